"""The random streams a run uses: seeded alike on every rank for the initial model, then per
rank; captured into a checkpoint and restored from it, so that dropout, augmentation, injected
delays and any random choice continue as if nothing had happened."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int, resized_samples: int = 0) -> int:
    """Rank ``rank``'s own streams after the common initial model (a resize starts fresh
    streams from the checkpoint's sample count)."""
    return seed + 1_000_003 * (rank + 1) + resized_samples


def capture_rng(delays: random.Random) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "delays": delays.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], delays: random.Random) -> None:
    random.setstate(state["python"])
    delays.setstate(state["delays"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
