"""Elastic training that grows back by itself: a learner killed, a replacement spawned into
the running job (launcher.respawn=true, runner/elastic/respawn.py), the job on n learners again.

For each algorithm, the digit images on 4 ranks (hadpsgd: 2 super learners of 2), elastic,
no spares, 12 epochs of steps slowed by ``--delay-s`` (0.05 s: a heavier model's step; the
8 epochs left after the kill then take longer than a replacement's start-up, where 4 epochs
of plain digits steps ended before it was ready, and 30 epochs diverged for choco): the same
job uninterrupted, and with learner 2 kill -9'd from outside once a third of the sample
budget is done. DiLoCo runs 6 epochs of steps slowed by twice ``--delay-s``: its outer step
at the digits' learning rate diverged at 12 epochs, uninterrupted too. Measured: seconds
from the kill to training again on 3 (the "lost" event), and to 4 learners again (the
"joined" event: the spawn, the replacement's start-up, which lockstep learners train
through, and the join); the held-out metric against the uninterrupted run's; that every
lockstep epoch used each sample once::

    python benchmarks/bench_respawn.py --json docs/results/respawn.json
    python benchmarks/bench_respawn.py --algos dpsgd adpsgd --epochs 12
    python benchmarks/bench_respawn.py --quick     # ssgd, 2 epochs: checks the wiring
    python benchmarks/bench_respawn.py --seeds 1 2 3 4  # and the respawned jobs with 4 more seeds

``--quick`` runs the respawned job only: no uninterrupted one (its top-1 is null, "-" in the
row), as each job's start-up on 4 ranks is most of the benchmark's time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from benchmarks.bench_elastic import (  # noqa: E402
    ONCE_CELL,
    every_sample_once,
    killed_run,
    start,
    wait,
)

NAME = "respawn"
ALGOS = ["ssgd", "dpsgd", "adpsgd", "hadpsgd", "sgp", "choco", "diloco"]
FULL = {"algos": ALGOS, "epochs": 12, "delay_s": 0.05}
QUICK = {"algos": ["ssgd"], "epochs": 2, "delay_s": 0.0}
# (epochs, delay) as a factor of --epochs and --delay-s: see the docstring.
SCALED = {"diloco": (0.5, 2.0)}
MD_HEADER = ("| date | algorithm | kill to training (on 3) | kill to 4 learners (join) | "
             "learners at end | top-1 uninterrupted / respawned | every sample once |\n"
             + "|---" * 7 + "|\n")


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_respawn.py", args.argv, args.quick)
    cases = []
    for algo in args.algos:
        root = args.runs / algo
        epochs_factor, delay_factor = SCALED.get(algo, (1.0, 1.0))
        epochs = max(2, round(args.epochs * epochs_factor))
        delay_s = round(args.delay_s * delay_factor, 3)
        slowed = f"faults.delay_s={delay_s}"
        # --quick: the respawned job only. The uninterrupted one adds no wiring (the same
        # start() and wait() the respawned job goes through), only a top-1 to compare with.
        plain = None if args.quick else wait(start(root / "uninterrupted", algo, epochs, True,
                                                   slowed), root / "uninterrupted", args.timeout)
        run = respawned(root / "respawned", algo, epochs, args.timeout, slowed)
        uninterrupted_top1 = None if plain is None else plain["top1"]
        again = []  # --seeds: the spread of what a respawn gives
        for seed in args.seeds:
            again.append({"seed": seed, **respawned(root / f"respawned-seed{seed}", algo,
                                                    epochs, args.timeout, slowed,
                                                    f"seed={seed}")})
            print(f"{algo} seed {seed}: 4 learners again {again[-1].get('kill_to_joined_s')} "
                  f"s, top-1 {again[-1]['top1']:.2f}", file=sys.stderr, flush=True)
        cases.append({"algo": algo, "epochs": epochs, "delay_s": delay_s, **run,
                      "uninterrupted_top1": uninterrupted_top1, "seeds": again})
        print(f"{algo}: training again {run['kill_to_training_s']} s, 4 learners again "
              f"{run.get('kill_to_joined_s')} s, top-1 {top1(uninterrupted_top1)} -> "
              f"{run['top1']:.2f}", file=sys.stderr, flush=True)
    return record.finish({"cases": cases, "run_dirs": str(args.runs)})


def respawned(run_dir: Path, algo: str, epochs: int, timeout_s: float, slowed: str,
              *extra: str) -> dict:
    """One respawned job: its timings (killed_run's), learners at the end, held-out top-1
    and whether every lockstep epoch used each sample once."""
    run = killed_run(run_dir, algo, epochs, timeout_s, "launcher.respawn=true", slowed, *extra)
    summary = run.pop("summary")
    return {**run, "learners_at_end": summary["learners_at_end"], "top1": summary["top1"],
            "every_sample_once": every_sample_once(summary)}


def top1(value: float | None) -> str:
    """A top-1 in a row; "-" for the uninterrupted job --quick does not run."""
    return "-" if value is None else f"{value:.2f}"


def markdown_rows(r: dict) -> list[str]:
    def joined(c: dict) -> str:
        if c.get("kill_to_joined_s") is None:
            return "never"
        return f"{c['kill_to_joined_s']:.2f} s ({c['joined_s']:.2f} s)"

    once = ONCE_CELL
    return [f"| {r['date'][:10]} | {c['algo']} | {c['kill_to_training_s']:.2f} s | "
            f"{joined(c)} | {c['learners_at_end']} | "
            f"{top1(c['uninterrupted_top1'])} / {c['top1']:.2f} | "
            f"{once[c['every_sample_once']]} |" for c in r["cases"]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_common_arguments(parser, NAME, timeout_s=600)
    parser.add_argument("--algos", nargs="+", choices=ALGOS,
                        help=f"default: {' '.join(ALGOS)}; --quick: ssgd")
    parser.add_argument("--epochs", type=int, help="default: 12; --quick: 2")
    parser.add_argument("--delay-s", type=float, help="seconds each step sleeps "
                        "(faults.delay_s); default: 0.05; --quick: 0")
    parser.add_argument("--seeds", type=int, nargs="*", default=[],
                        help="the respawned job again with these seeds (seed 0's is the "
                        "table's row); default: none")
    args = parser.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_respawn", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
