//! Costs a counter can never hold: a request whose charges on one counter add up past its
//! capacity is never admitted, and is answered as such (`cost_exceeds_capacity`), not as a
//! denial a retry would clear.

use std::time::Duration;

use tollgate_core::{Decision, Verdict};

use super::charge::Charge;

/// Whether `charges[i]` takes its counter past what it can ever hold, with the charges before
/// it in the request on the same counter. A check counts as the one unit it is decided as; a
/// limit that charges up to itself, or that does not enforce, denies nothing for it; nor does
/// a quota limit on its own (the store answers it over, and the other quota limits decide).
pub fn exceeds_with_earlier(charges: &[Charge<'_>], i: usize) -> bool {
    let charge = &charges[i];
    if !charge.enforce || charge.quota || charge.params.charges_up_to_limit() {
        return false;
    }
    let earlier = charges[..i]
        .iter()
        .filter(|c| c.key == charge.key)
        .fold(0u64, |sum, c| sum.saturating_add(c.cost));
    // A check answered as the counter stands takes no unit.
    let cost = charge.cost.max(u64::from(!charge.checks_as_is));
    earlier > 0 && earlier.saturating_add(cost) > charge.params.capacity()
}

/// Whether `charges[i]` can never be admitted: its cost alone, or with the charges before it
/// on the same counter, is more than the counter can ever hold.
pub fn never_admitted(charges: &[Charge<'_>], i: usize) -> bool {
    let charge = &charges[i];
    exceeds_with_earlier(charges, i)
        || (charge.enforce
            && !charge.quota
            && !charge.params.charges_up_to_limit()
            && charge.cost > charge.params.capacity())
}

/// `decision` rewritten as a cost its counter can never hold: no retry-after (a retry never
/// fits), no delay, its figures kept.
pub fn cost_exceeds_capacity(decision: Decision) -> Decision {
    Decision {
        verdict: Verdict::CostExceedsCapacity,
        retry_after: None,
        delay: Duration::ZERO,
        ..decision
    }
}

/// Rewrites the decisions of the charges among the first `live` that take their counter past
/// what it can ever hold with the charges before them (the request was looked at, charging
/// nothing): each answers with the figures as they stand, those of the counter's first charge
/// (allowed, as nothing was charged, or denied by the counter as it is).
pub fn answer_never_fits(charges: &[Charge<'_>], live: usize, decisions: &mut [Decision]) {
    for i in 0..live.min(decisions.len()) {
        if exceeds_with_earlier(charges, i) {
            let first = charges[..i]
                .iter()
                .position(|c| c.key == charges[i].key)
                .unwrap_or(i);
            decisions[i] = cost_exceeds_capacity(decisions[first]);
        }
    }
}
