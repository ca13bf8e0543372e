"""Rank 0's progress on the console: a bar on a terminal, plain lines anywhere else.

A bar redraws itself with carriage returns, which a SLURM output file, ``make demo > log``
or a CI log keeps as one ever-growing line. Without a terminal the same progress is a short
line every ``trainer.progress_every_s`` seconds and at each evaluation.
"""

from __future__ import annotations

import os
import time
from typing import Any

# Ranks under mpiexec write to a pipe that adpsgd-run relays: it tells them here whether its
# own stderr, where their output ends, is a terminal ("1") or not ("0").
CONSOLE_IS_TERMINAL = "ADPSGD_CONSOLE_IS_TERMINAL"


def ends_on_terminal(stream: Any) -> bool:
    """Whether what is written to ``stream`` ends on a terminal."""
    told = os.environ.get(CONSOLE_IS_TERMINAL)
    if told is not None:
        return told == "1"
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def evaluation_postfix(results: dict[str, dict[str, float]]) -> dict[str, str]:
    """An evaluation's metrics beside the progress, ``{"eval loss": "0.3121", ...}``: the
    ``eval`` split's (the averaged model where replicas differ), else every split's."""
    shown = {"eval": results["eval"]} if "eval" in results else results
    return {f"{split} {name}": f"{value:.4g}" for split, metrics in shown.items()
            for name, value in metrics.items()}


class ProgressBar:
    """Rank 0's progress over the run's sample budget: tqdm's bar on a terminal, a plain line
    every ``every_s`` seconds (and when :meth:`update` is forced) elsewhere, or nothing when
    ``stream`` is None."""

    def __init__(self, stream: Any, total: int, done: int, label: str, every_s: float = 30.0,
                 rate_unit: str = "samples/s"):
        """``rate_unit`` names the rate of the plain lines: a simulation's is samples per
        second of the host's time ("host samples/s"), not the modelled rate it reports."""
        self.bar = None
        self.rate_unit = rate_unit
        self.stream = None
        if stream is None:
            return
        if ends_on_terminal(stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=min(done, total), file=stream,
                            unit="sample", unit_scale=True, dynamic_ncols=True, desc=label)
            return
        self.stream, self.total, self.label, self.every_s = stream, total, label, every_s
        self.start = self.last_line = time.monotonic()
        self.first = self.done = self.shown = min(done, total)
        self.postfix: dict[str, str] = {}

    def update(self, done: int, force: bool = False, **postfix: str) -> None:
        """Progress to ``done`` samples; ``postfix`` (loss, lr...) shows beside it. ``force``
        prints a line now (an evaluation) where there is no bar. The count shown never goes
        back: an asynchronous rank's count is an estimate that a later, exact one may undercut
        by a few samples (14,045 then 14,024), which would read as lost work."""
        if self.bar is not None:
            self.bar.update(max(min(done, self.bar.total) - self.bar.n, 0))
            if postfix:
                self.bar.set_postfix(**postfix)
            return
        if self.stream is None:
            return
        self.done = max(self.done, min(done, self.total))
        self.postfix.update(postfix)
        if force or time.monotonic() - self.last_line >= self.every_s:
            self._line()

    def _line(self) -> None:
        now = time.monotonic()
        rate = (self.done - self.first) / max(now - self.start, 1e-9)
        parts = [f"{self.label}: {self.done:,}/{self.total:,} samples "
                 f"({100.0 * self.done / max(self.total, 1):.1f}%)",
                 f"{rate:,.0f} {self.rate_unit}"]
        parts += [f"{key} {value}" for key, value in self.postfix.items()]
        parts.append(f"elapsed {clock(now - self.start)}")
        if 0 < rate and self.done < self.total:
            parts.append(f"ETA {clock((self.total - self.done) / rate)}")
        print(", ".join(parts), file=self.stream, flush=True)
        self.last_line, self.shown = now, self.done

    def relabel(self, label: str) -> None:
        """A new label from here on (an elastic run that lost learners: ``ssgd x3``)."""
        if self.bar is not None:
            self.bar.set_description(label)
        elif self.stream is not None:
            self.label = label

    def close(self) -> None:
        """End the bar's line (before an error line, or the bar would overwrite its start);
        without a bar, a last line for progress not shown yet."""
        if self.bar is not None:
            self.bar.close()
        elif self.stream is not None and self.done != self.shown:
            self._line()
