"""The import rules between the package's layers (docs/architecture.md, "Layers"), checked on
the tree, and the checker itself checked on a synthetic package that breaks each rule."""

import textwrap

import pytest

from echelon.tools import layers


def test_the_tree_keeps_every_layer_rule():
    bad = layers.violations()
    assert bad == [], "\n".join(map(str, bad))


def test_every_folder_of_the_package_is_in_a_layer():
    folders = {p.name for p in layers.ROOT.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert folders == set(layers.LEVEL)


def test_no_service_imports_another_and_the_data_plane_is_below_them():
    arrows = layers.arrows()
    services = {"agent", "router", "matcher", "membership"}
    assert not {(a, b) for a, b in arrows if a in services and b in services}
    assert {b for a, b in arrows if a == "dataplane"} <= {"core", "runtime", "contract", "v1"}
    assert {b for a, b in arrows if a == "core"} <= {"contract"}
    assert {b for a, b in arrows if a == "client"} == {"v1", "contract"}  # no borrow from below
    assert not hasattr(layers, "CLIENT_BORROWS")


def _tree(tmp_path, files: dict[str, str]):
    root = tmp_path / "echelon"
    for name in ["__init__.py", *(f"{p}/__init__.py" for p in layers.LEVEL)]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


@pytest.mark.parametrize("name, text, rule", [
    ("agent/x.py", "from echelon.router import server\n", "peers"),
    ("matcher/x.py", "def f():\n    import echelon.membership.replica\n", "peers"),  # a lazy import counts
    ("launch/cluster.py", "from echelon.cli.pubsub import fetch_view\n", "upward"),
    ("dataplane/x.py", "from echelon.agent import registry\n", "upward"),
    ("dataplane/x.py", "from ..agent import registry\n", "upward"),  # relative
    ("runtime/x.py", "from echelon.dataplane import frames\n", "upward"),
    ("core/x.py", "from echelon.runtime import wire\n", "core imports nothing"),
    ("core/x.py", "from echelon.v1 import common_pb2\n", "core imports nothing"),
    ("core/x.py", "import grpc\n", "standard library and numpy"),
    ("client/x.py", "from echelon.agent.server import Agent\n", "client imports only"),
    ("client/x.py", "from echelon.runtime.auth import Auth\n", "client imports only"),
    ("client/x.py", "from echelon.core.cdm import Index\n", "client imports only"),  # no borrow at all
    ("client/x.py", "from echelon.runtime.limits import Limits\n", "client imports only"),
    ("client/x.py", "def f():\n    from echelon.dataplane import frames\n", "client imports only"),
    ("core/x.py", "from echelon.contract.wire import varint\n", "core imports nothing"),  # not the pure part
    ("core/x.py", "from echelon.contract import filters\n", "core imports nothing"),
    ("contract/schema.py", "import grpc\n", "pure languages"),
    ("contract/filters.py", "from echelon.contract.errors import InvalidArgument\n", "pure languages"),
    ("contract/x.py", "from echelon.runtime import auth\n", "upward"),
    ("contract/x.py", "from echelon.core import lbdd\n", "upward"),
    ("observe/x.py", "from echelon.agent import metrics\n", "peers"),
    ("newthing/x.py", "from echelon.core import lbdd\n", "in no layer"),
])
def test_the_checker_finds_a_broken_rule(tmp_path, name, text, rule):
    root = _tree(tmp_path, {name: text})
    found = layers.violations(root)
    assert len(found) == 1 and rule in found[0].rule, found
    assert found[0].imp.path == root / name


def test_the_checker_passes_what_the_rules_allow(tmp_path):
    root = _tree(tmp_path, {
        "core/x.py": "import hashlib\nimport numpy as np\nfrom . import y\nfrom echelon.core.y import z\n"
                     "from echelon.contract.filters import Filter\n",
        "contract/filters.py": "from __future__ import annotations\nimport math\nfrom echelon.contract.schema import S\n",
        "contract/wire.py": "import grpc\nfrom echelon.v1 import common_pb2\nfrom echelon.contract.filters import F\n",
        "core/y.py": "z = 1\n",
        "runtime/x.py": "from echelon.core import x\nfrom echelon.v1 import common_pb2\nimport grpc\n",
        "dataplane/x.py": "from ..runtime import x\nfrom echelon.core.x import np\n",
        "agent/x.py": "from echelon.dataplane import x\n",
        "router/x.py": "from echelon.dataplane.x import x\n",
        "client/x.py": "from echelon.v1 import pubsub_pb2\nfrom echelon.client import y\nfrom echelon.contract.filters import Filter\n"
                       "from echelon.contract.transport import Transport\n",
        "cli/x.py": "from echelon.client import x\nfrom echelon.agent import x\nfrom echelon.launch import y\n",
        "__main__.py": "from echelon.cli.x import main\n",
    })
    assert layers.violations(root) == []
