//! A shadow policy candidate: a second policy decided beside the live one on real traffic,
//! never enforced, so an operator can see what it would deny before making it live.
//!
//! The candidate's counters live in their own key space (`c|` + its content hash, see
//! [`super::keys::candidate_rule_key`]), so it never moves a live counter; its charges ride in
//! the same store call as the live ones, all with `enforce: false`. Replicas sharing a store and
//! shadowing the same candidate (same hash) count against the same counters.

use std::sync::Arc;

use tollgate_core::Timestamp;

use super::request::RequestDescriptor;
use super::snapshot::top_keys_per_rule;
use crate::metrics::{Outcome, RuleCounters, render_outcomes};
use crate::observe::prometheus::Exposition;
use crate::observe::shares::{self, ValueShares};
use crate::observe::{TopEntry, TopKeys};
use crate::policy::sources::sources_hash;
use crate::policy::{Policy, Rule, RuleMode};

/// Name of the candidate's decision counter family.
pub const CANDIDATE_DECISIONS: &str = "tollgate_candidate_decisions_total";

/// A validated policy shadowing the live one, with what it would have decided so far.
#[derive(Debug)]
pub struct Candidate {
    policy: Arc<Policy>,
    sources: Vec<(String, String)>,
    hash: String,
    counters: RuleCounters,
    /// Per rule: the keys it would have denied most often.
    top: Box<[TopKeys]>,
    /// Per rule (the first [`shares::MAX_RULES`]): the would-deny share of its most frequent
    /// values.
    shares: Box<[Option<Arc<ValueShares>>]>,
    started_at: Timestamp,
}

/// What one candidate rule would have decided since the candidate was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleReport {
    /// The rule's domain.
    pub domain: String,
    /// The rule's name.
    pub name: String,
    /// The rule's mode in the candidate (`enforce`, `shadow`, `soft`).
    pub mode: RuleMode,
    /// Descriptors the rule would have allowed.
    pub allowed: u64,
    /// Descriptors the rule would have denied (for a `soft` rule: marked as exceeded; for a
    /// `shadow` rule: reported as a shadow denial).
    pub would_deny: u64,
    /// The keys it would have denied most often, heaviest first.
    pub top: Vec<TopEntry>,
}

impl Candidate {
    /// A candidate running `policy`, compiled (and validated) from `sources`, starting now.
    pub fn new(policy: Policy, sources: Vec<(String, String)>, started_at: Timestamp) -> Self {
        let counters = RuleCounters::for_policy(&policy);
        let top = top_keys_per_rule(&policy);
        let rules = policy.rules().iter();
        let shares = shares::tables(rules.clone().map(|_| None), rules.map(|_| true));
        Candidate {
            hash: sources_hash(&sources),
            policy: Arc::new(policy),
            sources,
            counters,
            top,
            shares,
            started_at,
        }
    }

    /// The candidate policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// The would-deny shares per value of `rule` (one of this candidate's rules), if it has a
    /// table.
    pub fn value_shares(&self, rule: &Rule) -> Option<Arc<ValueShares>> {
        let own = self.policy.rules().get(rule.index)?;
        (own.domain == rule.domain && own.name == rule.name)
            .then(|| self.shares.get(rule.index).cloned().flatten())
            .flatten()
    }

    /// The `(file name, text)` pairs it was compiled from.
    pub fn sources(&self) -> &[(String, String)] {
        &self.sources
    }

    /// Content hash of the sources (as [`sources_hash`]); also names its counters' key space.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// When it was set.
    pub fn started_at(&self) -> Timestamp {
        self.started_at
    }

    /// Per rule that has a limit, in file order: what it would have decided, with its `top_n`
    /// most denied keys.
    pub fn report(&self, top_n: usize) -> Vec<RuleReport> {
        self.policy
            .rules()
            .iter()
            .filter(|rule| rule.limit.is_some())
            .map(|rule| RuleReport {
                domain: rule.domain.clone(),
                name: rule.name.clone(),
                mode: rule.mode,
                allowed: self.counters.get(rule.index, Outcome::Allowed),
                would_deny: self.counters.get(rule.index, Outcome::of(true, rule.mode)),
                top: self
                    .top
                    .get(rule.index)
                    .map_or_else(Vec::new, |top| top.top(top_n)),
            })
            .collect()
    }

    /// Counts one decision `rule` of this candidate made for `descriptor`; a check
    /// (`hits_addend: 0`) is not counted, as the live policy's decisions do not count it.
    pub(super) fn record(&self, rule: &Rule, descriptor: &RequestDescriptor, denied: bool) {
        if descriptor.cost() == 0 {
            return;
        }
        self.counters
            .record(rule.index, Outcome::of(denied, rule.mode));
        let shares = self.shares.get(rule.index).and_then(Option::as_ref);
        let top = self.top.get(rule.index).filter(|_| denied);
        if shares.is_none() && top.is_none() {
            return;
        }
        let text = super::describe::descriptor_text(descriptor);
        if let Some(shares) = shares {
            shares.record(text.as_str(), denied);
        }
        if let Some(top) = top {
            top.record(text.as_str(), 1);
        }
    }

    /// Appends [`CANDIDATE_DECISIONS`] in Prometheus text format.
    pub(super) fn render_metrics(&self, out: &mut String) {
        render_outcomes(
            &mut Exposition::new(out),
            (
                CANDIDATE_DECISIONS,
                "Descriptors checked against a rule of the shadow candidate policy, by outcome (never enforced).",
            ),
            self.policy.rules(),
            |index, outcome| self.counters.get(index, outcome),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;
    use crate::lifecycle::{Activation, Lifecycle};
    use crate::limiter::{CheckRequest, LimitOverride, Limiter};
    use crate::store::{MemoryStore, StoreBackend};

    const LIVE: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 5}
";

    const STRICTER: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 1, mode: shadow}
  - key: burst
    rate_limit: {name: soft_burst, unit: minute, requests_per_unit: 1, mode: soft}
  - key: vip
    rate_limit: {name: vip, unit: minute, requests_per_unit: 9, replaces: [{name: per_user}]}
";

    fn sources(text: &str) -> Vec<(String, String)> {
        vec![("candidate.yaml".to_owned(), text.to_owned())]
    }

    fn lifecycle() -> Lifecycle {
        // Aligned to a minute so no window rolls over during a test.
        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
            1_700_000_040_000_000,
        )));
        let store = StoreBackend::Memory(MemoryStore::new(clock.clone()));
        let policy = Policy::from_yaml("live.yaml", LIVE).unwrap();
        let limiter = Limiter::with_failure_settings(
            policy,
            store,
            crate::limiter::FailureSettings::default(),
            clock,
        );
        Lifecycle::new(Arc::new(limiter), None, sources(LIVE))
    }

    fn request(descriptors: &[&[(&str, &str)]]) -> CheckRequest {
        let descriptors = descriptors
            .iter()
            .map(|entries| {
                let entries = entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                RequestDescriptor::new(entries, 1, None).unwrap()
            })
            .collect();
        CheckRequest::new("api".into(), descriptors).unwrap()
    }

    fn rule<'a>(report: &'a [RuleReport], name: &str) -> &'a RuleReport {
        report.iter().find(|r| r.name == name).unwrap()
    }

    fn live_rule(limiter: &Limiter, name: &str) -> Arc<Rule> {
        let policy = limiter.policy();
        policy
            .rules()
            .iter()
            .find(|r| r.name == name)
            .unwrap()
            .clone()
    }

    #[tokio::test]
    async fn a_candidate_never_changes_the_answer_or_the_live_counters() {
        let lifecycle = lifecycle();
        let limiter = lifecycle.limiter();
        lifecycle.set_candidate(sources(STRICTER)).unwrap();
        let mut remaining = Vec::new();
        for _ in 0..4 {
            let answer = limiter.check(&request(&[&[("user", "a")]])).await.unwrap();
            assert!(answer.allowed(), "the live policy decides");
            assert!(!answer.statuses[0].shadow_would_deny);
            remaining.push(answer.statuses[0].decision.unwrap().remaining);
        }
        assert_eq!(
            remaining,
            [4, 3, 2, 1],
            "the live counter moved by one each time"
        );
        assert!(
            limiter
                .check(&request(&[&[("user", "b")]]))
                .await
                .unwrap()
                .allowed()
        );

        let candidate = limiter.candidate().unwrap();
        let report = candidate.report(5);
        let per_user = rule(&report, "per_user");
        assert_eq!((per_user.allowed, per_user.would_deny), (3, 2));
        assert_eq!(per_user.top.len(), 1);
        assert_eq!(
            (per_user.top[0].key.as_str(), per_user.top[0].count),
            ("user=a", 2)
        );
        let live = live_rule(limiter, "per_user");
        assert_eq!(limiter.rule_count(&live, Outcome::Denied), 0);
        assert_eq!(limiter.rule_count(&live, Outcome::Allowed), 5);
    }

    #[tokio::test]
    async fn candidate_modes_count_as_the_live_policy_would_and_replaces_apply() {
        let lifecycle = lifecycle();
        let limiter = lifecycle.limiter();
        lifecycle.set_candidate(sources(STRICTER)).unwrap();
        // Rules only the candidate has: the live policy matches nothing and allows.
        for (key, value) in [
            ("tenant", "t"),
            ("tenant", "t"),
            ("burst", "x"),
            ("burst", "x"),
        ] {
            let answer = limiter.check(&request(&[&[(key, value)]])).await.unwrap();
            assert!(answer.allowed());
            assert!(answer.statuses[0].limit.is_none(), "no live rule matched");
        }
        // `vip` replaces `per_user` in the candidate: 3 requests, per_user never sees them.
        for _ in 0..3 {
            let r = request(&[&[("user", "c")], &[("vip", "c")]]);
            assert!(limiter.check(&r).await.unwrap().allowed());
        }
        let report = limiter.candidate().unwrap().report(5);
        assert_eq!(rule(&report, "per_tenant").would_deny, 1);
        assert_eq!(rule(&report, "soft_burst").would_deny, 1);
        assert_eq!(rule(&report, "per_user").allowed, 0, "replaced by vip");
        assert_eq!(rule(&report, "vip").allowed, 3);

        let mut metrics = String::new();
        limiter.candidate().unwrap().render_metrics(&mut metrics);
        for line in [
            r#"tollgate_candidate_decisions_total{domain="api",rule="per_tenant",outcome="shadow_would_deny"} 1"#,
            r#"tollgate_candidate_decisions_total{domain="api",rule="soft_burst",outcome="soft_exceeded"} 1"#,
            r#"tollgate_candidate_decisions_total{domain="api",rule="soft_burst",outcome="allowed"} 1"#,
            r#"tollgate_candidate_decisions_total{domain="api",rule="vip",outcome="allowed"} 3"#,
        ] {
            assert!(metrics.contains(line), "missing `{line}` in\n{metrics}");
        }
    }

    #[tokio::test]
    async fn explain_and_caller_limits_do_not_feed_the_candidate() {
        let lifecycle = lifecycle();
        let limiter = lifecycle.limiter();
        lifecycle.set_candidate(sources(STRICTER)).unwrap();
        for _ in 0..3 {
            limiter
                .explain(&request(&[&[("user", "a")]]))
                .await
                .unwrap();
        }
        let own_limit = LimitOverride::new(100, Duration::from_secs(60)).unwrap();
        let d = RequestDescriptor::new(vec![("user".into(), "a".into())], 1, Some(own_limit));
        let r = CheckRequest::new("api".into(), vec![d.unwrap()]).unwrap();
        assert!(limiter.check(&r).await.unwrap().allowed());
        let report = limiter.candidate().unwrap().report(5);
        let per_user = rule(&report, "per_user");
        assert_eq!((per_user.allowed, per_user.would_deny), (0, 0));
    }

    #[tokio::test]
    async fn candidate_counters_live_apart_from_the_live_ones() {
        let lifecycle = lifecycle();
        let limiter = lifecycle.limiter();
        let store = limiter.store().memory().expect("memory store");
        limiter.check(&request(&[&[("user", "a")]])).await.unwrap();
        assert_eq!(store.len(), 1);
        lifecycle.set_candidate(sources(STRICTER)).unwrap();
        limiter.check(&request(&[&[("user", "a")]])).await.unwrap();
        assert_eq!(store.len(), 2, "one live and one candidate counter");
        let mut metrics = limiter.render_metrics().await;
        assert!(metrics.contains(CANDIDATE_DECISIONS));
        lifecycle.drop_candidate().unwrap();
        assert!(lifecycle.drop_candidate().is_none());
        metrics = limiter.render_metrics().await;
        assert!(
            !metrics.contains(CANDIDATE_DECISIONS),
            "only while one is set"
        );
    }

    #[tokio::test]
    async fn an_invalid_candidate_changes_nothing_and_the_same_one_keeps_its_counts() {
        let lifecycle = lifecycle();
        let limiter = lifecycle.limiter();
        let first = lifecycle.set_candidate(sources(STRICTER)).unwrap();
        limiter.check(&request(&[&[("user", "a")]])).await.unwrap();

        let broken = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
        let errors = lifecycle.set_candidate(sources(broken)).unwrap_err();
        assert!(errors.to_string().contains("candidate.yaml:4:"), "{errors}");
        let still = limiter.candidate().unwrap();
        assert!(Arc::ptr_eq(&still, &first), "the old candidate stays");

        let again = lifecycle.set_candidate(sources(STRICTER)).unwrap();
        assert!(Arc::ptr_eq(&again, &first), "same texts: same candidate");
        assert_eq!(rule(&again.report(1), "per_user").allowed, 1);
    }

    #[tokio::test]
    async fn promote_activates_the_candidate_on_the_live_counters_and_clears_it() {
        let lifecycle = lifecycle();
        let limiter = lifecycle.limiter();
        assert!(lifecycle.promote().is_err(), "nothing to promote");
        lifecycle.set_candidate(sources(STRICTER)).unwrap();
        for _ in 0..3 {
            assert!(
                limiter
                    .check(&request(&[&[("user", "a")]]))
                    .await
                    .unwrap()
                    .allowed()
            );
        }
        let activation = lifecycle.promote().unwrap();
        assert!(matches!(activation, Activation::Activated(_)));
        assert_eq!(activation.version().hash, sources_hash(&sources(STRICTER)));
        assert!(limiter.candidate().is_none());
        // The live per_user counter has 3 used; the promoted limit is 2.
        let answer = limiter.check(&request(&[&[("user", "a")]])).await.unwrap();
        assert!(!answer.allowed());
    }
}
