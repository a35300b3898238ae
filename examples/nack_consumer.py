"""A callback consumer with flow control and nack: a work queue whose flaky jobs are
retried after a delay.

Start a local cluster in another terminal (`echelon up`), then:

    python examples/nack_consumer.py         # the agents `echelon up` wrote to its context file
    python examples/nack_consumer.py --agent 127.0.0.1:7200

A named subscription hands jobs to an async callback, at most --max-outstanding at
once. Every fifth job fails its first attempt (a downstream hiccup): the callback nacks
it with a delay and the agent redelivers it later (`redelivery_count` 1). The callback
returning acks the job. Once every job is done the subscription drains (running
callbacks finish, nothing new is handed out) and is removed. Exit status 0 when every job was done exactly once
and no more than --max-outstanding ran at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys

from echelon.client import AckLevel, Client, Message, errors
from echelon.client.context import default_agents

RETRY_DELAY = 0.5  # seconds
TOPIC = "examples.jobs"


class Worker:
    def __init__(self, jobs: int, limit: int):
        self.jobs, self.limit = jobs, limit
        self.done: list[int] = []
        self.retried: list[int] = []
        self.running = self.most = 0
        self.finished = asyncio.Event()

    async def handle(self, msg: Message) -> None:
        job = msg.attributes["job"]
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(random.uniform(0.001, 0.02))  # the work
            if job % 5 == 0 and msg.redelivery_count == 0:
                self.retried.append(job)
                print(f"job {job}: downstream busy, retry in {RETRY_DELAY}s")
                await msg.nack(delay=RETRY_DELAY)
                return
            self.done.append(job)
            print(f"job {job}: done (attempt {msg.redelivery_count + 1})")
            if len(self.done) == self.jobs:
                self.finished.set()
        finally:
            self.running -= 1
        # returning acks the message; raising would nack it at once


async def main(agents: list[str], jobs: int, limit: int, topic: str = TOPIC) -> int:
    worker = Worker(jobs, limit)
    async with Client(agents) as client:
        await client.connect()  # fails at once, naming the cause, when no agent is there
        try:
            await client.create_topic(topic, ["job:int"])
        except errors.AlreadyExists as e:  # the topic exists with another schema
            print(f"cannot use topic {topic!r}: {e.message}; delete it (`echelon topic delete {topic}`) or give "
                  "--topic another name", file=sys.stderr)
            return 2
        sub = client.subscribe(topic, "", name="workers", callback=worker.handle, max_outstanding=limit)
        await sub.start()
        async with client.publisher(ack_level=AckLevel.DELIVERED) as pub:
            await pub.publish_batch(topic, [{"job": i} for i in range(jobs)])
        try:
            await asyncio.wait_for(worker.finished.wait(), 60)
        except asyncio.TimeoutError:
            print(f"only {len(worker.done)} of {jobs} jobs done in 60 s", file=sys.stderr)
        await sub.drain(timeout=10)  # running callbacks finish; nothing new is handed out
        await client.unsubscribe("workers")  # the queue is finished (a worker pool would keep it)
    exact = sorted(worker.done) == list(range(jobs))
    print(f"{len(worker.done)} jobs done, {len(worker.retried)} retried after a nack, "
          f"at most {worker.most} at once (limit {limit}): {'ok' if exact and worker.most <= limit else 'FAILED'}")
    return 0 if exact and worker.most <= limit else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", action="append", help="an agent's address (repeat for failover; default: the "
                                                         "context `echelon up` wrote, or $ECHELON_AGENT)")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--max-outstanding", type=int, default=4)
    args = parser.parse_args()
    try:
        sys.exit(asyncio.run(main(args.agent or default_agents(), args.jobs, args.max_outstanding, args.topic)))
    except errors.EchelonError as e:  # e.g. no agent there: the cause, not a traceback
        sys.exit(f"nack_consumer: {e.message}")
