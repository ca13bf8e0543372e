"""Characters of transcripts as CTC tokens, and greedy CTC decoding.

Apart from the model (model.py), which the ranks alone build: the heads and the decoder
configuration are imported when a command line is checked, and must not import torch
(runner/lazy.py).
"""

from __future__ import annotations

from runner.lazy import torch

BLANK = 0


class CharTokenizer:
    """Characters of normalised transcripts: index 0 is the CTC blank, 1 the word space."""

    def __init__(self, alphabet: str = "abcdefghijklmnopqrstuvwxyz'"):
        self.symbols = ["<blank>", " ", *alphabet]
        self.index = {s: i for i, s in enumerate(self.symbols)}

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, words: list[str]) -> list[int]:
        """Token ids of ``words`` joined by spaces; characters outside the alphabet drop out."""
        return [self.index[c] for c in " ".join(words) if c in self.index]

    def decode(self, ids: list[int]) -> list[str]:
        return "".join(self.symbols[i] for i in ids if i != BLANK).split()


def greedy_decode(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path: the most likely token per frame, repeats merged, blanks removed."""
    best = log_probs.argmax(dim=-1).cpu()
    hypotheses = []
    for row, length in zip(best, lengths.tolist()):
        ids = torch.unique_consecutive(row[:length]).tolist()
        hypotheses.append([i for i in ids if i != BLANK])
    return hypotheses
