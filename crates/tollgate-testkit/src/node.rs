//! One `redis-server` process: its port lease, its directory, its log, and its lifecycle.

use std::fs::{self, File, OpenOptions};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::Duration;

use parking_lot::Mutex;
use rustix::process::{Pid, Signal, kill_process};
use tempfile::TempDir;

use crate::binary::redis_binary;
use crate::deadline::Deadline;
use crate::port::PortLease;
use crate::resp;

/// How long `SIGTERM` gets before `SIGKILL`.
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(2);

/// Fresh ports to try when another process takes the picked one before Redis binds it.
const START_ATTEMPTS: usize = 5;

/// Tries at binding the same port again on restart, and the pause between them.
const RESTART_ATTEMPTS: usize = 25;
const RESTART_PAUSE: Duration = Duration::from_millis(200);

/// Pause between readiness polls.
const POLL: Duration = Duration::from_millis(10);

/// Lines of the server log quoted in a panic.
const LOG_TAIL_LINES: usize = 30;

/// The log file name inside the node's directory (the server's stdout and stderr).
const LOG_FILE: &str = "redis.log";

/// How a node is started: the same every time it is restarted.
#[derive(Debug, Clone)]
pub(crate) struct NodeConfig {
    /// Whether the node is a cluster node (its bus port is leased too).
    pub(crate) cluster: bool,
    /// Arguments after the kit's own (`--port`, `--dir`, ...); later ones win in Redis.
    pub(crate) args: Vec<String>,
    /// How long to wait for `PING` after each spawn.
    pub(crate) ready_timeout: Duration,
}

/// A `redis-server` on a leased loopback port, with its own temporary directory.
///
/// Dropping it ends the process (`SIGTERM`, then `SIGKILL`), reaps it, removes the directory and
/// releases the port.
#[derive(Debug)]
pub(crate) struct Node {
    // Field order is drop order: the process ends in `Drop`, then the lease, then the directory.
    child: Mutex<Option<Child>>,
    lease: PortLease,
    dir: TempDir,
    config: NodeConfig,
}

/// Why a spawn did not produce a ready server.
enum SpawnError {
    /// The port (or cluster bus port) was taken by someone else.
    AddressInUse,
}

impl Node {
    /// Starts a node on a fresh port, retrying on fresh ports when another process steals one.
    pub(crate) fn start(config: NodeConfig) -> Self {
        for _ in 0..START_ATTEMPTS {
            let node = Self {
                child: Mutex::new(None),
                lease: PortLease::acquire(config.cluster),
                dir: tempfile::Builder::new()
                    .prefix("tollgate-redis-")
                    .tempdir()
                    .expect("cannot create a temporary directory for redis-server"),
                config: config.clone(),
            };
            let spawned = node.spawn(&mut node.child.lock());
            match spawned {
                Ok(()) => return node,
                Err(SpawnError::AddressInUse) => continue,
            }
        }
        panic!("redis-server could not bind a free port in {START_ATTEMPTS} attempts");
    }

    pub(crate) fn port(&self) -> u16 {
        self.lease.port()
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id while the process runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        let mut child = self.child.lock();
        running(&mut child)
            .then(|| child.as_ref().map(Child::id))
            .flatten()
    }

    pub(crate) fn is_running(&self) -> bool {
        running(&mut self.child.lock())
    }

    /// Ends the process gracefully: `SIGTERM`, then `SIGKILL` after [`TERM_GRACE`].
    pub(crate) fn stop(&self) {
        let mut child = self.child.lock();
        terminate(&child);
        reap(&mut child, Deadline::after(TERM_GRACE));
    }

    /// Sends `SIGTERM` without waiting (see [`Node::reap`]), so many nodes can stop at once.
    pub(crate) fn terminate(&self) {
        terminate(&self.child.lock());
    }

    /// Waits until `deadline` for the process to exit, then kills it and reaps it.
    pub(crate) fn reap(&self, deadline: Deadline) {
        reap(&mut self.child.lock(), deadline);
    }

    /// Ends the process at once with `SIGKILL`, like a crash.
    pub(crate) fn kill(&self) {
        let mut child = self.child.lock();
        if let Some(mut process) = child.take() {
            // An error means the process already exited; `wait` reaps it either way.
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Stops the process if it runs and starts it again on the same port and directory.
    pub(crate) fn restart(&self) {
        let mut child = self.child.lock();
        terminate(&child);
        reap(&mut child, Deadline::after(TERM_GRACE));
        for _ in 0..RESTART_ATTEMPTS {
            match self.spawn(&mut child) {
                Ok(()) => return,
                Err(SpawnError::AddressInUse) => thread::sleep(RESTART_PAUSE),
            }
        }
        panic!(
            "redis-server could not bind 127.0.0.1:{} again after {RESTART_ATTEMPTS} attempts; log tail:\n{}",
            self.port(),
            self.log_tail()
        );
    }

    /// The last lines of the server's log (its stdout and stderr, across restarts).
    pub(crate) fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir().join(LOG_FILE)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    /// Spawns `redis-server` into `child` and waits until it answers `PING`.
    fn spawn(&self, child: &mut Option<Child>) -> Result<(), SpawnError> {
        let log_path = self.dir().join(LOG_FILE);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("cannot open the redis-server log file");
        let log_start = log.metadata().map(|meta| meta.len()).unwrap_or(0);
        let stderr = log
            .try_clone()
            .expect("cannot share the redis-server log file");
        let port = self.port().to_string();
        let process = Command::new(redis_binary())
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--protected-mode", "no", "--dir"])
            .arg(self.dir())
            .args(&self.config.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .expect("cannot spawn redis-server");
        let pid = process.id();
        *child = Some(process);

        let deadline = Deadline::after(self.config.ready_timeout);
        loop {
            if let Some(status) = exit_status(child) {
                *child = None;
                let log = log_since(&log_path, log_start);
                if log.contains("Address already in use") {
                    return Err(SpawnError::AddressInUse);
                }
                panic!(
                    "redis-server on 127.0.0.1:{port} exited ({status}) before answering PING; log:\n{log}"
                );
            }
            if answers_ping(self.port(), pid) {
                return Ok(());
            }
            if deadline.expired() {
                kill_now(child);
                panic!(
                    "redis-server on 127.0.0.1:{port} did not answer PING within {:?}; log tail:\n{}",
                    self.config.ready_timeout,
                    self.log_tail()
                );
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        terminate(child);
        reap(child, Deadline::after(TERM_GRACE));
    }
}

/// Whether the process in `child` is still alive (reaping it if it exited).
fn running(child: &mut Option<Child>) -> bool {
    child.is_some() && exit_status(child).is_none()
}

fn exit_status(child: &mut Option<Child>) -> Option<ExitStatus> {
    let process = child.as_mut()?;
    match process.try_wait() {
        Ok(status) => status,
        // The child cannot be waited on (already reaped elsewhere): treat it as gone.
        Err(_) => Some(ExitStatus::default()),
    }
}

fn terminate(child: &Option<Child>) {
    if let Some(process) = child {
        // An error means the process already exited, which is what we want.
        let _ = kill_process(Pid::from_child(process), Signal::TERM);
    }
}

/// Waits for the process to exit until `deadline`, then kills it; reaps it either way.
fn reap(child: &mut Option<Child>, deadline: Deadline) {
    while child.is_some() {
        if exit_status(child).is_some() {
            *child = None;
            return;
        }
        if deadline.expired() {
            kill_now(child);
            return;
        }
        thread::sleep(POLL);
    }
}

fn kill_now(child: &mut Option<Child>) {
    if let Some(mut process) = child.take() {
        let _ = process.kill();
        let _ = process.wait();
    }
}

/// Whether the server on `port` answers `PING` and is the process `pid` (not another test's server
/// that grabbed the port first).
fn answers_ping(port: u16, pid: u32) -> bool {
    let Ok(resp::Reply::Status(pong)) = resp::command(port, &["PING"]) else {
        return false;
    };
    if pong != "PONG" {
        return false;
    }
    resp::text(port, &["INFO", "server"]).is_ok_and(|info| {
        info.lines()
            .any(|line| line.trim() == format!("process_id:{pid}"))
    })
}

/// The log written since byte `start`.
fn log_since(path: &Path, start: u64) -> String {
    let log = File::open(path)
        .and_then(|mut file| {
            use std::io::{Read, Seek, SeekFrom};
            file.seek(SeekFrom::Start(start))?;
            let mut text = String::new();
            file.read_to_string(&mut text)?;
            Ok(text)
        })
        .unwrap_or_default();
    log.trim_end().to_owned()
}
