"""matcher/sample.py's EventSampler: every event counted per topic, one in `every` kept
at a fixed stride across batches, the last `kept` per topic (oracle: the whole stream)."""

from __future__ import annotations

import random

from echelon.matcher.sample import EventSampler


def test_systematic_sample_and_exact_counts():
    rnd = random.Random(3)
    sampler = EventSampler(kept=50, every=8)
    stream = []
    for _ in range(300):
        batch = [(rnd.choice("abc"), {"x": len(stream) + k}) for k in range(rnd.choice([1, 2, 7, 8, 9, 64]))]
        stream += batch
        sampler.add([t for t, _ in batch], [a for _, a in batch])
    for topic in "abc":
        assert sampler.seen[topic] == sum(t == topic for t, _ in stream)
        kept = [a for i, (t, a) in enumerate(stream) if t == topic and i % 8 == 0][-50:]
        assert list(sampler.recent[topic]) == kept


def test_least_recent_topic_goes_past_the_bound():
    sampler = EventSampler(topics=2, every=1)
    for topic in "abca":
        sampler.add([topic], [{"x": 1}])
    assert list(sampler.recent) == ["c", "a"] and "b" not in sampler.seen
