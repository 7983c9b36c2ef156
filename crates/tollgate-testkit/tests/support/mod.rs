//! Process checks shared by the kit's own tests.

use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;

/// Whether a process with `pid` exists (including as an unreaped zombie).
pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether nothing listens on `127.0.0.1:port`.
pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Pids of this process's children whose command name is `redis-server`, zombies included.
#[allow(dead_code)] // used by one test binary only
#[allow(clippy::unwrap_used)] // a test helper: an unreadable /proc must fail the test
pub fn redis_children() -> Vec<u32> {
    let me = std::process::id();
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid ...`: comm may contain spaces, so split after the last ')'.
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let comm = head
                .split_once('(')
                .map(|(_, comm)| comm)
                .unwrap_or_default();
            let ppid = rest
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok());
            comm == "redis-server" && ppid == Some(me)
        })
        .collect()
}
