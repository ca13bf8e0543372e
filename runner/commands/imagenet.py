"""``adpsgd-imagenet``: prepare ImageNet for recipe=imagenet.

    adpsgd-imagenet sort-val VAL_DIR --devkit DEVKIT_DIR [--out DIR]
    adpsgd-imagenet sort-val VAL_DIR --ground-truth FILE --meta meta.mat|ID_WNID.txt
    adpsgd-imagenet fake DIR [--classes 4 --train-per-class 40 --val-per-class 10]
                             [--size 48 --seed 0 --loose-val] [--photos --processes N]

Errors are one line (``adpsgd-imagenet: error: <cause>. Fix: <fix>``) and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recipes.imagenet.sort_val import (
    GROUND_TRUTH,
    META,
    read_ground_truth,
    read_id_to_wnid,
    sort_validation,
)
from runner.errors import UserError


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="adpsgd-imagenet",
                                  description="Prepare ImageNet (ILSVRC2012) for recipe=imagenet.")
    commands = top.add_subparsers(dest="command", required=True)
    sort = commands.add_parser(
        "sort-val", help="sort the loose validation images into VAL_DIR/<wnid>/",
        description="Sort the official validation images (ILSVRC2012_val_*.JPEG) into class "
                    "folders, from the devkit's ground truth. Rerunnable.")
    sort.add_argument("val_dir", type=Path, help="where the validation tarball was unpacked")
    sort.add_argument("--devkit", type=Path,
                      help=f"the unpacked devkit: reads {GROUND_TRUTH} and {META}")
    sort.add_argument("--ground-truth", type=Path, help="the ground-truth file (overrides "
                      "--devkit's): one ILSVRC2012_ID per line, image order")
    sort.add_argument("--meta", type=Path, help="ID-to-WNID map (overrides --devkit's): "
                      "meta.mat, or a text file of 'ID WNID' lines")
    sort.add_argument("--out", type=Path, help="link the images into OUT/<wnid>/ instead of "
                      "moving them (the source folder stays as it is)")
    fake = commands.add_parser(
        "fake", help="write a tiny ImageNet-shaped tree of generated JPEGs",
        description="A small stand-in for ImageNet (clearly different classes) to try the "
                    "recipe and the tools without the real data.")
    fake.add_argument("root", type=Path)
    fake.add_argument("--classes", type=int, default=4)
    fake.add_argument("--train-per-class", type=int, default=40)
    fake.add_argument("--val-per-class", type=int, default=10)
    fake.add_argument("--size", type=int, default=48, help="mean image side in pixels")
    fake.add_argument("--seed", type=int, default=0)
    fake.add_argument("--photos", action="store_true",
                      help="photo-like images, SIZE wide and 3/4 as high (use --size 500: "
                           "ImageNet's median), costing what photographs cost to decode: for "
                           "measuring a loader (benchmarks/bench_imagenet_input.py)")
    fake.add_argument("--processes", type=int, default=1, help="write with this many processes")
    fake.add_argument("--loose-val", action="store_true",
                      help="validation images unsorted, as the official tarball unpacks, with "
                           "a devkit in ROOT/devkit")
    return top


def sort_val(args: argparse.Namespace) -> str:
    ground_truth = args.ground_truth or (args.devkit / GROUND_TRUTH if args.devkit else None)
    meta = args.meta or (args.devkit / META if args.devkit else None)
    if ground_truth is None or meta is None:
        raise UserError("sort-val needs the ground truth and the ID-to-WNID map",
                        "pass --devkit DEVKIT_DIR, or --ground-truth FILE and --meta FILE")
    report = sort_validation(args.val_dir, read_ground_truth(ground_truth),
                             read_id_to_wnid(meta), args.out)
    return (f"{report.images} validation images in {report.classes} class folders of "
            f"{args.out or args.val_dir}: {report.placed} "
            f"{'linked' if args.out else 'moved'}, {report.already} already in place")


def fake(args: argparse.Namespace) -> str:
    from recipes.imagenet.synthetic import write_fake_imagenet

    if min(args.classes, args.train_per_class, args.val_per_class) < 1 or args.size < 8:
        raise UserError("fake needs at least 1 class and 1 image per class, of size >= 8",
                        "use e.g. --classes 4 --train-per-class 40 --val-per-class 10")
    data = write_fake_imagenet(args.root, args.classes, args.train_per_class,
                               args.val_per_class, args.size, args.seed, args.loose_val,
                               args.photos, max(1, args.processes))
    where = f"loose in {args.root / 'val'}, devkit in {args.root / 'devkit'}" if \
        args.loose_val else "sorted"
    return (f"wrote {len(data.wnids)} classes to {args.root}: {args.train_per_class} training "
            f"and {args.val_per_class} validation images each (validation {where})")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        print({"sort-val": sort_val, "fake": fake}[args.command](args))
    except UserError as ex:
        print(f"adpsgd-imagenet: error: {ex}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
