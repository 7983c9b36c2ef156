#!/usr/bin/env python3
"""Renders and checks the Kustomize files under deploy/kubernetes, offline.

Usage: scripts/check-kubernetes.py KUBECTL KUBERNETES_VALIDATE TOLLGATE_BINARY
(run with a Python that has PyYAML, e.g. the venv kubernetes-validate is installed in).

For the base and each overlay: `kubectl kustomize` renders it; `kubernetes-validate --strict`
validates every built-in resource against the Kubernetes schemas (it has none for the
ServiceMonitor, a custom resource, which is checked here instead); then what the schemas
cannot say: the Deployment's probes are /readyz and /healthz on the HTTP port its args give,
it has requests and limits and runs as the image's non-root user, its args are ones `tollgate
serve` accepts, the policy ConfigMap is plain (no hash suffix), mounted whole (not by
subPath) and its policy passes `tollgate validate`; the Service, PodDisruptionBudget and
ServiceMonitor select the pods and name ports that exist; a store URL names a Service of the
render; the Envoy example's rate-limit cluster is the tollgate Service's gRPC port and its
domain is one the policy has.

Then the base's pod is run as the kubelet would run it, as far as that goes without a
cluster (as root; in a network namespace of its own, for the fixed ports): the image's entry
point with the Deployment's args and env, as the pod's runAsUser, the ConfigMap laid out as a
ConfigMap volume is (`..data` symlink swap); its readiness and liveness probes must answer
200, and after the ConfigMap is swapped for an edited policy, the running policy must change.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KUSTOMIZATIONS = ["deploy/kubernetes/base", "deploy/kubernetes/overlays/redis"]

failures = []


def check(condition, message):
    if condition:
        print(f"ok: {message}")
    else:
        failures.append(message)
        print(f"FAIL: {message}")
    return condition


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def image_user():
    with open(os.path.join(ROOT, "deploy/container/Dockerfile"), encoding="utf-8") as f:
        users = re.findall(r"^USER\s+(\d+)", f.read(), re.M)
    return int(users[-1]) if users else None


def check_render(name, docs, tollgate):
    def find(kind, resource_name):
        return next(
            (d for d in docs if d["kind"] == kind and d["metadata"]["name"] == resource_name),
            None,
        )

    deployment = find("Deployment", "tollgate")
    if not check(deployment is not None, f"{name}: a Deployment tollgate"):
        return
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    check(
        selects(deployment["spec"]["selector"]["matchLabels"], pod_labels),
        f"{name}: the Deployment's selector matches its pods",
    )
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "tollgate")
    args = container.get("args", [])
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}

    # The args parse: clap reads and checks every flag and value before it acts on --help.
    run = subprocess.run([tollgate, *args, "--help"], capture_output=True, text=True)
    check(run.returncode == 0, f"{name}: `tollgate {' '.join(args)}` is accepted{': ' + run.stderr.strip() if run.returncode else ''}")

    def arg(flag):
        return args[args.index(flag) + 1] if flag in args else None

    http_port = int(arg("--http-addr").rsplit(":", 1)[1]) if arg("--http-addr") else 8080
    grpc_port = int(arg("--grpc-addr").rsplit(":", 1)[1]) if arg("--grpc-addr") else 8081
    check(ports.get("http") == http_port, f"{name}: container port http is --http-addr's {http_port}")
    check(ports.get("grpc") == grpc_port, f"{name}: container port grpc is --grpc-addr's {grpc_port}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        check(
            get.get("path") == path and get.get("port") in ("http", http_port),
            f"{name}: {probe} is GET {path} on the HTTP port",
        )
    resources = container.get("resources", {})
    check(
        resources.get("requests", {}).get("cpu") and resources.get("requests", {}).get("memory")
        and resources.get("limits", {}).get("memory"),
        f"{name}: cpu and memory requests and a memory limit",
    )
    security = pod["spec"].get("securityContext", {})
    check(
        security.get("runAsNonRoot") is True and security.get("runAsUser") == image_user(),
        f"{name}: runs as non-root uid {security.get('runAsUser')}, the image's USER {image_user()}",
    )

    # The policy: a plain ConfigMap, mounted whole, that tollgate accepts.
    config = arg("--config") or ""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    mount = next(
        (m for m in container.get("volumeMounts", []) if config.startswith(m["mountPath"].rstrip("/") + "/")),
        None,
    )
    if check(mount is not None, f"{name}: --config {config} is on a volume mount"):
        check("subPath" not in mount, f"{name}: the policy is mounted whole (a subPath mount never updates)")
        configmap_name = volumes[mount["name"]].get("configMap", {}).get("name")
        policy_map = find("ConfigMap", configmap_name)
        check(
            policy_map is not None and configmap_name == "tollgate-policy",
            f"{name}: the policy is the plain ConfigMap tollgate-policy (no hash suffix), found {configmap_name}",
        )
        key = config[len(mount["mountPath"].rstrip("/")) + 1 :]
        policy_text = (policy_map or {}).get("data", {}).get(key)
        if check(policy_text is not None, f"{name}: the ConfigMap has {key}"):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, key)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(policy_text)
                run = subprocess.run([tollgate, "validate", path], capture_output=True, text=True)
                check(run.returncode == 0, f"{name}: `tollgate validate` accepts the ConfigMap's policy{': ' + run.stdout + run.stderr if run.returncode else ''}")
            policy_domains = {d.get("domain") for d in yaml.safe_load_all(policy_text) if d}
    else:
        policy_domains = set()

    service = find("Service", "tollgate")
    if check(service is not None, f"{name}: a Service tollgate"):
        check(selects(service["spec"]["selector"], pod_labels), f"{name}: the Service selects the pods")
        service_ports = {p["name"]: p for p in service["spec"]["ports"]}
        for port_name in ("grpc", "http"):
            p = service_ports.get(port_name, {})
            check(
                p.get("targetPort") in (port_name, ports.get(port_name)),
                f"{name}: Service port {port_name} targets the container's {port_name} port",
            )

    pdb = find("PodDisruptionBudget", "tollgate")
    if check(pdb is not None, f"{name}: a PodDisruptionBudget tollgate"):
        check(selects(pdb["spec"]["selector"]["matchLabels"], pod_labels), f"{name}: the PodDisruptionBudget selects the pods")
        replicas = deployment["spec"].get("replicas", 1)
        check(
            pdb["spec"].get("maxUnavailable", 0) >= 1 or pdb["spec"].get("minAvailable", replicas) < replicas,
            f"{name}: the PodDisruptionBudget lets a node drain ({replicas} replicas)",
        )

    monitor = find("ServiceMonitor", "tollgate")
    if check(monitor is not None and service is not None, f"{name}: a ServiceMonitor tollgate"):
        check(monitor["apiVersion"] == "monitoring.coreos.com/v1", f"{name}: ServiceMonitor is monitoring.coreos.com/v1")
        check(
            selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"].get("labels", {})),
            f"{name}: the ServiceMonitor selects the Service",
        )
        names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"].get("endpoints", []):
            check(
                endpoint.get("port") in names and endpoint.get("path", "/metrics") == "/metrics",
                f"{name}: ServiceMonitor scrapes /metrics on Service port {endpoint.get('port')}",
            )

    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for env in container.get("env", []):
        if env["name"] == "TOLLGATE_STORE" and "value" in env:
            m = re.match(r"redis://(?:[^@/]*@)?([^:/]+):(\d+)", env["value"])
            target = services.get(m.group(1)) if m else None
            check(
                target is not None and any(p["port"] == int(m.group(2)) for p in target["spec"]["ports"]),
                f"{name}: TOLLGATE_STORE {env['value']} is a Service port of the render",
            )

    for doc in docs:
        if doc["kind"] != "ConfigMap" or "envoy.yaml" not in doc.get("data", {}):
            continue
        envoy = yaml.safe_load(doc["data"]["envoy.yaml"])
        clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
        filters = [
            f
            for listener in envoy["static_resources"]["listeners"]
            for chain in listener["filter_chains"]
            for hcm in chain["filters"]
            for f in hcm["typed_config"].get("http_filters", [])
            if f["name"] == "envoy.filters.http.ratelimit"
        ]
        if not check(filters, f"{name}: Envoy example has a rate-limit filter"):
            continue
        limit = filters[0]["typed_config"]
        cluster = clusters.get(limit["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"], {})
        address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        grpc_service_port = next((p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"), None)
        check(
            address["address"] == "tollgate" and address["port_value"] == grpc_service_port,
            f"{name}: Envoy's rate-limit cluster is the tollgate Service's gRPC port {grpc_service_port}",
        )
        check(
            "http2_protocol_options" in str(cluster.get("typed_extension_protocol_options", "")),
            f"{name}: Envoy's rate-limit cluster speaks HTTP/2",
        )
        check(
            limit.get("domain") in policy_domains and limit.get("transport_api_version", limit["rate_limit_service"].get("transport_api_version")) == "V3",
            f"{name}: Envoy asks for domain {limit.get('domain')} over RLS v3, a domain of the policy {sorted(policy_domains)}",
        )


def pod_spec(docs, tollgate):
    """What running the tollgate pod of `docs` needs, for `run_pod`."""
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "tollgate")
    pod = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "tollgate")
    mount = container["volumeMounts"][0]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"])
    probes = {
        probe: container[probe]["httpGet"]["path"] for probe in ("readinessProbe", "livenessProbe")
    }
    return {
        "args": container["args"],
        "env": {e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
        "uid": pod["securityContext"]["runAsUser"],
        "gid": pod["securityContext"].get("runAsGroup", pod["securityContext"]["runAsUser"]),
        "mount": mount["mountPath"],
        "data": configmap["data"],
        "probes": probes,
        "tollgate": os.path.abspath(tollgate),
        "entrypoint": os.path.join(ROOT, "deploy/container/entrypoint.sh"),
    }


def lay_out_configmap(top, data, generation):
    """A ConfigMap volume as the kubelet writes it: the files in a timestamped directory,
    `..data` linking to it, each key linking into `..data`; a new generation swaps `..data`."""
    gen = os.path.join(top, f"..2026_01_01_00_00_0{generation}.000")
    os.makedirs(gen)
    for key, text in data.items():
        with open(os.path.join(gen, key), "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(os.path.join(gen, key), 0o644)
    os.chmod(gen, 0o755)
    os.symlink(os.path.basename(gen), os.path.join(top, "..data_tmp"))
    os.rename(os.path.join(top, "..data_tmp"), os.path.join(top, "..data"))
    for key in data:
        link = os.path.join(top, key)
        if not os.path.islink(link):
            os.symlink(os.path.join("..data", key), link)


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def running_hash(port):
    _, text = http_get(f"http://127.0.0.1:{port}/metrics")
    m = re.search(r'^tollgate_policy_version\{hash="([^"]+)"\}', text, re.M)
    return m.group(1) if m else None


def run_pod(spec):
    """Inside the network namespace: runs the pod's command, probes it, swaps its ConfigMap."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        mount = os.path.join(top, spec["mount"].lstrip("/"))
        os.makedirs(mount)
        for dirpath, _, _ in os.walk(top):
            os.chmod(dirpath, 0o755)
        lay_out_configmap(mount, spec["data"], 1)
        bin_dir = os.path.join(top, "bin")
        os.makedirs(bin_dir)
        os.chmod(bin_dir, 0o755)
        for source, name in ((spec["tollgate"], "tollgate"), (spec["entrypoint"], "tollgate-entrypoint")):
            subprocess.run(["cp", source, os.path.join(bin_dir, name)], check=True)
            os.chmod(os.path.join(bin_dir, name), 0o755)
        args = [a.replace(spec["mount"], mount, 1) if a.startswith(spec["mount"] + "/") else a for a in spec["args"]]
        http_port = int(args[args.index("--http-addr") + 1].rsplit(":", 1)[1])
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
        env.update(spec["env"], PATH=f"{bin_dir}:/usr/bin:/bin", HOME="/nonexistent")
        process = subprocess.Popen(
            ["setpriv", f"--reuid={spec['uid']}", f"--regid={spec['gid']}", "--clear-groups", "--",
             os.path.join(bin_dir, "tollgate-entrypoint"), *args],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            for _ in range(100):
                if http_get(f"http://127.0.0.1:{http_port}/healthz")[0] == 200 or process.poll() is not None:
                    break
                time.sleep(0.1)
            for probe, path in spec["probes"].items():
                status, body = http_get(f"http://127.0.0.1:{http_port}{path}")
                check(status == 200, f"pod: {probe} GET {path} answers {status} ({body.splitlines()[0] if body else ''})")
            before = running_hash(http_port)
            check(before is not None, f"pod: runs policy {before} as uid {spec['uid']}")
            key = next(iter(spec["data"]))
            edited = dict(spec["data"])
            edited[key] = spec["data"][key] + "  # edited\n  - key: check_kubernetes\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
            lay_out_configmap(mount, edited, 2)
            after = before
            for _ in range(100):
                after = running_hash(http_port)
                if after not in (None, before):
                    break
                time.sleep(0.1)
            check(after not in (None, before), f"pod: the ConfigMap's ..data swap is reloaded (policy {before} -> {after})")
            check(process.poll() is None, "pod: still running")
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
            if failures:
                print(process.stderr.read(), file=sys.stderr)
    return 1 if failures else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--run-pod":
        with open(sys.argv[2], encoding="utf-8") as f:
            return run_pod(json.load(f))
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    kubectl, validate, tollgate = sys.argv[1:]
    for kustomization in KUSTOMIZATIONS:
        run = subprocess.run(
            [kubectl, "kustomize", os.path.join(ROOT, kustomization)], capture_output=True, text=True
        )
        if not check(run.returncode == 0, f"{kustomization}: kubectl kustomize renders it{': ' + run.stderr if run.returncode else ''}"):
            continue
        docs = [d for d in yaml.safe_load_all(run.stdout) if d]
        builtin = [d for d in docs if d["kind"] != "ServiceMonitor"]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump_all(builtin, f)
            f.flush()
            checked = subprocess.run([validate, "--strict", "--quiet", f.name], capture_output=True, text=True)
        check(
            checked.returncode == 0 and "ERROR" not in checked.stdout + checked.stderr,
            f"{kustomization}: kubernetes-validate --strict passes {len(builtin)} built-in resources{': ' + checked.stdout + checked.stderr if checked.returncode else ''}",
        )
        check_render(kustomization, docs, tollgate)
        if kustomization == KUSTOMIZATIONS[0] and not failures:
            if os.geteuid() != 0:
                check(False, "running the pod needs root (setpriv, unshare)")
                continue
            with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
                json.dump(pod_spec(docs, tollgate), f)
                f.flush()
                run = subprocess.run(["unshare", "--net", "--", sys.executable, os.path.abspath(__file__), "--run-pod", f.name])
            check(run.returncode == 0, f"{kustomization}: the pod ran, answered its probes and reloaded its ConfigMap")
    if failures:
        print(f"{len(failures)} Kubernetes check(s) failed")
        return 1
    print("Kubernetes files: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
