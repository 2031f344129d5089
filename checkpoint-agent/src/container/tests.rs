use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::launch::cpus;
use super::*;
use crate::isolation::RunAs;
use crate::workload::Launch;
use nix::sys::signal::Signal;
use spotplane_core::agent::{ContainerEngineInfo, RegistryCredential, ReplicaLimits};
use spotplane_core::{JobId, NodeId};

const SMI: &str = include_str!("../../tests/fixtures/nvidia-smi-L-h100x2-mig.txt");
const CDI: &str = include_str!("../../tests/fixtures/nvidia-ctk-cdi-list-h100x2-mig.txt");
const CDI_TYPE_INDEX: &str =
    include_str!("../../tests/fixtures/nvidia-ctk-cdi-list-type-index.txt");
const GPU0: &str = "GPU-5c1e8a52-2f3b-6a1d-9c0e-3b7f1d2a4e61";
const GPU1: &str = "GPU-a4f0c9d3-71e2-4b8a-8d5c-6e9f2b1a7c38";
const MIG_1_0: &str = "MIG-2f0d6c1e-8b4a-5f3d-9e2c-7a1b0c4d3e5f";
const MIG_1_2: &str = "MIG-0e4b7d2c-6a1f-5c3e-8d9b-2f1a3c4e5d6b";

fn output(code: i32, stdout: &str, stderr: &str) -> std::process::Output {
    use std::os::unix::process::ExitStatusExt;
    std::process::Output {
        status: std::process::ExitStatus::from_raw(code << 8),
        stdout: stdout.as_bytes().to_vec(),
        stderr: stderr.as_bytes().to_vec(),
    }
}

#[test]
fn ulimits_are_name_equals_soft_and_optional_hard() {
    for ok in [
        "nofile=1024:1024",
        "nproc=1024",
        "memlock=-1:-1",
        "stack=8192:-1",
    ] {
        assert_eq!(parse_ulimit(ok).as_deref(), Ok(ok));
    }
    for bad in [
        "nofile",
        "nofile=",
        "NOFILE=1",
        "nofile=1:",
        "nofile=a:b",
        "=1",
        "no-file=1",
    ] {
        let e = parse_ulimit(bad).expect_err(bad);
        assert!(e.contains("name=soft[:hard]") && e.contains(bad), "{e}");
    }
}

#[test]
fn an_engines_reason_is_its_last_error_lines_without_the_password() {
    // podman 4.3.1 pulling from nothing, as recorded on this project's test machine.
    let podman = "Trying to pull localhost:1/nope:1...\n\
        time=\"2026-12-03T06:27:54Z\" level=warning msg=\"Failed, retrying in 1s ... (1/3). Error: initializing source docker://localhost:1/nope:1: pinging container registry localhost:1: Get \\\"https://localhost:1/v2/\\\": dial tcp 127.0.0.1:1: connect: connection refused\"\n\
        Error: initializing source docker://localhost:1/nope:1: pinging container registry localhost:1: Get \"https://localhost:1/v2/\": dial tcp 127.0.0.1:1: connect: connection refused\n";
    let cases: [(&str, &str, Option<&str>, &str); 5] = [
        (
            "",
            podman,
            None,
            "initializing source docker://localhost:1/nope:1: pinging container registry localhost:1: Get \"https://localhost:1/v2/\": dial tcp 127.0.0.1:1: connect: connection refused",
        ),
        (
            "",
            "Error response from daemon: pull access denied for acme/train, repository does not exist or may require 'docker login'\n",
            None,
            "pull access denied for acme/train, repository does not exist or may require 'docker login'",
        ),
        (
            "",
            "Error: unable to retrieve auth token: invalid username/password: hunter2 refused\n",
            Some("hunter2"),
            "unable to retrieve auth token: invalid username/password: <redacted> refused",
        ),
        ("", "some warning\nthe last line\n", None, "the last line"),
        ("only stdout\n", "", None, "only stdout"),
    ];
    for (stdout, stderr, secret, want) in cases {
        assert_eq!(engine_error(&output(125, stdout, stderr), secret), want);
    }
    let silent = engine_error(&output(3, "", ""), None);
    assert!(silent.contains("exit status: 3"), "{silent}");
    let long = engine_error(
        &output(1, "", &format!("Error: {}", "é".repeat(1000))),
        None,
    );
    assert!(long.len() <= ERROR_MAX + '…'.len_utf8() && long.ends_with('…'));
}

#[test]
fn image_references_are_made_whole_as_docker_reads_them() {
    let cases = [
        ("ubuntu", "docker.io/library/ubuntu", "docker.io"),
        (
            "ubuntu:22.04",
            "docker.io/library/ubuntu:22.04",
            "docker.io",
        ),
        ("acme/train:1", "docker.io/acme/train:1", "docker.io"),
        ("ghcr.io/acme/train:1", "ghcr.io/acme/train:1", "ghcr.io"),
        (
            "localhost/spotplane-example-train:test",
            "localhost/spotplane-example-train:test",
            "localhost",
        ),
        ("localhost:1/nope:1", "localhost:1/nope:1", "localhost:1"),
        (
            "registry.example.com:5000/team/img@sha256:abc",
            "registry.example.com:5000/team/img@sha256:abc",
            "registry.example.com:5000",
        ),
    ];
    for (image, whole, host) in cases {
        assert_eq!(normalize_image(image), whole, "{image}");
        assert_eq!(registry_host(image), host, "{image}");
    }
}

#[test]
fn an_image_reference_is_never_read_as_a_flag() {
    for ok in [
        "ubuntu",
        "ghcr.io/acme/train:1",
        "localhost:5000/a/b_c-d.e:v1.2",
        "ghcr.io/acme/train@sha256:0123abc",
    ] {
        assert_eq!(check_reference(ok), Ok(()), "{ok}");
    }
    for bad in [
        "--privileged",
        "-v/:/host",
        "--privileged.io/x",
        "a b",
        "a\nb",
        "ghcr.io//x",
        "",
        "x;y",
    ] {
        let e = check_reference(bad).expect_err(bad);
        assert!(e.contains("is not an image reference"), "{e}");
    }
    let mut c = container(EngineSettings::default());
    c.image = "--privileged.io/x:1".into();
    assert!(plan_create(&launch(), &c).is_err());
    // The job's command cannot be a flag of the engine's either.
    let mut l = launch();
    l.command = vec!["--privileged".into(), "-v".into()];
    let p = plan_create(&l, &container(EngineSettings::default())).expect("plan");
    let at = p
        .args
        .iter()
        .position(|x| x == "ghcr.io/acme/train:1")
        .expect("image");
    assert_eq!(p.args[at - 1], "--entrypoint=--privileged");
    assert_eq!(p.args[at + 1..], ["-v"]);
}

#[test]
fn only_latest_or_untagged_images_are_pulled_again_when_present() {
    let cases = [
        ("ghcr.io/acme/train:1", false),
        ("ghcr.io/acme/train:latest", true),
        ("ghcr.io/acme/train", true),
        ("localhost:5000/train", true),
        ("localhost:5000/train:2", false),
        ("ghcr.io/acme/train@sha256:0123", false),
        ("ghcr.io/acme/train:latest@sha256:0123", false),
    ];
    for (image, again) in cases {
        assert_eq!(refreshes(image), again, "{image}");
    }
}

#[test]
fn the_auth_file_holds_one_login_for_the_images_registry() {
    use base64::Engine as _;
    let cred = RegistryCredential {
        username: "robot$ci".into(),
        password: "pa:ss".into(),
    };
    let cases = [
        (EngineKind::Podman, "ghcr.io", "ghcr.io"),
        (EngineKind::Docker, "ghcr.io", "ghcr.io"),
        (EngineKind::Podman, "docker.io", "docker.io"),
        (
            EngineKind::Docker,
            "docker.io",
            "https://index.docker.io/v1/",
        ),
    ];
    for (kind, host, key) in cases {
        let v: serde_json::Value =
            serde_json::from_str(&auth_json(kind, host, &cred)).expect("json");
        let auths = v["auths"].as_object().expect("auths");
        assert_eq!(auths.keys().collect::<Vec<_>>(), [key], "{kind:?} {host}");
        let auth = auths[key]["auth"].as_str().expect("auth");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth)
            .expect("base64");
        assert_eq!(decoded, b"robot$ci:pa:ss");
    }
}

#[test]
fn nvidia_smi_lists_gpus_and_their_mig_devices() {
    let l = parse_smi_list(SMI);
    assert_eq!(
        l.gpus,
        [
            ListedGpu {
                index: 0,
                uuid: GPU0.into()
            },
            ListedGpu {
                index: 1,
                uuid: GPU1.into()
            }
        ]
    );
    let migs: Vec<(u32, &str, u32, &str)> = l
        .migs
        .iter()
        .map(|m| (m.gpu, m.profile.as_str(), m.device, m.uuid.as_str()))
        .collect();
    assert_eq!(
        migs,
        [
            (1, "3g.40gb", 0, MIG_1_0),
            (1, "2g.20gb", 1, "MIG-7c3e1a9b-4d2f-5e8a-b1c0-9f6d2e3a4b5c"),
            (1, "1g.10gb", 2, MIG_1_2),
        ]
    );
    assert_eq!(
        parse_smi_list("No devices were found\n"),
        SmiList::default()
    );
}

#[test]
fn cdi_lists_give_the_device_names_and_skip_their_log_lines() {
    let names = parse_cdi_list(CDI);
    assert_eq!(names.len(), 9, "{names:?}");
    assert_eq!(names[0], "nvidia.com/gpu=0");
    assert!(names.contains(&format!("nvidia.com/gpu={GPU0}")));
    assert!(names.contains(&format!("nvidia.com/gpu={MIG_1_0}")));
    assert!(names.contains(&"nvidia.com/gpu=1:2".to_owned()));
    assert_eq!(names.last().map(String::as_str), Some("nvidia.com/gpu=all"));
    assert_eq!(
        parse_cdi_list(CDI_TYPE_INDEX),
        [
            "nvidia.com/gpu=all",
            "nvidia.com/gpu=gpu0",
            "nvidia.com/gpu=mig1:0",
            "nvidia.com/gpu=mig1:1",
            "nvidia.com/gpu=mig1:2"
        ]
    );
}

#[test]
fn a_replicas_devices_become_exactly_its_cdi_names_or_uuids() {
    let smi = parse_smi_list(SMI);
    let uuid_spec = parse_cdi_list(CDI);
    let index_spec = parse_cdi_list(CDI_TYPE_INDEX);
    let cdi = |v: &[&str]| {
        Ok(DeviceSelection::Cdi(
            v.iter().map(|s| s.to_string()).collect(),
        ))
    };
    let visible = |v: &str| Ok(DeviceSelection::Visible(v.to_owned()));
    let bare = ["nvidia.com/gpu=0".to_owned()];
    let gpu0 = format!("nvidia.com/gpu={GPU0}");
    let mig10 = format!("nvidia.com/gpu={MIG_1_0}");
    type Case<'a> = (
        &'a str,
        Vec<&'a str>,
        Option<&'a [String]>,
        Result<DeviceSelection, String>,
    );
    let cases: Vec<Case> = vec![
        (
            "whole GPU by its UUID name",
            vec!["0"],
            Some(&uuid_spec),
            cdi(&[&gpu0]),
        ),
        (
            "a MIG device by its UUID name",
            vec![MIG_1_0],
            Some(&uuid_spec),
            cdi(&[&mig10]),
        ),
        (
            "a GPU given by UUID",
            vec![GPU0],
            Some(&uuid_spec),
            cdi(&[&gpu0]),
        ),
        ("no GPU: no device", vec![], Some(&uuid_spec), cdi(&[])),
        (
            "two shares of one GPU: once",
            vec!["0", "0"],
            Some(&uuid_spec),
            cdi(&[&gpu0]),
        ),
        (
            "index names only",
            vec!["0"],
            Some(&index_spec),
            cdi(&["nvidia.com/gpu=gpu0"]),
        ),
        (
            "MIG by index names",
            vec![MIG_1_2],
            Some(&index_spec),
            cdi(&["nvidia.com/gpu=mig1:2"]),
        ),
        (
            "no UUID known: the index name",
            vec!["0"],
            Some(&bare[..]),
            cdi(&["nvidia.com/gpu=0"]),
        ),
        (
            "without CDI: UUIDs",
            vec!["0", "1"],
            None,
            visible(&format!("{GPU0},{GPU1}")),
        ),
        (
            "without CDI: a MIG UUID",
            vec![MIG_1_0],
            None,
            visible(MIG_1_0),
        ),
        (
            "without CDI and no GPU: void",
            vec![],
            None,
            visible("void"),
        ),
    ];
    for (what, devices, spec, want) in cases {
        let devices: Vec<String> = devices.into_iter().map(str::to_owned).collect();
        assert_eq!(select_devices(&devices, &smi, spec), want, "{what}");
    }
    // Unknown to nvidia-smi: the index as given (the NVIDIA runtime reads indices too).
    assert_eq!(
        select_devices(&["3".into()], &SmiList::default(), None),
        visible("3")
    );
    // GPU 1 has MIG on: the spec has no whole-GPU device for it.
    let e = select_devices(&["1".into()], &smi, Some(&uuid_spec)).expect_err("stale");
    assert!(
        e.contains("device 1 has no CDI name") && e.contains("nvidia-ctk cdi generate"),
        "{e}"
    );
    let e = select_devices(&["MIG-gone".into()], &smi, Some(&index_spec)).expect_err("gone");
    assert!(e.contains("MIG-gone"), "{e}");
    let e = select_devices(&["gpu zero".into()], &smi, None).expect_err("garbage");
    assert!(e.contains("neither a GPU index"), "{e}");
}

#[test]
fn cpu_shares_are_decimal_cpus() {
    for (milli, want) in [
        (1000, "1"),
        (2500, "2.5"),
        (250, "0.25"),
        (1, "0.001"),
        (16000, "16"),
    ] {
        assert_eq!(cpus(milli), want);
    }
}

fn engine(settings: EngineSettings) -> Arc<Engine> {
    Arc::new(Engine {
        kind: EngineKind::Podman,
        program: "podman".into(),
        version: "4.3.1".into(),
        settings,
        cdi: false,
    })
}

fn launch() -> Launch {
    Launch {
        job_id: JobId::new_at(1, 1),
        replica: 2,
        attempt: 3,
        node_id: Some(NodeId(uuid::Uuid::from_u128(7))),
        command: vec!["python".into(), "train.py".into(), "--lr=1e-3".into()],
        env: BTreeMap::from([("EPOCHS".into(), "3".into())]),
        devices: vec!["0".into()],
        checkpoint_dir: "/w/jobs/j/replica-2/attempt-3/checkpoint".into(),
        resume_dir: None,
        home_dir: Some("/w/jobs/j/replica-2/attempt-3/home".into()),
        tmp_dir: Some("/w/jobs/j/replica-2/attempt-3/tmp".into()),
        signal: Signal::SIGUSR1,
        log: None,
        run_as: Some(RunAs {
            uid: 200_001,
            gid: 200_001,
        }),
        working_dir: None,
        container: None,
    }
}

fn container(settings: EngineSettings) -> ContainerLaunch {
    let l = launch();
    ContainerLaunch {
        engine: engine(settings),
        image: "ghcr.io/acme/train:1".into(),
        name: container_name(l.job_id, l.replica, l.attempt),
        node_id: NodeId(uuid::Uuid::from_u128(7)),
        devices: DeviceSelection::Visible(GPU0.into()),
        limits: None,
        host_network: false,
        env_file: "/w/jobs/j/replica-2/attempt-3/container.env".into(),
    }
}

/// The value following `flag`, each time it appears.
fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

#[test]
fn a_replicas_create_names_labels_and_confines_it() {
    let l = launch();
    let c = container(EngineSettings::default());
    let p = plan_create(&l, &c).expect("plan");
    let a = &p.args;
    assert_eq!(a[0], "create");
    assert_eq!(values(a, "--name"), [format!("spotplane-{}-2-3", l.job_id)]);
    assert_eq!(
        values(a, "--label"),
        [
            format!("spotplane.node={}", c.node_id),
            format!("spotplane.job={}", l.job_id),
            "spotplane.replica=2".into(),
            "spotplane.attempt=3".into()
        ]
    );
    assert_eq!(values(a, "--user"), ["200001:200001"]);
    assert_eq!(values(a, "--pull"), ["never"]);
    assert_eq!(values(a, "--log-driver"), ["none"]);
    assert_eq!(values(a, "--security-opt"), ["no-new-privileges"]);
    assert_eq!(
        values(a, "--mount"),
        [
            "type=bind,src=/w/jobs/j/replica-2/attempt-3/checkpoint,dst=/spotplane/checkpoint",
            "type=bind,src=/w/jobs/j/replica-2/attempt-3/home,dst=/spotplane/home",
            "type=bind,src=/w/jobs/j/replica-2/attempt-3/tmp,dst=/spotplane/tmp",
        ]
    );
    assert_eq!(
        values(a, "--env-file"),
        ["/w/jobs/j/replica-2/attempt-3/container.env"]
    );
    // The engine's defaults: no network, runtime, limits or devices flags.
    for flag in [
        "--network",
        "--runtime",
        "--ulimit",
        "--cpus",
        "--memory",
        "--device",
        "--init",
        "--env",
    ] {
        assert!(!a.iter().any(|x| x == flag), "{flag} in {a:?}");
    }
    // The job's command replaces the entrypoint; its arguments follow the image.
    let tail: Vec<&str> = a[a.len() - 4..].iter().map(String::as_str).collect();
    assert_eq!(
        tail,
        [
            "--entrypoint=python",
            "ghcr.io/acme/train:1",
            "train.py",
            "--lr=1e-3"
        ]
    );
    assert!(p.engine_env.is_empty());
}

#[test]
fn the_env_file_holds_the_jobs_env_and_the_contract_with_the_paths_inside() {
    let mut l = launch();
    l.resume_dir = Some("/w/jobs/j/replica-2/attempt-3/resume".into());
    l.env.insert("NVIDIA_VISIBLE_DEVICES".into(), "all".into());
    l.env.insert("SPACED".into(), "  a b  ".into());
    let c = container(EngineSettings::default());
    let p = plan_create(&l, &c).expect("plan");
    let env: BTreeMap<&str, &str> = p
        .env_file
        .lines()
        .filter_map(|l| l.split_once('='))
        .collect();
    let job = l.job_id.to_string();
    let want = BTreeMap::from([
        ("EPOCHS", "3"),
        ("HOME", IN_HOME),
        // The job cannot widen its GPUs.
        ("NVIDIA_VISIBLE_DEVICES", GPU0),
        ("SPACED", "  a b  "),
        ("SPOTPLANE_ATTEMPT", "3"),
        ("SPOTPLANE_CHECKPOINT_DIR", IN_CHECKPOINT),
        (
            "SPOTPLANE_CHECKPOINT_MARKER",
            "/spotplane/checkpoint/.spotplane-checkpoint-complete",
        ),
        ("SPOTPLANE_CHECKPOINT_SIGNAL", "SIGUSR1"),
        ("SPOTPLANE_JOB_ID", job.as_str()),
        ("SPOTPLANE_NODE_ID", "00000000-0000-0000-0000-000000000007"),
        ("SPOTPLANE_REPLICA", "2"),
        ("SPOTPLANE_RESUME_DIR", IN_RESUME),
        ("TMPDIR", IN_TMP),
    ]);
    assert_eq!(env, want);
    // No PATH of the agent's: the image's own applies. No CUDA_VISIBLE_DEVICES: the
    // container sees only its GPUs, numbered from 0.
    assert!(!env.contains_key("PATH") && !env.contains_key("CUDA_VISIBLE_DEVICES"));
    assert!(
        values(&p.args, "--mount")
            .contains(&"type=bind,src=/w/jobs/j/replica-2/attempt-3/resume,dst=/spotplane/resume")
    );
    // The job's own HOME wins, as on the host.
    let mut l = launch();
    l.env.insert("HOME".into(), "/root".into());
    let p = plan_create(&l, &c).expect("plan");
    assert!(
        p.env_file.lines().any(|x| x == "HOME=/root"),
        "{}",
        p.env_file
    );
}

#[test]
fn a_multi_line_value_goes_through_the_engines_environment_unless_the_engine_reads_it() {
    let mut l = launch();
    let pem = "-----BEGIN KEY-----\nabc\n-----END KEY-----\n";
    l.env.insert("TLS_KEY".into(), pem.into());
    let c = container(EngineSettings::default());
    let p = plan_create(&l, &c).expect("plan");
    assert_eq!(p.engine_env, [("TLS_KEY".to_owned(), pem.to_owned())]);
    assert!(p.args.contains(&"--env=TLS_KEY".to_owned()), "{:?}", p.args);
    assert!(!p.env_file.contains("TLS_KEY") && !p.env_file.contains("BEGIN"));
    for name in [
        "LD_PRELOAD",
        "DOCKER_HOST",
        "CONTAINERS_CONF",
        "http_proxy",
        "PATH",
        "GODEBUG",
        "XDG_RUNTIME_DIR",
    ] {
        let mut l = launch();
        l.env.insert(name.into(), "a\nb".into());
        let e = plan_create(&l, &c).expect_err(name);
        assert!(e.starts_with(&format!("env {name}:")), "{e}");
    }
    let mut l = launch();
    l.env.insert("A=B".into(), "x".into());
    assert!(
        plan_create(&l, &c)
            .expect_err("name")
            .contains("not a variable name")
    );
    let mut l = launch();
    l.env.insert("NUL".into(), "a\0b".into());
    assert!(plan_create(&l, &c).expect_err("nul").contains("NUL byte"));
}

#[test]
fn limits_devices_networking_and_the_settings_reach_the_create() {
    let settings = EngineSettings {
        oci_runtime: Some("runc".into()),
        ulimits: vec!["nofile=1024:1024".into(), "nproc=1024:1024".into()],
        extra_args: vec!["--security-opt=label=disable".into()],
        init: true,
        ..EngineSettings::default()
    };
    let mut c = container(settings);
    c.limits = Some(ReplicaLimits {
        cpu_milli: 2500,
        memory_mib: 16384,
    });
    c.devices = DeviceSelection::Cdi(vec![
        format!("nvidia.com/gpu={GPU0}"),
        format!("nvidia.com/gpu={MIG_1_0}"),
    ]);
    c.host_network = true;
    let p = plan_create(&launch(), &c).expect("plan");
    let a = &p.args;
    assert_eq!(values(a, "--cpus"), ["2.5"]);
    assert_eq!(values(a, "--memory"), ["16384m"]);
    assert_eq!(values(a, "--memory-swap"), ["16384m"]);
    assert_eq!(
        values(a, "--device"),
        [
            format!("nvidia.com/gpu={GPU0}"),
            format!("nvidia.com/gpu={MIG_1_0}")
        ]
    );
    assert_eq!(values(a, "--network"), ["host"]);
    assert!(values(a, "--workdir").is_empty(), "the image's own");
    assert_eq!(values(a, "--runtime"), ["runc"]);
    assert_eq!(
        values(a, "--ulimit"),
        ["nofile=1024:1024", "nproc=1024:1024"]
    );
    assert!(a.iter().any(|x| x == "--init"));
    assert!(a.iter().any(|x| x == "--security-opt=label=disable"));
    // With CDI the runtime's variable is void: the devices come from the spec alone.
    assert!(
        p.env_file
            .lines()
            .any(|l| l == "NVIDIA_VISIBLE_DEVICES=void")
    );
    // The settings go before the entrypoint and the image.
    let image_at = a
        .iter()
        .position(|x| x == "ghcr.io/acme/train:1")
        .expect("image");
    let extra_at = a
        .iter()
        .position(|x| x == "--security-opt=label=disable")
        .expect("extra");
    assert!(extra_at < image_at);
    let mut l = launch();
    l.working_dir = Some("/workspace".into());
    let p = plan_create(&l, &c).expect("plan");
    let workdir_at = p
        .args
        .iter()
        .position(|x| x == "--workdir")
        .expect("workdir");
    assert_eq!(p.args[workdir_at + 1], "/workspace");
    assert!(workdir_at < image_at);
    // Zero limits are no limits.
    c.limits = Some(ReplicaLimits {
        cpu_milli: 0,
        memory_mib: 0,
    });
    let p = plan_create(&launch(), &c).expect("plan");
    assert!(values(&p.args, "--cpus").is_empty() && values(&p.args, "--memory").is_empty());
}

#[test]
fn a_replica_without_a_user_or_a_command_is_planned_so() {
    let c = container(EngineSettings::default());
    let mut l = launch();
    l.run_as = None;
    let p = plan_create(&l, &c).expect("plan");
    assert!(values(&p.args, "--user").is_empty(), "the image's own user");
    l.command.clear();
    assert_eq!(plan_create(&l, &c), Err("the command is empty".into()));
    let mut l = launch();
    l.checkpoint_dir = "/w/a,b/checkpoint".into();
    assert!(plan_create(&l, &c).expect_err("comma").contains("comma"));
}

#[test]
fn engine_settings_default_to_auto_and_the_usual_cdi_dirs() {
    let s = EngineSettings::default();
    assert_eq!(s.runtime, RuntimeChoice::Auto);
    assert_eq!(
        s.cdi_spec_dirs,
        [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
    );
    assert_eq!(
        engine(s).info(),
        ContainerEngineInfo {
            kind: "podman".into(),
            version: "4.3.1".into(),
            cdi: false
        }
    );
}

#[tokio::test]
async fn docker_counts_only_with_a_daemon_that_answers() {
    let docker = EngineSettings {
        runtime: RuntimeChoice::Docker,
        ..EngineSettings::default()
    };
    // Here the docker CLI is installed without a daemon (elsewhere it may be missing, or
    // have one): never an engine that cannot run anything.
    match detect(&docker).await {
        Ok(e) => {
            assert_eq!(e.kind, EngineKind::Docker);
            assert!(!e.version.is_empty());
        }
        Err(why) => {
            assert!(why.starts_with("docker: "), "{why}");
            assert!(
                why.contains("daemon") || why.contains("not installed"),
                "{why}"
            );
        }
    }
}

#[tokio::test]
async fn no_engine_is_a_reason_not_a_fallback() {
    let none = EngineSettings {
        runtime: RuntimeChoice::None,
        ..EngineSettings::default()
    };
    assert_eq!(
        detect(&none).await.err().as_deref(),
        Some("--container-runtime none")
    );
}
