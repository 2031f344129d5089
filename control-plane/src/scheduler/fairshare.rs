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

use spotplane_core::mig::MigProfile;
use spotplane_core::shape::GpuShape;
use spotplane_core::team::{Quota, QuotaResource};
use spotplane_core::{GpuModel, TeamName};

use super::snapshot::TeamSnap;

/// A quantity of a flavour: milli-GPUs for `Gpu`, instances for `Mig`.
pub type Amount = u64;

/// Models are few and fixed: per-model figures live in arrays indexed by the enum.
const MODELS: usize = GpuModel::ALL.len();

/// A team's quota on one flavour, in the flavour's amount (milli-GPUs or instances).
#[derive(Debug, Clone, Copy)]
struct Limits {
    nominal: Amount,
    borrowing: Option<Amount>,
    lending: Option<Amount>,
}

#[derive(Debug, Clone)]
pub struct TeamAccount {
    pub name: TeamName,
    pub weight: f64,
    cohort_id: Option<usize>,
    /// Per flavour slot (see [`Accounts::slot`]); `None`: no quota on it.
    limits: Vec<Option<Limits>>,
    /// Whether the team has any quota at all (a team without is limited by fair share only).
    limited: bool,
    /// Per flavour slot.
    usage: Vec<Amount>,
    gpu_milli: [u64; MODELS],
    cpu_milli: u64,
}

impl TeamAccount {
    fn nominal(&self, slot: usize) -> Amount {
        self.limits
            .get(slot)
            .copied()
            .flatten()
            .map_or(0, |l| l.nominal)
    }

    fn usage(&self, slot: usize) -> Amount {
        self.usage.get(slot).copied().unwrap_or(0)
    }

    fn borrowed(&self, slot: usize) -> Amount {
        self.usage(slot).saturating_sub(self.nominal(slot))
    }

    /// What this team lends its cohort now: unused nominal, up to its lending limit.
    fn lendable(&self, slot: usize) -> Amount {
        let Some(l) = self.limits.get(slot).copied().flatten() else {
            return 0;
        };
        let unused = l.nominal.saturating_sub(self.usage(slot));
        l.lending.map_or(unused, |limit| unused.min(limit))
    }
}

/// Usage and quotas of every team, kept current through the cycle. Flavours are dense slots
/// (GPU models by their enum, then the MIG profiles some quota names), so every question the
/// scheduler asks per queued job is a few array reads.
#[derive(Debug, Clone)]
pub struct Accounts {
    pub teams: Vec<TeamAccount>,
    by_name: FxHashMap<TeamName, usize>,
    gpu_capacity: [u64; MODELS],
    cpu_capacity: u64,
    /// MIG profiles with a quota somewhere; profile `k` is slot `MODELS + k`.
    mig_profiles: Vec<MigProfile>,
    /// Per cohort and flavour slot: what the members lend in all, and what they borrow in
    /// all, kept current by `charge` so that `headroom` is O(1).
    cohort_totals: Vec<Vec<(Amount, Amount)>>,
    cohorts: Vec<String>,
}

impl Accounts {
    pub fn new(
        teams: &[TeamSnap],
        gpu_capacity: FxHashMap<GpuModel, u64>,
        cpu_capacity: u64,
    ) -> Self {
        let mut mig_profiles: Vec<MigProfile> = Vec::new();
        for t in teams {
            for res in t.quotas.keys() {
                if let QuotaResource::Mig(p) = res
                    && !mig_profiles.contains(p)
                {
                    mig_profiles.push(*p);
                }
            }
        }
        let mut capacity = [0; MODELS];
        for (m, cap) in gpu_capacity {
            capacity[m as usize] = cap;
        }
        let mut a = Accounts {
            teams: Vec::new(),
            by_name: FxHashMap::default(),
            gpu_capacity: capacity,
            cpu_capacity,
            mig_profiles,
            cohort_totals: Vec::new(),
            cohorts: Vec::new(),
        };
        for t in teams {
            a.add(t.name.clone(), t.weight, t.cohort.as_deref(), &t.quotas);
        }
        a
    }

    fn slots(&self) -> usize {
        MODELS + self.mig_profiles.len()
    }

    /// The dense slot of a flavour; `None` for a MIG profile no quota names (nobody is
    /// charged for it).
    fn slot(&self, res: QuotaResource) -> Option<usize> {
        match res {
            QuotaResource::Gpu(m) => Some(m as usize),
            QuotaResource::Mig(p) => self
                .mig_profiles
                .iter()
                .position(|q| *q == p)
                .map(|k| MODELS + k),
        }
    }

    fn add(
        &mut self,
        name: TeamName,
        weight: f64,
        cohort: Option<&str>,
        quotas: &BTreeMap<QuotaResource, Quota>,
    ) -> usize {
        let i = self.teams.len();
        self.by_name.insert(name.clone(), i);
        let slots = self.slots();
        let cohort_id = cohort.map(|c| match self.cohorts.iter().position(|x| x == c) {
            Some(id) => id,
            None => {
                self.cohorts.push(c.to_owned());
                self.cohort_totals.push(vec![(0, 0); slots]);
                self.cohorts.len() - 1
            }
        });
        let mut limits = vec![None; slots];
        for (res, q) in quotas {
            let Some(slot) = self.slot(*res) else {
                continue;
            };
            let scale = |v: u32| match res {
                QuotaResource::Gpu(_) => Amount::from(v) * 1000,
                QuotaResource::Mig(_) => Amount::from(v),
            };
            let l = Limits {
                nominal: scale(q.nominal),
                borrowing: q.borrowing_limit.map(scale),
                lending: q.lending_limit.map(scale),
            };
            limits[slot] = Some(l);
            if let Some(c) = cohort_id {
                self.cohort_totals[c][slot].0 += l.lending.map_or(l.nominal, |x| x.min(l.nominal));
            }
        }
        self.teams.push(TeamAccount {
            name,
            weight: if weight.is_finite() && weight > 0.0 {
                weight
            } else {
                1.0
            },
            cohort_id,
            limits,
            limited: !quotas.is_empty(),
            usage: vec![0; slots],
            gpu_milli: [0; MODELS],
            cpu_milli: 0,
        });
        i
    }

    /// The team's index; a team the snapshot did not describe gets weight 1 and no quotas.
    /// Team names and their indexes so far.
    pub fn name_index(&self) -> FxHashMap<TeamName, usize> {
        self.by_name.clone()
    }

    pub fn team(&mut self, name: &TeamName) -> usize {
        match self.by_name.get(name) {
            Some(&i) => i,
            None => self.add(name.clone(), 1.0, None, &BTreeMap::new()),
        }
    }

    /// Whether the team has any quota at all.
    pub fn is_limited(&self, team: usize) -> bool {
        self.teams.get(team).is_some_and(|t| t.limited)
    }

    /// Whether two teams are in the same cohort.
    pub fn same_cohort(&self, a: usize, b: usize) -> bool {
        let cohort = |t: usize| self.teams.get(t).and_then(|t| t.cohort_id);
        cohort(a).is_some() && cohort(a) == cohort(b)
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
                if self
                    .slot(QuotaResource::Mig(*profile))
                    .is_some_and(|s| self.teams[team].limits[s].is_some()) =>
            {
                Some((QuotaResource::Mig(*profile), 1))
            }
            other => Some((QuotaResource::Gpu(model), u64::from(other.gpu_milli()))),
        }
    }

    /// Whether the team uses more of `res` than its nominal quota.
    pub fn is_borrowing(&self, team: usize, res: QuotaResource) -> bool {
        let t = &self.teams[team];
        t.limited && self.slot(res).is_some_and(|s| t.usage(s) > t.nominal(s))
    }

    /// How much more of `res` the team may use now: its unused nominal quota plus what it may
    /// borrow from its cohort. `None` means no limit (a team without quotas).
    pub fn headroom(&self, team: usize, res: QuotaResource) -> Option<Amount> {
        let t = &self.teams[team];
        if !t.limited {
            return None;
        }
        let Some(slot) = self.slot(res) else {
            return Some(0);
        };
        let own = t.nominal(slot).saturating_sub(t.usage(slot));
        let Some(cohort) = t.cohort_id else {
            return Some(own);
        };
        let (lent, borrowed) = self.cohort_totals[cohort][slot];
        // What the other members do not use of their nominal quota (up to their lending
        // limits), less what every member, this one included, already borrows from it.
        let pool = lent
            .saturating_sub(t.lendable(slot))
            .saturating_sub(borrowed);
        let may_borrow = match t.limits[slot].and_then(|l| l.borrowing) {
            Some(limit) => limit.saturating_sub(t.borrowed(slot)),
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
        t.limited
            && self
                .slot(res)
                .is_some_and(|s| t.usage(s) + amount <= t.nominal(s))
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
        let apply = |v: &mut u64, a: u64| {
            if sign >= 0 {
                *v += a;
            } else {
                *v = v.saturating_sub(a);
            }
        };
        if let Some((res, amount)) = self.flavour(team, shape, model)
            && let Some(slot) = self.slot(res)
        {
            let t = &mut self.teams[team];
            let before = (t.lendable(slot), t.borrowed(slot));
            apply(&mut t.usage[slot], amount);
            let after = (t.lendable(slot), t.borrowed(slot));
            if let Some(c) = t.cohort_id {
                let totals = &mut self.cohort_totals[c][slot];
                totals.0 = (totals.0 + after.0).saturating_sub(before.0);
                totals.1 = (totals.1 + after.1).saturating_sub(before.1);
            }
        }
        let t = &mut self.teams[team];
        if let Some(m) = model {
            apply(&mut t.gpu_milli[m as usize], u64::from(shape.gpu_milli()));
        }
        apply(&mut t.cpu_milli, cpu_milli);
    }

    /// The team's quota on each flavour it has one on: the flavour's name (a GPU model, or a
    /// MIG profile), and its nominal quota, usage and borrowed amount, in whole GPUs for a
    /// model and instances for a MIG profile.
    pub fn quota_standing(&self, team: usize) -> Vec<(String, f64, f64, f64)> {
        let t = &self.teams[team];
        let mut out = Vec::new();
        for slot in 0..self.slots() {
            if t.limits.get(slot).copied().flatten().is_none() {
                continue;
            }
            let (name, scale) = if slot < MODELS {
                (GpuModel::ALL[slot].to_string(), 1000.0)
            } else {
                (self.mig_profiles[slot - MODELS].to_string(), 1.0)
            };
            out.push((
                name,
                t.nominal(slot) as f64 / scale,
                t.usage(slot) as f64 / scale,
                t.borrowed(slot) as f64 / scale,
            ));
        }
        out
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
        for (used, cap) in t.gpu_milli.iter().zip(&self.gpu_capacity) {
            if *used > 0 && *cap > 0 {
                share = share.max(*used as f64 / *cap as f64);
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
        assert!(acc.is_borrowing(2, H100));
        acc.charge(2, &whole(2), Some(GpuModel::H100_80GB), 0, -1);
        assert!(!acc.is_borrowing(2, H100));
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
