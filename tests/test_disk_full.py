"""A full disk ends the job with one line, it does not hang it: the run dir on a real, small
tmpfs that fills up while the ranks write checkpoints. (Mounting needs root, which CI and this
machine have; elsewhere the test says why it skips.)"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from runner.checkpoint.files import complete_checkpoints, load_rank_state

from conftest import read_run, run_cli

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


@pytest.fixture
def small_disk(tmp_path):
    """A 9 MB tmpfs at tmp_path/disk, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    name = f"adpsgd-test-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=9m", name, str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): the full-disk "
                    "test needs root")
    yield mount, name
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_ends_the_job_with_one_line_and_keeps_the_last_checkpoint(tmp_path,
                                                                            small_disk):
    mount, device = small_disk
    run_dir = mount / "run"
    # Checkpoints of ~1.8 MB per rank: the third one does not fit.
    started = time.monotonic()
    proc = run_cli(["recipe=digit_images", "algo=ssgd",
                    "launcher.nprocs=2", "trainer.epochs=20", "trainer.checkpoint_every=4",
                    "trainer.keep_checkpoints=100", "trainer.progress=false",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False, timeout=120)
    ended_s = time.monotonic() - started
    stderr = proc.stderr
    print(f"full disk: adpsgd-run ended {ended_s:.1f} s after it started")
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr and "inline_container" not in stderr
    assert "killed from outside" not in stderr and "died without reporting" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("adpsgd-run: error:")]
    assert len(errors) == 1, stderr
    assert errors[0].startswith(f"adpsgd-run: error: no space left on {device} ({mount}) while "
                                f"writing {run_dir}/"), errors[0]
    assert "Fix: free space on" in errors[0]
    assert not list(run_dir.rglob("*.tmp")), "a partial file was left"
    newest = complete_checkpoints(run_dir)[-1]
    assert f"the last complete checkpoint ({newest.path}) is intact" in errors[0]
    for rank in range(2):  # it loads, checksums and all
        assert load_rank_state(newest, rank)["trainer"]["step"] == newest.step
    # Room again (another disk): the run continues from that checkpoint.
    moved = tmp_path / "moved"
    subprocess.run(["cp", "-a", str(run_dir), str(moved)], check=True)
    run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2",
             f"trainer.epochs={int(newest.epoch) + 1}", "trainer.checkpoint_every=4",
             "trainer.keep_checkpoints=100", "trainer.progress=false", "resume=auto",
             f"hydra.run.dir={moved}"], cwd=tmp_path, timeout=300)
    _, summary = read_run(moved)
    assert summary["status"] == "completed"
    assert Path(summary["resumed_from"]).name == newest.path.name
