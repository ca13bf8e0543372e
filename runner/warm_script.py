"""``python -m runner.warm_script SCRIPT [ARGS...]``: a Python script run as a fork of the rank
factory named in the environment (``ADPSGD_RANK_FACTORY``, runner/rank_factory.py), as the
launcher's ranks are, so that it does not load torch itself (about 2 CPU s a process).

For scripts that mpiexec starts on every rank and that import what ranks import (the test
suite's MPI checks, a study's helper ranks): ``mpiexec -n 4 python -m runner.warm_script
check.py ARGS`` runs ``check.py ARGS`` on 4 ranks, each a fork. Without a factory, or one that
cannot serve this process (another Python, another network namespace), the script runs here,
as ``python check.py ARGS`` would. The script sees what it would see run directly:
``sys.argv``, ``__name__ == "__main__"``, its own directory first on ``sys.path``, and
``OMP_NUM_THREADS`` (torch read the factory's when it loaded).
"""

from __future__ import annotations

import os
import runpy
import sys

from runner import rank_factory  # absolute: runner/worker.py runs this file by its path in the fork


def main() -> None:
    if len(sys.argv) < 2 or not os.path.isfile(sys.argv[1]):
        found = f"no such file: {sys.argv[1]}; " if len(sys.argv) > 1 else ""
        print(f"runner.warm_script: {found}usage: python -m runner.warm_script SCRIPT "
              "[ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    # In the process mpiexec started: exits as the fork ends; returns where none serves us.
    # In the fork (runner/worker.py runs this module again there): returns at once.
    rank_factory.hand_off()
    rank_factory.ready()  # a fork: the signals its stand-in passes on may come now
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    rank_factory.use_environment_threads()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
