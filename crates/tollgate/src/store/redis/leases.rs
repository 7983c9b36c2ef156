//! The calls the lease engine makes (see `leases`): a lease reserved on one counter, and its
//! unused units given back. Redis is the store that [`Grants`] leases.

use tollgate_core::Decision;

use super::decide::Group;
use super::script::{self, charge_args};
use super::store::RedisStore;
use crate::store::{Charge, Grants, Invalid, StoreError};

impl RedisStore {
    /// Charges one enforced counter like [`Store::apply`], and also returns the instant (µs,
    /// the store's clock) the charge was made at, for a later [`RedisStore::give_back`].
    pub async fn reserve(&self, charge: Charge<'_>) -> Result<(Decision, i64), StoreError> {
        script::fits_lua(charge.params).map_err(|e| StoreError::InvalidData(e.into()))?;
        let mut keys = Vec::with_capacity(96);
        let slot = self.key_and_slot(&mut keys, charge.key);
        let group = Group {
            slot,
            indexes: vec![0],
        };
        let charges = [charge];
        let span = 0..keys.len();
        let spans = std::slice::from_ref(&span);
        let reply = self
            .bounded(|deadline| self.run_decide(&charges, &keys, spans, &group, true, deadline))
            .await?;
        let decision = reply
            .decisions
            .first()
            .copied()
            .ok_or_else(|| StoreError::InvalidData(Invalid::NoDecision))?;
        Ok((decision, reply.now_micros))
    }

    /// Takes back `charge.cost` of a charge [`RedisStore::reserve`] made at `at` (see the
    /// REFUND contract in [`script`]: exact when nothing else charged the counter since, never
    /// more than was charged).
    pub async fn give_back(&self, charge: Charge<'_>, at: i64) -> Result<(), StoreError> {
        let mut keys = Vec::with_capacity(96);
        let slot = self.key_and_slot(&mut keys, charge.key);
        let mut invocation = self.refund.prepare_invoke();
        invocation
            .arg(at)
            .key(&keys)
            .arg(&charge_args(charge.params, charge.cost)[..]);
        self.bounded(|deadline| self.invoke_on_slot::<i64>(slot, &invocation, deadline))
            .await
            .map(drop)
    }
}

impl Grants for RedisStore {
    async fn reserve(&self, charge: Charge<'_>) -> Result<(Decision, i64), StoreError> {
        RedisStore::reserve(self, charge).await
    }

    async fn give_back(&self, charge: Charge<'_>, at: i64) -> Result<(), StoreError> {
        RedisStore::give_back(self, charge, at).await
    }
}
