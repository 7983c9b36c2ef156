//! `POST /json`: envoyproxy/ratelimit's HTTP endpoint. The body is a `RateLimitRequest` in
//! proto3 JSON (lowerCamelCase or original field names; 64-bit integers as numbers or strings;
//! enums by name or number); the answer is a `RateLimitResponse` in proto3 JSON with `200` when
//! OK, `429` when over the limit and `503` when a `closed` failure posture denied it. The JSON is mapped onto the protobuf types and then goes
//! through exactly the same decoder and encoder as gRPC.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};
use tollgate::limiter::{CheckRequest, Limiter, Transport};

use super::body::Body;
use super::invalid::{EnvoyJsonError, InvalidBody};
use super::respond::{add_rate_limit_headers, decision_status};
use crate::ApiError;
use crate::grpc::{decode_request, encode_response};
use crate::json_object::{Object, from_body};
use crate::units::{unit_from_name, unit_name};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default, deserialize_with = "or_default")]
    domain: String,
    #[serde(default, deserialize_with = "or_default")]
    descriptors: Vec<Object<JsonDescriptor>>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        deserialize_with = "uint"
    )]
    hits_addend: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default, deserialize_with = "or_default")]
    entries: Vec<Object<JsonEntry>>,
    #[serde(default)]
    limit: Option<Object<JsonOverride>>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        deserialize_with = "uint"
    )]
    hits_addend: Option<u64>,
    #[serde(
        default,
        alias = "is_negative_hits",
        rename = "isNegativeHits",
        deserialize_with = "or_default"
    )]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default, deserialize_with = "or_default")]
    key: String,
    #[serde(default, deserialize_with = "or_default")]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        default,
        alias = "requests_per_unit",
        rename = "requestsPerUnit",
        deserialize_with = "uint"
    )]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unit: Option<Value>,
}

/// proto3 JSON integers: a number or a string, in exponent form too (`1e2`, `100.0`), as long as
/// the value is a whole number.
fn uint<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    let not_one = |text: &dyn std::fmt::Display| {
        D::Error::custom(format!("`{text}` is not an unsigned integer"))
    };
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_f64().and_then(whole))
            .map(Some)
            .ok_or_else(|| not_one(&n)),
        Some(Value::String(s)) => s
            .parse()
            .ok()
            .or_else(|| s.parse::<f64>().ok().and_then(whole))
            .map(Some)
            .ok_or_else(|| not_one(&s)),
        Some(other) => Err(D::Error::custom(format!(
            "expected an unsigned integer, got {other}"
        ))),
    }
}

/// `f` as an integer, when it is a whole number small enough to be exact.
fn whole(f: f64) -> Option<u64> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    // In range and whole: the cast is exact (out of range, it saturates and is not used).
    (f.fract() == 0.0 && (0.0..=EXACT).contains(&f)).then_some(f as u64)
}

/// A field proto3 JSON may send as `null`, meaning its default.
fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

fn u32_field(name: &'static str, v: Option<u64>) -> Result<u32, EnvoyJsonError> {
    u32::try_from(v.unwrap_or(0)).map_err(|_| EnvoyJsonError::NotUint32(name))
}

fn unit_number(unit: Option<&Value>) -> Result<i32, EnvoyJsonError> {
    match unit {
        None => Ok(0),
        Some(Value::String(s)) => {
            unit_from_name(s).ok_or_else(|| EnvoyJsonError::UnknownUnit(s.clone()))
        }
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| EnvoyJsonError::UnknownUnit(n.to_string())),
        Some(other) => Err(EnvoyJsonError::UnknownUnit(other.to_string())),
    }
}

impl TryFrom<JsonRequest> for RateLimitRequest {
    type Error = EnvoyJsonError;

    fn try_from(json: JsonRequest) -> Result<Self, EnvoyJsonError> {
        let descriptors = json
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(i, Object(d))| {
                let limit = d
                    .limit
                    .map(|Object(l)| -> Result<_, EnvoyJsonError> {
                        Ok(RateLimitOverride {
                            requests_per_unit: u32_field("requestsPerUnit", l.requests_per_unit)?,
                            unit: unit_number(l.unit.as_ref())?,
                        })
                    })
                    .transpose()
                    .map_err(|why| EnvoyJsonError::Descriptor {
                        index: i,
                        why: Box::new(why),
                    })?;
                Ok(RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|Object(e)| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit,
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: d.is_negative_hits,
                })
            })
            .collect::<Result<_, EnvoyJsonError>>()?;
        Ok(RateLimitRequest {
            domain: json.domain,
            descriptors,
            hits_addend: u32_field("hitsAddend", json.hits_addend)?,
        })
    }
}

/// Renders the protobuf response in proto3 JSON.
fn response_json(
    response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> Value {
    let code = |c: i32| match c {
        1 => "OK",
        2 => "OVER_LIMIT",
        _ => "UNKNOWN",
    };
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut v = json!({ "code": code(s.code) });
            if let Some(l) = &s.current_limit {
                v["currentLimit"] = json!({
                    "name": l.name,
                    "requestsPerUnit": l.requests_per_unit,
                    "unit": unit_name(l.unit),
                });
                v["limitRemaining"] = json!(s.limit_remaining);
            } else if s.limit_remaining != 0 {
                // An unlimited rule's `u32::MAX`, as proto3 JSON writes a non-zero field.
                v["limitRemaining"] = json!(s.limit_remaining);
            }
            if let Some(d) = &s.duration_until_reset {
                v["durationUntilReset"] = json!(proto_duration(d.seconds, d.nanos));
            }
            v
        })
        .collect();
    let headers: Vec<Value> = response
        .response_headers_to_add
        .iter()
        .map(|h| json!({ "key": h.key, "value": h.value }))
        .collect();
    json!({
        "overallCode": code(response.overall_code),
        "statuses": statuses,
        "responseHeadersToAdd": headers,
    })
}

/// proto3 JSON `Duration`, canonical: seconds, then 0, 3, 6 or 9 fractional digits, then `s`.
fn proto_duration(seconds: i64, nanos: i32) -> String {
    if nanos == 0 {
        format!("{seconds}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{seconds}.{nanos:09}s")
    }
}

/// A `/json` body as a request, or why it is not one (a `400`).
fn decode(body: &[u8]) -> Result<CheckRequest, InvalidBody> {
    let json: JsonRequest = from_body(body)?;
    let wire = RateLimitRequest::try_from(json)?;
    Ok(decode_request(wire)?)
}

pub async fn check(State(limiter): State<Arc<Limiter>>, Body(body): Body) -> Response {
    let request = match decode(&body) {
        Ok(r) => r,
        Err(why) => {
            limiter.note_invalid(Transport::Http, &why);
            return ApiError::from(why).into_response();
        }
    };
    match limiter.check(&request).await {
        Ok(decided) => {
            let body = response_json(&encode_response(&decided, true));
            let mut response = (decision_status(&decided), axum::Json(body)).into_response();
            add_rate_limit_headers(response.headers_mut(), &decided);
            response
        }
        Err(e) => {
            limiter.note_invalid(Transport::Http, &e);
            ApiError::from(&e).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_use_proto3_json_form() {
        assert_eq!(proto_duration(59, 0), "59s");
        assert_eq!(proto_duration(1, 500_000_000), "1.500s");
        assert_eq!(proto_duration(2, 250_000), "2.000250s");
        assert_eq!(proto_duration(0, 1), "0.000000001s");
    }

    fn parsed(body: &str) -> Result<RateLimitRequest, String> {
        let json: JsonRequest = from_body(body.as_bytes()).map_err(|e| e.to_string())?;
        RateLimitRequest::try_from(json).map_err(|e| e.to_string())
    }

    /// proto3 JSON parsers take integers in exponent form and `null` for a field's default.
    #[test]
    fn integers_in_any_form_and_nulls_are_read() {
        let request = parsed(
            r#"{"domain": "api", "hitsAddend": 2.0, "descriptors": [{"entries": [{"key": "k", "value": null}],
                "hitsAddend": "1e2", "isNegativeHits": null, "limit": {"requestsPerUnit": 5e0, "unit": "MINUTE"}}]}"#,
        )
        .unwrap();
        assert_eq!(request.hits_addend, 2);
        let d = &request.descriptors[0];
        assert_eq!(d.hits_addend.as_ref().map(|h| h.value), Some(100));
        assert_eq!(d.entries[0].value, "");
        assert!(!d.is_negative_hits);
        assert_eq!(d.limit.as_ref().map(|l| l.requests_per_unit), Some(5));
        for bad in [r#""1.5""#, "2.5", "-1", r#""1e30""#] {
            let error = parsed(&format!(
                r#"{{"domain": "api", "hitsAddend": {bad}, "descriptors": []}}"#
            ))
            .unwrap_err();
            assert!(error.contains("not an unsigned integer"), "{bad}: {error}");
        }
    }

    /// A descriptor's limit that cannot be read names its descriptor, as every other
    /// descriptor error does.
    #[test]
    fn a_bad_limit_names_its_descriptor() {
        let limited = |limit: &str| {
            parsed(&format!(
                r#"{{"domain": "api", "descriptors": [{{"entries": [{{"key": "k", "value": "v"}}]}},
                    {{"entries": [{{"key": "k", "value": "w"}}], "limit": {limit}}}]}}"#
            ))
            .unwrap_err()
        };
        assert_eq!(
            limited(r#"{"requestsPerUnit": 5000000000, "unit": "MINUTE"}"#),
            "descriptor 1: requestsPerUnit does not fit in uint32"
        );
        assert_eq!(
            limited(r#"{"requestsPerUnit": 5, "unit": "FORTNIGHT"}"#),
            "descriptor 1: unknown unit `FORTNIGHT`"
        );
    }
}
