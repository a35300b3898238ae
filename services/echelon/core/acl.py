"""Per-topic access control: who may publish to, subscribe to or administer which topics.

The model is Kafka's ACLs and Pub/Sub's per-topic IAM, reduced to what a broker needs:

- An identity has a name and groups (from a token file, a JWT's claims or a client
  certificate: runtime/auth.py). A *principal* names who a rule is for:
  `user:<name>`, `group:<name>`, or `*` (every authenticated identity).
- A *pattern* names topics: a topic name (`quotes`), a prefix wildcard (`quotes.*`:
  every topic under `quotes.`, at any depth, but not `quotes` itself), or `*` (every topic).
- Rights: `publish`, `subscribe`, `admin`. `admin` implies the other two on the same
  topics (an owner may use what it administers). `admin` on `*` is the cluster admin:
  it changes ACLs, pushes routing plans (Control), and administers every topic.
- Allow rules only, no deny: the rights an identity holds on a topic are the union over
  the rules that name it, so the order rules were written in never matters.
- Identities in the group `admins` (SUPERUSERS) hold every right without a rule: they
  bootstrap the ACLs of an empty cluster. Members (the cluster's own services) are not
  subject to topic ACLs at all (runtime/auth.py): they carry traffic an agent checked.

Caps per identity (docs/security.md, "Caps per identity") are kept beside the rules, in
the same replicated map, under the pattern CAPS_PATTERN (which no topic pattern can be):
what a principal may hold and ask for (`CAP_FIELDS`). For an identity, each cap is its
user's value if set, else the highest its groups set (a group grants capacity as it
grants rights: the union), else `*`'s; unset everywhere, the agent's --limits apply.

A rule is keyed by (principal, pattern) (`rule_key`): a grant adds rights to that rule,
a revoke removes some, and a rule with none left is deleted. Membership stores the rules
in a last-writer-wins map like topics (core/replication.py), so two concurrent grants
on the same key at two replicas keep one of them everywhere; grants on different keys
never interfere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

RIGHTS = ("publish", "subscribe", "admin")
SUPERUSERS = "admins"  # the group whose members hold every right
_TOPIC = r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}"
_PATTERN = re.compile(rf"^(\*|{_TOPIC}\.\*|{_TOPIC})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@._:+-]{0,199}$")
_MEMO = 4096  # decisions remembered per rule set (a publish checks one per event)
CAPS_PATTERN = "+caps"  # the pattern of a principal's caps entry (a topic starts with a letter or digit)
CAP_FIELDS = ("subscriptions", "durable_subscriptions", "durable_max_messages", "durable_max_bytes",
              "durable_max_idle_seconds", "durable_max_replicas")


class AclError(ValueError):
    """A malformed rule: bad principal, pattern or right."""


@dataclass(frozen=True)
class Identity:
    """Who is calling: `name`, `groups`; `member` for the cluster's own services."""

    name: str
    groups: frozenset[str] = frozenset()
    member: bool = False

    @property
    def superuser(self) -> bool:
        return SUPERUSERS in self.groups

    def __str__(self) -> str:
        return f"member {self.name!r}" if self.member else f"user:{self.name}"


@dataclass(frozen=True)
class Rule:
    principal: str
    pattern: str
    rights: frozenset[str]

    @property
    def key(self) -> str:
        return rule_key(self.principal, self.pattern)


def rule_key(principal: str, pattern: str) -> str:
    """The replicated map's key of a rule (a space cannot occur in either part)."""
    return f"{principal} {pattern}"


def make_rule(principal: str, pattern: str, rights: Iterable[str]) -> Rule:
    """A validated rule; AclError names what is wrong."""
    check_principal(principal)
    if not _PATTERN.match(pattern):
        raise AclError(f"pattern {pattern!r}: a topic name, '<prefix>.*' or '*'")
    rights = frozenset(rights)
    if not rights or not rights <= set(RIGHTS):
        raise AclError(f"rights {sorted(rights)}: one or more of {', '.join(RIGHTS)}")
    return Rule(principal, pattern, rights)


def check_principal(principal: str) -> None:
    kind, _, name = principal.partition(":")
    if principal != "*" and (kind not in ("user", "group") or not _NAME.match(name)):
        raise AclError(f"principal {principal!r}: 'user:<name>', 'group:<name>' or '*'")


def make_caps(principal: str, caps: Mapping[str, int]) -> dict[str, int]:
    """Validated caps of `principal` (fields of CAP_FIELDS, positive; 0 dropped)."""
    check_principal(principal)
    bad = [k for k in caps if k not in CAP_FIELDS]
    if bad:
        raise AclError(f"caps {', '.join(map(repr, bad))}: one of {', '.join(CAP_FIELDS)}")
    for k, v in caps.items():
        if not isinstance(v, int) or v < 0 or v >= 1 << 63:
            raise AclError(f"cap {k}={v!r}: a whole number from 1 (0 removes it)")
    return {k: v for k, v in caps.items() if v}


def caps_for(caps: Mapping[str, Mapping[str, int]], who: Identity) -> dict[str, int]:
    """The caps that apply to `who` from principal -> caps: per field, its user's, else the
    highest of its groups', else `*`'s (absent: none set, the agent's limits apply)."""
    out: dict[str, int] = dict(caps.get("*", {}))
    grouped: dict[str, int] = {}
    for g in who.groups:
        for k, v in caps.get(f"group:{g}", {}).items():
            grouped[k] = max(grouped.get(k, 0), v)
    out.update(grouped)
    out.update(caps.get(f"user:{who.name}", {}))
    return out


def matches(pattern: str, topic: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return topic.startswith(pattern[:-1])
    return pattern == topic


def grant(old: Rule | None, rule: Rule) -> Rule:
    """The rule after adding `rule`'s rights to `old` (same key)."""
    return rule if old is None else Rule(rule.principal, rule.pattern, old.rights | rule.rights)


def revoke(old: Rule | None, rule: Rule) -> Rule | None:
    """The rule after removing `rule`'s rights from `old`; None: nothing left (delete it)."""
    if old is None:
        return None
    left = old.rights - rule.rights
    return Rule(old.principal, old.pattern, left) if left else None


def implied(rights: Iterable[str]) -> frozenset[str]:
    rights = frozenset(rights)
    return frozenset(RIGHTS) if "admin" in rights else rights


class Acl:
    """An immutable rule set and its decisions: build a new one when the rules change."""

    def __init__(self, rules: Iterable[Rule] = (), caps: Mapping[str, Mapping[str, int]] | None = None):
        self.rules = sorted(rules, key=lambda r: r.key)
        self.caps = dict(caps or {})  # principal -> its caps (CAP_FIELDS)
        self._caps_memo: dict[tuple, dict[str, int]] = {}
        self._by_principal: dict[str, list[tuple[str, frozenset[str]]]] = {}
        for r in self.rules:
            self._by_principal.setdefault(r.principal, []).append((r.pattern, implied(r.rights)))
        self._memo: dict[tuple, bool] = {}

    def allows(self, who: Identity, right: str, topic: str = "*") -> bool:
        """May `who` exercise `right` on `topic`? `topic="*"` asks for every topic (cluster admin)."""
        if who.member or who.superuser:
            return True
        key = (who.name, who.groups, right, topic)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            hit = self._memo[key] = self._decide(who, right, topic)
        return hit

    def _decide(self, who: Identity, right: str, topic: str) -> bool:
        principals = ("*", f"user:{who.name}", *(f"group:{g}" for g in who.groups))
        for p in principals:
            for pattern, rights in self._by_principal.get(p, ()):
                if right in rights and (pattern == "*" if topic == "*" else matches(pattern, topic)):
                    return True
        return False

    def caps_of(self, who: Identity) -> dict[str, int]:
        """`caps_for` this rule set's caps, remembered per identity."""
        key = (who.name, who.groups)
        hit = self._caps_memo.get(key)
        if hit is None:
            if len(self._caps_memo) >= _MEMO:
                self._caps_memo.clear()
            hit = self._caps_memo[key] = caps_for(self.caps, who)
        return hit

    def refusal(self, who: Identity, right: str, topic: str = "*") -> str | None:
        """None when allowed, else the message a PERMISSION_DENIED carries."""
        if self.allows(who, right, topic):
            return None
        where = "every topic ('*')" if topic == "*" else f"topic {topic!r}"
        return f"{who} lacks the {right!r} right on {where}"
