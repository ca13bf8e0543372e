"""What a lower precision on the wire (comm.exchange_dtype) costs in held-out accuracy: every
gossip and averaging algorithm trained with its models sent in float32, bfloat16 and float16,
on the same seeds, with the bytes each rank sent per step.

    python benchmarks/bench_exchange_dtype.py --json docs/results/exchange_dtype.json
    python benchmarks/bench_exchange_dtype.py --quick     # seconds: checks the wiring only

The difference that matters is against the float32 exchange of the same algorithm and seed:
the lockstep algorithms are deterministic, so it is the rounding's effect alone; AD-PSGD's
also holds its timing's. A rounded value is off by at most 2^-8 of itself in bfloat16 and
2^-11 in float16 (tests/mpi/comm_checks.py checks it on real ranks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "exchange_dtype"
DTYPES = ["float32", "bfloat16", "float16"]
FULL = {"algos": ["ssgd", "dpsgd", "adpsgd", "sgp", "choco_top1", "local_sgd", "diloco_p10"],
        "seeds": [0, 1], "epochs": 6, "nprocs": 4}
QUICK = {"algos": ["dpsgd"], "seeds": [0], "epochs": 1, "nprocs": 2}
WORKLOAD = ["recipe=digit_images", "trainer.batch_size=32", "trainer.progress=false"]
MD_HEADER = ("| date | algorithm | exchange | MB sent/step | held-out top-1 (seeds) | "
             "top-1 against float32 | held-out loss against float32 |\n"
             "|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    p.add_argument("--algos", nargs="+", choices=list(bench.ALGORITHM_VARIANTS),
                   help=f"default: {' '.join(FULL['algos'])}")
    p.add_argument("--seeds", nargs="+", type=int, help="default 0 1")
    p.add_argument("--epochs", type=int, help=f"default {FULL['epochs']}")
    p.add_argument("--nprocs", type=int, help=f"ranks (default {FULL['nprocs']})")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record(NAME, "benchmarks/bench_exchange_dtype.py", args.argv, args.quick)
    cases = {f"{algo}-{dtype}-{seed}": [
        *WORKLOAD, *bench.ALGORITHM_VARIANTS[algo], f"comm.exchange_dtype={dtype}",
        f"seed={seed}", f"trainer.epochs={args.epochs}", f"launcher.nprocs={args.nprocs}"]
        for algo in args.algos for dtype in DTYPES for seed in args.seeds}
    runs = bench.run_cases(args.runs, cases, args.nprocs, args.timeout)
    results: dict[str, Any] = {}
    for algo in args.algos:
        results[algo] = {}
        for dtype in DTYPES:
            summaries = [runs[f"{algo}-{dtype}-{seed}"]["summary"] for seed in args.seeds]
            results[algo][dtype] = {
                "top1": [s["final"]["top1"] for s in summaries],
                "loss": [s["final"]["loss"] for s in summaries],
                "bytes_per_step": [s["bytes_sent"]["mean_per_step"] for s in summaries]}
        base = results[algo]["float32"]
        for dtype in DTYPES:  # per seed, against the float32 exchange of the same seed
            entry = results[algo][dtype]
            entry["top1_change"] = [a - b for a, b in zip(entry["top1"], base["top1"])]
            entry["loss_change"] = [a - b for a, b in zip(entry["loss"], base["loss"])]
    return record.finish({"workload": WORKLOAD, "nprocs": args.nprocs, "epochs": args.epochs,
                          "seeds": args.seeds, "results": results,
                          "run_dirs": str(args.runs)})


def markdown_rows(r: dict[str, Any]) -> list[str]:
    def values(numbers: list[float], digits: int, signed: bool = False) -> str:
        return ", ".join(f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}" for x in numbers)

    return [f"| {r['date'][:10]} | {algo} | {dtype} | "
            f"{bench.median(e['bytes_per_step']) / 1e6:.3f} | {values(e['top1'], 2)} | "
            f"{values(e['top1_change'], 2, True)} | {values(e['loss_change'], 4, True)} |"
            for algo, by_dtype in r["results"].items() for dtype, e in by_dtype.items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write(NAME, args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
