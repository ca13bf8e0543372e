"""The seed papers' scale claims at 16-128 learners, in the simulator (launcher=sim; issue 17).

    python scripts/study_scale.py spectral          # adpsgd, dpsgd x 3 topologies x n = 16 .. 128
    python scripts/study_scale.py dasgd             # DaSGD's step time on a slow network, n <= 128
    python scripts/study_scale.py spectral --quick  # the wiring in seconds (numbers meaningless)

spectral (arXiv 2002.01119: the spectral gap shrinks as learners are added, which slows
convergence; a randomized pattern keeps it). AD-PSGD and D-PSGD train recipe=digit_images
grown to --train-size distorted digits (docs/scale_studies.md says why that is a fair stand-in)
at each --nprocs with three ways of choosing peers: the fixed ring, a randomized ring (D-PSGD:
topology=random_ring, a fresh ring every step; AD-PSGD: algo.pattern=random on
topology=complete, TASLP's uniformly random passive) and the bipartite exponential peers
(topology=bipartite_exponential), with SSGD at each n as the baseline. Read from each run's
metrics.jsonl: the held-out top-1 and loss against epochs and the consensus distance. The
fixed ring "falls behind" at the smallest n from which, at every larger n too, its final
held-out top-1 is more than --margin points below the better of the two other topologies.

dasgd (arXiv 2006.00441: communication entirely hidden, linear scale-up). Timing-only runs
(no learning: the schedule alone, runner/sim/timing.py) of ResNet-50-sized models
(recipe=imagenet) on the 64-V100 Ethernet cluster with its network slowed to
--network-gbps, unbounded in nodes, at each --nprocs: DaSGD with delay 1 and with delay = tau,
and SSGD for contrast. Step time against the compute-only step (a learner's compute seconds
per step), and scale-up efficiency: samples per second against n learners computing alone.

Learning rates (spectral): AD-PSGD and D-PSGD apply the rate to each learner's own batch, so
the linear-scaling rate of the global batch n x b (3.2 at n = 128, b = 16 for this recipe's
0.4 per 256) is a step sized for 2,048 samples taken with the noise of 16 (64 learners of 4 at
0.4 went to chance). The study uses optim.scaling=none and lr = --lr x sqrt(n x b / 256), the
square-root rule, for every algorithm at that n; every run's rate is in the JSON.

Run dirs go under --runs (default runs/study_scale/<study>); a run dir that already holds a
completed summary is read, not run again (rerun a study after an interruption). JSON:
docs/results/scale/<study>.json (--json), markdown rows with --markdown.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: this checkout's runner
    sys.path.insert(0, str(REPO))

from runner import benchmark as bench  # noqa: E402

RESULTS = REPO / "docs" / "results" / "scale"

# ---- spectral ------------------------------------------------------------------------------
# Topology -> algorithm -> overrides.
PEER_CHOICES: dict[str, dict[str, list[str]]] = {
    "fixed_ring": {"dpsgd": ["topology=ring"],
                   "adpsgd": ["topology=ring", "algo.pattern=fixed"]},
    "random_ring": {"dpsgd": ["topology=random_ring"],
                    "adpsgd": ["topology=complete", "algo.pattern=random"]},
    "exponential": {"dpsgd": ["topology=bipartite_exponential"],
                    "adpsgd": ["topology=bipartite_exponential", "algo.pattern=fixed"]},
}
SPECTRAL_FULL = {"nprocs": [16, 32, 64, 128], "epochs": 3, "train_size": 20480,
                 "heldout_size": 3590, "batch_size": 16}
# --quick: the 1,437 training and 359 held-out originals, a few steps of large batches
SPECTRAL_QUICK = {"nprocs": [8], "epochs": 1, "train_size": 0, "heldout_size": 0,
                  "batch_size": 64}
# A small CNN (38k parameters): big enough to show gradient noise and consensus effects,
# small enough for 128 learners on a CPU.
STUDY_MODEL = ["recipe.channels=[16,32]", "recipe.hidden=64"]

# ---- dasgd ---------------------------------------------------------------------------------
DASGD_CASES: dict[str, list[str]] = {
    "dasgd_delay1": ["algo=dasgd", "algo.tau=4", "algo.delay=1"],
    "dasgd_delay4": ["algo=dasgd", "algo.tau=4", "algo.delay=4"],
    "ssgd": ["algo=ssgd"],
}
DASGD_FULL = {"nprocs": [8, 16, 32, 64, 128], "samples_per_epoch": 1281167, "batch_size": 32}
DASGD_QUICK = {"nprocs": [8, 16], "samples_per_epoch": 16 * 32 * 12, "batch_size": 32}

MD_HEADERS = {
    "spectral": "| date | algorithm | peers | n | lr | held-out top-1 by epoch | final loss | "
                "consensus distance | ring behind by (pts) |\n"
                "|---|---|---|---|---|---|---|---|---|\n",
    "dasgd": "| date | case | n | step (s) | compute-only step (s) | overhead | "
             "scale-up efficiency |\n|---|---|---|---|---|---|---|\n",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("study", choices=["spectral", "dasgd"])
    bench.add_common_arguments(p, "study_scale", trains=False)
    p.add_argument("--out", dest="json", type=Path,
                   help="the same as --json (default without --quick: "
                        "docs/results/scale/<study>.json)")
    p.add_argument("--runs", type=Path, help="run dirs (default runs/study_scale/<study>, "
                                             "--quick: runs/study_scale/<study>-quick)")
    p.add_argument("--nprocs", type=int, nargs="+", help="learners (default: the study's)")
    p.add_argument("--batch-size", type=int,
                   help="per learner (default: spectral 16, dasgd 32)")
    p.add_argument("--epochs", type=int, help="spectral: epochs of every run (default 3)")
    p.add_argument("--train-size", type=int, help="spectral: training samples (default "
                                                  "20,480: n x b is a tenth of it at 128 x 16)")
    p.add_argument("--heldout-size", type=int, help="spectral: held-out samples (default 3,590)")
    p.add_argument("--lr", type=float, default=0.1,
                   help="spectral: the rate at a global batch of 256, scaled by its square root "
                        "(default 0.1)")
    p.add_argument("--margin", type=float, default=1.0,
                   help="spectral: top-1 points by which the fixed ring must trail to count as "
                        "behind (default 1.0)")
    p.add_argument("--network-gbps", type=float, default=10.0,
                   help="dasgd: the inter-node bandwidth (default 10, 10 Gb/s Ethernet)")
    p.add_argument("--samples-per-epoch", type=int,
                   help="dasgd: samples of the epoch timed (default ImageNet's 1,281,167)")
    args = p.parse_args(argv)
    quick, full = {"spectral": (SPECTRAL_QUICK, SPECTRAL_FULL),
                   "dasgd": (DASGD_QUICK, DASGD_FULL)}[args.study]
    bench.fill_defaults(args, argv, quick, full)
    if min(args.nprocs) < 2 or any(n % 2 for n in args.nprocs):
        p.error("--nprocs must be even numbers >= 2 (AD-PSGD pairs actives with passives)")
    if args.runs is None:
        args.runs = REPO / "runs" / "study_scale" / (args.study + ("-quick" if args.quick
                                                                   else ""))
    args.runs = args.runs.resolve()
    if args.json is None and not args.quick:
        args.json = RESULTS / f"{args.study}.json"
    return args


# ---- running simulations -------------------------------------------------------------------
def compose(overrides: list[str]) -> Any:
    """The typed config of ``overrides``, as adpsgd-run hands it to the launcher."""
    from runner.compose import compose_all, validate_job

    return validate_job(compose_all(list(overrides), False, "config")[0])


def already_run(run_dir: Path, cfg: Any) -> bool:
    """A completed run of exactly this config (a run dir left by other settings is not)."""
    from omegaconf import OmegaConf

    from runner.worker import RUN_CONFIG

    if not bench.completed(run_dir) or not (run_dir / RUN_CONFIG).exists():
        return False
    saved = OmegaConf.to_container(OmegaConf.load(run_dir / RUN_CONFIG))
    return saved == OmegaConf.to_container(cfg)


def simulate(root: Path, cases: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Run every case under launcher=sim in this process (a completed run dir of the same
    config is kept) and return :func:`runner.benchmark.read_run` of each."""
    from runner.sim.engine import Simulation
    from runner.sim.timing import TimingSimulation

    configs = {name: compose(overrides) for name, overrides in cases.items()}
    todo = {name: cases[name] for name in cases if not already_run(root / name, configs[name])}
    run_dirs = bench.prepare_cases(root, todo) if todo else {}
    for name, run_dir in run_dirs.items():
        print(f"{name} ...", flush=True)
        cfg = configs[name]
        kind = TimingSimulation if cfg.launcher.timing_only else Simulation
        kind(cfg, run_dir).run()
    return {name: bench.read_run(root / name) for name in cases}


def sqrt_scaled_lr(base: float, n: int, batch_size: int) -> float:
    return round(base * math.sqrt(n * batch_size / 256), 4)


# ---- spectral ------------------------------------------------------------------------------
def spectral_cases(args: argparse.Namespace) -> dict[str, list[str]]:
    cases = {}
    for n in args.nprocs:
        common = ["recipe=digit_images", f"recipe.train_size={args.train_size}",
                  f"recipe.heldout_size={args.heldout_size}", *STUDY_MODEL, "launcher=sim",
                  f"launcher.nprocs={n}", "cluster.nodes=0", f"trainer.epochs={args.epochs}",
                  f"trainer.batch_size={args.batch_size}", "trainer.progress=false",
                  "optim.scaling=none",
                  f"optim.lr={sqrt_scaled_lr(args.lr, n, args.batch_size)}"]
        cases[f"n{n}-ssgd"] = [*common, "algo=ssgd"]
        for peers, per_algo in PEER_CHOICES.items():
            for algo, extra in per_algo.items():
                cases[f"n{n}-{algo}-{peers}"] = [*common, f"algo={algo}", *extra]
    return cases


def mixing(algo: str, peers: str, n: int) -> dict[str, float]:
    """The spectral quantities of the mixing this case uses (docs/algorithms.md, section 9):
    D-PSGD's rho of its mixing matrix, AD-PSGD's per-averaging rho on its active-passive
    edges."""
    from runner.topology import TOPOLOGIES
    from runner.topology.pairing import pairwise_rho
    from runner.topology.spectral import summarize

    overrides = [o for o in PEER_CHOICES[peers][algo] if o.startswith("topology=")]
    cfg = compose(["recipe=digit_images", "launcher=sim", f"launcher.nprocs={n}",
                   "cluster.nodes=0", f"algo={algo}", *overrides])
    topology = TOPOLOGIES.get(cfg.topology.name)(cfg.topology, seed=cfg.seed)
    if algo == "adpsgd":
        return {"rho_per_averaging": pairwise_rho(topology, n)}
    summary = summarize(topology, n)
    return {"spectral_gap": summary["spectral_gap"], "rho": summary["rho"]}


def curve(run: dict[str, Any]) -> list[dict[str, float]]:
    """The held-out evaluations of a run: epoch, top-1, loss, consensus distance."""
    return [{"epoch": round(row["epoch"], 3), "top1": row["top1"], "loss": row["loss"],
             "consensus_distance": row.get("consensus_distance")}
            for row in run["metrics"] if row.get("split") == "eval"]


def falls_behind_at(deficits: dict[int, float], margin: float) -> int | None:
    """The smallest n from which the ring trails by more than ``margin`` at every larger n."""
    behind = None
    for n in sorted(deficits, reverse=True):
        if deficits[n] <= margin:
            break
        behind = n
    return behind


def measure_spectral(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record("study_scale spectral", "scripts/study_scale.py", args.argv,
                          args.quick)
    cases = spectral_cases(args)
    runs = simulate(args.runs, cases)
    table: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        n_part, algo, *rest = name.split("-")
        n, peers = int(n_part[1:]), (rest[0] if rest else "allreduce")
        summary = run["summary"]
        entry = {"algo": algo, "peers": peers, "nprocs": n, "overrides": cases[name],
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


def spectral_rows(r: dict[str, Any]) -> list[str]:
    rows = []
    for e in r["runs"].values():
        top1 = " / ".join(f"{p['top1']:.1f}" for p in e["curve"])
        behind = e.get("behind_best_other_by")
        rows.append(f"| {r['date'][:10]} | {e['algo']} | {e['peers']} | {e['nprocs']} | "
                    f"{e['lr']} | {top1} | {e['final_loss']:.3f} | "
                    f"{e['consensus_distance']:.3g} | "
                    f"{'-' if behind is None else f'{behind:.1f}'} |")
    return rows


# ---- dasgd ---------------------------------------------------------------------------------
def dasgd_cases(args: argparse.Namespace) -> dict[str, list[str]]:
    cases = {}
    for n in args.nprocs:
        common = ["recipe=imagenet", "launcher=sim", "launcher.timing_only=true",
                  f"launcher.nprocs={n}", f"launcher.samples_per_epoch={args.samples_per_epoch}",
                  "cluster=v100_16x4_ethernet", "cluster.nodes=0",
                  f"cluster.inter_node.bandwidth_gbps={args.network_gbps}",
                  f"trainer.batch_size={args.batch_size}", "trainer.epochs=1",
                  "trainer.progress=false"]
        for case, extra in DASGD_CASES.items():
            cases[f"n{n}-{case}"] = [*common, *extra]
    return cases


def measure_dasgd(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record("study_scale dasgd", "scripts/study_scale.py", args.argv, args.quick)
    cases = dasgd_cases(args)
    runs = simulate(args.runs, cases)
    table = {}
    for name, run in runs.items():
        n_part, case = name.split("-", 1)
        s = run["summary"]
        steps = sum(s["steps_per_rank"]) / len(s["steps_per_rank"])  # a learner's, on average
        compute_step = s["compute_s"] / steps
        alone = s["nprocs"] * s["batch_size"] / compute_step  # n learners that never talk
        table[name] = {
            "case": case, "nprocs": int(n_part[1:]), "overrides": cases[name],
            "step_s": s["step_s"], "compute_only_step_s": compute_step,
            "overhead": s["step_s"] / compute_step - 1.0,
            "samples_per_s": s["samples_per_s"], "scale_up_efficiency": s["samples_per_s"] / alone,
            "compute_s": s["compute_s"], "comm_s": s["comm_s"], "idle_s": s["idle_s"],
            "model_bytes": s["model_bytes"], "run_dir": run["run_dir"]}
    return record.finish({
        "study": "dasgd", "recipe": "imagenet", "cluster": "v100_16x4_ethernet",
        "network_gbps": args.network_gbps, "batch_size": args.batch_size,
        "samples_per_epoch": args.samples_per_epoch, "nprocs": args.nprocs, "runs": table,
        "run_dirs": str(args.runs)})


def dasgd_rows(r: dict[str, Any]) -> list[str]:
    return [f"| {r['date'][:10]} | {e['case']} | {e['nprocs']} | {e['step_s']:.4f} | "
            f"{e['compute_only_step_s']:.4f} | {100 * e['overhead']:.1f}% | "
            f"{e['scale_up_efficiency']:.3f} |" for e in r["runs"].values()]


STUDIES = {"spectral": (measure_spectral, spectral_rows),
           "dasgd": (measure_dasgd, dasgd_rows)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    measure, rows = STUDIES[args.study]
    return bench.measure_and_write(f"study_scale {args.study}", args, measure,
                                   MD_HEADERS[args.study], rows)


if __name__ == "__main__":
    raise SystemExit(main())
