"""failures: goodput under node failures, restarting from checkpoints against elastic training.

Timing-only runs (runner/sim/timing.py) of the seed papers' SWB-2000 BLSTM with SSGD on the
IBM P9 cluster (4 V100 per node) at each --nprocs give the failure-free training seconds of
--epochs epochs and the model's size. runner/sim/failures.py then draws node failures at each
--node-mtbf-hours (--draws Monte Carlo runs per cell) and reports the goodput, useful samples
per second against the failure-free rate, of:

* restarting from the last checkpoint, with checkpoints every --intervals-min minutes and at
  Young's and Daly's optimum for the job's MTBF; a checkpoint writes every rank's model and
  momentum at --storage-gbps, a restart costs --restart-s;
* elastic continuation (launcher.elastic): each failure costs --recovery-s, the job goes on
  with the nodes left (no checkpoint needed);
* elastic continuation with --spare-nodes nodes of spares (launcher.spares): a spare node
  takes a failed one's place after --join-s, while any is left.

With --event-loop-draws K, both policies are also simulated whole: K timing-only runs of the
--epochs epochs per cell, whose nodes fail inside the simulator's event loop
(cluster.failures, runner/sim/engine.py): restarting from the newest checkpoint, with one at
every epoch's end (as every run has) and 1, 2 or 4 per epoch where the epoch's steps divide
evenly, every --intervals-min minutes where that is between a step and an epoch, and
``trainer.checkpoint_every=auto`` (Young's period from the modelled write and the node MTBF,
planned by the run itself: runner/checkpoint/period.py); and going on without the failed
nodes (launcher.elastic, checkpoints not timed).
Beside each, the Monte Carlo model's goodput for the same policy.

--restart-s, --recovery-s, --join-s and --storage-gbps are assumptions (defaults: 300 s for
requeue, start and reading a checkpoint; 1 s, where 4 ranks here took 0.06-0.08 s, and 5 s,
where a join took 0.06 s, docs/RESULTS.md; 10 GB/s to the parallel file system).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from runner.sim.failures import FailureModel, daly_interval, mean_goodput, young_interval

from .common import bench, simulate

FULL = {"nprocs": [64, 1024], "epochs": 16, "node_mtbf_hours": [100.0, 1000.0],
        "intervals_min": [5.0, 15.0, 60.0], "draws": 2000, "samples_per_epoch": 0,
        "event_loop_draws": 0}
# --quick: epochs of 10 steps at n=8 and 5 at n=16, so that the event loop's runs take both
# branches of PER_EPOCH (checkpoints 1 and 2 per epoch at n=8, 1 where 5 steps do not divide)
QUICK = {"nprocs": [8, 16], "epochs": 1, "node_mtbf_hours": [1.0, 10.0],
         "intervals_min": [5.0], "draws": 50, "samples_per_epoch": 16 * 32 * 5,
         "event_loop_draws": 2}
PER_EPOCH = (1, 2, 4)  # checkpoints per epoch in the event loop's runs
GPUS_PER_NODE = 4  # the P9 cluster's
HEADER = ("| date | n | node MTBF (h) | job MTBF (h) | failure-free (h) | policy | "
          "checkpoint every (min) | goodput | samples/s |\n" + "|---" * 9 + "|\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nprocs", type=int, nargs="+", help="learners (default 64 1024)")
    p.add_argument("--epochs", type=int, help="SWB-2000 epochs of the run (default 16)")
    p.add_argument("--node-mtbf-hours", type=float, nargs="+",
                   help="mean hours between failures of one node (default 100 1000)")
    p.add_argument("--intervals-min", type=float, nargs="+",
                   help="checkpoint intervals to try besides the optimum (default 5 15 60)")
    p.add_argument("--draws", type=int, help="Monte Carlo runs per cell (default 2000)")
    p.add_argument("--samples-per-epoch", type=int,
                   help="samples of the epoch timed (default: the recipe's)")
    p.add_argument("--restart-s", type=float, default=300.0,
                   help="from a failure to training again from a checkpoint (default 300)")
    p.add_argument("--recovery-s", type=float, default=1.0,
                   help="elastic: from a failure to training again (default 1)")
    p.add_argument("--spare-nodes", type=int, default=2,
                   help="elastic with spares: nodes of spares started with the job (default 2)")
    p.add_argument("--join-s", type=float, default=5.0,
                   help="elastic with spares: a spare node's join (default 5)")
    p.add_argument("--storage-gbps", type=float, default=80.0,
                   help="checkpoint write bandwidth of the whole job, Gb/s (default 80)")
    p.add_argument("--event-loop-draws", type=int,
                   help="simulated runs per cell of restarts inside the simulator (default 0)")


def cases(args: argparse.Namespace) -> dict[str, list[str]]:
    return {f"n{n}": [*job(n, args), "trainer.epochs=1"] for n in args.nprocs}


def job(n: int, args: argparse.Namespace) -> list[str]:
    """The timing-only SSGD job of ``n`` learners every run of this study is."""
    samples = ([f"launcher.samples_per_epoch={args.samples_per_epoch}"]
               if args.samples_per_epoch else [])
    return ["recipe=swb2000", "algo=ssgd", "launcher=sim", "launcher.timing_only=true",
            f"launcher.nprocs={n}", f"launcher.procs_per_node={GPUS_PER_NODE}",
            "cluster=p9_v100_infiniband", "trainer.progress=false", *samples]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record("study_scale failures", "benchmarks/study_scale.py", args.argv,
                          args.quick)
    runs = simulate(args.runs, cases(args))
    cells = []
    for run in runs.values():
        s = run["summary"]
        n = s["nprocs"]
        work_s = args.epochs * s["virtual_s"]  # failure-free, on the modelled cluster
        # every rank writes its model and momentum (decentralized replicas differ)
        checkpoint_s = n * 2 * s["model_bytes"] * 8 / (args.storage_gbps * 1e9)
        for mtbf_h in args.node_mtbf_hours:
            model = FailureModel(mtbf_h * 3600, n // GPUS_PER_NODE, checkpoint_s,
                                 args.restart_s, args.recovery_s)
            intervals = {f"{m:g} min": m * 60 for m in args.intervals_min}
            intervals["Young"] = young_interval(checkpoint_s, model.job_mtbf_s)
            intervals["Daly"] = daly_interval(checkpoint_s, model.job_mtbf_s)
            policies = {f"restart, {k}": v for k, v in intervals.items()}
            policies["elastic"] = None
            spared = dataclasses.replace(model, spare_nodes=args.spare_nodes,
                                         join_s=args.join_s)
            policies[f"elastic, {args.spare_nodes} spare nodes"] = None
            for policy, interval in policies.items():
                mean, std = mean_goodput(work_s, spared if "spare" in policy else model,
                                         interval, args.draws, seed=len(cells))
                cells.append({"nprocs": n, "node_mtbf_h": mtbf_h,
                              "job_mtbf_h": model.job_mtbf_s / 3600,
                              "failure_free_h": work_s / 3600, "policy": policy,
                              "interval_min": None if interval is None else interval / 60,
                              "goodput": mean, "goodput_std": std,
                              "samples_per_s": mean * s["samples_per_s"],
                              "checkpoint_s": checkpoint_s, "run_dir": run["run_dir"]})
    loop = event_loop(args, runs) if args.event_loop_draws else []
    return record.finish({"study": "failures", "recipe": "swb2000", "algo": "ssgd",
                          "cluster": "p9_v100_infiniband", "epochs": args.epochs,
                          "restart_s": args.restart_s, "recovery_s": args.recovery_s,
                          "spare_nodes": args.spare_nodes, "join_s": args.join_s,
                          "storage_gbps": args.storage_gbps, "draws": args.draws,
                          "cells": cells, "event_loop": loop, "run_dirs": str(args.runs)})


def event_loop(args: argparse.Namespace, runs: dict[str, Any]) -> list[dict[str, Any]]:
    """Both policies simulated whole (see the module's docstring): per size and node MTBF,
    the mean goodput of --event-loop-draws seeds restarting from checkpoints (1, 2 or 4 per
    epoch, where the epoch's steps divide evenly) and going on without failed nodes (elastic,
    checkpoints not timed), each beside the Monte Carlo model's for the same policy."""
    cells = []
    for name, run in runs.items():
        s = run["summary"]
        n, steps = s["nprocs"], s["steps"]
        work_s = args.epochs * s["virtual_s"]
        for mtbf_h in args.node_mtbf_hours:
            failing = [f"trainer.epochs={args.epochs}",
                       f"cluster.failures.node_mtbf_hours={mtbf_h}"]
            restarting = ["launcher.max_restarts=100000",
                          f"cluster.storage_gbps={args.storage_gbps}",
                          f"cluster.failures.restart_s={args.restart_s}"]
            step_s = s["virtual_s"] / steps
            policies = {f"c{k}": [*restarting, *([f"trainer.checkpoint_every={steps // k}"]
                                                 if k > 1 else [])]
                        for k in PER_EPOCH if steps % k == 0}
            # every --intervals-min minutes of training, where that is a step or more and
            # less than an epoch (whose end has a checkpoint anyway)
            policies.update({f"m{m:g}": [*restarting, f"trainer.checkpoint_every="
                                                      f"{round(m * 60 / step_s)}"]
                             for m in args.intervals_min if 1 <= m * 60 / step_s < steps})
            # trainer.checkpoint_every=auto: Young's period from the modelled write and the
            # cluster's node MTBF, planned by the run as it goes (runner/checkpoint/period.py)
            policies["auto"] = [*restarting, "trainer.checkpoint_every=auto"]
            policies["elastic"] = ["launcher.elastic=true",
                                   f"cluster.failures.recovery_s={args.recovery_s}"]
            for policy, overrides in policies.items():
                cases = {f"{name}_h{mtbf_h:g}_{policy}_s{seed}": [
                    *job(n, args), *failing, *overrides, f"seed={seed}"]
                    for seed in range(args.event_loop_draws)}
                done = [r["summary"] for r in simulate(args.runs / "event_loop", cases).values()]
                goodputs = [work_s / r["virtual_s"] for r in done]
                elastic = policy == "elastic"
                checkpoint_s = done[0]["failures"]["checkpoint_s"]
                model = FailureModel(mtbf_h * 3600, n // GPUS_PER_NODE, checkpoint_s,
                                     args.restart_s, args.recovery_s)
                per_epoch = int(policy[1:]) if policy.startswith("c") else None
                planned = [p["period_s"] for r in done
                           for p in r["failures"].get("checkpoint_periods") or []]
                if elastic:
                    interval_s = None
                elif per_epoch:
                    interval_s = s["virtual_s"] / per_epoch
                elif policy.startswith("m"):
                    interval_s = step_s * round(float(policy[1:]) * 60 / step_s)
                else:  # auto: the model at Young's period, which the runs planned
                    interval_s = young_interval(checkpoint_s, model.job_mtbf_s)
                mean, std = mean_goodput(work_s, model, interval_s, args.draws, seed=len(cells))
                cells.append({
                    "nprocs": n, "node_mtbf_h": mtbf_h,
                    "policy": ("elastic" if elastic else "restart, auto (Young)"
                               if policy == "auto" else "restart"), "per_epoch": per_epoch,
                    "interval_min": None if elastic else interval_s / 60,
                    "job_mtbf_h": model.job_mtbf_s / 3600, "failure_free_h": work_s / 3600,
                    "checkpoint_s": checkpoint_s, "runs": len(done),
                    "goodput": float(np.mean(goodputs)),
                    "goodput_se": float(np.std(goodputs) / np.sqrt(len(goodputs))),
                    "samples_per_s": float(np.mean(goodputs)) * s["samples_per_s"],
                    "failures_mean": float(np.mean([r["failures"]["restarts"]
                                                    + r["failures"]["nodes_lost"]
                                                    for r in done])),
                    "model_goodput": mean, "model_goodput_std": std,
                    # auto: the periods its runs planned (Young's, from the modelled write)
                    "planned_period_s": sorted(set(planned)) if policy == "auto" else None})
    return cells


def rows(r: dict[str, Any]) -> list[str]:
    return [f"| {r['date'][:10]} | {c['nprocs']} | {c['node_mtbf_h']:g} | {c['job_mtbf_h']:.2f} | "
            f"{c['failure_free_h']:.2f} | {c['policy']} | "
            f"{'-' if c['interval_min'] is None else format(c['interval_min'], '.1f')} | "
            f"{c['goodput']:.3f} +- {c['goodput_std']:.3f} | {c['samples_per_s']:.0f} |"
            for c in r["cells"]] + [
        f"| {r['date'][:10]} | {c['nprocs']} | {c['node_mtbf_h']:g} | {c['job_mtbf_h']:.2f} | "
        f"{c['failure_free_h']:.2f} | {c['policy']}, simulated ({c['runs']} runs, "
        f"{c['failures_mean']:.1f} failures each; the model: {c['model_goodput']:.3f}) | "
        f"{'-' if c['interval_min'] is None else format(c['interval_min'], '.1f')} | "
        f"{c['goodput']:.3f} +- {c['goodput_se']:.3f} (se) | "
        f"{c['samples_per_s']:.0f} |" for c in r.get("event_loop", [])]
