"""What a run leaves behind: tb/ events, metrics.jsonl, summary.json, and the console table.

Only rank 0 writes. Layout of a run dir (the interface contract):

* ``tb/``            TensorBoard events: train/*, eval/*, time/*/rank<N>, hparams
* ``metrics.jsonl``  one JSON object per evaluation (epoch, step, samples, wall_s, split, loss,
                     and top1/top5 or wer)
* ``summary.json``   final metrics, throughput, time split, consensus distance, status
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


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

    def __init__(self, run_dir: str | Path, purge_step: int | None = None):
        """``purge_step`` (a resumed run): TensorBoard hides this run dir's earlier events at
        that step and after, which the interrupted session wrote past its checkpoint."""
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge_step)
        self.metrics_path = self.run_dir / "metrics.jsonl"

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

    def hparams(self, params: dict[str, Any], final_metrics: dict[str, float]) -> None:
        """One hparams entry in tb/ itself (SummaryWriter.add_hparams would open a subdir)."""
        from torch.utils.tensorboard.summary import hparams

        clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v)
                 for k, v in params.items()}
        metrics = {f"hparam/{k}": v for k, v in final_metrics.items()
                   if isinstance(v, (int, float)) and math.isfinite(v)}
        experiment, session_start, session_end = hparams(clean, metrics)
        file_writer = self.writer._get_file_writer()
        for summary in (experiment, session_start, session_end):
            file_writer.add_summary(summary)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value)

    def summary(self, payload: dict[str, Any]) -> None:
        write_json_atomic(self.run_dir / "summary.json",
                          {k: _finite(v) for k, v in payload.items()})

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def session_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """summary.json if the ranks of this session (since the run config was saved) wrote it."""
    path = Path(run_dir) / "summary.json"
    start = (Path(run_dir) / ".hydra" / "run.yaml").stat().st_mtime
    if path.exists() and path.stat().st_mtime >= start:
        return json.loads(path.read_text())
    return None


def write_failure_summary(run_dir: str | Path, algo: str, recipe: str, nprocs: int,
                          exit_status: int, status: str = "failed") -> None:
    """summary.json of a job that ended without a summary of its own (a rank failed or died,
    or a second Ctrl-C stopped it at once): ``status``, the exit status and the checkpoint to
    resume from, so that a script scanning run dirs sees every run's outcome. A summary the
    ranks wrote in this session is kept (then they got far enough to say more)."""
    from .checkpoint import complete_checkpoints

    if session_summary(run_dir) is not None:
        return
    checkpoints = complete_checkpoints(run_dir)
    evals = [r for r in read_metrics(run_dir) if r.get("split") == "eval"]
    write_json_atomic(Path(run_dir) / "summary.json", {
        "status": status, "exit_status": exit_status, "algo": algo, "recipe": recipe,
        "nprocs": nprocs, "checkpoint": str(checkpoints[-1].path) if checkpoints else None,
        "last_eval": evals[-1] if evals else None, "logs": str(Path(run_dir) / "logs")})


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    return "\n".join(lines)
