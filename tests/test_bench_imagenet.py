"""benchmarks/bench_imagenet.py --quick on CPU: it runs the trainer's compute path (bf16 autocast,
channels-last; torch.compile is checked in test_compute_path.py) and writes sane JSON and a
markdown row. Never a timed assertion: the numbers are only checked to be numbers."""

import importlib.util
import json
import math

import pytest

from conftest import REPO


def load_bench(name="bench_imagenet"):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_benchmark_writes_json_and_a_markdown_row(tmp_path, capsys):
    bench = load_bench()
    out, table = tmp_path / "bench.json", tmp_path / "bench.md"
    # 32 px, --quick's own: at 16 px ResNet's last stage convolves 1 x 1 inputs, where torch's
    # bf16 channels-last convolution on a CPU reads memory it never wrote (NaN gradients in 5
    # of 30 tries once freed memory held NaNs; none at 32 px): a CI run's NaN loss, twice.
    bench.main(["--quick", "--amp", "bf16", "--image-size", "32", "--batch-size", "2",
                "--steps", "1", "--json", str(out),
                "--markdown", str(table)])
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.split("\n| date")[0]) == result
    assert result["images_per_s"] > 0 and math.isfinite(result["images_per_s"])
    assert result["ms_per_step"] > 0 and math.isfinite(result["final_loss"])
    assert (result["arch"], result["image_size"], result["batch_size"], result["steps"]) == (
        "resnet18", 32, 2, 1)
    assert (result["amp"], result["channels_last"], result["compile"]) == (
        "bfloat16", True, False)
    assert result["device"] == "cpu" and result["peak_memory_gib"] is None
    assert result["quick"] is True and "--quick" in result["command"]
    lines = table.read_text().splitlines()
    assert lines[0].startswith("| date | device |") and len(lines) == 3
    assert lines[2].endswith(f"{result['images_per_s']:.1f} |")


def test_full_defaults_are_the_resnet50_gpu_setting():
    args = load_bench().parse_args([])
    assert (args.arch, args.image_size, args.batch_size, args.amp, args.channels_last) == (
        "resnet50", 224, 256, "auto", True)


@pytest.mark.slow
def test_training_from_jpeg_files_records_the_loader_and_a_lower_bound(tmp_path, capsys):
    from recipes.imagenet.synthetic import write_fake_imagenet

    write_fake_imagenet(tmp_path / "photos", classes=2, train_per_class=8, val_per_class=1,
                        size=120, photos=True)
    out, profile = tmp_path / "bench.json", tmp_path / "profile.txt"
    load_bench().main(["--quick", "--image-size", "16", "--batch-size", "4", "--steps", "2",
                       "--data", str(tmp_path / "photos"), "--loader", "pil", "--workers", "1",
                       "--json", str(out), "--profile", str(profile)])
    result = json.loads(out.read_text())
    # One worker may hold one batch ready: at least 10 timed steps per such batch.
    assert result["loader"] == "pil" and result["loader_queue_batches"] == 1
    assert result["steps"] == 10 and "recipe.loader=pil" in result["data"]
    assert 0 < result["images_per_s_lower_bound"] == pytest.approx(
        result["images_per_s"] * 9 / 10)
    assert result["gpu_share"] is None  # the hybrid loader's alone
    # 10 more steps under torch's profiler (from batches of their own): operators by time.
    table = profile.read_text()
    assert "Self CPU" in table and "aten::convolution" in table, table[:2000]


@pytest.mark.slow
def test_the_input_benchmark_measures_each_cpu_loader_and_says_why_gpu_is_left_out(
        tmp_path, capsys):
    out = tmp_path / "input.json"
    load_bench("bench_imagenet_input").main(["--quick", "--make", "20", "--workers", "1,2",
                                             "--batches", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    rows = {(r["loader"], r["workers"]): r for r in result["rows"]}
    assert set(rows) == {("pil", 1), ("pil", 2), ("simplejpeg", 1), ("simplejpeg", 2)}
    assert all(r["images_per_s"] > 0 for r in rows.values())
    assert rows["pil", 2]["batches"] == 8  # at least 4 batches per worker
    assert result["skipped"] == ["gpu: no CUDA GPU visible here"]
    assert result["files"] == 20 and 10 < result["mean_file_kb"] < 200


def test_the_gpu_loaders_two_device_parts_are_timed_apart_here_on_the_cpu(tmp_path):
    """What the input benchmark times of the gpu loader on a GPU (nvJPEG's decode, then the
    batched resample), run through the CPU's decode so that the code is exercised here."""
    import torch
    from test_imagenet_loaders import encoded_batch

    from recipes.imagenet.synthetic import write_fake_imagenet

    write_fake_imagenet(tmp_path, classes=2, train_per_class=4, val_per_class=1, size=120,
                        photos=True)
    batch = encoded_batch(sorted((tmp_path / "train").rglob("*.JPEG")))
    parts = load_bench("bench_imagenet_input").device_parts(batch.encoded, torch.device("cpu"),
                                                            64, repeats=1)
    assert set(parts) == {"device_decode_images_per_s", "device_resample_images_per_s"}
    assert all(rate > 0 for rate in parts.values())
