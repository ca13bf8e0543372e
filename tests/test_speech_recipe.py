"""The speech recipe's model, tokenizer and decoding, and its one-line data errors."""

import pytest
import torch

from recipes.speech.model import BLSTMAcousticModel, parameter_count
from recipes.speech.tokens import CharTokenizer, greedy_decode

from conftest import run_cli


def test_tokenizer_round_trip_drops_characters_outside_the_alphabet():
    tokenizer = CharTokenizer()
    ids = tokenizer.encode(["don't", "stop", "n0w"])
    assert 0 not in ids  # index 0 is the CTC blank
    assert tokenizer.decode(ids) == ["don't", "stop", "nw"]


def test_greedy_decoding_merges_repeats_and_removes_blanks():
    # Frames: a a <b> a b b <b> -> "a a b" as ids [3, 3, 4] for the alphabet "ab".
    tokenizer = CharTokenizer("ab")
    frames = [2, 2, 0, 2, 3, 3, 0]
    log_probs = torch.full((1, len(frames), len(tokenizer)), -10.0)
    log_probs[0, torch.arange(len(frames)), torch.tensor(frames)] = 0.0
    assert greedy_decode(log_probs, torch.tensor([len(frames)])) == [[2, 2, 3]]
    assert greedy_decode(log_probs, torch.tensor([3])) == [[2]]  # padding is ignored


def test_the_papers_shape_has_43_million_parameters_with_their_output_layer():
    # docs/algorithms.md (H-ADPSGD): 6 BLSTM layers x 512 per direction, 256 bottleneck, 260
    # inputs and 32,000 outputs give 43.1M parameters.
    assert parameter_count(BLSTMAcousticModel(260, 32000)) == 43_154_944


@pytest.mark.parametrize("subsample", [1, 3])
def test_model_output_lengths_follow_frame_stacking(subsample):
    model = BLSTMAcousticModel(40, 29, num_layers=2, hidden_size=16, bottleneck=8,
                               subsample=subsample)
    log_probs, lengths = model(torch.randn(3, 30, 40), torch.tensor([30, 17, 2]))
    assert lengths.tolist() == [max(1, n // subsample) for n in (30, 17, 2)]
    assert log_probs.shape == (3, 30 // subsample, 29)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(3, 30 // subsample))


@pytest.mark.parametrize("args,cause,fix", [
    (["recipe=swb2000"], "no train data dir given", "recipe.data.train=DIR"),
    (["recipe=swb300", "recipe.data.train=/no/such", "recipe.data.eval=/no/such"],
     "train data dir /no/such does not exist", "recipe.data.train=/no/such"),
    (["recipe=swb2000", "recipe.features.deltas=5"], "recipe.features.deltas", "deltas=2"),
])
@pytest.mark.slow
def test_missing_switchboard_data_is_one_line_before_ranks_start(tmp_path, args, cause, fix):
    proc = run_cli(args, cwd=tmp_path, check=False, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert cause in lines[0] and "Fix:" in lines[0] and fix in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


def test_the_swb2000_recipe_builds_the_papers_shape_with_a_character_ctc_head():
    from hydra import compose, initialize_config_module

    from recipes import RECIPES
    from runner.commands.compose import validate

    with initialize_config_module(config_module="runner.conf", version_base=None):
        cfg = validate(compose("config", overrides=["recipe=swb2000"]))
    model = RECIPES.get("swb2000")(cfg.recipe).build_model()
    lstm = model.lstm
    assert (lstm.num_layers, lstm.hidden_size, lstm.bidirectional) == (6, 512, True)
    assert model.bottleneck.out_features == 256
    assert lstm.input_size == 2 * 120  # 40 log-mel + deltas, two frames stacked per step
    assert parameter_count(model) == 34_856_477  # docs/speech-data.md
