//! The example workload's rendezvous on its own (no agent): the env a gang's replicas get,
//! rank 0 listening, the others joining, a replica placed again rejoining a rank 0 that trains
//! on, and a gang that cannot form ending the replica.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running example workload whose stdout is collected as it comes.
struct Replica {
    child: Child,
    out: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Replica {
    fn start(rank: u32, world: u32, port: u16, extra: &[(&str, &str)]) -> Replica {
        let dir = tempfile::tempdir().expect("tmp");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_spotplane-example-train"));
        cmd.env_clear()
            .env("SPOTPLANE_CHECKPOINT_DIR", dir.path())
            .env("TRAIN_STEP_MS", "20")
            .env("TRAIN_WEIGHTS_BYTES", "1000")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("SPOTPLANE_NODE_RANK", rank.to_string())
            .env("SPOTPLANE_PEER_ADDRS", "127.0.0.1,127.0.0.1,127.0.0.1")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .envs(extra.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("the example starts");
        let out = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let out = out.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                    o.push_str(&line);
                    o.push('\n');
                }
            }));
        }
        Replica {
            child,
            out,
            readers,
            _dir: dir,
        }
    }

    fn output(&self) -> String {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits up to 30 s for a line containing `what`.
    fn wait_for(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.output().contains(what) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no {what:?} in:\n{}", self.output());
    }

    /// Waits up to 30 s for it to exit, and for the last of its output.
    fn wait(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return status.code().unwrap_or(-1);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("still running:\n{}", self.output());
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn line(rank: u32, world: u32, port: u16) -> String {
    format!(
        "rendezvous rank={rank} world={world} node_rank={rank} master=127.0.0.1:{port} peers=127.0.0.1,127.0.0.1,127.0.0.1"
    )
}

#[test]
fn a_gang_of_three_forms_and_trains_to_the_end() {
    let port = spotplane_tests::free_port();
    let steps = [("TRAIN_STEPS", "10")];
    // The others come up before rank 0 listens, and keep trying.
    let mut two = Replica::start(2, 3, port, &steps);
    let mut one = Replica::start(1, 3, port, &steps);
    std::thread::sleep(Duration::from_millis(300));
    let mut zero = Replica::start(0, 3, port, &steps);
    for (r, rank) in [(&mut zero, 0), (&mut one, 1), (&mut two, 2)] {
        assert_eq!(r.wait(), 0, "rank {rank}: {}", r.output());
        let out = r.output();
        assert!(out.contains(&line(rank, 3, port)), "rank {rank}: {out}");
        assert!(out.contains("done step=10"), "rank {rank}: {out}");
    }
    let lead = zero.output();
    for rank in [1, 2] {
        assert!(
            lead.contains(&format!("peer joined rank={rank} from=127.0.0.1:")),
            "{lead}"
        );
    }
    // Nobody trained before the group formed.
    let formed = lead.find("rendezvous rank=0").expect("formed");
    assert!(!lead[..formed].contains("step="), "{lead}");
}

#[test]
fn a_replica_placed_again_rejoins_a_rank_zero_that_trains_on() {
    let port = spotplane_tests::free_port();
    let zero = Replica::start(0, 2, port, &[]);
    let mut one = Replica::start(1, 2, port, &[]);
    zero.wait_for(&line(0, 2, port));
    one.wait_for(&line(1, 2, port));
    // Its node goes; the replica is placed again and joins the running rank 0.
    let _ = one.child.kill();
    let _ = one.wait();
    let again = Replica::start(1, 2, port, &[]);
    again.wait_for(&line(1, 2, port));
    zero.wait_for("peer rejoined rank=1 from=127.0.0.1:");
}

#[test]
fn a_gang_that_does_not_form_in_time_ends_the_replica() {
    let port = spotplane_tests::free_port();
    let quick = [("TRAIN_RENDEZVOUS_TIMEOUT_MS", "600")];
    // Nobody listens for rank 1.
    let mut lone = Replica::start(1, 2, port, &quick);
    assert_eq!(lone.wait(), 2, "{}", lone.output());
    assert!(
        lone.output()
            .contains("rendezvous: rank 1 could not join 127.0.0.1:"),
        "{}",
        lone.output()
    );
    // Rank 0 of three hears from only one.
    let mut zero = Replica::start(0, 3, port, &quick);
    let one = Replica::start(1, 3, port, &quick);
    assert_eq!(zero.wait(), 2, "{}", zero.output());
    assert!(
        zero.output()
            .contains("rendezvous: not every rank of 3 connected"),
        "{}",
        zero.output()
    );
    drop(one);
    // A rank beyond the world is refused at once.
    let mut bad = Replica::start(3, 2, port, &quick);
    assert_eq!(bad.wait(), 2, "{}", bad.output());
    assert!(
        bad.output().contains("RANK=3 is not below WORLD_SIZE=2"),
        "{}",
        bad.output()
    );
}

#[test]
fn a_single_replica_needs_no_rendezvous() {
    let port = spotplane_tests::free_port();
    let mut alone = Replica::start(0, 1, port, &[("TRAIN_STEPS", "5")]);
    assert_eq!(alone.wait(), 0, "{}", alone.output());
    let out = alone.output();
    assert!(!out.contains("rendezvous"), "{out}");
    assert!(out.contains("done step=5"), "{out}");
}
