"""Launchers start the ranks of one run (``launcher=local``; SLURM comes later)."""

from ..registry import Registry
from .base import Launcher, LauncherConfig

LAUNCHERS: Registry[Launcher] = Registry("launcher", "runner.launch.all")

__all__ = ["LAUNCHERS", "Launcher", "LauncherConfig"]
