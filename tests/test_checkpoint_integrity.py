"""Damaged checkpoints are detected: the COMPLETE marker records each rank file's SHA-256 and
size, loading checks them, and a resume falls back to (or points at) the newest intact
checkpoint. One real 2-rank run makes the checkpoints; a byte is flipped in the newest one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runner.checkpoint.files import DamagedCheckpoint, complete_checkpoints, load_rank_state

from conftest import read_run, run_cli

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOB = ["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.progress=false",
       "trainer.checkpoint_every=5", "trainer.keep_checkpoints=3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrity")
    run_cli([*JOB, "trainer.epochs=1", f"hydra.run.dir={root / 'run'}"], cwd=root)
    return root / "run"


def copy_with_a_flipped_byte(trained: Path, dest: Path) -> tuple[Path, list]:
    """A copy of the run whose newest checkpoint's rank1.pt has one byte flipped (same size:
    nothing but a checksum can tell)."""
    run_dir = Path(shutil.copytree(trained, dest))
    found = complete_checkpoints(run_dir)
    victim = found[-1].rank_file(1)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    return victim, found


def test_the_marker_records_every_rank_files_checksum(trained):
    for checkpoint in complete_checkpoints(trained):
        marker = json.loads((checkpoint.path / "COMPLETE").read_text())
        assert set(marker["files"]) == {"rank0.pt", "rank1.pt"}
        for name, entry in marker["files"].items():
            assert entry["bytes"] == (checkpoint.path / name).stat().st_size
            assert len(entry["sha256"]) == 64


def test_a_flipped_byte_is_named_when_the_file_is_loaded(trained, tmp_path):
    victim, found = copy_with_a_flipped_byte(trained, tmp_path / "run")
    load_rank_state(found[-1], 0)  # the other rank's file is fine
    with pytest.raises(DamagedCheckpoint) as damaged:
        load_rank_state(found[-1], 1)
    message = str(damaged.value)
    assert message.startswith(f"{victim} is damaged (its SHA-256 differs from the one recorded "
                              "when it was written")
    assert f"Fix: resume={found[-2].path}, the newest intact checkpoint before it" in message


def test_resume_auto_falls_back_to_the_newest_intact_checkpoint(trained, tmp_path):
    victim, found = copy_with_a_flipped_byte(trained, tmp_path / "run")
    run_dir = victim.parent.parent.parent
    proc = run_cli([*JOB, "trainer.epochs=2", "resume=auto", f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path)
    warnings = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert warnings == [f"adpsgd-run: warning: resume=auto: {victim} is damaged (its SHA-256 "
                        "differs from the one recorded when it was written); trying "
                        f"{found[-2].path}, the complete checkpoint before it"], proc.stderr
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == str(found[-2].path)
    assert "Traceback" not in proc.stderr and metrics[-1]["epoch"] >= 2


def test_an_explicit_damaged_checkpoint_is_one_line_pointing_at_an_intact_one(trained,
                                                                               tmp_path):
    victim, found = copy_with_a_flipped_byte(trained, tmp_path / "run")
    proc = run_cli([*JOB, "trainer.epochs=2", f"resume={found[-1].path}",
                    f"hydra.run.dir={tmp_path / 'new'}"], cwd=tmp_path, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("adpsgd-run: error")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert errors[0] == (f"adpsgd-run: error: {victim} is damaged (its SHA-256 differs from the "
                         "one recorded when it was written; it changed after the checkpoint was "
                         f"complete). Fix: resume={found[-2].path}, the newest intact "
                         "checkpoint before it")
    assert "Traceback" not in proc.stderr


def test_checkpoints_written_before_checksums_still_load(trained, tmp_path):
    run_dir = Path(shutil.copytree(trained, tmp_path / "run"))
    newest = complete_checkpoints(run_dir)[-1]
    marker = json.loads((newest.path / "COMPLETE").read_text())
    del marker["files"]
    (newest.path / "COMPLETE").write_text(json.dumps(marker))
    [old] = [c for c in complete_checkpoints(run_dir) if c.path == newest.path]
    assert old.files is None
    assert load_rank_state(old, 1)["trainer"]["step"] == newest.step
