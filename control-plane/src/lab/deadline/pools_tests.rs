use proptest::prelude::*;

use super::*;
use crate::lab::deadline::{self, PolicyName};

/// A trace of one-hour ticks: `s` = spot available, `.` = not.
fn trace(s: &str) -> Trace {
    Trace {
        gap_seconds: 3600,
        available: s.chars().map(|c| c == 's').collect(),
        spot_prices: None,
    }
}

fn params(work: u32, deadline: u32, restart: u32) -> Params {
    Params {
        work_hours: f64::from(work),
        deadline_hours: f64::from(deadline),
        restart_hours: f64::from(restart),
        spot_price: SpotPrice::Fixed(1.0),
        on_demand_price: 3.0,
    }
}

fn model(texts: &[&str], work: u32, deadline: u32, restart: u32, migrate: u32) -> PoolsModel {
    let traces: Vec<Trace> = texts.iter().map(|t| trace(t)).collect();
    let named: Vec<(&str, &Trace)> = traces.iter().map(|t| ("t", t)).collect();
    match PoolsModel::new(
        &named,
        &params(work, deadline, restart),
        &[SpotPrice::Fixed(1.0)],
        f64::from(migrate),
    ) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    }
}

fn usd(m: &PoolsModel, name: PoolPolicyName) -> (f64, bool, u32) {
    let o = run(m, name);
    (m.usd(o.cost), o.deadline_met, o.moves)
}

#[test]
fn traces_of_different_tick_lengths_are_refused_not_resampled() {
    let (a, mut b) = (trace("ssss"), trace("ssss"));
    b.gap_seconds = 195;
    let err = PoolsModel::new(
        &[("a.json", &a), ("b.json", &b)],
        &params(1, 2, 0),
        &[SpotPrice::Fixed(1.0)],
        0.0,
    )
    .expect_err("different ticks");
    let text = err.to_string();
    assert!(
        text.contains("a.json: 3600 s") && text.contains("b.json: 195 s"),
        "{text}"
    );
    let err = PoolsModel::new(
        &[("a", &a), ("b", &trace("ssss"))],
        &params(1, 2, 0),
        &[SpotPrice::Fixed(1.0); 3],
        0.0,
    )
    .expect_err("three prices for two traces");
    assert!(
        err.to_string().contains("3 spot prices for 2 traces"),
        "{err}"
    );
}

#[test]
fn a_move_pays_the_restart_and_the_migration_and_the_checkpoint_follows() {
    // Pool 0 has spot for three hours, then never; pool 1 always. R = 1, M = 2.
    let m = model(&["sss.........", "ssssssssssss"], 6, 12, 1, 2);
    let choices = [
        PoolChoice::Spot(0), // restart
        PoolChoice::Spot(0), // progress 1
        PoolChoice::Spot(0), // progress 2
        PoolChoice::Spot(1), // preempted in 0 at tick 3: restart + migrate in 1 (3 ticks)
        PoolChoice::Spot(1),
        PoolChoice::Spot(1),
        PoolChoice::Spot(1), // progress 3..6
        PoolChoice::Spot(1),
        PoolChoice::Spot(1),
        PoolChoice::Spot(1),
    ];
    let o = simulate(&m, &mut Scripted { choices: &choices });
    assert_eq!(
        (o.finish, o.deadline_met, o.restarts, o.moves, o.preemptions),
        (10, true, 2, 1, 1)
    );
    assert_eq!(m.usd(o.cost), 10.0);
    // Before any progress a start anywhere pays the restart alone.
    let o = simulate(
        &m,
        &mut Scripted {
            choices: &[PoolChoice::Spot(1); 7],
        },
    );
    assert_eq!((o.finish, o.moves, m.usd(o.cost)), (7, 0, 7.0));
    // The optimum sees it: spot in pool 1 from the start, at 7.
    assert_eq!(usd(&m, PoolPolicyName::Optimal), (7.0, true, 0));
}

#[test]
fn a_spot_lost_during_a_move_leaves_the_checkpoint_where_it_was() {
    // Pool 1 has spot for two ticks only after pool 0 is gone: the move (3 ticks) fails.
    let m = model(&["ss..........", "..ss........"], 4, 12, 1, 2);
    let choices = [
        PoolChoice::Spot(0),
        PoolChoice::Spot(0), // progress 1
        PoolChoice::Spot(1), // move started at tick 2, lost at tick 4
        PoolChoice::Spot(1),
        PoolChoice::OnDemand, // at the checkpoint: pool 0's region, R = 1
        PoolChoice::OnDemand,
        PoolChoice::OnDemand,
        PoolChoice::OnDemand,
    ];
    let o = simulate(&m, &mut Scripted { choices: &choices });
    assert_eq!((o.moves, o.preemptions), (0, 2));
    // 2 ticks of spot in 0, 2 in 1, then on-demand: restart and 3 ticks of work.
    assert_eq!((o.finish, m.usd(o.cost)), (8, 4.0 + 4.0 * 3.0));
}

#[test]
fn with_one_pool_every_policy_is_its_single_pool_self() {
    let texts = [
        "ssss..ss.sssss....ssssssss...ssss.s.s.sssssss.....sssss",
        "..........sssss.s.s.s.s.s.sssssssssss...........sssssss",
    ];
    for text in texts {
        for (work, deadline, restart) in [(20, 40, 1), (30, 50, 2), (10, 54, 0)] {
            let many = model(&[text], work, deadline, restart, 3);
            let one = deadline::Model::new(&trace(text), &params(work, deadline, restart))
                .expect("valid");
            for (pools, single) in [
                (PoolPolicyName::OnDemand, PolicyName::OnDemand),
                (PoolPolicyName::UniformProgress, PolicyName::UniformProgress),
                (
                    PoolPolicyName::UniformProgressRr,
                    PolicyName::UniformProgress,
                ),
                (PoolPolicyName::Spotplane, PolicyName::Spotplane),
                (PoolPolicyName::Optimal, PolicyName::Optimal),
            ] {
                let (a, b) = (run(&many, pools), deadline::run(&one, single));
                assert_eq!(
                    (a.cost, a.finish, a.restarts, a.preemptions),
                    (b.cost, b.finish, b.restarts, b.preemptions),
                    "{pools} on {text} with W {work}, D {deadline}, R {restart}"
                );
            }
        }
    }
}

#[test]
fn uniform_progress_on_the_first_pool_ignores_the_others() {
    let m = model(&["..........", "ssssssssss"], 4, 10, 1, 0);
    // Waits while on track, then on-demand: 5 ticks at 3.
    assert_eq!(usd(&m, PoolPolicyName::UniformProgress), (15.0, true, 0));
    // Round robin is preempted only on a pool it ran on; on-demand too.
    assert_eq!(usd(&m, PoolPolicyName::UniformProgressRr).0, 15.0);
    // spotplane and the optimum take pool 1 from the start.
    assert_eq!(usd(&m, PoolPolicyName::Spotplane), (5.0, true, 0));
    assert_eq!(usd(&m, PoolPolicyName::Optimal), (5.0, true, 0));
}

#[test]
fn round_robin_moves_to_the_next_pool_on_preemption() {
    // Pool 0 is lost at tick 3; pool 1 has spot throughout.
    let m = model(
        &["sss...........", "ssssssssssssss", ".............."],
        6,
        14,
        1,
        1,
    );
    let o = run(&m, PoolPolicyName::UniformProgressRr);
    assert!(o.deadline_met);
    assert_eq!((o.preemptions, o.moves), (1, 1));
    // 3 ticks in 0 (restart + 2), R + M + 4 in 1.
    assert_eq!(m.usd(o.cost), 9.0);
}

#[test]
fn spotplane_moves_only_when_the_move_pays() {
    // Pool 0 comes back soon after a short outage; pool 1 is always there. With a cheap move
    // spotplane may leave; with a move as long as the outage it should wait.
    let blip = format!("{}{}{}", "s".repeat(30), "..", "s".repeat(40));
    let always = "s".repeat(72);
    let m = model(&[&blip, &always], 40, 72, 1, 10);
    let (cost, met, moves) = usd(&m, PoolPolicyName::Spotplane);
    assert!(met);
    assert_eq!(moves, 0, "a 10-tick move for a 2-tick outage");
    assert!(cost <= 44.0, "{cost}");
}

/// The least cost over every schedule, by enumeration (tiny models only).
fn brute_force(m: &PoolsModel) -> Option<u64> {
    let d = m.deadline as usize;
    let k = m.pools.len();
    let mut options = vec![PoolChoice::Wait, PoolChoice::OnDemand];
    options.extend((0..k).map(PoolChoice::Spot));
    let n = options.len();
    let mut best: Option<u64> = None;
    let mut choices = vec![PoolChoice::Wait; d];
    'codes: for code in 0..n.pow(d as u32) {
        let mut c = code;
        for (t, slot) in choices.iter_mut().enumerate() {
            *slot = options[c % n];
            c /= n;
            if let PoolChoice::Spot(j) = *slot
                && !m.available_at(j, t as u32)
            {
                continue 'codes;
            }
        }
        let o = simulate(m, &mut Scripted { choices: &choices });
        if o.deadline_met {
            best = Some(best.map_or(o.cost, |b| b.min(o.cost)));
        }
    }
    best
}

/// Random pools of runs of availability, different spot prices, and a job on them.
fn arb_model(max_len: usize, max_pools: usize) -> impl Strategy<Value = PoolsModel> {
    (
        prop::collection::vec(
            (
                prop::collection::vec((any::<bool>(), 1usize..8), 1..12),
                0.5f64..2.0,
            ),
            1..=max_pools,
        ),
        1usize..=max_len,
        0u32..3,
        0u32..3,
        0.0f64..1.0,
    )
        .prop_map(move |(pools, len, restart, migrate, work_frac)| {
            let deadline = len as u32;
            let work = (1 + (work_frac * f64::from(deadline)) as u32).min(deadline);
            let traces: Vec<Trace> = pools
                .iter()
                .map(|(runs, _)| {
                    let mut available: Vec<bool> = runs
                        .iter()
                        .flat_map(|&(a, n)| std::iter::repeat_n(a, n))
                        .collect();
                    available.resize(len.max(available.len()), false);
                    Trace {
                        gap_seconds: 3600,
                        available,
                        spot_prices: None,
                    }
                })
                .collect();
            let named: Vec<(&str, &Trace)> = traces.iter().map(|t| ("t", t)).collect();
            let prices: Vec<SpotPrice> = pools.iter().map(|&(_, s)| SpotPrice::Fixed(s)).collect();
            PoolsModel::new(
                &named,
                &params(work, deadline, restart),
                &prices,
                f64::from(migrate),
            )
            .expect("valid by construction")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn the_optimum_is_the_least_cost_over_every_schedule(m in arb_model(6, 2)) {
        prop_assert_eq!(solve(&m).map(|p| p.cost), brute_force(&m));
    }

    #[test]
    fn the_optimum_is_exact_with_three_pools(m in arb_model(5, 3)) {
        prop_assert_eq!(solve(&m).map(|p| p.cost), brute_force(&m));
    }

    #[test]
    fn no_online_policy_misses_a_feasible_deadline_and_none_beats_the_optimum(
        m in arb_model(120, 3),
    ) {
        let best = run(&m, PoolPolicyName::Optimal);
        if m.feasible() {
            prop_assert!(best.deadline_met);
            prop_assert_eq!(solve(&m).map(|p| p.cost), Some(best.cost));
        }
        for name in [
            PoolPolicyName::OnDemand,
            PoolPolicyName::UniformProgress,
            PoolPolicyName::UniformProgressRr,
            PoolPolicyName::Spotplane,
        ] {
            let o = run(&m, name);
            prop_assert_eq!(o.deadline_met, m.feasible(), "{}", name);
            if m.feasible() {
                prop_assert!(best.cost <= o.cost, "{} beat the optimum", name);
            }
        }
    }
}
