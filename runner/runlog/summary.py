"""summary.json: what a run reports when it ends (or fails), and the console's reading of it.

Built by rank 0 from every rank's report (:func:`build_summary`); written by the launcher for a
job that died before its ranks could (:func:`write_failure_summary`); read back by the
commands (:func:`primary_metric`, :func:`results_table`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from ..errors import UserError
from .failure_events import read_events, write_events_text
from .learner_times import learners_of, slowest_learner_line
from .records import read_metrics, read_restarts, write_json_atomic
from .writer import hparams_of, write_session_end, write_session_start

TIMES = ("compute", "comm", "idle", "data", "eval", "checkpoint", "comm_busy", "milestone_wait")


def host_record() -> dict[str, Any]:
    """Where a rank ran: the host's name, the cores this process may use and the machine (its
    kernel's boot id: hosts that are namespaces of one machine, as in the lab, share it), so
    that the simulator's measured cluster knows whether ranks shared cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        machine = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        machine = platform.node()
    return {"name": platform.node(), "cores": int(cores or 1), "machine": machine}


def rank_report(trainer: Any) -> dict[str, Any]:
    """What one rank of runner/trainer.py's Trainer reports, at every evaluation (TensorBoard's
    per-rank charts) and at the end (summary.json): time split, algorithm numbers, steps,
    skipped batches, milestones met, host, device and how its tensors travelled."""
    from ..train.compute_path import device_record

    t = trainer
    membership = getattr(t, "membership", None)
    return {"time": {**t.timers.snapshot(), "comm_busy": t.comm.busy_s},
            # The number it was launched with (an elastic run renumbers the ranks).
            "learner": (membership.learners[t.world.rank] if membership is not None
                        else t.world.rank),
            "node": t.world.node, "algo": t.algo.stats(), "steps": t.state.step,
            "skipped_batches": t.state.skipped_batches, "milestones": t.milestone_waits,
            "host": host_record(), "device": device_record(t.compute.device),
            "comm_backend": t.comm.backend, "comm_staging": t.comm.staging_record(),
            "bytes_sent": t.comm.traffic.report(t.state.step)}


def gather_summary(trainer: Any, status: str) -> dict[str, Any]:
    """Collective, at the end of a run of runner/trainer.py's Trainer: every rank's report,
    totals and parameter digest go to rank 0, which saves the final model of a completed run
    and writes summary.json and the hparams session; returns the summary (empty elsewhere)."""
    from ..comm.buffers import parameter_digest

    t = trainer
    seconds = t.timers.seconds
    elapsed = time.perf_counter() - t.start_time - seconds["eval"] - seconds["checkpoint"]
    train_time = t.comm.allreduce_numbers([elapsed], op="max")[0]
    membership = t.membership  # elastic runs: the learners lost on the way
    samples = (t.comm.allreduce_numbers([t.state.local_samples])[0]
               + (membership.lost_samples if membership else 0))
    digests = t.comm.gather_objects((t.world.node, parameter_digest(t.param_buffers)))
    recipe_reports = t.comm.gather_objects(t.recipe.rank_report())
    per_rank = t.comm.gather_objects(rank_report(t))
    if not t.world.is_main:
        return {}
    if status == "completed":
        t.checkpointer.save_final(t.model, t.state.step)
    last = t.checkpointer.last
    run = {"steps": t.state.step, "samples": int(samples), "train_s": train_time,
           "wall_s": time.perf_counter() - t.start_time,
           # The newest checkpoint, and the one this session resumed from (if any).
           "checkpoint": str(last) if last else None,
           "resumed_from": str(t.resumed_from.path) if t.resumed_from else None,
           "restarts": read_restarts(t.run_dir),
           # Ranks lost, stalled or failed in earlier jobs of this run (restarts).
           "events": read_events(t.run_dir),
           # The ranks launched, learners lost and joined (launcher.elastic), distinct
           # samples used per epoch (lockstep algorithms).
           "nprocs": t.cfg.launcher.nprocs, "learners_at_end": t.world.size,
           "membership": membership.events if membership else [],
           "epoch_samples": t.ledger.closed if t.ledger is not None else None}
    summary = build_summary(status, t.cfg, t.world, run, t.state.history, per_rank, digests,
                            t.recipe, recipe_reports)
    t.runlog.finish(summary)
    return summary


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


def write_failure_summary(run_dir: str | Path, cfg: Any, exit_status: int,
                          status: str = "failed", samples_reached: int | None = None) -> None:
    """summary.json of a job that ended without a summary of its own (a rank failed or died,
    or a second Ctrl-C stopped it at once): ``status``, the exit status, the checkpoint to
    resume from and how far the run got by its newest checkpoint or evaluation (``steps``,
    ``samples``; 0 before the first step), so that a script scanning run dirs sees every
    run's outcome; and its TensorBoard hparams session, with the last evaluation's metrics.
    A summary the ranks wrote in this session is kept (then they got far enough to say
    more), with the job's status and exit status: ranks that the MPI runtime stopped as it
    ended a failed job wrote "preempted", but the job failed. ``samples_reached``: the global
    samples the ranks had trained by their last heartbeats (None: unknown), which a job
    stopped at once reaches beyond its newest checkpoint; written as ``samples_reached``."""
    from torch.utils.tensorboard.writer import FileWriter

    from ..checkpoint.files import complete_checkpoints

    if (written := session_summary(run_dir)) is not None:
        if (written.get("status"), written.get("exit_status")) != (status, exit_status):
            write_json_atomic(Path(run_dir) / "summary.json",
                              {**written, "status": status, "exit_status": exit_status})
        return
    checkpoints = complete_checkpoints(run_dir)
    try:
        evals = [r for r in read_metrics(run_dir) if r.get("split") == "eval"]
    except UserError:  # a damaged file must not hide why the job failed: left out here
        evals = []
    events = read_events(run_dir)
    nprocs = cfg.launcher.nprocs
    # How far the run dir shows the run got: its newest checkpoint or evaluation (0 for a
    # job stopped before its first step), so that every summary.json has steps and samples.
    reached = [(c.step, c.samples) for c in checkpoints[-1:]]
    reached += [(e["step"], e["samples"]) for e in evals[-1:]
                if isinstance(e.get("step"), int) and isinstance(e.get("samples"), int)]
    steps, samples = max(reached, default=(0, 0))
    write_json_atomic(Path(run_dir) / "summary.json", {
        "status": status, "exit_status": exit_status, "algo": cfg.algo.name,
        "recipe": cfg.recipe.name, "nprocs": nprocs, "steps": steps, "samples": samples,
        "samples_reached": max(samples_reached or 0, samples),
        "checkpoint": str(checkpoints[-1].path) if checkpoints else None,
        "last_eval": evals[-1] if evals else None, "logs": str(Path(run_dir) / "logs"),
        "restarts": read_restarts(run_dir), "events": events,
        # An elastic job's losses and joins before it failed, as its summary lists them.
        "membership": [{k: v for k, v in e.items() if k not in ("time", "cause", "operation")}
                       for e in events if e.get("event") in ("lost", "joined", "spare lost")]})
    last = {k: v for k, v in (evals[-1] if evals else {}).items()
            if k not in ("epoch", "step", "samples", "train_s", "split")}
    writer = FileWriter(str(Path(run_dir) / "tb"))
    write_session_start(writer, hparams_of(cfg))  # none if the run died before
    write_session_end(writer, last, status)
    write_events_text(writer, events, evals[-1]["step"] if evals else 0)
    writer.close()


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
