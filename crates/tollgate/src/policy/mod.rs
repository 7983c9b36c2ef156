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
mod field;
mod identity;
mod load;
mod posture;
mod rule;
mod snapshot;
pub mod sources;
mod tree;
mod unit;

pub use error::{Location, PolicyError, PolicyErrors};
pub use field::MAX_FIELD_LEN;
pub(crate) use field::{garbles, is_bidi_control};
pub use load::MAX_POLICY_FILE;
pub use posture::{Posture, UnknownPosture};
pub use rule::{
    ChargeMode, LocalBudget, PolicyDefaults, Rule, RuleMode, UnknownChargeMode, posture_of,
};
pub use snapshot::Policy;
pub use tree::MAX_WILDCARDS_PER_LEVEL;
pub use unit::{PeriodError, Unit, parse_period};
