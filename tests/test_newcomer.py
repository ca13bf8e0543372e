"""What a newcomer hit from a fresh clone, each held by a test: an empty run dir, a run dir
left by a run that never trained."""

from __future__ import annotations

import json
import os

import pytest

from runner.commands.run import check_command_line
from runner.errors import ConfigError
from runner.launch.run_dir import check_fresh_start, start_fresh


@pytest.mark.parametrize("override", ["hydra.run.dir=", "hydra.run.dir= ", "-m"])
def test_an_empty_run_dir_is_refused_in_one_line(override, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["recipe=digit_images", override]
    if override == "-m":
        argv.append("hydra.sweep.dir=")
    key = "hydra.sweep.dir" if override == "-m" else "hydra.run.dir"
    with pytest.raises(SystemExit) as ended:
        check_command_line(argv)
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"adpsgd-run: error: {key} is empty, so the run would write into the current "
        f"directory ({tmp_path}). Fix: name a directory, e.g. {key}=runs/NAME, or leave {key} "
        "out for the default under runs/"]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("summary", [{"status": "stopped", "steps": 0},
                                     {"status": "failed", "exit_status": 1}])
def test_a_run_that_never_trained_does_not_block_a_fresh_start(tmp_path, summary):
    """Ctrl-C while the ranks started, or a rank that failed at start-up, left summary.json
    and a TensorBoard session but nothing learned: the same command starts again there, and
    finds only its own summary and session afterwards."""
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.vm").write_bytes(b"old session")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.log").write_text("the first try\n")
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    start_fresh(tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["logs", "rank0.log", "tb"]


@pytest.mark.parametrize("left,named", [
    ({"summary.json": {"status": "stopped", "steps": 12}}, "summary.json"),
    ({"summary.json": {"status": "completed"}}, "summary.json"),  # a timing-only simulation
    ({"summary.json": "not json"}, "summary.json"),
    ({"metrics.jsonl": {"split": "eval"}}, "metrics.jsonl")])
def test_a_run_that_trained_still_blocks_a_fresh_start(tmp_path, left, named):
    for name, content in left.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else
                                     json.dumps(content))
    with pytest.raises(ConfigError, match=f"holds another run's results \\({named}\\)"):
        check_fresh_start(tmp_path)
    assert (tmp_path / named).exists()
