"""The hybrid head: frame-level cross-entropy on Kaldi alignments (recipe.model.head=ce).

The data are real Kaldi files: WAVs of noise, a low tone and a high tone in a random order,
a data dir, and alignments of every 10 ms frame to its class written with kaldiio, one set as
a binary ark/scp pair and one as a text ark (what ``ali-to-pdf ... ark,t:-`` prints)."""

from __future__ import annotations

import kaldiio
import numpy as np
import pytest
import soundfile as sf

from recipes import RECIPES
from recipes.speech.kaldi_data import write_data_dir
from runner.errors import UserError

from conftest import read_run, run_cli

RATE, SHIFT, WINDOW = 16000, 160, 400
TONES = {1: 400.0, 2: 1800.0}  # class 0 is noise only


def utterance(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One second of three segments of random classes, and each frame's class."""
    bounds = np.sort(rng.integers(3000, 13000, size=2))
    classes = rng.permutation(3)
    audio = 0.01 * rng.standard_normal(RATE)
    for cls, start, stop in zip(classes, [0, *bounds], [*bounds, RATE]):
        if cls:
            t = np.arange(start, stop) / RATE
            audio[start:stop] += 0.3 * np.sin(2 * np.pi * TONES[cls] * t)
    frames = 1 + (RATE - WINDOW) // SHIFT
    centres = np.arange(frames) * SHIFT + WINDOW // 2
    labels = classes[np.searchsorted(bounds, centres, side="right")]
    return audio.astype(np.float32), labels.astype(np.int32)


def corpus(root, name: str, count: int, seed: int, text_ark: bool) -> tuple:
    rng = np.random.default_rng(seed)
    wavs, texts, alignments = {}, {}, {}
    (root / "audio").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        utt = f"{name}{i:03d}"
        audio, labels = utterance(rng)
        path = root / "audio" / f"{utt}.wav"
        sf.write(str(path), audio, RATE, subtype="PCM_16")
        wavs[utt], texts[utt], alignments[utt] = str(path), "tones", labels
    data = write_data_dir(root / name, wavs, texts, {utt: "spk" for utt in texts})
    if text_ark:
        ali = root / f"{name}.ali.txt"
        ali.write_text("".join(f"{u} {' '.join(map(str, a))}\n" for u, a in alignments.items()))
    else:
        ali = root / f"{name}.ali.scp"
        kaldiio.save_ark(str(root / f"{name}.ali.ark"), alignments, scp=str(ali))
    return data, ali


def hybrid_args(root, train, train_ali, heldout, eval_ali) -> list[str]:
    return ["recipe=swb300", f"recipe.data.train={train}", f"recipe.data.eval={heldout}",
            f"recipe.data.train_alignments={train_ali}", f"recipe.data.eval_alignments={eval_ali}",
            "recipe.data.sample_rate=16000", f"recipe.data.cache_dir={root / 'cache'}",
            "recipe.model.head=ce", "recipe.model.num_targets=3", "recipe.features.deltas=0",
            "recipe.model.num_layers=1", "recipe.model.hidden_size=32",
            "recipe.model.bottleneck=16", "recipe.model.dropout=0"]


@pytest.mark.mpi
@pytest.mark.slow
def test_cross_entropy_on_alignments_learns_the_frame_classes_on_2_ranks(tmp_path):
    train, train_ali = corpus(tmp_path, "train", 64, seed=0, text_ark=True)
    heldout, eval_ali = corpus(tmp_path, "eval", 16, seed=1, text_ark=False)
    run_dir = tmp_path / "run"
    run_cli([*hybrid_args(tmp_path, train, train_ali, heldout, eval_ali), "algo=ssgd",
             "launcher.nprocs=2", "trainer.epochs=4", "trainer.batch_size=8", "optim.lr=0.4",
             f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    metrics, summary = read_run(run_dir)
    assert summary["frame_acc"] > 90.0, [m["frame_acc"] for m in metrics]
    assert {"frame_acc", "loss"} <= set(metrics[-1]) and "wer" not in metrics[-1]
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    assert not (run_dir / "decode").exists()  # no words to write without a decoding graph


def recipe_for(tmp_path, **alignment_overrides):
    from hydra import compose, initialize_config_module

    from runner.commands.compose import validate

    train, train_ali = corpus(tmp_path, "train", 2, seed=0, text_ark=True)
    heldout, eval_ali = corpus(tmp_path, "eval", 2, seed=1, text_ark=False)
    args = hybrid_args(tmp_path, train, train_ali, heldout, eval_ali)
    args += [f"recipe.{key}={value}" for key, value in alignment_overrides.items()]
    with initialize_config_module(config_module="runner.conf", version_base=None):
        cfg = validate(compose("config", overrides=args))
    recipe = RECIPES.get("swb300")(cfg.recipe)
    recipe.prepare()
    return recipe


def test_a_pdf_id_beyond_num_targets_names_the_utterance(tmp_path):
    recipe = recipe_for(tmp_path, **{"model.num_targets": 2})
    train, _ = recipe.datasets()
    with pytest.raises(UserError, match=r"pdf id 2 outside 0..1.*Fix: set recipe.model"):
        for index in range(len(train)):
            train[index]


def test_alignments_of_another_frame_rate_are_refused(tmp_path):
    recipe = recipe_for(tmp_path)
    train, _ = recipe.datasets()
    alignments = recipe.head.alignments["train"]
    utt = train.utts[0]
    alignments[utt] = alignments[utt][::2]  # 20 ms frames
    with pytest.raises(UserError, match=rf"{utt}.*49 aligned frames but 98 feature frames"):
        train[0]


@pytest.mark.parametrize("args,key", [
    ([], "recipe.model.num_targets: head=ce needs the number of pdfs"),
    (["recipe.model.num_targets=9"], "recipe.data.train_alignments: head=ce needs train"),
    (["recipe.model.num_targets=9", "recipe.data.train_alignments=/no/ali.scp"],
     "recipe.data.train_alignments: head=ce needs train alignments, got '/no/ali.scp'"),
])
def test_the_ce_head_needs_the_number_of_pdfs_and_existing_alignments(capsys, args, key):
    from runner.commands.run import check_command_line

    with pytest.raises(SystemExit):
        check_command_line(["recipe=swb300", "recipe.model.head=ce", *args])
    line = capsys.readouterr().err.strip()
    assert key in line and "Fix:" in line and "\n" not in line, line
