"""Where the test suite's time goes, by file, from a JUnit XML report of ``make test``.

    make test PYTEST_ARGS="--durations=20 --junitxml=/tmp/suite.xml"
    python benchmarks/suite_profile.py /tmp/suite.xml [--top 30]

Per file: tests, the wall seconds of its tests (setup, call and teardown: a module's shared
job counts in its first test's setup), and the CPU seconds they used, the processes they
started and waited for included (tests/conftest.py records them as each test's ``cpu_s_*``
properties). On 2 cores a suite cannot take less wall time than half its CPU seconds, so the
CPU column is what a cut must lower; wall time well above CPU time is waiting (timeouts,
SLURM, the lab's links), which the pytest workers overlap.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def read_tests(report: Path) -> list[dict]:
    """One row per test case: file, name, wall seconds, CPU seconds, outcome."""
    rows = []
    for case in ET.parse(report).getroot().iter("testcase"):
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        cpu = sum(float(v) for k, v in properties.items() if k.startswith("cpu_s_"))
        outcome = next((child.tag for child in case
                        if child.tag in ("failure", "error", "skipped")), "passed")
        rows.append({"file": case.get("classname", "").split(".")[-1] + ".py",
                     "name": case.get("name", ""), "wall_s": float(case.get("time", 0)),
                     "cpu_s": cpu, "outcome": outcome,
                     "started_at": float(properties.get("started_at") or 0.0),
                     "worker": properties.get("worker", "")})
    return rows


def cores_busy(rows: list[dict], bin_s: float = 60.0) -> list[float]:
    """Cores in use in each ``bin_s`` of the suite: each test's CPU seconds spread evenly
    over its wall time (tests/conftest.py records when each started). Empty for a report
    without start times."""
    timed = [r for r in rows if r["started_at"] > 0]
    if not timed:
        return []
    start = min(r["started_at"] for r in timed)
    end = max(r["started_at"] + max(r["wall_s"], 1e-3) for r in timed)
    busy = [0.0] * (int((end - start) // bin_s) + 1)
    for row in timed:
        span = max(row["wall_s"], 1e-3)  # (a report's times have 3 decimals)
        first = row["started_at"] - start
        last, rate = first + span, row["cpu_s"] / span
        for b in range(int(first // bin_s), int(last // bin_s) + 1):
            overlap = min(last, (b + 1) * bin_s) - max(first, b * bin_s)
            busy[b] += rate * max(overlap, 0.0) / bin_s
    return busy


def workers_end(rows: list[dict]) -> dict[str, float]:
    """Seconds from the suite's start to each pytest worker's last test's end."""
    timed = [r for r in rows if r["started_at"] > 0]
    start = min((r["started_at"] for r in timed), default=0.0)
    ends: dict[str, float] = {}
    for row in timed:
        ends[row["worker"]] = max(ends.get(row["worker"], 0.0),
                                  row["started_at"] + row["wall_s"] - start)
    return dict(sorted(ends.items()))


def by_file(rows: list[dict]) -> list[dict]:
    totals: dict[str, dict] = defaultdict(lambda: {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
    for row in rows:
        total = totals[row["file"]]
        total["tests"] += 1
        total["wall_s"] += row["wall_s"]
        total["cpu_s"] += row["cpu_s"]
    return sorted(({"file": name, **t} for name, t in totals.items()),
                  key=lambda t: (-t["cpu_s"], -t["wall_s"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="pytest's --junitxml file")
    parser.add_argument("--top", type=int, default=20, help="how many tests to list by CPU")
    args = parser.parse_args(argv)
    rows = read_tests(args.report)
    files = by_file(rows)
    wall, cpu = sum(r["wall_s"] for r in rows), sum(r["cpu_s"] for r in rows)
    print(f"{len(rows)} tests, {wall:.0f} test-seconds of wall time, {cpu:.0f} CPU seconds\n")
    print("| file | tests | wall s | CPU s | CPU share |")
    print("|---|---|---|---|---|")
    for f in files:
        share = f["cpu_s"] / cpu if cpu else 0.0
        print(f"| {f['file']} | {f['tests']} | {f['wall_s']:.1f} | {f['cpu_s']:.1f} "
              f"| {share:.1%} |")
    if busy := cores_busy(rows):
        print("\nCores in use, minute by minute (the tests' CPU over their wall time): "
              + " ".join(f"{b:.1f}" for b in busy))
        print("Each worker's last test ended at: " + ", ".join(
            f"{w} {s:.0f} s" for w, s in workers_end(rows).items()))
    if args.top <= 0:
        return
    print(f"\nThe {args.top} tests that used the most CPU:\n")
    print("| test | wall s | CPU s |")
    print("|---|---|---|")
    for row in sorted(rows, key=lambda r: -r["cpu_s"])[:args.top]:
        print(f"| {row['file']}::{row['name']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} |")


if __name__ == "__main__":
    main()
