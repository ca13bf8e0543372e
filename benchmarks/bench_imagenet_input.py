"""ImageNet's input pipeline alone: images/s of the training transform from JPEG files.

    python benchmarks/bench_imagenet_input.py --make 2000 --json input.json
    python benchmarks/bench_imagenet_input.py --data /data/imagenet --loaders pil,simplejpeg
    python benchmarks/bench_imagenet_input.py --quick          # seconds: a smoke run

Each ``recipe.loader`` (pil, simplejpeg, gpu: recipes/imagenet/loaders.py) reads an ImageFolder
through the recipe's own dataset, collate and ``to_device`` (decode, random-resized crop, flip,
to a normalised float batch on the device). "1 worker" is one worker's work timed in this
process (and, for the gpu loader, the device's share of it timed apart); more workers are a
DataLoader feeding the device, timed from the workers' start to the last batch. Without
``--data``, ``--make N`` writes N photo-like JPEGs (500 x 375, quality 90, about 89 KB each:
ImageNet's median size; ``adpsgd-imagenet fake --photos``) to a temporary folder first.
The gpu loader is measured only where a CUDA GPU is visible (else one line says so). Prints
one JSON object and a markdown table; never asserts a speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_model  # noqa: E402
from recipes.imagenet.recipe import ImageNet, ImageNetConfig  # noqa: E402
from recipes.imagenet.synthetic import write_fake_imagenet  # noqa: E402
from runner.train.compute_path import ComputePath  # noqa: E402

CLASSES = 10
FULL = {"batch_size": 256, "batches": 16, "make": 2000, "image_size": 224}
QUICK = {"batch_size": 16, "batches": 3, "make": 64, "image_size": 64}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, help="an ImageFolder root holding train/<class>/*.JPEG")
    p.add_argument("--make", type=int, help="without --data: write this many photo-like JPEGs "
                   f"first (default {FULL['make']})")
    p.add_argument("--loaders", default="pil,simplejpeg,gpu")
    p.add_argument("--workers", default="1,all",
                   help="loader worker counts, comma-separated; 'all': one per core")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--batches", type=int,
                   help="batches per measurement with workers (at least 4 per worker)")
    p.add_argument("--image-size", type=int)
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="move batches to the device in a background thread (default: on a GPU)")
    p.add_argument("--quick", action="store_true", help=f"small defaults: {QUICK}")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def input_batches(root: Path, loader: str, image_size: int, batch_size: int, batches: int,
                  workers: int, device: torch.device, prefetch_factor: int = 2,
                  gpu_share: float | None = None) -> tuple[ImageNet, Any]:
    """The recipe (its loader made concrete for ``device``) and a DataLoader of ``batches``
    random batches of its training set (drawn with replacement, so a small folder serves any
    number), as the trainer's loader makes them: the recipe's collate, pinned on a GPU."""
    recipe = recipe_for(root, loader, image_size, device, gpu_share)
    train, _ = recipe.datasets()
    sampler = torch.utils.data.RandomSampler(range(len(train)), replacement=True,
                                             num_samples=batches * batch_size)
    data = torch.utils.data.DataLoader(train, batch_size=batch_size, sampler=sampler,
                                       num_workers=workers, collate_fn=recipe.collate,
                                       pin_memory=device.type == "cuda",
                                       prefetch_factor=prefetch_factor if workers else None)
    return recipe, data


def recipe_for(root: Path, loader: str, image_size: int, device: torch.device,
               gpu_share: float | None = None) -> ImageNet:
    cfg = OmegaConf.structured(ImageNetConfig(loader=loader, image_size=image_size))
    if gpu_share is not None:
        cfg.gpu_share = gpu_share
    cfg.data.root = str(root)
    recipe = ImageNet(cfg)
    recipe.place(device)
    return recipe


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_one_worker(root: Path, loader: str, args: argparse.Namespace) -> dict:
    """What one loader worker does (read, decode, crop, resize, flip; collate), timed in this
    process, so that no queue of batches decoded in advance can flatter it; and, for the gpu
    loader, the device's share (decode, crop, resize of the batch) timed apart."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipe = recipe_for(root, loader, args.image_size, device)
    train, _ = recipe.datasets()
    order = torch.randint(0, len(train), (args.batch_size * 2,)).tolist()
    recipe.collate([train[i] for i in order[:8]])  # imports, file cache
    started = time.perf_counter()
    batch = recipe.collate([train[i] for i in order[args.batch_size:]])
    worker_s = time.perf_counter() - started
    row = {"loader": recipe.loader, "workers": 1, "what": "one worker, in process",
           "images_per_s": args.batch_size / worker_s, "device": device.type}
    if loader == "gpu":
        recipe.to_device(batch, device, torch.float32)  # nvJPEG's set-up
        sync(device)
        started = time.perf_counter()
        for _ in range(3):
            recipe.to_device(batch, device, torch.float32)
        sync(device)
        row["device_images_per_s"] = 3 * args.batch_size / (time.perf_counter() - started)
        row.update(device_parts(batch.encoded, device, args.image_size))
    row["images_per_s_per_worker"] = row["images_per_s"]
    return row


def device_parts(encoded: Any, device: torch.device, size: int, repeats: int = 5
                 ) -> dict[str, float]:
    """The gpu loader's two device parts timed apart, images/s each: nvJPEG's decode of the
    batch, and the crops' resampling (recipes/imagenet/loaders.py, resized_crops)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    from recipes.imagenet.loaders import resized_crops

    files = list(torch.split(encoded.data, encoded.sizes))

    def rate(work: Any) -> tuple[float, Any]:
        result = work()
        sync(device)
        started = time.perf_counter()
        for _ in range(repeats):
            result = work()
        sync(device)
        return repeats * len(files) / (time.perf_counter() - started), result

    decode_rate, images = rate(lambda: decode_jpeg(files, mode=ImageReadMode.RGB, device=device))
    resample_rate, _ = rate(lambda: resized_crops(images, encoded.boxes, encoded.flips, size,
                                                  torch.float16))
    return {"device_decode_images_per_s": decode_rate,
            "device_resample_images_per_s": resample_rate}


def measure_all(root: Path, loader: str, workers: int, args: argparse.Namespace) -> dict:
    """``workers`` loader workers feeding the device, timed from their start to the last batch
    on the device: at least 4 batches per worker, each worker one batch ahead at most, so the
    time is the pipeline's own (the start of the workers is counted, not hidden)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prefetch = device.type == "cuda" if args.prefetch is None else args.prefetch
    batches = max(args.batches, 4 * workers)
    path = ComputePath(device=device, channels_last=True)
    started = time.perf_counter()
    recipe, data = input_batches(root, loader, args.image_size, args.batch_size, batches,
                                 workers, device, prefetch_factor=1)
    with path.batches(recipe, iter(data), prefetch) as stream:
        for batch in stream:
            images, _ = path.batch(recipe, batch)
    sync(device)
    rate = batches * args.batch_size / (time.perf_counter() - started)
    return {"loader": recipe.loader, "workers": workers, "what": "DataLoader to the device",
            "images_per_s": rate, "images_per_s_per_worker": rate / max(1, workers),
            "batches": batches, "device": device.type, "prefetch": prefetch,
            "batch_shape": list(images.shape)}


def make_photos(scratch: str | Path, count: int, classes: int = CLASSES) -> Path:
    """``count`` photo-like JPEGs in an ImageFolder under ``scratch`` (one process per core)."""
    root = Path(scratch) / "photos"
    write_fake_imagenet(root, classes=classes, train_per_class=max(1, count // classes),
                        val_per_class=1, size=500, photos=True,
                        processes=len(os.sched_getaffinity(0)))
    return root


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    workers = sorted({cores if w == "all" else int(w) for w in args.workers.split(",")})
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or make_photos(scratch, args.make)
        files = [f for f in (root / "train").rglob("*") if f.is_file()]
        mean_kb = sum(f.stat().st_size for f in files) / len(files) / 1024
        rows, skipped = [], []
        for loader in args.loaders.split(","):
            if loader == "gpu" and not torch.cuda.is_available():
                skipped.append("gpu: no CUDA GPU visible here")
                print("bench_imagenet_input: gpu loader skipped: no CUDA GPU visible here")
                continue
            for count in workers:
                row = (measure_one_worker(root, loader, args) if count == 1
                       else measure_all(root, loader, count, args))
                rows.append(row)
                device_part = (f"; the GPU's part {row['device_images_per_s']:.0f} img/s: "
                               f"decode {row['device_decode_images_per_s']:.0f}, resample "
                               f"{row['device_resample_images_per_s']:.0f} apart"
                               if "device_images_per_s" in row else "")
                print(f"{loader:>10} x {count:2d} workers: {row['images_per_s']:8.1f} img/s "
                      f"({row['images_per_s_per_worker']:.1f} per worker{device_part})",
                      flush=True)
    result = {
        "rows": rows, "skipped": skipped, "files": len(files), "mean_file_kb": mean_kb,
        "data": str(args.data) if args.data else f"{len(files)} generated photo-like JPEGs",
        "batch_size": args.batch_size,
        "image_size": args.image_size, "cores": cores, "cpu": cpu_model(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "host": platform.node(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "benchmarks/bench_imagenet_input.py", *args.argv]),
    }
    text = json.dumps(result, indent=2)
    print(text)
    print("| loader | workers | img/s | per worker | the GPU's part, img/s |\n"
          "|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['loader']} | {r['workers']} | {r['images_per_s']:.0f} | "
              f"{r['images_per_s_per_worker']:.0f} | {r.get('device_images_per_s', 0):.0f} |")
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
