//! Why an admin write's body is refused before anything changes: a push's sources, an
//! override. Each is answered as a `400` saying so.

use tollgate::limiter::UnfitOverride;
use tollgate::policy::{MAX_POLICY_FILE, PeriodError};
use tollgate::store::Unsupported;

use crate::json_object::InvalidJson;

/// Why a push body (`POST /v1/admin/policy`, a candidate) is not a set of sources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPush {
    /// Not the JSON object a push is.
    #[error(transparent)]
    Json(#[from] InvalidJson),
    /// `sources` is empty.
    #[error("a push needs at least one source")]
    NoSources,
    /// The source at this index has an empty (or blank) name.
    #[error("source {0} has an empty name")]
    EmptyName(usize),
    /// A source's name holds a control character: it goes into log lines as it is.
    #[error("source {index}'s name {name:?} holds a control character")]
    ControlInName { index: usize, name: String },
    /// Two sources have this name.
    #[error("two sources are named `{0}`")]
    SameName(String),
    /// A source's text is longer than a policy file may be.
    #[error(
        "source `{name}` is {bytes} bytes, larger than {} MiB, which no policy file needs",
        MAX_POLICY_FILE / (1024 * 1024)
    )]
    TooLarge { name: String, bytes: usize },
}

/// Why an override of a set body (`PUT /v1/admin/overrides`, one of a bulk set) is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidOverride {
    /// `period` is not one.
    #[error("`period`: {0}")]
    Period(#[from] PeriodError),
    /// A duration field (named) that humantime does not read.
    #[error("invalid `{field}` `{text}`: {why}")]
    Duration {
        field: &'static str,
        text: String,
        why: humantime::DurationError,
    },
    /// `expires_in` is zero: already over when set.
    #[error("`expires_in` must be longer than zero")]
    ExpiresAtOnce,
    /// `expires_in` is longer than `max_days` days.
    #[error(
        "`expires_in` may be at most {max_days} days; leave it out for an override that lasts until deleted"
    )]
    ExpiresTooLate { max_days: u64 },
    /// `reason` (as sent) holds a control character, which would forge an audit line.
    #[error("`reason` {0:?} holds a control character (a line break, an escape)")]
    ControlInReason(String),
    /// No rule of that name in that domain.
    #[error("no rule `{rule}` in domain `{domain}`")]
    NoRule { domain: String, rule: String },
    /// The entries match another rule (or none) than the one named.
    #[error("those entries do not match rule `{0}`")]
    OtherRule(String),
    /// The rule cannot take the limit asked for.
    #[error("{0}")]
    Unfit(#[from] UnfitOverride),
    /// The store cannot decide the limit asked for exactly.
    #[error("{0}")]
    Unsupported(#[from] Unsupported),
}
