"""adpsgd-prepare: run a recipe's data preparation stages without training.

Usage: ``adpsgd-prepare [--list] [--stage N] [--stop-stage M] [OVERRIDE ...]`` with the same
overrides as adpsgd-run (``recipe=swb2000 recipe.data.train=DIR recipe.data.eval=DIR
recipe.data.prepare_workers=8``). Stages are numbered from 0; each one is rerunnable and skips
work whose output is already in place, so an interrupted preparation is resumed by running the
command again (or from ``--stage N``). adpsgd-run runs every stage itself before ranks start;
this command is for preparing ahead of a job, e.g. on a login or data node.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from ..errors import OneLineParser, UsageError, UserError, one_line

PROG = "adpsgd-prepare"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Run a recipe's data preparation stages.",
                     epilog="Example: adpsgd-prepare recipe=swb300 recipe.data.train=DIR "
                            "recipe.data.eval=DIR --stop-stage 0")
    parser.add_argument("--list", action="store_true", help="list the stages and exit")
    parser.add_argument("--stage", type=int, default=0, help="first stage to run")
    parser.add_argument("--stop-stage", type=int, default=None, help="last stage to run")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for adpsgd-run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen stages; return the exit status (0, or 2 after a one-line error)."""
    import recipes  # noqa: F401 - fills the recipe registry (runner/recipe.py)

    from .compose import compose_all, validate_job

    try:
        args = build_parser().parse_args(argv)
        typed = validate_job(compose_all(list(args.overrides), False, "config")[0])
        recipe = recipes.RECIPES.get(typed.recipe.name)(typed.recipe)
        stages = recipe.prepare_stages()
        if args.list:
            for index, (name, _) in enumerate(stages):
                print(f"stage {index}: {name}")
            return 0
        last = len(stages) - 1 if args.stop_stage is None else args.stop_stage
        if stages and not 0 <= args.stage <= last < len(stages):
            raise UserError(f"no stages {args.stage}..{last}: {typed.recipe.name} has stages "
                            f"0..{len(stages) - 1}", "see adpsgd-prepare --list")
        if not stages:
            print(f"recipe {typed.recipe.name} has nothing to prepare")
        for index in range(args.stage, last + 1):
            name, stage = stages[index]
            print(f"stage {index}: {name}", flush=True)
            started = time.perf_counter()
            stage()
            print(f"stage {index} done in {time.perf_counter() - started:.1f} s", flush=True)
    except (UsageError, UserError) as ex:
        print(f"{PROG}: error: {one_line(ex)}", file=sys.stderr)
        return 2
    except SystemExit as ex:  # --help
        return ex.code if isinstance(ex.code, int) else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
