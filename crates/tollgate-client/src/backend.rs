//! What the middleware asks: a [`Backend`] turns a [`CheckRequest`] into a [`Verdict`].

use std::future::Future;

use tollgate::limiter::CheckRequest;

/// How a request was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted (possibly degraded or over a soft limit: see the headers).
    Allowed,
    /// Denied by a rate limit: answered with `429`.
    Limited,
    /// Denied because the limiter could not decide (a `closed` posture): answered with `503`,
    /// never a `429` that looks like a real limit.
    Unavailable,
}

/// A decision as the middleware needs it: the outcome, the headers to send, and the name of
/// the binding limit for the problem body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Allowed, limited or unavailable.
    pub outcome: Outcome,
    /// Rate-limit headers (lowercase names), e.g. `x-ratelimit-remaining`, `retry-after`.
    pub headers: Vec<(&'static str, String)>,
    /// The limit that bound the decision, when there is one.
    pub limit_name: Option<String>,
}

impl Verdict {
    /// Whether the request is admitted.
    pub fn allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// The value of one header of this verdict, by lowercase name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a backend could not produce a verdict at all (a failure posture is a verdict, not an
/// error).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The request was malformed; nothing was counted.
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// Something that decides requests: the in-process [`crate::Embedded`] limiter or the
/// [`crate::Remote`] client of a tollgate service.
pub trait Backend: Send + Sync + 'static {
    /// Decides `request`, charging its cost when admitted.
    fn check(
        &self,
        request: &CheckRequest,
    ) -> impl Future<Output = Result<Verdict, BackendError>> + Send;
}
