//! TLS on the gRPC port: `serve --grpc-tls-cert/--grpc-tls-key`, with `--grpc-tls-client-ca`
//! for mutual TLS (what envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`,
//! `GRPC_SERVER_TLS_KEY` and `GRPC_CLIENT_TLS_CACERT` set).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

#[derive(Debug, Clone, Args)]
pub struct GrpcTlsArgs {
    /// PEM certificate chain served on the gRPC port (with `--grpc-tls-key`); without it gRPC
    /// is plaintext. Read at startup: restart to serve a renewed certificate.
    #[arg(long, value_name = "PATH", requires = "grpc_tls_key")]
    grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of `--grpc-tls-cert`.
    #[arg(long, value_name = "PATH", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): every gRPC client must present a certificate one of them signed
    /// (mutual TLS); others are refused during the handshake.
    #[arg(long, value_name = "PATH", requires = "grpc_tls_cert")]
    grpc_tls_client_ca: Option<PathBuf>,
}

/// How long a client may take over the TLS handshake before its connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

impl GrpcTlsArgs {
    /// The server's TLS settings, or `None` for plaintext. The files are read and checked here,
    /// so a missing or malformed one stops the start with its path.
    pub fn server_config(&self) -> anyhow::Result<Option<ServerTlsConfig>> {
        let (Some(cert), Some(key)) = (&self.grpc_tls_cert, &self.grpc_tls_key) else {
            return Ok(None);
        };
        let chain = read_pem(cert, "CERTIFICATE", "--grpc-tls-cert")?;
        let key_pem = read_pem(key, "PRIVATE KEY", "--grpc-tls-key")?;
        if String::from_utf8_lossy(&key_pem).contains("ENCRYPTED") {
            anyhow::bail!(
                "--grpc-tls-key: {} is encrypted; give the key unencrypted (e.g. `openssl pkey -in KEY -out KEY.plain`)",
                key.display()
            );
        }
        let key = key_pem;
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(chain, key))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.grpc_tls_client_ca {
            let ca = read_pem(ca, "CERTIFICATE", "--grpc-tls-client-ca")?;
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        Ok(Some(config))
    }

    /// `true` when clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.grpc_tls_client_ca.is_some()
    }
}

/// The contents of the PEM file at `path` given with `flag`, which must hold a block whose
/// label ends with `label` (`CERTIFICATE`, `PRIVATE KEY`: PKCS#8, RSA or EC keys alike).
fn read_pem(path: &Path, label: &str, flag: &str) -> anyhow::Result<Vec<u8>> {
    let pem =
        std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))?;
    let text = String::from_utf8_lossy(&pem);
    let has_block = text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|found| found.ends_with(label))
    });
    if !has_block {
        anyhow::bail!("{flag}: {} holds no PEM `{label}` block", path.display());
    }
    Ok(pem)
}
