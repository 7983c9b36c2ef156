//! A pushed [`RateLimitConfig`] as a policy source: the `(name, text)` pair a policy file
//! would be, so that a push goes through the same compiler, validation and atomic swap as a
//! file reload, and its versions show and diff like files.
//!
//! The text is JSON (which the YAML parser reads), one field a line, with the field names of
//! envoyproxy/ratelimit's files. Proto3 cannot tell an unset field from its default, so
//! defaults are left out, as a file would: an empty `value` (any value), `false` flags, the
//! unit `UNKNOWN` of an `unlimited` limit and its `requests_per_unit` of 0.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, Struct, Value as ProtoValue};
use prost::Message;
use serde_json::{Map, Value, json};

use super::proto::{
    RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig, RateLimitDescriptor, RateLimitPolicy,
    RateLimitUnit,
};

/// Why a response's resources are not policy sources.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A resource of another type.
    #[error("resource {index} has type {found}, not {RATE_LIMIT_CONFIG_TYPE_URL}")]
    WrongType {
        /// Its position in the response.
        index: usize,
        /// Its type URL.
        found: String,
    },
    /// A resource that does not decode.
    #[error("resource {index} is not a RateLimitConfig: {source}")]
    Undecodable {
        /// Its position in the response.
        index: usize,
        /// What the decoder said.
        source: prost::DecodeError,
    },
    /// Two resources with one name.
    #[error("two resources are named `{0}`")]
    DuplicateName(String),
}

/// The policy sources of every resource of a response, in order: all of them, or why not.
pub fn sources(resources: &[Any]) -> Result<Vec<(String, String)>, ResourceError> {
    let mut sources: Vec<(String, String)> = Vec::with_capacity(resources.len());
    for (index, resource) in resources.iter().enumerate() {
        if resource.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
            return Err(ResourceError::WrongType {
                index,
                found: resource.type_url.clone(),
            });
        }
        let config = RateLimitConfig::decode(resource.value.as_slice())
            .map_err(|source| ResourceError::Undecodable { index, source })?;
        let source = policy_source(&config, index);
        if sources.iter().any(|(name, _)| *name == source.0) {
            return Err(ResourceError::DuplicateName(config.name));
        }
        sources.push(source);
    }
    Ok(sources)
}

/// One configuration as a policy source named `xds:NAME` (`xds:#INDEX` without a name).
pub fn policy_source(config: &RateLimitConfig, index: usize) -> (String, String) {
    let name = if config.name.is_empty() {
        format!("xds:#{index}")
    } else {
        format!("xds:{}", config.name)
    };
    let mut file = Map::new();
    file.insert("domain".into(), json!(config.domain));
    file.insert("descriptors".into(), descriptors(&config.descriptors));
    let text = serde_json::to_string_pretty(&Value::Object(file)).unwrap_or_default();
    (name, text + "\n")
}

fn descriptors(list: &[RateLimitDescriptor]) -> Value {
    Value::Array(list.iter().map(descriptor).collect())
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut out = Map::new();
    out.insert("key".into(), json!(d.key));
    if !d.value.is_empty() {
        out.insert("value".into(), json!(d.value));
    }
    if let Some(limit) = &d.rate_limit {
        out.insert("rate_limit".into(), rate_limit(limit));
    }
    if !d.descriptors.is_empty() {
        out.insert("descriptors".into(), descriptors(&d.descriptors));
    }
    for (name, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            out.insert(name.into(), Value::Bool(true));
        }
    }
    if let Some(metadata) = &d.metadata {
        out.insert("metadata".into(), structure(metadata));
    }
    Value::Object(out)
}

fn rate_limit(limit: &RateLimitPolicy) -> Value {
    let mut out = Map::new();
    let unit = RateLimitUnit::try_from(limit.unit);
    // An unlimited limit has no unit (the schema's default); any other needs one, and an
    // unknown or unset one reaches validation, which names it.
    if !(limit.unlimited && unit == Ok(RateLimitUnit::Unknown)) {
        let unit = match unit {
            Ok(unit) => unit.schema_name().to_owned(),
            Err(_) => format!("unit number {}", limit.unit),
        };
        out.insert("unit".into(), json!(unit));
    }
    if !limit.unlimited || limit.requests_per_unit != 0 {
        out.insert("requests_per_unit".into(), json!(limit.requests_per_unit));
    }
    if limit.unlimited {
        out.insert("unlimited".into(), Value::Bool(true));
    }
    if !limit.name.is_empty() {
        out.insert("name".into(), json!(limit.name));
    }
    if !limit.replaces.is_empty() {
        let replaces = limit.replaces.iter().map(|r| json!({ "name": r.name }));
        out.insert("replaces".into(), Value::Array(replaces.collect()));
    }
    Value::Object(out)
}

/// A protobuf `Struct` as the JSON it stands for.
fn structure(s: &Struct) -> Value {
    // Sorted, so that equal metadata gives equal texts (and no new version).
    let mut fields: Vec<_> = s.fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

fn value(v: &ProtoValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(list)) => Value::Array(list.values.iter().map(value).collect()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tollgate::policy::Policy;

    use super::*;
    use crate::xds::proto::RateLimitReplace;

    fn any(config: &RateLimitConfig) -> Any {
        Any {
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            value: config.encode_to_vec(),
        }
    }

    fn limited(key: &str, value: &str, unit: RateLimitUnit, n: u32) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A configuration with nested descriptors, an unlimited limit, names, `replaces` and
    /// metadata compiles into the rules a file with the same fields would.
    #[test]
    fn a_config_compiles_like_the_file_it_stands_for() {
        let mut parent = limited("tenant", "", RateLimitUnit::Minute, 60);
        parent.descriptors = vec![RateLimitDescriptor {
            key: "path".into(),
            value: "/health".into(),
            rate_limit: Some(RateLimitPolicy {
                unlimited: true,
                name: "health".into(),
                replaces: vec![RateLimitReplace {
                    name: "tenant".into(),
                }],
                ..Default::default()
            }),
            ..Default::default()
        }];
        parent.rate_limit.as_mut().unwrap().name = "tenant".into();
        let mut week = limited("plan", "free", RateLimitUnit::Week, 7);
        week.shadow_mode = true;
        week.metadata = Some(Struct {
            fields: [(
                "tier".to_owned(),
                ProtoValue {
                    kind: Some(Kind::StringValue("free".into())),
                },
            )]
            .into(),
        });
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "api".into(),
            descriptors: vec![parent, week],
        };
        let sources = sources(&[any(&config)]).unwrap();
        assert_eq!(sources[0].0, "xds:edge");
        let policy = Policy::from_sources(&sources).unwrap();
        let names: Vec<_> = policy.rules().iter().map(|r| r.name.to_string()).collect();
        assert_eq!(names.len(), 3, "{names:?}\n{}", sources[0].1);
        assert!(names.contains(&"health".to_owned()), "{names:?}");
        assert!(
            sources[0].1.contains("\"unit\": \"WEEK\""),
            "{}",
            sources[0].1
        );
        assert!(
            sources[0].1.contains("\"tier\": \"free\""),
            "{}",
            sources[0].1
        );
    }

    /// A resource of another type, bytes that do not decode and two resources with one name
    /// are refused, naming what was wrong; a limit without a unit fails to compile.
    #[test]
    fn bad_resources_are_refused_with_the_reason() {
        let config = RateLimitConfig {
            name: "a".into(),
            domain: "api".into(),
            descriptors: vec![limited("k", "", RateLimitUnit::Second, 1)],
        };
        let mut other = any(&config);
        other.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        let e = sources(&[other]).unwrap_err().to_string();
        assert!(e.contains("envoy.config.cluster.v3.Cluster"), "{e}");
        let garbage = Any {
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            value: vec![0xff, 0xff, 0xff],
        };
        let e = sources(&[garbage]).unwrap_err().to_string();
        assert!(e.contains("resource 0 is not a RateLimitConfig"), "{e}");
        let e = sources(&[any(&config), any(&config)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("two resources are named `a`"), "{e}");

        let unitless = RateLimitConfig {
            name: "b".into(),
            domain: "api".into(),
            descriptors: vec![limited("k", "", RateLimitUnit::Unknown, 1)],
        };
        let sources = sources(&[any(&unitless)]).unwrap();
        let e = Policy::from_sources(&sources).unwrap_err().to_string();
        assert!(e.contains("UNKNOWN"), "{e}");
    }
}
