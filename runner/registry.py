"""Name -> class registries for algorithms, recipes and launchers.

Each registered class carries a ``Config`` dataclass (its schema: unknown keys and wrong types
are errors) so that the CLI can validate ``algo.*``/``recipe.*``/``launcher.*`` before any rank
starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A registry of classes by name, filled by importing the modules of ``package``."""

    def __init__(self, kind: str, package: str):
        self.kind = kind
        self.package = package
        self._entries: dict[str, type[T]] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def decorator(cls: type[T]) -> type[T]:
            if name in self._entries and self._entries[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = cls
            cls.registered_name = name  # type: ignore[attr-defined]
            return cls

        return decorator

    def _load(self) -> None:
        if not self._loaded:
            # Importing the package imports its modules, whose decorators fill the registry.
            importlib.import_module(self.package)
            self._loaded = True

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def get(self, name: str) -> type[T]:
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            from .errors import UserError

            raise UserError(
                f"unknown {self.kind} {name!r}",
                f"choose one of: {', '.join(self.names())}",
            ) from None

    def __contains__(self, name: Any) -> bool:
        self._load()
        return name in self._entries
