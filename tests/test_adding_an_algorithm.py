"""docs/adding-an-algorithm.md, followed to the letter: its blocks are written into a copy of the
source tree, and the new algorithm is then composed, validated, trained on 2 real ranks and
checked against SSGD with the project's own equivalence harness. A guide that stops working
fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import BIN, MPI_SCRIPTS, REPO

pytestmark = pytest.mark.mpi

GUIDE = REPO / "docs" / "adding-an-algorithm.md"


def guide_blocks() -> list[tuple[str, str]]:
    """(target, text) of each block the guide marks as a new file."""
    pattern = r"<!-- file: (\S+) -->\n```\w*\n(.*?)```"
    return re.findall(pattern, GUIDE.read_text(), flags=re.S)


def follow_the_guide(src: Path) -> dict[str, list[str]]:
    """Write the guide's files into the tree at ``src``; return the equivalence cases the new
    algorithm declares (``reduces_to``), read from that tree as the tests read them."""
    for target, text in guide_blocks():
        (src / target).write_text(text)
    proc = run(src, [sys.executable, "-c", (
        "import json; from runner.algos import ALGORITHMS; "
        "print(json.dumps({case: ['algo=model_mixing', *r.overrides] for case, r in "
        "vars(ALGORITHMS.get('model_mixing'))['reduces_to'].items() "
        "if r.reference == ('algo=ssgd',)}))")], src)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    src = tmp_path_factory.mktemp("clone")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("runner", "recipes", "conf"):
        shutil.copytree(REPO / part, src / part, ignore=ignore,
                        symlinks=True, dirs_exist_ok=True)
    # An install ships conf/ inside the package as runner.conf (setup.cfg): the same here.
    conf = src / "runner" / "conf"
    if not conf.exists():
        conf.symlink_to("../conf")
    return src, follow_the_guide(src)


def run(src: Path, args: list[str], cwd: Path, timeout: float = 300
        ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src), "PATH": f"{BIN}:{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_guide_marks_every_step():
    """Three files of code and configuration, nothing edited elsewhere (the fourth place is
    the documentation): the packages import every module, the tests read the registries."""
    assert [target for target, _ in guide_blocks()] == [
        "runner/algos/model_mixing.py", "conf/algo/model_mixing.yaml",
        "runner/sim/drivers/model_mixing.py"]


def test_the_new_algorithm_is_composed_validated_and_trains(source_tree, tmp_path):
    src, _ = source_tree
    cli = [sys.executable, "-m", "runner.commands.run"]
    help_text = run(src, [*cli, "--help"], tmp_path)
    groups = help_text.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert "model_mixing" in groups, help_text.stdout + help_text.stderr

    for typo, needle in [("algo.alpah=0.25", "alpah"), ("algo.alpha=0", "algo.alpha")]:
        proc = run(src, [*cli, "recipe=digit_images", "algo=model_mixing", typo], tmp_path)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("adpsgd-run:")]
        assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0], proc.stderr
    assert "must be in (0, 1]" in errors[0], errors

    run_dir = tmp_path / "mixing"
    proc = run(src, [*cli, "recipe=digit_images", "algo=model_mixing", "algo.alpha=0.25",
                     "launcher.nprocs=2", "trainer.epochs=2", "trainer.progress=false",
                     f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["algo"] == "model_mixing", summary
    assert summary["nprocs"] == 2
    # 10 classes: chance is 10%; two epochs of any sound averaging scheme are far above it
    # (93.9% when written), and mixing keeps the models close.
    assert summary["final"]["top1"] > 50, summary["final"]
    assert summary["final"]["consensus_distance"] < 1e-2, summary["final"]


def test_the_new_algorithm_passes_its_equivalence_case(source_tree, tmp_path):
    src, cases = source_tree
    assert cases == {"model-mixing-alpha-1": ["algo=model_mixing", "algo.alpha=1"]}, cases
    proc = run(src, [str(BIN / "mpiexec"), "-n", "2", sys.executable,
                     str(MPI_SCRIPTS / "equivalence.py"), str(tmp_path / "eq"),
                     json.dumps(cases)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = re.findall(r"case model-mixing-alpha-1: (.*)", proc.stdout)
    assert len(reports) == 2 and all("equals SSGD" in r for r in reports), proc.stdout


def test_the_new_algorithm_simulates_as_it_trains(source_tree, tmp_path):
    """The guide's simulator driver: launcher=sim ends with the model that 2 real ranks train
    (float64, the same seed), as tests/test_sim_equivalence.py checks for every algorithm."""
    src, _ = source_tree
    common = ["recipe=digit_images", "algo=model_mixing", "algo.alpha=0.25", "trainer.epochs=1",
              "trainer.dtype=float64", "trainer.batch_size=16", "launcher.nprocs=2"]
    proc = run(src, [str(BIN / "mpiexec"), "-n", "2", sys.executable,
                     str(MPI_SCRIPTS / "sim_equivalence.py"), str(tmp_path),
                     json.dumps({"real": common})], tmp_path)
    assert proc.returncode == 0 and proc.stdout.count("case real: trained") == 2, \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    sim_dir = tmp_path / "sim"
    proc = run(src, [sys.executable, "-m", "runner.commands.run", *common, "launcher=sim",
                     "trainer.progress=false", f"hydra.run.dir={sim_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    real, simulated = (torch.load(d / "checkpoints" / "final_rank0.pt",
                                  weights_only=False)["model"] for d in (tmp_path / "real",
                                                                         sim_dir))
    worst = max(float((real[k] - simulated[k]).abs().max()) for k in real)
    assert worst <= 1e-10, f"the simulated model differs by {worst:.3g}"
