"""adpsgd-gap: spectral gap and rho of a topology for several learner counts.

Usage: ``adpsgd-gap --topology NAME [NAME ...] --n N [N ...] [--algo dpsgd|adpsgd] [--json]
[--seed S]``. Prints one row per topology and ``n`` with ``spectral_gap`` and ``rho`` as
defined in :mod:`runner.topology.spectral`; errors are one line on stderr (``adpsgd-gap:
error: ...``) with exit status 2.

``--algo dpsgd`` (the default) describes the topology as D-PSGD's mixing matrix W.
``--algo adpsgd`` describes AD-PSGD's pairwise averaging over the topology's active-passive
edges (runner/topology/pairing.py): ``rho`` of one averaging on a random such edge,
``spectral_gap = 1 - rho``, and ``rho_round = rho^(n/2)``, a round in which every active
averaged once (a modelling assumption).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..errors import OneLineParser, UsageError, UserError, one_line
from ..topology import TOPOLOGIES
from ..topology.pairing import pairwise_rho
from ..topology.spectral import summarize

PROG = "adpsgd-gap"
COLUMNS = ("topology", "n", "spectral_gap", "rho")
PAIRWISE_COLUMNS = (*COLUMNS, "rho_round")


def summarize_pairwise(topology, n: int) -> dict:
    """AD-PSGD's numbers for ``n`` participants on ``topology`` (see the module docstring)."""
    # Rounding can put a disconnected graph's rho a hair above 1 (a gap of -0.000000).
    rho = min(max(pairwise_rho(topology, n), 0.0), 1.0)
    return {"topology": topology.name, "n": int(n), "spectral_gap": 1.0 - rho, "rho": rho,
            "rho_round": rho ** (n / 2)}


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
        description="Spectral gap and rho of a mixing topology (docs/algorithms.md, "
                    "Topologies and spectral gap).",
        epilog="Fixed W: spectral_gap = 1 - SLEM(W), rho = SLEM(W^T W) (= SLEM^2 when "
               "symmetric). Time-varying W_k: spectral_gap = 1 - SLEM(E[W]), rho = largest "
               "|eigenvalue| of (I-J) E[W^T W] (I-J). Example: adpsgd-gap --topology ring "
               "--n 8 16 64 128")
    parser.add_argument("--topology", required=True, nargs="+", metavar="NAME",
                        help=f"one or more of: {', '.join(TOPOLOGIES.names())}")
    parser.add_argument("--n", required=True, nargs="+", type=positive_int, metavar="N",
                        help="numbers of learners")
    parser.add_argument("--algo", choices=("dpsgd", "adpsgd"), default="dpsgd",
                        help="dpsgd: the topology as a mixing matrix (default); adpsgd: "
                             "pairwise averaging over its active-passive edges, with "
                             "rho_round = rho^(n/2)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of {topology, n, spectral_gap, rho[, "
                             "rho_round]}")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for random topologies (the expectations do not depend on it)")
    return parser


def format_table(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    """Aligned columns (numbers with 6 decimals), topology left-aligned."""
    cells = [[str(r["topology"]), str(r["n"]), *(f"{r[c]:.6f}" for c in columns[2:])]
             for r in rows]
    widths = [max(len(c) for c in column) for column in zip(columns, *cells)]
    lines = []
    for row in [list(columns), *cells]:
        first = row[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join([first, *rest]).rstrip())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run adpsgd-gap; returns the exit status (0, or 2 after a one-line error)."""
    try:
        args = build_parser().parse_args(argv)
        topologies = [TOPOLOGIES.get(name)(None, seed=args.seed) for name in args.topology]
        describe, columns = ((summarize_pairwise, PAIRWISE_COLUMNS) if args.algo == "adpsgd"
                             else (summarize, COLUMNS))
        rows = [describe(topology, n) for topology in topologies for n in args.n]
    except (UsageError, UserError) as ex:
        print(f"{PROG}: error: {one_line(ex)}", file=sys.stderr)
        return 2
    except SystemExit as ex:  # --help
        return ex.code if isinstance(ex.code, int) else 0
    if args.json:
        print(json.dumps([{key: row[key] for key in columns} for row in rows]))
    else:
        print(format_table(rows, columns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
