//! Choosing which key of the key space each request uses: uniform or Zipf-skewed.

/// A small, fast, non-cryptographic generator (SplitMix64); one per worker.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Key indexes `0..n`: uniform, or Zipf with exponent `s` (key 0 hottest).
#[derive(Debug)]
pub enum KeySpace {
    Uniform(u64),
    /// Cumulative probabilities, one per key; sampled by binary search.
    Zipf(Vec<f64>),
}

impl KeySpace {
    pub fn new(keys: u64, zipf: Option<f64>) -> Self {
        match zipf {
            Some(s) if s > 0.0 && keys > 1 => {
                let mut sum = 0.0;
                let mut cdf: Vec<f64> = (1..=keys)
                    .map(|k| {
                        sum += (k as f64).powf(-s);
                        sum
                    })
                    .collect();
                for c in &mut cdf {
                    *c /= sum;
                }
                KeySpace::Zipf(cdf)
            }
            _ => KeySpace::Uniform(keys),
        }
    }

    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            KeySpace::Uniform(n) => rng.below(*n),
            KeySpace::Zipf(cdf) => {
                let u = rng.next_f64();
                let index = cdf.partition_point(|&c| c < u);
                index.min(cdf.len() - 1) as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_stays_in_range_and_covers_it() {
        let space = KeySpace::new(10, None);
        let mut rng = Rng::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[space.sample(&mut rng) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }

    #[test]
    fn zipf_one_makes_key_zero_about_twice_key_one() {
        let space = KeySpace::new(100, Some(1.0));
        let mut rng = Rng::new(7);
        let mut seen = [0u32; 100];
        for _ in 0..100_000 {
            seen[space.sample(&mut rng) as usize] += 1;
        }
        let ratio = f64::from(seen[0]) / f64::from(seen[1]);
        assert!((1.8..2.2).contains(&ratio), "ratio {ratio}");
        // H(100) ~ 5.19, so key 0 gets ~19% of the traffic.
        assert!((17_000..21_500).contains(&seen[0]), "{}", seen[0]);
        assert!(seen[99] > 0);
    }
}
