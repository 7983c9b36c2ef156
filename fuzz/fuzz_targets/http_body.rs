//! `POST /v1/check` bodies: any bytes decode or are refused with a message; a decoded request,
//! written back as JSON, decodes to the same request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use tollgate::limiter::CheckRequest;
use tollgate_server::http::decode_check_body;

/// Envoy's unit names by period in seconds (the API's `unit`).
fn unit_name(period_secs: u64) -> &'static str {
    const DAY: u64 = 86_400;
    match period_secs {
        1 => "SECOND",
        60 => "MINUTE",
        3_600 => "HOUR",
        DAY => "DAY",
        d if d == 7 * DAY => "WEEK",
        d if d == 30 * DAY => "MONTH",
        d if d == 365 * DAY => "YEAR",
        other => panic!("a limit override of {other} s, which no unit names"),
    }
}

/// The request as a `/v1/check` body that says everything explicitly.
fn encode(request: &CheckRequest) -> Value {
    let descriptors: Vec<Value> = request
        .descriptors()
        .iter()
        .map(|d| {
            let entries: Vec<Value> = d
                .entries()
                .iter()
                .map(|(k, v)| json!({"key": k, "value": v}))
                .collect();
            let mut descriptor = json!({"entries": entries, "hits_addend": d.cost()});
            if let Some(limit) = d.limit_override() {
                let requests = if limit.blocks {
                    0
                } else {
                    limit.params.limit()
                };
                descriptor["limit"] = json!({
                    "requests_per_unit": requests,
                    "unit": unit_name(limit.params.period().as_secs()),
                });
            }
            descriptor
        })
        .collect();
    json!({"domain": request.domain(), "descriptors": descriptors})
}

fuzz_target!(|data: &[u8]| {
    match decode_check_body(data) {
        Ok(request) => {
            let body = serde_json::to_vec(&encode(&request)).expect("a request encodes");
            let again = decode_check_body(&body).expect("a re-encoded request decodes");
            assert_eq!(
                request,
                again,
                "re-encoded as {}",
                String::from_utf8_lossy(&body)
            );
        }
        Err(why) => assert!(!why.to_string().is_empty(), "refused without a reason"),
    }
});
