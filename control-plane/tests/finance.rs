//! The cost ledger end to end: a replayed simulated week balancing against the simulated
//! clouds' bills, and the finance API (roles, summary, CSV and FOCUS exports, budgets) on
//! SQLite and PostgreSQL.

mod common;

use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use spotplane::clock::ManualClock;
use spotplane::config::FinanceSettings;
use spotplane::finance::export::{FOCUS_COLUMNS, FOCUS_MANDATORY, FocusType, parse_csv};
use spotplane::lab::finance_week::{WeekSpec, run_week};
use spotplane::reconcile::ledger::LedgerLoop;
use spotplane::scheduler::{Assigned, Placement};
use spotplane::store::{NewGpu, NewNode};
use spotplane_core::{
    Cloud, GpuModel, JobId, JobState, Market, Micros, MigLayout, NodeId, NodeState,
};
use spotplane_providers::registry::{self, BuildContext};

use common::{ADMIN_TOKEN, Backend, TestDb, TestServer};

async fn week(backend: Backend, days: i64) {
    let db = TestDb::new(backend);
    let store =
        spotplane::store::Store::connect(&db.config.database, spotplane::metrics::Metrics::new())
            .await
            .expect("connects");
    store.migrate().await.expect("migrates");
    let spec = WeekSpec {
        span: Duration::days(days),
        ..WeekSpec::default()
    };
    let clock = ManualClock::new(spec.start);
    let providers = registry::build(
        &db.config.providers,
        &BuildContext {
            clock: Arc::new(clock.clone()),
            sim_market: db.config.sim.market().expect("the simulated market"),
            catalog_dir: None,
            observer: None,
            sim_state_dir: None,
        },
    )
    .await
    .expect("simulated clouds");
    let out = tempfile::tempdir().expect("tempdir");
    let r = run_week(&store, &providers, &clock, &spec, Some(out.path()))
        .await
        .expect("the week replays");
    eprintln!("{r:#?}");
    assert!(r.nodes > 5 && r.jobs > 50, "{r:?}");
    assert!(
        r.preempted_nodes > 0 && r.lost_runs > 0,
        "the traces take nodes: {r:?}"
    );
    assert!(r.spot_nodes < r.nodes, "some on-demand too");
    // The ledger is the clouds' bill, to the micro-dollar (so to the cent), node by node.
    assert_eq!(r.ledger_total, r.cloud_bills_total, "{r:?}");
    assert_eq!(r.ledger_on_demand, r.cloud_bills_on_demand);
    assert_eq!(r.nodes_off, 0);
    // Teams plus idle are the total.
    assert_eq!(
        r.by_team.values().copied().sum::<Micros>() + r.idle,
        r.ledger_total
    );
    assert!(r.idle > Micros::ZERO && r.lost_work > Micros::ZERO);
    // The FOCUS file's ListCost - EffectiveCost is the saving.
    assert_eq!(r.focus_saving, r.saving);
    assert!(r.saving > Micros::ZERO);
    assert!(r.balanced);
    for f in [
        "ledger.csv",
        "focus.csv",
        "bills.csv",
        "summary-by-team.json",
        "report.json",
    ] {
        assert!(out.path().join(f).exists(), "{f}");
    }
    db.cleanup().await;
}

async fn a_replayed_week_balances_against_the_clouds_bills(backend: Backend) {
    // The whole week on SQLite; two days on PostgreSQL (the same code, a slower database).
    let days = if backend == Backend::Sqlite { 7 } else { 2 };
    week(backend, days).await;
}

fn t(h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 7, 1, h, 0, 0)
        .single()
        .expect("time")
}

/// One 8-GPU spot node at $8/h (on-demand $32/h) from 00:00 to 04:00, and a job of team `ml`
/// on four of its GPUs from 01:00 until it is lost at 03:00 (it never checkpointed: all of
/// that run's work is lost).
async fn seed(ts: &TestServer) -> (NodeId, JobId) {
    let ml = ts.team_with_token("ml").await;
    let store = ts.store();
    let node = NodeId(uuid::Uuid::now_v7());
    store
        .create_node(
            NewNode {
                id: node,
                name: "n1".into(),
                cloud: Cloud::Aws,
                region: "us-east-1".into(),
                zone: "use1-az1".into(),
                instance_type: "p4d.24xlarge".into(),
                market: Market::Spot,
                offer_id: None,
                client_token: node.to_string(),
                hourly_price: Micros::from_dollars(8),
                on_demand_price: Micros::from_dollars(32),
                cpu_milli: 96_000,
                memory_mib: 1 << 20,
                gpus: (0..8)
                    .map(|_| NewGpu {
                        model: GpuModel::A100_40GB,
                        memory_mib: 40_960,
                        mig_enabled: false,
                        mig_layout: MigLayout::empty(),
                    })
                    .collect(),
                labels: Default::default(),
            },
            t(0),
        )
        .await
        .expect("node");
    store
        .transition_node(node, NodeState::Ready, None, t(0))
        .await
        .expect("ready");
    let (s, v) = ts
        .call(
            Method::POST,
            "/v1/jobs",
            Some(&ml),
            Some(&json!({"name": "train", "shape": {"gpus": 4}, "command": ["x"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let job: JobId = v["id"].as_str().expect("id").parse().expect("job id");
    store
        .admit_job(
            job,
            &[Placement {
                replica: 0,
                node,
                assigned: Assigned::Whole(vec![0, 1, 2, 3]),
            }],
            t(1),
        )
        .await
        .expect("admitted");
    for to in [JobState::Starting, JobState::Running] {
        store
            .transition_job(job, None, None, to, None, t(1))
            .await
            .expect("runs");
    }
    store
        .transition_job(
            job,
            None,
            None,
            JobState::Lost,
            Some("node vanished".into()),
            t(3),
        )
        .await
        .expect("lost");
    store
        .transition_job(job, None, None, JobState::Queued, None, t(3))
        .await
        .expect("requeued");
    for to in [
        NodeState::Draining,
        NodeState::Terminating,
        NodeState::Terminated,
    ] {
        store
            .transition_node(node, to, None, t(4))
            .await
            .expect("ends");
    }
    (node, job)
}

async fn the_finance_api_sums_exports_and_scopes_by_role(backend: Backend) {
    let ts = TestServer::start(backend).await;
    let (_node, job) = seed(&ts).await;
    let other = ts.team_with_token("cv").await;
    let clock = ManualClock::new(t(6));
    let ledger = LedgerLoop::new(
        ts.store().clone(),
        Arc::new(clock.clone()),
        None,
        FinanceSettings::default(),
    );
    let r = ledger.run_once().await.expect("ledger");
    assert_eq!(r.lost_runs, 1, "{r:?}");
    let (s, v) = ts
        .call(
            Method::POST,
            "/v1/tokens",
            Some(ADMIN_TOKEN),
            Some(&json!({"name": "fin", "role": "finance"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let fin = v["token"].as_str().expect("token").to_owned();
    let range = "from=2026-07-01T00:00:00Z&to=2026-07-02T00:00:00Z";

    // 4 h of $8/h: $32 paid, $128 on demand; the job held half the node for 2 h: $8.
    let (s, v) = ts
        .call(
            Method::GET,
            &format!("/v1/finance/summary?{range}&group_by=team"),
            Some(&fin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["total"]["cost_micros"], 32_000_000);
    assert_eq!(v["total"]["on_demand_cost_micros"], 128_000_000);
    assert_eq!(v["total"]["saving_micros"], 96_000_000);
    assert_eq!(v["total"]["idle_micros"], 24_000_000);
    // Lost work: the whole run, 01:00-03:00 (no checkpoint), priced at its share: $8.
    assert_eq!(v["total"]["lost_work_micros"], 8_000_000);
    let rows: Vec<(String, i64)> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap_or("").to_owned(),
                r["cost_micros"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("(idle)".to_owned(), 24_000_000),
            ("ml".to_owned(), 8_000_000)
        ]
    );
    let (_, v) = ts
        .call(
            Method::GET,
            &format!("/v1/finance/summary?{range}&group_by=job"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert!(
        v["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .any(|r| r["key"] == job.to_string().as_str())
    );
    for by in ["provider", "region", "market"] {
        let (s, v) = ts
            .call(
                Method::GET,
                &format!("/v1/finance/summary?{range}&group_by={by}"),
                Some(&fin),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["rows"].as_array().map(Vec::len), Some(1), "{by}: {v}");
    }
    // A team sees only its own lines; another team sees nothing.
    let (_, v) = ts
        .call(
            Method::GET,
            &format!("/v1/finance/summary?{range}"),
            Some(&other),
            None,
        )
        .await;
    assert_eq!(v["total"]["cost_micros"], 0);
    // Bad input names the field.
    for (q, field) in [
        ("from=yesterday", "from"),
        ("from=2026-07-02T00:00:00Z&to=2026-07-01T00:00:00Z", "to"),
        ("group_by=colour", "group_by"),
    ] {
        let (s, v) = ts
            .call(
                Method::GET,
                &format!("/v1/finance/summary?{q}"),
                Some(&fin),
                None,
            )
            .await;
        assert!(
            s == StatusCode::UNPROCESSABLE_ENTITY || s == StatusCode::BAD_REQUEST,
            "{q}: {s}"
        );
        assert_eq!(v["field"], field, "{q}: {v}");
    }
    let (s, _) = ts
        .call(
            Method::GET,
            &format!("/v1/finance/export.csv?{range}&format=xml"),
            Some(&fin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);

    // The FOCUS export: every mandatory column, typed values, sums that match the ledger.
    let resp = ts
        .http
        .get(format!(
            "{}/v1/finance/export.csv?{range}&format=focus",
            ts.url
        ))
        .bearer_auth(&fin)
        .send()
        .await
        .expect("export");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap_or("")
            .starts_with("text/csv")
    );
    let text = resp.text().await.expect("body");
    let rows = parse_csv(&text).expect("CSV");
    let header = &rows[0];
    for m in FOCUS_MANDATORY {
        assert!(header.iter().any(|c| c == m), "missing {m}");
    }
    for (name, ty) in FOCUS_COLUMNS {
        let i = header.iter().position(|c| c == name).expect("column");
        for r in &rows[1..] {
            let v = &r[i];
            match ty {
                FocusType::Decimal => {
                    assert!(v.is_empty() || v.parse::<f64>().is_ok(), "{name}: {v}")
                }
                FocusType::DateTime => {
                    assert!(DateTime::parse_from_rfc3339(v).is_ok(), "{name}: {v}")
                }
                FocusType::Json => assert!(
                    serde_json::from_str::<Value>(v).is_ok_and(|j| j.is_object()),
                    "{name}: {v}"
                ),
                FocusType::String => {}
            }
        }
    }
    let col = |n: &str| header.iter().position(|c| c == n).expect("column");
    let sum = |n: &str| -> Micros {
        rows[1..]
            .iter()
            .map(|r| Micros::parse_usd(&r[col(n)]).expect("decimal"))
            .sum()
    };
    assert_eq!(sum("BilledCost"), Micros::from_dollars(32));
    assert_eq!(sum("EffectiveCost"), Micros::from_dollars(32));
    assert_eq!(
        sum("ListCost") - sum("EffectiveCost"),
        Micros::from_dollars(96)
    );
    assert!(
        rows[1..]
            .iter()
            .all(|r| r[col("PricingCategory")] == "Dynamic")
    );
    assert!(
        rows[1..]
            .iter()
            .all(|r| r[col("SkuId")] == "p4d.24xlarge" && r[col("RegionId")] == "us-east-1")
    );
    let tagged = rows[1..]
        .iter()
        .filter(|r| r[col("Tags")].contains("\"spotplane-team\":\"ml\""))
        .count();
    assert_eq!(tagged, 2, "two hours of the job");

    // The plain CSV: same total; a team's export holds only its lines; agents may not.
    let csv = ts
        .http
        .get(format!("{}/v1/finance/export.csv?{range}", ts.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("export")
        .text()
        .await
        .expect("body");
    let rows = parse_csv(&csv).expect("CSV");
    let cost = rows[0].iter().position(|c| c == "cost_usd").expect("cost");
    let total: Micros = rows[1..]
        .iter()
        .map(|r| Micros::parse_usd(&r[cost]).expect("decimal"))
        .sum();
    assert_eq!(total, Micros::from_dollars(32));

    // Budgets: admin sets, finance reads; crossing 50 % makes a budget.alert event.
    let (s, v) = ts
        .call(
            Method::PUT,
            "/v1/teams/ml/budget",
            Some(ADMIN_TOKEN),
            Some(&json!({"monthly_usd": 10.0})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _) = ts
        .call(
            Method::PUT,
            "/v1/teams/ml/budget",
            Some(&fin),
            Some(&json!({"monthly_usd": 10.0})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, v) = ts
        .call(
            Method::PUT,
            "/v1/teams/ml/budget",
            Some(ADMIN_TOKEN),
            Some(&json!({"monthly_usd": -1})),
        )
        .await;
    assert_eq!(
        (s, v["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("monthly_usd"))
    );
    let (_, v) = ts
        .call(Method::GET, "/v1/teams/ml/budget", Some(&fin), None)
        .await;
    assert_eq!(v["monthly_usd"], 10.0);
    let r = ledger.run_once().await.expect("ledger");
    assert_eq!(
        r.budget_alerts, 1,
        "$8 of $10 crosses 50 % and 80 %: one alert, at 80 %"
    );
    let events = ts.store().outbox_after(0, 10_000).await.expect("outbox");
    let alert = events
        .iter()
        .find(|e| e.kind == "budget.alert")
        .expect("an alert");
    assert_eq!(alert.payload["threshold_percent"], 80);
    assert_eq!(
        ledger.run_once().await.expect("ledger").budget_alerts,
        0,
        "once per threshold"
    );
    ts.stop().await;
}

on_both_databases!(
    a_replayed_week_balances_against_the_clouds_bills,
    the_finance_api_sums_exports_and_scopes_by_role,
);
