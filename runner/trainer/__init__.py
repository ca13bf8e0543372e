"""The one training loop shared by every algorithm (loop.py), what it reports (report.py)
and how it regroups when the learners change (regroup.py, launcher.elastic)."""

from .loop import Trainer

__all__ = ["Trainer"]
