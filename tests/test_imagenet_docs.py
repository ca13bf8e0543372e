"""Every command in docs/imagenet.md's bash blocks still matches the code (docs that rot are a
bug). adpsgd-imagenet commands run for real on generated data standing in for /data/...;
adpsgd-run commands go through the full pre-launch check (config and data layout); benchmark
commands through the script's argument parser. (The tarball extraction is an `sh` block: it
needs the real tarballs.)"""

import re
import shlex
import shutil

import pytest
from test_bench_imagenet import load_bench

from recipes.imagenet.synthetic import write_fake_imagenet
from runner.commands.imagenet import main as imagenet_tool
from runner.commands.imagenet import parser as imagenet_parser
from runner.commands.run import check_command_line

from conftest import REPO


def doc_commands() -> list[str]:
    text = (REPO / "docs" / "imagenet.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_every_command_in_the_imagenet_doc_matches_the_code(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"

    def fresh_imagenet():  # /data/imagenet with loose validation images and a devkit
        root, devkit = data / "imagenet", data / "ILSVRC2012_devkit_t12"
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(devkit, ignore_errors=True)
        fake = write_fake_imagenet(root, classes=3, train_per_class=2, val_per_class=2,
                                   size=16, loose_val=True)
        (root / "devkit").rename(devkit)
        (data / "synsets.txt").write_text("".join(f"{i} {w}\n" for w, i in fake.ids.items()))

    commands = doc_commands()
    assert any(c.startswith("adpsgd-imagenet sort-val") for c in commands)
    bench = load_bench()
    input_bench = load_bench("bench_imagenet_input")
    for command in commands:
        words = [re.sub(r"(^|=)/data/", rf"\g<1>{data}/", w) for w in shlex.split(command)]
        if words[:2] == ["adpsgd-imagenet", "sort-val"]:
            fresh_imagenet()
        if words[:2] == ["adpsgd-imagenet", "fake"] and "--photos" in words:
            imagenet_parser().parse_args(words[1:])  # hundreds of photo-sized JPEGs: parsed
        elif words[0] == "adpsgd-imagenet":
            imagenet_tool(words[1:])
        elif words[0] == "adpsgd-run":
            if not (data / "imagenet" / "val" / "n01000003").exists():
                fresh_imagenet()
                imagenet_tool(["sort-val", f"{data}/imagenet/val", "--devkit",
                               f"{data}/ILSVRC2012_devkit_t12"])
            check_command_line(words[1:])
        elif words[:2] == ["python", "benchmarks/bench_imagenet.py"]:
            bench.parse_args(words[2:])
        elif words[:2] == ["python", "benchmarks/bench_imagenet_input.py"]:
            input_bench.parse_args(words[2:])
        else:
            pytest.fail(f"docs/imagenet.md command with no check: {command!r}")
        assert "error" not in capsys.readouterr().err, command
