"""Importing this module registers every algorithm."""

from . import dpsgd, ssgd  # noqa: F401
