//! Quotas, borrowing and fair-share order.
//!
//! Vocabulary from Kueue: each team has a nominal quota per resource flavour (a GPU model,
//! counted in thousandths of a GPU, or a MIG profile, counted in instances); teams in a cohort
//! lend each other what they do not use of their nominal quota, up to each lender's lending
//! limit, and borrow up to their own borrowing limit. A team with no quota at all is limited by
//! fair share only. Among teams, the next job comes from the team with the smallest weighted
//! dominant share (DRF): its largest share of any GPU model's capacity or of the CPU, divided by
//! its weight.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use spotplane_core::shape::GpuShape;
use spotplane_core::team::{Quota, QuotaResource};
use spotplane_core::{GpuModel, TeamName};

use super::snapshot::TeamSnap;

/// A quantity of a flavour: milli-GPUs for `Gpu`, instances for `Mig`.
pub type Amount = u64;

#[derive(Debug, Clone)]
pub struct TeamAccount {
    pub name: TeamName,
    pub weight: f64,
    pub cohort: Option<String>,
    cohort_id: Option<usize>,
    quotas: BTreeMap<QuotaResource, Quota>,
    usage: FxHashMap<QuotaResource, Amount>,
    gpu_milli: FxHashMap<GpuModel, u64>,
    cpu_milli: u64,
}

impl TeamAccount {
    fn unlimited(&self) -> bool {
        self.quotas.is_empty()
    }

    fn scale(res: QuotaResource, v: u32) -> Amount {
        match res {
            QuotaResource::Gpu(_) => u64::from(v) * 1000,
            QuotaResource::Mig(_) => u64::from(v),
        }
    }

    pub fn nominal(&self, res: QuotaResource) -> Amount {
        self.quotas
            .get(&res)
            .map_or(0, |q| Self::scale(res, q.nominal))
    }

    pub fn usage(&self, res: QuotaResource) -> Amount {
        self.usage.get(&res).copied().unwrap_or(0)
    }

    fn borrowed(&self, res: QuotaResource) -> Amount {
        self.usage(res).saturating_sub(self.nominal(res))
    }

    /// What this team lends its cohort now: unused nominal, up to its lending limit.
    fn lendable(&self, res: QuotaResource) -> Amount {
        let Some(q) = self.quotas.get(&res) else {
            return 0;
        };
        let unused = self.nominal(res).saturating_sub(self.usage(res));
        match q.lending_limit {
            Some(l) => unused.min(Self::scale(res, l)),
            None => unused,
        }
    }

    /// Whether the team uses more of `res` than its nominal quota.
    pub fn is_borrowing(&self, res: QuotaResource) -> bool {
        !self.unlimited() && self.usage(res) > self.nominal(res)
    }
}

/// Usage and quotas of every team, kept current through the cycle.
#[derive(Debug, Clone)]
pub struct Accounts {
    pub teams: Vec<TeamAccount>,
    by_name: FxHashMap<TeamName, usize>,
    gpu_capacity: FxHashMap<GpuModel, u64>,
    cpu_capacity: u64,
    /// Per (cohort, flavour): what the members lend in all, and what they borrow in all,
    /// kept current by `charge` so that `headroom` is O(1).
    cohort_totals: FxHashMap<(usize, QuotaResource), (Amount, Amount)>,
    cohorts: Vec<String>,
}

impl Accounts {
    pub fn new(
        teams: &[TeamSnap],
        gpu_capacity: FxHashMap<GpuModel, u64>,
        cpu_capacity: u64,
    ) -> Self {
        let mut a = Accounts {
            teams: Vec::new(),
            by_name: FxHashMap::default(),
            gpu_capacity,
            cpu_capacity,
            cohort_totals: FxHashMap::default(),
            cohorts: Vec::new(),
        };
        for t in teams {
            a.add(t.name.clone(), t.weight, t.cohort.clone(), t.quotas.clone());
        }
        a
    }

    fn add(
        &mut self,
        name: TeamName,
        weight: f64,
        cohort: Option<String>,
        quotas: BTreeMap<QuotaResource, Quota>,
    ) -> usize {
        let i = self.teams.len();
        self.by_name.insert(name.clone(), i);
        let cohort_id = cohort
            .as_ref()
            .map(|c| match self.cohorts.iter().position(|x| x == c) {
                Some(id) => id,
                None => {
                    self.cohorts.push(c.clone());
                    self.cohorts.len() - 1
                }
            });
        if let Some(c) = cohort_id {
            for (res, q) in &quotas {
                let lend = TeamAccount::scale(
                    *res,
                    q.lending_limit.map_or(q.nominal, |l| l.min(q.nominal)),
                );
                self.cohort_totals.entry((c, *res)).or_insert((0, 0)).0 += lend;
            }
        }
        self.teams.push(TeamAccount {
            name,
            weight: if weight.is_finite() && weight > 0.0 {
                weight
            } else {
                1.0
            },
            cohort,
            cohort_id,
            quotas,
            usage: FxHashMap::default(),
            gpu_milli: FxHashMap::default(),
            cpu_milli: 0,
        });
        i
    }

    /// The team's index; a team the snapshot did not describe gets weight 1 and no quotas.
    pub fn team(&mut self, name: &TeamName) -> usize {
        match self.by_name.get(name) {
            Some(&i) => i,
            None => self.add(name.clone(), 1.0, None, BTreeMap::new()),
        }
    }

    /// The flavour and amount one replica of `shape` on a GPU of `model` counts against.
    pub fn flavour(
        &self,
        team: usize,
        shape: &GpuShape,
        model: Option<GpuModel>,
    ) -> Option<(QuotaResource, Amount)> {
        let model = model?;
        match shape {
            GpuShape::Whole { gpus: 0, .. } => None,
            GpuShape::Mig { profile, .. }
                if self.teams[team]
                    .quotas
                    .contains_key(&QuotaResource::Mig(*profile)) =>
            {
                Some((QuotaResource::Mig(*profile), 1))
            }
            other => Some((QuotaResource::Gpu(model), u64::from(other.gpu_milli()))),
        }
    }

    /// How much more of `res` the team may use now: its unused nominal quota plus what it may
    /// borrow from its cohort. `None` means no limit (a team without quotas).
    pub fn headroom(&self, team: usize, res: QuotaResource) -> Option<Amount> {
        let t = &self.teams[team];
        if t.unlimited() {
            return None;
        }
        let own = t.nominal(res).saturating_sub(t.usage(res));
        let Some(cohort) = t.cohort_id else {
            return Some(own);
        };
        let (lent, borrowed) = self
            .cohort_totals
            .get(&(cohort, res))
            .copied()
            .unwrap_or((0, 0));
        // What the other members do not use of their nominal quota (up to their lending
        // limits), less what every member, this one included, already borrows from it.
        let pool = lent
            .saturating_sub(t.lendable(res))
            .saturating_sub(borrowed);
        let may_borrow = match t.quotas.get(&res).and_then(|q| q.borrowing_limit) {
            Some(limit) => TeamAccount::scale(res, limit).saturating_sub(t.borrowed(res)),
            None => Amount::MAX,
        };
        Some(own + pool.min(may_borrow))
    }

    /// Whether the team may use `amount` more of `res`.
    pub fn allows(&self, team: usize, res: QuotaResource, amount: Amount) -> bool {
        self.headroom(team, res).is_none_or(|h| h >= amount)
    }

    /// Whether `amount` more keeps the team within its own nominal quota (the condition for
    /// reclaiming lent capacity).
    pub fn within_nominal(&self, team: usize, res: QuotaResource, amount: Amount) -> bool {
        let t = &self.teams[team];
        !t.unlimited() && t.usage(res) + amount <= t.nominal(res)
    }

    /// Records (or with `sign = -1`, removes) one replica's usage.
    pub fn charge(
        &mut self,
        team: usize,
        shape: &GpuShape,
        model: Option<GpuModel>,
        cpu_milli: u64,
        sign: i8,
    ) {
        let flavour = self.flavour(team, shape, model);
        let apply = |v: &mut u64, a: u64| {
            if sign >= 0 {
                *v += a;
            } else {
                *v = v.saturating_sub(a);
            }
        };
        if let Some((res, amount)) = flavour {
            let t = &self.teams[team];
            let before = (t.lendable(res), t.borrowed(res));
            apply(self.teams[team].usage.entry(res).or_insert(0), amount);
            let t = &self.teams[team];
            let after = (t.lendable(res), t.borrowed(res));
            if let Some(c) = t.cohort_id {
                let totals = self.cohort_totals.entry((c, res)).or_insert((0, 0));
                totals.0 = (totals.0 + after.0).saturating_sub(before.0);
                totals.1 = (totals.1 + after.1).saturating_sub(before.1);
            }
        }
        let t = &mut self.teams[team];
        if let Some(m) = model {
            apply(
                t.gpu_milli.entry(m).or_insert(0),
                u64::from(shape.gpu_milli()),
            );
        }
        apply(&mut t.cpu_milli, cpu_milli);
    }

    /// Weighted dominant share: the team's largest share of any GPU model's capacity or of
    /// the CPU, divided by its weight. Smaller goes first.
    pub fn dominant_share(&self, team: usize) -> f64 {
        let t = &self.teams[team];
        let mut share: f64 = if self.cpu_capacity > 0 {
            t.cpu_milli as f64 / self.cpu_capacity as f64
        } else {
            0.0
        };
        for (m, used) in &t.gpu_milli {
            if let Some(&cap) = self.gpu_capacity.get(m)
                && cap > 0
            {
                share = share.max(*used as f64 / cap as f64);
            }
        }
        share / t.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team(name: &str, cohort: Option<&str>, quotas: &[(QuotaResource, Quota)]) -> TeamSnap {
        TeamSnap {
            name: name.parse().expect("name"),
            weight: 1.0,
            cohort: cohort.map(str::to_owned),
            quotas: quotas.iter().copied().collect(),
        }
    }

    const H100: QuotaResource = QuotaResource::Gpu(GpuModel::H100_80GB);

    fn q(nominal: u32, borrow: Option<u32>, lend: Option<u32>) -> Quota {
        Quota {
            nominal,
            borrowing_limit: borrow,
            lending_limit: lend,
        }
    }

    fn whole(n: u32) -> GpuShape {
        GpuShape::Whole {
            gpus: n,
            models: vec![],
        }
    }

    #[test]
    fn a_team_borrows_idle_quota_of_its_cohort_up_to_its_limit() {
        let teams = [
            team("a", Some("ml"), &[(H100, q(4, Some(2), None))]),
            team("b", Some("ml"), &[(H100, q(8, None, Some(6)))]),
            team("c", None, &[(H100, q(8, None, None))]),
        ];
        let acc = Accounts::new(&teams, FxHashMap::default(), 0);
        assert_eq!(
            acc.headroom(0, H100),
            Some(6_000),
            "4 own + 2 borrowed (limit)"
        );
        assert_eq!(acc.headroom(1, H100), Some(12_000), "8 own + 4 of a's");
        assert_eq!(
            acc.headroom(2, H100),
            Some(8_000),
            "no cohort, no borrowing"
        );
    }

    #[test]
    fn lending_limits_and_others_borrowing_shrink_the_pool() {
        let teams = [
            team("a", Some("ml"), &[(H100, q(0, None, None))]),
            team("b", Some("ml"), &[(H100, q(8, None, Some(3)))]),
            team("c", Some("ml"), &[(H100, q(0, None, None))]),
        ];
        let mut acc = Accounts::new(&teams, FxHashMap::default(), 0);
        assert_eq!(acc.headroom(0, H100), Some(3_000));
        acc.charge(2, &whole(2), Some(GpuModel::H100_80GB), 0, 1);
        assert_eq!(acc.headroom(0, H100), Some(1_000), "c borrowed 2 of b's 3");
        assert!(acc.teams[2].is_borrowing(H100));
        acc.charge(2, &whole(2), Some(GpuModel::H100_80GB), 0, -1);
        assert!(!acc.teams[2].is_borrowing(H100));
    }

    #[test]
    fn what_a_team_already_borrowed_is_not_offered_to_it_again() {
        let teams = [
            team("a", Some("ml"), &[(H100, q(4, None, None))]),
            team("b", Some("ml"), &[(H100, q(0, None, None))]),
        ];
        let mut acc = Accounts::new(&teams, FxHashMap::default(), 0);
        assert_eq!(acc.headroom(1, H100), Some(4_000));
        acc.charge(1, &whole(3), Some(GpuModel::H100_80GB), 0, 1);
        assert_eq!(
            acc.headroom(1, H100),
            Some(1_000),
            "a lends 4, b holds 3 of them"
        );
        assert_eq!(
            acc.headroom(0, H100),
            Some(4_000),
            "a's nominal stays a's: it can reclaim it"
        );
    }

    #[test]
    fn a_team_without_quotas_is_limited_by_fair_share_only() {
        let mut acc = Accounts::new(&[], FxHashMap::default(), 0);
        let t = acc.team(&"newcomer".parse().expect("name"));
        assert_eq!(acc.headroom(t, H100), None);
        assert!(acc.allows(t, H100, u64::MAX));
    }

    #[test]
    fn dominant_share_is_the_largest_share_over_weight() {
        let mut teams = [team("a", None, &[]), team("b", None, &[])];
        teams[1].weight = 2.0;
        let cap: FxHashMap<GpuModel, u64> =
            [(GpuModel::H100_80GB, 8_000u64), (GpuModel::T4, 4_000)]
                .into_iter()
                .collect();
        let mut acc = Accounts::new(&teams, cap, 100_000);
        acc.charge(0, &whole(2), Some(GpuModel::T4), 10_000, 1);
        acc.charge(1, &whole(2), Some(GpuModel::T4), 10_000, 1);
        assert!((acc.dominant_share(0) - 0.5).abs() < 1e-9);
        assert!((acc.dominant_share(1) - 0.25).abs() < 1e-9);
    }
}
