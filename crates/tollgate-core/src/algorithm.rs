use std::fmt;
use std::str::FromStr;

/// The six supported algorithms. Names are the policy-file spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Counter per window aligned to whole multiples of the period since the Unix epoch.
    FixedWindow,
    /// Exact log of admitted cost in the trailing period.
    SlidingWindowLog,
    /// `current + previous * (1 - elapsed_fraction)` over two aligned windows.
    SlidingWindowCounter,
    /// Bucket of `burst` tokens refilled continuously at `limit` per period.
    TokenBucket,
    /// Shaper: a queue of `burst` draining at `limit` per period; admitted requests get a delay.
    LeakyBucket,
    /// Generic cell rate algorithm: one theoretical arrival time per key.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in documentation order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The policy-file name (`fixed_window`, `gcra`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether `burst` means something for this algorithm (bucket-shaped algorithms).
    pub fn uses_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Algorithm::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown algorithm `{}`, expected one of: ", self.0)?;
        for (i, a) in Algorithm::ALL.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(a.name())?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}
