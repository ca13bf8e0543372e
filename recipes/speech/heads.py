"""Output heads of the acoustic model: what it predicts, its loss and its held-out metric.

* ``ctc`` (default): characters with a CTC loss; decoded to words and scored by WER (overall
  and on the Hub5'00 subsets). End to end: no alignments, no decoding graph.
* ``ce``: the IBM papers' hybrid training, frame-level cross-entropy over context-dependent
  HMM states (Kaldi pdf ids) from existing Kaldi alignments; scored by frame accuracy and
  held-out loss per frame (WER needs a decoding graph, which is Kaldi's job).

A head gives the target sequence of each utterance, the loss of a batch and the summable
held-out statistics; the recipe owns data, features and the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runner.errors import UserError
from runner.lazy import lazy_import, torch

from .decoding import CTCDecoder
from .scoring import edit_ops, normalize_switchboard, subset_of
from .tokens import CharTokenizer

F = lazy_import("torch.nn.functional")

SUBSETS = ("swb", "ch")
IGNORE = -100  # padding of frame targets, skipped by the loss and the accuracy
# Kaldi's alignments and our features use the same framing (25 ms windows every 10 ms); a
# different snip_edges setting or feature pipeline can differ by a frame or two at the end.
FRAME_TOLERANCE = 2


class CTCHead:
    primary_metric = "wer"
    higher_is_better = False

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.tokenizer = CharTokenizer()
        self.texts: dict[str, dict[str, list[str]]] = {}  # role -> utterance -> words
        self._decoder: CTCDecoder | None = None

    def output_size(self) -> int:
        return len(self.tokenizer)

    def _normalize(self, text: str) -> list[str]:
        if self.cfg.text_normalization == "switchboard":
            return normalize_switchboard(text)
        return text.lower().split()

    def load(self, role: str, data) -> list[str]:
        """Targets of a Kaldi data dir's utterances; returns the utterances that have them."""
        self.texts[role] = {utt: self._normalize(text) for utt, text in data.text.items()}
        return list(self.texts[role])

    def targets(self, role: str, utt: str, frames: int) -> torch.Tensor:
        return torch.tensor(self.tokenizer.encode(self.texts[role][utt]), dtype=torch.long)

    def pad_value(self) -> int:
        return 0

    def _loss_sum(self, log_probs, out_lengths, targets, target_lengths) -> torch.Tensor:
        return F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths,
                          target_lengths.to(targets.device), blank=0, reduction="sum",
                          zero_infinity=True)

    def loss(self, log_probs, out_lengths, targets, target_lengths) -> torch.Tensor:
        """Mean CTC loss per utterance."""
        return self._loss_sum(log_probs, out_lengths, targets, target_lengths) / len(
            out_lengths)

    def _decode(self, log_probs, lengths) -> list[list[str]]:
        if self._decoder is None:  # built on first use: a beam decoder loads its lexicon
            words = (w for text in self.texts.get("train", {}).values() for w in text)
            self._decoder = CTCDecoder(self.cfg.decode, self.tokenizer, words)
        return self._decoder(log_probs, lengths)

    def eval_sums(self, log_probs, out_lengths, targets, target_lengths, utts
                  ) -> dict[str, float]:
        loss = self._loss_sum(log_probs, out_lengths, targets, target_lengths)
        sums = {"loss_sum": float(loss), "count": float(len(out_lengths))}
        for utt, hyp in zip(utts, self._decode(log_probs, out_lengths)):
            ref = self.texts["eval"][utt]
            errors = sum(edit_ops(ref, hyp))
            subset = subset_of(utt)  # Hub5'00: swb (sw*) or ch (en*)
            for suffix in ("", f"_{subset}") if subset else ("",):
                sums[f"errors{suffix}"] = sums.get(f"errors{suffix}", 0.0) + errors
                sums[f"words{suffix}"] = sums.get(f"words{suffix}", 0.0) + len(ref)
        return sums

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        result = {"loss": sums["loss_sum"] / max(sums["count"], 1.0),
                  "wer": 100.0 * sums.get("errors", 0.0) / max(sums.get("words", 0.0), 1.0)}
        for subset in SUBSETS:
            if sums.get(f"words_{subset}"):
                result[f"wer_{subset}"] = 100.0 * sums[f"errors_{subset}"] / sums[
                    f"words_{subset}"]
        return result

    def decode(self, log_probs, out_lengths, utts) -> list[tuple[str, str, str]]:
        return [(utt, " ".join(self.texts["eval"][utt]), " ".join(hyp))
                for utt, hyp in zip(utts, self._decode(log_probs, out_lengths))]


class FrameCEHead:
    """Cross-entropy on Kaldi frame alignments (pdf ids, as ``ali-to-pdf`` writes them).

    ``recipe.data.{train,eval}_alignments`` name a Kaldi table of int vectors: an ``.scp``
    (read lazily: use this for large corpora) or an ``ark`` (binary or text, read into
    memory). Utterances without an alignment are left out, as Kaldi's nnet training does.
    With frame stacking (``recipe.model.subsample`` = k) an output frame covers k input frames
    and is trained on the label of the middle one.
    """

    primary_metric = "frame_acc"
    higher_is_better = True

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.num_targets = cfg.model.num_targets
        self.alignments: dict[str, Any] = {}

    def output_size(self) -> int:
        return self.num_targets

    def load(self, role: str, data) -> list[str]:
        import kaldiio

        path = Path(getattr(self.cfg.data, f"{role}_alignments")).expanduser()
        try:
            table = (kaldiio.load_scp(str(path)) if path.suffix == ".scp"
                     else dict(kaldiio.load_ark(str(path))))
        except Exception as ex:  # noqa: BLE001 - kaldiio raises many kinds on a bad file
            raise UserError(f"cannot read the {role} alignments {path}: {ex}",
                            "give a Kaldi int-vector table of pdf ids (ali-to-pdf ... "
                            f"ark,scp:ali.ark,ali.scp), as recipe.data.{role}_alignments"
                            ) from None
        self.alignments[role] = table
        utts = [utt for utt in data.text if utt in table]
        if not utts:
            raise UserError(f"the {role} alignments {path} cover no utterance of "
                            f"{data.path}", "align this data dir (steps/align_fmllr.sh), "
                            "then ali-to-pdf")
        return utts

    def targets(self, role: str, utt: str, frames: int) -> torch.Tensor:
        labels = np.asarray(self.alignments[role][utt], dtype=np.int64)
        if abs(len(labels) - frames) > FRAME_TOLERANCE:
            raise UserError(f"utterance {utt!r} has {len(labels)} aligned frames but "
                            f"{frames} feature frames", "align with the same frame shift and "
                            "window as the features (10 ms, 25 ms, snip-edges=true)")
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_targets):
            raise UserError(f"utterance {utt!r} has pdf id {labels.max()} outside "
                            f"0..{self.num_targets - 1}", "set recipe.model.num_targets to "
                            "the number of pdfs (tree-info exp/tri4/tree)")
        out = np.full(frames, IGNORE, dtype=np.int64)
        out[:min(frames, len(labels))] = labels[:frames]
        return torch.from_numpy(out)

    def pad_value(self) -> int:
        return IGNORE

    def _output_labels(self, targets: torch.Tensor, out_lengths: torch.Tensor, frames: int
                       ) -> torch.Tensor:
        """Per-frame labels at the model's output rate: the middle input frame of each
        stack of ``subsample`` frames; IGNORE past each utterance's output length."""
        k = self.cfg.model.subsample
        labels = targets[:, k // 2::k][:, :frames]
        if labels.shape[1] < frames:
            labels = F.pad(labels, (0, frames - labels.shape[1]), value=IGNORE)
        past_end = torch.arange(frames, device=labels.device)[None, :] >= out_lengths.to(
            labels.device)[:, None]
        return labels.masked_fill(past_end, IGNORE)

    def _loss_and_hits(self, log_probs, out_lengths, targets
                       ) -> tuple[torch.Tensor, torch.Tensor, int]:
        labels = self._output_labels(targets, out_lengths, log_probs.shape[1])
        loss = F.nll_loss(log_probs.transpose(1, 2), labels, ignore_index=IGNORE,
                          reduction="sum")
        valid = labels != IGNORE
        hits = (log_probs.argmax(-1).eq(labels) & valid).sum()
        return loss, hits, int(valid.sum())

    def loss(self, log_probs, out_lengths, targets, target_lengths) -> torch.Tensor:
        """Mean cross-entropy per aligned frame."""
        loss, _, frames = self._loss_and_hits(log_probs, out_lengths, targets)
        return loss / max(frames, 1)

    def eval_sums(self, log_probs, out_lengths, targets, target_lengths, utts
                  ) -> dict[str, float]:
        loss, hits, frames = self._loss_and_hits(log_probs, out_lengths, targets)
        return {"loss_sum": float(loss), "count": float(frames), "correct": float(hits)}

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        frames = max(sums["count"], 1.0)
        return {"loss": sums["loss_sum"] / frames,
                "frame_acc": 100.0 * sums.get("correct", 0.0) / frames}

    def decode(self, log_probs, out_lengths, utts) -> list[tuple[str, str, str]]:
        return []  # no words without a decoding graph


HEADS = {"ctc": CTCHead, "ce": FrameCEHead}
