"""What a newcomer hit from a fresh clone, each held by a test: an empty run dir."""

from __future__ import annotations

import os

import pytest

from runner.commands.run import check_command_line


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
