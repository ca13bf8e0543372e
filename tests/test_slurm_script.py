"""launcher=slurm without a cluster: job.sbatch's contents (dry run), the launcher keys'
one-line errors, the restart step of a requeued job, and the rank placement check."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import REPO, run_cli

SLURM = ["launcher=slurm", "launcher.dry_run=true"]


def sbatch_options(script: str) -> list[str]:
    return [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.slow
def test_dry_run_writes_a_readable_script_for_a_2_node_4_gpu_hadpsgd_job(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["recipe=digit_images", "algo=hadpsgd", *SLURM, "launcher.nodes=2",
                    "launcher.procs_per_node=4", "launcher.gpus_per_node=4",
                    "launcher.cpus_per_task=8", "launcher.time=1-12:00:00",
                    "launcher.partition=gpu", "launcher.account=speech", "launcher.qos=high",
                    "launcher.signal_lead_s=600", "launcher.max_requeues=5",
                    "launcher.extra_sbatch=['--mem=128G','#SBATCH --exclusive']",
                    "launcher.setup=['module load cuda/12.4','source /opt/env.sh']",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=120)
    script_path = run_dir / "job.sbatch"
    assert f"wrote {script_path}" in proc.stdout and "not submitted" in proc.stdout
    assert "samples/s" not in proc.stdout and "submitted SLURM job" not in proc.stdout
    script = script_path.read_text()
    assert script.startswith("#!/bin/bash\n")
    assert sbatch_options(script) == [
        "--job-name=adpsgd-digit_images-hadpsgd", "--nodes=2", "--ntasks-per-node=4",
        "--cpus-per-task=8", "--gpus-per-node=4", "--time=1-12:00:00", "--partition=gpu",
        "--account=speech", "--qos=high", f"--chdir={tmp_path}",
        f"--output={run_dir}/logs/slurm-%j.out", "--open-mode=append",
        "--signal=B:USR1@600", "--requeue", "--mem=128G", "--exclusive"]
    lines = script.splitlines()
    assert lines.index("module load cuda/12.4") + 1 == lines.index("source /opt/env.sh")
    assert f"RUN_DIR={run_dir}" in lines and "MAX_REQUEUES=5" in lines
    steps = [line.strip() for line in lines]  # the ranks' steps are inside the restart loop
    assert ('srun --mpi=pmi2 --kill-on-bad-exit=1 --ntasks-per-node=4 --cpus-per-task=8 '
            '$overlap "$PYTHON" -m runner.worker "$RUN_DIR" &') in steps
    assert '"$PYTHON" -m runner.launch.batch_steps "$RUN_DIR" || exit 1' in steps
    assert '"$PYTHON" -m runner.launch.batch_steps "$RUN_DIR" --watch-step "$step" &' in steps
    assert any(line.startswith("MAX_RESTARTS=0 ") for line in lines)
    assert "trap 'forward USR1' USR1" in lines and "trap 'forward TERM' TERM" in lines
    assert 'scontrol requeue "$SLURM_JOB_ID" && exit 0' in script
    assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0
    run_cfg = OmegaConf.load(run_dir / ".hydra" / "run.yaml")
    assert (run_cfg.launcher.nprocs, run_cfg.launcher.procs_per_node) == (8, 4)
    assert not list((run_dir / "logs").iterdir())  # nothing ran


def test_mpiexec_inside_the_allocation_instead_of_srun(tmp_path):
    from runner.commands.compose import compose_all, validate_job
    from runner.launch.slurm import SlurmConfig, find_mpiexec, render_script

    [composed] = compose_all(["recipe=digit_images", "algo=ssgd", *SLURM,
                              "launcher.rank_launcher=mpiexec", "launcher.nodes=2",
                              "launcher.procs_per_node=3", "launcher.python=/opt/venv/bin/python"],
                             multirun=False, config_name="config")
    cfg = validate_job(composed)
    script = render_script(OmegaConf.to_object(cfg.launcher), cfg, tmp_path / "run", tmp_path)
    assert isinstance(OmegaConf.to_object(cfg.launcher), SlurmConfig)
    assert f'{find_mpiexec(None)} -n 6 -ppn 3 "$PYTHON" -m runner.worker "$RUN_DIR" &' in script
    assert "PYTHON=/opt/venv/bin/python" in script and "srun --mpi" not in script



def test_an_elastic_job_s_step_is_its_supervisor_over_srun_with_pmix(tmp_path):
    """launcher.elastic=true: the batch script's step is runner.launch.slurm_elastic (the
    local launcher's supervision), which starts srun --mpi=pmix with the lost-rank and
    lost-node kills off and Open MPI 5's ULFM environment; no step watcher, no restart loop
    of the script's own, and the allocation survives a node SLURM declares down."""
    from runner.commands.compose import compose_all, validate_job
    from runner.launch.slurm import render_script
    from runner.launch.slurm_elastic import PMIX_QUIET, AllocationLauncher

    [composed] = compose_all(["recipe=digit_images", "algo=dpsgd", *SLURM, "launcher.nodes=4",
                              "launcher.procs_per_node=1", "launcher.elastic=true",
                              "launcher.cpus_per_task=2"], multirun=False, config_name="config")
    cfg = validate_job(composed)
    slurm = OmegaConf.to_object(cfg.launcher)
    script = render_script(slurm, cfg, tmp_path / "run", tmp_path)
    assert "--no-kill" in sbatch_options(script)
    assert '"$PYTHON" -m runner.launch.slurm_elastic "$RUN_DIR" &' in script
    assert "ELASTIC=1" in script and "srun --mpi" not in script
    hosts = tmp_path / "allocation.hosts"
    hosts.write_text("".join(f"node{n} slots=1\n" for n in range(4)))
    launcher = AllocationLauncher(slurm, hosts)
    command = launcher.command(tmp_path / "run")
    assert command[:8] == ["srun", "--mpi=pmix", "--kill-on-bad-exit=0", "--no-kill",
                           "--ntasks=4", "--ntasks-per-node=1", "--cpus-per-task=2",
                           sys.executable], command
    env = launcher.environment()
    assert env["OMPI_MCA_mpi_ft_enable"] == "1" and env["LD_PRELOAD"].startswith(
        str(PMIX_QUIET)) and env["MPI4PY_LIBMPI"].endswith("libmpi.so.40"), env
    assert (launcher.cfg.hostfile, launcher.cfg.elastic, launcher.STARTER) == \
        (str(hosts), True, "srun")

BAD_LAUNCHER_KEYS = [
    (["launcher.procs_per_node=null"], "launcher.procs_per_node: launcher=slurm needs",
     "launcher.procs_per_node=4"),
    (["launcher.nprocs=3"], "runs nodes x procs_per_node = 1 x 2 = 2 ranks, got nprocs=3",
     "set launcher.nodes"),
    (["launcher.time=soon"], "launcher.time: 'soon' is not a SLURM time limit",
     "launcher.time=HH:MM:SS"),
    (["launcher.time=00:05:00", "launcher.signal_lead_s=300"],
     "300 s is not shorter than launcher.time=00:05:00", "launcher.signal_lead_s=30"),
    (["launcher.signal_lead_s=70000"], "must be between 0 and 65535",
     "launcher.signal_lead_s=300"),
    (["launcher.rank_launcher=torchrun"], "must be srun or mpiexec, got 'torchrun'",
     "launcher.rank_launcher=srun"),
    (["launcher.extra_sbatch=['mem=4G']"], "'mem=4G' is not an sbatch option",
     "extra_sbatch=[--mem=64G]"),
    (["launcher.dry_run=false", "launcher.sbatch=/no/such/sbatch"],
     "'/no/such/sbatch' not found: this machine cannot submit SLURM jobs",
     "launcher.dry_run=true"),
    (["launcher.nodes=0"], "launcher.nodes: must be >= 1", "launcher.nodes=1"),
    (["algo=hadpsgd", "launcher.nodes=3"], "needs an even number of them, got 3",
     "launcher.nprocs=8 with launcher.procs_per_node=2"),
]


@pytest.mark.parametrize("args,cause,fix", BAD_LAUNCHER_KEYS)
def test_bad_launcher_keys_end_with_one_clear_line(capsys, args, cause, fix):
    from runner.commands.run import check_command_line

    with pytest.raises(SystemExit) as exit_info:
        check_command_line(["recipe=digit_images", *SLURM, *args])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("adpsgd-run: error: "), lines
    assert cause in lines[0] and "Fix: " in lines[0] and fix in lines[0], lines[0]


@pytest.mark.slow
def test_a_bad_launcher_key_is_caught_before_the_run_dir_exists(tmp_path):
    proc = run_cli(["recipe=digit_images", "launcher=slurm", "launcher.time=12h"],
                   cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 2 and "launcher.time: '12h' is not a SLURM time limit" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("text,seconds", [
    ("30", 1800), ("30:15", 1815), ("04:00:00", 14400), ("2-0", 172800),
    ("1-12:30", 131400), ("1-00:00:05", 86405), ("4h", None), ("", None), ("1:2:3:4", None)])
def test_slurm_time_formats(text, seconds):
    from runner.launch.slurm import time_limit_s

    assert time_limit_s(text) == seconds


def write_run_config(run_dir: Path, resume: str | None) -> Path:
    path = run_dir / ".hydra" / "run.yaml"
    path.parent.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"seed": 0, "resume": resume, "trainer": {"epochs": 3}}),
                   path)
    return path


@pytest.mark.parametrize("resume", [None, "/data/pretrained/checkpoints/samples-0000000100"])
def test_a_job_that_runs_again_resumes_from_its_own_newest_checkpoint(tmp_path, resume):
    from runner.launch.restart_policy import prepare_restart

    path = write_run_config(tmp_path, resume)
    # First start: nothing to continue, the user's choice stands.
    assert prepare_restart(tmp_path) == resume
    assert OmegaConf.load(path).resume == resume
    # Requeued after a checkpoint: continue from this run dir's newest one.
    (tmp_path / "checkpoints" / "samples-0000001437").mkdir(parents=True)
    assert prepare_restart(tmp_path) == "auto"
    reloaded = OmegaConf.load(path)
    assert reloaded.resume == "auto" and reloaded.trainer.epochs == 3
    assert not list(path.parent.glob("*.tmp"))


@pytest.mark.slow
# runner.launch.restart: the name a job.sbatch written by an earlier version calls.
@pytest.mark.parametrize("module", ["runner.launch.batch_steps", "runner.launch.restart"])
def test_the_restart_step_prints_what_it_does(tmp_path, module):
    import sys

    write_run_config(tmp_path, None)
    restart = [sys.executable, "-m", module, str(tmp_path)]
    first = subprocess.run(restart, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and first.stdout == "", first.stderr
    checkpoint = tmp_path / "checkpoints" / "samples-0000000064"
    checkpoint.mkdir(parents=True)  # a write that a kill interrupted: no marker
    again = subprocess.run(restart, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no checkpoint is complete yet" in again.stdout
    (checkpoint / "COMPLETE").write_text(json.dumps(
        {"step": 2, "samples": 64, "epoch": 0.04, "nprocs": 2, "config": {}}))
    again = subprocess.run(restart, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "resume=auto: continuing from" in again.stdout
    missing = subprocess.run([*restart[:-1], str(tmp_path / "nowhere")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "run.yaml is missing. Fix:" in missing.stderr


def place(node: int, local: int, host: str, slurm=None):
    from runner.comm.world import Placement

    return Placement(node, local, host, slurm)


def test_placement_check_accepts_nodes_that_match_the_machines():
    from runner.comm.world import placement_problem

    # Two SLURM nodes of two tasks, srun's block distribution.
    assert placement_problem([place(0, 0, "a", (0, 0)), place(0, 1, "a", (0, 1)),
                              place(1, 0, "b", (1, 0)), place(1, 1, "b", (1, 1))], 2) is None
    # Emulated nodes on one machine, and mpiexec (no per-rank SLURM ids).
    assert placement_problem([place(0, 0, "a"), place(1, 0, "a")], 1) is None


def test_placement_check_rejects_a_node_split_over_machines_or_disagreeing_with_slurm():
    from runner.comm.world import placement_problem

    cyclic = [place(0, 0, "a", (0, 0)), place(0, 1, "b", (1, 0)),
              place(1, 0, "a", (0, 1)), place(1, 1, "b", (1, 1))]
    assert "ranks 0-1 form node 0 (launcher.procs_per_node=2) but run on several machines " \
           "(a, b)" == placement_problem(cyclic, 2)
    swapped = [place(0, 0, "a", (0, 1)), place(0, 1, "a", (0, 0))]
    assert "rank 0 is local rank 0 of node 0 here but SLURM_LOCALID=1" in placement_problem(
        swapped, 2)


def test_slurm_ids_count_only_when_srun_started_this_very_rank():
    from runner.comm.world import slurm_task

    srun = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NODEID": "1",
            "SLURM_LOCALID": "1"}
    assert slurm_task(srun, rank=3, size=4) == (1, 1)
    proxy = {**srun, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}  # mpiexec's proxy
    assert slurm_task(proxy, rank=3, size=4) is None
    assert slurm_task({}, rank=0, size=1) is None


def doc_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", (REPO / "docs" / "slurm.md").read_text(),
                      flags=re.S)


def test_every_command_in_the_slurm_doc_matches_the_code(capsys):
    """docs/slurm.md's commands: adpsgd-run ones pass the full pre-launch check (as dry runs,
    so that no sbatch is needed here); the others are the local cluster script's subcommands
    and SLURM's own commands (tests/test_slurm_cluster.py runs those for real)."""
    from runner.commands.run import check_command_line

    # The single-node cluster's directory and the lab's (scripts/slurm_local.sh up --nodes N).
    local_dirs = re.findall(r"^\s*DIR=\$\{SLURM_LOCAL_DIR:-(\S+)\}$",
                            (REPO / "scripts" / "slurm_local.sh").read_text(), flags=re.M)
    assert len(local_dirs) == 2, local_dirs
    commands = [line.strip() for block in doc_blocks("bash") for line in block.splitlines()
                if line.strip()]
    assert sum(c.startswith("adpsgd-run") for c in commands) >= 4
    for command in commands:
        words = shlex.split(command)
        if words[0] == "adpsgd-run":
            check_command_line([*words[1:], "launcher.dry_run=true"])
            assert capsys.readouterr().err == "", command
        elif words[0] == "scripts/slurm_local.sh":
            assert words[1] in ("up", "down", "status", "env") and words[2:] in (
                [], ["--lab"], ["--nodes", "2"]) and (words[2:] != ["--lab"] or
                                                     words[1] != "up"), command
        elif words[0] == "export":
            assert words[1] in [f"SLURM_CONF={d}/slurm.conf" for d in local_dirs], command
        else:
            assert words[0] == "scancel", f"docs/slurm.md command with no check: {command!r}"


def test_the_script_shown_in_the_slurm_doc_is_what_the_launcher_writes():
    from runner.commands.compose import compose_all, validate_job
    from runner.launch.slurm import render_script

    shown = next(block for block in doc_blocks("text") if block.startswith("#!/bin/bash"))
    command = next(line for block in doc_blocks("bash") for line in block.splitlines()
                   if "launcher.gpus_per_node=4" in line)
    args = [*shlex.split(command)[1:], "launcher.python=/scratch/venv/bin/python"]
    [composed] = compose_all(args, multirun=False, config_name="config")
    cfg = validate_job(composed)
    assert shown == render_script(OmegaConf.to_object(cfg.launcher), cfg,
                                  Path("/scratch/runs/digits-hadpsgd"), Path("/scratch"))


# ---- SLURM absent or unreachable: one line pointing at the set-up, at once ----------------
needs_slurm_client = pytest.mark.skipif(
    shutil.which("scontrol") is None or shutil.which("sbatch") is None,
    reason="SLURM's client commands (sbatch, scontrol) are not installed here; "
           "make slurm-up installs them")


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("adpsgd-run: error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
@needs_slurm_client
def test_submitting_without_a_slurm_configuration_says_how_to_set_it_up(tmp_path):
    # SLURM's own commands retry a missing SLURM_CONF for a minute; the timeout is a hang guard
    proc = run_cli(["recipe=digit_images", "launcher=slurm", "launcher.nodes=1",
                    "launcher.procs_per_node=2", f"hydra.run.dir={tmp_path / 'run'}"],
                   cwd=tmp_path, check=False, timeout=45,
                   env={"SLURM_CONF": str(tmp_path / "nowhere" / "slurm.conf")})
    assert proc.returncode == 2
    line = error_line(proc.stderr)
    assert "SLURM_CONF=" in line and "SLURM is not configured there" in line
    assert "scripts/slurm_local.sh up" in line and "docs/slurm.md" in line
    assert "#SBATCH" not in line and "launcher." not in line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@needs_slurm_client
def test_a_controller_that_does_not_answer_is_named(tmp_path, monkeypatch):
    from runner.errors import UserError
    from runner.launch.slurm import check_controller

    conf = tmp_path / "slurm.conf"  # a cluster whose controller is not running
    conf.write_text(f"ClusterName=nobody\nSlurmctldHost=localhost\n"
                    f"SlurmctldPort={free_port()}\nNodeName=localhost CPUs=1 State=UNKNOWN\n"
                    "PartitionName=p Nodes=localhost Default=YES State=UP\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    with pytest.raises(UserError, match=r"the SLURM controller does not answer \(.*DOWN\)"):
        check_controller("sbatch")
    if not Path("/etc/slurm/slurm.conf").exists():
        monkeypatch.delenv("SLURM_CONF")
        with pytest.raises(UserError, match="SLURM is not configured on this machine"):
            check_controller("sbatch")


@pytest.mark.parametrize("output,expected", [
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
     "(connect failure)", "sbatch could not reach SLURM: .*Unable to contact"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified",
     "sbatch refused .*Invalid partition name"),
])
@pytest.mark.slow
def test_sbatch_failures_tell_an_unreachable_slurm_from_a_bad_key(tmp_path, output, expected):
    from runner.errors import UserError
    from runner.launch.slurm import SlurmConfig, SlurmLauncher

    fake = tmp_path / "bin" / "sbatch"  # a site's wrapper: no scontrol beside it to ask first
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho {shlex.quote(output)} >&2\nexit 1\n")
    fake.chmod(0o755)
    launcher = SlurmLauncher(SlurmConfig(sbatch=str(fake)))
    with pytest.raises(UserError, match=expected) as caught:
        launcher.submit(tmp_path / "job.sbatch")
    unreachable = "could not reach" in str(caught.value)
    assert ("scripts/slurm_local.sh up" in caught.value.fix) == unreachable
    assert ("#SBATCH" in caught.value.fix) != unreachable


@pytest.mark.slow
def test_the_local_cluster_removes_stale_mpich_segments_and_keeps_mapped_ones(tmp_path):
    """A rank killed with -9 leaves its MPICH segment in /dev/shm; a later step whose job and
    step ids repeat would open it and fail in MPI_Init. scripts/slurm_local.sh removes the
    segments no process maps (on up, down and clean-shm) and keeps those a live rank maps."""
    stale, live = (Path(f"/dev/shm/mpich_shm_adpsgdtest{os.getpid()}_{i}") for i in (0, 1))
    for segment in (stale, live):
        segment.write_bytes(b"\0" * 4096)
        os.utime(segment, (time.time() - 600, time.time() - 600))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); "
         "m = mmap.mmap(f.fileno(), 0); f.close(); print(flush=True); time.sleep(60)", str(live)],
        stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()  # the segment is mapped
        out = subprocess.run(["bash", str(REPO / "scripts" / "slurm_local.sh"), "clean-shm"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert not stale.exists() and live.exists(), out.stdout
        assert "removed" in out.stdout and "stale MPICH segment" in out.stdout, out.stdout
    finally:
        holder.kill()
        holder.wait()
        for segment in (stale, live):
            segment.unlink(missing_ok=True)


# ---- the job script's step watcher: a step that outlives its ranks (a lost slurmstepd) ----
def fake_rank(run_dir: Path, rank: int, pid: int, status: int | None = None) -> None:
    """Rank files as a rank leaves them: pid file (heartbeat) and, once it ended, its exit
    record."""
    from runner.runlog.liveness import write_exit_record

    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"rank{rank}.pid").write_text(f"{pid} {socket.gethostname()}\n")
    if status is not None:
        write_exit_record(run_dir, rank, status)


def test_the_step_watcher_names_a_step_that_outlives_its_ranks_and_a_silent_rank(tmp_path):
    from runner.launch.batch_steps import STEP_LINGER_S, step_problem, step_status

    now = time.time()
    fake_rank(tmp_path, 0, 1, status=0)
    fake_rank(tmp_path, 1, 1)
    assert step_problem(tmp_path, 2, 60, None, now) is None  # rank 1 still beats
    os.utime(tmp_path / "logs" / "rank1.pid", (now - 90, now - 90))
    assert step_problem(tmp_path, 2, 60, None, now) == (
        f"rank 1 on {socket.gethostname()} stopped responding: no heartbeat for 90 s "
        "(launcher.stall_timeout_s=60; its node or slurmstepd lost?)", 1)
    assert step_problem(tmp_path, 2, 0, None, now) is None  # 0: never
    assert step_status(tmp_path, 2, 137) == 137  # one rank has not reported
    fake_rank(tmp_path, 1, 1, status=0)
    assert step_problem(tmp_path, 2, 60, now - 1, now) is None  # ended a moment ago
    assert step_problem(tmp_path, 2, 60, now - STEP_LINGER_S - 5, now) == (
        f"every rank ended {STEP_LINGER_S + 5:.0f} s ago but the job step did not (its "
        "slurmstepd or a proxy was lost)", None)
    assert step_status(tmp_path, 2, 137) == 0  # what the ranks said, not what srun said
    fake_rank(tmp_path, 1, 1, status=75)
    assert step_status(tmp_path, 2, 137) == 137  # they disagree: the step's own status


@pytest.mark.slow
def test_the_step_watcher_ends_a_lingering_step_and_the_ranks_left_on_this_host(tmp_path,
                                                                               monkeypatch):
    import runner.launch.batch_steps as restart

    monkeypatch.setattr(restart, "STEP_LINGER_S", 0.5)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    step = subprocess.Popen(["sleep", "300"])  # srun, waiting for a step that cannot report
    hung = subprocess.Popen(["sleep", "300"])  # a rank stuck after its exit record
    fake_rank(tmp_path, 0, hung.pid, status=0)
    fake_rank(tmp_path, 1, step.pid + 10**7, status=0)  # a pid that does not exist
    started = time.monotonic()
    restart.watch_step(tmp_path, step.pid, 2, stall_s=60, poll_s=0.1)
    assert step.wait(timeout=10) == -9 and hung.wait(timeout=10) == -9
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_the_job_builds_the_recipes_caches_not_the_submission(tmp_path):
    """A login node is no place for a corpus's synthesis and features, and a dry run needs
    none: adpsgd-run launcher=slurm leaves them to the job, which builds them once before its
    ranks (python -m runner.worker RUN_DIR --prepare)."""
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    run_cli(["recipe=spoken_digits", "recipe.synth.num_train=24", "recipe.synth.num_eval=8",
             "recipe.synth.train_speakers=4", f"recipe.data.cache_dir={cache}",
             "launcher=slurm", "launcher.dry_run=true", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert not cache.exists() or not any(cache.iterdir())
    assert '"$PYTHON" -m runner.worker "$RUN_DIR" --prepare || exit 2' in (
        run_dir / "job.sbatch").read_text()
    proc = subprocess.run([sys.executable, "-m", "runner.worker", str(run_dir), "--prepare"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(list(cache.rglob("feats.scp"))) + len(list(cache.rglob("*.ark"))) > 0, sorted(
        str(p.relative_to(cache)) for p in cache.rglob("*"))[:20]


@pytest.mark.slow  # runs a stand-in srun
def test_an_elastic_job_on_a_slurm_without_pmix_is_refused_in_one_line(tmp_path):
    """srun --mpi=list without pmix: the submission stops before the job queues, naming the
    plugin and how to get it; with pmix listed it passes."""
    from runner.errors import UserError
    from runner.launch.slurm_elastic import check_srun_has_pmix

    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\necho 'MPI plugin types are...'\necho '\tnone'\necho '\tpmi2'\n")
    srun.chmod(0o755)
    with pytest.raises(UserError, match=r"this SLURM has no PMIx plugin .*Fix: ask the site "
                       r"for SLURM's mpi/pmix plugin"):
        check_srun_has_pmix(str(srun))
    srun.write_text("#!/bin/sh\necho 'MPI plugin types are...'\necho '\tpmix'\n")
    check_srun_has_pmix(str(srun))
