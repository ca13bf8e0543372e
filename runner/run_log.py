"""What a run leaves behind: tb/ events, metrics.jsonl, summary.json, and the console table.

Only rank 0 writes. Layout of a run dir (the interface contract):

* ``tb/``            TensorBoard events: train/*, eval/*, by_samples/* (step: global
                     samples), time/* (mean and per rank), config text, custom-scalars
                     layout, hparams session
* ``metrics.jsonl``  one JSON object per evaluation (epoch, step, samples, wall_s, split, loss,
                     and top1/top5 or wer)
* ``summary.json``   final metrics, throughput, time split, consensus distance, status
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from .errors import one_line

# The launcher's record of the restarts of a run (launcher.max_restarts, runner/launch/
# restarts.py); summary.json repeats it as ``restarts``.
RESTARTS = Path("logs") / "restarts.json"


def read_restarts(run_dir: str | Path, strict: bool = False) -> list[dict[str, Any]]:
    """Every restart of the run so far: cause, at_samples, resumed_from_samples, failed_at
    (time.time() of the failure) and seconds_down (null until the restarted job resumed).
    None yet: []; a damaged file: [] too, or ValueError with ``strict``."""
    path = Path(run_dir) / RESTARTS
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text())["restarts"])
    except (OSError, ValueError, KeyError, TypeError) as ex:
        if strict:
            raise ValueError(f"{path} is unreadable ({one_line(ex)})") from None
        return []


def write_restarts(run_dir: str | Path, records: list[dict[str, Any]]) -> None:
    path = Path(run_dir) / RESTARTS
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"restarts": records})


def record_training_again(run_dir: str | Path) -> None:
    """Rank 0 of a job that resumed after a restart: the run was down from the failure until
    now (its state is loaded; the next step trains)."""
    records = read_restarts(run_dir)
    if records and records[-1].get("seconds_down") is None and "failed_at" in records[-1]:
        records[-1]["seconds_down"] = round(time.time() - records[-1]["failed_at"], 1)
        write_restarts(run_dir, records)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/Inf; null is unambiguous
    return value


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunLog:
    """Rank 0's writer for TensorBoard, metrics.jsonl and summary.json."""

    def __init__(self, run_dir: str | Path, cfg: Any, metric: str,
                 purge_step: int | None = None):
        """``metric``: the recipe's held-out metric (charted in the custom-scalars layout).
        ``purge_step`` (a resumed run): TensorBoard hides this run dir's earlier events at
        that step and after, which the interrupted session wrote past its checkpoint."""
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge_step)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if purge_step is None:  # a resumed run has these in its first session's events
            self.writer.add_custom_scalars(custom_scalars_layout(metric))
            self.text("config", config_markdown(cfg), 0)
            write_session_start(self.writer._get_file_writer(), hparams_of(cfg))

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def evaluation(self, record: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({k: _finite(v) for k, v in record.items()}) + "\n")

    def rewrite_metrics(self, records: list[dict[str, Any]]) -> None:
        """metrics.jsonl as of a checkpoint (a resumed run drops what the interrupted session
        wrote after it, then appends as usual)."""
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            for record in records:
                f.write(json.dumps({k: _finite(v) for k, v in record.items()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.metrics_path)

    def record_evaluation(self, results: dict[str, dict[str, float]], consensus: float,
                          per_rank: list[dict[str, Any]], where: dict[str, Any],
                          examples: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
        """One evaluation: a metrics.jsonl row per split (``where``: epoch, step, samples,
        wall_s, lr), its TensorBoard scalars, each rank's times and algorithm numbers, and
        the decoded examples; returns the rows (the run's history)."""
        step = where["step"]
        rows = []
        for split, metrics in results.items():
            row = {"epoch": where["epoch"], "step": step, "samples": where["samples"],
                   "wall_s": where["wall_s"], "split": split, **metrics,
                   "consensus_distance": consensus, "lr": where["lr"]}
            rows.append(row)
            self.evaluation(row)
            self.scalars({f"{split}/{k}": v for k, v in metrics.items()}, step)
            # The same against global samples: runs of different nprocs or batch line up.
            self.scalars({f"by_samples/{split}/{k}": v for k, v in metrics.items()},
                         where["samples"])
        self.scalars({"consensus/distance": consensus}, step)
        self.scalars({"by_samples/consensus/distance": consensus}, where["samples"])
        if per_rank:  # the mean split over ranks: one custom-scalars chart per run
            self.scalars({f"time/{name}_s": float(np.mean([r["time"].get(name, 0.0)
                                                           for r in per_rank]))
                          for name in TIME_SPLIT}, step)
        for rank, report in enumerate(per_rank):
            # Per rank only the split itself (checkpoint and bookkeeping seconds are in
            # summary.json): 5 cards per rank rather than 8.
            self.scalars({f"time/{name}_s/rank{rank}": report["time"][name]
                          for name in TIME_SPLIT if name in report["time"]}, step)
            self.scalars({f"algo/{name}/rank{rank}": value
                          for name, value in report["algo"].items()}, step)
        if examples:  # a markdown table: reference against hypothesis
            table = [f"| {utt} | {ref} | {hyp} |" for utt, ref, hyp in examples]
            self.text("eval/examples", "\n".join(
                ["| utterance | reference | hypothesis |", "|---|---|---|", *table]), step)
        return rows

    def summary(self, payload: dict[str, Any]) -> None:
        write_json_atomic(self.run_dir / "summary.json",
                          {k: _finite(v) for k, v in payload.items()})

    def finish(self, summary: dict[str, Any]) -> None:
        """summary.json, and the hparams session's metrics and status (a stopped or preempted
        run's too: its metrics are those of its last evaluation)."""
        write_session_end(self.writer._get_file_writer(), {
            **summary["final"], "samples_per_s": summary.get("samples_per_s"),
            "wall_s": summary.get("wall_s")}, summary["status"])
        self.summary(summary)
        self.close()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


TIMES = ("compute", "comm", "idle", "data", "eval", "checkpoint", "comm_busy", "milestone_wait")
# The time split TensorBoard shows (per rank and as the mean over ranks).
TIME_SPLIT = ("compute", "comm", "idle", "data", "eval")

# hparams metrics are numbers: the run's status (also a string hparam) as a code.
STATUS_CODES = {"completed": 0, "stopped": 1, "preempted": 2, "failed": 3}


def custom_scalars_layout(metric: str) -> dict[str, dict[str, list[Any]]]:
    """TensorBoard's custom-scalars page: each chart overlays every run (a tag regex), so
    runs compare at a glance. Same titles in every run: TensorBoard merges the layouts."""
    return {
        "compare runs": {
            f"held-out {metric}": ["Multiline", [f"^eval/{metric}$"]],
            "held-out loss": ["Multiline", ["^eval/loss$"]],
            "train samples/s": ["Multiline", ["^train/samples_per_s$"]],
            "consensus distance": ["Multiline", ["^consensus/distance$"]],
        },
        "by global samples": {
            f"held-out {metric}": ["Multiline", [f"^by_samples/eval/{metric}$"]],
            "held-out loss": ["Multiline", ["^by_samples/eval/loss$"]],
        },
        # One small chart per split (cumulative seconds, mean over ranks): in a single chart
        # the five lines of a run share its colour and cannot be told apart.
        "time split": {f"{name} s": ["Multiline", [f"^time/{name}_s$"]]
                       for name in TIME_SPLIT},
    }


def config_markdown(cfg: Any) -> str:
    """The composed config as a YAML code block (TensorBoard's text plugin renders markdown)."""
    from omegaconf import OmegaConf

    return f"```yaml\n{OmegaConf.to_yaml(cfg)}```"


def hparams_of(cfg: Any) -> dict[str, Any]:
    """What a run's hparams entry is filtered and sorted by: the algorithm with its own
    options (``algo.*``), the topology, the layout of ranks, the batch and the rate."""
    algo = {f"algo.{k}": v for k, v in cfg.algo.items()
            if k != "name" and isinstance(v, (int, float, str, bool))}
    return {"recipe": cfg.recipe.name, "algo": cfg.algo.name, **algo,
            "topology": cfg.topology.name, "launcher": cfg.launcher.name,
            "nprocs": cfg.launcher.nprocs,
            "launcher.procs_per_node": cfg.launcher.get("procs_per_node"),
            "comm.backend": cfg.comm.backend, "trainer.batch_size": cfg.trainer.batch_size,
            "trainer.epochs": cfg.trainer.epochs, "optim.lr": cfg.optim.lr, "seed": cfg.seed}


def hparam_metrics(metrics: dict[str, Any], status: str) -> dict[str, float]:
    """``hparam/<name>`` for the finite numbers of ``metrics``, and the status code."""
    clean = {f"hparam/{k}": float(v) for k, v in metrics.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    return {**clean, "hparam/status_code": float(STATUS_CODES.get(status, len(STATUS_CODES)))}


def write_session_start(file_writer: Any, params: dict[str, Any]) -> None:
    """The run's hparams session, written when the run starts: a running, killed or resumed
    run is in the HParams table too. TensorBoard keeps the first session start of a run (a
    resumed run's would be ignored), so it holds only what resuming does not change: the
    config, not the status. No experiment entry: TensorBoard takes one run's experiment as
    everyone's, which would hide the options of other algorithms; without one it collects
    the hparams of every run."""
    from torch.utils.tensorboard.summary import hparams

    clean = {k: "none" if v is None else v if isinstance(v, (int, float, str, bool))
             else str(v) for k, v in params.items()}
    _, session_start, _ = hparams(clean, {})
    file_writer.add_summary(session_start)


def write_session_end(file_writer: Any, metrics: dict[str, Any], status: str) -> None:
    """``metrics`` and the status code as ``hparam/<name>`` scalars (the plugin shows a
    session's last value of each, so a resumed run's replace its stopped session's), and
    for a completed run the session's end as a success. A stopped, preempted or failed run
    may be resumed, and TensorBoard would keep a first 'failure' for good: its session stays
    open, its outcome in ``hparam/status_code``."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from torch.utils.tensorboard.summary import scalar

    for tag, value in hparam_metrics(metrics, status).items():
        file_writer.add_summary(scalar(tag, value))
    if status == "completed":
        content = plugin_data_pb2.HParamsPluginData(
            session_end_info=plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS))
        file_writer.add_summary(Summary(value=[Summary.Value(
            tag=metadata.SESSION_END_INFO_TAG,
            metadata=metadata.create_summary_metadata(content))]))


class ProgressBar:
    """Rank 0's console bar over the run's sample budget (tqdm), or nothing."""

    def __init__(self, stream: Any, total: int, done: int, label: str):
        self.bar = None
        if stream is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=min(done, total), file=stream,
                            unit="sample", unit_scale=True, dynamic_ncols=True, desc=label)

    def update(self, done: int, **postfix: str) -> None:
        if self.bar is not None:
            self.bar.update(min(done, self.bar.total) - self.bar.n)
            if postfix:
                self.bar.set_postfix(**postfix)

    def close(self) -> None:
        """End the bar's line (before an error line, or the bar would overwrite its start)."""
        if self.bar is not None:
            self.bar.close()


def host_record() -> dict[str, Any]:
    """Where a rank ran: the host's name and the cores this process may use (the simulator's
    measured cluster needs to know whether ranks shared cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"name": platform.node(), "cores": int(cores or 1)}


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
             if k not in ("epoch", "step", "samples", "wall_s", "split")}
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
        # Waiting at evaluations and checkpoints for the other ranks (part of idle_s).
        "milestones": per_rank[0]["milestones"],
        # Steps whose update was dropped for a non-finite loss (skip_batch).
        "skipped_batches": [report["skipped_batches"] for report in per_rank],
        # Algorithm-specific numbers per rank (exchanges, staleness...).
        "algo_stats": {name: [stats.get(name) for stats in algo_stats]
                       for name in sorted({k for st in algo_stats for k in st})},
    }
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
                          status: str = "failed") -> None:
    """summary.json of a job that ended without a summary of its own (a rank failed or died,
    or a second Ctrl-C stopped it at once): ``status``, the exit status and the checkpoint to
    resume from, so that a script scanning run dirs sees every run's outcome; and its
    TensorBoard hparams session, with the last evaluation's metrics. A summary the ranks
    wrote in this session is kept (then they got far enough to say more)."""
    from torch.utils.tensorboard.writer import FileWriter

    from .checkpoint_files import complete_checkpoints

    if session_summary(run_dir) is not None:
        return
    checkpoints = complete_checkpoints(run_dir)
    evals = [r for r in read_metrics(run_dir) if r.get("split") == "eval"]
    nprocs = cfg.launcher.nprocs
    write_json_atomic(Path(run_dir) / "summary.json", {
        "status": status, "exit_status": exit_status, "algo": cfg.algo.name,
        "recipe": cfg.recipe.name, "nprocs": nprocs,
        "checkpoint": str(checkpoints[-1].path) if checkpoints else None,
        "last_eval": evals[-1] if evals else None, "logs": str(Path(run_dir) / "logs"),
        "restarts": read_restarts(run_dir)})
    last = {k: v for k, v in (evals[-1] if evals else {}).items()
            if k not in ("epoch", "step", "samples", "split")}
    writer = FileWriter(str(Path(run_dir) / "tb"))
    write_session_start(writer, hparams_of(cfg))  # none if the run died before
    write_session_end(writer, last, status)
    writer.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# Keys of summary["final"] that are not the recipe's metric.
NOT_METRICS = {"loss", "consensus_distance", "lr"}


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
    if isinstance(consensus, (int, float)) and consensus > 0:
        parts.append(f"consensus distance {consensus:.3g}")
    return "; ".join(parts) or None


def results_table(run_dir: str | Path) -> str:
    """A short console table of the evaluations and the final summary of one run."""
    rows = [r for r in read_metrics(run_dir) if r.get("split") == "eval"]
    summary_path = Path(run_dir) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    metric_keys = [k for k in ("top1", "top5", "wer", "wer_swb", "wer_ch")
                   if any(k in r for r in rows)]
    header = ["epoch", "step", "wall_s", "loss", *metric_keys]
    lines = ["  ".join(f"{h:>9}" for h in header)]
    for r in rows:
        cells = [f"{r['epoch']:9.2f}", f"{r['step']:9d}", f"{r['wall_s']:9.1f}",
                 f"{r['loss']:9.4f}"] + [f"{r.get(k, float('nan')):9.2f}" for k in metric_keys]
        lines.append("  ".join(cells))
    if summary:
        lines.append(
            f"{summary.get('algo')} on {summary.get('recipe')}, {summary.get('nprocs')} ranks: "
            f"{summary.get('samples_per_s', 0):.0f} samples/s, status {summary.get('status')}, "
            f"run dir {run_dir}")
        replicas = replicas_line(summary)
        if replicas:
            lines.append(replicas)
    return "\n".join(lines)
