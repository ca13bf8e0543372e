"""Elastic training across hosts when a host falls silent: its link cut, or every process on
it stopped (a hung host). No MPI notices either; the launcher's loss detector does
(runner/launch/loss_detector.py), and the survivors go on.

For each algorithm, on the lab (scripts/lab_cluster.sh, 1 Gbit/s links): 4 learners of the
digit images, 2 on lab1 and 2 on lab2 (hadpsgd: each host a super learner), elastic, no
spares; once a third of the sample budget is done, lab2 goes silent (``cut``: its link down;
``hang``: SIGSTOP to every process in its namespace, MPI's daemon included). Measured: seconds
from the fault to the launcher's decision (the "silent" event), and to training again (the
survivors' "lost" event, written when they train on); the held-out metric against the same
job uninterrupted; that every lockstep epoch used each sample once. Needs root::

    python benchmarks/bench_silent_host.py --json docs/results/lab/silent_host.json
    python benchmarks/bench_silent_host.py --algos ssgd adpsgd --faults cut
    python benchmarks/bench_silent_host.py --quick    # ssgd, a cut link, 2 epochs: wiring
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from benchmarks.bench_elastic import (  # noqa: E402
    ONCE_CELL,
    every_sample_once,
    start,
    wait,
    wait_for_a_third,
)
from benchmarks.bench_network import lab, lab_with  # noqa: E402

NAME = "silent_host"
SILENT = "lab2"
FAULTS = ["cut", "hang"]
ALGOS = ["ssgd", "dpsgd", "adpsgd", "hadpsgd", "sgp", "choco", "diloco"]
FULL = {"algos": ALGOS, "faults": FAULTS, "epochs": 6}
QUICK = {"algos": ["ssgd"], "faults": ["cut"], "epochs": 2}
MD_HEADER = ("| date | algorithm | fault | fault to decision | fault to training | learners at "
             "end | top-1 uninterrupted / after | every sample once |\n" + "|---" * 8 + "|\n")


def namespace_pids(host: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True)
    return [int(pid) for pid in done.stdout.split()]


def silence(fault: str) -> None:
    if fault == "cut":
        lab("link", SILENT, "down")
    else:
        for pid in namespace_pids(SILENT):
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass


def heal(fault: str) -> None:
    """The host answers again: its link up, or its processes killed and let go (a stopped
    process would outlive the job)."""
    if fault == "cut":
        lab("link", SILENT, "up")
        return
    pids = namespace_pids(SILENT)
    for sig in (signal.SIGKILL, signal.SIGCONT):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def faulted_run(run_dir: Path, algo: str, fault: str, args: argparse.Namespace,
                overrides: list[str]) -> dict:
    job = start(run_dir, algo, args.epochs, True, *overrides)
    try:
        wait_for_a_third(job, run_dir, args.epochs, args.timeout, f"the {fault}")
        silence(fault)
        fault_at = time.time()
        try:
            summary = wait(job, run_dir, args.timeout)
        finally:
            heal(fault)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    events = [json.loads(line) for line in
              (run_dir / "logs" / "events.jsonl").read_text().splitlines()]
    first = {kind: min((e["time"] for e in events if e["event"] == kind), default=None)
             for kind in ("silent", "lost")}
    return {"fault": fault, "summary": summary,
            **{f"fault_to_{name}_s": None if first[kind] is None else
               round(first[kind] - fault_at, 3)
               for kind, name in (("silent", "decision"), ("lost", "training"))}}


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_silent_host.py", args.argv, args.quick)
    hosts, shell, rates = lab_with(2, "1gbit")
    for host in hosts[:2]:
        lab("link", host, "up")
        lab("rate", host, "1gbit")
    hostfile = args.runs / "hosts"
    hostfile.parent.mkdir(parents=True, exist_ok=True)
    hostfile.write_text("lab1 slots=2\nlab2 slots=2\n")
    overrides = [f"launcher.hostfile={hostfile}", f"launcher.remote_shell={shell}",
                 "launcher.procs_per_node=2"]
    cases = []
    try:
        for algo in args.algos:
            root = args.runs / algo
            plain = wait(start(root / "uninterrupted", algo, args.epochs, True, *overrides),
                         root / "uninterrupted", args.timeout)
            for fault in args.faults:
                run = faulted_run(root / fault, algo, fault, args, overrides)
                summary = run.pop("summary")
                cases.append({"algo": algo, **run, "learners_at_end": summary["learners_at_end"],
                              "uninterrupted_top1": plain["top1"], "top1": summary["top1"],
                              "every_sample_once": every_sample_once(summary)})
                print(f"{algo}, {fault}: decided {run['fault_to_decision_s']} s, training "
                      f"again {run['fault_to_training_s']} s, top-1 {plain['top1']:.2f} -> "
                      f"{summary['top1']:.2f}", file=sys.stderr, flush=True)
    finally:
        for host in hosts[:2]:
            lab("rate", host, rates[host])
    return record.finish({"cases": cases, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    once = ONCE_CELL
    return [f"| {r['date'][:10]} | {c['algo']} | {c['fault']} | "
            f"{seconds(c['fault_to_decision_s'])} | {seconds(c['fault_to_training_s'])} | "
            f"{c['learners_at_end']} | {c['uninterrupted_top1']:.2f} / {c['top1']:.2f} | "
            f"{once[c['every_sample_once']]} |" for c in r["cases"]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_common_arguments(parser, NAME, timeout_s=600)
    parser.add_argument("--algos", nargs="+", choices=ALGOS,
                        help=f"default: {' '.join(ALGOS)}; --quick: ssgd")
    parser.add_argument("--faults", nargs="+", choices=FAULTS, help="default: cut hang; "
                        "--quick: cut")
    parser.add_argument("--epochs", type=int, help="default: 6; --quick: 2")
    args = parser.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_silent_host", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
