use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "allocations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub job_id: String,
    pub replica: i32,
    pub attempt: i32,
    pub node_id: String,
    pub gpu_indices: Json,
    pub mig: Option<Json>,
    pub gpu_milli: i32,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub created_at: DateTimeUtc,
    pub released_at: Option<DateTimeUtc>,
    pub phase: Option<String>,
    pub exit_code: Option<i32>,
    pub phase_at: Option<DateTimeUtc>,
    pub started_at: Option<DateTimeUtc>,
    /// Why its `start` failed, as the agent said.
    pub start_error: Option<String>,
    /// Heartbeat readings of its GPUs while it ran, and their sums (SM utilisation in
    /// percent, memory used in MiB) and the most memory used.
    pub util_samples: i64,
    pub sm_util_sum: i64,
    pub mem_used_mib_sum: i64,
    pub mem_used_mib_max: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
