"""Kill -9 one rank of a running job and measure how long the job takes to end.

For each algorithm and world size, ``adpsgd-run`` trains the digit images (many epochs, a
checkpoint every few steps); once the first checkpoint is complete, one rank gets SIGKILL
(what the out-of-memory killer sends). Measured from the kill: when the launcher has printed
its verdict naming the dead rank, and when ``adpsgd-run`` has exited. Also checked: no rank
process is left, and the newest complete checkpoint still loads::

    python scripts/bench_dead_rank.py --json dead_rank.json
    python scripts/bench_dead_rank.py --algos ssgd dasgd --nprocs 2

tests/test_dead_rank.py runs the same function on every case.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent
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
    found = subprocess.run(["pgrep", "-f", f"runner.worker {run_dir}"], capture_output=True,
                           text=True)
    return [int(pid) for pid in found.stdout.split()]


def newest_checkpoint_loads(run_dir: Path) -> str | None:
    """The newest complete checkpoint if every rank's file loads, else None."""
    import torch

    from runner.checkpoint_files import complete_checkpoints, load_rank_state

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
                raise RuntimeError(f"{name}: the moment to kill never came:\n"
                                   f"{stderr_path.read_text()[-2000:]}")
            time.sleep(0.05)
        if victim_process == "mpiexec":
            pid = int(subprocess.run(["pgrep", "-P", str(job.pid), "mpiexec"],
                                     capture_output=True, text=True).stdout.split()[0])
        else:
            pid = int((run_dir / "logs" / f"rank{victim}.pid").read_text().split()[0])
        os.kill(pid, signum)
        killed = time.monotonic()
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
            "verdict_s": verdict_s, "exit_s": exit_s, "stderr": text,
            "leftover_pids": worker_pids(run_dir),
            "checkpoint": newest_checkpoint_loads(run_dir), "run_dir": str(run_dir)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=sorted({a for a, _ in CASES}))
    parser.add_argument("--nprocs", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--work-dir", default="runs/bench/dead_rank")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    work_dir = Path(args.work_dir).absolute()
    work_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for algo in args.algos:
        for nprocs in args.nprocs:
            victim, overrides = CASES[(algo, nprocs)]
            result = kill_one_rank(work_dir, algo, nprocs, victim, overrides)
            result.pop("stderr")
            results.append(result)
            print(f"{algo:8s} x{nprocs}: rank {victim} killed; named after "
                  f"{result['verdict_s']:.2f} s, adpsgd-run exited after {result['exit_s']:.2f}"
                  f" s (status {result['status']}), leftovers {result['leftover_pids']}, "
                  f"checkpoint {'loads' if result['checkpoint'] else 'MISSING'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
