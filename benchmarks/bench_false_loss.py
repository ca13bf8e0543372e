"""No false loss on a loaded machine: elastic runs across two lab hosts beside busy processes.

The loss detector (runner/launch/loss_detector.py) takes a learner for lost after about a
second of silence on a quiet network. A learner that is only slow, on a host whose cores are
busy, must never be taken for lost: this runs ``--count`` elastic jobs of the digit images
(D-PSGD, one learner on lab1 and one on lab2, the detector's defaults), ``--at-once`` at a time
so that they also load each other, beside ``--hogs`` processes spinning on the cores
(scripts/under_load.py). Counted: runs in which any learner was taken for lost (a "silent"
event, a membership change, a run not completed on both learners), and each learner's
closest call (logs/heartbeats.json: its longest silence against the threshold in force).
Needs root (the lab's network namespaces)::

    python benchmarks/bench_false_loss.py --json docs/results/lab/false_loss.json  # 20 runs
    python benchmarks/bench_false_loss.py --quick    # 2 runs of 2 epochs: wiring
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from benchmarks.bench_elastic import stop  # noqa: E402
from benchmarks.bench_network import lab, lab_with  # noqa: E402
from runner.errors import UserError  # noqa: E402
from runner.launch.watchdog import HEARTBEATS  # noqa: E402
from runner.runlog.failure_events import read_events  # noqa: E402

NAME = "false_loss"
BIN = Path(sys.executable).parent
FULL = {"count": 20, "epochs": 4, "at_once": 2, "hogs": 2}
QUICK = {"count": 2, "epochs": 2, "at_once": 2, "hogs": 2}
MD_HEADER = ("| date | runs x epochs | at once | busy processes | false losses | runs completed "
             "on both learners | closest call (gap / threshold) |\n" + "|---" * 7 + "|\n")


def start(run_dir: Path, epochs: int, overrides: list[str]) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.stderr", "w") as stderr:  # the job has its own
        return subprocess.Popen(
            [str(BIN / "adpsgd-run"), "recipe=digit_images", "algo=dpsgd", "launcher.nprocs=2",
             "launcher.procs_per_node=1", "launcher.elastic=true", f"trainer.epochs={epochs}",
             "trainer.progress=false", *overrides, f"hydra.run.dir={run_dir}"],
            cwd=run_dir.parent, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True)


def judged(run_dir: Path, returncode: int, wall_s: float) -> dict:
    """One run's verdict from what it wrote."""
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    events = read_events(run_dir)
    try:
        calls = json.loads((run_dir / HEARTBEATS).read_text())["closest_calls"]
    except (OSError, ValueError, KeyError):  # none written (a failed run), or unreadable
        calls = {}
    silent = [e["learner"] for e in events if e.get("event") == "silent"]
    completed = (returncode == 0 and summary.get("status") == "completed"
                 and summary.get("learners_at_end") == 2)
    return {"run": run_dir.name, "returncode": returncode, "wall_s": round(wall_s, 1),
            "completed_on_both": completed, "silent": silent,
            "membership": summary.get("membership") or [],
            "false_loss": bool(silent or summary.get("membership") or not completed),
            "closest_calls": calls, "top1": summary.get("top1")}


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_false_loss.py", args.argv, args.quick)
    hosts, shell, rates = lab_with(2, "1gbit")
    for host in hosts[:2]:
        lab("link", host, "up")
        lab("rate", host, "1gbit")
    args.runs.mkdir(parents=True, exist_ok=True)
    hostfile = args.runs / "hosts"
    hostfile.write_text("lab1 slots=1\nlab2 slots=1\n")
    overrides = [f"launcher.hostfile={hostfile}", f"launcher.remote_shell={shell}"]
    hogs = subprocess.Popen([str(BIN / "python"), str(REPO / "scripts" / "under_load.py"),
                             "--hogs", str(args.hogs), "--max-s", str(args.timeout * args.count),
                             "--", "sleep", str(args.timeout * args.count)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: list[dict] = []
    jobs: list[subprocess.Popen] = []
    try:
        dirs = [args.runs / f"run{i}" for i in range(args.count)]
        for group in (dirs[i:i + args.at_once] for i in range(0, len(dirs), args.at_once)):
            started = time.monotonic()
            jobs = [start(run_dir, args.epochs, overrides) for run_dir in group]
            deadline = started + args.timeout
            for run_dir, job in zip(group, jobs):
                try:
                    job.wait(timeout=max(deadline - time.monotonic(), 1))
                except subprocess.TimeoutExpired:
                    raise UserError(f"{run_dir.name} ran over {args.timeout:.0f} s",
                                    "raise --timeout on a slow machine") from None
                runs.append(judged(run_dir, job.returncode, time.monotonic() - started))
                verdict = "FALSE LOSS" if runs[-1]["false_loss"] else "no loss"
                print(f"{run_dir.name}: {verdict}, {runs[-1]['wall_s']} s",
                      file=sys.stderr, flush=True)
    finally:
        for job in jobs:  # a time-out or Ctrl-C: no run goes on in its own session
            stop(job)
        # SIGINT: under_load.py stops and reaps its busy processes (SIGTERM would end it
        # before it does, and their CPU time would be nobody's: make test's profile missed it)
        hogs.send_signal(signal.SIGINT)
        hogs.wait(timeout=30)
        for host in hosts[:2]:
            lab("rate", host, rates[host])
    calls = [call for run in runs for call in run["closest_calls"].values()]
    closest = max(calls, key=lambda call: call["share"], default=None)
    return record.finish({
        "count": args.count, "epochs": args.epochs, "at_once": args.at_once,
        "hogs": args.hogs, "false_losses": sum(run["false_loss"] for run in runs),
        "completed_on_both": sum(run["completed_on_both"] for run in runs),
        "closest_call": closest, "runs": runs, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    closest = r["closest_call"]
    call = "-" if closest is None else (f"{closest['gap_s']:.2f} s / {closest['threshold_s']:.2f}"
                                        f" s ({closest['share']:.2f})")
    return [f"| {r['date'][:10]} | {r['count']} x {r['epochs']} | {r['at_once']} | {r['hogs']} "
            f"| {r['false_losses']} | {r['completed_on_both']} of {r['count']} | {call} |"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_common_arguments(parser, NAME, timeout_s=300)
    parser.add_argument("--count", type=int, help="runs (default 20; --quick: 2)")
    parser.add_argument("--epochs", type=int, help="epochs per run (default 4; --quick: 2)")
    parser.add_argument("--at-once", type=int, help="runs started together (default 2)")
    parser.add_argument("--hogs", type=int, help="busy processes beside them (default 2)")
    args = parser.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_false_loss", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
