//! `serve`'s xDS flags: `--config-source xds://HOST:PORT` and the `--xds-*` settings of the
//! client (see [`tollgate_server::xds`]), each with its `TOLLGATE_*` variable. Without
//! `--config-source` the `--xds-*` settings are not used (so a Deployment setting the variables
//! of both sources starts with the files).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tollgate_server::xds::settings::{
    SettingsError, parse_headers, parse_node_metadata, parse_source,
};
use tollgate_server::xds::{XdsSettings, XdsTls};

#[derive(Debug, Clone, Args)]
pub struct XdsArgs {
    /// Where the policy comes from instead of `--config`: `xds://HOST:PORT`, an xDS management
    /// server (Envoy Gateway) sending `RateLimitConfig` resources over ADS (state of the world).
    /// It is then the only writer of the policy: admin pushes, rollbacks and candidates answer
    /// 409, and the file watcher and the Redis policy sync are off.
    #[arg(long, value_name = "xds://HOST:PORT", env = "TOLLGATE_CONFIG_SOURCE", value_parser = parse_source)]
    pub config_source: Option<String>,
    /// The node id this replica subscribes as (the management server keys its snapshots by it).
    #[arg(
        long,
        default_value = "default",
        value_name = "ID",
        env = "TOLLGATE_XDS_NODE_ID"
    )]
    xds_node_id: String,
    /// The node's metadata, `key=value` pairs separated by commas (string values).
    #[arg(long, value_name = "K=V,...", env = "TOLLGATE_XDS_NODE_METADATA")]
    xds_node_metadata: Option<String>,
    /// Connect to the management server over TLS (the system's roots verify it, or
    /// `--xds-ca-file`).
    #[arg(long, env = "TOLLGATE_XDS_TLS")]
    xds_tls: bool,
    /// PEM CA certificate(s) that verify the management server's certificate.
    #[arg(long, value_name = "PATH", env = "TOLLGATE_XDS_CA_FILE")]
    xds_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to the management server (mTLS; with `--xds-key-file`).
    #[arg(long, value_name = "PATH", env = "TOLLGATE_XDS_CERT_FILE")]
    xds_cert_file: Option<PathBuf>,
    /// PEM private key of `--xds-cert-file`.
    #[arg(long, value_name = "PATH", env = "TOLLGATE_XDS_KEY_FILE")]
    xds_key_file: Option<PathBuf>,
    /// The name the management server's certificate must carry (a DNS name or IP address in
    /// its subjectAltName), when not the host of `--config-source`.
    #[arg(long, value_name = "NAME", env = "TOLLGATE_XDS_SERVER_NAME")]
    xds_server_name: Option<String>,
    /// Extra headers sent on the stream, `name=value` pairs separated by commas (`name:value`
    /// is read too).
    #[arg(
        long,
        value_name = "K=V,...",
        env = "TOLLGATE_XDS_HEADERS",
        hide_env_values = true
    )]
    xds_headers: Option<String>,
    /// The first wait before connecting again after a stream to the management server failed;
    /// each further wait doubles, up to `--xds-backoff-max`, each a random time between half
    /// and all of it.
    #[arg(long, default_value = "10s", value_parser = crate::arg_values::humantime_duration, value_name = "DURATION", env = "TOLLGATE_XDS_BACKOFF_INITIAL")]
    xds_backoff_initial: Duration,
    /// The longest wait before connecting again.
    #[arg(long, default_value = "60s", value_parser = crate::arg_values::humantime_duration, value_name = "DURATION", env = "TOLLGATE_XDS_BACKOFF_MAX")]
    xds_backoff_max: Duration,
    /// With `--config-source`: serve at once, with the empty policy (every request allowed,
    /// `/readyz` saying so) until the first configuration arrives, instead of waiting for it
    /// before listening.
    #[arg(long, env = "TOLLGATE_FORCE_START_WITHOUT_INITIAL_CONFIG")]
    pub force_start_without_initial_config: bool,
}

impl XdsArgs {
    /// The client's settings, `None` without `--config-source`; the TLS files are read once
    /// here, so a missing one stops the start.
    pub fn settings(&self) -> Result<Option<XdsSettings>, SettingsError> {
        let Some(server) = self.config_source.clone() else {
            return Ok(None);
        };
        let identity = match (&self.xds_cert_file, &self.xds_key_file) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err(SettingsError::HalfIdentity),
        };
        let tls_files = self.xds_ca_file.is_some() || identity.is_some();
        if tls_files && !self.xds_tls {
            return Err(SettingsError::NeedsTls);
        }
        let tls = self.xds_tls.then(|| XdsTls {
            ca: self.xds_ca_file.clone(),
            identity,
            server_name: self.xds_server_name.clone(),
        });
        let settings = XdsSettings {
            server,
            node_id: self.xds_node_id.clone(),
            node_metadata: parse_node_metadata(self.xds_node_metadata.as_deref().unwrap_or(""))?,
            tls,
            headers: parse_headers(self.xds_headers.as_deref().unwrap_or(""))?,
            backoff_initial: self.xds_backoff_initial,
            backoff_max: self.xds_backoff_max.max(self.xds_backoff_initial),
        };
        settings.check()?;
        Ok(Some(settings))
    }
}
