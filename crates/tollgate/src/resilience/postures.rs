//! The layer that answers when the store cannot decide: each limit's failure posture answers
//! instead.
//!
//! - `closed`: an enforced limit with this posture denies the whole request as *unavailable*
//!   (never a plain over-limit): nothing else is charged anywhere.
//! - `local`: decided on this replica's own in-memory store with `local_share` of the limit
//!   (and of the burst), all-or-nothing among the local limits of the request.
//! - `open`: allowed; the remaining quota is unknown and reported as the full limit.

use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{Decision, Params, Verdict};

use crate::clock::SharedClock;
use crate::policy::Posture;
use crate::store::health_of_inner;
use crate::store::{
    Answered, Call, Charge, Decisions, Degraded, INLINE_CHARGES, MemoryStore, Quotas, Store,
    StoreError, cost_exceeds_capacity, has_budgets, never_admitted,
};

/// Server-wide failure settings; a rule's `on_store_error` / `local_share` override them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailureSettings {
    /// Posture of limits that do not set `on_store_error`.
    pub posture: Posture,
    /// `local_share` of limits that do not set it.
    pub local_share: f64,
    /// `Retry-After` given with a denial because the limiter is unavailable.
    pub unavailable_retry_after: Duration,
    /// Most keys the `local` posture's store holds: past it a new key's request is allowed
    /// uncounted, as by `open`. A flood of new keys can make the postures answer (a store at
    /// its own cap, see [`crate::store::MemoryStore::with_max_keys`]): it must not then grow
    /// this store without end either.
    pub local_max_keys: usize,
    /// Most bytes the `local` posture's store's keys are counted for, as for
    /// [`crate::store::MemoryStore::with_max_bytes`]; `None` bounds (and counts) none.
    pub local_max_bytes: Option<usize>,
}

impl Default for FailureSettings {
    fn default() -> Self {
        FailureSettings {
            posture: Posture::Open,
            local_share: 1.0,
            unavailable_retry_after: Duration::from_secs(1),
            local_max_keys: usize::MAX,
            local_max_bytes: None,
        }
    }
}

/// The failure postures over the store `inner`: their settings and the `local` posture's own
/// store.
#[derive(Debug)]
pub struct Postures<S> {
    inner: S,
    pub settings: FailureSettings,
    local: MemoryStore,
}

impl<S> Postures<S> {
    /// Postures with `settings` over `inner`; the `local` posture's store runs on `clock`.
    pub fn new(inner: S, settings: FailureSettings, clock: SharedClock) -> Self {
        let local = MemoryStore::new(clock).with_max_keys(settings.local_max_keys);
        let local = match settings.local_max_bytes {
            Some(max) => local.with_max_bytes(max),
            None => local,
        };
        Postures {
            inner,
            settings,
            local,
        }
    }

    /// The store the postures answer for.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The store the postures answer for, to configure it.
    pub fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The in-process store used by the `local` posture.
    pub fn local_store(&self) -> &MemoryStore {
        &self.local
    }

    /// Decides every charge by its posture (and `local` share). Without `commit`, the local
    /// store is only asked (for explain). Allocates nothing for up to [`INLINE_CHARGES`]
    /// charges: while the store is down, every request comes through here.
    pub fn by_posture(&self, charges: &[Charge<'_>], commit: bool) -> Decisions {
        // An enforced `closed` limit denies the request as unavailable: the local shares are
        // then only looked at, and answer as they stand (nothing is charged).
        // Quota limits deny together: every one of them `closed` (see `store::admitted`).
        let mut quotas = Quotas::default();
        let closed = !charges
            .iter()
            .all(|c| quotas.admits(c, c.posture != Posture::Closed))
            || !quotas.satisfied();
        let local_params: SmallVec<[Option<Params>; INLINE_CHARGES]> = charges
            .iter()
            .map(|c| (c.posture == Posture::Local).then(|| scaled(c.params, c.local_share)))
            .collect();
        let local_charges: SmallVec<[Charge<'_>; INLINE_CHARGES]> = charges
            .iter()
            .zip(&local_params)
            .filter_map(|(c, params)| {
                Some(Charge {
                    params: params.as_ref()?,
                    ..*c
                })
            })
            .collect();
        let mut decided = Decisions::new();
        if closed {
            self.local.decide_denied(&local_charges, &mut decided);
        } else {
            // Full (`local_max_keys`, `local_max_bytes`), it charges nothing and its answers are those of a look:
            // a new key is allowed uncounted.
            let _held = self.local.decide(&local_charges, commit, &mut decided);
        }
        let mut local = decided.into_iter();
        charges
            .iter()
            .zip(&local_params)
            .map(|(c, params)| match (c.posture, params) {
                // A closed quota limit is over, whether or not the request is admitted.
                (Posture::Closed, _) if closed || (c.quota && c.enforce) => {
                    self.unavailable(c.params)
                }
                (_, Some(_)) => local.next().unwrap_or_else(|| unknown(c.params)),
                _ => unknown(c.params),
            })
            .collect()
    }

    /// Answers the live charges of a request the store could not decide (`cause`) by their
    /// postures, into `decisions`, charging the `local` shares when the call applies. A cost
    /// its counter can never hold needs no store to be answered: refused as such, not let
    /// through by `open` nor sent to retry by `closed`, and nothing is charged to a `local`
    /// share for the request it denies. A candidate's charges get no answer: it skips this
    /// request rather than report what a posture decided.
    fn answer_failed(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        cause: StoreError,
        decisions: &mut Decisions,
    ) -> Answered {
        let live = call.live(charges);
        let hopeless = |i: &usize| never_admitted(live, *i);
        let any_hopeless = (0..live.len()).any(|i| hopeless(&i));
        let commit = call.mode.applies() && !any_hopeless;
        *decisions = self.by_posture(live, commit);
        let mut degraded: Degraded = live.iter().map(|c| Some(c.posture)).collect();
        for i in (0..live.len().min(decisions.len())).filter(hopeless) {
            decisions[i] = cost_exceeds_capacity(decisions[i]);
            degraded[i] = None;
        }
        Answered::Postures { degraded, cause }
    }

    fn unavailable(&self, params: &Params) -> Decision {
        Decision {
            verdict: Verdict::Denied,
            limit: params.limit(),
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Some(self.settings.unavailable_retry_after),
            delay: Duration::ZERO,
        }
    }
}

impl<S: Store> Postures<S> {
    /// Decides `charges` at the store, and answers by the postures for what it could not
    /// decide: the whole request when it fails, or only the limits it could not decide when
    /// it answers in part (see [`Postures::decide_partly`]). Never an error: a failure is
    /// answered, and its cause reported in [`Answered::Postures`].
    pub async fn decide_or_answer(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Answered {
        let cause = match self.inner.decide(call, charges, decisions).await {
            Ok(answered) => return answered,
            Err(StoreError::Partly {
                decided,
                cause,
                deadline,
            }) if partial_applies(call, charges, &decided) => {
                let partly = (decided, deadline);
                let commit = call.mode.applies();
                match self.decide_partly(charges, partly, commit, decisions).await {
                    Ok(degraded) => {
                        let cause = *cause;
                        return Answered::Postures { degraded, cause };
                    }
                    // The charging call failed: the postures answer for the whole request.
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        self.answer_failed(call, charges, cause, decisions)
    }
}

impl<S: Store> Store for Postures<S> {
    async fn decide(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<Answered, StoreError> {
        Ok(self.decide_or_answer(call, charges, decisions).await)
    }

    health_of_inner!(apply_before);
}

/// Whether the postures answer for the limits a partial answer (`decided`) left alone: a
/// cluster primary down under part of the request, or a full memory store and a limit on a
/// key it does not hold. Not with a candidate or local budgets in the call: they take the
/// postures for the whole request, as any other store failure.
fn partial_applies(call: Call, charges: &[Charge<'_>], decided: &[Option<Decision>]) -> bool {
    !call.shadowed(charges) && decided.len() == charges.len() && !has_budgets(charges)
}

/// An allowed decision whose counters are unknown: reported as full (a bucket's capacity).
fn unknown(params: &Params) -> Decision {
    Decision {
        verdict: Verdict::Allowed,
        limit: params.limit(),
        remaining: params.capacity(),
        reset_after: Duration::ZERO,
        retry_after: None,
        delay: Duration::ZERO,
    }
}

/// `params` with `share` of the limit, at least 1, and the burst in the same proportion to it
/// ([`Params::rescaled`]): the share's capacity is then what the rate-limit headers announce
/// for its limit, the configured capacity scaled by the same factor.
fn scaled(params: &Params, share: f64) -> Params {
    let limit = ((params.limit() as f64 * share).floor() as u64).max(1);
    params.rescaled(limit, params.period()).unwrap_or(*params)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_core::Algorithm;

    use super::*;
    use crate::clock::ManualClock;
    use crate::store::{Failure, RedisFailure};

    /// `charge` under the `local` posture with `share`.
    fn local(charge: Charge<'_>, share: f64) -> Charge<'_> {
        Charge {
            posture: Posture::Local,
            local_share: share,
            ..charge
        }
    }

    /// A store that never answers: every call fails as unavailable.
    struct Down;

    fn down() -> StoreError {
        let answer = RedisFailure::Script("down".into());
        StoreError::Unavailable(Failure::Redis(answer))
    }

    impl Store for Down {
        async fn decide(
            &self,
            _call: Call,
            _charges: &[Charge<'_>],
            _decisions: &mut Decisions,
        ) -> Result<Answered, StoreError> {
            Err(down())
        }

        async fn apply_before(
            &self,
            _charges: &[Charge<'_>],
            _deadline: tokio::time::Instant,
        ) -> Result<Vec<Decision>, StoreError> {
            Err(down())
        }

        fn supports(&self, _params: &Params) -> Result<(), crate::store::Unsupported> {
            Ok(())
        }

        async fn key_count(&self) -> Result<usize, StoreError> {
            Err(down())
        }

        fn breakers(&self) -> Vec<(String, crate::resilience::BreakerState)> {
            Vec::new()
        }

        fn kind(&self) -> &'static str {
            "down"
        }
    }

    /// The layer alone over a failing store: it answers each live charge by its posture, says
    /// which posture answered and why, and leaves a candidate's charges unanswered.
    #[tokio::test]
    async fn over_a_failing_store_each_live_limit_takes_its_posture() {
        let clock = Arc::new(ManualClock::default());
        let layer = Postures::new(Down, FailureSettings::default(), clock);
        let p = Params::new(Algorithm::FixedWindow, 4, Duration::from_secs(60), None).unwrap();
        let open = Charge::new(b"o", &p, 1);
        let closed = Charge {
            posture: Posture::Closed,
            ..Charge::new(b"c", &p, 1)
        };
        let shadow = Charge::new(b"s", &p, 1);
        let call = Call {
            live: 2,
            ..Call::plain(crate::store::Mode::Apply)
        };
        let mut decisions = Decisions::new();
        let answered = layer
            .decide(call, &[open, closed, shadow], &mut decisions)
            .await;
        let Ok(Answered::Postures { degraded, cause }) = answered else {
            panic!("the postures answer: {answered:?}");
        };
        assert!(matches!(cause, StoreError::Unavailable(_)), "{cause:?}");
        assert_eq!(&degraded[..], &[Some(Posture::Open), Some(Posture::Closed)]);
        assert_eq!(decisions.len(), 2, "the candidate's charge is not answered");
        assert!(decisions[0].is_allowed(), "open allows");
        assert_eq!(decisions[1].verdict, Verdict::Denied, "closed denies");
        assert_eq!(decisions[1].retry_after, Some(Duration::from_secs(1)));
    }

    fn fallback() -> Postures<MemoryStore> {
        let clock = Arc::new(ManualClock::default());
        Postures::new(
            MemoryStore::new(clock.clone()),
            FailureSettings::default(),
            clock,
        )
    }

    #[test]
    fn a_share_scales_limit_and_burst_down_to_at_least_one() {
        let p = Params::new(Algorithm::Gcra, 100, Duration::from_secs(1), Some(40)).unwrap();
        let s = scaled(&p, 0.25);
        assert_eq!(
            (s.limit(), s.burst(), s.period()),
            (25, 10, Duration::from_secs(1))
        );
        // The burst keeps its ratio to the limit once that is rounded down: 3 a second of 7,
        // so 8 of 20 (not 10), which is what the headers announce for a limit of 3.
        let odd = Params::new(Algorithm::TokenBucket, 7, Duration::from_secs(1), Some(20)).unwrap();
        let s = scaled(&odd, 0.5);
        assert_eq!((s.limit(), s.burst()), (3, 8));
        let tiny = Params::new(Algorithm::FixedWindow, 3, Duration::from_secs(1), None).unwrap();
        assert_eq!(scaled(&tiny, 0.1).limit(), 1);
        for up_to_limit in [false, true] {
            let p = tiny.charging_up_to_limit(up_to_limit);
            assert_eq!(scaled(&p, 0.5).charges_up_to_limit(), up_to_limit);
        }
    }

    #[test]
    fn local_enforces_the_share_and_open_allows() {
        let f = fallback();
        let p = Params::new(Algorithm::FixedWindow, 8, Duration::from_secs(60), None).unwrap();
        let charge = |key: &'static [u8]| Charge::new(key, &p, 1);
        let mut allowed = 0;
        for _ in 0..10 {
            let d = f.by_posture(&[local(charge(b"k"), 0.25)], true);
            allowed += u32::from(d[0].is_allowed());
        }
        assert_eq!(allowed, 2, "a quarter of 8");
        let d = f.by_posture(&[local(charge(b"k"), 0.25), charge(b"o")], true);
        assert_eq!(d[0].verdict, Verdict::Denied);
        assert!(d[1].is_allowed());
    }

    #[test]
    fn one_enforced_closed_limit_denies_as_unavailable_and_charges_nothing() {
        let f = fallback();
        let p = Params::new(Algorithm::FixedWindow, 4, Duration::from_secs(60), None).unwrap();
        let local = Charge::new(b"l", &p, 1);
        let closed = Charge::new(b"c", &p, 1);
        let local = Charge {
            posture: Posture::Local,
            local_share: 0.5,
            ..local
        };
        let closed = Charge {
            posture: Posture::Closed,
            ..closed
        };
        let d = f.by_posture(&[local, closed], true);
        assert_eq!(d[1].verdict, Verdict::Denied);
        assert_eq!(d[1].retry_after, Some(Duration::from_secs(1)));
        assert!(
            f.local_store().is_empty(),
            "the local limit was not charged"
        );
        // The local limit reports its share (half of 4), as it stands: nothing charged.
        assert_eq!((d[0].limit, d[0].remaining), (2, 2));
    }
}
