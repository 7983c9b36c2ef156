//! What a limit does when the store cannot decide.

use std::fmt;
use std::str::FromStr;

/// The failure posture of a limit (`on_store_error` in the policy file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Posture {
    /// Allow the request and mark the decision degraded. The server-wide default, as the
    /// generic path should not turn a store outage into an API outage.
    #[default]
    Open,
    /// Deny with a reason that says the limiter is unavailable (HTTP 503, never a 429 that
    /// looks like a real limit).
    Closed,
    /// Decide in-process on this replica's in-memory store, with `local_share` of the limit.
    Local,
}

impl Posture {
    /// Every posture, in documentation order.
    pub const ALL: [Posture; 3] = [Posture::Open, Posture::Closed, Posture::Local];

    /// The policy-file spelling.
    pub fn name(self) -> &'static str {
        match self {
            Posture::Open => "open",
            Posture::Closed => "closed",
            Posture::Local => "local",
        }
    }
}

impl fmt::Display for Posture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Posture {
    type Err = UnknownPosture;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Posture::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPosture(s.to_owned()))
    }
}

/// An `on_store_error` that is not a posture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown `on_store_error` value `{0}`, expected open, closed or local")]
pub struct UnknownPosture(pub String);
