"""``launcher=sim``: every learner in this process, in the virtual time of a modelled cluster
(``cluster=``, conf/cluster/). See runner/sim/engine.py."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import EXIT_STOPPED, UserError
from ..schema import require
from .base import Launcher, LauncherConfig
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

    def check(self, prefix, cfg):
        super().check(prefix, cfg)
        require(self.nprocs <= 4096, f"{prefix}.nprocs", f"the simulator runs at most 4096 "
                f"learners, got {self.nprocs}", f"{prefix}.nprocs=1024")
        if self.replay is not None:
            require(Path(self.replay).is_dir(), f"{prefix}.replay",
                    f"{self.replay} is not a directory", f"{prefix}.replay=RUN_DIR/trace")


@LAUNCHERS.register("sim")
class SimLauncher(Launcher):
    Config = SimConfig

    def launch(self, run_cfg, run_dir):
        from ..sim.engine import Simulation

        run_dir = Path(run_dir)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(run_dir / "logs" / "sim.log")
        handler.setFormatter(logging.Formatter("%(asctime)s sim %(levelname)s %(message)s"))
        logger = logging.getLogger("adpsgd")
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            Simulation(run_cfg, run_dir, progress_stream=sys.stderr).run()
        except KeyboardInterrupt:
            print("adpsgd-run: simulation stopped by Ctrl-C (nothing to resume: the simulator "
                  "keeps no checkpoints)", file=sys.stderr, flush=True)
            return EXIT_STOPPED
        except UserError:
            raise
        finally:
            logger.removeHandler(handler)
            handler.close()
        return 0
