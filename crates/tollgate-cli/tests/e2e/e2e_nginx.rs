//! The gateway pattern: Debian's nginx with `auth_request` in front of a small upstream, asking
//! the built binary's `/v1/authorize` before every request (config: `examples/nginx/nginx.conf`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::{Server, header};

const NGINX: &str = "/usr/sbin/nginx";

// A sliding log, not a fixed window: a window boundary between two requests of a test would
// reset the count (it failed a run once).
const POLICY: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, algorithm: sliding_window_log, unit: minute, requests_per_unit: 3}
"#;

/// An HTTP/1 upstream on its own thread answering `200 upstream` and counting requests.
struct Upstream {
    addr: SocketAddr,
    served: Arc<AtomicUsize>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                // nginx sends no body here (GET): the request ends at the blank line.
                while !request.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if request.ends_with(b"\r\n\r\n") {
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nupstream\n",
                    );
                }
            }
        });
        Upstream { addr, served }
    }
}

/// A foreground nginx on a rendered copy of the example config; stopped when dropped.
struct Nginx {
    child: Child,
    addr: SocketAddr,
    prefix: tempfile::TempDir,
}

impl Nginx {
    /// nginx on the example forward-auth config, asking `tollgate` before `upstream`.
    fn start(tollgate: SocketAddr, upstream: SocketAddr) -> Nginx {
        let template = std::fs::read_to_string(example_config()).unwrap();
        Nginx::start_with(|addr| {
            template
                .replace("@LISTEN@", &addr.to_string())
                .replace("@TOLLGATE@", &tollgate.to_string())
                .replace("@UPSTREAM@", &upstream.to_string())
        })
    }

    /// nginx on the config `config` renders for the address it is to listen on.
    fn start_with(config: impl Fn(SocketAddr) -> String) -> Nginx {
        assert!(
            Path::new(NGINX).exists(),
            "{NGINX} is missing: install Debian's nginx (`apt-get install -y nginx`, as \
             scripts/test.sh does) to run the nginx end-to-end tests"
        );
        // Another process can take the port between probing and nginx binding it: retry.
        let mut last_error = String::new();
        for _ in 0..5 {
            let addr = free_port();
            let prefix = tempfile::tempdir().unwrap();
            std::fs::write(prefix.path().join("nginx.conf"), config(addr)).unwrap();
            let child = Command::new(NGINX)
                .arg("-p")
                .arg(prefix.path())
                .args(["-c", "nginx.conf", "-e", "error.log", "-g", "daemon off;"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let mut nginx = Nginx {
                child,
                addr,
                prefix,
            };
            match nginx.wait_listening() {
                Ok(()) => return nginx,
                Err(e) => last_error = e,
            }
        }
        panic!("nginx did not start: {last_error}");
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        // 250 tries 20 ms apart: about 5 s.
        for _ in 0..250 {
            if let Some(status) = self.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(self.prefix.path().join("error.log"))
                    .unwrap_or_default();
                return Err(format!("exited with {status}: {log}"));
            }
            if TcpStream::connect(self.addr).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("not listening after 5 s".into())
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers first. A SIGKILLed master would leave them
        // running, orphaned, on the port.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn example_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/nginx/nginx.conf")
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

async fn get(nginx: &Nginx, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(nginx.url("/items?page=1"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn nginx_forwards_up_to_the_limit_then_answers_429_without_calling_upstream() {
    let tollgate = Server::start_with_args(
        POLICY,
        &[
            "--authorize-domain",
            "edge",
            "--authorize-descriptor",
            "api_key=header:x-api-key",
        ],
    );
    let upstream = Upstream::start();
    let nginx = Nginx::start(tollgate.http, upstream.addr);

    for expected_remaining in ["2", "1", "0"] {
        let r = get(&nginx, "alice").await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("3"));
        assert_eq!(
            header(&r, "x-ratelimit-remaining"),
            Some(expected_remaining)
        );
        assert_eq!(header(&r, "ratelimit-policy"), Some("\"per_key\";q=3;w=60"));
        assert!(header(&r, "retry-after").is_none());
        assert_eq!(r.text().await.unwrap(), "upstream\n");
    }

    let denied = get(&nginx, "alice").await;
    assert_eq!(denied.status(), 429);
    assert_eq!(header(&denied, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    let retry: u64 = header(&denied, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    assert!(
        header(&denied, "ratelimit")
            .unwrap()
            .starts_with("\"per_key\";r=0;t=")
    );
    assert_eq!(upstream.served.load(Ordering::SeqCst), 3);

    // Another key has its own counter.
    let other = get(&nginx, "bob").await;
    assert_eq!(other.status(), 200);
    assert_eq!(header(&other, "x-ratelimit-remaining"), Some("2"));
    assert_eq!(upstream.served.load(Ordering::SeqCst), 4);

    // No key: no descriptor applies, so nothing is limited (and no quota headers).
    let anonymous = reqwest::get(nginx.url("/")).await.unwrap();
    assert_eq!(anonymous.status(), 200);
    assert!(header(&anonymous, "x-ratelimit-limit").is_none());
    assert_eq!(upstream.served.load(Ordering::SeqCst), 5);
}

/// A raw `GET` to nginx, `headers` as given (reqwest refuses to send a control byte): the status.
fn raw_status(nginx: &Nginx, path: &str, headers: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(nginx.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n").into_bytes();
    request.extend_from_slice(headers);
    request.extend_from_slice(b"\r\n");
    stream.write_all(&request).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer.split(' ').nth(1).unwrap_or_default();
    status
        .parse()
        .unwrap_or_else(|_| panic!("no status in {answer:?}"))
}

/// What a client sends cannot make the check fail: an odd header it adds is not passed on (a
/// control byte, or a hundred headers, made tollgate refuse the subrequest and nginx answer
/// 500), and the spellings of a path all count against its rule.
#[tokio::test]
async fn odd_headers_and_path_spellings_are_checked_like_any_request() {
    const PATHS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, algorithm: sliding_window_log, unit: minute, requests_per_unit: 100}
  - key: path
    value: /login
    rate_limit: {name: login, algorithm: sliding_window_log, unit: minute, requests_per_unit: 1}
"#;
    let tollgate = Server::start_with_args(
        PATHS,
        &[
            "--authorize-domain",
            "edge",
            "--authorize-descriptor",
            "api_key=header:x-api-key",
            "--authorize-descriptor",
            "path=path",
        ],
    );
    let upstream = Upstream::start();
    let nginx = Nginx::start(tollgate.http, upstream.addr);

    assert_eq!(
        raw_status(
            &nginx,
            "/items",
            b"X-Api-Key: carol\r\nX-Anything: a\x01b\r\n"
        ),
        200
    );
    let many: String = (0..120).map(|i| format!("X-H{i}: v\r\n")).collect();
    assert_eq!(raw_status(&nginx, "/items", many.as_bytes()), 200);
    assert_eq!(upstream.served.load(Ordering::SeqCst), 2);

    assert_eq!(raw_status(&nginx, "/login", b""), 200);
    for spelling in ["//login", "/%6cogin", "/./login", "/x/../login?next=/"] {
        assert_eq!(raw_status(&nginx, spelling, b""), 429, "{spelling}");
    }
    assert_eq!(upstream.served.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn authorize_is_disabled_without_a_domain() {
    let tollgate = Server::start(POLICY);
    let r = reqwest::get(tollgate.url("/v1/authorize")).await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("--authorize-domain"));
}

#[tokio::test]
async fn an_unavailable_store_with_the_closed_posture_is_a_503_not_a_429() {
    // Nothing listens on port 1: every decision falls to the `closed` posture.
    let tollgate = Server::start_with_args(
        POLICY,
        &[
            "--store",
            "redis://127.0.0.1:1",
            "--store-connect-timeout",
            "100ms",
            "--on-store-error",
            "closed",
            "--authorize-domain",
            "edge",
            "--authorize-descriptor",
            "api_key=header:x-api-key",
        ],
    );
    let upstream = Upstream::start();
    let nginx = Nginx::start(tollgate.http, upstream.addr);
    let r = get(&nginx, "alice").await;
    assert_eq!(r.status(), 503);
    assert!(header(&r, "retry-after").is_some());
    assert!(header(&r, "x-ratelimit-limit").is_none());
    assert_eq!(upstream.served.load(Ordering::SeqCst), 0);
}

/// tollgate behind a TLS-terminating proxy (an ingress): `tollgate check --addr https://...`
/// verifies the certificate against the system's roots, or the file `SSL_CERT_FILE` names, and
/// asks through it; a certificate it cannot verify is an error, never a silent fallback.
#[test]
fn check_asks_over_https_and_verifies_the_certificate() {
    let tollgate = Server::start(POLICY);
    let certs = tempfile::tempdir().unwrap();
    let support::Certificates { ca, cert, key, .. } = support::certificates(certs.path());
    let nginx = Nginx::start_with(|addr| {
        format!(
            "worker_processes 1;\npid nginx.pid;\nerror_log error.log;\nevents {{}}\nhttp {{\n  access_log off;\n  server {{\n    listen {addr} ssl;\n    ssl_certificate {};\n    ssl_certificate_key {};\n    location / {{ proxy_pass http://{}; }}\n  }}\n}}\n",
            cert.display(),
            key.display(),
            tollgate.http
        )
    });
    let check = |addr: String, ca: Option<&Path>| {
        let mut command = Command::new(support::binary());
        command.args(["check", "--domain", "edge", "--descriptor", "api_key=tls"]);
        command.args(["--addr", &addr]);
        command
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR");
        if let Some(ca) = ca {
            command.env("SSL_CERT_FILE", ca);
        }
        command.output().unwrap()
    };
    let https = format!("https://{}", nginx.addr);
    let trusted = check(https.clone(), Some(&ca));
    assert_eq!(trusted.status.code(), Some(0), "{trusted:?}");
    let stdout = String::from_utf8_lossy(&trusted.stdout);
    assert!(stdout.contains("2 remaining"), "{stdout}");
    let untrusted = check(https, None);
    assert_eq!(untrusted.status.code(), Some(2), "{untrusted:?}");
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert!(stderr.contains("certificate"), "{stderr}");
    let direct = check(format!("http://{}", tollgate.http), None);
    let stdout = String::from_utf8_lossy(&direct.stdout);
    assert!(
        stdout.contains("1 remaining"),
        "only the trusted check counted: {stdout}"
    );
}
