//! The layers of the decision path below the plan, as one type.

use crate::leases::HotKeys;
use crate::resilience::Postures;
use crate::store::{StoreBackend, Timed};

/// The decision path below the plan, top down: the failure postures answer for what the store
/// cannot decide; the hot keys' prefilter and leases answer what they can without it; the
/// store calls are timed; the store decides. Each layer is a [`Store`](crate::store::Store)
/// over the next.
pub(crate) type Stack = Postures<HotKeys<Timed<StoreBackend>>>;

impl Stack {
    /// The layer that keeps hot keys off the store.
    pub(crate) fn hot_keys(&self) -> &HotKeys<Timed<StoreBackend>> {
        self.inner()
    }

    /// The store, timed.
    pub(crate) fn timed(&self) -> &Timed<StoreBackend> {
        self.hot_keys().inner()
    }

    /// The store at the bottom.
    pub(crate) fn store(&self) -> &StoreBackend {
        self.timed().inner()
    }
}
