"""Invariants of the decentralized algorithms on real ranks (algorithms.md §2-§7): with
learning rate 0, gossip or averaging keeps the mean model and drives the consensus distance to
~0; DaSGD's merge keeps the mean while training."""

import pytest

from conftest import run_mpi

pytestmark = pytest.mark.mpi

CASES = {
    "dpsgd-ring": ["algo=dpsgd", "topology=ring"],
    "dpsgd-random-ring": ["algo=dpsgd", "topology=random_ring"],
    "dpsgd-exponential": ["algo=dpsgd", "topology=exponential"],
    "dpsgd-step-then-average": ["algo=dpsgd", "algo.ordering=step_then_average"],
    "adpsgd-fixed": ["algo=adpsgd", "algo.pattern=fixed"],
    "adpsgd-random": ["algo=adpsgd", "algo.pattern=random"],
    "adpsgd-delay-by-one": ["algo=adpsgd", "algo.delay_by_one=true"],
    "adpsgd-delay-by-one-random": ["algo=adpsgd", "algo.delay_by_one=true",
                                   "algo.pattern=random"],
    "hadpsgd": ["algo=hadpsgd", "launcher.procs_per_node=2"],
    "dasgd": ["algo=dasgd", "algo.tau=2", "algo.delay=1"],
    "dasgd-delay-equals-tau": ["algo=dasgd", "algo.tau=3", "algo.delay=3"],
    "local-sgd": ["algo=local_sgd", "algo.period=3"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gossip_keeps_the_mean_and_reaches_consensus(tmp_path, case):
    proc = run_mpi(4, "gossip_invariants.py", str(tmp_path), *CASES[case],
                   "launcher.nprocs=4", "trainer.epochs=2", "trainer.batch_size=16")
    assert proc.stdout.count("mean kept") == 4, proc.stdout
    if case.startswith("adpsgd-fixed") or case.startswith("adpsgd-random") or case == "hadpsgd":
        assert "exchanges" in proc.stdout


@pytest.mark.parametrize("tau,delay", [(3, 1), (2, 2)])
def test_dasgd_merge_keeps_the_mean_and_the_local_progress(tmp_path, tau, delay):
    proc = run_mpi(4, "dasgd_merge.py", str(tmp_path), f"algo.tau={tau}", f"algo.delay={delay}")
    assert proc.stdout.count("kept the mean and the local progress") == 4, proc.stdout
