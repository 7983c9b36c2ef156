//! The RLS response's `dynamic_metadata`, shaped as envoyproxy/ratelimit's
//! `RESPONSE_DYNAMIC_METADATA` shapes it (`--rls-dynamic-metadata`):
//!
//! ```text
//! { "domain": "...",
//!   "descriptors": [ { "entries": ["key=value", ...],
//!                      "limit": "requests_per_unit:N unit:UNIT",   (a limit the caller sent)
//!                      "hitsAddend": N },                           (the descriptor's own)
//!                    ... ],
//!   "hitsAddend": N,                                                (the request's, unless 0)
//!   "metadata": { ... } }         (the policy `metadata` of every limit that admitted, merged)
//! ```

use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, NullValue, Struct, Value};
use tollgate::limiter::{CheckResponse, Code};

/// What the metadata repeats of the request, taken before the request is decoded (which
/// consumes it).
#[derive(Debug)]
pub struct RequestEcho(HashMap<String, Value>);

impl RequestEcho {
    /// The `domain`, `descriptors` and `hitsAddend` fields for `request`.
    pub fn of(request: &RateLimitRequest) -> RequestEcho {
        let mut fields = HashMap::new();
        fields.insert("domain".to_owned(), string(&request.domain));
        let descriptors = request
            .descriptors
            .iter()
            .map(|d| {
                let mut fields = HashMap::new();
                let entries = d
                    .entries
                    .iter()
                    .map(|e| string(&format!("{}={}", e.key, e.value)))
                    .collect();
                fields.insert("entries".to_owned(), list(entries));
                if let Some(limit) = &d.limit {
                    let unit = RateLimitUnit::try_from(limit.unit)
                        .map_or("UNKNOWN", |unit| unit.as_str_name());
                    let text = format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit);
                    fields.insert("limit".to_owned(), string(&text));
                }
                if let Some(hits) = d.hits_addend {
                    fields.insert("hitsAddend".to_owned(), number(hits.value as f64));
                }
                structure(fields)
            })
            .collect();
        fields.insert("descriptors".to_owned(), list(descriptors));
        if request.hits_addend != 0 {
            fields.insert(
                "hitsAddend".to_owned(),
                number(f64::from(request.hits_addend)),
            );
        }
        RequestEcho(fields)
    }

    /// The whole `dynamic_metadata`: the echo, and under `metadata` the policy metadata of
    /// each limit that answered OK (a shadow limit that would deny included; unlimited and
    /// replaced ones have no limit), merged in request order: the first value of a key stays,
    /// and two mappings under one key merge, as upstream merges them.
    pub fn into_metadata(self, decided: &CheckResponse) -> Struct {
        let mut fields = self.0;
        let mut passed: HashMap<String, Value> = HashMap::new();
        for status in decided.statuses.iter().filter(|s| s.code == Code::Ok) {
            let rule = status.limit.as_ref().and_then(|l| l.rule());
            if let Some(metadata) = rule.and_then(|rule| rule.metadata.as_ref()) {
                for (key, value) in metadata {
                    merge_into(&mut passed, key, json_to_value(value));
                }
            }
        }
        if !passed.is_empty() {
            fields.insert("metadata".to_owned(), structure(passed));
        }
        Struct { fields }
    }
}

/// Adds `value` under `key` unless the key is taken; two structs under one key merge.
fn merge_into(into: &mut HashMap<String, Value>, key: &str, value: Value) {
    match into.get_mut(key) {
        None => {
            into.insert(key.to_owned(), value);
        }
        Some(Value {
            kind: Some(Kind::StructValue(existing)),
        }) => {
            if let Some(Kind::StructValue(incoming)) = value.kind {
                for (key, value) in incoming.fields {
                    merge_into(&mut existing.fields, &key, value);
                }
            }
        }
        Some(_) => {}
    }
}

fn json_to_value(value: &serde_json::Value) -> Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(NullValue::NullValue as i32),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

fn string(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.to_owned())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(fields: HashMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of(json: serde_json::Value) -> Value {
        json_to_value(&json)
    }

    /// upstream's TestOverlappingMetadataReturnsTheFirstValue, and nested mappings merging.
    #[test]
    fn the_first_value_of_a_key_stays_and_mappings_merge() {
        let mut into = HashMap::new();
        merge_into(&mut into, "name", value_of(serde_json::json!("service_1")));
        merge_into(&mut into, "name", value_of(serde_json::json!("service_2")));
        merge_into(&mut into, "quota", value_of(serde_json::json!({"a": 1})));
        merge_into(
            &mut into,
            "quota",
            value_of(serde_json::json!({"a": 2, "b": 3})),
        );
        assert_eq!(into["name"], value_of(serde_json::json!("service_1")));
        assert_eq!(into["quota"], value_of(serde_json::json!({"a": 1, "b": 3})));
    }
}
