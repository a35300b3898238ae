"""Who owns a named or durable subscription, and the scope of its name (docs/security.md).

With auth on, the name a client gives (`orders`) is in its own scope: the cluster-wide
name is `<identity>/<name>` (`ann/orders`), so two users who both pick `orders` get two
subscriptions, never each other's. A client name cannot contain `/`, so the part before
the last `/` is always the identity that created it (the owner); the owner may use
either form. Another identity may use the qualified form only if it holds `admin` on the
subscription's topic; to anyone else the subscription does not exist (NOT_FOUND with the
name as they gave it: a refusal never confirms another user's subscription). Ephemeral
subscriptions (`~N`, generated per agent) keep their name and carry their owner.

With auth off every caller is `anonymous` and names are not scoped; members (an agent
relaying a stream it already checked) pass the cluster-wide name as it is.
"""

from __future__ import annotations

from echelon.runtime.auth import CALLER, Access
from echelon.contract.errors import InvalidArgument, NotFound

SCOPE = "/"
MAX_NAME = 200  # a client's part of a name


def caller_name(access: Access) -> str:
    """The owner a subscription created by the current call records ("" : nobody's, auth
    off or a member)."""
    caller = CALLER.get()
    if not access.on or caller is None or not caller.limited:
        return ""
    return caller.identity.name


def owner_of(name: str) -> str:
    return name.rpartition(SCOPE)[0]


def scoped(access: Access, name: str) -> str:
    """The cluster-wide name of `name` as the current caller means it (not yet checked:
    `check` decides once the topic is known). INVALID_ARGUMENT for a malformed name."""
    me = caller_name(access)
    if not name or CALLER.get() is None or (access.on and not me):  # a member: as it is
        return name
    owner, _, short = name.rpartition(SCOPE)
    if not short or short.startswith("~") or len(short) > MAX_NAME or (owner and not me):
        raise InvalidArgument(f"subscription name {name[:60]!r}: 1-{MAX_NAME} characters, no leading '~', "
                              f"no '/'" + (" (but in '<owner>/<name>')" if me else ""))
    return name if owner else f"{me}{SCOPE}{name}" if me else name


def may_use(access: Access, name: str, topic: str, owner: str | None = None) -> bool:
    """May the current caller open, ack, seek, modify or delete the subscription `name` on
    `topic`? Its owner (`owner`, else the one its name records) or an admin of the topic."""
    me = caller_name(access)
    if not me:
        return True
    who = owner_of(name) if owner is None else owner
    return who == me or access.acl().allows(CALLER.get().identity, "admin", topic)


def check(access: Access, name: str, topic: str, given: str, owner: str | None = None) -> None:
    """NOT_FOUND (naming only what the caller gave) unless the caller may use it."""
    if not may_use(access, name, topic, owner):
        raise NotFound(f"subscription {given!r} does not exist")


def claim(access: Access, open_, registry=None) -> None:
    """An open's name made cluster-wide for its caller, and checked: a qualified name of
    another identity's needs admin on the topic the open names (the owner's own check).
    With `registry` (a named open served here), creating one more past the caller's
    `subscriptions` is refused (quota.py)."""
    given = open_.subscription
    name = scoped(access, given)
    if name:
        check(access, name, open_.topic, given)
    open_.subscription = name
    if registry is not None and name and not open_.HasField("durable"):
        from echelon.agent.quota import check_named  # quota.py builds on this module
        check_named(access, registry, name)
