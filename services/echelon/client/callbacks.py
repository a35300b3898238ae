"""The callback form of a subscription (client/subscription.py): each message goes to
`callback(msg)` in its own task, at most `max_outstanding` at once; a return acks it,
an exception nacks it (redelivered; logged and counted in `callback_errors`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import TYPE_CHECKING

from echelon.client.errors import ClientClosed, EchelonError

if TYPE_CHECKING:
    from echelon.client.message import Message
    from echelon.client.subscription import Callback, Subscription

log = logging.getLogger("echelon.client")


async def dispatch(sub: "Subscription", callback: "Callback") -> None:
    """Until the subscription ends: each message to the callback, at most max_outstanding at once."""
    slots = asyncio.Semaphore(sub.max_outstanding)
    loop = asyncio.get_running_loop()  # once: each call costs a syscall (getpid)
    while True:
        await slots.acquire()
        try:
            await sub._wait(None)
            (msg,) = sub._hand(1)
        except EchelonError:
            return
        task = loop.create_task(_run(sub, callback, msg))
        sub._callbacks.add(task)
        task.add_done_callback(lambda t: (sub._callbacks.discard(t), slots.release()))


async def _run(sub: "Subscription", callback: "Callback", msg: "Message") -> None:
    try:
        result = callback(msg)
        if inspect.isawaitable(result):
            await result
        settle = msg.ack()
    except Exception:  # noqa: BLE001 - the message is redelivered; the error is logged and counted
        sub.callback_errors += 1
        log.exception("subscription callback failed on %s:%d; nacked", msg.producer_id, msg.sequence)
        settle = msg.nack()
    try:
        await settle
    except ClientClosed:
        pass  # the stream ended meanwhile: the agent redelivers it (named subscriptions)
