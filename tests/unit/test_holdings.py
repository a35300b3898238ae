"""Reconciliation's digests and diff (core/holdings.py), against plain set arithmetic."""

import random

from hypothesis import given
from hypothesis import strategies as st

from echelon.core.holdings import bucket_of, diff, differing, digests

entries = st.dictionaries(st.sampled_from([f"a/~{i}" for i in range(40)]), st.integers(1, 5), max_size=30)


@given(entries, entries)
def test_digest_then_diff_finds_exactly_the_difference(agent, tier):
    n = 8
    tier_entries = list(tier.items())
    random.Random(1).shuffle(tier_entries)  # order does not matter
    buckets, sent = differing(digests(agent.items(), n), tier_entries)
    # Only differing buckets travel, and a bucket differs exactly when its sets differ.
    for b in range(n):
        same = {h for h in agent.items() if bucket_of(h[0], n) == b} == \
               {h for h in tier.items() if bucket_of(h[0], n) == b}
        assert (b not in buckets) == same
    assert set(sent) == {h for h in tier.items() if bucket_of(h[0], n) in buckets}
    d = diff(agent, sent, buckets, n)
    assert set(d.extra) == set(tier.items()) - set(agent.items())
    assert set(d.missing) == set(agent.items()) - set(tier.items())


def test_equal_sets_send_nothing():
    held = [("a/1", 3), ("a/2", 4)]
    assert differing(digests(held, 4), reversed(held)) == ([], [])
    assert digests([], 2) == digests([], 2) and len(digests([], 2)[0]) == 8
