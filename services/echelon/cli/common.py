"""What the client commands share: where the cluster is (flag, environment, context file,
default: cli/context.py), the client and channels made from it, and failures turned
into one line a person can act on (docs/cli.md)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import click
import grpc
from rich.console import Console

from echelon.cli.context import load
from echelon.client import Client, EchelonError
from echelon.client.connection import DEFAULT_AGENT_PORT, with_port
from echelon.client.diagnose import MEMBERSHIP, probe
from echelon.contract.transport import TlsDir, Transport

# Outside a terminal (a pipe, a log) rich would cut tables to 80 columns: addresses are what a person copies.
console = Console() if Console().is_terminal else Console(width=200)
DEFAULT_MEMBERSHIP_PORT = 7100
CONNECT_WAIT = 5.0  # seconds the first contact with a cluster may take before the command gives up

# name -> (environment variable, context field, default)
SETTINGS = {
    "agent": ("ECHELON_AGENT", "agents", [f"127.0.0.1:{DEFAULT_AGENT_PORT}"]),
    "membership": ("ECHELON_MEMBERSHIP", "membership", [f"127.0.0.1:{DEFAULT_MEMBERSHIP_PORT}"]),
    "prometheus": ("ECHELON_PROMETHEUS", "prometheus", "http://127.0.0.1:9090"),
    "tls_dir": ("ECHELON_TLS_DIR", "tls_dir", None),
    "token_file": ("ECHELON_TOKEN_FILE", "token_file", None),
}
PORTS = {"agent": DEFAULT_AGENT_PORT, "membership": DEFAULT_MEMBERSHIP_PORT}
META = "echelon.settings"  # ctx.meta: name -> (value, source)


def split(values) -> list[str]:
    if isinstance(values, str):
        values = [values]
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


def setting(name: str, flag=None) -> tuple[object, str]:
    """(value, where it came from: "flag", "$ENV", "context <file>" or "default")."""
    env, field, default = SETTINGS[name]
    value, source = None, "default"
    if flag not in (None, (), [], ""):
        value, source = flag, "flag"
    elif os.environ.get(env):
        value, source = os.environ[env], f"${env}"
    else:
        context = load()
        if context is not None and getattr(context, field):
            from echelon.client.context import context_path

            value, source = getattr(context, field), f"context {context_path()}"
    if value is None:
        value = default
    if name in PORTS and value is not None:
        value = [with_port(a, PORTS[name]) for a in split(value)]
    return value, source


def _resolved(name: str):
    def callback(ctx: click.Context, _param, value):
        resolved = setting(name, value)
        ctx.meta.setdefault(META, {})[name] = resolved
        return resolved[0]

    return callback


def AGENT(f):
    """--agent (and --tls-dir, --token) for the client the command makes."""
    return click.option("--agent", default=None, callback=_resolved("agent"), metavar="HOST[:PORT][,...]",
                        help=f"Agents' addresses, tried in turn [env ECHELON_AGENT; default: the context "
                             f"`echelon up` wrote, else 127.0.0.1:{DEFAULT_AGENT_PORT}].")(TLS(TOKEN(f)))


MEMBERSHIP_OPTION = click.option(
    "--membership", "addresses", multiple=True, callback=_resolved("membership"), metavar="HOST[:PORT][,...]",
    help=f"Membership replicas' addresses, tried in order [env ECHELON_MEMBERSHIP; default: the context, else "
         f"127.0.0.1:{DEFAULT_MEMBERSHIP_PORT}].")
PROMETHEUS = click.option("--prometheus", "url", default=None, callback=_resolved("prometheus"),
                          help="Prometheus' URL [env ECHELON_PROMETHEUS; default: the context, else "
                               "http://127.0.0.1:9090].")


def _tls(ctx: click.Context, _param, value):
    path, source = setting("tls_dir", value)
    if path and not Path(path).is_dir():
        raise click.BadParameter(f"{path} (from {source}) is not a directory", param_hint="--tls-dir")
    ctx.meta.setdefault(META, {})["tls_dir"] = (path, source)


def _token(ctx: click.Context, _param, value):
    if value:
        ctx.meta.setdefault(META, {})["token"] = (value, "flag")
        return
    if "ECHELON_TOKEN" in os.environ:  # (set empty: no token, whatever the context says)
        ctx.meta.setdefault(META, {})["token"] = (os.environ["ECHELON_TOKEN"], "$ECHELON_TOKEN")
        return
    path, source = setting("token_file")
    token = ""
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise click.BadParameter(f"cannot read the token file {path} (from {source}): {e.strerror}",
                                     param_hint="--token") from None
    ctx.meta.setdefault(META, {})["token"] = (token, f"file {path} ({source})" if path else "none")


TOKEN = click.option("--token", default=None, expose_value=False, callback=_token,
                     help="A bearer token (a static token or a JWT) for clusters run with --auth [env ECHELON_TOKEN; "
                          "or a file: $ECHELON_TOKEN_FILE, the context's].")
TLS = click.option("--tls-dir", default=None, expose_value=False, callback=_tls, type=click.Path(file_okay=False),
                   help="TLS: a directory with ca.crt (and tls.crt, tls.key for a client certificate) "
                        "[env ECHELON_TLS_DIR; default: the context's].")


def _compress(ctx: click.Context, _param, value: bool) -> None:
    ctx.meta.setdefault(META, {})["compress"] = (value, "flag")


COMPRESS = click.option("--compress", is_flag=True, expose_value=False, callback=_compress,
                        help="Offer zstd on the command's streams: fewer bytes, some CPU at each end "
                             "(docs/compression.md; needs the `zstd` extra).")


def _meta(name: str):
    ctx = click.get_current_context(silent=True)
    found = ctx.meta.get(META, {}).get(name) if ctx else None
    return found[0] if found else None


def client(agents: list[str]) -> Client:
    """A client of `agents`, over TLS if the command has a TLS directory, with its token,
    its streams compressed if the command has `--compress`."""
    return Client(agents, tls=_meta("tls_dir"), token=_meta("token") or "", compress=bool(_meta("compress")))


def transport() -> Transport:
    """The command's channels to services (membership), with its TLS directory and token."""
    tls = _meta("tls_dir")
    return Transport(TlsDir(Path(tls)) if tls else None, token=_meta("token") or "")


async def connected(c: Client) -> Client:
    """`c` once an agent of its list answered (CONNECT_WAIT at most): the command fails
    fast with the cause ("no agent at ...") instead of waiting on a dead address."""
    await c.connect(timeout=CONNECT_WAIT)
    return c


def with_client(agents: list[str], call):
    """`call(client)` on a connected client of `agents`, run to its end; a failure is the command's error."""
    async def run():
        async with client(agents) as c:
            return await call(await connected(c))

    try:
        return asyncio.run(run())
    except EchelonError as e:
        fail(e)


def fail(e: Exception):
    """End the command with `e` as one line (never a traceback or a repr)."""
    if isinstance(e, grpc.aio.AioRpcError):
        raise click.ClickException(f"{e.code().name}: {e.details()}")
    if isinstance(e, EchelonError) and e.code == grpc.StatusCode.UNAVAILABLE:
        raise click.ClickException(e.message)  # (the cause, already in words)
    raise click.ClickException(str(e))


async def membership_failure(replicas: list[str], timeout: float = CONNECT_WAIT) -> str:
    """Why no replica of `replicas` gave a view: each one's cause."""
    via = transport()
    causes = await asyncio.gather(*(probe(a, via, want=MEMBERSHIP, timeout=timeout) for a in replicas))
    return "; ".join(c or f"{a} answered the health check but gave no view" for a, c in zip(replicas, causes)) \
        or "no membership replica given"


def parse_value(text: str):
    """`45` -> int, `45.5` -> float, `"45"` or anything else -> string."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
