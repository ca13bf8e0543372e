"""A spoken connected-digits corpus (TIDIGITS-like), synthesized locally with eSpeak NG.

Utterances are strings of 1 to ``max_digits`` digits read as words ("three oh seven"; a zero is
read "oh" or "zero" at random, as TIDIGITS speakers did), spoken by eSpeak NG's English accents
combined with its voice variants, at several speeds and pitches, then resampled from eSpeak's
native 22050 Hz to 16 kHz, scaled to a random peak level, padded with 50-300 ms of silence at
each end and mixed with white or pink noise at a random SNR (relative to the mean power of the
synthesized speech, before the padding). The result is two real Kaldi data directories::

    OUT_DIR/wav/<utt>.wav      16 kHz mono 16-bit PCM
    OUT_DIR/train/ eval/       wav.scp (absolute paths), text, utt2spk, spk2utt, utt2dur
    OUT_DIR/speakers.tsv       what each speaker id is (accent, variant, pitch, range, speed)
    OUT_DIR/utterances.tsv     the synthesis settings of every utterance
    OUT_DIR/DONE               JSON stamp: version, parameters, eSpeak version, summary

Speakers. A speaker is an (accent, variant, pitch, pitch range, base speed) combination; each
utterance varies the speed by up to +-10 words per minute around its speaker's. Every speaker
has its own (accent, variant) pair, and the eval set is spoken only by held-out speakers: the
accents and variants they use also occur in training, but never in that combination, and never
with that pitch and speed. Eval digit strings never occur in the training set (compared as
digits, so "oh" and "zero" are the same); with a large training set every short string is
taken, so eval strings are longer on average (2000 training utterances leave no 1-digit ones).

Determinism. The same parameters give the same texts and byte-identical WAV files. eSpeak NG
keeps synthesis state between utterances in C statics that neither ``espeak_Terminate`` nor a
new ``espeak_Initialize`` resets (pitch flutter position, gain control, phase), so an
utterance's samples depend on what the library spoke before it in the same process. Synthesis
therefore runs in a fresh, lean child process (it loads this file by path, without the torch
that the ``recipes`` package imports) that speaks the whole corpus in a fixed order, with
eSpeak's random generators re-seeded for every utterance. The parent never synthesizes.

Caching. The corpus is built in a temporary sibling directory and renamed into place with the
DONE stamp inside, so an interrupted run is never mistaken for a finished one; a later call with
the same parameters returns at once. A directory stamped with other parameters is replaced.

    python -m recipes.speech.synth OUT_DIR --train 2000 --eval 200 --seed 0

eSpeak itself takes about 2.5 ms per utterance; with resampling, noise and writing, 2000 + 200
utterances (about 57 minutes of audio) take about 16 s on one core.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import soundfile as sf

from runner.errors import UserError, one_line

VERSION = 1
SAMPLE_RATE = 16000
INSTALL_FIX = "pip install espeakng-loader (it ships libespeak-ng and its data)"

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Code letters for utterance ids, as in TIDIGITS file names: o = "oh", z = "zero".
_ZERO_CODE = {"oh": "o", "zero": "z"}

# eSpeak NG English accents (files under espeak-ng-data/lang/gmw) and voice variants
# (espeak-ng-data/voices/!v). "" is the accent's own default voice.
ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc",
           "en-gb-x-gbclan", "en-gb-x-gbcwmd")
VARIANTS = ("", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5",
            "klatt", "klatt3", "Annie", "aunty", "edward", "linda", "max", "steph", "travis")
PITCH = (30, 70)        # espeakPITCH, 0-99 (50: the voice's normal pitch)
PITCH_RANGE = (30, 80)  # espeakRANGE, 0-99 (0: monotone)
SPEED = (140, 200)      # a speaker's base espeakRATE, words per minute
SPEED_JITTER = 10       # per utterance, +- words per minute
PEAK_DBFS = (-12.0, -4.0)
SILENCE_S = (0.05, 0.30)  # leading and trailing, each
NOISE_COLORS = ("white", "pink")

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE, _VOLUME, _PITCH, _RANGE, _WORDGAP = 1, 2, 3, 4, 7
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


# ----------------------------------------------------------------------------------------------
# Public API


def synthesize_corpus(out_dir: str | os.PathLike, num_train: int, num_eval: int, seed: int = 0,
                      *, train_speakers: int = 24, eval_speakers: int = 8, max_digits: int = 7,
                      snr_db: tuple[float, float] = (10.0, 30.0)) -> dict:
    """Synthesize (once) a spoken-digits corpus into ``out_dir``; return its summary.

    The summary holds the data dirs (``train``, ``eval``), counts, speakers, total durations,
    the eSpeak NG version, ``seconds`` (build time) and ``cached`` (True when ``out_dir``
    already held this corpus and nothing was written).
    """
    out = Path(out_dir).expanduser().resolve()
    params = _check_params(num_train, num_eval, seed, train_speakers, eval_speakers,
                           max_digits, snr_db)
    lib_path, data_path, espeak_version = _espeak_paths()
    stamp = {"version": VERSION, "params": params, "espeak": espeak_version}
    done = _read_stamp(out)
    if done is not None and _same(done, stamp):
        return {**done["summary"], "cached": True}
    if out.exists() and done is None and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not a synthesized corpus (it has no DONE stamp)",
                        "give an empty or new directory, or remove this one")
    start = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        plan = make_plan(seed, num_train, num_eval, train_speakers, eval_speakers, max_digits,
                         snr_db)
        durations = _run_worker(tmp, plan, lib_path, data_path)
        summary = _write_corpus(tmp, out, plan, durations, params, espeak_version)
        summary["seconds"] = round(time.monotonic() - start, 3)
        (tmp / "DONE").write_text(json.dumps({**stamp, "summary": summary}, indent=1) + "\n")
        _install(tmp, out, stamp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    done = _read_stamp(out)
    return {**done["summary"], "cached": False}


def digit_words(digits: str, zero_words: list[str] | None = None) -> list[str]:
    """The words of a digit string; ``zero_words`` says how each zero is read ("oh"/"zero")."""
    zeros = iter(zero_words or [])
    return [next(zeros, "zero") if d == "0" else DIGIT_WORDS[int(d)] for d in digits]


def words_to_digits(text: str) -> str:
    """Inverse of :func:`digit_words`: "three oh seven" -> "307"."""
    lookup = {w: str(i) for i, w in enumerate(DIGIT_WORDS)} | {"oh": "0"}
    return "".join(lookup[w] for w in text.split())


def resample(x: np.ndarray, orig_rate: int, new_rate: int, half_width: int = 32,
             beta: float = 6.0) -> np.ndarray:
    """Band-limited polyphase resampling (Kaiser-windowed sinc), float64 in and out.

    ``half_width`` is the number of input samples each side of an output sample; the cutoff
    sits half a transition band below the lower Nyquist frequency, so that little aliases.
    """
    g = math.gcd(orig_rate, new_rate)
    up, down = new_rate // g, orig_rate // g
    x = np.asarray(x, dtype=np.float64)
    if up == down:
        return x.copy()
    taps = _resample_taps(up, down, half_width, beta)
    n_out = (len(x) * up + down - 1) // down
    # Frame k of `padded` holds x[k - half_width + 1 : k + half_width + 1].
    padded = np.concatenate([np.zeros(half_width - 1), x, np.zeros(half_width + 1)])
    frames = np.lib.stride_tricks.sliding_window_view(padded, 2 * half_width)
    y = np.empty(n_out)
    # Output n reads input frame (n * down) // up with filter phase (n * down) % up; both repeat
    # every `up` outputs, so each phase is one strided matrix-vector product.
    for r in range(min(up, n_out)):
        first, phase = divmod(r * down, up)
        count = len(range(r, n_out, up))
        y[r::up] = frames[first:first + count * down:down] @ taps[phase]
    return y


@functools.lru_cache(maxsize=8)
def _resample_taps(up: int, down: int, half_width: int, beta: float) -> np.ndarray:
    """Filter taps, one row per output phase: row p is for outputs at input time k + p / up,
    column j weighs input k - half_width + 1 + j."""
    offsets = np.arange(-half_width + 1, half_width + 1)
    tau = (np.arange(up) / up)[:, None] - offsets[None, :]       # output time - input time
    transition = (beta * 0.9 + 0.5) / (4 * half_width)           # ~ Kaiser's rule, cycles/sample
    cutoff = min(up, down) / 2 / down - transition / 2            # cycles per input sample
    window = np.i0(beta * np.sqrt(np.clip(1 - (tau / half_width) ** 2, 0, None))) / np.i0(beta)
    taps = 2 * cutoff * np.sinc(2 * cutoff * tau) * window
    taps /= taps.sum(axis=1, keepdims=True)                       # unit gain at DC per phase
    taps.setflags(write=False)
    return taps


# ----------------------------------------------------------------------------------------------
# The plan: every random choice, made up front from the seed


def make_plan(seed: int, num_train: int, num_eval: int, train_speakers: int = 24,
              eval_speakers: int = 8, max_digits: int = 7,
              snr_db: tuple[float, float] = (10.0, 30.0)) -> dict:
    """Speakers and utterances (texts and every synthesis setting) drawn from ``seed``."""
    rng = np.random.default_rng([VERSION, seed])
    pairs = [(a, v) for a in ACCENTS for v in VARIANTS]
    chosen = rng.choice(len(pairs), size=train_speakers + eval_speakers, replace=False)
    speakers = []
    for i, p in enumerate(chosen):
        accent, variant = pairs[int(p)]
        speakers.append({
            "id": f"spk{i:03d}", "split": "train" if i < train_speakers else "eval",
            "accent": accent, "variant": variant,
            "voice": accent + (f"+{variant}" if variant else ""),
            "pitch": int(rng.integers(PITCH[0], PITCH[1] + 1)),
            "range": int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1)),
            "speed": int(rng.integers(SPEED[0], SPEED[1] + 1)),
        })
    by_split = {s: [spk for spk in speakers if spk["split"] == s] for s in ("train", "eval")}
    utterances: list[dict] = []
    train_digits: set[str] = set()
    for split, count in (("train", num_train), ("eval", num_eval)):
        for i in range(count):
            for _ in range(1000):
                length = int(rng.integers(1, max_digits + 1))
                digits = "".join(str(d) for d in rng.integers(0, 10, length))
                if split == "train" or digits not in train_digits:
                    break
            else:
                raise UserError(f"cannot draw {num_eval} eval digit strings that are not in the "
                                f"training set", "use fewer training utterances or more digits")
            if split == "train":
                train_digits.add(digits)
            zeros = [str(w) for w in rng.choice(["oh", "zero"], digits.count("0"))]
            words = digit_words(digits, zeros)
            spk = by_split[split][i % len(by_split[split])]
            zero_iter = iter(zeros)
            code = "".join(_ZERO_CODE[next(zero_iter)] if d == "0" else d for d in digits)
            utterances.append({
                "id": f"{spk['id']}-{split[:2]}{i:05d}-{code}", "split": split,
                "speaker": spk["id"], "text": " ".join(words), "voice": spk["voice"],
                "pitch": spk["pitch"], "range": spk["range"],
                "rate": int(np.clip(spk["speed"] + rng.integers(-SPEED_JITTER, SPEED_JITTER + 1),
                                    SPEED[0] - SPEED_JITTER, SPEED[1] + SPEED_JITTER)),
                "peak_dbfs": round(float(rng.uniform(*PEAK_DBFS)), 3),
                "snr_db": round(float(rng.uniform(*snr_db)), 3),
                "noise": str(rng.choice(NOISE_COLORS)),
                "lead_s": round(float(rng.uniform(*SILENCE_S)), 4),
                "trail_s": round(float(rng.uniform(*SILENCE_S)), 4),
                "seed": int(rng.integers(0, 2**31 - 1)),
            })
    return {"speakers": speakers, "utterances": utterances}


def _check_params(num_train, num_eval, seed, train_speakers, eval_speakers, max_digits,
                  snr_db) -> dict:
    for name, value, low in (("num_train", num_train, 1), ("num_eval", num_eval, 1),
                             ("train_speakers", train_speakers, 1),
                             ("eval_speakers", eval_speakers, 1), ("max_digits", max_digits, 1),
                             ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(f"speech synthesis: {name} must be an integer >= {low}, got "
                            f"{value!r}", f"set {name} to a whole number >= {low}")
    combos = len(ACCENTS) * len(VARIANTS)
    if train_speakers + eval_speakers > combos:
        raise UserError(f"speech synthesis: {train_speakers} + {eval_speakers} speakers is more "
                        f"than the {combos} accent/variant combinations",
                        f"use at most {combos} speakers in all")
    lo, hi = (float(v) for v in snr_db)
    if not lo <= hi:
        raise UserError(f"speech synthesis: snr_db range {snr_db} is empty", "give (low, high)")
    return {"num_train": num_train, "num_eval": num_eval, "seed": seed,
            "train_speakers": train_speakers, "eval_speakers": eval_speakers,
            "max_digits": max_digits, "snr_db": [lo, hi]}


# ----------------------------------------------------------------------------------------------
# eSpeak NG through ctypes


def _espeak_paths() -> tuple[str, str, str]:
    """Library path, data path and version of eSpeak NG; a UserError when it cannot load."""
    try:
        import espeakng_loader
    except ImportError as ex:
        raise UserError(f"the eSpeak NG library is not available ({one_line(str(ex))})",
                        INSTALL_FIX) from None
    try:
        lib_path = str(espeakng_loader.get_library_path())
        data_path = str(espeakng_loader.get_data_path())
        lib = ctypes.CDLL(lib_path)
        lib.espeak_Info.restype = ctypes.c_char_p
        lib.espeak_Info.argtypes = [ctypes.c_void_p]
        version = (lib.espeak_Info(None) or b"?").decode(errors="replace")
    except (OSError, RuntimeError, AttributeError) as ex:
        raise UserError(f"cannot load the eSpeak NG library ({one_line(str(ex))})",
                        INSTALL_FIX) from None
    return lib_path, data_path, version


def _check_voices(data_path: str, voices: list[str]) -> None:
    """eSpeak accepts an unknown variant silently: check that the files exist."""
    root = Path(data_path)
    langs = {p.name.lower() for p in (root / "lang").rglob("*") if p.is_file()}
    variants = {p.name for p in (root / "voices" / "!v").glob("*") if p.is_file()}
    for voice in voices:
        accent, _, variant = voice.partition("+")
        if accent.lower() not in langs or (variant and variant not in variants):
            raise UserError(f"eSpeak NG voice {voice!r} is not in {data_path}",
                            f"{INSTALL_FIX}; or reinstall it: pip install --force-reinstall "
                            f"espeakng-loader")


class _Espeak:
    """libespeak-ng in synchronous mode: one utterance in, int16 samples at 22050 Hz out."""

    def __init__(self, lib_path: str, data_path: str):
        lib = ctypes.CDLL(lib_path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                          ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint,
                                     ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                                     ctypes.c_void_p, ctypes.c_void_p]
        self.lib = lib
        self.libc = ctypes.CDLL(None)
        self.rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(),
                                          _INITIALIZE_DONT_EXIT)
        if self.rate <= 0:
            raise UserError(f"eSpeak NG could not initialize with data {data_path}", INSTALL_FIX)
        self._chunks: list[bytes] = []
        self._callback = _SYNTH_CALLBACK(self._collect)  # keep a reference: C holds the pointer
        lib.espeak_SetSynthCallback(self._callback)
        self._set_seed = getattr(lib, "espeak_ng_SetRandSeed", None)
        if self._set_seed is not None:
            self._set_seed.argtypes = [ctypes.c_long]

    def _collect(self, wav, numsamples, _events) -> int:
        if wav and numsamples > 0:
            self._chunks.append(ctypes.string_at(wav, 2 * numsamples))
        return 0

    def speak(self, text: str, voice: str, rate: int, pitch: int, pitch_range: int,
              seed: int) -> np.ndarray:
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise UserError(f"eSpeak NG has no voice {voice!r}", INSTALL_FIX)
        for param, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range),
                             (_VOLUME, 100), (_WORDGAP, 0)):
            self.lib.espeak_SetParameter(param, value, 0)
        # Breath noise and a few other effects are random: eSpeak's own generator and libc's.
        if self._set_seed is not None:
            self._set_seed(seed)
        self.libc.srand(ctypes.c_uint(seed))
        self._chunks = []
        data = text.encode() + b"\0"
        status = self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8,
                                       None, None)
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed with status {status} on {text!r}")
        return np.frombuffer(b"".join(self._chunks), dtype="<i2").copy()


# ----------------------------------------------------------------------------------------------
# The worker: a fresh process that speaks the whole plan in order


def _finish(speech: np.ndarray, native_rate: int, utt: dict) -> np.ndarray:
    """Resample to 16 kHz, set the level, pad with silence and add noise: int16 samples."""
    x = resample(speech.astype(np.float64) / 32768.0, native_rate, SAMPLE_RATE)
    peak = float(np.max(np.abs(x))) if len(x) else 0.0
    if peak <= 0:
        raise RuntimeError(f"eSpeak NG produced silence for {utt['id']} ({utt['text']!r})")
    x *= 10 ** (utt["peak_dbfs"] / 20) / peak
    power = float(np.mean(x**2))
    lead, trail = (round(utt[k] * SAMPLE_RATE) for k in ("lead_s", "trail_s"))
    x = np.concatenate([np.zeros(lead), x, np.zeros(trail)])
    rng = np.random.default_rng(utt["seed"])
    if utt["noise"] == "pink":
        size = 1 << (len(x) - 1).bit_length()  # a fast FFT length
        spectrum = np.fft.rfft(rng.standard_normal(size))
        freqs = np.fft.rfftfreq(size, d=1 / SAMPLE_RATE)
        spectrum /= np.sqrt(np.maximum(freqs, 20.0))  # 1/f power, flat below 20 Hz
        noise = np.fft.irfft(spectrum, n=size)[:len(x)]
    else:
        noise = rng.standard_normal(len(x))
    noise *= math.sqrt(power / 10 ** (utt["snr_db"] / 10) / float(np.mean(noise**2)))
    y = np.clip(np.round((x + noise) * 32767.0), -32768, 32767)
    return y.astype(np.int16)


def _worker_main(job_path: str) -> int:
    """Entry point of the child process; writes WAVs and durations, or an error file."""
    job_file = Path(job_path)
    job = json.loads(job_file.read_text())
    root = Path(job["dir"])
    try:
        engine = _Espeak(job["lib_path"], job["data_path"])
        durations = {}
        for utt in job["plan"]["utterances"]:
            speech = engine.speak(utt["text"], utt["voice"], utt["rate"], utt["pitch"],
                                  utt["range"], utt["seed"])
            audio = _finish(speech, engine.rate, utt)
            sf.write(root / "wav" / f"{utt['id']}.wav", audio, SAMPLE_RATE, subtype="PCM_16")
            durations[utt["id"]] = len(audio) / SAMPLE_RATE
        (root / ".durations.json").write_text(json.dumps(durations))
    except UserError as ex:
        (root / ".error.json").write_text(json.dumps({"cause": ex.cause, "fix": ex.fix}))
        return 3
    return 0


# Loads this file by path under another name: `import recipes.speech.synth` would import the
# recipes package, and torch with it, which takes seconds and is not needed to synthesize.
_BOOT = ("import importlib.util, sys\n"
         "spec = importlib.util.spec_from_file_location('_adpsgd_synth_worker', sys.argv[1])\n"
         "module = importlib.util.module_from_spec(spec)\n"
         "sys.modules[spec.name] = module\n"
         "spec.loader.exec_module(module)\n"
         "sys.exit(module._worker_main(sys.argv[2]))\n")


def _run_worker(tmp: Path, plan: dict, lib_path: str, data_path: str) -> dict[str, float]:
    _check_voices(data_path, sorted({s["voice"] for s in plan["speakers"]}))
    (tmp / "wav").mkdir()
    job = tmp / ".job.json"
    job.write_text(json.dumps({"dir": str(tmp), "lib_path": lib_path, "data_path": data_path,
                               "plan": plan}))
    import runner

    root = str(Path(runner.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _BOOT, str(Path(__file__).resolve()),
                           str(job)], env=env, capture_output=True, text=True)
    error = tmp / ".error.json"
    if error.exists():
        info = json.loads(error.read_text())
        raise UserError(info["cause"], info["fix"])
    if proc.returncode != 0:
        raise RuntimeError(f"speech synthesis worker exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-3000:]}")
    durations = json.loads((tmp / ".durations.json").read_text())
    for name in (".job.json", ".durations.json"):
        (tmp / name).unlink()
    return durations


# ----------------------------------------------------------------------------------------------
# Kaldi data dirs, stamp and installation


def _write_corpus(tmp: Path, out: Path, plan: dict, durations: dict[str, float], params: dict,
                  espeak_version: str) -> dict:
    # Imported here, not at the top: the worker loads this file without the recipes package.
    from recipes.speech.kaldi_data import write_data_dir

    totals = {}
    for split in ("train", "eval"):
        utts = [u for u in plan["utterances"] if u["split"] == split]
        wav_scp = {u["id"]: str(out / "wav" / f"{u['id']}.wav") for u in utts}
        write_data_dir(tmp / split, wav_scp, {u["id"]: u["text"] for u in utts},
                       {u["id"]: u["speaker"] for u in utts})
        (tmp / split / "utt2dur").write_text(
            "".join(f"{u} {durations[u]:.4f}\n" for u in sorted(wav_scp)))
        totals[split] = sum(durations[u] for u in wav_scp)
    fields = ("id", "split", "accent", "variant", "voice", "pitch", "range", "speed")
    _write_tsv(tmp / "speakers.tsv", fields, plan["speakers"])
    fields = ("id", "speaker", "voice", "rate", "pitch", "range", "peak_dbfs", "snr_db",
              "noise", "lead_s", "trail_s", "seed", "text")
    _write_tsv(tmp / "utterances.tsv", fields, plan["utterances"])
    used = {u["speaker"] for u in plan["utterances"]}
    return {
        "out_dir": str(out), "train": str(out / "train"), "eval": str(out / "eval"),
        **params, "sample_rate": SAMPLE_RATE, "espeak": espeak_version,
        "speakers": {split: [s["id"] for s in plan["speakers"]
                             if s["split"] == split and s["id"] in used]
                     for split in ("train", "eval")},
        "voices": sorted({s["voice"] for s in plan["speakers"] if s["id"] in used}),
        "duration_s": {k: round(v, 3) for k, v in totals.items()},
        "mean_duration_s": round(sum(totals.values()) / len(durations), 4),
    }


def _write_tsv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(fields)
        writer.writerows([row[k] for k in fields] for row in rows)


def _read_stamp(out: Path) -> dict | None:
    try:
        done = json.loads((out / "DONE").read_text())
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) and "summary" in done else None


def _same(done: dict, stamp: dict) -> bool:
    return all(done.get(k) == v for k, v in stamp.items())


def _install(tmp: Path, out: Path, stamp: dict) -> None:
    """Rename the finished build into place (replacing a corpus with other parameters)."""
    old = None
    if out.exists():
        done = _read_stamp(out)
        if done is not None and _same(done, stamp):
            return  # another process finished the same corpus first: keep theirs
        if done is None and (not out.is_dir() or any(out.iterdir())):
            raise UserError(f"{out} appeared while synthesizing and is not a synthesized corpus",
                            "give an empty or new directory, or remove this one")
        old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        done = _read_stamp(out)
        if done is None or not _same(done, stamp):
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.speech.synth",
        description="Synthesize a spoken connected-digits corpus (Kaldi data dirs) with "
                    "eSpeak NG.")
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--train", type=int, default=2000, help="training utterances")
    parser.add_argument("--eval", type=int, default=200, help="eval utterances")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-speakers", type=int, default=24)
    parser.add_argument("--eval-speakers", type=int, default=8)
    parser.add_argument("--max-digits", type=int, default=7)
    args = parser.parse_args(argv)
    try:
        summary = synthesize_corpus(args.out_dir, args.train, args.eval, args.seed,
                                    train_speakers=args.train_speakers,
                                    eval_speakers=args.eval_speakers, max_digits=args.max_digits)
    except UserError as ex:
        print(f"synth: error: {ex}", file=sys.stderr)
        return 2
    state = "already there" if summary["cached"] else f"built in {summary['seconds']:.1f} s"
    print(f"synth: {summary['num_train']} train + {summary['num_eval']} eval utterances "
          f"({summary['duration_s']['train'] + summary['duration_s']['eval']:.0f} s of audio, "
          f"mean {summary['mean_duration_s']:.2f} s) in {summary['out_dir']}: {state}")
    print(f"synth: data dirs {summary['train']} and {summary['eval']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
