"""dasgd (arXiv 2006.00441): communication entirely hidden, linear scale-up.

Timing-only runs (no learning: the schedule alone, runner/sim/timing.py) of ResNet-50-sized
models (recipe=imagenet) on the 64-V100 Ethernet cluster with its network slowed to
--network-gbps, unbounded in nodes, at each --nprocs: DaSGD with delay 1 and with delay = tau,
and SSGD for contrast. Step time against the compute-only step (a learner's compute seconds
per step), and scale-up efficiency: samples per second against n learners computing alone.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import bench, simulate

CASES: dict[str, list[str]] = {
    "dasgd_delay1": ["algo=dasgd", "algo.tau=4", "algo.delay=1"],
    "dasgd_delay4": ["algo=dasgd", "algo.tau=4", "algo.delay=4"],
    "ssgd": ["algo=ssgd"],
}
FULL = {"nprocs": [8, 16, 32, 64, 128], "samples_per_epoch": 1281167, "batch_size": 32}
QUICK = {"nprocs": [8, 16], "samples_per_epoch": 16 * 32 * 12, "batch_size": 32}
HEADER = ("| date | case | n | step (s) | compute-only step (s) | overhead | "
          "scale-up efficiency |\n|---|---|---|---|---|---|---|\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nprocs", type=int, nargs="+", help="learners (default 8 16 32 64 128)")
    p.add_argument("--batch-size", type=int, help="per learner (default 32)")
    p.add_argument("--network-gbps", type=float, default=10.0,
                   help="the inter-node bandwidth (default 10, 10 Gb/s Ethernet)")
    p.add_argument("--samples-per-epoch", type=int,
                   help="samples of the epoch timed (default ImageNet's 1,281,167)")


def cases(args: argparse.Namespace) -> dict[str, list[str]]:
    found = {}
    for n in args.nprocs:
        common = ["recipe=imagenet", "launcher=sim", "launcher.timing_only=true",
                  f"launcher.nprocs={n}", f"launcher.samples_per_epoch={args.samples_per_epoch}",
                  "cluster=v100_16x4_ethernet", "cluster.nodes=0",
                  f"cluster.inter_node.bandwidth_gbps={args.network_gbps}",
                  f"trainer.batch_size={args.batch_size}", "trainer.epochs=1",
                  "trainer.progress=false"]
        for case, extra in CASES.items():
            found[f"n{n}-{case}"] = [*common, *extra]
    return found


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record("study_scale dasgd", "benchmarks/study_scale.py", args.argv, args.quick)
    runs_by_case = cases(args)
    runs = simulate(args.runs, runs_by_case)
    table = {}
    for name, run in runs.items():
        n_part, case = name.split("-", 1)
        s = run["summary"]
        steps = sum(s["steps_per_rank"]) / len(s["steps_per_rank"])  # a learner's, on average
        compute_step = s["compute_s"] / steps
        alone = s["nprocs"] * s["batch_size"] / compute_step  # n learners that never talk
        table[name] = {
            "case": case, "nprocs": int(n_part[1:]), "overrides": runs_by_case[name],
            "step_s": s["step_s"], "compute_only_step_s": compute_step,
            "overhead": s["step_s"] / compute_step - 1.0,
            "samples_per_s": s["samples_per_s"], "scale_up_efficiency": s["samples_per_s"] / alone,
            "compute_s": s["compute_s"], "comm_s": s["comm_s"], "idle_s": s["idle_s"],
            "model_bytes": s["model_bytes"], "run_dir": run["run_dir"]}
    return record.finish({
        "study": "dasgd", "recipe": "imagenet", "cluster": "v100_16x4_ethernet",
        "network_gbps": args.network_gbps, "batch_size": args.batch_size,
        "samples_per_epoch": args.samples_per_epoch, "nprocs": args.nprocs, "runs": table,
        "run_dirs": str(args.runs)})


def rows(r: dict[str, Any]) -> list[str]:
    return [f"| {r['date'][:10]} | {e['case']} | {e['nprocs']} | {e['step_s']:.4f} | "
            f"{e['compute_only_step_s']:.4f} | {100 * e['overhead']:.1f}% | "
            f"{e['scale_up_efficiency']:.3f} |" for e in r["runs"].values()]
