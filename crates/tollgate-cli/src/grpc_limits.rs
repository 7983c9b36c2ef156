//! `serve`'s bounds on what gRPC clients may make the server hold: streams per connection,
//! HTTP/2's flow-control windows, request bytes per connection and in all, connections. What
//! they bound is [`tollgate_server::listen`]'s (see docs/listeners.md for the arithmetic).

use std::time::Duration;

use clap::Args;
use tollgate_server::listen::{GrpcLimits, RequestBytes};

/// HTTP/2 caps a flow-control window at 2^31 - 1 bytes.
const MAX_WINDOW: u64 = (1 << 31) - 1;

#[derive(Debug, Clone, Args)]
pub struct GrpcLimitArgs {
    /// Requests in flight per gRPC connection (HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`); a
    /// client wanting more opens another connection, as Envoy does.
    #[arg(long, env = "TOLLGATE_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = tollgate_server::listen::GRPC_MAX_STREAMS, value_parser = crate::arg_values::positive::<u32>, value_name = "N")]
    pub grpc_max_concurrent_streams: u32,
    /// Bytes one gRPC stream may send before the server reads them (HTTP/2's initial stream
    /// window), at least 64KiB - 1 byte: `64KiB`, `1MiB` or a number of bytes.
    #[arg(long, env = "TOLLGATE_GRPC_STREAM_WINDOW", default_value = "64KiB", value_parser = window, value_name = "BYTES")]
    pub grpc_stream_window: u32,
    /// Bytes all the streams of a gRPC connection may send before the server reads them
    /// (HTTP/2's connection window), at least 64KiB - 1 byte.
    #[arg(long, env = "TOLLGATE_GRPC_CONNECTION_WINDOW", default_value = "1MiB", value_parser = window, value_name = "BYTES")]
    pub grpc_connection_window: u32,
    /// Bytes of request messages one gRPC connection may hold while they arrive (each counted
    /// at the length its prefix announces, from its first bytes until it is decoded); a request
    /// past it is refused with `RESOURCE_EXHAUSTED`.
    #[arg(long, env = "TOLLGATE_GRPC_CONNECTION_REQUEST_BYTES", default_value = "1MiB", value_parser = bytes, value_name = "BYTES")]
    pub grpc_connection_request_bytes: usize,
    /// Bytes of request messages all gRPC connections together may hold while they arrive; a
    /// request past it is refused with `RESOURCE_EXHAUSTED`.
    #[arg(long, env = "TOLLGATE_GRPC_REQUEST_BYTES", default_value = "64MiB", value_parser = bytes, value_name = "BYTES")]
    pub grpc_request_bytes: usize,
    /// gRPC connections open at once (TLS handshakes included); one accepted past it is closed
    /// at once, counted in `tollgate_grpc_connections_refused_total` and logged at most once a
    /// second.
    #[arg(long, env = "TOLLGATE_GRPC_MAX_CONNECTIONS", default_value_t = 1024, value_parser = crate::arg_values::positive::<usize>, value_name = "N")]
    pub grpc_max_connections: usize,
}

impl GrpcLimitArgs {
    /// The listener's HTTP/2 settings, with the keepalive flags'.
    pub fn limits(&self, keepalive: Duration, keepalive_timeout: Duration) -> GrpcLimits {
        GrpcLimits {
            keepalive,
            keepalive_timeout,
            max_streams: self.grpc_max_concurrent_streams,
            stream_window: self.grpc_stream_window,
            connection_window: self.grpc_connection_window,
            ..GrpcLimits::default()
        }
    }

    /// The budgets of request bytes.
    pub fn request_bytes(&self) -> RequestBytes {
        RequestBytes::new(
            self.grpc_connection_request_bytes,
            self.grpc_request_bytes,
            tollgate_server::grpc::MAX_MESSAGE,
        )
    }
}

/// A number of bytes, `1048576` or with a unit: `64KiB`, `4MiB`, `1GiB` (powers of 1024; `KB`,
/// `MB`, `GB` are powers of 1000), at least 1.
pub(crate) fn bytes(s: &str) -> Result<usize, String> {
    let text = s.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}` (use B, KiB, MiB, GiB, KB, MB or GB)"
            ));
        }
    };
    let parsed = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .and_then(|n| usize::try_from(n).ok());
    match parsed {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "`{s}` is not a size such as 65536, 64KiB or 4MiB, at least 1 byte"
        )),
    }
}

/// An HTTP/2 flow-control window: from 65535 bytes (the protocol's initial window) to 2^31 - 1.
fn window(s: &str) -> Result<u32, String> {
    let n = bytes(s)? as u64;
    if !(65_535..=MAX_WINDOW).contains(&n) {
        return Err(format!(
            "`{s}` is not a window HTTP/2 allows here: from 65535 bytes (64KiB - 1) to 2GiB - 1"
        ));
    }
    u32::try_from(n).map_err(|_| format!("`{s}` is more than 2GiB - 1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(bytes("65536"), Ok(65_536));
        assert_eq!(bytes("64KiB"), Ok(65_536));
        assert_eq!(bytes("4MiB"), Ok(4 << 20));
        assert_eq!(bytes("2 MB"), Ok(2_000_000));
        for bad in ["", "0", "4 parsecs", "-1", "MiB", "99999999999GiB"] {
            let error = bytes(bad).unwrap_err();
            assert!(error.contains(&format!("`{bad}`")), "{error}");
        }
    }

    #[test]
    fn the_byte_budgets_default_to_the_listeners_constants() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            limits: GrpcLimitArgs,
        }
        let flags = Flags::parse_from(["serve"]).limits;
        let defaults = tollgate_server::listen::GrpcLimits::default();
        assert_eq!(
            flags.limits(defaults.keepalive, defaults.keepalive_timeout),
            defaults
        );
        assert_eq!(
            (
                flags.grpc_connection_request_bytes,
                flags.grpc_request_bytes
            ),
            (
                tollgate_server::listen::CONNECTION_REQUEST_BYTES,
                tollgate_server::listen::REQUEST_BYTES
            )
        );
    }

    #[test]
    fn windows_stay_within_what_http2_allows() {
        assert_eq!(window("64KiB"), Ok(65_536));
        assert_eq!(window("65535"), Ok(65_535));
        assert!(window("16KiB").is_err());
        assert!(window("2GiB").is_err());
    }
}
