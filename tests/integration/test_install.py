"""Installing the client as the documentation says (docs/cli.md, "Install"; the README's
"Install the client"), into a fresh venv, then the examples from that venv against a
real `echelon up`, right after the README's own CLI steps (which make a `quotes` topic
with another schema than any example's), and against no cluster (a message, not a
traceback).

The default suite builds the wheel `make dist` builds and installs it into a venv whose
only other packages are grpcio's and protobuf's (linked from this environment: no
index needed); the slow test runs the documented `pip install <checkout>` from the
package index in a fresh venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from echelon.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def without_tree(env) -> dict:
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}  # the venv's package, not this tree's


def build_wheel(out: Path) -> Path:
    """What `make dist` builds (without build isolation here: no index needed), from a copy of
    the tree's sources (a build writes its egg-info and build/ next to them)."""
    src = out / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc", "*.so")
    shutil.copytree(ROOT / "services", src / "services", ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    # ECHELON_PURE=1 as `make dist`: the pure wheel, without the compiled module (setup.py).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(src)], check=True, timeout=300, capture_output=True,
                   env={**without_tree(os.environ), "ECHELON_PURE": "1"})
    [wheel] = out.glob("echelon_pubsub-*.whl")
    return wheel


def test_the_documented_commands_are_the_ones_that_work():
    docs = (ROOT / "docs" / "cli.md").read_text()
    assert "pip install ." in docs and "make dist" in docs and "dist/echelon_pubsub-" in docs
    readme = (ROOT / "README.md").read_text()
    assert "## Install the client" in readme and "pip install ." in readme and "make dist" in readme
    assert re.search(r"^dist:", (ROOT / "Makefile").read_text(), re.M)


def test_the_wheel_ships_the_echelon_package_alone_and_needs_two_dependencies(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"echelon", wheel.name.split("-py3")[0] + ".dist-info"}
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    base = {re.split(r"[<>=; ]", line.split(": ", 1)[1])[0] for line in meta.splitlines()
            if line.startswith("Requires-Dist") and "extra ==" not in line}
    assert base == {"grpcio", "protobuf"}
    assert "echelon/client/client.py" in names and "echelon/examples" not in " ".join(names)


@pytest.fixture
def cluster_up(tmp_path):
    """`echelon up` as the README runs it (free ports), its context file in tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHELON_")}
    env["ECHELON_CONTEXT"] = str(tmp_path / "context.json")
    proc = subprocess.Popen([sys.executable, "-m", "echelon", "up", "--agents", "3", "--memberships", "1",
                             "--base-port", "0", "--no-prometheus", "--json", "--log-dir", str(tmp_path / "logs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        yield json.loads(line), env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def readme_cli_steps(env: dict) -> None:
    """The README's CLI steps, in its order: a `quotes` topic with two attributes, a publish."""
    def echelon(*args):
        r = subprocess.run([sys.executable, "-m", "echelon", *args], capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    echelon("topic", "create", "quotes", "--attr", "Symbol:string", "--attr", "High:float:0:500")
    echelon("pub", "--topic", "quotes", "--attr", 'Symbol="aapl"', "--attr", "High=50")


def run_examples(python: str, env: dict, cwd: Path) -> None:
    """Each example from `python` (an installed client, not this tree), agents from the context."""
    env = without_tree(env)
    def run(example: str, *args: str) -> str:
        r = subprocess.run([python, str(EXAMPLES / example), *args], capture_output=True, text=True, timeout=240,
                           cwd=cwd, env=env)
        assert r.returncode == 0, f"{example} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r.stdout

    out = run("stock_alerts.py", "--count", "100")
    assert sum(line.endswith("ok") for line in out.splitlines()) == 3, out
    assert "2 subscribers, every file intact: yes" in run("bulk_fanout.py", "--out", str(cwd / "fanout"))
    assert run("nack_consumer.py", "--jobs", "10").rstrip().endswith("ok")


def no_cluster(python: str, env: dict, cwd: Path) -> None:
    env = without_tree(env)
    nothing = f"127.0.0.1:{free_port()}"
    for example in ("stock_alerts.py", "bulk_fanout.py", "nack_consumer.py"):
        args = ["--agent", nothing] + (["--agent", nothing] if example == "bulk_fanout.py" else [])
        r = subprocess.run([python, str(EXAMPLES / example), *args], capture_output=True, text=True, timeout=60,
                           cwd=cwd, env=env)
        assert r.returncode != 0 and f"no agent at {nothing}" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr, r.stderr


def closure(names: list[str]) -> set[str]:
    """The distributions `names` need, transitively (their markers evaluated here)."""
    from importlib.metadata import distribution

    from packaging.requirements import Requirement

    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in distribution(name).requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def link_client_dependencies(venv: Path) -> None:
    """grpcio and protobuf, with what they need and nothing else, made importable in `venv`
    (linked from this environment's files)."""
    from importlib.metadata import distribution

    here = Path(sysconfig.get_paths()["purelib"])
    deps = venv / "deps"
    deps.mkdir()
    for name in closure(["grpcio", "protobuf"]):
        for f in distribution(name).files or ():
            parts = Path(f).parts
            if parts[0].endswith((".dist-info", ".data")) or parts[0] == ".." or len(parts) < 1:
                continue
            top = here / parts[0]
            if top.is_dir() and not (top / "__init__.py").exists() and len(parts) > 2:  # a namespace: google/
                (deps / parts[0]).mkdir(exist_ok=True)
                target, link = top / parts[1], deps / parts[0] / parts[1]
            else:
                target, link = top, deps / parts[0]
            if not link.exists() and target.exists():
                link.symlink_to(target)
    [site] = list((venv / "lib").glob("python3*/site-packages"))
    (site / "client-deps.pth").write_text(f"{deps}\n")


def fresh_venv(path: Path, with_pip: bool) -> str:
    subprocess.run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)], check=True,
                   timeout=180)
    return str(path / "bin" / "python")


def check_installed_client(python: str, cwd: Path) -> None:
    """The client imports from the venv (not this tree); the CLI says it needs the server extra."""
    r = subprocess.run([python, "-c", "import echelon.client, echelon; print(echelon.__file__)"], capture_output=True,
                       text=True, timeout=60, cwd=cwd, env={"PATH": os.environ["PATH"]})
    assert r.returncode == 0 and str(ROOT) not in r.stdout, r.stdout + r.stderr
    r = subprocess.run([python, "-m", "echelon", "--help"], capture_output=True, text=True, timeout=60, cwd=cwd,
                       env={"PATH": os.environ["PATH"]})
    assert r.returncode != 0 and "pip install 'echelon-pubsub[server]'" in r.stderr


@pytest.mark.timeout(600)
def test_the_installed_wheel_runs_the_examples_after_the_readme_steps(tmp_path, cluster_up):
    _, env = cluster_up
    python = fresh_venv(tmp_path / "venv", with_pip=False)
    wheel = build_wheel(tmp_path / "dist")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300, env=without_tree(os.environ))
    link_client_dependencies(tmp_path / "venv")
    check_installed_client(python, tmp_path)
    readme_cli_steps(env)
    run_examples(python, env, tmp_path)
    no_cluster(python, env, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_pip_install_from_a_checkout_runs_the_examples_after_the_readme_steps(tmp_path, cluster_up):
    """The documented command as a user types it: `pip install .` in the checkout, from the index."""
    _, env = cluster_up
    python = fresh_venv(tmp_path / "venv", with_pip=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "."], check=True, timeout=900, cwd=ROOT,
                   env={**without_tree(os.environ), "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    check_installed_client(python, tmp_path)
    readme_cli_steps(env)
    run_examples(python, env, tmp_path)
    no_cluster(python, env, tmp_path)
