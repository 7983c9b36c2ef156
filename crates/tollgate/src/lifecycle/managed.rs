//! A policy managed from outside: an xDS management server is its only writer.
//!
//! Such a life cycle starts with the empty policy (every descriptor unmatched, so every check is
//! allowed) as version 1, and its source's pushes become versions like any other, through the
//! same validation and atomic swap as a file reload, so unchanged rules keep their counters.
//! The admin API's pushes, rollbacks and candidates are refused by its handlers (see
//! [`Lifecycle::managed_by`]); the versions stay readable and diffable.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Activation, Lifecycle, Origin, PolicyVersion};
use crate::limiter::Limiter;
use crate::policy::PolicyErrors;
use crate::policy::sources::sources_hash;

impl Lifecycle {
    /// A life cycle whose only writer is `source` (`"xDS"`), starting with the empty policy
    /// the limiter runs as version 1, until the source's first push.
    pub fn managed(limiter: Arc<Limiter>, source: &'static str) -> Self {
        let lifecycle = Lifecycle::new(limiter, None, Vec::new());
        let first = lifecycle.current();
        let empty = Arc::new(PolicyVersion {
            seq: first.seq,
            hash: first.hash.clone(),
            origin: Origin::Xds,
            accepted_at: first.accepted_at,
            sources: Vec::new(),
            rules: first.rules,
            restored: None,
        });
        *lifecycle.history.lock() = vec![empty.clone()];
        *lifecycle.current.lock() = empty;
        let _ = lifecycle.managed.by.set(source);
        lifecycle
    }

    /// The source that alone writes the policy (`"xDS"`), if not the files and the admin API.
    pub fn managed_by(&self) -> Option<&'static str> {
        self.managed.by.get().copied()
    }

    /// Whether the managing source has not sent a valid policy yet (the empty one runs).
    pub fn awaiting_first_push(&self) -> bool {
        self.managed_by().is_some() && !self.managed.applied.load(Ordering::Acquire)
    }

    /// Validates what the managing source sent, completely, and makes it the running policy
    /// as a new version with [`Origin::Xds`]; an invalid one changes nothing and its errors are
    /// returned.
    pub fn apply_managed(
        &self,
        sources: Vec<(String, String)>,
    ) -> Result<Activation, PolicyErrors> {
        let activation = self.activate(sources, Origin::Xds)?;
        self.managed.applied.store(true, Ordering::Release);
        Ok(activation)
    }

    /// The hash the empty policy's version has: what [`Lifecycle::managed`] starts with.
    pub fn empty_hash() -> String {
        sources_hash(&[])
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Timestamp;

    use super::*;
    use crate::clock::ManualClock;
    use crate::policy::Policy;
    use crate::store::{MemoryStore, StoreBackend};

    fn managed() -> Lifecycle {
        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
            1_700_000_000_000_000,
        )));
        let empty = Policy::from_sources(&[]).unwrap();
        let limiter = Arc::new(Limiter::new(
            empty,
            StoreBackend::Memory(MemoryStore::new(clock)),
        ));
        Lifecycle::managed(limiter, "xDS")
    }

    /// The empty policy runs as an xDS version until the first push; an invalid push changes
    /// nothing and leaves the life cycle waiting; a valid one becomes version 2.
    #[test]
    fn a_managed_policy_starts_empty_and_takes_valid_pushes_only() {
        let lifecycle = managed();
        assert_eq!(lifecycle.managed_by(), Some("xDS"));
        assert!(lifecycle.awaiting_first_push());
        let first = lifecycle.current();
        assert_eq!((first.seq, first.origin, first.rules), (1, Origin::Xds, 0));
        assert_eq!(first.hash, Lifecycle::empty_hash());

        let invalid = vec![("xds:a".to_owned(), "domain: d\nnope: 1\n".to_owned())];
        assert!(lifecycle.apply_managed(invalid).is_err());
        assert!(lifecycle.awaiting_first_push());
        assert_eq!(lifecycle.current().seq, 1);

        let valid = super::super::tests::policy(5);
        let activation = lifecycle.apply_managed(valid).unwrap();
        assert!(
            matches!(activation, Activation::Activated(ref v) if v.seq == 2 && v.origin == Origin::Xds)
        );
        assert!(!lifecycle.awaiting_first_push());
        assert_eq!(lifecycle.versions().len(), 2);
    }
}
