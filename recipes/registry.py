"""The recipe registry: ``RECIPES.register(NAME)`` on a class where it is defined; the
package's ``__init__`` imports every module that registers one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.registry import Registry

if TYPE_CHECKING:
    from .base import Recipe

RECIPES: Registry[Recipe] = Registry("recipe")
