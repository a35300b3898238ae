"""`make kube-check` from the test suite: skipped, with the reason, unless ECHELON_KUBE_BIN
names kube-kit's binaries (CI cannot build them: no fetch); the run itself is slow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kube import kube_check


def test_skips_with_the_reason_where_the_binaries_are_absent(tmp_path, capsys):
    assert kube_check.main(["--bin", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kube-check skipped: etcd, kube-apiserver not in ")


def test_spark_pods_are_built_from_the_application_template():
    app = {"kind": "ScheduledSparkApplication", "metadata": {"name": "job"}, "spec": {"template": {
        "image": "img", "volumes": [{"name": "tmp", "emptyDir": {}}],
        "driver": {"serviceAccount": "sa", "podSecurityContext": {"runAsNonRoot": True},
                   "securityContext": {"allowPrivilegeEscalation": False},
                   "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]},
        "executor": {"securityContext": {}}}}}
    driver, executor = kube_check.spark_pods([app], "ns")
    assert driver["spec"]["securityContext"] == {"runAsNonRoot": True}
    assert driver["spec"]["serviceAccountName"] == "sa" and driver["spec"]["volumes"][0]["name"] == "tmp"
    assert executor["spec"]["securityContext"] == {} and "serviceAccountName" not in executor["spec"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_chart_on_a_real_api_server():
    bin_dir = os.environ.get("ECHELON_KUBE_BIN", "")
    reason = kube_check.missing_binaries(Path(bin_dir) if bin_dir else None)
    if reason:
        pytest.skip(reason)
    assert kube_check.main(["--bin", bin_dir]) == 0
