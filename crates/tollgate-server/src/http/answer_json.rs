//! The JSON text of a `/v1/check` answer, written straight into its body.
//!
//! Byte for byte what `serde_json` writes for [`WireResponse`] (the fields in their order, an
//! absent optional field left out, `retry_after_ms` written `null` when absent, strings escaped
//! as `serde_json` escapes them), without its serializer's generic machinery: on the hot path
//! that machinery cost about a tenth of a no-op check's instructions. The tests hold the two
//! equal.

use serde::Serialize;

/// The answer, as `serde_json` would write it: the format's definition, which [`to_vec`]
/// writes by hand and the tests hold to this derive.
#[derive(Debug, Serialize)]
pub(super) struct WireResponse<'a> {
    pub(super) allowed: bool,
    pub(super) overall_code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) retry_after_ms: Option<u64>,
    /// Set when the store could not decide: the most severe posture that answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) degraded: Option<&'static str>,
    /// Set when a soft limit was exceeded: how long to hold the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) soft_delay_ms: Option<u64>,
    pub(super) statuses: Vec<WireStatus<'a>>,
}

#[derive(Debug, Serialize)]
pub(super) struct WireStatus<'a> {
    pub(super) code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) limit_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) algorithm: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reset_after_ms: Option<u64>,
    pub(super) retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) delay_ms: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) shadow_would_deny: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) soft_exceeded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) degraded: Option<&'static str>,
}

/// `answer` as JSON.
pub(super) fn to_vec(answer: &WireResponse<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + 320 * answer.statuses.len());
    out.extend_from_slice(br#"{"allowed":"#);
    out.extend_from_slice(if answer.allowed { b"true" } else { b"false" });
    out.extend_from_slice(br#","overall_code":"#);
    string(&mut out, answer.overall_code);
    optional_number(&mut out, br#","retry_after_ms":"#, answer.retry_after_ms);
    optional_string(&mut out, br#","degraded":"#, answer.degraded);
    optional_number(&mut out, br#","soft_delay_ms":"#, answer.soft_delay_ms);
    out.extend_from_slice(br#","statuses":["#);
    for (i, status) in answer.statuses.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_status(&mut out, status);
    }
    out.extend_from_slice(b"]}");
    out
}

fn write_status(out: &mut Vec<u8>, s: &WireStatus<'_>) {
    out.extend_from_slice(br#"{"code":"#);
    string(out, s.code);
    optional_string(out, br#","limit_name":"#, s.limit_name);
    optional_string(out, br#","algorithm":"#, s.algorithm);
    optional_number(out, br#","limit":"#, s.limit);
    optional_number(out, br#","period_ms":"#, s.period_ms);
    optional_number(out, br#","remaining":"#, s.remaining);
    optional_number(out, br#","reset_after_ms":"#, s.reset_after_ms);
    out.extend_from_slice(br#","retry_after_ms":"#);
    match s.retry_after_ms {
        Some(ms) => number(out, ms),
        None => out.extend_from_slice(b"null"),
    }
    optional_number(out, br#","delay_ms":"#, s.delay_ms);
    if s.shadow_would_deny {
        out.extend_from_slice(br#","shadow_would_deny":true"#);
    }
    if s.soft_exceeded {
        out.extend_from_slice(br#","soft_exceeded":true"#);
    }
    optional_string(out, br#","reason":"#, s.reason);
    optional_string(out, br#","degraded":"#, s.degraded);
    out.push(b'}');
}

/// `key` (a comma, the quoted name and a colon) then `value`, when there is one.
fn optional_number(out: &mut Vec<u8>, key: &[u8], value: Option<u64>) {
    if let Some(n) = value {
        out.extend_from_slice(key);
        number(out, n);
    }
}

fn optional_string(out: &mut Vec<u8>, key: &[u8], value: Option<&str>) {
    if let Some(s) = value {
        out.extend_from_slice(key);
        string(out, s);
    }
}

fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `s` quoted, escaped as `serde_json` escapes: `"` and `\` by a backslash, the control
/// characters below U+0020 by their short escape or `\u00XX`; everything else as it is.
fn string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Every escape class: quotes, backslashes, each control character, DEL, non-ASCII, the
    /// line and paragraph separators, and anything else.
    fn name() -> impl Strategy<Value = String> {
        let char = prop_oneof![
            Just('"'),
            Just('\\'),
            (0u8..0x20).prop_map(char::from),
            Just('\u{7f}'),
            Just('\u{2028}'),
            Just('é'),
            any::<char>(),
            Just('a'),
        ];
        prop::collection::vec(char, 0..12).prop_map(|chars| chars.into_iter().collect())
    }

    /// A status's name and its other fields, owned.
    type Fields = (Option<String>, Vec<Option<u64>>, [bool; 4]);

    fn fields() -> impl Strategy<Value = Fields> {
        (
            prop::option::of(name()),
            prop::collection::vec(prop::option::of(any::<u64>()), 7),
            any::<[bool; 4]>(),
        )
    }

    fn status((name, n, flags): &Fields) -> WireStatus<'_> {
        WireStatus {
            code: if flags[0] { "OK" } else { "OVER_LIMIT" },
            limit_name: name.as_deref(),
            algorithm: n[0].map(|_| "fixed_window"),
            limit: n[0],
            period_ms: n[1],
            remaining: n[2],
            reset_after_ms: n[3],
            retry_after_ms: n[4],
            delay_ms: n[5],
            shadow_would_deny: flags[1],
            soft_exceeded: flags[2],
            reason: flags[3].then_some("over_limit"),
            degraded: n[6].map(|_| "closed"),
        }
    }

    proptest! {
        #[test]
        fn writes_what_serde_json_writes(
            statuses in prop::collection::vec(fields(), 0..4),
            allowed in any::<bool>(),
            head in prop::collection::vec(prop::option::of(any::<u64>()), 3),
        ) {
            let answer = WireResponse {
                allowed,
                overall_code: if allowed { "OK" } else { "OVER_LIMIT" },
                retry_after_ms: head[0],
                degraded: head[1].map(|_| "open"),
                soft_delay_ms: head[2],
                statuses: statuses.iter().map(status).collect(),
            };
            let by_serde = serde_json::to_string(&answer).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(String::from_utf8(to_vec(&answer)).ok(), Some(by_serde));
        }
    }

    #[test]
    fn escapes_a_control_character_by_its_code() {
        let mut out = Vec::new();
        string(&mut out, "a\u{1}\"\u{2028}");
        assert_eq!(out, "\"a\\u0001\\\"\u{2028}\"".as_bytes());
    }
}
