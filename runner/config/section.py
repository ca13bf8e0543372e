"""What every configuration schema shares: the ``check`` hook and the one-line error for an
impossible value. A leaf module: the schemas of every part (trainer, algorithms, recipes,
launchers, topologies) import it, and it imports none of them."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig

from ..errors import ConfigError


class Section:
    """Mixin for schema dataclasses: ``check`` raises ConfigError for impossible values."""

    def check(self, prefix: str, cfg: DictConfig) -> None:
        return None

    @classmethod
    def default(cls, name: str) -> Any:
        """The schema's default for field ``name`` (what a fix hint suggests)."""
        for f in dataclasses.fields(cls):
            if f.name == name:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
        raise KeyError(name)

    def hint(self, prefix: str, name: str) -> str:
        """``PREFIX.NAME=DEFAULT``: the fix that puts a key back to its default."""
        value = self.default(name)
        if value is None:
            shown = "null"
        elif isinstance(value, bool):
            shown = str(value).lower()
        elif isinstance(value, float) and value.is_integer():
            shown = str(int(value))
        else:
            shown = str(value)
        return f"{prefix}.{name}={shown}"


def require(condition: bool, key: str, problem: str, fix: str) -> None:
    if not condition:
        raise ConfigError(key, problem, fix)
