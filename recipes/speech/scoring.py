"""Switchboard/Hub5'00-style word error rate: text normalisation, edit distance and totals.

Scoring follows what Kaldi's ``egs/swbd/s5c`` recipe does before it hands a hypothesis to
NIST's sclite with the Hub5 GLM (``en20000405_hub5.glm``): everything the reference marks as
optionally deletable (hesitations, word fragments, noise and non-speech tags) is removed from
*both* sides, so that saying it costs nothing and leaving it out costs nothing either. The
edit distance is then a plain word-level Levenshtein distance with unit costs, as Kaldi's
``compute-wer`` computes it. Known differences from a full sclite/GLM run, all small:

* GLM spelling equivalences (``okay``/``ok``, contractions) and acronym mappings are not
  applied; both sides are expected to use the Switchboard lexicon's spelling.
* A ``{ a / b }`` alternation in an STM reference is scored as its first alternative, not as
  whichever alternative matches the hypothesis best.
* Ties between alignments with the same number of errors are broken towards fewer
  substitutions (sclite's weighted alignment makes the same choice in the common case of
  one deletion plus one insertion versus two substitutions); the total never depends on it.

Utterance ids decide the Hub5'00 subset, as in Kaldi's eval2000 data: ``sw*`` is the
Switchboard part (``swb``) and ``en*`` the CallHome English part (``ch``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

from runner.errors import UserError

from .kaldi_table import read_table

# What NIST's Hub5 GLM maps to %HESITATION, i.e. what the Hub5'00 reference treats as
# optionally deletable; Kaldi's swbd score_sclite.sh strips exactly these from hypotheses.
# "oh" is a scored word, not a hesitation, and so are the backchannels "uh-huh", "um-hum"
# and "mm-hmm": they answer the other speaker and the GLM leaves them alone.
HESITATIONS: tuple[str, ...] = ("uh", "um", "eh", "mm", "hm", "ah", "huh", "ha", "er", "oof",
                                "hee", "ach", "eee", "ew")
# The Hub5'00 subsets, keyed by the prefix of their utterance ids.
SUBSET_PREFIXES: tuple[tuple[str, str], ...] = (("sw", "swb"), ("en", "ch"))
SUBSETS: tuple[str, ...] = tuple(name for _, name in SUBSET_PREFIXES)

# A whole whitespace-separated token, without consuming the whitespace around it.
_START, _END = r"(?<!\S)", r"(?!\S)"


class Rule(NamedTuple):
    """One normalisation step: ``pattern.sub(replacement, text)`` and the reason for it."""

    pattern: re.Pattern[str]
    replacement: str
    why: str


def _rule(pattern: str, replacement: str, why: str) -> Rule:
    return Rule(re.compile(pattern), replacement, why)


# Applied in this order to the lowercased transcript; the result is split on whitespace.
# The order matters: tags that carry a word are unwrapped before the remaining tags are
# dropped, and parentheses come off before the hesitation and fragment rules look at a token.
NORMALIZATION_RULES: tuple[Rule, ...] = (
    _rule(r"\{\s*([^{}/]*?)\s*(?:/[^{}]*)?\}", r" \1 ",
          "'{ a / b }' is an STM alternation (scored as its first alternative) and '{word}' "
          "marks a coinage in the MS-State transcripts: keep the word, drop the braces"),
    _rule(r"\[laughter-([^\[\]\s]+)\]", r"\1",
          "'[laughter-yeah]' is the word 'yeah' said while laughing: the word is scored"),
    _rule(r"\[[^\[\]\s/]*/([^\[\]\s/]+)\]", r"\1",
          "'[bocket/bucket]' is a mispronunciation of 'bucket': score the intended word"),
    _rule(r"\[[^\[\]]*\]", "",
          "'[noise]', '[laughter]', '[vocalized-noise]', '[silence]' are not speech; inside "
          "a fragment ('th[e]-') the bracketed part was not said"),
    _rule(r"<[^<>\s]*>", "",
          "'<unk>', '<noise>', '<spoken_noise>', '<b_aside>'/'<e_aside>' are tags, not words"),
    _rule(r"[()]", "",
          "parentheses mark optionally deletable words in Hub5 STM references ('(%hesitation)',"
          " '(w-)', '(uh)'); the rules below remove what they mark, other words are scored"),
    _rule(_START + r"%\S*" + _END, " ",
          "'%hesitation' (and '%uh', '%ah') are GLM hesitation tokens"),
    _rule(r"_\d+" + _END, "",
          "'i_1' is an alternative-pronunciation variant of 'i' in the Switchboard lexicon"),
    _rule(_START + r"(?:-\S*|\S*-)" + _END, " ",
          "word fragments ('hel-', '-lo') are optionally deletable in the Hub5 reference"),
    _rule(_START + "(?:" + "|".join(HESITATIONS) + ")" + _END, " ",
          "hesitations map to %hesitation in the Hub5 GLM and are optionally deletable"),
    _rule(_START + "@" + _END, " ", "'@' is the empty alternative of an STM alternation"),
)


def normalize_switchboard(text: str) -> list[str]:
    """Words of a Switchboard/Hub5'00 transcript as they are scored.

    Lowercases, applies :data:`NORMALIZATION_RULES` in order and splits on whitespace.
    Words that are merely unusual are kept as they are: hyphenated words (``uh-huh``,
    ``x-ray``), apostrophes (``don't``) and the lexicon's slash words (``and/or``, one word in
    the Switchboard lexicon, so splitting it would change the reference length).
    """
    text = text.lower()
    for rule in NORMALIZATION_RULES:
        text = rule.pattern.sub(rule.replacement, text)
    return text.split()


def edit_ops(ref: Sequence[str], hyp: Sequence[str]) -> tuple[int, int, int]:
    """``(substitutions, deletions, insertions)`` of a minimum-error alignment of two word
    sequences (unit-cost Levenshtein distance; their sum is the edit distance).

    Among alignments with the fewest errors the one with the fewest substitutions is chosen.
    """
    # A common prefix and suffix align as matches in some optimal alignment, and a decoder's
    # output mostly agrees with the reference, so trimming them saves most of the table.
    n, m = len(ref), len(hyp)
    start = 0
    while start < n and start < m and ref[start] == hyp[start]:
        start += 1
    while n > start and m > start and ref[n - 1] == hyp[m - 1]:
        n -= 1
        m -= 1
    ref, hyp = ref[start:n], hyp[start:m]
    n, m = len(ref), len(hyp)
    if n == 0 or m == 0:
        return 0, n, m
    # One integer per cell, errors * scale + substitutions, minimises the errors first and
    # the substitutions second with plain integer comparisons (substitutions <= n < scale).
    scale = n + 1
    sub_cost = scale + 1
    prev = list(range(0, (m + 1) * scale, scale))  # row 0: j insertions
    for i, word in enumerate(ref, 1):
        left = i * scale  # column 0: i deletions
        row = [left]
        for j, other in enumerate(hyp):
            best = prev[j] if other == word else prev[j] + sub_cost
            deletion = prev[j + 1] + scale
            if deletion < best:
                best = deletion
            left += scale  # insertion: one more than the cell to the left
            if left < best:
                best = left
            left = best
            row.append(best)
        prev = row
    errors, subs = divmod(prev[m], scale)
    # ins - del is fixed by the lengths, and ins + del = errors - subs.
    dels = (errors - subs + n - m) // 2
    return subs, dels, errors - subs - dels


@dataclass
class WerStats:
    """Error counts summed over utterances; ``+`` and :meth:`update` merge two totals."""

    errors: int = 0
    ref_words: int = 0
    sub: int = 0
    dele: int = 0
    ins: int = 0
    utts: int = 0

    def add(self, ref_words: Sequence[str], hyp_words: Sequence[str]) -> WerStats:
        """Count one utterance (already normalised words); returns ``self``."""
        sub, dele, ins = edit_ops(ref_words, hyp_words)
        self.sub += sub
        self.dele += dele
        self.ins += ins
        self.errors += sub + dele + ins
        self.ref_words += len(ref_words)
        self.utts += 1
        return self

    def update(self, other: WerStats) -> WerStats:
        """Add another total into this one in place; returns ``self``."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def __add__(self, other: WerStats) -> WerStats:
        if not isinstance(other, WerStats):
            return NotImplemented
        return WerStats().update(self).update(other)

    @property
    def wer(self) -> float:
        """Word error rate in percent. With no reference words it is ``100 * errors`` (as if
        there were one word), which keeps it finite for JSON and logs, like the recipe."""
        return 100.0 * self.errors / max(self.ref_words, 1)

    def sclite_line(self) -> str:
        """The summary as Kaldi's compute-wer prints it:
        ``%WER 12.34 [ 123 / 997, 10 ins, 20 del, 93 sub ]``."""
        return (f"%WER {self.wer:.2f} [ {self.errors} / {self.ref_words}, {self.ins} ins, "
                f"{self.dele} del, {self.sub} sub ]")


def subset_of(utt_id: str) -> str | None:
    """The Hub5'00 subset of an utterance: ``'swb'`` (``sw*``), ``'ch'`` (``en*``) or None."""
    for prefix, name in SUBSET_PREFIXES:
        if utt_id.startswith(prefix):
            return name
    return None


def score_sets(refs: Mapping[str, str], hyps: Mapping[str, str], normalize: bool = True
               ) -> dict[str, WerStats]:
    """Totals for ``'all'`` and for each Hub5'00 subset that has reference utterances.

    A reference utterance without a hypothesis counts as all deletions (a decoder that drops
    an utterance must not look better for it); a hypothesis for an utterance that is not in
    the reference raises :class:`UserError`, since it means the two files do not belong
    together. ``normalize=False`` scores the words exactly as written (case-sensitive).
    """
    extra = sorted(set(hyps) - set(refs))
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise UserError(f"the hypothesis has utterance {extra[0]!r}{more} that the reference "
                        "does not have", "score a hypothesis against the reference of the "
                        "same data set, or remove those utterances from the hypothesis")
    words = normalize_switchboard if normalize else str.split
    sets: dict[str, WerStats] = {"all": WerStats()}
    for utt, ref_text in refs.items():
        ref, hyp = words(ref_text), words(hyps.get(utt, ""))
        one = WerStats().add(ref, hyp)
        sets["all"].update(one)
        subset = subset_of(utt)
        if subset is not None:
            sets.setdefault(subset, WerStats()).update(one)
    # Subsets in a fixed order, whatever order the utterances came in.
    return {name: sets[name] for name in ("all", *SUBSETS) if name in sets}


def score_texts(refs: Mapping[str, str], hyps: Mapping[str, str], normalize: bool = True
                ) -> dict[str, float]:
    """WER of hypothesis texts against reference texts, both keyed by utterance id.

    Returns ``wer`` (percent, all utterances), ``wer_swb``/``wer_ch`` for the subsets that
    have reference utterances, and the overall counts ``ref_words``, ``sub``, ``del``,
    ``ins`` and ``utts``. See :func:`score_sets` for missing and extra utterances.
    """
    sets = score_sets(refs, hyps, normalize)
    total = sets["all"]
    result: dict[str, float] = {"wer": total.wer}
    for name in SUBSETS:
        if name in sets:
            result[f"wer_{name}"] = sets[name].wer
    result.update({"ref_words": total.ref_words, "sub": total.sub, "del": total.dele,
                   "ins": total.ins, "utts": total.utts})
    return result


def read_kaldi_text(path: str | Path) -> dict[str, str]:
    """A Kaldi ``text`` file (``<utterance-id> <word> <word> ...``) as id -> transcript.

    A line with only an id is an utterance with no words (a decoder's empty output). A
    directory is read as a Kaldi data directory, i.e. its ``text`` file. Missing or unreadable
    files and duplicate ids raise :class:`UserError` naming the file (and line).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "text"
    return dict(read_table(path, "<utterance-id> <words...>", "then score again",
                           id_kind="utterance id", what="Kaldi text file"))
