"""Recipes: data, model and metric for one task. They know nothing of algorithms. Importing
this package registers them."""

from . import digit_images  # noqa: F401 - they register
from .base import Recipe
from .imagenet import recipe as imagenet_recipe  # noqa: F401
from .registry import RECIPES
from .speech import recipe as speech_recipe  # noqa: F401

__all__ = ["RECIPES", "Recipe"]
