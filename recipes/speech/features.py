"""Kaldi-compatible log-mel filterbank features, CMVN and a rerunnable on-disk feature cache.

Features are computed with ``torchaudio.compliance.kaldi.fbank``, which reimplements Kaldi's
``compute-fbank-feats``; the tables are written as Kaldi ark/scp files with kaldiio, so the
cache can be inspected with Kaldi's own tools (``copy-feats``, ``apply-cmvn``) and a Kaldi
``feats.scp``/``cmvn.scp`` can be loaded in its place.

Two choices differ from Kaldi's defaults, on purpose:

* ``dither`` is 0 (Kaldi: 1.0). Dither adds random noise, so the same audio would give
  different features on every run and a cached result could not be reproduced; with 0 the
  features are a pure function of the audio and the options.
* ``energy_floor`` is Kaldi's 0.0 (torchaudio's default is 1.0); it only matters with
  ``use_energy=True``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import multiprocessing
import os
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import kaldiio
import numpy as np
import torch
import torchaudio
import torchaudio.compliance.kaldi as kaldi
import torchaudio.functional as AF

from runner.errors import UserError, one_line

from .kaldi_data import KaldiDataDir, audio_identity, load_data_dir

log = logging.getLogger(__name__)

# Bump when the computation changes in a way the options do not capture, so old caches are
# recomputed instead of silently reused.
FORMAT_VERSION = 1
STAMP = "prepared.json"
OUTPUTS = ("feats.ark", "feats.scp", "cmvn.ark", "cmvn.scp")
# Kaldi reads 16-bit PCM samples as their integer values; soundfile returns them divided by
# 2**15. Multiplying back makes the log energies (and so the features) match Kaldi's exactly.
INT16_SCALE = 32768.0
# Kaldi's apply-cmvn floors variances here before taking 1/sqrt.
VAR_FLOOR = 1e-20
CHUNK_UTTERANCES = 32  # utterances per worker task: large enough to amortise the pickling
# What kaldiio raises for a truncated, overwritten or missing ark (seen on damaged arks): its
# readers assert on short reads and hand malformed headers to struct and numpy.
ARK_READ_ERRORS = (AssertionError, EOFError, OSError, RuntimeError, ValueError)
RECOMPUTE_FIX = "recompute the features (delete the features directory to force it)"


@dataclass(frozen=True)
class FbankOptions:
    """Options of ``compute-fbank-feats`` (names follow torchaudio/Kaldi) plus deltas.

    ``deltas`` is Kaldi's ``add-deltas --delta-order``: 0 (static only), 1 or 2 (static,
    delta and delta-delta: 3 x ``num_mel_bins`` dims, 120 for 40 bins).
    """

    num_mel_bins: int = 40
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0
    sample_rate: int = 16000
    deltas: int = 0
    low_freq: float = 20.0
    high_freq: float = 0.0  # <= 0: offset from the Nyquist frequency, as in Kaldi
    preemphasis_coefficient: float = 0.97
    window_type: str = "povey"
    use_energy: bool = False
    energy_floor: float = 0.0
    snip_edges: bool = True

    def check(self) -> None:
        """Raise a UserError for option values Kaldi would reject."""
        problems = [
            (self.num_mel_bins >= 1, "num_mel_bins", "must be >= 1", "num_mel_bins=40"),
            (self.sample_rate > 0, "sample_rate", "must be positive", "sample_rate=16000"),
            (0 < self.frame_shift_ms <= self.frame_length_ms, "frame_shift_ms",
             "must be positive and at most frame_length_ms", "frame_shift_ms=10"),
            (self.deltas in (0, 1, 2), "deltas", "must be 0, 1 or 2",
             "deltas=2 for deltas and delta-deltas, or 0"),
            (self.dither >= 0, "dither", "must be >= 0", "dither=0"),
            (self.window_samples >= 2, "frame_length_ms", "gives less than 2 samples per frame",
             "frame_length_ms=25"),
            (self.window_type in ("povey", "hamming", "hanning", "rectangular", "blackman"),
             "window_type", "must be povey, hamming, hanning, rectangular or blackman",
             "window_type=povey"),
        ]
        for ok, name, problem, fix in problems:
            if not ok:
                # The recipes read these from recipe.features.*, except the audio's rate.
                section = "recipe.data" if name == "sample_rate" else "recipe.features"
                raise UserError(f"{section}.{name}={getattr(self, name)!r} {problem}",
                                f"set {section}.{fix}")

    @property
    def window_samples(self) -> int:
        """Samples per frame, truncated as Kaldi's FrameExtractionOptions does."""
        return int(self.sample_rate * 0.001 * self.frame_length_ms)

    @property
    def feature_dim(self) -> int:
        """Dimension of one output frame, deltas included."""
        return (self.num_mel_bins + int(self.use_energy)) * (self.deltas + 1)


def _as_waveform(waveform: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(1, samples) float32 on Kaldi's integer scale."""
    wav = torch.as_tensor(np.asarray(waveform) if not isinstance(waveform, torch.Tensor)
                          else waveform)
    if wav.dim() == 2 and wav.shape[0] == 1:
        wav = wav[0]
    if wav.dim() != 1:
        raise ValueError(f"expected mono audio of shape (samples,) or (1, samples), "
                         f"got {tuple(wav.shape)}")
    # Integer PCM is already on Kaldi's scale; float audio in [-1, 1] is not.
    scale = 1.0 if not wav.is_floating_point() else INT16_SCALE
    return (wav.to(torch.float32) * scale).unsqueeze(0)


def compute_fbank(waveform: np.ndarray | torch.Tensor, opts: FbankOptions | None = None
                  ) -> torch.Tensor:
    """Log-mel filterbank features (frames, ``opts.feature_dim``) of one mono waveform.

    Float input is taken to be in [-1, 1] (as soundfile returns it) and multiplied by 32768
    first, because Kaldi reads 16-bit samples as integers: without the scaling every log
    energy would be off by log(32768**2) and the features would not match Kaldi's. Integer
    input (e.g. int16) is used as is. ``opts.sample_rate`` must be the waveform's rate.
    """
    opts = opts or FbankOptions()
    wav = _as_waveform(waveform)
    if wav.shape[1] < opts.window_samples:
        raise ValueError(f"{wav.shape[1]} samples is shorter than one {opts.frame_length_ms} ms "
                         f"frame ({opts.window_samples} samples)")
    feats = kaldi.fbank(
        wav, num_mel_bins=opts.num_mel_bins, frame_length=opts.frame_length_ms,
        frame_shift=opts.frame_shift_ms, dither=opts.dither,
        sample_frequency=float(opts.sample_rate), low_freq=opts.low_freq,
        high_freq=opts.high_freq, preemphasis_coefficient=opts.preemphasis_coefficient,
        window_type=opts.window_type, use_energy=opts.use_energy,
        energy_floor=opts.energy_floor, snip_edges=opts.snip_edges)
    return add_deltas(feats, opts.deltas)


def add_deltas(feats: torch.Tensor, order: int) -> torch.Tensor:
    """Append ``order`` orders of deltas (5-frame regression windows, as Kaldi's add-deltas
    with --delta-window=2): (frames, D) -> (frames, D * (order + 1)).

    Away from the ends this equals Kaldi; within two frames of either end Kaldi pads the static
    features for every order while this pads each delta stream, so values there differ slightly.
    """
    streams = [feats]
    for _ in range(order):
        # compute_deltas differentiates along the last axis, so time goes last.
        streams.append(AF.compute_deltas(streams[-1].T, win_length=5).T)
    return torch.cat(streams, dim=1) if order else feats


def _to_numpy64(mat: torch.Tensor | np.ndarray) -> np.ndarray:
    return (mat.detach().cpu().numpy() if isinstance(mat, torch.Tensor) else
            np.asarray(mat)).astype(np.float64)


def _accumulate(stats: np.ndarray | None, mat: np.ndarray) -> np.ndarray:
    """Add one utterance to Kaldi CMVN stats: row 0 = sums | count, row 1 = squares | 0."""
    if stats is None:
        stats = np.zeros((2, mat.shape[1] + 1), dtype=np.float64)
    stats[0, :-1] += mat.sum(axis=0)
    stats[0, -1] += mat.shape[0]
    stats[1, :-1] += (mat * mat).sum(axis=0)
    return stats


def compute_cmvn_stats(feats: Mapping[str, torch.Tensor | np.ndarray],
                       utt2spk: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Kaldi CMVN stats (float64, shape (2, D + 1)) per speaker, or per utterance without
    ``utt2spk`` (compute-cmvn-stats with and without --spk2utt)."""
    stats: dict[str, np.ndarray] = {}
    for utt, mat in feats.items():
        key = _speaker(utt, utt2spk, "utt2spk")
        stats[key] = _accumulate(stats.get(key), _to_numpy64(mat))
    return dict(sorted(stats.items()))


def _speaker(utt: str, utt2spk: Mapping[str, str] | None, source: str) -> str:
    if utt2spk is None:
        return utt
    if utt not in utt2spk:
        raise UserError(f"utterance {utt!r} has features but no speaker in {source}",
                        "use the utt2spk of the data dir the features were computed from")
    return utt2spk[utt]


def _load_cmvn_scp(cmvn_scp: str | os.PathLike) -> dict[str, np.ndarray]:
    path = Path(cmvn_scp)
    if not path.is_file():
        raise UserError(f"CMVN stats {path} do not exist",
                        "compute them (prepare_features, or Kaldi's steps/compute_cmvn_stats.sh)")
    try:
        return {key: np.asarray(mat, dtype=np.float64)
                for key, mat in kaldiio.load_scp(str(path)).items()}
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot read CMVN stats from {path}: {one_line(str(exc))}",
                        "recompute them (prepare_features, or steps/compute_cmvn_stats.sh)"
                        ) from None


def apply_cmvn(feats: Mapping[str, torch.Tensor | np.ndarray],
               cmvn: Mapping[str, np.ndarray] | str | os.PathLike,
               utt2spk: Mapping[str, str] | None = None,
               norm_vars: bool = False) -> dict[str, torch.Tensor]:
    """Kaldi's apply-cmvn: subtract the speaker's (or, without ``utt2spk``, the utterance's)
    mean, and with ``norm_vars`` also divide by its standard deviation.

    ``cmvn`` is a dict of (2, D + 1) stats or the path of a Kaldi ``cmvn.scp`` (read with
    kaldiio; row 0 holds the sums with the frame count in the last column).
    """
    source = str(cmvn) if isinstance(cmvn, (str, os.PathLike)) else "the CMVN stats"
    stats = _load_cmvn_scp(cmvn) if isinstance(cmvn, (str, os.PathLike)) else cmvn
    out: dict[str, torch.Tensor] = {}
    for utt, mat in feats.items():
        key = _speaker(utt, utt2spk, "utt2spk")
        if key not in stats:
            raise UserError(f"no CMVN stats for {key!r} (utterance {utt!r}) in {source}",
                            "compute the stats with the same utt2spk as the features")
        st = np.asarray(stats[key], dtype=np.float64)
        x = _to_numpy64(mat)
        if st.shape != (2, x.shape[1] + 1):
            raise UserError(f"CMVN stats of {key!r} in {source} have shape {st.shape}, but "
                            f"utterance {utt!r} has {x.shape[1]}-dim features",
                            "recompute the stats from these features")
        count = st[0, -1]
        if count < 1:
            raise UserError(f"CMVN stats of {key!r} in {source} count {count} frames",
                            "recompute the stats; every speaker needs at least one frame")
        mean = st[0, :-1] / count
        if norm_vars:
            var = np.maximum(st[1, :-1] / count - mean * mean, VAR_FLOOR)
            x = (x - mean) / np.sqrt(var)
        else:
            x = x - mean
        out[utt] = torch.from_numpy(x.astype(np.float32))
    return out


def speaker_mean_normalize(feats: Mapping[str, torch.Tensor | np.ndarray],
                           utt2spk: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """Per-speaker mean subtraction (apply-cmvn --norm-vars=false with speaker stats): after
    it, the frames of each speaker average to zero in every dimension."""
    return apply_cmvn(feats, compute_cmvn_stats(feats, utt2spk), utt2spk)


def inputs_digest(data: KaldiDataDir) -> str:
    """SHA-256 of everything in the data dir the features depend on: per utterance its id,
    transcript, speaker, segment and wav.scp entry, and the size and modification time of the
    audio files it reads (their contents are not hashed: too slow for thousands of hours), so
    that audio replaced in place is computed again, and checked again (its sample rate)."""
    digest = hashlib.sha256()
    audio: dict[str, list] = {}  # per recording: several segments share one file
    for utt in data.utterances:
        rec = data.recording_of(utt)
        if rec not in audio:
            audio[rec] = audio_identity(data.wav_scp[rec])
        seg = list(data.segments[utt]) if data.segments is not None else None
        row = [utt, data.text[utt], data.utt2spk[utt], rec, data.wav_scp[rec], seg, audio[rec]]
        digest.update(json.dumps(row, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def _features_of(data: KaldiDataDir, utt: str, opts: FbankOptions) -> np.ndarray:
    audio, rate = data.read_audio(utt, opts.sample_rate)
    if len(audio) < opts.window_samples:
        raise UserError(f"utterance {utt!r} of {data.path} is {len(audio) / rate:.3f} s long, "
                        f"shorter than one {opts.frame_length_ms:g} ms frame",
                        "drop it from text (Kaldi's make_fbank.sh skips such utterances and "
                        "utils/fix_data_dir.sh then removes them)")
    return compute_fbank(audio, opts).numpy()


_WORKER: tuple[KaldiDataDir, FbankOptions] | None = None


def _init_worker(data: KaldiDataDir, opts: FbankOptions) -> None:
    global _WORKER
    _WORKER = (data, opts)
    # One intra-op thread per worker: the workers are the parallelism.
    torch.set_num_threads(1)


def _compute_chunk(utts: list[str]) -> list[tuple[str, np.ndarray]]:
    assert _WORKER is not None, "worker not initialised"
    data, opts = _WORKER
    return [(utt, _features_of(data, utt, opts)) for utt in utts]


def _iter_features(data: KaldiDataDir, opts: FbankOptions, num_workers: int
                   ) -> Iterator[tuple[str, np.ndarray]]:
    """(utterance, features) in utterance order, from this process or from worker processes."""
    utts = data.utterances
    if num_workers <= 1:
        for utt in utts:
            yield utt, _features_of(data, utt, opts)
        return
    chunks = iter([utts[i:i + CHUNK_UTTERANCES] for i in range(0, len(utts), CHUNK_UTTERANCES)])
    # spawn, not fork: forking after torch has started its thread pools can deadlock.
    pool = ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(data, opts))
    try:
        # A bounded window of tasks in flight keeps finished-but-unwritten features from
        # piling up in memory when one chunk is slow.
        pending: deque[Future] = deque(pool.submit(_compute_chunk, chunk)
                                       for _, chunk in zip(range(2 * num_workers), chunks))
        while pending:
            done = pending.popleft().result()
            nxt = next(chunks, None)
            if nxt is not None:
                pending.append(pool.submit(_compute_chunk, nxt))
            yield from done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Serialise preparations of one cache dir: when several ranks prepare the same features,
    the first computes them and the others wait, then find them current."""
    with open(out / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _expected_stamp(data: KaldiDataDir, opts: FbankOptions, out: Path) -> dict:
    return {"format_version": FORMAT_VERSION, "torchaudio": torchaudio.__version__,
            "options": asdict(opts), "inputs_sha256": inputs_digest(data),
            "out_dir": str(out)}


def _is_current(out: Path, expected: dict) -> bool:
    """Whether a finished preparation with the same inputs and options is in ``out``; the
    recorded output sizes catch outputs replaced or truncated since."""
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or any(stamp.get(k) != v for k, v in expected.items()):
        return False
    sizes = stamp.get("outputs", {})
    for name in OUTPUTS:
        try:
            if (out / name).stat().st_size != sizes.get(name):
                return False
        except OSError:
            return False
    return True


def _write_table(fd, key: str, mat: np.ndarray, final_ark: Path) -> str:
    """Append one matrix to an open ark; return its scp line, which points at the ark's final
    name (the ark is being written under a temporary one)."""
    start = fd.tell()
    kaldiio.save_ark(fd, {key: mat})
    # kaldiio writes "<key> " and then the matrix; scp offsets point just past the space.
    return f"{key} {final_ark}:{start + len((key + ' ').encode())}\n"


def _fsync(handle) -> None:
    """Flush to disk before the rename, so that a crash cannot leave a renamed but empty file."""
    handle.flush()
    os.fsync(handle.fileno())


def _compute(data: KaldiDataDir, opts: FbankOptions, out: Path, num_workers: int) -> dict:
    tmp = {name: out / f".{name}.tmp{os.getpid()}" for name in OUTPUTS}
    started = time.monotonic()
    try:
        stats: dict[str, np.ndarray] = {}
        frames = 0
        with ExitStack() as stack:
            files = {name: stack.enter_context(open(tmp[name], "wb" if name.endswith("ark")
                                                    else "w"))
                     for name in OUTPUTS}
            for handle in files.values():
                stack.callback(_fsync, handle)  # runs before the file closes
            for i, (utt, mat) in enumerate(_iter_features(data, opts, num_workers), 1):
                files["feats.scp"].write(_write_table(files["feats.ark"], utt, mat,
                                                      out / "feats.ark"))
                spk = data.utt2spk[utt]
                stats[spk] = _accumulate(stats.get(spk), mat.astype(np.float64))
                frames += mat.shape[0]
                if i % 1000 == 0:
                    log.info("features: %d/%d utterances", i, len(data.text))
            for spk in sorted(stats):
                files["cmvn.scp"].write(_write_table(files["cmvn.ark"], spk, stats[spk],
                                                     out / "cmvn.ark"))
        # Arks before scps: a reader never sees an scp pointing into a not-yet-final ark.
        for name in OUTPUTS:
            os.replace(tmp[name], out / name)
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    seconds = time.monotonic() - started
    log.info("features: %d utterances, %d frames in %.1f s -> %s", len(data.text), frames,
             seconds, out)
    return {"outputs": {name: (out / name).stat().st_size for name in OUTPUTS},
            "num_utterances": len(data.text), "num_speakers": len(stats),
            "num_frames": frames, "feature_dim": opts.feature_dim}


def prepare_features(data_dir: KaldiDataDir | str | os.PathLike, out_dir: str | os.PathLike,
                     opts: FbankOptions | None = None, num_workers: int = 1,
                     role: str = "data") -> Path:
    """Compute fbank features of every utterance into ``out_dir`` and return its feats.scp.

    Writes ``feats.ark``/``feats.scp`` (keyed by utterance), ``cmvn.ark``/``cmvn.scp``
    (per-speaker Kaldi CMVN stats) and ``prepared.json``, a stamp of the options and of
    :func:`inputs_digest`. A rerun with the same inputs and options only re-reads the data dir
    and returns; anything else recomputes. The old stamp is removed first and the new one
    written last, and every file is written under a temporary name and renamed, so an
    interrupted run never leaves a cache that looks complete. ``num_workers`` > 1 computes in
    that many processes.
    """
    opts = opts or FbankOptions()
    opts.check()
    data = data_dir if isinstance(data_dir, KaldiDataDir) else load_data_dir(data_dir, role)
    out = Path(out_dir).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the features directory {out}: {exc.strerror}",
                        "set recipe.data.cache_dir to a writable directory") from None
    expected = _expected_stamp(data, opts, out)
    with _locked(out):
        if _is_current(out, expected):
            log.info("features in %s are current; nothing to do", out)
            return out / "feats.scp"
        (out / STAMP).unlink(missing_ok=True)
        for stale in out.glob(".*.tmp*"):  # left by a run that was killed
            stale.unlink(missing_ok=True)
        data.validate(check_audio_files=True)
        stamp = {**expected, "data_dir": str(data.path.resolve()),
                 **_compute(data, opts, out, num_workers)}
        tmp = out / f".{STAMP}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, out / STAMP)
    return out / "feats.scp"


def read_feature_matrix(table: Mapping[str, object], utt: str, feats_scp: Path, fix: str
                        ) -> np.ndarray:
    """One utterance's features from a kaldiio table of ``feats_scp`` as a float32 copy. A
    damaged ark is a UserError naming the utterance and the list, whatever kaldiio raised
    (an empty AssertionError for a truncated ark says nothing by itself)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # kaldiio warns before re-raising: one line is enough
            return np.array(table[utt], dtype=np.float32)
    except ARK_READ_ERRORS as exc:
        detail = one_line(str(exc))
        reason = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        raise UserError(f"cannot read the features of utterance {utt!r} listed in {feats_scp}: "
                        f"the ark is truncated or corrupt ({reason})", fix) from None


def load_features(feats_scp: str | os.PathLike, cmvn_scp: str | os.PathLike | None = None,
                  utt2spk: Mapping[str, str] | None = None, norm_vars: bool = False,
                  utterances: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """Features of a Kaldi feats.scp as float32 (frames, dim) tensors, sorted by utterance.

    With ``cmvn_scp`` the stats are applied (per speaker through ``utt2spk``, else keyed by
    utterance, as apply-cmvn does). ``utterances`` restricts what is loaded.
    """
    path = Path(feats_scp)
    if not path.is_file():
        raise UserError(f"feature list {path} does not exist",
                        "compute features first (prepare_features, or Kaldi's "
                        "steps/make_fbank.sh)")
    try:
        table = kaldiio.load_scp(str(path))
        keys = sorted(table.keys())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot parse {path}: {one_line(str(exc))}", RECOMPUTE_FIX) from None
    if utterances is not None:
        wanted = set(utterances)
        missing = sorted(wanted.difference(keys))
        if missing:
            raise UserError(f"utterance {missing[0]!r} has no features in {path}"
                            + (f" ({len(missing) - 1} more missing)" if len(missing) > 1 else ""),
                            "recompute the features for this data dir")
        keys = [k for k in keys if k in wanted]
    feats: dict[str, torch.Tensor] = {}
    for utt in keys:
        # A writable copy, detached from the ark.
        feats[utt] = torch.from_numpy(read_feature_matrix(table, utt, path, RECOMPUTE_FIX))
    if cmvn_scp is not None:
        feats = apply_cmvn(feats, cmvn_scp, utt2spk, norm_vars)
    return feats
