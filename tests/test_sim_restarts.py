"""Node failures inside a simulation's event loop (cluster.failures, runner/sim/engine.py): the
modelled job goes back to its newest checkpoint as a restarted job does, so its lost work,
its downtime and its checkpoints' cost are the run's own; or, launcher.elastic in a timing-only
run (runner/sim/timing.py), the others go on without the failed node."""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, read_write
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from runner.errors import EXIT_TOO_FEW_LEARNERS, UserError
from runner.sim.engine import Simulation
from runner.sim.failures import FailureModel, NodeFailures, restart_wall_s
from runner.sim.timing import TimingSimulation

from conftest import BIN, MPI_SCRIPTS, REPO

sys.path.insert(0, str(MPI_SCRIPTS))
from harness import compose_config  # noqa: E402

# A timing-only job without jitter, 4 learners per node: by default SSGD on 8 (2 nodes), an
# epoch of 10 steps of 256 samples.
TIMING = ["recipe=swb2000", "launcher=sim", "launcher.timing_only=true",
          "launcher.procs_per_node=4", "cluster=v100_16x4_ethernet",
          "cluster.compute.jitter=0", "launcher.model_bytes=1e8",
          "launcher.samples_per_epoch=2560", "trainer.epochs=1", "trainer.progress=false"]


@functools.cache
def composed(overrides: tuple[str, ...]):
    """compose_config, once per distinct job in this module (composing costs far more than a
    timing-only run); callers get a copy of their own."""
    return compose_config(list(overrides))


def timing_config(*overrides: str, algo: str = "ssgd", n: int = 8):
    return copy.deepcopy(composed((*TIMING, f"algo={algo}", f"launcher.nprocs={n}",
                                   *overrides)))


def timing(tmp_path, *overrides: str, algo: str = "ssgd", n: int = 8) -> dict:
    return TimingSimulation(timing_config(*overrides, algo=algo, n=n), tmp_path).run()


def test_a_restart_costs_the_training_since_the_checkpoint_and_the_downtime(tmp_path):
    """A node dies in the middle of the second checkpoint's write: that checkpoint never
    completed, so the job goes back to the first; the run ends exactly the lost training and
    restart_s later than without the failure."""
    ckpt = ["trainer.checkpoint_every=4", "cluster.storage_gbps=80"]
    free = timing(tmp_path / "free", *ckpt)
    checkpoint_s = free["failures"]["checkpoint_s"]
    assert checkpoint_s == pytest.approx(8 * 2 * 1e8 * 8 / 80e9)  # models and momenta
    writes = free["failures"]["checkpoints_written_s"] / checkpoint_s
    assert writes == pytest.approx(3)  # after steps 4 and 8, and at the epoch's end
    step_s = (free["virtual_s"] - 3 * checkpoint_s) / 10
    at = 8 * step_s + 1.5 * checkpoint_s  # halfway through the second write
    failed = timing(tmp_path / "failed", *ckpt, f"cluster.failures.at_s=[{at!r}]",
                    "cluster.failures.restart_s=120", "launcher.max_restarts=1")
    [restart] = failed["restarts"]
    assert restart["resumed_from_samples"] == 4 * 256
    assert restart["lost_s"] == pytest.approx(4 * step_s + 0.5 * checkpoint_s)
    assert restart["seconds_down"] == 120 and restart["failed_at_virtual_s"] == at
    assert failed["virtual_s"] == pytest.approx(free["virtual_s"] + restart["lost_s"] + 120)
    assert failed["samples"] == free["samples"] and failed["steps"] == free["steps"]
    assert failed["failures"]["checkpoints_written_s"] == pytest.approx(4 * checkpoint_s)
    assert failed["failures"]["goodput_samples_per_s"] == pytest.approx(
        2560 / failed["virtual_s"])


@pytest.mark.parametrize("algo", ["ssgd", "adpsgd", "hadpsgd"])
def test_without_a_complete_checkpoint_the_job_starts_over(algo, tmp_path):
    """The job starts again from nothing, restart_s after the failure, and (without jitter)
    takes the uninterrupted run's time again, asynchronous learners' schedule included."""
    free = timing(tmp_path / "free", algo=algo)
    at = free["virtual_s"] / 2
    failed = timing(tmp_path / "failed", f"cluster.failures.at_s=[{at!r}]",
                    "cluster.failures.restart_s=10", "launcher.max_restarts=1", algo=algo)
    [restart] = failed["restarts"]
    assert restart["resumed_from_samples"] == 0 and restart["lost_s"] == pytest.approx(at)
    assert failed["virtual_s"] == pytest.approx(free["virtual_s"] + at + 10)
    assert failed["steps_per_rank"] == free["steps_per_rank"]


def test_more_failures_than_max_restarts_end_the_run_with_one_line(tmp_path):
    with pytest.raises(UserError) as caught:
        timing(tmp_path, "cluster.failures.at_s=[1.0,12.0]", "cluster.failures.restart_s=10",
               "launcher.max_restarts=1")  # the second while training again, from 11 s
    line = str(caught.value)
    assert "a node was killed (cluster.failures.at_s) at virtual 12 s" in line, line
    assert "launcher.max_restarts=1" in line and "\n" not in line


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ssgd", "dpsgd"])
def test_a_restarted_lockstep_run_learns_exactly_what_an_uninterrupted_one_does(algo,
                                                                                 tmp_path):
    """Learning on digits: the restart loads the checkpoint's every learner state, so the
    final model and every evaluation equal the uninterrupted run's; metrics.jsonl and
    TensorBoard hold each step once (what came after the checkpoint is dropped)."""
    job = ["recipe=digit_images", f"algo={algo}", "launcher=sim", "launcher.nprocs=4",
           "trainer.epochs=3", "trainer.progress=false", "trainer.eval_every=6"]
    free = Simulation(compose_config(job), tmp_path / "free").run()
    epoch_s = free["virtual_s"] / 3
    failed = Simulation(compose_config([
        *job, f"cluster.failures.at_s=[{2.5 * epoch_s!r}]", "cluster.failures.restart_s=5",
        "launcher.max_restarts=1"]), tmp_path / "failed").run()
    [restart] = failed["restarts"]
    assert restart["resumed_from_samples"] == 2 * 1438  # the epoch-end checkpoint
    assert failed["final"] == free["final"]
    # To the skew of the learners' clocks at the checkpoint (D-PSGD's do not wait for each
    # other there), which a restart, starting every learner at once, does not keep.
    assert failed["virtual_s"] == pytest.approx(free["virtual_s"] + restart["lost_s"] + 5,
                                                rel=1e-4)

    def final_model(run: str) -> dict:
        return torch.load(tmp_path / run / "checkpoints" / "final_rank0.pt")["model"]

    for name, value in final_model("free").items():
        assert torch.equal(value, final_model("failed")[name]), name
    rows = {run: [json.loads(line) for line in open(tmp_path / run / "metrics.jsonl")]
            for run in ("free", "failed")}
    drop = ("wall_s", "train_s")
    assert ([{k: v for k, v in r.items() if k not in drop} for r in rows["failed"]]
            == [{k: v for k, v in r.items() if k not in drop} for r in rows["free"]])
    events = EventAccumulator(str(tmp_path / "failed" / "tb"))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == sorted(set(steps)), steps


@pytest.mark.slow
def test_random_failures_cost_what_the_failure_model_expects(tmp_path):
    """Over many seeds, the event loop's mean wall time matches runner/sim/failures.py's
    Monte Carlo of the same job (checkpoint interval, write time, restart time, job MTBF)."""
    ckpt = ["trainer.checkpoint_every=2", "cluster.storage_gbps=80"]
    free = timing(tmp_path / "free", *ckpt)
    checkpoint_s = free["failures"]["checkpoint_s"]
    step_s = (free["virtual_s"] - 5 * checkpoint_s) / 10  # writes after every 2 steps
    mtbf_s, restart_s = free["virtual_s"] / 2, 0.5
    job = [*ckpt, f"cluster.failures.node_mtbf_hours={2 * mtbf_s / 3600!r}",  # 2 nodes
           f"cluster.failures.restart_s={restart_s}", "launcher.max_restarts=1000"]

    # The job composed once (read-only: no run can change it for the next), its seed set per
    # run: what composing it with seed= gives.
    cfg = timing_config(*job)
    OmegaConf.set_readonly(cfg, True)

    def seeded(seed: int):
        with read_write(cfg):
            cfg.seed = seed
        return cfg

    assert seeded(3) == compose_config([*TIMING, "algo=ssgd", "launcher.nprocs=8", *job,
                                        "seed=3"])
    walls = [TimingSimulation(seeded(seed), tmp_path / f"s{seed}").run()["virtual_s"]
             for seed in range(150)]
    model = FailureModel(2 * mtbf_s, 2, checkpoint_s, restart_s, 0.0)
    rng = np.random.default_rng(7)
    # The model writes no checkpoint after the last interval; the run does, at the epoch's end.
    expected = [restart_wall_s(10 * step_s, 2 * step_s, model, rng) + checkpoint_s
                for _ in range(20000)]
    assert np.mean(walls) == pytest.approx(np.mean(expected), rel=4 * np.std(expected) / (
        np.mean(expected) * math.sqrt(len(walls))))
    assert np.mean(walls) > 1.2 * free["virtual_s"]  # the failures did cost


def test_node_failures_are_drawn_afresh_after_each_restart():
    never = NodeFailures(None, 4, [], seed=0)
    assert never.next_at() == math.inf
    planned = NodeFailures(None, 4, [50.0, 10.0, 70.0], seed=0)
    assert planned.take(resumes_at=60.0) == (10.0, None)  # the job is down until 60 s:
    assert planned.next_at() == 70.0  # the node killed at 50 s had nothing on it
    job_mtbf = 100.0
    drawn = NodeFailures(4 * job_mtbf, 4, [], seed=1)
    gaps, t = [], 0.0
    for _ in range(4000):
        at, node = drawn.take(resumes_at=drawn.next_at())
        gaps.append(at - t)
        t = at
        assert 0 <= node < 4
    assert np.mean(gaps) == pytest.approx(job_mtbf, rel=0.05)


@pytest.mark.slow
def test_the_documented_command_restarts_its_job(tmp_path):
    """docs/simulator.md's failures command, run as written (plus a run dir)."""
    block = re.search(r"## Node failures and restarts.*?```bash\n(.*?)```",
                      (REPO / "docs" / "simulator.md").read_text(), re.S).group(1)
    [command] = block.strip().splitlines()
    proc = subprocess.run([str(BIN / "adpsgd-run"), *shlex.split(command)[1:],
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    restarts = summary["restarts"]
    assert summary["status"] == "completed" and restarts, summary
    assert summary["failures"]["restarts"] == len(restarts)
    assert f"{len(restarts)} restart(s)" in proc.stdout, proc.stdout
    assert all(r["cause"].startswith("node ") and r["seconds_down"] == 300 for r in restarts)


def test_an_elastic_job_goes_on_without_the_failed_node(tmp_path):
    """8 learners on 2 nodes; a node is killed during step 4: that step is dropped, and the 4
    others go on recovery_s later as a job of 4 (one node's collectives, 128-sample steps)
    from the 3 steps' samples, to the epoch's end."""
    step8 = timing(tmp_path / "8")["virtual_s"] / 10
    step4 = timing(tmp_path / "4", n=4)["virtual_s"] / 20
    elastic = timing(tmp_path / "elastic", "launcher.elastic=true",
                     f"cluster.failures.at_s=[{3.5 * step8!r}]", "cluster.failures.recovery_s=2")
    assert elastic["membership"] == [
        {"event": "lost", "learner": learner, "host": "node1", "at_samples": 3 * 256,
         "virtual_s": 3.5 * step8, "remain": 4} for learner in (4, 5, 6, 7)]
    assert elastic["learners_at_end"] == 4 and elastic["nprocs"] == 8
    assert elastic["samples"] == 2560 and elastic["restarts"] == []
    assert elastic["virtual_s"] == pytest.approx(4 * step8 + 2 + 14 * step4)
    assert elastic["failures"]["nodes_lost"] == 1


def test_an_elastic_job_left_with_too_few_learners_ends_with_one_line(tmp_path):
    with pytest.raises(UserError) as caught:
        timing(tmp_path, "launcher.elastic=true", "launcher.min_learners=5",
               "cluster.failures.at_s=[1.0]")
    line = str(caught.value)
    assert line.startswith("node 1 failed at virtual 1 s") and "\n" not in line, line
    assert "4 learner(s) would remain, fewer than launcher.min_learners=5" in line, line
    # exit status 4 as a real job's: lost machines, which launcher.max_restarts restarts
    assert caught.value.exit_status == EXIT_TOO_FEW_LEARNERS


def test_asynchronous_learners_go_on_without_a_failed_node(tmp_path):
    free = timing(tmp_path / "free", algo="adpsgd", n=16)
    elastic = timing(tmp_path / "elastic", "launcher.elastic=true", "cluster.failures.at_s=[2.0]",
                     algo="adpsgd", n=16)
    lost = elastic["membership"]
    assert [e["host"] for e in lost] == ["node3"] * 4  # an explicit kill: the last node's
    assert lost[0]["remain"] == 12 == elastic["learners_at_end"] == len(
        elastic["steps_per_rank"])
    assert 2560 <= elastic["samples"] < 2560 + 16 * 32
    assert elastic["virtual_s"] > free["virtual_s"]  # 12 learners do the rest, after 1 s
