use std::path::Path;

use proptest::prelude::*;

use super::optimal::{self, Scripted};
use super::*;

const S: f64 = 1.0;
const O: f64 = 3.0;

/// A trace of one-hour ticks: `s` = spot available, `.` = not.
fn trace(s: &str) -> Trace {
    Trace {
        gap_seconds: 3600,
        available: s.chars().map(|c| c == 's').collect(),
        spot_prices: None,
    }
}

fn model(trace_text: &str, work: u32, deadline: u32, restart: u32) -> Model {
    let params = Params {
        work_hours: f64::from(work),
        deadline_hours: f64::from(deadline),
        restart_hours: f64::from(restart),
        spot_price: SpotPrice::Fixed(S),
        on_demand_price: O,
    };
    match Model::new(&trace(trace_text), &params) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    }
}

/// (cost in USD, finish tick, deadline met, spot ticks, on-demand ticks, restarts).
fn summary(m: &Model, name: PolicyName) -> (f64, u32, bool, u64, u64, u32) {
    let o = run(m, name);
    (
        m.usd(o.cost),
        o.finish,
        o.deadline_met,
        o.spot_ticks,
        o.on_demand_ticks,
        o.restarts,
    )
}

#[test]
fn hours_become_ticks_conservatively() {
    let t = Trace {
        gap_seconds: 32,
        available: vec![true; 20_000],
        spot_prices: None,
    };
    let p = Params {
        work_hours: 48.0,
        deadline_hours: 52.0,
        restart_hours: 0.05,
        spot_price: SpotPrice::Fixed(0.918),
        on_demand_price: 3.06,
    };
    let m = Model::new(&t, &p).expect("valid");
    // 48 h = 5400 ticks exactly; 52 h = 5850; 180 s = 5.6 ticks, rounded up to 6.
    assert_eq!((m.work, m.deadline, m.restart), (5400, 5850, 6));
    let m = Model::new(
        &t,
        &Params {
            work_hours: 48.001,
            deadline_hours: 52.001,
            ..p
        },
    )
    .expect("valid");
    assert_eq!((m.work, m.deadline), (5401, 5850));
}

#[test]
fn on_demand_costs_exactly_one_restart_and_the_work_at_its_price() {
    let m = model("..........", 5, 10, 1);
    assert_eq!(summary(&m, PolicyName::OnDemand), (18.0, 6, true, 0, 6, 1));
    let m = model("ssssssssss", 5, 10, 0);
    assert_eq!(summary(&m, PolicyName::OnDemand), (15.0, 5, true, 0, 5, 1));
}

#[test]
fn greedy_waits_out_an_early_outage_and_uniform_progress_pays_on_demand_for_it() {
    // Four hours without spot, then spot to the deadline.
    let m = model("....ssssssss", 6, 12, 1);
    assert_eq!(summary(&m, PolicyName::Greedy), (7.0, 11, true, 7, 0, 1));
    // UP is behind its line from tick 1: on-demand (restart at 1, work 2..=5); the line
    // `ep(t + 2) ≤ cp(t)` holds again at tick 6, where it takes the spot.
    assert_eq!(
        summary(&m, PolicyName::UniformProgress),
        (18.0, 9, true, 3, 5, 2)
    );
    assert_eq!(summary(&m, PolicyName::Optimal), (7.0, 11, true, 7, 0, 1));
}

#[test]
fn greedy_and_uniform_progress_on_a_mid_outage() {
    // Spot for three hours, six hours of outage, spot for the last three.
    let m = model("sss......sss", 6, 12, 1);
    // Greedy: spot 0..=2 (2 h of work), waits until the slack is 2R at tick 6, then
    // on-demand to the end.
    assert_eq!(summary(&m, PolicyName::Greedy), (18.0, 11, true, 3, 5, 2));
    // UP: on the line at ticks 3 and 4, behind at 5: on-demand from 5, and still behind
    // `ep(t + 2)` when spot returns at 9, so it finishes on on-demand.
    assert_eq!(
        summary(&m, PolicyName::UniformProgress),
        (18.0, 10, true, 3, 5, 2)
    );
    // The optimum uses both spot windows and a short on-demand run between them.
    assert_eq!(summary(&m, PolicyName::Optimal), (15.0, 12, true, 6, 3, 3));
}

#[test]
fn greedy_commits_to_on_demand_when_the_slack_is_two_restarts() {
    let m = model("............", 6, 12, 2);
    // Slack 6 at tick 0, 2R = 4: waits ticks 0 and 1, on-demand from tick 2.
    assert_eq!(summary(&m, PolicyName::Greedy), (24.0, 10, true, 0, 8, 1));
}

#[test]
fn an_infeasible_deadline_is_missed_by_everyone_and_reported() {
    let m = model("ssssss", 5, 5, 1);
    assert!(!m.feasible());
    for name in PolicyName::ALL {
        let o = run(&m, name);
        assert!(!o.deadline_met, "{name}");
        assert_eq!(o.finish, 6, "{name}");
    }
    assert!(optimal::solve(&m).is_none());
}

#[test]
fn a_trace_shorter_than_the_deadline_is_refused() {
    let params = Params {
        work_hours: 2.0,
        deadline_hours: 10.0,
        restart_hours: 0.1,
        spot_price: SpotPrice::Fixed(S),
        on_demand_price: O,
    };
    let err = Model::new(&trace("ssss"), &params).expect_err("too short");
    assert!(matches!(
        err,
        ModelError::TraceTooShort {
            trace_ticks: 4,
            deadline_ticks: 10,
            ..
        }
    ));
}

#[test]
fn every_parameter_problem_is_reported_at_once() {
    let params = Params {
        work_hours: 0.0,
        deadline_hours: -1.0,
        restart_hours: f64::NAN,
        spot_price: SpotPrice::Trace,
        on_demand_price: 3.0,
    };
    match Model::new(&trace("ssss"), &params) {
        Err(ModelError::Invalid(problems)) => assert_eq!(problems.len(), 4, "{problems:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_trace_prices_are_used_tick_by_tick() {
    let mut t = trace("ssss");
    t.spot_prices = Some(vec![1.0, 2.0, 3.0, 4.0]);
    let params = Params {
        work_hours: 3.0,
        deadline_hours: 4.0,
        restart_hours: 1.0,
        spot_price: SpotPrice::Trace,
        on_demand_price: 9.0,
    };
    let m = Model::new(&t, &params).expect("valid");
    // Slack 1 < 2R: no online policy may risk spot; the optimum knows spot stays.
    assert_eq!(m.usd(run(&m, PolicyName::Greedy).cost), 36.0);
    assert_eq!(m.usd(run(&m, PolicyName::Optimal).cost), 10.0);
}

#[test]
fn trace_files_are_parsed_and_errors_name_the_file() {
    let p = Path::new("x/us-east-1a_v100_1.json");
    let t = trace::parse(p, br#"{"metadata":{"gap_seconds":195},"data":[0,1,0]}"#).expect("valid");
    assert_eq!(t.gap_seconds, 195);
    assert_eq!(t.available, vec![true, false, true]);
    let t = trace::parse(
        p,
        br#"{"metadata":{"gap_seconds":32},"data":[0,0],"prices":[0.918,0.918]}"#,
    )
    .expect("valid");
    assert_eq!(t.spot_prices, Some(vec![0.918, 0.918]));
    for bad in [
        &b"{not json"[..],
        br#"{"metadata":{},"data":[0]}"#,
        br#"{"metadata":{"gap_seconds":0},"data":[0]}"#,
        br#"{"metadata":{"gap_seconds":30},"data":[]}"#,
        br#"{"metadata":{"gap_seconds":30},"data":["x"]}"#,
        br#"{"metadata":{"gap_seconds":30},"data":[0,0],"prices":[1.0]}"#,
    ] {
        let e = trace::parse(p, bad).expect_err("invalid");
        assert!(
            e.to_string().contains("us-east-1a_v100_1.json"),
            "{e} for {}",
            String::from_utf8_lossy(bad)
        );
    }
    let e = trace::load(Path::new("/nonexistent/trace.json")).expect_err("missing");
    assert!(e.to_string().contains("/nonexistent/trace.json"), "{e}");
}

#[test]
fn policy_lists_expand_all_and_refuse_unknown_names() {
    assert_eq!(
        PolicyName::parse_list(&["all"]).expect("valid"),
        PolicyName::ALL.to_vec()
    );
    assert_eq!(
        PolicyName::parse_list(&["greedy", "optimal"]).expect("valid"),
        vec![PolicyName::Greedy, PolicyName::Optimal]
    );
    assert!(PolicyName::parse_list(&["fastest"]).is_err());
}

/// The least cost over every schedule, by enumeration (tiny models only).
fn brute_force(m: &Model) -> Option<u64> {
    let d = m.deadline as usize;
    let options = [
        Choice::Wait,
        Choice::Run(Kind::Spot),
        Choice::Run(Kind::OnDemand),
    ];
    let mut best: Option<u64> = None;
    let mut choices = vec![Choice::Wait; d];
    for code in 0..3usize.pow(d as u32) {
        let mut c = code;
        let mut valid = true;
        for (t, slot) in choices.iter_mut().enumerate() {
            *slot = options[c % 3];
            c /= 3;
            if *slot == Choice::Run(Kind::Spot) && !m.available[t] {
                valid = false;
            }
        }
        if !valid {
            continue;
        }
        let o = simulate(m, &mut Scripted { choices: &choices });
        if o.deadline_met {
            best = Some(best.map_or(o.cost, |b| b.min(o.cost)));
        }
    }
    best
}

/// A random model: a trace of runs of availability, and a job on it.
fn arb_model(max_len: usize) -> impl Strategy<Value = Model> {
    (
        prop::collection::vec((any::<bool>(), 1usize..8), 1..12),
        1usize..=max_len,
        0u32..4,
        prop::sample::select(vec![(1.0, 3.0), (0.918, 3.06), (2.0, 2.5)]),
        0.0f64..1.0,
    )
        .prop_map(move |(runs, len, restart, (s, o), work_frac)| {
            let mut available: Vec<bool> = runs
                .iter()
                .flat_map(|&(a, n)| std::iter::repeat_n(a, n))
                .collect();
            available.resize(len.max(available.len()), false);
            let deadline = len as u32;
            let work = 1 + (work_frac * f64::from(deadline)) as u32;
            let t = Trace {
                gap_seconds: 3600,
                available,
                spot_prices: None,
            };
            let p = Params {
                work_hours: f64::from(work.min(deadline)),
                deadline_hours: f64::from(deadline),
                restart_hours: f64::from(restart),
                spot_price: SpotPrice::Fixed(s),
                on_demand_price: o,
            };
            Model::new(&t, &p).expect("valid by construction")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn no_online_policy_misses_a_feasible_deadline_and_none_beats_the_optimum(
        m in arb_model(60),
    ) {
        let best = run(&m, PolicyName::Optimal);
        if m.feasible() {
            prop_assert!(best.deadline_met);
            let plan = optimal::solve(&m).expect("feasible");
            prop_assert_eq!(plan.cost, best.cost, "the plan replays at its own cost");
        }
        for name in [
            PolicyName::OnDemand,
            PolicyName::Greedy,
            PolicyName::UniformProgress,
            PolicyName::Spotplane,
        ] {
            let o = run(&m, name);
            prop_assert_eq!(o.deadline_met, m.feasible(), "{}", name);
            if m.feasible() {
                prop_assert!(
                    best.cost <= o.cost,
                    "{} beat the optimum: {} < {}", name, o.cost, best.cost
                );
            }
            // Billed time is the work plus at most one restart per start, at the two prices.
            let billed = o.spot_ticks + o.on_demand_ticks;
            prop_assert!(billed >= u64::from(m.work) + u64::from(m.restart));
            let most = u64::from(m.work) + u64::from(o.restarts) * u64::from(m.restart);
            prop_assert!(billed <= most);
            prop_assert_eq!(
                o.cost,
                o.spot_ticks * m.spot_price[0] + o.on_demand_ticks * m.on_demand_price
            );
        }
    }

    #[test]
    fn the_optimum_is_the_least_cost_over_every_schedule(m in arb_model(8)) {
        let dp = optimal::solve(&m).map(|p| p.cost);
        prop_assert_eq!(dp, brute_force(&m));
    }

    #[test]
    fn spotplane_never_misses_a_feasible_deadline_on_long_traces(m in arb_model(400)) {
        if m.feasible() {
            prop_assert!(run(&m, PolicyName::Spotplane).deadline_met);
            prop_assert!(run(&m, PolicyName::UniformProgress).deadline_met);
            prop_assert!(run(&m, PolicyName::Greedy).deadline_met);
        }
    }
}

/// Chooses at random (seeded), without any care for the deadline.
struct Reckless(u64);

impl Policy for Reckless {
    fn decide(&mut self, _: &View<'_>) -> Choice {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        match self.0 >> 62 {
            0 => Choice::Wait,
            1 => Choice::Run(Kind::OnDemand),
            _ => Choice::Run(Kind::Spot),
        }
    }
}

struct Guarded<P>(P);

impl<P: Policy> Policy for Guarded<P> {
    fn decide(&mut self, v: &View<'_>) -> Choice {
        let wanted = self.0.decide(v);
        policies::guard(v, wanted)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn any_policy_behind_the_guard_meets_a_feasible_deadline(
        m in arb_model(120),
        seed in any::<u64>(),
    ) {
        let o = simulate(&m, &mut Guarded(Reckless(seed)));
        prop_assert_eq!(o.deadline_met, m.feasible());
    }
}

#[test]
fn spotplane_on_the_outage_tables() {
    let m = model("....ssssssss", 6, 12, 1);
    assert_eq!(summary(&m, PolicyName::Spotplane), (7.0, 11, true, 7, 0, 1));
    let m = model("sss......sss", 6, 12, 1);
    let (cost, _, met, ..) = summary(&m, PolicyName::Spotplane);
    assert!(met);
    assert!(cost <= 18.0, "{cost}");
}

#[test]
fn spotplane_weighs_the_recent_past_of_a_pool_more() {
    // Three days of spot back once a day, and three days of spot back every other hour.
    let rare = "s".to_owned() + &".".repeat(23);
    let (rare, often) = (rare.repeat(3), "s.".repeat(36));
    // The chance that an outage seen for an hour (the second class on hour-long ticks) is
    // over at the next tick.
    let regain = |text: &str| {
        let m = model(text, 140, 144, 1);
        let mut p = policies::Spotplane::default();
        simulate(&m, &mut p);
        p.chain(3600).unavailable[1].ends
    };
    let (rare_then_often, often_then_rare) = (
        regain(&format!("{rare}{often}")),
        regain(&format!("{often}{rare}")),
    );
    // The same ticks in either order (counted alike, both would be 0.85); the last days
    // decide.
    assert!(rare_then_often > 0.8, "{rare_then_often}");
    assert!(often_then_rare < 0.6, "{often_then_rare}");
}

#[test]
fn before_anything_is_seen_spotplane_plans_with_its_prior() {
    let prior = policies::Prior {
        available_hours: [0.5, 1.0, 3.0],
        unavailable_hours: [1.0, 2.0, 6.0],
        weight_hours: 10.0,
    };
    // Ticks of six minutes: a run believed to last L hours ends with 1 / (10 L) per tick.
    let c = policies::Spotplane::with_prior(prior).chain(360);
    let ends = |classes: &[markov::Class]| classes.iter().map(|c| c.ends).collect::<Vec<_>>();
    let near = |a: Vec<f64>, b: [f64; 3]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    assert!(near(ends(&c.available), [0.2, 0.1, 1.0 / 30.0]), "{c:?}");
    assert!(near(ends(&c.unavailable), [0.1, 0.05, 1.0 / 60.0]), "{c:?}");
    // The classes' lengths in ticks: 15 minutes and 45 minutes of spot, 30 and 90 of outage.
    let ticks = |classes: &[markov::Class]| classes.iter().map(|c| c.ticks).collect::<Vec<_>>();
    assert_eq!(ticks(&c.available)[..2], [2.5, 7.5]);
    assert_eq!(ticks(&c.unavailable)[..2], [5.0, 15.0]);
}

fn job(work: u32, deadline: u32, restart: u32) -> markov::Job {
    markov::Job {
        work,
        deadline,
        restart,
        spot_price: 1.0,
        on_demand_price: 3.0,
    }
}

/// Two classes of a kind of run: young ones end with `young` per tick for `young_ticks`
/// ticks, older ones with `old`.
fn two_classes(young: f64, old: f64, young_ticks: f64) -> Vec<markov::Class> {
    vec![
        markov::Class {
            ends: young,
            ticks: young_ticks,
        },
        markov::Class {
            ends: old,
            ticks: f64::INFINITY,
        },
    ]
}

/// Spot in two age classes; outages in one, ending with `regain` per tick.
fn chain(young: f64, old: f64, young_ticks: f64, regain: f64) -> markov::Chain {
    markov::Chain {
        available: two_classes(young, old, young_ticks),
        unavailable: vec![markov::Class {
            ends: regain,
            ticks: f64::INFINITY,
        }],
    }
}

/// The mode with spot available in class `spot`, or in the youngest outage class.
fn mode(running: Option<Kind>, spot: Option<usize>) -> markov::Mode {
    markov::Mode {
        running,
        spot: spot.map_or(markov::Spot::Unavailable(0), markov::Spot::Available),
    }
}

#[test]
fn the_markov_plan_takes_lasting_spot_and_waits_while_waiting_is_free() {
    let spot = Some(Choice::Run(Kind::Spot));
    let od = Some(Choice::Run(Kind::OnDemand));
    let steady = chain(0.001, 0.001, 2.0, 0.5);
    let p = markov::plan(&job(20, 30, 1), &steady, 0, 30);
    assert_eq!(p.decide(0, 0, mode(None, Some(0))), spot);
    assert_eq!(p.decide(5, 4, mode(Some(Kind::Spot), Some(1))), spot);
    // Spot comes back fast and the slack is ample: wait for it.
    assert_eq!(p.decide(2, 0, mode(None, None)), Some(Choice::Wait));
    // Spot that is rarely back: waiting costs nothing until the slack is one restart, and
    // then on-demand is the only way.
    let scarce = chain(0.5, 0.5, 2.0, 0.001);
    let p = markov::plan(&job(20, 30, 1), &scarce, 0, 30);
    assert_eq!(p.decide(0, 0, mode(None, None)), Some(Choice::Wait));
    assert_eq!(p.decide(9, 0, mode(None, None)), od);
    // Once on on-demand with the slack spent, it stays there.
    assert_eq!(p.decide(12, 2, mode(Some(Kind::OnDemand), Some(1))), od);
    // Outside the planned window there is no advice.
    assert_eq!(p.decide(30, 0, mode(None, None)), None);
}

#[test]
fn the_markov_plan_leaves_on_demand_for_spot_that_has_proved_itself_not_for_a_blip() {
    // Young runs almost always end within a few ticks; a run that got old lasts.
    let blippy = chain(0.8, 0.001, 3.0, 0.2);
    let p = markov::plan(&job(40, 60, 2), &blippy, 0, 60);
    let od = Some(Choice::Run(Kind::OnDemand));
    let spot = Some(Choice::Run(Kind::Spot));
    assert_eq!(p.decide(20, 10, mode(Some(Kind::OnDemand), Some(0))), od);
    assert_eq!(p.decide(20, 10, mode(Some(Kind::OnDemand), Some(1))), spot);
}

#[test]
fn the_markov_plan_waits_out_a_young_outage_and_keeps_on_demand_through_an_old_one() {
    // Half of the outages end within a tick or two; one that has lasted is likely to last.
    let c = markov::Chain {
        available: two_classes(0.02, 0.01, 3.0),
        unavailable: two_classes(0.5, 0.01, 3.0),
    };
    let p = markov::plan(&job(40, 60, 2), &c, 0, 60);
    let on_demand = Some(Kind::OnDemand);
    let outage = |class| markov::Mode {
        running: on_demand,
        spot: markov::Spot::Unavailable(class),
    };
    // With slack to spare, on-demand is given up for spot about to come back...
    assert_eq!(p.decide(5, 2, outage(0)), Some(Choice::Wait));
    // ...but not for spot that is likely gone for long.
    assert_eq!(p.decide(5, 2, outage(1)), Some(Choice::Run(Kind::OnDemand)));
}

#[test]
fn large_plans_coarsen_their_grid_and_still_advise() {
    let c = chain(0.1, 0.01, 10.0, 0.01);
    let p = markov::plan(&job(10_000, 20_000, 4), &c, 0, 2_000);
    assert!(p.bytes() < 100 << 20, "{} bytes", p.bytes());
    assert!(p.decide(0, 0, mode(None, Some(0))).is_some());
    assert!(
        p.decide(1_999, 1_000, mode(Some(Kind::Spot), Some(1)))
            .is_some()
    );
}

#[test]
fn the_optimum_is_no_dearer_than_any_policy_on_the_tables() {
    for (text, work, deadline, restart) in [
        ("....ssssssss", 6, 12, 1),
        ("sss......sss", 6, 12, 1),
        ("s.s.s.s.s.s.s.s.s.s.", 8, 20, 1),
        ("ssssssss............", 10, 20, 2),
        ("............ssssssss", 10, 20, 0),
    ] {
        let m = model(text, work, deadline, restart);
        let best = run(&m, PolicyName::Optimal);
        assert!(best.deadline_met, "{text}");
        for name in PolicyName::ALL {
            let o = run(&m, name);
            assert!(o.deadline_met, "{name} on {text}");
            assert!(
                best.cost <= o.cost,
                "{name} on {text}: {} < {}",
                o.cost,
                best.cost
            );
        }
    }
}
