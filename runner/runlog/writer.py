"""Rank 0's writer for what an evaluation leaves: TensorBoard events (tb/) and metrics.jsonl;
the run's hparams session; summary.json at the end (its content: runner/runlog/summary.py).

TensorBoard's tags: train/*, eval/*, by_samples/* (step: global samples, so runs of other
sizes line up), time/* (mean and per rank), algo/* per rank, the config as text, the
custom-scalars layout and the hparams session.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from .failure_events import write_events_text
from .learner_times import learner_times
from .records import drop_torn_tail, finite_json, write_json_atomic

# Tags whose step is the global sample count (runs of other sizes line up), not the step.
SAMPLES_AXIS = ("by_samples/", "membership/")


def forget_events_after(tb_dir: Path, step: int, samples: int) -> None:
    """Drop from ``tb_dir``'s event files what was written past ``step`` (past ``samples``
    for the tags against global samples): a resumed run, or one gone back to a checkpoint,
    writes those points again. TensorBoard's own purge_step cannot do it: it hides every
    tag's events at or past one step, which drops the whole history of the tags against
    samples. The events left are written again, in order, into the oldest file."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    files = sorted(tb_dir.glob("events.out.tfevents.*"))
    kept: list[bytes] = []  # records as written (the loader that parses them converts them)
    dropped = False
    for path in files:
        for record in RawEventFileLoader(str(path)).Load():  # a torn last record ends a file
            event = Event.FromString(record)
            if event.HasField("file_version") and kept:  # one, at the start
                continue
            if event.HasField("summary"):
                values = [v for v in event.summary.value if event.step <= (
                    samples if v.tag.startswith(SAMPLES_AXIS) else step)]
                if len(values) < len(event.summary.value):
                    dropped = True
                    if not values:
                        continue
                    del event.summary.value[:]
                    event.summary.value.extend(values)
                    record = event.SerializeToString()
            kept.append(record)
    if not dropped and len(files) < 2:
        return
    tmp = tb_dir / ".rewritten.tmp"  # no "tfevents" in its name: TensorBoard never reads it
    with open(tmp, "wb") as f:
        records = RecordWriter(f)
        for record in kept:
            records.write(record)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, files[0])  # the oldest name: read before the new session's file
    for path in files[1:]:
        path.unlink()


class RunLog:
    """Rank 0's writer for TensorBoard, metrics.jsonl and summary.json."""

    def __init__(self, run_dir: str | Path, cfg: Any, metric: str,
                 resume_at: tuple[int, int] | None = None):
        """``metric``: the recipe's held-out metric (charted in the custom-scalars layout).
        ``resume_at`` (a resumed run): the step and global samples it goes on from; the
        events an earlier session wrote past them are dropped (forget_events_after)."""
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        if resume_at is not None:
            forget_events_after(self.run_dir / "tb", *resume_at)
        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"))
        self.metrics_path = self.run_dir / "metrics.jsonl"
        drop_torn_tail(self.metrics_path)  # an earlier session's, cut by its end
        if resume_at is None:  # a resumed run has these in its first session's events
            self.writer.add_custom_scalars(custom_scalars_layout(metric))
            self.text("config", config_markdown(cfg), 0)
            write_session_start(self.writer._get_file_writer(), hparams_of(cfg))

    def restart_at(self, step: int, samples: int) -> None:
        """Going back in the same process (a simulated job to a checkpoint, an elastic job's
        undone step) to ``step`` and ``samples``: the events written after them go, as for a
        resumed run."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()
        forget_events_after(self.run_dir / "tb", step, samples)
        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def evaluation(self, record: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({k: finite_json(v) for k, v in record.items()}) + "\n")

    def rewrite_metrics(self, records: list[dict[str, Any]]) -> None:
        """metrics.jsonl as of a checkpoint (a resumed run drops what the interrupted session
        wrote after it, then appends as usual)."""
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            for record in records:
                f.write(json.dumps({k: finite_json(v) for k, v in record.items()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.metrics_path)

    def record_evaluation(self, results: dict[str, dict[str, float]], consensus: float,
                          per_rank: list[dict[str, Any]], where: dict[str, Any],
                          examples: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
        """One evaluation: a metrics.jsonl row per split (``where``: epoch, step, samples,
        wall_s, train_s (wall less the evaluations and checkpoints so far), lr), its
        TensorBoard scalars, each rank's times and algorithm numbers, and
        the decoded examples; returns the rows (the run's history)."""
        step = where["step"]
        rows = evaluation_rows(results, consensus, where)
        for row, (split, metrics) in zip(rows, results.items()):
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
        sent = [report["bytes_sent"] for report in per_rank if report.get("bytes_sent")]
        if sent:  # bytes on the wire (runner/comm/traffic.py): per step, and in all by samples
            self.scalars({"comm/bytes_sent_per_step": float(np.mean([r["per_step"]
                                                                     for r in sent]))}, step)
            self.scalars({"by_samples/comm/bytes_sent": float(sum(r["total"] for r in sent))},
                         where["samples"])
        for rank, report in enumerate(per_rank):
            if report.get("bytes_sent"):
                self.scalars({f"comm/bytes_sent_per_step/rank{rank}":
                              report["bytes_sent"]["per_step"]}, step)
            # Per rank only the split itself (checkpoint and bookkeeping seconds are in
            # summary.json): 5 cards per rank rather than 8.
            self.scalars({f"time/{name}_s/rank{rank}": report["time"][name]
                          for name in TIME_SPLIT if name in report["time"]}, step)
            self.scalars({f"algo/{name}/rank{rank}": value
                          for name, value in report["algo"].items()}, step)
            # Which learner is slow: its own work and its waiting per step so far.
            self.scalars({f"learners/{name}/rank{rank}": value
                          for name, value in learner_times(report).items()
                          if name != "step_s"}, step)
        if examples:  # a markdown table: reference against hypothesis
            table = [f"| {utt} | {ref} | {hyp} |" for utt, ref, hyp in examples]
            self.text("eval/examples", "\n".join(
                ["| utterance | reference | hypothesis |", "|---|---|---|", *table]), step)
        return rows

    def summary(self, payload: dict[str, Any]) -> None:
        write_json_atomic(self.run_dir / "summary.json",
                          {k: finite_json(v) for k, v in payload.items()})

    def finish(self, summary: dict[str, Any]) -> None:
        """summary.json, and the hparams session's metrics and status (a stopped or preempted
        run's too: its metrics are those of its last evaluation)."""
        write_session_end(self.writer._get_file_writer(), {
            **summary["final"], "samples_per_s": summary.get("samples_per_s"),
            "wall_s": summary.get("wall_s")}, summary["status"])
        write_events_text(self.writer._get_file_writer(), summary.get("events") or [],
                          summary.get("steps") or 0)
        self.summary(summary)
        self.close()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


# The time split TensorBoard shows (per rank and as the mean over ranks).
TIME_SPLIT = ("compute", "comm", "idle", "data", "eval")


def evaluation_rows(results: dict[str, dict[str, float]], consensus: float,
                    where: dict[str, Any]) -> list[dict[str, Any]]:
    """An evaluation's metrics.jsonl rows (and the run's history), one per split."""
    return [{"epoch": where["epoch"], "step": where["step"], "samples": where["samples"],
             "wall_s": where["wall_s"], "train_s": where.get("train_s"), "split": split,
             **metrics, "consensus_distance": consensus, "lr": where["lr"]}
            for split, metrics in results.items()]


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
            "bytes sent per step": ["Multiline", ["^comm/bytes_sent_per_step$"]],
        },
        "by global samples": {
            f"held-out {metric}": ["Multiline", [f"^by_samples/eval/{metric}$"]],
            "held-out loss": ["Multiline", ["^by_samples/eval/loss$"]],
            "bytes sent (all ranks)": ["Multiline", ["^by_samples/comm/bytes_sent$"]],
        },
        # One small chart per split (cumulative seconds, mean over ranks): in a single chart
        # the five lines of a run share its colour and cannot be told apart.
        "time split": {f"{name} s": ["Multiline", [f"^time/{name}_s$"]]
                       for name in TIME_SPLIT},
        # Which learner is slow: one line per rank (runner/runlog/learner_times.py).
        "learners": {"own work per step (s)": ["Multiline", [r"^learners/compute_s/rank\d+$"]],
                     "waiting per step (s)": ["Multiline", [r"^learners/wait_s/rank\d+$"]]},
    }


def config_markdown(cfg: Any) -> str:
    """The composed config as a YAML code block (TensorBoard's text plugin renders markdown)."""
    from omegaconf import OmegaConf

    return f"```yaml\n{OmegaConf.to_yaml(cfg)}```"


def hparams_of(cfg: Any) -> dict[str, Any]:
    """What a run's hparams entry is filtered and sorted by: the algorithm with its own
    options (``algo.*``), the topology, the layout of ranks, how models travel, the batch and
    the rate."""
    algo = {f"algo.{k}": v for k, v in cfg.algo.items()
            if k != "name" and isinstance(v, (int, float, str, bool))}
    return {"recipe": cfg.recipe.name, "algo": cfg.algo.name, **algo,
            "topology": cfg.topology.name, "launcher": cfg.launcher.name,
            "nprocs": cfg.launcher.nprocs,
            "launcher.procs_per_node": cfg.launcher.get("procs_per_node"),
            "comm.backend": cfg.comm.backend,
            # The dtype models travel in (the model's own when unset).
            "comm.exchange_dtype": cfg.comm.get("exchange_dtype") or cfg.trainer.dtype,
            "trainer.batch_size": cfg.trainer.batch_size,
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
