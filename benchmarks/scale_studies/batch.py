"""batch (arXiv 1907.05701): AD-PSGD converges with a batch about 3x as large as SSGD's.

SSGD and AD-PSGD train the grown digits at each --nprocs with a ladder of per-learner batches
(--batch-sizes; a batch is left out where n x b would leave fewer than five steps in an epoch)
for the same number of epochs, the same data and the same model. So that neither is judged
by a rate tuned for the other, every point runs with two learning-rate rules and keeps the
better: the square-root rule (optim.scaling=none, lr = --lr x sqrt(n x b / 256)) and the linear
rule with a one-epoch warm-up from --lr (optim.scaling=linear, lr = --lr x n x b / 256, the
large-batch recipe of arXiv 1706.02677). An algorithm "tolerates" a batch when its final
held-out top-1 there and at every smaller batch of the ladder is within a margin of its result
at the smallest batch (each of --margins, in top-1 points); the claim is held at an n and a
margin when AD-PSGD tolerates at least twice SSGD's largest batch (the ladder doubles, so 3x
reads as 2x or 4x), and held when that is so at every n and margin.
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

ALGOS = {"ssgd": ["algo=ssgd"], "adpsgd": ["algo=adpsgd", "topology=ring"]}
FULL = {"nprocs": [16, 64], "batch_sizes": [8, 16, 32, 64, 128], "epochs": 10,
        "train_size": TRAIN_SIZE, "heldout_size": HELDOUT_SIZE}
QUICK = {"nprocs": [4], "batch_sizes": [16, 64], "epochs": 1, "train_size": 0,
         "heldout_size": 0}
MIN_STEPS_PER_EPOCH = 5
HEADER = ("| date | algorithm | n | batch | global batch | best rule | lr | held-out top-1 "
          "(sqrt / linear) | within margins |\n|---|---|---|---|---|---|---|---|---|\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nprocs", type=int, nargs="+", help="learners (default 16 64)")
    p.add_argument("--batch-sizes", type=int, nargs="+",
                   help="per-learner batches, smallest first (default 8 16 32 64 128)")
    p.add_argument("--epochs", type=int, help="epochs of every run (default 10)")
    p.add_argument("--train-size", type=int, help="training samples (default 20,480)")
    p.add_argument("--heldout-size", type=int, help="held-out samples (default 3,590)")
    p.add_argument("--lr", type=float, default=0.1,
                   help="the rate at a global batch of 256 (default 0.1)")
    p.add_argument("--margins", type=float, nargs="+", default=[1.0, 2.0],
                   help="top-1 points below the smallest batch's result still counted as "
                        "tolerated (default 1 and 2)")


def train_samples(args: argparse.Namespace) -> int:
    return args.train_size or 1437  # 0: the recipe's originals


def ladder(args: argparse.Namespace, n: int) -> list[int]:
    """The batches run at n learners: those leaving at least MIN_STEPS_PER_EPOCH steps."""
    return [b for b in sorted(args.batch_sizes)
            if n * b * MIN_STEPS_PER_EPOCH <= train_samples(args)]


def rates(args: argparse.Namespace, n: int, b: int) -> dict[str, list[str]]:
    return {"sqrt": ["optim.scaling=none", f"optim.lr={sqrt_scaled_lr(args.lr, n, b)}"],
            "linear": ["optim.scaling=linear", "optim.reference_batch=256",
                       f"optim.lr={args.lr}", "optim.warmup_epochs=1"]}


def peak_lr(args: argparse.Namespace, rule: str, n: int, b: int) -> float:
    """The rate a rule reaches (after the warm-up)."""
    return sqrt_scaled_lr(args.lr, n, b) if rule == "sqrt" else args.lr * n * b / 256


def cases(args: argparse.Namespace) -> dict[str, list[str]]:
    found = {}
    for n in args.nprocs:
        for b in ladder(args, n):
            common = [*digits(args.train_size, args.heldout_size), "launcher=sim",
                      f"launcher.nprocs={n}", "cluster.nodes=0", f"trainer.epochs={args.epochs}",
                      f"trainer.batch_size={b}", "trainer.progress=false"]
            for algo, extra in ALGOS.items():
                for rule, lr in rates(args, n, b).items():
                    found[f"n{n}-{algo}-b{b}-{rule}"] = [*common, *extra, *lr]
    return found


def tolerated(top1_by_batch: dict[int, float | None], margin: float) -> int:
    """The largest batch up to which every result is within ``margin`` of the smallest's
    (None: diverged)."""
    batches = sorted(top1_by_batch)
    reference, largest = top1_by_batch[batches[0]] or 0.0, batches[0]
    for b in batches[1:]:
        if (top1_by_batch[b] or 0.0) < reference - margin:
            break
        largest = b
    return largest


def verdict(ratios: list[float]) -> str:
    if all(r >= 2 for r in ratios):
        return "held"
    return "partly" if any(r >= 2 for r in ratios) or any(r > 1 for r in ratios) else "not held"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record("study_scale batch", "benchmarks/study_scale.py", args.argv, args.quick)
    by_case = cases(args)
    runs = simulate(args.runs, by_case, divergence_is_a_result=True)
    points: dict[str, dict[str, Any]] = {}
    for n in args.nprocs:
        for b in ladder(args, n):
            for algo in ALGOS:
                per_rule = {}
                for rule in rates(args, n, b):
                    run = runs[f"n{n}-{algo}-b{b}-{rule}"]
                    final = run["summary"]["final"] if run["summary"] else {}
                    per_rule[rule] = {"final_top1": final.get("top1"),
                                      "final_loss": final.get("loss"),
                                      "diverged": run.get("diverged"),
                                      "lr": peak_lr(args, rule, n, b),
                                      "curve": curve(run), "run_dir": run["run_dir"]}
                # a diverged run (no final top-1) loses to any other
                best = max(per_rule, key=lambda rule: per_rule[rule]["final_top1"] or -1.0)
                points[f"n{n}-{algo}-b{b}"] = {
                    "algo": algo, "nprocs": n, "batch_size": b, "global_batch": n * b,
                    "best_rule": best, "final_top1": per_rule[best]["final_top1"],
                    "rules": per_rule}
    tolerance: dict[str, dict[str, dict[str, Any]]] = {}
    ratios = []
    for margin in args.margins:
        by_n = tolerance.setdefault(f"{margin:g}", {})
        for n in args.nprocs:
            largest = {}
            for algo in ALGOS:
                top1 = {p["batch_size"]: p["final_top1"] for p in points.values()
                        if p["algo"] == algo and p["nprocs"] == n}
                largest[algo] = tolerated(top1, margin)
                for b in top1:
                    within = points[f"n{n}-{algo}-b{b}"].setdefault("within_margin", {})
                    within[f"{margin:g}"] = b <= largest[algo]
            ratio = largest["adpsgd"] / largest["ssgd"]
            ratios.append(ratio)
            by_n[str(n)] = {"largest_batch": largest, "adpsgd_over_ssgd": ratio,
                            "ladder_top": ladder(args, n)[-1]}
    return record.finish({
        "study": "batch", "recipe": "digit_images", "train_size": args.train_size,
        "heldout_size": args.heldout_size, "model": STUDY_MODEL, "epochs": args.epochs,
        "nprocs": args.nprocs, "batch_sizes": args.batch_sizes, "margins_points": args.margins,
        "lr_rules": {"sqrt": f"{args.lr} x sqrt(n x b / 256)",
                     "linear": f"{args.lr} x n x b / 256, 1 warm-up epoch from {args.lr}"},
        "points": points, "tolerance": tolerance, "verdict": verdict(ratios),
        "run_dirs": str(args.runs)})


def rows(r: dict[str, Any]) -> list[str]:
    found = []
    for p in r["points"].values():
        finals = [p["rules"][rule]["final_top1"] for rule in ("sqrt", "linear")]
        top1 = " / ".join("diverged" if v is None else f"{v:.1f}" for v in finals)
        lr = p["rules"][p["best_rule"]]["lr"]
        found.append(f"| {r['date'][:10]} | {p['algo']} | {p['nprocs']} | {p['batch_size']} | "
                     f"{p['global_batch']} | {p['best_rule']} | "
                     f"{lr:.4g} | {top1} | "
                     + ", ".join(f"{m}: {'yes' if ok else 'no'}"
                                 for m, ok in p["within_margin"].items()) + " |")
    return found
