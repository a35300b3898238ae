"""Draw the layers and the imports between them as docs/layers.png (`make docs-diagram`).

The layers come from tools/layers.py and the arrows from the code's imports today, so the
picture in docs/architecture.md and the README is the rule the import test checks.
Imports of `v1`, `contract` and `core` are left out but the client's (every layer above
may use them); the caption says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from echelon.tools import layers

OUT = layers.ROOT.parents[1] / "docs" / "layers.png"
WHAT = {
    "v1": "the messages\n(generated)", "contract": "schemas, filters,\nerrors, transport",
    "core": "pure algorithms", "runtime": "service plumbing",
    "dataplane": "LBDD trees, frames,\nholds, relay", "agent": "client API,\ndelivery, durable",
    "router": "OctopiA regions", "matcher": "Meghdoot zones,\nCDM", "membership": "views, topics,\nplans",
    "observe": "dashboards,\nalerts", "replan": "routing job\n(Spark)", "launch": "local clusters",
    "cli": "`echelon`", "tools": "codegen,\nthis picture", "client": "the SDK",
}
COLOURS = ("#dfe8f5", "#e4f1e1", "#fbeed5", "#f6dede", "#ece3f3")


def draw(out: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    width, box_w, box_h, gap = 11.0, 1.25, 0.62, 1.45
    fig, ax = plt.subplots(figsize=(width + 2.4, 1.2 + gap * len(layers.LAYERS)))
    centre: dict[str, tuple[float, float]] = {}
    for level, (name, pkgs) in enumerate(layers.LAYERS):
        y = level * gap
        ax.add_patch(FancyBboxPatch((0, y - 0.5), width, 1.0, boxstyle="round,pad=0.02",
                                    fc=COLOURS[level % len(COLOURS)], ec="none", zorder=0))
        ax.text(0.08, y + 0.42, name, fontsize=8, style="italic", color="#555555", va="center")
        step = (width - 1.0) / len(pkgs)
        for k, pkg in enumerate(pkgs):
            centre[pkg] = (1.0 + step * (k + 0.5), y - 0.05)
    # The client stands beside the services, outside the bands.
    centre[layers.CLIENT] = (width + 1.1, layers.LEVEL["agent"] * gap - 0.05)
    for pkg, (x, y) in centre.items():
        service = pkg in layers.SERVICES
        ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h, boxstyle="round,pad=0.03",
                                    fc="white", ec="#333333", lw=1.6 if service else 0.9, zorder=2))
        ax.text(x, y + 0.13, pkg, ha="center", va="center", fontsize=9.5, weight="bold", zorder=3)
        ax.text(x, y - 0.13, WHAT.get(pkg, ""), ha="center", va="center", fontsize=6.5, zorder=3,
                linespacing=0.95)
    for src, dst in sorted(layers.arrows()):
        client = src == layers.CLIENT  # its arrows show it needs the contract alone
        if (dst in ("core", "v1", "contract") and not client) or src not in centre or dst not in centre:
            continue
        (x0, y0), (x1, y1) = centre[src], centre[dst]
        ax.add_patch(FancyArrowPatch((x0, y0 - box_h / 2), (x1, y1 + box_h / 2), arrowstyle="-|>",
                                     mutation_scale=9, lw=0.7, color="#a04040" if client else "#4a5a7a",
                                     alpha=0.75, linestyle="--" if client else "-",
                                     connectionstyle="arc3,rad=0.08", zorder=1))
    ax.text(0, -0.75, "An arrow: the package at its tail imports the one at its head (from the code today). "
            "Every layer may import v1, contract and core (not drawn);\nno package imports one of its own layer or "
            "above (tests/unit/test_layers.py). The client (dashed arrows) imports\nthe contract alone, v1 and "
            "contract, which the services import too.", fontsize=7.5, va="top")
    ax.set_xlim(-0.1, width + 2.0)
    ax.set_ylim(-1.45, gap * (len(layers.LAYERS) - 1) + 0.6)
    ax.axis("off")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    print(draw(p.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
