"""Name -> class registries (algorithms, recipes, topologies, launchers).

Each kind has its registry in a leaf module of its package (``runner/algos/registry.py``...;
the recipes': runner/recipe.py): a class registers itself with the decorator where it is
defined, and the package's ``__init__`` imports every such module, so importing the package
fills its registry (the recipes package fills the runner's). Each registered class carries a
``Config`` dataclass (its schema: unknown keys and wrong types are errors) so that the
commands can validate ``algo.*``/``recipe.*``/``launcher.*`` before any rank starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """A registry of classes by name, filled by importing the modules that define them."""

    def __init__(self, kind: str, filled_by: str | None = None):
        """``filled_by``: what registers the entries, when it is not the registry's own
        package (the recipes: runner/recipe.py), named when a lookup finds none."""
        self.kind = kind
        self.filled_by = filled_by
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def decorator(cls: type[T]) -> type[T]:
            if name in self._entries and self._entries[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = cls
            cls.registered_name = name  # type: ignore[attr-defined]
            return cls

        return decorator

    def names(self) -> list[str]:
        return sorted(self._entries)

    def require_entries(self, wanted: str = "") -> None:
        """UserError when nothing has registered yet (its package was not imported)."""
        if not self._entries:
            raise UserError(f"no {self.kind} is registered{wanted}",
                            f"import {self.filled_by or 'its package'} first, as the commands "
                            "do")

    def get(self, name: str) -> type[T]:
        try:
            return self._entries[name]
        except KeyError:
            self.require_entries(f" (looking for {name!r})")
            raise UserError(
                f"unknown {self.kind} {name!r}",
                f"choose one of: {', '.join(self.names())}",
            ) from None

    def __contains__(self, name: Any) -> bool:
        return name in self._entries
