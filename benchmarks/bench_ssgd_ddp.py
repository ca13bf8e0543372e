"""SSGD against torch's DistributedDataParallel: the same model, batch, ranks, threads and
data order; the throughput ratio SSGD / DDP (goal >= 1.0).

    python benchmarks/bench_ssgd_ddp.py                    # 2 ranks, 5 repetitions of 4 epochs
    python benchmarks/bench_ssgd_ddp.py --nprocs 4 --json ddp.json --markdown docs/bench.md
    python benchmarks/bench_ssgd_ddp.py --quick            # seconds: checks the wiring only

Everything runs in ONE mpiexec job, so both sides share the processes, the thread settings
(the local launcher's OMP_NUM_THREADS) and the machine's load at that moment. Each rank first
runs one untimed epoch of each (warm-up: allocator, caches, the process group), then
``--repeats`` timed runs of each, alternating which goes first so that a drift in load hits
both alike. SSGD is the trainer exactly as adpsgd-run runs it (runner.rank.run_rank on a run
dir; its summary's samples_per_s). DDP is a plain training loop over the same recipe, the same
sharded batches (runner/train/data.py), learning-rate schedule, optimizer, compute path and bucket
size (``comm.bucket_mb`` as ``bucket_cap_mb``), with gloo on CPU and NCCL on GPU. Both count
samples over training seconds (evaluation excluded), the slowest rank's time. The reported
ratio is the median of SSGD's throughputs over the median of DDP's. As a check that the two
compute the same thing, the warm-up's final models are compared (max |difference|; both are
synchronous SGD on the same batches, so only the summation order differs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "ssgd_vs_ddp"
# A 1.1M-parameter digits CNN (4.3 MB of gradients per step): big enough that gradient
# communication is part of a step, small enough for minutes on two cores.
FULL = {"nprocs": 2, "repeats": 5, "epochs": 4, "batch_size": 32,
        "overrides": ["recipe=digit_images", "recipe.hidden=1024"]}
QUICK = {"nprocs": 2, "repeats": 1, "epochs": 1, "batch_size": 32,
         "overrides": ["recipe=digit_images"]}
MD_HEADER = ("| date | machine | ranks | model | batch/rank | SSGD samples/s | DDP samples/s "
             "| ratio (goal >= 1.0) | load before/after |\n|---|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME)
    p.add_argument("--nprocs", type=int, help=f"ranks (default {FULL['nprocs']})")
    p.add_argument("--repeats", type=int, help=f"timed runs of each (default {FULL['repeats']})")
    p.add_argument("--epochs", type=int, help=f"epochs per timed run (default {FULL['epochs']})")
    p.add_argument("--batch-size", type=int, help="per rank (default 32)")
    p.add_argument("overrides", nargs="*", help="adpsgd-run overrides for both sides "
                   f"(default: {' '.join(FULL['overrides'])})")
    p.add_argument("--rank-job", help=argparse.SUPPRESS)  # the rank side, under mpiexec
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if min(args.nprocs, args.repeats, args.epochs, args.batch_size) < 1:
        p.error("--nprocs, --repeats, --epochs and --batch-size must be >= 1")
    return args


# ---- the rank side ---------------------------------------------------------------------------
def train_ddp(cfg, world_mpi, model_out: Path | None = None) -> dict:
    """Train ``cfg`` with DistributedDataParallel as a plain loop; samples/s of all ranks."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from recipes import RECIPES
    from runner.algos.optim import parameter_groups
    from runner.errors import UserError
    from runner.train.compute_path import ComputePath, resolve_device
    from runner.train.data import BatchFetcher, ShardedBatches
    from runner.train.lr_schedule import LRSchedule
    from runner.train.rng import rank_seed, seed_everything

    rank, size = world_mpi.Get_rank(), world_mpi.Get_size()
    tcfg, o = cfg.trainer, cfg.optim
    device = resolve_device(tcfg.device, rank)
    recipe = RECIPES.get(cfg.recipe.name)(cfg.recipe)
    train_set, _ = recipe.datasets()
    seed_everything(cfg.seed)  # the trainer's initial model
    model = recipe.build_model().to(device)
    compute = ComputePath.from_config(tcfg, device)
    compute.prepare_model(model)
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                  bucket_cap_mb=cfg.comm.bucket_mb, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(parameter_groups(model, o.weight_decay, o.no_decay_norm_bias),
                                lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                                weight_decay=o.weight_decay)
    shards = ShardedBatches(len(train_set), rank, size, tcfg.batch_size, cfg.seed)
    fetch = BatchFetcher(train_set, recipe.collate, num_workers=tcfg.num_workers,
                         pin_memory=tcfg.pin_memory and device.type == "cuda",
                         persistent_workers=tcfg.persistent_workers)
    schedule = LRSchedule(o, size * tcfg.batch_size, len(train_set), tcfg.epochs)
    seed_everything(rank_seed(cfg.seed, rank))
    samples = 0
    world_mpi.Barrier()
    started = time.perf_counter()
    for epoch in range(tcfg.epochs):
        batches = shards.epoch_batches(epoch)
        for k, batch in enumerate(fetch.iterate(batches)):
            if batch is None:  # DDP needs every rank in every step's reduction
                raise UserError("an empty batch on a rank: DDP cannot skip a step",
                                "choose --batch-size so that every rank gets samples")
            for group in optimizer.param_groups:
                group["lr"] = schedule.lr_at(samples)
            optimizer.zero_grad(set_to_none=False)
            batch = compute.batch(recipe, batch)
            with compute.autocast():
                loss = recipe.loss(ddp, batch)
            # The trainer's count weighting (1 unless the last batch is short).
            (loss * len(batches[k]) * size / shards.global_count(k)).backward()
            if o.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_grad_norm)
            optimizer.step()
            samples += shards.global_count(k)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = world_mpi.allreduce(time.perf_counter() - started, op=_mpi().MAX)
    if model_out is not None and rank == 0:
        torch.save(model.state_dict(), model_out)
    return {"samples": samples, "train_s": elapsed, "samples_per_s": samples / elapsed}


def _mpi():
    from runner.comm.world import mpi

    return mpi()


def max_difference(ssgd_dir: Path, ddp_model: Path) -> float:
    import torch

    ours = torch.load(ssgd_dir / "checkpoints" / "final_rank0.pt", weights_only=False)["model"]
    theirs = torch.load(ddp_model, weights_only=True)
    return max(float((ours[k].float() - theirs[k].float()).abs().max()) for k in ours)


def rank_job(spec_path: Path) -> None:
    """Warm-up of each, then the timed runs in alternating order; rank 0 writes the DDP
    numbers next to the spec (SSGD's are in its run dirs' summaries)."""
    from runner.comm.communicator import init_torch_distributed, shutdown_torch_distributed
    from runner.rank import load_run_config, run_rank
    from runner.train.compute_path import resolve_device

    spec = json.loads(spec_path.read_text())
    world_mpi = _mpi().COMM_WORLD
    warmup_dir, timed_dirs = Path(spec["warmup"]), [Path(d) for d in spec["timed"]]
    device = resolve_device(load_run_config(warmup_dir).trainer.device, world_mpi.Get_rank())
    init_torch_distributed(world_mpi, "nccl" if device.type == "cuda" else "gloo")
    ddp_model = spec_path.parent / "ddp_warmup_model.pt"

    def ssgd(run_dir: Path) -> None:
        if run_rank(run_dir, in_process=True) != 0:
            raise SystemExit(1)  # run_rank has aborted the job

    ssgd(warmup_dir)
    results = {"warmup": train_ddp(load_run_config(warmup_dir), world_mpi, ddp_model),
               "timed": []}
    for index, run_dir in enumerate(timed_dirs):
        cfg = load_run_config(run_dir)
        if index % 2 == 0:
            ssgd(run_dir)
            results["timed"].append(train_ddp(cfg, world_mpi))
        else:
            results["timed"].append(train_ddp(cfg, world_mpi))
            ssgd(run_dir)
    if world_mpi.Get_rank() == 0:
        results["max_abs_difference"] = max_difference(warmup_dir, ddp_model)
        (spec_path.parent / "ddp_results.json").write_text(json.dumps(results, indent=2))
    shutdown_torch_distributed()


# ---- the driver ------------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_ssgd_ddp.py", args.argv, args.quick)
    base = [*args.overrides, "algo=ssgd", f"launcher.nprocs={args.nprocs}",
            f"trainer.batch_size={args.batch_size}", "trainer.progress=false"]
    cases = {"warmup": [*base, "trainer.epochs=1"]}
    cases.update({f"ssgd-{i}": [*base, f"trainer.epochs={args.epochs}"]
                  for i in range(args.repeats)})
    run_dirs = bench.prepare_cases(args.runs, cases)
    spec = args.runs / "spec.json"
    spec.write_text(json.dumps({"warmup": str(run_dirs["warmup"]),
                                "timed": [str(run_dirs[f"ssgd-{i}"])
                                          for i in range(args.repeats)]}))
    bench.run_ranks(args.nprocs, [str(Path(__file__).resolve()), "--rank-job", str(spec)],
              args.timeout, "SSGD and DDP")
    ddp = json.loads((args.runs / "ddp_results.json").read_text())
    ssgd = [bench.read_run(run_dirs[f"ssgd-{i}"])["summary"] for i in range(args.repeats)]
    ssgd_rates = [s["samples_per_s"] for s in ssgd]
    ddp_rates = [r["samples_per_s"] for r in ddp["timed"]]
    cfg_model = " ".join(o for o in args.overrides if o.startswith("recipe"))
    return record.finish({
        "nprocs": args.nprocs, "batch_size": args.batch_size, "epochs": args.epochs,
        "repeats": args.repeats, "model": cfg_model, "overrides": base,
        "parameters": bench.parameter_count(run_dirs["warmup"]),
        "ssgd_samples_per_s": ssgd_rates, "ddp_samples_per_s": ddp_rates,
        "ssgd_median": bench.median(ssgd_rates), "ddp_median": bench.median(ddp_rates),
        "ratio": bench.median(ssgd_rates) / bench.median(ddp_rates),
        "paired_ratios": [s / d for s, d in zip(ssgd_rates, ddp_rates)],
        "goal": ">= 1.0",
        "ssgd_time_split_s": {k: bench.median([s[k] for s in ssgd])
                              for k in ("compute_s", "comm_s", "idle_s", "data_s")},
        "warmup_max_abs_difference": ddp["max_abs_difference"],
        "run_dirs": str(args.runs),
    })


def markdown_row(r: dict) -> str:
    return (f"| {r['date'][:10]} | {r['machine']['cpu']} x{r['machine']['cores']} | "
            f"{r['nprocs']} | {r['model']} ({r['parameters'] / 1e6:.2f}M) | {r['batch_size']} | "
            f"{r['ssgd_median']:.0f} | {r['ddp_median']:.0f} | {r['ratio']:.2f} | "
            f"{r['load_before'][0]} / {r['load_after'][0]} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_job:
        rank_job(Path(args.rank_job))
        return 0

    return bench.measure_and_write("bench_ssgd_ddp", args, measure, MD_HEADER,
                                   lambda result: [markdown_row(result)])


if __name__ == "__main__":
    raise SystemExit(main())
