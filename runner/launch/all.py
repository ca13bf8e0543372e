"""Importing this module registers every launcher."""

from . import local  # noqa: F401
