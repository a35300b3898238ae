"""The Python client SDK, shared by the CLI, the tests and users.

    import asyncio
    from echelon.client import AckLevel, Client, errors

    async def main():
        async with Client("127.0.0.1:7200") as client:
            await client.create_topic("quotes", ["Symbol:string", "High:float:0:500"])
            async with client.subscribe("quotes", 'Symbol = "aapl" and High >= 45') as sub:
                async with client.publisher(ack_level=AckLevel.DELIVERED) as pub:
                    result = await pub.publish("quotes", {"Symbol": "aapl", "High": 50.0})
                    print(result)        # PublishResult(producer_id='p-...', sequence=1, destinations=1)
                msg = await sub.next(timeout=5)
                await msg.ack()
            try:
                await client.get_topic("nope")
            except errors.NotFound as e:
                print(e.message)

    asyncio.run(main())

The pieces: `Client` (topics, drain/close), `Publisher` (`publish`, `publish_nowait`,
`publish_batch`; flushes on exit), `Subscription` (iterate, or `callback=` with
`max_outstanding` flow control; `msg.ack()`, `msg.nack(delay=...)`), `AckLevel`, and one
error family in `echelon.client.errors`. The client needs grpcio and protobuf only
(`pip install .` in a checkout, or the wheel `make dist` builds: docs/cli.md); the services
come with the `server` extra.
"""

from echelon.client import errors
from echelon.client.client import Client
from echelon.client.connection import ConnectionEvent, Reconnect
from echelon.client.durable import Durable
from echelon.client.errors import EchelonError
from echelon.client.publisher import AckLevel, Publisher, PublishResult
from echelon.client.subscription import Message, Subscription

ACCEPTED, DELIVERED = AckLevel.ACCEPTED, AckLevel.DELIVERED  # shorthands: `publisher(ack_level=DELIVERED)`

__all__ = ["ACCEPTED", "DELIVERED", "AckLevel", "Client", "ConnectionEvent", "Durable", "EchelonError", "Message",
           "PublishResult", "Publisher", "Reconnect", "Subscription", "errors"]
