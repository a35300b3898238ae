"""The chart rendered by the real Helm engine for every ci/*-values.yaml, linted strictly,
and every object validated: standard kinds against the Kubernetes 1.30 OpenAPI schemas
(kubernetes-validate --strict), Prometheus Operator kinds against typed models generated
from their CRDs (cloudcoil), the spark-operator kind against the fields we use.

What cannot be real here: no kube-apiserver can run on this machine (no registry ships
one, no Docker engine for kind), so nothing is applied to a cluster and there is no
server-side dry run; `helm install --dry-run=client` is as far as Helm goes.
"""

from __future__ import annotations

import copy

import pytest

from tests.deploy.chart import (CHART, CI_FILES, KUBE_VERSION, ci_values, helm, objects, of_kind,
                                render)

kubernetes_validate = pytest.importorskip("kubernetes_validate")
CUSTOM = {"ServiceMonitor", "PrometheusRule", "ScheduledSparkApplication", "SparkApplication", "Certificate", "Issuer"}


@pytest.fixture(params=CI_FILES, ids=lambda p: p.stem)
def scenario(request):
    return ci_values(request.param)


def test_every_scenario_is_there():
    names = {p.name for p in CI_FILES}
    assert {"default-values.yaml", "minimal-values.yaml", "regions-values.yaml",
            "prometheus-operator-values.yaml", "spark-operator-values.yaml"} <= names


def test_lint_strict(scenario):
    result = helm().lint(str(CHART), scenario, strict=True, kube_version=f"v{KUBE_VERSION}")
    # Severity 1 is INFO ("icon is recommended": the project has no icon to point to).
    assert result["errors"] == [] and [m for m in result["messages"] if m["severity"] > 1] == []


def test_standard_objects_validate_strictly(scenario):
    checked = 0
    for obj in objects(scenario):
        if obj["kind"] in CUSTOM:
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        checked += 1
    assert checked >= 10


def test_the_validator_can_fail():
    """The oracle is live: an unknown field and a wrong type are refused."""
    sts = copy.deepcopy(of_kind(objects(), "StatefulSet")[0])
    sts["spec"]["replica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSION, strict=True)
    sts = copy.deepcopy(of_kind(objects(), "StatefulSet")[0])
    sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSION, strict=True)


def _dropped(original, dumped, path="") -> list[str]:
    """Keys of `original` the model did not keep (pydantic ignores unknown fields), or changed."""
    if isinstance(original, dict):
        if not isinstance(dumped, dict):
            return [path]
        return [p for k, v in original.items() for p in
                ([f"{path}.{k}"] if k not in dumped else _dropped(v, dumped[k], f"{path}.{k}"))]
    if isinstance(original, list):
        if not isinstance(dumped, list) or len(dumped) != len(original):
            return [path]
        return [p for i, (a, b) in enumerate(zip(original, dumped)) for p in _dropped(a, b, f"{path}[{i}]")]
    return [] if original == dumped or str(original) == str(dumped) else [path]


def check_prometheus_operator(obj: dict) -> None:
    """Typed models generated from the Prometheus Operator's CRDs: types and patterns are
    checked by pydantic, unknown fields by a round trip (the models ignore extras)."""
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, obj["kind"]).model_validate(obj)
    dumped = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert _dropped(obj, dumped) == [], f"{obj['kind']}: fields unknown to the CRD"


def test_prometheus_operator_resources():
    objs = objects(ci_values(CHART / "ci" / "prometheus-operator-values.yaml"))
    kinds = {o["kind"] for o in objs}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds
    for obj in of_kind(objs, "ServiceMonitor", "PrometheusRule"):
        check_prometheus_operator(obj)


def test_crd_check_can_fail():
    from pydantic import ValidationError

    sm = copy.deepcopy(of_kind(objects({"metrics": {"serviceMonitor": {"enabled": True}}}), "ServiceMonitor")[0])
    sm["spec"]["endpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(ValidationError):
        check_prometheus_operator(sm)
    sm["spec"]["endpoints"][0]["interval"] = "30s"
    sm["spec"]["endpoints"][0]["portName"] = "metrics"
    with pytest.raises(AssertionError, match="unknown to the CRD"):
        check_prometheus_operator(sm)


# The spark-operator's sparkoperator.k8s.io/v1beta2 types (api/v1beta2/*_types.go in
# kubeflow/spark-operator), restricted to the fields the chart writes. No registry ships
# a typed model or the CRD, so this is what is checked: the field names, their types, the
# enums. Not checked: cron syntax beyond being a string, resource quantities' grammar,
# the contents of the driver's and executor's security contexts (the core schema's).
SPARK_FIELDS = {
    "spec": {"schedule": str, "concurrencyPolicy": ("Allow", "Forbid", "Replace"),
             "successfulRunHistoryLimit": int, "failedRunHistoryLimit": int, "template": dict},
    "spec.template": {"type": ("Java", "Scala", "Python", "R"), "pythonVersion": ("2", "3"),
                      "mode": ("cluster", "client"), "image": str, "imagePullPolicy": str,
                      "imagePullSecrets": list, "mainApplicationFile": str, "arguments": list,
                      "sparkVersion": str, "sparkConf": dict, "restartPolicy": dict,
                      "timeToLiveSeconds": int, "volumes": list, "driver": dict, "executor": dict},
    "spec.template.restartPolicy": {"type": ("Never", "Always", "OnFailure")},
    "spec.template.driver": {"cores": int, "memory": str, "serviceAccount": str, "labels": dict,
                             "podSecurityContext": dict, "securityContext": dict, "env": list, "volumeMounts": list},
    "spec.template.executor": {"instances": int, "cores": int, "memory": str, "labels": dict,
                               "podSecurityContext": dict, "securityContext": dict, "env": list, "volumeMounts": list},
}


def check_spark_application(obj: dict) -> None:
    assert obj["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert obj["kind"] == "ScheduledSparkApplication"
    for path, fields in SPARK_FIELDS.items():
        node = obj
        for part in path.split("."):
            node = node[part]
        unknown = set(node) - set(fields)
        assert not unknown, f"{path}: fields not in v1beta2: {unknown}"
        for key, kind in fields.items():
            if key not in node:
                continue
            if isinstance(kind, tuple):
                assert node[key] in kind, f"{path}.{key}={node[key]!r} not one of {kind}"
            else:
                assert isinstance(node[key], kind) and not isinstance(node[key], bool), f"{path}.{key}: {kind}"
    assert obj["spec"]["template"]["mainApplicationFile"].startswith("local:///")
    assert all(isinstance(a, str) for a in obj["spec"]["template"]["arguments"])
    assert all(isinstance(v, str) for v in obj["spec"]["template"].get("sparkConf", {}).values())


def test_spark_operator_scenario():
    objs = objects(ci_values(CHART / "ci" / "spark-operator-values.yaml"))
    apps = of_kind(objs, "ScheduledSparkApplication")
    assert len(apps) == 1 and not of_kind(objs, "CronJob")
    check_spark_application(apps[0])
    broken = copy.deepcopy(apps[0])
    broken["spec"]["template"]["driver"]["coreLimits"] = "1"
    with pytest.raises(AssertionError, match="not in v1beta2"):
        check_spark_application(broken)
    # The driver creates its executors: its ServiceAccount, and only it, gets a Role.
    sa = apps[0]["spec"]["template"]["driver"]["serviceAccount"]
    bindings = of_kind(objs, "RoleBinding")
    assert [b["subjects"][0]["name"] for b in bindings] == [sa]


def test_default_routing_job_is_a_local_cronjob():
    objs = objects()
    (job,) = of_kind(objs, "CronJob")
    (c,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["spark-submit"] and c["args"][:2] == ["--master", "local[2]"]
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert not of_kind(objs, "Role", "RoleBinding", "ScheduledSparkApplication")


def test_install_dry_run_client():
    """`helm install --dry-run=client`: as far as Helm goes without a cluster."""
    h = helm()
    release = h.Config(storage_driver="memory").install(h.Chart.load(str(CHART)), "echelon", dry_run="client")
    assert release is not None


def test_server_side_dry_run():
    pytest.skip("no kube-apiserver on this machine (no registry ships one; no Docker engine for kind): "
                "server-side dry run and a real install cannot run here")


def test_notes_tell_how_to_reach_the_api():
    notes = render()["echelon/templates/NOTES.txt"]
    assert "port-forward svc/echelon-agent 7200:7200" in notes
    assert "grpcurl -plaintext 127.0.0.1:7200 list" in notes
    assert "helm test echelon" in notes and "grafana_dashboard" in notes


def test_routing_job_arguments_parse_with_the_job_parser():
    """The arguments the chart gives the job, parsed by the job's own argparse parser."""
    job = pytest.importorskip("echelon.replan.main", reason="the routing job (spark/) is not in this tree yet")
    cron = of_kind(objects({"routingJob": {"prometheusUrl": "http://prometheus:9090"}}), "CronJob")[0]
    (c,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    main_file = c["args"].index("/opt/echelon/spark/main.py")
    parsed = job.parser().parse_args(c["args"][main_file + 1:])
    assert parsed.prometheus == "http://prometheus:9090" and parsed.membership.count(".svc.cluster.local:7100") == 3
    entry = (CHART.parents[2] / "spark" / "main.py").read_text()
    assert "from echelon.replan.main import main" in entry
    (app,) = of_kind(objects(ci_values(CHART / "ci" / "spark-operator-values.yaml")), "ScheduledSparkApplication")
    job.parser().parse_args(app["spec"]["template"]["arguments"])


def test_packaged_chart_renders_the_same(tmp_path):
    """`helm package` follows the files/ symlinks: the .tgz a user installs renders alike."""
    h = helm()
    tgz = h.package(str(CHART), destination=str(tmp_path))
    values = ci_values(CHART / "ci" / "prometheus-operator-values.yaml")
    packaged = h.Chart.load(tgz).render(values, name="echelon", namespace="pubsub")
    assert packaged == render(values)
