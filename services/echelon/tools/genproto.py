"""Generate the Python modules and .pyi stubs for `protos/echelon/v1` into `echelon.v1`.

`python -m echelon.tools.genproto` (or `make proto`) rewrites `services/echelon/v1/`;
`generate(out)` renders into any folder so a test can compare against the committed
code and fail when it is stale.

Besides protoc's modules it writes `tags.py`: the wire tag of every field, for the encoders
that write protobuf bytes by hand on the hot path (docs/architecture.md, "One contract"), so
that no field number is written down twice.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTOS = ROOT / "protos"
TARGET = ROOT / "services" / "echelon" / "v1"
INIT = '"""Generated from protos/echelon/v1 by `make proto`; do not edit."""\n'


def generate(out: Path) -> list[Path]:
    """Compile every proto into `out` (flat: the contents of echelon/v1); return the files."""
    from grpc_tools import protoc

    sources = sorted(p.relative_to(PROTOS).as_posix() for p in (PROTOS / "echelon" / "v1").glob("*.proto"))
    include = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", f"--descriptor_set_out={tmp}/set.pb", *sources]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("*_pb2*.py*"):
            stale.unlink()
        for f in (Path(tmp) / "echelon" / "v1").iterdir():
            shutil.copy(f, out / f.name)
        (out / "tags.py").write_text(tags((Path(tmp) / "set.pb").read_bytes()))
    (out / "__init__.py").write_text(INIT)
    return sorted(out.iterdir())


_WIRE = {0: "varint", 1: "64-bit", 2: "length-delimited", 5: "32-bit"}


def _wire_type(field) -> int:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    if field.label == F.LABEL_REPEATED and field.type not in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
        return 2  # a repeated scalar is packed in proto3
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FIXED64, F.TYPE_SFIXED64):
        return 1
    if field.type in (F.TYPE_FLOAT, F.TYPE_FIXED32, F.TYPE_SFIXED32):
        return 5
    if field.type in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
        return 2
    return 0


def tags(descriptor_set: bytes) -> str:
    """`tags.py` from protoc's descriptor set: a class per message (nested ones, map entries
    included, inside their parent), an int per field: field number << 3 | wire type."""
    from google.protobuf.descriptor_pb2 import FileDescriptorSet

    lines: list[str | None] = [
        '"""Generated from protos/echelon/v1 by `make proto`; do not edit.', "",
        "The wire tag of every field (field number << 3 | wire type), for the encoders that write",
        "protobuf bytes by hand: `echelon.contract.wire.varint(tag)` is the tag's bytes.", '"""']

    def message(m, indent: str, source: str) -> None:
        lines.extend(["", "" if not indent else None, f"{indent}class {m.name}:" + (f"  # {source}" if source else "")])
        for f in m.field:
            wire = _wire_type(f)
            lines.append(f"{indent}    {f.name} = {f.number << 3 | wire:#04x}  # {f.number}, {_WIRE[wire]}")
        for nested in m.nested_type:
            message(nested, indent + "    ", "")
        if not m.field and not m.nested_type:
            lines.append(f"{indent}    pass")

    for file in sorted(FileDescriptorSet.FromString(descriptor_set).file, key=lambda f: f.name):
        for m in file.message_type:
            message(m, "", file.name.rpartition("/")[2])
    return "\n".join(line for line in lines if line is not None) + "\n"


def main() -> int:
    files = generate(TARGET)
    print(f"generated {len(files)} files into {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
