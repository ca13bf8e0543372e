"""Kill -9 one rank of a running job and measure how long the job takes to end.

For each algorithm and world size, ``adpsgd-run`` trains the digit images (many epochs, a
checkpoint every few steps); once the first checkpoint is complete, one rank gets SIGKILL
(what the out-of-memory killer sends). Measured from the kill: when the launcher has printed
its verdict naming the dead rank, and when ``adpsgd-run`` has exited. Also checked: no rank
process is left, and the newest complete checkpoint still loads::

    python benchmarks/bench_dead_rank.py --json docs/results/dead_rank.json
    python benchmarks/bench_dead_rank.py --algos ssgd dasgd --nprocs 2
    python benchmarks/bench_dead_rank.py --quick       # one 2-rank SSGD case: checks the wiring

tests/test_dead_rank.py runs the same function on every case.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runner.errors import UserError

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "dead_rank"
BIN = Path(sys.executable).parent
BOUND_S = 60  # the bound from a rank's death to the job's exit
CASES = {  # (algo, nprocs): (rank to kill, extra overrides)
    ("ssgd", 2): (1, []),
    ("ssgd", 4): (0, []),
    ("adpsgd", 2): (1, []),
    ("adpsgd", 4): (3, []),
    ("hadpsgd", 2): (1, ["launcher.procs_per_node=1"]),
    ("hadpsgd", 4): (2, ["launcher.procs_per_node=2"]),
    ("dasgd", 2): (0, []),
    ("dasgd", 4): (1, []),
}


def worker_pids(run_dir: Path) -> list[int]:
    """The job's processes still running: those with the run dir on their command line
    (mpiexec's, the job's own rank factory) and its ranks, by their pid files (a rank forked
    from a shared factory, runner/rank_factory.py, has the factory's command line)."""
    from runner.runlog.liveness import process_alive, rank_pid

    found = subprocess.run(["pgrep", "-f", f"runner.worker {run_dir}"], capture_output=True,
                           text=True)
    ranks = [rank_pid(run_dir, int(path.name.removeprefix("rank").split(".")[0]))
             for path in (run_dir / "logs").glob("rank*.pid")]
    return sorted({int(pid) for pid in found.stdout.split()} |
                  {pid for pid in ranks if pid and process_alive(pid)})


def newest_checkpoint_loads(run_dir: Path) -> str | None:
    """The newest complete checkpoint if every rank's file loads, else None."""
    import torch

    from runner.checkpoint.files import complete_checkpoints, load_rank_state

    found = complete_checkpoints(run_dir)
    if not found:
        return None
    for rank in range(found[-1].nprocs):
        state = load_rank_state(found[-1], rank)
        if not all(torch.isfinite(v).all() for v in state["model"].values()
                   if v.is_floating_point()):
            return None
    return str(found[-1].path)


def has_complete_checkpoint(run_dir: Path) -> bool:
    return bool(list((run_dir / "checkpoints").glob("samples-*/COMPLETE")))


def kill_one_rank(work_dir: Path, algo: str, nprocs: int, victim: int | None,
                  overrides: list[str], startup_timeout_s: float = 600,
                  ready: Callable[[Path], bool] = has_complete_checkpoint,
                  name: str | None = None, epochs: int = 200,
                  signum: int = signal.SIGKILL, victim_process: str = "rank") -> dict:
    """Start the job, send ``signum`` to rank ``victim`` (or, with ``victim_process=
    "mpiexec"``, to mpiexec itself) once ``ready(run_dir)`` (by default: once a checkpoint is
    complete), measure the end. SIGSTOP makes a hung rank instead of a dead one."""
    name = name or f"{algo}-{nprocs}"
    run_dir = work_dir / name
    stderr_path = work_dir / f"{name}.stderr"
    command = [str(BIN / "adpsgd-run"), "recipe=digit_images", f"algo={algo}",
               f"launcher.nprocs={nprocs}", f"trainer.epochs={epochs}",
               "trainer.checkpoint_every=4", "trainer.progress=false",
               f"hydra.run.dir={run_dir}", *overrides]
    with open(stderr_path, "w") as stderr:
        job = subprocess.Popen(command, cwd=work_dir, stdout=subprocess.DEVNULL,
                               stderr=stderr, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not ready(run_dir):
            if job.poll() is not None or time.monotonic() > deadline:
                lines = stderr_path.read_text().strip().splitlines() or ["(nothing)"]
                ended = (f"exited with status {job.returncode}" if job.poll() is not None
                         else f"ran {startup_timeout_s:.0f} s without one")
                raise UserError(f"{name}: the moment to kill a rank never came: adpsgd-run "
                                f"{ended}; its last line: {lines[-1]}",
                                f"read {stderr_path}; on a slow machine raise --timeout")
            time.sleep(0.05)
        if victim_process == "mpiexec":
            pid = int(subprocess.run(["pgrep", "-P", str(job.pid), "mpiexec"],
                                     capture_output=True, text=True).stdout.split()[0])
        else:
            pid = int((run_dir / "logs" / f"rank{victim}.pid").read_text().split()[0])
        os.kill(pid, signum)
        killed, killed_at = time.monotonic(), time.time()
        verdict_s = None
        while job.poll() is None and time.monotonic() - killed < 120:
            if verdict_s is None and "died without reporting" in stderr_path.read_text():
                verdict_s = time.monotonic() - killed
            time.sleep(0.02)
        exit_s = time.monotonic() - killed
        status = job.wait(timeout=5)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    text = stderr_path.read_text()
    verdict_s = verdict_s if verdict_s is not None else (
        exit_s if "died without reporting" in text else None)
    return {"algo": algo, "nprocs": nprocs, "killed_rank": victim, "pid": pid, "status": status,
            "verdict_s": verdict_s, "exit_s": exit_s, "killed_at": killed_at, "stderr": text,
            "leftover_pids": worker_pids(run_dir),
            "checkpoint": newest_checkpoint_loads(run_dir), "run_dir": str(run_dir)}


FULL = {"algos": sorted({a for a, _ in CASES}), "nprocs": [2, 4]}
QUICK = {"algos": ["ssgd"], "nprocs": [2]}
MD_HEADER = ("| date | algorithm | ranks | rank killed | named after | exited after | "
             "leftovers | checkpoint | load before/after |\n" + "|---" * 9 + "|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_common_arguments(parser, NAME, timeout_s=600)
    algos = sorted({a for a, _ in CASES})
    parser.add_argument("--algos", nargs="+", choices=algos,
                        help=f"default: {' '.join(FULL['algos'])}; --quick: ssgd")
    parser.add_argument("--nprocs", nargs="+", type=int, choices=sorted({n for _, n in CASES}),
                        help="default: 2 4; --quick: 2")
    args = parser.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_dead_rank.py", args.argv, args.quick)
    args.runs.mkdir(parents=True, exist_ok=True)
    cases = []
    for algo in args.algos:
        for nprocs in args.nprocs:
            victim, overrides = CASES[(algo, nprocs)]
            # --timeout bounds the wait for the first checkpoint (the moment to kill).
            result = kill_one_rank(args.runs, algo, nprocs, victim, overrides,
                                   startup_timeout_s=args.timeout)
            result.pop("stderr")
            result["held"] = (result["verdict_s"] is not None and result["exit_s"] < BOUND_S
                              and not result["leftover_pids"] and bool(result["checkpoint"]))
            cases.append(result)
            named = "never" if result["verdict_s"] is None else f"{result['verdict_s']:.2f} s"
            print(f"{algo:8s} x{nprocs}: rank {victim} killed; named after {named}, adpsgd-run "
                  f"exited after {result['exit_s']:.2f} s (status {result['status']}), "
                  f"leftovers {result['leftover_pids']}, checkpoint "
                  f"{'loads' if result['checkpoint'] else 'MISSING'}", file=sys.stderr,
                  flush=True)
    return record.finish({"bound_s": BOUND_S, "cases": cases,
                          "all_held": all(case["held"] for case in cases),
                          "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    return [f"| {r['date'][:10]} | {c['algo']} | {c['nprocs']} | {c['killed_rank']} | "
            f"{seconds(c['verdict_s'])} | {seconds(c['exit_s'])} | {len(c['leftover_pids'])} | "
            f"{'loads' if c['checkpoint'] else 'MISSING'} | "
            f"{r['load_before'][0]} / {r['load_after'][0]} |" for c in r["cases"]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_dead_rank", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
