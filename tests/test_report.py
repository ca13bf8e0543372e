"""adpsgd-report on two tiny real runs (digit images, 1 epoch: SSGD in process, AD-PSGD on
2 real ranks): valid PNGs of sensible size and a table that holds the runs' own numbers; a
run without summary.json; one-line errors for run dirs that are missing or empty; a sweep dir
of adpsgd-run -m, read as it lies."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from PIL import Image

from runner.commands.report import main as report_main

from conftest import BIN, run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    runs = {"ssgd": ["algo=ssgd", "launcher.nprocs=1"],
            "adpsgd": ["algo=adpsgd", "launcher.nprocs=2"]}
    printed = {}
    for name, overrides in runs.items():
        printed[name] = run_cli(["recipe=digit_images", *overrides, "trainer.epochs=1",
                                 f"hydra.run.dir={root / name}"], cwd=root).stdout
    return root, [root / name for name in runs], printed


@pytest.mark.mpi
def test_report_draws_pngs_and_a_table_of_the_runs_numbers(two_runs):
    root, run_dirs, _ = two_runs
    out = root / "report"
    proc = subprocess.run([str(BIN / "adpsgd-report"), *map(str, run_dirs), "--out", str(out),
                           "--rank0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("curves_wall", "curves_epoch", "throughput"):
        path = out / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert 10_000 < path.stat().st_size < 400_000  # drawn, yet small enough for docs/
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            width, height = image.size
        assert 600 <= width <= 2000 and 250 <= height <= 800, (name, image.size)
    table = (out / "table.md").read_text()
    assert table in proc.stdout  # printed too
    lines = table.splitlines()
    assert lines[0].startswith("| run | algo | recipe | nprocs | final metric | samples/s |")
    assert len(lines) == 2 + len(run_dirs)
    for run_dir, line in zip(run_dirs, lines[2:]):
        summary = json.loads((run_dir / "summary.json").read_text())
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:4] == [run_dir.name, summary["algo"], "digit_images",
                             str(summary["nprocs"])]
        assert cells[4] == f"top1 {summary['top1']:.2f}"
        assert cells[5] == f"{summary['samples_per_s']:.1f}"
        assert cells[6:9] == [f"{summary[k]:.2f}" for k in ("compute_s", "comm_s", "idle_s")]
        assert cells[10] == "completed"
    # AD-PSGD's replicas differ: its consensus distance is a number; SSGD's is 0.
    assert float(lines[3].split("|")[10]) >= 0 and lines[2].split("|")[10].strip() == "0"


@pytest.mark.slow
def test_a_sweep_dir_is_read_as_it_lies(tmp_path):
    """adpsgd-report SWEEP_DIR: the jobs' run dirs in job order, labelled and tabulated by the
    setting they sweep; multirun.yaml and other entries skipped with one line each."""
    sweep = tmp_path / "sweep"
    run_cli(["-m", "recipe=digit_images", "algo=ssgd", "launcher.nprocs=1", "trainer.epochs=1",
             "trainer.progress=false", "optim.lr=0.4,0.2", f"hydra.sweep.dir={sweep}"],
            cwd=tmp_path)
    (sweep / "notes.txt").write_text("mine\n")
    (sweep / "unfinished").mkdir()
    out = tmp_path / "report"
    proc = subprocess.run([str(BIN / "adpsgd-report"), str(sweep), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stderr.splitlines()) == [
        f"adpsgd-report: skipping {sweep / 'multirun.yaml'} (the sweep's Hydra config, not a "
        "run)",
        f"adpsgd-report: skipping {sweep / 'notes.txt'} (a file, not a run dir)",
        f"adpsgd-report: skipping {sweep / 'unfinished'} (not a run dir: no metrics.jsonl or "
        "summary.json)"]
    lines = (out / "table.md").read_text().splitlines()
    assert lines[0].startswith("| run | optim.lr | algo | recipe | nprocs | final metric |")
    assert len(lines) == 4
    for job, (lr, line) in enumerate(zip(("0.4", "0.2"), lines[2:])):
        summary = json.loads((sweep / f"{job}-optim.lr={lr}" / "summary.json").read_text())
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:5] == [f"optim.lr={lr}", lr, "ssgd", "digit_images", "1"]
        assert cells[5] == f"top1 {summary['top1']:.2f}"
    assert (out / "curves_wall.png").stat().st_size > 10_000
    # As a user types it: the shell's glob over the sweep dir names multirun.yaml, the notes,
    # a dry run's dir and a run stopped before its first evaluation beside the jobs.
    subprocess.run([str(BIN / "adpsgd-run"), "recipe=digit_images", "launcher=slurm",
                    "launcher.dry_run=true", f"hydra.run.dir={sweep / 'dry'}"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=120)
    (sweep / "stopped").mkdir()
    (sweep / "stopped" / "summary.json").write_text('{"status": "stopped"}')
    proc = subprocess.run([str(BIN / "adpsgd-report"), *map(str, sorted(sweep.iterdir())),
                           "--out", str(tmp_path / "globbed")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stderr.splitlines()) == [
        f"adpsgd-report: skipping {sweep / 'dry'} (not a run dir: no metrics.jsonl or "
        "summary.json)",
        f"adpsgd-report: skipping {sweep / 'multirun.yaml'} (the sweep's Hydra config, not a "
        "run)",
        f"adpsgd-report: skipping {sweep / 'notes.txt'} (a file, not a run dir)",
        f"adpsgd-report: skipping {sweep / 'stopped'} (no metrics.jsonl: the run (stopped) "
        "never evaluated)",
        f"adpsgd-report: skipping {sweep / 'unfinished'} (not a run dir: no metrics.jsonl or "
        "summary.json)"]
    assert (tmp_path / "globbed" / "table.md").read_text().splitlines()[2:] == lines[2:]


@pytest.mark.mpi
def test_the_run_ends_with_its_replicas_scores_and_consensus(two_runs):
    """What adpsgd-run printed at the end of the runs above (report reads what it says): for
    AD-PSGD the averaged model's and rank 0's own top-1 and the consensus distance as
    summary.json has them; for SSGD (one model) nothing beyond the usual line."""
    _, run_dirs, printed = two_runs
    ssgd_tail = printed["ssgd"].strip().splitlines()[-1]
    assert ssgd_tail.startswith("ssgd on digit_images, 1 ranks: ") and "consensus" not in ssgd_tail
    summary = json.loads((run_dirs[1] / "summary.json").read_text())
    averaged, own = summary["final"]["top1"], summary["final_rank0"]["top1"]
    distance = summary["consensus_distance"]
    # Two AD-PSGD ranks whose last exchange came after their last steps hold the same model
    # (a CI run ended so): then there is nothing to add, as for SSGD.
    parts = []
    if f"{averaged:.2f}" != f"{own:.2f}":
        parts.append(f"held-out top1 {averaged:.2f} (averaged model), {own:.2f} (rank 0's own)")
    if distance > 0:
        parts.append(f"consensus distance {distance:.3g}")
    lines = printed["adpsgd"].strip().splitlines()
    at = max(i for i, line in enumerate(lines)
             if line.startswith("adpsgd on digit_images, 2 ranks: "))
    # After it: the replicas' line, if any; a "slowest learner" line may follow (one of two
    # ranks sharing 2 cores can be slowed by the machine, which is what that line is for).
    after = [line for line in lines[at + 1:] if not line.startswith("slowest learner: ")]
    assert after == (["; ".join(parts)] if parts else []), lines[at:]
    assert parts or distance == 0


def test_missing_and_empty_run_dirs_are_one_line_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_jobs = tmp_path / "sweep"
    no_jobs.mkdir()
    (no_jobs / "multirun.yaml").write_text("hydra: {}\n")
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    for args, expected in (([str(tmp_path / "nope")], "does not exist"),
                           ([str(empty)], f"nothing to report: {empty}: not a run dir: no "
                            "metrics.jsonl or summary.json"),
                           ([str(tmp_path / "multirun.yaml"), str(empty)],
                            f"nothing to report: {tmp_path / 'multirun.yaml'}: the sweep's "
                            f"Hydra config, not a run; {empty}: not a run dir"),
                           ([str(no_jobs)], f"sweep dir {no_jobs} holds no run dir"),
                           ([], "required")):
        assert report_main([*args, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("adpsgd-report: error: ") and expected in err
        assert err.count("\n") == 1 and "Fix: " in err
    assert not (tmp_path / "out").exists()


@pytest.mark.mpi
def test_a_run_without_summary_is_drawn_as_incomplete(two_runs, tmp_path):
    """A run that died after an evaluation: its metrics.jsonl, no summary.json."""
    _, run_dirs, _ = two_runs
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    shutil.copy(run_dirs[0] / "metrics.jsonl", crashed)
    last = json.loads((crashed / "metrics.jsonl").read_text().splitlines()[-1])
    assert report_main([str(crashed), "--out", str(tmp_path / "out")]) == 0
    row = (tmp_path / "out" / "table.md").read_text().splitlines()[2]
    assert f"| top1 {last['top1']:.2f} |" in row and "incomplete (no summary.json)" in row
    assert (tmp_path / "out" / "curves_epoch.png").stat().st_size > 10_000


def test_many_runs_make_a_taller_learners_picture_and_the_time_split_is_whole(tmp_path,
                                                                               monkeypatch):
    """Six runs: learners.png was one row 2,808 px wide; now rows of three. throughput.png's
    stacked seconds include loading data, evaluating and checkpointing."""
    from matplotlib.figure import Figure

    from runner.commands.report import LEARNER_COLUMNS, Run, plot_learners, plot_throughput

    split = {"compute_s": 4.0, "data_s": 1.0, "comm_s": 2.0, "idle_s": 0.5, "eval_s": 1.5,
             "checkpoint_s": 0.25}
    learners = [{"rank": r, "host": "vm", "compute_s": 0.01, "wait_s": 0.002} for r in range(4)]
    runs = [Run(tmp_path / f"r{i}", f"run {i}", {"samples_per_s": 100.0, "learners": learners,
                                                  **split}) for i in range(6)]
    plot_learners(runs, tmp_path / "learners.png")
    width, height = Image.open(tmp_path / "learners.png").size
    # Two rows of three panels of 5.2 x 3.8 inches at 90 dpi.
    assert LEARNER_COLUMNS == 3
    assert width <= 3 * 5.2 * 90 + 1 and height >= 2 * 3.8 * 90 - 1, (width, height)
    drawn = []
    real_savefig = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        drawn.append(fig)
        return real_savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_throughput(runs[:1], tmp_path / "throughput.png")
    time_ax = drawn[0].axes[1]
    assert [h.get_label() for h in time_ax.get_legend_handles_labels()[0]] == \
        ["compute", "data", "comm", "idle", "eval", "checkpoint"]
    assert sum(bar.get_height() for bar in time_ax.patches) == pytest.approx(sum(split.values()))
