"""Rank 0's progress on the console."""

from __future__ import annotations

from typing import Any


class ProgressBar:
    """Rank 0's console bar over the run's sample budget (tqdm), or nothing."""

    def __init__(self, stream: Any, total: int, done: int, label: str):
        self.bar = None
        if stream is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=min(done, total), file=stream,
                            unit="sample", unit_scale=True, dynamic_ncols=True, desc=label)

    def update(self, done: int, **postfix: str) -> None:
        if self.bar is not None:
            self.bar.update(min(done, self.bar.total) - self.bar.n)
            if postfix:
                self.bar.set_postfix(**postfix)

    def close(self) -> None:
        """End the bar's line (before an error line, or the bar would overwrite its start)."""
        if self.bar is not None:
            self.bar.close()
