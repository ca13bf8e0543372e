"""The speech path end to end: spoken digits trained on real ranks to a WER, adpsgd-prepare's
stages, and data mistakes caught as one line before any rank starts."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import soundfile as sf

from recipes.speech.kaldi_data import write_data_dir
from runner.commands.prepare import main as prepare_main
from runner.commands.score import main as score_main

from conftest import read_run, run_cli

# A test-sized corpus: a third of the default's utterances and voices, 4 epochs (2026-12-04,
# the run below with seeds 0-3: final WER 20.5, 16.0, 22.0, 22.0 against the test's 30;
# 5 epochs reached 9.9 for a quarter more CPU, 3 only 62.3).
SMALL = ["recipe=spoken_digits", "recipe.synth.num_train=640", "recipe.synth.num_eval=64",
         "recipe.synth.train_speakers=40", "trainer.epochs=4", "trainer.batch_size=16",
         "optim.lr=0.4"]


@pytest.fixture(scope="module")
def speech_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("speech")
    run_dir = root / "run"
    # Beam search over a lexicon of the training words: the decoding users would pick.
    run_cli([*SMALL, "algo=ssgd", "launcher.nprocs=2", "recipe.decode.beam_size=8",
             "recipe.decode.lexicon=train", f"recipe.data.cache_dir={root / 'cache'}",
             f"hydra.run.dir={run_dir}"], cwd=root, timeout=600)
    return run_dir


@pytest.mark.mpi
@pytest.mark.slow
def test_spoken_digits_on_2_ranks_reaches_a_wer_below_30_percent(speech_run):
    metrics, summary = read_run(speech_run)
    assert summary["status"] == "completed" and summary["nprocs"] == 2
    assert summary["wer"] < 30.0, [m["wer"] for m in metrics]
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[-1]["wer"] < metrics[0]["wer"]
    assert all({"wer", "loss", "lr", "samples", "wall_s"} <= set(m) for m in metrics)
    assert "wer_swb" not in summary["final"]  # digit utterance ids belong to no Hub5 subset


@pytest.mark.mpi
@pytest.mark.slow
def test_tensorboard_has_wer_lr_and_decoded_examples(speech_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(speech_run / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert {"eval/wer", "eval/loss", "train/loss", "train/lr"} <= set(events.Tags()["scalars"])
    panels = events.Tensors("eval/examples/text_summary")
    assert len(panels) == 4  # one per evaluation
    table = panels[-1].tensor_proto.string_val[0].decode()
    assert table.startswith("| utterance | reference | hypothesis |")
    rows = table.splitlines()[2:]
    assert len(rows) == 4 and all(row.count("|") == 4 for row in rows)


# ---------------------------------------------------------------- data mistakes, one line


def kaldi_dir(root, name: str, rate: int = 16000, texts: dict | None = None):
    """A Kaldi data dir of three short noise recordings."""
    audio = root / f"{name}-audio"
    audio.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    wavs = {}
    for utt in ("u1", "u2", "u3"):
        path = audio / f"{utt}.wav"
        sf.write(str(path), (0.1 * rng.standard_normal(rate // 2)).astype(np.float32), rate,
                 subtype="PCM_16")
        wavs[utt] = str(path)
    texts = texts if texts is not None else {"u1": "one", "u2": "two", "u3": "three"}
    return write_data_dir(root / name, wavs, texts, {utt: "spk" for utt in texts})


def break_missing_wav(root):
    data = kaldi_dir(root, "train")
    (root / "train-audio" / "u2.wav").unlink()
    return data


def break_truncated_wav(root):
    """u2.wav's header intact, half its samples gone (a copy cut short)."""
    data = kaldi_dir(root, "train")
    wav = root / "train-audio" / "u2.wav"
    with wav.open("r+b") as f:
        f.truncate(44 + (wav.stat().st_size - 44) // 2)
    return data


def break_wav_is_a_directory(root):
    data = kaldi_dir(root, "train")
    (root / "train-audio" / "u2.wav").unlink()
    (root / "train-audio" / "u2.wav").mkdir()
    return data


def break_empty_text(root):
    data = kaldi_dir(root, "train")
    (data / "text").write_text("")
    return data


def break_empty_transcript(words: str):
    def broken(root):
        data = kaldi_dir(root, "train")
        (data / "text").write_text(f"u1 one\n{words}\nu3 three\n")
        return data
    return broken


def break_missing_text(root):
    data = kaldi_dir(root, "train")
    (data / "text").unlink()
    return data


def break_utterance_not_in_wav_scp(root):
    data = kaldi_dir(root, "train")
    (data / "text").write_text("u1 one\nu2 two\nu3 three\nu9 nine\n")
    return data


DATA_MISTAKES = {
    "missing wav file": (break_missing_wav, "u2.wav", "does not exist"),
    "a wav file cut short": (break_truncated_wav, "u2.wav", "'u2' is cut short: its header "
                             "declares"),
    "wav.scp entry that is a directory": (break_wav_is_a_directory, "u2.wav",
                                          "is a directory, not an audio file"),
    "empty text": (break_empty_text, "train data dir", "has no utterances"),
    "missing text": (break_missing_text, "train data dir", "has no text"),
    # An id with no words (or only spaces): scored, WER 104 %; trained, an empty CTC target.
    "an utterance without words": (break_empty_transcript("u2"), "text:2",
                                   "'u2' (", "has an empty transcript"),
    "an utterance of spaces": (break_empty_transcript("u2    "), "text:2",
                               "has an empty transcript"),
    "utterance not in wav.scp": (break_utterance_not_in_wav_scp, "u9", "wav.scp"),
    "sample-rate mismatch": (lambda root: kaldi_dir(root, "train", rate=8000), "8000",
                             "sample_rate"),
}


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Fix:" in lines[0] and "Traceback" not in stderr, lines[0]
    return lines[0]


@pytest.mark.parametrize("mistake", sorted(DATA_MISTAKES))
def test_a_data_mistake_is_one_line_naming_the_file_and_the_fix(tmp_path, capsys, mistake):
    make, *fragments = DATA_MISTAKES[mistake]
    train, heldout = make(tmp_path), kaldi_dir(tmp_path, "eval")
    status = prepare_main(["recipe=swb300", f"recipe.data.train={train}",
                           f"recipe.data.eval={heldout}", "recipe.data.sample_rate=16000",
                           f"recipe.data.cache_dir={tmp_path / 'cache'}"])
    line = one_error_line(capsys.readouterr().err)
    assert status == 2 and line.startswith("adpsgd-prepare: error: ")
    for fragment in fragments:
        assert fragment in line, (fragment, line)


@pytest.mark.slow
def test_an_eval_set_with_no_utterances_stops_adpsgd_run_before_ranks_start(tmp_path):
    train, heldout = kaldi_dir(tmp_path, "train"), kaldi_dir(tmp_path, "eval", texts={})
    proc = run_cli(["recipe=swb300", f"recipe.data.train={train}", f"recipe.data.eval={heldout}",
                    "recipe.data.sample_rate=16000", f"recipe.data.cache_dir={tmp_path / 'c'}",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, check=False, timeout=120)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 2 and "eval" in line and "no utterances" in line, line
    assert not (tmp_path / "run" / "logs" / "rank0.log").exists()  # no rank started


@pytest.mark.slow
def test_prepare_runs_stages_once_and_lists_them(tmp_path, capsys):
    common = [*SMALL[:5], "recipe.synth.num_train=16", "recipe.synth.num_eval=4",
              f"recipe.data.cache_dir={tmp_path}"]
    assert prepare_main(["--list", *common]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "stage 0: synthesize the corpus", "stage 1: features of the train set",
        "stage 2: features of the eval set"]
    assert prepare_main(["--stop-stage", "0", *common]) == 0
    assert "stage 1" not in capsys.readouterr().out
    assert not (tmp_path / "features").exists()
    assert prepare_main(common) == 0
    first = capsys.readouterr().out
    assert "built in" not in first and "(cached)" in first  # stage 0 was done already
    features = sorted(p for p in (tmp_path / "features").rglob("*") if p.is_file())
    stamps = [p.stat().st_mtime_ns for p in features]
    assert prepare_main(["--stage", "1", *common]) == 0  # a rerun recomputes nothing
    assert [p.stat().st_mtime_ns for p in features] == stamps


@pytest.mark.mpi
@pytest.mark.slow
def test_adpsgd_score_on_the_runs_decode_files_gives_the_runs_wer(speech_run):
    _, summary = read_run(speech_run)
    ref, hyp = speech_run / "decode" / "eval.ref.txt", speech_run / "decode" / "eval.hyp.txt"
    assert len(ref.read_text().splitlines()) == len(hyp.read_text().splitlines()) == 64
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert score_main([str(ref), str(hyp), "--json"]) == 0
    scored = json.loads(out.getvalue())
    assert scored["wer"] == pytest.approx(summary["wer"], abs=1e-9), (scored, summary["wer"])
