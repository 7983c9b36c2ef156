//! The HTTP listener (`serve`'s API and admin API, `bench-server`'s API): hyper, with the
//! read deadline axum's `serve` does not set (see [`super::idle_deadline`]). Without it a
//! client that sent half a request held its socket, and a task, for as long as it liked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tower::ServiceExt;
use tracing::{debug, error, warn};

use super::drain::Open;
use super::idle_deadline::{IdleDeadline, Progress};
use super::stop::stopped;
use crate::http::body_too_slow;

/// Whether a listener's requests carry their client's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// Not given: the decision API never reads it, and each of its requests would pay for
    /// putting it in (a map made for the extension).
    Omitted,
    /// As axum's [`ConnectInfo<SocketAddr>`] in each request's extensions: the admin API's
    /// audit lines say who made each change.
    Given,
}

/// Serves `router` on `listener` until `stop` says stop, then waits for the requests in flight
/// (the caller bounds that wait) while idle connections close. `open` counts the connections
/// and the requests in flight meanwhile.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    peer: Peer,
    read_timeout: Duration,
    stop: watch::Receiver<bool>,
    open: Open,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    // Every connection's task holds a clone; `recv` answers `None` once all have ended.
    let (tracked, mut all_closed) = mpsc::channel::<()>(1);
    let mut stopped_listening = pin!(stopped(stop.clone()));
    loop {
        let (stream, client) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut stopped_listening => break,
        };
        // An answer written in several segments must not wait on Nagle's algorithm.
        if let Err(e) = stream.set_nodelay(true) {
            warn!(error = %e, "Could not set TCP_NODELAY on an HTTP connection");
        }
        let progress = Progress::new();
        let io = TokioIo::new(IdleDeadline::new(stream, progress.clone(), read_timeout));
        let service = Marking {
            router: router.clone(),
            progress: progress.clone(),
            limit: read_timeout,
            client: (peer == Peer::Given).then_some(ConnectInfo(client)),
        };
        let connection = builder.serve_connection(io, service).into_owned();
        let (tracked, stop) = (tracked.clone(), stop.clone());
        let counted = (open.connections.hold(), open.requests.track(&progress));
        tokio::spawn(async move {
            let _tracked = (tracked, counted);
            if let Err(e) = close_gracefully(connection, progress, stop).await {
                debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    // Every connection's task has seen `stop` too: those with no request in flight close
    // within `STOPPING_GRACE` (see `IdleDeadline`); requests in flight finish, within the
    // caller's bound.
    drop(tracked);
    let _ = all_closed.recv().await;
}

/// Drives `connection` until it ends, and closes it gracefully once the listener stops or it
/// has been idle past its read deadline: an HTTP/2 client gets a GOAWAY (which tells it that
/// no request of its was left unprocessed) rather than a bare close, and an HTTP/1 connection
/// ends after the answer in flight. `IdleDeadline` bounds how long that takes.
async fn close_gracefully<C>(
    connection: C,
    progress: Progress,
    stop: watch::Receiver<bool>,
) -> Result<(), C::Error>
where
    C: GracefulConnection,
{
    let mut connection = pin!(connection);
    tokio::select! {
        biased;
        ended = connection.as_mut() => return ended,
        () = stopped(stop) => progress.stop(),
        () = progress.idle_expired() => {}
    }
    connection.as_mut().graceful_shutdown();
    connection.await
}

/// A failed `accept`: a connection reset before it was taken is nothing; anything else (out of
/// file descriptors, mostly) is logged and waited out for a second rather than spun on.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    error!(error = %e, "Could not accept an HTTP connection; trying again in 1s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The router, marking a connection's progress when a request's headers are in and when its
/// answer is ready. Over HTTP/2 a stream's body and answer are also due within `limit` of its
/// headers (`408` otherwise): the connection's deadline cannot see one stalled stream among
/// busy ones.
#[derive(Clone)]
struct Marking {
    router: Router,
    progress: Progress,
    limit: Duration,
    /// The connection's client, put into each request when the listener gives it ([`Peer`]).
    client: Option<ConnectInfo<SocketAddr>>,
}

impl hyper::service::Service<axum::http::Request<Incoming>> for Marking {
    type Response = Response;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, Infallible>> + Send + 'static>,
    >;

    fn call(&self, request: axum::http::Request<Incoming>) -> Self::Future {
        let in_flight = self.progress.request();
        let multiplexed = request.version() == axum::http::Version::HTTP_2;
        let mut request = request.map(Body::new);
        if let Some(client) = self.client {
            request.extensions_mut().insert(client);
        }
        let answer = self.router.clone().oneshot(request);
        let limit = self.limit;
        Box::pin(async move {
            let answer = if multiplexed {
                tokio::time::timeout(limit, answer)
                    .await
                    .unwrap_or_else(|_| Ok(body_too_slow(axum::http::Version::HTTP_2)))
            } else {
                answer.await
            };
            drop(in_flight);
            answer
        })
    }
}
