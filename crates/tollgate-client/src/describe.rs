//! Turning an HTTP request into the [`CheckRequest`] to decide.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use http::Request;
use tollgate::limiter::headers::descriptor_value;
use tollgate::limiter::{
    CheckRequest, MAX_DESCRIPTORS, MAX_FIELD_LEN, RequestDescriptor, normalized_path,
};

/// Derives the rate-limit request for an HTTP request; `None` lets it through unchecked.
///
/// Implemented by every `Fn(&http::Request<B>) -> Option<CheckRequest>` closure and by
/// [`Descriptors`].
pub trait Describe<B>: Send + Sync + 'static {
    /// The check for `request`, or `None` to skip rate limiting it.
    fn describe(&self, request: &Request<B>) -> Option<CheckRequest>;
}

impl<B, F> Describe<B> for F
where
    F: Fn(&Request<B>) -> Option<CheckRequest> + Send + Sync + 'static,
{
    fn describe(&self, request: &Request<B>) -> Option<CheckRequest> {
        self(request)
    }
}

#[derive(Debug, Clone)]
enum Source {
    Header(http::HeaderName),
    ClientIp,
    Path,
    Method,
    User,
}

/// The authenticated user of a request, as an authentication layer in front of the rate
/// limit puts it in the request's extensions; read by [`Descriptors::user`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedUser(pub String);

/// A declarative [`Describe`] for common cases: each source becomes its own one-entry
/// descriptor `key=value` (so each is limited independently by the policy rule of that
/// key); a source absent from the request (missing or empty header, unknown peer) is left out,
/// and a request with no source present is not checked.
///
/// Every value present is limited, whatever it holds: a header value that is not visible ASCII
/// is read lossily, and a value of any length is checked (over [`MAX_FIELD_LEN`] bytes, its
/// counter key holds a digest of it), so no value can slip past its limit by being unusable.
///
/// ```
/// # use tollgate_client::Descriptors;
/// let describe = Descriptors::new("api")
///     .header("x-api-key", "api_key")
///     .client_ip("remote_address")
///     .path("path");
/// # let _ = describe;
/// ```
#[derive(Debug, Clone)]
pub struct Descriptors {
    domain: String,
    sources: Vec<(Source, String)>,
}

/// The builder methods panic on a name no check could carry (they are written once, at
/// startup): a layer built from them would otherwise let every request through unchecked.
impl Descriptors {
    /// Descriptors in the policy domain `domain`.
    ///
    /// # Panics
    /// When `domain` is empty or longer than [`MAX_FIELD_LEN`] bytes.
    pub fn new(domain: impl Into<String>) -> Self {
        Descriptors {
            domain: field("domain", domain.into()),
            sources: Vec::new(),
        }
    }

    /// The value of header `name` as descriptor key `key`.
    ///
    /// # Panics
    /// When `name` is not a valid header name, or `key` is empty or longer than
    /// [`MAX_FIELD_LEN`] bytes.
    #[allow(clippy::panic)] // see the impl's documentation
    pub fn header(self, name: &str, key: impl Into<String>) -> Self {
        match http::HeaderName::try_from(name) {
            Ok(name) => self.source(Source::Header(name), key.into()),
            Err(_) => panic!("tollgate: `{name}` is not a valid header name"),
        }
    }

    /// The peer's IP address (from axum's `ConnectInfo<SocketAddr>`, so serve with
    /// `into_make_service_with_connect_info`) as descriptor key `key`.
    ///
    /// # Panics
    /// When `key` is empty or longer than [`MAX_FIELD_LEN`] bytes, or when this would be source
    /// number [`MAX_DESCRIPTORS`] + 1; the same for each source.
    pub fn client_ip(self, key: impl Into<String>) -> Self {
        self.source(Source::ClientIp, key.into())
    }

    /// The request path as descriptor key `key`, normalized as the service's forward auth
    /// does (`//login`, `/%6cogin` and `/./login` are `/login`; see
    /// [`tollgate::limiter::normalized_path`]). Under axum's `Router::nest` it
    /// is the path the nested router sees, without the prefix.
    pub fn path(self, key: impl Into<String>) -> Self {
        self.source(Source::Path, key.into())
    }

    /// The request method (`GET`, `POST`...) as descriptor key `key`.
    pub fn method(self, key: impl Into<String>) -> Self {
        self.source(Source::Method, key.into())
    }

    /// The [`AuthenticatedUser`] extension, when present, as descriptor key `key`.
    pub fn user(self, key: impl Into<String>) -> Self {
        self.source(Source::User, key.into())
    }

    #[allow(clippy::panic)] // see the impl's documentation
    fn source(mut self, source: Source, key: String) -> Self {
        if self.sources.len() == MAX_DESCRIPTORS {
            panic!("tollgate: at most {MAX_DESCRIPTORS} sources, one descriptor each");
        }
        self.sources.push((source, field("descriptor key", key)));
        self
    }
}

/// `value`, checked to be a domain or key every check accepts.
#[allow(clippy::panic)] // see `impl Descriptors`
fn field(what: &str, value: String) -> String {
    if value.is_empty() || value.len() > MAX_FIELD_LEN {
        panic!(
            "tollgate: a {what} must be 1 to {MAX_FIELD_LEN} bytes, not {} (`{}`)",
            value.len(),
            value.chars().take(40).collect::<String>()
        );
    }
    value
}

impl<B> Describe<B> for Descriptors {
    fn describe(&self, request: &Request<B>) -> Option<CheckRequest> {
        let descriptors: Vec<RequestDescriptor> = self
            .sources
            .iter()
            .filter_map(|(source, key)| {
                let value = match source {
                    Source::Header(name) => {
                        descriptor_value(request.headers().get(name).map(|v| v.as_bytes()))
                    }
                    Source::ClientIp => request
                        .extensions()
                        .get::<ConnectInfo<SocketAddr>>()
                        .map(|c| c.0)
                        .or_else(|| request.extensions().get::<SocketAddr>().copied())
                        // `::ffff:10.0.0.5` from a dual-stack listener is the IPv4 client
                        // `10.0.0.5`, as the service and nginx name it.
                        .map(|addr| addr.ip().to_canonical().to_string()),
                    Source::Path => Some(normalized_path(request.uri().path())),
                    Source::Method => Some(request.method().as_str().to_owned()),
                    Source::User => request
                        .extensions()
                        .get::<AuthenticatedUser>()
                        .map(|u| u.0.clone()),
                }?;
                RequestDescriptor::new(vec![(key.clone(), value)], 1, None).ok()
            })
            .collect();
        if descriptors.is_empty() {
            return None;
        }
        CheckRequest::new(self.domain.clone(), descriptors).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_and_authenticated_user_become_descriptors() {
        let describe = Descriptors::new("api").method("method").user("user");
        let mut request = Request::post("/x").body(()).unwrap();
        let only_method = describe.describe(&request).unwrap();
        assert_eq!(only_method.descriptors().len(), 1, "no user yet: left out");
        assert_eq!(
            only_method.descriptors()[0].entries()[0],
            ("method".into(), "POST".into())
        );
        request
            .extensions_mut()
            .insert(AuthenticatedUser("alice".into()));
        let both = describe.describe(&request).unwrap();
        assert_eq!(
            both.descriptors()[1].entries()[0],
            ("user".into(), "alice".into())
        );
    }

    /// The client IP of an IPv4 peer on a dual-stack listener (`::ffff:10.0.0.5`) is its IPv4
    /// address, and the path is normalized, both as the service names them: the same client
    /// and path get the same counter whichever way they reach it.
    #[test]
    fn client_ips_and_paths_are_named_as_the_service_names_them() {
        let describe = Descriptors::new("api").client_ip("ip").path("path");
        let mut request = Request::get("//a/./b/../%6cogin?x=1").body(()).unwrap();
        let peer: SocketAddr = "[::ffff:10.0.0.5]:4000".parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let described = describe.describe(&request).unwrap();
        let values: Vec<&str> = described
            .descriptors()
            .iter()
            .map(|d| d.entries()[0].1.as_str())
            .collect();
        assert_eq!(values, ["10.0.0.5", "/a/login"]);
    }

    /// A header value that is present is always limited: not visible ASCII, it is read
    /// lossily; however long, it is checked (the counter key digests it).
    #[test]
    fn unusable_header_values_are_still_limited() {
        let describe = Descriptors::new("api").header("x-api-key", "api_key");
        let value_of = |raw: &[u8]| {
            let request = Request::get("/")
                .header("x-api-key", http::HeaderValue::from_bytes(raw).unwrap())
                .body(())
                .unwrap();
            let check = describe.describe(&request).expect("checked");
            check.descriptors()[0].entries()[0].1.clone()
        };
        assert_eq!(value_of(b"k1\xff"), "k1\u{fffd}");
        let long = vec![b'A'; MAX_FIELD_LEN + 1];
        assert_eq!(value_of(&long).len(), MAX_FIELD_LEN + 1, "checked as it is");
        // Empty is missing: not a key shared by every client that sends it.
        let empty = Request::get("/").header("x-api-key", "").body(()).unwrap();
        assert!(describe.describe(&empty).is_none());
    }

    /// A name no check could carry fails where the layer is built, not silently on every
    /// request.
    #[test]
    fn unusable_names_fail_at_once() {
        let panics = |build: fn() -> Descriptors| {
            let message = std::panic::catch_unwind(build)
                .expect_err("built")
                .downcast::<String>()
                .map(|m| *m)
                .unwrap_or_default();
            assert!(message.starts_with("tollgate: "), "{message}");
            message
        };
        assert!(panics(|| Descriptors::new("")).contains("domain must be 1 to"));
        assert!(
            panics(|| Descriptors::new("api").header("x api key", "api_key"))
                .contains("`x api key` is not a valid header name")
        );
        assert!(
            panics(|| Descriptors::new("api").client_ip(""))
                .contains("descriptor key must be 1 to")
        );
        let long = "k".repeat(MAX_FIELD_LEN + 1);
        let message = std::panic::catch_unwind(|| Descriptors::new("api").path(long.clone()));
        assert!(message.is_err());
        assert!(
            std::panic::catch_unwind(|| (0..=MAX_DESCRIPTORS)
                .fold(Descriptors::new("api"), |d, i| d
                    .header("x-a", format!("k{i}"))))
            .is_err(),
            "one source more than a check carries"
        );
        // At the limit, it builds and checks.
        let at_limit = "k".repeat(MAX_FIELD_LEN);
        let describe = Descriptors::new(at_limit.clone()).method(at_limit);
        let request = Request::get("/").body(()).unwrap();
        assert!(describe.describe(&request).is_some());
    }
}
