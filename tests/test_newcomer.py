"""What a newcomer hit from a fresh clone, each held by a test: an empty run dir, a run dir
left by a run that never trained, a cluster file of one's own, a space in an override."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import pytest

from runner.commands.compose import compose_all
from runner.commands.run import check_command_line, split_argv
from runner.errors import ConfigError, UserError
from runner.launch.run_dir import check_fresh_start, start_fresh

from conftest import BIN, REPO


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


def own_cluster(root, name: str, typo: bool = False):
    """ROOT/cluster/NAME.yaml as docs/simulator.md makes it: h100x8's file, renamed."""
    text = (REPO / "conf" / "cluster" / "h100x8.yaml").read_text()
    text = text.replace("name: h100x8", f"name: {name}")
    if typo:
        text = text.replace("\nnodes: 1", "\nnodse: 1")
    (root / "cluster").mkdir(parents=True, exist_ok=True)
    (root / "cluster" / f"{name}.yaml").write_text(text)


@pytest.mark.parametrize("given", ["-cd {root}", "--config-dir={root}",
                                   "hydra.searchpath=[file://{root}]"])
def test_a_cluster_file_of_ones_own_composes_the_documented_ways(tmp_path, given):
    own_cluster(tmp_path, "mycluster")
    argv = [*shlex.split(given.format(root=tmp_path)), "recipe=digit_images", "launcher=sim",
            "cluster=mycluster", "launcher.nprocs=8"]
    overrides, multirun, config_name, _ = split_argv(argv)
    [cfg] = compose_all(overrides, multirun, config_name)
    assert cfg.cluster.name == "mycluster" and cfg.cluster.gpus_per_node == 8


def test_a_typo_in_a_cluster_file_names_the_file_and_the_key(tmp_path):
    own_cluster(tmp_path, "typo", typo=True)
    overrides, multirun, config_name, _ = split_argv(
        ["-cd", str(tmp_path), "recipe=digit_images", "launcher=sim", "cluster=typo"])
    with pytest.raises(UserError) as error:
        compose_all(overrides, multirun, config_name)
    path = tmp_path / "cluster" / "typo.yaml"
    assert str(error.value) == (f"unknown key 'nodse' in {path} (cluster.nodse). Fix: did you "
                                f"mean nodes? (in {path})")


@pytest.mark.parametrize("argv", [["trainer.epochs=", "3"], ["trainer.epochs", "=3"]])
def test_a_space_around_the_equals_sign_is_named(argv, capsys):
    with pytest.raises(SystemExit) as ended:
        check_command_line(["recipe=digit_images", *argv])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"adpsgd-run: error: trainer.epochs: a space around '=' made {' '.join(argv)} two "
        "words of the command line. Fix: write trainer.epochs=3, without spaces"]


@pytest.mark.slow
def test_the_documented_own_cluster_commands_run(tmp_path):
    """docs/simulator.md's commands, from a directory of one's own."""
    block = re.search(r"### Your own cluster.*?```bash\n(.*?)```",
                      (REPO / "docs" / "simulator.md").read_text(), re.S).group(1)
    commands = block.strip().splitlines()
    (tmp_path / "conf").symlink_to(REPO / "conf")  # as in a clone
    subprocess.run(["bash", "-c", " && ".join(commands[:2])], cwd=tmp_path, check=True)
    run = [str(BIN / "adpsgd-run"), *shlex.split(commands[2])[1:],
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["cluster"] == "mycluster"


@pytest.mark.slow
def test_the_simulators_console_and_report_read_well(tmp_path):
    """A simulation's console: progress lines with the held-out metrics and the results
    table, no log records (Python dicts, checkpoint paths), simulated seconds that show; a
    timing-only run: no empty table, a row in the report but no blank curves."""
    run = [str(BIN / "adpsgd-run"), "recipe=digit_images", "algo=adpsgd", "launcher=sim",
           "launcher.nprocs=8", "trainer.epochs=2"]
    proc = subprocess.run([*run, f"hydra.run.dir={tmp_path / 'sim'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = proc.stdout + proc.stderr
    assert "{" not in console and "checkpoint (scheduled)" not in console, console
    assert "eval top1" in proc.stderr  # the progress line at each evaluation
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s+\d\.\d\d ", line)]
    assert len(rows) == 2 and all(float(row[2]) > 0 for row in rows), proc.stdout
    assert "eval at epoch" in (tmp_path / "sim" / "logs" / "sim.log").read_text()  # kept there
    timing = subprocess.run([*run, "launcher.timing_only=true", "launcher.nprocs=64",
                             f"hydra.run.dir={tmp_path / 'timing'}"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert timing.returncode == 0 and "epoch       step" not in timing.stdout, timing.stdout
    out = tmp_path / "report"
    report = subprocess.run([str(BIN / "adpsgd-report"), str(tmp_path / "timing"), "--out",
                             str(out)], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "no curves: none of these runs evaluated" in report.stderr
    assert not (out / "curves_wall.png").exists() and (out / "throughput.png").exists()
    assert "| timing | adpsgd | digit_images | 64 |" in (out / "table.md").read_text()


@pytest.mark.slow
def test_resume_auto_says_what_it_continues(tmp_path):
    """resume=auto without a run dir continues nothing (Hydra makes a new dir): it says so;
    on a finished run it starts no rank and says the run is done (fewer epochs than the run
    trained crashed a rank before: the schedule's rate was 0 there)."""
    job = [str(BIN / "adpsgd-run"), "recipe=digit_images", "algo=ssgd", "launcher.nprocs=1",
           "trainer.progress=false"]
    fresh = subprocess.run([*job, "trainer.epochs=2", "resume=auto"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    said = re.match(r"adpsgd-run: resume=auto without hydra.run.dir: (\S+) is a new run dir",
                    fresh.stdout)
    assert said, fresh.stdout
    # That fresh run is the finished run the rest continues (one training job, not two).
    run_dir = tmp_path / said.group(1)  # (as printed: absolute, or under the cwd)
    assert run_dir.is_relative_to(tmp_path / "runs") and (run_dir / "summary.json").exists()
    log = (run_dir / "logs" / "rank0.log").read_text()
    for epochs in (2, 1):
        done = subprocess.run([*job, f"trainer.epochs={epochs}", "resume=auto",
                               f"hydra.run.dir={run_dir}"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith(f"adpsgd-run: {run_dir} has trained 2.00 epochs, "
                                      f"trainer.epochs={epochs}: nothing to train"), done.stdout
        assert "status completed" in done.stdout  # the run's own results table
        assert (run_dir / "logs" / "rank0.log").read_text() == log  # no rank started
    # The same for a checkpoint named by its path, into another run dir.
    last = sorted((run_dir / "checkpoints").glob("samples-*"))[-1]
    done = subprocess.run([*job, "trainer.epochs=2", f"resume={last}",
                           f"hydra.run.dir={tmp_path / 'other'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stdout.startswith(f"adpsgd-run: {last} has trained 2.00 epochs"), done.stdout


@pytest.mark.parametrize("argv,line", [
    (["-cd", "/no/such/dir", "cluster=mycluster"],
     "the config dir /no/such/dir (-cd or hydra.searchpath) is not a directory. Fix: give the "
     "directory that holds your group folders, e.g. -cd myconf for myconf/cluster/NAME.yaml"),
    (["-cd", "launcher=sim"],
     "-cd needs a directory, e.g. -cd myconf (Hydra would take 'launcher=sim' for one). Fix: "
     "give -cd DIR before the overrides")])
def test_a_config_dir_that_is_no_directory_is_one_line(argv, line, capsys):
    with pytest.raises(SystemExit) as ended:
        check_command_line(["recipe=digit_images", *argv])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"adpsgd-run: error: {line}"]


@pytest.mark.slow
def test_resume_auto_without_a_checkpoint_starts_over_cleanly(tmp_path):
    """A run that evaluated but left no complete checkpoint (a simulation stopped between an
    evaluation and its checkpoint; checkpoints deleted by hand): resume=auto starts fresh, and
    the earlier attempt's rows do not stay in metrics.jsonl beside the new ones."""
    run = [str(BIN / "adpsgd-run"), "recipe=digit_images", "algo=dpsgd", "launcher=sim",
           "launcher.nprocs=4", "trainer.epochs=1", f"hydra.run.dir={tmp_path / 'run'}"]
    subprocess.run(run, cwd=tmp_path, check=True, capture_output=True, timeout=300)
    for checkpoint in (tmp_path / "run" / "checkpoints").glob("samples-*"):
        (checkpoint / "COMPLETE").unlink()
    again = subprocess.run([*run, "resume=auto"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    rows = [json.loads(line) for line in
            (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows if row["split"] == "eval"] == [1.0], rows
