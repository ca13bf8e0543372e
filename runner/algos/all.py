"""Importing this module registers every algorithm."""

from . import adpsgd, dasgd, dpsgd, hadpsgd, local_sgd, ssgd  # noqa: F401
