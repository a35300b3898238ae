import asyncio
import os
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings

from tests.harness import Cluster

# `echelon up` writes where its cluster is to a context file every command reads (cli/context.py):
# the tests' clusters write theirs here, never to the user's ~/.config, and no test reads the user's.
os.environ["ECHELON_CONTEXT"] = str(Path(tempfile.mkdtemp(prefix="echelon-tests-")) / "context.json")

# Property tests say what holds, not how fast: a shared, loaded machine must not fail them on
# hypothesis' per-example deadline or its too-slow check.
settings.register_profile("echelon", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("echelon")


def pytest_asyncio_loop_factories(config, item):
    """Async tests (and the in-process clusters in them) run on asyncio's loop unless
    ECHELON_EVENT_LOOP=uvloop asks for the services' loop (runtime/loop.py): uvloop forks a
    subprocess itself and runs Python's at-fork handlers in the child, and with gRPC's
    threads busy in this process one child died of a segfault in such a handler
    (filelock's) in a full run. The service processes the tests start run on uvloop."""
    import os

    from echelon.runtime.loop import ENV

    if os.environ.get(ENV, "").strip().lower() == "uvloop":
        import uvloop

        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest_asyncio.fixture
async def cluster():
    """Three agents, one matcher, one membership replica, on loopback."""
    c = Cluster(agents=3)
    try:
        yield await c.start()
    finally:
        await c.stop()


_spark = None  # started by pytest_collection_finish when a collected test needs it


def pytest_collection_finish(session):
    """Start Spark's JVM before any test runs, when one of them needs it. PySpark forks the
    JVM from this process, and a fork while gRPC's threads are busy (every test before it
    leaves some) once lost the child: "Java gateway process exited before sending its port
    number", after grpc's "skipping fork() handlers"."""
    global _spark
    if any("spark" in getattr(item, "fixturenames", ()) for item in session.items):
        from echelon.replan.session import session as spark_session

        _spark = spark_session("local[*]")


@pytest.fixture(scope="session")
def spark():
    """One local[*] SparkSession for every Spark test of the run (a JVM start costs ~10 s)."""
    from echelon.replan.session import session

    s = _spark or session("local[*]")
    try:
        yield s
    finally:
        s.stop()
