"""What a user waits for before and around training: ``adpsgd-run --help``, the imports every
rank pays, and a small job's time split into its phases.

    python benchmarks/bench_startup.py --json docs/results/startup.json
    python benchmarks/bench_startup.py --quick     # seconds: checks the wiring only

A job's phases come from the clock of each process: ``launcher`` is adpsgd-run's start to the
line it prints as it hands over to mpiexec (composing, validating, preparing the data),
``ranks_start`` from there to rank 0's first log line (mpiexec, Python, torch, MPI_Init, the
recipe's data and model; torch loaded once, by the rank factory, except in the ``cold`` jobs,
``launcher.warm_start=false``), ``training`` to its "finished" line, ``ending`` to
adpsgd-run's exit.
Every time is the median of ``--repeats`` runs; the CPU seconds are the job's processes' own
(user + system, the launcher and every rank).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from runner.errors import UserError, one_line  # noqa: E402
from runner.rank_factory import SHARED_FACTORY  # noqa: E402

NAME = "startup"
BIN = Path(sys.executable).parent
FULL = {"repeats": 5, "nprocs": [2, 4]}
QUICK = {"repeats": 1, "nprocs": [2]}
JOB = ["recipe=digit_images", "algo=ssgd", "trainer.epochs=1", "trainer.progress=false"]
# What a rank imports, beyond the interpreter (runner/rank.py and what it loads to train).
RANK_IMPORTS = "import torch, mpi4py.MPI, runner.rank, runner.trainer, recipes"
MD_HEADER = ("| date | what | median s | CPU s | note |\n|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    p.add_argument("--repeats", type=int, help=f"runs of each measure (default "
                                                 f"{FULL['repeats']})")
    p.add_argument("--nprocs", type=int, nargs="+", help="ranks of the small job (default 2 4)")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def timed(command: list[str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the command and every process it waited for, result)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise UserError(f"{' '.join(command)} exited {proc.returncode}: "
                        f"{one_line(proc.stderr)}", "run it alone to see why")
    return wall, cpu, proc


def log_time(line: str) -> float:
    """The epoch seconds of a rank log line ("2026-11-29 08:06:11,123 rank0@vm INFO ...")."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def job_phases(root: Path, nprocs: int, index: int, warm: bool = True) -> dict[str, float]:
    """One small job through adpsgd-run, timed by phase (see the module docstring); its ranks
    forked from a rank factory (``warm``, the default) or each loading torch."""
    run_dir = root / f"job-{nprocs}-{index}-{'warm' if warm else 'cold'}"
    command = [str(BIN / "adpsgd-run"), *JOB, f"launcher.nprocs={nprocs}",
               f"launcher.warm_start={str(warm).lower()}", f"hydra.run.dir={run_dir}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start_wall, start = time.time(), time.perf_counter()
    # The job's own factory, as a user's first job has, not one shared by a caller's jobs.
    env = {name: value for name, value in os.environ.items() if name != SHARED_FACTORY}
    proc = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    handed_over = None
    for line in proc.stdout:  # "adpsgd-run: ssgd on digit_images with 2 rank(s); run dir ..."
        if handed_over is None and re.match(r"adpsgd-run: \w+ on \w+ with \d+ rank", line):
            handed_over = time.time()
    err = proc.stderr.read()
    status = proc.wait()
    end = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if status != 0 or handed_over is None:
        raise UserError(f"{' '.join(command)} exited {status}: {one_line(err)}",
                        "run it alone to see why")
    log = (run_dir / "logs" / "rank0.log").read_text().splitlines()
    first = log_time(log[0])
    finished = log_time(next(line for line in log if line.endswith("rank 0 finished")))
    end_wall = start_wall + (end - start)
    return {"launcher_s": handed_over - start_wall, "ranks_start_s": first - handed_over,
            "training_s": finished - first, "ending_s": end_wall - finished,
            "total_s": end - start,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(bench.median([r[key] for r in runs]), 3) for key in runs[0]}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record(NAME, "benchmarks/bench_startup.py", args.argv, args.quick)
    root = Path(args.runs).absolute()
    root.mkdir(parents=True, exist_ok=True)
    python = [sys.executable, "-c"]
    floors = {"python": [*python, "pass"], "import_torch": [*python, "import torch"],
              "rank_imports": [*python, RANK_IMPORTS], "help": [str(BIN / "adpsgd-run"),
                                                                "--help"]}
    results: dict[str, Any] = {}
    for name, command in floors.items():
        runs = [timed(command, root)[:2] for _ in range(args.repeats)]
        results[name] = {"wall_s": round(bench.median([w for w, _ in runs]), 3),
                         "cpu_s": round(bench.median([c for _, c in runs]), 3)}
        print(f"{name}: {results[name]}", flush=True)
    results["job"], results["job_cold"] = {}, {}
    for nprocs in args.nprocs:
        # Warm and cold in turn, so that a machine's drift reaches both alike.
        runs = [(job_phases(root, nprocs, i), job_phases(root, nprocs, i, warm=False))
                for i in range(args.repeats)]
        for key, which in (("job", 0), ("job_cold", 1)):
            results[key][str(nprocs)] = medians([pair[which] for pair in runs])
            print(f"{key} on {nprocs} rank(s): {results[key][str(nprocs)]}", flush=True)
    return record.finish({"job_overrides": JOB, "repeats": args.repeats, "results": results,
                          "run_dirs": str(root)})


def markdown_rows(r: dict[str, Any]) -> list[str]:
    date, res = r["date"][:10], r["results"]
    rows = [f"| {date} | {name} | {res[name]['wall_s']:.2f} | {res[name]['cpu_s']:.2f} | |"
            for name in ("python", "import_torch", "rank_imports", "help")]
    jobs = [(f"job on {n} rank(s)", job) for n, job in res["job"].items()]
    jobs += [(f"job on {n} rank(s), cold (launcher.warm_start=false)", job)
             for n, job in res.get("job_cold", {}).items()]
    for what, job in jobs:
        rows.append(f"| {date} | {what} | {job['total_s']:.2f} | "
                    f"{job['cpu_s']:.2f} | launcher {job['launcher_s']:.2f}, ranks start "
                    f"{job['ranks_start_s']:.2f}, training {job['training_s']:.2f}, ending "
                    f"{job['ending_s']:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write(NAME, args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
