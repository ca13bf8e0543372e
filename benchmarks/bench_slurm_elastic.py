"""Elastic training under SLURM: a node lost mid-run, the others training again.

For each algorithm, the digit images on the lab's 4-node SLURM (scripts/slurm_local.sh up
--nodes 4: one slurmd per host of scripts/lab_cluster.sh; root), one rank per node,
``launcher=slurm launcher.elastic=true`` (srun --mpi=pmix, Open MPI 5 with ULFM; docs/slurm.md),
12 epochs of steps slowed by ``--delay-s``. Once a third of the sample budget is done, lab3 is
lost (``--faults``):

* ``node``: every process on lab3 kill -9'd (its slurmd, slurmstepd and rank: a node that died);
* ``link``: lab3's link cut (a node that hangs or falls off the network).

Measured: seconds from the fault to training again (the survivors' "lost" event), the
survivors' own recovery (summary.json's ``recovered_s``), how the job ended and on how many
learners, the held-out metric, and that every lockstep epoch used each sample once. Between
jobs lab3 is brought back (its slurmd started again, its link mended) and the job is waited
out of SLURM's queue::

    python benchmarks/bench_slurm_elastic.py --json docs/results/slurm_elastic.json
    python benchmarks/bench_slurm_elastic.py --algos dpsgd adpsgd --faults node
    python benchmarks/bench_slurm_elastic.py --quick     # dpsgd, node, 4 epochs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from benchmarks.bench_elastic import ONCE_CELL, every_sample_once, rows_of  # noqa: E402
from runner.errors import UserError  # noqa: E402

NAME = "slurm_elastic"
BIN = Path(sys.executable).parent
SLURM_LOCAL = REPO / "scripts" / "slurm_local.sh"
LAB = REPO / "scripts" / "lab_cluster.sh"
# The lab's third host (scripts/lab_cluster.sh names them LAB_PREFIX1..N; lab3 by default).
NODES, LOST_NODE, TRAIN_SIZE = 4, f"{os.environ.get('LAB_PREFIX', 'lab')}3", 1438
ALGOS = ["ssgd", "dpsgd", "adpsgd", "hadpsgd", "sgp", "choco", "diloco"]
FAULTS = ["node", "link"]
FULL = {"algos": ALGOS, "faults": FAULTS, "epochs": 12, "delay_s": 0.05}
QUICK = {"algos": ["dpsgd"], "faults": ["node"], "epochs": 4, "delay_s": 0.05}
SCALED = {"diloco": (0.5, 2.0)}  # (epochs, delay) factors, as bench_respawn's
MD_HEADER = ("| date | algorithm | fault | fault to training | survivors' recovery | "
             "learners at end | top-1 | every sample once |\n" + "|---" * 8 + "|\n")


def slurm_env() -> dict[str, str]:
    up = subprocess.run(["bash", str(SLURM_LOCAL), "up", "--nodes", str(NODES)],
                        capture_output=True, text=True, timeout=900)
    conf = re.search(r"export SLURM_CONF=(\S+)", up.stdout)
    if up.returncode != 0 or not conf:
        raise UserError(f"the lab's SLURM did not come up: {(up.stderr or up.stdout).strip()}",
                        "run as root on a machine with network namespaces")
    return {**os.environ, "SLURM_CONF": conf.group(1), "PATH": f"{BIN}:{os.environ['PATH']}"}


def job_state(job_id: str, env: dict[str, str]) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                           env=env, timeout=60).stdout
    state = re.search(r"JobState=(\S+)", shown)
    return state.group(1) if state else "GONE"


def lose(fault: str) -> float:
    if fault == "node":
        pids = subprocess.run(["ip", "netns", "pids", LOST_NODE], capture_output=True,
                              text=True, check=True).stdout.split()
        subprocess.run(["kill", "-9", *pids], check=False)
    else:
        subprocess.run(["bash", str(LAB), "link", LOST_NODE, "down"], check=True,
                       capture_output=True, timeout=60)
    return time.time()


def bring_back(fault: str) -> None:
    if fault == "node":
        subprocess.run(["bash", str(SLURM_LOCAL), "start-node", LOST_NODE, "--lab"],
                       check=True, capture_output=True, timeout=120)
    else:
        subprocess.run(["bash", str(LAB), "link", LOST_NODE, "up"], check=True,
                       capture_output=True, timeout=60)


def run_case(run_dir: Path, algo: str, fault: str, epochs: int, delay_s: float,
             timeout_s: float, env: dict[str, str]) -> dict:
    submitted = subprocess.run(
        [str(BIN / "adpsgd-run"), "recipe=digit_images", f"algo={algo}", "launcher=slurm",
         f"launcher.nodes={NODES}", "launcher.procs_per_node=1", "launcher.elastic=true",
         "launcher.time=00:30:00", "launcher.signal_lead_s=60", f"trainer.epochs={epochs}",
         "trainer.eval_every=4", "trainer.progress=false", f"faults.delay_s={delay_s}",
         f"hydra.run.dir={run_dir}"], capture_output=True, text=True, env=env, timeout=300)
    found = re.search(r"submitted SLURM job (\d+)", submitted.stdout)
    if not found:
        raise UserError(f"{algo}: not submitted: {submitted.stderr.strip()[-300:]}")
    job_id = found.group(1)
    deadline = time.monotonic() + timeout_s
    budget = epochs * TRAIN_SIZE
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and any(r["samples"] >= budget / 3 for r in rows_of(run_dir))):
        if time.monotonic() > deadline or job_state(job_id, env) not in ("PENDING", "RUNNING"):
            raise UserError(f"{algo}: the moment for the fault never came (job {job_id})")
        time.sleep(0.05)
    lost_at = lose(fault)
    ended = run_dir / "logs" / f"slurm-{job_id}.out"
    try:
        while "ranks exited with status" not in (ended.read_text() if ended.exists() else ""):
            if time.monotonic() > deadline:
                raise UserError(f"{algo}: job {job_id} ran over {timeout_s:.0f} s")
            time.sleep(0.2)
    finally:
        bring_back(fault)
    while job_state(job_id, env) not in ("COMPLETED", "FAILED", "CANCELLED", "GONE"):
        time.sleep(0.5)  # lab3's slurmstepd reports the step's end once it answers again
    summary = json.loads((run_dir / "summary.json").read_text())
    events = [json.loads(line) for line in
              (run_dir / "logs" / "events.jsonl").read_text().splitlines()]
    lost = [e for e in events if e["event"] == "lost"]
    return {"algo": algo, "fault": fault, "epochs": epochs, "delay_s": delay_s,
            "job_state": job_state(job_id, env), "status": summary["status"],
            "fault_to_training_s": round(lost[0]["time"] - lost_at, 3) if lost else None,
            "recovered_s": (summary["membership"] or [{}])[0].get("recovered_s"),
            "learners_at_end": summary.get("learners_at_end"), "top1": summary.get("top1"),
            "every_sample_once": every_sample_once(summary)}


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_slurm_elastic.py", args.argv, args.quick)
    env = slurm_env()
    cases = []
    for algo in args.algos:
        epochs_factor, delay_factor = SCALED.get(algo, (1.0, 1.0))
        epochs = max(2, round(args.epochs * epochs_factor))
        delay_s = round(args.delay_s * delay_factor, 3)
        for fault in args.faults:
            case = run_case(args.runs / f"{algo}-{fault}", algo, fault, epochs, delay_s,
                            args.timeout, env)
            cases.append(case)
            print(f"{algo} {fault}: training again {case['fault_to_training_s']} s, "
                  f"{case['status']} on {case['learners_at_end']}", file=sys.stderr,
                  flush=True)
    return record.finish({"cases": cases, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:.2f} s"

    return [f"| {r['date'][:10]} | {c['algo']} | {c['fault']} | "
            f"{seconds(c['fault_to_training_s'])} | {seconds(c['recovered_s'])} | "
            f"{c['learners_at_end']} ({c['status']}) | {c['top1']:.2f} | "
            f"{ONCE_CELL[c['every_sample_once']]} |" for c in r["cases"]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_common_arguments(parser, NAME, timeout_s=600)
    parser.add_argument("--algos", nargs="+", choices=ALGOS,
                        help=f"default: {' '.join(ALGOS)}; --quick: dpsgd")
    parser.add_argument("--faults", nargs="+", choices=FAULTS,
                        help="default: node link; --quick: node")
    parser.add_argument("--epochs", type=int, help="default: 12; --quick: 4")
    parser.add_argument("--delay-s", type=float, help="seconds each step sleeps "
                        "(faults.delay_s); default: 0.05")
    args = parser.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_slurm_elastic", args, measure, MD_HEADER,
                                   markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
