"""Speech recipes: swb2000, swb300 (Kaldi data dirs) and spoken_digits (synthesized locally).

All three share one path: a Kaldi data dir -> log-mel fbank cached as ark/scp (or the dir's
own feats.scp) -> per-speaker mean normalisation -> BLSTM with a CTC head over characters ->
greedy (or beam) decoding -> WER overall and on the Hub5'00 subsets. Features are prepared
once by the launching process (:meth:`SpeechRecipe.prepare`); ranks read the cache lazily, so
a corpus larger than memory works.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from runner.config.section import require
from runner.errors import UserError
from runner.lazy import torch
from runner.recipe import RECIPES, Recipe, RecipeConfig

from .decoding import DecodeConfig
from .heads import HEADS


@dataclass
class SpeechDataConfig:
    train: Optional[str] = None
    eval: Optional[str] = None
    cache_dir: Optional[str] = None
    sample_rate: int = 16000
    prepare_workers: int = 1  # processes that compute features
    train_alignments: Optional[str] = None  # model.head=ce: Kaldi pdf-id alignments
    eval_alignments: Optional[str] = None


@dataclass
class SynthConfig:
    num_train: int = 2000
    num_eval: int = 200
    train_speakers: int = 64
    eval_speakers: int = 8
    seed: int = 0


@dataclass
class AugmentConfig:
    """SpecAugment-style masking of the training features (eval is never augmented)."""
    freq_masks: int = 0  # bands of mel bins set to the (normalised) mean, per utterance
    freq_width: int = 8  # each band is up to this many bins wide
    time_masks: int = 0  # spans of frames masked the same way
    time_width: float = 0.05  # each span covers up to this fraction of the utterance


@dataclass
class FeatureConfig:
    num_mel_bins: int = 40
    deltas: int = 0  # 0, or 2 for deltas and delta-deltas


@dataclass
class SpeechModelConfig:
    num_layers: int = 6
    hidden_size: int = 512
    bottleneck: int = 256
    subsample: int = 2
    dropout: float = 0.0
    head: str = "ctc"  # ctc: characters, WER; ce: Kaldi pdf ids from alignments, frame acc.
    num_targets: Optional[int] = None  # head=ce: the number of pdfs


@dataclass
class SpeechConfig(RecipeConfig):
    name: str = "swb2000"
    data: SpeechDataConfig = field(default_factory=SpeechDataConfig)
    synth: SynthConfig = field(default_factory=SynthConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    model: SpeechModelConfig = field(default_factory=SpeechModelConfig)
    text_normalization: str = "switchboard"  # switchboard | none
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    examples: int = 4

    def check(self, prefix, cfg):
        require(self.features.deltas in (0, 1, 2), f"{prefix}.features.deltas",
                f"must be 0, 1 or 2, got {self.features.deltas}", f"{prefix}.features.deltas=2")
        require(self.model.num_layers >= 1 and self.model.hidden_size >= 1,
                f"{prefix}.model", "num_layers and hidden_size must be >= 1",
                f"{prefix}.model.num_layers=6 {prefix}.model.hidden_size=512")
        require(self.model.subsample >= 1, f"{prefix}.model.subsample", "must be >= 1",
                f"{prefix}.model.subsample=2")
        require(self.text_normalization in ("switchboard", "none"),
                f"{prefix}.text_normalization", f"unknown {self.text_normalization!r}",
                f"{prefix}.text_normalization=switchboard")
        require(self.data.sample_rate > 0, f"{prefix}.data.sample_rate", "must be > 0",
                f"{prefix}.data.sample_rate=16000")
        require(self.data.prepare_workers >= 1, f"{prefix}.data.prepare_workers",
                "must be >= 1", f"{prefix}.data.prepare_workers=4")
        require(0 <= self.augment.freq_width <= self.features.num_mel_bins,
                f"{prefix}.augment.freq_width", f"must be between 0 and "
                f"features.num_mel_bins={self.features.num_mel_bins}",
                f"{prefix}.augment.freq_width=8")
        require(0 <= self.augment.time_width < 1, f"{prefix}.augment.time_width",
                "must be in [0, 1)", f"{prefix}.augment.time_width=0.05")
        self.decode.check(f"{prefix}.decode")
        require(self.model.head in HEADS, f"{prefix}.model.head",
                f"must be one of {', '.join(HEADS)}, got {self.model.head!r}",
                f"{prefix}.model.head=ctc")
        if self.model.head == "ce":
            require(bool(self.model.num_targets) and self.model.num_targets > 1,
                    f"{prefix}.model.num_targets", "head=ce needs the number of pdfs",
                    f"{prefix}.model.num_targets=N with N from `tree-info exp/tri4/tree`")
            for role in ("train", "eval"):
                path = getattr(self.data, f"{role}_alignments")
                require(bool(path) and Path(path).expanduser().is_file(),
                        f"{prefix}.data.{role}_alignments",
                        f"head=ce needs {role} alignments, got {path!r}",
                        f"{prefix}.data.{role}_alignments=ALI.scp (ali-to-pdf output)")


def cache_root(cfg: SpeechConfig) -> Path:
    root = cfg.data.cache_dir or os.environ.get("ADPSGD_CACHE") or "~/.cache/adpsgd"
    return Path(root).expanduser()


class Utterances:
    """(utterance id, normalised features, targets) read lazily from a feats.scp; the targets
    come from the model's head (characters of the transcript, or aligned frame labels). A
    damaged ark is found only here, while training reads it: ``damaged_fix`` is the fix its
    error names (it depends on who wrote the features). A map-style dataset (``__len__`` and
    ``__getitem__``), not a subclass of torch's ``Dataset``, so that the launcher, which
    imports this module to check a command line, does not import torch."""

    def __init__(self, feats_scp: Path, cmvn_scp: Path | None, utt2spk: dict[str, str],
                 utts: list[str], targets: Callable[[str, int], torch.Tensor], damaged_fix: str):
        import kaldiio

        self.feats_scp, self.damaged_fix = feats_scp, damaged_fix
        self.feats = kaldiio.load_scp(str(feats_scp))
        self.cmvn = dict(kaldiio.load_scp(str(cmvn_scp))) if cmvn_scp else {}
        self.utt2spk, self.targets = utt2spk, targets
        self.utts = sorted(u for u in utts if u in self.feats)

    def __len__(self) -> int:
        return len(self.utts)

    def __getitem__(self, index: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        from .features import read_feature_matrix

        utt = self.utts[index]
        feats = torch.from_numpy(read_feature_matrix(self.feats, utt, self.feats_scp,
                                                     self.damaged_fix))
        stats = self.cmvn.get(self.utt2spk.get(utt, utt))
        if stats is not None:  # Kaldi cmvn stats: row 0 = sums | count (mean normalisation)
            stats = torch.tensor(stats, dtype=torch.float64)
            feats = feats - (stats[0, :-1] / stats[0, -1]).float()
        return utt, feats, self.targets(utt, len(feats))


def spec_augment(feats: torch.Tensor, lengths: torch.Tensor, cfg: AugmentConfig,
                 num_mel_bins: int) -> torch.Tensor:
    """A copy of ``feats`` (batch, frames, dim) with random mel bands and time spans of every
    utterance set to 0, the mean of mean-normalised features (SpecAugment without time
    warping). With deltas (dim = k * num_mel_bins) a band is masked in every block."""
    out = feats.clone()
    blocks = out.view(*out.shape[:2], -1, num_mel_bins)
    for i, frames in enumerate(lengths.tolist()):
        for _ in range(cfg.freq_masks):
            width = int(torch.randint(0, cfg.freq_width + 1, ()))
            start = int(torch.randint(0, num_mel_bins - width + 1, ()))
            blocks[i, :, :, start:start + width] = 0.0
        longest = int(cfg.time_width * frames)
        for _ in range(cfg.time_masks):
            width = int(torch.randint(0, longest + 1, ()))
            start = int(torch.randint(0, frames - width + 1, ()))
            out[i, start:start + width] = 0.0
    return out


class SpeechRecipe(Recipe):
    Config = SpeechConfig
    primary_metric = "wer"
    higher_is_better = False

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.head = HEADS[cfg.model.head](cfg)
        self.primary_metric = self.head.primary_metric
        self.higher_is_better = self.head.higher_is_better

    # ---- data ---------------------------------------------------------------------------
    def data_dirs(self) -> tuple[Path, Path]:
        data = self.cfg.data
        for role, path in (("train", data.train), ("eval", data.eval)):
            if not path:
                raise UserError(f"recipe {self.cfg.name}: no {role} data dir given",
                                f"set recipe.data.{role}=DIR, a Kaldi data dir (see "
                                "docs/speech-data.md for preparing it with Kaldi or lhotse)")
        return Path(data.train).expanduser(), Path(data.eval).expanduser()

    def check_data(self) -> None:
        from .kaldi_data import load_data_dir

        for role, path in zip(("train", "eval"), self.data_dirs()):
            if not path.is_dir():
                raise UserError(f"recipe {self.cfg.name}: {role} data dir {path} does not "
                                "exist", f"prepare it (docs/speech-data.md) and set "
                                f"recipe.data.{role}={path}")
            load_data_dir(path, role=role)

    def feature_dir(self, data_dir: Path) -> Path:
        """Where the features of ``data_dir`` are cached: keyed by the dir and the options."""
        key = json.dumps([str(data_dir.resolve()), self.cfg.features.num_mel_bins,
                          self.cfg.features.deltas, self.cfg.data.sample_rate])
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        return cache_root(self.cfg) / "features" / f"{data_dir.name}-{digest}"

    def _fbank_options(self):
        from .features import FbankOptions

        f = self.cfg.features
        return FbankOptions(num_mel_bins=f.num_mel_bins, deltas=f.deltas,
                            sample_rate=self.cfg.data.sample_rate)

    def _feature_files(self, data_dir: Path) -> tuple[Path, Path | None]:
        """(feats.scp, cmvn.scp): the data dir's own when it has them (Kaldi-computed)."""
        if (data_dir / "feats.scp").exists():
            cmvn = data_dir / "cmvn.scp"
            return data_dir / "feats.scp", cmvn if cmvn.exists() else None
        out = self.feature_dir(data_dir)
        return out / "feats.scp", out / "cmvn.scp"

    def prepare_stages(self):
        return [(f"features of the {role} set", lambda role=role, path=path:
                 self._prepare_features(role, path))
                for role, path in zip(("train", "eval"), self.data_dirs())]

    def _prepare_features(self, role: str, path: Path) -> None:
        from .features import prepare_features
        from .kaldi_data import load_data_dir

        if (path / "feats.scp").exists():
            print(f"{path} has its own feats.scp; nothing to compute")
            return
        out = self.feature_dir(path)
        prepare_features(load_data_dir(path, role=role), out, self._fbank_options(),
                         num_workers=self.cfg.data.prepare_workers, role=role)
        print(f"{role} features in {out}")

    def _dataset(self, data_dir: Path, role: str) -> Utterances:
        from .kaldi_data import load_data_dir

        data = load_data_dir(data_dir, role=role)
        feats, cmvn = self._feature_files(data_dir)
        if not feats.exists():
            raise UserError(f"recipe {self.cfg.name}: features of {data_dir} are not prepared",
                            "start the job with adpsgd-run, which prepares them first")
        utts = self.head.load(role, data)
        if feats.parent == data_dir:  # Kaldi's features, or an export's
            damaged_fix = (f"recompute them (Kaldi's steps/make_fbank.sh), or delete {feats} "
                           "so that adpsgd-run computes features from the audio")
        else:
            damaged_fix = f"delete {feats.parent}; adpsgd-run then computes the features again"
        dataset = Utterances(feats, cmvn, dict(data.utt2spk), utts,
                             lambda utt, frames: self.head.targets(role, utt, frames),
                             damaged_fix)
        if len(dataset) == 0:
            raise UserError(f"recipe {self.cfg.name}: {role} set {data_dir} has no "
                            "utterances with features", f"check {data_dir}/text and rerun")
        return dataset

    def datasets(self):
        train_dir, eval_dir = self.data_dirs()
        return self._dataset(train_dir, "train"), self._dataset(eval_dir, "eval")

    def collate(self, samples):
        utts, feats, targets = zip(*samples)
        return (torch.nn.utils.rnn.pad_sequence(list(feats), batch_first=True),
                torch.tensor([len(f) for f in feats]),
                torch.nn.utils.rnn.pad_sequence(list(targets), batch_first=True,
                             padding_value=self.head.pad_value()),
                torch.tensor([len(t) for t in targets]),
                list(utts))

    def to_device(self, batch, device, dtype):
        feats, lengths, tokens, token_lengths, utts = batch
        return (feats.to(device, dtype, non_blocking=True), lengths, tokens.to(device),
                token_lengths, utts)

    # ---- model and loss -----------------------------------------------------------------
    def input_dim(self) -> int:
        return self.cfg.features.num_mel_bins * (1 + self.cfg.features.deltas)

    def build_model(self):
        from .model import BLSTMAcousticModel  # a subclass of nn.Module: imports torch

        m = self.cfg.model
        return BLSTMAcousticModel(self.input_dim(), self.head.output_size(), m.num_layers,
                                  m.hidden_size, m.bottleneck, m.subsample, m.dropout)

    def _forward(self, model, batch):
        feats, lengths, targets, target_lengths, utts = batch
        log_probs, out_lengths = model(feats, lengths.to(feats.device))
        return log_probs, out_lengths, targets, target_lengths, utts

    def loss(self, model, batch):
        if self.cfg.augment.freq_masks or self.cfg.augment.time_masks:
            batch = (spec_augment(batch[0], batch[1], self.cfg.augment,
                                  self.cfg.features.num_mel_bins), *batch[1:])
        return self.head.loss(*self._forward(model, batch)[:4])

    def eval_sums(self, model, batch):
        return self.head.eval_sums(*self._forward(model, batch))

    def metrics(self, sums):
        return self.head.metrics(sums)

    def decode(self, model, batch):
        log_probs, out_lengths, _, _, utts = self._forward(model, batch)
        return self.head.decode(log_probs, out_lengths, utts)

    def examples(self, model, batch):
        return self.decode(model, batch)[:self.cfg.examples]


@RECIPES.register("swb2000")
class Switchboard2000(SpeechRecipe):
    pass


@RECIPES.register("swb300")
class Switchboard300(SpeechRecipe):
    pass


@RECIPES.register("spoken_digits")
class SpokenDigits(SpeechRecipe):
    """Connected digit strings synthesized locally (recipes/speech/synth.py) into a Kaldi data
    dir, unless ``recipe.data.train``/``eval`` point at other dirs."""

    def corpus_dir(self) -> Path:
        s = self.cfg.synth
        return (cache_root(self.cfg) / "spoken_digits" /
                f"{s.num_train}-{s.num_eval}-spk{s.train_speakers}-{s.eval_speakers}-seed{s.seed}")

    def data_dirs(self) -> tuple[Path, Path]:
        if self.cfg.data.train or self.cfg.data.eval:
            return super().data_dirs()
        return self.corpus_dir() / "train", self.corpus_dir() / "eval"

    def check_data(self) -> None:
        if self.cfg.data.train or self.cfg.data.eval:
            super().check_data()

    def prepare_stages(self):
        if self.cfg.data.train or self.cfg.data.eval:
            return super().prepare_stages()
        return [("synthesize the corpus", self._synthesize), *super().prepare_stages()]

    def _synthesize(self) -> None:
        from .synth import synthesize_corpus

        s = self.cfg.synth
        summary = synthesize_corpus(self.corpus_dir(), s.num_train, s.num_eval, seed=s.seed,
                                    train_speakers=s.train_speakers,
                                    eval_speakers=s.eval_speakers)
        state = "cached" if summary.get("cached") else f"built in {summary['seconds']:.0f} s"
        print(f"spoken digits corpus in {self.corpus_dir()} ({state})")
