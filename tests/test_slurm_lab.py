"""launcher=slurm across nodes: a SLURM whose nodes are a lab's hosts (scripts/slurm_local.sh
up --nodes 4: one slurmd per host of scripts/lab_cluster.sh, beside the single-node cluster of
tests/test_slurm_cluster.py, on ports of its own).

The lab here is one of its own, slab1..slab4 (SLURM_LAB: its names, subnet and directories),
not the lab of tests/test_lab.py, so that neither file's cut links and killed hosts can reach
the other's jobs. make test still runs the two files one after the other (one "lab" resource):
side by side on 2 cores (2026-12-01) they shortened nothing yet, the suite being bound by its
CPU, and in those CI runs two timing-sensitive tests elsewhere failed under the extra load.

Needs root (the lab's namespaces) and SLURM's daemons; elsewhere these tests skip with the
reason. Jobs are the digits of tests/test_slurm_cluster.py, one rank per node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.checkpoint.files import complete_checkpoints

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
LAB = REPO / "scripts" / "lab_cluster.sh"
# The scripts' own variables (scripts/lab_cluster.sh, scripts/slurm_local.sh): another prefix,
# subnet and directory than the lab's defaults, and a SLURM directory of its own so that a
# SLURM on the default lab is never taken for this one.
SLURM_LAB = {"LAB_PREFIX": "slab", "LAB_SUBNET": "10.214.0", "LAB_DIR": "/run/adpsgd-slab",
             "SLURM_LOCAL_DIR": "/tmp/adpsgd-slurm-slab"}

JOB = ["recipe=digit_images", "algo=adpsgd", "trainer.epochs=4", "trainer.progress=false",
       "faults.delay_s=0.1", "launcher=slurm", "launcher.nodes=2", "launcher.procs_per_node=1",
       "launcher.time=00:10:00", "launcher.signal_lead_s=60",
       "launcher.extra_sbatch=['--nodelist=slab[1-2]']"]  # of the cluster's 4 nodes


def on_the_slurm_lab(*command: str, **options) -> subprocess.CompletedProcess:
    """One of the scripts' commands, on this file's lab."""
    return subprocess.run(["bash", *command], env={**os.environ, **SLURM_LAB},
                          capture_output=True, **options)


@pytest.fixture(scope="session")
def lab_slurm_session() -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("SLURM on the lab needs root (network namespaces): run the suite as root")
    was_up = on_the_slurm_lab(str(SCRIPT), "status", "--lab", timeout=60).returncode == 0
    lab_was_up = on_the_slurm_lab(str(LAB), "status", timeout=60).returncode == 0
    yield slurm_up("--nodes", "4", env=SLURM_LAB)
    if not was_up:  # leave it as it was found: the lab too, which slurm_local.sh brought up
        on_the_slurm_lab(str(SCRIPT), "down", "--lab", timeout=300)
    if not lab_was_up:
        on_the_slurm_lab(str(LAB), "down", timeout=300)


@pytest.fixture
def lab_slurm_env(lab_slurm_session) -> dict[str, str]:
    """The cluster, whole before each test (quick when it is): a test here kills every
    process on a host, a slurmd among them."""
    return slurm_up("--nodes", "4", env=SLURM_LAB)


def wait_for_first_evaluation(run_dir: Path, job_id: str, env: dict[str, str],
                              timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "metrics.jsonl").exists():
        assert time.monotonic() < deadline, job_fields(job_id, env)
        time.sleep(0.2)


def test_the_nodes_are_the_lab_hosts(lab_slurm_env):
    nodes = slurm(["sinfo", "-h", "-N", "-o", "%N %t"], lab_slurm_env).stdout.split("\n")
    assert [line.split()[0] for line in nodes if line] == [f"slab{i}" for i in range(1, 5)], nodes


def test_a_job_on_two_nodes_is_preempted_requeued_and_resumed(lab_slurm_env, tmp_path):
    """Ranks on both lab hosts (srun across nodes, PMI-2 over the links); SLURM's warning in
    the middle of the run: they checkpoint, the job requeues itself and resumes on the two
    nodes, and ends with every evaluation once."""
    [(job_id, run_dir)] = submit([*JOB, f"hydra.run.dir={tmp_path}/run"], tmp_path,
                                 lab_slurm_env)
    wait_for_first_evaluation(run_dir, job_id, lab_slurm_env)
    signalled = slurm(["scancel", "--batch", "--signal=USR1", job_id], lab_slurm_env)
    assert signalled.returncode == 0, signalled.stderr
    fields = wait_for_job(job_id, lab_slurm_env, timeout=400)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, log)
    assert re.search(r"on slab\[1-2\]|on slab1,slab2", log), log
    assert "requeueing (requeue 1 of 3)" in log and "ranks exited with status 0" in log, log
    metrics, summary = read_run(run_dir)
    assert eval_epochs(metrics) == [1, 2, 3, 4], metrics
    assert summary["status"] == "completed" and summary["top1"] > 80, summary
    assert [(h["name"], h["ranks"]) for h in summary["hosts"]] == [("slab1", 1), ("slab2", 1)]


def lose_node(node: str) -> None:
    """kill -9 of every process on a lab host (its slurmd, slurmstepd and rank): a node lost
    without a word."""
    pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True,
                          check=True).stdout.split()
    assert pids, f"nothing runs on {node}"
    subprocess.run(["kill", "-9", *pids], check=False)


def cut_link(node: str, state: str) -> None:
    on_the_slurm_lab(str(LAB), "link", node, state, check=True, timeout=60)


def start_node(node: str) -> None:
    on_the_slurm_lab(str(SCRIPT), "start-node", node, "--lab", check=True, timeout=60)


def wait_for_line(run_dir: Path, job_id: str, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ((run_dir / "logs" / f"slurm-{job_id}.out").exists()
               and text in slurm_log(run_dir, job_id)):
        assert time.monotonic() < deadline, f"no {text!r} in {timeout:.0f} s"
        time.sleep(0.2)


def test_a_node_lost_without_a_word_is_named_and_the_job_requeued_and_completed(lab_slurm_env,
                                                                             tmp_path):
    """Every process on slab2 killed after the first evaluation: the job script's watcher
    names rank 1 on slab2 after launcher.stall_timeout_s, finds slab2's slurmd silent and
    requeues the job instead of restarting it in an allocation that lost a node (launcher.
    max_restarts allows one); slab2 comes back and the job completes from its newest
    checkpoint, each evaluation once. (The job failed there, blaming ranks 0 and 1.)"""
    [(job_id, run_dir)] = submit([*JOB, "launcher.max_restarts=1", "launcher.stall_timeout_s=6",
                                  f"hydra.run.dir={tmp_path}/run"], tmp_path, lab_slurm_env)
    try:
        wait_for_line(run_dir, job_id, "start 1 on")
        wait_for_first_evaluation(run_dir, job_id, lab_slurm_env)
        lose_node("slab2")
        wait_for_line(run_dir, job_id, "adpsgd: requeueing (requeue 1 of 3)")
    finally:
        start_node("slab2")
    fields = wait_for_job(job_id, lab_slurm_env, timeout=400)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, log)
    cause = "rank 1 on slab2 stopped responding: no heartbeat for "
    assert f"adpsgd: {cause}" in log and "adpsgd: node slab2 does not answer (its slurmd at " \
        in log and "the job is requeued rather than restarted in this allocation" in log, log
    metrics, summary = read_run(run_dir)
    assert eval_epochs(metrics) == [1, 2, 3, 4], metrics
    assert summary["status"] == "completed", summary
    [stalled] = summary["events"]
    assert (stalled["event"], stalled["learner"], stalled["host"]) == ("stalled", 1, "slab2")
    [restart] = summary["restarts"]
    assert restart["cause"].startswith(cause) and restart["at_samples"] > 0, restart


def test_a_node_lost_after_a_preemption_fails_the_run_with_a_summary_of_its_own(lab_slurm_env,
                                                                                tmp_path):
    """Preempted once (its ranks wrote summary.json, status preempted), requeued, then slab2
    lost without a word and no restart allowed: summary.json says failed, with the newest
    checkpoint, how far the ranks got and the stall naming rank 1 on slab2; not the earlier
    start's preempted status, samples and checkpoint."""
    [(job_id, run_dir)] = submit([*JOB, "launcher.stall_timeout_s=6",
                                  f"hydra.run.dir={tmp_path}/run"], tmp_path, lab_slurm_env)
    try:
        wait_for_first_evaluation(run_dir, job_id, lab_slurm_env)
        slurm(["scancel", "--batch", "--signal=USR1", job_id], lab_slurm_env)
        wait_for_line(run_dir, job_id, "start 2 on")
        preempted = json.loads((run_dir / "summary.json").read_text())
        assert preempted["status"] == "preempted", preempted
        wait_for_line(run_dir, job_id, "resume=auto: continuing")
        deadline = time.monotonic() + 120
        # trained past the preemption, to a checkpoint of this start's
        while complete_checkpoints(run_dir)[-1].samples <= preempted["samples"]:
            assert time.monotonic() < deadline, slurm_log(run_dir, job_id)
            time.sleep(0.2)
        lose_node("slab2")
        wait_for_line(run_dir, job_id, "adpsgd: job failed (exit status")
    finally:
        start_node("slab2")
    summary = json.loads((run_dir / "summary.json").read_text())
    newest = complete_checkpoints(run_dir)[-1]
    assert summary["status"] == "failed" and summary["checkpoint"] == str(newest.path), summary
    assert newest.samples > preempted["samples"] and summary["samples"] >= newest.samples
    [stalled] = [e for e in summary["events"] if e["event"] == "stalled"]
    assert (stalled["learner"], stalled["host"]) == (1, "slab2"), summary["events"]
    assert f"continue from {newest.path} with: sbatch {run_dir}/job.sbatch" in slurm_log(
        run_dir, job_id)


ELASTIC_JOB = ["recipe=digit_images", "trainer.epochs=4", "trainer.progress=false",
               "faults.delay_s=0.1", "launcher=slurm", "launcher.nodes=4",
               "launcher.procs_per_node=1", "launcher.elastic=true", "launcher.time=00:10:00",
               "launcher.signal_lead_s=60"]


@pytest.mark.parametrize(("algo", "fault"), [("dpsgd", "node lost"), ("adpsgd", "link cut")])
def test_an_elastic_slurm_job_goes_on_without_a_lost_node(lab_slurm_env, tmp_path, algo, fault):
    """launcher=slurm launcher.elastic=true (srun --mpi=pmix, Open MPI's ULFM): after the first
    evaluation slab3 is lost, every process on it killed (its slurmd, slurmstepd and rank) or
    its link cut. The three other learners go on in the same job step, the loss is named by
    node, srun (which waits for slab3's task) is stopped once they end, and the job completes
    with every evaluation."""
    [(job_id, run_dir)] = submit([*ELASTIC_JOB, f"algo={algo}", f"hydra.run.dir={tmp_path}/run"],
                                 tmp_path, lab_slurm_env)
    try:
        wait_for_first_evaluation(run_dir, job_id, lab_slurm_env)
        lose_node("slab3") if fault == "node lost" else cut_link("slab3", "down")
        wait_for_line(run_dir, job_id, "adpsgd: ranks exited with status")
    finally:
        start_node("slab3") if fault == "node lost" else cut_link("slab3", "up")
    fields = wait_for_job(job_id, lab_slurm_env, timeout=300)
    log = slurm_log(run_dir, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "0", (fields, log)
    assert re.search(r"learner 2 \(slab3\) lost at [\d,]+ samples: 3 learner\(s\) go on", log), log
    assert "learner(s) 2 on slab3, which the job went on without, never answered again: srun" \
        in log and "ranks exited with status 0" in log, log
    metrics, summary = read_run(run_dir)
    assert eval_epochs(metrics) == [1, 2, 3, 4], metrics
    assert summary["status"] == "completed" and summary["top1"] > 80, summary
    [lost] = summary["membership"]
    assert (lost["event"], lost["learner"], lost["host"], lost["learners"]) == \
        ("lost", 2, "slab3", 3), lost


def test_the_slurm_elastic_benchmark_quick_mode(lab_slurm_env, tmp_path):
    """benchmarks/bench_slurm_elastic.py --quick: dpsgd, slab3's processes killed; its JSON
    names the fault, how long to training again and the job's end on 3 learners."""
    out = tmp_path / "slurm_elastic.json"
    proc = subprocess.run([sys.executable,
                           str(REPO / "benchmarks" / "bench_slurm_elastic.py"), "--quick",
                           "--json", str(out), "--runs", str(tmp_path / "runs")],
                          capture_output=True, text=True, env=lab_slurm_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [case] = json.loads(out.read_text())["cases"]
    assert (case["algo"], case["fault"], case["status"], case["learners_at_end"]) == \
        ("dpsgd", "node", "completed", 3), case
    assert case["fault_to_training_s"] > 0 and case["every_sample_once"] is True, case
