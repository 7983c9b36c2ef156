//! The checks of a rule's own settings, each on its own: the limit of its `rate_limit` block
//! (`unit` or `period`, `requests_per_unit`, `algorithm`, `burst`), `mode`, `charge`,
//! `on_store_error` and `local_share`, `local_budget`, and the descriptor's `quota_mode` and
//! `metadata`. Each reports its problems with their locations and returns what it could read.

use std::time::Duration;

use tollgate_core::{Algorithm, MAX_LIMIT, MAX_LOG_LIMIT, Params};

use super::SourceCompiler;
use crate::policy::document::{Count, DescriptorDoc, RateLimitDoc};
use crate::policy::posture::Posture;
use crate::policy::rule::{ChargeMode, LocalBudget, RuleMode};
use crate::policy::{Location, Unit, parse_period};

/// ` 123` for a number read exactly, nothing for one the parser only approximated.
fn shown(count: Count) -> String {
    if count.exact {
        format!(" {}", count.number)
    } else {
        String::new()
    }
}

impl SourceCompiler<'_> {
    /// `mode`, reconciled with the descriptor's envoy-style `shadow_mode`.
    pub(super) fn mode(&mut self, doc: &RateLimitDoc, shadow_mode: bool) -> RuleMode {
        let Some(mode) = &doc.mode else {
            return if shadow_mode {
                RuleMode::Shadow
            } else {
                RuleMode::Enforce
            };
        };
        let at = self.location(&mode.referenced);
        let parsed = match mode.value.as_str() {
            "enforce" => RuleMode::Enforce,
            "shadow" => RuleMode::Shadow,
            "soft" => RuleMode::Soft,
            other => {
                self.error(
                    at,
                    format!("unknown mode `{other}`, expected enforce, shadow or soft"),
                );
                return RuleMode::Enforce;
            }
        };
        if parsed != RuleMode::Enforce && doc.unlimited.as_ref().is_some_and(|u| u.value) {
            self.error(
                at.clone(),
                format!(
                    "`mode: {}` has no meaning with `unlimited: true`: the rule never denies",
                    mode.value
                ),
            );
        }
        if shadow_mode && parsed != RuleMode::Shadow {
            self.error(
                at,
                format!(
                    "`mode: {}` contradicts the descriptor's `shadow_mode: true`",
                    mode.value
                ),
            );
        }
        parsed
    }

    /// The descriptor's `quota_mode` (validated against its `rate_limit`).
    pub(super) fn quota_mode(&mut self, descriptor: &DescriptorDoc, doc: &RateLimitDoc) -> bool {
        let Some(quota) = descriptor.quota_mode.as_ref().filter(|q| q.value) else {
            return false;
        };
        if doc.local_budget.is_some() {
            self.error(
                self.location(&quota.referenced),
                "`quota_mode: true` cannot be used with `local_budget`: whether an over quota \
                 denies depends on the request's other quota limits, which a replica's \
                 reservation does not see",
            );
            return false;
        }
        true
    }

    /// Whether `charge: up_to_limit` is set (validated against the other fields); without
    /// `charge`, the policy's default, on a limit it can apply to (not `unlimited`, nor with a
    /// `local_budget`).
    pub(super) fn charges_up_to_limit(&mut self, doc: &RateLimitDoc) -> bool {
        let Some(charge) = &doc.charge else {
            let unlimited = doc.unlimited.as_ref().is_some_and(|u| u.value);
            return self.defaults.charge == ChargeMode::UpToLimit
                && !unlimited
                && doc.local_budget.is_none();
        };
        let at = self.location(&charge.referenced);
        let up_to_limit = match charge.value.as_str() {
            "whole" => false,
            "up_to_limit" => true,
            other => {
                self.error(
                    at,
                    format!("unknown charge `{other}`, expected whole or up_to_limit"),
                );
                return false;
            }
        };
        if doc.unlimited.as_ref().is_some_and(|u| u.value) {
            self.error(at, "`charge` has no meaning with `unlimited: true`");
            return false;
        }
        if up_to_limit && doc.local_budget.is_some() {
            self.error(
                at,
                "`charge: up_to_limit` cannot be used with `local_budget`: a replica serves \
                 from its reservation only what fits whole",
            );
            return false;
        }
        up_to_limit
    }

    /// The descriptor's `metadata`: a mapping (any keys and values, as in envoyproxy/ratelimit),
    /// `None` when absent or empty.
    pub(super) fn metadata(
        &mut self,
        descriptor: &DescriptorDoc,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        let metadata = descriptor.metadata.as_ref()?;
        match &metadata.value {
            serde_json::Value::Object(map) if map.is_empty() => None,
            serde_json::Value::Object(map) => Some(map.clone()),
            serde_json::Value::Null => None,
            _ => {
                self.error(
                    self.location(&metadata.referenced),
                    "`metadata` must be a mapping, such as `{name: service_1}`",
                );
                None
            }
        }
    }

    /// Whether the limit is `requests_per_unit: 0`, envoyproxy/ratelimit's way to block a value
    /// outright; reports the fields that mean nothing beside a block.
    pub(super) fn blocks(&mut self, doc: &RateLimitDoc, mode: RuleMode) -> bool {
        let Some(count) = doc
            .requests_per_unit
            .as_ref()
            .filter(|c| c.value.number == 0)
        else {
            return false;
        };
        let conflicts: Vec<&str> = [
            ("burst", doc.burst.is_some()),
            ("local_budget", doc.local_budget.is_some()),
            ("mode: soft", mode == RuleMode::Soft),
        ]
        .into_iter()
        .filter_map(|(field, present)| present.then_some(field))
        .collect();
        if !conflicts.is_empty() {
            self.error(
                self.location(&count.referenced),
                format!(
                    "`requests_per_unit: 0` blocks every request; `{}` has no meaning beside it",
                    conflicts.join("`, `")
                ),
            );
        }
        true
    }

    /// Validates `local_budget` and `local_budget_ttl` against the rule's limit and mode.
    pub(super) fn local_budget(
        &mut self,
        doc: &RateLimitDoc,
        limit: Option<&Params>,
        mode: RuleMode,
    ) -> Option<LocalBudget> {
        let ttl = doc.local_budget_ttl.as_ref().and_then(|text| {
            let at = self.location(&text.referenced);
            let (min, max) = LocalBudget::TTL_RANGE;
            match humantime::parse_duration(text.value.trim()) {
                Ok(ttl) if (min..=max).contains(&ttl) => Some(ttl),
                Ok(_) => {
                    self.error(
                        at,
                        format!("`local_budget_ttl` must be between {min:?} and {max:?}"),
                    );
                    None
                }
                Err(e) => {
                    self.error(
                        at,
                        format!("invalid `local_budget_ttl` `{}`: {e}", text.value),
                    );
                    None
                }
            }
        });
        let Some(size) = &doc.local_budget else {
            if let Some(text) = &doc.local_budget_ttl {
                self.error(
                    self.location(&text.referenced),
                    "`local_budget_ttl` needs `local_budget`",
                );
            }
            return None;
        };
        let at = self.location(&size.referenced);
        if mode != RuleMode::Enforce {
            self.error(
                at,
                format!(
                    "`local_budget` applies to enforced limits only, not `mode: {}`",
                    mode.name()
                ),
            );
            return None;
        }
        if doc.unlimited.as_ref().is_some_and(|u| u.value) {
            self.error(at, "`local_budget` has no meaning with `unlimited: true`");
            return None;
        }
        // A bad limit is reported on its own field.
        let limit = limit?;
        if limit.algorithm() == Algorithm::LeakyBucket {
            self.error(
                at,
                "`local_budget` cannot be used with leaky_bucket: each request must get its own \
                 delay from the store",
            );
            return None;
        }
        let capacity = limit.capacity();
        match u64::try_from(size.value.number) {
            Ok(n) if (1..=capacity).contains(&n) => Some(LocalBudget {
                size: n,
                ttl: ttl.unwrap_or(LocalBudget::DEFAULT_TTL),
            }),
            _ => {
                let n = shown(size.value);
                self.error(
                    at,
                    format!(
                        "`local_budget`{n} must be between 1 and the limit's capacity, {capacity}"
                    ),
                );
                None
            }
        }
    }

    /// Validates `on_store_error` and `local_share`.
    pub(super) fn failure_posture(&mut self, doc: &RateLimitDoc) -> (Option<Posture>, Option<f64>) {
        let unlimited = doc.unlimited.as_ref().is_some_and(|u| u.value);
        let posture = doc.on_store_error.as_ref().and_then(|p| {
            if unlimited {
                self.error(
                    self.location(&p.referenced),
                    "`on_store_error` has no meaning with `unlimited: true`",
                );
                return None;
            }
            p.value
                .parse::<Posture>()
                .map_err(|e| self.error(self.location(&p.referenced), e.to_string()))
                .ok()
        });
        let share = doc.local_share.as_ref().and_then(|s| {
            if s.value > 0.0 && s.value <= 1.0 {
                Some(s.value)
            } else {
                self.error(
                    self.location(&s.referenced),
                    format!("`local_share` {} must be above 0 and at most 1", s.value),
                );
                None
            }
        });
        (posture, share)
    }

    /// Validates the limit fields, reporting every bad field. Each field is checked on its own
    /// through `Params::new` (with harmless values for the others), so its message is the core's.
    pub(super) fn limit(
        &mut self,
        doc: &RateLimitDoc,
        block: &Option<Location>,
    ) -> (Option<Params>, Option<Unit>) {
        if let Some(unlimited) = doc.unlimited.as_ref().filter(|u| u.value) {
            // envoyproxy/ratelimit refuses a unit beside `unlimited: true` but accepts and
            // ignores `requests_per_unit`; files written for it load here unchanged.
            let conflicts: Vec<&str> = [
                ("unit", doc.unit.is_some()),
                ("period", doc.period.is_some()),
                ("algorithm", doc.algorithm.is_some()),
                ("burst", doc.burst.is_some()),
            ]
            .into_iter()
            .filter_map(|(field, present)| present.then_some(field))
            .collect();
            if !conflicts.is_empty() {
                self.error(
                    self.location(&unlimited.referenced),
                    format!(
                        "`unlimited: true` cannot be combined with `{}`",
                        conflicts.join("`, `")
                    ),
                );
            }
            return (None, None);
        }

        let algorithm = match &doc.algorithm {
            None => Some(Algorithm::FixedWindow),
            Some(name) => match name.value.parse::<Algorithm>() {
                Ok(algorithm) => Some(algorithm),
                Err(e) => {
                    self.error(self.location(&name.referenced), e.to_string());
                    None
                }
            },
        };
        let probe = algorithm.unwrap_or(Algorithm::FixedWindow);
        const PROBE_PERIOD: Duration = Duration::from_secs(1);

        let mut unit = None;
        let period = match (&doc.unit, &doc.period) {
            (Some(_), Some(period)) => {
                self.error(
                    self.location(&period.referenced),
                    "give either `unit` or `period`, not both",
                );
                None
            }
            (None, None) => {
                self.error(
                    block.clone(),
                    "`rate_limit` needs `unit` or `period` (or `unlimited: true`)",
                );
                None
            }
            (Some(name), None) => match Unit::from_name(&name.value) {
                Some(found) => {
                    unit = Some(found);
                    Some(found.period())
                }
                None => {
                    let expected: Vec<&str> = Unit::ALL.iter().map(|u| u.name()).collect();
                    self.error(
                        self.location(&name.referenced),
                        format!(
                            "unknown unit `{}`, expected one of: {}",
                            name.value,
                            expected.join(", ")
                        ),
                    );
                    None
                }
            },
            (None, Some(text)) => match parse_period(&text.value) {
                Ok(period) => match Params::new(probe, 1, period, None) {
                    Ok(_) => Some(period),
                    Err(e) => {
                        self.error(self.location(&text.referenced), e.to_string());
                        None
                    }
                },
                Err(e) => {
                    self.error(self.location(&text.referenced), e.to_string());
                    None
                }
            },
        };

        let limit = match &doc.requests_per_unit {
            None => {
                self.error(block.clone(), "missing `requests_per_unit`");
                None
            }
            Some(count) if count.value.number < 0 => {
                self.error(
                    self.location(&count.referenced),
                    "invalid `requests_per_unit`: limit must be at least 1, or 0 to block every \
                     request",
                );
                None
            }
            Some(count) => {
                let at = self.location(&count.referenced);
                // 0 blocks: the rule is checked, and kept, with a stand-in limit of 1 (see
                // `Rule::blocked`).
                match u64::try_from(count.value.number.max(1)) {
                    Ok(n) => match Params::new(probe, n, PROBE_PERIOD, None) {
                        Ok(_) => Some(n),
                        Err(e) => {
                            self.error(at, format!("invalid `requests_per_unit`: {e}"));
                            None
                        }
                    },
                    Err(_) => {
                        let max = if probe == Algorithm::SlidingWindowLog {
                            MAX_LOG_LIMIT
                        } else {
                            MAX_LIMIT
                        };
                        let n = shown(count.value);
                        self.error(at, format!("invalid `requests_per_unit`: limit{n} is above the maximum of {max}"));
                        None
                    }
                }
            }
        };

        let burst = match (&doc.burst, algorithm) {
            (None, _) => Some(None),
            // Whether a burst is allowed depends on the algorithm, which is already reported.
            (Some(_), None) => None,
            (Some(count), Some(algorithm)) => {
                let at = self.location(&count.referenced);
                match u64::try_from(count.value.number) {
                    Ok(n) => match Params::new(algorithm, 1, PROBE_PERIOD, Some(n)) {
                        Ok(_) => Some(Some(n)),
                        Err(e) => {
                            self.error(at, e.to_string());
                            None
                        }
                    },
                    Err(_) => {
                        let n = shown(count.value);
                        self.error(at, format!("burst{n} must be between 1 and {MAX_LIMIT}"));
                        None
                    }
                }
            }
        };

        let (Some(algorithm), Some(period), Some(limit), Some(burst)) =
            (algorithm, period, limit, burst)
        else {
            return (None, unit);
        };
        match Params::new(algorithm, limit, period, burst) {
            Ok(params) => (Some(params), unit),
            Err(e) => {
                self.error(block.clone(), e.to_string());
                (None, unit)
            }
        }
    }
}
