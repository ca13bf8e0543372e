"""Reductions to SSGD on real ranks: each configuration below must give SSGD's parameters
(float64, plain SGD, 4 ranks with a short last batch every epoch)."""

import pytest

from conftest import run_mpi

pytestmark = pytest.mark.mpi

CASES = {
    "dpsgd-complete-graph": ["algo=dpsgd", "topology=complete",
                             "algo.ordering=step_then_average"],
    "hadpsgd-one-node": ["algo=hadpsgd", "launcher.procs_per_node=4"],
    "dasgd-blocking-every-step": ["algo=dasgd", "algo.tau=1", "algo.delay=0"],
    "local-sgd-period-1": ["algo=local_sgd", "algo.period=1"],
    "post-local-sgd-before-the-switch": ["algo=local_sgd", "algo.switch_epoch=5"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reduces_to_ssgd(tmp_path, case):
    proc = run_mpi(4, "equivalence.py", str(tmp_path), *CASES[case])
    assert proc.stdout.count("equals SSGD") == 4, proc.stdout
