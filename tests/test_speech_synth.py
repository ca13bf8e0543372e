"""The spoken-digits synthesizer: real eSpeak NG audio into real Kaldi data dirs, cached and
deterministic."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from recipes.speech import synth
from recipes.speech.kaldi_data import load_data_dir
from runner.errors import UserError

REPO = Path(__file__).resolve().parents[1]
WORDS = set(synth.DIGIT_WORDS) | {"oh"}


def read_table(path: Path) -> list[tuple[str, str]]:
    rows = []
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(" ")
        rows.append((key, rest))
    return rows


def wav_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "wav").glob("*.wav"))}


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth") / "digits"
    return out, synth.synthesize_corpus(out, num_train=12, num_eval=4, seed=0)


@pytest.mark.slow
def test_wavs_are_16k_mono_speech(corpus):
    out, summary = corpus
    wavs = sorted((out / "wav").glob("*.wav"))
    assert len(wavs) == 16 and summary["num_train"] == 12 and summary["num_eval"] == 4
    durations = {}
    for split in ("train", "eval"):
        durations.update((k, float(v)) for k, v in read_table(out / split / "utt2dur"))
    for wav in wavs:
        info = sf.info(wav)
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        audio, _ = sf.read(wav, dtype="float32")
        assert 0.3 <= len(audio) / 16000 <= 6.0
        assert durations[wav.stem] == pytest.approx(len(audio) / 16000, abs=1e-3)
        assert 0.01 < float(np.sqrt(np.mean(audio**2))) and np.abs(audio).max() < 1.0
        # speech, not only noise: the loudest 50 ms is far above the quietest
        frames = audio[: len(audio) // 800 * 800].reshape(-1, 800)
        energy = np.sort(np.mean(frames**2, axis=1))
        assert energy[-1] > 10 * energy[0]
    assert summary["mean_duration_s"] == pytest.approx(np.mean(list(durations.values())),
                                                       abs=1e-3)


@pytest.mark.slow
def test_texts_are_digit_words_and_eval_is_held_out(corpus):
    out, summary = corpus
    digits = {}
    for split in ("train", "eval"):
        digits[split] = []
        for utt, text in read_table(out / split / "text"):
            words = text.split()
            assert 1 <= len(words) <= 7 and set(words) <= WORDS and text == text.lower()
            # the id ends with the TIDIGITS-style code of the words: o = "oh", z = "zero"
            code = "".join({"oh": "o", "zero": "z"}.get(w, synth.words_to_digits(w))
                           for w in words)
            assert utt.endswith(f"-{code}")
            digits[split].append(synth.words_to_digits(text))
    assert not set(digits["eval"]) & set(digits["train"])
    speakers = {row["id"]: row for row in _tsv(out / "speakers.tsv")}
    train_spk = {s for _, s in read_table(out / "train" / "utt2spk")}
    eval_spk = {s for _, s in read_table(out / "eval" / "utt2spk")}
    assert train_spk and eval_spk and not train_spk & eval_spk
    assert {speakers[s]["voice"] for s in eval_spk}.isdisjoint(
        speakers[s]["voice"] for s in train_spk)
    assert summary["speakers"] == {"train": sorted(train_spk), "eval": sorted(eval_spk)}
    assert all(v.startswith("en") for v in summary["voices"])


def _tsv(path: Path) -> list[dict]:
    header, *rows = (line.split("\t") for line in path.read_text().splitlines())
    return [dict(zip(header, row)) for row in rows]


@pytest.mark.slow
def test_kaldi_dirs_are_consistent_and_sorted(corpus):
    out, summary = corpus
    for split in ("train", "eval"):
        root = out / split
        assert summary[split] == str(root)
        tables = {name: read_table(root / name)
                  for name in ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur")}
        utts = [u for u, _ in tables["text"]]
        assert utts == sorted(utts) and len(set(utts)) == len(utts)
        for name in ("wav.scp", "utt2spk", "utt2dur"):
            assert [u for u, _ in tables[name]] == utts
        utt2spk = dict(tables["utt2spk"])
        for utt, spk in utt2spk.items():
            assert utt.startswith(f"{spk}-")
        spk2utt = {s: rest.split() for s, rest in tables["spk2utt"]}
        assert list(spk2utt) == sorted(spk2utt)
        assert sorted(u for us in spk2utt.values() for u in us) == utts
        assert all(utt2spk[u] == s for s, us in spk2utt.items() for u in us)
        for utt, path in tables["wav.scp"]:
            assert Path(path).is_absolute() and Path(path) == out / "wav" / f"{utt}.wav"
            assert Path(path).is_file()
        data = load_data_dir(root, split)  # the recipes' own reader accepts it
        data.validate()
        assert sorted(data.text) == utts


@pytest.mark.slow
def test_same_seed_is_byte_identical_and_another_seed_differs(corpus, tmp_path):
    out, _ = corpus
    again = synth.synthesize_corpus(tmp_path / "again", 12, 4, seed=0)
    assert not again["cached"]
    for split in ("train", "eval"):
        assert (tmp_path / "again" / split / "text").read_text() == \
            (out / split / "text").read_text()
    assert wav_bytes(tmp_path / "again") == wav_bytes(out)
    synth.synthesize_corpus(tmp_path / "other", 12, 4, seed=1)
    assert (tmp_path / "other" / "train" / "text").read_text() != \
        (out / "train" / "text").read_text()
    assert not set(wav_bytes(tmp_path / "other").values()) & set(wav_bytes(out).values())


@pytest.mark.slow
def test_stamp_makes_a_second_call_fast_and_writes_nothing(corpus):
    out, summary = corpus
    before = snapshot(out)
    start = time.monotonic()
    again = synth.synthesize_corpus(out, num_train=12, num_eval=4, seed=0)
    assert time.monotonic() - start < 1.0
    assert again["cached"] and {**again, "cached": False} == summary
    assert snapshot(out) == before


@pytest.mark.slow
def test_other_parameters_replace_the_corpus_and_leave_no_partial_dirs(tmp_path):
    out = tmp_path / "corpus"
    synth.synthesize_corpus(out, 2, 1, seed=5)
    summary = synth.synthesize_corpus(out, 3, 1, seed=5)
    assert not summary["cached"] and summary["num_train"] == 3
    assert len(read_table(out / "train" / "text")) == 3 and len(list(out.glob("wav/*"))) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_refuses_a_directory_that_is_not_a_corpus(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a synthesized corpus"):
        synth.synthesize_corpus(tmp_path, 2, 1)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_missing_library_is_a_one_line_user_error(tmp_path, monkeypatch):
    import espeakng_loader

    monkeypatch.setattr(espeakng_loader, "get_library_path",
                        lambda: str(tmp_path / "libespeak-ng.so"))
    with pytest.raises(UserError) as err:
        synth.synthesize_corpus(tmp_path / "out", 2, 1)
    assert "pip install espeakng-loader" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setitem(sys.modules, "espeakng_loader", None)
    with pytest.raises(UserError, match="pip install espeakng-loader"):
        synth.synthesize_corpus(tmp_path / "out", 2, 1)
    assert not (tmp_path / "out").exists()


def test_bad_counts_are_user_errors(capsys, tmp_path):
    assert synth.main([str(tmp_path / "out"), "--train", "0", "--eval", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("synth: error: ") and "num_train" in err and "\n" not in err


def test_resample_keeps_the_band_and_removes_aliases():
    t = np.arange(22050) / 22050
    low = synth.resample(np.sin(2 * np.pi * 1000 * t), 22050, 16000)
    assert len(low) == 16000
    expected = np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)
    assert np.max(np.abs(low - expected)[100:-100]) < 1e-3
    high = synth.resample(np.sin(2 * np.pi * 9000 * t), 22050, 16000)
    assert np.max(np.abs(high[100:-100])) < 1e-2


@pytest.mark.slow
def test_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "recipes.speech.synth", str(tmp_path / "c"),
                           "--train", "2", "--eval", "1", "--seed", "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 train + 1 eval utterances" in proc.stdout
    assert len(read_table(tmp_path / "c" / "eval" / "text")) == 1
