"""The chart's own rules, checked on what the real Helm engine renders for every
ci/*-values.yaml: labels, probes, ports, security, images, termination periods, the
services' arguments parsed by the real `echelon` CLI, stable membership addresses."""

from __future__ import annotations

import re

import click
import pytest

from echelon.cli.main import cli
from tests.deploy.chart import (CHART, CI_FILES, NAMESPACE, ROOT, ci_values, expand, flag, objects,
                                of_kind, pod_template, service_containers)

LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
          "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart")
ROLES = {"membership", "matcher", "agent", "router"}


@pytest.fixture(params=CI_FILES, ids=lambda p: p.stem)
def objs(request):
    return objects(ci_values(request.param))


def test_labels_on_every_object(objs):
    for o in objs:
        labels = o["metadata"].get("labels", {})
        assert all(k in labels for k in LABELS), (o["kind"], o["metadata"]["name"], labels)
        tpl = pod_template(o)
        if tpl is not None and o["kind"] != "Pod":
            selector = o["spec"].get("selector", {}).get("matchLabels", {})
            assert selector.items() <= tpl["metadata"]["labels"].items()


def test_selectors_are_the_stable_three(objs):
    """Selector labels never change on upgrade: no version or chart label in them."""
    for o in objs:
        sel = o.get("spec", {}).get("selector")
        if o["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "PodDisruptionBudget"):
            sel = sel["matchLabels"]
        if o["kind"] in ("Service", "StatefulSet", "Deployment", "DaemonSet", "PodDisruptionBudget"):
            assert set(sel) == {"app.kubernetes.io/name", "app.kubernetes.io/instance",
                                "app.kubernetes.io/component"}


def test_pods_are_locked_down(objs):
    for o in objs:
        tpl = pod_template(o)
        if tpl is None:
            continue
        spec = tpl["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
            image = c["image"]
            assert re.fullmatch(r"[^:@]+(/[^:@]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]*(@sha256:[0-9a-f]{64})?", image), image
            assert not image.split("@")[0].endswith(":latest")


def test_every_service_container_has_grpc_probes_and_named_ports(objs):
    found = set()
    for o, c in service_containers(objs):
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        args = c["args"]
        tls = any(e["name"] == "ECHELON_TLS_DIR" for e in c["env"])
        # With TLS the kubelet's probes (no TLS) go to the plain-text health port, and an
        # agent offers a port for token clients.
        expected = {"grpc", "metrics"} | ({"health"} if tls else set()) | \
            ({"grpc-token"} if tls and args[0] == "agent" else set())
        assert set(ports) == expected
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == ports["health" if tls else "grpc"], (o["metadata"]["name"], probe)
        assert int(flag(args, "--port")) == ports["grpc"] and int(flag(args, "--metrics-port")) == ports["metrics"]
        if tls:
            assert int(flag(args, "--health-port")) == ports["health"]
            if args[0] == "agent":
                assert int(flag(args, "--client-port")) == ports["grpc-token"]
        found.add(args[0])
    assert {"membership", "matcher", "agent"} <= found


def test_termination_period_exceeds_the_drain(objs):
    for o, c in service_containers(objs):
        tgps = o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert tgps > float(flag(c["args"], "--grace"))


def _context(c: dict, env: dict[str, str] | None = None) -> click.Context:
    """The container's arguments parsed by the real CLI (types and ranges validated)."""
    args = [expand(a) for a in c["args"]]
    command = cli.commands[args[0]]
    return command.make_context(args[0], args[1:], auto_envvar_prefix=f"ECHELON_{args[0].upper()}",
                                default_map=None, obj=env)


def test_services_start_with_arguments_their_cli_accepts(objs):
    for o, c in service_containers(objs):
        ctx = _context(c)
        p = ctx.params
        assert p["host"] == "0.0.0.0"
        role = c["args"][0]
        name = o["metadata"]["name"]
        if o["kind"] == "StatefulSet":
            assert p["member_id"] == "echelon-x-0"  # the pod's name: stable in a StatefulSet
        elif o["kind"] == "DaemonSet":
            # The node's name (one agent per node), or the pod's when cert-manager's
            # csi-driver, which cannot name the node, issues the certificate.
            csi = any("csi" in v for v in o["spec"]["template"]["spec"]["volumes"])
            assert p["member_id"] == ("echelon-x-0" if csi else "node-a")
        if role == "membership":
            assert p["advertise"] == f"echelon-x-0.{name}.{NAMESPACE}.svc.cluster.local:{p['port']}"
        else:
            assert p["advertise"] == f"10.1.2.3:{p['port']}"  # the pod's IP, from the downward API


def test_peers_and_membership_are_the_stable_dns_names(objs):
    (sts,) = [o for o in of_kind(objs, "StatefulSet") if o["metadata"]["name"].endswith("-membership")]
    svc = [s for s in of_kind(objs, "Service") if s["metadata"]["name"] == sts["spec"]["serviceName"]]
    assert len(svc) == 1 and svc[0]["spec"]["clusterIP"] == "None"
    assert svc[0]["spec"]["publishNotReadyAddresses"] is True  # replicas sync before they are ready
    name, n = sts["metadata"]["name"], sts["spec"]["replicas"]
    port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    expected = ",".join(f"{name}-{i}.{name}.{NAMESPACE}.svc.cluster.local:{port}" for i in range(n))
    for o, c in service_containers(objs):
        assert flag(c["args"], "--peers" if c["args"][0] == "membership" else "--membership") == expected


def test_statefulsets_have_their_headless_service_and_pdb():
    objs = objects()
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    pdbs = {p["metadata"]["name"] for p in of_kind(objs, "PodDisruptionBudget")}
    for sts in of_kind(objs, "StatefulSet"):
        assert services[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
        assert sts["metadata"]["name"] in pdbs
    membership = [s for s in of_kind(objs, "StatefulSet") if s["metadata"]["name"].endswith("-membership")]
    assert membership[0]["spec"]["replicas"] == 3


def test_agent_service_keeps_clients_on_their_node():
    objs = objects()
    (ds,) = of_kind(objs, "DaemonSet")
    client = [s for s in of_kind(objs, "Service") if s["metadata"]["name"] == ds["metadata"]["name"]]
    assert client[0]["spec"]["internalTrafficPolicy"] == "Local"
    assert "topologySpreadConstraints" not in ds["spec"]["template"]["spec"]  # one per node already
    assert [p["name"] for p in client[0]["spec"]["ports"]] == ["grpc"]
    minimal = objects(ci_values(CHART / "ci" / "minimal-values.yaml"))
    (dep,) = of_kind(minimal, "Deployment")
    client = [s for s in of_kind(minimal, "Service") if s["metadata"]["name"] == dep["metadata"]["name"]]
    assert dep["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert client[0]["spec"]["internalTrafficPolicy"] == "Cluster"  # agents are not on every node


def test_region_from_node():
    """The init container reads the node's label with the kubernetes client and the agent
    takes it through its ECHELON_AGENT_REGION fallback. The script itself needs an API
    server to run, which this machine cannot have: it is compiled, not run."""
    objs = objects(ci_values(CHART / "ci" / "regions-values.yaml"))
    (ds,) = of_kind(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    compile(init["args"][0], "region-from-node", "exec")
    assert "topology.kubernetes.io/zone" in init["args"][0] and spec["automountServiceAccountToken"] is True
    agent = spec["containers"][0]
    assert "--region" not in agent["args"] and "ECHELON_AGENT_REGION" in agent["command"][2]
    ctx = cli.commands["agent"].make_context(
        "agent", [expand(a) for a in agent["args"][1:]], auto_envvar_prefix="ECHELON_AGENT")
    assert ctx.params["region"] == "local"  # without the variable: the default
    import os
    os.environ["ECHELON_AGENT_REGION"] = "europe-west1-b"
    try:
        ctx = cli.commands["agent"].make_context(
            "agent", [expand(a) for a in agent["args"][1:]], auto_envvar_prefix="ECHELON_AGENT")
    finally:
        del os.environ["ECHELON_AGENT_REGION"]
    assert ctx.params["region"] == "europe-west1-b"
    (role,) = of_kind(objs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    (binding,) = of_kind(objs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]


def test_no_api_access_unless_needed():
    """RBAC only for what is read: nothing by default, and no token mounted."""
    objs = objects()
    assert not of_kind(objs, "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    for o in objs:
        tpl = pod_template(o)
        if tpl is not None:
            assert tpl["spec"]["automountServiceAccountToken"] is False, o["metadata"]["name"]


def test_routers_one_statefulset_per_region():
    objs = objects(ci_values(CHART / "ci" / "regions-values.yaml"))
    routers = {o["metadata"]["labels"]["echelon.io/region"]: o for o in of_kind(objs, "StatefulSet")
               if "echelon.io/region" in o["metadata"]["labels"]}
    assert set(routers) == {"europe-west1-b", "us-east1-c"}
    for region, sts in routers.items():
        spec = sts["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"topology.kubernetes.io/zone": region}
        assert flag(spec["containers"][0]["args"], "--region") == region
    assert not [o for o in of_kind(objects(), "StatefulSet") if "router" in o["metadata"]["name"]]


def test_network_policies_open_only_named_service_ports(objs):
    pods = {o["metadata"]["name"]: o for o in objs if pod_template(o) is not None}
    for np in of_kind(objs, "NetworkPolicy"):
        target = np["spec"]["podSelector"]["matchLabels"]
        matched = [p for p in pods.values() if target.items() <= pod_template(p)["metadata"]["labels"].items()]
        assert matched, np["metadata"]["name"]
        names = {port["name"] for p in matched for c in pod_template(p)["spec"]["containers"] for port in c["ports"]}
        for rule in np["spec"]["ingress"]:
            assert {p["port"] for p in rule["ports"]} <= names <= {"grpc", "metrics", "health", "grpc-token"}


def test_prometheus_scrape_annotations_or_servicemonitor():
    plain = objects()
    assert not of_kind(plain, "ServiceMonitor")
    for o, c in service_containers(plain):
        ann = o["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true"
        assert ann["prometheus.io/port"] == str(int(flag(c["args"], "--metrics-port")))
    operator = objects(ci_values(CHART / "ci" / "prometheus-operator-values.yaml"))
    (sm,) = of_kind(operator, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for o, c in service_containers(operator):
        assert "prometheus.io/scrape" not in o["spec"]["template"]["metadata"].get("annotations", {})
        assert o["spec"]["template"]["metadata"]["labels"]["echelon.io/role"] == c["args"][0]
    targets = [s for s in of_kind(operator, "Service")
               if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
               and any(p["name"] == "metrics" for p in s["spec"]["ports"])]
    assert {s["spec"]["selector"]["app.kubernetes.io/component"] for s in targets} == {"membership", "matcher", "agent"}


def test_chart_app_version_is_the_package_version():
    import tomllib

    import yaml

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == version
