"""`make kube-check`: the chart on a real kube-apiserver (shared/kube-kit builds etcd,
kube-apiserver and kube-controller-manager from MicroShift's vendored Kubernetes).

For every scenario (deploy/helm/echelon/ci/*-values.yaml), in its own namespace that
enforces PodSecurity `restricted`:

1. `kubectl apply --dry-run=server --validate=strict` of what the chart renders: every
   object, custom resources included, against the real API (and the CRDs' real schemas);
2. `helm install` (Helm's engine through helm-python-sdk);
3. the pods the controllers create from it (StatefulSets; DaemonSets on two Node objects
   registered for the purpose; a Job made from the CronJob), and every refusal
   (FailedCreate events: PodSecurity, quota, ...); the SparkApplication's driver and
   executor pods built as the spark-operator builds them, created with --dry-run=server
   (there is no operator here);
4. `helm upgrade` (logLevel debug) and `helm uninstall`, and what is left (the
   membership claims are kept by design).

There is no kubelet and no scheduler: pods stay Pending, which is enough for admission
and the controllers. CRDs come from their upstream YAML (`--crds DIR`, filled by
tests/kube/crds.sh from fetched repositories); a CRD that is absent is named and the
scenarios that need it are checked with --dry-run=client only.

Exit 0 when every scenario installs, every controller-created pod is admitted and
upgrade and uninstall succeed; the table says what happened.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loadtest.daemons import wait_ready

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "echelon"
KIT = Path(os.environ.get("KUBE_KIT", Path.home() / ".cache" / "echelon-kube"))
BINARIES = ("etcd", "kube-apiserver")  # and kube-controller-manager, without which no pod is created
# The CRDs the chart's scenarios use, by the resource they define.
CRDS = {
    "servicemonitors.monitoring.coreos.com": "monitoring.coreos.com_servicemonitors.yaml",
    "prometheusrules.monitoring.coreos.com": "monitoring.coreos.com_prometheusrules.yaml",
    "scheduledsparkapplications.sparkoperator.k8s.io": "sparkoperator.k8s.io_scheduledsparkapplications.yaml",
    "sparkapplications.sparkoperator.k8s.io": "sparkoperator.k8s.io_sparkapplications.yaml",
    "certificates.cert-manager.io": "cert-manager.io_certificates.yaml",
    "issuers.cert-manager.io": "cert-manager.io_issuers.yaml",
}
NODES = {"node-a": "europe-west1-b", "node-b": "us-east1-c"}  # the regions scenario's zones
RELEASE = "echelon"


def missing_binaries(bin_dir: Path | None) -> str:
    """Why the check cannot run here ("" when it can)."""
    if bin_dir is None:
        return "no binaries directory (set ECHELON_KUBE_BIN or pass --bin; shared/kube-kit builds them)"
    absent = [b for b in BINARIES if not (bin_dir / b).exists()]
    if absent:
        return f"{', '.join(absent)} not in {bin_dir} (shared/kube-kit/build.sh builds them)"
    if kubectl_path() is None:
        return "no kubectl (shared/kube-kit/build.sh installs one; or put it on PATH)"
    return ""


def kubectl_path() -> str | None:
    local = KIT / "go" / "bin" / "kubectl"
    return str(local) if local.exists() else shutil.which("kubectl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ApiServer:
    """etcd (127.0.0.1:2379, fixed by kube-kit's build), kube-apiserver on a free port,
    kube-controller-manager; stopped by their pids."""

    bin_dir: Path
    work: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    kubeconfig: Path | None = None

    @property
    def controllers(self) -> bool:
        return (self.bin_dir / "kube-controller-manager").exists()

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (the child keeps it)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def start(self) -> ApiServer:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 2379)) == 0:
                raise RuntimeError("127.0.0.1:2379 is taken (another etcd): kube-kit's etcd listens there")
        w = self.work
        subprocess.run(["openssl", "genrsa", "-out", w / "sa.key", "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", w / "sa.key", "-pubout", "-out", w / "sa.pub"], check=True,
                       capture_output=True)
        token = os.urandom(16).hex()
        (w / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
        port = free_port()
        self.kubeconfig = w / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                       "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}]}))
        self._spawn("etcd", ["nice", "-n", "10", str(self.bin_dir / "etcd"), str(w / "etcd-data")])
        self._wait(lambda: "etcd ready" in (w / "etcd.log").read_text(), 60, "etcd")
        self._spawn("apiserver", [
            "nice", "-n", "10", str(self.bin_dir / "kube-apiserver"), "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={w / 'certs'}", "--service-cluster-ip-range=10.96.0.0/16",
            f"--service-account-key-file={w / 'sa.pub'}", f"--service-account-signing-key-file={w / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--token-auth-file={w / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,"
            "ResourceQuota,PodSecurity"])
        self._wait(lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 180,
                   "kube-apiserver /readyz")
        if not self.controllers:
            return self
        self._spawn("kcm", ["nice", "-n", "10", str(self.bin_dir / "kube-controller-manager"),
                            f"--kubeconfig={self.kubeconfig}", f"--service-account-private-key-file={w / 'sa.key'}",
                            "--use-service-account-credentials=true", "--leader-elect=false",
                            "--bind-address=127.0.0.1", f"--secure-port={free_port()}"])
        return self

    def _wait(self, ready, timeout: float, what: str) -> None:
        wait_ready(ready, timeout, what, self.procs, self.work.glob("*.log"), interval=1.0)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([kubectl_path(), "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r

    def json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@dataclass
class Outcome:
    scenario: str
    validated: str = ""
    installed: str = ""
    pods: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    upgraded: str = ""
    uninstalled: str = ""
    left: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.validated.startswith("ok") and self.installed == "ok" and not self.refused
                and self.upgraded == "ok" and self.uninstalled == "ok")


def install_crds(api: ApiServer, crds: Path | None) -> list[str]:
    """Apply the CRDs found in `crds`; returns the names of those that are absent."""
    absent = []
    for name, file in CRDS.items():
        path = crds / file if crds else None
        if path is None or not path.exists():
            absent.append(name)
            continue
        api.kubectl("apply", "--server-side", "-f", str(path))
    for name in CRDS:
        if name not in absent:
            api.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return absent


def register_nodes(api: ApiServer) -> None:
    """Node objects (no kubelet behind them), so the DaemonSet controller creates pods."""
    for name, zone in NODES.items():
        api.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  "topology.kubernetes.io/zone": zone}}}))


def mark_ready(api: ApiServer) -> None:
    """Heartbeat for the kubelet-less nodes: without one the node lifecycle controller
    taints them unreachable about a minute after they register, and the DaemonSet
    controller then places no pod on them (the later scenarios' agents went missing)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in NODES:
        api.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(
            {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeCheck",
                                        "message": "no kubelet: kept ready by kube-check",
                                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}))
        api.kubectl("patch", "node", name, "--type=merge", "-p", '{"spec": {"taints": null}}')


def spark_pods(manifest: list[dict], namespace: str) -> list[dict]:
    """The driver and one executor pod of the ScheduledSparkApplication, built as the
    spark-operator builds them (the template's pod-level and container-level security
    contexts, volumes, mounts, env, service account)."""
    out = []
    for o in manifest:
        if o.get("kind") != "ScheduledSparkApplication":
            continue
        app = o["spec"]["template"]
        for role in ("driver", "executor"):
            spec = app[role]
            container = {"name": f"spark-kubernetes-{role}", "image": app["image"],
                         "securityContext": spec.get("securityContext", {}), "env": spec.get("env", []),
                         "volumeMounts": spec.get("volumeMounts", [])}
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"{o['metadata']['name']}-{role}", "namespace": namespace,
                                "labels": spec.get("labels", {})},
                   "spec": {"restartPolicy": "Never", "containers": [container],
                            "securityContext": spec.get("podSecurityContext", {}),
                            "volumes": app.get("volumes", [])}}
            if spec.get("serviceAccount"):
                pod["spec"]["serviceAccountName"] = spec["serviceAccount"]
            out.append(pod)
    return out


def check_scenario(api: ApiServer, values_file: Path, absent_crds: list[str]) -> Outcome:
    import helm_python

    scenario = values_file.name.removesuffix("-values.yaml")
    ns = f"kc-{scenario}"
    out = Outcome(scenario)
    values = yaml.safe_load(values_file.read_text()) or {}
    mark_ready(api)
    api.kubectl("create", "namespace", ns)
    api.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/warn=restricted", "pod-security.kubernetes.io/audit=restricted")
    rendered = helm_python.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=ns)
    manifest = [d for p, t in sorted(rendered.items()) if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
    text = yaml.safe_dump_all(manifest)
    kinds = {f"{d['kind']}" for d in manifest}
    needs_absent = [c for c in absent_crds if any(c.split(".")[0].rstrip("s") == k.lower() for k in kinds)]
    mode = "client" if needs_absent else "server"
    r = api.kubectl("apply", f"--dry-run={mode}", "--validate=strict", "-n", ns, "-f", "-", stdin=text, check=False)
    out.validated = f"ok ({mode}, {len(manifest)} objects)" if r.returncode == 0 else f"FAILED: {r.stderr.strip()[:300]}"
    if needs_absent:
        out.notes.append(f"CRDs absent: {', '.join(needs_absent)}: not installed, validated client-side only")
        return out
    config = helm_python.Config(kubeconfig_path=str(api.kubeconfig), namespace=ns)
    try:
        config.install(str(CHART), RELEASE, values, namespace=ns)
        out.installed = "ok"
    except helm_python.HelmError as e:
        out.installed = f"FAILED: {e}"
        return out
    # The controllers' work: StatefulSet and DaemonSet pods, and a run of the CronJob.
    for cron in api.json("-n", ns, "get", "cronjobs")["items"]:
        api.kubectl("-n", ns, "create", "job", f"{cron['metadata']['name']}-check",
                    f"--from=cronjob/{cron['metadata']['name']}")
    for pod in spark_pods(manifest, ns):
        r = api.kubectl("create", "--dry-run=server", "-n", ns, "-f", "-", stdin=json.dumps(pod), check=False)
        if r.returncode == 0:
            out.pods.append(f"{pod['metadata']['name']} (built as the spark-operator would, --dry-run=server)")
        else:
            out.refused.append(f"{pod['metadata']['name']}: {r.stderr.strip()[:300]}")
    if not api.controllers:
        out.notes.append("no kube-controller-manager binary: no controller creates pods")
        expected = 0
    else:
        expected = sum(int(o["spec"].get("replicas", 1)) for o in manifest if o["kind"] == "StatefulSet")
        expected += len(NODES) if any(o["kind"] == "DaemonSet" for o in manifest) else 0
        expected += sum(int(o["spec"].get("replicas", 1)) for o in manifest if o["kind"] == "Deployment")
        expected += len(api.json("-n", ns, "get", "cronjobs")["items"])
    deadline = time.monotonic() + 90
    pods: list[str] = []
    while time.monotonic() < deadline:
        pods = sorted(p["metadata"]["name"] for p in api.json("-n", ns, "get", "pods")["items"])
        refused = failed_creates(api, ns)
        if len(pods) >= expected or refused:
            break
        time.sleep(2)
    out.pods += pods
    out.refused += failed_creates(api, ns)
    if len(pods) < expected and not out.refused:
        out.notes.append(f"{len(pods)} of {expected} expected pods created")
    try:
        config.upgrade(str(CHART), RELEASE, {**values, "logLevel": "debug"}, namespace=ns)
        out.upgraded = "ok"
        out.notes.append(f"upgrade: {len(config.history(RELEASE))} revisions in the release's history")
    except helm_python.HelmError as e:
        out.upgraded = f"FAILED: {e}"
    try:
        config.uninstall(RELEASE)
        out.uninstalled = "ok"
    except helm_python.HelmError as e:
        out.uninstalled = f"FAILED: {e}"
    time.sleep(3)
    left = api.kubectl("-n", ns, "get", "all,pvc,cm,secret,sa,role,rolebinding,networkpolicy,pdb", "-l",
                       f"app.kubernetes.io/instance={RELEASE}", "-o", "name", check=False).stdout.split()
    out.left = left
    return out


def failed_creates(api: ApiServer, ns: str) -> list[str]:
    events = api.json("-n", ns, "get", "events")["items"]
    return sorted({f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e['message'][:300]}"
                   for e in events if e.get("reason") == "FailedCreate"})


def table(outcomes: list[Outcome], absent: list[str]) -> str:
    lines = [f"{'scenario':<22}{'validate':<28}{'install':<9}{'pods':>5}{'refused':>9}{'upgrade':>9}"
             f"{'uninstall':>11}{'left':>6}"]
    for o in outcomes:
        lines.append(f"{o.scenario:<22}{o.validated[:27]:<28}{o.installed[:8]:<9}{len(o.pods):>5}"
                     f"{len(o.refused):>9}{o.upgraded[:8]:>9}{o.uninstalled[:10]:>11}{len(o.left):>6}")
    for o in outcomes:
        lines.append(f"\n{o.scenario}: pods created by the controllers (namespace kc-{o.scenario}, "
                     f"PodSecurity restricted enforced):")
        lines += [f"  {p}" for p in o.pods] or ["  none"]
        lines += [f"  REFUSED {r}" for r in o.refused]
        lines += [f"  left after uninstall: {x}" for x in o.left]
        lines += [f"  note: {n}" for n in o.notes]
        for field_name in ("validated", "installed", "upgraded", "uninstalled"):
            value = getattr(o, field_name)
            if value and not value.startswith("ok"):
                lines.append(f"  {field_name}: {value}")
    if absent:
        lines.append(f"\nCRDs not available offline: {', '.join(absent)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, default=Path(os.environ["ECHELON_KUBE_BIN"])
                    if os.environ.get("ECHELON_KUBE_BIN") else None, help="kube-kit's bin directory")
    ap.add_argument("--crds", type=Path, default=Path(os.environ.get("ECHELON_KUBE_CRDS", KIT / "crds")))
    ap.add_argument("--only", default="", help="one scenario (a ci/*-values.yaml stem without -values)")
    args = ap.parse_args(argv)
    reason = missing_binaries(args.bin)
    if reason:
        print(f"kube-check skipped: {reason}")
        return 0
    files = sorted((CHART / "ci").glob("*-values.yaml"))
    if args.only:
        files = [f for f in files if f.name == f"{args.only}-values.yaml"]
    work = Path(tempfile.mkdtemp(prefix="kube-check-"))
    api = ApiServer(args.bin, work)
    try:
        api.start()
        version = json.loads(api.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
        print(f"kube-apiserver {version} on {api.kubeconfig} (work dir {work})")
        absent = install_crds(api, args.crds if args.crds.exists() else None)
        register_nodes(api)
        outcomes = [check_scenario(api, f, absent) for f in files]
    finally:
        api.stop()
    print(table(outcomes, absent))
    bad = [o.scenario for o in outcomes if not o.ok and not any("CRDs absent" in n for n in o.notes)]
    print(f"\n{len(outcomes) - len(bad)} of {len(outcomes)} scenarios passed" + (f"; failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
