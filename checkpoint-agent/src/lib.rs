//! The spotplane node agent.
//!
//! Runs on every node spotplane buys. It registers with the control plane with a per-node
//! token, reports the node's GPUs and their MIG layout, heartbeats telemetry, watches the
//! cloud's metadata service for termination notices, runs the node's replicas and checkpoints
//! them to object storage when told or warned. It never links the control plane; both ends
//! share `spotplane-core`'s protocol types. docs/agent.md tells the whole story.
//!
//! - [`agent`]: the main loop (registration, heartbeats, commands, notices);
//! - [`notice`]: the clouds' metadata services, behind [`notice::NoticeSource`];
//! - [`workload`]: one replica's process and the workload contract;
//! - [`container`]: replicas of jobs with an image, through podman or docker;
//! - [`isolation`]: the workloads' users and what they can reach;
//! - [`checkpoint`]: upload, find and restore checkpoints with object_store;
//! - [`logs`]: the replicas' output, in rotated files, shipped and archived;
//! - [`telemetry`]: NVML readings named after DCGM fields; [`mig`]: MIG re-layouts;
//! - [`inventory`]: the node's GPUs; [`client`]: the control plane's agent API;
//! - [`gang`]: the node's address for its gang peers, and a replica's rendezvous environment;
//! - [`bench`]: `spotplane-agent bench upload`.

pub mod agent;
pub mod bench;
pub mod checkpoint;
pub mod client;
pub mod container;
pub mod gang;
pub mod inventory;
pub mod isolation;
pub mod logs;
pub mod mig;
pub mod notice;
pub mod telemetry;
pub mod workload;
