//! What the admin handlers share.

use std::sync::Arc;
use std::time::Duration;

use tollgate::lifecycle::Lifecycle;
use tollgate::observe::Throttle;

/// What admin handlers share.
#[derive(Debug, Clone)]
pub struct AdminState {
    pub(super) lifecycle: Arc<Lifecycle>,
    pub(super) token: Option<Arc<str>>,
    /// Requests refused for their token, logged at most once per [`REFUSALS_LOGGED_EVERY`].
    pub(super) refusals: Arc<Throttle>,
}

/// Requests refused for their token are logged at most once per this long: a flood of them
/// must not flood the log.
pub(super) const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(1);
