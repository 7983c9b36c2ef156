//! The checks clap runs on flag values that are not plain numbers or strings (shares,
//! durations, counts of at least 1, header and domain names), shared by the subcommands.

use std::time::Duration;

pub(crate) fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a share above 0 and at most 1")),
    }
}

/// A duration of at most a day: no setting of `serve` is meant to be longer, and a longer one
/// (up to `u64::MAX` seconds parses) would overflow the deadlines computed from it.
pub(crate) fn any_duration(s: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration such as 500ms or 2s: {e}"))?;
    if parsed > tollgate::store::MAX_SETTING {
        return Err(format!(
            "`{s}` is more than a day (24h), the most this setting takes"
        ));
    }
    Ok(parsed)
}

/// `--watch-interval`: `0s` (no watching) or at least 100 ms: each check reads and hashes every
/// policy and TLS file, and `1ns` kept most of a core busy doing it.
pub(crate) fn watch_duration(s: &str) -> Result<Duration, String> {
    let parsed = any_duration(s)?;
    if !parsed.is_zero() && parsed < MIN_WATCH_INTERVAL {
        return Err(format!(
            "`{s}` is shorter than {MIN_WATCH_INTERVAL:?}: each check reads every watched file (0s turns watching off)"
        ));
    }
    Ok(parsed)
}

const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(100);

pub(crate) fn humantime_duration(s: &str) -> Result<Duration, String> {
    let parsed = any_duration(s)?;
    if parsed.is_zero() {
        return Err("the interval must be greater than zero".into());
    }
    Ok(parsed)
}

/// A count that must be at least 1.
pub(crate) fn positive<T: std::str::FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        _ => Err(format!("`{s}` is not a whole number of at least 1")),
    }
}

/// A response header name: RFC 9110 token characters, not empty.
pub(crate) fn header_name(s: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if s.is_empty() || !s.chars().all(token) {
        return Err(format!("`{s}` is not a header name"));
    }
    Ok(s.to_owned())
}

/// A domain given on the command line: not empty (every check in it would be refused).
pub(crate) fn domain_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the domain must not be empty".into());
    }
    Ok(s.to_owned())
}
