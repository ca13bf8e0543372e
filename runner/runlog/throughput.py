"""Training throughput between two logs: TensorBoard's ``train/samples_per_s``.

The rate is global samples per second of training since the previous reading. Two things
must not enter it, so the trainer (and the simulator) restart the interval after them:

* a pause in training (an evaluation, a checkpoint): its seconds are not training's, and
  counting them would show a dip after every evaluation;
* a count that is replaced rather than advanced: an asynchronous rank estimates the global
  count between milestones and learns the exact one there, which is lower when the estimate
  ran ahead. Across that correction the rate would read as negative.
"""

from __future__ import annotations


class Throughput:
    """Samples per second since the last :meth:`read` or :meth:`restart`."""

    def __init__(self, now: float, samples: int) -> None:
        self.restart(now, samples)

    def restart(self, now: float, samples: int) -> None:
        """Begin a new interval at ``(now, samples)``, without a reading."""
        self._since = (now, samples)

    def read(self, now: float, samples: int) -> float:
        """The rate over the interval that ends at ``(now, samples)``; the next begins there."""
        then, before = self._since
        self._since = (now, samples)
        return (samples - before) / max(now - then, 1e-9)
