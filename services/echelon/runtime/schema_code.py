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
"""

from __future__ import annotations

from typing import Callable

from echelon.contract.schema import NUMBER_BYTES, AttrType, Schema, utf8_length

Fill = Callable[[object, object], "tuple | None"]


def compile_schema(schema: Schema) -> Fill:
    """`fill(attributes, out)`: the request's attributes map, the Event's (empty) map."""
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
