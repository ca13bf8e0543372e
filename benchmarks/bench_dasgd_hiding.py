"""DaSGD communication hiding: step time with delayed (background) model averaging against
the compute-only step time (goal <= 1.05), with blocking averaging beside it to show what the
communication costs when it is not hidden.

    python benchmarks/bench_dasgd_hiding.py                   # 2 ranks, tau 1 and 4, 3 repetitions
    python benchmarks/bench_dasgd_hiding.py --taus 1 2 4 --repeats 5 --json hiding.json
    python benchmarks/bench_dasgd_hiding.py --quick           # seconds: checks the wiring only

Three settings of the same algorithm module (runner/algos/dasgd.py), so that the step is the
same code in each and only the averaging differs:

* compute-only: ``algo.tau=0``, so no averaging ever starts;
* hidden: ``algo.delay=1``: every tau steps an allreduce of the model starts on the
  communication thread and is merged one step later, while that step computes;
* blocking: ``algo.delay=0``: the same allreduce, waited for at once (local SGD, period tau).

Step time is the run's training seconds (evaluation excluded) over its steps. The default model
is the digits CNN with a 4096-unit hidden layer: 4.3M parameters, 17 MB averaged per
allreduce, about as long as a step's compute on one core, so communication is not negligible.
All cases run in one mpiexec job, interleaved per repetition; ratios are medians.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "dasgd_hiding"
FULL = {"nprocs": 2, "repeats": 3, "epochs": 3, "batch_size": 32, "taus": [1, 4],
        "overrides": ["recipe=digit_images", "recipe.hidden=4096"]}
QUICK = {"nprocs": 2, "repeats": 1, "epochs": 1, "batch_size": 32, "taus": [4],
         "overrides": ["recipe=digit_images"]}
GOAL = 1.05
MD_HEADER = ("| date | ranks | model | tau | compute-only ms/step | hidden (delay 1) ms/step | "
             "ratio (goal <= 1.05) | blocking (delay 0) ms/step | ratio | load before/after |\n"
             "|---|---|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    p.add_argument("--nprocs", type=int, help=f"ranks (default {FULL['nprocs']})")
    p.add_argument("--taus", type=int, nargs="+",
                   help=f"averaging periods (default {FULL['taus']})")
    p.add_argument("--repeats", type=int, help=f"default {FULL['repeats']}")
    p.add_argument("--epochs", type=int, help=f"per run (default {FULL['epochs']})")
    p.add_argument("--batch-size", type=int, help="per rank (default 32)")
    p.add_argument("overrides", nargs="*", help="adpsgd-run overrides for every case "
                   f"(default: {' '.join(FULL['overrides'])})")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if min(args.nprocs, args.repeats, args.epochs, args.batch_size, *args.taus) < 1:
        p.error("--nprocs, --taus, --repeats, --epochs and --batch-size must be >= 1")
    return args


def settings(taus: list[int]) -> dict[str, list[str]]:
    """Setting name -> DaSGD overrides."""
    out = {"compute": ["algo.tau=0", "algo.delay=0"]}  # never averages
    for tau in taus:
        out[f"hidden-tau{tau}"] = [f"algo.tau={tau}", "algo.delay=1"]
        out[f"blocking-tau{tau}"] = [f"algo.tau={tau}", "algo.delay=0"]
    return out


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_dasgd_hiding.py", args.argv, args.quick)
    base = [*args.overrides, "algo=dasgd", f"launcher.nprocs={args.nprocs}",
            f"trainer.epochs={args.epochs}", f"trainer.batch_size={args.batch_size}",
            "trainer.progress=false"]
    chosen = settings(args.taus)
    cases = {f"{r}-{name}": [*base, *extra] for r in range(args.repeats)
             for name, extra in chosen.items()}
    runs = bench.run_cases(args.runs, cases, nprocs=args.nprocs, timeout_s=args.timeout)
    step_ms = {}
    merge_wait_ms = {}
    for name in chosen:
        summaries = [runs[f"{r}-{name}"]["summary"] for r in range(args.repeats)]
        step_ms[name] = [1000 * s["train_s"] / s["steps"] for s in summaries]
        waits = [sum(s["algo_stats"]["merge_wait_s"]) / len(s["algo_stats"]["merge_wait_s"])
                 for s in summaries]
        merge_wait_ms[name] = 1000 * bench.median(waits) / summaries[0]["steps"]
    compute = bench.median(step_ms["compute"])
    per_tau = {}
    for tau in args.taus:
        hidden = bench.median(step_ms[f"hidden-tau{tau}"])
        blocking = bench.median(step_ms[f"blocking-tau{tau}"])
        per_tau[str(tau)] = {
            "hidden_ms_per_step": hidden, "blocking_ms_per_step": blocking,
            "hidden_ratio": hidden / compute, "blocking_ratio": blocking / compute,
            "hidden_merge_wait_ms_per_step": merge_wait_ms[f"hidden-tau{tau}"],
            "blocking_merge_wait_ms_per_step": merge_wait_ms[f"blocking-tau{tau}"],
            "goal_met": hidden / compute <= GOAL}
    return record.finish({
        "nprocs": args.nprocs, "epochs": args.epochs, "batch_size": args.batch_size,
        "repeats": args.repeats, "overrides": base,
        "parameters": bench.parameter_count(runs[f"0-{next(iter(chosen))}"]["run_dir"]),
        "compute_ms_per_step": compute, "step_ms": step_ms, "taus": per_tau,
        "goal": f"hidden_ratio <= {GOAL}", "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    model = " ".join(o for o in r["overrides"] if o.startswith("recipe"))
    return [f"| {r['date'][:10]} | {r['nprocs']} | {model} ({r['parameters'] / 1e6:.1f}M) | "
            f"{tau} | {r['compute_ms_per_step']:.1f} | {t['hidden_ms_per_step']:.1f} | "
            f"{t['hidden_ratio']:.3f} | {t['blocking_ms_per_step']:.1f} | "
            f"{t['blocking_ratio']:.3f} | {r['load_before'][0]} / {r['load_after'][0]} |"
            for tau, t in r["taus"].items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    return bench.measure_and_write("bench_dasgd_hiding", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
