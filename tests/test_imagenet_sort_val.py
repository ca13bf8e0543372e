"""adpsgd-imagenet sort-val on a generated validation set with a fake devkit (ground truth and
meta.mat), and with a text ID-to-WNID file: right folders, rerunnable, one-line errors."""

import subprocess
from pathlib import Path

import pytest

from recipes.imagenet.sort_val import GROUND_TRUTH, IMAGE_NAME, META
from recipes.imagenet.synthetic import class_image, write_fake_imagenet
from runner.commands.imagenet import main

from conftest import BIN


@pytest.fixture
def loose(tmp_path):
    return write_fake_imagenet(tmp_path / "imagenet", classes=5, train_per_class=1,
                               val_per_class=3, size=16, seed=3, loose_val=True)


def sort_val(capsys, *args) -> tuple[int, str, str]:
    try:
        main(["sort-val", *map(str, args)])
        status = 0
    except SystemExit as ex:
        status = ex.code
    out, err = capsys.readouterr()
    return status, out, err


def expected_folders(data) -> dict[str, str]:
    wnid_of = {i: wnid for wnid, i in data.ids.items()}
    return {IMAGE_NAME.format(n): wnid_of[label] for n, label in enumerate(data.val_labels, 1)}


def placed(val_dir: Path) -> dict[str, str]:
    return {p.name: p.parent.name for p in val_dir.glob("*/*.JPEG")}


def test_devkit_ground_truth_and_meta_mat_sort_every_image_into_its_class(loose, capsys):
    val = loose.root / "val"
    status, out, _ = sort_val(capsys, val, "--devkit", loose.root / "devkit")
    assert status == 0 and "15 validation images in 5 class folders" in out, out
    assert "15 moved" in out
    assert placed(val) == expected_folders(loose)
    assert not list(val.glob("*.JPEG"))  # nothing left loose
    # The IDs are not in WNID order: sorting by ID position would have put images elsewhere.
    assert sorted(loose.ids, key=loose.ids.get) != sorted(loose.ids)
    status, out, _ = sort_val(capsys, val, "--devkit", loose.root / "devkit")
    assert status == 0 and "0 moved, 15 already in place" in out
    assert placed(val) == expected_folders(loose)


def test_interrupted_sort_finishes_on_rerun(loose, capsys):
    val = loose.root / "val"
    first = val / IMAGE_NAME.format(1)
    wnid = expected_folders(loose)[first.name]
    (val / wnid).mkdir()
    first.rename(val / wnid / first.name)  # as if a first run stopped after one image
    status, out, _ = sort_val(capsys, val, "--devkit", loose.root / "devkit")
    assert status == 0 and "14 moved, 1 already in place" in out
    assert placed(val) == expected_folders(loose)


def test_text_mapping_and_out_dir_link_without_touching_the_source(loose, capsys, tmp_path):
    mapping = tmp_path / "synsets.txt"
    mapping.write_text("# ILSVRC2012_ID WNID words\n" + "".join(
        f"{i} {wnid} some words\n" for wnid, i in loose.ids.items()))
    out_dir = tmp_path / "sorted"
    status, out, _ = sort_val(capsys, loose.root / "val", "--ground-truth",
                              loose.root / "devkit" / GROUND_TRUTH, "--meta", mapping,
                              "--out", out_dir)
    assert status == 0 and "15 linked" in out
    assert placed(out_dir) == expected_folders(loose)
    assert all(p.is_symlink() for p in out_dir.glob("*/*.JPEG"))
    assert len(list((loose.root / "val").glob("*.JPEG"))) == 15


def error_cases(data, tmp_path: Path) -> list[tuple[list, str, str]]:
    devkit = data.root / "devkit"
    truth = devkit / GROUND_TRUTH
    short = tmp_path / "short.txt"
    short.write_text("".join(f"{i}\n" for i in data.val_labels[:-1]))
    long = tmp_path / "long.txt"
    long.write_text("".join(f"{i}\n" for i in [*data.val_labels, data.val_labels[0]]))
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("".join(f"{i}\n" for i in [*data.val_labels[:-1], 999]))
    words = tmp_path / "words.txt"
    words.write_text("".join(f"{wnid} a name\n" for wnid in data.ids))
    garbage = tmp_path / "garbage.mat"
    garbage.write_bytes(b"not a mat file at all")
    val = data.root / "val"
    return [
        ([val, "--devkit", tmp_path / "nope"], "ground-truth file", "--devkit DIR"),
        ([val, "--ground-truth", truth], "needs the ground truth and the ID-to-WNID map",
         "--meta FILE"),
        ([tmp_path / "noval", "--devkit", devkit], "noval not found", "validation tarball"),
        ([val, "--ground-truth", short, "--meta", devkit / META],
         "holds 1 validation images that the 14-line ground truth does not list",
         "50,000 lines"),
        ([val, "--ground-truth", long, "--meta", devkit / META],
         "lists 16 images but 1 are in neither", "unpack the whole validation tarball"),
        ([val, "--ground-truth", unknown, "--meta", devkit / META], "ILSVRC2012_ID 999",
         "meta.mat of the same devkit"),
        ([val, "--ground-truth", truth, "--meta", words], "is not 'ID WNID'",
         "'ILSVRC2012_ID WNID' pair per line"),
        ([val, "--ground-truth", truth, "--meta", garbage], "is not the devkit's meta.mat",
         "data/meta.mat"),
    ]


def test_mistakes_end_with_one_line_and_move_nothing(loose, capsys, tmp_path):
    for args, cause, fix in error_cases(loose, tmp_path):
        status, out, err = sort_val(capsys, *args)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1, (args, err)
        assert lines[0].startswith("adpsgd-imagenet: error: ") and cause in lines[0], lines[0]
        assert "Fix: " in lines[0] and fix in lines[0], lines[0]
        assert len(list((loose.root / "val").glob("*.JPEG"))) == 15  # checked before moving


@pytest.mark.slow
def test_installed_command_sorts_and_reports_errors_in_one_line(loose):
    val, devkit = loose.root / "val", loose.root / "devkit"
    bad = subprocess.run([str(BIN / "adpsgd-imagenet"), "sort-val", str(val)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    good = subprocess.run([str(BIN / "adpsgd-imagenet"), "sort-val", str(val), "--devkit",
                           str(devkit)], capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and "15 moved" in good.stdout, good.stderr
    assert placed(val) == expected_folders(loose)


def test_generated_classes_differ_in_colour_and_pattern():
    import numpy as np

    rng = np.random.default_rng(0)
    means = [class_image(k, 6, rng, 32).reshape(-1, 3).mean(axis=0) for k in range(6)]
    gaps = [np.abs(a - b).max() for i, a in enumerate(means) for b in means[i + 1:]]
    assert min(gaps) > 20  # clearly different colours
