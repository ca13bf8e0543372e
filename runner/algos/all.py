"""Importing this module registers every algorithm."""

from . import ssgd  # noqa: F401
