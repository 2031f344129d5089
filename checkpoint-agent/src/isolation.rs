//! Who a replica runs as, and what it can reach.
//!
//! Replicas of different jobs may share a node, and so may different teams. With
//! [`Isolation::User`] (the default) each job gets a user of its own for as long as it has a
//! replica on the node: a uid (and a gid of the same number) taken from a range set aside for
//! workloads, which no account and no other job holds. Its replicas start with that uid and
//! gid and no supplementary groups, so they cannot read another job's processes
//! (`/proc/<pid>/environ`), signal them, or open the agent's files.
//!
//! What is on disk, under the work directory:
//!
//! | path | owner | mode |
//! | --- | --- | --- |
//! | the work directory, `jobs/`, `jobs/<job>/replica-<r>/attempt-<a>/` | the agent | 0711 |
//! | `credential.json`, `done-commands.json`, `…/output.log` | the agent | 0600 |
//! | `…/checkpoint/`, `…/resume/`, `…/home/`, `…/tmp/` | the job's user | 0700 |
//!
//! Folders the agent works in as root are never writable by a workload, so no workload can
//! swap one for a link that would point the agent's writes elsewhere. While a checkpoint is
//! read for upload, the checkpoint folder is taken back (owned by the agent, so frozen) and
//! everything in it must be the job's own; it is handed back afterwards. When a job's last
//! replica on the node ends, whatever still runs as its user is killed and its folders are
//! taken back, so the uid owns nothing when another job gets it.
//!
//! Changing users needs root. An agent that is not root refuses to start under
//! [`Isolation::User`]; [`Isolation::None`] (an explicit switch, for a node given to one team
//! or a developer's machine) runs replicas as the agent's own user, with the same cleared
//! environment.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use spotplane_core::JobId;

/// Where the workloads' users come from when no range is given.
pub const DEFAULT_UID_BASE: u32 = 200_000;
/// How many uids the default range holds.
pub const DEFAULT_UID_COUNT: u32 = 65_536;

/// How replicas are kept apart from the agent and from each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Isolation {
    /// A user of its own per job (the agent must be root).
    #[default]
    User,
    /// As the agent's own user: only for a node given to one team.
    None,
}

/// The uid and gid a replica runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error(
        "the workload uid range {base}..{end} is not usable: it must lie within 1000..4294967294 and hold at least one uid",
        end = u64::from(*.base) + u64::from(*.count)
    )]
    BadRange { base: u32, count: u32 },
    #[error("every workload uid ({count} from {base}) is held by a job on this node")]
    Exhausted { base: u32, count: u32 },
    #[error(
        "the agent is not root (uid {0}), so it cannot run replicas as users of their own; run it as root, or pass --workload-isolation none on a node given to one team"
    )]
    NotRoot(u32),
    #[error(
        "replicas run as users of their own must reach the work directory, but {0} is not searchable by others (add o+x)"
    )]
    Unreachable(PathBuf),
    #[error("{path} is not the job's own (owned by uid {owner}); the checkpoint is refused")]
    Foreign { path: PathBuf, owner: u32 },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> IsolationError {
    let path = path.to_owned();
    move |source| IsolationError::Io { what, path, source }
}

/// The uids of the workloads' users, one per job with a replica on the node.
#[derive(Debug)]
pub struct UidPool {
    base: u32,
    count: u32,
    /// The offset tried first: uids go round the range, so one comes back as late as can be.
    next: u32,
    held: HashMap<JobId, (u32, usize)>,
}

impl UidPool {
    /// A pool of `count` uids from `base`. The range must stay clear of system accounts
    /// (below 1000) and of `nobody` and `-1` at the top.
    pub fn new(base: u32, count: u32) -> Result<UidPool, IsolationError> {
        let end = u64::from(base) + u64::from(count);
        if base < 1000 || count == 0 || end > u64::from(u32::MAX - 1) {
            return Err(IsolationError::BadRange { base, count });
        }
        Ok(UidPool {
            base,
            count,
            next: 0,
            held: HashMap::new(),
        })
    }

    /// The job's user: the one it holds already, else a free one. Each call is one more
    /// replica of the job; [`UidPool::release`] it when that replica has ended.
    pub fn acquire(&mut self, job: JobId) -> Result<RunAs, IsolationError> {
        if let Some((uid, refs)) = self.held.get_mut(&job) {
            *refs += 1;
            return Ok(RunAs {
                uid: *uid,
                gid: *uid,
            });
        }
        let taken: std::collections::HashSet<u32> = self.held.values().map(|(u, _)| *u).collect();
        for i in 0..self.count {
            let off = (self.next + i) % self.count;
            let uid = self.base + off;
            if !taken.contains(&uid) {
                self.next = (off + 1) % self.count;
                self.held.insert(job, (uid, 1));
                return Ok(RunAs { uid, gid: uid });
            }
        }
        Err(IsolationError::Exhausted {
            base: self.base,
            count: self.count,
        })
    }

    /// One replica of the job has ended. Returns the uid when it was the job's last one on
    /// the node: the caller then clears what the user left ([`reclaim`]).
    pub fn release(&mut self, job: JobId) -> Option<u32> {
        let (uid, refs) = self.held.get_mut(&job)?;
        *refs -= 1;
        if *refs > 0 {
            return None;
        }
        let uid = *uid;
        self.held.remove(&job);
        Some(uid)
    }
}

/// The real, effective, saved and filesystem uids of a process, from `/proc/<pid>/status`.
fn uids_of(status: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut it = line.split_whitespace().map(|v| v.parse::<u32>().ok());
    Some([it.next()??, it.next()??, it.next()??, it.next()??])
}

/// The agent's effective uid.
pub fn effective_uid() -> Result<u32, IsolationError> {
    let p = Path::new("/proc/self/status");
    let status = std::fs::read_to_string(p).map_err(io("reading", p))?;
    uids_of(&status)
        .map(|u| u[1])
        .ok_or_else(|| IsolationError::Io {
            what: "reading",
            path: p.to_owned(),
            source: std::io::Error::other("no Uid line"),
        })
}

/// Checks, before any replica starts, that the agent can switch users and that the users
/// can reach the work directory (every folder above it searchable by others).
pub fn check_can_isolate(work_dir: &Path) -> Result<(), IsolationError> {
    let uid = effective_uid()?;
    if uid != 0 {
        return Err(IsolationError::NotRoot(uid));
    }
    let abs = std::fs::canonicalize(work_dir).map_err(io("resolving", work_dir))?;
    for dir in abs.ancestors().skip(1) {
        let mode = std::fs::metadata(dir).map_err(io("reading", dir))?.mode();
        if mode & 0o001 == 0 {
            return Err(IsolationError::Unreachable(dir.to_owned()));
        }
    }
    Ok(())
}

/// Sets a path's mode (without following a link at `p`: links are left alone).
pub fn set_mode(p: &Path, mode: u32) -> Result<(), IsolationError> {
    let meta = std::fs::symlink_metadata(p).map_err(io("reading", p))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(io("setting the mode of", p))
}

/// Creates `dir` and the folders above it that are missing, each with `mode`.
pub fn create_dirs(dir: &Path, mode: u32) -> Result<(), IsolationError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(io("creating", dir))
}

/// A folder only `owner` may use (0700), created if missing. Its parent must not be
/// writable by `owner`, or the folder could be swapped under the agent.
pub fn private_dir(dir: &Path, owner: Option<RunAs>) -> Result<(), IsolationError> {
    create_dirs(dir, 0o700)?;
    match owner {
        Some(r) => hand_over(dir, r),
        None => set_mode(dir, 0o700),
    }
}

/// Gives `root` and everything in it to `to`, folders made 0700. Bottom-up: a folder is
/// handed over only once its contents are, so the user can never change a folder the agent
/// is still walking. Links are not followed (their own owner changes); a file with several
/// hard links is left as it is.
pub fn hand_over(root: &Path, to: RunAs) -> Result<(), IsolationError> {
    let meta = std::fs::symlink_metadata(root).map_err(io("reading", root))?;
    if !meta.is_dir() && meta.nlink() > 1 {
        // Its inode has another name, perhaps outside the job's folders (the agent's
        // credential, hard-linked in): it stays whose it is.
        tracing::warn!(path = %root.display(), "a file with several links is not handed to the workload");
        return Ok(());
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(root).map_err(io("listing", root))? {
            let entry = entry.map_err(io("listing", root))?;
            hand_over(&entry.path(), to)?;
        }
        set_mode(root, 0o700)?;
    }
    std::os::unix::fs::lchown(root, Some(to.uid), Some(to.gid)).map_err(io("handing over", root))
}

/// Takes `root` and everything in it back for the agent (`owner`), top-down: a folder
/// becomes the agent's before it is listed, after which its user can no longer change it.
/// With `expect` set, every entry must have been that user's (a file of anyone else, such
/// as a hard link to the agent's files, is refused). Set-id bits are dropped.
pub fn take_back(root: &Path, owner: RunAs, expect: Option<u32>) -> Result<(), IsolationError> {
    let meta = std::fs::symlink_metadata(root).map_err(io("reading", root))?;
    if let Some(uid) = expect
        && meta.uid() != uid
    {
        return Err(IsolationError::Foreign {
            path: root.to_owned(),
            owner: meta.uid(),
        });
    }
    std::os::unix::fs::lchown(root, Some(owner.uid), Some(owner.gid))
        .map_err(io("taking back", root))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if meta.is_file() || meta.is_dir() {
        set_mode(root, meta.mode() & 0o777)?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(root).map_err(io("listing", root))? {
            let entry = entry.map_err(io("listing", root))?;
            take_back(&entry.path(), owner, expect)?;
        }
    }
    Ok(())
}

/// Kills every process still running as `uid` (a workload's children that left its process
/// group), until none is left or a few rounds have passed. Returns how many were signalled.
pub fn kill_user(uid: u32) -> usize {
    let mut killed = 0;
    for _ in 0..10 {
        let mut found = 0;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return killed;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
                continue;
            };
            if uids_of(&status).is_some_and(|u| u.contains(&uid)) {
                found += 1;
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if found == 0 {
            break;
        }
        killed += found;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    killed
}

/// After a job's last replica on the node: kills what still runs as its user and takes its
/// folders back, so the uid owns nothing when it goes to another job.
pub fn reclaim(uid: u32, job_dir: &Path, agent: RunAs) {
    let killed = kill_user(uid);
    if killed > 0 {
        tracing::warn!(
            uid,
            killed,
            "killed processes the job's replicas left behind"
        );
    }
    if job_dir.exists()
        && let Err(e) = take_back(job_dir, agent, None)
    {
        tracing::error!(error = %e, uid, "cannot take back the job's folders");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: u64) -> JobId {
        JobId::new_at(n, u128::from(n))
    }

    #[test]
    fn each_job_holds_its_own_uid_until_its_last_replica_ends() {
        let mut pool = UidPool::new(200_000, 3).expect("pool");
        let a = pool.acquire(job(1)).expect("a");
        let a2 = pool.acquire(job(1)).expect("a again");
        let b = pool.acquire(job(2)).expect("b");
        assert_eq!(a, a2);
        assert_ne!(a.uid, b.uid);
        assert_eq!(a.uid, a.gid);
        assert_eq!(
            pool.release(job(1)),
            None,
            "one replica of job 1 still runs"
        );
        assert_eq!(pool.release(job(1)), Some(a.uid));
        // A uid just freed comes back last.
        let c = pool.acquire(job(3)).expect("c");
        assert!(c.uid != a.uid && c.uid != b.uid, "{c:?}");
        let d = pool.acquire(job(4)).expect("d");
        assert_eq!(d.uid, a.uid);
        assert!(matches!(
            pool.acquire(job(5)),
            Err(IsolationError::Exhausted { .. })
        ));
    }

    #[test]
    fn a_uid_range_over_system_accounts_or_the_top_is_refused() {
        assert!(UidPool::new(0, 10).is_err());
        assert!(UidPool::new(999, 10).is_err());
        assert!(UidPool::new(200_000, 0).is_err());
        assert!(UidPool::new(u32::MAX - 10, 10).is_err());
        assert!(UidPool::new(DEFAULT_UID_BASE, DEFAULT_UID_COUNT).is_ok());
    }

    #[test]
    fn the_uid_lines_of_a_process_status_are_read() {
        let s = "Name:\tbash\nUid:\t0\t200001\t0\t200001\nGid:\t0\t0\t0\t0\n";
        assert_eq!(uids_of(s), Some([0, 200_001, 0, 200_001]));
        assert_eq!(uids_of("Name:\tx\n"), None);
    }

    #[test]
    fn taking_back_refuses_a_file_the_job_did_not_make() {
        if effective_uid().ok() != Some(0) {
            eprintln!("skipped: needs root to change owners");
            return;
        }
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("ckpt");
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        std::fs::write(dir.join("sub/mine"), b"x").expect("write");
        let user = RunAs {
            uid: 200_777,
            gid: 200_777,
        };
        let agent = RunAs { uid: 0, gid: 0 };
        hand_over(&dir, user).expect("hand over");
        let m = std::fs::metadata(dir.join("sub/mine")).expect("meta");
        assert_eq!((m.uid(), m.gid()), (200_777, 200_777));
        assert_eq!(std::fs::metadata(&dir).expect("meta").mode() & 0o777, 0o700);
        take_back(&dir, agent, Some(user.uid)).expect("the job's own files");
        assert_eq!(
            std::fs::metadata(dir.join("sub/mine")).expect("meta").uid(),
            0
        );
        hand_over(&dir, user).expect("hand over again");
        // A file of the agent's inside (as a hard link to its credential would be).
        std::fs::write(dir.join("sub/theirs"), b"secret").expect("write");
        std::os::unix::fs::lchown(dir.join("sub/theirs"), Some(0), Some(0)).expect("chown");
        assert!(matches!(
            take_back(&dir, agent, Some(user.uid)),
            Err(IsolationError::Foreign { .. })
        ));
        // A hard link of the agent's file is never handed over.
        std::fs::remove_file(dir.join("sub/theirs")).expect("rm");
        let secret = tmp.path().join("credential.json");
        std::fs::write(&secret, b"secret").expect("write");
        std::fs::hard_link(&secret, dir.join("sub/link")).expect("link");
        hand_over(&dir, user).expect("hand over");
        assert_eq!(std::fs::metadata(&secret).expect("meta").uid(), 0);
        assert_eq!(
            std::fs::metadata(dir.join("sub/mine")).expect("meta").uid(),
            200_777
        );
    }
}
