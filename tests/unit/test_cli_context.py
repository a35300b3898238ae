"""The CLI's context (cli/context.py): the file `echelon up` writes, and the order every
setting is taken in: flag, environment, context file, default. No cluster needed."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from echelon.cli.common import setting
from echelon.cli.context import Context, context_path, forget, load
from echelon.cli.main import cli
from echelon.client.connection import with_port


def settings(env: dict, *args: str) -> dict:
    r = CliRunner().invoke(cli, ["context", "--json", *args], env=env)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_the_file_round_trips_owner_only_and_forget_removes_only_its_own(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "context.json"
    monkeypatch.setenv("ECHELON_CONTEXT", str(path))
    assert context_path() == path and load() is None
    ctx = Context(agents=["127.0.0.1:7300"], membership=["127.0.0.1:7200"], prometheus="http://127.0.0.1:9999",
                  tls_dir="/x/tls", token_file="/x/admin.token", log_dir="/x", pid=1234)
    ctx.save()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    back = load()
    assert back == Context(**{**ctx.__dict__, "written": back.written}) and back.written
    forget(999)  # another `echelon up`'s: stays
    assert path.exists()
    forget(1234)
    assert not path.exists()


def test_a_broken_context_file_is_named(tmp_path, monkeypatch):
    path = tmp_path / "context.json"
    path.write_text("{not json")
    r = CliRunner().invoke(cli, ["context"], env={"ECHELON_CONTEXT": str(path)})
    assert r.exit_code == 1 and f"the context file {path} cannot be read" in r.output and "delete it" in r.output
    assert "Traceback" not in r.output


def test_flag_beats_environment_beats_context_beats_default(tmp_path, monkeypatch):
    path = tmp_path / "context.json"
    env = {"ECHELON_CONTEXT": str(path), "ECHELON_AGENT": None, "ECHELON_MEMBERSHIP": None,
           "ECHELON_PROMETHEUS": None, "ECHELON_TLS_DIR": None, "ECHELON_TOKEN_FILE": None}
    s = settings(env)["settings"]
    assert s["agent"] == {"value": ["127.0.0.1:7200"], "source": "default"}
    assert s["membership"] == {"value": ["127.0.0.1:7100"], "source": "default"}
    Context(agents=["127.0.0.1:7301", "127.0.0.1:7302"], membership=["127.0.0.1:7201"],
            prometheus="http://127.0.0.1:9999", pid=1).save(path)
    s = settings(env)["settings"]
    assert s["agent"] == {"value": ["127.0.0.1:7301", "127.0.0.1:7302"], "source": f"context {path}"}
    assert s["prometheus"]["value"] == "http://127.0.0.1:9999"
    s = settings({**env, "ECHELON_AGENT": "10.0.0.1,10.0.0.2:7999", "ECHELON_MEMBERSHIP": "10.0.0.3"})["settings"]
    assert s["agent"] == {"value": ["10.0.0.1:7200", "10.0.0.2:7999"], "source": "$ECHELON_AGENT"}
    assert s["membership"] == {"value": ["10.0.0.3:7100"], "source": "$ECHELON_MEMBERSHIP"}  # default ports
    # A command's flag wins over all of them (the same resolution every command's option runs).
    monkeypatch.setenv("ECHELON_CONTEXT", str(path))
    monkeypatch.delenv("ECHELON_AGENT", raising=False)
    assert setting("agent", "10.9.9.9") == (["10.9.9.9:7200"], "flag")
    assert setting("agent", None)[1] == f"context {path}"


def test_a_bare_host_gets_the_default_port():
    assert with_port("127.0.0.1") == "127.0.0.1:7200"
    assert with_port("agent-0.svc", 7100) == "agent-0.svc:7100"
    assert with_port("127.0.0.1:7301") == "127.0.0.1:7301"
    assert with_port("::1") == "[::1]:7200" and with_port("[::1]") == "[::1]:7200" and with_port("[::1]:9") == "[::1]:9"


def test_every_command_has_help_and_there_is_a_version():
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("echelon ")
    missing = []

    def walk(group, path):
        for name, cmd in group.commands.items():
            if not (cmd.help or "").strip():
                missing.append(" ".join([*path, name]))
            if hasattr(cmd, "commands"):
                walk(cmd, [*path, name])

    walk(cli, [])
    assert not missing, f"commands without help: {missing}"


def test_spark_quiet_sends_the_processes_stderr_to_a_log_and_gives_it_back(capfd):
    """`echelon replan` without --verbose: what the JVM (a child inheriting fd 2) writes goes
    to a log file, and fd 2 is the terminal's again afterwards."""
    import subprocess
    import sys

    from echelon.cli.replan import _spark_quiet

    with _spark_quiet(False) as log:
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('log4j banner\\n')"], check=True)
    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('after\\n')"], check=True)
    err = capfd.readouterr().err
    assert "log4j banner" not in err and "after" in err
    assert "log4j banner" in open(log).read()
    os.unlink(log)
    with _spark_quiet(True) as log:
        assert log is None
