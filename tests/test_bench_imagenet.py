"""benchmarks/bench_imagenet.py --quick on CPU: it runs the trainer's compute path (bf16 autocast,
channels-last; torch.compile is checked in test_compute_path.py) and writes sane JSON and a
markdown row. Never a timed assertion: the numbers are only checked to be numbers."""

import importlib.util
import json
import math

import pytest

from conftest import REPO


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_imagenet",
                                                  REPO / "benchmarks" / "bench_imagenet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_benchmark_writes_json_and_a_markdown_row(tmp_path, capsys):
    bench = load_bench()
    out, table = tmp_path / "bench.json", tmp_path / "bench.md"
    bench.main(["--quick", "--amp", "bf16", "--image-size", "16", "--batch-size", "2",
                "--steps", "1", "--json", str(out),
                "--markdown", str(table)])
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.split("\n| date")[0]) == result
    assert result["images_per_s"] > 0 and math.isfinite(result["images_per_s"])
    assert result["ms_per_step"] > 0 and math.isfinite(result["final_loss"])
    assert (result["arch"], result["image_size"], result["batch_size"], result["steps"]) == (
        "resnet18", 16, 2, 1)
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
