"""Simulator calibration: simulated against measured samples/s, 4 ranks on this machine.

ssgd, adpsgd, hadpsgd and dasgd, with and without a 4x straggler, simulated on a cluster
fitted to a real SSGD run here, against the same runs measured here (goal: every
simulated/measured ratio within 20%).

    python benchmarks/bench_sim_calibration.py                 # 3 x 8 epochs, every algorithm
    python benchmarks/bench_sim_calibration.py --algos ssgd adpsgd --conditions even
    python benchmarks/bench_sim_calibration.py --quick         # seconds: checks the wiring only

Three stages:

1. **Measure.** One mpiexec job of 4 real ranks (2 emulated nodes of 2, which hadpsgd needs)
   trains, as adpsgd-run would (benchmarks/harness.py), a one-epoch warm-up, then ``--repeats``
   times (3) the calibration run (ssgd, no straggler) and every compared case: each algorithm
   without and with ``faults.straggler.ranks=[3] faults.straggler.factor=4``. Each case
   reports its run of median samples/s (with that run's time split and steps); the
   calibration is the SSGD calibration run of median samples/s. The calibration runs are runs
   of their own, so that every compared case, SSGD's included, is a prediction, not the fit.
2. **Fit.** ``cluster=measured cluster.from_summary=CALIBRATION/summary.json``
   (runner/sim/cluster.py, measured_cluster): seconds per sample from the calibration run's
   compute time, an effective link from its exposed allreduce time.
3. **Simulate.** Every compared case once (the simulator is deterministic) with
   ``launcher=sim launcher.nprocs=4 launcher.procs_per_node=2`` and that cluster, in this
   process (what adpsgd-run does for launcher=sim, minus the process start; the JSON has each
   case's equivalent command).

Throughput is summary.json's ``samples_per_s``: for a real run, samples over the training
seconds of the slowest rank (after the ranks start together; evaluations and checkpoints
excluded, waiting for each other at them included); for a simulated one, samples over the
virtual seconds of the modelled cluster. ratio = simulated / measured. Each row has both time
splits (mean seconds per rank of compute, comm, idle, data, and what no timer covered), their
difference, and the steps each rank took (asynchronous algorithms: the straggler's against
the others'), so a row outside the band says where the model and the machine part ways.

Reading it on a machine with fewer cores than ranks (4 ranks on 2 cores here): the ranks
share the cores, so a rank waiting at a collective is mostly waiting while the other ranks
compute. The real runs show that time as SSGD's barrier ``idle``, H-ADPSGD's node ``comm`` and
DaSGD's merge waits. The measured cluster sees from summary.json's ``hosts`` that the cores
were shared and fits that wait as ``compute.contention`` (SSGD's barrier wait per second of
compute) and ``rendezvous_s`` (the least a collective takes: its allreduce time per step);
the time no timer covered becomes ``step_overhead_s``. A sleeping straggler (the fault
injection sleeps) gives its core to the others: the model lengthens a straggler's own step,
not its wait for a core (runner/sim/cluster.py, ComputeModel).
``repeat_ratio_ssgd`` (the same configuration measured apart) shows how far two real runs
differ, and ``fit_ratio_ssgd`` how well the fit reproduces its own run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "sim_calibration"
ALGOS = ("ssgd", "adpsgd", "hadpsgd", "dasgd")
CONDITIONS = ("even", "straggler")
STRAGGLER_RANK = 3
STRAGGLER = [f"faults.straggler.ranks=[{STRAGGLER_RANK}]", "faults.straggler.factor=4"]
NPROCS, PROCS_PER_NODE = 4, 2
BAND = 0.20  # |simulated / measured - 1| at most this
DEFAULT_OUT = Path("docs/results/sim/calibration.json")
SPLIT = ("compute", "comm", "idle", "data")
FULL = {"algos": list(ALGOS), "conditions": list(CONDITIONS), "repeats": 3, "epochs": 8,
        "batch_size": 32, "warmup": True, "overrides": ["recipe=digit_images"]}
QUICK = {"algos": ["ssgd", "adpsgd"], "conditions": ["even"], "repeats": 1, "epochs": 1,
         "batch_size": 32, "warmup": False, "overrides": ["recipe=digit_images"]}
MD_HEADER = ("| date | algorithm | samples/s measured / simulated | ratio | with 4x straggler "
             "measured / simulated | ratio | within 20% | load before/after |\n"
             "|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    # --out is --json under the name the simulator's results use; a full run writes
    # DEFAULT_OUT unless told otherwise, a --quick one only where told.
    p.add_argument("--out", dest="json", type=Path,
                   help=f"write the JSON result here (default {DEFAULT_OUT}; --quick: nowhere)")
    p.add_argument("--algos", nargs="+", choices=ALGOS, help="default: all")
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS,
                   help="without and/or with the 4x straggler on rank 3 (default: both)")
    p.add_argument("--repeats", type=int,
                   help=f"real runs per case, the median reported (default {FULL['repeats']})")
    p.add_argument("--epochs", type=int, help=f"per run (default {FULL['epochs']})")
    p.add_argument("--batch-size", type=int, help=f"per rank (default {FULL['batch_size']})")
    p.add_argument("overrides", nargs="*",
                   help=f"adpsgd-run overrides for every run, real and simulated (default: "
                        f"{' '.join(FULL['overrides'])})")
    p.set_defaults(warmup=None)  # FULL/QUICK decide
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if args.json is None and not args.quick:
        args.json = DEFAULT_OUT
    if min(args.repeats, args.epochs, args.batch_size) < 1:
        p.error("--repeats, --epochs and --batch-size must be >= 1")
    args.algos = list(dict.fromkeys(args.algos))
    args.conditions = [c for c in CONDITIONS if c in args.conditions]
    return args


def case_name(algo: str, condition: str) -> str:
    return f"{algo}-{condition}"


def cli(overrides: list[str], run_dir: Path) -> str:
    return " ".join(["adpsgd-run", *overrides, f"hydra.run.dir={run_dir}"])


# ---- the simulated side ----------------------------------------------------------------------
# ---- what a row holds ------------------------------------------------------------------------
def side(summary: dict[str, Any], run_dir: str, command: str) -> dict[str, Any]:
    """One run's numbers: throughput, seconds, the time split (mean over ranks and per rank)
    and the steps of every rank."""
    train_s = float(summary["train_s"])
    means = {k: float(summary.get(f"{k}_s", 0.0)) for k in SPLIT}
    steps = [int(s) for s in summary["steps_per_rank"]]
    per_rank = [{k: float(t.get(k, 0.0)) for k in SPLIT} for t in summary["per_rank"]]
    for t, n in zip(per_rank, steps):
        t["compute_ms_per_step"] = 1000 * t["compute"] / max(n, 1)
    others = [s for r, s in enumerate(steps) if r != STRAGGLER_RANK]
    return {
        "samples_per_s": float(summary["samples_per_s"]),
        "samples": int(summary["samples"]),
        "train_s": train_s,
        **{f"{k}_s": v for k, v in means.items()},
        # Training seconds of the slowest rank that no timer covered (mean rank's split
        # subtracted): loop overhead, logging, the rank's own descheduling between timers.
        "untimed_s": train_s - sum(means.values()),
        "ms_per_step": 1000 * train_s / max(max(steps), 1),
        "steps_per_rank": steps,
        "straggler_steps_vs_others": steps[STRAGGLER_RANK] / (sum(others) / len(others))
        if len(steps) > STRAGGLER_RANK and sum(others) else None,
        "per_rank": per_rank,
        "milestone_wait_s": summary.get("milestone_wait_s"),
        "algo_stats": summary.get("algo_stats", {}),
        "final_top1": summary.get("top1"),
        "run_dir": run_dir,
        "command": command,
    }


def compare(algo: str, condition: str, real: dict[str, Any], sim: dict[str, Any]
            ) -> dict[str, Any]:
    ratio = sim["samples_per_s"] / real["samples_per_s"]
    # Where the seconds differ (measured minus simulated, mean rank): which part of the
    # model is off when a ratio is.
    gap = {k: real[f"{k}_s"] - sim[f"{k}_s"] for k in (*SPLIT, "untimed", "train")}
    return {"algo": algo, "condition": condition, "straggler": condition == "straggler",
            "measured_samples_per_s": real["samples_per_s"],
            "simulated_samples_per_s": sim["samples_per_s"],
            "ratio": ratio, "within_band": abs(ratio - 1) <= BAND,
            "gap_s": gap, "measured": real, "simulated": sim}


def fitted_cluster(summary_path: Path) -> dict[str, Any]:
    """What cluster=measured takes from the calibration run (runner/sim/cluster.py)."""
    from runner.sim.cluster import _model_bytes, measured_cluster

    cfg = measured_cluster(summary_path)
    return {"seconds_per_sample": dict(cfg.compute.seconds_per_sample),
            "step_overhead_s": cfg.compute.step_overhead_s,
            "contention": cfg.compute.contention, "rendezvous_s": cfg.rendezvous_s,
            "latency_us": cfg.intra_node.latency_us,
            "bandwidth_gbps": cfg.intra_node.bandwidth_gbps,
            "model_bytes": _model_bytes(summary_path.parent / "checkpoints" / "final_rank0.pt"),
            "gpus_per_node": cfg.gpus_per_node, "allreduce": cfg.allreduce,
            "description": cfg.description}


# ---- the benchmark -------------------------------------------------------------------------
def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median samples/s (the lower middle one of an even count): its time split
    and steps belong to the number reported."""
    ordered = sorted(runs, key=lambda run: run["summary"]["samples_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_sim_calibration.py", args.argv, args.quick)
    base = [*args.overrides, f"launcher.nprocs={NPROCS}",
            f"launcher.procs_per_node={PROCS_PER_NODE}", f"trainer.epochs={args.epochs}",
            f"trainer.batch_size={args.batch_size}", "trainer.progress=false"]
    compared = {case_name(a, c): [*base, *bench.ALGORITHM_VARIANTS[a],
                                  *(STRAGGLER if c == "straggler" else [])]
                for a in args.algos for c in args.conditions}
    calibration_overrides = [*base, *bench.ALGORITHM_VARIANTS["ssgd"]]
    real_root, sim_root = args.runs / "real", args.runs / "sim"
    # One job: a one-epoch warm-up (the job's first run pays for first-time costs: allocator,
    # MPI connections, caches; not used), then per repetition the calibration run and
    # algorithm > (even, straggler), so that a drift in the machine's load hits every case.
    warmup = {"warmup": [*calibration_overrides, "trainer.epochs=1"]} if args.warmup else {}
    real_cases = dict(warmup)
    for r in range(args.repeats):
        real_cases[f"{r}-calibration"] = calibration_overrides
        real_cases.update({f"{r}-{name}": overrides for name, overrides in compared.items()})
    print(f"measuring {len(real_cases)} real runs on {NPROCS} ranks ...", file=sys.stderr,
          flush=True)
    started = time.perf_counter()
    real = bench.run_cases(real_root, real_cases, nprocs=NPROCS, timeout_s=args.timeout)
    real_s = time.perf_counter() - started
    load_after_real = bench.load_average()  # the simulations that follow load the machine too

    def repeats(name: str) -> list[dict[str, Any]]:
        return [real[f"{r}-{name}"] for r in range(args.repeats)]

    # The calibration: the SSGD run of median throughput among the repetitions (one run's
    # summary is what cluster=measured reads; the median keeps an outlier out of the fit).
    chosen = median_run(repeats("calibration"))
    calibration_dir = Path(chosen["run_dir"])
    summary_path = calibration_dir / "summary.json"
    sim_extra = ["launcher=sim", f"launcher.nprocs={NPROCS}",
                 f"launcher.procs_per_node={PROCS_PER_NODE}", "cluster=measured",
                 f"cluster.from_summary={summary_path}"]
    sim_cases = {name: [*overrides, *sim_extra] for name, overrides in compared.items()}
    print(f"simulating {len(sim_cases)} runs on the cluster fitted to {summary_path} ...",
          file=sys.stderr, flush=True)
    started = time.perf_counter()
    sim = bench.simulate_cases(sim_root, sim_cases)
    sim_s = time.perf_counter() - started

    calibration = side(chosen["summary"], str(calibration_dir),
                       cli(calibration_overrides, calibration_dir))
    calibration["repeats_samples_per_s"] = [run["summary"]["samples_per_s"]
                                            for run in repeats("calibration")]
    rows = []
    for algo in args.algos:
        for condition in args.conditions:
            name = case_name(algo, condition)
            runs = repeats(name)
            run = median_run(runs)
            measured = side(run["summary"], run["run_dir"],
                            cli(compared[name], Path(run["run_dir"])))
            measured["repeats_samples_per_s"] = [x["summary"]["samples_per_s"] for x in runs]
            simulated = side(sim[name]["summary"], sim[name]["run_dir"],
                             cli(sim_cases[name], sim_root / name))
            simulated["host_s"] = sim[name]["summary"].get("host_s")
            rows.append(compare(algo, condition, measured, simulated))
    within = [r["within_band"] for r in rows]
    by_name = {f"{row['algo']}-{row['condition']}": row for row in rows}
    result = {
        "nprocs": NPROCS, "procs_per_node": PROCS_PER_NODE, "epochs": args.epochs,
        "batch_size": args.batch_size, "repeats": args.repeats, "straggler": STRAGGLER,
        "band": BAND, "warmup_run": bool(args.warmup), "overrides": base,
        "how": ("real runs: one mpiexec job of 4 ranks running each case's run dir in turn "
                "(benchmarks/harness.py run_cases, as adpsgd-run trains it), every case "
                "--repeats times, the run of median samples/s reported; simulated runs "
                "(deterministic, once): launcher=sim in the benchmark's process; each entry's "
                "'command' is the equivalent adpsgd-run command"),
        "calibration": {**calibration, "separate_run": True,
                        "note": "ssgd without straggler, runs of their own (the median one "
                                "fitted): every compared case, ssgd-even included, is a "
                                "prediction, not the fit",
                        "fitted_cluster": fitted_cluster(summary_path)},
        # The same configuration measured apart (ssgd-even against the calibration run): the
        # run-to-run spread a ratio cannot be expected to beat.
        "repeat_ratio_ssgd": (by_name["ssgd-even"]["measured_samples_per_s"]
                              / calibration["samples_per_s"]) if "ssgd-even" in by_name
        else None,
        # ssgd-even's simulation is the calibration run's own configuration simulated: how
        # well the fit reproduces the run it was fitted to (no run-to-run spread in it).
        "fit_ratio_ssgd": (by_name["ssgd-even"]["simulated_samples_per_s"]
                           / calibration["samples_per_s"]) if "ssgd-even" in by_name
        else None,
        "rows": rows,
        "within_band": sum(within), "outside_band": len(within) - sum(within),
        "all_within_band": all(within),
        "real_jobs_s": real_s, "simulations_s": sim_s, "load_after_real_runs": load_after_real,
        "run_dirs": str(args.runs),
    }
    result = record.finish(result)
    print_table(result)
    return result


def print_table(r: dict[str, Any]) -> None:
    """Measured against simulated, per case, with both time splits (mean seconds per rank)."""
    cal = r["calibration"]
    fit = cal["fitted_cluster"]
    per_sample = next(iter(fit["seconds_per_sample"].values()))
    print(f"\ncalibration run: {cal['samples_per_s']:.0f} samples/s (median of "
          f"{', '.join(f'{x:.0f}' for x in cal['repeats_samples_per_s'])}); fitted "
          f"{per_sample * 1e6:.1f} us/sample, link {fit['latency_us']:.1f} us + "
          f"{fit['bandwidth_gbps']:.3g} Gb/s, model {fit['model_bytes'] / 1e6:.3g} MB",
          file=sys.stderr)
    if r["repeat_ratio_ssgd"] is not None:
        print(f"ssgd-even measured / calibration run (same config): "
              f"{r['repeat_ratio_ssgd']:.2f}; simulated ssgd-even / calibration run (the fit "
              f"on its own run): {r['fit_ratio_ssgd']:.2f}", file=sys.stderr)
    head = (f"{'case':<18} {'measured':>9} {'(range)':>11} {'simulated':>9} {'ratio':>6} "
            f"{'ok':>3}  {'compute/comm/idle/untimed s  measured':<38} {'simulated':<20} "
            f"steps measured / simulated")
    print(head, file=sys.stderr)
    for row in r["rows"]:
        m, s = row["measured"], row["simulated"]

        def split(x: dict) -> str:
            return "/".join(f"{x[k]:.2f}" for k in ("compute_s", "comm_s", "idle_s",
                                                    "untimed_s"))

        spread = m["repeats_samples_per_s"]
        print(f"{row['algo'] + '-' + row['condition']:<18} {m['samples_per_s']:>9.0f} "
              f"{f'{min(spread):.0f}-{max(spread):.0f}':>11} "
              f"{s['samples_per_s']:>9.0f} {row['ratio']:>6.2f} "
              f"{'yes' if row['within_band'] else 'NO':>3}  {split(m):<38} {split(s):<20} "
              f"{m['steps_per_rank']} / {s['steps_per_rank']}", file=sys.stderr)
    print(f"{r['within_band']} of {len(r['rows'])} within {r['band']:.0%}; load "
          f"{r['load_before']} -> {r['load_after']}\n", file=sys.stderr, flush=True)


def markdown_rows(r: dict) -> list[str]:
    rows = []
    for algo in dict.fromkeys(row["algo"] for row in r["rows"]):
        cells = []
        ok = []
        for condition in CONDITIONS:
            row = next((x for x in r["rows"] if x["algo"] == algo
                        and x["condition"] == condition), None)
            if row is None:
                cells += ["-", "-"]
                continue
            cells += [f"{row['measured_samples_per_s']:.0f} / "
                      f"{row['simulated_samples_per_s']:.0f}", f"{row['ratio']:.2f}"]
            ok.append(row["within_band"])
        rows.append(f"| {r['date'][:10]} | {algo} | {' | '.join(cells)} | "
                    f"{'yes' if all(ok) else 'no'} | "
                    f"{r['load_before'][0]} / {r['load_after'][0]} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_sim_calibration", args, measure, MD_HEADER,
                                   markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
