//! Runtime overrides over the admin API.
//!
//! `PUT /v1/admin/overrides` with
//! `{"domain": "api", "rule": "per_tenant", "entries": [{"key": "tenant", "value": "acme"}],
//!   "requests_per_unit": 1000, "period": "1m", "expires_in": "2h", "reason": "launch day"}`
//! (`period`, `expires_in` and `reason` optional) gives that descriptor a different limit on the
//! same counter. Every change is logged for audit.
//!
//! The bodies' fields are declared in alphabetical order, the order in which they have always
//! been written.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tollgate::limiter::{Limiter, Override, OverrideError};
use tollgate::policy::Policy;
use tollgate::store::Store;
use tollgate_core::Timestamp;
use tracing::info;

use super::extract::AdminPath;
use super::invalid::InvalidOverride;
use super::state::AdminState;
use crate::ApiError;
use crate::http::Body;
use crate::json_object::{Object, from_body};

/// Longest `expires_in` taken.
const MAX_EXPIRES_IN: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetBody {
    domain: String,
    rule: String,
    entries: Vec<Object<Entry>>,
    requests_per_unit: u64,
    #[serde(default)]
    period: Option<String>,
    #[serde(default)]
    expires_in: Option<String>,
    #[serde(default)]
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    key: String,
    value: String,
}

fn duration(field: &'static str, text: &str) -> Result<Duration, InvalidOverride> {
    humantime::parse_duration(text).map_err(|why| InvalidOverride::Duration {
        field,
        text: text.to_owned(),
        why,
    })
}

/// An override, as listed.
#[derive(Debug, Serialize)]
pub struct Described {
    applies: bool,
    domain: String,
    entries: Vec<DescribedEntry>,
    expires_in_ms: Option<u64>,
    id: u64,
    period_ms: Option<u64>,
    reason: String,
    requests_per_unit: u64,
    rule: String,
}

/// One descriptor entry of an override.
#[derive(Debug, Serialize)]
pub struct DescribedEntry {
    key: String,
    value: String,
}

fn describe(o: &Override, now_us: u64, policy: &Policy) -> Described {
    Described {
        applies: o.applies_under(policy),
        domain: o.domain.clone(),
        entries: o
            .entries
            .iter()
            .map(|(key, value)| DescribedEntry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        expires_in_ms: o
            .expires_at
            .map(|at| at.as_micros().saturating_sub(now_us) / 1000),
        id: o.id,
        period_ms: o.period.map(|p| p.as_millis() as u64),
        reason: o.reason.clone(),
        requests_per_unit: o.requests_per_unit,
        rule: o.rule.clone(),
    }
}

/// An override's expiry for its audit line, as `(expires_in, expires_at)` set at `now`:
/// `("2h", "2026-03-01T14:00:00Z")`, or `"never"` twice.
fn expiry(o: &Override, now: Timestamp) -> (String, String) {
    match o.expires_at {
        Some(at) => {
            let expires_in = humantime::format_duration(at.saturating_since(now)).to_string();
            let wall = std::time::UNIX_EPOCH + std::time::Duration::from_micros(at.as_micros());
            (
                expires_in,
                humantime::format_rfc3339_seconds(wall).to_string(),
            )
        }
        None => ("never".into(), "never".into()),
    }
}

/// The overrides in force.
#[derive(Debug, Serialize)]
pub struct Overrides {
    pub(super) overrides: Vec<Described>,
}

pub async fn list(State(state): State<AdminState>) -> Json<Overrides> {
    let limiter = state.lifecycle.limiter();
    let now = limiter.clock().now();
    let policy = limiter.policy();
    let overrides = limiter
        .overrides()
        .list(now)
        .iter()
        .map(|o| describe(o, now.as_micros(), &policy))
        .collect();
    Json(Overrides { overrides })
}

/// Reads one override of a set body at `now`, or says why it is refused.
fn parse(
    body: &SetBody,
    limiter: &Limiter,
    policy: &Policy,
    now: Timestamp,
) -> Result<Override, InvalidOverride> {
    let period = body
        .period
        .as_deref()
        .map(tollgate::policy::parse_period)
        .transpose()?;
    let expires_at = body
        .expires_in
        .as_deref()
        .map(|e| match duration("expires_in", e)? {
            // Already over when set: an operator's typo, not an intent.
            d if d.is_zero() => Err(InvalidOverride::ExpiresAtOnce),
            // Without `expires_in` an override lasts until deleted; a longer one is a typo.
            d if d > MAX_EXPIRES_IN => Err(InvalidOverride::ExpiresTooLate {
                max_days: MAX_EXPIRES_IN.as_secs() / 86_400,
            }),
            d => Ok(now.saturating_add(d)),
        })
        .transpose()?;
    let entries: Vec<(String, String)> = body
        .entries
        .iter()
        .map(|Object(e)| (e.key.clone(), e.value.clone()))
        .collect();
    // The reason goes into the audit log's lines as it is: a line break there would forge
    // the next one.
    if body.reason.chars().any(char::is_control) {
        return Err(InvalidOverride::ControlInReason(body.reason.clone()));
    }
    let rule = policy
        .rules()
        .iter()
        .find(|r| r.domain == body.domain && r.name == body.rule)
        .ok_or_else(|| InvalidOverride::NoRule {
            domain: body.domain.clone(),
            rule: body.rule.clone(),
        })?;
    if policy.find(&body.domain, &entries).map(|r| r.index) != Some(rule.index) {
        return Err(InvalidOverride::OtherRule(body.rule.clone()));
    }
    let o = Override {
        id: 0,
        domain: body.domain.clone(),
        rule: body.rule.clone(),
        entries,
        requests_per_unit: body.requests_per_unit,
        period,
        expires_at,
        set_at: now,
        reason: body.reason.clone(),
    };
    let params = o.params_for(rule)?;
    limiter.store().supports(&params)?;
    Ok(o)
}

/// The answer to a set that passed the cap: `409`, naming it.
fn too_many(e: &OverrideError) -> ApiError {
    let OverrideError::TooMany { max, .. } = e;
    ApiError::conflict(e.to_string()).with_detail("max_overrides", max)
}

/// Logs the audit line of an override set.
fn log_set(o: &Override, now: Timestamp) {
    let (expires_in, expires_at) = expiry(o, now);
    info!(id = o.id, domain = %o.domain, rule = %o.rule, entries = ?o.entries, requests_per_unit = o.requests_per_unit, period = ?o.period, expires_in = %expires_in, expires_at = %expires_at, reason = %o.reason, "Override set");
}

pub async fn set(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Result<Json<Described>, ApiError> {
    let body: SetBody = from_body(&body)?;
    let limiter = state.lifecycle.limiter();
    let now = limiter.clock().now();
    let policy = limiter.policy();
    let mut o = parse(&body, limiter, &policy, now)
        .map_err(|why| ApiError::of_kind(&why, format!("invalid override: {why}")))?;
    o.id = limiter
        .overrides()
        .set(o.clone())
        .map_err(|e| too_many(&e))?;
    log_set(&o, now);
    Ok(Json(describe(&o, now.as_micros(), &policy)))
}

/// `PUT /v1/admin/overrides/bulk`: `{"overrides": [...]}`, each element a body of
/// `PUT /v1/admin/overrides`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkBody {
    overrides: Elements,
}

/// The elements of a bulk set, each read as an object; an element that does not read is
/// named by its index.
#[derive(Debug)]
struct Elements(Vec<SetBody>);

impl<'de> Deserialize<'de> for Elements {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ElementsVisitor;

        impl<'de> serde::de::Visitor<'de> for ElementsVisitor {
            type Value = Elements;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of overrides")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Elements, A::Error> {
                let mut all = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                loop {
                    match seq.next_element::<Object<SetBody>>() {
                        Ok(Some(Object(one))) => all.push(one),
                        Ok(None) => return Ok(Elements(all)),
                        Err(e) => {
                            return Err(serde::de::Error::custom(format!(
                                "override {}: {e}",
                                all.len()
                            )));
                        }
                    }
                }
            }
        }

        deserializer.deserialize_seq(ElementsVisitor)
    }
}

/// Sets every override of a bulk body, or none: the first that is refused is named by its
/// index (from 0) and nothing is set; a set that would pass the cap sets nothing either.
pub async fn set_bulk(
    State(state): State<AdminState>,
    Body(body): Body<{ super::MAX_BODY }>,
) -> Result<Json<Overrides>, ApiError> {
    let body: BulkBody = from_body(&body)?;
    let limiter = state.lifecycle.limiter();
    let now = limiter.clock().now();
    let policy = limiter.policy();
    let list = body
        .overrides
        .0
        .iter()
        .enumerate()
        .map(|(i, one)| {
            parse(one, limiter, &policy, now).map_err(|why| {
                ApiError::of_kind(&why, format!("invalid override {i}: {why}"))
                    .with_detail("index", i)
            })
        })
        .collect::<Result<Vec<Override>, ApiError>>()?;
    let ids = limiter
        .overrides()
        .set_all(list.clone())
        .map_err(|e| too_many(&e))?;
    let overrides = list
        .into_iter()
        .zip(ids)
        .map(|(mut o, id)| {
            o.id = id;
            log_set(&o, now);
            describe(&o, now.as_micros(), &policy)
        })
        .collect();
    Ok(Json(Overrides { overrides }))
}

pub async fn delete(
    State(state): State<AdminState>,
    AdminPath(id): AdminPath<u64>,
) -> Result<StatusCode, ApiError> {
    let limiter = state.lifecycle.limiter();
    match limiter.overrides().delete(id, limiter.clock().now()) {
        Some(o) => {
            info!(id, domain = %o.domain, rule = %o.rule, entries = ?o.entries, "Override deleted");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::not_found(format!("no override {id}"))),
    }
}
