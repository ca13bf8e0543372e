"""The simulator's own speed: learner-steps per host second and peak memory of launcher=sim for
N = 16, 64, 128, 256 and 1,024 learners on digit_images, against one process training one
model at 128x the batch (goals: 128 learners at >= half its samples/s; 1,024 in <= 8 GiB).

    python benchmarks/bench_sim.py                          # ssgd and adpsgd, N = 16 ... 1024
    python benchmarks/bench_sim.py --algos hadpsgd --nprocs 128 1024 --steps 20
    python benchmarks/bench_sim.py --quick                  # N = 16 and 64, 2 steps: the wiring

Every N runs in a fresh process (its algorithms one after the other, in --algos order), so
the peak resident memory (getrusage's high-water mark, imports included) is that N's: the most
any of its algorithms needed (--quick runs its two N in one process, to save a start).
Every learner has a full batch of --batch-size at each of --steps steps: the 1,438 training
digits are repeated to N x batch x steps samples, one epoch (1,024 learners of 4 read 4,096
a step). Timed is the driver's advance through that epoch (the gradients, the updates, the
schedule, the exchanges): after one untimed gradient call of up to 256 learners, which pays
torch.func's lazy imports (about 4 s), and without building the stacked models, the
evaluation and the final checkpoint (setup_s and the run's host_s report those apart).
Samples per host second are the samples trained over the timed seconds (asynchronous learners
run a little past the epoch: the samples they trained count).

The yardstick is the recipe's model in one process, torch.optim.SGD with the simulation's
learning rate and momentum, at one batch of --reference-n x --batch-size samples: steps timed
after warm-up as benchmarks/harness.py's time_training_steps takes them. ``ratio`` is the
simulation's samples per host second at N = --reference-n over the yardstick's (goal >= 0.5).
Both run on this machine's CPU threads; on a shared machine the load average before and after
says how much of it the numbers had.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: this checkout's runner
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from runner.errors import UserError  # noqa: E402

NAME = "sim"
DEFAULT_OUT = REPO / "docs" / "results" / "sim" / "bench_sim.json"
FULL = {"nprocs": [16, 64, 128, 256, 1024], "steps": 10, "reference_n": 128,
        "reference_steps": 20}
QUICK = {"nprocs": [16, 64], "steps": 2, "reference_n": 64, "reference_steps": 3}
RATIO_GOAL, MEMORY_GOAL_GIB, MEMORY_GOAL_N = 0.5, 8.0, 1024
MD_HEADER = ("| date | algorithm | learners | learner-steps/s | samples/s (host) | "
             "vs one model at N x batch | peak RSS (GiB) | load before/after |\n"
             "|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME, timeout_s=1800)
    p.add_argument("--out", dest="json", type=Path,
                   help=f"the same as --json (default without --quick: {DEFAULT_OUT})")
    p.add_argument("--algos", nargs="+", choices=list(bench.ALGORITHM_VARIANTS),
                   default=["ssgd", "adpsgd"], help="default: ssgd adpsgd")
    p.add_argument("--nprocs", type=int, nargs="+", help=f"learners (default {FULL['nprocs']})")
    p.add_argument("--batch-size", type=int, default=4, help="per learner (default 4)")
    p.add_argument("--lr", type=float, default=0.05, help="optim.lr (default 0.05)")
    p.add_argument("--steps", type=int,
                   help=f"steps of every learner, timed (default {FULL['steps']})")
    p.add_argument("--reference-n", type=int,
                   help=f"the yardstick's batch in learners' batches, and the N compared with it "
                        f"(default {FULL['reference_n']}; added to --nprocs)")
    p.add_argument("--reference-steps", type=int,
                   help=f"timed steps of the yardstick (default {FULL['reference_steps']})")
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if min(*args.nprocs, args.batch_size, args.steps, args.reference_n,
           args.reference_steps) < 1:
        p.error("--nprocs, --batch-size, --steps, --reference-n and --reference-steps must be "
                ">= 1")
    args.nprocs = sorted({*args.nprocs, args.reference_n})
    if args.json is None and not args.quick:
        args.json = DEFAULT_OUT
    return args


def overrides(algo: str, nprocs: int, batch_size: int, lr: float) -> list[str]:
    return ["recipe=digit_images", "launcher=sim", f"launcher.nprocs={nprocs}",
            *bench.ALGORITHM_VARIANTS[algo], f"trainer.batch_size={batch_size}",
            f"optim.lr={lr}", "optim.scaling=none", "cluster.nodes=0", "trainer.epochs=1",
            "trainer.progress=false"]


def gib(nbytes: float) -> float:
    return round(nbytes / 2**30, 3)


def peak_rss_gib() -> float:
    """This process's resident-memory high-water mark (Linux: ru_maxrss in KiB)."""
    return gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def rss_gib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return gib(pages * os.sysconf("SC_PAGE_SIZE"))


def repeat_digits(samples: int) -> None:
    """digit_images' training set repeated to ``samples`` (in this process's registry)."""
    from torch.utils.data import TensorDataset

    from recipes import RECIPES

    recipe = RECIPES.get("digit_images")
    original = recipe.datasets

    def datasets(self):
        train, heldout = original(self)
        reps = -(-samples // len(train))
        return TensorDataset(*(t.repeat(reps, *[1] * (t.dim() - 1))[:samples]
                               for t in train.tensors)), heldout

    recipe.datasets = datasets


# ---- one N (or, --quick, several), in its own process ---------------------------------------
def run_child(spec: dict) -> dict[str, dict]:
    started = time.perf_counter()
    from runner.sim.engine import Simulation  # noqa: F401 - timed as the imports

    imports_s = round(time.perf_counter() - started, 2)
    results = {}
    for n in spec["nprocs"]:
        results[str(n)] = run_n(spec, n)
        results[str(n)].update(import_s=imports_s, shared_process=len(spec["nprocs"]) > 1)
    return results


def run_n(spec: dict, n: int) -> dict:
    from runner.sim.engine import Simulation

    b, steps = spec["batch_size"], spec["steps"]
    repeat_digits(n * b * steps)
    out = {"nprocs": n, "rss_before_gib": rss_gib(), "cases": {}}
    for algo in spec["algos"]:
        cfg = bench.compose(overrides(algo, n, b, spec["lr"]))
        started = time.perf_counter()
        sim = Simulation(cfg, Path(spec["runs"]) / f"n{n}-{algo}")
        setup_s = time.perf_counter() - started
        # Untimed: one call as the run's own (a chunk of up to 256 learners), which pays
        # torch.func's lazy imports on the first
        first = list(range(min(n, sim.learners.chunk)))
        batches, counts = sim.batches(0, 0, first)
        sim.learners.gradients(sim.x[first], first, batches, counts)
        timed = [0.0]
        advance = sim.driver.advance_to

        def timed_advance(target: int, meet: bool = True, advance=advance,
                          timed=timed) -> None:
            began = time.perf_counter()
            advance(target, meet)
            timed[0] += time.perf_counter() - began

        sim.driver.advance_to = timed_advance
        summary = sim.run()
        learner_steps = int(sum(sim.driver.steps_per_learner()))
        out["cases"][algo] = {
            "learner_steps": learner_steps, "samples": int(sim.samples),
            "timed_s": round(timed[0], 3),
            "learner_steps_per_host_s": learner_steps / timed[0],
            "samples_per_host_s": sim.samples / timed[0],
            "setup_s": round(setup_s, 3), "run_host_s": round(summary["host_s"], 3),
            "eval_host_s": round(summary["host_eval_s"], 3),
            "virtual_s": summary["virtual_s"],
            "samples_per_virtual_s": summary["samples_per_s"],
            "final_top1": summary.get("top1"),
            "model_parameters": int(sim.learners.size),
            "rss_after_gib": rss_gib(), "peak_rss_gib_so_far": peak_rss_gib(),
            "overrides": overrides(algo, n, b, spec["lr"])}
        del sim, summary
        gc.collect()
    out["peak_rss_gib"] = peak_rss_gib()
    return out


def measure_n(args: argparse.Namespace, nprocs: list[int]) -> dict[str, dict]:
    spec = {"nprocs": nprocs, "algos": args.algos, "batch_size": args.batch_size,
            "lr": args.lr, "steps": args.steps, "runs": str(args.runs)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    print(f"N = {', '.join(map(str, nprocs))}: {', '.join(args.algos)} ...", flush=True)
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                               json.dumps(spec)], capture_output=True, text=True, env=env,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"N = {nprocs} did not finish within {args.timeout:.0f} s",
                        "fewer --steps, or raise --timeout") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise UserError(f"N = {nprocs} exited with status {proc.returncode} ({tail})",
                        "run it alone: python benchmarks/bench_sim.py --nprocs N")
    results = json.loads(lines[-1][len("RESULT "):])
    for result in results.values():
        result["process_s"] = round(time.perf_counter() - started, 1)
    return results


def reference(args: argparse.Namespace) -> dict:
    """One model, torch.optim.SGD, one batch of reference_n x batch_size samples."""
    import torch

    from recipes import RECIPES
    from runner.train.compute_path import ComputePath

    batch = args.reference_n * args.batch_size
    cfg = bench.compose(overrides("ssgd", 1, batch, args.lr))
    recipe = RECIPES.get("digit_images")(cfg.recipe)
    train, _ = recipe.datasets()
    reps = -(-batch // len(train))
    host_batch = tuple(t.repeat(reps, *[1] * (t.dim() - 1))[:batch] for t in train.tensors)
    torch.manual_seed(cfg.seed)
    model = recipe.build_model()
    o = cfg.optim
    optimizer = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum,
                                nesterov=o.nesterov, weight_decay=o.weight_decay)
    path = ComputePath.from_config(cfg.trainer, torch.device("cpu"))
    timed = bench.time_training_steps(model, recipe, path, optimizer, host_batch, warmup=3,
                                      steps=args.reference_steps)
    return {"batch": batch, "steps": args.reference_steps, "seconds": round(timed.seconds, 3),
            "samples_per_s": batch * args.reference_steps / timed.seconds,
            "final_loss": timed.final_loss}


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_sim.py", args.argv, args.quick)
    groups = [args.nprocs] if args.quick else [[n] for n in args.nprocs]
    per_n = {n: result for group in groups for n, result in measure_n(args, group).items()}
    ref = reference(args)
    compared = {}
    at = per_n[str(args.reference_n)]["cases"]
    for algo in args.algos:
        ratio = at[algo]["samples_per_host_s"] / ref["samples_per_s"]
        compared[algo] = {"nprocs": args.reference_n, "ratio": ratio, "goal": RATIO_GOAL,
                          "goal_met": ratio >= RATIO_GOAL}
    memory = None
    if str(MEMORY_GOAL_N) in per_n:
        peak = per_n[str(MEMORY_GOAL_N)]["peak_rss_gib"]
        memory = {"nprocs": MEMORY_GOAL_N, "peak_rss_gib": peak, "goal_gib": MEMORY_GOAL_GIB,
                  "goal_met": peak <= MEMORY_GOAL_GIB}
    return record.finish({
        "recipe": "digit_images", "algos": args.algos, "batch_size": args.batch_size,
        "steps": args.steps, "nprocs": per_n, "reference": ref, "vs_reference": compared,
        "memory_goal": memory, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    rows = []
    for n, entry in r["nprocs"].items():
        for algo, case in entry["cases"].items():
            vs = r["vs_reference"].get(algo, {})
            ratio = f"{vs['ratio']:.2f}" if vs.get("nprocs") == int(n) else "-"
            rows.append(f"| {r['date'][:10]} | {algo} | {n} | "
                        f"{case['learner_steps_per_host_s']:.0f} | "
                        f"{case['samples_per_host_s']:.0f} | {ratio} | "
                        f"{entry['peak_rss_gib']:.2f} | "
                        f"{r['load_before'][0]} / {r['load_after'][0]} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:  # one N, in its own process (measure_n)
        print("RESULT " + json.dumps(run_child(json.loads(argv[1]))), flush=True)
        return 0
    args = parse_args(argv)
    return bench.measure_and_write("bench_sim", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
