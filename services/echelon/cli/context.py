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
from pathlib import Path

import click

from echelon.client.context import Context, context_path
from echelon.client.context import load as read

__all__ = ["Context", "context", "context_path", "forget", "load"]


def load(path: Path | None = None) -> Context | None:
    """The context file's content (None: there is none); a file that cannot be read is the
    command's error, naming it (a person can delete it)."""
    try:
        return read(path)
    except ValueError as e:
        raise click.ClickException(str(e)) from None


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
