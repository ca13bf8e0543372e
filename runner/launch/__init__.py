"""Launchers start the ranks of one run: ``launcher=local`` (mpiexec here) or ``launcher=slurm``
(an sbatch job). Importing this package registers them."""

from . import local, slurm  # noqa: F401 - they register
from .base import Launcher, LauncherConfig
from .registry import LAUNCHERS

__all__ = ["LAUNCHERS", "Launcher", "LauncherConfig"]
