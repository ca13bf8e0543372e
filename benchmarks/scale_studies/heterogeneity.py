"""heterogeneity (arXiv 1710.06952): with learners of different speeds AD-PSGD is faster than
the best of D-PSGD and AllReduce-SGD, and on a network shared with other jobs its epochs take
4-8x less time than the synchronous baselines'.

SSGD, D-PSGD, AD-PSGD, H-ADPSGD and DaSGD (tau = delay = 4, the hiding setting of the dasgd
study) train the grown digits on --nprocs learners of the paper's machine (cluster=p100_128,
nodes of 4 P100) under four conditions:

  even               the preset's 5% step-time jitter, no slow periods
  straggler          rank 3 computes --straggler-factor times slower, all run
  slow_periods       every learner is slow (x --slow-factor) for --slow-period-s at random,
                     a --slow-fraction of the time on average (Poisson onsets)
  contended_network  the inter-node links keep --network-share of their 100 Gb/s, at 5x the
                     latency: the other jobs' traffic on a shared HPC network

Time is the paper's workload's, learning the digits': every exchange is timed for ResNet-50
(launcher.model_bytes = 25.6 M fp32 parameters) and every sample costs a P100's ResNet-50 time
(the preset's imagenet seconds per sample), so a step of the digits costs what a step of
ResNet-50 would on that machine while the held-out top-1 says how many epochs each algorithm
needs. The two are measured apart, as the paper states its claim (loss against epochs, time
per epoch): a learning run evaluates every --eval-every steps and gives the epochs to the
first held-out top-1 at or above --target (interpolated between evaluations); a timing-only
run of the same case (runner/sim/timing.py), evaluating at epoch ends only, gives the seconds
per epoch. Their product is the time to target. Frequent evaluations would otherwise be part
of the time: asynchronous learners meet at every evaluation, so each one costs them a wait for
the slowest learner's step (45% of AD-PSGD's time with the straggler at one every 5 steps).
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import (
    HELDOUT_SIZE,
    STUDY_MODEL,
    TRAIN_SIZE,
    bench,
    curve,
    digits,
    simulate,
    sqrt_scaled_lr,
)

RESNET50_BYTES = 25_557_032 * 4
ORIGINAL_TRAIN_SIZE = 1437  # recipe.train_size=0: digit_images' own training images
P100_RESNET50_S_PER_SAMPLE = 4.5e-3  # conf/cluster/p100_128.yaml, imagenet
ALGOS = {"ssgd": ["algo=ssgd"], "dpsgd": ["algo=dpsgd", "topology=ring"],
         "adpsgd": ["algo=adpsgd", "topology=ring"], "hadpsgd": ["algo=hadpsgd", "topology=ring"],
         "dasgd": ["algo=dasgd", "algo.tau=4", "algo.delay=4"]}
SYNCHRONOUS = ("ssgd", "dpsgd")
CONDITIONS = ("even", "straggler", "slow_periods", "contended_network")
FULL = {"nprocs": 16, "epochs": 4, "batch_size": 32, "train_size": TRAIN_SIZE,
        "heldout_size": HELDOUT_SIZE, "eval_every": 10, "target": 90.0, "algos": list(ALGOS),
        "conditions": list(CONDITIONS)}
# --quick: a synchronous and an asynchronous algorithm, even and with the straggler
QUICK = {"nprocs": 8, "epochs": 1, "batch_size": 64, "train_size": 0, "heldout_size": 0,
         "eval_every": 1, "target": 20.0, "algos": ["ssgd", "adpsgd"],
         "conditions": ["even", "straggler"]}
HEADER = ("| date | condition | algorithm | s per epoch | epochs to target | s to target | "
          "final top-1 | compute / comm / idle (s per learner) |\n"
          "|---|---|---|---|---|---|---|---|\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nprocs", type=int, help="learners, nodes of 4 (default 16)")
    p.add_argument("--algos", nargs="+", choices=list(ALGOS), help="default: all five")
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS, help="default: all four")
    p.add_argument("--epochs", type=int, help="epochs of every run (default 4)")
    p.add_argument("--batch-size", type=int, help="per learner (default 32)")
    p.add_argument("--train-size", type=int, help="training samples (default 20,480)")
    p.add_argument("--heldout-size", type=int, help="held-out samples (default 3,590)")
    p.add_argument("--eval-every", type=int,
                   help="steps between the learning runs' evaluations (default 10)")
    p.add_argument("--target", type=float, help="held-out top-1 to reach (default 90)")
    p.add_argument("--lr", type=float, default=0.1,
                   help="the rate at a global batch of 256, scaled by its square root "
                        "(default 0.1)")
    p.add_argument("--straggler-factor", type=float, default=4.0)
    p.add_argument("--slow-factor", type=float, default=4.0)
    p.add_argument("--slow-period-s", type=float, default=5.0,
                   help="virtual seconds of a slow period (default 5: ~35 steps)")
    p.add_argument("--slow-fraction", type=float, default=0.2,
                   help="share of the time a learner is slow, on average (default 0.2)")
    p.add_argument("--network-share", type=float, default=0.1,
                   help="contended_network: the share of the inter-node bandwidth left to "
                        "this job (default 0.1)")


def conditions(args: argparse.Namespace) -> dict[str, list[str]]:
    rate = args.slow_fraction / args.slow_period_s * 3600  # onsets per learner-hour
    even = ["cluster.compute.slow_period_rate_per_hour=0"]
    every = {"even": even,
            "straggler": [*even, "faults.straggler.ranks=[3]",
                          f"faults.straggler.factor={args.straggler_factor}"],
            "slow_periods": [f"cluster.compute.slow_period_rate_per_hour={rate:g}",
                             f"cluster.compute.slow_period_s={args.slow_period_s}",
                             f"cluster.compute.slow_factor={args.slow_factor}"],
            "contended_network": [*even, "cluster.inter_node.bandwidth_gbps="
                                  f"{100 * args.network_share:g}",
                                  "cluster.inter_node.latency_us=10"]}
    return {name: every[name] for name in CONDITIONS if name in args.conditions}


def cases(args: argparse.Namespace) -> dict[str, list[str]]:
    """``<condition>-<algo>`` learns, ``<condition>-<algo>-timing`` is timed."""
    n, b = args.nprocs, args.batch_size
    common = [*digits(args.train_size, args.heldout_size), "launcher=sim",
              f"launcher.nprocs={n}", "launcher.procs_per_node=4", "cluster=p100_128",
              "cluster.nodes=0", f"launcher.model_bytes={RESNET50_BYTES}",
              f"cluster.compute.seconds_per_sample.digit_images={P100_RESNET50_S_PER_SAMPLE}",
              f"trainer.epochs={args.epochs}", f"trainer.batch_size={b}",
              "trainer.progress=false", "optim.scaling=none",
              f"optim.lr={sqrt_scaled_lr(args.lr, n, b)}"]
    learn = [f"trainer.eval_every={args.eval_every}"]
    timing = ["launcher.timing_only=true",
              f"launcher.samples_per_epoch={args.train_size or ORIGINAL_TRAIN_SIZE}"]
    found = {}
    for condition, extra in conditions(args).items():
        for algo in args.algos:
            algo_overrides = ALGOS[algo]
            found[f"{condition}-{algo}"] = [*common, *extra, *algo_overrides, *learn]
            found[f"{condition}-{algo}-timing"] = [*common, *extra, *algo_overrides, *timing]
    return found


def epochs_to(points: list[dict[str, float]], target: float) -> float | None:
    """Epochs at which held-out top-1 first reaches ``target``, linear between evaluations."""
    before = {"epoch": 0.0, "top1": 0.0}
    for point in points:
        if point["top1"] >= target:
            if point["top1"] == before["top1"]:
                return point["epoch"]
            share = (target - before["top1"]) / (point["top1"] - before["top1"])
            return before["epoch"] + share * (point["epoch"] - before["epoch"])
        before = point
    return None


def ratio(slow: float | None, fast: float | None) -> float | None:
    return None if slow is None or fast is None else slow / fast


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record("study_scale heterogeneity", "benchmarks/study_scale.py", args.argv,
                          args.quick)
    by_case = cases(args)
    runs = simulate(args.runs, by_case)
    table: dict[str, dict[str, Any]] = {}
    for condition in conditions(args):
        for algo in args.algos:
            name = f"{condition}-{algo}"
            learned, timed = runs[name]["summary"], runs[f"{name}-timing"]["summary"]
            points = curve(runs[name])
            epochs = epochs_to(points, args.target)
            epoch_s = timed["epoch_s"]
            table[name] = {
                "condition": condition, "algo": algo, "overrides": by_case[name],
                "epoch_s": epoch_s, "epochs_to_target": epochs,
                "time_to_target_s": None if epochs is None else epochs * epoch_s,
                "final_top1": learned["final"].get("top1"), "curve": points,
                "compute_s": timed["compute_s"], "comm_s": timed["comm_s"],
                "idle_s": timed["idle_s"], "samples_per_s": timed["samples_per_s"],
                "learning_run_epoch_s": learned["virtual_s"] / args.epochs,
                "consensus_distance": learned.get("consensus_distance"),
                "run_dir": runs[name]["run_dir"],
                "timing_run_dir": runs[f"{name}-timing"]["run_dir"]}
    summary = {}
    synchronous = [a for a in SYNCHRONOUS if a in args.algos]
    for condition in conditions(args):
        row = {algo: table[f"{condition}-{algo}"] for algo in args.algos}
        reached = {a: row[a]["time_to_target_s"] for a in args.algos
                   if row[a]["time_to_target_s"] is not None}
        entry: dict[str, Any] = {"fastest_to_target": min(reached, key=reached.get, default=None)}
        if synchronous and "adpsgd" in row:
            adpsgd = row["adpsgd"]
            best_sync = min(synchronous, key=lambda a: row[a]["epoch_s"])
            sync_reached = [reached[a] for a in synchronous if a in reached]
            entry.update({
                "best_synchronous_epoch_over_adpsgd": row[best_sync]["epoch_s"]
                / adpsgd["epoch_s"],
                "best_synchronous_to_target_over_adpsgd": ratio(
                    min(sync_reached, default=None), adpsgd["time_to_target_s"])})
            if "ssgd" in row:
                entry["ssgd_epoch_over_adpsgd"] = row["ssgd"]["epoch_s"] / adpsgd["epoch_s"]
        summary[condition] = entry
    return record.finish({
        "study": "heterogeneity", "recipe": "digit_images", "train_size": args.train_size,
        "heldout_size": args.heldout_size, "model": STUDY_MODEL, "cluster": "p100_128",
        "timed_as": {"model_bytes": RESNET50_BYTES,
                     "seconds_per_sample": P100_RESNET50_S_PER_SAMPLE},
        "nprocs": args.nprocs, "batch_size": args.batch_size, "epochs": args.epochs,
        "algos": args.algos,
        "target_top1": args.target, "lr": sqrt_scaled_lr(args.lr, args.nprocs, args.batch_size),
        "conditions": {c: o for c, o in conditions(args).items()}, "runs": table,
        "summary": summary, "run_dirs": str(args.runs)})


def rows(r: dict[str, Any]) -> list[str]:
    found = []
    for e in r["runs"].values():
        epochs, seconds = e["epochs_to_target"], e["time_to_target_s"]
        reached = ("not reached | -" if epochs is None else f"{epochs:.2f} | {seconds:.1f}")
        found.append(f"| {r['date'][:10]} | {e['condition']} | {e['algo']} | "
                     f"{e['epoch_s']:.2f} | {reached} | {e['final_top1']:.1f} | "
                     f"{e['compute_s']:.1f} / {e['comm_s']:.1f} / {e['idle_s']:.1f} |")
    return found
