//! The policy file: parsing, validation and descriptor matching.
//!
//! A policy is envoyproxy/ratelimit's YAML configuration (one `domain` per file, nested
//! `descriptors` with `key`/`value`, `rate_limit {unit, requests_per_unit, name, unlimited,
//! replaces}`, `shadow_mode`, `detailed_metric`), extended with `period`, `algorithm` and `burst`
//! inside `rate_limit`. [`Policy::load`] validates everything once and reports every problem
//! with its file, line and column; [`Policy::find`] then matches request descriptors without
//! allocating.

mod compiler;
mod document;
mod error;
mod identity;
mod load;
mod rule;
mod snapshot;
pub mod sources;
mod tree;
mod unit;

pub use error::{Location, PolicyError, PolicyErrors};
pub use load::MAX_POLICY_FILE;
pub use rule::{ChargeMode, LocalBudget, PolicyDefaults, Rule, RuleMode, UnknownChargeMode};
pub use snapshot::Policy;
pub use tree::MAX_WILDCARDS_PER_LEVEL;
pub use unit::{Unit, parse_period};

/// Longest domain or key, in bytes. A value may be longer: in counter keys it is replaced by
/// a digest of it (see `limiter::keys`).
pub const MAX_FIELD_LEN: usize = 1024;

/// The Unicode characters that reorder text around them (marks, embeddings, overrides,
/// isolates): in a name they could make a log line or a terminal read otherwise than it is.
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `text` holds a control character or a bidirectional one: written to a log line, a
/// metric label or a terminal, it could forge a line or hide what it says.
pub(crate) fn garbles(text: &str) -> bool {
    text.chars().any(|c| c.is_control() || is_bidi_control(c))
}
