#!/usr/bin/python3
"""Checks the Kubernetes manifests of deploy/kubernetes/ (PyYAML, Debian's
python3-yaml): what a cluster would only show at run time, when hsapd
refuses to start or peers refuse each other.

For every DaemonSet: each file flag (--token_file, --tls_cert, --tls_key,
--tls_ca) names a file that a read-only Secret volume of the container
provides (the Secret's key mapped to that name; cert-manager's tls.crt,
tls.key and ca.crt to the matching flags); Secrets holding a key or the
token are mounted with no group/other bits (hsapd refuses such files);
the token stays (operators); the three TLS flags come together. With TLS:
no gRPC probe (the kubelet's speaks plaintext, the port TLS only); the
advertised address is the host network's $HOST_IP with --port; the
DaemonSet is pinned to one node (kubernetes.io/hostname) and mounts that
node's certificate only, whose IP SAN is that node's entry in the peers
ConfigMap, with client and server usage, from an issuer the files define;
no two DaemonSets mount one node's Secret, and none mounts the CA's; the
CA's Secret lives in cert-manager's namespace. hsapd-tls.yaml is what
make_tls_manifests.py writes for the arguments in its header.

The checks can fail: the self-test breaks a copy of the manifests in each
of those ways and expects each break to be reported.

Run: bazel test //deploy:kubernetes_manifest_test, or python3 this file.
"""

import copy
import os
import re
import shlex
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
for candidate in (os.path.join(os.environ.get("TEST_SRCDIR", ""), "hsap", "deploy"), HERE):
    if os.path.isdir(os.path.join(candidate, "kubernetes")):
        DEPLOY = candidate
        break
KUBE = os.path.join(DEPLOY, "kubernetes")
# Secrets the operator creates (deploy/README.md), not the manifests.
EXTERNAL_SECRETS = {"hsapd-token"}
# Which cert-manager Secret key each TLS flag must read.
TLS_KEYS = {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"}
CLUSTER_RESOURCE_NAMESPACE = "cert-manager"
FLAG = re.compile(r'--([a-z_]+)=("([^"]*)"|[^\s\\"]+)')


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def flags_of(container):
    text = " ".join(container.get("command", []) + container.get("args", []))
    out = {}
    for m in FLAG.finditer(text):
        out[m.group(1)] = m.group(3) if m.group(3) is not None else m.group(2)
    return out


def check_daemonset(ds, docs, where):
    """Problems of one DaemonSet (strings)."""
    problems = []
    name = f"{where}: DaemonSet {ds['metadata']['name']}"
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    for k, v in spec["selector"]["matchLabels"].items():
        if labels.get(k) != v:
            problems.append(f"{name}: selector {k}={v} does not match the pod labels")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    certificates = {d["spec"]["secretName"]: d for d in docs if d["kind"] == "Certificate"}
    for c in pod["containers"]:
        flags = flags_of(c)
        mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts", [])}
        secrets_for = {}
        for flag in ("token_file", "tls_cert", "tls_key", "tls_ca"):
            if flag not in flags:
                continue
            path = flags[flag]
            directory, base = os.path.split(path)
            mount = mounts.get(directory)
            if mount is None:
                problems.append(f"{name}: --{flag}={path}: no volume is mounted at {directory}")
                continue
            volume = volumes.get(mount["name"])
            if volume is None or "secret" not in volume:
                problems.append(f"{name}: --{flag}={path}: {directory} is not a Secret volume")
                continue
            secret = volume["secret"]
            secrets_for[flag] = secret["secretName"]
            if not mount.get("readOnly"):
                problems.append(f"{name}: --{flag}: the mount at {directory} is not readOnly")
            items = {i["path"]: i["key"] for i in secret.get("items", [])}
            if base not in items:
                problems.append(f"{name}: --{flag}={path}: Secret {secret['secretName']} "
                                f"mounted at {directory} maps no key to {base}")
            elif flag in TLS_KEYS and items[base] != TLS_KEYS[flag]:
                problems.append(f"{name}: --{flag} reads key {items[base]} of "
                                f"{secret['secretName']}, not {TLS_KEYS[flag]}")
            if flag in ("token_file", "tls_key") and secret.get("defaultMode", 0o644) & 0o077:
                problems.append(f"{name}: --{flag}: Secret volume {mount['name']} has defaultMode "
                                f"{secret.get('defaultMode', 0o644):04o}; hsapd refuses a key or "
                                "token its group or others can read (0400)")
            known = secret["secretName"] in EXTERNAL_SECRETS or secret["secretName"] in certificates
            if not known:
                problems.append(f"{name}: Secret {secret['secretName']} is neither created by the "
                                "operator (deploy/README.md) nor issued by a Certificate here")
        if "token_file" not in flags:
            problems.append(f"{name}: no --token_file: operators authenticate with the token")
        tls = [f for f in TLS_KEYS if f in flags]
        if tls and len(tls) != 3:
            problems.append(f"{name}: TLS flags {tls}: all three of --tls_cert/--tls_key/--tls_ca")
        if not tls:
            continue
        # Mutual TLS.
        if len({secrets_for.get(f) for f in TLS_KEYS}) != 1:
            problems.append(f"{name}: the TLS flags read different Secrets {secrets_for}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "grpc" in c.get(probe, {}):
                problems.append(f"{name}: {probe} is a gRPC probe, which the kubelet sends in "
                                "plaintext to a port that speaks TLS only")
        port = flags.get("port")
        host_ip = [e for e in c.get("env", []) if e["name"] == "HOST_IP"]
        if flags.get("advertise_address") != f"$HOST_IP:{port}":
            problems.append(f"{name}: --advertise_address is {flags.get('advertise_address')!r}, "
                            f"not \"$HOST_IP:{port}\" (the certificate names the node's IP)")
        if not host_ip or host_ip[0].get("valueFrom", {}).get("fieldRef", {}).get(
                "fieldPath") != "status.hostIP":
            problems.append(f"{name}: HOST_IP is not the downward API's status.hostIP")
        if not pod.get("hostNetwork"):
            problems.append(f"{name}: not hostNetwork: the pod's address is not the node's IP")
        node = pod.get("nodeSelector", {}).get("kubernetes.io/hostname")
        if node is None:
            problems.append(f"{name}: not pinned to one node (nodeSelector kubernetes.io/hostname)"
                            ": its certificate names one node's IP")
        cert = certificates.get(secrets_for.get("tls_cert"))
        if cert is None:
            problems.append(f"{name}: no Certificate issues Secret {secrets_for.get('tls_cert')}")
            continue
        if cert["spec"].get("isCA"):
            problems.append(f"{name}: mounts the CA's Secret {cert['spec']['secretName']}")
        if cert["metadata"].get("labels", {}).get("hsap.io/node") != node:
            problems.append(f"{name}: runs on node {node} but mounts the certificate of node "
                            f"{cert['metadata'].get('labels', {}).get('hsap.io/node')}")
        peers = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] ==
                 "hsapd-peers"]
        peer_hosts = {}
        if peers:
            for p in peers[0]["data"]["peers"].split(","):
                host, _, p_port = p.rpartition(":")
                peer_hosts[host] = p_port
        ips = cert["spec"].get("ipAddresses", [])
        if len(ips) != 1 or ips[0] not in peer_hosts:
            problems.append(f"{name}: certificate {cert['metadata']['name']} names {ips}; it must "
                            f"name its node's one entry of the peers list {sorted(peer_hosts)}")
        elif peer_hosts[ips[0]] != port:
            problems.append(f"{name}: the peers list has {ips[0]}:{peer_hosts[ips[0]]} but "
                            f"--port is {port}")
    return problems


def check_certificates(docs, where):
    problems = []
    issuers = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
               if d["kind"] in ("Issuer", "ClusterIssuer")}
    certs = [d for d in docs if d["kind"] == "Certificate"]
    by_secret = {(c["metadata"].get("namespace"), c["spec"]["secretName"]): c for c in certs}
    for c in certs:
        name = f"{where}: Certificate {c['metadata']['name']}"
        ref = c["spec"]["issuerRef"]
        kind = ref.get("kind", "Issuer")
        key = (kind, None if kind == "ClusterIssuer" else c["metadata"].get("namespace"),
               ref["name"])
        if key not in issuers:
            problems.append(f"{name}: issuer {kind} {ref['name']} is not defined here")
        if c["spec"].get("isCA"):
            continue
        usages = set(c["spec"].get("usages", []))
        for needed in ("client auth", "server auth", "digital signature"):
            if needed not in usages:
                problems.append(f"{name}: usages lack '{needed}' (a daemon dials and serves; "
                                "hsapd checks client use and signatures)")
    for (kind, _, iname), issuer in issuers.items():
        secret = issuer["spec"].get("ca", {}).get("secretName")
        if secret is None:
            continue
        namespace = CLUSTER_RESOURCE_NAMESPACE if kind == "ClusterIssuer" else \
            issuer["metadata"].get("namespace")
        ca = by_secret.get((namespace, secret))
        if ca is None or not ca["spec"].get("isCA"):
            problems.append(f"{where}: {kind} {iname} signs with Secret {namespace}/{secret}, "
                            "which no CA Certificate here issues")
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    mounted = {}
    for ds in daemonsets:
        for v in ds["spec"]["template"]["spec"].get("volumes", []):
            s = v.get("secret", {}).get("secretName")
            if s is not None and s not in EXTERNAL_SECRETS:
                mounted.setdefault(s, []).append(ds["metadata"]["name"])
    for s, users in mounted.items():
        if len(users) > 1:
            problems.append(f"{where}: Secret {s} is mounted by {users}: a node's key belongs on "
                            "that node only")
    selectors = [tuple(sorted(ds["spec"]["selector"]["matchLabels"].items())) for ds in daemonsets]
    if len(set(selectors)) != len(selectors):
        problems.append(f"{where}: DaemonSets with the same selector fight over their pods")
    return problems


def check_manifest(docs, where):
    problems = []
    for d in docs:
        for field in ("apiVersion", "kind", "metadata"):
            if field not in d:
                problems.append(f"{where}: a document without {field}")
    problems += check_certificates(docs, where)
    for d in docs:
        if d["kind"] == "DaemonSet":
            problems += check_daemonset(d, docs, where)
    return problems


def check_generated(path):
    """hsapd-tls.yaml is make_tls_manifests.py's output for its header's arguments."""
    with open(path) as f:
        text = f.read()
    m = re.search(r"make_tls_manifests\.py\n#   (.*)\n", text)
    if m is None:
        return [f"{path}: no generator arguments in the header"]
    out = subprocess.run([sys.executable, os.path.join(KUBE, "make_tls_manifests.py")] +
                         shlex.split(m.group(1)), capture_output=True, text=True, check=True).stdout
    if out != text:
        return [f"{path} differs from make_tls_manifests.py {m.group(1)}: regenerate it"]
    return []


def self_test(tls_docs):
    """Each break of a valid TLS manifest is reported (the checks can fail)."""
    def daemonset(docs, node):
        return next(d for d in docs if d["kind"] == "DaemonSet" and
                    d["metadata"]["name"] == f"hsapd-{node}")

    def container(docs, node="node-a"):
        return daemonset(docs, node)["spec"]["template"]["spec"]["containers"][0]

    def volume(docs, name, node="node-a"):
        return next(v for v in daemonset(docs, node)["spec"]["template"]["spec"]["volumes"]
                    if v["name"] == name)

    def edit_args(docs, old, new):
        c = container(docs)
        assert old in c["args"][0], old
        c["args"][0] = c["args"][0].replace(old, new)

    def cert(docs, node):
        return next(d for d in docs if d["kind"] == "Certificate" and
                    d["metadata"]["name"] == f"hsapd-{node}")

    breaks = {
        "no volume is mounted": lambda d: container(d)["volumeMounts"].pop(
            next(i for i, m in enumerate(container(d)["volumeMounts"]) if m["name"] == "tls")),
        "maps no key to": lambda d: edit_args(d, "/etc/hsap/tls/tls.key", "/etc/hsap/tls/key.pem"),
        "reads key": lambda d: volume(d, "tls")["secret"]["items"].__setitem__(
            1, {"key": "tls.crt", "path": "tls.key"}),
        "defaultMode": lambda d: volume(d, "tls")["secret"].__setitem__("defaultMode", 0o644),
        "gRPC probe": lambda d: container(d).__setitem__("livenessProbe", {"grpc": {"port": 7070}}),
        "its node's one entry": lambda d: cert(d, "node-a")["spec"].__setitem__(
            "ipAddresses", ["10.0.0.9"]),
        "mounts the certificate of node": lambda d: volume(d, "tls")["secret"].__setitem__(
            "secretName", "hsapd-tls-node-b"),
        "usages lack 'client auth'": lambda d: cert(d, "node-b")["spec"]["usages"].remove(
            "client auth"),
        "--advertise_address": lambda d: edit_args(d, '--advertise_address="$HOST_IP:7070"', ""),
        "no --token_file": lambda d: edit_args(d, "--token_file=/etc/hsap/token/token", ""),
        "all three": lambda d: edit_args(d, "--tls_ca=/etc/hsap/tls/ca.crt", ""),
        "not pinned": lambda d: daemonset(d, "node-a")["spec"]["template"]["spec"].pop(
            "nodeSelector"),
        "not readOnly": lambda d: next(m for m in container(d)["volumeMounts"]
                                       if m["name"] == "tls").pop("readOnly"),
        "no CA Certificate": lambda d: next(c for c in d if c["kind"] == "Certificate" and
                                            c["spec"].get("isCA"))["metadata"].__setitem__(
            "namespace", "hsap"),
        "is not defined here": lambda d: cert(d, "node-a")["spec"]["issuerRef"].__setitem__(
            "name", "some-issuer"),
    }
    failures = []
    for expected, breaker in breaks.items():
        docs = copy.deepcopy(tls_docs)
        breaker(docs)
        problems = check_manifest(docs, "self-test")
        if not any(expected in p for p in problems):
            failures.append(f"self-test: breaking '{expected}' was not reported (got {problems})")
    return failures


def main():
    problems = []
    files = sorted(f for f in os.listdir(KUBE) if f.endswith(".yaml"))
    if "hsapd-tls.yaml" not in files or "hsapd-daemonset.yaml" not in files:
        problems.append(f"{KUBE}: expected hsapd-daemonset.yaml and hsapd-tls.yaml, found {files}")
    loaded = {}
    for f in files:
        try:
            loaded[f] = load(os.path.join(KUBE, f))
        except yaml.YAMLError as e:
            problems.append(f"{f}: not valid YAML: {e}")
    for f, docs in loaded.items():
        problems += check_manifest(docs, f)
        print(f"{f}: {len(docs)} documents: " + ", ".join(
            f"{d['kind']} {d['metadata']['name']}" for d in docs))
    if "hsapd-tls.yaml" in loaded:
        problems += check_generated(os.path.join(KUBE, "hsapd-tls.yaml"))
        problems += self_test(loaded["hsapd-tls.yaml"])
    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print("kubernetes_manifest_test: all checks passed (and every self-test break was reported)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
