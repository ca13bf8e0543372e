"""CTC decoding: greedy and flashlight-text beam search, with and without a lexicon."""

import importlib.util

import pytest
import torch

from recipes.speech.decoding import CTCDecoder, DecodeConfig, write_lexicon
from recipes.speech.tokens import CharTokenizer
from runner.errors import ConfigError

TOKENIZER = CharTokenizer()


def emissions(frames: list[dict[str, float]]) -> torch.Tensor:
    """(1, T, V) log-probabilities: each frame gives probabilities to a few symbols (a space
    is the word boundary, "" the blank) and spreads the rest over the others."""
    rows = []
    for frame in frames:
        probs = torch.full((len(TOKENIZER),), 1e-4)
        for symbol, p in frame.items():
            probs[TOKENIZER.index[symbol] if symbol else 0] = p
        rows.append((probs / probs.sum()).log())
    return torch.stack(rows)[None]


def spell(text: str) -> list[dict[str, float]]:
    """Peaky frames for ``text``: every character, then a blank."""
    return [frame for c in text for frame in ({c: 0.97}, {"": 0.97})]


def decode(cfg: DecodeConfig, frames, words=()):
    log_probs = emissions(frames)
    return CTCDecoder(cfg, TOKENIZER, words)(log_probs, torch.tensor([log_probs.shape[1]]))[0]


def test_greedy_and_lexicon_free_beam_agree_on_clear_frames():
    frames = spell("oh two nine")
    assert decode(DecodeConfig(), frames) == ["oh", "two", "nine"]
    assert decode(DecodeConfig(beam_size=8), frames) == ["oh", "two", "nine"]


def test_a_lexicon_turns_a_misspelling_into_the_word_it_almost_is():
    # The second "e" of "three" is a little less likely than a blank: the best path drops it.
    frames = [*spell("thre"), {"e": 0.45, "": 0.55}, {"": 0.97}]
    assert decode(DecodeConfig(), frames) == ["thre"]
    words = ["one", "two", "three", "tree"]
    assert decode(DecodeConfig(beam_size=16, lexicon="train"), frames, words) == ["three"]


def test_lexicon_file_from_training_words(tmp_path):
    path = tmp_path / "lexicon.txt"
    assert write_lexicon(["nine", "oh", "nine", "café", ""], TOKENIZER, path) == 2
    assert path.read_text().splitlines() == ["nine n i n e |", "oh o h |"]
    assert decode(DecodeConfig(beam_size=8, lexicon=str(path)), spell("nine oh")) == [
        "nine", "oh"]


@pytest.mark.parametrize("cfg,problem,fix", [
    (DecodeConfig(beam_size=-1), "must be >= 0", "beam_size=0"),
    (DecodeConfig(beam_size=4, lm="/no/such.arpa", lexicon="train"), "does not exist",
     "decode.lm=null"),
    (DecodeConfig(beam_size=4, lexicon="/no/lexicon.txt"), "does not exist",
     "decode.lexicon=null"),
])
def test_bad_decoding_options_are_one_line_errors(cfg, problem, fix):
    with pytest.raises(ConfigError) as error:
        cfg.check("recipe.decode")
    assert problem in str(error.value) and fix in str(error.value)


def test_a_language_model_needs_a_lexicon(tmp_path):
    lm = tmp_path / "lm.arpa"
    lm.write_text("\\data\\\n")
    with pytest.raises(ConfigError, match="needs a lexicon. Fix: recipe.decode.lexicon=train"):
        DecodeConfig(beam_size=4, lm=str(lm)).check("recipe.decode")


def test_beam_search_without_flashlight_text_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flashlight" else real(name, *a))
    with pytest.raises(ConfigError) as error:
        DecodeConfig(beam_size=4).check("recipe.decode")
    assert "needs flashlight-text" in str(error.value)
    assert "adpsgd[beam]" in str(error.value) and "beam_size=0" in str(error.value)
    DecodeConfig(beam_size=0).check("recipe.decode")  # greedy needs nothing
