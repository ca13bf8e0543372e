"""Straggler resilience: every algorithm on 4 ranks with rank 3 computing 4x slower
(``faults.straggler.ranks=[3] faults.straggler.factor=4``) against no straggler; the share of
throughput kept (goal >= 0.70 for adpsgd and hadpsgd; SSGD's reported beside them).

    python benchmarks/bench_stragglers.py                      # 3 repetitions, 6 epochs each
    python benchmarks/bench_stragglers.py --algos ssgd adpsgd hadpsgd --repeats 5
    python benchmarks/bench_stragglers.py --quick              # seconds: checks the wiring only

All cases train in one mpiexec job of 4 ranks (2 emulated nodes of 2, which hadpsgd needs),
each as adpsgd-run would train it (benchmarks/harness.py), in the order repetition > algorithm >
(no straggler, straggler), so that a drift in the machine's load hits both sides of a ratio
alike. Throughput is the run's samples_per_s (samples over training seconds of the slowest
rank, evaluation excluded); kept = median with straggler / median without. The straggler
sleeps 3x its own forward/backward time each step (runner/trainer/loop.py): on a machine with fewer
cores than ranks, that sleep hands its core to the other ranks, which flatters every
algorithm whose other ranks do not wait for it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runner.runlog.summary import primary_metric

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "stragglers"
STRAGGLER = ["faults.straggler.ranks=[3]", "faults.straggler.factor=4"]
FULL = {"repeats": 3, "epochs": 6, "batch_size": 32,
        "overrides": ["recipe=digit_images", "recipe.hidden=1024"]}
QUICK = {"repeats": 1, "epochs": 1, "batch_size": 32, "overrides": ["recipe=digit_images"]}
GOALS = {"adpsgd": 0.70, "hadpsgd": 0.70}
MD_HEADER = ("| date | algorithm | samples/s | vs ssgd | with 4x straggler | kept | goal | "
             "load before/after |\n|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    p.add_argument("--algos", nargs="+", choices=list(bench.ALGORITHM_VARIANTS),
                   default=list(bench.ALGORITHM_VARIANTS), help="default: all")
    p.add_argument("--repeats", type=int, help=f"default {FULL['repeats']}")
    p.add_argument("--epochs", type=int, help=f"per run (default {FULL['epochs']})")
    p.add_argument("--batch-size", type=int, help="per rank (default 32)")
    p.add_argument("overrides", nargs="*",
                   help=f"adpsgd-run overrides for every case (default: "
                        f"{' '.join(FULL['overrides'])})")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if min(args.repeats, args.epochs, args.batch_size) < 1:
        p.error("--repeats, --epochs and --batch-size must be >= 1")
    return args


def case_name(repeat: int, algo: str, straggler: bool) -> str:
    return f"{repeat}-{algo}-{'straggler' if straggler else 'even'}"


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_stragglers.py", args.argv, args.quick)
    base = [*args.overrides, "launcher.nprocs=4", "launcher.procs_per_node=2",
            f"trainer.epochs={args.epochs}", f"trainer.batch_size={args.batch_size}",
            "trainer.progress=false"]
    cases = {case_name(r, algo, slow): [*base, *bench.ALGORITHM_VARIANTS[algo],
                                        *(STRAGGLER if slow else [])]
             for r in range(args.repeats) for algo in args.algos for slow in (False, True)}
    runs = bench.run_cases(args.runs, cases, nprocs=4, timeout_s=args.timeout)
    algorithms = {}
    for algo in args.algos:
        entry = {}
        for slow, key in ((False, "even"), (True, "straggler")):
            summaries = [runs[case_name(r, algo, slow)]["summary"] for r in range(args.repeats)]
            entry[f"{key}_samples_per_s"] = [s["samples_per_s"] for s in summaries]
            # Seconds each rank waited at evaluations and checkpoints for the others: with a
            # straggler, mostly for the step it was in when the others got there.
            entry[f"{key}_milestone_wait_s"] = [s.get("milestone_wait_s") for s in summaries]
            entry[f"{key}_median"] = bench.median(entry[f"{key}_samples_per_s"])
            # Asynchronous ranks take their own number of steps: the straggler fewer.
            entry[f"{key}_steps_per_rank"] = summaries[-1]["steps_per_rank"]
            metric = primary_metric(summaries[-1])
            entry[f"{key}_final_{metric}"] = bench.median([s[metric] for s in summaries])
        entry["kept"] = entry["straggler_median"] / entry["even_median"]
        entry["goal"] = GOALS.get(algo)
        entry["goal_met"] = entry["kept"] >= GOALS[algo] if algo in GOALS else None
        algorithms[algo] = entry
    if "ssgd" in algorithms:  # the field notes' other yardstick: speed when nobody straggles
        for entry in algorithms.values():
            entry["even_vs_ssgd"] = entry["even_median"] / algorithms["ssgd"]["even_median"]
    return record.finish({"nprocs": 4, "procs_per_node": 2, "straggler": STRAGGLER,
                          "epochs": args.epochs, "batch_size": args.batch_size,
                          "repeats": args.repeats, "overrides": base,
                          "algorithms": algorithms, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    rows = []
    for algo, e in r["algorithms"].items():
        goal = f">= {e['goal']:.2f}" if e["goal"] else "-"
        vs_ssgd = f"{e['even_vs_ssgd']:.2f}" if "even_vs_ssgd" in e else "-"
        rows.append(f"| {r['date'][:10]} | {algo} | {e['even_median']:.0f} | {vs_ssgd} | "
                    f"{e['straggler_median']:.0f} | {e['kept']:.2f} | {goal} | "
                    f"{r['load_before'][0]} / {r['load_after'][0]} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    return bench.measure_and_write("bench_stragglers", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
