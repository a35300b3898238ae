"""Generate the Python modules and .pyi stubs for `protos/echelon/v1` into `echelon.v1`.

`python -m echelon.tools.genproto` (or `make proto`) rewrites `services/echelon/v1/`;
`generate(out)` renders into any folder so a test can compare against the committed
code and fail when it is stale.
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
                f"--grpc_python_out={tmp}", *sources]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("*_pb2*.py*"):
            stale.unlink()
        for f in (Path(tmp) / "echelon" / "v1").iterdir():
            shutil.copy(f, out / f.name)
    (out / "__init__.py").write_text(INIT)
    return sorted(out.iterdir())


def main() -> int:
    files = generate(TARGET)
    print(f"generated {len(files)} files into {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
