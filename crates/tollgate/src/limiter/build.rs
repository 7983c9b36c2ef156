//! How a [`Limiter`] is made: its policy, its store under the layers of the decision path, and
//! their settings.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arc_swap::ArcSwap;

use super::Limiter;
use super::overrides::Overrides;
use super::shadow::CandidateSlot;
use super::snapshot::Snapshot;
use super::telemetry::Telemetry;
use crate::clock::{SharedClock, SystemClock};
use crate::leases::HotKeys;
use crate::policy::Policy;
use crate::resilience::{FailureSettings, Postures};
use crate::store::{StoreBackend, Timed};

impl Limiter {
    /// A limiter over `store` enforcing `policy`, with the default failure settings (`open`).
    pub fn new(policy: Policy, store: StoreBackend) -> Self {
        let clock = Arc::new(SystemClock::new());
        Self::with_failure_settings(policy, store, FailureSettings::default(), clock)
    }

    /// A limiter with explicit failure settings. `clock` is the limiter's own time: the `local`
    /// posture's store, override expiry, the prefilter and local budgets.
    pub fn with_failure_settings(
        policy: Policy,
        store: StoreBackend,
        settings: FailureSettings,
        clock: SharedClock,
    ) -> Self {
        Limiter {
            snapshot: ArcSwap::from_pointee(Snapshot::new(policy, None)),
            candidate: CandidateSlot::default(),
            stack: Postures::new(
                HotKeys::new(Timed::new(store), true),
                settings,
                clock.clone(),
            ),
            overrides: Overrides::default(),
            clock,
            telemetry: Telemetry::default(),
            policy_epoch: AtomicU64::new(0),
        }
    }

    /// Turns the prefilter (remembered denials, Redis store only) on or off; on by default.
    pub fn with_prefilter(mut self, on: bool) -> Self {
        self.stack.inner_mut().set_prefilter(on);
        self
    }

    /// At most `max` runtime overrides in force (sets past it are refused);
    /// [`DEFAULT_MAX_OVERRIDES`] by default.
    pub fn with_max_overrides(mut self, max: usize) -> Self {
        self.overrides = Overrides::with_max(max);
        self
    }
}
