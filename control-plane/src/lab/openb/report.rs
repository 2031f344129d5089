//! The 0..130 columns of `analysis_allo_discrete.csv` (openb-protocol.md §8.3), with the
//! analysis scripts' exact rounding: Python's `round` per event, numpy's pairwise mean per
//! column and numpy's `round` on the mean.

/// The last column reported: arrivals at 130% of the cluster's GPU capacity.
pub const LAST_COLUMN: usize = 130;

/// One event of the run: cumulative arrived and currently allocated milli-GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub arrived: i64,
    pub used: i64,
}

/// Python's `round(x, ndigits)`: the float nearest to the decimal with `ndigits` digits that is
/// nearest to the exact binary value of `x`. Rust's `{:.N}` formatting is exact (not rounded
/// through an intermediate), so formatting and parsing back gives the same answer except for
/// exact binary ties, where both round half to even.
fn py_round(x: f64, ndigits: usize) -> f64 {
    if ndigits == 0 {
        return x.round_ties_even();
    }
    format!("{x:.ndigits$}").parse().unwrap_or(x)
}

/// numpy's `round(x, 2)`: `rint(x·100)/100` in float64.
fn np_round2(x: f64) -> f64 {
    (x * 100.0).round_ties_even() / 100.0
}

/// numpy's pairwise summation of float64 (`pairwise_sum_DOUBLE`, block size 128, 8 lanes).
fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        a.iter().fold(0.0, |s, x| s + x)
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for (j, rj) in r.iter_mut().enumerate() {
                *rj += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for x in &a[i..] {
            res += x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

/// numpy's mean: 0.0 plus the pairwise sum, divided by the count.
fn np_mean(a: &[f64]) -> f64 {
    (0.0 + pairwise_sum(a)) / a.len() as f64
}

/// The GPU allocation ratio (%) at each arrival percentage 0..=130 (`None`: no event there).
pub fn alloc_columns(events: &[Event], total_gpus: i64) -> Vec<Option<f64>> {
    let g = total_gpus as f64;
    let rows: Vec<(f64, f64)> = events
        .iter()
        .map(|e| {
            (
                py_round(e.arrived as f64 / g / 10.0, 0),
                py_round(e.used as f64 / g / 10.0, 2),
            )
        })
        .collect();
    (0..=LAST_COLUMN)
        .map(|k| {
            let k = k as f64;
            let mut sel: Vec<f64> = rows.iter().filter(|r| r.0 == k).map(|r| r.1).collect();
            if sel.is_empty() {
                sel = rows
                    .iter()
                    .filter(|r| r.0 >= k - 1.0 && r.0 <= k + 1.0)
                    .map(|r| r.1)
                    .collect();
            }
            (!sel.is_empty()).then(|| np_round2(np_mean(&sel)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sum_matches_plain_sums_on_exact_values() {
        let v: Vec<f64> = (1..=300).map(f64::from).collect();
        assert_eq!(pairwise_sum(&v), 45150.0);
        assert_eq!(pairwise_sum(&v[..5]), 15.0);
        assert_eq!(pairwise_sum(&v[..20]), 210.0);
    }

    #[test]
    fn rounding_follows_python_and_numpy() {
        assert_eq!(py_round(2.5, 0), 2.0);
        assert_eq!(py_round(3.5, 0), 4.0);
        // 2.675 is 2.67499999… in binary: Python's round gives 2.67.
        assert_eq!(py_round(2.675, 2), 2.67);
        assert_eq!(np_round2(0.125), 0.12);
    }

    #[test]
    fn a_column_without_events_uses_its_neighbours() {
        // Arrivals at 0%, 2%: column 1 has no row of its own and averages 0 and 2.
        let ev = [
            Event {
                arrived: 0,
                used: 0,
            },
            Event {
                arrived: 2 * 62_120,
                used: 2 * 62_120,
            },
        ];
        let cols = alloc_columns(&ev, 6212);
        assert_eq!(cols[0], Some(0.0));
        assert_eq!(cols[1], Some(1.0));
        assert_eq!(cols[2], Some(2.0));
        assert_eq!(cols[3], Some(2.0));
        assert_eq!(cols[4], None);
    }
}
