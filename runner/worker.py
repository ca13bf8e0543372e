"""One rank: ``python -m runner.worker RUN_DIR``, as a launcher starts it (never by hand).

This module only starts the rank, and imports nothing first but the rank factory's client:
with a factory (runner/rank_factory.py) the process that mpiexec started is a stand-in that
hands its place to a fork of the factory, and loading what a rank runs (runner/rank.py, with
OmegaConf, NumPy and the run log) would cost every stand-in of every job for nothing: a
stand-in took 0.36 CPU s with it and takes 0.07 without (median of 15 here). Without a
factory the rank runs here, as runner/rank.py says.

``RUN_DIR --rank-factory`` starts the factory itself; ``RUN_DIR --prepare`` builds the recipe's
caches ahead of a batch job's ranks; ``RUN_DIR --respawned`` is a replacement spawned into a
running elastic job (runner/elastic/respawn.py).
"""

from __future__ import annotations

import os
import runpy
import sys

from . import rank_factory


def main() -> None:
    if sys.argv[2:] == [rank_factory.SERVE]:
        from .rank import load_what_ranks_train_with

        # Returns in each forked rank, with its stand-in's arguments.
        rank_factory.serve(sys.argv[1], load_what_ranks_train_with)
        if os.path.abspath(sys.argv[0]) != os.path.abspath(__file__):
            # The stand-in ran another program (python -m runner.warm_script SCRIPT): run it.
            runpy.run_path(sys.argv[0], run_name="__main__")
            return
    else:
        rank_factory.hand_off()  # exits as the forked rank does; returns where none serves us
    from .rank import run_from_command_line

    run_from_command_line(sys.argv[1:])


if __name__ == "__main__":
    main()
