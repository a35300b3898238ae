"""`echelon up --auth` and `echelon acl grant|revoke|list` as a user runs them: real
processes (the launcher's tokens file, the members' shared token), the CLI's commands in
this process (click's runner) against them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from echelon.cli.main import cli


def run(*args: str, token: str | None) -> tuple[int, str]:
    env = {"ECHELON_TOKEN": token} if token is not None else {}
    r = CliRunner().invoke(cli, list(args), env=env)
    return r.exit_code, r.output


@pytest.mark.timeout(180)
def test_acl_commands_on_a_cluster_started_with_auth(tmp_path, monkeypatch):
    monkeypatch.delenv("ECHELON_TOKEN", raising=False)
    up = subprocess.Popen([sys.executable, "-m", "echelon", "up", "--agents", "1", "--memberships", "1",
                           "--base-port", "0", "--json", "--no-prometheus", "--auth", "--log-dir", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = up.stdout.readline()
        assert line, up.stderr.read()
        ready = json.loads(line)
        admin = ready["admin_token"]
        agent = next(p["address"] for p in ready["processes"] if p["role"] == "agent")
        tokens = tmp_path / "auth" / "tokens.json"
        assert oct(tokens.stat().st_mode & 0o777) == "0o600" and admin in tokens.read_text()
        assert all(admin not in " ".join(open(f"/proc/{p['pid']}/cmdline").read().split("\0"))
                   for p in ready["processes"])  # secrets go in the environment, not argv

        code, out = run("acl", "list", "--agent", agent, token="")
        assert code == 1 and "UNAUTHENTICATED" in out
        assert run("topic", "create", "quotes.us", "--attr", "Symbol:string", "--agent", agent, token=admin)[0] == 0

        code, out = run("acl", "grant", "group:traders", "quotes.*", "publish", "subscribe", "--agent", agent,
                        token=admin)
        assert code == 0 and "group:traders on quotes.*: publish, subscribe" in out, out
        code, out = run("acl", "revoke", "group:traders", "quotes.*", "subscribe", "--agent", agent, token=admin)
        assert code == 0 and "group:traders on quotes.*: publish" in out, out
        code, out = run("acl", "grant", "user:ann", "quotes.us", "subscribe,admin", "--agent", agent, token=admin)
        assert code == 0, out
        # Bad input: a usage error before any call, or INVALID_ARGUMENT from the server; nothing changes.
        code, out = run("acl", "grant", "user:ann", "quotes", "read", "--agent", agent, token=admin)
        assert code == 2 and "rights are publish, subscribe, admin" in out
        code, out = run("acl", "grant", "ann", "quotes", "publish", "--agent", agent, token=admin)
        assert code == 1 and "INVALID_ARGUMENT" in out and "principal" in out
        code, out = run("acl", "revoke", "user:bob", "quotes", "publish", "--agent", agent, token=admin)
        assert code == 1 and "NOT_FOUND" in out
        # Caps per identity, beside the rules (not among them).
        code, out = run("acl", "cap", "user:ann", "durable_subscriptions=20", "subscriptions=5,durable_max_bytes=9",
                        "--agent", agent, token=admin)
        assert code == 0 and "user:ann: subscriptions=5, durable_subscriptions=20, durable_max_bytes=9" in out, out
        code, out = run("acl", "cap", "user:ann", "durable_max_bytes=0", "--agent", agent, token=admin)
        assert code == 0 and "user:ann: subscriptions=5, durable_subscriptions=20" in out, out
        code, out = run("acl", "cap", "user:ann", "subscription=5", "--agent", agent, token=admin)
        assert code == 2 and "FIELD one of subscriptions" in out, out
        code, out = run("acl", "caps", "--json", "--agent", agent, token=admin)
        assert code == 0 and json.loads(out) == {"user:ann": {"subscriptions": 5, "durable_subscriptions": 20}}
        code, out = run("acl", "list", "--json", "--agent", agent, token=admin)
        assert code == 0 and json.loads(out) == [
            {"principal": "group:traders", "pattern": "quotes.*", "rights": ["publish"]},
            {"principal": "user:ann", "pattern": "quotes.us", "rights": ["subscribe", "admin"]}]

        # A token that is not the admin's: its rights are the rules'. The file is re-read.
        rows = json.loads(tokens.read_text())
        rows["tokens"].append({"token": "ann-secret-token", "name": "ann", "groups": ["traders"]})
        tokens.write_text(json.dumps(rows))
        deadline = time.monotonic() + 15  # the agent looks at the file at most once a second
        code, out = run("acl", "list", "--agent", agent, token="ann-secret-token")
        while "UNAUTHENTICATED" in out and time.monotonic() < deadline:
            time.sleep(0.2)
            code, out = run("acl", "list", "--agent", agent, token="ann-secret-token")
        assert code == 1 and "PERMISSION_DENIED" in out and "'admin' right on every topic" in out, out
        code, out = run("pub", "--topic", "quotes.us", "--attr", "Symbol=x", "--agent", agent, token="ann-secret-token")
        assert code == 0, out  # publish from group:traders on quotes.*
        code, out = run("pub", "--topic", "news", "--attr", "Symbol=x", "--agent", agent, token="ann-secret-token")
        assert code == 1 and "PERMISSION_DENIED" in out and "'publish' right on topic 'news'" in out, out
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
    assert up.returncode == 0
    assert os.path.exists(tmp_path / "auth" / "tokens.json")
