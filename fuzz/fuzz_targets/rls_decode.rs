//! Envoy RLS v3 `RateLimitRequest`s: any bytes either fail to decode, are refused, or give a
//! request that, encoded back into a message, decodes to the same request.
#![no_main]

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor,
    rate_limit_descriptor::{Entry, RateLimitOverride},
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tollgate::limiter::CheckRequest;
use tollgate_server::grpc::decode_request;

/// Envoy's unit numbers by period in seconds.
fn unit(period_secs: u64) -> i32 {
    const DAY: u64 = 86_400;
    match period_secs {
        1 => 1,
        60 => 2,
        3_600 => 3,
        DAY => 4,
        d if d == 30 * DAY => 5,
        d if d == 365 * DAY => 6,
        d if d == 7 * DAY => 7,
        other => panic!("a limit override of {other} s, which no unit names"),
    }
}

/// The request as a message that says every cost per descriptor.
fn encode(request: &CheckRequest) -> RateLimitRequest {
    RateLimitRequest {
        domain: request.domain().to_string(),
        descriptors: request
            .descriptors()
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries()
                    .iter()
                    .map(|(key, value)| Entry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                limit: d.limit_override().map(|l| RateLimitOverride {
                    requests_per_unit: if l.blocks {
                        0
                    } else {
                        u32::try_from(l.params.limit()).expect("an override from a u32")
                    },
                    unit: unit(l.params.period().as_secs()),
                }),
                hits_addend: Some(UInt64Value { value: d.cost() }),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(message) = RateLimitRequest::decode(data) else {
        return;
    };
    match decode_request(message) {
        Ok(request) => {
            let bytes = encode(&request).encode_to_vec();
            let message = RateLimitRequest::decode(bytes.as_slice()).expect("our bytes decode");
            let again = decode_request(message).expect("a re-encoded request is valid");
            assert_eq!(request, again);
        }
        Err(why) => assert!(!why.to_string().is_empty(), "refused without a reason"),
    }
});
