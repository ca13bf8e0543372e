"""Kaldi data directories, read as Kaldi's egs/swbd/s5c and fisher_swbd recipes write them.

A data directory holds plain-text tables keyed by the first whitespace-separated field:

* ``wav.scp``   ``<recording-id> <extended-filename>``: an audio file path, or a shell command
  that writes a WAV file to stdout, ending in ``|`` (``sph2pipe -f wav -p -c 1 x.sph |``).
* ``segments``  ``<utterance-id> <recording-id> <start-s> <end-s>`` (optional; without it every
  recording is one utterance with the same id). An end time of ``-1`` means "to the end of the
  recording", as in Kaldi's extract-segments.
* ``text``      ``<utterance-id> <transcript...>``: defines the utterances.
* ``utt2spk``   ``<utterance-id> <speaker-id>`` (``spk2utt`` is its inverse).
* ``feats.scp``/``cmvn.scp`` when features were already computed (by Kaldi or by
  :func:`recipes.speech.features.prepare_features`).

Every problem a user can fix raises :class:`runner.errors.UserError` with a one-line message
that names the file (with line number where there is one) or the utterance, and the fix.
"""

from __future__ import annotations

import io
import math
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import soundfile as sf

from runner.errors import UserError, one_line

from .kaldi_table import read_table

PREPARE_FIX = ("prepare it with Kaldi (local/swbd1_data_prep.sh, then utils/fix_data_dir.sh) "
               "or export one with lhotse")
FIX_DATA_DIR = "then run Kaldi's utils/fix_data_dir.sh on the directory"
# Kaldi's extract-segments tolerates segments that end up to this far past the recording
# (--max-overshoot=0.5) and truncates them; further than that the segment is an error.
MAX_OVERSHOOT_S = 0.5
# Audio extensions whose paths inside a wav.scp pipe command are worth checking for existence.
AUDIO_SUFFIXES = (".wav", ".sph", ".flac", ".mp3", ".ogg", ".opus", ".au", ".aiff")


# The smallest data size that WAV writers put in a header when they stream (a pipe) and do
# not know the length (sox's 0x7FFFF000; others 0xFFFFFFFF).
STREAMED_WAV_SIZE = 0x7FFFF000


def wav_cut_short(path: str) -> tuple[int, int] | None:
    """(bytes of samples the header of a WAV file declares, bytes the file holds) when the
    file ends before its data does (a copy cut short); None for a whole WAV or another format.
    libsndfile reads such a file without a word, as the shorter audio it holds. A size of
    0, or one near 2 or 4 GiB (0x7FFFF000, 0xFFFFFFFF), is a streamed WAV's "unknown", not a
    claim."""
    with open(path, "rb") as f:
        head = f.read(12)
        if head[:4] != b"RIFF" or head[8:] != b"WAVE":
            return None
        end = os.fstat(f.fileno()).st_size
        while True:
            header = f.read(8)
            if len(header) < 8:
                return None
            size = int.from_bytes(header[4:], "little")
            if header[:4] == b"data":
                held = end - f.tell()
                return (size, held) if 0 < size < STREAMED_WAV_SIZE and held < size else None
            f.seek(size + size % 2, os.SEEK_CUR)  # chunks are padded to an even size


def not_audio(path: str) -> str:
    """Why a wav.scp path that is no file cannot be read: a directory, or nothing there."""
    return "is a directory, not an audio file" if Path(path).is_dir() else "does not exist"


class Segment(NamedTuple):
    """One line of ``segments``: the recording and the times (seconds) cut out of it."""

    recording: str
    start: float
    end: float  # -1: to the end of the recording


def _label(role: str) -> str:
    """How messages name a data dir: "train data dir", or plain "data dir"."""
    return "data dir" if role == "data" else f"{role} data dir"


def _role_fix(role: str, what: str) -> str:
    """The fix for a bad data dir, naming the config key the recipes read it from."""
    key = f"; then set recipe.data.{role}=<dir>" if role in ("train", "eval") else ""
    return f"{what}{key}"


def is_pipe(entry: str) -> bool:
    """Whether a wav.scp entry is a command whose stdout is the audio (``... |``)."""
    return entry.rstrip().endswith("|")


@dataclass
class KaldiDataDir:
    """A parsed Kaldi data directory. ``text`` is sorted by utterance id as Kaldi sorts
    (``LC_ALL=C sort``: byte order, which is code-point order for UTF-8)."""

    path: Path
    wav_scp: dict[str, str]
    text: dict[str, str]
    utt2spk: dict[str, str]
    segments: dict[str, Segment] | None = None
    feats_scp: Path | None = None
    cmvn_scp: Path | None = None
    role: str = "data"
    # Line numbers of ids in text/wav.scp, so later errors can point at file:line.
    text_lines: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    # The last whole recording read: segments of one recording are consecutive in Kaldi's
    # utterance order, so one cached recording runs a pipe command once per recording, not
    # once per segment.
    _cache: tuple[str, np.ndarray, int] | None = field(default=None, repr=False,
                                                       compare=False)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = None  # audio does not travel to worker processes
        return state

    @property
    def utterances(self) -> list[str]:
        """Utterance ids (those in ``text``), sorted."""
        return list(self.text)

    @property
    def spk2utt(self) -> dict[str, list[str]]:
        """Speaker -> its utterances, both sorted (Kaldi's spk2utt)."""
        out: dict[str, list[str]] = {}
        for utt in self.text:
            out.setdefault(self.utt2spk[utt], []).append(utt)
        return dict(sorted(out.items()))

    def recording_of(self, utt: str) -> str:
        """The wav.scp id the utterance's audio comes from."""
        return self.segments[utt].recording if self.segments is not None else utt

    def _check_known(self, utt: str) -> None:
        if utt not in self.text:
            raise UserError(f"utterance {utt!r} is not in {self.path / 'text'}",
                            "use an utterance id listed in text")

    def subset(self, utts: Iterable[str]) -> KaldiDataDir:
        """The same directory restricted to ``utts`` (unknown ids are ignored); raises when
        nothing is left, since an empty training or eval set cannot run."""
        keep = set(utts)
        text = {u: t for u, t in self.text.items() if u in keep}
        sub = replace(self, text=text, utt2spk={u: self.utt2spk[u] for u in text},
                      segments=(None if self.segments is None
                                else {u: self.segments[u] for u in text}),
                      text_lines={u: self.text_lines[u] for u in text if u in self.text_lines},
                      _cache=None)
        _require_utterances(sub)
        return sub

    def validate(self, check_audio_files: bool = True) -> None:
        """Check that every utterance's audio can be found, without reading any audio.

        File paths are stat'ed; for pipe commands the program must be on PATH and the audio
        paths named in the command (``*.sph``, ``*.wav``, ...) must exist.
        """
        if not check_audio_files:
            return
        missing: list[tuple[str, str]] = []
        seen: set[str] = set()
        for utt in self.text:
            rec = self.recording_of(utt)
            if rec in seen:
                continue
            seen.add(rec)
            entry = self.wav_scp[rec]
            if is_pipe(entry):
                self._check_command(rec, entry)
                missing += [(rec, p) for p in _paths_in_command(entry) if not Path(p).exists()]
            elif not Path(entry).is_file():
                missing.append((rec, entry))
        if missing:
            rec, first = missing[0]
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UserError(f"audio file {first}{relative_to_cwd(first)} of recording {rec!r} "
                            f"in {self.path / 'wav.scp'} {not_audio(first)}{more}",
                            f"restore the audio or correct wav.scp, {FIX_DATA_DIR}")

    def _check_command(self, rec: str, entry: str) -> None:
        try:
            program = shlex.split(entry.rstrip()[:-1])[0]
        except (ValueError, IndexError):
            raise UserError(f"{self.path / 'wav.scp'}: recording {rec!r} has an unparsable "
                            f"command {entry!r}",
                            "write '<recording-id> <command> |' with balanced quotes") from None
        if "$" not in program and shutil.which(program) is None:
            raise UserError(f"program {program!r} in the wav.scp command of recording {rec!r} "
                            f"({self.path / 'wav.scp'}) is not installed or not on PATH",
                            "install it (sph2pipe ships with Kaldi's tools/) or add its "
                            "directory to PATH")

    def read_audio(self, utt: str, sample_rate: int | None = None) -> tuple[np.ndarray, int]:
        """Mono float32 samples in [-1, 1] of one utterance, and their sample rate."""
        self._check_known(utt)
        rec = self.recording_of(utt)
        if self._cache is not None and self._cache[0] == rec:
            audio, rate = self._cache[1], self._cache[2]
        else:
            audio, rate = self._read_recording(utt, rec)
            if self.segments is not None:
                self._cache = (rec, audio, rate)
        if sample_rate is not None and rate != sample_rate:
            entry = self.wav_scp[rec]
            source = f"audio of recording {rec!r} ({entry.strip()})"
            resample = (f"append 'sox -t wav - -r {sample_rate} -t wav - |' to the wav.scp "
                        f"command" if is_pipe(entry) else
                        f"use 'sox {entry} -r {sample_rate} -t wav - |' in wav.scp")
            raise UserError(f"{source} for utterance {utt!r} is {rate} Hz, but {sample_rate} Hz "
                            f"is expected", f"resample it ({resample}) or set "
                            f"recipe.data.sample_rate={rate}")
        if self.segments is not None:
            audio = self._cut(utt, audio, rate)
        return audio, rate

    def _read_recording(self, utt: str, rec: str) -> tuple[np.ndarray, int]:
        entry = self.wav_scp[rec]
        if is_pipe(entry):
            command = entry.rstrip()[:-1].strip()
            # Kaldi runs these through popen(), i.e. /bin/sh; so does shell=True.
            proc = subprocess.run(command, shell=True, capture_output=True, check=False)
            if proc.returncode != 0 or not proc.stdout:
                why = (f"exited with status {proc.returncode}" if proc.returncode != 0
                       else "wrote nothing to stdout")
                detail = one_line(proc.stderr.decode(errors="replace"))[-200:]
                raise UserError(f"wav.scp command for utterance {utt!r} (recording {rec!r}) "
                                f"{why}: {command!r}" + (f": {detail}" if detail else ""),
                                f"run the command by hand to see why, then fix it in "
                                f"{self.path / 'wav.scp'}")
            source: str | io.BytesIO = io.BytesIO(proc.stdout)
            name = f"the output of {command!r}"
        else:
            if not Path(entry).is_file():
                raise UserError(f"audio file {entry}{relative_to_cwd(entry)} of utterance "
                                f"{utt!r} (listed in {self.path / 'wav.scp'}) "
                                f"{not_audio(entry)}",
                                f"restore the audio or correct wav.scp, {FIX_DATA_DIR}")
            cut = wav_cut_short(entry)
            if cut:
                raise UserError(f"audio file {entry}{relative_to_cwd(entry)} of utterance "
                                f"{utt!r} is cut short: its header declares {cut[0]:,} bytes "
                                f"of samples, the file holds {cut[1]:,}",
                                f"copy the audio again, or drop the utterance from text, "
                                f"{FIX_DATA_DIR}")
            source, name = entry, entry
        try:
            audio, rate = sf.read(source, dtype="float32", always_2d=True)
        except RuntimeError as exc:  # soundfile's decode errors derive from it
            raise UserError(f"cannot decode {name} (utterance {utt!r}) as audio: "
                            f"{one_line(str(exc))}",
                            "wav.scp must name a WAV/FLAC file or a command that writes WAV "
                            "to stdout (e.g. 'sph2pipe -f wav -p -c 1 x.sph |')") from None
        if audio.shape[1] != 1:
            raise UserError(f"{name} (utterance {utt!r}) has {audio.shape[1]} channels; "
                            f"features need mono audio",
                            "select one channel in wav.scp (e.g. 'sph2pipe -f wav -p -c 1 x.sph"
                            " |' or 'sox x.wav -t wav - remix 1 |')")
        return np.ascontiguousarray(audio[:, 0]), int(rate)

    def _cut(self, utt: str, audio: np.ndarray, rate: int) -> np.ndarray:
        """The segment's samples, rounded to the nearest sample as extract-segments does."""
        seg = self.segments[utt]
        where = f"{self.path / 'segments'}, utterance {utt!r}"
        start = int(round(seg.start * rate))
        end = len(audio) if seg.end < 0 else int(round(seg.end * rate))
        duration = len(audio) / rate
        if start >= len(audio):
            raise UserError(f"{where} starts at {seg.start} s, after recording "
                            f"{seg.recording!r} ends ({duration:.2f} s)",
                            f"correct or remove the segment, {FIX_DATA_DIR}")
        if end > len(audio):
            if (end - len(audio)) / rate > MAX_OVERSHOOT_S:
                raise UserError(f"{where} ends at {seg.end} s, more than {MAX_OVERSHOOT_S} s "
                                f"after recording {seg.recording!r} ends ({duration:.2f} s)",
                                f"correct or remove the segment, {FIX_DATA_DIR}")
            end = len(audio)
        return audio[start:end].copy()


def relative_to_cwd(path: str) -> str:
    """For a relative audio path: what it was taken against (as Kaldi's tools, the current
    directory, not the data dir), as a parenthesis; empty for an absolute one."""
    if Path(path.strip()).is_absolute():
        return ""
    return f" (a relative path: taken from the current directory {Path.cwd()}, as Kaldi does)"


def audio_identity(entry: str) -> list[tuple[str, int | None, int | None]]:
    """(path, size, modification time in ns) of each audio file a wav.scp entry reads (the
    file itself, or the files its command names), None for one that is missing: what a cache
    of features keys on, since hashing thousands of hours of audio would take longer than the
    features themselves."""
    paths = _paths_in_command(entry) if is_pipe(entry) else [entry.strip()]
    identity: list[tuple[str, int | None, int | None]] = []
    for path in paths:
        try:
            status = os.stat(path)
            identity.append((path, status.st_size, status.st_mtime_ns))
        except OSError:
            identity.append((path, None, None))
    return identity


def _paths_in_command(entry: str) -> list[str]:
    """Audio paths named literally in a pipe command; paths built from shell variables are
    skipped, since they cannot be checked without running the shell."""
    try:
        tokens = shlex.split(entry.rstrip()[:-1])
    except ValueError:
        return []
    return [t for t in tokens[1:]
            if "$" not in t and not t.startswith("-") and t.lower().endswith(AUDIO_SUFFIXES)]


def _read_segments(path: Path) -> dict[str, Segment]:
    rows = read_table(path, "<utterance-id> <recording-id> <start-s> <end-s>", FIX_DATA_DIR, 4, 4)
    where = rows.line
    segments: dict[str, Segment] = {}
    for utt, rest in rows.items():
        rec, start, end = rest.split()
        try:
            seg = Segment(rec, float(start), float(end))
        except ValueError:
            seg = None
        ok = (seg is not None and math.isfinite(seg.start) and math.isfinite(seg.end)
              and seg.start >= 0 and (seg.end == -1 or seg.end > seg.start))
        if not ok:
            raise UserError(f"{path}:{where[utt]}: malformed segment {utt} {rec} {start} {end}, "
                            f"expected times in seconds with 0 <= start < end (or end -1)",
                            f"correct or remove that line, {FIX_DATA_DIR}")
        segments[utt] = seg
    return segments


def _require_utterances(data: KaldiDataDir) -> None:
    if data.text:
        return
    if data.role == "eval":
        fix = ("point recipe.data.eval at a prepared evaluation set with transcripts "
               "(e.g. Kaldi's local/eval2000_data_prep.sh, then utils/fix_data_dir.sh)")
    else:
        fix = _role_fix(data.role, f"{PREPARE_FIX}, so that text lists its utterances")
    raise UserError(f"{_label(data.role)} {data.path} has no utterances "
                    f"({data.path / 'text'} lists none)", fix)


def load_data_dir(path: str | os.PathLike, role: str = "data") -> KaldiDataDir:
    """Parse and cross-check a Kaldi data directory (no audio is read).

    ``role`` ("train", "eval", ...) only shapes error messages, so that they name the set and
    the config key (``recipe.data.<role>``) to fix.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise UserError(f"{_label(role)} {root} {what}",
                        _role_fix(role, PREPARE_FIX))
    for name in ("wav.scp", "text"):
        if not (root / name).is_file():
            raise UserError(f"{_label(role)} {root} has no {name}",
                            _role_fix(role, f"{PREPARE_FIX}; a Kaldi data dir needs wav.scp "
                                            f"and text"))
    # wav.scp keeps the whole rest of the line: commands contain spaces.
    wav_scp = dict(read_table(root / "wav.scp", "<recording-id> <path or command |>",
                              FIX_DATA_DIR, min_fields=2))
    rows = read_table(root / "text", "<utterance-id> <transcript>", FIX_DATA_DIR)
    text_lines = rows.line
    text = {utt: " ".join(rows[utt].split()) for utt in sorted(rows)}
    segments = _read_segments(root / "segments") if (root / "segments").is_file() else None
    has_utt2spk = (root / "utt2spk").is_file()
    if has_utt2spk:
        utt2spk = dict(read_table(root / "utt2spk", "<utterance-id> <speaker-id>",
                                  FIX_DATA_DIR, 2, 2))
    else:
        # Kaldi's convention when speakers are unknown: every utterance is its own speaker.
        utt2spk = {}
    data = KaldiDataDir(
        path=root, wav_scp=wav_scp, text=text, utt2spk=utt2spk, segments=segments,
        feats_scp=(root / "feats.scp") if (root / "feats.scp").is_file() else None,
        cmvn_scp=(root / "cmvn.scp") if (root / "cmvn.scp").is_file() else None,
        role=role, text_lines=text_lines)
    _require_utterances(data)
    _cross_check(data, has_utt2spk)
    return data


def _cross_check(data: KaldiDataDir, has_utt2spk: bool) -> None:
    """Every utterance in text needs audio (and a speaker): what fix_data_dir.sh enforces."""
    root = data.path
    for utt in data.text:
        at = f"{root / 'text'}:{data.text_lines.get(utt, '?')}"
        if not data.text[utt]:  # scored, it counts every hypothesis word as an error
            raise UserError(f"utterance {utt!r} ({at}) has an empty transcript",
                            f"write its words after the id, or drop it from text, "
                            f"{FIX_DATA_DIR}")
        if data.segments is not None:
            if utt not in data.segments:
                raise UserError(f"utterance {utt!r} ({at}) is not in {root / 'segments'}",
                                f"add its segment or drop it from text, {FIX_DATA_DIR}")
            rec = data.segments[utt].recording
            if rec not in data.wav_scp:
                raise UserError(f"recording {rec!r} of utterance {utt!r} (in "
                                f"{root / 'segments'}) is not in {root / 'wav.scp'}",
                                f"add the recording to wav.scp or drop its segments, "
                                f"{FIX_DATA_DIR}")
        elif utt not in data.wav_scp:
            raise UserError(f"utterance {utt!r} ({at}) is not in {root / 'wav.scp'} (and there "
                            f"is no segments file)",
                            f"add its audio to wav.scp or drop it from text, {FIX_DATA_DIR}")
        if has_utt2spk:
            if utt not in data.utt2spk:
                raise UserError(f"utterance {utt!r} ({at}) is not in {root / 'utt2spk'}",
                                f"add '<utterance-id> <speaker-id>', {FIX_DATA_DIR}")
        else:
            data.utt2spk[utt] = utt


def read_audio(data_dir: KaldiDataDir | str | os.PathLike, utt: str,
               sample_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Mono float32 samples of utterance ``utt`` and their rate; with ``sample_rate`` given,
    a recording at any other rate is a UserError (nothing is resampled silently)."""
    data = data_dir if isinstance(data_dir, KaldiDataDir) else load_data_dir(data_dir)
    return data.read_audio(utt, sample_rate)


def _check_id(kind: str, value: str) -> None:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{kind} {value!r} must be non-empty and contain no whitespace")


def _write_atomic(path: Path, lines: Iterable[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def write_data_dir(path: str | os.PathLike, wav_scp: Mapping[str, str], text: Mapping[str, str],
                   utt2spk: Mapping[str, str],
                   segments: Mapping[str, tuple[str, float, float]] | None = None) -> Path:
    """Write a Kaldi data dir (wav.scp, text, utt2spk, spk2utt and optionally segments), sorted
    as Kaldi's utils/fix_data_dir.sh leaves it. Bad arguments are programming errors
    (ValueError), not user errors."""
    root = Path(path)
    for utt in text:
        _check_id("utterance id", utt)
        if "\n" in text[utt] or "\r" in text[utt]:
            raise ValueError(f"transcript of {utt!r} contains a line break")
        if utt not in utt2spk:
            raise ValueError(f"utterance {utt!r} has no speaker in utt2spk")
        _check_id("speaker id", utt2spk[utt])
        rec = segments[utt][0] if segments is not None else utt
        if segments is not None and utt not in segments:
            raise ValueError(f"utterance {utt!r} has no segment")
        if rec not in wav_scp:
            raise ValueError(f"recording {rec!r} of utterance {utt!r} is not in wav_scp")
    for rec, entry in wav_scp.items():
        _check_id("recording id", rec)
        if not entry.strip() or "\n" in entry:
            raise ValueError(f"wav.scp entry of {rec!r} must be one non-empty line")
    root.mkdir(parents=True, exist_ok=True)
    utts = sorted(text)
    _write_atomic(root / "wav.scp", (f"{rec} {wav_scp[rec].strip()}" for rec in sorted(wav_scp)))
    _write_atomic(root / "text", (f"{u} {' '.join(text[u].split())}".rstrip() for u in utts))
    _write_atomic(root / "utt2spk", (f"{u} {utt2spk[u]}" for u in utts))
    spk2utt: dict[str, list[str]] = {}
    for u in utts:
        spk2utt.setdefault(utt2spk[u], []).append(u)
    _write_atomic(root / "spk2utt", (f"{s} {' '.join(spk2utt[s])}" for s in sorted(spk2utt)))
    if segments is not None:
        # repr() keeps every digit of the times, so what is written reads back identical.
        _write_atomic(root / "segments", (
            f"{u} {segments[u][0]} {float(segments[u][1])!r} {float(segments[u][2])!r}"
            for u in utts))
    elif (root / "segments").exists():
        (root / "segments").unlink()  # a stale one would re-map utterances to recordings
    return root
