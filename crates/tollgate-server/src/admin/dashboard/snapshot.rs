//! `GET /v1/admin/dashboard/snapshot`: everything the page shows, in one JSON document built
//! when asked (nothing is rendered while no one looks).

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use tollgate::observe::history::{COLUMNS, Metrics, Quantiles, RuleSeries, ValueCounts};
use tollgate::observe::shares::ValueShares;
use tollgate::policy::Rule;
use tollgate::resilience::BreakerState;
use tollgate::store::Store;

use super::access::Role;
use super::state::DashboardState;

/// Top denied keys listed per rule.
const TOP_KEYS: usize = 5;

/// Descriptor values (and first-entry roll-ups) listed per rule.
const TOP_VALUES: usize = 10;

/// The window of the latency quantiles.
const LATENCY_WINDOW_MS: u64 = 60_000;

/// The window of the "now" rates and of store reachability.
const NOW_WINDOW: usize = 5;

fn quantiles(q: Quantiles) -> Value {
    // An infinite bound (above the histogram's last) is `null`.
    let ms = |s: f64| s.is_finite().then_some(s * 1e3);
    json!({"count": q.count, "p50_ms": ms(q.p50), "p99_ms": ms(q.p99)})
}

/// The mean of the last `n` entries of `rates`.
fn recent(rates: &[f64], n: usize) -> f64 {
    let tail = &rates[rates.len().saturating_sub(n)..];
    if tail.is_empty() {
        0.0
    } else {
        tail.iter().sum::<f64>() / tail.len() as f64
    }
}

/// Decisions by a value, and the ones its rule did not simply allow.
#[derive(Debug, Default, Clone, Copy)]
struct Share {
    total: u64,
    hits: u64,
}

impl Share {
    fn add(&mut self, counts: &[u64; 4]) {
        self.total += counts.iter().sum::<u64>();
        self.hits += counts[1..].iter().sum::<u64>();
    }

    fn json(self, name: &str) -> Value {
        let fraction = if self.total == 0 {
            0.0
        } else {
            self.hits as f64 / self.total as f64
        };
        json!({"value": name, "total": self.total, "hits": self.hits, "share": fraction})
    }
}

/// The first `key=value` of a descriptor text (escaped commas are not separators).
fn first_entry(descriptor: &str) -> &str {
    let mut escaped = false;
    for (i, c) in descriptor.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            ',' if !escaped => return &descriptor[..i],
            _ => escaped = false,
        }
    }
    descriptor
}

/// The values of a `detailed_metric` rule with the most hits, and the same rolled up by the
/// descriptor's first entry.
fn shares(values: &[&ValueCounts]) -> (Vec<Value>, Vec<Value>, HashMap<String, Share>) {
    let mut per_value: HashMap<String, Share> = HashMap::new();
    let mut rolled: HashMap<String, Share> = HashMap::new();
    for v in values {
        per_value
            .entry(v.descriptor.clone())
            .or_default()
            .add(&v.counts);
        rolled
            .entry(first_entry(&v.descriptor).to_owned())
            .or_default()
            .add(&v.counts);
    }
    let top = |map: &HashMap<String, Share>| {
        let mut list: Vec<(&String, &Share)> = map.iter().collect();
        list.sort_by(|a, b| {
            b.1.hits
                .cmp(&a.1.hits)
                .then(b.1.total.cmp(&a.1.total))
                .then(a.0.cmp(b.0))
        });
        list.into_iter()
            .take(TOP_VALUES)
            .map(|(name, share)| share.json(name))
            .collect::<Vec<_>>()
    };
    (top(&per_value), top(&rolled), per_value)
}

/// A rule's per-value sketch: the values with the most hits and their roll-up by first entry,
/// each counted since the sketch began tracking it.
fn sketch_json(table: &ValueShares) -> Value {
    let entries = table.top(table.capacity());
    let mut rolled: HashMap<&str, Share> = HashMap::new();
    for e in &entries {
        let share = rolled.entry(first_entry(&e.key)).or_default();
        share.total += e.tracked();
        share.hits += e.hits;
    }
    let mut rollup: Vec<(&str, Share)> = rolled.into_iter().collect();
    rollup.sort_by(|a, b| {
        b.1.hits
            .cmp(&a.1.hits)
            .then(b.1.total.cmp(&a.1.total))
            .then(a.0.cmp(b.0))
    });
    json!({
        "capacity": table.capacity(),
        "total": table.total(),
        "max_error": table.max_error(),
        "values": entries.iter().take(TOP_VALUES).map(|e| json!({
            "value": e.key, "total": e.tracked(), "error": e.error, "hits": e.hits,
            "share": e.share(),
        })).collect::<Vec<_>>(),
        "rollup": rollup.into_iter().take(TOP_VALUES)
            .map(|(name, share)| share.json(name)).collect::<Vec<_>>(),
    })
}

fn rule_json(
    state: &DashboardState,
    rule: &Rule,
    series: Option<&RuleSeries>,
    metrics: &Metrics,
) -> Value {
    let zeros = Vec::new();
    let rates: serde_json::Map<String, Value> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let rates = series.map_or(&zeros, |s| &s.rates[i]);
            (column.to_string(), json!(rates))
        })
        .collect();
    let now: serde_json::Map<String, Value> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let rates = series.map_or(&zeros[..], |s| &s.rates[i][..]);
            (column.to_string(), json!(recent(rates, NOW_WINDOW)))
        })
        .collect();
    let totals: serde_json::Map<String, Value> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, column)| (column.to_string(), json!(series.map_or(0, |s| s.totals[i]))))
        .collect();
    let values: Vec<&ValueCounts> = metrics
        .values
        .iter()
        .filter(|v| v.domain == rule.domain && v.rule == rule.name)
        .collect();
    let (top_values, rollup, per_value) = shares(&values);
    let top: Vec<Value> = state
        .admin
        .lifecycle
        .limiter()
        .top_keys(&rule.domain, &rule.name, TOP_KEYS)
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let own = per_value.get(&e.key).map(|s| s.json(&e.key));
            json!({"key": e.key, "count": e.count, "error": e.error, "own_traffic": own})
        })
        .collect();
    json!({
        "domain": rule.domain,
        "rule": rule.name,
        "mode": rule.mode.name(),
        "unlimited": rule.limit.is_none(),
        "detailed_metric": rule.detailed_metric,
        "rates": rates,
        "now": now,
        "totals": totals,
        "top_keys": top,
        "values": top_values,
        "rollup": rollup,
        "values_tracked": per_value.len(),
        "sketch": state.admin.lifecycle.limiter().value_shares(rule).map(|t| sketch_json(&t)),
    })
}

fn candidate_json(state: &DashboardState) -> Value {
    let limiter = state.admin.lifecycle.limiter();
    let Some(candidate) = limiter.candidate() else {
        return Value::Null;
    };
    let now = limiter.clock().now().as_micros();
    let rules: Vec<Value> = candidate
        .report(TOP_KEYS)
        .iter()
        .map(|r| {
            let total = r.allowed + r.would_deny;
            let sketch = candidate
                .policy()
                .rules()
                .iter()
                .find(|rule| rule.domain == r.domain && rule.name == r.name)
                .and_then(|rule| candidate.value_shares(rule))
                .map(|t| sketch_json(&t));
            json!({
                "domain": r.domain,
                "rule": r.name,
                "mode": r.mode.name(),
                "allowed": r.allowed,
                "would_deny": r.would_deny,
                "share": if total == 0 { 0.0 } else { r.would_deny as f64 / total as f64 },
                "sketch": sketch,
                "top_keys": r.top.iter()
                    .map(|e| json!({"key": e.key, "count": e.count, "error": e.error}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "hash": candidate.hash(),
        "shadowing_for_ms": now.saturating_sub(candidate.started_at().as_micros()) / 1000,
        "files": candidate.sources().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        "rules": rules,
    })
}

/// The snapshot.
pub(super) async fn snapshot(
    State(state): State<DashboardState>,
    Extension(role): Extension<Role>,
) -> Response {
    let limiter = state.admin.lifecycle.limiter().clone();
    let metrics = limiter.sample_metrics();
    let series = state.history.series();
    let policy = limiter.policy();
    let rules: Vec<Value> = policy
        .rules()
        .iter()
        .map(|rule| {
            let s = series
                .rules
                .iter()
                .find(|s| *s.domain == rule.domain && *s.rule == rule.name);
            rule_json(&state, rule, s, &metrics)
        })
        .collect();
    let (decision, store) = match state.history.latency(LATENCY_WINDOW_MS) {
        Some((d, s)) => (quantiles(d), quantiles(s)),
        None => (Value::Null, Value::Null),
    };
    let breakers = limiter.store().breakers();
    let mut postures: HashMap<&str, u64> = HashMap::new();
    for (_, _, posture, count) in &metrics.degraded {
        *postures.entry(posture.as_str()).or_default() += count;
    }
    let failing_now = recent(&series.store_errors, NOW_WINDOW) > 0.0;
    let reachable = !failing_now && breakers.iter().all(|(_, s)| *s != BreakerState::Open);
    let admin = state.admin.clone();
    let versions = super::super::policy::list(State(admin.clone())).await.0;
    let overrides = super::super::overrides::list(State(admin)).await.0;
    Json(json!({
        "can_write": role == Role::Write,
        "sample_every_ms": super::SAMPLE_EVERY.as_millis() as u64,
        "history_samples": state.history.capacity(),
        "at_ms": series.at_ms,
        "latency_window_ms": LATENCY_WINDOW_MS,
        "latency": {"decision": decision, "store": store},
        "requests_total": metrics.requests,
        "rules": rules,
        "candidate": candidate_json(&state),
        "health": {
            "store": limiter.store().kind(),
            "store_description": limiter.store().description(),
            "reachable": reachable,
            "breakers": breakers.iter()
                .map(|(node, s)| json!({"node": node, "state": s.name()}))
                .collect::<Vec<_>>(),
            "store_errors_total": metrics.store_errors,
            "store_errors": series.store_errors,
            "fail_open_total": metrics.fail_open,
            "fail_open": series.fail_open,
            "degraded_by_posture": postures,
        },
        "policy": versions,
        "overrides": overrides.overrides,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_entry_ends_at_an_unescaped_comma() {
        assert_eq!(first_entry("tenant=acme,user=bob"), "tenant=acme");
        assert_eq!(first_entry("tenant=a\\,b,user=bob"), "tenant=a\\,b");
        assert_eq!(first_entry("tenant=acme"), "tenant=acme");
    }

    #[test]
    fn shares_count_every_outcome_but_allowed_as_a_hit() {
        let v = |descriptor: &str, counts| ValueCounts {
            domain: "api".into(),
            rule: "r".into(),
            descriptor: descriptor.into(),
            counts,
        };
        let (a, b, c) = (
            v("tenant=a,user=1", [6, 0, 4, 0]),
            v("tenant=a,user=2", [10, 0, 0, 0]),
            v("tenant=b,user=3", [1, 0, 0, 0]),
        );
        let (top, rollup, _) = shares(&[&a, &b, &c]);
        assert_eq!(top[0]["value"], "tenant=a,user=1");
        assert_eq!(top[0]["share"], 0.4);
        assert_eq!(rollup[0]["value"], "tenant=a");
        assert_eq!(rollup[0]["total"], 20);
        assert_eq!(rollup[0]["share"], 0.2);
        assert_eq!(rollup[1]["share"], 0.0);
    }
}
