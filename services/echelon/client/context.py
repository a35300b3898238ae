"""Where the local cluster is: the context file `echelon up` writes (the CLI reads it for
every command: cli/context.py; docs/cli.md, "The context"), and the agents a program
uses when it is given none (`default_agents`), as the examples do.

The file is `$ECHELON_CONTEXT`, else `$XDG_CONFIG_HOME/echelon/context.json`
(`~/.config/echelon/context.json`): JSON with the agents', membership replicas' and
Prometheus' addresses, the client TLS directory and the admin's token file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from echelon.client.connection import DEFAULT_AGENT_PORT, with_port

CONTEXT_ENV = "ECHELON_CONTEXT"
AGENT_ENV = "ECHELON_AGENT"


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
    """The context file's content; None when there is none. ValueError (naming the file)
    when it cannot be read."""
    path = path or context_path()
    try:
        data = json.loads(path.read_text())
        return Context(**{k: v for k, v in data.items() if k in Context.__dataclass_fields__})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"the context file {path} cannot be read ({e}): fix or delete it") from None


def default_agents(fallback: int = 1) -> list[str]:
    """The agents to use when none were given: $ECHELON_AGENT (a comma list), else the
    context file's, else the first `fallback` agents of `echelon up`'s default layout."""
    if os.environ.get(AGENT_ENV):
        return [with_port(a) for a in os.environ[AGENT_ENV].split(",") if a.strip()]
    context = load()
    if context is not None and context.agents:
        return list(context.agents)
    return [f"127.0.0.1:{DEFAULT_AGENT_PORT + i}" for i in range(fallback)]
