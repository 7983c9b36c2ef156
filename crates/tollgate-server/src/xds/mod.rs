//! The xDS config source: envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW`, as Envoy Gateway
//! runs it. The limits arrive as [`proto::RateLimitConfig`] resources over the aggregated
//! discovery service (state of the world) from a management server, not from files.
//!
//! Each response is validated completely (every resource a policy source, all of them
//! compiling together and running on the store) and applied as one new policy version through
//! [`Lifecycle::apply_managed`], the same swap as a file reload (counters of unchanged rules
//! kept); then it is ACKed. An invalid response is NACKed as a whole, with the reason, and
//! the running policy stays. A stream that fails is opened again after a backoff with jitter;
//! meanwhile the last accepted policy stays in force.
//!
//! - [`proto`]: the resource's messages.
//! - `convert`: a resource as a policy source.
//! - `client`: one ADS stream, its ACKs and NACKs.
//! - `backoff`: the waits between streams.
//! - [`settings`]: what the client connects with, and the parsers of `serve`'s flags.

mod backoff;
mod client;
mod convert;
pub mod proto;
pub mod settings;

use std::sync::Arc;

use tokio::sync::watch;
use tollgate::lifecycle::Lifecycle;
use tollgate::service::stopped;
use tracing::warn;

pub use convert::{ResourceError, policy_source};
pub use settings::{SettingsError, XdsSettings, XdsTls};

use self::backoff::Backoff;
use self::client::Accepted;

/// The name the life cycle gives its writer, in the admin API's refusals and `/readyz`.
pub const SOURCE: &str = "xDS";

/// Keeps a stream to the management server open, until `stop` says stop: each response
/// becomes the running policy (ACK) or is refused with its reason (NACK); a stream that fails
/// is opened again after a wait (see [`XdsSettings::backoff_initial`]).
pub async fn subscribe(
    lifecycle: Arc<Lifecycle>,
    settings: Arc<XdsSettings>,
    stop: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(settings.backoff_initial, settings.backoff_max);
    let mut accepted = Accepted::default();
    loop {
        let mut responded = false;
        let ended = tokio::select! {
            e = client::stream(&lifecycle, &settings, &mut accepted, &mut responded) => e,
            _ = stopped(stop.clone()) => return,
        };
        if responded {
            backoff.reset();
        }
        let wait = backoff.next_wait();
        let waiting = if lifecycle.awaiting_first_push() {
            "no configuration received yet: the empty policy allows every request"
        } else {
            "the last accepted policy stays in force"
        };
        warn!(
            server = %settings.server,
            error = %ended,
            retry_in = %humantime::format_duration(wait),
            "xDS: no stream to the management server; {waiting}"
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped(stop.clone()) => return,
        }
    }
}
