"""Recipes: data, model and metric for one task. They know nothing of algorithms."""

from runner.registry import Registry

from .base import Recipe

RECIPES: Registry[Recipe] = Registry("recipe", "recipes.all")

__all__ = ["RECIPES", "Recipe"]
