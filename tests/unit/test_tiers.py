"""Which matcher tier serves which region (dataplane/tiers.py), from a view."""

from __future__ import annotations

from echelon.dataplane.gateway import Gateway
from echelon.dataplane.tiers import Tiers, is_pseudo, pseudo
from echelon.v1 import membership_pb2 as mpb

ALIVE, DEAD, LEFT = mpb.MEMBER_STATE_ALIVE, mpb.MEMBER_STATE_DEAD, mpb.MEMBER_STATE_LEFT


def member(i: str, role: int, region: str, state: int = ALIVE) -> mpb.Member:
    return mpb.Member(id=i, role=role, region=region, state=state)


def view(matchers: dict[str, str], routers: dict[str, str], agents: dict[str, str] = {}, states: dict = {}):
    return [member(i, role, r, states.get(i, ALIVE))
            for role, ms in ((mpb.ROLE_MATCHER, matchers), (mpb.ROLE_ROUTER, routers), (mpb.ROLE_AGENT, agents))
            for i, r in ms.items()]


def test_one_region_of_matchers_serves_every_region_as_before():
    t = Tiers(view({"m0": "local", "m1": "local"}, {"r-eu": "eu", "r-us": "us"}, {"a": "eu", "b": "us"}))
    assert {t.serving(r) for r in ("eu", "us", "local")} == {"local"}
    assert t.far("eu") == t.far("us") == []  # one tier names every agent: no region sent to as a whole
    assert [m.id for m in t.matchers(view({"m0": "local", "m1": "local"}, {}), "eu")] == ["m0", "m1"]


def test_each_region_with_matchers_has_its_own_tier():
    members = view({"m-eu": "eu", "m-us": "us", "m-ap": "ap"}, {"r-eu": "eu", "r-us": "us", "r-ap": "ap"})
    t = Tiers(members)
    assert [t.serving(r) for r in ("eu", "us", "ap")] == ["eu", "us", "ap"]
    assert t.far("eu") == ["@ap", "@us"]
    assert [m.id for m in t.matchers([m for m in members if m.role == mpb.ROLE_MATCHER], "us")] == ["m-us"]


def test_a_region_without_matchers_is_served_by_the_first_region_with_some():
    t = Tiers(view({"m-us": "us", "m-ap": "ap"}, {"r-eu": "eu", "r-us": "us", "r-ap": "ap"}))
    assert t.serving("eu") == "ap"
    assert t.far("eu") == ["@us"]  # ap's tier names eu's and ap's agents
    assert t.far("ap") == ["@us"] and t.far("us") == ["@ap", "@eu"]


def test_dead_members_keep_their_region_left_ones_do_not():
    states = {"m-us": DEAD, "r-ap": DEAD}
    t = Tiers(view({"m-eu": "eu", "m-us": "us", "m-ap": "ap"}, {"r-eu": "eu", "r-ap": "ap"}, states=states))
    assert t.serving("us") == "us"  # a crashed matcher does not move its region's subscriptions
    assert t.far("eu") == ["@ap"]  # a region whose router is DEAD is still sent to (parked for it)
    t = Tiers(view({"m-eu": "eu", "m-ap": "ap"}, {"r-eu": "eu", "r-ap": "ap"}, states={"r-ap": LEFT}))
    assert t.far("eu") == []


def test_the_gateway_parks_other_regions_while_its_region_has_no_router():
    g = Gateway("a", "eu")
    g.update([member("r-eu", mpb.ROLE_ROUTER, "eu")], {"r-eu": "eu", "b": "us"}, "eu", ["@us"])
    assert g.elsewhere(["a", "b"]) == ["b", "@us"]
    assert g.alive("@us") and not g.dead
    g.update([], {"b": "us"}, "eu", ["@us"])
    assert g.waits_for("@us") and "@us" in g.dead and not g.alive("@us")
    assert not g.waits_for("b")  # an agent of a region without routers here is lost, as before
    assert is_pseudo(pseudo("us")) and not is_pseudo("agent-0")
