"""values.yaml: every key documented, every key used (changing it changes what the real
Helm engine renders), and values.schema.json refusing wrong values."""

from __future__ import annotations

import copy
import json
import re

import pytest

from tests.deploy.chart import CHART, ci_values, helm, objects, of_kind, pod_template, render

VALUES = CHART / "values.yaml"
KEY = re.compile(r"^(\s*)([A-Za-z_][\w.-]*):")


def test_every_key_is_commented():
    lines = VALUES.read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        m = KEY.match(line)
        if not m:
            continue
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        if not before.strip().startswith("#") or not before.startswith(m.group(1) + "#"):
            missing.append(f"{i + 1}: {line.strip()}")
    assert missing == []


def _leaves(values, path=()):
    if isinstance(values, dict) and values:
        for k, v in values.items():
            yield from _leaves(v, (*path, k))
    else:
        yield path, values


# Values constrained by a pattern in the schema: a valid other value.
OTHER = {
    ("image", "tag"): "9.9.9", ("routingJob", "image", "tag"): "9.9.9",
    ("image", "digest"): "sha256:" + "a" * 64, ("routingJob", "image", "digest"): "sha256:" + "a" * 64,
    ("routingJob", "master"): "local[3]", ("routingJob", "sparkOperator", "sparkVersion"): "9.9.9",
    ("routingJob", "sparkOperator", "driver", "memory"): "3g",
    ("routingJob", "sparkOperator", "executor", "memory"): "3g",
    ("metrics", "serviceMonitor", "interval"): "17s", ("routingJob", "mainApplicationFile"): "/x.py",
    ("routingJob", "prometheusUrl"): "http://prometheus:9090",
    ("agent", "kind"): "Deployment", ("agent", "dissemination"): "p2p", ("logLevel",): "debug",
    ("agent", "service", "type"): "NodePort", ("agent", "service", "internalTrafficPolicy"): "Cluster",
    ("image", "pullPolicy"): "Always", ("routingJob", "image", "pullPolicy"): "Always",
    ("podSecurityContext", "seccompProfile", "type"): "Localhost",
    ("routingJob", "args"): ["--dry-run"], ("imagePullSecrets",): [{"name": "x"}],
    ("router", "regions"): [{"name": "zone-x"}],
    ("networkPolicy", "clientsFrom"): [{"podSelector": {}}], ("networkPolicy", "metricsFrom"): [{"podSelector": {}}],
    ("routingJob", "sparkConf"): {"spark.x": "1"},
    ("agent", "durable", "storage"): "hostPath", ("agent", "durable", "fsync"): "always",
    ("agent", "durable", "sizeLimit"): "2Gi", ("membership", "persistence", "size"): "5Gi",
    ("tls", "source"): "secrets", ("tls", "certManager", "issuerRef", "kind"): "ClusterIssuer",
    ("tls", "certManager", "duration"): "12h", ("tls", "certManager", "renewBefore"): "4h",
    ("tls", "certManager", "caDuration"): "8760h",
    ("auth", "mode"): "tokens", ("auth", "jwt", "jwksUrl"): "https://other.example/jwks",
    ("auth", "superusers"): ["ops"], ("auth", "limits"): "publish_rate=7",
    ("auth", "identityCaps"): {"user:ann": {"subscriptions": 3}},
}


def _mutate(path, value):
    if path in OTHER:
        return OTHER[path]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + "x" if value else "x"
    if isinstance(value, list):
        return [*value, "--mutated"] if path[-1] == "extraArgs" else [*value, {"key": "mutated"}]
    if isinstance(value, dict):
        return {"mutated": "x"}
    raise AssertionError(path)


def _get(values, path, default):
    for k in path:
        if not isinstance(values, dict) or k not in values:
            return default
        values = values[k]
    return values


def _set(values, path, value):
    out = copy.deepcopy(values)
    node = out
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value
    return out


def test_every_key_changes_the_output():
    import yaml

    defaults = yaml.safe_load(VALUES.read_text())
    everything = {"agent": {"kind": "Deployment", "regionFromNode": {"enabled": True},
                            "durable": {"storage": "hostPath"}},
                  "router": {"enabled": True, "regions": [{"name": "zone-a"}]},
                  "metrics": {"serviceMonitor": {"enabled": True}}}
    tls_secrets = ci_values(CHART / "ci" / "tls-secrets-values.yaml") | {"router": everything["router"]}
    # cert-manager, with every Secret named too, so that switching the source renders.
    tls_cert_manager = {"tls": ci_values(CHART / "ci" / "tls-values.yaml")["tls"] | {"secrets": tls_secrets["tls"]["secrets"]}}
    auth = ci_values(CHART / "ci" / "auth-values.yaml")
    jwt = {**tls_cert_manager, "auth": auth["auth"] | {"mode": "jwt", "jwt": {"jwksUrl": "https://idp.example/jwks"}}}
    bases = [{}, everything, ci_values(CHART / "ci" / "spark-operator-values.yaml"), tls_cert_manager, tls_secrets,
             auth, jwt]
    pending = set()
    if (CHART / "files" / "prometheus" / "rules.yaml").exists():
        bases.append({"metrics": {"prometheusRule": {"enabled": True}}})
    else:  # the rules file arrives with the observability issue
        pending |= {"metrics.prometheusRule.enabled", "metrics.prometheusRule.labels"}
    rendered = [render(b) for b in bases]
    unused = []
    for path, value in _leaves(defaults):
        changed = False
        for base, before in zip(bases, rendered):
            try:
                after = render(_set(base, path, _mutate(path, _get(base, path, value))))
            except helm().HelmValuesError as e:
                pytest.fail(f"{'.'.join(path)}: the mutation broke the schema: {e}")
            except helm().HelmRenderError:
                continue
            if after != before:
                changed = True
                break
        if not changed and ".".join(path) not in pending:
            unused.append(".".join(path))
    assert unused == []


@pytest.mark.parametrize("values", [
    {"membership": {"replicas": "three"}},
    {"agent": {"kind": "Pod"}},
    {"image": {"tag": "latest"}},
    {"agent": {"port": 70000}},
    {"agent": {"prot": 7200}},
    {"routingJob": {"master": "yarn"}},
    {"membership": {"persistence": {"size": "lots"}}},
    {"routingJob": {"activeDeadlineSeconds": 30}},
    {"router": {"regions": [{"name": "Not A DNS Label"}]}},
    {"matcher": {"resources": {"requests": {"cpu": ["1"]}}}},
], ids=json.dumps)
def test_schema_refuses(values):
    with pytest.raises(helm().HelmValuesError):
        render(values)


def test_a_termination_period_shorter_than_the_drain_is_refused():
    with pytest.raises(helm().HelmRenderError, match="must exceed matcher.grace"):
        render({"matcher": {"grace": 40}})


def test_an_integer_cpu_per_pod_makes_agents_and_matchers_guaranteed():
    """docs/operations.md, "CPU placement": requests equal to limits with a whole CPU give the
    pod Guaranteed QoS, which the kubelet's static CPU manager needs to give it a core of its
    own; that holds only if every container of the pod (init ones too) has them."""
    whole = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    objs = objects({"agent": {"resources": whole}, "matcher": {"resources": whole}})
    pods = {o["metadata"]["name"]: pod_template(o)["spec"] for o in of_kind(objs, "StatefulSet", "DaemonSet",
                                                                          "Deployment")}
    placed = {name: spec for name, spec in pods.items() if "agent" in name or "matcher" in name}
    assert len(placed) >= 2, sorted(pods)
    for name, spec in placed.items():
        for c in spec.get("initContainers", []) + spec["containers"]:
            res = c.get("resources", {})
            assert res.get("requests") and res.get("requests") == res.get("limits"), (name, c["name"], res)
            assert str(res["limits"]["cpu"]).isdigit(), (name, c["name"], res)
