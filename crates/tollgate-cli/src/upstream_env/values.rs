//! Upstream's value forms, each checked and written as `serve` reads it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::UpstreamEnvError;

fn invalid(var: &'static str, value: &str, why: impl Into<String>) -> UpstreamEnvError {
    UpstreamEnvError::Invalid {
        var,
        value: value.to_owned(),
        why: why.into(),
    }
}

/// A boolean as upstream's loader reads it (Go's `strconv.ParseBool`).
pub fn boolean(var: &'static str, value: &str) -> Result<bool, UpstreamEnvError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(invalid(var, value, "not a boolean (true or false)")),
    }
}

/// `boolean`, written as `serve` reads a switch.
pub fn switch(var: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    boolean(var, value).map(|on| on.to_string())
}

/// A Go duration (`500ms`, `10s`, `1m30s`), written as `serve` reads durations.
pub fn duration(var: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    let text = value.replace("µs", "us");
    match humantime::parse_duration(&text) {
        Ok(_) => Ok(text),
        Err(e) => Err(invalid(
            var,
            value,
            format!("not a duration such as 10s: {e}"),
        )),
    }
}

/// A value passed on as it is.
pub fn verbatim(_: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    Ok(value.to_owned())
}

/// A response header name (RFC 9110 token characters).
pub fn header_name(var: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if value.chars().all(token) {
        Ok(value.to_owned())
    } else {
        Err(invalid(var, value, "not a header name"))
    }
}

/// `LOG_LEVEL` (logrus's level names, any case) as a tracing level.
pub fn log_level(var: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    let level = match value.to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        _ => {
            return Err(invalid(
                var,
                value,
                "not a log level (trace, debug, info, warn, error)",
            ));
        }
    };
    Ok(level.to_owned())
}

/// `LOG_FORMAT`: `text` or `json`.
pub fn log_format(var: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    match value.to_ascii_lowercase().as_str() {
        "text" => Ok("text".to_owned()),
        "json" => Ok("json".to_owned()),
        _ => Err(invalid(var, value, "not a log format (text or json)")),
    }
}

/// `k1:v1,k2:v2` (upstream's map form) as `k1=v1,k2=v2`.
pub fn pairs(var: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    let mut out = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once(':') {
            Some((k, v)) if !k.trim().is_empty() => out.push(format!("{}={}", k.trim(), v.trim())),
            _ => return Err(invalid(var, value, format!("`{entry}` is not key:value"))),
        }
    }
    Ok(out.join(","))
}

/// `CONFIG_GRPC_XDS_NODE_METADATA`'s `k1=v1,k2=v2`; entries without `=` are dropped, as
/// upstream drops them.
pub fn node_metadata(_: &'static str, value: &str) -> Result<String, UpstreamEnvError> {
    let kept: Vec<&str> = value.split(',').filter(|e| e.contains('=')).collect();
    Ok(kept.join(","))
}

/// An address from a host and a port variable, either unset; the missing part is tollgate's
/// default's. `None` when neither is set.
pub fn address(
    (host_var, host): (&'static str, Option<String>),
    (port_var, port): (&'static str, Option<String>),
    default: SocketAddr,
) -> Result<Option<String>, UpstreamEnvError> {
    if host.is_none() && port.is_none() {
        return Ok(None);
    }
    let ip = match host.as_deref() {
        None => default.ip(),
        Some("localhost") => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Some(text) => text
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| invalid(host_var, text, "not an IP address (or localhost)"))?,
    };
    let port = match port.as_deref() {
        None => default.port(),
        Some(text) => text
            .parse::<u16>()
            .map_err(|_| invalid(port_var, text, "not a port number (0 to 65535)"))?,
    };
    Ok(Some(SocketAddr::new(ip, port).to_string()))
}
