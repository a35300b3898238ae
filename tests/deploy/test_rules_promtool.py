"""The generated alerting rules under `promtool test rules` (tests/deploy/rules_test.yaml):
three balanced releases fire no EchelonMatcherOverShare and an unbalanced one does; the
routing job's failed and stale alerts and the certificate expiry alert fire for the
namespace and member they should, and no other."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.chart import ROOT

RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
TESTS = ROOT / "tests" / "deploy" / "rules_test.yaml"


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian package prometheus) is not installed")
def test_rules_fire_for_the_unbalanced_release_and_the_failing_job_only(tmp_path):
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = yaml.safe_load(TESTS.read_text())
    assert tests["rule_files"] == ["../../deploy/prometheus/rules.yaml"]
    tests["rule_files"] = ["rules.yaml"]
    (tmp_path / "rules_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", "rules_test.yaml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr
