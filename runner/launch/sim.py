"""``launcher=sim``: every learner in this process, in the virtual time of a modelled cluster
(``cluster=``, conf/cluster/). See runner/sim/engine.py."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..config.section import require
from ..errors import EXIT_STOPPED, DiskFull, UserError, disk_full
from .base import Launcher, LauncherConfig, records_off_the_console
from .failure_summary import write_failure_summary
from .registry import LAUNCHERS

log = logging.getLogger("adpsgd")


@dataclass
class SimConfig(LauncherConfig):
    name: str = "sim"
    nprocs: int = 16  # learners (ranks of the modelled job)
    # ranks per modelled node (hadpsgd's super learners); conf/launcher/sim.yaml: the cluster's
    procs_per_node: Optional[int] = None
    # a real adpsgd/hadpsgd run's exchange trace (RUN_DIR/trace, recorded with
    # algo.record_trace=true) to replay instead of the modelled schedule
    replay: Optional[str] = None
    # No data and no learning: the schedule of the run for a model of model_bytes and an epoch
    # of samples_per_epoch, projected in seconds of host time (runner/sim/timing.py)
    timing_only: bool = False
    # bytes a learner sends per exchange (null: the recipe's model's parameters in
    # trainer.dtype); set in a learning run, a small model learns while the exchanges are
    # timed for a large one
    model_bytes: Optional[float] = None
    # null: the recipe's (imagenet: 1,281,167 images; swb2000: 2,000 h in utterances of 4 s;
    # the others: their training set; runner/sim/timing.py, SAMPLES_PER_EPOCH)
    samples_per_epoch: Optional[int] = None

    def check(self, prefix, cfg):
        super().check(prefix, cfg)
        require(not self.elastic or self.timing_only, f"{prefix}.elastic", "the simulator "
                "models learners going on without a failed node in timing-only runs; a learning "
                "simulation restarts from its newest checkpoint instead",
                f"{prefix}.timing_only=true (or {prefix}.elastic=false)")
        require(not self.spares, f"{prefix}.spares", "the simulator does not model spares; "
                "benchmarks/study_scale.py failures models their goodput",
                f"{prefix}.spares=0")
        require(not self.respawn, f"{prefix}.respawn", "the simulator does not model "
                "replacements spawned into the job", f"{prefix}.respawn=false")
        require(self.nprocs <= 4096, f"{prefix}.nprocs", f"the simulator runs at most 4096 "
                f"learners, got {self.nprocs}", f"{prefix}.nprocs=1024")
        require(self.model_bytes is None or self.model_bytes > 0, f"{prefix}.model_bytes",
                f"must be > 0 (or null: the recipe's model), got {self.model_bytes}",
                f"{prefix}.model_bytes=1.0e8")
        require(self.samples_per_epoch is None or self.samples_per_epoch >= 1,
                f"{prefix}.samples_per_epoch", f"must be >= 1 (or null: the recipe's), got "
                f"{self.samples_per_epoch}", f"{prefix}.samples_per_epoch=1281167")
        require(not (self.timing_only and self.replay), f"{prefix}.replay",
                "a timing-only run has no models to replay a trace on",
                f"{prefix}.replay=null (or {prefix}.timing_only=false)")
        require(not cfg.resume_averaged, "resume_averaged", "a simulated run resumes with "
                "every learner's own state (the simulator keeps them all)",
                "resume_averaged=false")
        failures = cfg.cluster.failures
        require(not (self.replay and (failures.node_mtbf_hours or failures.at_s)),
                "cluster.failures", "a replayed trace is one run's exchanges, without "
                "restarts", "cluster.failures.node_mtbf_hours=null cluster.failures.at_s=[] "
                f"(or {prefix}.replay=null)")
        if self.replay is not None:
            require(Path(self.replay).is_dir(), f"{prefix}.replay",
                    f"{self.replay} is not a directory", f"{prefix}.replay=RUN_DIR/trace")
        for key, injected, why, fix in unmodelled_faults(cfg, replay=self.replay is not None):
            require(not injected, key, f"the simulator does not model it ({why})", fix)


@LAUNCHERS.register("sim")
class SimLauncher(Launcher):
    Config = SimConfig

    def launch(self, run_cfg, run_dir):
        from ..sim.engine import Simulation
        from ..sim.timing import TimingSimulation

        run_dir = Path(run_dir)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(run_dir / "logs" / "sim.log")
        handler.setFormatter(logging.Formatter("%(asctime)s sim %(levelname)s %(message)s"))
        logger = logging.getLogger("adpsgd")
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        # Ctrl-C raises KeyboardInterrupt even where SIGINT came ignored (a job started with
        # `&` from a script inherits that), as the local launcher's ranks also stop on it.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            simulation = TimingSimulation if run_cfg.launcher.timing_only else Simulation
            with records_off_the_console():  # they go to logs/sim.log
                simulation(run_cfg, run_dir, progress_stream=sys.stderr).run()
        except KeyboardInterrupt:  # adpsgd-run says it in one line (nothing to resume)
            return EXIT_STOPPED
        except (OSError, RuntimeError) as ex:  # torch.save reports a full disk as either
            full = disk_full(ex, run_dir)
            if full is None and isinstance(ex, RuntimeError) and _nearly_full(run_dir):
                full = DiskFull(None, run_dir)
            if full is None:
                write_failure_summary(run_dir, run_cfg, 1)
                raise
            raise UserError(full.cause, "free space there or give the run a disk with room "
                            "(hydra.run.dir=...), then run it again (a simulation starts "
                            "over)") from None
        except UserError as ex:  # a diverged run, a failure with no restart left: as a rank's
            write_failure_summary(run_dir, run_cfg, ex.exit_status)
            raise
        except Exception:
            write_failure_summary(run_dir, run_cfg, 1)
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
            logger.removeHandler(handler)
            handler.close()
        return 0


def unmodelled_faults(cfg, replay: bool) -> list[tuple[str, bool, str, str]]:
    """(key, whether set, why, fix) of the faults a real rank injects into itself and the
    simulator has no counterpart for: a run that asked for one is refused rather than run
    without it (a replay follows the recorded run's order, so its delays are moot)."""
    faults = cfg.faults
    return [
        ("faults.nonfinite_loss.ranks", bool(faults.nonfinite_loss.ranks),
         "a simulated run ends at its first non-finite loss; trainer.on_nonfinite is tried "
         "with launcher=local", "faults.nonfinite_loss.ranks=[]"),
        ("trainer.on_nonfinite", cfg.trainer.on_nonfinite != "stop",
         "a simulated run ends at its first non-finite loss", "trainer.on_nonfinite=stop"),
        ("faults.sigkill", bool(faults.sigkill.ranks) or faults.sigkill.sample is not None,
         "its node failures are cluster.failures", "faults.sigkill.ranks=[] "
         "faults.sigkill.sample=null cluster.failures.at_s=[3600]"),
        ("faults.sigkill.recovering_ranks", bool(faults.sigkill.get("recovering_ranks")),
         "its recoveries take the time cluster.failures gives them",
         "faults.sigkill.recovering_ranks=[]"),
        ("faults.delay_s", faults.delay_s > 0 and not replay,
         "its steps vary by cluster.compute.jitter", "faults.delay_s=0 cluster.compute.jitter=0.1"),
        ("faults.checkpoint_write_delay_s", faults.checkpoint_write_delay_s > 0,
         "its checkpoints take the time cluster.storage_gbps gives them",
         "faults.checkpoint_write_delay_s=0 cluster.storage_gbps=10"),
        ("faults.eval_delay_s", faults.eval_delay_s > 0,
         "its evaluations take no virtual time", "faults.eval_delay_s=0"),
    ]


def _nearly_full(run_dir: Path) -> bool:
    try:
        return shutil.disk_usage(run_dir).free < 2**20
    except OSError:
        return False
