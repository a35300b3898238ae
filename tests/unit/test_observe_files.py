"""The generated dashboards and rules: fresh, valid for their consumers (Grafana's model in
grafana-foundation-sdk, promtool, the Prometheus Operator's CRD model), and the alerts
fire and resolve on made-up histories (promtool test rules, data/alerts_test.yaml)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from echelon.observe import catalog, generate, grafana

ROOT = generate.ROOT
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool (Debian package prometheus) not installed")


def test_generated_files_are_fresh():
    assert generate.stale() == [], "run `python -m echelon.observe.generate` and commit the result"


def test_stale_check_sees_a_changed_file(tmp_path):
    assert generate.main(["--root", str(tmp_path)]) == 0
    assert generate.stale(tmp_path) == []
    (tmp_path / generate.RULES).write_text("groups: []\n")
    assert generate.stale(tmp_path) == [generate.RULES]


@pytest.mark.parametrize("board", catalog.DASHBOARDS, ids=lambda d: d.uid)
def test_dashboard_round_trips_through_the_grafana_model(board):
    text = (ROOT / generate.DASHBOARDS_DIR / f"{board.uid}.json").read_text()
    model = grafana.load(text)
    # Nothing the typed model does not know is lost, nothing is added.
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == json.loads(text)
    assert model.schema_version >= 41 and model.uid == board.uid
    names = {v.name: v for v in model.templating.list_val}
    assert names["datasource"].type_val == "datasource" and names["datasource"].query == "prometheus"
    for var in ("region", "topic"):
        assert names[var].type_val == "query" and names[var].multi and names[var].include_all
    assert [p.title for p in model.panels] == [p.title for p in board.panels]
    for panel, spec in zip(model.panels, board.panels):
        assert panel.description and panel.field_config.defaults.unit == spec.unit
        assert panel.datasource.uid == "${datasource}"
        assert [t.ref_id for t in panel.targets] == [chr(ord("A") + i) for i in range(len(spec.queries))]
        assert [t.expr for t in panel.targets] == [q.expr for q in spec.queries]
        overrides = {o.matcher.options: o.properties[0].value for o in panel.field_config.overrides}
        assert overrides == {chr(ord("A") + i): q.unit for i, q in enumerate(spec.queries)
                             if q.unit and q.unit != spec.unit}


def test_catalog_names_are_unique():
    titles = [(d.uid, p.title) for d, p in catalog.panels()]
    assert len(titles) == len(set(titles))
    assert len({r.record for r in catalog.RECORDS}) == len(catalog.RECORDS)
    assert {a.alert for a in catalog.ALERTS} >= {"EchelonLinkCongested", "EchelonMemberDead", "EchelonMatcherOverShare",
                                                   "EchelonSubscriberBacklogNearBound", "EchelonViewAgeGrowing",
                                                   "EchelonPlanRefused"}


def test_instantiate_fills_grafana_variables():
    expr = 'sum(rate(x{region=~"$region", topic=~"$topic"}[$__rate_interval]))'
    assert catalog.instantiate(expr, topic="quotes") == 'sum(rate(x{region=~".*", topic=~"quotes"}[1m]))'


def test_prometheus_rule_matches_the_operator_model():
    from cloudcoil.models.prometheus_operator.v1 import PrometheusRule

    doc = yaml.safe_load((ROOT / generate.PROMETHEUS_RULE).read_text())
    rule = PrometheusRule.model_validate(doc)  # types and patterns (durations) of the CRD
    # The model ignores unknown fields: dumping it back must give the same document.
    assert rule.model_dump(by_alias=True, exclude_none=True, mode="json") == doc
    plain = yaml.safe_load((ROOT / generate.RULES).read_text())
    assert doc["spec"]["groups"] == plain["groups"]


@needs_promtool
def test_promtool_checks_the_rules():
    out = subprocess.run(["promtool", "check", "rules", str(ROOT / generate.RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    n = len(catalog.RECORDS) + len(catalog.ALERTS)
    assert f"SUCCESS: {n} rules found" in out.stdout


@needs_promtool
def test_alerts_fire_and_resolve_under_promtool():
    tests = Path(__file__).parent / "data" / "alerts_test.yaml"
    out = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # tests/deploy/rules_test.yaml holds the releases-in-namespaces cases (run by tests/deploy).
    releases = Path(__file__).parents[1] / "deploy" / "rules_test.yaml"
    tested = {t["alertname"] for f in (tests, releases) for g in yaml.safe_load(f.read_text())["tests"]
              for t in g.get("alert_rule_test", ())}
    assert tested == {a.alert for a in catalog.ALERTS}, "every alert has a promtool test"
