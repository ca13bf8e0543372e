"""BLSTM acoustic model with a CTC head over characters (tokens: recipes/speech/tokens.py).

Shape of the IBM Switchboard models (docs/algorithms.md, H-ADPSGD; a reconstruction): ``num_layers``
bidirectional LSTM layers of ``hidden_size`` cells per direction, a linear bottleneck, then the
output layer. The papers' output is a 32,000-way softmax over context-dependent HMM states
trained on Kaldi alignments; here the output is CTC over characters, so that word error rate is
measured end to end without a decoding graph. ``subsample`` stacks that many consecutive frames
into one (and drops the rest), which shortens the sequences the LSTM runs over.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class BLSTMAcousticModel(nn.Module):
    def __init__(self, input_dim: int, vocab_size: int, num_layers: int = 6,
                 hidden_size: int = 512, bottleneck: int = 256, subsample: int = 1,
                 dropout: float = 0.0):
        super().__init__()
        self.subsample = subsample
        self.lstm = nn.LSTM(input_dim * subsample, hidden_size, num_layers=num_layers,
                            bidirectional=True, batch_first=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.bottleneck = nn.Linear(2 * hidden_size, bottleneck)
        self.output = nn.Linear(bottleneck, vocab_size)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return torch.div(lengths, self.subsample, rounding_mode="floor").clamp(min=1)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, frames, dim) features -> (batch, frames', vocab) log-probabilities and
        their lengths."""
        if self.subsample > 1:
            batch, frames, dim = feats.shape
            frames -= frames % self.subsample
            if frames == 0:  # shorter than one stacked frame: pad to one
                feats = nn.functional.pad(feats, (0, 0, 0, self.subsample - feats.shape[1]))
                frames = self.subsample
            feats = feats[:, :frames].reshape(batch, frames // self.subsample,
                                              dim * self.subsample)
        out_lengths = self.output_lengths(lengths)
        packed = pack_padded_sequence(feats, out_lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        hidden, _ = self.lstm(packed)
        hidden, _ = pad_packed_sequence(hidden, batch_first=True)
        logits = self.output(self.bottleneck(hidden))
        return logits.log_softmax(dim=-1), out_lengths


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
