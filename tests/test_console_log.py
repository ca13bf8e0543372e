"""Rank 0's progress where there is no terminal (a SLURM output file, ``make demo > log``,
CI): plain lines, never carriage returns; the bar stays on a terminal."""

from __future__ import annotations

import io
import os
import pty
import subprocess

import pytest
from omegaconf import OmegaConf

from runner.config.run_schema import TrainerConfig
from runner.errors import ConfigError
from runner.runlog.console import CONSOLE_IS_TERMINAL, ProgressBar, ends_on_terminal

from conftest import BIN

COMMAND = ["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.epochs=2",
           "trainer.progress_every_s=0.01"]  # a step is at least a few ms, even on a fast CI host


def test_without_a_terminal_progress_is_plain_lines(monkeypatch):
    monkeypatch.delenv(CONSOLE_IS_TERMINAL, raising=False)
    out = io.StringIO()
    progress = ProgressBar(out, total=1000, done=0, label="ssgd x2", every_s=3600)
    progress.update(250, loss="0.5")  # within the interval: nothing yet
    assert out.getvalue() == ""
    progress.update(500, force=True, **{"eval top1": "91.2"})
    progress.update(1000)
    progress.close()  # the progress not shown yet
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[0].startswith("ssgd x2: 500/1,000 samples (50.0%), ")
    assert "loss 0.5" in lines[0] and "eval top1 91.2" in lines[0] and "ETA " in lines[0]
    assert lines[1].startswith("ssgd x2: 1,000/1,000 samples (100.0%)")
    assert "ETA" not in lines[1]


def test_a_new_label_shows_from_the_next_line(monkeypatch):
    monkeypatch.delenv(CONSOLE_IS_TERMINAL, raising=False)
    out = io.StringIO()
    progress = ProgressBar(out, total=100, done=0, label="ssgd x4", every_s=3600)
    progress.update(10, force=True)
    progress.relabel("ssgd x3")  # an elastic run lost a learner
    progress.update(20, force=True)
    assert [line.split(":")[0] for line in out.getvalue().splitlines()] == ["ssgd x4",
                                                                             "ssgd x3"]


def test_the_count_shown_never_goes_back(monkeypatch):
    """An asynchronous rank's estimate (14,045) may be undercut by the exact count (14,024)."""
    monkeypatch.delenv(CONSOLE_IS_TERMINAL, raising=False)
    out = io.StringIO()
    progress = ProgressBar(out, total=20000, done=0, label="adpsgd x4", every_s=3600)
    for done in (14045, 14024, 14100):
        progress.update(done, force=True)
    shown = [int(line.split()[2].split("/")[0].replace(",", ""))
             for line in out.getvalue().splitlines()]
    assert shown == [14045, 14045, 14100]


def test_the_launcher_says_whether_the_console_is_a_terminal(monkeypatch):
    monkeypatch.setenv(CONSOLE_IS_TERMINAL, "1")
    assert ends_on_terminal(io.StringIO())  # a pipe to adpsgd-run, which has a terminal
    monkeypatch.setenv(CONSOLE_IS_TERMINAL, "0")
    assert not ends_on_terminal(io.StringIO())
    monkeypatch.delenv(CONSOLE_IS_TERMINAL)
    assert not ends_on_terminal(io.StringIO())
    assert not ends_on_terminal(object())


def test_trainer_progress_every_s_must_be_positive():
    with pytest.raises(ConfigError, match=r"trainer.progress_every_s: must be > 0, got 0"):
        TrainerConfig(progress_every_s=0).check("trainer", OmegaConf.create({}))


@pytest.mark.mpi
@pytest.mark.slow
def test_a_job_logged_to_a_file_has_short_lines_and_no_carriage_return(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.run([str(BIN / "adpsgd-run"), *COMMAND,
                               f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                              stdout=out, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "\r" not in text
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 300, max(lines, key=len)
    progress = [line for line in lines if line.startswith("ssgd x2: ")]
    assert len(progress) >= 3, text  # every 0.01 s, at both evaluations, and the last
    assert any("eval top1" in line for line in progress), progress
    assert progress[-1].startswith("ssgd x2: ") and "(100.0%)" in progress[-1], progress


@pytest.mark.mpi
@pytest.mark.slow
def test_on_a_terminal_the_bar_stays(tmp_path):
    main, tty = pty.openpty()
    proc = subprocess.Popen([str(BIN / "adpsgd-run"), *COMMAND,
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=tty)
    os.close(tty)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal's other end closed: the command ended
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=300) == 0, seen.decode(errors="replace")[-3000:]
    os.close(main)
    assert b"\r" in seen and b"sample/s" in seen  # tqdm's bar, redrawn in place
