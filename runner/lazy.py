"""Heavy modules imported on first use.

``adpsgd-run`` checks a command line against every algorithm's and recipe's schema before any
rank starts, and those schemas live in the modules that hold the algorithm's or recipe's code.
That code needs torch, whose import takes 3 to 4 s of CPU; the launcher itself never touches a
tensor. So the modules that the launcher imports write ``from runner.lazy import torch`` (or
``lazy_import("torch.nn.functional")``): the name is bound at once, and torch is imported the
first time one of its attributes is read, which happens in the ranks only.

Rules for a module that uses it (tests/test_imports.py checks that the launcher stays torch
free):

- read torch's attributes only inside functions and methods: a class statement, decorator or
  default value that touches ``torch.X`` imports torch when the module is imported;
- subclasses of torch's classes (``nn.Module``, ``Dataset``) go in modules that only the ranks
  import (a recipe's ``model.py``), imported inside the method that builds them.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """Stands for the module ``name`` until an attribute is read, then imports it. Each
    attribute read is copied onto this object, so later reads are plain lookups."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__dict__["_lazy_module"] = None

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)  # copy, pickle and inspect ask; do not import
        module = self.__dict__["_lazy_module"]
        if module is None:
            module = importlib.import_module(self.__name__)
            self.__dict__["_lazy_module"] = module
        value = getattr(module, attribute)
        self.__dict__[attribute] = value
        return value

    def __repr__(self) -> str:
        state = "imported" if self.__dict__["_lazy_module"] is not None else "not imported yet"
        return f"<lazy module {self.__name__!r} ({state})>"


def lazy_import(name: str) -> Any:
    """The module ``name``, imported when one of its attributes is first read."""
    return LazyModule(name)


torch: Any = lazy_import("torch")
