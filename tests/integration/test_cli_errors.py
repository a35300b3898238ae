"""The CLI against a real `echelon up` (processes, as a user runs them): commands find the
cluster through the context file alone; every connection failure says its cause in one
line (never a traceback or a repr); progress shows on a terminal (a pty) and not off one."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from echelon.launch import free_port
from tests.harness import wait_registered

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NO_TRACE = ("Traceback", "AioRpcError", "object at 0x", "debug_error_string")


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up")
    env = {**os.environ, "ECHELON_CONTEXT": str(tmp / "context.json")}
    for var in ("ECHELON_AGENT", "ECHELON_MEMBERSHIP", "ECHELON_TOKEN", "ECHELON_TLS_DIR", "ECHELON_PROMETHEUS"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "echelon", "up", "--agents", "2", "--memberships", "1",
                             "--base-port", "0", "--no-prometheus", "--json", "--log-dir", str(tmp / "logs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        yield ready, env, tmp
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def echelon(env, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "echelon", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)



def side_by_side(commands: list[tuple[dict, tuple[str, ...]]]) -> list[subprocess.CompletedProcess]:
    """`echelon(env, *args)` for each (env, args), all at once (each is a process start, mostly
    imports): their results in the commands' order."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda c: echelon(c[0], *c[1]), commands))


def address(ready, role, key="address"):
    return next(p[key] for p in ready["processes"] if p["role"] == role)


def fails_with(r, *words):
    assert r.returncode != 0, r.stdout
    for w in words:
        assert w in r.stderr, r.stderr
    assert not [t for t in NO_TRACE if t in r.stderr + r.stdout], r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr  # one line


def test_the_context_file_finds_the_cluster(up):
    ready, env, tmp = up
    context = json.loads((tmp / "context.json").read_text())
    agents = [p["address"] for p in ready["processes"] if p["role"] == "agent"]
    assert context["agents"] == agents and context["membership"] == [address(ready, "membership")]
    assert ready["context"] == str(tmp / "context.json")
    r = echelon(env, "topic", "create", "ctx-t", "--attr", "n:int")  # no --agent: the context's
    assert r.returncode == 0 and "ctx-t" in r.stdout, r.stderr
    # The environment beats the context: a metrics port through ECHELON_AGENT fails as the flag would.
    context_shown, status, r = side_by_side([(env, ("context", "--json")),
                                             (env, ("status", "--json")),  # no --membership
                                             ({**env, "ECHELON_AGENT": address(ready, "agent", "metrics")},
                                              ("topic", "list"))])
    shown = json.loads(context_shown.stdout)["settings"]
    assert shown["agent"] == {"value": agents, "source": f"context {tmp / 'context.json'}"}
    assert status.returncode == 0 and {m["id"] for m in json.loads(status.stdout)["members"]} >= {"agent-0"}
    fails_with(r, address(ready, "agent", "metrics"), "/metrics port")


def test_each_connection_failure_names_its_cause(up, tmp_path):
    ready, env, _ = up
    agent, metrics, replica = address(ready, "agent"), address(ready, "agent", "metrics"), address(ready, "membership")
    nothing = f"127.0.0.1:{free_port()}"
    out = tmp_path / "topo.png"
    cases = [  # (command, what its one line must say); none changes anything, so they run side by side
        (("topic", "list", "--agent", metrics), (f"{metrics} answers HTTP, not gRPC", "/metrics port")),
        (("topic", "list", "--agent", replica), (f"{replica} is a membership replica, not an agent",)),
        (("status", "--membership", agent), (f"{agent} is an agent, not a membership replica",)),
        (("pub", "--topic", "t", "--agent", nothing), (f"no agent at {nothing}", "echelon up")),
        (("sub", "--topic", "t", "--agent", nothing), (f"no agent at {nothing}",)),
        (("subscription", "list", "--agent", nothing), (f"no agent at {nothing}",)),
        (("status", "--membership", nothing), (f"no membership replica at {nothing}",)),
        (("topology", "--topic", "nope", "--out", str(out)), ("no topic 'nope'",)),
        (("topic", "show", "nope"), ("NOT_FOUND", "'nope'")),
    ]
    for (_, words), r in zip(cases, side_by_side([(env, args) for args, _ in cases])):
        fails_with(r, *words)
    assert not out.exists()


def on_pty(env, *args, timeout=60.0) -> tuple[int, str]:
    """Run a command with a terminal for stdout and stderr; its exit code and what it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "echelon", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env={**env, "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=10), ANSI.sub("", out.decode(errors="replace"))


def test_progress_on_a_terminal_and_not_off_one(up, tmp_path):
    ready, env, _ = up
    assert echelon(env, "topic", "create", "prog", "--attr", "n:int").returncode == 0
    code, out = on_pty(env, "pub", "--topic", "prog", "--attr", "n=1", "--count", "5000")
    assert code == 0 and "events/s" in out and "5000/5000" in out, out
    code, out = on_pty(env, "pub", "--topic", "prog", "--attr", "n=1", "--count", "5000", "--quiet")
    assert code == 0 and "events/s" not in out and "published 5000/5000" in out, out
    off = echelon(env, "pub", "--topic", "prog", "--attr", "n=1", "--count", "5000")
    assert off.returncode == 0 and "events/s" not in off.stdout + off.stderr and "published 5000/5000" in off.stdout

    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(3 << 20))
    code, out = on_pty(env, "pub", "--topic", "prog", "--attr", "n=2", "--payload-file", str(payload))
    assert code == 0 and "payload.bin" in out and "MB" in out, out  # bytes sent, of the file's size
    off = echelon(env, "pub", "--topic", "prog", "--attr", "n=2", "--payload-file", str(payload))
    assert off.returncode == 0 and "MB" not in off.stdout + off.stderr

    # sub --out on a terminal: bytes, rate, ETA of the payload as it is written.
    got = tmp_path / "got.bin"
    master, slave = pty.openpty()
    sub = subprocess.Popen([sys.executable, "-m", "echelon", "sub", "--topic", "prog", "--filter", "n = 3",
                            "--count", "1", "--out", str(got), "--timeout", "60"], stdin=subprocess.DEVNULL,
                           stdout=slave, stderr=slave, env={**env, "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    try:
        wait_registered(address(ready, "matcher"), "prog")  # before the publish
        assert echelon(env, "pub", "--topic", "prog", "--attr", "n=3", "--payload-file", str(payload)).returncode == 0
        out = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            elif sub.poll() is not None:
                break
        assert sub.wait(timeout=10) == 0
    finally:
        os.close(master)
        if sub.poll() is None:
            sub.kill()
    text = ANSI.sub("", out.decode(errors="replace"))
    assert got.read_bytes() == payload.read_bytes()
    assert "got.bin" in text and "MB" in text, text


def test_a_tls_cluster_from_the_context_and_a_plain_client_told_why(tmp_path):
    """`echelon up --tls --auth`: the context carries the TLS directory and the admin's token
    file, so plain `echelon topic ...` works; a client told to skip TLS hears that it must not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHELON_")}
    env["ECHELON_CONTEXT"] = str(tmp_path / "context.json")
    proc = subprocess.Popen([sys.executable, "-m", "echelon", "up", "--agents", "1", "--memberships", "1", "--tls",
                             "--auth", "--base-port", "0", "--no-prometheus", "--json", "--log-dir",
                             str(tmp_path / "logs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        context = json.loads((tmp_path / "context.json").read_text())
        assert context["tls_dir"] and context["token_file"]
        assert (Path(context["token_file"]).read_text().strip() == ready["admin_token"])
        r = echelon(env, "topic", "create", "secure", "--attr", "n:int")
        assert r.returncode == 0, r.stderr
        assert "secure" in echelon(env, "topic", "list").stdout
        agent = address(ready, "agent")
        plain = {k: v for k, v in env.items() if k != "ECHELON_CONTEXT"}
        plain["ECHELON_CONTEXT"] = str(tmp_path / "none.json")
        fails_with(echelon(plain, "topic", "list", "--agent", agent), f"{agent} serves TLS and this client does not",
                   "--tls-dir")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert not (tmp_path / "context.json").exists()
