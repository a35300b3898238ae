"""A topic's schema compiled into one Python function (the publishing agent's
admission, agent/admission.py): a publish's attributes read off the wire, checked and
set into the Event's map in one pass.

Done apart, the request's map is converted to a dict (wire.attributes_from_pb), the dict
checked (Schema.validate_event) and set into the Event (wire.attributes_into_pb): three
passes with a loop and a branch per attribute. Compiled per topic version, each declared
attribute is one straight block:
looked up by name, its kind compared with the one its type takes, its bounds or length
checked against constants, its value set. Unknown attributes are counted out (`len`).

The function only says yes: when the event is valid, its map filled as the passes apart
would fill it and the content of its attributes returned, for the event's digest: the
schema's names and each one's value (None when absent), then the kind of each float
attribute's (an int taken as it is and the float of the same value are other events). Else
None (the map then partly filled: the caller drops that Event and takes the passes apart,
which raise the precise error). Names and bounds are bound constants, never written into
the code's text.

The same function exists compiled (runtime/_fill.c, built by `pip install` where a C
compiler is, docs/performance.md "A compiled hot path"): `compile_schema` gives that one
when it was built and ECHELON_PURE is not set, else the Python one, which stays the
reference (tests/unit/test_schema_fill.py holds the two equal). `COMPILED` says which.
"""

from __future__ import annotations

import os
from typing import Callable

from echelon.contract.schema import NUMBER_BYTES, AttrType, Schema, utf8_length

Fill = Callable[[object, object], "tuple | None"]
KINDS = {AttrType.STRING: 0, AttrType.INT: 1, AttrType.FLOAT: 2}  # runtime/_fill.c's numbering


PURE = os.environ.get("ECHELON_PURE", "") not in ("", "0")


def _compiled():
    """runtime/_fill.c's Fill type, or None: not built here, or ECHELON_PURE set."""
    if PURE:
        return None
    try:
        from echelon.runtime import _fill
    except ImportError:
        return None
    return _fill.Fill


_Fill = _compiled()
# "compiled", or why not: what a log line and the agents' echelon_agent_compiled_hot_path say.
COMPILED = "compiled" if _Fill is not None else (
    "pure Python (ECHELON_PURE)" if PURE
    else "pure Python (runtime/_fill.c not built: no C compiler at install)")


def compile_schema(schema: Schema, pure: bool = False) -> Fill:
    """`fill(attributes, out)`: the request's attributes map, the Event's (empty) map;
    compiled in C when that was built (`pure`: the Python reference regardless)."""
    if _Fill is not None and not pure:
        attributes = sorted(schema.attributes, key=lambda a: a.name)
        strings = [a.type is AttrType.STRING for a in attributes]
        return _Fill(tuple(a.name for a in attributes), tuple(KINDS[a.type] for a in attributes),
                     tuple(None if s else a.low for a, s in zip(attributes, strings)),
                     tuple(None if s else a.high for a, s in zip(attributes, strings)),
                     tuple(a.length_limit if s else 0 for a, s in zip(attributes, strings)),
                     tuple(utf8_length(a.name) + (0 if s else NUMBER_BYTES) for a, s in zip(attributes, strings)),
                     schema.attribute_bytes_limit)
    return python_fill(schema)


def python_fill(schema: Schema) -> Fill:
    """The reference: `fill` written as Python text for this schema and compiled by Python."""
    consts: dict[str, object] = {}

    def const(value: object) -> str:
        name = f"k{len(consts)}"
        consts[name] = value
        return name

    attributes = sorted(schema.attributes, key=lambda a: a.name)
    floats = [i for i, a in enumerate(attributes) if a.type is AttrType.FLOAT]
    lines = ["def fill(m, out):", "    g = m.get", "    n = 0", "    size = 0",
             "    " + " = ".join([f"x{i}" for i in range(len(attributes))] + [f"c{i}" for i in floats] + ["None"])]
    for i, a in enumerate(attributes):
        name = const(a.name)
        lines += [f"    v = g({name})", "    if v is not None:", "        n += 1", f"        c{i} = c = v.WhichOneof('kind')"]
        if a.type is AttrType.STRING:
            lines += ["        if c != 'string_value':", "            return None",
                      f"        x{i} = x = v.string_value",
                      "        s = len(x) if x.isascii() else len(x.encode('utf-8', 'surrogatepass'))",
                      f"        if s > {const(a.length_limit)}:", "            return None",
                      f"        size += s + {const(utf8_length(a.name))}",
                      f"        out[{name}].string_value = x"]
            continue
        kinds = ("int_value",) if a.type is AttrType.INT else ("float_value", "int_value")
        for j, kind in enumerate(kinds):  # a float attribute takes an int as it is (widening)
            lines += [f"        {'if' if j == 0 else 'elif'} c == '{kind}':", f"            x{i} = x = v.{kind}",
                      f"            if not {const(a.low)} <= x <= {const(a.high)}:",  # NaN fails
                      "                return None",
                      f"            out[{name}].{kind} = x"]
        lines += ["        else:", "            return None",
                  f"        size += {const(utf8_length(a.name) + NUMBER_BYTES)}"]
    lines += [f"    if n != len(m) or size > {const(schema.attribute_bytes_limit)}:", "        return None",
              "    return (" + ", ".join([const(tuple(a.name for a in attributes))]
                                          + [f"x{i}" for i in range(len(attributes))]
                                          + [f"c{i}" for i in floats]) + ",)"]
    namespace = dict(consts)
    exec(compile("\n".join(lines), "<schema>", "exec"), namespace)  # noqa: S102 - our own text, constants bound
    return namespace["fill"]  # type: ignore[return-value]
