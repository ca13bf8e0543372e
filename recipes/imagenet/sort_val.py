"""Sort the official ILSVRC2012 validation images into ``val/<wnid>/`` (ImageFolder layout).

The validation tarball unpacks into 50,000 loose files ``ILSVRC2012_val_00000001.JPEG`` ...
The devkit's ``data/ILSVRC2012_validation_ground_truth.txt`` holds one ILSVRC2012_ID per line,
line i for image i, and ``data/meta.mat`` maps ILSVRC2012_IDs to WNIDs (read with scipy).
Instead of meta.mat, a text file with one ``ID WNID`` pair per line works too. The IDs are not
the order of sorted WNIDs, so a WNID list without IDs (one per line) is refused rather than
guessed at.

Everything is checked before anything moves: a missing image, an image the ground truth does
not list, or an ID without a WNID stops with one line. Rerunning after a complete or an
interrupted run finishes the job and changes nothing else.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from runner.errors import UserError

GROUND_TRUTH = Path("data") / "ILSVRC2012_validation_ground_truth.txt"
META = Path("data") / "meta.mat"
IMAGE_NAME = "ILSVRC2012_val_{:08d}.JPEG"
IMAGE_PATTERN = re.compile(r"ILSVRC2012_val_\d{8}\.JPEG$")


@dataclass
class SortReport:
    images: int
    classes: int
    placed: int  # moved (or linked) by this run
    already: int  # found in their class folder


def read_ground_truth(path: Path) -> list[int]:
    """ILSVRC2012_IDs, one per validation image, in image order."""
    if not path.is_file():
        raise UserError(f"ground-truth file {path} not found",
                        "pass --devkit DIR (the unpacked ILSVRC2012 devkit) or "
                        "--ground-truth FILE")
    labels = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if not line.strip().isdigit():
            raise UserError(f"{path} line {number} is {line.strip()!r}, not an ILSVRC2012_ID",
                            "pass the devkit's ILSVRC2012_validation_ground_truth.txt")
        labels.append(int(line))
    if not labels:
        raise UserError(f"ground-truth file {path} is empty", "pass the devkit's file")
    return labels


def read_id_to_wnid(path: Path) -> dict[int, str]:
    """ILSVRC2012_ID -> WNID from the devkit's meta.mat, or from a text file of
    ``ID WNID`` lines (anything after the WNID is ignored)."""
    if not path.is_file():
        raise UserError(f"ID-to-WNID file {path} not found",
                        "pass --devkit DIR, or --meta meta.mat or a text file of 'ID WNID' "
                        "lines")
    if path.suffix == ".mat":
        return _read_meta_mat(path)
    mapping = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 2 or not fields[0].isdigit():
            raise UserError(f"{path} line {number} is not 'ID WNID': {line.strip()!r}",
                            "give one 'ILSVRC2012_ID WNID' pair per line, or the devkit's "
                            "meta.mat")
        mapping[int(fields[0])] = fields[1]
    return mapping


def _read_meta_mat(path: Path) -> dict[int, str]:
    try:
        from scipy.io import loadmat
    except ImportError:
        raise UserError("reading meta.mat needs scipy",
                        "pip install scipy, or pass --meta with a text file of 'ID WNID' "
                        "lines") from None
    try:
        synsets = loadmat(str(path), squeeze_me=True)["synsets"]
        return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets}
    except Exception as ex:  # noqa: BLE001 - scipy raises many kinds for a foreign file
        raise UserError(f"{path} is not the devkit's meta.mat ({type(ex).__name__}: {ex})",
                        "pass the devkit's data/meta.mat") from None


def sort_validation(val_dir: Path, labels: list[int], id_to_wnid: dict[int, str],
                    out_dir: Path | None = None) -> SortReport:
    """Move ``val_dir``'s images into ``val_dir/<wnid>/`` (or, with ``out_dir``, link them
    into ``out_dir/<wnid>/`` and leave ``val_dir`` as it is, e.g. on read-only storage)."""
    if not val_dir.is_dir():
        raise UserError(f"validation folder {val_dir} not found",
                        "pass the folder the validation tarball was unpacked into")
    target = out_dir or val_dir
    unknown = sorted({i for i in labels if i not in id_to_wnid})
    if unknown:
        raise UserError(f"the ground truth uses ILSVRC2012_ID {unknown[0]} (and "
                        f"{len(unknown) - 1} more) that the ID-to-WNID file does not map",
                        "pass the meta.mat of the same devkit")
    plan, already, missing = [], 0, []
    for number, label in enumerate(labels, 1):
        name = IMAGE_NAME.format(number)
        source, destination = val_dir / name, target / id_to_wnid[label] / name
        if os.path.lexists(destination):
            already += 1
        elif source.is_file():
            plan.append((source, destination))
        else:
            missing.append(name)
    if missing:
        raise UserError(f"the ground truth lists {len(labels)} images but {len(missing)} are "
                        f"in neither {val_dir} nor its class folders (first: {missing[0]})",
                        "unpack the whole validation tarball into that folder")
    listed = {IMAGE_NAME.format(number) for number in range(1, len(labels) + 1)}
    extra = sorted(entry.name for entry in os.scandir(val_dir)
                   if entry.is_file() and IMAGE_PATTERN.match(entry.name)
                   and entry.name not in listed)
    if extra:
        raise UserError(f"{val_dir} holds {len(extra)} validation images that the "
                        f"{len(labels)}-line ground truth does not list (first: {extra[0]})",
                        "pass the ground truth of the same release (50,000 lines for "
                        "ILSVRC2012)")
    for source, destination in plan:
        destination.parent.mkdir(parents=True, exist_ok=True)
        if out_dir is None:
            os.replace(source, destination)
        else:
            destination.symlink_to(source.resolve())
    return SortReport(images=len(labels), classes=len(set(labels)), placed=len(plan),
                      already=already)
