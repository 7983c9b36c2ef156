//! Runs the real `tollgate` binary on free loopback ports for end-to-end tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(dead_code)] // each test file uses part of this kit

pub mod ads;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// Path of the built binary.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate"))
}

/// Runs `tollgate serve ARGS` (on kernel-chosen loopback ports, without an admin token in the
/// environment) expecting it to refuse to start: its exit code and standard error. A server
/// that starts anyway is killed after 10 s and fails the test instead of hanging it.
pub fn serve_refused(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(binary())
        .arg("serve")
        .args(args)
        .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    for _ in 0..200 {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some(status) = status else {
        let _ = child.kill();
        panic!("serve still runs 10 s after starting with {args:?}");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

/// A running `tollgate serve`; stopped with SIGTERM when dropped.
pub struct Server {
    child: Child,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// The policy file the server was started with.
    pub config: PathBuf,
    dir: tempfile::TempDir,
}

/// Where [`Server::start_logged`] writes the server's standard error.
const LOG: &str = "serve.log";

impl Server {
    /// Starts a server on the given policy text.
    pub fn start(policy: &str) -> Server {
        Self::start_with_args(policy, &[])
    }

    /// Starts a server on the given policy text with extra `serve` arguments.
    pub fn start_with_args(policy: &str, args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy).unwrap();
        Self::spawn(&path, args, dir, Stdio::inherit())
    }

    /// [`Server::start_with_args`], with the server's log (warnings and errors) kept for
    /// [`Server::log`].
    pub fn start_logged(policy: &str, args: &[&str]) -> Server {
        Self::start_logged_at("warn", policy, args)
    }

    /// [`Server::start_logged`], logging at `level` (`RUST_LOG`): `info` keeps the admin API's
    /// audit lines.
    pub fn start_logged_at(level: &str, policy: &str, args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy).unwrap();
        let log = std::fs::File::create(dir.path().join(LOG)).unwrap();
        Self::spawn_at(level, Some(&path), args, dir, Stdio::from(log))
    }

    /// A server given no `--config` (its policy comes from `--config-source` in `args`), its
    /// log kept at `info` for [`Server::log`].
    pub fn start_sourced(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join(LOG)).unwrap();
        Self::spawn_at("info", None, args, dir, Stdio::from(log))
    }

    /// The server's process id (for its `/proc/PID/status`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What a server started with [`Server::start_logged`] has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(LOG)).unwrap_or_default()
    }

    fn spawn(config: &Path, args: &[&str], dir: tempfile::TempDir, log: Stdio) -> Server {
        Self::spawn_at("warn", Some(config), args, dir, log)
    }

    /// `tollgate serve` logging at `level`, on the policy file `config` (`None`: none, its
    /// policy comes from `args`), with its temporary directory `dir`.
    fn spawn_at(
        level: &str,
        config: Option<&Path>,
        args: &[&str],
        dir: tempfile::TempDir,
        log: Stdio,
    ) -> Server {
        let mut command = Command::new(binary());
        command.env("RUST_LOG", level).arg("serve");
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        command
            .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(args)
            .stderr(log);
        let (child, [http, grpc, admin]) = listening(command, ["http", "grpc", "admin"]);
        Server {
            child,
            http,
            grpc,
            admin,
            config: config.map_or_else(|| dir.path().join("no-config"), Path::to_path_buf),
            dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// `POST path` on the HTTP listener with `body` as JSON: the answer.
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// `POST /v1/check` with one descriptor `key=value` in domain `api`.
    pub async fn check(&self, key: &str, value: &str) -> reqwest::Response {
        let body = serde_json::json!({
            "domain": "api",
            "descriptors": [{"entries": [{"key": key, "value": value}]}],
        });
        self.post("/v1/check", &body).await
    }

    /// The server's `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// `body` as JSON to the admin API's `path` with `method` (no token): the answer.
    pub async fn admin_send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        reqwest::Client::new()
            .request(method, self.admin_url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Shadows `text` (as `candidate.yaml`) as the policy candidate through the admin API (no
    /// token); fails the test if the server refuses it.
    pub async fn push_candidate(&self, text: &str) {
        let sources = serde_json::json!({"sources": [{"name": "candidate.yaml", "text": text}]});
        let r = self
            .admin_send(
                reqwest::Method::POST,
                "/v1/admin/policy/candidate",
                &sources,
            )
            .await;
        assert!(r.status().is_success(), "candidate refused: {}", r.status());
    }

    /// `GET` on the admin API (no token), its JSON answer.
    pub async fn admin_json(&self, path: &str) -> serde_json::Value {
        reqwest::get(self.admin_url(path))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `METHOD path` with `body` (JSON, or empty) and, when given, `token` as its Bearer token,
    /// to the admin API on a connection of its own: the answer's status and text, and the
    /// connection's local address (the client address the server sees).
    pub fn admin_raw(
        &self,
        method: &str,
        path: &str,
        body: &str,
        token: Option<&str>,
    ) -> (u16, String, SocketAddr) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(self.admin).unwrap();
        let client = stream.local_addr().unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.admin,
            body.len()
        )
        .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {answer:?}"));
        (status, answer, client)
    }

    /// Runs `tollgate policy ARGS` against this server's admin API; returns (exit code,
    /// stdout, stderr).
    pub fn policy_cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(binary())
            .arg("policy")
            .args(args)
            .args(["--admin", &self.admin_url("")])
            .env_remove("TOLLGATE_ADMIN_TOKEN")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Sends a signal (`HUP`, `TERM`...) to the server.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status();
        assert!(status.unwrap().success());
    }

    pub async fn grpc_client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// Sends SIGTERM and waits until the shutdown has begun: the HTTP listener is closed.
    pub async fn begin_shutdown(&self) {
        self.signal("TERM");
        eventually(
            Duration::from_secs(5),
            "the HTTP listener closes",
            async || std::net::TcpStream::connect(self.http).is_err(),
        )
        .await;
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    /// [`Server::stop`], keeping the server (for [`Server::log`]).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        self.exit_status()
    }

    /// Waits for the exit status of a server already told to stop ([`Server::begin_shutdown`]),
    /// without a second signal (which would cut its drain short).
    pub fn exited(mut self) -> std::process::ExitStatus {
        self.exit_status()
    }

    fn exit_status(&mut self) -> std::process::ExitStatus {
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("server did not stop within 5 s of SIGTERM");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `done` every 50 ms until it holds; panics saying `what` did not happen if it still
/// does not after `within`.
pub async fn eventually(within: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..within.as_millis().div_ceil(50) {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(done().await, "{what} within {within:?}");
}

/// The background tasks a server's `/metrics` text lists as supervised, in name order: every
/// long-lived task `serve` starts goes through the supervisor, which gives each a
/// `tollgate_background_task_panics_total` series from its start. Panics if one has panicked.
pub fn supervised_tasks(metrics: &str) -> Vec<String> {
    let prefix = "tollgate_background_task_panics_total{task=\"";
    let mut tasks: Vec<String> = metrics
        .lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .map(|rest| {
            let (task, count) = rest.split_once("\"} ").unwrap();
            assert_eq!(count, "0", "{task} panicked: {metrics}");
            task.to_owned()
        })
        .collect();
    tasks.sort();
    tasks
}

/// The value of header `name`, if the response has it.
pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// A running `tollgate bench-server` (the no-op ceiling); killed when dropped.
pub struct BenchServer {
    child: Child,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
}

impl BenchServer {
    pub fn start() -> BenchServer {
        let mut command = Command::new(binary());
        command
            .arg("bench-server")
            .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
            .stderr(Stdio::null());
        let (child, [http, grpc]) = listening(command, ["http", "grpc"]);
        BenchServer { child, http, grpc }
    }
}

/// Spawns `command` (with `RUST_LOG=warn` unless it sets another) and reads the `NAME
/// listening on ADDR` lines it prints, in the order of `names`.
pub fn listening<const N: usize>(
    mut command: Command,
    names: [&str; N],
) -> (Child, [SocketAddr; N]) {
    if !command.get_envs().any(|(name, _)| name == "RUST_LOG") {
        command.env("RUST_LOG", "warn");
    }
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let addrs = names.map(|name| {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("exited before `{name} listening on`"))
            .unwrap();
        line.strip_prefix(&format!("{name} listening on "))
            .unwrap_or_else(|| panic!("unexpected line `{line}`"))
            .parse()
            .unwrap()
    });
    (child, addrs)
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An RLS descriptor from `(key, value)` pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// PEM files made by `openssl` for TLS tests: a CA, a server certificate it signed for
/// 127.0.0.1 and a client certificate it signed.
pub struct Certificates {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Certificates {
    /// `serve`'s arguments for gRPC over TLS with these, asking for client certificates when
    /// `mutual`.
    pub fn serve_args(&self, mutual: bool) -> Vec<&str> {
        fn path(p: &Path) -> &str {
            p.to_str().unwrap()
        }
        let mut args = vec![
            "--grpc-tls-cert",
            path(&self.cert),
            "--grpc-tls-key",
            path(&self.key),
        ];
        if mutual {
            args.extend(["--grpc-tls-client-ca", path(&self.ca)]);
        }
        args
    }

    /// A new certificate for the server's key, signed by the CA, valid from `not_before` to
    /// `not_after` (`YYMMDDHHMMSSZ`, UTC), written to `path`.
    pub fn server_cert_valid(&self, not_before: &str, not_after: &str, path: &Path) {
        let dir = self.ca.parent().unwrap();
        let config = "[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\nnew_certs_dir = .\n\
                      serial = ca.srl\ndefault_md = sha256\npolicy = any\nunique_subject = no\n\
                      [any]\ncommonName = supplied\n";
        std::fs::write(dir.join("ca.cnf"), config).unwrap();
        std::fs::write(dir.join("index.txt"), "").unwrap();
        let out = Command::new("openssl")
            .args([
                "ca", "-batch", "-notext", "-config", "ca.cnf", "-cert", "ca.pem",
            ])
            .args([
                "-keyfile",
                "ca.key",
                "-in",
                "server.csr",
                "-extfile",
                "server.cnf",
            ])
            .args(["-startdate", not_before, "-enddate", not_after, "-out"])
            .arg(path)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl ca: {out:?}");
    }
}

/// Makes, in `dir`, a CA (`ca.key`, `ca{suffix}`) with the subject `ca_subject`, and for each
/// `(name, subject, extensions)` of `leaves` a key (`{name}.key`) and a certificate
/// (`{name}{suffix}`) the CA signs, with those X.509v3 extensions; all valid for a day.
pub fn sign_with_openssl(
    dir: &Path,
    suffix: &str,
    ca_subject: &str,
    leaves: &[(&str, &str, &str)],
) {
    let openssl = |args: &str| {
        let out = Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(dir)
            .output()
            .expect("openssl (Debian's openssl package, as scripts/test.sh installs)");
        assert!(out.status.success(), "openssl {args}: {out:?}");
    };
    let new_key = "-newkey rsa:2048 -nodes -days 1";
    openssl(&format!(
        "req -x509 {new_key} -keyout ca.key -out ca{suffix} -subj {ca_subject}"
    ));
    for (name, subject, extensions) in leaves {
        openssl(&format!(
            "req {new_key} -keyout {name}.key -out {name}.csr -subj {subject}"
        ));
        let extensions = format!("{extensions}\nbasicConstraints=CA:FALSE\n");
        std::fs::write(dir.join(format!("{name}.cnf")), extensions).unwrap();
        openssl(&format!(
            "x509 -req -in {name}.csr -CA ca{suffix} -CAkey ca.key -CAcreateserial \
             -out {name}{suffix} -days 1 -extfile {name}.cnf"
        ));
    }
}

/// Makes [`Certificates`] in `dir`.
pub fn certificates(dir: &Path) -> Certificates {
    let leaves = [
        (
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
        ),
        (
            "client",
            "/CN=tollgate-test-client",
            "extendedKeyUsage=clientAuth",
        ),
    ];
    sign_with_openssl(dir, ".pem", "/CN=tollgate-test-CA", &leaves);
    Certificates {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    }
}

/// Opens a connection to `addr` and sends `bytes`, then goes silent: never reads, never answers.
pub fn silent_client(addr: std::net::SocketAddr, bytes: &[u8]) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(bytes).unwrap();
    stream
}

/// Reads what the server sends on `stream` for at most `within`: all of it if the server closed
/// the connection meanwhile (a reset counts as a close), `None` if it is still open.
pub fn read_until_closed(stream: &mut std::net::TcpStream, within: Duration) -> Option<String> {
    read_bytes_until_closed(stream, within)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// [`read_until_closed`], as bytes.
pub fn read_bytes_until_closed(
    stream: &mut std::net::TcpStream,
    within: Duration,
) -> Option<Vec<u8>> {
    use std::io::Read;
    let tick = Duration::from_millis(100);
    stream.set_read_timeout(Some(tick)).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    for _ in 0..within.as_millis().div_ceil(tick.as_millis()) {
        match stream.read(&mut buffer) {
            Ok(0) => return Some(received),
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            // A signal (another test's child exiting: SIGCHLD) interrupts a read without
            // closing anything.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return Some(received),
        }
    }
    None
}

pub fn closed_within(stream: &mut std::net::TcpStream, within: Duration) -> bool {
    read_until_closed(stream, within).is_some()
}

/// Runs `tests/interop/<script>` with `args` under `$TOLLGATE_PYTHON` (Python with grpcio and
/// envoy-data-plane; `python3` when unset); fails the test with the script's output unless it
/// exits 0 and says `interop ok`.
pub fn run_interop(script: &str, args: &[&str]) {
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/interop")
        .join(script);
    let output = Command::new(&python)
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "interop client failed ({}):\n{stdout}\n{stderr}\n(install with: pip install -r tests/interop/requirements.txt)",
        output.status
    );
    assert!(stdout.contains("interop ok"), "{stdout}");
}
