//! The lab: simulations, replays and benchmark drivers that run the control plane's own parts
//! to measure them, kept apart from the production modules.
//!
//! - [`replay`]: `spotplane replay`, a fleet replay in virtual time (`replay::World`: the
//!   store, the recovery, scheduling and capacity loops, the simulated clouds, one clock);
//! - [`simagent`]: in-process agents for the simulated nodes of `replay` and `demo`;
//! - [`demo`]: `spotplane demo`, the whole system on one machine around a `replay::World`;
//! - [`bench`](mod@bench): `spotplane bench submit` (load on the API) and `bench cycle` (the
//!   leader's cycles on a large queue);
//! - [`finance_week`]: `spotplane bench finance`, a replayed week in the ledger, checked against
//!   the simulated clouds' bills;
//! - [`openb`]: `spotplane bench pack`, the openb packing experiment of FGD over the scheduler's
//!   policies;
//! - [`deadline`]: `spotplane bench deadline`, one deadline-bound job on a Can't Be Late trace,
//!   with its exhaustive searches (`deadline::limits`, tests only);
//! - [`cli`] and [`commands`]: the lab commands' arguments, and the drivers that run them and
//!   print, which `main.rs` dispatches to.
//!
//! The rule: production modules never import the lab. The lab uses production freely — what
//! it measures is the control plane's own store, loops, planner and scheduler — but nothing
//! outside `lab/` names it except `main.rs`, the composition root, which puts the lab's
//! commands in the command tree. The test below holds the rule by reading the sources.
//!
//! Left outside, as production:
//! - `simfront`, the simulated nodes' metadata services and `/sim/control`: `spotplane serve`
//!   mounts it whenever simulated clouds are configured, as the embedded default is, and real
//!   node agents on simulated nodes read their notices from it;
//! - the simulated clouds themselves (`spotplane_providers::sim`; `bench sim` drives their
//!   `sim::replay` from [`commands`]);
//! - the planner's deadline rule (`crate::planner`): it is its own online rule, which the
//!   policies of [`deadline`] are measured against; no production module uses [`deadline`].

pub mod bench;
pub mod cli;
pub mod commands;
pub mod deadline;
pub mod demo;
pub mod finance_week;
pub mod openb;
pub mod replay;
pub mod simagent;

#[cfg(test)]
mod spans;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Every `.rs` file under `dir`, recursively.
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
                .path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }

    /// Whether `text` names the lab: `crate::lab`, or a path through `lab::` (not `gitlab::`).
    fn names_the_lab(text: &str) -> bool {
        text.contains("crate::lab")
            || text.match_indices("lab::").any(|(at, _)| {
                text[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
            })
    }

    #[test]
    fn production_modules_never_name_the_lab() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        let production: Vec<&PathBuf> = files
            .iter()
            .filter(|p| !p.starts_with(src.join("lab")) && **p != src.join("main.rs"))
            .collect();
        // The walk found the crate: a wrong root would pass with nothing read.
        assert!(production.contains(&&src.join("server.rs")));
        let offenders: Vec<String> = production
            .into_iter()
            .filter(|p| {
                let text = std::fs::read_to_string(p)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
                names_the_lab(&text)
            })
            .map(|p| format!("src/{}", p.strip_prefix(&src).unwrap_or(p).display()))
            .collect();
        assert!(
            offenders.is_empty(),
            "production modules name the lab (`crate::lab` or `lab::`); move what they use out \
             of lab/ or invert the dependency: {offenders:?}"
        );
    }

    #[test]
    fn a_path_through_the_lab_is_told_from_a_longer_name() {
        assert!(names_the_lab("use crate::lab::replay;"));
        assert!(names_the_lab("spotplane::lab::demo::run"));
        assert!(names_the_lab("lab::cli::DemoArgs"));
        assert!(!names_the_lab(
            "gitlab::Client; collab::x; the lab's commands"
        ));
    }
}
