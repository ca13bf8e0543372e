"""The seed papers' scale claims at 16-128 learners, in the simulator (launcher=sim; issue 17).

    python benchmarks/study_scale.py spectral       # adpsgd, dpsgd x 3 topologies x n = 16..128
    python benchmarks/study_scale.py batch          # ssgd vs adpsgd: the largest batch tolerated
    python benchmarks/study_scale.py heterogeneity  # 5 algorithms: straggler, slow periods, network
    python benchmarks/study_scale.py dasgd          # DaSGD's step time on a slow network, n <= 128
    python benchmarks/study_scale.py tables         # the papers' SWB-2000 hours, projected
    python benchmarks/study_scale.py failures       # goodput: restarts against elastic training
    python benchmarks/study_scale.py spectral --quick  # the wiring in seconds (meaningless numbers)

Each study is a module of benchmarks/scale_studies/ whose docstring says what it runs and how it
decides; docs/scale_studies.md has the results and verdicts. Run dirs go under --runs (default
runs/study_scale/<study>); a run dir that already holds a completed summary of the same config
is read, not run again (rerun a study after an interruption). JSON:
docs/results/scale/<study>.json (--json), markdown rows with --markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks.scale_studies import (  # noqa: E402
    batch,
    dasgd,
    failures,
    heterogeneity,
    spectral,
    tables,
)
from benchmarks.scale_studies.common import RESULTS, bench  # noqa: E402

STUDIES = {"spectral": spectral, "batch": batch, "heterogeneity": heterogeneity,
           "dasgd": dasgd, "tables": tables, "failures": failures}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # No abbreviations: a study writes docs/results/ by default, and `--margin 1` must not
    # quietly mean --margins.
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    sub = p.add_subparsers(dest="study", required=True, metavar="STUDY")
    for name, study in STUDIES.items():
        s = sub.add_parser(name, help=study.__doc__.split("\n")[0],
                           description=study.__doc__, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        bench.add_common_arguments(s, "study_scale", trains=False)
        s.add_argument("--runs", type=Path, help="run dirs (default runs/study_scale/<study>, "
                                                 "--quick: runs/study_scale/<study>-quick)")
        study.add_arguments(s)
    args = p.parse_args(argv)
    study = STUDIES[args.study]
    bench.fill_defaults(args, argv, study.QUICK, study.FULL)
    nprocs = args.nprocs if isinstance(getattr(args, "nprocs", None), list) else (
        [args.nprocs] if getattr(args, "nprocs", None) else [])
    if any(n < 2 or n % 2 for n in nprocs):
        p.error("--nprocs must be even numbers >= 2 (AD-PSGD pairs actives with passives)")
    if args.runs is None:
        args.runs = REPO / "runs" / "study_scale" / (args.study + ("-quick" if args.quick
                                                                   else ""))
    args.runs = args.runs.resolve()
    if args.json is None and not args.quick:
        args.json = RESULTS / f"{args.study}.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    study = STUDIES[args.study]
    return bench.measure_and_write(f"study_scale {args.study}", args, study.measure,
                                   study.HEADER, study.rows)


if __name__ == "__main__":
    raise SystemExit(main())
