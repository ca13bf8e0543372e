"""Does losing a learner change what the job learns? Seeds against seeds.

bench_elastic.py compares one killed run of each algorithm with the spread of five
uninterrupted ones. A single run from the very same distribution as five others falls
outside their range with probability 2/6, so over 17 such comparisons about 6 land outside by
chance alone: one run cannot tell a kill's effect from a seed's. Here every kind of run is
repeated over the same seeds, on the digit images with 4 elastic ranks (hadpsgd: 2 super
learners of 2), bench_elastic.py's jobs and kill (learner 2, kill -9 from outside once a
third of the sample budget is done):

* ``uninterrupted``: nobody killed;
* ``killed``: the job goes on with 3 learners;
* ``rejoined``: the same kill with ``launcher.spares=1``: a spare takes the lost place;
* ``respawned`` (``--kinds``): the same kill with ``launcher.respawn=true``: a replacement is
  spawned into the job. It needs steps slowed (``--delay-s 0.05``, for every kind of run:
  the asynchronous algorithms' averagings depend on it), else the 8 epochs left after the
  kill end before a replacement has started.

Verdict, fixed before measuring: a kind holds the uninterrupted runs' accuracy when the
median of its held-out top-1 over the seeds lies inside the uninterrupted runs' range (the
median, since an algorithm that now and then diverges at the digits' rate, uninterrupted
too, would move a mean by tens of points). Also reported: how many of its runs are inside
that range, and the difference of the means with its standard error::

    python benchmarks/bench_held_out.py --json docs/results/held_out.json
    python benchmarks/bench_held_out.py --algos sgp dasgd --seeds 0 1 2 3 4 5 6 7
    python benchmarks/bench_held_out.py --algos adpsgd hadpsgd --kinds respawned --delay-s 0.05
    python benchmarks/bench_held_out.py --quick     # ssgd, 2 epochs, seed 0, killed: the wiring
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from benchmarks.bench_elastic import (  # noqa: E402
    EPOCHS_SCALE,
    killed_run,
    start,
    wait,
)
from benchmarks.bench_elastic import FULL as ELASTIC_FULL  # noqa: E402

NAME = "held_out"
# Each kind of run: what its job adds to the uninterrupted one's (and the same kill).
KINDS = {"killed": [], "rejoined": ["launcher.spares=1"], "respawned": ["launcher.respawn=true"]}
FULL = {"algos": ELASTIC_FULL["algos"], "epochs": 12, "seeds": [0, 1, 2, 3, 4],
        "kinds": ["killed", "rejoined"]}
# --quick: the kill without a spare, whose run bench_elastic.py's --quick does not make (its
# kill with one is the same killed_run with launcher.spares=1).
QUICK = {"algos": ["ssgd"], "epochs": 2, "seeds": [0], "kinds": ["killed"]}
MD_HEADER = ("| date | algorithm | seeds | step delay | top-1 uninterrupted: median (range) | "
             + " | ".join(f"{kind}: median (range), runs inside" for kind in KINDS)
             + " | verdict |\n" + "|---" * (6 + len(KINDS)) + "|\n")


def compare(uninterrupted: list[float], other: list[float]) -> dict:
    """``other``'s top-1 against the uninterrupted runs': the verdict (its median inside
    their range), its runs inside, and the difference of the means with its standard error
    (None with fewer than 2 runs on either side)."""
    low, high = min(uninterrupted), max(uninterrupted)
    median = statistics.median(other)
    difference = statistics.fmean(other) - statistics.fmean(uninterrupted)
    error = (math.sqrt(statistics.variance(uninterrupted) / len(uninterrupted)
                       + statistics.variance(other) / len(other))
             if min(len(uninterrupted), len(other)) >= 2 else None)
    return {"median": median, "low": min(other), "high": max(other),
            "inside": low <= median <= high,
            "runs_inside": sum(low <= x <= high for x in other), "runs": len(other),
            "mean_difference": difference, "standard_error": error}


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_held_out.py", args.argv, args.quick)
    slowed = [f"faults.delay_s={args.delay_s}"] if args.delay_s else []
    cases = []
    for algo in args.algos:
        root = args.runs / algo
        epochs = max(1, round(args.epochs * EPOCHS_SCALE.get(algo, 1)))
        top1: dict[str, dict[int, float]] = {"uninterrupted": {}, **{k: {} for k in args.kinds}}
        learners_at_end = {}
        for seed in args.seeds:
            run_dir = root / f"uninterrupted-seed{seed}"  # start() adds the algorithm's args
            top1["uninterrupted"][seed] = wait(
                start(run_dir, algo, epochs, True, f"seed={seed}", *slowed), run_dir,
                args.timeout)["top1"]
            for kind in args.kinds:
                measured = killed_run(root / f"{kind}-seed{seed}", algo, epochs, args.timeout,
                                      f"seed={seed}", *slowed, *KINDS[kind])
                top1[kind][seed] = measured["summary"]["top1"]
                learners_at_end[f"{kind}-seed{seed}"] = measured["summary"]["learners_at_end"]
            print(f"{algo} seed {seed}: top-1 " + ", ".join(
                f"{kind} {values[seed]:.2f}" for kind, values in top1.items()),
                file=sys.stderr, flush=True)
        base = list(top1["uninterrupted"].values())
        cases.append({"algo": algo, "epochs": epochs, "seeds": list(args.seeds),
                      "delay_s": args.delay_s, "kinds": list(args.kinds), "top1": top1,
                      "learners_at_end": learners_at_end,
                      **{kind: compare(base, list(top1[kind].values())) for kind in args.kinds}})
    return record.finish({"cases": cases, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    def spread(values) -> str:
        values = list(values)
        return (f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")

    def kind_cell(c: dict, kind: str) -> str:
        if kind not in c["kinds"]:
            return "-"
        k = c[kind]
        return (f"{k['median']:.2f} ({k['low']:.2f}-{k['high']:.2f}), "
                f"{k['runs_inside']} of {k['runs']}")

    return [f"| {r['date'][:10]} | {c['algo']} | {len(c['seeds'])} | {c['delay_s']:g} s | "
            f"{spread(c['top1']['uninterrupted'].values())} | "
            + " | ".join(kind_cell(c, kind) for kind in KINDS)
            + f" | {'inside' if all(c[k]['inside'] for k in c['kinds']) else 'OUTSIDE'} |"
            for c in r["cases"]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_common_arguments(parser, NAME, timeout_s=600)
    parser.add_argument("--algos", nargs="+", choices=FULL["algos"],
                        help=f"default: {' '.join(FULL['algos'])}; --quick: ssgd")
    parser.add_argument("--epochs", type=int, help="default: 12; --quick: 2")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="the seeds of every kind of run; default: 0 1 2 3 4; --quick: 0")
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS),
                        help="the kinds of run beside the uninterrupted one; default: killed "
                        "rejoined")
    parser.add_argument("--delay-s", type=float, default=0.0,
                        help="seconds every step of every run sleeps (faults.delay_s: a "
                        "heavier model's step, which respawned runs need so that a "
                        "replacement joins before the end; default 0)")
    args = parser.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_held_out", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
