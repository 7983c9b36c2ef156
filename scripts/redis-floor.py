#!/usr/bin/env python3
"""Redis's own time per fixed-window decision: tollgate's function beside the least Lua that
decides a fixed window in each of four layouts, in one redis-server, rounds alternating.

What it answers: how far tollgate's script is from the floor of its layout, and what another
layout would save, before anyone migrates the data format. The floors (`scripts/redis-floor/`)
decide nothing but a fixed window of cost 1: no params, no other algorithm, no reply format.

- `tollgate`: the decision library, `FCALL`ed with the store's own batch format (both printed
  by `cargo run -p tollgate --example redis-lua`), one one-charge request per key;
- `hash`: today's layout, HMGET + HSET + PEXPIREAT per key;
- `packed`: one string per key, GET + SET ... PXAT;
- `mget`: the packed layout, the batch's reads in one MGET;
- `incr`: a key per window, INCRBY + PEXPIRE (envoyproxy/ratelimit's; not exact as tollgate is).

Method: a redis-server of its own on a free loopback port (pinned to core 0 when `taskset`
exists; this script to the last core), with persistence off. Per layout and round: FLUSHALL,
a warm-up that makes every key, `CONFIG RESETSTAT`, then `--calls` batches of `--batch` keys
taken in turn, `now` moving `--step-us` a call; the figure is `INFO commandstats`'s `usec` over
the decisions, Redis's time inside the command (the socket's reads and writes and the
command's parsing come on top of it). Medians and ranges over `--rounds`, and each layout's
ratio to tollgate's in the same round (this machine's speed moves between rounds). Every step
has a deadline; the redis-server is shut down on every exit.

Python 3 standard library only; needs redis-server and cargo. The RESP client and the
tollgate helpers are `scripts/redis-instructions.py`'s.
"""

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FLOORS = ["hash", "packed", "mget", "incr"]


def instructions_module():
    spec = importlib.util.spec_from_file_location(
        "redis_instructions", os.path.join(HERE, "redis-instructions.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ri = instructions_module()


def pinned(core, cmd):
    return ["taskset", "-c", str(core), *cmd] if shutil.which("taskset") else cmd


def start_redis(work, deadline):
    port = ri.free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--dir", work]
    log = open(os.path.join(work, "redis.log"), "wb")
    proc = subprocess.Popen(pinned(0, cmd), stdout=log, stderr=subprocess.STDOUT)
    while True:
        deadline.left("waiting for redis-server")
        if proc.poll() is not None:
            raise ri.Failure(f"redis-server exited ({proc.returncode}); see {log.name}")
        try:
            con = ri.Resp(port, 10)
            if con.call("PING") == "PONG" or con.call("PING") == b"PONG":
                return proc, con
        except OSError:
            time.sleep(0.05)


def per_decision(con, command):
    info = con.call("INFO", "commandstats")
    info = info.decode() if isinstance(info, bytes) else info
    found = re.search(rf"cmdstat_{command}:calls=(\d+),usec=(\d+)", info)
    if not found:
        raise ri.Failure(f"no {command} in INFO commandstats")
    return int(found.group(2))


def one_round(con, layout, code, args, deadline):
    con.call("FLUSHALL", "SYNC", timeout=60)
    keys = [ri.key(f"floor-{layout}", i) for i in range(args.keys)]
    base = (int(time.time()) // 3600 + 2) * 3_600_000_000
    warmup = -(-args.keys // args.batch)
    nxt = 0
    for c in range(warmup + args.calls):
        if c == warmup:
            con.call("CONFIG", "RESETSTAT")
        batch = []
        for _ in range(args.batch):
            batch.append(keys[nxt])
            nxt = (nxt + 1) % args.keys
        now = str(base + c * args.step_us)
        left = min(60, deadline.left(f"measuring {layout}"))
        if layout == "tollgate":
            reply = con.call("FCALL", code["function"], str(args.batch), *batch, now,
                             *([code["request"]] * args.batch), timeout=left)
            ri.check_reply(reply, args.batch, "fixed_window")
        else:
            reply = con.call("EVALSHA", code[layout], str(args.batch), *batch, now, timeout=left)
            if not isinstance(reply, list) or len(reply) != args.batch or min(reply) < 0:
                raise ri.Failure(f"{layout}: unexpected reply {reply!r:.200}")
    usec = per_decision(con, "fcall" if layout == "tollgate" else "evalsha")
    return usec / (args.calls * args.batch)


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds, layouts alternating (5)")
    p.add_argument("--calls", type=int, default=2000, help="measured calls a round (2000)")
    p.add_argument("--batch", type=int, default=16, help="keys a call (16, as coalesced)")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys, in turn (10000)")
    p.add_argument("--step-us", type=int, default=500, help="how far now moves a call (500)")
    p.add_argument("--cargo", default="cargo", help="cargo, to print tollgate's library")
    p.add_argument("--timeout", type=float, default=900, help="the whole run's deadline, s")
    args = p.parse_args()
    if min(args.rounds, args.calls, args.batch, args.keys, args.step_us) < 1:
        p.error("every count must be at least 1")
    return args


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def main():
    args = parse_args()
    deadline = ri.Deadline(args.timeout)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    if not shutil.which("redis-server"):
        raise ri.Failure("redis-server is required (apt-get install redis-server)")
    print("printing tollgate's library (cargo run --example redis-lua)...", file=sys.stderr)
    code = {
        "library": ri.tollgate_text(args.cargo, deadline, "library"),
        "function": ri.tollgate_text(args.cargo, deadline, "function").strip(),
        "request": ri.tollgate_text(
            args.cargo, deadline, "request", "fixed_window", "1000000", "1s"
        ).strip(),
    }
    with tempfile.TemporaryDirectory(prefix="redis-floor-") as work:
        proc, con = start_redis(work, deadline)
        try:
            con.call("FUNCTION", "LOAD", "REPLACE", code["library"], timeout=60)
            for layout in FLOORS:
                with open(os.path.join(HERE, "redis-floor", f"{layout}.lua")) as f:
                    sha = con.call("SCRIPT", "LOAD", f.read(), timeout=60)
                code[layout] = sha.decode() if isinstance(sha, bytes) else sha
            layouts = ["tollgate", *FLOORS]
            figures = {layout: [] for layout in layouts}
            for r in range(args.rounds):
                for layout in layouts:
                    figures[layout].append(one_round(con, layout, code, args, deadline))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"{args.rounds} rounds of {args.calls} calls of {args.batch} keys "
          f"({args.keys} keys in turn, now +{args.step_us} µs a call); Redis's usec a decision")
    print("| layout | µs a decision, median (range) | of tollgate's, paired by round |")
    print("|---|---|---|")
    for layout in layouts:
        v = figures[layout]
        ratios = [a / b for a, b in zip(v, figures["tollgate"])]
        print(f"| {layout} | {median(v):.2f} ({min(v):.2f}–{max(v):.2f}) | "
              f"{median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")


if __name__ == "__main__":
    try:
        main()
    except ri.Failure as e:
        print(f"redis-floor: {e}", file=sys.stderr)
        sys.exit(1)
