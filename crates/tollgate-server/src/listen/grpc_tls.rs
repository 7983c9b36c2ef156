//! TLS on the gRPC port: `serve --grpc-tls-cert/--grpc-tls-key`, with `--grpc-tls-client-ca`
//! for mutual TLS (what envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`,
//! `GRPC_SERVER_TLS_KEY` and `GRPC_CLIENT_TLS_CACERT` set).
//!
//! The handshake is ours (rustls through tokio-rustls, as tonic's own), so that the files can
//! be read again while serving: [`ServingTls::watch`] checks them every `--watch-interval` and
//! serves a changed, valid set to new connections (a renewed certificate needs no restart); a
//! set that does not load is logged and the one in use stays. A served certificate (or one of
//! its chain) that has expired, or is not valid yet, is logged at the start and when it comes
//! to pass: clients refuse it, and the server's log is where an operator looks first.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tollgate::clock::{Clock, SystemClock};
use tracing::{debug, info, warn};

use super::cert_validity::Validity;

/// One TLS file: where it is, and what messages call it (`serve` names it by its flag).
#[derive(Debug, Clone)]
pub struct TlsFile {
    /// Where the file is.
    pub path: PathBuf,
    /// What errors call it, e.g. `--grpc-tls-cert`.
    pub name: &'static str,
}

/// The files the gRPC port's TLS is read from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain served: the server's own certificate first, then intermediates.
    pub cert: TlsFile,
    /// PEM private key of `cert` (PKCS#8, RSA or EC), unencrypted.
    pub key: TlsFile,
    /// PEM CA certificate(s): when given, every client must present a certificate one of them
    /// signed (mutual TLS); others are refused during the handshake.
    pub client_ca: Option<TlsFile>,
}

/// Why TLS files do not load; each names the file as its [`TlsFile::name`] says.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("{name}: cannot read {}", path.display())]
    Read {
        name: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file holds no PEM block of the label wanted.
    #[error("{name}: {} holds no PEM `{label}` block", path.display())]
    NoBlock {
        name: &'static str,
        path: PathBuf,
        label: &'static str,
    },
    /// The key is encrypted.
    #[error(
        "{name}: {} is encrypted; give the key unencrypted (e.g. `openssl pkey -in KEY -out KEY.plain`)",
        path.display()
    )]
    Encrypted { name: &'static str, path: PathBuf },
    /// A PEM block does not decode.
    #[error("{name}: {}: {problem}", path.display())]
    Pem {
        name: &'static str,
        path: PathBuf,
        problem: tokio_rustls::rustls::pki_types::pem::Error,
    },
    /// The client CA certificates do not make a verifier.
    #[error("{name}: {}", path.display())]
    ClientCa {
        name: &'static str,
        path: PathBuf,
        source: VerifierBuilderError,
    },
    /// The key is not the first certificate's.
    #[error(
        "{cert} and {key} do not make a TLS identity (the key must be the first certificate's: the server's own, before any intermediate)"
    )]
    Identity {
        cert: &'static str,
        key: &'static str,
        source: tokio_rustls::rustls::Error,
    },
}

/// How long a client may take over the TLS handshake before its connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The files' contents: what a reload compares.
type Contents = Vec<Vec<u8>>;

/// What a load makes of the files: their contents, the settings, and the validity of the
/// served certificate when it could be read.
type Loaded = (Contents, Arc<ServerConfig>, Option<Validity>);

impl TlsFiles {
    /// `true` when clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.client_ca.is_some()
    }

    /// Reads the files and makes the server's TLS settings from them.
    fn load(&self) -> Result<Loaded, TlsError> {
        let (cert, key) = (&self.cert, &self.key);
        let chain_pem = read_pem(cert, "CERTIFICATE")?;
        let key_pem = read_pem(key, "PRIVATE KEY")?;
        if String::from_utf8_lossy(&key_pem).contains("ENCRYPTED") {
            return Err(TlsError::Encrypted {
                name: key.name,
                path: key.path.clone(),
            });
        }
        let chain = certificates(&chain_pem, cert)?;
        let validity = Validity::of_chain(chain.iter().map(|der| der.as_ref()));
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|problem| TlsError::Pem {
            name: key.name,
            path: key.path.clone(),
            problem,
        })?;
        let builder = ServerConfig::builder();
        let mut contents = vec![chain_pem, key_pem];
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let ca_pem = read_pem(ca, "CERTIFICATE")?;
                let mut roots = RootCertStore::empty();
                roots.add_parsable_certificates(certificates(&ca_pem, ca)?);
                contents.push(ca_pem);
                let verifier = WebPkiClientVerifier::builder(roots.into())
                    .build()
                    .map_err(|source| TlsError::ClientCa {
                        name: ca.name,
                        path: ca.path.clone(),
                        source,
                    })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config =
            builder
                .with_single_cert(chain, private)
                .map_err(|source| TlsError::Identity {
                    cert: cert.name,
                    key: key.name,
                    source,
                })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok((contents, Arc::new(config), validity))
    }
}

/// The certificates of the PEM text `pem`, read from `file`.
fn certificates(pem: &[u8], file: &TlsFile) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|problem| TlsError::Pem {
            name: file.name,
            path: file.path.clone(),
            problem,
        })
}

/// The contents of the PEM file `file`, which must hold a block whose label ends with `label`
/// (`CERTIFICATE`, `PRIVATE KEY`: PKCS#8, RSA or EC keys alike).
fn read_pem(file: &TlsFile, label: &'static str) -> Result<Vec<u8>, TlsError> {
    let pem = std::fs::read(&file.path).map_err(|source| TlsError::Read {
        name: file.name,
        path: file.path.clone(),
        source,
    })?;
    let text = String::from_utf8_lossy(&pem);
    let has_block = text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|found| found.ends_with(label))
    });
    if !has_block {
        return Err(TlsError::NoBlock {
            name: file.name,
            path: file.path.clone(),
            label,
        });
    }
    Ok(pem)
}

/// `error` and its sources, as `anyhow`'s `{:#}` writes them: `outer: inner: innermost`.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// The TLS settings the gRPC port serves, and the files they came from.
#[derive(Debug)]
pub struct ServingTls {
    files: TlsFiles,
    current: Mutex<Loaded>,
    clock: SystemClock,
}

impl ServingTls {
    /// The TLS `files` make. They are read and checked here, so a missing or malformed one
    /// stops the start, named.
    pub fn load(files: TlsFiles) -> Result<Arc<ServingTls>, TlsError> {
        let tls = ServingTls {
            current: Mutex::new(files.load()?),
            files,
            clock: SystemClock::new(),
        };
        if let Some(problem) = tls.certificate_problem() {
            tls.warn_certificate(&problem);
        }
        Ok(Arc::new(tls))
    }

    /// The files served.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn config(&self) -> Arc<ServerConfig> {
        self.current().1.clone()
    }

    /// Reads the files again; serves them to new connections when they changed and load.
    /// Returns whether they were taken, or why not.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let loaded = self.files.load()?;
        let mut current = self.current();
        if current.0 == loaded.0 {
            return Ok(false);
        }
        *current = loaded;
        Ok(true)
    }

    /// What is wrong with the served chain's validity now, if anything.
    fn certificate_problem(&self) -> Option<String> {
        let validity = self.current().2?;
        let now = self.clock.now().as_micros() / 1_000_000;
        validity.problem(i64::try_from(now).unwrap_or(i64::MAX))
    }

    fn warn_certificate(&self, problem: &str) {
        warn!(
            certificate = %self.files.cert.path.display(),
            "The gRPC TLS certificate chain served {problem}: clients that check it refuse the handshake until it is renewed"
        );
    }

    /// Checks the files every `every` until `stop`; a failure is logged when it first happens
    /// or its reason changes, not at every check.
    pub async fn watch(self: Arc<Self>, every: Duration, mut stop: watch::Receiver<bool>) {
        if every.is_zero() {
            return;
        }
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_failure = None;
        // Told at the start already (`serving`).
        let mut last_problem = self.certificate_problem();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            match self.reload() {
                Ok(true) => {
                    info!("gRPC TLS files changed: serving them to new connections");
                    last_failure = None;
                }
                Ok(false) => {
                    if last_failure.take().is_some() {
                        info!("gRPC TLS files load again, unchanged: still serving them");
                    }
                }
                Err(e) => {
                    let reason = with_sources(&e);
                    if last_failure.as_ref() != Some(&reason) {
                        warn!(error = %reason, "gRPC TLS files do not load; still serving the ones loaded before");
                        last_failure = Some(reason);
                    }
                }
            }
            let problem = self.certificate_problem();
            if problem != last_problem {
                match &problem {
                    Some(problem) => self.warn_certificate(problem),
                    None => info!("The gRPC TLS certificate chain served is valid now"),
                }
                last_problem = problem;
            }
        }
    }

    /// `accepted` connections after their TLS handshake, each within [`HANDSHAKE_TIMEOUT`] and
    /// all at once (a slow client delays no other); a failed handshake is dropped, logged at
    /// `debug`.
    pub fn handshakes<IO, S>(
        self: Arc<Self>,
        accepted: S,
    ) -> impl Stream<Item = std::io::Result<TlsStream<IO>>> + Send + 'static
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        S: Stream<Item = std::io::Result<IO>> + Send + 'static,
    {
        accepted
            .flat_map_unordered(None, move |accepted| {
                let acceptor = TlsAcceptor::from(self.config());
                futures_util::stream::once(async move {
                    let io = match accepted {
                        Ok(io) => io,
                        Err(e) => return Some(Err(e)),
                    };
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                        Ok(Ok(tls)) => Some(Ok(tls)),
                        Ok(Err(e)) => {
                            debug!(error = %e, "gRPC TLS handshake failed");
                            None
                        }
                        Err(_) => {
                            debug!("gRPC TLS handshake timed out");
                            None
                        }
                    }
                })
                .boxed()
            })
            .filter_map(std::future::ready)
    }
}
