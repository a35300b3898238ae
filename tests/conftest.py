import pytest
import pytest_asyncio

from tests.harness import Cluster


@pytest_asyncio.fixture
async def cluster():
    """Three agents, one matcher, one membership replica, on loopback."""
    c = Cluster(agents=3)
    try:
        yield await c.start()
    finally:
        await c.stop()


@pytest.fixture(scope="session")
def spark():
    """One local[*] SparkSession for every Spark test of the run (a JVM start costs ~10 s)."""
    from spark.session import session

    s = session("local[*]")
    try:
        yield s
    finally:
        s.stop()
