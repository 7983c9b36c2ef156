//! envoyproxy/ratelimit's xDS resource, `ratelimit.config.ratelimit.v3.RateLimitConfig`, as
//! prost messages written from its documented schema (`api/ratelimit/config/ratelimit/v3/
//! rls_conf.proto`): the field numbers and types are the wire contract, the names follow it.

use envoy_types::pb::google::protobuf::Struct;

/// The type URL of [`RateLimitConfig`] resources, subscribed to over ADS.
pub const RATE_LIMIT_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The limits of one domain: what one policy file holds.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// The configuration's name, unique among the resources.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The domain the descriptors belong to.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// The top-level descriptors.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// One node of the descriptor tree.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The entry key to match.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The entry value to match; empty matches any value.
    #[prost(string, tag = "2")]
    pub value: String,
    /// The limit of a request descriptor ending here.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// Nested descriptors, matching the next entry.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Count and report, never deny.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// Metrics carry the matched value.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// A quota descriptor: over only when every quota descriptor of the request is.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// Sent back in the response's `dynamic_metadata` when the limit matches.
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<Struct>,
}

/// A limit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// The period the limit counts over.
    #[prost(enumeration = "RateLimitUnit", tag = "1")]
    pub unit: i32,
    /// Requests allowed per unit.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// No limit at all.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// The limit's name, for `replaces`.
    #[prost(string, tag = "4")]
    pub name: String,
    /// Limits this one replaces when both match.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// One limit replaced, by name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    /// The replaced limit's name.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// A limit's unit. The numbers are the schema's: `WEEK` came last and is 7.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RateLimitUnit {
    /// Not set.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// 30 days.
    Month = 5,
    /// 365 days.
    Year = 6,
    /// 7 days.
    Week = 7,
}

impl RateLimitUnit {
    /// The schema's name of the unit (`SECOND`...), as envoyproxy/ratelimit's files spell it.
    pub fn schema_name(self) -> &'static str {
        match self {
            RateLimitUnit::Unknown => "UNKNOWN",
            RateLimitUnit::Second => "SECOND",
            RateLimitUnit::Minute => "MINUTE",
            RateLimitUnit::Hour => "HOUR",
            RateLimitUnit::Day => "DAY",
            RateLimitUnit::Month => "MONTH",
            RateLimitUnit::Year => "YEAR",
            RateLimitUnit::Week => "WEEK",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use prost::Message;

    use super::*;

    /// The field numbers are the wire contract: bytes written by hand from the schema decode
    /// into the fields they name.
    #[test]
    fn field_numbers_match_the_schema() {
        // RateLimitPolicy: unit (1) = WEEK (7), requests_per_unit (2) = 5, unlimited (3),
        // name (4) = "n", replaces (5) = [{name (1) = "r"}].
        let policy = [
            0x08, 7, 0x10, 5, 0x18, 1, 0x22, 1, b'n', 0x2a, 3, 0x0a, 1, b'r',
        ];
        // RateLimitDescriptor: key (1), value (2), rate_limit (3), shadow_mode (5),
        // detailed_metric (6), quota_mode (7), metadata (8) = {}.
        let mut descriptor = vec![0x0a, 1, b'k', 0x12, 1, b'v', 0x1a, policy.len() as u8];
        descriptor.extend(policy);
        descriptor.extend([0x28, 1, 0x30, 1, 0x38, 1, 0x42, 0]);
        // RateLimitConfig: name (1), domain (2), descriptors (3).
        let mut config = vec![0x0a, 1, b'c', 0x12, 1, b'd', 0x1a, descriptor.len() as u8];
        config.extend(&descriptor);

        let decoded = RateLimitConfig::decode(config.as_slice()).unwrap();
        let expected = RateLimitConfig {
            name: "c".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                value: "v".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Week as i32,
                    requests_per_unit: 5,
                    unlimited: true,
                    name: "n".into(),
                    replaces: vec![RateLimitReplace { name: "r".into() }],
                }),
                descriptors: vec![],
                shadow_mode: true,
                detailed_metric: true,
                quota_mode: true,
                metadata: Some(Struct::default()),
            }],
        };
        assert_eq!(decoded, expected);
        assert_eq!(expected.encode_to_vec(), config);
    }
}
