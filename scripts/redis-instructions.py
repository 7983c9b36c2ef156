#!/usr/bin/env python3
"""Instructions per decision inside redis-server, per algorithm, counted by callgrind.

Starts `redis-server` on a free loopback port under `valgrind --tool=callgrind`, loads the
decision code exactly as tollgate sends it (printed by tollgate itself:
`cargo run -p tollgate --example redis-lua`), and sends batches of one-charge requests in the
store's own format (one packed argument per request, also printed by tollgate), one call at a
time (the coalescer keeps two out, which Redis runs one after the other all the same). Per algorithm: a fresh data set, a warm-up that creates every key,
then callgrind's counters zeroed (`callgrind_control -z`), the measured calls, and a dump
(`callgrind_control -d`). The figure is the dump's instructions, less Redis's timer
(`serverCron`, which runs ten times a second whatever the load, so its share depends on how
fast valgrind runs), over the decisions made. All of that in `--repeat` redis-server
processes, whose median and range are printed: each process seeds Redis's hash tables at
random, which moves a count by up to about 1%; within one process a run repeats within 0.1%.
Counts do not depend on the machine's load.

`now` is pinned (the second whole hour ahead of the wall clock, so that nothing Redis expires by
its own clock vanishes, and every run starts at the same place in the rules' windows) and moves
`--step-us` a call; keys are taken in turn. With the defaults that is 30,000 decisions a second
of `now` over 10,000 keys, as `scripts/bench-redis.sh` sends them: every key is made in the
warm-up, then decided every 312.5 ms, 3.2 times in the counted calls, which span one whole
second, so 31% of the windows' decisions open a new window wherever the windows fall. Every
decision must be allowed: a run where a request was denied or failed is not counted.

Python 3 standard library only. Needs valgrind (`callgrind_control`, `callgrind_annotate`),
redis-server and cargo. Every step has a deadline (`--timeout` for the whole run); the
redis-server it started is shut down on every exit.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ALGORITHMS = [
    "fixed_window",
    "sliding_window_counter",
    "gcra",
    "token_bucket",
    "leaky_bucket",
    "sliding_window_log",
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Failure(Exception):
    """A step that did not go as it must: reported, and the run stops."""


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self, what):
        left = self.end - time.monotonic()
        if left <= 0:
            raise Failure(f"out of time (--timeout) while {what}")
        return left


# ------------------------------------------------------------------------------------------
# A RESP client: commands as arrays of bulk strings, replies parsed into Python values.


class RedisError(Exception):
    pass


class Resp:
    def __init__(self, port, timeout):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        self.sock.close()

    def call(self, *args, timeout=None):
        if timeout is not None:
            self.sock.settimeout(timeout)
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, int):
                a = str(a)
            if isinstance(a, str):
                a = a.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        reply = self._reply()
        if isinstance(reply, RedisError):
            raise reply
        return reply

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise Failure("redis-server closed the connection")
        self.buf += data

    def _line(self):
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line, self.buf = self.buf[:end], self.buf[end + 2 :]
                return line
            self._fill()

    def _exactly(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exactly(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise Failure(f"unexpected reply line {line[:80]!r}")


# ------------------------------------------------------------------------------------------
# What tollgate sends, from tollgate.


def tollgate_text(cargo, deadline, *args):
    """Output of `cargo run -p tollgate --example redis-lua -- ARGS`."""
    cmd = [cargo, "run", "-q", "-p", "tollgate", "--example", "redis-lua", "--", *args]
    try:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            capture_output=True,
            timeout=deadline.left("running " + " ".join(cmd)),
        )
    except subprocess.TimeoutExpired:
        raise Failure(f"out of time (--timeout) running {' '.join(cmd)}")
    if done.returncode != 0:
        raise Failure(f"{' '.join(cmd)} failed:\n{done.stderr.decode(errors='replace')}")
    return done.stdout.decode()


def git_commit():
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, timeout=10
        ).stdout.decode().strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


# ------------------------------------------------------------------------------------------
# redis-server under callgrind.


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """redis-server under callgrind in its own directory; `stop` always ends it."""

    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.proc = None
        self.port = None
        self.log = os.path.join(work, "valgrind.log")
        self.out = os.path.join(work, "callgrind.out")

    def start(self, deadline):
        for _ in range(5):
            self.port = free_port()
            cmd = [
                self.args.valgrind,
                "--tool=callgrind",
                "--dump-instr=no",
                f"--callgrind-out-file={self.out}",
                self.args.redis_server,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.work,
                "--daemonize",
                "no",
            ]
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
            if self.wait_ready(deadline):
                return
            self.stop()
        raise Failure(f"redis-server under valgrind never answered; see its log:\n{self.tail()}")

    def wait_ready(self, deadline):
        until = time.monotonic() + min(120, deadline.left("starting redis-server"))
        while time.monotonic() < until:
            if self.proc.poll() is not None:
                return False
            try:
                con = Resp(self.port, 5)
                try:
                    if con.call("PING") == "PONG":
                        return True
                finally:
                    con.close()
            except (OSError, RedisError, Failure):
                pass
            time.sleep(0.2)
        return False

    def tail(self):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return "(no log)"

    def control(self, flag, deadline):
        """`callgrind_control FLAG PID`, which answers once valgrind has done it."""
        cmd = [self.args.callgrind_control, flag, str(self.proc.pid)]
        try:
            done = subprocess.run(
                cmd, capture_output=True, timeout=min(60, deadline.left("asking callgrind"))
            )
        except subprocess.TimeoutExpired:
            raise Failure(f"{' '.join(cmd)} got no answer within 60 s")
        if done.returncode != 0 or b"OK" not in done.stdout:
            raise Failure(f"{' '.join(cmd)} failed: {(done.stdout + done.stderr).decode()}")

    def dumps(self):
        prefix = os.path.basename(self.out) + "."
        return {f for f in os.listdir(self.work) if f.startswith(prefix)}

    def dump(self, deadline):
        """Dumps the counters since the last zero; the path of the new dump file."""
        before = self.dumps()
        self.control("-d", deadline)
        until = time.monotonic() + min(30, deadline.left("waiting for callgrind's dump"))
        while time.monotonic() < until:
            for name in self.dumps() - before:
                path = os.path.join(self.work, name)
                if total_instructions(path) is not None:
                    return path
            time.sleep(0.1)
        raise Failure("callgrind_control -d wrote no dump within 30 s")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            con = Resp(self.port, 5)
            try:
                con.call("SHUTDOWN", "NOSAVE")
            except (Failure, RedisError, OSError):
                pass  # the server closes the connection as it exits
            finally:
                con.close()
        except OSError:
            pass
        for sig, wait in ((None, 20), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            if sig is not None:
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def total_instructions(path):
    """The `totals:` (else `summary:`) line of a callgrind dump; None while it is incomplete."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"^totals:\s*(\d+)", text, re.M) or re.search(r"^summary:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def inclusive(annotate, path, function, deadline):
    """Instructions inside `function` and what it called, by callgrind_annotate; 0 if absent."""
    cmd = [annotate, "--inclusive=yes", "--threshold=100", path]
    try:
        done = subprocess.run(
            cmd, capture_output=True, timeout=min(120, deadline.left("annotating"))
        )
    except subprocess.TimeoutExpired:
        raise Failure(f"{' '.join(cmd)} took over 120 s")
    if done.returncode != 0:
        raise Failure(f"{' '.join(cmd)} failed: {done.stderr.decode(errors='replace')}")
    pattern = re.compile(r"^\s*([\d,]+)\s.*:" + re.escape(function) + r"\s")
    for line in done.stdout.decode(errors="replace").splitlines():
        m = pattern.match(line)
        if m:
            return int(m.group(1).replace(",", ""))
    return 0


# ------------------------------------------------------------------------------------------
# The measurement.


def key(algorithm, i):
    """A key of the store's shape: `tg:{16 hex digits}:` then a counter key."""
    counter = f"bench|{algorithm}|k{i}"
    tag = hashlib.sha1(counter.encode()).hexdigest()[:16]
    return f"tg:{{{tag}}}:{counter}".encode()


def check_reply(reply, batch, algorithm):
    """Every request of the batch allowed: after the call's now, each request's short form
    `-2, remaining, reset, charged` (its full reply, eight integers, where a retry or a delay
    rules the short form out)."""
    if not isinstance(reply, list) or not reply or not isinstance(reply[0], int):
        raise Failure(f"{algorithm}: unexpected batch reply {reply!r:.300}")
    at = 1
    for r in range(batch):
        if at >= len(reply):
            raise Failure(f"{algorithm}: the reply ends before request {r}: {reply!r:.300}")
        if reply[at] == -1:
            raise Failure(f"{algorithm}: request {r} failed: {reply[at + 1]!r}")
        if reply[at] == -2:
            at += 4
            continue
        one = reply[at : at + 8]
        if len(one) != 8 or one[1] != 1 or one[2] != 0:
            raise Failure(
                f"{algorithm}: request {r} was not allowed ({one}); raise --limit or --keys"
            )
        at += 8
    if at != len(reply):
        raise Failure(f"{algorithm}: {len(reply) - at} numbers past the batch's requests")


def measure(server, con, run, deadline):
    args = run["args"]
    algorithm, via = run["algorithm"], run["via"]
    con.call("FLUSHALL", "SYNC", timeout=60)
    keys = [key(algorithm, i) for i in range(args.keys)]
    if via == "fcall":
        head = ["FCALL", run["function"], str(args.batch)]
    else:
        head = ["EVALSHA", run["sha"], str(args.batch)]
    base = (int(time.time()) // 3600 + 2) * 3_600_000_000
    nxt = 0
    total_calls = args.warmup + args.calls
    for c in range(total_calls):
        if c == args.warmup:
            server.control("-z", deadline)
        batch_keys = []
        for _ in range(args.batch):
            batch_keys.append(keys[nxt])
            nxt = (nxt + 1) % args.keys
        now = str(base + c * args.step_us)
        reply = con.call(
            *head,
            *batch_keys,
            now,
            *([run["request"]] * args.batch),
            timeout=min(120, deadline.left(f"measuring {algorithm} by {via}")),
        )
        check_reply(reply, args.batch, algorithm)
    path = server.dump(deadline)
    total = total_instructions(path)
    timer = inclusive(args.callgrind_annotate, path, "serverCron", deadline)
    decisions = args.calls * args.batch
    return {
        "algorithm": algorithm,
        "via": via,
        "decisions": decisions,
        "instructions": total,
        "timer": timer,
        "per_decision": (total - timer) / decisions,
        "per_call": (total - timer) / args.calls,
        "timer_share": timer / total if total else 0.0,
    }


class HelpFormat(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__,
        epilog="Example: scripts/redis-instructions.py --algorithms fixed_window,gcra --via both",
        formatter_class=HelpFormat,
    )
    p.add_argument(
        "--algorithms",
        default=",".join(ALGORITHMS),
        help="comma-separated algorithms to measure",
    )
    p.add_argument(
        "--via",
        choices=["fcall", "evalsha", "both"],
        default="fcall",
        help="FCALL of the function library (Redis 7, the default path) or EVALSHA of the "
        "batch script (the fallback where FUNCTION is refused)",
    )
    p.add_argument("--batch", type=int, default=16, help="requests (one charge each) per call")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys, taken in turn")
    p.add_argument("--warmup", type=int, default=700, help="calls before counting")
    p.add_argument(
        "--calls",
        type=int,
        default=2000,
        help="calls counted; times --step-us, best a whole number of periods",
    )
    p.add_argument("--step-us", type=int, default=500, help="how far `now` moves each call, µs")
    p.add_argument("--limit", type=int, default=1000, help="each rule's limit")
    p.add_argument("--period", default="1s", help="each rule's period (humantime)")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="redis-server processes, each measuring everything; the median is printed",
    )
    p.add_argument("--timeout", type=float, default=3600, help="the whole run's deadline, s")
    p.add_argument("--json", action="store_true", help="print the results as JSON lines too")
    p.add_argument("--keep", metavar="DIR", help="keep the callgrind dumps and log in DIR")
    p.add_argument("--redis-server", default="redis-server")
    p.add_argument("--valgrind", default="valgrind")
    p.add_argument("--callgrind-control", default="callgrind_control")
    p.add_argument("--callgrind-annotate", default="callgrind_annotate")
    p.add_argument("--cargo", default=os.environ.get("CARGO", "cargo"))
    args = p.parse_args()
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    for a in args.algorithms:
        if a not in ALGORITHMS:
            p.error(f"unknown algorithm {a!r}; expected some of {','.join(ALGORITHMS)}")
    for name in ("batch", "keys", "warmup", "calls", "limit", "repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup * args.batch < args.keys:
        p.error("--warmup calls of --batch requests must make every one of --keys")
    if args.step_us < 0:
        p.error("--step-us must not be negative")
    for tool in (args.redis_server, args.valgrind, args.callgrind_control, args.cargo):
        if shutil.which(tool) is None:
            p.error(f"{tool} not found")
    return args


def interrupted(_signal, _frame):
    raise KeyboardInterrupt


def main():
    args = parse_args()
    deadline = Deadline(args.timeout)
    # A SIGTERM (say from `timeout`) unwinds like Ctrl-C, through the cleanup below.
    signal.signal(signal.SIGTERM, interrupted)

    print("building tollgate's example redis-lua ...", file=sys.stderr)
    library = tollgate_text(args.cargo, deadline, "library")
    function = tollgate_text(args.cargo, deadline, "function").strip()
    batch_script = tollgate_text(args.cargo, deadline, "batch")
    requests = {
        a: tollgate_text(args.cargo, deadline, "request", a, str(args.limit), args.period).strip()
        for a in args.algorithms
    }
    for a, words in requests.items():
        period = int(words.split()[4])
        if args.calls * args.step_us % period:
            print(
                f"warning: {args.calls} calls of {args.step_us} µs are not whole periods of "
                f"{a} ({period} µs): its share of new windows depends on where they fall",
                file=sys.stderr,
            )
    vias = ["fcall", "evalsha"] if args.via == "both" else [args.via]

    commit = git_commit()
    code = {"library": library, "function": function, "batch": batch_script}
    results = []
    try:
        for repeat in range(args.repeat):
            results += one_process(args, deadline, code, requests, vias, commit, repeat)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (Failure, RedisError, OSError) as e:
        print(f"redis-instructions: {e}", file=sys.stderr)
        return 1

    print(
        f"instructions per decision, median of {args.repeat} redis-server processes "
        f"(min–max); redis-server {results[0]['redis']}, tollgate {commit}"
    )
    print()
    print("| algorithm | via | instructions/decision | instructions/call | timer share |")
    print("|---|---|---|---|---|")
    for algorithm in args.algorithms:
        for via in vias:
            runs = [r for r in results if r["algorithm"] == algorithm and r["via"] == via]
            per = sorted(r["per_decision"] for r in runs)
            call = sorted(r["per_call"] for r in runs)
            share = sorted(r["timer_share"] for r in runs)
            print(
                f"| {algorithm} | {via} | {median(per):,.0f} ({per[0]:,.0f}–{per[-1]:,.0f}) | "
                f"{median(call):,.0f} | {100 * share[0]:.1f}–{100 * share[-1]:.1f}% |"
            )
    if args.json:
        for r in results:
            print(json.dumps(r))
    return 0


def median(sorted_values):
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2


def one_process(args, deadline, code, requests, vias, commit, repeat):
    """Every algorithm and way of calling, on one redis-server under callgrind."""
    work = tempfile.mkdtemp(prefix="tollgate-callgrind-")
    server = Server(args, work)
    results = []
    try:
        server.start(deadline)
        con = Resp(server.port, 60)
        version = con.call("INFO", "server").decode()
        version = re.search(r"redis_version:(\S+)", version).group(1)
        con.call("FUNCTION", "LOAD", "REPLACE", code["library"], timeout=60)
        sha = con.call("SCRIPT", "LOAD", code["batch"], timeout=60).decode()
        if sha != hashlib.sha1(code["batch"].encode()).hexdigest():
            raise Failure(f"SCRIPT LOAD answered {sha!r}, not the script's SHA-1")
        print(
            f"process {repeat + 1} of {args.repeat}: redis-server {version} under callgrind, "
            f"tollgate {commit}; {args.calls} calls of {args.batch} one-charge requests "
            f"counted after {args.warmup}, {args.keys} keys, {args.limit} per {args.period}, "
            f"now +{args.step_us} µs a call",
            file=sys.stderr,
        )
        for algorithm in args.algorithms:
            for via in vias:
                started = time.monotonic()
                run = {
                    "args": args,
                    "algorithm": algorithm,
                    "via": via,
                    "function": code["function"],
                    "sha": sha,
                    "request": requests[algorithm],
                }
                result = measure(server, con, run, deadline)
                result.update(redis=version, commit=commit, process=repeat + 1)
                results.append(result)
                print(
                    f"  {algorithm} by {via}: {result['per_decision']:,.0f} instructions a "
                    f"decision ({time.monotonic() - started:.0f} s)",
                    file=sys.stderr,
                )
        con.close()
    finally:
        server.stop()
        if args.keep:
            keep = os.path.join(args.keep, f"process-{repeat + 1}")
            os.makedirs(keep, exist_ok=True)
            for name in os.listdir(work):
                shutil.copy(os.path.join(work, name), keep)
        shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
