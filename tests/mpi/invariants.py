"""mpiexec -n 4 python invariants.py RUN_DIR CASES_JSON: the checks of gossip_invariants.py,
conservation.py, push_sum.py and dasgd_merge.py in one job, since starting four ranks costs
more than most cases. A case's first override names the script whose ``checks`` run it
(``check=conservation``); the rest are that script's overrides."""

import conservation
import dasgd_merge
import gossip_invariants
import push_sum

from harness import run_cases_on_ranks

CHECKS = {module.__name__: module.checks
          for module in (gossip_invariants, conservation, push_sum, dasgd_merge)}


def checks(world_mpi, run_dir, overrides):
    script = overrides[0].removeprefix("check=")
    return CHECKS[script](world_mpi, run_dir, overrides[1:])


run_cases_on_ranks(checks)
