"""Where the cluster is: the context file `echelon up` writes and every command reads,
and `echelon context`, which shows what a command would use and where each value came
from (docs/cli.md, "The context").

Each setting is taken from, in order: the command's flag, one environment variable
(`ECHELON_AGENT`, ...), the context file, the default. The file is
`$ECHELON_CONTEXT`, else `$XDG_CONFIG_HOME/echelon/context.json` (`~/.config/...`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

CONTEXT_ENV = "ECHELON_CONTEXT"


def context_path() -> Path:
    if os.environ.get(CONTEXT_ENV):
        return Path(os.environ[CONTEXT_ENV])
    config = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config) / "echelon" / "context.json"


@dataclass
class Context:
    """What `echelon up` started: the addresses to copy, and the credentials to use."""

    agents: list[str] = field(default_factory=list)
    membership: list[str] = field(default_factory=list)
    prometheus: str | None = None
    tls_dir: str | None = None
    token_file: str | None = None  # holds the cluster admin's token
    log_dir: str | None = None
    pid: int | None = None  # of the `echelon up` that wrote it
    written: str = ""

    def save(self, path: Path | None = None) -> Path:
        """Write it atomically (readable by its owner alone: it names a token file)."""
        path = path or context_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.written = self.written or time.strftime("%Y-%m-%dT%H:%M:%S%z")
        part = path.with_name(path.name + ".part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=2)
            f.write("\n")
        os.replace(part, path)
        return path


def load(path: Path | None = None) -> Context | None:
    """The context file's content; None when there is none. A file that cannot be read is
    an error naming it (a person can delete it)."""
    path = path or context_path()
    try:
        data = json.loads(path.read_text())
        known = {k: v for k, v in data.items() if k in Context.__dataclass_fields__}
        return Context(**known)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise click.ClickException(f"the context file {path} cannot be read ({e}): fix or delete it") from None


def forget(pid: int, path: Path | None = None) -> None:
    """Remove the context file if the `echelon up` of `pid` wrote it (a later one's stays)."""
    path = path or context_path()
    try:
        if load(path) and load(path).pid == pid:
            path.unlink()
    except (OSError, click.ClickException):
        pass


@click.command("context")
@click.option("--json", "as_json", is_flag=True, help="As one JSON object.")
def context(as_json) -> None:
    """Show where the commands find the cluster: each setting, and where it came from
    (flag, environment, the context file `echelon up` wrote, or the default)."""
    from echelon.cli.common import SETTINGS, setting

    path = context_path()
    saved = load(path)
    rows = {name: setting(name) for name in SETTINGS}
    if os.environ.get("ECHELON_TOKEN"):
        rows["token"] = ("(set)", "$ECHELON_TOKEN")
    if as_json:
        print(json.dumps({"file": str(path), "exists": saved is not None, "written_by_pid": saved and saved.pid,
                          "settings": {k: {"value": v, "source": s} for k, (v, s) in rows.items()}}))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console() if Console().is_terminal else Console(width=200)
    if saved is None:
        console.print(f"no context file at {path}: `echelon up` writes one; until then the defaults apply")
    else:
        console.print(f"context file {path} (written {saved.written} by `echelon up`, pid {saved.pid}; logs in "
                      f"{saved.log_dir})")
    t = Table("setting", "value", "from")
    for name, (value, source) in rows.items():
        t.add_row(name, ", ".join(value) if isinstance(value, list) else str(value or "-"), source)
    for col in t.columns:
        col.no_wrap = True
    console.print(t)
