"""adpsgd-report's groups: runs that differ only in their seed, read as one result.

A comparison is believed with its spread over seeds. adpsgd-report puts runs into one group
when their validated configs (``.hydra/run.yaml``) are equal but for the key the group is
taken over (``--over``, ``seed`` by default; a config group such as ``topology`` counts with
everything under it) and ``resume``. Runs that differ in anything else are never merged: they
form groups of their own, and the table shows every key whose value differs between groups,
so a reader sees what was compared. A run without its config is a group of its own.

For each group, over its n runs:

* the final held-out metric (summary.json's, else the last ``eval`` evaluation): mean, min-max,
  and the sample standard deviation where n >= 3 (with fewer it says little);
* with ``--target METRIC=VALUE`` (``top1=90``, ``wer=5``): the training time (metrics.jsonl's
  ``train_s``) and samples at the first evaluation that reaches it (``>=``, or ``<=`` for a
  metric where lower is better), over the runs that reached it ("k of n");
* samples/s.

Written beside the per-run report: ``groups.md`` (ready to paste into a paper),
``groups.json`` (every number, each run's too) and ``curves_groups.png`` (per group the mean
curve over its runs, against epochs, with the min-max band shaded).
"""

from __future__ import annotations

import difflib
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from ..errors import UserError
from .report_figures import lower_is_better, panel_figure

if TYPE_CHECKING:
    from .report import Run

IGNORED_KEYS = ("resume",)  # a resumed run is the same experiment
# An evaluation's fields that are no target (when and where it was, not how good).
COUNTERS = {"epoch", "step", "samples", "wall_s", "train_s", "lr", "consensus_distance"}


@dataclass
class Spread:
    """Numbers of the runs of a group: mean, min, max, and the sample std where n >= 3."""

    values: list[float]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) >= 3 else None

    def as_dict(self) -> dict[str, Any]:
        return {"n": len(self.values), "mean": self.mean, "std": self.std,
                "min": min(self.values, default=None), "max": max(self.values, default=None),
                "values": self.values}


@dataclass
class Target:
    metric: str
    value: float
    lower_is_better: bool

    def reached(self, row: dict[str, Any]) -> bool:
        got = row.get(self.metric)
        if not isinstance(got, (int, float)) or not math.isfinite(got):
            return False
        return got <= self.value if self.lower_is_better else got >= self.value


@dataclass
class Group:
    settings: dict[str, str]  # the keys that differ between groups, with this group's values
    runs: list[Run] = field(default_factory=list)
    config_key: str | None = None  # None: a run without its config, alone

    @property
    def label(self) -> str:
        shown = ",".join(f"{key}={value}" for key, value in self.settings.items())
        return shown or self.runs[0].label


def parse_target(text: str | None, lower_is_better: Any) -> Target | None:
    """``METRIC=VALUE`` (top1=90, wer=5) as a Target; UserError naming the form otherwise."""
    if text is None:
        return None
    metric, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not metric or not math.isfinite(number):
        raise UserError(f"--target {text!r} is not METRIC=VALUE",
                        "give e.g. --target top1=90 or --target wer=5")
    return Target(metric.strip(), number, lower_is_better(metric))


def flat_config(run: Run) -> dict[str, str] | None:
    """The run's validated config as dotted key -> value text, None without one."""
    if run.config is None:
        return None
    flat: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if OmegaConf.is_dict(node):
            for key in node:
                walk(node[key], f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = json.dumps(OmegaConf.to_container(node) if OmegaConf.is_list(
                node) else node, default=str)

    walk(run.config, "")
    return flat


def _outside(key: str, over: str) -> bool:
    return not any(key == k or key.startswith(f"{k}.") for k in (over, *IGNORED_KEYS))


def check_over(runs: Sequence[Run], over: str) -> None:
    """``over`` must be a key of the runs' configs (or a group of keys); a typo is one line
    with the closest key."""
    keys = {key for run in runs if (flat := flat_config(run)) for key in flat}
    if not keys or any(key == over or key.startswith(f"{over}.") for key in keys):
        return
    tops = {key.split(".")[0] for key in keys}
    close = difflib.get_close_matches(over, sorted(keys | tops), n=1)
    hint = f"did you mean --over {close[0]}?" if close else "give a key of the runs' configs"
    raise UserError(f"--over {over}: no run's config has that key", hint)


def check_target(runs: Sequence[Run], target: Target | None) -> None:
    """The target's metric must be one the runs evaluated: one line naming those otherwise."""
    if target is None or any(target.metric in row for run in runs for row in run.split("eval")):
        return
    known = sorted({key for run in runs for row in run.split("eval") for key in row
                    if key not in COUNTERS and isinstance(row[key], (int, float))})
    close = difflib.get_close_matches(target.metric, known, n=1)
    raise UserError(f"--target {target.metric}: no run evaluated that metric",
                    f"did you mean --target {close[0]}=...?" if close else
                    f"give one of {', '.join(known)}")


def group_runs(runs: Sequence[Run], over: str = "seed") -> list[Group]:
    """Runs whose configs are equal but for ``over`` (and ``resume``), in the order their
    first runs come; each group's ``settings`` are the keys that differ between groups."""
    configs = [flat_config(run) for run in runs]
    groups: dict[str, Group] = {}
    for index, (run, flat) in enumerate(zip(runs, configs)):
        if flat is None:
            groups[f"#{index}"] = Group({}, [run])
            continue
        kept = {key: value for key, value in flat.items() if _outside(key, over)}
        key = json.dumps(kept, sort_keys=True)
        groups.setdefault(key, Group({}, config_key=key)).runs.append(run)
    kept_configs = [json.loads(g.config_key) for g in groups.values() if g.config_key]
    differing = sorted({key for config in kept_configs for key in config
                        if len({c.get(key) for c in kept_configs}) > 1})
    # A config group whose option differs (algo=dpsgd, algo=adpsgd) is shown by its option's
    # name, not by every key under it.
    chosen = {key.split(".")[0] for key in differing if key.endswith(".name")
              and key.count(".") == 1}
    shown = list(dict.fromkeys(key.split(".")[0] if key.split(".")[0] in chosen else key
                               for key in differing))
    for group in groups.values():
        if group.config_key:
            config = json.loads(group.config_key)
            group.settings = {key: _shown(config.get(f"{key}.name" if key in chosen else key,
                                                     '"-"')) for key in shown}
    return list(groups.values())


def _shown(value: str) -> str:
    """A config value as a reader writes it: no JSON quotes around a string."""
    try:
        loaded = json.loads(value)
    except (TypeError, ValueError):
        return str(value)
    return loaded if isinstance(loaded, str) else json.dumps(loaded)


def final_metric(run: Run, metric: str) -> float | None:
    final = run.summary.get("final") or (run.split("eval") or [{}])[-1]
    value = final.get(metric)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def time_to(run: Run, target: Target) -> tuple[float, int] | None:
    """Training seconds and samples at the first ``eval`` evaluation that reaches the
    target; None if none did."""
    for row in run.split("eval"):
        if target.reached(row):
            seconds = row.get("train_s", row.get("wall_s"))
            if isinstance(seconds, (int, float)):
                return float(seconds), int(row.get("samples", 0))
    return None


def group_numbers(group: Group, over: str, target: Target | None) -> dict[str, Any]:
    """Everything the table and the JSON say of one group."""
    metric = next((run.metric for run in group.runs if run.metric), None)
    finals = [v for run in group.runs if metric and (v := final_metric(run, metric)) is not None]
    rates = [float(r) for run in group.runs
             if isinstance(r := run.summary.get("samples_per_s"), (int, float))]
    numbers: dict[str, Any] = {
        "group": group.label, "settings": group.settings, "over": over,
        "over_values": [run.setting(over) for run in group.runs],
        "runs": [str(run.path) for run in group.runs], "metric": metric,
        "final": Spread(finals).as_dict(), "samples_per_s": Spread(rates).as_dict()}
    if target is not None:
        reached = [hit for run in group.runs if (hit := time_to(run, target)) is not None]
        numbers["target"] = {"metric": target.metric, "value": target.value,
                             "lower_is_better": target.lower_is_better,
                             "reached": len(reached), "of": len(group.runs),
                             "train_s": Spread([s for s, _ in reached]).as_dict(),
                             "samples": Spread([float(n) for _, n in reached]).as_dict()}
    return numbers


def _cell(spread: dict[str, Any], fmt: str) -> list[str]:
    """mean, std, min-max of a spread as table cells ("-" where there is no number)."""
    def num(value: Any) -> str:
        return format(value, fmt) if isinstance(value, (int, float)) else "-"
    span = (f"{num(spread['min'])}-{num(spread['max'])}" if spread["values"] else "-")
    return [num(spread["mean"]), num(spread["std"]), span]


def groups_table(numbers: list[dict[str, Any]]) -> str:
    """The groups as a markdown table: the settings that differ (or the group's name where
    none does), n, then mean, std and min-max of the final metric, of the training time to
    the target and of samples/s."""
    settings = list(numbers[0]["settings"]) if numbers else []
    metric = next((n["metric"] for n in numbers if n["metric"]), "metric")
    columns = [*(settings or ["group"]), f"n ({numbers[0]['over']})" if numbers else "n",
               f"{metric} mean", f"{metric} std", f"{metric} min-max"]
    target = numbers[0].get("target") if numbers else None
    if target:
        name = (f"train s to {target['metric']} {'<=' if target['lower_is_better'] else '>='}"
                f" {target['value']:g}")
        columns += [f"{name}: mean", "std", "min-max", "reached"]
    columns += ["samples/s mean", "std", "min-max"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for n in numbers:
        row = [*([n["settings"].get(key, "-") for key in settings] or [n["group"]]),
               str(len(n["runs"])), *_cell(n["final"], ".2f")]
        if target:
            row += [*_cell(n["target"]["train_s"], ".3g"),
                    f"{n['target']['reached']} of {n['target']['of']}"]
        row += _cell(n["samples_per_s"], ".1f")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def mean_curve(runs: Sequence[Run], metric: str) -> tuple[list[float], list[float],
                                                           list[float], list[float]]:
    """Epochs that every run evaluated at, with the mean, min and max of ``metric`` there."""
    per_run = [{row["epoch"]: row[metric] for row in run.split("eval")
                if isinstance(row.get(metric), (int, float)) and "epoch" in row}
               for run in runs]
    epochs = sorted(set.intersection(*(set(points) for points in per_run))) if per_run else []
    values = [[points[e] for points in per_run] for e in epochs]
    return (epochs, [statistics.fmean(v) for v in values], [min(v) for v in values],
            [max(v) for v in values])


def plot_groups(groups: Sequence[Group], out: Path) -> None:
    """Held-out loss and the recipe's metric against epochs: per group the mean over its
    runs, the min-max band shaded."""
    metrics = ["loss"] + sorted({r.metric for g in groups for r in g.runs if r.metric})
    fig, axes = panel_figure(len(metrics))
    for index, group in enumerate(groups):
        color = f"C{index % 10}"
        for ax, metric in zip(axes, metrics):
            epochs, mean, low, high = mean_curve(group.runs, metric)
            if not epochs:
                continue
            ax.plot(epochs, mean, "-o", color=color, markersize=3,
                    label=f"{group.label} (n={len(group.runs)})")
            ax.fill_between(epochs, low, high, color=color, alpha=0.2, linewidth=0)
    for ax, metric in zip(axes, metrics):
        better = "lower" if lower_is_better(metric) else "higher"
        ax.set(xlabel="epoch", ylabel=f"held-out {metric}",
               title=f"{metric}: mean, min-max band ({better} is better)")
        ax.grid(alpha=0.3)
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="outside right upper")
    fig.savefig(out)


def write_groups(runs: Sequence[Run], out: Path, over: str, target: Target | None
                 ) -> dict[str, Path]:
    """groups.md, groups.json and curves_groups.png in ``out`` when some group holds more
    than one run; nothing (an empty dict) otherwise."""
    groups = group_runs(runs, over)
    if all(len(group.runs) < 2 for group in groups):
        return {}
    numbers = [group_numbers(group, over, target) for group in groups]
    paths = {"groups_table": out / "groups.md", "groups_json": out / "groups.json",
             "groups_curves": out / "curves_groups.png"}
    paths["groups_table"].write_text(groups_table(numbers))
    paths["groups_json"].write_text(json.dumps(numbers, indent=1) + "\n")
    if any(run.evaluations for run in runs):
        plot_groups(groups, paths["groups_curves"])
    else:
        del paths["groups_curves"]
    return paths
