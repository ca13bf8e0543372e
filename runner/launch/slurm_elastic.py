"""Elastic jobs under SLURM (``launcher=slurm launcher.elastic=true``): the ranks start under
``srun --mpi=pmix`` with Open MPI 5's ULFM, supervised from the batch script as under
``launcher=local`` with a hostfile.

Why srun, not Open MPI's mpiexec: PRRTE, the runtime behind that mpiexec, ends the whole job
when it loses a node's daemon (a node's processes killed, the node down), elastic or not
("We cannot recover from this failure"; docs/failures.md). Started by srun, every node's ranks
hang off that node's slurmstepd, and a lost node takes only its own ranks: srun, run with
``--kill-on-bad-exit=0 --no-kill``, keeps the step of the others. Two things were needed:

* Open MPI, seeing a peer fail, reports it to its runtime as a PMIx event
  (``PMIX_ERR_PROC_TERM_WO_SYNC``), and SLURM's PMIx plugin cancels the whole step on any such
  event. The ranks preload native/pmix_quiet.c (built by ``make install``), which drops that
  one event; the survivors learn of the failure from MPI and from this supervisor.
* srun waits for the tasks of a node it no longer hears, until SLURM declares the node down
  (``SlurmdTimeout``, minutes). Once every other learner has ended, the supervisor stops srun,
  as it stops mpiexec for learners behind a cut link.

The supervisor (``python -m runner.launch.slurm_elastic RUN_DIR``, the batch script's step) is
the local launcher's: heartbeats over the network from every node, the loss detector, the
one-line loss report naming the node, events and membership in summary.json, Ctrl-C and SLURM's
warning passed on to the ranks (USR2 and USR1 through srun, as through Open MPI's mpiexec).

Not here: spares (the allocation holds nodes x procs_per_node learners) and
``launcher.respawn`` (SLURM's PMIx server cannot start processes into a running step: every
survivor's MPI_Comm_spawn returns an error under srun --mpi=pmix).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..config.section import require
from ..errors import ConfigError, UserError
from ..runlog.records import RUN_CONFIG
from .base import LauncherConfig
from .local import LocalConfig, LocalLauncher
from .loss_detector import LossDetectionKeys
from .mpi_flavour import MpiFlavour
from .stop_forwarding import OPEN_MPI_FORWARDS
from .ulfm_mpi import ULFM_PREFIX, find_ulfm_mpiexec, ulfm_environment

# make install builds it from native/pmix_quiet.c
PMIX_QUIET = ULFM_PREFIX / "lib" / "adpsgd_pmix_quiet.so"
HOSTS_FILE = Path("logs") / "allocation.hosts"  # in the run dir: the allocation's nodes
SRUN_MPI_FIX = "launcher.srun_mpi=pmix (or a version srun --mpi=list names, e.g. pmix_v4)"


def srun_mpi(cfg: Any) -> str:
    """The PMI an elastic job's srun uses: PMIx (Open MPI 5 speaks no PMI-2); the version
    launcher.srun_mpi names, if it names one."""
    return cfg.srun_mpi if str(cfg.srun_mpi).startswith("pmix") else "pmix"


def check_elastic(cfg: Any, prefix: str, run_cfg: DictConfig) -> None:
    """What an elastic SLURM job needs, before it is submitted."""
    require(cfg.rank_launcher == "srun", f"{prefix}.rank_launcher", "an elastic SLURM job "
            "starts its ranks with srun: Open MPI's mpiexec ends the whole job when it loses a "
            "node's daemon", f"{prefix}.rank_launcher=srun")
    require(cfg.srun_mpi in ("pmi2", "pmix") or str(cfg.srun_mpi).startswith("pmix_"),
            f"{prefix}.srun_mpi", f"an elastic job's Open MPI speaks PMIx, not "
            f"{cfg.srun_mpi}", SRUN_MPI_FIX)
    require(not cfg.spares, f"{prefix}.spares", "an elastic SLURM job starts no spares yet "
            "(its allocation holds nodes x procs_per_node learners)", f"{prefix}.spares=0")
    require(not cfg.respawn, f"{prefix}.respawn", "SLURM's PMIx server cannot start "
            "processes into a running job step (MPI_Comm_spawn fails under srun "
            "--mpi=pmix), so a lost learner cannot be replaced there",
            f"{prefix}.respawn=false (the job goes on with the survivors)")
    require(run_cfg.comm.backend in ("auto", "mpi"), "comm.backend", "an elastic run moves "
            f"tensors over MPI, whose communicators shrink; {run_cfg.comm.backend}'s groups "
            "cannot", "comm.backend=auto")
    find_ulfm_mpiexec(None, f"{prefix}.elastic")
    if not PMIX_QUIET.is_file():
        raise ConfigError(f"{prefix}.elastic", f"{PMIX_QUIET} is missing (make install "
                          "builds it with a C compiler; without it SLURM cancels the whole "
                          "job step at a learner's loss)", "install gcc, then run make install")
    try:  # the dynamic loader would skip a damaged one with a warning, and the job would die
        ctypes.CDLL(str(PMIX_QUIET)).PMIx_Notify_event  # noqa: B018
    except (OSError, AttributeError) as ex:
        raise ConfigError(f"{prefix}.elastic", f"{PMIX_QUIET} cannot be loaded ({ex})",
                          f"rm {PMIX_QUIET}, then run make install") from None


def check_srun_has_pmix(srun: str = "srun") -> None:
    """One line when this SLURM cannot start Open MPI's ranks (no PMIx plugin), before the
    job waits in the queue."""
    try:
        listed = subprocess.run([srun, "--mpi=list"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return  # a site's wrapper, or none here: the job's own srun will say
    output = listed.stdout + listed.stderr
    if "pmix" not in output:
        raise UserError(f"this SLURM has no PMIx plugin (srun --mpi=list: "
                        f"{' '.join(output.split()[-6:])}), which an elastic job's Open MPI "
                        "ranks need", "ask the site for SLURM's mpi/pmix plugin (Debian: "
                        "apt-get install libpmix-dev beside slurmd, then restart slurmd), or "
                        "run with launcher.elastic=false")


class SrunUlfm(MpiFlavour):
    """The ranks of an elastic SLURM job: srun --mpi=pmix, Open MPI 5's libmpi with ULFM
    enabled (what mpiexec's ``--with-ft ulfm`` sets), pmix_quiet preloaded. A stop travels
    through srun as through Open MPI's mpiexec (srun passes USR1 and USR2 on to every task)."""

    forwards = OPEN_MPI_FORWARDS

    def __init__(self, slurm: Any):
        super().__init__(find_ulfm_mpiexec(None))
        self.slurm = slurm

    def command(self, cfg: Any, processes: int, hosts: list[str], program: list[str],
                cleanup_by_watchdog: bool, session_dirs: str | None) -> list[str]:
        # --kill-on-bad-exit=0: a dead rank is a loss the others go on without; --no-kill:
        # so is a node SLURM declares down. srun's own ending is the supervisor's to make.
        return ["srun", f"--mpi={srun_mpi(self.slurm)}", "--kill-on-bad-exit=0", "--no-kill",
                f"--ntasks={processes}", f"--ntasks-per-node={cfg.procs_per_node}",
                f"--cpus-per-task={self.slurm.cpus_per_task}", *self.slurm.srun_args,
                sys.executable, *program]

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        env = {**env, **ulfm_environment(self.mpiexec, env)}
        preload = [str(PMIX_QUIET), *filter(None, env.get("LD_PRELOAD", "").split(":"))]
        return {**env, "OPAL_PREFIX": str(ULFM_PREFIX), "OMPI_MCA_mpi_ft_enable": "1",
                "LD_PRELOAD": ":".join(preload)}


class AllocationLauncher(LocalLauncher):
    """The local launcher's supervision over srun's ranks, from the batch script on the
    allocation's first node; the allocation's nodes are its hostfile."""

    STARTER = "srun"

    def __init__(self, slurm: Any, hostfile: Path):
        shared = [f.name for f in (*fields(LauncherConfig), *fields(LossDetectionKeys))
                  if f.name != "name"]
        # Cold ranks: each must hang off its node's slurmstepd (a lost node takes only its
        # own) and load native/pmix_quiet.c, which a fork of a rank factory would not.
        super().__init__(LocalConfig(**{name: getattr(slurm, name) for name in shared},
                                     hostfile=str(hostfile), warm_start=False))
        self.slurm = slurm

    @property
    def flavour(self) -> MpiFlavour:
        return SrunUlfm(self.slurm)

    def command(self, run_dir: Path, session_dirs: str | None = None) -> list[str]:
        return self.flavour.command(self.cfg, self.processes, [],
                                    ["-m", "runner.worker", str(run_dir)], True, None)

    def ranks_per_machine(self) -> int:
        return int(self.cfg.procs_per_node)


def allocation_hosts(run_dir: Path, procs_per_node: int) -> Path:
    """The allocation's nodes as a hostfile (``scontrol show hostnames``), written to the
    run dir's logs."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise UserError("SLURM_JOB_NODELIST is not set: this runs inside a SLURM job only",
                        f"submit {run_dir}/job.sbatch with sbatch")
    scontrol = shutil.which("scontrol") or "scontrol"
    names = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                           text=True, timeout=60, check=True).stdout.split()
    path = run_dir / HOSTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name} slots={procs_per_node}\n" for name in names))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.launch.slurm_elastic RUN_DIR``: run the elastic job's ranks in this
    allocation, supervised, to the end; the exit status is the job's."""
    run_dir = Path((argv or sys.argv[1:])[0]).resolve()
    run_cfg = OmegaConf.load(run_dir / RUN_CONFIG)
    slurm = run_cfg.launcher
    try:
        hostfile = allocation_hosts(run_dir, int(slurm.procs_per_node))
        return AllocationLauncher(slurm, hostfile).launch(run_cfg, run_dir)
    except (UserError, ConfigError) as ex:
        print(f"adpsgd: {ex}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
