"""H-ADPSGD traffic inside a node: bytes per local step that a super learner's ranks move
among themselves (the gradient allreduce, and the broadcasts that keep their replicas equal).

    python benchmarks/bench_node_traffic.py                    # 4 ranks in 2 nodes, 8 in 2
    python benchmarks/bench_node_traffic.py --shapes 4x2 --repeats 5
    python benchmarks/bench_node_traffic.py --quick            # seconds: checks the wiring only

The counts come from summary.json's ``bytes_sent`` (runner/comm/traffic.py: what each rank
sent, evaluations apart): per step, a member's share of the gradients' allreduce and, per
node, the leader's broadcasts. They do not depend on the machine's speed; samples/s is
reported beside them. The allreduce of the gradient is the synchronous half of H-ADPSGD
and needed at every step; the broadcast is what keeps the ranks of a node on their leader's
model after its gossip changed it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "node_traffic"
FULL = {"shapes": ["4x2", "8x4"], "repeats": 2, "epochs": 2, "batch_size": 32,
        "overrides": ["recipe=digit_images", "recipe.hidden=1024"]}
QUICK = {"shapes": ["4x2"], "repeats": 1, "epochs": 1, "batch_size": 32,
         "overrides": ["recipe=digit_images"]}
MD_HEADER = ("| date | ranks x per node | parameters | allreduce MB/step | broadcast MB/step | "
             "model broadcasts per step | samples/s | load before/after |\n"
             "|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    p.add_argument("--shapes", nargs="+", help="NPROCSxPROCS_PER_NODE (default "
                   f"{' '.join(FULL['shapes'])})")
    p.add_argument("--repeats", type=int, help=f"default {FULL['repeats']}")
    p.add_argument("--epochs", type=int, help=f"per run (default {FULL['epochs']})")
    p.add_argument("--batch-size", type=int, help="per rank (default 32)")
    p.add_argument("overrides", nargs="*", help="adpsgd-run overrides for every case "
                   f"(default: {' '.join(FULL['overrides'])})")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    try:
        args.shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    except ValueError:
        p.error("--shapes takes NPROCSxPROCS_PER_NODE, e.g. 4x2")
    if any(len(s) != 2 or s[0] % s[1] or (s[0] // s[1]) % 2 for s in args.shapes):
        p.error("each shape needs an even number of nodes, e.g. 4x2 or 8x4")
    return args


def per_step(summary: dict, kind: str) -> float:
    """Bytes of ``kind`` (summary.json's bytes_sent) per step, summed over ranks."""
    sent = summary["bytes_sent"]["by_kind"].get(kind, [])
    return sum(b / max(steps, 1) for b, steps in zip(sent, summary["steps_per_rank"]))


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_node_traffic.py", args.argv, args.quick)
    shapes = {}
    for nprocs, per_node in args.shapes:
        base = [*args.overrides, "algo=hadpsgd", f"launcher.nprocs={nprocs}",
                f"launcher.procs_per_node={per_node}", f"trainer.epochs={args.epochs}",
                f"trainer.batch_size={args.batch_size}", "trainer.progress=false"]
        cases = {f"{nprocs}x{per_node}-{r}": base for r in range(args.repeats)}
        runs = bench.run_cases(args.runs, cases, nprocs=nprocs, timeout_s=args.timeout)
        summaries = [run["summary"] for run in runs.values()]
        params = bench.parameter_count(next(iter(runs.values()))["run_dir"])
        model_bytes = 4 * params  # float32
        stats = [s["algo_stats"] for s in summaries]
        # Per step, a member's share of the gradients' allreduce; the leader's broadcasts of x
        # (the one rank that sends them), per node.
        allreduce = [per_step(s, "node/allreduce") / nprocs for s in summaries]
        broadcast = [per_step(s, "node/broadcast") / (nprocs // per_node) for s in summaries]
        shapes[f"{nprocs}x{per_node}"] = {
            "parameters": params, "overrides": base,
            "allreduce_bytes_per_step": allreduce, "broadcast_bytes_per_step": broadcast,
            # A whole-model broadcast moves model_bytes: how many of them per step (evaluations
            # and checkpoints add one each).
            "model_broadcasts_per_step": [b / model_bytes for b in broadcast],
            "samples_per_s": [s["samples_per_s"] for s in summaries],
            "exchanges": [sum(x for x in st.get("exchanges", []) if x) for st in stats]}
    return record.finish({"repeats": args.repeats, "epochs": args.epochs,
                          "shapes": shapes, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    mb = 2**20
    return [f"| {r['date'][:10]} | {shape} | {e['parameters'] / 1e6:.2f}M | "
            f"{bench.median(e['allreduce_bytes_per_step']) / mb:.2f} | "
            f"{bench.median(e['broadcast_bytes_per_step']) / mb:.2f} | "
            f"{bench.median(e['model_broadcasts_per_step']):.2f} | "
            f"{bench.median(e['samples_per_s']):.0f} | "
            f"{r['load_before'][0]} / {r['load_after'][0]} |"
            for shape, e in r["shapes"].items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_node_traffic", args, measure, MD_HEADER,
                                   markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
