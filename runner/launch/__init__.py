"""Launchers start the ranks of one run: ``launcher=local`` (mpiexec here) or ``launcher=slurm``
(an sbatch job)."""

from ..registry import Registry
from .base import Launcher, LauncherConfig

LAUNCHERS: Registry[Launcher] = Registry("launcher", "runner.launch.all")

__all__ = ["LAUNCHERS", "Launcher", "LauncherConfig"]
