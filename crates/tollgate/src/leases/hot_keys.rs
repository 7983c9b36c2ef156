//! The store layer that keeps hot keys off the shared store: the [`Prefilter`] answers
//! remembered denials, and [`Leases`] admit from local budgets. Both apply to a shared (Redis)
//! store only ([`Granting::shared`]); on the memory store, already local, the layer is inert,
//! though that store grants leases too. Explain reads the leases without taking from them, and
//! never the prefilter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{Decision, Timestamp};

use super::lease::{Leases, Taken};
use super::prefilter::Prefilter;
use crate::store::health_of_inner;
use crate::store::{
    Answered, Call, Charge, Decisions, Granting, INLINE_CHARGES, Invalid, Mode, Store, StoreError,
    admitted, has_budgets,
};

/// The layer over the store `inner`: remembered denials (`None` when the prefilter is off),
/// this replica's leases, and how many limits they admitted without the store.
#[derive(Debug)]
pub struct HotKeys<S> {
    inner: S,
    prefilter: Option<Prefilter>,
    leases: Leases,
    local_admissions: AtomicU64,
}

impl<S> HotKeys<S> {
    /// Hot keys over `inner`, with the prefilter on when `prefilter`.
    pub fn new(inner: S, prefilter: bool) -> Self {
        HotKeys {
            inner,
            prefilter: prefilter.then(Prefilter::default),
            leases: Leases::default(),
            local_admissions: AtomicU64::new(0),
        }
    }

    /// Turns the prefilter on or off, forgetting what it remembered.
    pub fn set_prefilter(&mut self, on: bool) {
        self.prefilter = on.then(Prefilter::default);
    }

    /// The store the layer keeps hot keys off.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// This replica's leases.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Limits admitted from a lease already held, without calling the store.
    pub fn local_admissions(&self) -> &AtomicU64 {
        &self.local_admissions
    }

    /// Drops every lease without giving anything back: the store lost the counters they
    /// were reserved from, and giving units back would credit the counts made since (those
    /// reserved between the loss and this call go too: under the limit, never over; a renewal
    /// under way may still give back once). See [`Leases::forfeit`].
    pub fn forfeit(&self) {
        self.leases.forfeit();
    }
}

impl<S: Granting> HotKeys<S> {
    /// The prefilter, if on and the store is shared (the memory store is already local).
    pub fn prefilter(&self) -> Option<&Prefilter> {
        self.prefilter.as_ref().filter(|_| self.inner.shared())
    }

    /// The store local budgets are leased from: the grantor, if the store is shared (on one
    /// process a local budget would only hold units the store could have decided).
    fn lessor(&self) -> Option<&Arc<S::Grantor>> {
        self.inner.grantor().filter(|_| self.inner.shared())
    }

    /// A live charge the prefilter denies, by its index among `charges`. None when an
    /// enforced charge can never fit its limit: the store's answer (no retry-after, reason
    /// `cost_exceeds_capacity`) is not one the prefilter can give. (A limit that charges up to
    /// itself admits such a charge while a unit is left; the store decides those too.)
    fn prefiltered(
        &self,
        charges: &[Charge<'_>],
        now: Timestamp,
        epoch: u64,
    ) -> Option<(usize, Decision)> {
        let prefilter = self.prefilter()?;
        let denial = charges.iter().enumerate().find_map(|(n, charge)| {
            if !charge.enforce || !charge.prefilterable {
                return None;
            }
            let denial = prefilter.check(charge.key, charge.cost, now, epoch)?;
            Some((n, denial))
        })?;
        // Rare, so looked at only once a denial is remembered.
        let never_fits = charges
            .iter()
            .any(|c| c.enforce && c.cost > c.params.capacity());
        (!never_fits).then_some(denial)
    }

    /// Remembers the store's denials of the live charges for the prefilter, and forgets a
    /// remembered denial of a key the store just charged (a cheaper request fit), whose
    /// retry-after has moved.
    fn remember_denials(
        &self,
        charges: &[Charge<'_>],
        decisions: &[Decision],
        now: Timestamp,
        epoch: u64,
    ) {
        let Some(prefilter) = self.prefilter() else {
            return;
        };
        for (n, (charge, decision)) in charges.iter().zip(decisions).enumerate() {
            let remember = charge.prefilterable;
            // A key charged twice in one request: only its first charge was decided against
            // the stored state alone; the later ones saw the earlier ones' tentative effect.
            let repeated = charges[..n].iter().any(|c| c.key == charge.key);
            if !remember || !charge.enforce || repeated {
                continue;
            }
            if decision.is_allowed() {
                prefilter.forget(charge.key);
            } else {
                prefilter.record(charge.key, charge.cost, decision, now, epoch);
            }
        }
    }

    /// Gives back the unused units of lapsed leases and forgets cleared denials. Returns how
    /// many keys got units back.
    pub async fn sweep(&self, now: Timestamp, epoch: u64) -> usize {
        if let Some(prefilter) = self.prefilter() {
            prefilter.sweep(now, epoch);
        }
        self.release(now, epoch).await
    }

    /// Gives back the unused units of the leases lapsed at `now` (every one at
    /// [`Timestamp::MAX`]). Returns how many keys got units back.
    pub async fn release(&self, now: Timestamp, epoch: u64) -> usize {
        let Some(grantor) = self.lessor() else {
            return 0;
        };
        let credited = self.leases.sweep(&**grantor, now, epoch).await;
        // A lease of an older epoch may be given back to a counter whose rule lost its
        // budget meanwhile: a denial remembered for it may no longer hold.
        if let Some(prefilter) = self.prefilter() {
            for key in &credited {
                prefilter.forget(key);
            }
        }
        credited.len()
    }
}

impl<S: Store + Granting> HotKeys<S> {
    /// Decides `charges` (the live policy's, then a candidate's) into `decisions`. A live
    /// charge with a remembered denial answers a charged request with no candidate in it,
    /// calling nothing. The live charges whose rule has a local budget go to this replica's
    /// leases, the rest to the store, which is not called when nothing is left for it.
    /// Charged, all or nothing: if the store denies the request, the leases get their units
    /// back. For explain, the leases answer taking nothing: a lease holds units the store
    /// counts as used, so a peek alone reads a key this replica would still admit as
    /// exhausted; and while the store is down, a request served from leases alone still admits.
    /// Once the store decided a charged request, its denials are remembered.
    async fn decide_hot(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<Answered, StoreError> {
        let commit = call.mode.applies();
        // Not while a candidate shadows: it must see every request the running policy decides.
        if commit
            && !call.shadowed(charges)
            && let Some((index, denial)) = self.prefiltered(charges, call.now, call.epoch)
        {
            return Ok(Answered::Remembered { index, denial });
        }
        let answered = match self.lessor() {
            // Boxed: inline, the lease paths' state would make every decision's future 3.9 KB
            // instead of 1.4 KB, and the Redis path boxes that future per request. The lease
            // paths call Redis anyway; one more allocation is nothing beside that.
            Some(grantor) if has_budgets(charges) => {
                if commit {
                    Box::pin(self.apply_leased(call, grantor, charges, decisions)).await?;
                } else {
                    Box::pin(self.explain_leased(call, charges, decisions)).await?;
                }
                Answered::Store
            }
            _ => self.inner.decide(call, charges, decisions).await?,
        };
        if commit && matches!(answered, Answered::Store) {
            let live = call.live(charges);
            let live_decisions = decisions.get(..live.len()).unwrap_or_default();
            self.remember_denials(live, live_decisions, call.now, call.epoch);
        }
        Ok(answered)
    }

    /// [`HotKeys::decide_hot`] for explain, once a live charge has a local budget. (Each
    /// charge is read against its lease on its own: a key charged twice in one request is
    /// explained as if charged once.)
    async fn explain_leased(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        let (now, epoch) = (call.now, call.epoch);
        let leased: SmallVec<[Option<Decision>; INLINE_CHARGES]> = charges
            .iter()
            .map(|charge| {
                charge.local_budget?;
                self.leases.would_serve(charge, now, epoch)
            })
            .collect();
        let from_lease = |i: usize| leased.get(i).copied().flatten();
        let rest: SmallVec<[Charge<'_>; INLINE_CHARGES]> = (0..charges.len())
            .filter(|&i| from_lease(i).is_none())
            .map(|i| charges[i])
            .collect();
        let mut peeked = Decisions::new();
        if !rest.is_empty() {
            let call = Call {
                mode: Mode::Peek,
                ..call
            };
            self.inner.decide(call, &rest, &mut peeked).await?;
        }
        let mut peeked = peeked.into_iter();
        decisions.clear();
        for i in 0..charges.len() {
            let decision = from_lease(i)
                .or_else(|| peeked.next())
                .ok_or(StoreError::InvalidData(Invalid::TooFewFromStore))?;
            decisions.push(decision);
        }
        Ok(())
    }

    /// [`HotKeys::decide_hot`] to charge, once a live charge has a local budget.
    async fn apply_leased(
        &self,
        call: Call,
        grantor: &Arc<S::Grantor>,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> Result<(), StoreError> {
        let (now, epoch) = (call.now, call.epoch);
        let mut taken: SmallVec<[Option<Taken>; INLINE_CHARGES]> = SmallVec::new();
        for charge in charges {
            taken.push(match charge.local_budget {
                Some(&budget) => self.leases.take(grantor, *charge, budget, now, epoch).await,
                None => None,
            });
        }
        let rest: SmallVec<[Charge<'_>; INLINE_CHARGES]> = charges
            .iter()
            .zip(&taken)
            .filter(|(_, taken)| taken.is_none())
            .map(|(charge, _)| *charge)
            .collect();
        let mut decided = Decisions::new();
        let answer = if rest.is_empty() {
            Ok(())
        } else {
            let live = call.live.saturating_sub(charges.len() - rest.len());
            let call = Call { live, ..call };
            self.inner.decide(call, &rest, &mut decided).await.map(drop)
        };
        let mut decided = decided.into_iter();
        decisions.clear();
        decisions.extend(
            taken
                .iter()
                .map_while(|t| t.as_ref().map(|t| t.decision).or_else(|| decided.next())),
        );
        let answer = match answer {
            Ok(()) if decisions.len() < charges.len() => {
                Err(StoreError::InvalidData(Invalid::TooFewFromStore))
            }
            answer => answer,
        };
        let admitted = answer.is_ok() && admitted(charges, decisions);
        for (i, (charge, t)) in charges.iter().zip(&taken).enumerate() {
            match t {
                Some(t) if !admitted => {
                    // Its figures as they stand, as the stores answer for a request denied
                    // (units that cannot go back stay charged).
                    if t.put_back(charge.cost)
                        && let Some(d) = decisions.get_mut(i)
                    {
                        d.remaining = d.remaining.saturating_add(charge.cost);
                        d.delay = Duration::ZERO;
                    }
                }
                Some(t) if t.spared_the_store => {
                    self.local_admissions.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        answer
    }
}

impl<S: Store + Granting> Store for HotKeys<S> {
    fn decide(
        &self,
        call: Call,
        charges: &[Charge<'_>],
        decisions: &mut Decisions,
    ) -> impl std::future::Future<Output = Result<Answered, StoreError>> + Send {
        self.decide_hot(call, charges, decisions)
    }

    health_of_inner!(apply_before);
}

impl<S: Granting> Granting for HotKeys<S> {
    type Grantor = S::Grantor;

    fn grantor(&self) -> Option<&Arc<Self::Grantor>> {
        self.inner.grantor()
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use tollgate_core::{Algorithm, Params, Verdict};

    use super::*;
    use crate::policy::LocalBudget;
    use crate::store::{Failure, Grants, RedisFailure, Unsupported};

    /// A failure of the store, saying `why`.
    fn failure(why: &str) -> StoreError {
        StoreError::Unavailable(Failure::Redis(RedisFailure::Script(why.to_owned())))
    }

    /// A store that counts its calls: it admits every charge (each on a fresh counter: the
    /// limit less the charge's cost remaining) except on the key `over`, which it denies for 10 s, and fails every call once told to.
    #[derive(Debug, Default)]
    struct Counted {
        decides: AtomicUsize,
        reserves: AtomicUsize,
        give_backs: AtomicUsize,
        failing: AtomicBool,
    }

    impl Counted {
        fn answer(&self, charge: &Charge<'_>) -> Result<Decision, StoreError> {
            if self.failing.load(Ordering::Relaxed) {
                return Err(failure("told to fail"));
            }
            let limit = charge.params.limit();
            let over = charge.key == b"over";
            Ok(Decision {
                verdict: if over {
                    Verdict::Denied
                } else {
                    Verdict::Allowed
                },
                limit,
                remaining: if over {
                    0
                } else {
                    limit.saturating_sub(charge.cost)
                },
                reset_after: Duration::from_secs(60),
                retry_after: over.then_some(Duration::from_secs(10)),
                delay: Duration::ZERO,
            })
        }

        fn calls(&self) -> [usize; 3] {
            [&self.decides, &self.reserves, &self.give_backs].map(|n| n.load(Ordering::Relaxed))
        }
    }

    impl Store for Counted {
        async fn decide(
            &self,
            _call: Call,
            charges: &[Charge<'_>],
            decisions: &mut Decisions,
        ) -> Result<Answered, StoreError> {
            self.decides.fetch_add(1, Ordering::Relaxed);
            decisions.clear();
            for charge in charges {
                decisions.push(self.answer(charge)?);
            }
            Ok(Answered::Store)
        }

        async fn apply_before(
            &self,
            _charges: &[Charge<'_>],
            _deadline: tokio::time::Instant,
        ) -> Result<Vec<Decision>, StoreError> {
            Err(failure("not asked here"))
        }

        fn supports(&self, _params: &Params) -> Result<(), Unsupported> {
            Ok(())
        }

        async fn key_count(&self) -> Result<usize, StoreError> {
            Ok(0)
        }

        fn breakers(&self) -> Vec<(String, crate::resilience::BreakerState)> {
            Vec::new()
        }

        fn kind(&self) -> &'static str {
            "counted"
        }
    }

    impl Grants for Counted {
        async fn reserve(&self, charge: Charge<'_>) -> Result<(Decision, i64), StoreError> {
            self.reserves.fetch_add(1, Ordering::Relaxed);
            Ok((self.answer(&charge)?, 7))
        }

        async fn give_back(&self, _charge: Charge<'_>, _at: i64) -> Result<(), StoreError> {
            self.give_backs.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    /// The counted store as a stack's bottom, shared between replicas or not.
    #[derive(Debug)]
    struct Bottom {
        inner: Arc<Counted>,
        shared: bool,
    }

    impl Store for Bottom {
        fn decide(
            &self,
            call: Call,
            charges: &[Charge<'_>],
            decisions: &mut Decisions,
        ) -> impl std::future::Future<Output = Result<Answered, StoreError>> + Send {
            self.inner.decide(call, charges, decisions)
        }

        health_of_inner!(apply_before);
    }

    impl Granting for Bottom {
        type Grantor = Counted;

        fn grantor(&self) -> Option<&Arc<Counted>> {
            Some(&self.inner)
        }

        fn shared(&self) -> bool {
            self.shared
        }
    }

    fn layer(shared: bool) -> (Arc<Counted>, HotKeys<Bottom>) {
        let store = Arc::new(Counted::default());
        let bottom = Bottom {
            inner: store.clone(),
            shared,
        };
        (store, HotKeys::new(bottom, true))
    }

    fn minute() -> Params {
        Params::new(Algorithm::FixedWindow, 100, Duration::from_secs(60), None)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    const BUDGET: LocalBudget = LocalBudget {
        size: 5,
        ttl: Duration::from_secs(1),
    };

    /// A charge the prefilter may remember.
    fn remembered<'a>(key: &'a [u8], params: &'a Params) -> Charge<'a> {
        Charge {
            prefilterable: true,
            ..Charge::new(key, params, 1)
        }
    }

    /// A charge of a rule with a local budget of five units.
    fn leased<'a>(key: &'a [u8], params: &'a Params) -> Charge<'a> {
        Charge {
            local_budget: Some(&BUDGET),
            ..Charge::new(key, params, 1)
        }
    }

    async fn apply(
        layer: &HotKeys<Bottom>,
        at: Timestamp,
        charges: &[Charge<'_>],
    ) -> (Result<Answered, StoreError>, Decisions) {
        let call = Call {
            now: at,
            ..Call::plain(Mode::Apply)
        };
        let mut decisions = Decisions::new();
        let answered = layer.decide(call, charges, &mut decisions).await;
        (answered, decisions)
    }

    const T: Timestamp = Timestamp::from_micros(1_700_000_000_000_000);

    /// The store's denial is remembered: the same request answers from it, without the store,
    /// until the retry-after the store gave.
    #[tokio::test]
    async fn a_remembered_denial_answers_without_calling_the_store() {
        let (store, layer) = layer(true);
        let params = minute();
        let over = [remembered(b"over", &params)];
        let (answered, decisions) = apply(&layer, T, &over).await;
        assert!(matches!(answered, Ok(Answered::Store)), "{answered:?}");
        assert_eq!(decisions[0].verdict, Verdict::Denied);
        let soon = T.saturating_add(Duration::from_secs(4));
        let (answered, _) = apply(&layer, soon, &over).await;
        let Ok(Answered::Remembered { index: 0, denial }) = answered else {
            panic!("remembered: {answered:?}");
        };
        assert_eq!(denial.retry_after, Some(Duration::from_secs(6)));
        assert_eq!(store.calls(), [1, 0, 0], "the store was not called again");
        let (answered, _) = apply(&layer, T.saturating_add(Duration::from_secs(10)), &over).await;
        assert!(matches!(answered, Ok(Answered::Store)), "{answered:?}");
        assert_eq!(
            store.calls(),
            [2, 0, 0],
            "past the retry-after, the store decides"
        );
    }

    /// A lease reserved in one call serves its units without calling the store.
    #[tokio::test]
    async fn leases_serve_without_calling_the_store() {
        let (store, layer) = layer(true);
        let params = minute();
        let hot = [leased(b"hot", &params)];
        for n in 0..BUDGET.size {
            let (answered, decisions) = apply(&layer, T, &hot).await;
            assert!(matches!(answered, Ok(Answered::Store)), "{answered:?}");
            assert!(decisions[0].is_allowed());
            assert_eq!(
                decisions[0].remaining,
                100 - (n + 1),
                "request {n}: the limit less what it used"
            );
        }
        assert_eq!(store.calls(), [0, 1, 0], "one reservation, no decision");
        assert_eq!(layer.local_admissions().load(Ordering::Relaxed), 4);
        // Used up: the next request reserves again (nothing is left to give back).
        apply(&layer, T, &hot)
            .await
            .0
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.calls(), [0, 2, 0]);
        // Lapsed, the lease gives its 4 unused units back.
        let lapsed = T.saturating_add(BUDGET.ttl);
        assert_eq!(layer.release(lapsed, 0).await, 1);
        assert_eq!(store.calls(), [0, 2, 1]);
    }

    /// A request the store denies charges nothing: a limit admitted from a lease gets its
    /// units back into the lease (and answers as it stands).
    #[tokio::test]
    async fn a_store_denial_gives_the_leases_their_units_back() {
        let (store, layer) = layer(true);
        let params = minute();
        let (answered, decisions) = apply(
            &layer,
            T,
            &[leased(b"hot", &params), Charge::new(b"over", &params, 1)],
        )
        .await;
        assert!(matches!(answered, Ok(Answered::Store)), "{answered:?}");
        assert_eq!(decisions[1].verdict, Verdict::Denied);
        assert_eq!(decisions[0].remaining, 100, "as it stands: nothing used");
        // All five units are still in the lease.
        for _ in 0..BUDGET.size {
            apply(&layer, T, &[leased(b"hot", &params)])
                .await
                .0
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(
            store.calls(),
            [1, 1, 0],
            "the five came from the first lease"
        );
        assert_eq!(layer.local_admissions().load(Ordering::Relaxed), 5);
    }

    /// A store that fails fails the call (the postures above answer); the units a lease
    /// admitted for it go back into the lease.
    #[tokio::test]
    async fn a_failing_store_fails_the_call_and_leaves_the_lease_whole() {
        let (store, layer) = layer(true);
        let params = minute();
        apply(&layer, T, &[leased(b"hot", &params)])
            .await
            .0
            .unwrap_or_else(|e| panic!("{e}"));
        store.failing.store(true, Ordering::Relaxed);
        let both = [leased(b"hot", &params), Charge::new(b"cold", &params, 1)];
        let (answered, _) = apply(&layer, T, &both).await;
        assert!(
            matches!(answered, Err(StoreError::Unavailable(_))),
            "{answered:?}"
        );
        // The lease still holds its 4: served from it while the store fails.
        for _ in 0..4 {
            let (answered, decisions) = apply(&layer, T, &[leased(b"hot", &params)]).await;
            assert!(
                answered.is_ok() && decisions[0].is_allowed(),
                "{answered:?}"
            );
        }
        assert_eq!(store.calls(), [1, 1, 0]);
    }

    /// On a store of one process the layer is inert, though the store grants leases: every
    /// request goes to the store, no denial is remembered and no lease reserved.
    #[tokio::test]
    async fn on_an_unshared_store_the_layer_is_inert() {
        let (store, layer) = layer(false);
        assert!(layer.prefilter().is_none());
        let params = minute();
        let over = remembered(b"over", &params);
        for _ in 0..3 {
            let (answered, _) = apply(&layer, T, &[over, leased(b"hot", &params)]).await;
            assert!(matches!(answered, Ok(Answered::Store)), "{answered:?}");
        }
        assert_eq!(store.calls(), [3, 0, 0]);
        assert_eq!(layer.release(Timestamp::MAX, 0).await, 0);
        assert_eq!(layer.local_admissions().load(Ordering::Relaxed), 0);
    }
}
