"""CTC decoding: greedy best path, or beam search with torchaudio's flashlight-text decoder.

Beam search is optional (``pip install 'adpsgd[beam]'`` installs flashlight-text); greedy
decoding needs nothing. With ``lexicon`` the beam only forms words of a lexicon (``train``: the
words of the training transcripts, spelled with the model's characters; or a file of
``WORD SPELLING...`` lines), which removes the misspellings a character model makes; a KenLM
model (``lm``) adds word-level context. Without a lexicon the beam searches over characters.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from runner.config.section import require
from runner.lazy import torch

from .tokens import CharTokenizer, greedy_decode

SILENCE = "|"  # flashlight's word boundary token: our space
INSTALL_FIX = "pip install 'adpsgd[beam]' (flashlight-text)"


@dataclass
class DecodeConfig:
    beam_size: int = 0  # 0: greedy best path
    lexicon: Optional[str] = None  # null: lexicon-free; train: training words; or a file
    lm: Optional[str] = None  # a KenLM model (.arpa or .bin); needs a lexicon
    lm_weight: float = 2.0
    word_score: float = 0.0  # added per word: > 0 favours more words

    def check(self, prefix: str) -> None:
        require(self.beam_size >= 0, f"{prefix}.beam_size", f"must be >= 0, got "
                f"{self.beam_size}", f"{prefix}.beam_size=0")
        if not self.beam_size:
            return
        require(importlib.util.find_spec("flashlight") is not None, f"{prefix}.beam_size",
                "beam search needs flashlight-text, which is not installed",
                f"{INSTALL_FIX}, or {prefix}.beam_size=0 for greedy decoding")
        files = {"lexicon": self.lexicon if self.lexicon != "train" else None, "lm": self.lm}
        for key, path in files.items():
            if path:
                require(Path(path).expanduser().is_file(), f"{prefix}.{key}",
                        f"file {path} does not exist", f"give the path of an existing file, "
                        f"or {prefix}.{key}=null")
        require(not self.lm or bool(self.lexicon), f"{prefix}.lm",
                "a word language model needs a lexicon", f"{prefix}.lexicon=train")


def write_lexicon(words: Iterable[str], tokenizer: CharTokenizer, path: Path) -> int:
    """Write ``WORD c h a r s |`` for every word spelled fully in the tokenizer's alphabet;
    return how many words were written."""
    lines = []
    for word in sorted(set(words)):
        if word and all(c in tokenizer.index and c != " " for c in word):
            lines.append(f"{word} {' '.join(word)} {SILENCE}")
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


class CTCDecoder:
    """Turns (batch, frames, tokens) log-probabilities into word sequences."""

    def __init__(self, cfg: DecodeConfig, tokenizer: CharTokenizer,
                 train_words: Iterable[str] = ()):
        self.cfg, self.tokenizer = cfg, tokenizer
        self._beam = None
        if cfg.beam_size:
            self._beam = self._build_beam(train_words)

    def _build_beam(self, train_words: Iterable[str]):
        from torchaudio.models.decoder import ctc_decoder

        tokens = [SILENCE if s == " " else s for s in self.tokenizer.symbols]
        lexicon = self.cfg.lexicon
        if lexicon == "train":
            # The decoder reads its lexicon from a file; it is parsed once, so a temporary
            # file per rank is enough.
            handle, name = tempfile.mkstemp(prefix="lexicon-", suffix=".txt")
            os.close(handle)
            write_lexicon(train_words, self.tokenizer, Path(name))
            lexicon = name
        try:
            return ctc_decoder(
                lexicon=str(Path(lexicon).expanduser()) if lexicon else None, tokens=tokens,
                lm=str(Path(self.cfg.lm).expanduser()) if self.cfg.lm else None,
                beam_size=self.cfg.beam_size, lm_weight=self.cfg.lm_weight,
                word_score=self.cfg.word_score, blank_token=tokens[0], sil_token=SILENCE)
        finally:
            if self.cfg.lexicon == "train":
                os.unlink(lexicon)

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[str]]:
        if self._beam is None:
            return [self.tokenizer.decode(ids) for ids in greedy_decode(log_probs, lengths)]
        emissions = log_probs.detach().float().cpu().contiguous()
        results = self._beam(emissions, lengths.cpu().to(torch.int32))
        if self.cfg.lexicon:
            return [list(nbest[0].words) if nbest else [] for nbest in results]
        return [self.tokenizer.decode(nbest[0].tokens.tolist()) if nbest else []
                for nbest in results]
