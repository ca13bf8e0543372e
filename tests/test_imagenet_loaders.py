"""recipe.loader (recipes/imagenet/loaders.py): every loader draws the augmentation torchvision's
RandomResizedCrop and RandomHorizontalFlip draw, from the same random stream, so the same
seed gives the same crops whichever decodes them; simplejpeg's reduced-scale decoding and the
gpu loader's device-side crop (run here on the CPU, its code path unchanged) give the pixels
Pillow gives, within rounding; files a fast decoder cannot take fall back to Pillow; an
undecodable file is named whatever the loader."""

import io

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from recipes.imagenet.data import (
    BadImage,
    EncodedImage,
    PillowImage,
    normalize_on_device,
    train_transform,
)
from recipes.imagenet.loaders import (
    CANVAS_SIDE,
    CropBox,
    EncodedTrain,
    HybridTrain,
    SimpleJpegTrain,
    crop_box,
    decode_on_gpu,
    resized_crops,
    resolve_loader,
)
from recipes.imagenet.recipe import ImageNet, ImageNetConfig
from recipes.imagenet.synthetic import photo_image, write_fake_imagenet
from runner.errors import UserError

SIZE = 64


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    write_fake_imagenet(root, classes=2, train_per_class=6, val_per_class=1, size=320,
                        photos=True)
    return sorted((root / "train").rglob("*.JPEG"))


def recipe_for(loader, root="unused"):
    cfg = OmegaConf.structured(ImageNetConfig(loader=loader, image_size=SIZE))
    cfg.data.root = str(root)
    return ImageNet(cfg)


@pytest.mark.parametrize("height,width", [(375, 500), (500, 375), (64, 1000), (1000, 64),
                                          (224, 224), (17, 31)])
def test_crop_boxes_are_torchvisions_random_resized_crop_draws(height, width):
    from torchvision.transforms import RandomResizedCrop

    for seed in range(40):
        torch.manual_seed(seed)
        ours = crop_box(height, width, 0.08)
        torch.manual_seed(seed)
        theirs = RandomResizedCrop.get_params(torch.empty(3, height, width), [0.08, 1.0],
                                              [3 / 4, 4 / 3])
        assert tuple(ours) == tuple(theirs), (seed, ours, theirs)


def loads(load, paths, seed=0):
    torch.manual_seed(seed)
    return [load(str(p)) for p in paths]


def encoded_batch(paths, seed=0):
    """The gpu loader's first half: the workers' EncodedTrain items, collated into a batch."""
    items = loads(EncodedTrain(SIZE, 0.08, fallback=None), paths, seed)
    assert all(isinstance(item, EncodedImage) for item in items)
    return recipe_for("gpu").collate([(item, 0) for item in items])


def gpu_path_on(device, paths, seed=0):
    """The gpu loader's two halves: the worker's EncodedTrain, then the batch's decode, crop
    and resize on ``device`` (the recipe's to_device)."""
    batch = encoded_batch(paths, seed)
    images, failed = decode_on_gpu(batch.encoded, torch.device(device), SIZE)
    assert failed == []
    return images.cpu()


def test_every_loader_gives_pillows_crops_from_the_same_seed(photos):
    pil = torch.stack(loads(PillowImage(train_transform(SIZE, 0.08)), photos)).float()
    fast = torch.stack(loads(SimpleJpegTrain(SIZE, 0.08, fallback=None), photos)).float()
    gpu = gpu_path_on("cpu", photos)
    assert pil.shape == fast.shape == gpu.shape == (len(photos), 3, SIZE, SIZE)

    def per_image(a, b):  # mean absolute difference of each image pair, in grey levels
        return (a - b).abs().mean(dim=(1, 2, 3))

    # The gpu path decodes the whole file and resamples with the same antialiased bilinear
    # filter: rounding apart, Pillow's pixels. simplejpeg decodes crops of >= 2 x 64 px at
    # 1/2-1/8 scale (the IDCT's downscaling instead of the filter's): a few grey levels.
    assert per_image(gpu, pil).max() < 1
    assert per_image(fast, pil).max() < 10
    # Another crop, or the other flip, of the same photos differs by far more.
    assert per_image(pil.roll(1, 0), pil).min() > 30
    assert per_image(pil.flip(-1), pil).min() > 30


def random_crops(count, seed):
    """uint8 images of random sizes, a random box in each (some smaller than the output, so
    upsampled), every other one flipped."""
    generator = torch.Generator().manual_seed(seed)

    def draw(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    images, boxes = [], []
    for _ in range(count):
        height, width = draw(8, 300), draw(8, 300)
        images.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8,
                                    generator=generator))
        box_height, box_width = draw(1, height), draw(1, width)
        boxes.append(CropBox(draw(0, height - box_height), draw(0, width - box_width),
                             box_height, box_width))
    return images, boxes, [k % 2 == 1 for k in range(count)]


@pytest.mark.parametrize("canvas_side", [CANVAS_SIDE, 200, 0])
def test_the_batched_resize_is_torchs_antialiased_bilinear_crop_by_crop(canvas_side):
    """The gpu loader's resampling of a whole batch (two matrix products over a padded canvas;
    crops over canvas_side one by one) gives each crop what interpolate(antialias=True) gives
    it alone, flipped where drawn: in float32 to rounding, in float16 (the GPU's) within a
    quarter of a grey level."""
    images, boxes, flips = random_crops(16, seed=canvas_side % 7)
    expected = []
    for image, box, flip in zip(images, boxes, flips):
        crop = image[:, box.top:box.top + box.height, box.left:box.left + box.width]
        alone = torch.nn.functional.interpolate(crop[None].float(), size=(SIZE, SIZE),
                                                mode="bilinear", antialias=True)[0]
        expected.append(alone.flip(-1) if flip else alone)
    expected = torch.stack(expected)
    batched = resized_crops(images, boxes, flips, SIZE, canvas_side=canvas_side)
    assert batched.dtype == torch.float32 and batched.shape == (16, 3, SIZE, SIZE)
    assert (batched - expected).abs().max() < 1e-3
    half = resized_crops(images, boxes, flips, SIZE, torch.float16, canvas_side=canvas_side)
    assert (half - expected).abs().max() < 0.25
    assert (batched.flip(-1) - expected).abs().mean() > 10  # a flip is not a rounding


def test_the_hybrid_loader_gives_each_file_the_crop_of_the_loader_it_draws(photos):
    """loader=hybrid: about gpu_share of the files go to the GPU path, the rest are decoded by
    simplejpeg; each file's pixels are those of the loader that took it, with the crop and flip
    every loader draws for it (the coin is Python's random, not torch's stream); the recipe's
    to_device puts the batch back together, labels in the order of its images."""
    import random

    hybrid = HybridTrain(SimpleJpegTrain(SIZE, 0.08, fallback=None),
                         EncodedTrain(SIZE, 0.08, fallback=None), gpu_share=0.5)
    random.seed(1)
    items = loads(hybrid, photos)
    on_gpu = [i for i, item in enumerate(items) if isinstance(item, EncodedImage)]
    on_cpu = [i for i, item in enumerate(items) if not isinstance(item, EncodedImage)]
    assert on_gpu and on_cpu
    by_cpu = loads(SimpleJpegTrain(SIZE, 0.08, fallback=None), photos)
    by_gpu = gpu_path_on("cpu", photos)
    for i in on_cpu:
        assert torch.equal(items[i], by_cpu[i]), i
    recipe = recipe_for("hybrid")
    batch = recipe.collate([(item, index) for index, item in enumerate(items)])
    images, labels = recipe.to_device(batch, torch.device("cpu"), torch.float32)
    assert labels.tolist() == on_cpu + on_gpu
    # The workers' crops first, then the GPU path's, each as its loader alone gives it.
    assert torch.equal(images[:len(on_cpu)], normalize_on_device(
        torch.stack([by_cpu[i] for i in on_cpu]).float(), torch.float32))
    assert torch.allclose(images[len(on_cpu):], normalize_on_device(by_gpu[on_gpu],
                                                                    torch.float32))


def test_the_hybrid_loader_needs_a_gpu():
    with pytest.raises(UserError, match="recipe.loader=hybrid decodes on the training GPU"):
        resolve_loader("hybrid", torch.device("cpu"))


def test_simplejpeg_decodes_a_large_photo_at_a_reduced_scale_with_the_same_content(tmp_path):
    import simplejpeg

    path = tmp_path / "big.JPEG"
    Image.fromarray(photo_image(0, 2, np.random.default_rng(1), 1200)).save(path, quality=90)
    header = simplejpeg.decode_jpeg_header(path.read_bytes())
    assert header[:2] == (900, 1200)
    seen = []
    real = simplejpeg.decode_jpeg

    def spy(data, **kw):
        seen.append(kw)
        return real(data, **kw)

    simplejpeg.decode_jpeg = spy
    try:
        fast = torch.stack(loads(SimpleJpegTrain(SIZE, 0.5, None), [path] * 8)).float()
    finally:
        simplejpeg.decode_jpeg = real
    assert any(kw["min_height"] < 900 for kw in seen), seen  # crops >= 2 x 64 px: scaled
    pil = torch.stack(loads(PillowImage(train_transform(SIZE, 0.5)), [path] * 8)).float()
    # The same crops: a few grey levels apart (the IDCT keeps more of this photo's per-pixel
    # noise than the bilinear filter), against > 30 between different crops.
    assert (fast - pil).abs().mean(dim=(1, 2, 3)).max() < 12
    assert (pil.roll(1, 0) - pil).abs().mean(dim=(1, 2, 3)).min() > 30


def test_cmyk_and_png_files_fall_back_to_pillow_in_the_fast_loaders(tmp_path):
    rgb = photo_image(1, 2, np.random.default_rng(2), 160)
    cmyk, png = tmp_path / "cmyk.JPEG", tmp_path / "png.JPEG"
    Image.fromarray(rgb).convert("CMYK").save(cmyk, quality=90)
    Image.fromarray(rgb).save(png, format="PNG")  # ImageNet has one such file
    pillow = PillowImage(train_transform(SIZE, 0.08))
    for load in (SimpleJpegTrain(SIZE, 0.08, pillow), EncodedTrain(SIZE, 0.08, pillow)):
        for path in (cmyk, png):
            out = load(str(path))
            assert isinstance(out, torch.Tensor) and out.shape == (3, SIZE, SIZE)
            assert out.dtype == torch.uint8


def test_an_undecodable_file_is_named_whatever_the_loader(tmp_path, photos):
    good = photos[0].read_bytes()
    truncated, garbage = tmp_path / "truncated.JPEG", tmp_path / "garbage.JPEG"
    truncated.write_bytes(good[: len(good) // 3])
    garbage.write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    samples = [(str(photos[0]), 0), (str(truncated), 1), (str(garbage), 1)]
    for loader in ("pil", "simplejpeg"):
        recipe = recipe_for(loader)
        recipe.loader = loader
        files = imagefiles(recipe, samples)
        out = [files[i] for i in range(3)]
        assert isinstance(out[2], BadImage) and out[2].path == str(garbage)
        if loader == "pil":  # libjpeg-turbo through simplejpeg decodes what it can of it
            assert isinstance(out[1], BadImage) and out[1].path == str(truncated)
    # The gpu loader: the worker reads the header only; the device-side decode finds the
    # truncated file, Pillow cannot decode it either, and the recipe names it.
    recipe = recipe_for("pil")
    recipe.loader = "gpu"
    files = imagefiles(recipe, samples, EncodedTrain(SIZE, 0.08, fallback=None))
    batch = recipe.collate([files[0], files[1], files[2]])
    assert [b.path for b in batch.bad] == [str(garbage)]
    with pytest.raises(UserError, match="cannot decode image .*truncated.JPEG"):
        recipe.to_device(batch._replace(bad=()), torch.device("cpu"), torch.float32)
    recipe.cfg.data.skip_bad = True
    images, labels = recipe.to_device(batch, torch.device("cpu"), torch.float32)
    assert images.shape == (1, 3, SIZE, SIZE) and labels.tolist() == [0]
    assert recipe.skipped == {str(garbage), str(truncated)}


def imagefiles(recipe, samples, load=None):
    from recipes.imagenet.data import ImageFiles

    pillow = PillowImage(train_transform(SIZE, 0.08))
    load = load or {"pil": pillow, "simplejpeg": SimpleJpegTrain(SIZE, 0.08, pillow)}[
        recipe.loader]
    return ImageFiles(samples, load)


def test_auto_picks_simplejpeg_on_a_cpu_and_gpu_is_refused_there():
    assert resolve_loader("auto", torch.device("cpu")) == "simplejpeg"
    # Too few cores per rank would mean the GPU, but no GPU decodes here.
    assert resolve_loader("auto", torch.device("cuda"), ranks_on_host=1000) == "simplejpeg"
    assert resolve_loader("pil", torch.device("cpu")) == "pil"
    with pytest.raises(UserError, match="recipe.loader=gpu decodes on the training GPU"):
        resolve_loader("gpu", torch.device("cpu"))


def test_a_jpeg_in_memory_decodes_the_same_through_the_gpu_path_on_a_cpu():
    rgb = photo_image(0, 2, np.random.default_rng(3), 200)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "JPEG", quality=95)
    data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    from recipes.imagenet.data import pack_encoded

    whole = CropBox(0, 0, rgb.shape[0], rgb.shape[1])
    packed = pack_encoded([EncodedImage("mem", data, whole, False),
                           EncodedImage("mem", data, whole, True)])
    images, failed = decode_on_gpu(packed, torch.device("cpu"), 64)
    assert failed == [] and images.shape == (2, 3, 64, 64)
    assert torch.allclose(images[1], images[0].flip(-1))
    reference = torch.nn.functional.interpolate(
        torch.from_numpy(rgb).permute(2, 0, 1)[None].float(), size=(64, 64), mode="bilinear",
        antialias=True)[0]
    assert (images[0] - reference).abs().mean() < 3  # JPEG's loss at quality 95, resampled
