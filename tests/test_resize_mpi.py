"""A run checkpointed by 4 ranks continues on 2 and ends on 4 again (resume=auto with another
launcher.nprocs, runner/checkpoint/resize.py): every sample of each interrupted epoch is read once,
and the held-out metric reaches the uninterrupted run's within the spread of its seeds. One
4-rank job runs every case (tests/mpi/resize.py)."""

import pytest

from conftest import case_report, run_mpi_cases

pytestmark = pytest.mark.mpi

# The asynchronous algorithms run at half the recipe's rate: at the recipe's, a run of either
# now and then loses many points mid-run and ends low, uninterrupted or not (tests/mpi/resize.py).
CASES = {
    "ssgd": ["algo=ssgd"],
    "dpsgd": ["algo=dpsgd"],
    "adpsgd": ["algo=adpsgd", "optim.lr=0.2"],
    "hadpsgd": ["algo=hadpsgd", "launcher.procs_per_node=2", "optim.lr=0.2"],
    "dasgd": ["algo=dasgd", "algo.tau=4", "algo.delay=2"],
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return run_mpi_cases(4, "resize.py", tmp_path_factory.mktemp("resize"), CASES, timeout=500)


@pytest.mark.parametrize("case", sorted(CASES))
def test_four_ranks_to_two_and_back_read_every_sample_once(job, case):
    report = case_report(job, case, 4)
    assert "every sample of both interrupted epochs read once" in report, report
