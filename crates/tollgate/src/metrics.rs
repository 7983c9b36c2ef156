//! Decision counters per rule, rendered in the Prometheus text format.
//!
//! Counters are allocated when a policy is compiled (one slot per rule), so counting on the
//! request path is one atomic add. Labels are bounded: domain and rule name from the policy
//! file, never a client-supplied value, except for the rules that ask for it with
//! `detailed_metric: true` (as in envoyproxy/ratelimit): those are also counted per descriptor
//! value, under a lock of their own, for at most [`MAX_DETAILED_VALUES`] values per rule.
//!
//! A descriptor sent with `hits_addend: 0` is a check, not a decision: it charges nothing, and
//! is counted apart, in `tollgate_checks_total`, so that Envoy's check before a request and
//! charge after it count one decision, not two.
//!
//! Only the series a rule can produce are written, each from the policy's load on (at 0 until
//! counted, so that `rate()` sees the first increment): its mode's two outcomes
//! ([`Outcome::of_mode`]) among decisions and among checks, and its failure posture's degraded
//! decisions; a rule without a limit (`unlimited: true`) decides nothing and has none. A reload
//! continues a rule's counters, all of them: a series its new mode or posture no longer produces
//! disappears, and one it produces again comes back at the count it had, never lower.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::observe::prometheus::{Exposition, Kind};
use crate::policy::{Policy, Posture, Rule, RuleMode, posture_of};

/// Descriptors charged against a rule, by domain, rule and outcome.
pub const DECISIONS: &str = "tollgate_decisions_total";

/// Descriptors checked (`hits_addend: 0`) against a rule, by domain, rule and outcome.
pub const CHECKS: &str = "tollgate_checks_total";

/// Outcomes of `detailed_metric` rules, by domain, rule, descriptor and outcome.
pub const DETAILED_DECISIONS: &str = "tollgate_detailed_decisions_total";

/// Decisions a rule's failure posture made, by domain, rule and posture.
pub const DEGRADED_DECISIONS: &str = "tollgate_degraded_decisions_total";

/// What happened to one descriptor checked against a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed by the rule.
    Allowed,
    /// Denied by the rule.
    Denied,
    /// Shadow-mode rule that would have denied.
    ShadowWouldDeny,
    /// Soft rule over its limit: allowed and marked.
    SoftExceeded,
}

impl Outcome {
    /// How a decision by a rule in `mode` is counted.
    pub fn of(denied: bool, mode: RuleMode) -> Outcome {
        match (denied, mode) {
            (false, _) => Outcome::Allowed,
            (true, RuleMode::Enforce) => Outcome::Denied,
            (true, RuleMode::Shadow) => Outcome::ShadowWouldDeny,
            (true, RuleMode::Soft) => Outcome::SoftExceeded,
        }
    }

    /// The outcomes a rule in `mode` can produce, in rendering order: allowed, and its mode's
    /// over-the-limit outcome.
    pub fn of_mode(mode: RuleMode) -> [Outcome; 2] {
        [Outcome::Allowed, Outcome::of(true, mode)]
    }

    /// Every outcome, in rendering order.
    pub const ALL: [Outcome; 4] = [
        Outcome::Allowed,
        Outcome::Denied,
        Outcome::ShadowWouldDeny,
        Outcome::SoftExceeded,
    ];

    /// The `outcome` label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::ShadowWouldDeny => "shadow_would_deny",
            Outcome::SoftExceeded => "soft_exceeded",
        }
    }
}

/// Slots per rule: the outcomes, then one per failure posture.
const SLOTS: usize = Outcome::ALL.len() + Posture::ALL.len();

fn posture_slot(posture: Posture) -> usize {
    Outcome::ALL.len() + posture as usize
}

/// Distinct descriptor values counted per `detailed_metric` rule; later ones are counted
/// together as [`OTHER_VALUES`].
pub const MAX_DETAILED_VALUES: usize = 1000;

/// The `descriptor` label of the values past [`MAX_DETAILED_VALUES`]. Never a descriptor's:
/// a descriptor's text holds a `=`, or is cut at a length far above this one's.
pub const OTHER_VALUES: &str = "_other";

/// One rule's counters.
type Slot = Arc<RuleSlot>;

#[derive(Debug, Default)]
struct RuleSlot {
    counts: [AtomicU64; SLOTS],
    /// Checks (`hits_addend: 0`), by outcome.
    checks: [AtomicU64; Outcome::ALL.len()],
    /// Per descriptor value (`detailed_metric` rules only): a count per outcome.
    values: parking_lot::Mutex<HashMap<Box<str>, [u64; Outcome::ALL.len()]>>,
}

/// Counters for every rule of one policy.
#[derive(Debug)]
pub struct RuleCounters {
    counts: Box<[Slot]>,
}

impl RuleCounters {
    /// One zeroed slot per rule of `policy`.
    pub fn for_policy(policy: &Policy) -> Self {
        RuleCounters {
            counts: policy.rules().iter().map(|_| Slot::default()).collect(),
        }
    }

    /// The counters of `policy`, continuing those of `previous` (the counters of
    /// `previous_policy`) for every rule with the same domain and name: Prometheus counters
    /// only go up while the process runs, whatever is reloaded, rolled back or adopted, and a
    /// decision still in flight under the old policy counts in the same place.
    pub fn continuing(policy: &Policy, previous_policy: &Policy, previous: &RuleCounters) -> Self {
        RuleCounters {
            counts: policy.carry_over(previous_policy, &previous.counts, Slot::default),
        }
    }

    /// Counts one outcome for the rule at `index`.
    pub fn record(&self, index: usize, outcome: Outcome) {
        if let Some(slot) = self.counts.get(index) {
            slot.counts[outcome as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one check's outcome for the rule at `index`.
    pub fn record_check(&self, index: usize, outcome: Outcome) {
        if let Some(slot) = self.counts.get(index) {
            slot.checks[outcome as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one outcome for the rule at `index` under the descriptor shown as `value` (for a
    /// rule with `detailed_metric`; see [`MAX_DETAILED_VALUES`]).
    pub fn record_value(&self, index: usize, value: &str, outcome: Outcome) {
        let Some(slot) = self.counts.get(index) else {
            return;
        };
        let mut values = slot.values.lock();
        let key = if values.contains_key(value) || values.len() < MAX_DETAILED_VALUES {
            value
        } else {
            OTHER_VALUES
        };
        match values.get_mut(key) {
            Some(counts) => counts[outcome as usize] += 1,
            None => {
                let mut counts = [0; Outcome::ALL.len()];
                counts[outcome as usize] = 1;
                values.insert(key.into(), counts);
            }
        }
    }

    /// Counts one decision the rule's failure posture made because the store could not.
    pub fn record_degraded(&self, index: usize, posture: Posture) {
        if let Some(slot) = self.counts.get(index) {
            slot.counts[posture_slot(posture)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count of degraded decisions made with `posture` for the rule at `index`.
    pub fn degraded(&self, index: usize, posture: Posture) -> u64 {
        self.counts.get(index).map_or(0, |slot| {
            slot.counts[posture_slot(posture)].load(Ordering::Relaxed)
        })
    }

    /// The count of `outcome` for the rule at `index`.
    pub fn get(&self, index: usize, outcome: Outcome) -> u64 {
        self.counts.get(index).map_or(0, |slot| {
            slot.counts[outcome as usize].load(Ordering::Relaxed)
        })
    }

    /// The count of checks with `outcome` for the rule at `index`.
    pub fn checks(&self, index: usize, outcome: Outcome) -> u64 {
        self.counts.get(index).map_or(0, |slot| {
            slot.checks[outcome as usize].load(Ordering::Relaxed)
        })
    }

    /// Per descriptor value of a `detailed_metric` rule (by its index): its decisions per
    /// outcome, in the order of the values. Copied out, so decisions do not wait for the caller.
    pub fn values(&self, index: usize) -> Vec<(Box<str>, [u64; Outcome::ALL.len()])> {
        let Some(slot) = self.counts.get(index) else {
            return Vec::new();
        };
        let mut sorted: Vec<_> = slot.values.lock().clone().into_iter().collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        sorted
    }

    /// Appends [`DECISIONS`], [`CHECKS`], [`DETAILED_DECISIONS`] and [`DEGRADED_DECISIONS`] in
    /// Prometheus text format: for each rule with a limit, the series it can produce (see the
    /// module's documentation), its failure posture its own or else `default_posture`.
    pub fn render(&self, policy: &Policy, default_posture: Posture, out: &mut String) {
        let mut text = Exposition::new(out);
        render_outcomes(
            &mut text,
            (DECISIONS, "Descriptors charged against a rule, by outcome."),
            policy.rules(),
            |index, outcome| self.get(index, outcome),
        );
        render_outcomes(
            &mut text,
            (
                CHECKS,
                "Descriptors checked against a rule with hits_addend 0 (nothing charged), by outcome.",
            ),
            policy.rules(),
            |index, outcome| self.checks(index, outcome),
        );
        self.render_values(policy, &mut text);
        let mut family = text.family(
            DEGRADED_DECISIONS,
            "Decisions made by a rule's failure posture because the store could not decide.",
            Kind::Counter,
        );
        for rule in policy.rules().iter().filter(|r| r.limit.is_some()) {
            let posture = posture_of(Some(rule), default_posture);
            let labels = [
                ("domain", rule.domain.as_str()),
                ("rule", rule.name.as_str()),
                ("posture", posture.name()),
            ];
            family.sample(&labels, self.degraded(rule.index, posture));
        }
    }

    /// Appends [`DETAILED_DECISIONS`]: the outcomes counted per descriptor value of every
    /// `detailed_metric` rule, in the order of the values' texts.
    fn render_values(&self, policy: &Policy, text: &mut Exposition<'_>) {
        let help = format!(
            "Descriptors checked against a rule with detailed_metric, by descriptor and outcome (at most {MAX_DETAILED_VALUES} descriptors a rule; later ones as descriptor=\"{OTHER_VALUES}\")."
        );
        let mut family = text.family(DETAILED_DECISIONS, &help, Kind::Counter);
        for rule in policy.rules().iter().filter(|r| r.detailed_metric) {
            for (value, counts) in self.values(rule.index) {
                for outcome in Outcome::ALL.into_iter().filter(|o| counts[*o as usize] > 0) {
                    let labels = [
                        ("domain", rule.domain.as_str()),
                        ("rule", rule.name.as_str()),
                        ("descriptor", &value),
                        ("outcome", outcome.label()),
                    ];
                    family.sample(&labels, counts[outcome as usize]);
                }
            }
        }
    }
}

/// Appends the counter `name` (described by `help`): for each rule of `rules` with a limit, a
/// series per outcome its mode can produce ([`Outcome::of_mode`]), counting
/// `count(rule index, outcome)`.
pub(crate) fn render_outcomes<'a>(
    text: &mut Exposition<'_>,
    (name, help): (&str, &str),
    rules: impl IntoIterator<Item = &'a Arc<Rule>>,
    count: impl Fn(usize, Outcome) -> u64,
) {
    let mut family = text.family(name, help, Kind::Counter);
    for rule in rules.into_iter().filter(|r| r.limit.is_some()) {
        for outcome in Outcome::of_mode(rule.mode) {
            let labels = [
                ("domain", rule.domain.as_str()),
                ("rule", rule.name.as_str()),
                ("outcome", outcome.label()),
            ];
            family.sample(&labels, count(rule.index, outcome));
        }
    }
}
