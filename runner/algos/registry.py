"""The algorithm registry: ``ALGORITHMS.register(NAME)`` on a class where it is defined; the
package's ``__init__`` imports every module that registers one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.registry import Registry

if TYPE_CHECKING:
    from .base import Algorithm

ALGORITHMS: Registry[Algorithm] = Registry("algorithm")
