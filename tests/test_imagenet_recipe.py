"""recipe=imagenet in process: data layout checks, transforms, undecodable files, model, loss,
presets. The training runs on real ranks are in test_imagenet_e2e.py."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_cli import assert_one_line_error

from recipes.classification import classification_sums
from recipes.imagenet.data import BadImage, ImageBatch
from recipes.imagenet.model import RESNETS, build_resnet
from recipes.imagenet.recipe import ImageNet, ImageNetConfig
from recipes.imagenet.synthetic import write_fake_imagenet
from runner.errors import UserError


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    write_fake_imagenet(root, classes=3, train_per_class=4, val_per_class=2, size=40)
    return root


def recipe_for(root: Path, **overrides) -> ImageNet:
    cfg = OmegaConf.structured(ImageNetConfig(image_size=32))
    cfg.data.root = str(root)
    return ImageNet(OmegaConf.merge(cfg, overrides))


def corrupt(path: Path) -> Path:
    path.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    return path


def test_resnet_names_are_torchvisions_builders():
    import torchvision.models.resnet as resnet

    assert set(RESNETS) == {name for name in resnet.__all__ if name[0].islower()}


@pytest.mark.parametrize("arch,last_bn", [("resnet18", "bn2"), ("resnet50", "bn3")])
def test_last_batchnorm_scale_of_every_block_starts_at_zero(arch, last_bn):
    model = build_resnet(arch, num_classes=7, zero_init_residual=True)
    blocks = [m for m in model.modules() if hasattr(m, last_bn) and hasattr(m, "conv1")]
    assert blocks and all(getattr(b, last_bn).weight.abs().sum() == 0 for b in blocks)
    assert model.fc.out_features == 7
    plain = build_resnet(arch, num_classes=7, zero_init_residual=False)
    assert all(getattr(b, last_bn).weight.abs().sum() > 0 for b in plain.modules()
               if hasattr(b, last_bn) and hasattr(b, "conv1"))


def test_datasets_index_classes_by_sorted_train_folders_and_give_uint8_crops(tree):
    recipe = recipe_for(tree)
    train, val = recipe.datasets()
    assert (len(train), len(val), recipe.num_classes) == (12, 6, 3)
    folders = sorted(p.name for p in (tree / "train").iterdir())
    for path, label in train.samples + val.samples:
        assert Path(path).parent.name == folders[label]
    image, label = train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)
    batch = recipe.collate([train[0], val[1]])
    assert batch.images.shape == (2, 3, 32, 32) and batch.bad == ()
    images, labels = recipe.to_device(batch, torch.device("cpu"), torch.float32)
    assert images.dtype == torch.float32 and -3 < images.mean() < 3
    assert labels.tolist() == [train[0][1], val[1][1]]


def test_undecodable_image_stops_with_its_name_or_is_counted_once_when_skipped(tmp_path):
    write_fake_imagenet(tmp_path, classes=2, train_per_class=3, val_per_class=1, size=32)
    bad = corrupt(next((tmp_path / "train").glob("*/*.JPEG")))
    recipe = recipe_for(tmp_path)
    train, _ = recipe.datasets()
    index = next(i for i, (path, _) in enumerate(train.samples) if path == str(bad))
    item = train[index]
    assert isinstance(item, BadImage) and item.path == str(bad)
    batch = recipe.collate([train[i] for i in range(len(train))])
    assert len(batch.labels) == len(train) - 1 and batch.bad == (item,)
    with pytest.raises(UserError, match="cannot decode image .*" + bad.name) as error:
        recipe.to_device(batch, torch.device("cpu"), torch.float32)
    assert "recipe.data.skip_bad=true" in str(error.value)

    skipping = recipe_for(tmp_path, data={"skip_bad": True})
    for _ in range(3):  # every epoch meets it again: still one file
        skipping.to_device(batch, torch.device("cpu"), torch.float32)
    other = BadImage("/elsewhere/x.JPEG", "OSError")
    summary = skipping.summary_entries([skipping.rank_report(), [str(bad), other.path], None])
    assert summary == {"skipped_images": 2, "loader": "simplejpeg",  # auto, on a CPU
                       "skipped_image_files": sorted([str(bad), other.path])}


def test_a_batch_whose_images_were_all_skipped_gives_a_zero_gradient_everywhere(tree):
    recipe = recipe_for(tree, model={"arch": "resnet18"}, data={"skip_bad": True})
    recipe.datasets()
    model = recipe.build_model()
    empty = recipe.collate([BadImage("a.JPEG", "OSError"), BadImage("b.JPEG", "OSError")])
    assert isinstance(empty, ImageBatch) and empty.images.shape == (0, 3, 32, 32)
    images, labels = recipe.to_device(empty, torch.device("cpu"), torch.float32)
    loss = recipe.loss(model, (images, labels))
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in model.parameters())
    assert recipe.eval_sums(model, (images, labels))["count"] == 0


def test_top5_counts_every_row_when_there_are_fewer_than_five_classes():
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])
    sums = classification_sums(logits, torch.tensor([1, 2]))
    assert (sums["count"], sums["top1_correct"], sums["top5_correct"]) == (2.0, 1.0, 2.0)


def test_label_smoothing_reaches_the_loss(tree):
    torch.manual_seed(0)
    logits = torch.randn(4, 3)
    labels = torch.tensor([0, 1, 2, 0])
    model = torch.nn.Identity()
    plain = recipe_for(tree).loss(model, (logits, labels))
    smooth = recipe_for(tree, label_smoothing=0.1).loss(model, (logits, labels))
    expected = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    assert smooth == pytest.approx(expected.item()) and smooth != pytest.approx(plain.item())


def bad_commands(tree: Path, tmp_path: Path) -> list[tuple[list[str], str, str]]:
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    (empty / "val").mkdir()
    loose = tmp_path / "loose"
    write_fake_imagenet(loose, classes=2, train_per_class=1, val_per_class=1, size=16,
                        loose_val=True)
    half = tmp_path / "half"  # an interrupted sort
    write_fake_imagenet(half, classes=2, train_per_class=1, val_per_class=2, size=16)
    next((half / "val").glob("*/*.JPEG")).rename(half / "val" / "ILSVRC2012_val_00000009.JPEG")
    odd = tmp_path / "odd"
    write_fake_imagenet(odd, classes=2, train_per_class=1, val_per_class=1, size=16)
    (odd / "val" / "n99999999").mkdir()
    return [
        ([], "recipe imagenet needs recipe.data.root", "recipe.data.root=DIR"),
        (["recipe.data.root=/no/such/imagenet"], "/no/such/imagenet does not exist",
         "recipe.data.root"),
        ([f"recipe.data.root={tree}", "recipe.data.val=validation"], "has no validation/",
         "recipe.data.val=NAME"),
        ([f"recipe.data.root={empty}"], "train has no class folders", "<wnid>"),
        ([f"recipe.data.root={loose}"], "val holds 2 images but no class folders",
         "adpsgd-imagenet sort-val"),
        ([f"recipe.data.root={half}"], "val holds 1 images next to its class folders",
         "adpsgd-imagenet sort-val"),
        ([f"recipe.data.root={odd}"], "are not in", "same WNID folder names"),
        ([f"recipe.data.root={tree}", "recipe.model.arch=resnet51"],
         "unknown ResNet 'resnet51'", "recipe.model.arch=resnet50"),
        ([f"recipe.data.root={tree}", "recipe.image_size=8"], "recipe.image_size",
         "recipe.image_size=224"),
        ([f"recipe.data.root={tree}", "recipe.data.skip=true"],
         "unknown key 'recipe.data.skip'", "recipe.data.skip_bad"),
        ([f"recipe.data.root={tree}", "trainer.amp=fp8"], "trainer.amp", "trainer.amp=auto"),
        ([f"recipe.data.root={tree}", "recipe.loader=hybird"], "unknown loader 'hybird'",
         "recipe.loader=hybrid"),
        ([f"recipe.data.root={tree}", "recipe.loader=hybrid", "trainer.device=cpu"],
         "loader=hybrid decodes on the training GPU", "recipe.loader=auto"),
        ([f"recipe.data.root={tree}", "recipe.gpu_share=1.5"], "recipe.gpu_share",
         "recipe.gpu_share=0.3"),
        ([f"recipe.data.root={tree}", "trainer.compile_backend=inductr"],
         "trainer.compile_backend", "trainer.compile_backend=inductor"),
    ]


def test_data_and_option_mistakes_end_with_one_line_before_ranks_start(tree, tmp_path, capsys):
    from runner.commands.run import check_command_line

    for args, cause, fix in bad_commands(tree, tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            check_command_line(["recipe=imagenet", *args])
        assert_one_line_error(exit_info.value.code, capsys.readouterr().err, cause, fix)


@pytest.mark.parametrize("preset,algo", [("imagenet_ssgd", "ssgd"),
                                         ("imagenet_adpsgd", "adpsgd")])
def test_presets_hold_the_seeds_imagenet_settings(tree, preset, algo):
    from runner.commands.compose import compose_all, validate_job

    [cfg] = compose_all([f"experiment={preset}", f"recipe.data.root={tree}"], False, "config")
    run = validate_job(cfg)
    assert (run.algo.name, run.recipe.name, run.recipe.model.arch) == (algo, "imagenet",
                                                                        "resnet50")
    o, t = run.optim, run.trainer
    assert (o.lr, o.reference_batch, o.scaling, o.warmup_epochs) == (0.1, 256, "linear", 5)
    assert (o.schedule, list(o.milestones), o.decay_factor) == ("step", [30, 60, 80], 0.1)
    assert (o.momentum, o.nesterov, o.weight_decay) == (0.9, True, 1e-4)
    assert (t.epochs, t.batch_size, t.amp, t.channels_last) == (90, 32, "auto", True)
    assert run.launcher.nprocs % 2 == 0
