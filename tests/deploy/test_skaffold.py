"""skaffold.yaml against skaffold's published JSON schema for its apiVersion (vendored
under tests/deploy/schemas/, see the README there), and against this repository: the
Dockerfile targets, the chart, the values it sets, the Service it forwards.

What cannot be real here: no skaffold binary and no cluster, so `skaffold dev` is not run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.deploy.chart import ROOT, objects

SCHEMAS = Path(__file__).parent / "schemas"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load((ROOT / "skaffold.yaml").read_text())


def schema_for(api_version: str) -> dict:
    path = SCHEMAS / f"skaffold-{api_version.removeprefix('skaffold/')}.json"
    if not path.exists():
        pytest.skip(f"{path.name} not present: the schema for {api_version} is not vendored")
    return json.loads(path.read_text())


def test_validates_against_the_published_schema(config):
    jsonschema.validate(config, schema_for(config["apiVersion"]))


def test_the_schema_can_fail(config):
    schema = schema_for(config["apiVersion"])
    broken = json.loads(json.dumps(config))
    broken["build"]["artifacts"][0]["docker"]["targett"] = "service"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_uses_the_newest_vendored_schema(config):
    def number(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v))

    versions = [p.stem.removeprefix("skaffold-") for p in SCHEMAS.glob("skaffold-v*.json")]
    assert config["apiVersion"] == "skaffold/" + max(versions, key=number)


def test_builds_the_dockerfile_targets(config):
    targets = set(re.findall(r"^FROM \S+ AS (\S+)", (ROOT / "Dockerfile").read_text(), re.M))
    for artifact in config["build"]["artifacts"]:
        assert artifact["docker"]["target"] in targets
        assert (ROOT / artifact["context"] / artifact["docker"]["dockerfile"]).exists()


def test_deploys_the_chart_with_values_that_exist(config):
    defaults = yaml.safe_load((ROOT / "deploy/helm/echelon/values.yaml").read_text())
    (release,) = [r for r in config["deploy"]["helm"]["releases"] if "chartPath" in r]
    assert (ROOT / release["chartPath"] / "Chart.yaml").exists()
    for f in release["valuesFiles"]:
        assert (ROOT / f).exists()
    images = {a["image"] for a in config["build"]["artifacts"]}
    for key, template in release["setValueTemplates"].items():
        node = defaults
        for part in key.split("."):
            node = node[part]  # KeyError: the chart has no such value
        image = re.search(r"IMAGE_\w+?_(echelon\w*)}}", template).group(1)
        assert image.replace("_", "-") in images


def test_forwards_the_agent_service(config):
    (release,) = [r for r in config["deploy"]["helm"]["releases"] if "chartPath" in r]
    dev = yaml.safe_load((ROOT / release["valuesFiles"][0]).read_text())
    services = {s["metadata"]["name"]: s for s in objects(dev) if s["kind"] == "Service"}
    forwards = {f["resourceName"]: f for f in config["portForward"]}
    agent = forwards[f"{release['name']}-agent"]
    assert agent["port"] in [p["port"] for p in services[agent["resourceName"]]["spec"]["ports"]]
    assert "prometheus-server" in forwards
