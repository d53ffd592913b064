"""Plot failure -> running again, slurm-recovery against plain Slurm, from recovery_latency's JSON.

    .venv/bin/python bench/plot_latency.py docs/img/recovery_latency.json [-o PNG]

(default PNG: the JSON's path with .png).

One row per fault kind that restarts a job (crash with a fatal XID, XID on a running job, hang)
and one for plain Slurm's ``--requeue`` job with its node set DOWN by hand at the fault: every
trial as a dot (jittered vertically), its box (quartiles, whiskers to the extremes) and its p50
written beside it, on a log scale of seconds. The application bug is left out: it is stopped,
not restarted, so it has no time to running again. Trials whose outcome check failed are drawn
as red crosses, not dropped. The title carries the machine's CPUs and load average.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROWS = (
    ("crash", "ours: job crash with a fatal XID", "tab:blue"),
    ("xid", "ours: fatal XID on a running job", "tab:blue"),
    ("hang", "ours: hang (from its last progress)", "tab:blue"),
    ("baseline", "plain Slurm --requeue,\nnode set DOWN by hand at the fault", "tab:orange"),
)


def series(record: dict) -> list[tuple[str, str, list[float], list[float]]]:
    """(label, colour, measured end-to-end seconds of trials that passed, of trials that did
    not) per row present in the record."""
    figures = record["figures"]
    out = []
    for key, label, colour in ROWS:
        rows = figures.get("baseline") if key == "baseline" else figures["ours"].get(key)
        if not rows:
            continue
        ok = [
            r["end_to_end"] for r in rows if r.get("end_to_end") is not None and not r["problems"]
        ]
        bad = [r["end_to_end"] for r in rows if r.get("end_to_end") is not None and r["problems"]]
        if ok or bad:
            out.append((f"{label}\n(n={len(rows)})", colour, ok, bad))
    return out


def first(values: list[float] | None) -> str:
    return f"{values[0]:.1f}" if values else "?"


def plot(record: dict, out: Path) -> None:
    data = series(record)
    if not data:
        raise SystemExit("no end-to-end times in the file (a --quick run of app_bug only?)")
    rng = random.Random(0)
    fig, ax = plt.subplots(figsize=(10, 1.1 * len(data) + 1.6))
    positions = list(range(len(data), 0, -1))
    ax.boxplot(
        [ok + bad for _, _, ok, bad in data],
        positions=positions,
        orientation="horizontal",
        whis=(0, 100),
        widths=0.5,
        showfliers=False,
        medianprops={"color": "black"},
    )
    for y, (_, colour, ok, bad) in zip(positions, data, strict=True):
        ax.scatter(
            ok, [y + rng.uniform(-0.18, 0.18) for _ in ok], s=14, color=colour, alpha=0.7, zorder=3
        )
        if bad:
            ax.scatter(
                bad,
                [y + rng.uniform(-0.18, 0.18) for _ in bad],
                s=30,
                marker="x",
                color="red",
                zorder=4,
                label="outcome check failed",
            )
        values = ok + bad
        ax.annotate(
            f"p50 {statistics.median(values):.1f} s",
            (max(values), y),
            xytext=(8, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
        )
    ax.set_xscale("log")
    ax.set_yticks(positions, [label for label, _, _, _ in data], fontsize=9)
    ax.set_xlabel("failure -> job RUNNING again on healthy nodes (seconds, log scale)")
    left, right = ax.get_xlim()
    ax.set_xlim(left / 1.3, right * 2.5)
    ticks = [
        t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if left / 1.3 <= t <= right * 2.5
    ]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(axis="x", which="both", alpha=0.3)
    machine = record.get("machine", {})
    load = record["figures"].get("load_average", {})
    ax.set_title(
        "slurm-recovery vs plain Slurm: time until a failed job runs again\n"
        f"local cluster ({machine.get('slurm') or 'Slurm'}, {machine.get('cpus')} CPUs), "
        f"{machine.get('at', '')[:10]}; 1-min load average {first(load.get('start'))} at the "
        f"start, {first(load.get('end'))} at the end",
        fontsize=9,
    )
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles[:1], labels[:1], loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="written by bench/recovery_latency.py --json")
    parser.add_argument("-o", "--out", type=Path, help="the PNG (default: the JSON's, .png)")
    args = parser.parse_args()
    record = json.loads(args.json.read_text())
    out = args.out or args.json.with_suffix(".png")
    plot(record, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
