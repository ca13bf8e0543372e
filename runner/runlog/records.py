"""The run dir's JSON records: metrics.jsonl (read back), logs/restarts.json, and the
atomic write that every JSON file of a run dir goes through (a crash leaves the old file or
the new one, never half of either)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from ..errors import UserError, one_line

# The launcher's record of the restarts of a run (launcher.max_restarts,
# runner/launch/restart_policy.py); summary.json repeats it as ``restarts``.
RESTARTS = Path("logs") / "restarts.json"
# The run's composed, validated config, written before any rank starts; ranks, restarts and
# a batch job's steps read it.
RUN_CONFIG = Path(".hydra") / "run.yaml"


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


def finite_json(value: Any) -> Any:
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


def drop_torn_tail(path: Path) -> None:
    """Cut a last line that has no newline (an append that a kill or a full disk cut short)
    off a JSON-lines file, so that the next append starts a line of its own."""
    try:
        with open(path, "r+b") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records. A last line without its newline that does not parse is an
    append that a kill or a full disk cut short: left out. Any other line that is not a JSON
    object is damage: UserError naming the file and the line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif not (number == len(lines) and not text.endswith("\n")):
            raise UserError(f"{path} line {number} is not a JSON record (the file is damaged)",
                            "restore the file, or delete that line")
    return records
