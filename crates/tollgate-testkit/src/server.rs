//! A single `redis-server`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::binary::redis_cli_binary;
use crate::node::{Node, NodeConfig};

/// How long a server gets to answer `PING` after it is spawned, unless the builder says otherwise.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A real `redis-server` on a free loopback port, with no persistence (`--save ""`,
/// `--appendonly no`) and its own temporary directory.
///
/// Every method blocks the calling thread. Dropping the server ends the process (`SIGTERM`, then
/// `SIGKILL` after about 2 s), reaps it and removes its directory, also when the test panics.
///
/// ```
/// use tollgate_testkit::RedisServer;
///
/// let redis = RedisServer::builder()
///     .args(["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"])
///     .start();
/// assert_eq!(redis.cli(&["CONFIG", "GET", "maxmemory"]), "maxmemory\n1048576");
/// redis.restart();
/// assert!(redis.is_running());
/// ```
#[derive(Debug)]
pub struct RedisServer {
    node: Node,
}

impl RedisServer {
    /// Starts a server with the default configuration and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed, or the server does not answer within 10 s (the
    /// message quotes the server's log).
    pub fn start() -> Self {
        Self::builder().start()
    }

    /// A builder for a server with extra configuration arguments.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder {
            args: Vec::new(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }

    /// The loopback port the server listens on; it stays the same across [`RedisServer::restart`].
    pub fn port(&self) -> u16 {
        self.node.port()
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()))
    }

    /// `redis://127.0.0.1:port`, for client libraries.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// The server's process id while it runs (for `kill -STOP` and similar fault injection).
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// The server's working directory; `redis.log` in it holds the server's output.
    pub fn dir(&self) -> &Path {
        self.node.dir()
    }

    /// Whether the process is alive (a process stopped with `SIGSTOP` still counts as alive).
    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    /// Stops the server gracefully: `SIGTERM`, then `SIGKILL` if it has not exited within about
    /// 2 s. The port stays reserved for [`RedisServer::restart`]. Does nothing if already stopped.
    pub fn stop(&self) {
        self.node.stop();
    }

    /// Kills the server at once with `SIGKILL`, like a crash. Does nothing if already stopped.
    pub fn kill(&self) {
        self.node.kill();
    }

    /// Stops the server if it runs, then starts it again on the same port and waits for `PING`.
    /// Data is lost: nothing is persisted.
    ///
    /// # Panics
    ///
    /// When the port stays taken by another process for about 5 s, or the server does not answer.
    pub fn restart(&self) {
        self.node.restart();
    }

    /// Runs `redis-cli -p PORT args...` and returns its standard output without the trailing
    /// newline. Error replies come back as text (`ERR ...`), as `redis-cli` prints them.
    ///
    /// # Panics
    ///
    /// When `redis-cli` cannot be run or exits with a failure (for instance when it cannot
    /// connect), quoting its standard error.
    pub fn cli(&self, args: &[&str]) -> String {
        run_cli(self.port(), args)
    }
}

/// Options for [`RedisServer`]; [`RedisServerBuilder::start`] starts the server.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisServerBuilder {
    args: Vec<String>,
    ready_timeout: Duration,
}

impl RedisServerBuilder {
    /// Adds one `redis-server` argument, such as `--enable-debug-command` then `yes`. Arguments come
    /// after the kit's own, so they can override them.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds `redis-server` arguments, such as `["--maxmemory", "1mb"]`.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long to wait for `PING` after each start or restart (default 10 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`]; also when Redis rejects an argument (the message quotes why).
    pub fn start(self) -> RedisServer {
        RedisServer {
            node: Node::start(NodeConfig {
                cluster: false,
                args: self.args,
                ready_timeout: self.ready_timeout,
            }),
        }
    }
}

/// Runs `redis-cli -p port args...` and returns stdout without the trailing newline.
pub(crate) fn run_cli(port: u16, args: &[&str]) -> String {
    let output = Command::new(redis_cli_binary())
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("cannot run redis-cli");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        panic!(
            "redis-cli -p {port} {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim_end(),
            stdout.trim_end()
        );
    }
    stdout.strip_suffix('\n').unwrap_or(&stdout).to_owned()
}
