"""adpsgd-score: Switchboard/Hub5'00-style WER of a hypothesis Kaldi text file.

Usage: ``adpsgd-score REF HYP [--no-normalize] [--json]``. REF and HYP are Kaldi ``text``
files (``<utterance-id> <words...>``; a data directory stands for its ``text``). Prints one
line per set in Kaldi compute-wer style, ``%WER 12.34 [ 123 / 997, 10 ins, 20 del, 93 sub ]``
followed by the set name: ``all``, then ``swb`` (``sw*`` ids) and ``ch`` (``en*`` ids) when
the reference has them. ``--json`` prints one object with the keys of
:func:`recipes.speech.scoring.score_texts` instead. Errors are one line on stderr
(``adpsgd-score: error: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from recipes.speech.scoring import read_kaldi_text, score_sets, score_texts
from runner.errors import OneLineParser, UserError, command_status

PROG = "adpsgd-score"


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of adpsgd-score."""
    parser = OneLineParser(prog=PROG, description="Word error rate of a hypothesis Kaldi text file "
                     "against a reference one, with Switchboard/Hub5'00 normalisation and "
                     "per-subset results (swb: sw* ids, ch: en* ids).")
    parser.add_argument("ref", metavar="REF", help="reference Kaldi text file")
    parser.add_argument("hyp", metavar="HYP", help="hypothesis Kaldi text file")
    parser.add_argument("--no-normalize", dest="normalize", action="store_false",
                        help="score the words exactly as written (no lowercasing, no removal "
                        "of hesitations, fragments and noise tags)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of %%WER lines")
    return parser


def _score(args: argparse.Namespace) -> tuple[str, str]:
    """(stdout, stderr note) of one run; raises UserError for anything the user can fix."""
    refs, hyps = read_kaldi_text(args.ref), read_kaldi_text(args.hyp)
    if not refs:
        raise UserError(f"{args.ref} has no utterances, so there is nothing to score",
                        "give the reference Kaldi text file as the first argument")
    extra = [utt for utt in hyps if utt not in refs]
    if extra:  # checked here too so that the message can name both files
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise UserError(f"{args.hyp} has utterance {extra[0]!r}{more} that {args.ref} does "
                         "not have", "score a hypothesis against the reference of the same "
                         "data set (REF first, then HYP)")
    missing = sum(utt not in hyps for utt in refs)
    note = (f"{PROG}: note: {missing} of {len(refs)} reference utterances have no hypothesis "
            "and count as deletions") if missing else ""
    if args.json:
        return json.dumps(score_texts(refs, hyps, args.normalize)), note
    sets = score_sets(refs, hyps, args.normalize)
    return "\n".join(f"{stats.sclite_line()} {name}" for name, stats in sets.items()), note


def main(argv: Sequence[str] | None = None) -> int:
    """Run adpsgd-score; returns the exit status (0, or 2 after a one-line error)."""

    def body() -> int:
        out, note = _score(build_parser().parse_args(argv))
        if note:
            print(note, file=sys.stderr)
        print(out)
        return 0

    return command_status(PROG, body)

if __name__ == "__main__":
    raise SystemExit(main())
