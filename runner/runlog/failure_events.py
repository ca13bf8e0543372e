"""A job's failures as events: which learner on which host, doing what, when.

The launcher (runner/launch/) records one event per failed job in ``logs/events.jsonl``: a
rank that died, stalled (no heartbeat), gave up on a peer, or failed with a line of its own;
mpiexec killed from outside. A restart keeps the earlier ones. summary.json repeats them as
``events`` and TensorBoard's text panel shows them as a table (tag ``events``), so that the
monitoring names a hung or dead peer too, not only the terminal.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EVENTS = Path("logs") / "events.jsonl"
# ``time`` is Unix seconds (a float) in every event, a failure's or an elastic job's change.
COLUMNS = ("time", "event", "learner", "host", "operation", "at_samples", "cause")


def record_event(run_dir: str | Path, event: dict[str, Any]) -> None:
    """Append ``event`` (keys: COLUMNS) to the run's events; never raises (it runs on the
    way out of a failure, perhaps on a full disk)."""
    path = Path(run_dir) / EVENTS
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({key: event.get(key) for key in COLUMNS}) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        pass


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's events so far, oldest first; a line that does not parse (a write cut by a
    crash) is left out."""
    path = Path(run_dir) / EVENTS
    try:
        lines = path.read_text(errors="replace").splitlines()  # a flipped byte: one bad line
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def cell(key: str, value: Any) -> str:
    """A table cell: ``time`` (Unix seconds) as local time to the second."""
    if value is None:
        return "-"
    if key == "time" and isinstance(value, (int, float)):
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value))
    return str(value).replace("|", "/")


def events_markdown(events: list[dict[str, Any]]) -> str:
    """The events as a markdown table (TensorBoard's text panel renders it)."""
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for event in events:
        cells = [cell(key, event.get(key)) for key in COLUMNS]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_events_text(writer: Any, events: list[dict[str, Any]], step: int) -> None:
    """The events table into a TensorBoard FileWriter (SummaryWriter's or the launcher's)."""
    from torch.utils.tensorboard.summary import text

    if events:
        writer.add_summary(text("events", events_markdown(events)), step)
