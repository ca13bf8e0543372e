"""Importing this module registers every topology."""

from . import graphs, random_ring, torus  # noqa: F401
