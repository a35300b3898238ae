"""The `echelon` command: one module per command group, all Click (docs/cli.md).

Services (services.py): agent, matcher, router, membership. A local cluster: up, demo.
Clients of a cluster: context, topic, pub, sub, subscription, acl, status, top, topology.
The routing job: replan, metrics. Pure computation: tree.
"""

from __future__ import annotations

import os
import sys

try:
    import click
    import rich  # noqa: F401
except ModuleNotFoundError as e:  # `pip install echelon-pubsub` is the client alone
    raise SystemExit(f"the echelon command needs the server extra ({e.name} is missing): "
                     "pip install 'echelon-pubsub[server]'") from None

DEBUG_ENV = "ECHELON_DEBUG"  # set: a failure the CLI did not expect shows its traceback


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("echelon-pubsub")
    except PackageNotFoundError:
        return "unknown (not installed)"


@click.group(context_settings={"auto_envvar_prefix": "ECHELON", "help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", "-V", prog_name="echelon", message="%(prog)s %(version)s")
def cli() -> None:
    """Echelon: content-based publish/subscribe.

    `echelon up` starts a local cluster and writes where it is to a context file; the
    other commands find it there (`echelon context`), or take --agent, --membership,
    --prometheus, or ECHELON_AGENT, ECHELON_MEMBERSHIP, ECHELON_PROMETHEUS."""


from echelon.cli.acl import acl  # noqa: E402 - subcommands register below
from echelon.cli.context import context  # noqa: E402
from echelon.cli.demo import demo  # noqa: E402
from echelon.cli.observe import top, topology  # noqa: E402
from echelon.cli.pubsub import pub, sub  # noqa: E402
from echelon.cli.replan import metrics, replan  # noqa: E402
from echelon.cli.services import agent, matcher, membership, router  # noqa: E402
from echelon.cli.status import status  # noqa: E402
from echelon.cli.subscription import subscription  # noqa: E402
from echelon.cli.topic import topic  # noqa: E402
from echelon.cli.tree import tree  # noqa: E402
from echelon.cli.up import up  # noqa: E402

for command in (agent, matcher, router, membership, up, demo, context, topic, pub, sub, subscription, acl, status,
                top, topology, tree, replan, metrics):
    cli.add_command(command)


def main() -> None:
    """The console script: a failure is one line on stderr and a non-zero exit, never a
    traceback (ECHELON_DEBUG=1 shows one for a failure nobody expected)."""
    import grpc

    from echelon.client import EchelonError

    try:
        cli()
    except EchelonError as e:
        _die(str(e) if e.code != grpc.StatusCode.UNAVAILABLE else e.message)
    except grpc.aio.AioRpcError as e:
        _die(f"{e.code().name}: {e.details()}")
    except Exception as e:  # noqa: BLE001 - the last resort: one line, not a traceback
        if os.environ.get(DEBUG_ENV):
            raise
        _die(f"{type(e).__name__}: {e} (set {DEBUG_ENV}=1 to see where)")


def _die(message: str) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(1)
