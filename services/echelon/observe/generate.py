"""Write the dashboards and rules the chart ships (`python -m echelon.observe.generate`);
`--check` only says which committed files are stale (exit 1), as the test does."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS_DIR = Path("deploy/grafana/dashboards")
RULES = Path("deploy/prometheus/rules.yaml")
PROMETHEUS_RULE = Path("deploy/prometheus/prometheusrule.yaml")


def outputs() -> dict[Path, str]:
    """Every generated file (relative to the repository root) and its content."""
    from echelon.observe import grafana, rules
    from echelon.observe.catalog import DASHBOARDS

    files = {DASHBOARDS_DIR / f"{d.uid}.json": grafana.to_json(d) for d in DASHBOARDS}
    files[RULES] = rules.rules_file()
    files[PROMETHEUS_RULE] = rules.prometheus_rule()
    return files


def stale(root: Path = ROOT) -> list[Path]:
    return [p for p, text in outputs().items() if not (root / p).exists() or (root / p).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if args.check:
        old = stale(args.root)
        for p in old:
            print(f"stale: {p}")
        return 1 if old else 0
    for p, text in outputs().items():
        (args.root / p).parent.mkdir(parents=True, exist_ok=True)
        (args.root / p).write_text(text)
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
