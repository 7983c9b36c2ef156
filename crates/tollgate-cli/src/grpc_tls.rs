//! `serve`'s gRPC TLS flags: `--grpc-tls-cert/--grpc-tls-key`, with `--grpc-tls-client-ca` for
//! mutual TLS. What they serve, and how the files are watched, is
//! [`tollgate_server::listen::ServingTls`]'s.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tollgate_server::listen::{ServingTls, TlsFile, TlsFiles};

#[derive(Debug, Clone, Args)]
pub struct GrpcTlsArgs {
    /// PEM certificate chain served on the gRPC port (with `--grpc-tls-key`); without it gRPC
    /// is plaintext. The files are checked every `--watch-interval`: a renewed certificate is
    /// served to new connections without a restart.
    #[arg(
        long,
        env = "TOLLGATE_GRPC_TLS_CERT",
        value_name = "PATH",
        requires = "grpc_tls_key"
    )]
    grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of `--grpc-tls-cert`.
    #[arg(
        long,
        env = "TOLLGATE_GRPC_TLS_KEY",
        value_name = "PATH",
        requires = "grpc_tls_cert"
    )]
    grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): every gRPC client must present a certificate one of them signed
    /// (mutual TLS); others are refused during the handshake.
    #[arg(
        long,
        env = "TOLLGATE_GRPC_TLS_CLIENT_CA",
        value_name = "PATH",
        requires = "grpc_tls_cert"
    )]
    grpc_tls_client_ca: Option<PathBuf>,
}

impl GrpcTlsArgs {
    /// The TLS the gRPC port serves, or `None` for plaintext. The files are read and checked
    /// here, so a missing or malformed one stops the start with its flag and path.
    pub fn serving(&self) -> anyhow::Result<Option<Arc<ServingTls>>> {
        let Some(files) = self.files()? else {
            return Ok(None);
        };
        Ok(Some(ServingTls::load(files)?))
    }

    /// `true` when clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.grpc_tls_client_ca.is_some()
    }

    /// The files given, each named by its flag; `None` without `--grpc-tls-cert`.
    fn files(&self) -> anyhow::Result<Option<TlsFiles>> {
        let file = |path: &PathBuf, name| TlsFile {
            path: path.clone(),
            name,
        };
        match (&self.grpc_tls_cert, &self.grpc_tls_key) {
            (None, _) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert: file(cert, "--grpc-tls-cert"),
                key: file(key, "--grpc-tls-key"),
                client_ca: self
                    .grpc_tls_client_ca
                    .as_ref()
                    .map(|ca| file(ca, "--grpc-tls-client-ca")),
            })),
            (Some(_), None) => anyhow::bail!("--grpc-tls-cert and --grpc-tls-key go together"),
        }
    }
}
