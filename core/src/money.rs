//! Money as integer micro-dollars.
//!
//! Billed amounts are never `f64`: a month of per-second spot charges summed in floating point
//! drifts by cents, and finance reconciles to the cent. One [`Micros`] is one millionth of a US
//! dollar; an `i64` holds ±9.2 trillion dollars. Prices are micro-dollars per hour; a charge is a
//! price times a duration, rounded half away from zero to the micro-dollar exactly once.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};

use serde::{Deserialize, Serialize};

/// An amount of US dollars in millionths.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct Micros(pub i64);

/// A decimal amount that cannot be represented as micro-dollars.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("amount is not a finite number")]
    NotFinite,
    #[error("amount is out of range")]
    OutOfRange,
    #[error("amount has more than 6 decimal places")]
    TooPrecise,
    #[error("{0:?} is not a decimal amount")]
    Malformed(String),
}

pub const MICROS_PER_DOLLAR: i64 = 1_000_000;

impl Micros {
    pub const ZERO: Micros = Micros(0);

    pub const fn from_dollars(d: i64) -> Self {
        Micros(d * MICROS_PER_DOLLAR)
    }

    /// Converts a dollar amount given as a float (as JSON carries `12.5`). The float is
    /// rounded to the nearest micro-dollar; values with more than six significant decimals
    /// are rejected rather than silently rounded.
    pub fn from_usd_f64(usd: f64) -> Result<Self, MoneyError> {
        if !usd.is_finite() {
            return Err(MoneyError::NotFinite);
        }
        let scaled = usd * MICROS_PER_DOLLAR as f64;
        if scaled.abs() > 9.0e15 {
            return Err(MoneyError::OutOfRange);
        }
        let rounded = scaled.round();
        // A value with more than six decimals is off the micro grid by much more than the
        // float error of a six-decimal value (at most a few ulps of `scaled`). A value that is
        // not zero never becomes zero: $0.000000001 is refused, not stored as nothing.
        if (scaled - rounded).abs() > 1e-3 || (rounded == 0.0 && usd != 0.0) {
            return Err(MoneyError::TooPrecise);
        }
        Ok(Micros(rounded as i64))
    }

    /// Parses a decimal string such as `"3.06"` or `"0.000123"` exactly.
    pub fn parse_usd(s: &str) -> Result<Self, MoneyError> {
        let malformed = || MoneyError::Malformed(s.to_owned());
        let t = s.trim();
        let (neg, t) = match t.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, t),
        };
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        if int.is_empty() && frac.is_empty() {
            return Err(malformed());
        }
        if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
            return Err(malformed());
        }
        let frac = frac.trim_end_matches('0');
        if frac.len() > 6 {
            return Err(MoneyError::TooPrecise);
        }
        let int: i64 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| MoneyError::OutOfRange)?
        };
        let frac_micros: i64 = if frac.is_empty() {
            0
        } else {
            let padded = format!("{frac:0<6}");
            padded.parse().map_err(|_| malformed())?
        };
        let v = int
            .checked_mul(MICROS_PER_DOLLAR)
            .and_then(|v| v.checked_add(frac_micros))
            .ok_or(MoneyError::OutOfRange)?;
        Ok(Micros(if neg { -v } else { v }))
    }

    /// Dollars as a float, for display and for planning arithmetic only (never for billing).
    pub fn as_usd_f64(self) -> f64 {
        self.0 as f64 / MICROS_PER_DOLLAR as f64
    }

    /// The charge for holding something priced at `self` per hour for `millis` milliseconds,
    /// rounded half away from zero to the micro-dollar.
    pub fn per_hour_for_millis(self, millis: i64) -> Micros {
        const MILLIS_PER_HOUR: i128 = 3_600_000;
        let num = self.0 as i128 * millis as i128;
        let half = MILLIS_PER_HOUR / 2;
        let q = if num >= 0 {
            (num + half) / MILLIS_PER_HOUR
        } else {
            (num - half) / MILLIS_PER_HOUR
        };
        Micros(q.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }

    /// `self * numerator / denominator`, rounded half away from zero (shares of a node's cost).
    pub fn scale(self, numerator: i64, denominator: i64) -> Micros {
        if denominator == 0 {
            return Micros::ZERO;
        }
        let num = self.0 as i128 * numerator as i128;
        let den = denominator as i128;
        let half = den.abs() / 2;
        let q = if (num >= 0) == (den > 0) {
            (num.abs() + half) / den.abs()
        } else {
            -((num.abs() + half) / den.abs())
        };
        Micros(q.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }

    /// An exact sum of `price × milliseconds` (micro-dollars per hour times milliseconds, as
    /// [`PriceMillis`] accumulates it) as micro-dollars, rounded half away from zero once.
    pub fn from_price_millis(units: PriceMillis) -> Micros {
        const MILLIS_PER_HOUR: i128 = 3_600_000;
        let half = MILLIS_PER_HOUR / 2;
        let q = if units.0 >= 0 {
            (units.0 + half) / MILLIS_PER_HOUR
        } else {
            (units.0 - half) / MILLIS_PER_HOUR
        };
        Micros(q.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }

    pub fn checked_add(self, other: Micros) -> Option<Micros> {
        self.0.checked_add(other.0).map(Micros)
    }
}

/// Charges accumulated exactly, before rounding: micro-dollars per hour times milliseconds.
/// Rounding a running total once ([`Micros::from_price_millis`]) instead of each piece makes
/// a bill independent of how its time was cut into pieces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PriceMillis(pub i128);

impl PriceMillis {
    /// Adds holding something priced `price` per hour for `millis` milliseconds.
    pub fn add(&mut self, price: Micros, millis: i64) {
        self.0 += i128::from(price.0) * i128::from(millis);
    }
}

/// Serde for a [`Micros`] that reads and writes as US dollars (`35.5`), for read models whose
/// JSON speaks dollars while the code keeps exact micro-dollars:
/// `#[serde(with = "spotplane_core::money::usd")]`.
pub mod usd {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Micros;

    pub fn serialize<S: Serializer>(v: &Micros, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(v.as_usd_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Micros, D::Error> {
        let usd = f64::deserialize(d)?;
        Micros::from_usd_f64(usd).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Micros {
    /// Formats as dollars with six decimals trimmed to at least two: `$12.50`, `$0.000123`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let int = abs / MICROS_PER_DOLLAR as u64;
        let frac = abs % MICROS_PER_DOLLAR as u64;
        let mut frac_s = format!("{frac:06}");
        while frac_s.len() > 2 && frac_s.ends_with('0') {
            frac_s.pop();
        }
        write!(f, "{sign}${int}.{frac_s}")
    }
}

impl Add for Micros {
    type Output = Micros;
    fn add(self, rhs: Micros) -> Micros {
        Micros(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Micros {
    fn add_assign(&mut self, rhs: Micros) {
        *self = *self + rhs;
    }
}

impl Sub for Micros {
    type Output = Micros;
    fn sub(self, rhs: Micros) -> Micros {
        Micros(self.0.saturating_sub(rhs.0))
    }
}

impl SubAssign for Micros {
    fn sub_assign(&mut self, rhs: Micros) {
        *self = *self - rhs;
    }
}

impl Neg for Micros {
    type Output = Micros;
    fn neg(self) -> Micros {
        Micros(self.0.saturating_neg())
    }
}

impl Sum for Micros {
    fn sum<I: Iterator<Item = Micros>>(iter: I) -> Micros {
        iter.fold(Micros::ZERO, Add::add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn floats_with_up_to_six_decimals_convert_exactly() {
        assert_eq!(Micros::from_usd_f64(12.5), Ok(Micros(12_500_000)));
        assert_eq!(Micros::from_usd_f64(0.000001), Ok(Micros(1)));
        assert_eq!(Micros::from_usd_f64(3.06), Ok(Micros(3_060_000)));
        assert_eq!(Micros::from_usd_f64(0.0000001), Err(MoneyError::TooPrecise));
        assert_eq!(Micros::from_usd_f64(f64::NAN), Err(MoneyError::NotFinite));
        assert_eq!(Micros::from_usd_f64(1e12), Err(MoneyError::OutOfRange));
    }

    #[test]
    fn a_tiny_amount_is_refused_rather_than_stored_as_zero() {
        for tiny in [1e-9, -1e-9, 1e-300, 4e-7, f64::MIN_POSITIVE] {
            assert_eq!(
                Micros::from_usd_f64(tiny),
                Err(MoneyError::TooPrecise),
                "{tiny}"
            );
        }
        assert_eq!(Micros::from_usd_f64(0.0), Ok(Micros(0)));
        assert_eq!(Micros::from_usd_f64(-0.0), Ok(Micros(0)));
    }

    #[test]
    fn decimal_strings_parse_exactly() {
        assert_eq!(Micros::parse_usd("3.06"), Ok(Micros(3_060_000)));
        assert_eq!(Micros::parse_usd("0.918"), Ok(Micros(918_000)));
        assert_eq!(Micros::parse_usd("-1.5"), Ok(Micros(-1_500_000)));
        assert_eq!(Micros::parse_usd("7"), Ok(Micros(7_000_000)));
        assert_eq!(Micros::parse_usd("1.2300000"), Ok(Micros(1_230_000)));
        assert_eq!(Micros::parse_usd("1.0000001"), Err(MoneyError::TooPrecise));
        assert!(Micros::parse_usd("abc").is_err());
        assert!(Micros::parse_usd(".").is_err());
    }

    #[test]
    fn display_shows_dollars_and_cents_at_least() {
        assert_eq!(Micros(12_500_000).to_string(), "$12.50");
        assert_eq!(Micros(123).to_string(), "$0.000123");
        assert_eq!(Micros(-1_000_000).to_string(), "-$1.00");
    }

    #[test]
    fn hourly_price_for_a_duration_rounds_half_away_from_zero() {
        let price = Micros::from_dollars(3); // $3/h
        assert_eq!(price.per_hour_for_millis(3_600_000), Micros(3_000_000));
        assert_eq!(price.per_hour_for_millis(1_000), Micros(833)); // 833.33
        assert_eq!(Micros(1).per_hour_for_millis(1_800_000), Micros(1)); // 0.5 -> 1
        assert_eq!(Micros(-1).per_hour_for_millis(1_800_000), Micros(-1));
    }

    proptest! {
        #[test]
        fn parse_and_display_round_trip(v in -1_000_000_000_000i64..1_000_000_000_000i64) {
            let m = Micros(v);
            let text = m.to_string().replace('$', "");
            prop_assert_eq!(Micros::parse_usd(&text), Ok(m));
        }

        #[test]
        fn splitting_an_hour_into_seconds_loses_at_most_half_a_micro_per_piece(
            price in 0i64..100_000_000, seconds in 1i64..10_000
        ) {
            let whole = Micros(price).per_hour_for_millis(seconds * 1000);
            let pieces: Micros = (0..seconds).map(|_| Micros(price).per_hour_for_millis(1000)).sum();
            prop_assert!((whole.0 - pieces.0).abs() <= seconds);
        }

        #[test]
        fn a_running_total_rounds_the_same_however_its_time_is_cut(
            price in 0i64..100_000_000, cuts in proptest::collection::vec(1i64..10_000_000, 1..20)
        ) {
            let mut whole = PriceMillis::default();
            whole.add(Micros(price), cuts.iter().sum());
            // Pieces priced as differences of the rounded running total add up to the whole.
            let mut run = PriceMillis::default();
            let mut billed = Micros::ZERO;
            for c in &cuts {
                let before = Micros::from_price_millis(run);
                run.add(Micros(price), *c);
                billed += Micros::from_price_millis(run) - before;
            }
            prop_assert_eq!(billed, Micros::from_price_millis(whole));
            prop_assert_eq!(
                Micros::from_price_millis(whole),
                Micros(price).per_hour_for_millis(cuts.iter().sum())
            );
        }

        #[test]
        fn scale_by_whole_is_identity(v in -1_000_000_000i64..1_000_000_000, d in 1i64..1000) {
            prop_assert_eq!(Micros(v).scale(d, d), Micros(v));
        }
    }
}
