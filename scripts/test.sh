#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, then runs format,
# lint and every test. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Build output lives outside the clone so repeated runs (and CI on the same machine) reuse it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/tollgate-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n==> %s\n' "$*"; }

if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi

# apt_install PACKAGE...: installs Debian packages, quietly.
apt_install() {
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# apt_install_stopped SERVICE PACKAGE...: the same for a package whose Debian service would start
# on install and take a port the tests need. Service starts are denied for the install
# (policy-rc.d exit 101), any policy that was there is restored, and SERVICE is stopped if it
# started anyway (failing to stop it, with no systemd or nothing running, is fine).
apt_install_stopped() {
  local service="$1" policy=/usr/sbin/policy-rc.d saved="" failed=""
  shift
  if [ -e "$policy" ]; then saved="$(mktemp)"; $sudo cp -p "$policy" "$saved"; fi
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  apt_install "$@" || failed=1
  if [ -n "$saved" ]; then $sudo mv "$saved" "$policy"; else $sudo rm -f "$policy"; fi
  if [ -n "$failed" ]; then echo "apt-get install $* failed" >&2; exit 1; fi
  $sudo service "$service" stop >/dev/null 2>&1 || true
}

# The docs are built with this mdBook (`cargo info mdbook` for the latest).
MDBOOK_VERSION=0.5.4

# That cache only grows: every change of a dependency, a flag or the toolchain leaves the old
# artifacts behind (it had reached 65 GB and filled a disk). Past CACHE_MAX_GB (30), start
# afresh: one full build, rather than a full disk.
cache_gb=$(du -s --block-size=1G "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1 || echo 0)
if [ "${cache_gb:-0}" -gt "${CACHE_MAX_GB:-30}" ]; then
  step "build cache $CARGO_TARGET_DIR holds ${cache_gb} GB: cleaning it (over ${CACHE_MAX_GB:-30} GB)"
  cargo clean
fi

step "redis-server and redis-cli (Redis and Redis Cluster tests start real servers)"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt_install redis-server redis-tools
fi
redis-server --version

step "nginx (the forward-auth test runs Debian's /usr/sbin/nginx with auth_request)"
if [ ! -x /usr/sbin/nginx ]; then
  # Debian starts a system nginx on port 80 after installing; the tests run their own.
  apt_install_stopped nginx nginx
fi
/usr/sbin/nginx -v

step "openssl (the HTTPS test makes a CA and a certificate for nginx to terminate TLS with)"
if ! command -v openssl >/dev/null; then
  apt_install openssl
fi
openssl version

step "Python interop client (grpcio + envoy-data-plane) in /var/tmp/tollgate-venv"
venv=/var/tmp/tollgate-venv
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv"; then
    # Debian's python3 ships venv without ensurepip: it comes with python3-venv.
    rm -rf "$venv"
    apt_install python3-venv
    python3 -m venv "$venv"
  fi
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/interop/requirements.txt
export TOLLGATE_PYTHON="$venv/bin/python"

step "mdbook $MDBOOK_VERSION (builds docs/; from crates.io, without the server, watcher and search)"
if command -v mdbook >/dev/null && mdbook --version | grep -qx "mdbook v$MDBOOK_VERSION"; then
  mdbook=mdbook
else
  # Its own target dir: the build cache above is the workspace's, and this is built once.
  mdbook_build="$(mktemp -d)"
  cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features \
    --target-dir "$mdbook_build" --quiet
  rm -rf "$mdbook_build"
  mdbook="$(command -v mdbook || echo "${CARGO_HOME:-$HOME/.cargo}/bin/mdbook")"
fi
"$mdbook" --version

step "docs: the link checker's tests, the link check, then mdbook build"
python3 scripts/test_check_links.py
python3 scripts/check-links.py
# Output into the build cache, outside the clone (a relative --dest-dir is read from docs/).
"$mdbook" build docs --dest-dir "$(realpath -m "$CARGO_TARGET_DIR")/book"

# --- deploy: Prometheus (begin) -------------------------------------------------------------
step "prometheus and promtool (alert rules' unit tests; the dashboard test runs a real Prometheus)"
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  # Debian starts a system Prometheus on port 9090 (tollgate's admin default) after
  # installing; the test runs its own on a free port.
  apt_install_stopped prometheus prometheus
fi
promtool --version | head -1

step "promtool check rules and test rules (deploy/prometheus)"
promtool check rules deploy/prometheus/alerts.yaml
(cd deploy/prometheus && promtool test rules alerts.test.yaml)
# --- deploy: Prometheus (end) ---------------------------------------------------------------

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# Each tollgate-client feature builds alone (an embedded user compiles no gRPC or HTTP client,
# and with embedded-memory no Redis client).
for feature in embedded embedded-memory remote-http remote-grpc; do
  step "cargo check -p tollgate-client --no-default-features --features $feature"
  cargo check -p tollgate-client --locked --no-default-features --features "$feature"
done

# tollgate without its Redis stores (the memory store alone, no redis-rs): it lints clean, and
# its unit tests pass; the tests that need Redis are gated out of that build, and all run in
# the default one below.
step "no redis-rs in tollgate without default features, nor in tollgate-client without embedded"
for crate_features in "tollgate" "tollgate-client embedded-memory" \
  "tollgate-client remote-http" "tollgate-client remote-grpc"; do
  read -r crate features <<<"$crate_features"
  # Captured first: piped, grep -q quitting early would break cargo tree's pipe, and under
  # pipefail the `if` would then take a match for none.
  deps="$(cargo tree -p "$crate" --locked --no-default-features ${features:+--features "$features"} \
    -e normal --prefix none)"
  if grep -q '^redis v' <<<"$deps"; then
    echo "$crate ${features:-without default features} depends on redis-rs" >&2
    exit 1
  fi
done

step "cargo clippy -p tollgate --no-default-features --all-targets -- -D warnings"
cargo clippy -p tollgate --no-default-features --all-targets --locked -- -D warnings
step "cargo test -p tollgate --no-default-features --lib"
cargo test -p tollgate --no-default-features --lib --locked

step "python3 -m unittest: the tests of scripts/check-layers.py"
python3 -m unittest discover -s scripts -p 'test_*.py'

# Import cycles between files (every crate) and imports against crates/tollgate's layer order:
# any one fails the run.
step "scripts/check-layers.py"
python3 scripts/check-layers.py

step "cargo test"
cargo test --workspace --locked

# --- fuzzing and the soak (begin) -----------------------------------------------------------
step "cargo-fuzz (the fuzz targets in fuzz/ build with it, on the stable toolchain with -s none)"
cargo_fuzz="${CARGO_HOME:-$HOME/.cargo}/bin/cargo-fuzz"
if ! command -v cargo-fuzz >/dev/null && [ ! -x "$cargo_fuzz" ]; then
  fuzz_install="$(mktemp -d)"
  cargo install cargo-fuzz --locked --target-dir "$fuzz_install" --quiet
  rm -rf "$fuzz_install"
fi
PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH" cargo fuzz --version

# Each target for FUZZ_SECONDS (12) from its committed seeds, new inputs kept in a scratch
# directory; a crash or a broken invariant stops libFuzzer with an error, and so the run.
fuzz_scratch="$(mktemp -d)"
for target in policy http_body rls_decode keys path; do
  step "cargo fuzz run $target, ${FUZZ_SECONDS:-12} s"
  mkdir -p "$fuzz_scratch/$target"
  (cd fuzz && PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH" cargo fuzz run -s none \
    --target-dir "$CARGO_TARGET_DIR/fuzz" "$target" "$fuzz_scratch/$target" "corpus/$target" \
    -- -max_total_time="${FUZZ_SECONDS:-12}" -timeout=10 -rss_limit_mb=1024 -print_final_stats=1 \
    2>&1 | tail -n 20) || { rm -rf "$fuzz_scratch"; exit 1; }
done
rm -rf "$fuzz_scratch"

step "scripts/soak.sh 60: memory store, one Redis, a 3+3 cluster, 20 s each"
scripts/soak.sh 60
# --- fuzzing and the soak (end) -------------------------------------------------------------

# --- dashboard: real headless browser (begin) -----------------------------------------------
step "chromium and chromium-driver (the dashboard test drives Debian's browser through WebDriver)"
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_install chromium chromium-driver
fi
chromium --version
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/dashboard/requirements.txt

step "dashboard in a headless browser (tests/dashboard/browser_test.py; screenshots in target/dashboard)"
cargo build -p tollgate-cli --bin tollgate --locked
"$venv/bin/python" tests/dashboard/browser_test.py "$CARGO_TARGET_DIR/debug/tollgate" target/dashboard
# --- dashboard: real headless browser (end) -------------------------------------------------

# --- deploy: container, Kubernetes, systemd files (begin) -----------------------------------
step "container file: structure, and its command run as its USER (scripts/check-container.py)"
# The checks run commands in network namespaces of their own (ip, ss from iproute2) and ask
# them for /healthz (curl).
if ! command -v ip >/dev/null || ! command -v ss >/dev/null || ! command -v curl >/dev/null; then
  apt_install iproute2 curl
fi
cargo build -p tollgate-cli --bin tollgate --locked
python3 scripts/check-container.py "$CARGO_TARGET_DIR/debug/tollgate"

step "Kubernetes files: kubectl kustomize, kubernetes-validate, checks (scripts/check-kubernetes.py)"
deploy_venv=/var/tmp/tollgate-deploy-venv
if [ ! -x "$deploy_venv/bin/python" ]; then python3 -m venv "$deploy_venv"; fi
"$deploy_venv/bin/python" -m pip install --quiet --disable-pip-version-check -r deploy/kubernetes/requirements.txt
"$deploy_venv/bin/python" scripts/check-kubernetes.py "$deploy_venv/bin/kubectl" \
  "$deploy_venv/bin/kubernetes-validate" "$CARGO_TARGET_DIR/debug/tollgate"

step "systemd unit: systemd-analyze verify and security, ExecStart run (scripts/check-systemd.sh)"
if ! command -v systemd-analyze >/dev/null; then
  apt_install systemd
fi
scripts/check-systemd.sh "$CARGO_TARGET_DIR/debug/tollgate"
# --- deploy: container, Kubernetes, systemd files (end) -------------------------------------
