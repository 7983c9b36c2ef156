#!/usr/bin/env python3
"""Checks deploy/container/Dockerfile without a container engine, then runs its command.

Usage: scripts/check-container.py TOLLGATE_BINARY   (as root: see below)

Structure: a build stage and a runtime stage that copies the binary from it; the runtime
stage's USER is numeric and not root; EXPOSE lists exactly the ports of `tollgate serve`'s
default addresses (read from the binary's --help); every COPY source from the build context
exists and is not excluded by .dockerignore, and the build stage's alone make a workspace whose
lock file needs no change (`cargo metadata --locked`); /bin/ratelimit links to the copied binary;
ENTRYPOINT and CMD are exec (JSON) form.

Run: the runtime stage's exact ENTRYPOINT + CMD, with each path the Dockerfile copies into the
image pointing at the file it copies (the binary at TOLLGATE_BINARY), as the Dockerfile's USER,
in a network namespace of its own (so the image's fixed ports cannot meet another process's):
/healthz answers, HTTP and gRPC listen on all interfaces and the admin API on loopback only;
then again with an admin token mounted, when the admin API listens on all interfaces and
refuses a request without the token. Needs root (setpriv, unshare); exits non-zero on any
failure, printing each.
"""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(ROOT, "deploy", "container", "Dockerfile")
TOKEN_PATH = "/run/secrets/tollgate/admin-token"

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL: {message}")


def ok(message):
    print(f"ok: {message}")


def instructions(path):
    """The Dockerfile's instructions as (KEYWORD, argument text), continuations joined."""
    out, pending = [], ""
    with open(path, encoding="utf-8") as f:
        for line in f:
            stripped = line.strip()
            if not pending and (not stripped or stripped.startswith("#")):
                continue
            if stripped.endswith("\\"):
                pending += stripped[:-1] + " "
                continue
            text = pending + stripped
            pending = ""
            keyword, _, rest = text.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages(parsed):
    """Stages in order: dicts with name, base and instructions."""
    out = []
    for keyword, rest in parsed:
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            out.append({"base": m.group(1), "name": m.group(2), "body": []})
        elif out:
            out[-1]["body"].append((keyword, rest))
    return out


def copy_args(rest):
    """(--from stage or None, sources, destination) of a COPY instruction."""
    words = rest.split()
    source_stage = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--from="):
            source_stage = flag.split("=", 1)[1]
    return source_stage, words[:-1], words[-1]


def dockerignored(path):
    ignore = os.path.join(ROOT, ".dockerignore")
    if not os.path.exists(ignore):
        return False
    with open(ignore, encoding="utf-8") as f:
        patterns = [l.strip().lstrip("/") for l in f if l.strip() and not l.startswith("#")]
    parts = path.split("/")
    return any(
        fnmatch.fnmatch("/".join(parts[: i + 1]), p.rstrip("/"))
        for p in patterns
        for i in range(len(parts))
    )


def default_ports(binary):
    """Ports of serve's default --http-addr, --grpc-addr and --admin-addr."""
    text = subprocess.run(
        [binary, "serve", "--help"], check=True, capture_output=True, text=True
    ).stdout
    ports = {}
    for flag in ("--http-addr", "--grpc-addr", "--admin-addr"):
        m = re.search(re.escape(flag) + r" <ADDR>.*?\[default: [^\]]*:(\d+)\]", text, re.S)
        if not m:
            fail(f"no default address for {flag} in `tollgate serve --help`")
            continue
        ports[flag] = int(m.group(1))
    return ports


def check_build_context(build):
    """The build stage's COPY sources alone form a workspace whose lock file needs no change
    (`cargo metadata --locked` on a copy of just them): the image's `cargo build
    --locked` sees every manifest and crate it needs."""
    with tempfile.TemporaryDirectory() as context:
        for keyword, rest in build["body"]:
            if keyword != "COPY":
                continue
            source_stage, sources, dest = copy_args(rest)
            if source_stage is not None:
                continue
            for source in sources:
                local = os.path.join(ROOT, source)
                # `COPY a b ./` puts a and b in the work dir; `COPY crates crates` makes crates.
                into_dir = dest.endswith("/") or dest == "."
                target = os.path.join(context, dest, os.path.basename(source)) if into_dir else os.path.join(context, dest)
                if os.path.isdir(local):
                    shutil.copytree(local, target, ignore=shutil.ignore_patterns("target"))
                elif os.path.exists(local):
                    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
                    shutil.copy2(local, target)
        run = subprocess.run(
            ["cargo", "metadata", "--locked", "--format-version", "1"],
            cwd=context, capture_output=True, text=True,
        )
        if run.returncode != 0:
            fail(f"the build stage's sources do not form a locked workspace: {run.stderr.strip()}")
        else:
            members = len(json.loads(run.stdout)["workspace_members"])
            ok(f"the build stage's COPY sources: a locked workspace of {members} crates")


def check_structure(binary):
    parsed = instructions(DOCKERFILE)
    all_stages = stages(parsed)
    names = [s["name"] for s in all_stages]
    if len(all_stages) < 2:
        fail(f"a multi-stage build needs two stages or more, found {names}")
        return None
    runtime = all_stages[-1]
    ok(f"stages {names}, runtime stage from {runtime['base']}")
    body = runtime["body"]

    users = [rest for k, rest in body if k == "USER"]
    if not users or not re.fullmatch(r"\d+(:\d+)?", users[-1]):
        fail(f"the runtime stage's USER must be numeric uid[:gid], found {users}")
        return None
    uid, _, gid = users[-1].partition(":")
    gid = gid or uid
    if uid == "0":
        fail("the runtime stage runs as root")
    else:
        ok(f"USER {users[-1]}")

    exposed = sorted(int(p.split("/")[0]) for k, r in body if k == "EXPOSE" for p in r.split())
    defaults = default_ports(binary)
    if exposed != sorted(defaults.values()):
        fail(f"EXPOSE {exposed} is not the binary's default ports {defaults}")
    else:
        ok(f"EXPOSE {exposed} = the default ports {defaults}")

    # What the image holds: destination path -> local file.
    files = {}
    for stage in all_stages:
        for keyword, rest in stage["body"]:
            if keyword not in ("COPY", "ADD"):
                continue
            source_stage, sources, dest = copy_args(rest)
            if source_stage is not None:
                if source_stage not in names[: all_stages.index(stage)]:
                    fail(f"COPY --from={source_stage}: no earlier stage of that name")
                if stage is runtime and len(sources) == 1 and sources[0].endswith("/tollgate"):
                    files[dest] = os.path.abspath(binary)
                continue
            for source in sources:
                local = os.path.join(ROOT, source)
                if not os.path.exists(local):
                    fail(f"COPY source {source} does not exist")
                elif dockerignored(source):
                    fail(f"COPY source {source} is excluded by .dockerignore")
                else:
                    ok(f"COPY source {source} exists")
                if stage is runtime and len(sources) == 1 and not dest.endswith("/"):
                    files[dest] = local
    check_build_context(all_stages[0])
    binary_dest = next((d for d, l in files.items() if l == os.path.abspath(binary)), None)
    if binary_dest is None:
        fail("the runtime stage does not copy the tollgate binary from the build stage")
        return None

    links = [
        r for k, r in body if k == "RUN" and re.search(r"\bln\s+(-s\s+)?\S+\s+/bin/ratelimit\b", r)
    ]
    if not any(binary_dest in r for r in links):
        fail(f"no RUN ln {binary_dest} /bin/ratelimit in the runtime stage")
    else:
        ok(f"/bin/ratelimit -> {binary_dest}")
        files["/bin/ratelimit"] = os.path.abspath(binary)

    command = []
    for keyword in ("ENTRYPOINT", "CMD"):
        rest = next((r for k, r in reversed(body) if k == keyword), None)
        if rest is None:
            continue
        try:
            words = json.loads(rest)
        except json.JSONDecodeError:
            fail(f"{keyword} is not in exec (JSON) form: {rest}")
            return None
        command += words
    ok(f"command {command}")
    return {"uid": uid, "gid": gid, "files": files, "command": command, "defaults": defaults}


def lay_out_image(files, top):
    """Copies what the image holds under `top`; returns the image path -> local path map."""
    mapped = {}
    for dest, local in files.items():
        target = os.path.join(top, dest.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(local, target)
        mapped[dest] = target
    for dirpath, dirnames, filenames in os.walk(top):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, os.stat(path).st_mode | 0o444)
    return mapped


def listening():
    """Local addresses with a listening TCP socket, as `ss` prints them."""
    out = subprocess.run(["ss", "-Hltn"], check=True, capture_output=True, text=True).stdout
    return {line.split()[3] for line in out.splitlines() if line.strip()}


def get(url, token=None):
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def run_once(spec, top, env, token):
    """Runs the image's command; checks its listeners and health. Inside the namespace."""
    mapped = lay_out_image(spec["files"], top)
    command = [mapped.get(word, word) for word in spec["command"]]
    bins = sorted({os.path.dirname(p) for p in mapped.values()})
    env = dict(env, PATH=":".join(bins + ["/usr/bin", "/bin"]), HOME="/nonexistent")
    ports = spec["defaults"]
    label = "with a token mounted" if token else "without a token"
    process = subprocess.Popen(
        ["setpriv", f"--reuid={spec['uid']}", f"--regid={spec['gid']}", "--clear-groups", "--"]
        + command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        health = f"http://127.0.0.1:{ports['--http-addr']}/healthz"
        for _ in range(100):
            if process.poll() is not None:
                fail(f"{label}: the command exited with {process.returncode}: {process.stderr.read()}")
                return
            try:
                status, body = get(health)
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            fail(f"{label}: /healthz did not answer within 10 s")
            return
        ok(f"{label}: /healthz answered {body.strip()!r} to uid {spec['uid']}")
        sockets = listening()
        admin_host = "0.0.0.0" if token else "127.0.0.1"
        for flag, host in (
            ("--http-addr", "0.0.0.0"),
            ("--grpc-addr", "0.0.0.0"),
            ("--admin-addr", admin_host),
        ):
            address = f"{host}:{ports[flag]}"
            if address in sockets:
                ok(f"{label}: {flag[2:]} listens on {address}")
            else:
                fail(f"{label}: {flag[2:]} does not listen on {address} (listening: {sorted(sockets)})")
        admin = f"http://127.0.0.1:{ports['--admin-addr']}/v1/admin/policy"
        status, _ = get(admin)
        expected = 401 if token else 200
        if status == expected:
            ok(f"{label}: admin API answered {status} without a token")
        else:
            fail(f"{label}: admin API answered {status} without a token, expected {expected}")
        if token:
            status, _ = get(admin, token)
            if status == 200:
                ok(f"{label}: admin API answered 200 with the token")
            else:
                fail(f"{label}: admin API answered {status} with the token")
        if process.poll() is not None:
            fail(f"{label}: the server exited: {process.stderr.read()}")
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def inner(spec_path):
    """The runs, in the network namespace `main` made."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        run_once(spec, os.path.join(top, "image"), base_env, None)
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        token = "check-container-token"
        token_file = os.path.join(top, "secret", "admin-token")
        os.makedirs(os.path.dirname(token_file))
        with open(token_file, "w", encoding="utf-8") as f:
            f.write(token + "\n")
        os.chmod(os.path.dirname(token_file), 0o755)
        os.chmod(token_file, 0o444)
        # Where the entry point looks for the mounted token, pointed at this one.
        env = dict(base_env, TOLLGATE_ADMIN_TOKEN_FILE=token_file)
        run_once(spec, os.path.join(top, "image"), env, token)
    return 1 if failures else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        return inner(sys.argv[2])
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    if os.geteuid() != 0:
        print("check-container.py runs the image's command as its USER in a network namespace: run it as root", file=sys.stderr)
        return 2
    spec = check_structure(binary)
    if spec is None or failures:
        print(f"{len(failures)} structural check(s) failed")
        return 1
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        spec_path = f.name
    try:
        run = subprocess.run(
            ["unshare", "--net", "--", sys.executable, os.path.abspath(__file__), "--inner", spec_path]
        )
    finally:
        os.unlink(spec_path)
    if run.returncode != 0:
        print("the container command's run failed")
        return 1
    print("container file: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
