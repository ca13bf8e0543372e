"""Training throughput of recipe=swb2000's BLSTM acoustic model on one device, in input
frames/s (100 frames = 1 s of audio), on synthetic features.

    python benchmarks/bench_blstm.py                 # the swb2000 shape, batch 32 x 500 frames
    python benchmarks/bench_blstm.py --amp bf16 --json blstm.json --markdown docs/bench.md
    python benchmarks/bench_blstm.py --quick         # a 2x64 BLSTM: seconds on a CPU

The model is the recipe's own (conf/recipe/swb2000.yaml: 6 bidirectional LSTM layers of 512
cells per direction, a 256-unit bottleneck, frame stacking by 2, 120 inputs = 40 log-mel plus
deltas, a CTC head over characters), in the flat parameter buffers every algorithm
communicates, trained with the recipe's CTC loss through runner/train/compute_path.py's compute path
(bf16 autocast with --amp, device copies from pinned memory) and SGD with Nesterov momentum.
Utterances have random lengths between half and all of --frames (padding as real batches
have it) and random character targets; feature extraction and communication are left out, so
the number is what one device can train. Prints one JSON object and one markdown row; never
asserts a speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "blstm"
FULL = {"batch_size": 32, "frames": 500, "warmup": 5, "steps": 20, "num_layers": None,
        "hidden_size": None, "threads": None}
# One thread: a second one only spins against the other processes of a busy small machine.
QUICK = {"batch_size": 4, "frames": 100, "warmup": 1, "steps": 2, "num_layers": 2,
         "hidden_size": 64, "threads": 1}
MD_HEADER = ("| date | device | layers x cells | batch x frames | amp | frames/s | audio s/s | "
             "ms/step |\n|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from runner.train.compute_path import AMP_CHOICES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(p, NAME, trains=False)
    p.add_argument("--batch-size", type=int, help="utterances per step (default 32)")
    p.add_argument("--frames", type=int, help="longest utterance, 10 ms frames (default 500)")
    p.add_argument("--warmup", type=int, help="untimed steps (default 5)")
    p.add_argument("--steps", type=int, help="timed steps (default 20)")
    p.add_argument("--num-layers", type=int, help="default: the recipe's (6)")
    p.add_argument("--hidden-size", type=int, help="cells per direction; default: the recipe's")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--amp", choices=AMP_CHOICES, default="auto",
                   help="auto: bf16 on GPUs that compute it natively, else none")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's, one per core)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.batch_size, args.frames, args.steps) < 1 or args.warmup < 0:
        p.error("--batch-size, --frames and --steps must be >= 1, --warmup >= 0")
    return args


def recipe_config(args: argparse.Namespace):
    """recipe=swb2000 as adpsgd-run composes it, with the model size overrides."""
    from hydra import compose, initialize_config_module

    import recipes  # noqa: F401 - fills the recipe registry, as the commands do
    from runner.commands.compose import validate

    overrides = ["recipe=swb2000"]
    if args.num_layers:
        overrides.append(f"recipe.model.num_layers={args.num_layers}")
    if args.hidden_size:
        overrides.append(f"recipe.model.hidden_size={args.hidden_size}")
    with initialize_config_module(config_module="runner.conf", version_base=None):
        return validate(compose("config", overrides=overrides))


def synthetic_batch(recipe, batch_size: int, frames: int, generator: torch.Generator):
    """Padded features, lengths between frames/2 and frames, and character targets short
    enough for CTC after frame stacking."""
    lengths = torch.randint(frames // 2, frames + 1, (batch_size,), generator=generator)
    lengths[0] = frames  # the padded length is the longest
    feats = torch.randn(batch_size, frames, recipe.input_dim(), generator=generator)
    target_lengths = torch.clamp(lengths // (4 * recipe.cfg.model.subsample), min=1)
    tokens = torch.randint(1, recipe.head.output_size(), (batch_size, int(target_lengths.max())),
                           generator=generator)
    return feats, lengths, tokens, target_lengths, [f"utt{i}" for i in range(batch_size)]


def benchmark(args: argparse.Namespace) -> dict:
    from recipes import RECIPES
    from runner.algos.optim import parameter_groups
    from runner.comm.buffers import flatten_parameters
    from runner.train.compute_path import ComputePath, amp_dtype

    record = bench.Record(NAME, "benchmarks/bench_blstm.py", args.argv, args.quick)
    if args.threads:
        torch.set_num_threads(args.threads)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    cfg = recipe_config(args)
    recipe = RECIPES.get(cfg.recipe.name)(cfg.recipe)
    torch.manual_seed(0)
    model = recipe.build_model().to(device)
    flatten_parameters(model.parameters())  # the trainer's layout
    path = ComputePath(device=device, amp=amp_dtype(args.amp, device, torch.float32),
                       channels_last=False, compile=args.compile, compile_backend="inductor",
                       cudnn_benchmark=False)
    path.prepare_model(model)
    # The recipe's rate for this batch (optim.lr per optim.reference_batch samples) and its
    # clipping: without them the summed CTC loss diverges to NaN within 20 steps.
    optim = cfg.optim
    lr = optim.lr * args.batch_size / optim.reference_batch
    optimizer = torch.optim.SGD(parameter_groups(model, 0.0, False), lr=lr, momentum=0.9,
                                nesterov=True)
    host = synthetic_batch(recipe, args.batch_size, args.frames, torch.Generator().manual_seed(0))
    if use_cuda:
        host = tuple(t.pin_memory() if isinstance(t, torch.Tensor) else t for t in host)
    frames = int(host[1].sum())

    timed = bench.time_training_steps(model, recipe, path, optimizer, host, args.warmup,
                                      args.steps, clip_grad_norm=optim.clip_grad_norm)
    elapsed = timed.seconds
    m = cfg.recipe.model
    return record.finish({
        "frames_per_s": frames * args.steps / elapsed,
        "audio_seconds_per_s": frames * args.steps / elapsed / 100,
        "ms_per_step": 1000 * elapsed / args.steps,
        "final_loss": timed.final_loss,
        "parameters": sum(p.numel() for p in model.parameters()),
        "num_layers": m.num_layers, "hidden_size": m.hidden_size, "bottleneck": m.bottleneck,
        "subsample": m.subsample, "input_dim": recipe.input_dim(),
        "outputs": recipe.head.output_size(), "batch_size": args.batch_size,
        "frames": args.frames, "frames_per_batch": frames, "steps": args.steps,
        "warmup": args.warmup, "lr": lr, "clip_grad_norm": optim.clip_grad_norm,
        "amp": str(path.amp).replace("torch.", "") if path.amp else "none",
        "compile": args.compile, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if use_cuda else bench.cpu_model(),
        "cpu_threads": torch.get_num_threads(),
        "peak_memory_gib": timed.peak_memory_gib,
    })


def markdown_row(r: dict) -> str:
    return (f"| {r['date'][:10]} | {r['device_name']} ({r['device']}) | {r['num_layers']} x "
            f"{r['hidden_size']} | {r['batch_size']} x {r['frames']} | {r['amp']} | "
            f"{r['frames_per_s']:.0f} | {r['audio_seconds_per_s']:.1f} | {r['ms_per_step']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    return bench.measure_and_write("bench_blstm", args, benchmark, MD_HEADER,
                                   lambda result: [markdown_row(result)])


if __name__ == "__main__":
    raise SystemExit(main())
