"""launcher=slurm across nodes: a SLURM whose nodes are the lab's hosts (scripts/slurm_local.sh
up --nodes 2: one slurmd per host of scripts/lab_cluster.sh, beside the single-node cluster of
tests/test_slurm_cluster.py, on ports of its own).

Needs root (the lab's namespaces) and SLURM's daemons; elsewhere these tests skip with the
reason. Jobs are the digits of tests/test_slurm_cluster.py, one rank per node."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from conftest import REPO, read_run
from test_slurm_cluster import (
    eval_epochs,
    job_fields,
    slurm,
    slurm_log,
    slurm_up,
    submit,
    wait_for_job,
)

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.resource("lab")]

SCRIPT = REPO / "scripts" / "slurm_local.sh"
JOB = ["recipe=digit_images", "algo=adpsgd", "trainer.epochs=4", "trainer.progress=false",
       "faults.delay_s=0.1", "launcher=slurm", "launcher.nodes=2", "launcher.procs_per_node=1",
       "launcher.time=00:10:00", "launcher.signal_lead_s=60"]


@pytest.fixture(scope="session")
def lab_slurm_env() -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("SLURM on the lab needs root (network namespaces): run the suite as root")
    was_up = subprocess.run(["bash", str(SCRIPT), "status", "--lab"], capture_output=True,
                            timeout=60).returncode == 0
    yield slurm_up("--nodes", "2")
    if not was_up:  # leave it as it was found
        subprocess.run(["bash", str(SCRIPT), "down", "--lab"], capture_output=True, timeout=300)


def test_the_nodes_are_the_lab_hosts(lab_slurm_env):
    nodes = slurm(["sinfo", "-h", "-N", "-o", "%N %t"], lab_slurm_env).stdout.split("\n")
    assert [line.split()[0] for line in nodes if line] == ["lab1", "lab2"], nodes


def test_a_job_on_two_nodes_is_preempted_requeued_and_resumed(lab_slurm_env, tmp_path):
    """Ranks on both lab hosts (srun across nodes, PMI-2 over the links); SLURM's warning in
    the middle of the run: they checkpoint, the job requeues itself and resumes on the two
    nodes, and ends with every evaluation once."""
    [(job_id, run_dir)] = submit([*JOB, f"hydra.run.dir={tmp_path}/run"], tmp_path,
                                 lab_slurm_env)
    deadline = time.monotonic() + 240
    while not (run_dir / "metrics.jsonl").exists():
        assert time.monotonic() < deadline, job_fields(job_id, lab_slurm_env)
        time.sleep(0.2)
    signalled = slurm(["scancel", "--batch", "--signal=USR1", job_id], lab_slurm_env)
    assert signalled.returncode == 0, signalled.stderr
    fields = wait_for_job(job_id, lab_slurm_env, timeout=400)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, log)
    assert re.search(r"on lab\[1-2\]|on lab1,lab2", log), log
    assert "requeueing (requeue 1 of 3)" in log and "ranks exited with status 0" in log, log
    metrics, summary = read_run(run_dir)
    assert eval_epochs(metrics) == [1, 2, 3, 4], metrics
    assert summary["status"] == "completed" and summary["top1"] > 80, summary
    assert [(h["name"], h["ranks"]) for h in summary["hosts"]] == [("lab1", 1), ("lab2", 1)]
