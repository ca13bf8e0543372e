"""SLURM launcher: write ``RUN_DIR/job.sbatch``, submit it with sbatch, return at once.

The script is meant to be read and resubmitted by hand: every ``#SBATCH`` option comes from a
``launcher.*`` key, then environment set-up lines, then the ranks under
``srun --mpi=pmi2`` (default) or mpiexec inside the allocation.

Preemption and time limits (docs/slurm.md)::

    #SBATCH --signal=B:USR1@<signal_lead_s>   SLURM warns the batch shell before the end
    trap 'forward USR1' USR1                  the script passes it on to srun/mpiexec, which
                                              deliver it to every rank
    ranks: finish the step, checkpoint, exit 75 (runner.errors.EXIT_PREEMPTED)
    status 75 -> scontrol requeue $SLURM_JOB_ID   unless SLURM_RESTART_COUNT >= max_requeues
    next start -> python -m runner.launch.batch_steps RUN_DIR (resume=auto), then the ranks

``B:`` signals the batch shell only: the script always learns of the warning and forwards it
the same way whichever program started the ranks (``--signal=USR1@...`` would signal the job
steps' tasks, which under mpiexec are its proxies rather than the ranks).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from ..config.section import require
from ..errors import EXIT_PREEMPTED, UserError, one_line
from .base import Launcher, LauncherConfig
from .local import find_mpiexec
from .loss_detector import LossDetectionKeys
from .registry import LAUNCHERS
from .restart_policy import REQUEUE

JOB_SCRIPT = "job.sbatch"
RANK_LAUNCHERS = ("srun", "mpiexec")
MAX_SIGNAL_LEAD_S = 65535  # sbatch --signal's limit
# SLURM's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
TIME_FORMAT = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")


def time_limit_s(text: str) -> Optional[int]:
    """Seconds in a SLURM ``--time`` value; None when it is not one of SLURM's formats."""
    match = TIME_FORMAT.match(text.strip())
    if not match:
        return None
    days, d_hours, d_minutes, d_seconds, first, second, third = match.groups()
    if days is not None:
        return (int(days) * 86400 + int(d_hours) * 3600 + int(d_minutes or 0) * 60
                + int(d_seconds or 0))
    if third is not None:  # hours:minutes:seconds
        return int(first) * 3600 + int(second) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # minutes[:seconds]


def sbatch_option(line: str) -> str:
    """An extra ``#SBATCH`` line as its option: ``--mem=64G`` and ``#SBATCH --mem=64G`` alike."""
    text = line.strip()
    return text[len("#SBATCH"):].strip() if text.startswith("#SBATCH") else text


@dataclass
class SlurmConfig(LauncherConfig, LossDetectionKeys):
    name: str = "slurm"
    nodes: int = 1  # --nodes
    procs_per_node: Optional[int] = 2  # --ntasks-per-node (e.g. one rank per GPU)
    # nprocs (ranks in all) is nodes x procs_per_node; conf/launcher/slurm.yaml derives it.
    gpus_per_node: int = 0  # --gpus-per-node (0: no GPU request)
    cpus_per_task: int = 1  # --cpus-per-task; also each rank's OMP_NUM_THREADS
    time: str = "01:00:00"  # SLURM's formats: MM, HH:MM:SS, D-HH:MM...
    partition: Optional[str] = None  # --partition (null: the cluster's default)
    account: Optional[str] = None  # --account
    qos: Optional[str] = None  # --qos
    job_name: Optional[str] = None  # default: adpsgd-<recipe>-<algo>
    extra_sbatch: list[str] = field(default_factory=list)  # more #SBATCH options ("--mem=64G")
    setup: list[str] = field(default_factory=list)  # shell lines before the ranks (module load)
    rank_launcher: str = "srun"  # srun | mpiexec (inside the allocation)
    srun_mpi: str = "pmi2"  # srun --mpi=...: the PMI the MPI library speaks
    srun_args: list[str] = field(default_factory=list)  # e.g. ["--cpu-bind=cores"]
    mpiexec: Optional[str] = None  # with rank_launcher=mpiexec; default: the venv's
    mpiexec_args: list[str] = field(default_factory=list)
    python: Optional[str] = None  # Python on the nodes; default: this one (shared filesystem)
    signal_lead_s: int = 300  # USR1 this long before the time limit: checkpoint, requeue (0: none)
    max_requeues: int = 3  # a job requeues itself at most this often (SLURM_RESTART_COUNT)
    sbatch: str = "sbatch"  # the submit command

    def check(self, prefix: str, cfg: DictConfig) -> None:
        # nprocs follows from these two: name them, not nprocs, when they are wrong.
        require(self.procs_per_node is not None, f"{prefix}.procs_per_node",
                "launcher=slurm needs the number of tasks per node",
                f"{prefix}.procs_per_node=4 (e.g. one rank per GPU)")
        require(self.nodes >= 1, f"{prefix}.nodes", f"must be >= 1, got {self.nodes}",
                f"{prefix}.nodes=1")
        super().check(prefix, cfg)
        ranks = self.nodes * self.procs_per_node
        require(self.nprocs == ranks, f"{prefix}.nprocs",
                f"launcher=slurm runs nodes x procs_per_node = {self.nodes} x "
                f"{self.procs_per_node} = {ranks} ranks, got nprocs={self.nprocs}",
                f"set {prefix}.nodes and {prefix}.procs_per_node instead of {prefix}.nprocs")
        require(self.gpus_per_node >= 0, f"{prefix}.gpus_per_node", "must be >= 0",
                f"{prefix}.gpus_per_node=0")
        require(self.cpus_per_task >= 1, f"{prefix}.cpus_per_task", "must be >= 1",
                f"{prefix}.cpus_per_task=1")
        limit = time_limit_s(self.time)
        require(limit is not None and limit > 0, f"{prefix}.time",
                f"{self.time!r} is not a SLURM time limit",
                f"{prefix}.time=HH:MM:SS, e.g. {prefix}.time=04:00:00 or 1-00:00:00")
        require(0 <= self.signal_lead_s <= MAX_SIGNAL_LEAD_S, f"{prefix}.signal_lead_s",
                f"must be between 0 and {MAX_SIGNAL_LEAD_S} seconds, got {self.signal_lead_s}",
                f"{prefix}.signal_lead_s=300")
        require(self.signal_lead_s < limit, f"{prefix}.signal_lead_s",
                f"{self.signal_lead_s} s is not shorter than {prefix}.time={self.time}: the "
                "warning would come before the job starts", f"{prefix}.signal_lead_s="
                f"{max(1, limit // 10)} or a longer {prefix}.time")
        require(self.max_requeues >= 0, f"{prefix}.max_requeues", "must be >= 0",
                f"{prefix}.max_requeues=3")
        require(self.rank_launcher in RANK_LAUNCHERS, f"{prefix}.rank_launcher",
                f"must be srun or mpiexec, got {self.rank_launcher!r}",
                f"{prefix}.rank_launcher=srun")
        for line in self.extra_sbatch:
            require(sbatch_option(line).startswith("-") and "\n" not in line,
                    f"{prefix}.extra_sbatch", f"{line!r} is not an sbatch option",
                    f"write options as sbatch takes them, e.g. {prefix}.extra_sbatch=[--mem=64G]")
        if self.elastic:  # srun --mpi=pmix, Open MPI 5's ULFM, the loss detector
            # (imported here: the batch script runs that module with python -m)
            from .slurm_elastic import check_elastic

            check_elastic(self, prefix, cfg)
            self.check_loss_detection(prefix, across_hosts=True)
        elif self.rank_launcher == "mpiexec":
            find_mpiexec(self.mpiexec, key=f"{prefix}.mpiexec")
        if self.python is not None:
            require(Path(self.python).is_absolute(), f"{prefix}.python",
                    f"must be an absolute path, got {self.python!r}",
                    f"{prefix}.python=/path/to/venv/bin/python")
        if not self.dry_run:
            require(shutil.which(self.sbatch) is not None, f"{prefix}.sbatch",
                    f"{self.sbatch!r} not found: this machine cannot submit SLURM jobs",
                    "run on a SLURM login node (or start one here: scripts/slurm_local.sh up), "
                    f"or write the script only with {prefix}.dry_run=true")
            if self.elastic:
                from .slurm_elastic import check_srun_has_pmix

                check_srun_has_pmix(str(Path(shutil.which(self.sbatch)).with_name("srun")))


# The batch job (job.sbatch): str.format fields in braces, the shell's own braces doubled.
JOB_TEMPLATE = """#!/bin/bash
# adpsgd job: {algo} on {recipe}, {nodes} node(s) x \
{procs_per_node} rank(s), written by `adpsgd-run launcher=slurm`.
# Submitting it again (sbatch {run_dir}/{job_script}) continues the run from its newest checkpoint.
{header}

RUN_DIR={run_dir_quoted}
PYTHON={python}
MAX_REQUEUES={max_requeues}
MAX_RESTARTS={max_restarts}  # ranks started again in this allocation after a lost rank
PREEMPTED={preempted}  # the ranks' status after a checkpoint on USR1/TERM
REQUEUE={requeue}  # runner.launch.batch_steps's answer when a node of the allocation is lost
ELASTIC={elastic}  # 1: the step supervises an elastic job (runner/launch/slurm_elastic.py)

# Environment set-up (launcher.setup):
{setup}

export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${{SLURM_CPUS_PER_TASK:-1}}
restarts=${{SLURM_RESTART_COUNT:-0}}
echo "adpsgd: job $SLURM_JOB_ID start $((restarts + 1)) on $SLURM_JOB_NODELIST at $(date -Is)"
# SLURM's warning (--signal=B:USR1) and a preemption's SIGTERM reach this shell; pass them
# on to the ranks, which checkpoint at the next safe point and exit with $PREEMPTED.
step=""
interrupted=0
signalled=0
forward() {{
    interrupted=1
    signalled=1
    echo "adpsgd: SIG$1 at $(date -Is): the ranks checkpoint and stop"
    [ -n "$step" ] && kill -s "$1" "$step" 2>/dev/null
}}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

# The recipe's caches (generated corpora, features), built once here on the job's first
# node, not on the login node at submission; the ranks only read them.
"$PYTHON" -m runner.worker "$RUN_DIR" --prepare || exit 2

taken=0
overlap=""
node_lost=0
while true; do
    # Before the ranks: continue from the newest checkpoint of this run dir when there is one.
    "$PYTHON" -m runner.launch.batch_steps "$RUN_DIR" || exit 1
    {ranks_line} &
    step=$!
    watcher=""
    if [ "$ELASTIC" = 0 ]; then
        # Ends a step that outlives its ranks or whose ranks went silent (a lost slurmstepd).
        # (An elastic job's supervisor watches its ranks itself.)
        "$PYTHON" -m runner.launch.batch_steps "$RUN_DIR" --watch-step "$step" &
        watcher=$!
    fi
    wait "$step"; status=$?
    while [ "$interrupted" = 1 ]; do  # a trapped signal ends `wait` early: wait for the ranks
        interrupted=0
        wait "$step"; status=$?
    done
    step=""
    if [ -n "$watcher" ]; then
        kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
        reported=$("$PYTHON" -m runner.launch.batch_steps "$RUN_DIR" --step-status "$status") &&
            status=$reported
    fi
    echo "adpsgd: ranks exited with status $status at $(date -Is)"
    # Completed, preempted, stopped, a user's error, or a signal to this job: no restart here;
    # nor after an elastic job, whose supervisor restarted it as launcher.max_restarts allows.
    case "$status" in 0|"$PREEMPTED"|130|2) break ;; esac
    [ "$signalled" = 1 ] && break
    [ "$ELASTIC" = 1 ] && break
    # A lost rank: start the ranks again in this allocation (launcher.max_restarts), unless
    # the failure repeats before a newer checkpoint (runner/launch/batch_steps.py); a lost node:
    # requeue the job, which srun could not start there again.
    decision=0
    "$PYTHON" -m runner.launch.batch_steps "$RUN_DIR" --after-failure "$status" \\
        --max-restarts "$MAX_RESTARTS" --taken "$taken" || decision=$?
    [ "$decision" = "$REQUEUE" ] && node_lost=1
    [ "$decision" = 0 ] || break
    taken=$((taken + 1))
    overlap="--overlap"  # a lost step may still hold its CPUs in SLURM's books
done

# SLURM counts a requeue at once, so a requeue from outside (scontrol requeue, a preemption
# that requeues) shows as more restarts than this start saw.
requeued() {{
    local now
    now=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'Restarts=[0-9]*')
    [ "${{now#Restarts=}}" -gt "$restarts" ] 2>/dev/null
}}
if [ "$status" -eq "$PREEMPTED" ]; then
    if requeued; then
        echo "adpsgd: checkpoint written; SLURM has requeued the job already: it continues from" \\
             "this checkpoint"
        exit 0
    elif [ "$restarts" -lt "$MAX_REQUEUES" ]; then
        echo "adpsgd: checkpoint written; requeueing (requeue $((restarts + 1)) of $MAX_REQUEUES)"
        scontrol requeue "$SLURM_JOB_ID" && exit 0
        requeued && echo "adpsgd: SLURM has requeued the job meanwhile" && exit 0
        echo "adpsgd: scontrol requeue failed; continue with: sbatch $RUN_DIR/{job_script}"
    else
        echo "adpsgd: checkpoint written; requeue limit ($MAX_REQUEUES) reached; continue with:" \\
             "sbatch $RUN_DIR/{job_script}"
    fi
elif [ "$node_lost" = 1 ]; then
    if [ "$restarts" -lt "$MAX_REQUEUES" ]; then
        echo "adpsgd: requeueing (requeue $((restarts + 1)) of $MAX_REQUEUES): the job continues" \\
             "from its newest checkpoint once SLURM allocates nodes that answer"
        scontrol requeue "$SLURM_JOB_ID" && exit 0
        requeued && echo "adpsgd: SLURM has requeued the job meanwhile" && exit 0
        echo "adpsgd: scontrol requeue failed"
    else
        echo "adpsgd: requeue limit ($MAX_REQUEUES) reached"
    fi
fi
# Every other end is a failure (a user's error too): summary.json says so, with the newest
# checkpoint and how far the ranks got, whatever an earlier start of the job wrote there.
case "$status" in
    0|"$PREEMPTED"|130) ;;
    *) "$PYTHON" -m runner.launch.batch_steps "$RUN_DIR" --failed "$status" ;;
esac
exit "$status"
"""


def render_script(cfg: SlurmConfig, run_cfg: DictConfig, run_dir: Path, workdir: Path) -> str:
    """The text of job.sbatch for a run dir (absolute paths: it may be submitted from
    anywhere)."""
    q = shlex.quote
    name = cfg.job_name or f"adpsgd-{run_cfg.recipe.name}-{run_cfg.algo.name}"
    options = [f"--job-name={name}", f"--nodes={cfg.nodes}",
               f"--ntasks-per-node={cfg.procs_per_node}", f"--cpus-per-task={cfg.cpus_per_task}"]
    if cfg.gpus_per_node:
        options.append(f"--gpus-per-node={cfg.gpus_per_node}")
    options.append(f"--time={cfg.time}")
    options += [f"--{key}={getattr(cfg, key)}" for key in ("partition", "account", "qos")
                if getattr(cfg, key)]
    options += [f"--chdir={workdir}", f"--output={run_dir}/logs/slurm-%j.out",
                "--open-mode=append"]  # a requeued job appends to the same log
    if cfg.signal_lead_s:
        options.append(f"--signal=B:USR1@{cfg.signal_lead_s}")
    options.append("--requeue")
    if cfg.elastic:  # a node SLURM declares down does not end the allocation: the job goes on
        options.append("--no-kill")
    options += [sbatch_option(line) for line in cfg.extra_sbatch]

    python = cfg.python or sys.executable
    if cfg.elastic:  # srun under the supervisor (runner/launch/slurm_elastic.py)
        ranks = []
    elif cfg.rank_launcher == "srun":
        # --kill-on-bad-exit: a rank that dies takes its step down at once (as mpiexec's
        # clean-up does) instead of leaving its peers waiting for it until a timeout.
        ranks = ["srun", f"--mpi={cfg.srun_mpi}", "--kill-on-bad-exit=1",
                 f"--ntasks-per-node={cfg.procs_per_node}",
                 f"--cpus-per-task={cfg.cpus_per_task}", *cfg.srun_args]
    else:
        ranks = [find_mpiexec(cfg.mpiexec), "-n", str(cfg.nprocs), "-ppn",
                 str(cfg.procs_per_node), *cfg.mpiexec_args]
    # srun's $overlap is empty until a restart (unquoted: nothing when empty).
    overlap = " $overlap" if cfg.rank_launcher == "srun" else ""
    ranks_line = " ".join(q(word) for word in ranks) + overlap + \
        ' "$PYTHON" -m runner.worker "$RUN_DIR"' if ranks else \
        '"$PYTHON" -m runner.launch.slurm_elastic "$RUN_DIR"'
    setup = "\n".join(cfg.setup) if cfg.setup else "# (none: launcher.setup)"
    header = "\n".join(f"#SBATCH {option}" for option in options)
    return JOB_TEMPLATE.format(
        algo=run_cfg.algo.name, recipe=run_cfg.recipe.name, nodes=cfg.nodes,
        procs_per_node=cfg.procs_per_node, run_dir=run_dir, job_script=JOB_SCRIPT,
        header=header, run_dir_quoted=q(str(run_dir)), python=q(python),
        max_requeues=cfg.max_requeues, max_restarts=cfg.max_restarts, preempted=EXIT_PREEMPTED,
        requeue=REQUEUE, elastic=int(cfg.elastic), setup=setup, ranks_line=ranks_line)


@LAUNCHERS.register("slurm")
class SlurmLauncher(Launcher):
    Config = SlurmConfig
    blocking = False  # returns once sbatch has queued the job
    prepares_data = False  # the job does, on its first node (a dry run needs none)

    def launch(self, run_cfg, run_dir):
        run_dir = Path(run_dir).resolve()
        script = run_dir / JOB_SCRIPT
        script.write_text(render_script(self.cfg, run_cfg, run_dir, Path.cwd()))
        script.chmod(0o755)
        if self.cfg.dry_run:
            print(f"adpsgd-run: wrote {script} (launcher.dry_run=true: not submitted; submit "
                  f"it with: sbatch {script})", flush=True)
            return 0
        job_id = self.submit(script)
        print(f"adpsgd-run: submitted SLURM job {job_id} ({self.cfg.nodes} node(s) x "
              f"{self.cfg.procs_per_node} rank(s)); it runs in {run_dir}\n"
              f"  follow it:    squeue -j {job_id}\n"
              f"  its output:   tail -f {run_dir}/logs/slurm-{job_id}.out "
              f"(ranks: {run_dir}/logs/rank<N>.log)\n"
              f"  TensorBoard:  tensorboard --logdir {run_dir}/tb\n"
              f"  results:      {run_dir}/metrics.jsonl, {run_dir}/summary.json\n"
              f"  stop it:      scancel {job_id} (checkpoint first: "
              f"scancel --batch --signal=USR1 {job_id})", flush=True)
        return 0

    def check_fits(self, script: Path) -> None:
        """One line before submitting a job larger than the cluster (``sbatch --test-only``
        says no node configuration can run it; submitted, it would pend forever). Any other
        answer, or none, is left to the real submission."""
        try:
            proc = subprocess.run([self.cfg.sbatch, "--test-only", str(script)],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return
        if proc.returncode != 0 and NEVER_RUNS in (proc.stderr + proc.stdout).lower():
            cfg = self.cfg
            gpus = f", {cfg.gpus_per_node} GPU(s) per node" if cfg.gpus_per_node else ""
            partition = f" -p {cfg.partition}" if cfg.partition else ""
            raise UserError(
                f"SLURM cannot run this job: {cfg.nodes} node(s) x {cfg.procs_per_node} "
                f"task(s) of {cfg.cpus_per_task} CPU(s){gpus} is more than any set of its "
                f"nodes offers (sbatch --test-only: {one_line(proc.stderr or proc.stdout)}); "
                "submitted, it would pend forever",
                f"ask for what `sinfo{partition} -o '%D %c %G'` lists (nodes, CPUs and GPUs "
                "per node), e.g. fewer launcher.nodes or launcher.procs_per_node")

    def submit(self, script: Path) -> str:
        """``sbatch --parsable SCRIPT``; the job id, or a UserError with sbatch's reason. The
        controller is pinged first: sbatch itself retries an unreachable one for a minute."""
        check_controller(self.cfg.sbatch)
        self.check_fits(script)
        command = [self.cfg.sbatch, "--parsable", str(script)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as ex:
            raise UserError(f"could not run {' '.join(command)}: {one_line(ex)}",
                            SLURM_SETUP_FIX) from None
        job_id = proc.stdout.strip().split(";")[0]
        if proc.returncode != 0 or not job_id.isdigit():
            output = proc.stderr or proc.stdout
            reason = one_line(output) or f"exit status {proc.returncode}"
            if unreachable(output):
                raise UserError(f"sbatch could not reach SLURM: {reason}", SLURM_SETUP_FIX)
            raise UserError(f"sbatch refused {script}: {reason}",
                            "fix the launcher.* key behind the #SBATCH line it names "
                            "(partition, account, qos, time, nodes)")
        return job_id


# sbatch --test-only's answer for a job that no node configuration of the cluster can run
# (submitted, it would pend forever with reason PartitionConfig or PartitionNodeLimit).
NEVER_RUNS = "requested node configuration is not available"


SLURM_SETUP_FIX = ("point SLURM_CONF at your cluster's slurm.conf (or submit from a login node "
                   "that has one); on this machine: scripts/slurm_local.sh up, then eval "
                   "\"$(scripts/slurm_local.sh env)\" (docs/slurm.md, 'A SLURM cluster on "
                   "this machine')")
# What SLURM's commands print when they have no configuration or no controller to talk to.
UNREACHABLE = ("could not establish a configuration source", "unable to contact slurm",
               "s_p_parse_file: unable to", "unable to process configuration file",
               "connect failure", "zero bytes were transmitted", "munge")


def unreachable(output: str) -> bool:
    return any(sign in output.lower() for sign in UNREACHABLE)


def check_controller(sbatch: str, timeout_s: float = 15.0) -> None:
    """One line, at once, when SLURM is not configured here or its controller is down
    (``scontrol ping`` answers either in milliseconds). Only the scontrol installed beside
    ``sbatch`` is asked: a site's own submit wrapper is left to answer for itself."""
    found = shutil.which(sbatch)
    scontrol = Path(found).with_name("scontrol") if found else None
    if scontrol is None or not scontrol.is_file():
        return
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # SLURM's commands would retry it for a minute
        raise UserError(f"SLURM_CONF={conf} is not a file: SLURM is not configured there",
                        SLURM_SETUP_FIX)
    try:
        proc = subprocess.run([str(scontrol), "ping"], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"the SLURM controller did not answer `scontrol ping` within "
                        f"{timeout_s:.0f} s", SLURM_SETUP_FIX) from None
    except OSError:
        return
    output = f"{proc.stdout}\n{proc.stderr}"
    if proc.returncode == 0 or " is UP" in output:  # one controller answering is enough
        return
    lowered = output.lower()
    if "configuration source" in lowered or "configuration file" in lowered \
            or "s_p_parse_file" in lowered:
        last = [line.strip() for line in output.splitlines() if line.strip()][-1]
        raise UserError(f"SLURM is not configured on this machine (no usable slurm.conf; "
                        f"scontrol ping: {last})", SLURM_SETUP_FIX)
    down = [line.strip() for line in output.splitlines() if line.strip().endswith("DOWN")]
    if down or unreachable(output):
        raise UserError(f"the SLURM controller does not answer "
                        f"({'; '.join(down) or one_line(output)})", SLURM_SETUP_FIX)

