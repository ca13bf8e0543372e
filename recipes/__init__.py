"""Recipes: data, model and metric for one task. They know nothing of algorithms. Importing
this package registers them in the runner's registry (runner/recipe.py), which the commands
and the worker do."""

from runner.recipe import RECIPES, Recipe

from . import digit_images  # noqa: F401 - they register
from .imagenet import recipe as imagenet_recipe  # noqa: F401
from .speech import recipe as speech_recipe  # noqa: F401

__all__ = ["RECIPES", "Recipe"]
