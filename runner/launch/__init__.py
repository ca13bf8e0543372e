"""Launchers start the ranks of one run: ``launcher=local`` (mpiexec here), ``launcher=slurm``
(an sbatch job) or ``launcher=sim`` (every learner in this process, in modelled time).
Importing this package registers them."""

from . import local, sim, slurm  # noqa: F401 - they register
from .base import Launcher, LauncherConfig
from .registry import LAUNCHERS

__all__ = ["LAUNCHERS", "Launcher", "LauncherConfig"]
