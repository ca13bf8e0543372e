"""launcher=slurm against a real SLURM: the single-node cluster of scripts/slurm_local.sh.

CI starts it (`make slurm-up`); otherwise the session fixture starts it itself, and these tests
skip only when its daemons cannot start, with the script's reason. Jobs are small (digit
images, 2 ranks on the node's 2 CPUs) and polled at short intervals.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import BIN, MPI_SCRIPTS, REPO, parent_pid, read_run, run_cli

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.resource("slurm")]

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
# The job of the end-to-end test and the preemption test: the same, so that the preempted one
# can be compared with an uninterrupted run. faults.delay_s stretches an epoch to seconds, so a
# signal sent after the first evaluation lands in the middle of the run (ranks act on it within
# two preemption checks, runner/checkpoint/preemption.py).
JOB = ["recipe=digit_images", "algo=adpsgd", "trainer.epochs=4", "trainer.progress=false",
       "faults.delay_s=0.1", "launcher=slurm", "launcher.nodes=1", "launcher.procs_per_node=2",
       "launcher.time=00:10:00", "launcher.signal_lead_s=60"]


def slurm_up(*options: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``scripts/slurm_local.sh up OPTIONS`` (idempotent: quick when the cluster is up) and
    the environment for SLURM's commands, SLURM_CONF of that cluster; the test skips, with the
    script's reason, when its daemons cannot start. ``env``: the scripts' variables (which
    lab, which directory), kept in the environment returned."""
    command = " ".join(["scripts/slurm_local.sh up", *options])
    env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "slurm_local.sh"), "up",
                               *options], capture_output=True, text=True, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{command} did not finish in 15 minutes")
    conf = re.search(r"export SLURM_CONF=(\S+)", proc.stdout)
    if proc.returncode != 0 or not conf:
        reason = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        print(f"SLURM tests skip: {command} failed: {reason}", file=sys.stderr)
        pytest.skip(f"{command} failed: {reason}")
    return {**env, "SLURM_CONF": conf.group(1), "PATH": f"{BIN}:{os.environ['PATH']}"}


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """The environment for SLURM's commands: SLURM_CONF of the local single-node cluster,
    brought down after the tests when they brought it up (CI's `make slurm-up` keeps its)."""
    script = str(REPO / "scripts" / "slurm_local.sh")
    was_up = subprocess.run(["bash", script, "status"], capture_output=True,
                            timeout=120).returncode == 0
    yield slurm_up()
    if not was_up:
        subprocess.run(["bash", script, "down"], capture_output=True, timeout=300)
        where = os.environ.get("SLURM_LOCAL_DIR", "/tmp/adpsgd-slurm")  # the script's
        left = subprocess.run(["pgrep", "-f", f"(slurmctld|slurmd|munged) .*{where}/"],
                              capture_output=True, text=True).stdout.split()
        assert not left, f"SLURM's daemons outlived the tests that started them: {left}"


def slurm(args: list[str], env: dict[str, str], timeout: float = 60
          ) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def job_fields(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show job`` as a dict (JobState, Restarts, ExitCode...)."""
    out = slurm(["scontrol", "-o", "show", "job", job_id], env).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_for_job(job_id: str, env: dict[str, str], timeout: float = 240) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = job_fields(job_id, env)
        if fields.get("JobState") in FINAL_STATES:
            return fields
        time.sleep(0.5)
    slurm(["scancel", job_id], env)
    pytest.fail(f"SLURM job {job_id} did not end in {timeout} s: {fields}")


def submit(args: list[str], cwd: Path, env: dict[str, str]) -> list[tuple[str, Path]]:
    """Run adpsgd-run (it returns once sbatch queued the jobs); [(job id, run dir)]."""
    proc = run_cli(args, cwd=cwd, env=env)
    jobs = re.findall(r"submitted SLURM job (\d+) .*?; it runs in (\S+)", proc.stdout)
    assert jobs, proc.stdout
    assert "samples/s" not in proc.stdout  # no results table for a job that has not run yet
    assert f"squeue -j {jobs[0][0]}" in proc.stdout and "tensorboard --logdir" in proc.stdout
    return [(job_id, Path(run_dir)) for job_id, run_dir in jobs]


def slurm_log(run_dir: Path, job_id: str) -> str:
    return (run_dir / "logs" / f"slurm-{job_id}.out").read_text()


def eval_epochs(metrics: list[dict]) -> list[int]:
    return [round(m["epoch"]) for m in metrics if m["split"] == "eval"]


def rank_lines(stdout: str) -> list[dict]:
    """Each rank's JSON line (srun may glue two ranks' lines together: decode from each
    ``rank N: `` prefix)."""
    decoder, found = json.JSONDecoder(), []
    for prefix in re.finditer(r"rank \d+: (?=\{)", stdout):
        found.append(decoder.raw_decode(stdout, prefix.end())[0])
    return sorted(found, key=lambda line: line["mpi_rank"])


def test_rank_mapping_agrees_between_slurm_and_mpi(slurm_env):
    script = [sys.executable, str(MPI_SCRIPTS / "slurm_world.py"), "2"]
    env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    # srun starts the ranks: SLURM's task ids are the ranks.
    proc = slurm(["srun", "-n", "2", "--mpi=pmi2", *script], env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = rank_lines(proc.stdout)
    assert [line["mpi_rank"] for line in lines] == [0, 1], proc.stdout
    for line in lines:
        slurm_ids = line["slurm"]
        for world in (line["world"], line["world_real_nodes"]):
            assert world["rank"] == line["mpi_rank"] == int(slurm_ids["SLURM_PROCID"])
            assert world["local_rank"] == int(slurm_ids["SLURM_LOCALID"])
            assert world["node"] == int(slurm_ids["SLURM_NODEID"]) == 0
            assert (world["size"], world["local_size"], world["num_nodes"]) == (2, 2, 1)
    # mpiexec inside an allocation: SLURM's variables describe mpiexec's proxy (task 0 of a
    # 1-task step on each node), so the ranks come from MPI alone and must still be right.
    proc = slurm(["salloc", "-n", "2", str(BIN / "mpiexec"), "-n", "2", *script], env,
                 timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = rank_lines(proc.stdout)
    assert [line["slurm"]["SLURM_PROCID"] for line in lines] == ["0", "0"], proc.stdout
    for line in lines:
        for world in (line["world"], line["world_real_nodes"]):
            assert (world["rank"], world["local_rank"], world["node"]) == (
                line["mpi_rank"], line["mpi_rank"], 0)


@pytest.fixture(scope="module")
def uninterrupted(slurm_env, tmp_path_factory) -> tuple[str, Path, dict[str, str]]:
    """The 2-task job run to the end: (job id, run dir, its final scontrol fields)."""
    cwd = tmp_path_factory.mktemp("slurm-e2e")
    [(job_id, run_dir)] = submit([*JOB, f"hydra.run.dir={cwd}/run"], cwd, slurm_env)
    return job_id, run_dir, wait_for_job(job_id, slurm_env)


def test_two_task_job_runs_to_the_end(uninterrupted):
    job_id, run_dir, fields = uninterrupted
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, log)
    assert "ranks exited with status 0" in log and "requeue" not in log, log
    metrics, summary = read_run(run_dir)
    assert eval_epochs(metrics) == [1, 2, 3, 4]
    assert {m["split"] for m in metrics} == {"eval", "eval_rank0"}
    assert summary["status"] == "completed" and summary["nprocs"] == 2, summary
    assert summary["algo"] == "adpsgd" and summary["epochs"] == 4
    assert summary["top1"] > 80, summary  # the digits are learnt, not just run through
    for rank in (0, 1):
        rank_log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank} of 2, node 0 (local rank {rank} of 2)" in rank_log, rank_log
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "eval/loss", "eval/top1", "eval_rank0/top1",
            "consensus/distance", "time/compute_s/rank1"} <= tags, tags
    assert [e.step for e in events.Scalars("eval/top1")] == [
        m["step"] for m in metrics if m["split"] == "eval"]


def test_preempted_job_checkpoints_requeues_and_resumes(slurm_env, uninterrupted, tmp_path):
    """SLURM's warning signal (what --signal=B:USR1@lead sends, here on demand) in the middle
    of the run: the ranks checkpoint and exit 75, the job requeues itself, and the requeued job
    resumes in the same run dir and ends with the epochs of an uninterrupted run."""
    [(job_id, run_dir)] = submit([*JOB, f"hydra.run.dir={tmp_path}/run"], tmp_path, slurm_env)
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.jsonl").exists():  # the first epoch's evaluation
        assert time.monotonic() < deadline, job_fields(job_id, slurm_env)
        assert job_fields(job_id, slurm_env).get("JobState") not in FINAL_STATES
        time.sleep(0.2)
    signalled = slurm(["scancel", "--batch", "--signal=USR1", job_id], slurm_env)
    assert signalled.returncode == 0, signalled.stderr
    fields = wait_for_job(job_id, slurm_env, timeout=300)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, log)
    assert "ranks exited with status 75" in log and "requeueing (requeue 1 of 3)" in log, log
    assert "resume=auto: continuing from the newest complete checkpoint" in log, log
    assert "ranks exited with status 0" in log, log
    assert "resume: auto" in (run_dir / ".hydra" / "run.yaml").read_text()
    metrics, summary = read_run(run_dir)
    _, baseline_dir, _ = uninterrupted
    baseline_metrics, baseline = read_run(baseline_dir)
    # The same epochs, each evaluated once: the resumed job continued the first one's log.
    assert eval_epochs(metrics) == eval_epochs(baseline_metrics) == [1, 2, 3, 4], metrics
    assert summary["status"] == "completed" and summary["epochs"] == baseline["epochs"]
    assert abs(summary["samples"] - baseline["samples"]) <= 0.05 * baseline["samples"]
    assert summary["top1"] > 80, summary


def test_a_job_larger_than_the_cluster_is_not_submitted(slurm_env, tmp_path):
    """4 nodes on a 1-node cluster would pend forever (PartitionConfig): one line instead."""
    before = slurm(["squeue", "-h", "-o", "%i"], slurm_env).stdout.split()
    proc = run_cli([*JOB, "launcher.nodes=4", f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path,
                   env=slurm_env, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "adpsgd-run: error: SLURM cannot run this job: 4 node(s) x 2 task(s) of 1 CPU(s) is "
        "more than any set of its nodes offers"), proc.stderr
    assert slurm(["squeue", "-h", "-o", "%i"], slurm_env).stdout.split() == before


def test_a_users_scontrol_requeue_needs_no_second_requeue(slurm_env, tmp_path):
    """``scontrol requeue JOBID`` by hand: SLURM signals the job and requeues it itself; the
    ranks checkpoint and exit 75, and the script, seeing the requeue counted, says so instead
    of requeueing again (which fails) and advising a second sbatch on the same run dir."""
    [(job_id, run_dir)] = submit([*JOB, f"hydra.run.dir={tmp_path}/run"], tmp_path, slurm_env)
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.jsonl").exists():
        assert time.monotonic() < deadline, job_fields(job_id, slurm_env)
        time.sleep(0.2)
    requeued = slurm(["scontrol", "requeue", job_id], slurm_env)
    assert requeued.returncode == 0, requeued.stderr
    fields = wait_for_job(job_id, slurm_env, timeout=300)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, log)
    assert "requeue failed" not in log and "continue with" not in log, log
    if "ranks exited with status 75" in log:  # they checkpointed before SLURM's KillWait
        assert "SLURM has requeued the job already" in log, log
    assert read_run(run_dir)[1]["status"] == "completed"


def test_a_killed_rank_restarts_inside_the_allocation_and_the_run_completes(slurm_env,
                                                                            tmp_path):
    """kill -9 of rank 1 once a checkpoint is complete, launcher.max_restarts=2: srun takes
    the step down (--kill-on-bad-exit), the job script starts the ranks again in the same
    allocation from the checkpoint, and the run ends with every evaluation once."""
    from runner.checkpoint.files import complete_checkpoints

    [(job_id, run_dir)] = submit([*JOB, "trainer.checkpoint_every=8", "launcher.max_restarts=2",
                                  f"hydra.run.dir={tmp_path}/run"], tmp_path, slurm_env)
    deadline = time.monotonic() + 180
    while not complete_checkpoints(run_dir):
        assert time.monotonic() < deadline, job_fields(job_id, slurm_env)
        assert job_fields(job_id, slurm_env).get("JobState") not in FINAL_STATES
        time.sleep(0.2)
    os.kill(int((run_dir / "logs" / "rank1.pid").read_text().split()[0]), 9)
    fields = wait_for_job(job_id, slurm_env, timeout=300)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "0", (fields, log)
    assert "ranks exited with status 137" in log and "ranks exited with status 0" in log, log
    restarts = [line for line in log.splitlines() if "restart 1 of 2: " in line]
    assert len(restarts) == 1 and "continuing from" in restarts[0], log
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed" and len(summary["restarts"]) == 1, summary
    assert summary["restarts"][0]["seconds_down"] > 0, summary["restarts"]
    assert eval_epochs(metrics) == [1, 2, 3, 4], metrics


@pytest.mark.parametrize("ranks_too", [False, True], ids=["stepd", "stepd-and-ranks"])
def test_a_killed_slurmstepd_is_noticed_and_the_run_completes(slurm_env, tmp_path, ranks_too):
    """kill -9 of the slurmstepd that runs the ranks' step, once a checkpoint is complete:
    srun is left waiting for a step that can no longer report (for minutes, as SLURM sees it).
    Alone, the ranks train on and finish: the job script's step watcher ends the step
    STEP_LINGER_S after their exit records and takes their status (0). With its ranks killed
    too (a lost node), their heartbeats stop: the watcher ends the step after
    launcher.stall_timeout_s, and the ranks start again in the allocation from the
    checkpoint."""
    from runner.checkpoint.files import complete_checkpoints

    [(job_id, run_dir)] = submit([*JOB, "trainer.checkpoint_every=8", "launcher.max_restarts=2",
                                  "launcher.stall_timeout_s=20", f"hydra.run.dir={tmp_path}/run"],
                                 tmp_path, slurm_env)
    deadline = time.monotonic() + 180
    while not complete_checkpoints(run_dir):
        assert time.monotonic() < deadline, job_fields(job_id, slurm_env)
        assert job_fields(job_id, slurm_env).get("JobState") not in FINAL_STATES
        time.sleep(0.2)
    ranks = [int((run_dir / "logs" / f"rank{r}.pid").read_text().split()[0]) for r in (0, 1)]
    stepd = parent_pid(ranks[1])
    assert Path(f"/proc/{stepd}/comm").read_text().startswith("slurmstepd"), stepd
    for pid in [stepd, *(ranks if ranks_too else [])]:
        os.kill(pid, 9)
    fields = wait_for_job(job_id, slurm_env, timeout=400)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED", (fields, log)
    ended = [line for line in log.splitlines() if line.endswith(": ending the step")]
    assert len(ended) == 1 and ("no heartbeat" if ranks_too else "every rank ended") in ended[0]
    assert "ranks exited with status 0" in log, log
    metrics, summary = read_run(run_dir)
    assert summary["status"] == "completed", summary
    assert len(summary.get("restarts", [])) == (1 if ranks_too else 0), summary
    assert eval_epochs(metrics) == [1, 2, 3, 4], metrics


def test_sweep_submits_one_job_per_combination(slurm_env, tmp_path):
    """Each combination gets its own run dir, job.sbatch and job; the jobs are cancelled once
    SLURM has them (the end-to-end test shows that such a job runs)."""
    jobs = submit(["-m", "recipe=digit_images", "algo=ssgd", "trainer.epochs=1",
                   "trainer.progress=false", "launcher=slurm", "launcher.procs_per_node=1",
                   "optim.lr=0.2,0.4", f"hydra.sweep.dir={tmp_path}/sweep"], tmp_path, slurm_env)
    try:
        assert len({job_id for job_id, _ in jobs}) == len({run_dir for _, run_dir in jobs}) == 2
        for (job_id, run_dir), lr in zip(jobs, (0.2, 0.4)):
            assert OmegaConf.load(run_dir / ".hydra" / "run.yaml").optim.lr == lr
            fields = job_fields(job_id, slurm_env)
            assert fields["Command"] == str(run_dir / "job.sbatch"), fields
            assert fields["StdOut"] == str(run_dir / "logs" / f"slurm-{job_id}.out"), fields
            assert fields["NumTasks"] == "1" and fields["NumNodes"] in ("1", "1-1"), fields
    finally:  # at once (a plain scancel gives the ranks KillWait to stop gracefully)
        ids = [job_id for job_id, _ in jobs]
        slurm(["scancel", "--full", "--signal=KILL", *ids], slurm_env)
        slurm(["scancel", *ids], slurm_env)
