"""A topic's filters compiled into one Python function (a subscribing agent's
local match, delivery.py).

Checking each filter with `Filter.matches` walks its predicates through a generator and
a method call each, for every filter and every event it receives. The counting index
(core/cdm.py) beats that per event in large frames, but has a fixed cost per call, which a
lone event pays alone. Compiled, the whole set is one call per frame: for each event,
each attribute a filter names is read and its kind (string or number) found once, then
every filter is one boolean expression over those locals, except filters that are one
equality (`Symbol = "x"`, the commonest): those of an attribute are found by one dict
lookup of its value, whatever their number.

Exact as `Filter.matches` (each predicate as `Predicate.holds`) for the values events
carry (int, float, str: contract/wire.py): no value, a bool, or a value of the other
kind satisfies no predicate. A predicate whose literal is of none of these kinds calls
its own `holds`. Literals are passed to the code as bound constants, never written into
its text.

A disjunction (contract/filters.py) is one `or` of its terms' tests: a subscription gets an
event once, however many of its terms the event satisfies.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from echelon.contract.filters import Expression, Filter, Op, Predicate

Matcher = Callable[[Sequence[Mapping[str, object]]], list[list[int]]]

_COMPARE = {Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}


def compile_filters(filters: Sequence[Expression], wire: bool = False) -> Matcher:
    """A function of a batch of events' attributes: for each filter (in the order of
    `filters`), the positions in the batch of the events it satisfies, in order. One call
    per batch, the loop over its events inside: a frame's events come together, and each
    subscription takes its own in one go (delivery.py).

    `wire`: each item of the batch is an event's attribute map as received (names to
    values with a `kind` oneof, the contract's Value), read in place: only the attributes
    the filters name, not every one converted to a dict first.
    A value with no kind set, or NaN (both refused at publish), satisfies no predicate."""
    consts: dict[str, object] = {}
    attrs: dict[str, int] = {}  # attribute name -> its local's number
    tests: list[str] = []

    def const(value: object) -> str:
        name = f"k{len(consts)}"
        consts[name] = value
        return name

    def local(attribute: str) -> int:
        if attribute not in attrs:
            attrs[attribute] = len(attrs)
        return attrs[attribute]

    equal: dict[tuple[int, str], dict[object, list[int]]] = {}  # (attribute, kind) -> literal -> filters
    for pos, flt in enumerate(filters):
        (p, *more) = flt.predicates if isinstance(flt, Filter) and flt.predicates else (None,)
        kind = "s" if p is not None and p.value.__class__ is str else "n"
        if p is not None and not more and p.op is Op.EQ and p.value.__class__ in (str, int, float) and \
                p.value == p.value:  # one equality (not NaN): by lookup
            equal.setdefault((local(p.attribute), kind), {}).setdefault(p.value, []).append(pos)
            tests.append("")
        else:  # a disjunction: its terms in one `or`, each term's predicates in one `and`
            terms = [_conjunction([_predicate(p, local(p.attribute), const) for p in t.predicates]) for t in flt.terms]
            tests.append(terms[0] if len(terms) == 1 else " or ".join(f"({t})" for t in terms))
    lines = ["def match(batch):"]
    lines += [f"    r{pos} = []" for pos in range(len(tests))]
    lines += [f"    rs = [{', '.join(f'r{pos}' for pos in range(len(tests)))}]",
              "    for j, a in enumerate(batch):", "        g = a.get"]
    for attribute, i in attrs.items():
        lines.append(f"        x{i} = g({const(attribute)})")
        if wire:
            lines += [f"        if x{i} is not None:", f"            w = x{i}.WhichOneof('kind')",
                      f"            x{i} = None if w is None else getattr(x{i}, w)",
                      f"            if x{i} != x{i}: x{i} = None"]
        lines += [f"        c{i} = x{i}.__class__",
                  f"        s{i} = c{i} is str", f"        n{i} = c{i} is int or c{i} is float"]
    for (i, kind), table in equal.items():  # the value's filters (1 == 1.0, as ==), if it is of the kind
        lines += [f"        if {kind}{i}:", f"            for pos in {const(table)}.get(x{i}, ()): rs[pos].append(j)"]
    for pos, test in enumerate(tests):
        if test:
            lines.append(f"        if {test}: r{pos}.append(j)")
    lines.append("    return rs")
    namespace = dict(consts)
    exec(compile("\n".join(lines), "<filters>", "exec"), namespace)  # noqa: S102 - our own text, constants bound
    return namespace["match"]  # type: ignore[return-value]


def _conjunction(tests: list[tuple[str, str]]) -> str:
    """A term's predicates in one `and`; consecutive ones of the same kind test it once
    (`Price >= a and Price < b`: `(n0 and k0 <= x0 and x0 < k1)`)."""
    out: list[tuple[str, list[str]]] = []
    for kind, test in tests:
        if kind and out and out[-1][0] == kind:
            out[-1][1].append(test)
        else:
            out.append((kind, [test]))
    return " and ".join(f"({kind} and {' and '.join(ts)})" if kind else ts[0] for kind, ts in out) or "True"


def _predicate(p: Predicate, i: int, const: Callable[[object], str]) -> tuple[str, str]:
    """One predicate over the locals of attribute number `i` (x: the value, s/n: its kind):
    the kind it needs ("": none, a call) and its test given that kind."""
    v, x = p.value, f"x{i}"
    kinds = {str: f"s{i}", int: f"n{i}", float: f"n{i}"}
    kind = kinds.get(v.__class__)
    if kind is None or (p.op is Op.BETWEEN and p.upper.__class__ not in kinds) or \
            (p.op is Op.PREFIX and kind != f"s{i}"):
        return "", f"{const(p.holds)}({x})"  # an unusual literal: the predicate's own check
    if p.op is Op.BETWEEN:
        return kind, f"{const(v)} <= {x} <= {const(p.upper)}"
    if p.op is Op.PREFIX:
        return kind, f"{x}.startswith({const(v)})"
    return kind, f"{x} {_COMPARE[p.op]} {const(v)}"
