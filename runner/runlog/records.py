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

from ..errors import one_line

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


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
