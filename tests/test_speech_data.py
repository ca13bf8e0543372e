"""Kaldi data directories, fbank features and the feature cache, on tiny generated WAVs."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

from recipes.speech import features as feat_mod
from recipes.speech.features import (
    FbankOptions,
    apply_cmvn,
    compute_cmvn_stats,
    compute_fbank,
    load_features,
    prepare_features,
    speaker_mean_normalize,
)
from recipes.speech.kaldi_data import KaldiDataDir, load_data_dir, read_audio, write_data_dir
from runner.errors import UserError

RATE = 16000


def tone(seconds: float, freq: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def int16(samples: np.ndarray) -> np.ndarray:
    return np.round(samples * 32768).clip(-32768, 32767).astype(np.int16)


def pcm16(samples: np.ndarray) -> np.ndarray:
    """What :func:`write_wav` of ``samples`` reads back as."""
    return int16(samples) / np.float32(32768)


def write_wav(path: Path, samples: np.ndarray, rate: int = RATE) -> Path:
    # Integers are written exactly; soundfile's own float -> PCM rounding differs by 1 LSB.
    sf.write(str(path), int16(samples), rate, subtype="PCM_16")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Three utterances of two speakers, one recording per utterance, no segments."""
    audio = tmp_path / "audio"
    audio.mkdir()
    wavs = {"rec_a": write_wav(audio / "a.wav", tone(0.5, 300)),
            "rec_b": write_wav(audio / "b.wav", tone(0.8, 500)),
            "rec_c": write_wav(audio / "c.wav", tone(0.3, 700))}
    return write_data_dir(tmp_path / "data", {r: str(p) for r, p in wavs.items()},
                          {"rec_a": "one two", "rec_b": "three", "rec_c": "four five six"},
                          {"rec_a": "spk1", "rec_b": "spk1", "rec_c": "spk2"})


def assert_user_error(excinfo: pytest.ExceptionInfo, *fragments: str) -> str:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, UserError)
    assert "\n" not in message and "Fix:" in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# ----------------------------------------------------------------------------- data dirs


def test_write_and_load_without_segments(corpus: Path) -> None:
    data = load_data_dir(corpus)
    assert data.utterances == ["rec_a", "rec_b", "rec_c"]
    assert data.segments is None and data.feats_scp is None and data.cmvn_scp is None
    assert data.text["rec_c"] == "four five six"
    assert data.spk2utt == {"spk1": ["rec_a", "rec_b"], "spk2": ["rec_c"]}
    assert (corpus / "spk2utt").read_text() == "spk1 rec_a rec_b\nspk2 rec_c\n"
    audio, rate = read_audio(data, "rec_b", sample_rate=RATE)
    assert rate == RATE and audio.dtype == np.float32 and audio.shape == (int(0.8 * RATE),)
    np.testing.assert_array_equal(audio, pcm16(tone(0.8, 500)))


@pytest.mark.slow
def test_hand_written_kaldi_dir_with_segments(tmp_path: Path) -> None:
    """Files as Kaldi's swbd recipe writes them: unsorted input, 2-decimal times, pipes."""
    samples = tone(2.0, 440)
    wav = write_wav(tmp_path / "sw02001.wav", samples)
    data_dir = tmp_path / "train"
    data_dir.mkdir()
    (data_dir / "wav.scp").write_text(f"sw02001-A cat {wav} |\n")
    (data_dir / "segments").write_text("sw02001-A_000098-000150 sw02001-A 0.98 1.50\n"
                                       "sw02001-A_000000-000050 sw02001-A 0.00 0.50\n")
    (data_dir / "text").write_text("sw02001-A_000098-000150 uh-huh  yeah\n"
                                   "sw02001-A_000000-000050 hi um\n")
    (data_dir / "utt2spk").write_text("sw02001-A_000000-000050 sw02001-A\n"
                                      "sw02001-A_000098-000150 sw02001-A\n")
    (data_dir / "feats.scp").write_text("")
    data = load_data_dir(data_dir)
    assert data.utterances == ["sw02001-A_000000-000050", "sw02001-A_000098-000150"]
    assert data.text["sw02001-A_000098-000150"] == "uh-huh yeah"
    assert data.wav_scp["sw02001-A"] == f"cat {wav} |"
    assert data.segments["sw02001-A_000098-000150"] == ("sw02001-A", 0.98, 1.50)
    assert data.feats_scp == data_dir / "feats.scp"
    audio, _ = read_audio(data, "sw02001-A_000098-000150", RATE)
    np.testing.assert_array_equal(audio, pcm16(samples)[15680:24000])


def test_segments_round_trip_and_end_of_recording(tmp_path: Path) -> None:
    samples = tone(1.0, 250)
    wav = write_wav(tmp_path / "r.wav", samples)
    root = write_data_dir(tmp_path / "d", {"r": str(wav)}, {"u1": "a", "u2": "b"},
                          {"u1": "s", "u2": "s"},
                          segments={"u1": ("r", 0.125, 0.5), "u2": ("r", 0.5, -1)})
    data = load_data_dir(root)
    assert data.segments["u1"] == ("r", 0.125, 0.5)
    first, _ = data.read_audio("u1")
    rest, _ = data.read_audio("u2")  # end -1: to the end of the recording
    np.testing.assert_array_equal(first, pcm16(samples)[2000:8000])
    np.testing.assert_array_equal(rest, pcm16(samples)[8000:])


@pytest.mark.slow
def test_pipe_commands_cat_and_python(tmp_path: Path) -> None:
    samples = tone(0.6, 330)
    wav = write_wav(tmp_path / "x.wav", samples)
    script = ("import io, sys, numpy as np, soundfile as sf; b = io.BytesIO(); "
              "t = np.arange(8000) / 16000; "
              "x = np.round(0.25 * np.sin(2 * np.pi * 200 * t) * 32768).astype(np.int16); "
              "sf.write(b, x, 16000, format='WAV'); sys.stdout.buffer.write(b.getvalue())")
    root = write_data_dir(tmp_path / "d",
                          {"cat_rec": f"cat {shlex.quote(str(wav))} |",
                           "py_rec": f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} |"},
                          {"cat_rec": "x", "py_rec": "y"}, {"cat_rec": "s1", "py_rec": "s2"})
    data = load_data_dir(root)
    data.validate(check_audio_files=True)
    audio, rate = data.read_audio("cat_rec", RATE)
    np.testing.assert_array_equal(audio, pcm16(samples))
    audio, rate = data.read_audio("py_rec", RATE)
    t = np.arange(8000) / 16000
    np.testing.assert_array_equal(audio, pcm16(0.25 * np.sin(2 * np.pi * 200 * t)))
    assert rate == RATE


def test_missing_utt2spk_means_one_speaker_per_utterance(corpus: Path) -> None:
    (corpus / "utt2spk").unlink()
    data = load_data_dir(corpus)
    assert data.utt2spk == {u: u for u in data.utterances}


def test_subset(corpus: Path) -> None:
    sub = load_data_dir(corpus).subset(["rec_c", "rec_a", "unknown"])
    assert sub.utterances == ["rec_a", "rec_c"] and set(sub.utt2spk) == {"rec_a", "rec_c"}


# ------------------------------------------------------------------------------ errors


def test_missing_data_dir(tmp_path: Path) -> None:
    with pytest.raises(UserError) as excinfo:
        load_data_dir(tmp_path / "nope", role="train")
    assert_user_error(excinfo, "nope", "does not exist", "swbd1_data_prep.sh",
                      "fix_data_dir.sh", "recipe.data.train")


def test_missing_text(corpus: Path) -> None:
    (corpus / "text").unlink()
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus)
    assert_user_error(excinfo, str(corpus), "no text")


def test_empty_text(corpus: Path) -> None:
    (corpus / "text").write_text("")
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus, role="train")
    assert_user_error(excinfo, "train data dir", str(corpus / "text"), "no utterances",
                      "recipe.data.train")


def test_eval_set_without_utterances(corpus: Path) -> None:
    (corpus / "text").write_text("\n")
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus, role="eval")
    assert_user_error(excinfo, "eval data dir", "no utterances", "recipe.data.eval")
    (corpus / "text").write_text("rec_a hello\n")
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus, role="eval").subset(["rec_b"])
    assert_user_error(excinfo, "eval data dir", "no utterances")


def test_missing_wav_file(corpus: Path) -> None:
    (corpus.parent / "audio" / "b.wav").unlink()
    data = load_data_dir(corpus)  # loading reads no audio: the check is lazy
    with pytest.raises(UserError) as excinfo:
        data.read_audio("rec_b")
    assert_user_error(excinfo, "b.wav", "rec_b", "does not exist")
    with pytest.raises(UserError) as excinfo:
        data.validate(check_audio_files=True)
    message = assert_user_error(excinfo, "b.wav", "rec_b", "wav.scp")
    assert "relative path" not in message  # absolute: nothing to explain
    data.validate(check_audio_files=False)


def test_a_missing_relative_wav_path_says_what_it_was_taken_against(
        corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scp = corpus / "wav.scp"
    scp.write_text(scp.read_text().replace(str(corpus.parent / "audio") + "/", "audio/"))
    monkeypatch.chdir(corpus)  # not the dir the relative paths were written for
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus).validate(check_audio_files=True)
    assert_user_error(excinfo, "audio file audio/a.wav (a relative path: taken from the "
                      f"current directory {corpus}, as Kaldi does)")


def test_missing_file_inside_pipe_command(tmp_path: Path) -> None:
    root = write_data_dir(tmp_path / "d", {"r": f"cat {tmp_path / 'gone.sph'} |"}, {"r": "a"},
                          {"r": "s"})
    with pytest.raises(UserError) as excinfo:
        load_data_dir(root).validate()
    assert_user_error(excinfo, "gone.sph", "'r'")


@pytest.mark.slow
def test_failing_pipe_command(tmp_path: Path) -> None:
    root = write_data_dir(tmp_path / "d", {"r": "sh -c 'echo broken >&2; exit 3' |"},
                          {"r": "a"}, {"r": "s"})
    with pytest.raises(UserError) as excinfo:
        load_data_dir(root).read_audio("r")
    assert_user_error(excinfo, "'r'", "status 3", "echo broken", "broken")


def test_sample_rate_mismatch(tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "narrow.wav", tone(0.5, 300, rate=8000), rate=8000)
    data = load_data_dir(write_data_dir(tmp_path / "d", {"u": str(wav)}, {"u": "a"}, {"u": "s"}))
    with pytest.raises(UserError) as excinfo:
        data.read_audio("u", sample_rate=16000)
    assert_user_error(excinfo, "narrow.wav", "8000 Hz", "16000 Hz", "recipe.data.sample_rate=8000",
                      "resample")


def test_utterance_not_in_wav_scp(corpus: Path) -> None:
    (corpus / "text").write_text((corpus / "text").read_text() + "rec_z orphan\n")
    (corpus / "utt2spk").write_text((corpus / "utt2spk").read_text() + "rec_z spk3\n")
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus)
    assert_user_error(excinfo, "rec_z", f"{corpus / 'text'}:4", "wav.scp")


def test_segment_recording_not_in_wav_scp(corpus: Path) -> None:
    (corpus / "segments").write_text("rec_a rec_a 0 0.2\nrec_b rec_x 0 0.2\nrec_c rec_c 0 0.2\n")
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus)
    assert_user_error(excinfo, "rec_x", "rec_b", "wav.scp")


@pytest.mark.parametrize(("name", "content", "line"), [
    ("segments", "rec_a rec_a 0 0.2\nrec_b rec_b zero 0.2\n", 2),
    ("segments", "rec_a rec_a 0.5 0.2\n", 1),
    ("utt2spk", "rec_a spk1\nrec_b\n", 2),
    ("wav.scp", "rec_a\n", 1),
    ("text", "rec_a one\nrec_a two\n", 2),
])
def test_malformed_line_names_file_and_line(corpus: Path, name: str, content: str,
                                            line: int) -> None:
    (corpus / name).write_text(content)
    with pytest.raises(UserError) as excinfo:
        load_data_dir(corpus)
    assert_user_error(excinfo, f"{corpus / name}:{line}")


def test_bad_options_and_missing_features(tmp_path: Path) -> None:
    with pytest.raises(UserError) as excinfo:
        FbankOptions(deltas=3).check()
    assert_user_error(excinfo, "recipe.features.deltas=3", "deltas=2")
    with pytest.raises(UserError) as excinfo:
        load_features(tmp_path / "feats.scp")
    assert_user_error(excinfo, "feats.scp", "does not exist")


def test_utterance_shorter_than_a_frame(tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "blip.wav", tone(0.01, 300))
    root = write_data_dir(tmp_path / "d", {"u": str(wav)}, {"u": "a"}, {"u": "s"})
    with pytest.raises(UserError) as excinfo:
        prepare_features(root, tmp_path / "f")
    assert_user_error(excinfo, "'u'", "shorter than one 25 ms frame")
    assert not (tmp_path / "f" / "prepared.json").exists()


# ---------------------------------------------------------------------------- features


def test_fbank_matches_torchaudio_on_int16_scale() -> None:
    samples = pcm16(tone(0.5, 440) + tone(0.5, 1200) * 0.5)
    got = compute_fbank(samples, FbankOptions())
    want = kaldi.fbank(torch.from_numpy(samples).unsqueeze(0) * 32768, num_mel_bins=40,
                       frame_length=25.0, frame_shift=10.0, dither=0.0, energy_floor=0.0,
                       sample_frequency=16000.0)
    assert got.shape == (48, 40)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # int16 samples are already on Kaldi's scale, and give the same features
    as_int = compute_fbank(int16(samples))
    torch.testing.assert_close(as_int, got, rtol=0, atol=0)
    # dither 0 is deterministic
    torch.testing.assert_close(compute_fbank(samples), got, rtol=0, atol=0)


def test_deltas_give_120_dims() -> None:
    samples = tone(0.4, 440)
    static = compute_fbank(samples)
    full = compute_fbank(samples, FbankOptions(deltas=2))
    assert FbankOptions(deltas=2).feature_dim == 120
    assert full.shape == (static.shape[0], 120)
    torch.testing.assert_close(full[:, :40], static, rtol=0, atol=0)
    assert compute_fbank(samples, FbankOptions(deltas=1)).shape[1] == 80


def test_kaldiio_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    mats = {f"utt{i}": rng.standard_normal((5 + i, 40)).astype(np.float32) for i in range(3)}
    kaldiio.save_ark(str(tmp_path / "f.ark"), mats, scp=str(tmp_path / "f.scp"))
    loaded = load_features(tmp_path / "f.scp")
    assert list(loaded) == sorted(mats)
    for utt, mat in mats.items():
        assert loaded[utt].dtype == torch.float32
        np.testing.assert_array_equal(loaded[utt].numpy(), mat)
    assert list(load_features(tmp_path / "f.scp", utterances=["utt2"])) == ["utt2"]


def test_speaker_mean_normalize_zero_mean() -> None:
    rng = np.random.default_rng(1)
    feats = {f"u{i}": torch.from_numpy(rng.normal(3.0 * i, 1.0, (10 + i, 4)).astype(np.float32))
             for i in range(4)}
    utt2spk = {"u0": "a", "u1": "a", "u2": "b", "u3": "b"}
    normed = speaker_mean_normalize(feats, utt2spk)
    for speaker in ("a", "b"):
        frames = torch.cat([normed[u] for u, s in utt2spk.items() if s == speaker])
        torch.testing.assert_close(frames.double().mean(0), torch.zeros(4, dtype=torch.float64),
                                   atol=1e-5, rtol=0)
    stats = compute_cmvn_stats(feats, utt2spk)
    assert stats["a"].shape == (2, 5) and stats["a"][0, -1] == 21


def test_cmvn_scp_from_kaldiio(tmp_path: Path) -> None:
    """Stats as Kaldi writes them: 2 x (D+1), sums and count in row 0, squares in row 1."""
    feats = {"u1": torch.tensor([[1.0, 2.0], [3.0, 6.0]]), "u2": torch.tensor([[5.0, 10.0]])}
    stats = {"spk": np.array([[9.0, 18.0, 3.0], [35.0, 140.0, 0.0]])}
    kaldiio.save_ark(str(tmp_path / "cmvn.ark"), stats, scp=str(tmp_path / "cmvn.scp"))
    utt2spk = {"u1": "spk", "u2": "spk"}
    normed = apply_cmvn(feats, tmp_path / "cmvn.scp", utt2spk)
    torch.testing.assert_close(normed["u1"], torch.tensor([[-2.0, -4.0], [0.0, 0.0]]))
    torch.testing.assert_close(normed["u2"], torch.tensor([[2.0, 4.0]]))
    scaled = apply_cmvn(feats, tmp_path / "cmvn.scp", utt2spk, norm_vars=True)
    var = np.array([35.0 / 3 - 9.0, 140.0 / 3 - 36.0])
    torch.testing.assert_close(scaled["u2"], torch.tensor([2.0, 4.0]) / torch.tensor(var).sqrt()
                               .float().unsqueeze(0))
    with pytest.raises(UserError) as excinfo:
        apply_cmvn(feats, tmp_path / "cmvn.scp", {"u1": "spk", "u2": "other"})
    assert_user_error(excinfo, "'other'", "u2")


# ----------------------------------------------------------------------- feature cache


def stamp_and_mtimes(out: Path) -> tuple[str, dict[str, int]]:
    names = ["prepared.json", "feats.ark", "feats.scp", "cmvn.ark", "cmvn.scp"]
    return (out / "prepared.json").read_text(), {n: (out / n).stat().st_mtime_ns for n in names}


def test_prepare_features_writes_kaldi_tables(corpus: Path, tmp_path: Path) -> None:
    data = load_data_dir(corpus)
    scp = prepare_features(data, tmp_path / "feats")
    assert scp == (tmp_path / "feats" / "feats.scp").resolve()
    raw = load_features(scp)
    assert list(raw) == data.utterances
    for utt in data.utterances:
        audio, _ = data.read_audio(utt)
        torch.testing.assert_close(raw[utt], compute_fbank(audio), rtol=0, atol=0)
    normed = load_features(scp, scp.parent / "cmvn.scp", data.utt2spk)
    expected = speaker_mean_normalize(raw, data.utt2spk)
    for utt in data.utterances:
        torch.testing.assert_close(normed[utt], expected[utt], rtol=0, atol=1e-5)
    stamp = json.loads((scp.parent / "prepared.json").read_text())
    assert stamp["num_utterances"] == 3 and stamp["num_speakers"] == 2
    assert stamp["options"]["num_mel_bins"] == 40 and stamp["feature_dim"] == 40
    assert not list(scp.parent.glob(".*.tmp*"))


def test_prepare_features_rerun_is_a_no_op(corpus: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "feats"
    prepare_features(corpus, out)
    before = stamp_and_mtimes(out)

    def no_audio(*args, **kwargs):
        raise AssertionError("a current cache must not read audio")

    with monkeypatch.context() as patch:
        patch.setattr(KaldiDataDir, "read_audio", no_audio)
        prepare_features(corpus, out)
        prepare_features(load_data_dir(corpus), out, FbankOptions())
    assert stamp_and_mtimes(out) == before

    # a changed option recomputes
    scp = prepare_features(corpus, out, FbankOptions(deltas=2))
    assert json.loads((out / "prepared.json").read_text())["options"]["deltas"] == 2
    assert next(iter(load_features(scp).values())).shape[1] == 120
    # so does a changed input
    after_options = stamp_and_mtimes(out)
    (corpus / "text").write_text("rec_a one two\nrec_b three\n")
    prepare_features(corpus, out, FbankOptions(deltas=2))
    assert stamp_and_mtimes(out)[0] != after_options[0]
    assert list(load_features(out / "feats.scp")) == ["rec_a", "rec_b"]


def test_audio_replaced_in_place_is_computed_and_checked_again(corpus: Path,
                                                              tmp_path: Path) -> None:
    """The same wav.scp, the same paths, other audio: the cache is stale (its key holds each
    file's size and modification time), so the new audio's features are computed, and a
    file at another sample rate is refused as on the first run."""
    out = tmp_path / "feats"
    prepare_features(corpus, out)
    wav = Path(load_data_dir(corpus).wav_scp["rec_b"])
    write_wav(wav, tone(0.6, 900))
    prepare_features(corpus, out)
    features = load_features(out / "feats.scp")
    audio, _ = load_data_dir(corpus).read_audio("rec_b")
    torch.testing.assert_close(features["rec_b"], compute_fbank(audio), rtol=0, atol=0)
    write_wav(wav, tone(0.6, 900, rate=8000), rate=8000)
    with pytest.raises(UserError) as excinfo:
        prepare_features(corpus, out)
    assert_user_error(excinfo, "8000 Hz", "16000 Hz is expected")


def test_interrupted_run_leaves_no_complete_looking_cache(corpus: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    out = tmp_path / "feats"
    prepare_features(corpus, out)
    real = feat_mod._features_of
    calls = []

    def crash_on_second(data, utt, opts):
        calls.append(utt)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(data, utt, opts)

    with monkeypatch.context() as patch:
        patch.setattr(feat_mod, "_features_of", crash_on_second)
        with pytest.raises(KeyboardInterrupt):
            prepare_features(corpus, out, FbankOptions(num_mel_bins=23))
    assert not (out / "prepared.json").exists()
    assert not list(out.glob(".*.tmp*"))
    scp = prepare_features(corpus, out, FbankOptions(num_mel_bins=23))
    assert all(m.shape[1] == 23 for m in load_features(scp).values())


@pytest.mark.slow  # spawns two worker processes, each importing torch: seconds, not millis
def test_prepare_features_with_workers_matches_one_process(tmp_path: Path) -> None:
    samples = tone(3.0, 440)
    wav = write_wav(tmp_path / "long.wav", samples)
    segments = {f"u{i:03d}": ("rec", i * 0.05, i * 0.05 + 0.3) for i in range(40)}
    root = write_data_dir(tmp_path / "d", {"rec": f"cat {wav} |"},
                          {u: "x" for u in segments}, {u: f"s{i % 3}" for i, u in
                                                       enumerate(segments)}, segments)
    one = load_features(prepare_features(root, tmp_path / "one"))
    two = load_features(prepare_features(root, tmp_path / "two", num_workers=2))
    assert list(one) == list(two) == sorted(segments)
    for utt in one:
        torch.testing.assert_close(one[utt], two[utt], rtol=0, atol=0)
