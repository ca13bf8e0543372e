"""adpsgd-gap: spectral gap and rho of a topology for several learner counts.

Usage: ``adpsgd-gap --topology NAME [NAME ...] --n N [N ...] [--json] [--seed S]``. Prints
one row per topology and ``n`` with ``spectral_gap`` and ``rho`` as defined in
:mod:`runner.topology.spectral`; errors are one line on stderr (``adpsgd-gap: error: ...``)
with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .errors import OneLineParser, UsageError, UserError, one_line
from .topology import TOPOLOGIES
from .topology.spectral import summarize

PROG = "adpsgd-gap"
COLUMNS = ("topology", "n", "spectral_gap", "rho")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Spectral gap and rho of a mixing topology (algorithms.md section 9).",
        epilog="Fixed W: spectral_gap = 1 - SLEM(W), rho = SLEM(W^T W) (= SLEM^2 when "
               "symmetric). Time-varying W_k: spectral_gap = 1 - SLEM(E[W]), rho = largest "
               "|eigenvalue| of (I-J) E[W^T W] (I-J). Example: adpsgd-gap --topology ring "
               "--n 8 16 64 128")
    parser.add_argument("--topology", required=True, nargs="+", metavar="NAME",
                        help=f"one or more of: {', '.join(TOPOLOGIES.names())}")
    parser.add_argument("--n", required=True, nargs="+", type=positive_int, metavar="N",
                        help="numbers of learners")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of {topology, n, spectral_gap, rho}")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for random topologies (the expectations do not depend on it)")
    return parser


def format_table(rows: list[dict]) -> str:
    """Aligned columns topology, n, spectral_gap, rho (6 decimals), topology left-aligned."""
    cells = [[str(r["topology"]), str(r["n"]), f"{r['spectral_gap']:.6f}", f"{r['rho']:.6f}"]
             for r in rows]
    widths = [max(len(c) for c in column) for column in zip(COLUMNS, *cells)]
    lines = []
    for row in [list(COLUMNS), *cells]:
        first = row[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join([first, *rest]).rstrip())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run adpsgd-gap; returns the exit status (0, or 2 after a one-line error)."""
    try:
        args = build_parser().parse_args(argv)
        topologies = [TOPOLOGIES.get(name)(None, seed=args.seed) for name in args.topology]
        rows = [summarize(topology, n) for topology in topologies for n in args.n]
    except (UsageError, UserError) as ex:
        print(f"{PROG}: error: {one_line(ex)}", file=sys.stderr)
        return 2
    except SystemExit as ex:  # --help
        return ex.code if isinstance(ex.code, int) else 0
    if args.json:
        print(json.dumps([{key: row[key] for key in COLUMNS} for row in rows]))
    else:
        print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
