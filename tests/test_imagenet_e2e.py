"""recipe=imagenet through adpsgd-run on 2 real ranks, on a generated ImageFolder of 8 clearly
different classes: a ResNet-18 at 32 px learns far above chance under SSGD and AD-PSGD, logs
top-1/top-5, skips and counts undecodable JPEGs, or stops naming one."""

import pytest

from recipes.imagenet.synthetic import write_fake_imagenet

from conftest import read_run, run_cli

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CLASSES = 8
CHANCE = 100.0 / CLASSES
SMALL = ["recipe=imagenet", "recipe.model.arch=resnet18", "recipe.image_size=32",
         "launcher.nprocs=2", "trainer.batch_size=16", "trainer.eval_batch_size=32",
         "trainer.progress=false"]


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    """8 classes x 23 training and 6 validation JPEGs, plus one undecodable file in each of
    train/ and val/ (184 + 1 training files: no batch of a single image)."""
    root = tmp_path_factory.mktemp("imagenet")
    data = write_fake_imagenet(root, classes=CLASSES, train_per_class=23, val_per_class=6,
                               size=40)
    broken = [root / "train" / data.wnids[2] / "broken.JPEG",
              root / "val" / data.wnids[5] / "broken.JPEG"]
    for path in broken:
        path.write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    return root, broken


def train(root, tmp_path, *args):
    run_dir = tmp_path / "run"
    proc = run_cli([*SMALL, f"recipe.data.root={root}", f"hydra.run.dir={run_dir}", *args],
                   cwd=tmp_path)
    return run_dir, proc


def eval_tags(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return set(events.Tags()["scalars"])


def test_ssgd_learns_far_above_chance_with_workers_and_skips_bad_jpegs(imagenet, tmp_path):
    root, broken = imagenet
    run_dir, proc = train(root, tmp_path, "algo=ssgd", "trainer.epochs=2",
                          "trainer.num_workers=1", "recipe.data.skip_bad=true",
                          "recipe.label_smoothing=0.1", "optim.no_decay_norm_bias=true")
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["recipe"] == "imagenet"
    assert summary["top1"] >= 4 * CHANCE, metrics  # chance is 12.5%
    assert [m["epoch"] for m in metrics] == [1.0, 2.0]
    assert all({"top1", "top5", "loss"} <= set(m) and m["top5"] >= m["top1"] for m in metrics)
    assert {"eval/top1", "eval/top5", "eval/loss", "train/loss"} <= eval_tags(run_dir)
    assert summary["samples"] == 2 * (CLASSES * 23 + 1)  # bad files still have their turn
    assert summary["skipped_images"] == 2
    assert summary["skipped_image_files"] == sorted(map(str, broken))
    assert "top1" in proc.stdout and "top5" in proc.stdout
    logs = "".join((run_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
    assert "skipping undecodable image" in logs


def test_adpsgd_learns_and_scores_the_averaged_model_with_averaged_batchnorm(imagenet,
                                                                           tmp_path):
    root, _ = imagenet
    run_dir, _ = train(root, tmp_path, "algo=adpsgd", "trainer.epochs=2",
                       "recipe.data.skip_bad=true", "optim.no_decay_norm_bias=true")
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["algo"] == "adpsgd"
    assert summary["top1"] >= 4 * CHANCE, metrics
    assert {m["split"] for m in metrics} == {"eval", "eval_rank0"}
    assert summary["final_rank0"]["top1"] >= 2 * CHANCE
    assert summary["consensus_distance"] > 0  # the replicas really differed


def test_an_undecodable_jpeg_stops_the_job_with_a_line_naming_it(imagenet, tmp_path):
    root, broken = imagenet
    proc = run_cli([*SMALL, "algo=ssgd", f"recipe.data.root={root}", "trainer.epochs=1",
                    "trainer.num_workers=0",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "cannot decode image" in line]
    assert lines and lines[0].startswith("adpsgd-run: error: cannot decode image "), proc.stderr
    assert str(broken[0]) in lines[0] or str(broken[1]) in lines[0]
    assert "recipe.data.skip_bad=true" in lines[0]
