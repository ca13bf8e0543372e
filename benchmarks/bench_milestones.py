"""Waiting at milestones: the mean time an AD-PSGD rank waits at an evaluation or checkpoint
for the other ranks to get there, at 8 and 16 ranks.

    python benchmarks/bench_milestones.py                      # n = 8 and 16, 3 repetitions
    python benchmarks/bench_milestones.py --nprocs 8 --repeats 5
    python benchmarks/bench_milestones.py --quick              # seconds: checks the wiring only

Evaluations and checkpoints are collective points in global samples. Asynchronous ranks only
estimate the global count, so the first rank to reach a milestone waits there until the last
one's estimate reaches it too. What the rank waits is summary.json's ``milestone_wait_s``
(seconds per rank between arriving at the milestone and every rank having arrived, which
includes finishing the exchanges in flight); this benchmark reports it per milestone, the
mean over ranks, medians over repetitions. Every step sleeps a random 0-``--delay`` s
(``faults.delay_s``) so that ranks drift apart as they would on a shared cluster. Ranks are
oversubscribed on a small machine: what matters is the same workload before and after a
change, measured alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "milestones"
FULL = {"nprocs": [8, 16], "repeats": 3, "epochs": 3, "batch_size": 8, "eval_every": 2,
        "delay": 0.01, "overrides": ["recipe=digit_images"]}
QUICK = {"nprocs": [4], "repeats": 1, "epochs": 1, "batch_size": 8, "eval_every": 4,
         "delay": 0.001, "overrides": ["recipe=digit_images"]}
MD_HEADER = ("| date | algorithm | ranks | milestones per run | mean wait per milestone (ms) | "
             "runs | samples/s | load before/after |\n|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    p.add_argument("--nprocs", type=int, nargs="+", help=f"default {FULL['nprocs']}")
    p.add_argument("--algo", default="adpsgd", choices=["adpsgd", "adpsgd_random", "hadpsgd"],
                   help="default adpsgd (fixed pattern)")
    p.add_argument("--repeats", type=int, help=f"default {FULL['repeats']}")
    p.add_argument("--epochs", type=int, help=f"per run (default {FULL['epochs']})")
    p.add_argument("--batch-size", type=int, help=f"per rank (default {FULL['batch_size']})")
    p.add_argument("--eval-every", type=int,
                   help=f"steps between evaluations (default {FULL['eval_every']})")
    p.add_argument("--delay", type=float, help=f"faults.delay_s (default {FULL['delay']})")
    p.add_argument("overrides", nargs="*", help="adpsgd-run overrides for every case "
                   f"(default: {' '.join(FULL['overrides'])})")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if min(*args.nprocs, args.repeats, args.epochs, args.batch_size, args.eval_every) < 1:
        p.error("--nprocs, --repeats, --epochs, --batch-size and --eval-every must be >= 1")
    return args


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_milestones.py", args.argv, args.quick)
    per_n = {}
    for nprocs in args.nprocs:
        base = [*args.overrides, *bench.ALGORITHM_VARIANTS[args.algo],
                f"launcher.nprocs={nprocs}", "launcher.procs_per_node=2",
                f"trainer.epochs={args.epochs}", f"trainer.batch_size={args.batch_size}",
                f"trainer.eval_every={args.eval_every}", f"faults.delay_s={args.delay}",
                "trainer.progress=false"]
        cases = {f"n{nprocs}-{r}": base for r in range(args.repeats)}
        runs = bench.run_cases(args.runs, cases, nprocs=nprocs, timeout_s=args.timeout)
        summaries = [run["summary"] for run in runs.values()]
        waits_ms = [1000 * s["milestone_wait_s"] / max(1, s["milestones"]) for s in summaries]
        per_n[str(nprocs)] = {
            "mean_wait_ms_per_milestone": waits_ms,
            "median_ms": bench.median(waits_ms),
            "milestones": [s["milestones"] for s in summaries],
            "samples_per_s": [s["samples_per_s"] for s in summaries],
            "steps_per_rank": summaries[-1]["steps_per_rank"],
            "overrides": base}
    return record.finish({"algo": args.algo, "repeats": args.repeats, "nprocs": per_n,
                          "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    def each(waits: list[float]) -> str:
        return ", ".join(f"{w:.0f}" for w in waits)

    return [f"| {r['date'][:10]} | {r['algo']} | {n} | {bench.median(e['milestones']):.0f} | "
            f"{e['median_ms']:.1f} ({each(e['mean_wait_ms_per_milestone'])}) | "
            f"{len(e['milestones'])} | {bench.median(e['samples_per_s']):.0f} | "
            f"{r['load_before'][0]} / {r['load_after'][0]} |"
            for n, e in r["nprocs"].items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_milestones", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
