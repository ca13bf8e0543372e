"""What a command line would do, job by job, without doing it: ``launcher.dry_run=true``.

For every job of the command line (each combination of a ``-m`` sweep) one line: its number,
the values it sweeps, its run dir and what ``adpsgd-run`` would do there. The verdicts follow
the rules a real start applies (runner/commands/run.py, runner/launch/run_dir.py):

* ``skip``: with ``resume=auto``, its newest complete checkpoint is at its last epoch;
* ``resume``: with ``resume=auto`` (or a checkpoint path), a complete checkpoint to continue;
* ``start over``: with ``resume=auto``, a run dir holding no complete checkpoint;
* ``run``: a run dir not there yet, or nothing of a run in it;
* ``refused``: without ``resume``, a run dir that holds a run (a fresh start would mix the two).

Re-running an interrupted sweep with ``resume=auto`` and the same ``hydra.sweep.dir`` does
what the list says: the completed jobs are skipped, the stopped ones resumed from their
newest checkpoints and the others run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ..errors import UserError


@dataclass
class PlannedJob:
    num: int
    swept: str  # the job's values of the swept keys ("algo=dpsgd,seed=2"); "" for one run
    run_dir: Path
    verdict: str  # skip | resume | start over | run | refused
    why: str

    def line(self) -> str:
        values = f" {self.swept}" if self.swept else ""
        return f"job {self.num}{values}: {self.verdict} ({self.why}) in {self.run_dir}"


def job_run_dir(cfg: DictConfig, num: int, multirun: bool) -> Path:
    """The dir Hydra will give job ``num`` (``cfg`` composed with Hydra's node)."""
    from hydra.core.hydra_config import HydraConfig

    from .compose import sweep_subdir

    HydraConfig.instance().set_config(cfg)  # ${hydra:runtime.choices...} resolve from here
    if not multirun:
        return Path(str(cfg.hydra.run.dir))
    choices = cfg.hydra.runtime.choices
    return Path(str(cfg.hydra.sweep.dir)) / sweep_subdir(
        num, str(cfg.hydra.job.override_dirname), f"{choices.recipe}-{choices.algo}")


def verdict(typed: DictConfig, run_dir: Path) -> tuple[str, str]:
    """(what a start of this job would do in ``run_dir``, why)."""
    from ..checkpoint.files import check_compatible, resolve_resume
    from ..launch.run_dir import check_fresh_start

    if typed.resume is None:
        try:
            check_fresh_start(run_dir)
        except UserError:
            return "refused", ("its run dir holds a run; add resume=auto to continue it, or "
                               "choose another hydra.sweep.dir")
        return "run", "a new run"
    if typed.resume == "auto" and not run_dir.is_dir():
        return "run", "a new run"
    checkpoint = resolve_resume(typed.resume, run_dir)
    if checkpoint is None:
        # (auto found no complete checkpoint; an evaluated attempt is cleared first)
        if typed.resume == "auto" and (run_dir / "metrics.jsonl").exists():
            return "start over", "it stopped before its first complete checkpoint"
        return "run", "no complete checkpoint in its run dir"
    try:
        check_compatible(checkpoint, OmegaConf.to_container(typed), typed.resume_averaged)
    except UserError as ex:
        return "refused", str(ex)
    if checkpoint.epoch >= typed.trainer.epochs - 1e-9:
        return "skip", f"completed: {checkpoint.epoch:.2f} of {typed.trainer.epochs} epochs"
    return "resume", (f"from {checkpoint.path.name}, epoch {checkpoint.epoch:.2f} of "
                      f"{typed.trainer.epochs}")


def plan(overrides: list[str], multirun: bool, config_name: str) -> list[PlannedJob]:
    """Every job of the command line (``overrides`` with adpsgd-run's own sweep naming, as
    the jobs get it), with its run dir and verdict."""
    from .compose import compose_all, job_config, validate_job

    configs = compose_all(overrides, multirun, config_name, with_hydra=True)
    planned = []
    for num, cfg in enumerate(configs):
        run_dir = job_run_dir(cfg, num, multirun)
        what, why = verdict(validate_job(job_config(cfg)), run_dir)
        swept = str(cfg.hydra.job.override_dirname) if multirun else ""
        planned.append(PlannedJob(num, swept, run_dir, what, why))
    return planned
