"""The network claims on real links: the algorithms trained across the lab's hosts
(scripts/lab_cluster.sh) at 1 Gbit/s, at 100 Mbit/s, and with one host's link at a tenth of
the others' (the shared network of the AD-PSGD paper), for epoch time, samples/s, bytes sent
per step and time to a held-out target.

    python benchmarks/bench_lab_claims.py --json docs/results/lab/claims.json \
        --plot docs/results/lab/claims.png            # ~20 min on 2 cores
    python benchmarks/bench_lab_claims.py --networks 100mbit --epochs 12 \
        --algos ssgd dpsgd adpsgd sgp sgp_overlap choco_top1 choco_qsgd8 diloco_p10 diloco_p50 \
        --json docs/results/lab/peers.json --plot docs/results/lab/peers.png   # the peers'
    python benchmarks/bench_lab_claims.py --quick     # 2 hosts, 1 epoch, 2 algorithms: wiring

Needs root (the lab). The workload makes the exchange dominate at the lower rate: the digits
CNN with a 1,024-unit hidden layer (1.08 M parameters, 4.3 MB), batch 32 per rank, one rank on
each of 4 hosts; hadpsgd runs 2 hosts x 2 ranks (its super learners are the hosts). Each
algorithm trains the same epochs; time to the target is the training time (from the start,
evaluations and checkpoints left out: metrics.jsonl's train_s) of the first epoch-end
evaluation of the averaged model at or above the target; the wall time to it (as the user
waits, evaluations included) is reported beside. SSGD's communication share is its ranks'
communication seconds over their training seconds (summary.json's time split).

The claims. AD-PSGD and its seeds: where SSGD spends more than half its time communicating,
AD-PSGD trains at >= 2x its samples/s and reaches the target in <= 0.6 of its time. CHOCO-SGD
with top-1% against D-PSGD on the same ring: <= 3% of its bytes per step, and the target in
<= 0.5 of its time. Bytes per step are summary.json's ``bytes_sent`` (counted where each rank
sent them), mean over ranks. The run dirs stay under --runs for adpsgd-report and the
simulator's comparison (benchmarks/bench_lab_sim.py).
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
from benchmarks.bench_network import lab, lab_with  # noqa: E402

NAME = "lab_claims"
ALGOS = ["ssgd", "dpsgd", "adpsgd", "adpsgd_random", "hadpsgd", "dasgd"]  # the default
# Network name -> the rate of each host's link (lab2 is the slow one of the shared network:
# hadpsgd's two hosts are lab1 and lab2, so every algorithm meets it).
NETWORKS = {"1gbit": ["1gbit"] * 4, "100mbit": ["100mbit"] * 4,
            "shared": ["1gbit", "100mbit", "1gbit", "1gbit"]}
FULL = {"hosts": 4, "epochs": 8, "target": 90.0, "networks": list(NETWORKS), "algos": ALGOS}
QUICK = {"hosts": 2, "epochs": 1, "target": 50.0, "networks": ["1gbit"],
         "algos": ["ssgd", "adpsgd"]}
WORKLOAD = ["recipe=digit_images", "recipe.hidden=1024", "trainer.batch_size=32",
            "trainer.progress=false"]
MD_HEADER = ("| date | network | algorithm | samples/s | epoch s | comm share | MB sent/step | "
             "training s to target | wall s to target | final top-1 |\n"
             "|---|---|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME, timeout_s=3 * 3600)
    p.add_argument("--hosts", type=int, help=f"ranks, one per host (default {FULL['hosts']})")
    p.add_argument("--epochs", type=int, help=f"default {FULL['epochs']}")
    p.add_argument("--target", type=float, help=f"held-out top-1, %% (default {FULL['target']})")
    p.add_argument("--networks", nargs="+", choices=list(NETWORKS))
    p.add_argument("--algos", nargs="+", choices=list(bench.ALGORITHM_VARIANTS),
                   help=f"default: {' '.join(ALGOS)}")
    p.add_argument("--plot", type=Path, help="write the picture (PNG) here")
    p.add_argument("--reuse", action="store_true", help="keep the completed cases of --runs")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if args.hosts < 2 or args.hosts % 2 or args.epochs < 1:
        p.error("--hosts must be even and >= 2, --epochs >= 1")
    return args


def time_to(evaluations: list[dict], target: float, key: str) -> float | None:
    """``key`` (wall_s, or train_s: without the evaluations and checkpoints) of the first
    held-out evaluation at or above ``target``."""
    for record in evaluations:
        if record.get("split") == "eval" and record.get("top1", -1) >= target:
            return record.get(key)
    return None


def comm_share(summary: dict[str, Any]) -> float:
    """Communication seconds over training seconds, mean over ranks."""
    shares = [t.get("comm", 0.0) / max(sum(t.get(k, 0.0) for k in ("compute", "comm", "idle",
                                                                      "data")), 1e-9)
              for t in summary["per_rank"]]
    return sum(shares) / len(shares)


def run_network(args: argparse.Namespace, network: str, shell: str) -> dict[str, Any]:
    """Every algorithm on one network: one job for the one-rank-per-host cases, one for
    hadpsgd's two hosts of two ranks."""
    for host, rate in zip([f"lab{i}" for i in range(1, args.hosts + 1)], NETWORKS[network]):
        lab("rate", host, rate)
    root = args.runs / network
    root.mkdir(parents=True, exist_ok=True)
    flat = root / "hosts"
    flat.write_text("".join(f"lab{i}\n" for i in range(1, args.hosts + 1)))
    paired = root / "hosts-2x2"
    paired.write_text("".join(f"lab{i}:2\n" for i in range(1, args.hosts // 2 + 1)))
    runs: dict[str, Any] = {}
    groups = [([a for a in args.algos if a != "hadpsgd"], flat, 1),
              (["hadpsgd"] if "hadpsgd" in args.algos else [], paired, 2)]
    for algos, hostfile, per_host in groups:
        if not algos:
            continue
        placement = {"hostfile": str(hostfile), "remote_shell": shell,
                     "procs_per_node": per_host}
        cases = {algo: [*WORKLOAD, *bench.ALGORITHM_VARIANTS[algo], f"trainer.epochs={args.epochs}",
                        f"launcher.nprocs={args.hosts}",
                        *(f"launcher.{k}={v}" for k, v in placement.items())]
                 for algo in algos}
        runs.update(bench.run_cases(root, cases, args.hosts, args.timeout, args.reuse,
                                    placement))
    results = {}
    for algo, run in runs.items():
        summary = run["summary"]
        results[algo] = {
            "run_dir": run["run_dir"], "samples_per_s": summary["samples_per_s"],
            "epoch_s": summary["train_s"] / summary["epochs"],
            "comm_share": comm_share(summary),
            # Seconds at the evaluations and checkpoints (mean over ranks): waiting there
            # for the others, scoring, writing; and the share of the run's wall time.
            "milestone_s": sum(summary[k] for k in ("milestone_wait_s", "eval_s",
                                                    "checkpoint_s")),
            "milestone_share": sum(summary[k] for k in ("milestone_wait_s", "eval_s",
                                                        "checkpoint_s")) / summary["wall_s"],
            "eval_beside_s": summary.get("eval_beside_s", 0.0),
            "bytes_per_step": summary["bytes_sent"]["mean_per_step"],
            "bytes_by_kind": summary["bytes_sent"]["by_kind"],
            "time_to_target_s": time_to(run["metrics"], args.target, "train_s"),
            "wall_to_target_s": time_to(run["metrics"], args.target, "wall_s"),
            "final_top1": summary.get("top1"), "hosts": summary.get("hosts")}
        print(f"  {network} {algo}: {results[algo]['samples_per_s']:.0f} samples/s, comm "
              f"{results[algo]['comm_share']:.2f}, to target "
              f"{results[algo]['time_to_target_s']}", file=sys.stderr, flush=True)
    return results


def verdict(results: dict[str, Any]) -> dict[str, Any]:
    """The claim where SSGD communicates more than half the time: AD-PSGD (either pattern)
    at >= 2x SSGD's samples/s and <= 0.6 of its time to the target."""
    ssgd = results.get("ssgd")
    if not ssgd or ssgd["comm_share"] <= 0.5:
        return {"applies": False, **choco_verdict(results)}
    out: dict[str, Any] = {"applies": True, **choco_verdict(results)}
    for algo in ("adpsgd", "adpsgd_random"):
        if algo not in results:
            continue
        mine = results[algo]
        speed = mine["samples_per_s"] / ssgd["samples_per_s"]
        times = (mine["time_to_target_s"] / ssgd["time_to_target_s"]
                 if mine["time_to_target_s"] and ssgd["time_to_target_s"] else None)
        out[algo] = {"speedup": speed, "time_ratio": times,
                     "held": speed >= 2 and times is not None and times <= 0.6}
    return out


def choco_verdict(results: dict[str, Any]) -> dict[str, Any]:
    """CHOCO-SGD top-1% against D-PSGD: <= 3% of its bytes per step and <= 0.5 of its time to
    the target."""
    dpsgd, choco = results.get("dpsgd"), results.get("choco_top1")
    if not dpsgd or not choco:
        return {}
    bytes_ratio = choco["bytes_per_step"] / dpsgd["bytes_per_step"]
    times = (choco["time_to_target_s"] / dpsgd["time_to_target_s"]
             if choco["time_to_target_s"] and dpsgd["time_to_target_s"] else None)
    return {"choco_top1": {"bytes_ratio": bytes_ratio, "time_ratio": times,
                           "held": bytes_ratio <= 0.03 and times is not None and times <= 0.5}}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record(NAME, "benchmarks/bench_lab_claims.py", args.argv, args.quick)
    _, shell, before = lab_with(args.hosts, "1gbit")
    try:
        networks = {network: run_network(args, network, shell) for network in args.networks}
    finally:
        for host, rate in before.items():  # the links as they were
            lab("rate", host, rate)
    result = record.finish({"workload": WORKLOAD, "hosts": args.hosts, "epochs": args.epochs,
                            "target_top1": args.target, "networks": networks,
                            "rates": {n: NETWORKS[n][:args.hosts] for n in args.networks},
                            "verdict": {n: verdict(r) for n, r in networks.items()}})
    if args.plot:
        plot(result, args.plot)
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    """Samples/s, bytes sent per step and time to the target, per algorithm, one group of
    bars per network."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    networks = list(result["networks"])
    algos = list(next(iter(result["networks"].values())))
    figure = Figure(figsize=(16, 4))
    panels = (("samples_per_s", "samples/s (higher is better)"),
              ("bytes_per_step", "bytes sent per step and rank (log)"),
              ("time_to_target_s", f"training s to {result['target_top1']:.0f}% top-1 (lower "
                                   "is better; none: not reached)"))
    for axis, (key, label) in zip(figure.subplots(1, 3), panels):
        width = 0.8 / len(algos)
        for i, algo in enumerate(algos):
            values = [result["networks"][n][algo][key] or 0.0 for n in networks]
            axis.bar([x + i * width for x in range(len(networks))], values, width, label=algo)
        axis.set_xticks([x + 0.4 - width / 2 for x in range(len(networks))], networks)
        axis.set_title(label, fontsize=9)
        if key == "bytes_per_step":
            axis.set_yscale("log")
    figure.axes[0].legend(fontsize=8)
    figure.suptitle(f"{result['hosts']} lab hosts: "
                    + ", ".join(f"{n} ({' '.join(result['rates'][n])})" for n in networks))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")


def markdown_rows(result: dict[str, Any]) -> list[str]:
    date = result["date"][:10]
    rows = []
    for network, results in result["networks"].items():
        for algo, r in results.items():
            to, wall = (f"{r[k]:.1f}" if r[k] else "-"
                        for k in ("time_to_target_s", "wall_to_target_s"))
            rows.append(f"| {date} | {network} | {algo} | {r['samples_per_s']:.0f} | "
                        f"{r['epoch_s']:.2f} | {r['comm_share']:.2f} | "
                        f"{r['bytes_per_step'] / 1e6:.3f} | {to} | {wall} | "
                        f"{r['final_top1']:.1f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write(NAME, args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
