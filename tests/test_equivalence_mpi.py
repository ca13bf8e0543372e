"""Reductions to SSGD on real ranks: each configuration below must give SSGD's parameters
(float64, plain SGD, 4 ranks with a short last batch every epoch). One MPI job runs them all."""

import pytest

from conftest import case_report, run_mpi_cases

pytestmark = pytest.mark.mpi

CASES = {
    "dpsgd-complete-graph": ["algo=dpsgd", "topology=complete",
                             "algo.ordering=step_then_average"],
    "hadpsgd-one-node": ["algo=hadpsgd", "launcher.procs_per_node=4"],
    "dasgd-blocking-every-step": ["algo=dasgd", "algo.tau=1", "algo.delay=0"],
    "local-sgd-period-1": ["algo=local_sgd", "algo.period=1"],
    "post-local-sgd-before-the-switch": ["algo=local_sgd", "algo.switch_epoch=5"],
}
# Reductions to another algorithm than SSGD (with momentum: it is the same on both sides).
OTHER_CASES = {
    "diloco-outer-sgd-1-is-local-sgd": [
        "algo=diloco", "algo.period=3", "algo.outer_lr=1", "algo.outer_momentum=0",
        "optim.momentum=0.9", "reference:algo=local_sgd", "reference:algo.period=3",
        "reference:optim.momentum=0.9"],
    "choco-identity-consensus-1-is-dpsgd": [
        "algo=choco", "algo.compression=identity", "algo.gamma=1", "topology=ring",
        "optim.momentum=0.9", "reference:algo=dpsgd", "reference:topology=ring",
        "reference:algo.ordering=step_then_average", "reference:optim.momentum=0.9"],
}


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    return run_mpi_cases(4, "equivalence.py", tmp_path_factory.mktemp("equivalence"),
                         {**CASES, **OTHER_CASES})


@pytest.mark.parametrize("case", sorted(CASES))
def test_reduces_to_ssgd(lines, case):
    report = case_report(lines, case, 4)
    assert report.count("equals SSGD") == 4, report


@pytest.mark.parametrize("case", sorted(OTHER_CASES))
def test_reduces_to_another_algorithm(lines, case):
    report = case_report(lines, case, 4)
    assert report.count("equals algo=") == 4, report
