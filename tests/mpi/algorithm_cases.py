"""mpiexec -n 4 python algorithm_cases.py RUN_DIR CASES_JSON: the cases of
straggler_immunity.py and final_model.py in one job (starting 4 ranks costs more CPU than
either's cases). Each case's first override names its script; the rest are that script's."""

import final_model
import straggler_immunity

from harness import run_cases_on_ranks

CHECKS = {"straggler_immunity": straggler_immunity.checks, "final_model": final_model.checks}


def checks(world_mpi, run_dir, overrides):
    return CHECKS[overrides[0]](world_mpi, run_dir, overrides[1:])


run_cases_on_ranks(checks)
