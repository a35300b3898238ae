"""Render the chart with the real Helm engine (helm-python-sdk embeds Helm's Go library)
and walk what it produced: objects, pod specs, containers, the services' arguments."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "echelon"
CI_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "echelon", "pubsub"
# What the chart gives $(VAR) in the services' arguments (the downward API in a pod).
DOWNWARD = {"POD_NAME": "echelon-x-0", "POD_NAMESPACE": NAMESPACE, "POD_IP": "10.1.2.3", "NODE_NAME": "node-a"}


def helm():
    import helm_python

    return helm_python


@functools.cache
def chart():
    return helm().Chart.load(str(CHART))


def ci_values(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict | None = None, name: str = RELEASE) -> dict[str, str]:
    """template path -> rendered text (NOTES.txt included)."""
    return chart().render(values or {}, name=name, namespace=NAMESPACE)


@functools.cache
def _objects(values_json: str) -> tuple[dict, ...]:
    out = render(json.loads(values_json))
    return tuple(doc for path, text in sorted(out.items()) if path.endswith(".yaml")
                 for doc in yaml.safe_load_all(text) if doc)


def objects(values: dict | None = None) -> list[dict]:
    """Every object the chart renders for these values (cached per values)."""
    return list(_objects(json.dumps(values or {}, sort_keys=True)))


def of_kind(objs: list[dict], *kinds: str) -> list[dict]:
    return [o for o in objs if o["kind"] in kinds]


def pod_template(obj: dict) -> dict | None:
    """The pod spec's parent (metadata + spec) of a workload, or the Pod itself."""
    kind = obj["kind"]
    if kind in ("StatefulSet", "Deployment", "DaemonSet"):
        return obj["spec"]["template"]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]
    if kind == "Pod":
        return obj
    return None


def service_containers(objs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, container) for every long-running Echelon service container."""
    return [(o, c) for o in of_kind(objs, "StatefulSet", "Deployment", "DaemonSet")
            for c in o["spec"]["template"]["spec"]["containers"]]


def expand(arg: str) -> str:
    for k, v in DOWNWARD.items():
        arg = arg.replace(f"$({k})", v)
    return arg


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]
