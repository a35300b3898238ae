"""What the chart gives membership's state and the routing job when the cluster outgrows
one machine: a claim per membership replica, the job scoped to its release, a deadline
of its own, and its SparkApplication pods shaped for PodSecurity `restricted`."""

from __future__ import annotations

from tests.deploy.chart import CHART, NAMESPACE, ci_values, objects, of_kind, render


def membership(values: dict | None = None) -> dict:
    return next(o for o in of_kind(objects(values), "StatefulSet") if o["metadata"]["name"].endswith("-membership"))


def test_membership_keeps_its_state_on_a_claim_per_replica():
    sts = membership()
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "storageClassName" not in claim["spec"]  # the cluster's default class
    container = sts["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--data-dir") + 1].startswith("/var/lib/echelon/")
    assert {"name": "data", "mountPath": "/var/lib/echelon"} in container["volumeMounts"]
    assert sts["spec"]["template"]["spec"]["securityContext"]["fsGroup"]  # the non-root user may write it

    sized = membership({"membership": {"persistence": {"storageClass": "fast-ssd", "size": "5Gi"}}})
    spec = sized["spec"]["volumeClaimTemplates"][0]["spec"]
    assert spec["storageClassName"] == "fast-ssd" and spec["resources"]["requests"]["storage"] == "5Gi"

    memory = membership({"membership": {"persistence": {"enabled": False}}})
    assert "volumeClaimTemplates" not in memory["spec"]
    assert "--data-dir" not in memory["spec"]["template"]["spec"]["containers"][0]["args"]


def job_args(values: dict) -> list[str]:
    objs = objects(values)
    cron = of_kind(objs, "CronJob")
    if cron:
        return cron[0]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    return of_kind(objs, "ScheduledSparkApplication")[0]["spec"]["template"]["arguments"]


def test_the_job_reads_only_its_release_and_has_a_deadline_inside_kubernetes():
    args = job_args({"routingJob": {"prometheusUrl": "http://prom:9090"}})
    assert args[args.index("--selector") + 1] == \
        f'namespace="{NAMESPACE}",pod=~"echelon-(membership|matcher|agent|router)-.+"'
    assert args[args.index("--deadline") + 1] == "1620s"  # a tenth inside activeDeadlineSeconds (1800)
    assert "--selector" not in job_args({})  # scraping the view's members is scoped already
    op = job_args(ci_values(CHART / "ci" / "spark-operator-values.yaml"))
    assert op[op.index("--deadline") + 1] == "1800s"  # the operator has none: the job's is the run's


def test_the_spark_application_is_shaped_for_restricted_and_has_scratch_space():
    objs = objects(ci_values(CHART / "ci" / "spark-operator-values.yaml"))
    app = of_kind(objs, "ScheduledSparkApplication")[0]["spec"]["template"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}} in app["volumes"]
    for role in ("driver", "executor"):
        pod = app[role]
        assert pod["podSecurityContext"]["runAsNonRoot"] is True
        assert pod["podSecurityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = pod["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert {"name": "tmp", "mountPath": "/tmp"} in pod["volumeMounts"]
    assert app["timeToLiveSeconds"] == 86400  # cleanup of a finished run, not a deadline
    (role,) = of_kind(objs, "Role")
    assert {"update", "patch", "create", "delete", "watch"} <= set(role["rules"][0]["verbs"])
    notes = render(ci_values(CHART / "ci" / "spark-operator-values.yaml"))["echelon/templates/NOTES.txt"]
    assert f'must watch namespace "{NAMESPACE}"' in notes and "jobNamespaces" in notes


def test_a_scraping_job_may_reach_the_metrics_ports_the_network_policy_narrows():
    values = ci_values(CHART / "ci" / "regions-values.yaml")
    for policy in of_kind(objects(values), "NetworkPolicy"):
        metrics = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "metrics")
        assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "echelon",
                                                "app.kubernetes.io/instance": "echelon",
                                                "app.kubernetes.io/component": "routing-job"}}} in metrics["from"]
    with_prometheus = {**values, "routingJob": {"prometheusUrl": "http://prom:9090"}}
    for policy in of_kind(objects(with_prometheus), "NetworkPolicy"):
        metrics = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "metrics")
        assert len(metrics["from"]) == 1  # only the monitoring namespace


def pods(values: dict) -> dict[str, dict]:
    """workload name -> pod template, for the long-running services."""
    return {o["metadata"]["name"]: o["spec"]["template"] for o in of_kind(objects(values), "StatefulSet",
                                                                        "DaemonSet", "Deployment")}


ROUTERS = {"router": {"enabled": True, "regions": [{"name": "zone-a", "replicas": 2}]}}


def test_operator_knobs_reach_every_service_pod():
    values = {**ROUTERS, "priorityClassName": "critical-messaging", "podLabels": {"team": "messaging"},
              "extraEnv": [{"name": "TZ", "value": "UTC"}],
              "extraVolumes": [{"name": "ca-bundle", "configMap": {"name": "corp-ca"}}],
              "extraVolumeMounts": [{"name": "ca-bundle", "mountPath": "/etc/corp-ca", "readOnly": True}],
              "preStopSeconds": 5, "hardSpread": True}
    got = pods(values)
    assert set(got) == {"echelon-membership", "echelon-matcher", "echelon-agent", "echelon-router-zone-a"}
    for name, tpl in got.items():
        spec = tpl["spec"]
        assert spec["priorityClassName"] == "critical-messaging", name
        assert tpl["metadata"]["labels"]["team"] == "messaging", name
        assert {"name": "ca-bundle", "configMap": {"name": "corp-ca"}} in spec["volumes"], name
        c = spec["containers"][0]
        assert {"name": "TZ", "value": "UTC"} in c["env"], name
        assert {"name": "ca-bundle", "mountPath": "/etc/corp-ca", "readOnly": True} in c["volumeMounts"], name
        assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}, name
        for tsc in spec.get("topologySpreadConstraints", []):
            assert tsc["whenUnsatisfiable"] == "DoNotSchedule", name
    for o in objects(values):  # pod labels never reach a selector
        assert "team" not in o.get("spec", {}).get("selector", {}).get("matchLabels", {})
    defaults = pods(ROUTERS)
    for tpl in defaults.values():
        assert "priorityClassName" not in tpl["spec"] and "lifecycle" not in tpl["spec"]["containers"][0]
        assert all(t["whenUnsatisfiable"] == "ScheduleAnyway" for t in tpl["spec"].get("topologySpreadConstraints", []))
    import pytest

    from tests.deploy.chart import helm
    with pytest.raises(helm().HelmRenderError, match="preStopSeconds"):
        render({"preStopSeconds": 28})  # 28 + grace 5 > terminationGracePeriodSeconds 30


def test_service_accounts_created_named_or_brought():
    sas = lambda v: sorted(o["metadata"]["name"] for o in of_kind(objects(v), "ServiceAccount"))  # noqa: E731
    assert sas({}) == ["echelon-agent", "echelon-matcher", "echelon-membership", "echelon-routing-job"]
    annotated = of_kind(objects({"serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "e@p"}}}),
                        "ServiceAccount")
    assert all(sa["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": "e@p"} for sa in annotated)
    assert sas({"serviceAccount": {"name": "echelon"}}) == ["echelon"]
    brought = {"serviceAccount": {"create": False, "name": "platform-sa"},
               "routingJob": {"sparkOperator": {"enabled": True}}}
    objs = objects(brought)
    assert not of_kind(objs, "ServiceAccount")
    assert {t["spec"]["serviceAccountName"] for t in pods(brought).values()} == {"platform-sa"}
    (binding,) = of_kind(objs, "RoleBinding")
    assert binding["subjects"][0]["name"] == "platform-sa"
    app = of_kind(objs, "ScheduledSparkApplication")[0]["spec"]["template"]
    assert app["driver"]["serviceAccount"] == "platform-sa"
    assert {t["spec"]["serviceAccountName"] for t in pods({"serviceAccount": {"create": False}}).values()} == \
        {"default"}


def test_routers_get_a_disruption_budget_per_region():
    values = {"router": {"enabled": True, "regions": [{"name": "zone-a", "replicas": 2}, {"name": "zone-b"}]}}
    budgets = {o["metadata"]["name"]: o["spec"] for o in of_kind(objects(values), "PodDisruptionBudget")}
    assert budgets["echelon-router-zone-a"]["maxUnavailable"] == 1
    assert budgets["echelon-router-zone-b"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == \
        "router-zone-b"
    off = {"router": {**values["router"], "pdb": {"enabled": False, "maxUnavailable": 1}}}
    assert not [n for n in (o["metadata"]["name"] for o in of_kind(objects(off), "PodDisruptionBudget"))
                if "router" in n]
