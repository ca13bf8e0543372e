"""Importing this module registers every recipe."""

from . import digit_images  # noqa: F401
from .imagenet import recipe as imagenet_recipe  # noqa: F401
from .speech import recipe  # noqa: F401
