//! A port of Go's `math/rand` generator (the pre-1.20 global source), bit for bit.
//!
//! The openb experiment (openb-protocol.md §2) draws its arrival order, its tuned clones and its
//! node tie-break permutation from Go's global generator seeded with the tune seed, so any trace
//! and seed gives the published-comparable sequence only with this exact generator.
//!
//! The source is an additive lagged Fibonacci generator of length 607 and tap 273 over 64-bit
//! integers: `s[n] = s[n-607] + s[n-273] (mod 2^64)`, reported masked to 63 bits. Seeding fills
//! the 607 registers from a Park–Miller LCG (`x ← 48271·x mod 2^31−1`, Schrage's form) XOR-ed
//! with a constant table, `cooked`, which Go defines as the generator's own state after 7.8e12
//! steps from seed 1 with a slightly different fill (shifts 20/10 instead of 40/20).
//!
//! Rather than carry that 607-number table, [`cooked`] derives it: the generator is linear, so
//! stepping it N times is multiplying by `x^N` modulo its characteristic polynomial
//! `P(x) = x^607 − x^334 − 1` over ℤ/2^64. `x^N mod P` takes ~43 squarings of degree-606
//! polynomials (milliseconds), after which each register is a dot product with the start state.
//! The port is checked end to end by `seed 1 → first Int63 = 5577006791947779410` and by the
//! reference arrival orders and permutations of seeds 42..51.

use std::sync::OnceLock;

const LEN: usize = 607;
const TAP: usize = 273;
const MASK63: u64 = (1 << 63) - 1;
const LCG_M: i32 = i32::MAX; // 2^31 − 1

/// One Park–Miller step, `48271·x mod (2^31 − 1)` in Schrage's overflow-free form.
fn lcg_step(x: i32) -> i32 {
    const A: i32 = 48271;
    const Q: i32 = 44488; // M / A
    const R: i32 = 3399; // M % A
    let hi = x / Q;
    let lo = x % Q;
    let x = A * lo - R * hi;
    if x < 0 { x + LCG_M } else { x }
}

/// The 607 registers filled from the LCG: three LCG outputs packed per register with the given
/// shifts (`hi << s1 ^ mid << s2 ^ lo`), after 20 warm-up steps.
fn lcg_fill(seed: i64, s1: u32, s2: u32) -> [u64; LEN] {
    let mut seed = seed % i64::from(LCG_M);
    if seed < 0 {
        seed += i64::from(LCG_M);
    }
    if seed == 0 {
        seed = 89_482_311;
    }
    // In range 1..2^31−1 by construction.
    let mut x = seed as i32;
    for _ in 0..20 {
        x = lcg_step(x);
    }
    let mut vec = [0u64; LEN];
    for v in vec.iter_mut() {
        x = lcg_step(x);
        let mut u = (x as u64) << s1;
        x = lcg_step(x);
        u ^= (x as u64) << s2;
        x = lcg_step(x);
        u ^= x as u64;
        *v = u;
    }
    vec
}

/// `a·b mod P` for polynomials of degree < 607 with coefficients in ℤ/2^64, where
/// `x^607 ≡ x^334 + 1`.
fn poly_mulmod(a: &[u64; LEN], b: &[u64; LEN]) -> [u64; LEN] {
    let mut prod = vec![0u64; 2 * LEN - 1];
    for (i, &ai) in a.iter().enumerate() {
        if ai == 0 {
            continue;
        }
        for (p, &bj) in prod[i..i + LEN].iter_mut().zip(b.iter()) {
            *p = p.wrapping_add(ai.wrapping_mul(bj));
        }
    }
    // From the top down, so a reduction that lands at or above 607 is reduced in turn.
    for k in (LEN..2 * LEN - 1).rev() {
        let c = prod[k];
        if c != 0 {
            prod[k - LEN] = prod[k - LEN].wrapping_add(c);
            prod[k - TAP] = prod[k - TAP].wrapping_add(c);
        }
    }
    let mut out = [0u64; LEN];
    out.copy_from_slice(&prod[..LEN]);
    out
}

/// `x·c mod P`.
fn poly_times_x(c: &mut [u64; LEN]) {
    let top = c[LEN - 1];
    c.copy_within(0..LEN - 1, 1);
    c[0] = top;
    c[LEN - TAP] = c[LEN - TAP].wrapping_add(top);
}

/// Go's `rngCooked` table: the registers of the generator filled from seed 1 with shifts 20/10
/// and stepped 7.8e12 times, masked to 63 bits. Derived once, by jumping ahead (module doc).
pub fn cooked() -> &'static [u64; LEN] {
    static COOKED: OnceLock<[u64; LEN]> = OnceLock::new();
    COOKED.get_or_init(|| {
        const STEPS: u64 = 7_800_000_000_000;
        let start = lcg_fill(1, 20, 10);
        // Register p initially holds sequence element m(p), the sequence being numbered so
        // that step n (n ≥ 1) writes element n into register (334 − n) mod 607: registers
        // 334..606 hold elements 0..−272, registers 0..333 hold −273..−606. Renumber
        // t = m + 606 so the start state is u[0..607] and u[k] = u[k−607] + u[k−273].
        let mut u = [0u64; LEN];
        for (p, &v) in start.iter().enumerate() {
            u[(LEN + 333 - p) % LEN] = v;
        }
        // Square-and-multiply for x^STEPS mod P.
        let mut acc = [0u64; LEN];
        acc[0] = 1;
        let mut base = [0u64; LEN];
        base[1] = 1;
        let mut n = STEPS;
        while n > 0 {
            if n & 1 == 1 {
                acc = poly_mulmod(&acc, &base);
            }
            n >>= 1;
            if n > 0 {
                base = poly_mulmod(&base, &base);
            }
        }
        // After STEPS steps the registers hold u[STEPS ..= STEPS + 606]; u[k] = Σ c_i u[i]
        // where x^k mod P = Σ c_i x^i.
        let mut out = [0u64; LEN];
        for j in 0..LEN as u64 {
            let value = acc
                .iter()
                .zip(u.iter())
                .fold(0u64, |s, (c, v)| s.wrapping_add(c.wrapping_mul(*v)));
            // u index STEPS + j is sequence element n = STEPS + j − 606, in register
            // (334 − n) mod 607.
            let n = (STEPS + j) as i128 - 606;
            let reg = (334 - n).rem_euclid(LEN as i128) as usize;
            out[reg] = value & MASK63;
            poly_times_x(&mut acc);
        }
        out
    })
}

/// Go's `rand.New(rand.NewSource(seed))`, with the methods the openb experiment draws from.
#[derive(Clone)]
pub struct GoRand {
    tap: usize,
    feed: usize,
    vec: [u64; LEN],
}

impl std::fmt::Debug for GoRand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoRand")
            .field("tap", &self.tap)
            .field("feed", &self.feed)
            .finish_non_exhaustive()
    }
}

impl GoRand {
    /// `rand.Seed(seed)`.
    pub fn new(seed: i64) -> Self {
        let mut vec = lcg_fill(seed, 40, 20);
        for (v, c) in vec.iter_mut().zip(cooked().iter()) {
            *v = (*v ^ c) & MASK63;
        }
        GoRand {
            tap: 0,
            feed: LEN - TAP,
            vec,
        }
    }

    /// `Int63()`: a value in [0, 2^63).
    pub fn int63(&mut self) -> i64 {
        self.tap = if self.tap == 0 { LEN - 1 } else { self.tap - 1 };
        self.feed = if self.feed == 0 {
            LEN - 1
        } else {
            self.feed - 1
        };
        let x = self.vec[self.feed].wrapping_add(self.vec[self.tap]) & MASK63;
        self.vec[self.feed] = x;
        x as i64
    }

    /// `Uint32()`.
    pub fn uint32(&mut self) -> u32 {
        (self.int63() >> 31) as u32
    }

    /// `Int31()`.
    pub fn int31(&mut self) -> i32 {
        (self.int63() >> 32) as i32
    }

    /// `Int63n(n)`, n > 0: rejection sampling on `Int63`.
    pub fn int63n(&mut self, n: i64) -> i64 {
        assert!(n > 0, "Int63n needs n > 0");
        if n & (n - 1) == 0 {
            return self.int63() & (n - 1);
        }
        let max = ((1u64 << 63) - 1 - (1u64 << 63) % n as u64) as i64;
        let mut v = self.int63();
        while v > max {
            v = self.int63();
        }
        v % n
    }

    /// `Int31n(n)`, n > 0: rejection sampling on `Int31`.
    pub fn int31n(&mut self, n: i32) -> i32 {
        assert!(n > 0, "Int31n needs n > 0");
        if n & (n - 1) == 0 {
            return self.int31() & (n - 1);
        }
        let max = ((1u32 << 31) - 1 - (1u32 << 31) % n as u32) as i32;
        let mut v = self.int31();
        while v > max {
            v = self.int31();
        }
        v % n
    }

    /// The unexported `int31n` (Lemire's multiply-shift with rejection) used by `Shuffle`.
    fn int31n_lemire(&mut self, n: u32) -> u32 {
        let mut prod = u64::from(self.uint32()) * u64::from(n);
        if (prod as u32) < n {
            let thresh = n.wrapping_neg() % n;
            while (prod as u32) < thresh {
                prod = u64::from(self.uint32()) * u64::from(n);
            }
        }
        (prod >> 32) as u32
    }

    /// `Intn(n)`, n > 0.
    pub fn intn(&mut self, n: usize) -> usize {
        if n <= i32::MAX as usize {
            self.int31n(n as i32) as usize
        } else {
            self.int63n(n as i64) as usize
        }
    }

    /// `Float64()`: `Int63 / 2^63`, drawing again in the (never seen) case that rounds to 1.
    pub fn float64(&mut self) -> f64 {
        loop {
            let f = self.int63() as f64 / (1u64 << 63) as f64;
            if f < 1.0 {
                return f;
            }
        }
    }

    /// `Perm(n)`.
    pub fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut m = vec![0usize; n];
        for i in 0..n {
            let j = self.intn(i + 1);
            m[i] = m[j];
            m[j] = i;
        }
        m
    }

    /// `Shuffle(len(items), swap)`: Fisher–Yates from the end.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        let mut i = items.len();
        while i > 1 {
            i -= 1;
            let j = if i >= i32::MAX as usize {
                self.int63n(i as i64 + 1) as usize
            } else {
                self.int31n_lemire(i as u32 + 1) as usize
            };
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_one_gives_gos_first_int63() {
        let mut r = GoRand::new(1);
        assert_eq!(r.int63(), 5_577_006_791_947_779_410);
    }

    #[test]
    fn the_derived_cooked_table_has_gos_first_and_last_entries() {
        let c = cooked();
        assert_eq!(c[0], 5_041_579_894_721_019_882);
        assert_eq!(c[1], 4_646_389_086_726_545_243);
        assert_eq!(c[606], 4_152_330_101_494_654_406);
    }

    #[test]
    fn perm_is_a_permutation() {
        let mut r = GoRand::new(42);
        let mut p = r.perm(100);
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }
}
