"""adpsgd-report: pictures and a table of several runs, side by side.

Usage: ``adpsgd-report RUN_DIR [RUN_DIR ...] --out DIR [--rank0]``. Reads each run dir's
``metrics.jsonl`` and ``summary.json`` (the interface of runner/runlog/) and writes to DIR:

* ``curves_wall.png``: held-out loss and the recipe's metric (WER, top-1, ...) against wall
  seconds, one line per run: what a user waits for;
* ``curves_epoch.png``: the same against epochs: what an algorithm does with the data;
* ``throughput.png``: samples/s per run, and the mean seconds per rank spent computing,
  loading data, communicating (what overlap did not hide), idle (waiting for slower ranks),
  evaluating and checkpointing;
* ``learners.png``: per run, each learner's own work and waiting per step (which learner
  is slow), three runs to a row;
* ``table.md``: run, algo, recipe, ranks, final metric, samples/s, compute/comm/idle seconds,
  consensus distance, status (also printed);
* ``tb/LABEL``: a link to each run's ``tb/``, so that ``tensorboard --logdir DIR/tb`` names
  the runs by these labels (TensorBoard names a run by its event directory relative to the
  log dir: ``--logdir runs`` shows ``2026-11-23/21-21-22-digit_images-dpsgd/tb``).

A RUN_DIR may also be a sweep dir as ``adpsgd-run -m`` leaves it (``hydra.sweep.dir``, with
Hydra's ``multirun.yaml``): its run dirs are read in job order, and those runs are labelled by
the settings that differ between the runs (``topology=ring``, ``topology=random_ring``: the
keys the runs' command lines set, as each run's ``.hydra/run.yaml`` has them), which become
columns of the table too. Every entry of a sweep dir, and every path given, that is no run dir
is skipped with a one-line note on stderr: the shell's ``SWEEP_DIR/*`` names multirun.yaml
too, and a dry run's dir holds no metrics.

Only the ``eval`` split is drawn (the averaged model for algorithms whose replicas differ);
``--rank0`` adds rank 0's own model (``eval_rank0``) as dashed lines. A run that stopped before
writing summary.json is still drawn, with status ``incomplete``. Errors are one line on stderr
(``adpsgd-report: error: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from ..errors import OneLineParser, UserError, command_status, one_line
from ..runlog.records import read_metrics
from ..runlog.summary import NOT_METRICS, primary_metric
from .report_figures import lower_is_better, panel_figure
from .report_groups import check_over, check_target, parse_target, write_groups

PROG = "adpsgd-report"
TABLE_COLUMNS = ("run", "algo", "recipe", "nprocs", "final metric", "samples/s", "compute s",
                 "comm s", "idle s", "consensus distance", "status")
# Settings the table shows anyway: no extra column when they differ between runs.
SHOWN_SETTINGS = {"algo", "recipe", "launcher.nprocs"}
RUN_FILES = ("metrics.jsonl", "summary.json")
SWEEP_FILE = "multirun.yaml"  # Hydra writes it into every sweep dir


@dataclass
class Run:
    path: Path
    label: str
    summary: dict[str, Any]
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    in_sweep: bool = False  # found inside a sweep dir: labelled by its differing settings
    # The keys its command line set (.hydra/overrides.yaml) and its validated config.
    overrides: dict[str, str] = field(default_factory=dict)
    config: DictConfig | None = None

    def setting(self, key: str) -> str:
        """This run's value of ``key`` (a config group by its option's name), as its
        validated config has it; as typed when the config does not hold it; "-" when
        unknown."""
        value = OmegaConf.select(self.config, key) if self.config is not None else None
        if isinstance(value, DictConfig):
            value = value.get("name")
        if isinstance(value, (DictConfig, ListConfig)):
            return json.dumps(OmegaConf.to_container(value), separators=(",", ":"))
        if value is not None:
            return str(value)
        return self.overrides.get(key, "-")

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
        raise UserError(f"run dir {path} does not exist" if not path.exists() else
                        f"{path} is a file, not a run dir",
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
    overrides, config = read_settings(path)
    return Run(path, path.name, summary, evaluations, overrides=overrides, config=config)


def read_settings(path: Path) -> tuple[dict[str, str], DictConfig | None]:
    """What the run's command line set (key -> value as typed) and its validated config,
    from ``.hydra/``; empty for a run dir without them (a copy, another tool's run)."""
    hydra_dir = path / ".hydra"
    overrides: dict[str, str] = {}
    config = None
    try:
        if (hydra_dir / "overrides.yaml").is_file():
            for line in OmegaConf.load(hydra_dir / "overrides.yaml"):
                key, _, value = str(line).partition("=")
                # +key / ~key add or delete a key; group@package places a group elsewhere.
                overrides[key.lstrip("+~").split("@", 1)[0]] = value
        if (hydra_dir / "run.yaml").is_file():
            config = OmegaConf.load(hydra_dir / "run.yaml")
    except Exception as ex:  # noqa: BLE001 - OmegaConf raises YAML and its own errors
        raise UserError(f"cannot read the config of {path}: {one_line(ex)}",
                        f"repair or delete {hydra_dir}, or leave this run dir out") from None
    return overrides, (config if isinstance(config, DictConfig) else None)


def note(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def is_run_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in RUN_FILES)


def _job_order(path: Path) -> tuple[int, str]:
    """Sweep jobs by number (0-..., 1-..., 10-...), then anything else by name."""
    head = path.name.split("-", 1)[0]
    return (int(head) if head.isdigit() else sys.maxsize, path.name)


def why_not_a_run(path: Path) -> str | None:
    """Why an existing ``path`` is not a run dir to read, in a few words; None if it is one."""
    if path.is_file():
        if path.name == SWEEP_FILE:
            return "the sweep's Hydra config, not a run"
        return "a file, not a run dir"
    if path.name == ".hydra":
        return "a run's Hydra config, not a run"
    if not is_run_dir(path):
        return f"not a run dir: no {' or '.join(RUN_FILES)}"
    if not (path / "metrics.jsonl").is_file():
        # A timing-only simulation evaluates nothing but has its summary to compare; a run
        # stopped or failed before its first evaluation has nothing to draw.
        try:
            summary = json.loads((path / "summary.json").read_text())
            status = summary.get("status", "unknown")
        except (OSError, ValueError, AttributeError):
            status = "unreadable summary.json"
        if status != "completed":
            return f"no metrics.jsonl: the run ({status}) never evaluated"
    return None


def find_run_dirs(paths: Sequence[Path], skipped: Callable[[str], None] = note
                  ) -> list[tuple[Path, bool]]:
    """(run dir, found in a sweep dir) for every path: a run dir as given; a sweep dir (one
    holding multirun.yaml and no run files of its own) stands for the run dirs inside it, in
    job order. Every other path or entry (the shell's ``SWEEP_DIR/*`` gives multirun.yaml too;
    a dry run's dir holds no metrics) is passed to ``skipped`` as one line, unless nothing is
    left to read: then that is the error."""
    found: list[tuple[Path, bool]] = []
    skips: list[tuple[Path, str]] = []
    for path in map(Path, paths):
        if not path.exists():
            raise UserError(f"run dir {path} does not exist",
                            "give the directories that adpsgd-run printed ('run dir ...')")
        if not (path.is_dir() and (path / SWEEP_FILE).is_file() and not is_run_dir(path)):
            reason = why_not_a_run(path)
            if reason:
                skips.append((path, reason))
            else:  # a sweep's job given by itself (SWEEP_DIR/*) is labelled as in its sweep
                found.append((path, (path.parent / SWEEP_FILE).is_file()))
            continue
        reasons = {entry: why_not_a_run(entry) for entry in sorted(path.iterdir(),
                                                                   key=_job_order)}
        runs = [entry for entry, reason in reasons.items() if reason is None]
        if not runs:
            raise UserError(f"sweep dir {path} holds no run dir with {' or '.join(RUN_FILES)}"
                            " (no job has evaluated yet)",
                            "give it again once a job has evaluated, or give run dirs")
        skips += [(entry, reason) for entry, reason in reasons.items() if reason is not None]
        found += [(run, True) for run in runs]
    if not found:
        shown = "; ".join(f"{path}: {reason}" for path, reason in skips[:2])
        more = f" (and {len(skips) - 2} more)" if len(skips) > 2 else ""
        raise UserError(f"nothing to report: {shown}{more}",
                        "give run dirs (those adpsgd-run printed) or sweep dirs; a dry run or "
                        "a run stopped before its first evaluation has no metrics to draw")
    for path, reason in skips:
        skipped(f"skipping {path} ({reason})")
    return found


def differing_settings(runs: list[Run]) -> list[str]:
    """The keys set on any run's command line whose value is not the same in every run, in
    the order the command lines give them."""
    keys = dict.fromkeys(key for run in runs for key in run.overrides)
    return [key for key in keys if len({run.setting(key) for run in runs}) > 1]


def label_runs(runs: list[Run], settings: list[str]) -> None:
    """A sweep's runs by their differing settings (``topology=ring``), other runs by their
    directory name; the parent's name is prefixed where two labels would clash."""
    for run in runs:
        by_setting = ",".join(f"{key}={run.setting(key)}" for key in settings)
        run.label = by_setting if run.in_sweep and by_setting else run.path.name
    labels = [run.label for run in runs]
    for run in runs:
        if labels.count(run.label) > 1:
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


def markdown_table(runs: list[Run], settings: Sequence[str] = ()) -> str:
    """One row per run; ``settings`` (keys that differ between the runs) as columns after
    ``run``."""
    columns = [TABLE_COLUMNS[0], *settings, *TABLE_COLUMNS[1:]]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for run in runs:
        row = table_row(run)
        lines.append("| " + " | ".join([row[0], *map(run.setting, settings), *row[1:]]) + " |")
    return "\n".join(lines) + "\n"


# ---- plots -----------------------------------------------------------------------------------
MARKERS = "osD^v<>ph*"  # one per run beside its colour: runs that overlap stay visible
PERCENT = ("top1", "top5", "wer", "acc", "err")  # metrics the recipes report in percent


def plot_curves(runs: list[Run], x_key: str, x_label: str, rank0: bool, out: Path) -> None:
    """Loss and each recipe metric present against ``x_key``, one colour and marker per run
    (runs without evaluations, timing-only simulations, have no line)."""
    metrics = ["loss"] + sorted({r.metric for r in runs if r.metric})
    fig, axes = panel_figure(len(metrics))
    for index, run in enumerate(runs):
        color, marker = f"C{index % 10}", MARKERS[index % len(MARKERS)]
        for ax, metric in zip(axes, metrics):
            for split, style in (("eval", "-"), ("eval_rank0", "--")):
                points = [(r[x_key], r[metric]) for r in run.split(split)
                          if r.get(metric) is not None and r.get(x_key) is not None]
                if not points or (split == "eval_rank0" and not rank0):
                    continue
                xs, ys = zip(*points)
                label = run.label if split == "eval" else f"{run.label} (rank 0)"
                ax.plot(xs, ys, style, color=color, marker=marker, markersize=4, alpha=0.85,
                        markerfacecolor="none" if index % 2 else color, label=label)
    for ax, metric in zip(axes, metrics):
        better = "lower" if lower_is_better(metric) else "higher"
        unit = " (%)" if any(word in metric for word in PERCENT) else ""
        ax.set(xlabel=x_label, ylabel=f"held-out {metric}{unit}",
               title=f"{metric} on the held-out split ({better} is better)")
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
    """Samples/s bars, and the seconds a rank spent (mean per rank) stacked per run: computing,
    loading data, communicating, idle, evaluating and checkpointing."""
    fig, (rate_ax, time_ax) = panel_figure(2)
    labels = [r.label for r in runs]
    positions = range(len(runs))
    rates = [r.summary.get("samples_per_s") or 0.0 for r in runs]
    bars = rate_ax.bar(positions, rates, color=[f"C{i % 10}" for i in positions])
    rate_ax.bar_label(bars, fmt="%.0f", fontsize=7)
    rate_ax.set(ylabel="samples/s", title="training throughput")
    bottom = [0.0] * len(runs)
    for key, color in (("compute_s", "#4c72b0"), ("data_s", "#55a868"), ("comm_s", "#dd8452"),
                       ("idle_s", "#c44e52"), ("eval_s", "#8172b3"),
                       ("checkpoint_s", "#937860")):
        values = [r.summary.get(key) or 0.0 for r in runs]
        time_ax.bar(positions, values, bottom=bottom, color=color, label=key[:-2])
        bottom = [b + v for b, v in zip(bottom, values)]
    time_ax.set(ylabel="seconds (mean per rank)", title="where a rank's time went")
    fig.legend(*time_ax.get_legend_handles_labels(), fontsize=7, loc="outside right upper")
    for ax in (rate_ax, time_ax):
        ax.set_xticks(list(positions), labels, rotation=30, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.savefig(out)


LEARNER_COLUMNS = 3  # learners.png: runs side by side, then further rows


def plot_learners(runs: list[Run], out: Path) -> None:
    """Per run, a bar per learner: its own work per step (computing, loading batches) with
    its waiting per step stacked on top, so that the slow learner stands out."""
    shown = [r for r in runs if r.summary.get("learners")]
    fig, axes = panel_figure(len(shown), max_columns=LEARNER_COLUMNS)
    for ax, run in zip(axes, shown):
        learners = run.summary["learners"]
        ranks = [learner["rank"] for learner in learners]
        work = [learner["compute_s"] * 1e3 for learner in learners]
        wait = [learner["wait_s"] * 1e3 for learner in learners]
        ax.bar(ranks, work, color="#4c72b0", label="own work")
        ax.bar(ranks, wait, bottom=work, color="#c44e52", label="waiting")
        ax.set(xlabel="learner (rank)", ylabel="ms per step", title=run.label)
        if len(ranks) <= 16:
            hosts = [learner.get("host") or "" for learner in learners]
            named = len(set(hosts)) > 1  # the host under the rank where they differ
            ax.set_xticks(ranks, [f"{rank}\n{host}" if named else str(rank)
                                  for rank, host in zip(ranks, hosts)], fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=7, loc="outside right upper")
    fig.savefig(out)


def write_report(run_dirs: Sequence[Path], out: Path, rank0: bool = False,
                 skipped: Callable[[str], None] = note, over: str = "seed",
                 target: str | None = None) -> dict[str, Path]:
    """Load the runs (run dirs, or sweep dirs: see :func:`find_run_dirs`) and write the
    PNGs and table.md into ``out``, and the groups of runs that differ only in ``over``
    with ``target`` (report_groups.py); return the paths."""
    runs = []
    for path, in_sweep in find_run_dirs(run_dirs, skipped):
        runs.append(load_run(path))
        runs[-1].in_sweep = in_sweep
    wanted = parse_target(target, lower_is_better)
    check_over(runs, over)  # mistakes in the groups' options before anything is drawn
    check_target(runs, wanted)
    settings = differing_settings(runs)
    label_runs(runs, settings)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = {"curves_wall": out / "curves_wall.png", "curves_epoch": out / "curves_epoch.png",
                 "throughput": out / "throughput.png", "table": out / "table.md"}
        if any(run.evaluations for run in runs):
            plot_curves(runs, "wall_s", "wall time (s)", rank0, paths["curves_wall"])
            plot_curves(runs, "epoch", "epoch", rank0, paths["curves_epoch"])
        else:  # timing-only simulations: nothing to draw against time
            skipped("no curves: none of these runs evaluated (timing-only simulations)")
            del paths["curves_wall"], paths["curves_epoch"]
        plot_throughput(runs, paths["throughput"])
        if any(run.summary.get("learners") for run in runs):  # runs from before it: none
            paths["learners"] = out / "learners.png"
            plot_learners(runs, paths["learners"])
        paths["table"].write_text(markdown_table(
            runs, [key for key in settings if key not in SHOWN_SETTINGS]))
        paths["tb"] = link_event_dirs(runs, out / "tb")
        paths.update(write_groups(runs, out, over, wanted))
    except OSError as ex:
        raise UserError(f"cannot write the report to {out}: {one_line(ex)}",
                        "give --out a writable directory") from None
    return paths


def link_event_dirs(runs: list[Run], board: Path) -> Path:
    """``board/LABEL`` -> each run's ``tb/`` (absolute, so the report can move); the links
    of an earlier report there are replaced, so that its runs do not linger."""
    if board.is_dir():
        for old in sorted(board.rglob("*"), reverse=True):  # links first, then their dirs
            if old.is_symlink():
                old.unlink()
            elif old.is_dir() and not any(old.iterdir()):
                old.rmdir()
    for run in runs:
        events = run.path / "tb"
        if events.is_dir():
            link = board / run.label  # a clash-free label may hold one '/': a subdir
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(events.resolve(), target_is_directory=True)
    return board


# ---- command line ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Plots and a markdown table of several runs.",
                     epilog="Example: adpsgd-report runs/2026-11-23/* --out report; "
                            "adpsgd-report runs/multirun/2026-11-23/10-00-00 --out report")
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="run dirs, or sweep dirs of adpsgd-run -m (hydra.sweep.dir)")
    parser.add_argument("--out", type=Path, required=True,
                        help="directory for PNGs, table.md and tb/ (links for TensorBoard)")
    parser.add_argument("--rank0", action="store_true",
                        help="also draw rank 0's own model (split eval_rank0), dashed")
    parser.add_argument("--over", default="seed", metavar="KEY",
                        help="runs whose configs differ only in KEY form a group: mean and "
                             "spread in groups.md/.json, bands in curves_groups.png "
                             "(default: seed)")
    parser.add_argument("--target", metavar="METRIC=VALUE",
                        help="the groups' training time to reach it, e.g. top1=90 or wer=5")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run adpsgd-report; returns the exit status (0, or 2 after a one-line error)."""

    def body() -> int:
        args = build_parser().parse_args(argv)
        paths = write_report(args.run_dirs, args.out, rank0=args.rank0, over=args.over,
                             target=args.target)
        print(paths["table"].read_text(), end="")
        if "groups_table" in paths:
            print(f"\nruns that differ only in {args.over}, as groups:")
            print(paths["groups_table"].read_text(), end="")
        for path in paths.values():
            print(f"wrote {path}")
        print(f"compare them in TensorBoard: tensorboard --logdir {paths['tb']}")
        return 0

    return command_status(PROG, body)

if __name__ == "__main__":
    raise SystemExit(main())
