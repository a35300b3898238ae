"""Files for a post-mortem: deliveries.jsonl (every message sent, every delivery) and
timeline.png (delivery latency by send time, fault windows shaded, verdicts marked)."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.chaos.observer import DEAD, STATE, SUSPECT, Observer
from loadtest.chaos.schedule import Fault
from loadtest.chaos.workload import Producer, Subscriber


def dump(path: Path, producers: list[Producer], subscribers: list[Subscriber], t0: float) -> None:
    """What was sent and what every subscription received, one JSON line each, for a post-mortem."""
    with open(path, "w") as out:
        for p in producers:
            for seq, s in p.sent.items():
                out.write(json.dumps({"sent": p.id, "seq": seq, "t": round(s.at - t0, 4), "acked": s.acked,
                                      "failed": s.failed, "attrs": s.attrs}) + "\n")
        for sub in subscribers:
            for x in sub.log:
                out.write(json.dumps({"sub": sub.name, "agent": sub.agent, "producer": x.d.producer,
                                      "seq": x.d.sequence, "key": x.d.ordering_key, "redelivery": x.d.redelivery,
                                      "t": round(x.at - t0, 4)}) + "\n")


def plot(path: Path, faults: list[Fault], obs: Observer, producers: list[Producer],
         subscribers: list[Subscriber], t0: float) -> Path | None:
    """Delivery latency over time (by send time), fault windows shaded, verdicts marked."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sent_at = {(p.id, seq): s.at for p in producers for seq, s in p.sent.items()}
    xs, ys = [], []
    for sub in subscribers:
        for x in sub.log:
            at = sent_at.get((x.d.producer, x.d.sequence))
            if at is not None:
                xs.append(at - t0)
                ys.append(max(x.at - at, 1e-3))
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.scatter(xs, ys, s=2, color="0.3", label="a delivery (to any subscription)")
    colours = {"netem": "tab:blue", "pause": "tab:orange", "kill": "tab:red", "partition": "tab:purple",
               "replica": "tab:green"}
    for f in faults:
        ax.axvspan(f.start - t0, f.end - t0, color=colours.get(f.kind, "0.8"), alpha=0.15)
        ax.text(f.start - t0, 1.02, f"{f.kind} {','.join(f.targets)}", transform=ax.get_xaxis_transform(),
                fontsize=7, rotation=20)
    for state, marker, colour in ((SUSPECT, "|", "orange"), (DEAD, "x", "red")):
        ts = [c.at - t0 for c in obs.changes if c.state == state and c.at >= t0]
        ax.scatter(ts, [max(ys, default=1) * 1.5] * len(ts), marker=marker, color=colour,
                   label=f"{STATE[state].upper()} on a replica")
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the run (when the message was sent)")
    ax.set_ylabel("publish to delivery (s)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
