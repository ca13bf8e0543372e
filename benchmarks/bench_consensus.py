"""Spectral gap and measured consensus contraction, fixed against randomized ring, n = 8..128,
from the mixing matrices of runner/topology (no ranks).

    python benchmarks/bench_consensus.py --json consensus.json --markdown consensus.md --plot c.png
    python benchmarks/bench_consensus.py --n 8 16 --quick

Theory (docs/algorithms.md, Topologies and spectral gap): for the fixed ring W,
``rho = SLEM(W)^2``; for the randomized ring W_k = P_k^T W P_k (a fresh permutation every
step), ``rho = SLEM(E[W^T W]) = 1/3 - 2/(3(n-1))``.
Both bound the per-step contraction of the consensus distance
``Xi = (1/n) sum_i ||x_i - xbar||^2`` under pure gossip ``X <- X W_k``: exactly
(asymptotically) for the fixed ring, in expectation for the random one.

Measured: each trial draws X (``--dim`` x n, mean removed), runs pure gossip with the very
matrices the trainer uses (``mixing_matrix(n, step)``), and records Xi every step until theory
predicts a 1e-12 decay (at least 60 steps, at most --max-steps). The per-step contraction is
``exp(slope)`` of a least-squares line through log Xi over the last three quarters of the
steps (the first quarter is the transient while faster modes die out), and, for comparison
with the expectation bound, the mean of the ratios Xi_{k+1} / Xi_k over the same steps. Trials
use different X and permutation seeds; the table gives their mean.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from runner.topology import TOPOLOGIES
from runner.topology.spectral import centering, summarize

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "consensus"
TOPOLOGY_NAMES = ("ring", "random_ring")
FULL = {"n": [8, 16, 32, 64, 128], "trials": 5, "max_steps": 40000}
QUICK = {"n": [8, 16], "trials": 2, "max_steps": 3000}
MIN_STEPS = 60  # a fit over fewer steps of a random pattern is mostly noise
MD_HEADER = ("| n | topology | spectral gap | rho (theory) | measured contraction (fit) | "
             "measured mean ratio | 1 - rho | 1 - measured | steps |\n"
             "|---|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME, trains=False)
    p.add_argument("--n", type=int, nargs="+", help=f"learner counts (default {FULL['n']})")
    p.add_argument("--trials", type=int, help=f"default {FULL['trials']}")
    p.add_argument("--max-steps", type=int, help=f"default {FULL['max_steps']}")
    p.add_argument("--dim", type=int, default=32, help="model dimension d of X (d x n)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, help="write a PNG of 1 - rho against n here")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if min(*args.n, args.trials, args.max_steps, args.dim) < 1 or min(args.n) < 4:
        p.error("--n must be >= 4; --trials, --max-steps and --dim >= 1")
    return args


def gossip_trace(topology, n: int, steps: int, dim: int, rng: np.random.Generator
                 ) -> np.ndarray:
    """Xi_0..Xi_steps of pure gossip from a random X with its mean removed (a small mean
    keeps rounding in the mean from masking a tiny deviation)."""
    x = rng.standard_normal((dim, n)) @ centering(n)
    trace = np.empty(steps + 1)
    fixed = None if topology.time_varying else topology.mixing_matrix(n)
    for k in range(steps + 1):
        deviation = x - x.mean(axis=1, keepdims=True)
        trace[k] = float(np.sum(deviation * deviation)) / n
        if k < steps:
            x = x @ (fixed if fixed is not None else topology.mixing_matrix(n, k))
    return trace


def fit_contraction(trace: np.ndarray) -> tuple[float, float]:
    """(exp of the least-squares slope of log Xi, mean of Xi_{k+1}/Xi_k) after the transient."""
    start = len(trace) // 4
    tail = trace[start:]
    steps = np.arange(len(tail))
    slope = np.polyfit(steps, np.log(tail), 1)[0]
    return float(math.exp(slope)), float(np.mean(tail[1:] / tail[:-1]))


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_consensus.py", args.argv, args.quick)
    rows = []
    for n in args.n:
        for name in TOPOLOGY_NAMES:
            theory = summarize(TOPOLOGIES.get(name)(None, seed=args.seed), n)
            rho = theory["rho"]
            predicted = math.ceil(math.log(1e-12) / math.log(rho))
            steps = min(args.max_steps, max(MIN_STEPS, predicted))
            fits, ratios = [], []
            for trial in range(args.trials):
                topology = TOPOLOGIES.get(name)(None, seed=args.seed + trial)
                rng = np.random.default_rng([args.seed, n, trial])
                fit, ratio = fit_contraction(gossip_trace(topology, n, steps, args.dim, rng))
                fits.append(fit)
                ratios.append(ratio)
            measured = float(np.mean(fits))
            rows.append({"n": n, "topology": name, "spectral_gap": theory["spectral_gap"],
                         "rho": rho, "one_minus_rho": 1 - rho,
                         "measured_contraction": measured,
                         "measured_contraction_trials": fits,
                         "measured_mean_ratio": float(np.mean(ratios)),
                         "one_minus_measured": 1 - measured,
                         "measured_over_theory": measured / rho if rho else None,
                         "steps": steps})
    return record.finish({"trials": args.trials, "dim": args.dim, "seed": args.seed,
                          "rows": rows})


def markdown_rows(r: dict) -> list[str]:
    return [f"| {x['n']} | {x['topology']} | {x['spectral_gap']:.6f} | {x['rho']:.6f} | "
            f"{x['measured_contraction']:.6f} | {x['measured_mean_ratio']:.6f} | "
            f"{x['one_minus_rho']:.6f} | {x['one_minus_measured']:.6f} | {x['steps']} |"
            for x in r["rows"]]


def plot(r: dict, path: Path) -> None:
    """1 - rho (theory, lines) and 1 - measured contraction (markers) against n, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.8), dpi=90, layout="constrained")
    ax = fig.add_subplot()
    for index, name in enumerate(TOPOLOGY_NAMES):
        rows = [x for x in r["rows"] if x["topology"] == name]
        ns = [x["n"] for x in rows]
        ax.plot(ns, [x["one_minus_rho"] for x in rows], "-", color=f"C{index}",
                label=f"{name}: 1 - rho (theory)")
        ax.plot(ns, [x["one_minus_measured"] for x in rows], "o", color=f"C{index}",
                label=f"{name}: 1 - measured")
    ax.set(xscale="log", yscale="log", xlabel="learners n",
           ylabel="consensus distance removed per step",
           title="pure gossip: fixed against randomized ring")
    ns = sorted({x["n"] for x in r["rows"]})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> None:
        from threadpoolctl import threadpool_limits

        # n x n products are far too small for threads; on a busy machine BLAS threads
        # spinning against other processes made them 100x slower.
        with threadpool_limits(limits=1):
            result = measure(args)
        if args.plot:
            plot(result, args.plot)
            result["plot"] = str(args.plot)
        bench.write_outputs(result, args.json, args.markdown, MD_HEADER, markdown_rows(result))

    return bench.run_benchmark("bench_consensus", body)


if __name__ == "__main__":
    raise SystemExit(main())
