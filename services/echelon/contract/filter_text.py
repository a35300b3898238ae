"""The filter language's grammar, and its compilation to the normal form (filters.py).

    filter     := '{' [or_expr] '}' | [or_expr]
    or_expr    := and_expr ('or' and_expr)*
    and_expr   := factor ('and' factor)*
    factor     := 'not' factor | '(' or_expr ')' | predicate
    predicate  := name op literal | name 'between' literal 'and' literal
                | name 'prefix' string | name ['not'] 'in' '(' literal (',' literal)* ')'

`not` binds tighter than `and`, `and` tighter than `or`, as in SQL. A tree of these is
turned into a disjunction of conjunctive terms: `not` goes down to the predicates (De
Morgan; `Predicate.negated`), `and` distributes over `or`. The normal form can be
exponential in the text (`(a or b) and (c or d) and ...`), so its size is counted on
the tree first, in both polarities, and refused past `FilterLimits.max_terms` or
`max_expanded` before a term is built. Everything else is one pass over the text: the
tokens (one regex match each), a recursive descent bounded by `max_depth`, and the
predicates counted as they are read, so the work stops at the first cap passed.
"""

from __future__ import annotations

import re
from typing import Union

from echelon.contract.filters import (Disjunction, Expression, Filter, FilterLimits, FilterSyntaxError, FilterTooLarge,
                                  Op, Predicate, Value)
from echelon.contract.schema import utf8_length

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
    | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op><=|>=|!=|==|=|<|>)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>[{}(),])
    )""",
    re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(.)")
_END = ("end", "", -1)

# The tree: a predicate, or (kind, children) with kind "and" / "or", or ("not", child).
Node = Union[Predicate, tuple]


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            start = len(text) - len(text[pos:].lstrip())
            raise FilterSyntaxError("unexpected character", text, start)
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return out


def parse_text(text: str, limits: FilterLimits) -> Expression:
    """The normal form of `text`; FilterSyntaxError or FilterTooLarge (see the module doc)."""
    size = utf8_length(text)  # C speed, even for megabytes
    if size > limits.max_bytes:
        raise FilterTooLarge(f"a filter of {size} bytes: at most {limits.max_bytes}")
    tree = _Parser(text, limits).filter()
    if tree is None:
        return Filter(())
    return normal_form(tree, limits)


class _Parser:
    def __init__(self, text: str, limits: FilterLimits):
        self.text = text
        self.limits = limits
        self.toks = _tokens(text)
        self.i = 0
        self.predicates = 0

    def peek(self, ahead: int = 0) -> tuple[str, str, int]:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else ("end", "", len(self.text))

    def word(self, *words: str, ahead: int = 0) -> bool:
        k, v, _ = self.peek(ahead)
        return k == "word" and v.lower() in words

    def punct(self, p: str) -> bool:
        return self.peek()[:2] == ("punct", p)

    def fail(self, message: str) -> FilterSyntaxError:
        return FilterSyntaxError(message, self.text, self.peek()[2])

    def filter(self) -> Node | None:
        braced = self.punct("{")
        if braced:
            self.i += 1
        tree = None
        if not (self.peek()[0] == "end" or (braced and self.punct("}"))):
            tree = self.or_expr(0)
        if braced:
            if not self.punct("}"):
                raise self._after_expression("`}`")
            self.i += 1
        if self.i < len(self.toks):
            raise self._after_expression("the end")
        return tree

    def _after_expression(self, closer: str) -> FilterSyntaxError:
        k = self.peek()[0]
        if k in ("word", "num", "str", "op"):
            return self.fail(f"expected `and`, `or` or {closer}")
        return self.fail("unexpected input" if k != "end" else f"expected {closer}")

    def or_expr(self, depth: int) -> Node:
        children = [self.and_expr(depth)]
        while self.word("or"):
            self.i += 1
            children.append(self.and_expr(depth))
        return children[0] if len(children) == 1 else ("or", children)

    def and_expr(self, depth: int) -> Node:
        children = [self.factor(depth)]
        while self.word("and"):
            self.i += 1
            children.append(self.factor(depth))
        return children[0] if len(children) == 1 else ("and", children)

    def factor(self, depth: int) -> Node:
        opens = self.punct("(")
        if opens or (self.word("not") and self.peek(1)[0] != "op"):  # `not = 3`: an attribute named not
            if depth >= self.limits.max_depth:
                raise FilterTooLarge(f"nesting deeper than {self.limits.max_depth} (parentheses and `not`) at "
                                     f"position {self.peek()[2]}")
            self.i += 1
            if not opens:
                return ("not", self.factor(depth + 1))
            inner = self.or_expr(depth + 1)
            if not self.punct(")"):
                raise self._after_expression("`)`")
            self.i += 1
            return inner
        return self.predicate()

    def count(self) -> None:
        self.predicates += 1
        if self.predicates > self.limits.max_predicates:
            raise FilterTooLarge(f"more than {self.limits.max_predicates} predicates (the one at position "
                                 f"{self.peek()[2]} is past the limit)")

    def predicate(self) -> Node:
        k, name, _ = self.peek()
        if k != "word":
            raise self.fail("expected an attribute name")
        self.count()
        self.i += 1
        k, v, _ = self.peek()
        if k == "op":
            self.i += 1
            return Predicate(name, Op("=" if v == "==" else v), self.literal())
        low = v.lower() if k == "word" else ""
        if low == "between":
            self.i += 1
            lo = self.literal()
            if not self.word("and"):
                raise self.fail("expected `and` in between")
            self.i += 1
            return Predicate(name, Op.BETWEEN, lo, self.literal())
        if low == "prefix":
            self.i += 1
            if self.peek()[0] != "str":
                raise self.fail("prefix needs a quoted string")
            return Predicate(name, Op.PREFIX, self.literal())
        if low == "in" or (low == "not" and self.word("in", ahead=1)):
            self.i += 1 if low == "in" else 2
            alternatives = ("or", [Predicate(name, Op.EQ, v) for v in self.values()])
            return alternatives if low == "in" else ("not", alternatives)
        raise self.fail("expected an operator (= != < <= > >= between prefix in)")

    def values(self) -> list[Value]:
        """`(literal, ...)`, each counted as a predicate."""
        if not self.punct("("):
            raise self.fail("expected `(` after in")
        self.i += 1
        out = [self.literal()]
        while self.punct(","):
            self.i += 1
            self.count()
            out.append(self.literal())
        if not self.punct(")"):
            raise self.fail("expected `,` or `)` in the list")
        self.i += 1
        return out

    def literal(self) -> Value:
        k, v, pos = self.peek()
        if k == "num":
            self.i += 1
            try:
                return float(v) if any(c in v for c in ".eE") else int(v)
            except ValueError:  # past int's digit limit
                raise FilterSyntaxError("number too long", self.text, pos) from None
        if k == "str":
            self.i += 1
            return _ESCAPE.sub(r"\1", v[1:-1])
        raise self.fail("expected a number or a quoted string")


def _size(node: Node, positive: bool, cap_terms: int, cap_preds: int) -> tuple[int, int]:
    """(terms, predicates) of `node`'s normal form (of its negation when not `positive`),
    each saturated just past its cap so the numbers stay small."""
    if isinstance(node, Predicate):
        n = 1 if positive else len(node.negated())
        return n, n
    kind, arg = node
    if kind == "not":
        return _size(arg, not positive, cap_terms, cap_preds)
    sizes = [_size(c, positive, cap_terms, cap_preds) for c in arg]
    if (kind == "or") == positive:  # a disjunction: terms side by side
        return min(sum(t for t, _ in sizes), cap_terms + 1), min(sum(n for _, n in sizes), cap_preds + 1)
    terms, preds = 1, 0  # a conjunction: every term of one child with every term of the others
    for t, n in sizes:
        terms, preds = min(terms * t, cap_terms + 1), min(preds * t + n * terms, cap_preds + 1)
    return terms, preds


def _terms(node: Node, positive: bool) -> list[tuple[Predicate, ...]]:
    if isinstance(node, Predicate):
        return [(node,)] if positive else [(q,) for q in node.negated()]
    kind, arg = node
    if kind == "not":
        return _terms(arg, not positive)
    parts = [_terms(c, positive) for c in arg]
    if (kind == "or") == positive:
        return [t for part in parts for t in part]
    out: list[tuple[Predicate, ...]] = [()]
    for part in parts:
        out = [a + b for a in out for b in part]
    return out


def normal_form(tree: Node, limits: FilterLimits) -> Expression:
    """The disjunction of conjunctive terms equal to `tree`, its size checked first;
    repeated predicates in a term, repeated terms and terms another implies are dropped."""
    terms, preds = _size(tree, True, limits.max_terms, limits.max_expanded)
    if terms > limits.max_terms:
        raise FilterTooLarge(f"the filter expands to more than {limits.max_terms} terms (an `or` inside an "
                             f"`and` multiplies them): at most {limits.max_terms}")
    if preds > limits.max_expanded:
        raise FilterTooLarge(f"the filter expands to more than {limits.max_expanded} predicates over its terms: "
                             f"at most {limits.max_expanded}")
    unique = list(dict.fromkeys(tuple(dict.fromkeys(t)) for t in _terms(tree, True)))
    sets = [frozenset(t) for t in unique]
    # Absorption: a term holding every predicate of another implies it, so adds nothing.
    kept = [t for t, mine in zip(unique, sets) if not any(other < mine for other in sets)]
    if len(kept) == 1:
        return Filter(kept[0])
    return Disjunction(tuple(Filter(t) for t in kept))
