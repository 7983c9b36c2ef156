//! The policy file as written: envoyproxy/ratelimit's YAML format plus tollgate's extensions.
//! Doc comments here are the user documentation of each field. Unknown fields are errors.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde_saphyr::Spanned;

/// One policy file: one domain and its descriptor tree.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DomainDoc {
    /// The domain requests name. Required, non-empty, defined by one file only.
    pub domain: Option<Spanned<String>>,
    /// The top-level descriptors.
    pub descriptors: Option<Vec<Spanned<DescriptorDoc>>>,
}

/// One node of the descriptor tree; matches one `(key, value)` entry of a request descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DescriptorDoc {
    /// The entry key to match. Required, non-empty.
    pub key: Option<Spanned<String>>,
    /// The entry value to match exactly; a value with `*` in it is a wildcard, each `*` matching
    /// zero or more characters (`foo*`, `bar*b`, `foo*bar*baz`; a bare `*` matches any value).
    /// Without a value (or with an empty one) the descriptor matches any value and each
    /// distinct value gets its own counter.
    pub value: Option<Spanned<String>>,
    /// The limit applied when a request descriptor ends at this node.
    pub rate_limit: Option<Spanned<RateLimitDoc>>,
    /// Nested descriptors matching the next entry of a request descriptor.
    pub descriptors: Option<Vec<Spanned<DescriptorDoc>>>,
    /// Count and report, but never deny.
    pub shadow_mode: Option<bool>,
    /// envoyproxy/ratelimit's quota mode: a request over this descriptor's limit is denied
    /// only when every quota-mode descriptor of the request is over its limit (and, as always,
    /// when a descriptor without quota mode is). Only read on a descriptor with a `rate_limit`.
    pub quota_mode: Option<Spanned<bool>>,
    /// Let metrics carry the matched value of a key-only descriptor.
    pub detailed_metric: Option<bool>,
    /// envoyproxy/ratelimit's metrics option; accepted, with no effect here.
    #[allow(dead_code)] // read by serde only: a file written for envoyproxy/ratelimit loads
    pub value_to_metric: Option<bool>,
    /// With a wildcard `value` (one with a `*`): every value it matches shares one counter, instead of one
    /// counter per value.
    pub share_threshold: Option<Spanned<bool>>,
    /// envoyproxy/ratelimit's `metadata`: any mapping, sent back in the RLS response's
    /// `dynamic_metadata` when this descriptor's limit admits a request (with the server's
    /// `--rls-dynamic-metadata`). Only read on a descriptor with a `rate_limit`.
    pub metadata: Option<Spanned<serde_json::Value>>,
    /// Names of limits this descriptor's limit replaces (also accepted inside `rate_limit`,
    /// where envoyproxy/ratelimit reads it; give it in one place only).
    pub replaces: Option<Spanned<Vec<Spanned<ReplacesDoc>>>>,
}

/// A limit: envoy's `unit` + `requests_per_unit`, or `unlimited: true`, plus extensions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RateLimitDoc {
    /// `second`, `minute`, `hour`, `day`, `week` (7 days), `month` (30 days) or `year`
    /// (365 days), in any case. Exclusive with `period`.
    pub unit: Option<Spanned<String>>,
    /// Requests (cost units) allowed per unit or period.
    pub requests_per_unit: Option<Spanned<Count>>,
    /// No limit: the request is allowed without touching the store. Takes no other limit field.
    pub unlimited: Option<Spanned<bool>>,
    /// The limit's name, reported to clients and used by `replaces`. Defaults to the descriptor
    /// path (`key_value.key`, with `#2`, `#3`... when two paths read alike). Unique in a domain.
    pub name: Option<Spanned<String>>,
    /// Names of limits this one replaces when both match a request.
    pub replaces: Option<Spanned<Vec<Spanned<ReplacesDoc>>>>,
    /// Extension: any period instead of `unit`, such as `30s`, `5m`, `1h30m`, `500ms`.
    pub period: Option<Spanned<String>>,
    /// Extension: `fixed_window` (default), `sliding_window_log`, `sliding_window_counter`,
    /// `token_bucket`, `leaky_bucket` or `gcra`.
    pub algorithm: Option<Spanned<String>>,
    /// Extension: bucket size for `token_bucket`, `leaky_bucket` and `gcra`; defaults to the
    /// limit.
    pub burst: Option<Spanned<Count>>,
    /// Extension: how a request whose cost does not fit is charged. `whole` (default): it is
    /// denied and charges nothing. `up_to_limit`: it is admitted while any unit is left and
    /// charged what is left, for costs counted once the work is done (the tokens a response
    /// used, sent by Envoy's `apply_on_stream_done`), which must count as far as they can.
    pub charge: Option<Spanned<String>>,
    /// Extension: `enforce` (default), `shadow` (the same as the descriptor's
    /// `shadow_mode: true`) or `soft` (allow, but mark the request as over its limit).
    pub mode: Option<Spanned<String>>,
    /// Extension: what happens when the store cannot decide: `open` (allow, marked degraded),
    /// `closed` (deny as unavailable) or `local` (decide in-process with `local_share` of the
    /// limit). Defaults to the server's `--on-store-error` (itself `open` by default).
    pub on_store_error: Option<Spanned<String>>,
    /// Extension: the share of the limit (and burst) one replica enforces on its own while the
    /// store is unavailable and the posture is `local`; for example `0.25` with four replicas.
    /// Between 0 (exclusive) and 1; defaults to the server's `--local-share`.
    pub local_share: Option<Spanned<f64>>,
    /// Extension, for hot keys on a shared store: each replica reserves this many units of a
    /// key's quota from the store at a time and admits from its reservation without calling the
    /// store; what it did not use goes back when the reservation expires. Enforced limits only.
    pub local_budget: Option<Spanned<Count>>,
    /// Extension: how long a `local_budget` reservation lives, such as `100ms` (the default);
    /// between 1ms and 60s. It bounds how far admissions can drift (see docs/hot-keys.md, "The
    /// bound").
    pub local_budget_ttl: Option<Spanned<String>>,
}

/// One `replaces` entry: `{name: other_limit}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplacesDoc {
    /// The name of the replaced limit.
    pub name: Option<Spanned<String>>,
}

/// A whole number as written, kept wide so that negative and oversized values reach validation
/// (and get a message about the limit) instead of failing as a type error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Count {
    pub number: i128,
    /// False when the parser could only read the number approximately (beyond 64 bits, it
    /// reads a float), so messages should not repeat it.
    pub exact: bool,
}

impl Count {
    fn exact(number: i128) -> Count {
        Count {
            number,
            exact: true,
        }
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CountVisitor)
    }
}

struct CountVisitor;

impl Visitor<'_> for CountVisitor {
    type Value = Count;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a whole number")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
        Ok(Count::exact(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
        Ok(Count::exact(v.into()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Count, E> {
        Ok(Count::exact(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Count, E> {
        Ok(i128::try_from(v).map_or(
            Count {
                number: i128::MAX,
                exact: false,
            },
            Count::exact,
        ))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Count, E> {
        // The YAML parser reads integers beyond 64 bits as floats; keep them so validation
        // reports "above the maximum" rather than a type error. `as` saturates.
        if v.is_finite() && v.fract() == 0.0 {
            Ok(Count {
                number: v as i128,
                exact: false,
            })
        } else {
            Err(E::invalid_type(Unexpected::Float(v), &self))
        }
    }
}
