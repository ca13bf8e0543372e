"""The simulator against the lab: every run of benchmarks/bench_lab_claims.py simulated on a
cluster fitted to the lab, samples/s and the fastest algorithm compared network by network.

    python benchmarks/bench_lab_sim.py --claims docs/results/lab/claims.json \
        --network docs/results/network/busbw.json --json docs/results/lab/sim.json
    python benchmarks/bench_lab_sim.py --claims A.json B.json C.json ...  # the lab's medians

With several claims files (the same cases run again, each with its run dirs), each case's lab
samples/s is the median of its runs and the spread is kept beside it: one run of the lab
varies by more than the goal's band from run to run (docs/RESULTS.md), and a case compared
with a single run is a comparison with that run's luck.

The cluster is ``cluster=measured`` with what the lab measured and nothing fitted to the runs
it predicts: compute (seconds per sample, overhead, and the contention of the lab's hosts
sharing this machine's cores) from the claims' SSGD run at the first network's rate (with
several claims files, the run of median samples/s among theirs);
the link between hosts from the network benchmark at each network's rate (latency and
bandwidth fitted to AD-PSGD's exchanges, ``cluster.from_network``); for the shared network,
the slow host's link as ``cluster.node_bandwidth_factor``. The goal: samples/s within 20% of
the lab's in every case, and the same fastest algorithm on each network. Runs simulate in this
process (no root needed: the lab's run dirs are only read).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from benchmarks.bench_lab_claims import NETWORKS, WORKLOAD  # noqa: E402
from runner.errors import UserError  # noqa: E402

NAME = "lab_sim"
BAND = 0.20
RATE_OF = {network: rates[0] for network, rates in NETWORKS.items()}  # the fast hosts' rate
MD_HEADER = ("| date | network | algorithm | samples/s lab / simulated | ratio | within 20% |\n"
             "|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME, timeout_s=3600)
    p.add_argument("--claims", type=Path, nargs="+", required=True,
                   help="benchmarks/bench_lab_claims.py's JSON (its run dirs must exist); "
                   "several: the same cases run again, compared by their medians")
    p.add_argument("--network", type=Path, required=True,
                   help="benchmarks/bench_network.py's JSON")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def slow_hosts(network: str) -> dict[str, float]:
    """Host index -> its link's fraction of the others' (the shared network's slow host)."""
    rates = NETWORKS[network]
    fastest = max(rates, key=rate_bits)
    return {str(i): rate_bits(r) / rate_bits(fastest) for i, r in enumerate(rates)
            if r != fastest}


def rate_bits(rate: str) -> float:
    from benchmarks.bench_network import rate_bits as bits

    return bits(rate)


def cases_for(claims: dict[str, Any], network: str, calibration: str,
              network_json: Path) -> dict[str, list[str]]:
    hosts, epochs = claims["hosts"], claims["epochs"]
    cases = {}
    for algo in claims["networks"][network]:
        per_host = 2 if algo == "hadpsgd" else 1  # its nodes are hosts lab1, lab2: node i
        nodes = slow_hosts(network)               # is host i either way
        cases[algo] = [*WORKLOAD, *bench.ALGORITHM_VARIANTS[algo], f"trainer.epochs={epochs}",
                       "launcher=sim", f"launcher.nprocs={hosts}",
                       f"launcher.procs_per_node={per_host}", "cluster=measured",
                       f"cluster.from_summary={calibration}", "cluster.gpus_per_node=2",
                       f"cluster.from_network={network_json}",
                       f"cluster.network_rate={RATE_OF[network]}",
                       *(f"+cluster.node_bandwidth_factor.{node}={factor}"
                         for node, factor in nodes.items())]
    return cases


def read_claims(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as ex:
        raise UserError(f"cannot read {path} ({ex})",
                        "run benchmarks/bench_lab_claims.py with --json first") from None


def median_claims(runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One claims record whose every case holds the median samples/s of ``runs`` (the same
    hosts, epochs, networks and algorithms; ``names``: where each came from, for the error),
    with the runs' values as ``lab_runs``; the SSGD case of the first network keeps the run
    dir of its median run (the simulator's calibration). The upper median of an even count."""
    shape = [(r["hosts"], r["epochs"], {n: sorted(c) for n, c in r["networks"].items()})
             for r in runs]
    if any(s != shape[0] for s in shape):
        other = next(n for n, s in zip(names, shape) if s != shape[0])
        raise UserError(f"{other} and {names[0]} ran different cases (hosts, epochs, networks "
                        "or algorithms)", "compare runs of the same bench_lab_claims.py command")
    networks = {}
    for network, cases in runs[0]["networks"].items():
        networks[network] = {}
        for algo in cases:
            ordered = sorted((r["networks"][network][algo] for r in runs),
                             key=lambda case: case["samples_per_s"])
            networks[network][algo] = {**ordered[len(ordered) // 2],
                                       "lab_runs": [c["samples_per_s"] for c in ordered]}
    return {**runs[0], "networks": networks}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record(NAME, "benchmarks/bench_lab_sim.py", args.argv, args.quick)
    claims = median_claims([read_claims(path) for path in args.claims],
                           [str(path) for path in args.claims])
    first = next(iter(claims["networks"]))
    calibration = Path(claims["networks"][first]["ssgd"]["run_dir"]) / "summary.json"
    if not calibration.exists():
        raise UserError(f"{calibration} (the claims' SSGD run) is gone",
                        "run benchmarks/bench_lab_claims.py again, keeping its --runs")
    networks = {}
    for network, real in claims["networks"].items():
        sim = bench.simulate_cases(args.runs / network,
                                   cases_for(claims, network, str(calibration), args.network))
        rows = {}
        for algo, measured in real.items():
            simulated = sim[algo]["summary"]["samples_per_s"]
            ratio = simulated / measured["samples_per_s"]
            rows[algo] = {"lab_samples_per_s": measured["samples_per_s"],
                          "lab_runs": measured["lab_runs"],
                          "simulated_samples_per_s": simulated, "ratio": ratio,
                          "within": abs(ratio - 1) <= BAND, "run_dir": sim[algo]["run_dir"]}
        winner = {side: max(rows, key=lambda a, k=key: rows[a][k])
                  for side, key in (("lab", "lab_samples_per_s"),
                                    ("simulated", "simulated_samples_per_s"))}
        networks[network] = {"rows": rows, "winner": winner,
                             "same_winner": winner["lab"] == winner["simulated"]}
        print(f"  {network}: " + ", ".join(f"{a} {r['ratio']:.2f}" for a, r in rows.items())
              + f"; fastest {winner['lab']} / {winner['simulated']}", file=sys.stderr,
              flush=True)
    within = sum(r["within"] for n in networks.values() for r in n["rows"].values())
    total = sum(len(n["rows"]) for n in networks.values())
    return record.finish({"claims": [str(path) for path in args.claims],
                          "network": str(args.network),
                          "calibration": str(calibration), "band": BAND,
                          "networks": networks, "within": within, "cases": total,
                          "same_winner_everywhere": all(n["same_winner"]
                                                        for n in networks.values())})


def spread(row: dict[str, Any]) -> str:
    """`` (LOW-HIGH)``: the lab's runs of a case compared by their median; none for one."""
    runs = row.get("lab_runs", [])
    return f" ({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else ""


def markdown_rows(result: dict[str, Any]) -> list[str]:
    date = result["date"][:10]
    return [f"| {date} | {network} | {algo} | {r['lab_samples_per_s']:.0f}{spread(r)} / "
            f"{r['simulated_samples_per_s']:.0f} | {r['ratio']:.2f} | "
            f"{'yes' if r['within'] else 'no'} |"
            for network, n in result["networks"].items() for algo, r in n["rows"].items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write(NAME, args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
