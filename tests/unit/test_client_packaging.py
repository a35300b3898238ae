"""`pip install echelon-pubsub` is the client alone: grpcio and protobuf, nothing of the
server side. Cheap checks here (the declared metadata; every import the client and the
examples can reach, read from the source; a real import with the server's packages
blocked); the slow test builds a fresh venv from this tree and inspects what pip put in it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services" / "echelon"
CLIENT_DISTS = {"grpcio", "protobuf"}
CLIENT_TOP_LEVEL = {"grpc", "google", "echelon"}  # what those two distributions (and we) provide
# zstd, for `compress=True`: the `zstd` extra (backports.zstd) or Python 3.14's own, each
# import guarded by ImportError (contract/zstream.py); the client imports without them.
OPTIONAL_TOP_LEVEL = {"backports", "compression"}
SERVER_DISTS = {"grpcio-health-checking", "grpcio-reflection", "prometheus-client", "kubernetes", "numpy", "click",
                "rich", "pyspark", "matplotlib"}
SERVER_MODULES = ["grpc_health", "grpc_reflection", "prometheus_client", "kubernetes", "numpy", "click", "rich",
                  "pyspark", "matplotlib"]


def requirement_name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_the_distribution_declares_only_grpcio_and_protobuf():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {requirement_name(r) for r in project["dependencies"]} == CLIENT_DISTS
    extras = project["optional-dependencies"]
    server = {requirement_name(r) for r in extras["server"]}
    assert server >= {"grpcio-health-checking", "grpcio-reflection", "prometheus-client", "numpy", "click", "rich"}
    assert "server" in (ROOT / "Makefile").read_text().split("pip install -q -e '.[", 1)[1].split("]'")[0]
    assert 'pip install --no-cache-dir ".[server]"' in (ROOT / "Dockerfile").read_text()  # the services' image


def module_file(name: str) -> Path | None:
    """The source file of an `echelon.*` module in this tree."""
    parts = name.split(".")[1:]
    base = SERVICES.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def reachable_imports(start: list[Path]) -> tuple[set[str], set[str]]:
    """(echelon modules, other top-level modules) imported anywhere in `start` and in the
    echelon modules they import, transitively, including imports inside functions."""
    seen_files, echelon, others = set(), set(), set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen_files:
            continue
        seen_files.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] != "echelon":
                    others.add(name.split(".")[0])
                    continue
                f = module_file(name)
                if f is not None:
                    echelon.add(name)
                    todo.append(f)
                    # importing a.b.c runs a/__init__ and a/b/__init__ too
                    for i in range(2, name.count(".") + 1):
                        parent = module_file(".".join(name.split(".")[:i]))
                        if parent is not None:
                            todo.append(parent)
    return echelon, others


def test_nothing_the_client_or_the_examples_can_import_needs_the_server():
    start = sorted((SERVICES / "client").glob("*.py")) + sorted((ROOT / "examples").glob("*.py"))
    echelon, others = reachable_imports(start)
    third_party = others - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party <= CLIENT_TOP_LEVEL | OPTIONAL_TOP_LEVEL, third_party - CLIENT_TOP_LEVEL - OPTIONAL_TOP_LEVEL
    assert not {m for m in echelon if m.split(".")[1] in ("agent", "matcher", "membership", "router", "local",
                                                          "cli", "demo", "commands")}
    assert "echelon.runtime.server" not in echelon and "echelon.runtime.metrics" not in echelon


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block())
import echelon.client, echelon.client.errors
import json
try:
    echelon.client.Client("127.0.0.1:1", compress=True)
    refused = ""
except echelon.client.errors.FailedPrecondition as e:
    refused = str(e)
print(json.dumps([sorted(m for m in sys.modules if m.startswith("echelon")), refused]))
"""


def test_the_client_imports_with_the_server_packages_missing():
    out = subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=set(SERVER_MODULES) | OPTIONAL_TOP_LEVEL)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    loaded, refused = json.loads(out.stdout)
    assert "echelon.client.client" in set(loaded) and "echelon.runtime.server" not in set(loaded)
    assert "pip install 'echelon-pubsub[zstd]'" in refused  # compress=True without zstd names the extra


@pytest.mark.slow
def test_pip_install_of_the_client_alone_pulls_no_server_dependency(tmp_path):
    """A fresh venv, `pip install <this tree>` from PyPI (about a minute), then what is in it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([*pip, "install", "-q", str(ROOT)], check=True, timeout=600, env=env)
    listed = json.loads(subprocess.run([*pip, "list", "--format=json"], check=True, capture_output=True,
                                       text=True, timeout=120, env=env).stdout)
    installed = {p["name"].lower().replace("_", "-") for p in listed}
    print("installed:", sorted(installed))
    assert not installed & SERVER_DISTS, installed & SERVER_DISTS
    assert {"echelon-pubsub", "grpcio", "protobuf"} <= installed
    python = str(venv / "bin" / "python")
    check = subprocess.run([python, "-c", "import echelon.client; print(echelon.client.Client)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert check.returncode == 0 and "Client" in check.stdout, check.stderr
    cli = subprocess.run([str(venv / "bin" / "echelon"), "--help"], capture_output=True, text=True, timeout=60)
    assert cli.returncode != 0 and "pip install 'echelon-pubsub[server]'" in cli.stderr


def test_the_compiled_hot_path_is_optional_and_not_in_the_dist_wheel():
    """setup.py's extension (docs/performance.md, "A compiled hot path") never fails an
    install without a C compiler, and `make dist` builds the wheel without it: one pure
    wheel for every platform, as docs/cli.md says."""
    setup_py = (ROOT / "setup.py").read_text()
    assert "optional=True" in setup_py and "ECHELON_PURE" in setup_py
    recipe = (ROOT / "Makefile").read_text().split("\ndist:", 1)[1].split("\n\n", 1)[0]
    assert "ECHELON_PURE=1 $(PY) -m pip wheel" in recipe
    for path in ("setup.py", "services/echelon/runtime/_fill.c"):
        assert path in (ROOT / "Makefile").read_text().split("$(STAMP):", 1)[1].split("\n", 1)[0]  # reinstalled on change
