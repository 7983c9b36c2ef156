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
"""

import os
import re
import subprocess
import sys
import tempfile

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


def main():
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
    if failures:
        print(f"{len(failures)} Kubernetes check(s) failed")
        return 1
    print("Kubernetes files: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
