"""Training throughput of recipe=imagenet's model on one device, in images/s, on synthetic data.

    python benchmarks/bench_imagenet.py                      # ResNet-50, 224 px, batch 256
    python benchmarks/bench_imagenet.py --quick              # ResNet-18, 32 px: seconds on a CPU
    python benchmarks/bench_imagenet.py --json bench.json --markdown docs/bench.md
    python benchmarks/bench_imagenet.py --make 4000 --loader auto --workers 14   # from JPEGs

It times the trainer's own compute path, not a stand-in: the recipe's model (flattened into
the flat parameter buffers that every algorithm communicates), the recipe's device-side
normalisation and loss, runner/train/compute_path.py's channels-last, bf16 autocast and
torch.compile options, and SGD with momentum and weight decay. The batch is a fixed uint8 tensor in
pinned host memory, copied to the device every step as the loader's batches are, so JPEG decoding
and communication are left out: the number is what one GPU can train, the ceiling that the
data loader and the algorithm then have to feed. With ``--data DIR`` (an ImageFolder) or
``--make N`` (N photo-like JPEGs written first, as benchmarks/bench_imagenet_input.py does) the
batches come instead from the recipe's own loader (``--loader``, ``--workers``; the gpu loader
decodes on the device, moved a batch ahead by the trainer's prefetching thread), so the number
is end to end from JPEG files. Prints one JSON object and one markdown table row; never
asserts a speed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import shlex
import sys
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from recipes.imagenet.data import ImageBatch
from recipes.imagenet.model import RESNETS, build_resnet
from recipes.imagenet.recipe import ImageNet, ImageNetConfig
from runner.algos.optim import parameter_groups
from runner.comm.buffers import flatten_parameters
from runner.config.run_schema import OptimConfig
from runner.train.compute_path import AMP_CHOICES, ComputePath, amp_dtype
from runner.train.lr_schedule import LRSchedule

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks.bench_imagenet_input import input_batches, make_photos  # noqa: E402
from benchmarks.harness import PROFILED_STEPS, cpu_model, time_training_steps  # noqa: E402

FULL = {"arch": "resnet50", "image_size": 224, "batch_size": 256, "warmup": 10, "steps": 40}
QUICK = {"arch": "resnet18", "image_size": 32, "batch_size": 8, "warmup": 1, "steps": 3}
MD_HEADER = ("| date | device | arch | image | batch | amp | channels_last | compile | img/s |\n"
             "|---|---|---|---|---|---|---|---|---|\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"small defaults for a smoke run: {QUICK}")
    p.add_argument("--arch", choices=RESNETS, help=f"default {FULL['arch']}")
    p.add_argument("--image-size", type=int, help=f"default {FULL['image_size']}")
    p.add_argument("--batch-size", type=int, help=f"per device, default {FULL['batch_size']}")
    p.add_argument("--warmup", type=int, help=f"untimed steps, default {FULL['warmup']}")
    p.add_argument("--steps", type=int, help=f"timed steps, default {FULL['steps']}")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--amp", choices=AMP_CHOICES, default="auto",
                   help="auto: bf16 on GPUs that compute it natively, else none")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--data", type=Path, help="train from this ImageFolder's JPEGs")
    p.add_argument("--make", type=int, help="train from this many generated photo-like JPEGs")
    p.add_argument("--loader", default="auto", help="recipe.loader for --data/--make")
    p.add_argument("--gpu-share", type=float,
                   help="recipe.gpu_share for --loader hybrid (default: the recipe's)")
    p.add_argument("--profile", type=Path,
                   help=f"after the timed steps, {PROFILED_STEPS} more under torch's profiler: "
                   "its table of operators by device time to this file")
    p.add_argument("--workers", type=int, default=os.cpu_count(),
                   help="loader workers for --data/--make (default: one per core)")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="trainer.prefetch_to_device (default: on a GPU)")
    p.add_argument("--json", type=Path, help="also write the JSON object to this file")
    p.add_argument("--markdown", type=Path, help="append the table row to this file")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.gpu_share is not None and args.loader != "hybrid":
        p.error("--gpu-share is the hybrid loader's: add --loader hybrid")
    if min(args.batch_size, args.steps, args.image_size) < 1 or args.warmup < 0:
        p.error("--batch-size, --steps and --image-size must be >= 1, --warmup >= 0")
    return args


def benchmark(args: argparse.Namespace) -> dict:
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    path = ComputePath(device=device, amp=amp_dtype(args.amp, device, torch.float32),
                       channels_last=args.channels_last, compile=args.compile,
                       compile_backend=args.compile_backend, cudnn_benchmark=True)
    recipe = ImageNet(OmegaConf.structured(ImageNetConfig(image_size=args.image_size)))
    prefetch, queue = False, 0
    torch.manual_seed(0)
    model = build_resnet(args.arch, args.classes, zero_init_residual=True).to(device)
    flatten_parameters(model.parameters())  # the trainer's layout
    path.prepare_model(model)
    # The rate the trainer gives this batch (0.1 per 256 images, scaled linearly): the full
    # setting's 0.1, and no divergence in --quick's tiny batches (0.1 on 2 images gave a NaN
    # loss after two steps on one CI machine's CPU).
    optimizer = torch.optim.SGD(parameter_groups(model, 1e-4, False),
                                lr=LRSchedule(OptimConfig(), args.batch_size, 1, 1).peak,
                                momentum=0.9,
                                nesterov=True, weight_decay=1e-4)
    images = torch.randint(0, 256, (args.batch_size, 3, args.image_size, args.image_size),
                           dtype=torch.uint8)
    labels = torch.randint(0, args.classes, (args.batch_size,))
    if use_cuda:
        images, labels = images.pin_memory(), labels.pin_memory()
    host_batch = ImageBatch(images, labels, ())
    jpegs = args.data is not None or args.make
    with contextlib.ExitStack() as stack:
        if jpegs:
            root = args.data or make_photos(stack.enter_context(tempfile.TemporaryDirectory()),
                                            args.make)
            # The loader's workers are at most one batch ahead each: at least 10 timed steps
            # per such batch, and the rate is also given without them (a lower bound).
            queue = max(1, args.workers)
            args.steps = max(args.steps, 10 * queue)
            recipe, data = input_batches(root, args.loader, args.image_size, args.batch_size,
                                         args.warmup + args.steps
                                         + (PROFILED_STEPS if args.profile else 0),
                                         args.workers, device, prefetch_factor=1,
                                         gpu_share=args.gpu_share)
            prefetch = use_cuda if args.prefetch is None else args.prefetch
            stream = stack.enter_context(path.batches(recipe, iter(data), prefetch))
            host_batch = functools.partial(next, stream)
        timed = time_training_steps(model, recipe, path, optimizer, host_batch, args.warmup,
                                    args.steps, profile=args.profile)
    elapsed = timed.seconds
    result = {
        "images_per_s": args.batch_size * args.steps / elapsed,
        "ms_per_step": 1000 * elapsed / args.steps,
        "warmup_s": timed.warmup_s,
        "final_loss": timed.final_loss,
        "arch": args.arch, "image_size": args.image_size, "batch_size": args.batch_size,
        "steps": args.steps, "warmup": args.warmup, "classes": args.classes,
        "amp": str(path.amp).replace("torch.", "") if path.amp else "none",
        "channels_last": args.channels_last, "compile": args.compile,
        "compile_backend": args.compile_backend if args.compile else None,
        "quick": args.quick,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if use_cuda else cpu_model(),
        "cpu_threads": torch.get_num_threads(),
        "peak_memory_gib": timed.peak_memory_gib,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "command": shlex.join(["python", "benchmarks/bench_imagenet.py", *args.argv]),
        "data": (f"JPEG files ({args.data or f'{args.make} generated photo-like'}), "
                 f"recipe.loader={recipe.loader}, {args.workers} workers, prefetch={prefetch}"
                 if jpegs else
                 "synthetic uint8 batch in pinned host memory, copied to the device each step"),
        "loader": recipe.loader if jpegs else None,
        "gpu_share": recipe.cfg.gpu_share if jpegs and recipe.loader == "hybrid" else None,
        # JPEG files: the workers may have decoded this many batches ahead during the warm-up,
        # and the rate as if they had not counted.
        "loader_queue_batches": queue if jpegs else None,
        "images_per_s_lower_bound": (args.batch_size * (args.steps - queue) / elapsed
                                     if jpegs else None),
    }
    return result


def markdown_row(r: dict) -> str:
    device = f"{r['device_name']} ({r['device']})"
    return (f"| {r['date'][:10]} | {device} | {r['arch']} | {r['image_size']} | "
            f"{r['batch_size']} | {r['amp']} | {r['channels_last']} | {r['compile']} | "
            f"{r['images_per_s']:.1f} |")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = benchmark(args)
    text = json.dumps(result, indent=2)
    print(text)
    row = markdown_row(result)
    print(MD_HEADER + row)
    if args.json:
        args.json.write_text(text + "\n")
    if args.markdown:
        new = not args.markdown.exists()
        with open(args.markdown, "a") as f:
            f.write((MD_HEADER if new else "") + row + "\n")


if __name__ == "__main__":
    main()
