"""``adpsgd-run``: the Hydra app over conf/.

Before Hydra starts anything, :func:`preflight` composes the config for the command line (for
``-m``, every combination of the sweep) and validates it, so that a typo, a wrong type or an
impossible value ends with one line that names the key and the fix, before any run dir or rank
exists. Hydra then composes again, creates the run dir (``hydra.run.dir``), and the task saves
the validated config to ``.hydra/run.yaml`` and hands over to the launcher.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import lru_cache, partial
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import recipes  # noqa: F401 - fills the recipe registry (runner/recipe.py)

from .. import ctrl_c
from ..errors import EXIT_PREEMPTED, EXIT_STOPPED, ConfigError, UserError
from ..rank_factory import factory_for_sweep
from .compose import (
    CONFIG_MODULE,
    CONFIG_NAME,
    check_override_spacing,
    compose_all,
    config_dirs,
    job_config,
    sweep_jobs,
    validate_job,
)

# Flags after which Hydra only prints something (no run): skip the preflight.
INFO_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--version", "--cfg", "-c",
              "--shell-completion", "-sc"}
VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
               "-cn", "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}


def split_argv(argv: list[str]) -> tuple[list[str], bool, str, bool]:
    """(overrides, multirun, config name, info-only) from a Hydra command line. A config dir
    (``-cd DIR``, Hydra's ``--config-dir``) becomes ``hydra.searchpath=[file://DIR]`` among
    the overrides, which is what Hydra makes of it, so that the checks before the job find the
    user's own config files (conf/cluster/ ones, say) as Hydra will."""
    overrides, multirun, config_name, info = [], False, CONFIG_NAME, False
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, _, inline = arg.partition("=") if arg.startswith("-") else (arg, "", "")
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg.startswith("-"):
            info = info or name in INFO_FLAGS
            following = argv[i + 1] if i + 1 < len(argv) else ""
            value = inline or (following if "=" not in following
                               and not following.startswith("-") else "")
            if name in ("--config-name", "-cn"):
                config_name = value or config_name
            if name in ("--config-dir", "-cd"):
                if not value:
                    raise UserError(f"{name} needs a directory, e.g. {name} myconf"
                                    + (f" (Hydra would take {following!r} for one)"
                                       if following else ""),
                                    f"give {name} DIR before the overrides")
                if not any(a.startswith("hydra.searchpath=") for a in argv):
                    overrides.append(f"hydra.searchpath=[file://{Path(value).absolute()}]")
            if name in VALUE_FLAGS and not inline and value:  # the value is the next word
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return overrides, multirun, config_name, info


def check_resume(typed: DictConfig, run_dir: Path | None,
                 run_dir_given: bool = True) -> str | None:
    """Raise ConfigError when ``resume`` names no usable checkpoint or one that does not fit
    this job (before any rank starts); return what the job will do. Without a run dir (the
    preflight) only an explicit checkpoint path can be checked. ``run_dir_given``: the
    command line named the run dir (else Hydra made a new one, where auto finds nothing)."""
    from ..checkpoint.files import check_compatible, resolve_resume

    if typed.resume is None or (run_dir is None and typed.resume == "auto"):
        return None
    checkpoint = resolve_resume(typed.resume, run_dir or Path.cwd())
    if checkpoint is None and not run_dir_given:
        return (f"resume=auto without hydra.run.dir: {run_dir} is a new run dir, so there is "
                "nothing to continue: starting fresh (to continue a run, add "
                "hydra.run.dir=ITS_RUN_DIR)")
    if checkpoint is None:
        return f"no complete checkpoint in {run_dir}: starting fresh"
    check_compatible(checkpoint, OmegaConf.to_container(typed), typed.resume_averaged)
    if run_dir is not None and checkpoint.epoch >= typed.trainer.epochs - 1e-9:
        where = run_dir if typed.resume == "auto" else checkpoint.path
        raise RunFinished(f"{where} has trained {checkpoint.epoch:.2f} "
                          f"epochs, trainer.epochs={typed.trainer.epochs}: nothing to train; "
                          f"to train on, raise trainer.epochs (e.g. trainer.epochs="
                          f"{int(checkpoint.epoch) + typed.trainer.epochs}) with resume=auto")
    nprocs = typed.launcher.nprocs
    merged = (f"; written by {checkpoint.nprocs} ranks, so {nprocs} start from the mean of their "
              "states and share the rest of the epoch" if checkpoint.nprocs != nprocs else
              "; every rank starts from the mean of the ranks' states"
              if typed.resume_averaged else "")
    return (f"resuming from {checkpoint.path} (step {checkpoint.step}, epoch "
            f"{checkpoint.epoch:.2f}){merged}")


# Whether the command line named the run dir (main() then pins it into sys.argv either way).
RUN_DIR_GIVEN = [True]


class RunFinished(Exception):
    """``resume`` names a checkpoint at or past this job's last epoch: no rank need start."""


def check_output_dir(overrides: list[str], multirun: bool) -> None:
    """Hydra creates the run dir before the job starts and reports a failure as a traceback:
    try first whether a directory can be created where it will go."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")]
    if given and not given[-1].strip():  # Hydra would take the current directory
        raise UserError(f"{key} is empty, so the run would write into the current directory "
                        f"({Path.cwd()})", f"name a directory, e.g. {key}=runs/NAME, or leave "
                        f"{key} out for the default under runs/")
    target = Path(given[-1].split("$", 1)[0] if given else "runs").expanduser()
    existing = target.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file")
        os.rmdir(tempfile.mkdtemp(prefix=".adpsgd-probe-", dir=existing))
    except OSError as ex:
        raise UserError(f"cannot create the run dir {given[-1] if given else target} under "
                        f"{existing} ({ex.strerror or ex})",
                        f"set {key} to a writable place, e.g. {key}=runs/NAME") from None


# The loss detector's keys (launcher=local): read only by an elastic job across hosts.
DETECTOR_KEYS = {f"launcher.{key}" for key in ("heartbeat_s", "loss_after_s", "loss_spread",
                                               "link_timeout_s")}


def override_key(override: str) -> str:
    """The key an override sets: ``+a.b=1`` -> ``a.b``."""
    return override.lstrip("+~").split("=", 1)[0]


def check_keys_used(typed: DictConfig, job: list[str]) -> None:
    """A ``topology=`` (or ``topology.KEY=``) on the command line that the chosen algorithm
    would silently drop is an error; so is a loss detector's key where no learner is taken
    for lost from its heartbeats."""
    from ..algos import ALGORITHMS

    detector = [o for o in job if override_key(o) in DETECTOR_KEYS]
    across_hosts = typed.launcher.get("hostfile") or typed.launcher.name == "slurm"
    if detector and not (typed.launcher.get("elastic") and across_hosts):
        raise ConfigError(override_key(detector[0]), "only an elastic job "
                          "across hosts takes a silent learner for lost from its heartbeats, "
                          f"so {detector[0]} would change nothing", "remove it, or run with "
                          "launcher.elastic=true and launcher.hostfile=FILE (or launcher=slurm)")
    given = [o for o in job if override_key(o).split(".", 1)[0] == "topology"]
    if not given:
        return
    reason = ALGORITHMS.get(typed.algo.name).topology_ignored(typed)
    if reason:
        users = [n for n in ALGORITHMS.names() if ALGORITHMS.get(n).uses_topology]
        raise ConfigError("topology", f"{reason}, so {given[0]} would change nothing",
                          f"remove it; algo={', '.join(users)} follow a topology")


def preflight(argv: list[str]) -> list[DictConfig]:
    """Check every job of ``argv`` before anything starts; their validated configs."""
    overrides, multirun, config_name, info = split_argv(argv)
    if info:
        return []
    check_override_spacing(overrides)
    for config_dir in config_dirs(overrides)[:-1]:  # the user's (the last is the package's)
        if not config_dir.is_dir():
            raise UserError(f"the config dir {config_dir} (-cd or hydra.searchpath) is not a "
                            "directory", "give the directory that holds your group folders, "
                            "e.g. -cd myconf for myconf/cluster/NAME.yaml")
    check_output_dir(overrides, multirun)
    jobs = sweep_jobs(overrides, multirun)
    single = single_run_dir(argv)  # a single run's one compose serves both
    configs = ([job_config(_single_run_config(tuple(argv)))] if single
               else compose_all(overrides, multirun, config_name))
    checked = []
    for job, cfg in zip(jobs, configs):
        typed = validate_job(cfg)
        check_keys_used(typed, job)
        check_resume(typed, None)
        checked.append(typed)
    if single and single[1] is None and single[0].is_dir() and not lists_jobs(argv, checked):
        from ..launch.run_dir import check_fresh_start  # main() checks again, locked

        check_fresh_start(single[0])
    return checked


def lists_jobs(argv: list[str], configs: list[DictConfig]) -> bool:
    """launcher.dry_run=true lists the jobs and starts none (runner/commands/sweep_plan.py),
    except launcher=slurm's single job, whose dry run writes its batch script."""
    multirun = split_argv(argv)[1]
    return any(cfg.launcher.get("dry_run") and (multirun or cfg.launcher.name != "slurm")
               for cfg in configs)


def print_job_list(argv: list[str]) -> None:
    from .sweep_plan import plan

    overrides, multirun, config_name, _ = split_argv(argv)
    naming = sweep_naming(argv)  # the jobs' dir names, as main() gives them to Hydra
    planned = plan([*overrides, *([naming] if naming else [])], multirun, config_name)
    for job in planned:
        print(f"adpsgd-run: {job.line()}")
    counts = {v: sum(j.verdict == v for j in planned) for v in
              ("run", "resume", "start over", "skip", "refused")}
    print("adpsgd-run: launcher.dry_run=true: nothing started; "
          + ", ".join(f"{n} {v}" for v, n in counts.items() if n))


@hydra.main(version_base=None, config_path=f"pkg://{CONFIG_MODULE}", config_name=CONFIG_NAME)
def run_job(cfg: DictConfig) -> None:
    from ..launch import LAUNCHERS
    from ..launch.failure_summary import write_failure_summary
    from ..runlog.records import RUN_CONFIG
    from ..runlog.summary import results_table

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        typed = validate_job(cfg)
        claim_run_dir(run_dir, typed.resume)  # a sweep's job (a single run's: in main())
        resuming = check_resume(typed, run_dir, RUN_DIR_GIVEN[0])
    except UserError as ex:
        print(f"adpsgd-run: error: {ex}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunFinished as done:
        report_finished(done, run_dir)
        return
    if resuming:
        print(f"adpsgd-run: {resuming}", flush=True)
    if typed.resume == "auto" and (run_dir / "metrics.jsonl").exists():
        from ..checkpoint.files import complete_checkpoints
        from ..launch.restart_policy import start_over

        if not complete_checkpoints(run_dir):  # an attempt that evaluated, then stopped
            start_over(run_dir)  # before its first checkpoint: its rows would mix with ours
    for sub in ("tb", "logs", "checkpoints"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(typed, run_dir / RUN_CONFIG)
    try:
        from ..recipe import RECIPES

        launcher_class = LAUNCHERS.get(typed.launcher.name)
        if launcher_class.prepares_data and not typed.launcher.get("timing_only"):
            RECIPES.get(typed.recipe.name)(typed.recipe).prepare()  # caches, before ranks
    except UserError as ex:
        print(f"adpsgd-run: error: {ex}", file=sys.stderr)
        raise SystemExit(2) from None
    spares = typed.launcher.get("spares")
    print(f"adpsgd-run: {typed.algo.name} on {typed.recipe.name} with "
          f"{typed.launcher.nprocs} rank(s){f' and {spares} spare(s)' if spares else ''}; "
          f"run dir {run_dir}", flush=True)
    try:
        launcher = launcher_class(typed.launcher)
        status = launcher.launch(typed, run_dir)
    except UserError as ex:
        print(f"adpsgd-run: error: {ex}", file=sys.stderr)
        raise SystemExit(ex.exit_status) from None
    except KeyboardInterrupt:
        # A Ctrl-C before the launcher took the signals over (between the line above and the
        # start of mpiexec: no rank has started) is a stop like the others, at once; in the
        # instant after it let them go, the run may have completed already.
        ctrl_c.answered()
        from ..launch.stop_forwarding import FIRST_CTRL_C
        from ..runlog.summary import session_summary

        if (session_summary(run_dir) or {}).get("status") == "completed":
            status = 0
        else:
            print(f"\nadpsgd-run: {FIRST_CTRL_C}", file=sys.stderr, flush=True)
            status = EXIT_STOPPED
    if status == EXIT_PREEMPTED:
        print(f"adpsgd-run: stopped by a signal after checkpointing (exit status {status}); "
              f"to continue, run the same command with resume=auto hydra.run.dir={run_dir}",
              file=sys.stderr)
        raise SystemExit(status)
    if status == EXIT_STOPPED:
        report_user_stop(typed, run_dir)
        raise SystemExit(status)
    if status != 0 and launcher.blocking:
        write_failure_summary(run_dir, typed, status,
                              samples_reached=samples_the_ranks_reached(run_dir, typed))
    if status != 0:
        print(f"adpsgd-run: job failed (exit status {status}); logs in {run_dir / 'logs'}",
              file=sys.stderr)
        raise SystemExit(status)
    if launcher.blocking:  # a submitted batch job has no results yet
        print(results_table(run_dir), flush=True)


def report_finished(done: RunFinished, run_dir: Path) -> None:
    """A job with nothing left to train: its results, or one line in a sweep continued with
    resume=auto (one per completed job)."""
    from ..runlog.summary import results_table

    if in_a_sweep():
        print(f"adpsgd-run: skipped, completed: {done}", flush=True)
        return
    print(f"adpsgd-run: {done}", flush=True)
    if (run_dir / "metrics.jsonl").exists():
        print(results_table(run_dir), flush=True)


def samples_the_ranks_reached(run_dir: Path, cfg: DictConfig) -> int | None:
    """The most global samples a learner or spare reported (runner/launch/watchdog.py); None
    where none did."""
    from ..launch.watchdog import samples_reported

    return samples_reported(run_dir, int(cfg.launcher.nprocs)
                            + int(cfg.launcher.get("spares") or 0))


def in_a_sweep() -> bool:
    """Whether this job is one of a ``-m`` sweep's."""
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def report_user_stop(typed: DictConfig, run_dir: Path) -> None:
    """The one line after Ctrl-C: whether the ranks checkpointed (summary status ``stopped``
    written by them) or were stopped at once, and how to continue."""
    from ..checkpoint.files import complete_checkpoints, remove_partial_checkpoints
    from ..launch.failure_summary import write_failure_summary
    from ..runlog.summary import session_summary

    summary = session_summary(run_dir) or {}
    graceful = summary.get("status") == "stopped"
    if not graceful:  # a second Ctrl-C: nothing half-written stays behind
        remove_partial_checkpoints(run_dir)
        write_failure_summary(run_dir, typed, EXIT_STOPPED, status="stopped",
                              samples_reached=samples_the_ranks_reached(run_dir, typed))
    checkpoints = complete_checkpoints(run_dir)
    if not graceful:
        how = "at once"
    elif summary.get("checkpoint") and summary["checkpoint"] != summary.get("resumed_from"):
        how = f"after checkpointing at step {summary['steps']}"
    else:
        how = "before training started"
    if in_a_sweep():
        then = ("to continue the sweep, run the same command with resume=auto: its completed "
                "jobs are skipped, this one " + ("resumes from its newest checkpoint"
                                                 if checkpoints else "starts again") +
                " and the others run (add launcher.dry_run=true to list them first)")
    elif checkpoints:
        then = (f"the newest checkpoint is {checkpoints[-1].path}; to continue, run the same "
                f"command with resume=auto hydra.run.dir={run_dir}")
    else:
        then = ("no checkpoint was written, so there is nothing to continue from: the same "
                "command starts the run again there")
    print(f"adpsgd-run: stopped by Ctrl-C {how} (status stopped in {run_dir / 'summary.json'})"
          f"; {then}", file=sys.stderr)


def claim_run_dir(run_dir: Path, resume: str | None) -> None:
    """Lock ``run_dir`` for this job (runner/runlog/run_lock.py) and refuse a fresh start in
    another run's dir (runner/launch/run_dir.py)."""
    from ..launch.run_dir import start_fresh
    from ..runlog.run_lock import claim

    claim(run_dir, check=partial(start_fresh, run_dir) if resume is None else None)


def single_run_dir(argv: list[str]) -> tuple[Path, str | None] | None:
    """(the run dir Hydra will use, ``resume``) for a single run, resolved now (``${now:...}``
    included); None for a sweep or a command that only prints. The check before the job and
    the job itself ask for the same command line: composed once (a quarter of a second), and both
    see the same ``${now:...}``."""
    cfg = _single_run_config(tuple(argv))  # Hydra caches ${now:...} in the config it resolves
    return None if cfg is None else (Path(str(cfg.hydra.run.dir)), cfg.get("resume"))


@lru_cache(maxsize=2)
def _single_run_config(argv: tuple[str, ...]) -> DictConfig | None:
    """The composed config of a single run, Hydra's node included (None for a sweep or a
    command that only prints)."""
    overrides, multirun, config_name, info = split_argv(list(argv))
    if multirun or info:
        return None
    [cfg] = compose_all(overrides, False, config_name, with_hydra=True)
    HydraConfig.instance().set_config(cfg)  # ${now:...} and ${hydra:...} resolve from here
    return cfg


@contextlib.contextmanager
def hydra_mode_of(composed: DictConfig | None) -> Iterator[None]:
    """Hydra's main composes the whole config once more only to read ``hydra.mode`` from it
    (``Hydra.get_mode``: 0.1-0.2 of the launcher's 1.2 CPU s here, for every job of the test
    suite and every user's). A single run's config, composed for the checks, already says it
    (``composed``; None for a sweep, whose combinations Hydra composes as before)."""
    if composed is None:
        yield
        return
    from hydra._internal.hydra import Hydra

    mode = composed.hydra.mode
    original = Hydra.get_mode
    Hydra.get_mode = lambda _hydra, config_name, overrides: mode
    try:
        yield
    finally:
        Hydra.get_mode = original


def pin_run_dir(run_dir: Path) -> None:
    """Write the resolved run dir into ``sys.argv``, so that Hydra uses exactly this one."""
    given = [i for i, a in enumerate(sys.argv) if a.startswith("hydra.run.dir=")]
    for i in given:
        sys.argv[i] = f"hydra.run.dir={run_dir}"
    if not given:
        sys.argv.append(f"hydra.run.dir={run_dir}")


EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"


def sweep_naming(argv: list[str]) -> str | None:
    """The override that makes each sweep job's dir name (conf/config.yaml hydra.sweep.subdir)
    hold only the values this sweep varies (``0-topology=ring``):
    ``hydra.job.config.override_dirname.exclude_keys=[...]`` with every key that is the same
    in all jobs (those are in multirun.yaml and each job's .hydra/overrides.yaml, and would
    only lengthen every name). None for a single run, or when the command line sets it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, multirun, _, info = split_argv(argv)
    if not multirun or info or any(o.startswith(f"{EXCLUDE_KEYS}=") for o in overrides):
        return None
    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = sorted({o.key_or_group for o in parsed
                    if not o.is_sweep_override() and not o.key_or_group.startswith("hydra.")})
    return f"{EXCLUDE_KEYS}=[{','.join(repr(key) for key in fixed)}]"


def check_command_line(argv: list[str]) -> list[DictConfig]:
    """Validate every job of ``argv`` (their configs); on a user error print one line and
    exit with 2."""
    try:
        return preflight(argv)
    except UserError as ex:
        print(f"adpsgd-run: error: {ex}", file=sys.stderr)
        raise SystemExit(2) from None


HELP_FLAGS = ("--help", "-h")


def print_help(argv: list[str]) -> None:
    """``adpsgd-run [OVERRIDES] --help``: conf/config.yaml's help template over the config the
    overrides compose. Hydra's own --help composes every option of every config group to list
    them (2 s of its start-up here), although the template lists the groups by their folders
    (``adpsgd_config_groups``): one compose is enough."""
    import string

    overrides, _, config_name, _ = split_argv([a for a in argv if a not in HELP_FLAGS])
    [cfg] = compose_all(overrides, False, config_name, with_hydra=True)
    HydraConfig.instance().set_config(cfg)  # the template's ${hydra:...} resolve from here
    config = OmegaConf.to_yaml(job_config(cfg), resolve="--resolve" in argv)
    print(string.Template(cfg.hydra.help.template).safe_substitute(CONFIG=config))


def one_line_on_error(action: Callable[[list[str]], None], argv: list[str]) -> None:
    """``action(argv)``; a user's mistake in it ends with its one line and exit status 2."""
    try:
        action(argv)
    except UserError as ex:
        print(f"adpsgd-run: error: {ex}", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> None:
    if any(flag in sys.argv[1:] for flag in HELP_FLAGS) and "--hydra-help" not in sys.argv:
        one_line_on_error(print_help, sys.argv[1:])
        return
    try:
        configs = check_command_line(sys.argv[1:])
        if lists_jobs(sys.argv[1:], configs):
            one_line_on_error(print_job_list, sys.argv[1:])
            return
        RUN_DIR_GIVEN[0] = any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))
                               for a in sys.argv[1:])
        composed = _single_run_config(tuple(sys.argv[1:]))  # before pin_run_dir changes argv
        try:
            single = single_run_dir(sys.argv[1:])
            if single:  # before Hydra writes anything into it
                pin_run_dir(single[0])
                claim_run_dir(*single)
            naming = sweep_naming(sys.argv[1:])
            if naming:  # Hydra reads sys.argv
                sys.argv.append(naming)
        except UserError as ex:
            print(f"adpsgd-run: error: {ex}", file=sys.stderr)
            raise SystemExit(2) from None
        if ctrl_c.unanswered():  # pressed while checking the command line, and lost
            raise KeyboardInterrupt
        with factory_for_sweep([cfg.launcher for cfg in configs]), hydra_mode_of(composed):
            run_job()
    except KeyboardInterrupt:  # outside a running job (composing, preparing data)
        print("\nadpsgd-run: interrupted (Ctrl-C) while no rank was running", file=sys.stderr)
        raise SystemExit(EXIT_STOPPED) from None
    finally:
        # Exiting collects every object the imports made (torch, Hydra), which took seconds on
        # a loaded machine after the job had ended; nothing is left to free but memory.
        gc.freeze()


if __name__ == "__main__":
    main()
