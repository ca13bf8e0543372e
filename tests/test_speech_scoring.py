"""Switchboard/Hub5'00 scoring: normalisation table, edit distance against jiwer and a full
table, per-subset totals computed by hand, the Kaldi text reader and adpsgd-score."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import jiwer
import pytest

from recipes.speech.scoring import (
    HESITATIONS,
    NORMALIZATION_RULES,
    WerStats,
    edit_ops,
    normalize_switchboard,
    read_kaldi_text,
    score_sets,
    score_texts,
    subset_of,
)
from runner.commands import score as score_cli
from runner.errors import UserError

from conftest import REPO

NORMALIZATION_CASES = [  # (transcript, scored words, what it shows)
    ("Yes I KNOW", ["yes", "i", "know"], "lowercased"),
    ("[noise] right [laughter]", ["right"], "noise and laughter tags dropped"),
    ("[vocalized-noise] okay [silence]", ["okay"], "vocalized noise and silence dropped"),
    ("i <unk> think <noise>", ["i", "think"], "angle-bracket tags dropped"),
    ("(%HESITATION) we (%hesitation) went %uh", ["we", "went"], "GLM hesitation tokens"),
    ("[laughter-yeah] that's [laughter-right]", ["yeah", "that's", "right"],
     "word said laughing is kept"),
    ("uh i um think eh mm hm ah huh er so", ["i", "think", "so"], "hesitations removed"),
    ("ha hee oof ach eee ew haha", ["haha"], "the rest of the GLM hesitations"),
    ("oh okay", ["oh", "okay"], "'oh' is a word, not a hesitation"),
    ("uh-huh mm-hmm um-hum", ["uh-huh", "mm-hmm", "um-hum"], "backchannels are scored"),
    ("hel- -lo hello - --", ["hello"], "fragments and lone dashes removed"),
    ("th[e]- the -[th]at that", ["the", "that"], "MS-State fragments with completions"),
    ("i_1 mean it_1", ["i", "mean", "it"], "lexicon pronunciation variants"),
    ("{ a / an } apple", ["a", "apple"], "STM alternation: first alternative"),
    ("{ uh / @ } yes", ["yes"], "alternation of a hesitation and nothing"),
    ("{alrighty} then", ["alrighty", "then"], "MS-State coinage braces"),
    ("[bocket/bucket] of water", ["bucket", "of", "water"], "mispronunciation: intended word"),
    ("(W-) WE (UH) WENT (I) THERE", ["we", "went", "i", "there"], "STM optional words"),
    ("<B_ASIDE> hi there <E_ASIDE>", ["hi", "there"], "aside markers"),
    ("and/or x-ray don't at&t", ["and/or", "x-ray", "don't", "at&t"], "unusual words kept"),
    ("  [noise]  ", [], "nothing left"),
    ("", [], "empty transcript"),
]


@pytest.mark.parametrize("text,words,what", NORMALIZATION_CASES,
                         ids=[case[2] for case in NORMALIZATION_CASES])
def test_normalize_switchboard(text, words, what):
    assert normalize_switchboard(text) == words, what


def test_rules_are_documented_and_hesitations_keep_oh():
    assert all(rule.why and rule.pattern.pattern for rule in NORMALIZATION_RULES)
    assert "oh" not in HESITATIONS and {"uh", "um", "eh", "mm", "hm", "ah", "huh", "er"} <= set(
        HESITATIONS)


# Plain lowercase words that normalisation leaves alone, so WER must equal jiwer's.
VOCAB = ("the a and to of i you that it yeah know so we they was like just well okay right "
         "think don't uh-huh and/or x-ray oh really what going get people").split()


def _random_pair(rng: random.Random) -> tuple[list[str], list[str]]:
    ref = [rng.choice(VOCAB) for _ in range(rng.randint(1, 25))]
    hyp = []
    for word in ref:
        roll = rng.random()
        if roll < 0.1:
            continue  # deletion
        hyp.append(rng.choice(VOCAB) if roll < 0.25 else word)  # substitution or match
        if rng.random() < 0.08:
            hyp.append(rng.choice(VOCAB))  # insertion
    if rng.random() < 0.1:
        hyp = [rng.choice(VOCAB) for _ in range(rng.randint(0, 25))]  # unrelated output
    return ref, hyp


def test_wer_equals_jiwer_on_random_sentences():
    rng = random.Random(1234)
    pairs = [_random_pair(rng) for _ in range(400)]
    for ref, hyp in pairs:
        expected = jiwer.wer(" ".join(ref), " ".join(hyp)) * 100
        assert 100 * sum(edit_ops(ref, hyp)) / len(ref) == pytest.approx(expected), (ref, hyp)
    refs = {f"sw_{i:04d}": " ".join(ref) for i, (ref, _) in enumerate(pairs)}
    hyps = {f"sw_{i:04d}": " ".join(hyp) for i, (_, hyp) in enumerate(pairs)}
    corpus = jiwer.wer(list(refs.values()), list(hyps.values())) * 100
    for normalize in (True, False):
        assert score_texts(refs, hyps, normalize)["wer"] == pytest.approx(corpus)


@pytest.mark.parametrize("ref,hyp,ops", [
    ("a b c", "a b c", (0, 0, 0)),
    ("a b c", "", (0, 3, 0)),
    ("", "a b", (0, 0, 2)),
    ("a b c", "a x c", (1, 0, 0)),
    ("a b c", "a c", (0, 1, 0)),
    ("a b c", "a b b c", (0, 0, 1)),
    ("a b c d", "x a b c", (0, 1, 1)),
    ("the cat sat", "a cat sat down", (1, 0, 1)),
])
def test_edit_ops_by_hand(ref, hyp, ops):
    assert edit_ops(ref.split(), hyp.split()) == ops
    if ref:
        assert 100 * sum(ops) / len(ref.split()) == pytest.approx(jiwer.wer(ref, hyp) * 100)


def _full_table(ref: list[str], hyp: list[str]) -> tuple[int, int, int]:
    """Untrimmed DP over (errors, substitutions, deletions, insertions) tuples."""
    prev = [(j, 0, 0, j) for j in range(len(hyp) + 1)]
    for i, word in enumerate(ref, 1):
        row = [(i, 0, i, 0)]
        for j, other in enumerate(hyp, 1):
            e, s, d, n = prev[j - 1]
            diag = (e, s, d, n) if word == other else (e + 1, s + 1, d, n)
            e, s, d, n = prev[j]
            up = (e + 1, s, d + 1, n)
            e, s, d, n = row[j - 1]
            left = (e + 1, s, d, n + 1)
            row.append(min(diag, up, left, key=lambda t: t[:2]))
        prev = row
    return prev[-1][1:]


def test_edit_ops_matches_full_table_and_invariants():
    rng = random.Random(7)
    for _ in range(300):  # a tiny vocabulary makes ties and repeated words common
        ref = [rng.choice("abc") for _ in range(rng.randint(0, 9))]
        hyp = [rng.choice("abc") for _ in range(rng.randint(0, 9))]
        sub, dele, ins = edit_ops(ref, hyp)
        assert (sub, dele, ins) == _full_table(ref, hyp), (ref, hyp)
        assert ins - dele == len(hyp) - len(ref)


def test_wer_stats_add_merge_and_empty():
    one = WerStats().add("a b c".split(), "a x".split())
    assert (one.errors, one.ref_words, one.sub, one.dele, one.ins, one.utts) == (2, 3, 1, 1, 0, 1)
    two = WerStats().add(["d"], ["d", "e"])
    total = one + two
    assert (total.errors, total.ref_words, total.ins, total.utts) == (3, 4, 1, 2)
    assert total.wer == pytest.approx(75.0)
    assert one.errors == 2  # + leaves its operands alone
    assert one.update(two) == total
    assert WerStats().wer == 0.0
    assert WerStats().add([], ["x"]).wer == 100.0  # finite without reference words
    assert total.sclite_line() == "%WER 75.00 [ 3 / 4, 1 ins, 1 del, 1 sub ]"


def test_subset_of():
    assert subset_of("sw_4390-A_000100-000200") == "swb"
    assert subset_of("sw02001-A_000098-001156") == "swb"
    assert subset_of("en_4156-A_030185-030248") == "ch"
    assert subset_of("fsh_60262-A_000000-000100") is None


# Hand-checked: sw_1 one substitution; sw_2 normalises to "it was fine" / "it is fine" (one
# substitution); en_1 one insertion; en_2 has no hypothesis (one deletion); x_1 belongs to
# neither subset (one deletion).
REFS = {"sw_1": "yes i know that", "sw_2": "uh it was [laughter] fine",
        "en_1": "we went home", "en_2": "okay", "x_1": "hello there"}
HYPS = {"sw_1": "yes i no that", "sw_2": "it is fine um", "en_1": "we went to home",
        "x_1": "hello"}
EXPECTED = {"wer": 100 * 5 / 13, "wer_swb": 100 * 2 / 7, "wer_ch": 100 * 2 / 4,
            "ref_words": 13, "sub": 2, "del": 2, "ins": 1, "utts": 5}
EXPECTED_LINES = ["%WER 38.46 [ 5 / 13, 1 ins, 2 del, 2 sub ] all",
                  "%WER 28.57 [ 2 / 7, 0 ins, 0 del, 2 sub ] swb",
                  "%WER 50.00 [ 2 / 4, 1 ins, 1 del, 0 sub ] ch"]


def test_score_texts_subsets_by_hand():
    result = score_texts(REFS, HYPS)
    assert result == pytest.approx(EXPECTED)
    assert list(result) == list(EXPECTED)
    sets = score_sets(REFS, HYPS)
    assert (sets["swb"].utts, sets["ch"].utts, sets["ch"].dele) == (2, 2, 1)


def test_score_texts_subset_keys_only_when_present():
    only_swb = {k: v for k, v in REFS.items() if k.startswith("sw")}
    result = score_texts(only_swb, {"sw_1": "yes i no that"})
    assert "wer_swb" in result and "wer_ch" not in result
    assert result["del"] == 3  # sw_2 has no hypothesis: its three words are deleted
    assert set(score_texts({"x": "a"}, {"x": "a"})) == {"wer", "ref_words", "sub", "del",
                                                          "ins", "utts"}


def test_score_texts_without_normalisation():
    result = score_texts({"sw_2": REFS["sw_2"]}, {"sw_2": HYPS["sw_2"]}, normalize=False)
    assert result["ref_words"] == 5  # uh and [laughter] are scored as words
    assert result["wer"] == pytest.approx(jiwer.wer(REFS["sw_2"], HYPS["sw_2"]) * 100)
    assert score_texts({"a": "Yes"}, {"a": "yes"}, normalize=False)["sub"] == 1


def test_extra_hypothesis_is_an_error():
    with pytest.raises(UserError, match="'zz_9'.*Fix:"):
        score_texts({"sw_1": "a"}, {"sw_1": "a", "zz_9": "b"})


def _write(tmp_path, name: str, texts: dict[str, str]):
    path = tmp_path / name
    path.write_text("".join(f"{utt} {text}".rstrip() + "\n" for utt, text in texts.items()))
    return path


def test_read_kaldi_text(tmp_path):
    path = tmp_path / "text"
    path.write_text("sw_1 yes  i know\nsw_2\n\nen_1   we went home  \n")
    expected = {"sw_1": "yes  i know", "sw_2": "", "en_1": "we went home"}
    assert read_kaldi_text(path) == expected
    assert read_kaldi_text(tmp_path) == expected  # a data directory: its text file


def test_read_kaldi_text_errors(tmp_path):
    path = tmp_path / "dup"
    path.write_text("a x\nb y\na z\n")
    with pytest.raises(UserError, match=r"dup:3: duplicate utterance id 'a' \(first on line 1"):
        read_kaldi_text(path)
    with pytest.raises(UserError, match="nope: no such file"):
        read_kaldi_text(tmp_path / "nope")
    (tmp_path / "latin1").write_bytes(b"a caf\xe9\n")
    with pytest.raises(UserError, match="not UTF-8"):
        read_kaldi_text(tmp_path / "latin1")


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    status = score_cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_text_and_json(tmp_path, capsys):
    ref, hyp = _write(tmp_path, "ref", REFS), _write(tmp_path, "hyp", HYPS)
    status, out, err = _cli(capsys, str(ref), str(hyp))
    assert status == 0 and out.splitlines() == EXPECTED_LINES
    assert "1 of 5 reference utterances have no hypothesis" in err
    status, out, _ = _cli(capsys, str(ref), str(hyp), "--json")
    assert status == 0 and len(out.splitlines()) == 1
    assert json.loads(out) == pytest.approx(EXPECTED)
    status, out, _ = _cli(capsys, str(ref), str(hyp), "--json", "--no-normalize")
    assert json.loads(out) == pytest.approx(score_texts(REFS, HYPS, normalize=False))
    assert json.loads(out)["ref_words"] == 15


@pytest.mark.parametrize("case", ["missing", "duplicate", "extra", "empty_ref", "usage"])
def test_cli_errors_are_one_line(tmp_path, capsys, case):
    ref, hyp = _write(tmp_path, "ref", REFS), _write(tmp_path, "hyp", HYPS)
    args, needle = {
        "missing": ([str(ref), str(tmp_path / "absent")], "absent: no such file"),
        "duplicate": ([str(ref), str(_write(tmp_path, "dup", {"sw_1": "a"}))], None),
        "extra": ([str(ref), str(_write(tmp_path, "extra", {"zz_1": "a", "zz_2": "b"}))],
                  "has utterance 'zz_1' and 1 more"),
        "empty_ref": ([str(_write(tmp_path, "empty", {})), str(hyp)], "nothing to score"),
        "usage": ([str(ref)], "the following arguments are required: HYP"),
    }[case]
    if case == "duplicate":
        (tmp_path / "dup").write_text("sw_1 a\nsw_1 b\n")
        needle = "dup:2: duplicate utterance id 'sw_1'"
    status, out, err = _cli(capsys, *args)
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("adpsgd-score: error: ")
    assert needle in err
    if case == "usage":
        assert err.rstrip().endswith("Fix: see adpsgd-score --help"), err


@pytest.mark.slow
def test_cli_as_module(tmp_path):
    ref, hyp = _write(tmp_path, "ref", REFS), _write(tmp_path, "hyp", HYPS)
    run = [sys.executable, "-m", "runner.commands.score"]
    proc = subprocess.run([*run, str(ref), str(hyp)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == EXPECTED_LINES
    proc = subprocess.run([*run, str(ref), str(tmp_path / "absent")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"adpsgd-score: error: {tmp_path / 'absent'}: no such "
                                        "file. Fix: give the path of a Kaldi text file "
                                        "('<utterance-id> <words...>' per line)"]
