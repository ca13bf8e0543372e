"""Importing this module registers every recipe."""

from . import digit_images  # noqa: F401
