"""Time to a target WER on spoken digits (the default recipe) for ssgd, adpsgd (fixed and
random pattern, delay-by-one), hadpsgd and dasgd at the same epoch budget; and a batch-size
sweep testing the seeds' claim that AD-PSGD converges with about 3x the batch of SSGD.

    python benchmarks/bench_time_to_wer.py --json wer.json --markdown wer.md   # ~40 min on 2 cores
    python benchmarks/bench_time_to_wer.py --skip-sweep                        # the comparison only
    python benchmarks/bench_time_to_wer.py --quick      # a tiny corpus, 1 epoch: the wiring only
    adpsgd-report RUNS/ssgd RUNS/adpsgd ... --out docs/results/time_to_wer  # the pictures

Every case trains the default job's recipe and settings (4 ranks in 2 emulated nodes, 8
epochs, batch 16 per rank, the recipe's rate scaled linearly with the global batch) with one
algorithm; all run in one mpiexec job, one after another, each leaving a run dir under
--runs for adpsgd-report. Time to a target is the wall time (from the start of training,
evaluations included, as the user waits) of the first epoch-end evaluation of the averaged
model whose WER is at or below the target.

The sweep trains ssgd and adpsgd with per-rank batches --sweep-batches (the rate scaled
linearly each time) for the same epochs. A batch is *tolerated* when the final WER stays
within --tolerance points of that algorithm's WER at the smallest batch; the claim holds when
adpsgd's largest tolerated batch is at least 3x ssgd's. Long runs can be resumed: --reuse keeps
the cases of --runs that already completed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "time_to_wer"
ALGOS = ["ssgd", "adpsgd", "adpsgd_random", "adpsgd_delay_by_one", "hadpsgd", "dasgd"]
SWEEP_ALGOS = ["ssgd", "adpsgd"]
FULL = {"epochs": 8, "batch_size": 16, "sweep_batches": [16, 32, 48], "targets": [20.0, 10.0, 5.0],
        "overrides": ["recipe=spoken_digits"]}
# A corpus of 32 utterances by 8 voices (4 held out): a second or two per case, 2 steps of
# the global batch of 16 and 1 at the sweep's 32; the WERs mean nothing.
QUICK = {"epochs": 1, "batch_size": 4, "sweep_batches": [4, 8], "targets": [100.0, 50.0],
         "overrides": ["recipe=spoken_digits", "recipe.synth.num_train=32",
                       "recipe.synth.num_eval=4", "recipe.synth.train_speakers=8",
                       "recipe.synth.eval_speakers=2"]}
MD_HEADER = ("| date | algorithm | batch/rank | final WER | best WER | time to targets (s) | "
             "epochs to targets | train s | samples/s | load before/after |\n"
             "|---|---|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME, timeout_s=4 * 3600)  # ~1 h on a busy 2-core machine
    p.add_argument("--algos", nargs="+", choices=ALGOS, default=ALGOS)
    p.add_argument("--epochs", type=int, help=f"the budget of every run (default {FULL['epochs']})")
    p.add_argument("--batch-size", type=int, help="per rank (default 16)")
    p.add_argument("--targets", type=float, nargs="+", help=f"WERs, %% (default {FULL['targets']})")
    p.add_argument("--sweep-batches", type=int, nargs="+",
                   help=f"per-rank batches of the sweep (default {FULL['sweep_batches']})")
    p.add_argument("--tolerance", type=float, default=2.0,
                   help="WER points above the smallest batch's that still count as converged")
    p.add_argument("--skip-sweep", action="store_true", help="no batch-size sweep")
    p.add_argument("--reuse", action="store_true",
                   help="keep the completed cases of --runs (resume an interrupted benchmark)")
    p.add_argument("overrides", nargs="*", help="adpsgd-run overrides for every case "
                   f"(default: {' '.join(FULL['overrides'])})")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    args.sweep_batches = sorted(set(args.sweep_batches))
    if min(args.epochs, args.batch_size, *args.sweep_batches) < 1:
        p.error("--epochs, --batch-size and --sweep-batches must be >= 1")
    return args


def time_to(evaluations: list[dict], target: float, key: str) -> float | None:
    """``key`` (wall_s or epoch) of the first held-out evaluation at or below ``target``."""
    for record in evaluations:
        if record.get("split") == "eval" and record.get("wer") is not None \
                and record["wer"] <= target:
            return record[key]
    return None


def describe(run: dict, targets: list[float]) -> dict:
    s, evaluations = run["summary"], run["metrics"]
    wers = [r["wer"] for r in evaluations if r.get("split") == "eval" and r.get("wer") is not None]
    return {"run_dir": run["run_dir"], "final_wer": s["wer"], "best_wer": min(wers),
            "train_s": s["train_s"], "wall_s": s["wall_s"], "samples_per_s": s["samples_per_s"],
            "time_to_target_s": {str(t): time_to(evaluations, t, "wall_s") for t in targets},
            "epochs_to_target": {str(t): time_to(evaluations, t, "epoch") for t in targets},
            "wer_by_epoch": [[r["epoch"], r["wer"]] for r in evaluations
                             if r.get("split") == "eval"]}


def sweep_verdict(sweep: dict[str, dict[int, dict]], tolerance: float) -> dict:
    """Largest tolerated batch per algorithm, and whether adpsgd's is >= 3x ssgd's."""
    tolerated = {}
    for algo, by_batch in sweep.items():
        smallest = by_batch[min(by_batch)]["final_wer"]
        ok = [b for b, r in by_batch.items() if r["final_wer"] <= smallest + tolerance]
        tolerated[algo] = max(ok)
    ratio = tolerated["adpsgd"] / tolerated["ssgd"]
    largest = max(b for by_batch in sweep.values() for b in by_batch)
    return {"tolerated_batch": tolerated, "ratio": ratio, "claim_holds": ratio >= 3,
            # Both tolerating the largest batch tried says nothing about the claim.
            "inconclusive": all(t == largest for t in tolerated.values())}


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_time_to_wer.py", args.argv, args.quick)
    base = [*args.overrides, "launcher.nprocs=4", "launcher.procs_per_node=2",
            f"trainer.epochs={args.epochs}", "trainer.progress=false"]
    cases = {algo: [*base, *bench.ALGORITHM_VARIANTS[algo], f"trainer.batch_size={args.batch_size}"]
             for algo in args.algos}
    sweep_cases = {} if args.skip_sweep else {
        (algo, b): algo if b == args.batch_size and algo in cases else f"{algo}-b{b}"
        for algo in SWEEP_ALGOS for b in args.sweep_batches}
    for (algo, b), name in sweep_cases.items():
        cases.setdefault(name, [*base, *bench.ALGORITHM_VARIANTS[algo], f"trainer.batch_size={b}"])
    runs = bench.run_cases(args.runs, cases, nprocs=4, timeout_s=args.timeout, reuse=args.reuse)
    comparison = {algo: describe(runs[algo], args.targets) for algo in args.algos}
    result = {"nprocs": 4, "procs_per_node": 2, "epochs": args.epochs,
              "batch_size": args.batch_size, "targets": args.targets, "overrides": base,
              "algorithms": comparison, "run_dirs": str(args.runs)}
    if sweep_cases:
        sweep: dict[str, dict[int, dict]] = {}
        for (algo, b), name in sweep_cases.items():
            sweep.setdefault(algo, {})[b] = describe(runs[name], args.targets)
        result["sweep"] = {algo: {str(b): r for b, r in by_batch.items()}
                           for algo, by_batch in sweep.items()}
        result["sweep_verdict"] = {**sweep_verdict(sweep, args.tolerance),
                                   "tolerance_wer_points": args.tolerance}
    return record.finish(result)


def _cell(values: dict, fmt: str) -> str:
    """Values per target, "-" where the target was not reached."""
    return " / ".join("-" if v is None else format(v, fmt) for v in values.values())


def markdown_rows(r: dict) -> list[str]:
    rows = []
    entries = [(algo, r["batch_size"], e) for algo, e in r["algorithms"].items()]
    for algo, by_batch in r.get("sweep", {}).items():
        entries += [(algo, int(b), e) for b, e in by_batch.items()
                    if not (int(b) == r["batch_size"] and algo in r["algorithms"])]
    for algo, batch, e in entries:
        rows.append(f"| {r['date'][:10]} | {algo} | {batch} | {e['final_wer']:.2f} | "
                    f"{e['best_wer']:.2f} | {_cell(e['time_to_target_s'], '.0f')} | "
                    f"{_cell(e['epochs_to_target'], '.2f')} | {e['train_s']:.0f} | "
                    f"{e['samples_per_s']:.1f} | {r['load_before'][0]} / {r['load_after'][0]} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    return bench.measure_and_write("bench_time_to_wer", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
