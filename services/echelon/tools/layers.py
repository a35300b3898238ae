"""The layers of the package and the import rules between them (docs/architecture.md, "Layers").

One definition serves the import-rule test (tests/unit/test_layers.py) and the diagram
(`make docs-diagram`, tools/diagram.py), so the picture cannot drift from the rule.

A package may import the packages of the layers below its own, never one of its own
layer (so no service imports another) and never one above. Three have narrower rules:
`core` imports, of `echelon`, only the contract's pure languages (CONTRACT_PURE: schemas
and filters), and outside it only the standard library and numpy; those pure modules
import only the standard library and each other; the client SDK stands beside the layers
and imports only the contract (`v1`, `contract`) and itself.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "echelon"
ROOT = Path(__file__).resolve().parents[1]  # services/echelon/

# Lowest first. A package imports only packages of lower layers.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("generated contract", ("v1",)),
    ("contract", ("contract",)),
    ("algorithms", ("core",)),
    ("runtime", ("runtime",)),
    ("data plane", ("dataplane",)),
    # The services, and the tools that run, watch and plan a cluster (as processes, not imports).
    ("services and operations", ("agent", "router", "matcher", "membership", "observe", "replan", "launch")),
    ("command line", ("cli", "tools")),
)
SERVICES = ("agent", "router", "matcher", "membership")
CLIENT = "client"
CLIENT_IMPORTS = frozenset({"v1", "contract"})  # the contract, both halves: what a client shares with a server
# The languages of schemas and filters: pure, so `core`'s algorithms are written over them.
CONTRACT_PURE = frozenset({"echelon.contract.schema", "echelon.contract.filters", "echelon.contract.filter_text"})
CORE_THIRD_PARTY = frozenset({"numpy"})

LEVEL = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}
LEVEL[CLIENT] = LEVEL["agent"]  # beside the services: of the others only the command line uses it


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    path: Path
    line: int
    target: str  # the imported module, dotted (absolute)


@dataclass(frozen=True)
class Violation:
    imp: Import
    rule: str

    def __str__(self) -> str:
        return f"{self.imp.path}:{self.imp.line}: {self.imp.module} imports {self.imp.target}: {self.rule}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path = ROOT) -> list[Import]:
    """Every import statement under root (the `echelon` folder), at any depth, lazy ones included."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                else:
                    targets = [node.module or ""]
            else:
                continue
            found.extend(Import(module, path, node.lineno, t) for t in targets)
    return found


def _part(module: str) -> str | None:
    """The top folder of echelon a module lives in (None outside them: echelon/__main__.py)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2 or parts[1].startswith("__"):
        return None
    return parts[1]


def check(imp: Import) -> str | None:
    """The rule this import breaks, or None."""
    src, dst = _part(imp.module), _part(imp.target)
    top = imp.target.split(".")[0]
    if src is None:
        return None  # echelon/__init__.py, __main__.py: the entry points
    if src == "core" and top != PACKAGE and top not in sys.stdlib_module_names and top not in CORE_THIRD_PARTY:
        return "core imports only the standard library and numpy"
    if imp.module in CONTRACT_PURE and top not in sys.stdlib_module_names and top != "__future__" \
            and imp.target not in CONTRACT_PURE:
        return "the contract's pure languages import only the standard library and each other"
    if top != PACKAGE or dst == src or dst is None:
        return None
    if src == CLIENT:
        if dst in CLIENT_IMPORTS:
            return None
        return "the client imports only the contract (echelon.v1, echelon.contract) and itself"
    if src not in LEVEL:
        return f"{src} is in no layer (add it to echelon.tools.layers.LAYERS)"
    if dst not in LEVEL:
        return f"{dst} is in no layer (add it to echelon.tools.layers.LAYERS)"
    if src == "core" and imp.target not in CONTRACT_PURE:
        return "core imports nothing of echelon but the contract's pure languages"
    if LEVEL[dst] == LEVEL[src]:
        return f"{src} and {dst} are peers in one layer: neither imports the other"
    if LEVEL[dst] > LEVEL[src]:
        return f"{src} imports upward ({dst} is a higher layer)"
    return None


def violations(root: Path = ROOT) -> list[Violation]:
    return [Violation(i, r) for i in imports(root) if (r := check(i))]


def arrows(root: Path = ROOT) -> set[tuple[str, str]]:
    """(from, to) between top folders of echelon, as the code imports today."""
    out = set()
    for i in imports(root):
        src, dst = _part(i.module), _part(i.target)
        if src and dst and src != dst and i.target.split(".")[0] == PACKAGE:
            out.add((src, dst))
    return out


if __name__ == "__main__":
    bad = violations()
    print("\n".join(map(str, bad)) or "no layer rule broken")
    raise SystemExit(1 if bad else 0)
