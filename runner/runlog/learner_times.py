"""Which learner is slow: each learner's time per step, split into its own work and waiting.

DDP cannot say which rank held a step up: every rank waits in the same allreduce. Here every
rank times its own work (computing and loading batches) apart from waiting (communication not
hidden, idling for peers), so the slow learner is the one whose *own work* per step is
longest; in a lockstep run the others show the difference as waiting, in an asynchronous run
as more steps.
"""

from __future__ import annotations

import statistics
from typing import Any

# A learner whose own work per step is this many times the other learners' median is named at
# the end of the run.
SLOW_FACTOR = 1.5


def learner_times(report: dict[str, Any]) -> dict[str, float]:
    """Seconds per step of one rank's report (runner/runlog/summary.py's rank_report): its
    own work (``compute_s``: computing and loading batches), ``wait_s`` (communication not
    hidden, idle) and their sum ``step_s``."""
    seconds, steps = report["time"], max(int(report["steps"]), 1)
    work = seconds.get("compute", 0.0) + seconds.get("data", 0.0)
    wait = seconds.get("comm", 0.0) + seconds.get("idle", 0.0)
    return {"step_s": (work + wait) / steps, "compute_s": work / steps, "wait_s": wait / steps}


def learners_of(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """summary.json's ``learners``: per rank the number it was launched with (``learner``;
    another after an elastic run lost a learner), its node (hadpsgd's super learner), its
    host, steps and seconds per step."""
    return [{"rank": rank, "learner": report.get("learner", rank), "node": report.get("node"),
             "host": (report.get("host") or {}).get("name"),
             "steps": int(report["steps"]),
             **{name: round(value, 6) for name, value in learner_times(report).items()}}
            for rank, report in enumerate(per_rank)]


def slowest_learner_line(learners: list[dict[str, Any]]) -> str | None:
    """One line naming the slowest learner and its host when its own work per step is more
    than SLOW_FACTOR times the median of the other learners'; None otherwise (or for one
    learner)."""
    if len(learners) < 2:
        return None
    slowest = max(learners, key=lambda learner: learner["compute_s"])
    others = [learner for learner in learners if learner is not slowest]
    median = statistics.median(learner["compute_s"] for learner in others)
    if median <= 0 or slowest["compute_s"] <= SLOW_FACTOR * median:
        return None
    where = f" on host {slowest['host']}" if slowest.get("host") else ""
    wait = statistics.mean(learner["wait_s"] for learner in others)
    steps = statistics.median(learner["steps"] for learner in others)
    launched = slowest.get("learner", slowest["rank"])
    name = f"rank {slowest['rank']}" + (f" (learner {launched} as launched)"
                                        if launched != slowest["rank"] else "")
    return (f"slowest learner: {name}{where}, "
            f"{slowest['compute_s'] * 1e3:.1f} ms of its own work per step, "
            f"{slowest['compute_s'] / median:.1f}x the other learners' median "
            f"{median * 1e3:.1f} ms ({slowest['steps']} steps against their median {steps:g}; "
            f"they waited {wait * 1e3:.1f} ms per step)")
