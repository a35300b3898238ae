"""The reconciliation barrier's bookkeeping (matcher/refill.py): complete once every agent
the view holds alive has refilled, or a complete handoff filled the topic, or the wait
for the missing agents timed out (counted)."""

from echelon.matcher.refill import Refill


def test_complete_once_every_alive_agent_refilled():
    alive = {"a", "b"}
    now = [0.0]
    r = Refill(lambda: alive, timeout=30, clock=lambda: now[0])
    assert not r.complete("t")
    r.agent("a")
    assert not r.complete("t")
    alive.add("c")  # an agent that appears meanwhile is waited for too
    r.agent("b")
    assert not r.done()
    alive.discard("c")  # ... until the view no longer holds it alive
    assert r.done() and r.complete("t")
    alive.add("d")  # monotone: a later agent registers through any entry like any other
    assert r.complete("t")


def test_a_handoff_from_complete_peers_completes_its_topic_only():
    r = Refill(lambda: {"a"}, timeout=30, clock=lambda: 0.0)
    r.handoff("t")
    assert r.complete("t") and not r.complete("u")


def test_an_agent_that_never_refills_is_given_up_after_the_timeout_and_counted():
    now = [0.0]
    timeouts = []
    r = Refill(lambda: {"a", "b"}, timeout=5, clock=lambda: now[0])
    r.on_timeout = timeouts.append
    r.agent("a")
    now[0] = 4.9
    assert not r.complete("t")
    now[0] = 5.1
    assert r.complete("t") and timeouts == [1]


def test_without_agents_to_wait_for_it_is_complete_from_the_start():
    assert Refill().complete("t")
    assert Refill(lambda: []).complete("t")
