//! The tower middleware: decide, then forward or answer `429`/`503`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use tollgate::limiter::{CheckRequest, MAX_COST, headers};

use crate::backend::{Backend, BackendError, Outcome, Verdict};
use crate::describe::Describe;

/// A [`Layer`] that rate-limits every request through a [`Backend`].
///
/// Allowed requests reach the inner service and their response gets the rate-limit headers
/// (`X-RateLimit-*`, `RateLimit-Policy`, `RateLimit`, and `X-Tollgate-Soft-Exceeded` /
/// `X-Tollgate-Degraded` when set). A request denied by a limit is answered `429` with
/// `Retry-After` and an `application/problem+json` body; one denied because the limiter is
/// unavailable is answered `503`. The inner service is not called for either.
///
/// With [`RateLimitLayer::charge_after_response`], a request is only checked before it is
/// served, and charged the [`Cost`] its response reports.
pub struct RateLimitLayer<K, D> {
    backend: Arc<K>,
    describe: Arc<D>,
    after_response: bool,
}

/// What a response cost, in the units of the rate limits it was checked against (the tokens
/// an LLM call used, say): put it in the response's extensions for a layer built with
/// [`RateLimitLayer::charge_after_response`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost(pub u64);

impl<K, D> RateLimitLayer<K, D> {
    /// Checks requests described by `describe` against `backend`.
    pub fn new(backend: K, describe: D) -> Self {
        RateLimitLayer {
            backend: Arc::new(backend),
            describe: Arc::new(describe),
            after_response: false,
        }
    }

    /// Charges what a response cost once it is known, instead of the request's cost before it
    /// is served: a request is checked without counting (it passes while its limits have a
    /// unit left), and the [`Cost`] the inner service puts in its response's extensions is then
    /// charged to the same descriptors, before the response is returned so that the caller's
    /// next request sees it; the response's rate-limit headers tell the quota left after it.
    /// The cost must be known when the inner service returns the response (its head): a body
    /// streamed after that cannot report one. A response without a `Cost` charges nothing.
    /// Give the policy's rules `charge: up_to_limit`, so that a cost larger than what is left
    /// still uses it up.
    pub fn charge_after_response(self) -> Self {
        RateLimitLayer {
            after_response: true,
            ..self
        }
    }
}

impl<K, D> Clone for RateLimitLayer<K, D> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            backend: self.backend.clone(),
            describe: self.describe.clone(),
            after_response: self.after_response,
        }
    }
}

impl<K, D> fmt::Debug for RateLimitLayer<K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl<S, K, D> Layer<S> for RateLimitLayer<K, D> {
    type Service = RateLimit<S, K, D>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            backend: self.backend.clone(),
            describe: self.describe.clone(),
            after_response: self.after_response,
        }
    }
}

/// The service made by [`RateLimitLayer`].
pub struct RateLimit<S, K, D> {
    inner: S,
    backend: Arc<K>,
    describe: Arc<D>,
    after_response: bool,
}

impl<S: Clone, K, D> Clone for RateLimit<S, K, D> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            backend: self.backend.clone(),
            describe: self.describe.clone(),
            after_response: self.after_response,
        }
    }
}

impl<S, K, D> fmt::Debug for RateLimit<S, K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, K, D, B, ResB> Service<Request<B>> for RateLimit<S, K, D>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    K: Backend,
    D: Describe<B>,
    B: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResB>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was not polled ready stays here; the ready one serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let check = self.describe.describe(&request);
        let backend = self.backend.clone();
        let after_response = self.after_response;
        Box::pin(async move {
            let Some(check) = check else {
                return inner.call(request).await;
            };
            let first = if after_response {
                check.with_cost(0)
            } else {
                Ok(check.clone())
            };
            let verdict = match first {
                Ok(first) => backend.check(&first).await,
                Err(e) => Err(BackendError::Invalid(e.to_string())),
            };
            let verdict = match verdict {
                Ok(verdict) => verdict,
                Err(_) => {
                    // Details stay on the server side: the caller learns only that it failed.
                    return Ok(problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the rate limit check failed".to_owned(),
                        &[],
                    ));
                }
            };
            match verdict.outcome {
                Outcome::Allowed => {
                    let mut response = inner.call(request).await?;
                    let charged = match after_response {
                        true => charge_cost(backend, check, response.extensions()).await,
                        false => None,
                    };
                    let headers = &charged.as_ref().unwrap_or(&verdict).headers;
                    add_headers(response.headers_mut(), headers);
                    Ok(response)
                }
                Outcome::Limited => Ok(problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    detail(&verdict),
                    &verdict.headers,
                )),
                Outcome::Unavailable => Ok(problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the rate limiter is unavailable".to_owned(),
                    &verdict.headers,
                )),
            }
        })
    }
}

/// Charges `check`'s descriptors the [`Cost`] in `extensions`, if any (a cost above
/// [`MAX_COST`] as that much). Returns the charge's verdict when it was admitted: its headers
/// tell the quota left after it. The charge runs as a task of its own, so that it is made even
/// if the caller goes away (a client reset, an outer timeout) once the response is made.
///
/// A charge is all or nothing for the descriptors of one check, so one descriptor that cannot
/// hold the cost (a request limit below it) would leave the others, a `charge: up_to_limit`
/// budget among them, charged nothing. When the whole charge is refused, each descriptor is
/// charged on its own, what it can; those that still refuse are counted in
/// [`refused_charges`] and logged.
async fn charge_cost<K: Backend>(
    backend: Arc<K>,
    check: CheckRequest,
    extensions: &http::Extensions,
) -> Option<Verdict> {
    let &Cost(cost) = extensions.get::<Cost>().filter(|c| c.0 > 0)?;
    let charge = check.with_cost(cost.min(MAX_COST)).ok()?;
    let charged = tokio::spawn(async move {
        let whole = backend.check(&charge).await.ok()?;
        if whole.allowed() || whole.outcome != Outcome::Limited || charge.descriptors().len() < 2 {
            if whole.outcome == Outcome::Limited {
                refused(&charge, 1, cost);
            }
            return Some(whole);
        }
        let mut last_allowed = None;
        let mut refused_here = 0;
        for descriptor in charge.descriptors() {
            let one = CheckRequest::new(charge.domain().to_owned(), vec![descriptor.clone()]);
            let Ok(one) = one else { continue };
            match backend.check(&one).await {
                Ok(verdict) if verdict.allowed() => last_allowed = Some(verdict),
                _ => refused_here += 1,
            }
        }
        if refused_here > 0 {
            refused(&charge, refused_here, cost);
        }
        last_allowed
    });
    charged.await.ok()?.filter(Verdict::allowed)
}

/// Descriptors charged after the response that refused their charge, since the process
/// started; see [`refused_charges`].
static REFUSED_CHARGES: AtomicU64 = AtomicU64::new(0);

/// How many descriptors refused a cost reported after the response (see
/// [`RateLimitLayer::charge_after_response`]) since the process started: a cost above what a
/// rule without `charge: up_to_limit` has left. Each is logged too.
pub fn refused_charges() -> u64 {
    REFUSED_CHARGES.load(Ordering::Relaxed)
}

fn refused(charge: &CheckRequest, descriptors: u64, cost: u64) {
    REFUSED_CHARGES.fetch_add(descriptors, Ordering::Relaxed);
    tracing::warn!(
        domain = charge.domain(),
        descriptors,
        cost,
        "A cost reported after the response was refused by a limit that cannot hold it (give the rule `charge: up_to_limit`); the other descriptors were charged"
    );
}

fn detail(verdict: &Verdict) -> String {
    match &verdict.limit_name {
        Some(name) => format!("rate limit `{name}` exceeded"),
        None => "rate limit exceeded".to_owned(),
    }
}

/// tollgate's own header names, built once: `HeaderName::try_from` copies a non-standard name
/// on every call.
static KNOWN_NAMES: [HeaderName; 8] = [
    HeaderName::from_static(headers::DEGRADED),
    HeaderName::from_static(headers::SOFT_EXCEEDED),
    HeaderName::from_static(headers::LIMIT),
    HeaderName::from_static(headers::REMAINING),
    HeaderName::from_static(headers::RESET),
    HeaderName::from_static(headers::POLICY),
    HeaderName::from_static(headers::RATELIMIT),
    HeaderName::from_static(headers::RETRY_AFTER),
];

fn add_headers(map: &mut http::HeaderMap, headers: &[(&'static str, String)]) {
    for (name, value) in headers {
        let name = KNOWN_NAMES
            .iter()
            .find(|known| known.as_str() == *name)
            .cloned()
            .or_else(|| HeaderName::try_from(*name).ok());
        if let (Some(name), Ok(value)) = (name, HeaderValue::from_str(value)) {
            map.insert(name, value);
        }
    }
}

/// An RFC 9457 problem response.
fn problem<ResB: From<String>>(
    status: StatusCode,
    detail: String,
    headers: &[(&'static str, String)],
) -> Response<ResB> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(ResB::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    add_headers(response.headers_mut(), headers);
    response
}
