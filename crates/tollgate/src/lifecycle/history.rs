//! The kept versions: the history trimmed to its bounds, and rollbacks to a kept version.

use std::sync::Arc;

use tracing::{debug, warn};

use super::{Activation, Fleet, KEPT_VERSIONS, Lifecycle, Origin, PolicyVersion, RollbackError};

impl Lifecycle {
    /// Drops the oldest versions of `history` while it holds more than [`KEPT_VERSIONS`] or
    /// more than `history_max_bytes` of source texts, except `running` and the version a plain
    /// rollback from it goes to: a rollback right after any change still works.
    pub(super) fn trim(&self, history: &mut Vec<Arc<PolicyVersion>>, running: &PolicyVersion) {
        // Dropping other versions never changes which one that is.
        let target = rollback_target(history, running).map(|v| v.seq);
        let mut bytes = history
            .iter()
            .map(|v| v.source_bytes())
            .fold(0, usize::saturating_add);
        let mut dropped = 0usize;
        while history.len() > KEPT_VERSIONS || bytes > self.history_max_bytes {
            let Some(oldest) = history
                .iter()
                .position(|v| v.seq != running.seq && Some(v.seq) != target)
            else {
                warn!(
                    bytes,
                    most = self.history_max_bytes,
                    "The running policy version and its rollback target alone hold more than --policy-history-max-bytes; both are kept"
                );
                break;
            };
            bytes = bytes.saturating_sub(history[oldest].source_bytes());
            history.remove(oldest);
            dropped += 1;
        }
        if dropped > 0 {
            debug!(
                dropped,
                kept = history.len(),
                bytes,
                "Oldest policy versions dropped from the history"
            );
        }
    }

    /// Returns to version `to`, or to the one before the running one: for a version a rollback
    /// made, the one before the version it restored, so plain rollbacks step back one version
    /// each.
    pub fn rollback(&self, to: Option<u64>) -> Result<Activation, RollbackError> {
        self.rollback_against(to, None)
    }

    /// [`Lifecycle::rollback`], deciding "unchanged" against `fleet` as
    /// [`Lifecycle::activate_against`] does.
    pub(super) fn rollback_against(
        &self,
        to: Option<u64>,
        fleet: Option<&str>,
    ) -> Result<Activation, RollbackError> {
        // Chosen and activated under `current`'s lock, which every activation holds from its
        // choice to its swap: two rollbacks at once end where two in a row do (each chose
        // against the same running version, and the second undid the first or failed), and no
        // push lands between a rollback's choice and its activation.
        let result = {
            let mut current = self.current.lock();
            let target = {
                let history = self.history.lock();
                match to {
                    Some(seq) => history.iter().find(|v| v.seq == seq).cloned(),
                    None => rollback_target(&history, &current).cloned(),
                }
            };
            let target = target.ok_or(match to {
                Some(seq) => RollbackError::NotKept(seq),
                None => RollbackError::NoEarlier,
            })?;
            let fleet = Fleet::new(fleet, &target.sources, Origin::Rollback);
            let swapped = self.swap_in(
                &mut current,
                target.sources.clone(),
                fleet.origin,
                Some(target.seq),
                fleet.differs,
            );
            (swapped, fleet)
        };
        let (result, fleet) = result;
        self.settle(&result, fleet.origin);
        fleet.answer(result).map_err(RollbackError::Rejected)
    }
}

/// The version of `history` a plain rollback from `running` goes to: the newest before the
/// running one or, when a rollback made the running one, before the version it restored.
fn rollback_target<'h>(
    history: &'h [Arc<PolicyVersion>],
    running: &PolicyVersion,
) -> Option<&'h Arc<PolicyVersion>> {
    let back_from = running.restored.unwrap_or(running.seq);
    history.iter().rev().find(|v| v.seq < back_from)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{lifecycle, policy};
    use super::*;
    use crate::policy::Policy;
    use crate::policy::sources::sources_hash;

    /// Plain rollbacks step back one version each, whether made one after the other or all at
    /// once: each used to choose the version before the running one, so a second undid the
    /// first, and rollbacks made at once chose the same version (the later ones then failed).
    #[test]
    fn plain_rollbacks_step_back_one_version_each() {
        let lifecycle = lifecycle();
        for n in 2..=7 {
            lifecycle.activate(policy(n), Origin::Push).unwrap();
        }
        let running = |lifecycle: &Lifecycle| lifecycle.current().hash.clone();
        lifecycle.rollback(None).unwrap();
        lifecycle.rollback(None).unwrap();
        assert_eq!(
            running(&lifecycle),
            sources_hash(&policy(5)),
            "two in a row"
        );

        let barrier = Arc::new(std::sync::Barrier::new(3));
        let rollbacks: Vec<_> = (0..3)
            .map(|_| {
                let (lifecycle, barrier) = (lifecycle.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    lifecycle.rollback(None)
                })
            })
            .collect();
        for rollback in rollbacks {
            let done = rollback.join().unwrap();
            assert!(matches!(done, Ok(Activation::Activated(_))), "{done:?}");
        }
        assert_eq!(
            running(&lifecycle),
            sources_hash(&policy(2)),
            "three at once"
        );
        lifecycle.rollback(None).unwrap();
        assert_eq!(running(&lifecycle), sources_hash(&policy(1)));
        assert_eq!(
            lifecycle.rollback(None).unwrap_err(),
            RollbackError::NoEarlier
        );

        // A version reached `--to` steps back from there; a push is stepped back from itself.
        lifecycle.rollback(Some(4)).unwrap();
        lifecycle.rollback(None).unwrap();
        assert_eq!(running(&lifecycle), sources_hash(&policy(3)));
        lifecycle.activate(policy(9), Origin::Push).unwrap();
        lifecycle.rollback(None).unwrap();
        assert_eq!(running(&lifecycle), sources_hash(&policy(3)));
    }

    /// `policy(n)` padded with a comment to `SIZED` bytes of name and text.
    fn sized(n: u32) -> Vec<(String, String)> {
        let mut sources = policy(n);
        let (name, text) = &mut sources[0];
        let pad = SIZED - name.len() - text.len() - 2;
        text.push_str(&format!("#{}\n", "x".repeat(pad)));
        sources
    }

    const SIZED: usize = 1_000;

    /// The sequence numbers kept, oldest first.
    fn kept(lifecycle: &Lifecycle) -> Vec<u64> {
        lifecycle.versions().iter().map(|v| v.seq).collect()
    }

    /// A life cycle keeping `versions` of [`sized`] policies' bytes, running `sized(1)`.
    fn keeping(versions: usize) -> Lifecycle {
        let limiter = lifecycle().limiter().clone();
        limiter.replace_policy(Policy::from_sources(&sized(1)).unwrap());
        Lifecycle::new(limiter, None, sized(1)).with_history_max_bytes(versions * SIZED + SIZED / 2)
    }

    /// Past its bytes the history drops its oldest versions first (it used to keep 50 of any
    /// size: 1.6 GB of two 16 MiB files), but never the running version nor the one a plain
    /// rollback goes to, so a rollback still works after versions were dropped.
    #[test]
    fn a_history_past_its_bytes_drops_the_oldest_first_but_keeps_the_rollback_target() {
        assert_eq!(sized(7)[0].0.len() + sized(7)[0].1.len(), SIZED);
        let lifecycle = keeping(3);
        for n in 2..=4 {
            lifecycle.activate(sized(n), Origin::Push).unwrap();
        }
        assert_eq!(kept(&lifecycle), [2, 3, 4], "the oldest went first");
        let bytes: usize = lifecycle.versions().iter().map(|v| v.source_bytes()).sum();
        assert_eq!(bytes, 3 * SIZED);

        // Back to 3: a plain rollback from there goes to 2, the oldest, which must stay.
        lifecycle.rollback(Some(3)).unwrap();
        assert_eq!(kept(&lifecycle), [2, 4, 5], "3 went instead of 2");
        let back = lifecycle.rollback(None).unwrap();
        assert!(matches!(back, Activation::Activated(ref v) if v.hash == sources_hash(&sized(2))));
        assert_eq!(kept(&lifecycle), [4, 5, 6]);
        assert_eq!(
            lifecycle.rollback(None).unwrap_err(),
            RollbackError::NoEarlier,
            "nothing before 2 is kept"
        );
        assert_eq!(
            lifecycle.rollback(Some(1)).unwrap_err(),
            RollbackError::NotKept(1)
        );
        lifecycle.rollback(Some(4)).unwrap();
        assert_eq!(lifecycle.current().hash, sources_hash(&sized(4)));
    }

    /// Versions larger than the bound on their own: the running one and its rollback target
    /// are kept anyway, and the rollback works.
    #[test]
    fn the_running_version_and_its_rollback_target_outlast_the_bound() {
        let lifecycle = keeping(0);
        lifecycle.activate(sized(2), Origin::Push).unwrap();
        assert_eq!(kept(&lifecycle), [1, 2]);
        lifecycle.activate(sized(3), Origin::Push).unwrap();
        assert_eq!(kept(&lifecycle), [2, 3]);
        lifecycle.rollback(None).unwrap();
        assert_eq!(lifecycle.current().hash, sources_hash(&sized(2)));
        assert_eq!(
            kept(&lifecycle),
            [4],
            "4 restored 2, and nothing before 2 is kept"
        );
        assert_eq!(
            lifecycle.rollback(None).unwrap_err(),
            RollbackError::NoEarlier
        );
    }

    /// Within the bytes, the count still bounds the history.
    #[test]
    fn the_history_keeps_at_most_its_count_of_versions() {
        let lifecycle = lifecycle();
        for n in 2..=60 {
            lifecycle.activate(policy(n), Origin::Push).unwrap();
        }
        assert_eq!(kept(&lifecycle), (11..=60).collect::<Vec<_>>());
    }

    /// An activation takes `current` then `history`; a rollback used to take them the other
    /// way round, and the two racing could deadlock.
    #[test]
    fn rollbacks_racing_activations_finish() {
        let lifecycle = lifecycle();
        let (done, finished) = std::sync::mpsc::channel();
        let pusher = {
            let (lifecycle, done) = (lifecycle.clone(), done.clone());
            std::thread::spawn(move || {
                for n in 0..2000 {
                    lifecycle
                        .activate(policy(2 + n % 50), Origin::Push)
                        .unwrap();
                }
                done.send(()).unwrap();
            })
        };
        let roller = std::thread::spawn(move || {
            for _ in 0..2000 {
                let _ = lifecycle.rollback(None);
            }
            done.send(()).unwrap();
        });
        for _ in 0..2 {
            finished
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("an activation and a rollback deadlocked");
        }
        pusher.join().unwrap();
        roller.join().unwrap();
    }
}
