"""adpsgd-report: pictures and a table of several runs, side by side.

Usage: ``adpsgd-report RUN_DIR [RUN_DIR ...] --out DIR [--rank0]``. Reads each run dir's
``metrics.jsonl`` and ``summary.json`` (the interface of runner/run_log.py) and writes to DIR:

* ``curves_wall.png``: held-out loss and the recipe's metric (WER, top-1, ...) against wall
  seconds, one line per run: what a user waits for;
* ``curves_epoch.png``: the same against epochs: what an algorithm does with the data;
* ``throughput.png``: samples/s per run, and the mean seconds per rank spent computing,
  communicating (what overlap did not hide) and idle (waiting for slower ranks);
* ``table.md``: run, algo, recipe, ranks, final metric, samples/s, compute/comm/idle seconds,
  consensus distance, status (also printed).

Only the ``eval`` split is drawn (the averaged model for algorithms whose replicas differ);
``--rank0`` adds rank 0's own model (``eval_rank0``) as dashed lines. A run that stopped before
writing summary.json is still drawn, with status ``incomplete``. Errors are one line on stderr
(``adpsgd-report: error: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import OneLineParser, UserError, command_status, one_line
from ..run_log import read_metrics

PROG = "adpsgd-report"
# Keys of summary["final"] that are not the recipe's metric.
NOT_METRICS = {"loss", "consensus_distance", "lr"}
TABLE_COLUMNS = ("run", "algo", "recipe", "nprocs", "final metric", "samples/s", "compute s",
                 "comm s", "idle s", "consensus distance", "status")


def primary_metric(summary: dict[str, Any]) -> str | None:
    """The recipe's headline metric of a run: the trainer writes it both inside ``final`` and
    at the top level of summary.json (``wer``, ``top1``, ``frame_acc``...)."""
    final = summary.get("final") or {}
    names = [k for k in final if k in summary and k not in NOT_METRICS]
    return names[0] if names else None


def lower_is_better(metric: str) -> bool:
    return any(word in metric for word in ("wer", "loss", "err"))


@dataclass
class Run:
    path: Path
    label: str
    summary: dict[str, Any]
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metric(self) -> str | None:
        if self.summary:
            return primary_metric(self.summary)
        keys = {k for r in self.evaluations for k in r} - NOT_METRICS
        return next((k for k in ("wer", "top1", "frame_acc") if k in keys), None)

    def split(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.evaluations if r.get("split") == name]


def load_run(path: Path) -> Run:
    """A run dir's evaluations and summary; one-line UserError when it holds neither."""
    if not path.is_dir():
        raise UserError(f"run dir {path} does not exist",
                        "give the directories that adpsgd-run printed ('run dir ...')")
    summary_path = path / "summary.json"
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        evaluations = read_metrics(path)
    except (json.JSONDecodeError, OSError) as ex:
        raise UserError(f"cannot read the run files in {path}: {one_line(ex)}",
                        "rerun the job or leave this run dir out") from None
    if not summary and not evaluations:
        raise UserError(f"{path} holds no metrics.jsonl or summary.json (not a run dir, or "
                        "the run ended before its first evaluation)",
                        "give run dirs of runs that evaluated at least once")
    return Run(path, path.name, summary, evaluations)


def unique_labels(runs: list[Run]) -> None:
    """Label runs by their directory name, with the parent's name where two would clash."""
    names = [r.path.name for r in runs]
    for run in runs:
        if names.count(run.path.name) > 1:
            run.label = f"{run.path.parent.name}/{run.path.name}"


# ---- table -----------------------------------------------------------------------------------
def _number(value: Any, fmt: str) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return format(value, fmt)
    return "-"


def table_row(run: Run) -> list[str]:
    s, metric = run.summary, run.metric
    last = (run.split("eval") or [{}])[-1]
    final = s.get("final") or last
    value = final.get(metric) if metric else None
    consensus = s.get("consensus_distance", last.get("consensus_distance"))
    return [run.label, str(s.get("algo", "-")), str(s.get("recipe", "-")),
            str(s.get("nprocs", "-")),
            f"{metric} {_number(value, '.2f')}" if metric else "-",
            _number(s.get("samples_per_s"), ".1f"), _number(s.get("compute_s"), ".2f"),
            _number(s.get("comm_s"), ".2f"), _number(s.get("idle_s"), ".2f"),
            _number(consensus, ".3g"), str(s.get("status", "incomplete (no summary.json)"))]


def markdown_table(runs: list[Run]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |",
             "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(table_row(run)) + " |" for run in runs]
    return "\n".join(lines) + "\n"


# ---- plots -----------------------------------------------------------------------------------
def _figure(columns: int):
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2 * columns, 3.8), dpi=90, layout="constrained")
    return fig, [fig.add_subplot(1, columns, i + 1) for i in range(columns)]


def plot_curves(runs: list[Run], x_key: str, x_label: str, rank0: bool, out: Path) -> None:
    """Loss and each recipe metric present against ``x_key``, one colour per run."""
    metrics = ["loss"] + sorted({r.metric for r in runs if r.metric})
    fig, axes = _figure(len(metrics))
    for index, run in enumerate(runs):
        color = f"C{index % 10}"
        for ax, metric in zip(axes, metrics):
            for split, style in (("eval", "-"), ("eval_rank0", "--")):
                points = [(r[x_key], r[metric]) for r in run.split(split)
                          if r.get(metric) is not None and r.get(x_key) is not None]
                if not points or (split == "eval_rank0" and not rank0):
                    continue
                xs, ys = zip(*points)
                label = run.label if split == "eval" else f"{run.label} (rank 0)"
                ax.plot(xs, ys, style, color=color, marker="o", markersize=3, label=label)
    for ax, metric in zip(axes, metrics):
        better = "lower" if lower_is_better(metric) else "higher"
        ax.set(xlabel=x_label, ylabel=f"held-out {metric}",
               title=f"held-out {metric} ({better} is better)")
        ax.grid(alpha=0.3)
        if metric == "loss" and all(v > 0 for line in ax.get_lines() for v in line.get_ydata()):
            ax.set_yscale("log")
    handles = {}  # one legend for the figure: a run may lack some metric's panel
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="outside right upper")
    fig.savefig(out)


def plot_throughput(runs: list[Run], out: Path) -> None:
    """Samples/s bars, and compute/comm/idle seconds (mean per rank) stacked per run."""
    fig, (rate_ax, time_ax) = _figure(2)
    labels = [r.label for r in runs]
    positions = range(len(runs))
    rates = [r.summary.get("samples_per_s") or 0.0 for r in runs]
    bars = rate_ax.bar(positions, rates, color=[f"C{i % 10}" for i in positions])
    rate_ax.bar_label(bars, fmt="%.0f", fontsize=7)
    rate_ax.set(ylabel="samples/s", title="training throughput")
    bottom = [0.0] * len(runs)
    for key, color in (("compute_s", "#4c72b0"), ("comm_s", "#dd8452"), ("idle_s", "#c44e52")):
        values = [r.summary.get(key) or 0.0 for r in runs]
        time_ax.bar(positions, values, bottom=bottom, color=color, label=key[:-2])
        bottom = [b + v for b, v in zip(bottom, values)]
    time_ax.set(ylabel="seconds (mean per rank)", title="where a rank's time went")
    time_ax.legend(fontsize=7)
    for ax in (rate_ax, time_ax):
        ax.set_xticks(list(positions), labels, rotation=30, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.savefig(out)


def write_report(run_dirs: Sequence[Path], out: Path, rank0: bool = False) -> dict[str, Path]:
    """Load the runs and write the three PNGs and table.md into ``out``; return the paths."""
    runs = [load_run(Path(d)) for d in run_dirs]
    unique_labels(runs)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = {"curves_wall": out / "curves_wall.png", "curves_epoch": out / "curves_epoch.png",
                 "throughput": out / "throughput.png", "table": out / "table.md"}
        plot_curves(runs, "wall_s", "wall time (s)", rank0, paths["curves_wall"])
        plot_curves(runs, "epoch", "epoch", rank0, paths["curves_epoch"])
        plot_throughput(runs, paths["throughput"])
        paths["table"].write_text(markdown_table(runs))
    except OSError as ex:
        raise UserError(f"cannot write the report to {out}: {one_line(ex)}",
                        "give --out a writable directory") from None
    return paths


# ---- command line ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Plots and a markdown table of several runs.",
                     epilog="Example: adpsgd-report runs/2026-11-23/* --out report")
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--out", type=Path, required=True, help="directory for PNGs and table.md")
    parser.add_argument("--rank0", action="store_true",
                        help="also draw rank 0's own model (split eval_rank0), dashed")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run adpsgd-report; returns the exit status (0, or 2 after a one-line error)."""

    def body() -> int:
        args = build_parser().parse_args(argv)
        paths = write_report(args.run_dirs, args.out, rank0=args.rank0)
        print(paths["table"].read_text(), end="")
        for path in paths.values():
            print(f"wrote {path}")
        return 0

    return command_status(PROG, body)

if __name__ == "__main__":
    raise SystemExit(main())
