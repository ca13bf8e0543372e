"""launcher=sim from the command line: README's 64-learner AD-PSGD and H-ADPSGD runs leave the
run dir real ranks leave (metrics.jsonl, summary.json with every learner's steps and time split,
TensorBoard events, the final model), in modelled seconds; mistakes end with one line."""

import subprocess

import pytest

from conftest import BIN, is_readme_simulation, read_run, readme_commands, run_cli

SIMULATIONS = [c for c in readme_commands() if is_readme_simulation(c)]


def test_the_readme_shows_both_simulations():
    algos = [next(w for w in c.split() if w.startswith("algo=")) for c in SIMULATIONS]
    assert algos == ["algo=adpsgd", "algo=hadpsgd"], SIMULATIONS


@pytest.mark.slow
@pytest.mark.parametrize("command", SIMULATIONS, ids=["adpsgd", "hadpsgd"])
def test_sixty_four_learners_train_in_one_process(command, tmp_path):
    """README's commands as written (test_readme.py leaves them to this test), in a known
    run dir: AD-PSGD on the default cluster; H-ADPSGD in 16 super learners of 4 on the P9
    cluster with learner 5 four times slower."""
    run_dir = tmp_path / "run"
    args = command.split()[1:]
    proc = run_cli([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=120)
    assert "64 rank(s)" in proc.stdout
    metrics, summary = read_run(run_dir)
    # The run ends with what sets its learners apart: rank 0's own model scores below the
    # averaged one, and their consensus distance (runner/runlog/summary.py replicas_line);
    # with a straggler, the line that names it (runner/runlog/learner_times.py).
    tail = proc.stdout.strip().splitlines()
    if "straggler" in command:
        assert tail.pop().startswith("slowest learner: rank 5, "), tail
    assert tail[-1] == (
        f"held-out top1 {summary['final']['top1']:.2f} (averaged model), "
        f"{summary['final_rank0']['top1']:.2f} (rank 0's own); "
        f"consensus distance {summary['consensus_distance']:.3g}")
    algo, cluster = summary["algo"], summary["cluster"]
    assert summary["status"] == "completed" and summary["launcher"] == "sim"
    assert summary["nprocs"] == 64 and len(summary["steps_per_rank"]) == 64
    assert summary["top1"] > 50, summary["final"]  # it learns (chance is 10)
    # Modelled seconds: the split adds up to each learner's clock, the run's wall time.
    for times in summary["per_rank"]:
        spent = times["compute"] + times["comm"] + times["idle"]
        assert spent == pytest.approx(summary["wall_s"], rel=0.05)
    assert summary["compute_s"] > 0 and summary["host_s"] > 0
    assert summary["wall_s"] == summary["virtual_s"]
    assert summary["learner_steps_per_host_s"] > 0
    stats = summary["algo_stats"]
    assert len(stats["staleness_mean"]) == 64 and max(stats["exchanges"]) > 0
    steps = summary["steps_per_rank"]
    if algo == "adpsgd":
        assert cluster == "v100_16x4_ethernet"
        assert min(steps) >= 15  # ~19 steps of 256 samples in 3 epochs
    else:  # 16 super learners of 4 ranks: one model per node
        assert algo == "hadpsgd" and cluster == "p9_v100_infiniband"
        assert summary["node_replicas_identical"] and not summary["replicas_identical"]
        assert summary["comm_s"] > 0  # the node collectives of every step
        # learner 5 slows its node (ranks 4-7) alone: the other nodes go on
        assert steps[4:8] == [steps[5]] * 4 and steps[5] < 0.5 * min(steps[8:])
    evals = [m for m in metrics if m["split"] == "eval"]
    assert [round(m["epoch"]) for m in evals] == [1, 2, 3]
    assert all(m["wall_s"] <= summary["wall_s"] + 1e-9 for m in evals)
    assert (run_dir / "checkpoints" / "final_rank0.pt").exists()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    # adpsgd-report reads it as it reads a real run's dir.
    report = subprocess.run([str(BIN / "adpsgd-report"), str(run_dir), "--out",
                             str(tmp_path / "report")], capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr
    assert algo in (tmp_path / "report" / "table.md").read_text()


@pytest.mark.parametrize("override, named", [
    (["cluster=v100_16x4_etherne"], "cluster"),
    (["launcher.replay=/nonexistent/trace"], "launcher.replay"),
    (["launcher.nprocs=65", "algo=ssgd"], "launcher.nprocs"),
])
@pytest.mark.slow
def test_mistakes_end_with_one_line(override, named, tmp_path):
    proc = run_cli(["recipe=digit_images", "launcher=sim", "launcher.nprocs=8", *override,
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0], proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_damaged_trace_is_refused_with_one_line(tmp_path):
    from runner.algos.trace import write_trace

    trace = tmp_path / "trace"
    for index in range(2):
        write_trace(trace, index, [["read"], ["apply", 0.1], ["snap", 0, 1, 0],
                                   ["merge", 0, 1, 0]])
    path = trace / "participant1.jsonl"
    data = bytearray(path.read_bytes())
    data[data.index(b"0.1") + 2] ^= 0x01  # 0.1 -> 0.0: still valid JSON, a different run
    path.write_bytes(bytes(data))
    proc = run_cli(["recipe=digit_images", "launcher=sim", "launcher.nprocs=2", "algo=adpsgd",
                    "trainer.epochs=1", f"launcher.replay={trace}",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, check=False,
                   timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "participant1.jsonl is damaged" in lines[0], proc.stderr


@pytest.mark.slow
def test_a_resumed_simulation_ends_where_the_uninterrupted_one_does(tmp_path):
    import sys

    import torch

    from conftest import MPI_SCRIPTS

    sys.path.insert(0, str(MPI_SCRIPTS))
    from runner.checkpoint.files import complete_checkpoints
    from runner.sim.engine import Simulation

    from harness import compose_config

    base = ["launcher=sim", "launcher.nprocs=8", "trainer.epochs=3", "trainer.batch_size=8",
            "trainer.dtype=float64", "cluster=p100_128", "trainer.keep_checkpoints=3",
            "algo=adpsgd"]
    run_dir = tmp_path / "run"
    whole = Simulation(compose_config(base), run_dir).run()
    final = torch.load(run_dir / "checkpoints" / "final_rank0.pt", weights_only=False)
    first = complete_checkpoints(run_dir)[0]  # after epoch 1: continue from there
    resumed = Simulation(compose_config([*base, f"resume={first.path}"]), run_dir).run()
    again = torch.load(run_dir / "checkpoints" / "final_rank0.pt", weights_only=False)
    assert all(torch.equal(final["model"][k], again["model"][k]) for k in final["model"])
    assert resumed["wall_s"] == whole["wall_s"]
    assert resumed["steps_per_rank"] == whole["steps_per_rank"]
    assert resumed["resumed_from"] == str(first.path)
    metrics, _ = read_run(run_dir)
    splits = 1 if whole["replicas_identical"] else 2  # eval, and eval_rank0 when they differ
    assert [round(m["epoch"]) for m in metrics] == [e for e in (1, 2, 3) for _ in range(splits)]
    # A simulated run's checkpoint is not for real ranks (and the reverse): one line.
    proc = run_cli(["recipe=digit_images", "algo=adpsgd", "launcher.nprocs=8", "trainer.epochs=3",
                    "trainer.batch_size=8", "trainer.dtype=float64", "resume=auto",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "launcher=sim" in lines[0], proc.stderr

