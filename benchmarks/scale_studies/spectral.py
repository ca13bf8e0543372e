"""spectral (arXiv 2002.01119): the spectral gap shrinks as learners are added, which slows
convergence; a randomized pattern keeps it.

AD-PSGD and D-PSGD train the grown digits at each --nprocs with three ways of choosing peers:
the fixed ring, a randomized ring (D-PSGD: topology=random_ring, a fresh ring every step;
AD-PSGD: algo.pattern=random on topology=complete, TASLP's uniformly random passive) and the
bipartite exponential peers (topology=bipartite_exponential), with SSGD at each n as the
baseline. Read from each run's metrics.jsonl: the held-out top-1 and loss against epochs and the
consensus distance. The fixed ring "falls behind" at the smallest n from which, at every larger
n too, its final held-out top-1 is more than --margin points below the better of the two other
topologies.

Learning rates: AD-PSGD and D-PSGD apply the rate to each learner's own batch, so the
linear-scaling rate of the global batch n x b (3.2 at n = 128, b = 16 for this recipe's 0.4
per 256) is a step sized for 2,048 samples taken with the noise of 16 (64 learners of 4 at 0.4
went to chance). The study uses optim.scaling=none and lr = --lr x sqrt(n x b / 256), the
square-root rule, for every algorithm at that n; every run's rate is in the JSON.
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

# Topology -> algorithm -> overrides.
PEER_CHOICES: dict[str, dict[str, list[str]]] = {
    "fixed_ring": {"dpsgd": ["topology=ring"],
                   "adpsgd": ["topology=ring", "algo.pattern=fixed"]},
    "random_ring": {"dpsgd": ["topology=random_ring"],
                    "adpsgd": ["topology=complete", "algo.pattern=random"]},
    "exponential": {"dpsgd": ["topology=bipartite_exponential"],
                    "adpsgd": ["topology=bipartite_exponential", "algo.pattern=fixed"]},
}
FULL = {"nprocs": [16, 32, 64, 128], "epochs": 3, "train_size": TRAIN_SIZE,
        "heldout_size": HELDOUT_SIZE, "batch_size": 16}
# --quick: the 1,437 training and 359 held-out originals, a few steps of large batches
QUICK = {"nprocs": [8], "epochs": 1, "train_size": 0, "heldout_size": 0, "batch_size": 64}
HEADER = ("| date | algorithm | peers | n | lr | held-out top-1 by epoch | final loss | "
          "consensus distance | ring behind by (pts) |\n|---|---|---|---|---|---|---|---|---|\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nprocs", type=int, nargs="+", help="learners (default 16 32 64 128)")
    p.add_argument("--batch-size", type=int, help="per learner (default 16)")
    p.add_argument("--epochs", type=int, help="epochs of every run (default 3)")
    p.add_argument("--train-size", type=int, help="training samples (default 20,480: n x b "
                                                  "is a tenth of it at 128 x 16)")
    p.add_argument("--heldout-size", type=int, help="held-out samples (default 3,590)")
    p.add_argument("--lr", type=float, default=0.1,
                   help="the rate at a global batch of 256, scaled by its square root "
                        "(default 0.1)")
    p.add_argument("--margin", type=float, default=1.0,
                   help="top-1 points by which the fixed ring must trail to count as behind "
                        "(default 1.0)")


def cases(args: argparse.Namespace) -> dict[str, list[str]]:
    found = {}
    for n in args.nprocs:
        common = [*digits(args.train_size, args.heldout_size), "launcher=sim",
                  f"launcher.nprocs={n}", "cluster.nodes=0", f"trainer.epochs={args.epochs}",
                  f"trainer.batch_size={args.batch_size}", "trainer.progress=false",
                  "optim.scaling=none",
                  f"optim.lr={sqrt_scaled_lr(args.lr, n, args.batch_size)}"]
        found[f"n{n}-ssgd"] = [*common, "algo=ssgd"]
        for peers, per_algo in PEER_CHOICES.items():
            for algo, extra in per_algo.items():
                found[f"n{n}-{algo}-{peers}"] = [*common, f"algo={algo}", *extra]
    return found


def mixing(algo: str, peers: str, n: int) -> dict[str, float]:
    """The spectral quantities of the mixing this case uses (docs/algorithms.md, section 9):
    D-PSGD's rho of its mixing matrix, AD-PSGD's per-averaging rho on its active-passive
    edges."""
    from runner.topology import TOPOLOGIES
    from runner.topology.pairing import pairwise_rho
    from runner.topology.spectral import summarize

    overrides = [o for o in PEER_CHOICES[peers][algo] if o.startswith("topology=")]
    cfg = bench.compose(["recipe=digit_images", "launcher=sim", f"launcher.nprocs={n}",
                   "cluster.nodes=0", f"algo={algo}", *overrides])
    topology = TOPOLOGIES.get(cfg.topology.name)(cfg.topology, seed=cfg.seed)
    if algo == "adpsgd":
        return {"rho_per_averaging": pairwise_rho(topology, n)}
    summary = summarize(topology, n)
    return {"spectral_gap": summary["spectral_gap"], "rho": summary["rho"]}


def falls_behind_at(deficits: dict[int, float], margin: float) -> int | None:
    """The smallest n from which the ring trails by more than ``margin`` at every larger n."""
    behind = None
    for n in sorted(deficits, reverse=True):
        if deficits[n] <= margin:
            break
        behind = n
    return behind


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record("study_scale spectral", "benchmarks/study_scale.py", args.argv,
                          args.quick)
    runs_by_case = cases(args)
    runs = simulate(args.runs, runs_by_case)
    table: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        n_part, algo, *rest = name.split("-")
        n, peers = int(n_part[1:]), (rest[0] if rest else "allreduce")
        summary = run["summary"]
        entry = {"algo": algo, "peers": peers, "nprocs": n, "overrides": runs_by_case[name],
                 "lr": sqrt_scaled_lr(args.lr, n, args.batch_size),
                 "curve": curve(run), "final_top1": summary["final"].get("top1"),
                 "final_loss": summary["final"].get("loss"),
                 "consensus_distance": summary.get("consensus_distance"),
                 "samples_per_virtual_s": summary.get("samples_per_s"),
                 "host_s": summary.get("host_s"), "run_dir": run["run_dir"]}
        if algo != "ssgd":
            entry["mixing"] = mixing(algo, peers, n)
        table[name] = entry
    verdict = {}
    for algo in ("adpsgd", "dpsgd"):
        deficits = {}
        for n in args.nprocs:
            ring = table[f"n{n}-{algo}-fixed_ring"]["final_top1"]
            best = max(table[f"n{n}-{algo}-{p}"]["final_top1"]
                       for p in PEER_CHOICES if p != "fixed_ring")
            deficits[n] = round(best - ring, 3)
            table[f"n{n}-{algo}-fixed_ring"]["behind_best_other_by"] = deficits[n]
        verdict[algo] = {"ring_deficit_top1_points": {str(n): d for n, d in deficits.items()},
                         "margin_points": args.margin,
                         "fixed_ring_falls_behind_at": falls_behind_at(deficits, args.margin)}
    return record.finish({
        "study": "spectral", "recipe": "digit_images", "train_size": args.train_size,
        "heldout_size": args.heldout_size, "model": STUDY_MODEL, "batch_size": args.batch_size,
        "epochs": args.epochs, "nprocs": args.nprocs, "lr_rule": f"{args.lr} x sqrt(n x b / 256)",
        "runs": table, "verdict": verdict, "run_dirs": str(args.runs)})


def rows(r: dict[str, Any]) -> list[str]:
    found = []
    for e in r["runs"].values():
        top1 = " / ".join(f"{p['top1']:.1f}" for p in e["curve"])
        behind = e.get("behind_best_other_by")
        found.append(f"| {r['date'][:10]} | {e['algo']} | {e['peers']} | {e['nprocs']} | "
                     f"{e['lr']} | {top1} | {e['final_loss']:.3f} | "
                     f"{e['consensus_distance']:.3g} | "
                     f"{'-' if behind is None else f'{behind:.1f}'} |")
    return found
