"""Importing this module registers every launcher."""

from . import local, slurm  # noqa: F401
