"""The generated code in services/echelon/v1 must be what `make proto` makes of protos/."""

import filecmp

from echelon.tools.genproto import TARGET, generate


def test_generated_code_is_fresh(tmp_path):
    files = generate(tmp_path)
    stale = [f.name for f in files if not (TARGET / f.name).exists() or not filecmp.cmp(f, TARGET / f.name, False)]
    extra = sorted({p.name for p in TARGET.glob("*_pb2*")} - {f.name for f in files})
    assert not stale and not extra, f"run `make proto`: stale {stale}, extra {extra}"
