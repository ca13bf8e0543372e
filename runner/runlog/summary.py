"""summary.json: what a run reports when it ends (or fails), and the console's reading of it.

Built by rank 0 from every rank's report (:func:`build_summary`); written by the launcher for a
job that died before its ranks could (runner/launch/failure_summary.py); read back by the
commands (:func:`primary_metric`, :func:`results_table`).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from .learner_times import learners_of, slowest_learner_line
from .records import read_metrics

# eval_beside: seconds the evaluation thread scored copies while training went on
# (trainer.eval_in_background), not part of the others.
TIMES = ("compute", "comm", "idle", "data", "eval", "checkpoint", "comm_busy", "milestone_wait",
         "eval_beside")


def host_record() -> dict[str, Any]:
    """Where a rank ran: the host's name, the cores this process may use and the machine (its
    kernel's boot id: hosts that are namespaces of one machine, as in the lab, share it), so
    that the simulator's measured cluster knows whether ranks shared cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        machine = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        machine = socket.gethostname()
    # Not platform.node(): it keeps the first answer, which a rank forked from the rank
    # factory would take over from the factory (a lab host's rank would name the head).
    return {"name": socket.gethostname(), "cores": int(cores or 1), "machine": machine}


def bytes_sent_entry(sent: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's ``bytes_sent`` from each rank's traffic report (runner/comm/traffic.py):
    per rank, the bytes sent and sent per step, and the same by kind; ``mean_per_step``, the
    mean over ranks of their bytes per step."""
    kinds = sorted({kind for report in sent for kind in report["by_kind"]})
    return {"per_rank": [report["total"] for report in sent],
            "per_step": [report["per_step"] for report in sent],
            "mean_per_step": sum(report["per_step"] for report in sent) / len(sent),
            "by_kind": {kind: [report["by_kind"].get(kind, 0) for report in sent]
                        for kind in kinds}}


def hosts_of(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host: its name, the cores its ranks could use and how many ranks ran there."""
    hosts: dict[str, dict[str, Any]] = {}
    for report in per_rank:
        host = report.get("host")
        if host:
            entry = hosts.setdefault(host["name"], {**host, "ranks": 0})
            entry["ranks"] += 1
    return list(hosts.values())


def build_summary(status: str, cfg: Any, world: Any, run: dict[str, Any],
                  history: list[dict[str, Any]], per_rank: list[dict[str, Any]],
                  digests: list[tuple[int, str]], recipe: Any,
                  recipe_reports: list[Any]) -> dict[str, Any]:
    """summary.json's content. ``run``: steps, samples (every rank's), train_s, wall_s,
    checkpoint, resumed_from; ``per_rank``: each rank's report (time split, algorithm numbers,
    steps, skipped batches, milestones met); ``digests``: (node, SHA-256 of its parameters)
    per rank; ``recipe_reports``: what the recipe's ranks report for its own entries. The final
    metrics are those of the last evaluation (so far, for a run stopped early)."""
    run = {"algo": cfg.algo.name, "recipe": cfg.recipe.name, "nprocs": world.size,
           "procs_per_node": world.local_size, "epochs": cfg.trainer.epochs, **run}
    evals = [r for r in history if r["split"] == "eval"]
    final = {k: v for k, v in (evals[-1] if evals else {}).items()
             if k not in ("epoch", "step", "samples", "wall_s", "train_s", "split")}
    times = [report["time"] for report in per_rank]
    means = {name: float(sum(t.get(name, 0.0) for t in times) / len(times)) for name in TIMES}
    algo_stats = [report["algo"] for report in per_rank]
    summary = {
        "status": status, **run,
        "samples_per_s": run["samples"] / max(run["train_s"], 1e-9),
        "final": final,
        recipe.primary_metric: final.get(recipe.primary_metric),
        "consensus_distance": final.get("consensus_distance"),
        # Bitwise comparison of every rank's final parameters.
        "replicas_identical": len({d for _, d in digests}) == 1,
        # The same inside every (real or emulated) node: hadpsgd's super learners.
        "node_replicas_identical": len(set(digests)) == world.num_nodes,
        **{f"{name}_s": means[name] for name in TIMES},
        "per_rank": times,
        "steps_per_rank": [report["steps"] for report in per_rank],
        # Seconds per step of each learner, its own work apart from waiting (learner_times.py).
        "learners": learners_of(per_rank),
        # Waiting at evaluations and checkpoints for the other ranks (part of idle_s).
        "milestones": per_rank[0]["milestones"],
        # Steps whose update was dropped for a non-finite loss (skip_batch).
        "skipped_batches": [report["skipped_batches"] for report in per_rank],
        # Algorithm-specific numbers per rank (exchanges, staleness...).
        "algo_stats": {name: [stats.get(name) for stats in algo_stats]
                       for name in sorted({k for st in algo_stats for k in st})},
    }
    sent = [report.get("bytes_sent") for report in per_rank]
    if all(sent):
        summary["bytes_sent"] = bytes_sent_entry(sent)
    devices = [report.get("device") for report in per_rank]
    if any(devices):  # real ranks: where each computed and how its tensors travelled
        summary["devices"] = devices
        summary["comm_backend"] = per_rank[0].get("comm_backend")
        staging = [report.get("comm_staging") for report in per_rank]
        if any(staging):
            summary["comm_staging"] = staging
    hosts = hosts_of(per_rank)
    if hosts:  # real ranks (simulated learners run on no host of their own)
        summary["hosts"] = hosts
    rank0 = [r for r in history if r["split"] == "eval_rank0"]
    if rank0:
        summary["final_rank0"] = rank0[-1]
    summary.update(recipe.summary_entries(recipe_reports))
    return summary


def session_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """summary.json if the ranks of this session (since the run config was saved) wrote it."""
    path = Path(run_dir) / "summary.json"
    start = (Path(run_dir) / ".hydra" / "run.yaml").stat().st_mtime
    if path.exists() and path.stat().st_mtime >= start:
        return json.loads(path.read_text())
    return None


# Keys of summary["final"] that are not the recipe's metric.
NOT_METRICS = {"loss", "consensus_distance", "lr", "train_s"}


def primary_metric(summary: dict[str, Any]) -> str | None:
    """The recipe's headline metric of a run: the trainer writes it both inside ``final`` and
    at the top level of summary.json (``wer``, ``top1``, ``frame_acc``...)."""
    final = summary.get("final") or {}
    names = [k for k in final if k in summary and k not in NOT_METRICS]
    return names[0] if names else None


def replicas_line(summary: dict[str, Any]) -> str | None:
    """For a run whose ranks ended with different models (decentralized, asynchronous): the
    held-out metric of the averaged model beside rank 0's own where they differ, and the
    consensus distance. None when every rank holds the same model (SSGD): nothing to add."""
    parts = []
    metric = primary_metric(summary)
    averaged = (summary.get("final") or {}).get(metric)
    own = (summary.get("final_rank0") or {}).get(metric)
    if isinstance(averaged, (int, float)) and isinstance(own, (int, float)) \
            and f"{averaged:.2f}" != f"{own:.2f}":
        parts.append(f"held-out {metric} {averaged:.2f} (averaged model), {own:.2f} (rank 0's "
                     "own)")
    consensus = summary.get("consensus_distance")
    # Identical replicas (SSGD, a local SGD that just averaged) differ by rounding alone.
    if isinstance(consensus, (int, float)) and consensus > 0 \
            and not summary.get("replicas_identical"):
        parts.append(f"consensus distance {consensus:.3g}")
    return "; ".join(parts) or None


def seconds_cell(seconds: float) -> str:
    """A 9-wide cell of seconds that shows a simulated run's too (milliseconds of virtual
    time on a fast modelled cluster): 1 decimal from 10 s, 3 below, then scientific."""
    if seconds >= 10 or seconds == 0:
        return f"{seconds:9.1f}"
    return f"{seconds:9.3f}" if seconds >= 0.01 else f"{seconds:9.2e}"


def results_table(run_dir: str | Path) -> str:
    """A short console table of the evaluations and the final summary of one run."""
    rows = [r for r in read_metrics(run_dir) if r.get("split") == "eval"]
    summary_path = Path(run_dir) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    metric_keys = [k for k in ("top1", "top5", "wer", "wer_swb", "wer_ch")
                   if any(k in r for r in rows)]
    header = ["epoch", "step", "wall_s", "loss", *metric_keys]
    lines = ["  ".join(f"{h:>9}" for h in header)] if rows else []  # timing-only: no rows
    for r in rows:
        cells = [f"{r['epoch']:9.2f}", f"{r['step']:9d}", seconds_cell(r["wall_s"]),
                 f"{r['loss']:9.4f}"] + [f"{r.get(k, float('nan')):9.2f}" for k in metric_keys]
        lines.append("  ".join(cells))
    if summary:
        events = [e["event"] for e in summary.get("membership") or []]  # elastic runs
        changes = [f"{events.count(e)} {e}" for e in ("lost", "joined") if e in events]
        ranks = f"{summary.get('nprocs')} ranks" + (
            f" ({', '.join(changes)}, {summary.get('learners_at_end')} at the end)"
            if changes else "")
        # A simulation's rate is in modelled seconds (its progress lines show the host's).
        rate = "modelled samples/s" if summary.get("launcher") == "sim" else "samples/s"
        restarts = len(summary.get("restarts") or [])  # a job restarted is worth a word
        restarted = f" ({restarts} restart{'s' if restarts > 1 else ''})" if restarts else ""
        lines.append(
            f"{summary.get('algo')} on {summary.get('recipe')}, {ranks}: "
            f"{summary.get('samples_per_s', 0):.0f} {rate}, status {summary.get('status')}"
            f"{restarted}, run dir {run_dir}")
        replicas = replicas_line(summary)
        if replicas:
            lines.append(replicas)
        slowest = slowest_learner_line(summary.get("learners") or [])
        if slowest:
            lines.append(slowest)
    return "\n".join(lines)
