"""Importing this module registers every algorithm."""

from . import adpsgd, dpsgd, hadpsgd, ssgd  # noqa: F401
