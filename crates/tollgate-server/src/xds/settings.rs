//! What the xDS client connects with, and the parsers of `serve`'s `--xds-*` values.

use std::path::PathBuf;
use std::time::Duration;

/// Why an xDS setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// `--config-source` is not `xds://HOST:PORT`.
    #[error("`{0}` is not a config source such as xds://HOST:PORT")]
    Source(String),
    /// A `k=v` list entry without its `=`.
    #[error("`{entry}` in {what} is not KEY=VALUE")]
    Pair {
        /// The entry.
        entry: String,
        /// `--xds-headers` or `--xds-node-metadata`.
        what: &'static str,
    },
    /// A header that gRPC metadata cannot carry.
    #[error("`{0}` cannot be sent as a gRPC header (lower-case ASCII names, visible ASCII values)")]
    Header(String),
    /// A client certificate without its key, or a key without its certificate.
    #[error("--xds-cert-file and --xds-key-file go together")]
    HalfIdentity,
    /// A CA or client certificate given without TLS.
    #[error("--xds-ca-file, --xds-cert-file and --xds-key-file need --xds-tls")]
    NeedsTls,
    /// A TLS file that cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    File {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The xDS client's settings.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// The management server's `HOST:PORT`.
    pub server: String,
    /// The node id the management server keys its snapshots by.
    pub node_id: String,
    /// The node's metadata, string values.
    pub node_metadata: Vec<(String, String)>,
    /// TLS to the management server; plaintext when `None`.
    pub tls: Option<XdsTls>,
    /// Extra headers sent on the stream.
    pub headers: Vec<(String, String)>,
    /// The first wait before reconnecting.
    pub backoff_initial: Duration,
    /// The longest wait before reconnecting.
    pub backoff_max: Duration,
}

/// TLS to the management server.
#[derive(Debug, Clone, Default)]
pub struct XdsTls {
    /// The CA that signed the server's certificate (the system's roots when `None`).
    pub ca: Option<PathBuf>,
    /// A client certificate and its key, for mTLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name the server's certificate must carry (the host of the URL when `None`).
    pub server_name: Option<String>,
}

/// The `HOST:PORT` of `xds://HOST:PORT`.
pub fn parse_source(source: &str) -> Result<String, SettingsError> {
    let bad = || SettingsError::Source(source.to_owned());
    let rest = source.strip_prefix("xds://").ok_or_else(bad)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(rest.to_owned())
}

/// `--xds-node-metadata`: `k=v,k2=v2`, split at each entry's first `=` as envoyproxy/ratelimit
/// does (which drops an entry without one; here it is an error).
pub fn parse_node_metadata(text: &str) -> Result<Vec<(String, String)>, SettingsError> {
    parse_pairs(text, "--xds-node-metadata", &['='])
}

/// `k=v,k2=v2`, each entry split at the first of `separators`; empty entries are skipped.
fn parse_pairs(
    text: &str,
    what: &'static str,
    separators: &[char],
) -> Result<Vec<(String, String)>, SettingsError> {
    let mut pairs = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let at = entry.find(separators).ok_or_else(|| SettingsError::Pair {
            entry: entry.to_owned(),
            what,
        })?;
        let (key, value) = (entry[..at].trim(), entry[at + 1..].trim());
        if key.is_empty() {
            return Err(SettingsError::Pair {
                entry: entry.to_owned(),
                what,
            });
        }
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

/// `--xds-headers`: `k=v,k2=v2` (or `k:v`, as envoyproxy/ratelimit's map variables are
/// written: a header name holds neither, so the first of them separates), pairs that gRPC
/// metadata can carry.
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let pairs = parse_pairs(text, "--xds-headers", &['=', ':'])?;
    for (key, value) in &pairs {
        let name = tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(
            key.to_ascii_lowercase().as_bytes(),
        );
        let value = tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(value);
        if name.is_err() || value.is_err() {
            return Err(SettingsError::Header(key.clone()));
        }
    }
    Ok(pairs)
}

/// The PEM texts of the TLS files, read now: at start to refuse a missing file, and at each
/// connection so that renewed certificates are used.
#[derive(Debug)]
pub(super) struct TlsFiles {
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl XdsTls {
    pub(super) fn read(&self) -> Result<TlsFiles, SettingsError> {
        let read = |what: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|source| SettingsError::File {
                what,
                path: path.clone(),
                source,
            })
        };
        let ca = self
            .ca
            .as_ref()
            .map(|ca| read("--xds-ca-file", ca))
            .transpose()?;
        let identity = match &self.identity {
            Some((cert, key)) => {
                Some((read("--xds-cert-file", cert)?, read("--xds-key-file", key)?))
            }
            None => None,
        };
        Ok(TlsFiles { ca, identity })
    }
}

impl XdsSettings {
    /// Reads the TLS files once, so that a start with a missing one fails at once.
    pub fn check(&self) -> Result<(), SettingsError> {
        if let Some(tls) = &self.tls {
            tls.read()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sources_are_xds_urls_with_a_port() {
        assert_eq!(
            parse_source("xds://cp.example:18000").unwrap(),
            "cp.example:18000"
        );
        assert_eq!(parse_source("xds://[::1]:18000/").unwrap(), "[::1]:18000");
        for bad in [
            "cp:18000",
            "http://cp:18000",
            "xds://cp",
            "xds://:1",
            "xds://cp:x",
            "xds://a/b:1",
        ] {
            assert!(parse_source(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pairs_take_equals_or_colons_and_name_a_bad_entry() {
        let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let pairs = parse_node_metadata("a=1, b=x:y=z ,,c=").unwrap();
        assert_eq!(pairs, owned(&[("a", "1"), ("b", "x:y=z"), ("c", "")]));
        let e = parse_node_metadata("a=1,b:2").unwrap_err().to_string();
        assert_eq!(e, "`b:2` in --xds-node-metadata is not KEY=VALUE");
        let pairs = parse_headers("x-a:1,x-b=2:3").unwrap();
        assert_eq!(pairs, owned(&[("x-a", "1"), ("x-b", "2:3")]));
        let e = parse_headers("a=1,oops").unwrap_err().to_string();
        assert_eq!(e, "`oops` in --xds-headers is not KEY=VALUE");
        assert!(parse_headers("bad name=1").is_err());
    }
}
