use chrono::TimeZone;
use proptest::prelude::*;

use super::*;

fn t(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 7, 1, h, m, 0)
        .single()
        .expect("time")
}

fn node(n: u128) -> NodeId {
    NodeId(uuid::Uuid::from_u128(n))
}

fn job(n: u128) -> JobId {
    JobId(uuid::Uuid::from_u128(n))
}

fn usd(s: &str) -> Micros {
    Micros::parse_usd(s).expect("amount")
}

fn price(at: DateTime<Utc>, p: &str, od: &str) -> Price {
    Price {
        at,
        price: usd(p),
        on_demand: usd(od),
    }
}

fn alloc(
    j: u128,
    team: &str,
    share: Share,
    from: DateTime<Utc>,
    to: Option<DateTime<Utc>>,
) -> AllocSpan {
    AllocSpan {
        job: job(j),
        team_id: team.into(),
        attempt: 0,
        share,
        from,
        to,
    }
}

fn eight_gpu_node() -> NodeInput {
    NodeInput {
        id: node(1),
        market: Market::Spot,
        billed_from: t(0, 0),
        billed_to: None,
        confirmed_until: None,
        until: None,
        gpus: 8,
        cpu_milli: 96_000,
        prices: vec![price(t(0, 0), "8", "32")],
        allocations: Vec::new(),
    }
}

fn sum(lines: &[Line], f: impl Fn(&Line) -> bool) -> Micros {
    lines.iter().filter(|l| f(l)).map(|l| l.cost).sum()
}

#[test]
fn an_empty_node_is_one_idle_line_per_hour_at_its_price() {
    let out = ledger(&[eight_gpu_node()], t(2, 0));
    assert_eq!(out.lines.len(), 2);
    assert!(out.lines.iter().all(|l| l.kind == LineKind::Idle));
    assert_eq!(out.lines[0].cost, usd("8"));
    assert_eq!(out.lines[1].list_cost, usd("32"));
    assert_eq!(out.lines[0].gpu_milli, 8000);
    assert_eq!(
        out.progress,
        [Progress {
            node: node(1),
            until: t(2, 0),
            closed: false
        }]
    );
}

#[test]
fn a_spot_price_change_cuts_the_interval_and_each_part_has_its_price() {
    let mut n = eight_gpu_node();
    n.prices.push(price(t(0, 30), "4", "32"));
    let out = ledger(&[n], t(1, 0));
    let got: Vec<_> = out
        .lines
        .iter()
        .map(|l| (l.start, l.end, l.price, l.cost, l.list_cost))
        .collect();
    assert_eq!(
        got,
        [
            (t(0, 0), t(0, 30), usd("8"), usd("4"), usd("16")),
            (t(0, 30), t(1, 0), usd("4"), usd("2"), usd("16")),
        ]
    );
}

#[test]
fn whole_gpus_mig_slices_and_shared_gpus_pay_by_the_share_they_hold() {
    let mut n = eight_gpu_node();
    // 4 whole GPUs, a 3g MIG instance (3/7 of a GPU), half a GPU: 28000 + 3000 + 3500 of 56000.
    n.allocations = vec![
        alloc(1, "a", Share::Gpus(4), t(0, 0), None),
        alloc(2, "b", Share::MigSlices(3), t(0, 0), None),
        alloc(3, "b", Share::GpuMilli(500), t(0, 0), None),
    ];
    // $7/h for an hour: 7,000,000 micro-dollars in 56000 units, 125 per unit.
    n.prices = vec![price(t(0, 0), "7", "28")];
    let out = ledger(&[n], t(1, 0));
    let by_job: Vec<_> = out
        .lines
        .iter()
        .map(|l| (l.job, l.kind, l.gpu_milli, l.cost))
        .collect();
    assert_eq!(
        by_job,
        [
            (Some(job(1)), LineKind::Usage, 4000, Micros(3_500_000)),
            (Some(job(2)), LineKind::Usage, 429, Micros(375_000)),
            (Some(job(3)), LineKind::Usage, 500, Micros(437_500)),
            (None, LineKind::Idle, 3071, Micros(2_687_500)),
        ]
    );
    assert_eq!(sum(&out.lines, |_| true), usd("7"));
}

#[test]
fn allocations_starting_and_ending_cut_the_time_and_replicas_of_a_job_are_one_line() {
    let mut n = eight_gpu_node();
    n.allocations = vec![
        alloc(1, "a", Share::Gpus(2), t(0, 15), Some(t(0, 45))),
        alloc(1, "a", Share::Gpus(2), t(0, 15), Some(t(0, 45))),
    ];
    let out = ledger(&[n], t(1, 0));
    let got: Vec<_> = out
        .lines
        .iter()
        .map(|l| (l.start, l.kind, l.gpu_milli))
        .collect();
    assert_eq!(
        got,
        [
            (t(0, 0), LineKind::Idle, 8000),
            (t(0, 15), LineKind::Usage, 4000),
            (t(0, 15), LineKind::Idle, 4000),
            (t(0, 45), LineKind::Idle, 8000),
        ]
    );
    // Half the node for half an hour at $8/h.
    assert_eq!(sum(&out.lines, |l| l.kind == LineKind::Usage), usd("2"));
}

#[test]
fn a_node_without_gpus_is_shared_by_cpu() {
    let n = NodeInput {
        gpus: 0,
        cpu_milli: 4000,
        allocations: vec![alloc(1, "a", Share::Cpu(1000), t(0, 0), None)],
        ..eight_gpu_node()
    };
    let out = ledger(&[n], t(1, 0));
    assert_eq!(out.lines[0].cost, usd("2"));
    assert_eq!(out.lines[1].cost, usd("6"));
}

#[test]
fn a_terminated_node_is_closed_and_billed_to_its_end_only() {
    let mut n = eight_gpu_node();
    n.billed_to = Some(t(0, 20));
    let out = ledger(std::slice::from_ref(&n), t(3, 0));
    assert_eq!(sum(&out.lines, |_| true), Micros(2_666_667));
    assert_eq!(
        out.progress[0],
        Progress {
            node: node(1),
            until: t(0, 20),
            closed: true
        }
    );
    n.until = Some(t(0, 20));
    let again = ledger(&[n], t(4, 0));
    assert!(again.lines.is_empty());
    assert!(again.progress[0].closed);
}

#[test]
fn a_running_node_is_billed_only_as_far_as_its_cloud_confirmed_it() {
    // The cloud last showed it at 0:30; the horizon is at 2:00. Its end, heard later, was
    // 0:40: billed to 0:30 first, then to 0:40, never past.
    let mut n = eight_gpu_node();
    n.confirmed_until = Some(t(0, 30));
    let first = ledger(std::slice::from_ref(&n), t(2, 0));
    assert_eq!(first.progress[0].until, t(0, 30));
    assert!(!first.progress[0].closed);
    n.until = Some(t(0, 30));
    n.billed_to = Some(t(0, 40));
    let second = ledger(std::slice::from_ref(&n), t(2, 0));
    assert!(second.progress[0].closed);
    let mut whole = eight_gpu_node();
    whole.billed_to = Some(t(0, 40));
    let at_once = ledger(&[whole], t(2, 0));
    assert_eq!(
        sum(&first.lines, |_| true) + sum(&second.lines, |_| true),
        sum(&at_once.lines, |_| true),
        "in two steps as in one"
    );
    // The horizon still bounds it when the cloud confirmed later.
    let mut ahead = eight_gpu_node();
    ahead.confirmed_until = Some(t(5, 0));
    assert_eq!(ledger(&[ahead], t(1, 0)).progress[0].until, t(1, 0));
}

#[test]
fn the_largest_remainder_goes_first_and_parts_sum_to_the_whole() {
    assert_eq!(
        apportion(Micros(10), &[1, 1, 1]),
        [Micros(4), Micros(3), Micros(3)]
    );
    assert_eq!(apportion(Micros(100), &[1, 2]), [Micros(33), Micros(67)]);
    assert_eq!(apportion(Micros(5), &[0, 0]), [Micros::ZERO, Micros(5)]);
    assert_eq!(
        apportion(Micros(-10), &[1, 1, 1]),
        [Micros(-4), Micros(-3), Micros(-3)]
    );
    assert!(apportion(Micros(5), &[]).is_empty());
}

#[test]
fn lost_work_is_priced_from_the_usage_lines_it_overlaps() {
    let mut n = eight_gpu_node();
    n.allocations = vec![alloc(1, "a", Share::Gpus(8), t(0, 0), Some(t(2, 0)))];
    let out = ledger(&[n], t(2, 0));
    let lost = price_lost_work(
        &[LostRun {
            job: job(1),
            team_id: "a".into(),
            since: t(0, 30),
            lost_at: t(1, 30),
        }],
        &out.lines,
    );
    // An hour of the whole $8/h node, in two memo lines (one per hour line it overlaps).
    assert_eq!(lost.len(), 2);
    assert!(lost.iter().all(|l| l.kind == LineKind::LostWork));
    assert_eq!(lost.iter().map(|l| l.cost).sum::<Micros>(), usd("8"));
    assert_eq!(lost.iter().map(|l| l.list_cost).sum::<Micros>(), usd("32"));
}

#[test]
fn budget_alerts_fire_once_per_threshold_and_month() {
    let b = usd("100");
    let cases = [
        (usd("49.99"), None, None),
        (usd("50"), None, Some(50)),
        (usd("60"), Some(("2026-07", 50)), None),
        (usd("85"), Some(("2026-07", 50)), Some(80)),
        (usd("120"), Some(("2026-07", 50)), Some(100)),
        (usd("120"), Some(("2026-07", 100)), None),
        (usd("55"), Some(("2026-06", 100)), Some(50)),
    ];
    for (spent, alerted, want) in cases {
        assert_eq!(
            budget_alert("2026-07", spent, b, alerted),
            want,
            "{spent} {alerted:?}"
        );
    }
    assert_eq!(budget_alert("2026-07", usd("5"), Micros::ZERO, None), None);
}

/// A random node: prices changing at random minutes, allocations of random shares.
fn arb_node() -> impl Strategy<Value = NodeInput> {
    let prices = proptest::collection::vec((1u32..600, 1i64..50_000_000), 0..8);
    let allocs =
        proptest::collection::vec((0u32..600, 1u32..600, 0u8..4, 1u32..1000, 0u128..5), 0..8);
    (prices, allocs, 1i64..60_000_000, 1u32..9).prop_map(|(ps, al, first, gpus)| {
        let start = t(0, 0);
        let mut prices = vec![Price {
            at: start,
            price: Micros(first),
            on_demand: Micros(first * 3),
        }];
        let mut ps = ps;
        ps.sort_unstable();
        ps.dedup_by_key(|p| p.0);
        for (m, p) in ps {
            prices.push(Price {
                at: start + Duration::seconds(i64::from(m) * 61),
                price: Micros(p),
                on_demand: Micros(first * 3),
            });
        }
        // Shares that fit: at most one GPU each, and at most `gpus` of them.
        let allocations = al
            .into_iter()
            .take(gpus as usize)
            .map(|(from, len, kind, milli, j)| {
                let share = match kind {
                    0 => Share::Gpus(1),
                    1 => Share::MigSlices((milli % 7 + 1) as u8),
                    2 => Share::GpuMilli(milli),
                    _ => Share::Cpu(u64::from(milli)),
                };
                let from = start + Duration::seconds(i64::from(from) * 53);
                alloc(
                    j,
                    "t",
                    share,
                    from,
                    Some(from + Duration::seconds(i64::from(len) * 47)),
                )
            })
            .collect();
        NodeInput {
            id: node(9),
            market: Market::Spot,
            billed_from: start,
            billed_to: Some(start + Duration::hours(9) + Duration::seconds(17)),
            confirmed_until: None,
            until: None,
            gpus,
            cpu_milli: 8000,
            prices,
            allocations,
        }
    })
}

/// The whole life of a node at its prices, rounded once: what the cloud bills.
fn whole_life(n: &NodeInput) -> (Micros, Micros) {
    let end = n.billed_to.expect("ends");
    let (mut paid, mut list) = (PriceMillis::default(), PriceMillis::default());
    let mut s = n.billed_from;
    while s < end {
        let e = (s + Duration::seconds(1)).min(end);
        let p = Totals { node: n }.price_at(s);
        paid.add(p.price, (e - s).num_milliseconds());
        list.add(p.on_demand, (e - s).num_milliseconds());
        s = e;
    }
    (
        Micros::from_price_millis(paid),
        Micros::from_price_millis(list),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn however_often_it_runs_a_nodes_lines_sum_to_its_whole_life_billed_once(
        n in arb_node(),
        cuts in proptest::collection::vec(1i64..40_000, 0..6),
    ) {
        let mut horizons: Vec<DateTime<Utc>> =
            cuts.iter().map(|s| t(0, 0) + Duration::seconds(*s)).collect();
        horizons.sort_unstable();
        horizons.push(t(12, 0));
        let mut node = n.clone();
        let mut lines = Vec::new();
        for h in horizons {
            let out = ledger(std::slice::from_ref(&node), h);
            node.until = Some(out.progress[0].until);
            lines.extend(out.lines);
        }
        let (paid, list) = whole_life(&n);
        prop_assert_eq!(lines.iter().map(|l| l.cost).sum::<Micros>(), paid);
        prop_assert_eq!(lines.iter().map(|l| l.list_cost).sum::<Micros>(), list);
        // Lines tile the node's life without gaps or overlaps.
        let mut spans: Vec<_> = lines.iter().map(|l| (l.start, l.end)).collect();
        spans.sort_unstable();
        spans.dedup();
        prop_assert_eq!(spans.first().map(|s| s.0), Some(n.billed_from));
        prop_assert_eq!(spans.last().map(|s| s.1), n.billed_to);
        prop_assert!(spans.windows(2).all(|w| w[0].1 == w[1].0));
        // No line is longer than an hour or crosses an hour.
        prop_assert!(lines.iter().all(|l| l.millis() <= 3_600_000
            && l.start.duration_trunc(Duration::hours(1)).ok()
                == (l.end - Duration::milliseconds(1)).duration_trunc(Duration::hours(1)).ok()));
    }

    #[test]
    fn apportioned_parts_always_sum_to_the_whole_and_follow_the_weights(
        total in 0i64..1_000_000_000_000,
        weights in proptest::collection::vec(0u64..100_000, 1..12),
    ) {
        let parts = apportion(Micros(total), &weights);
        prop_assert_eq!(parts.iter().copied().sum::<Micros>(), Micros(total));
        let sum: u128 = weights.iter().map(|w| u128::from(*w)).sum();
        for (p, w) in parts.iter().zip(&weights) {
            if let Some(q) = (u128::from(total as u64) * u128::from(*w)).checked_div(sum) {
                let floor = q as i64;
                prop_assert!(p.0 == floor || p.0 == floor + 1);
            }
        }
    }
}
