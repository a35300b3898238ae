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
