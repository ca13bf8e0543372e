"""Deadlock freedom on real ranks: 4 ranks with random per-step delays, rank 3 ten times
slower and frequent evaluations (each one quiesces the gossip) end every time, 10 times in a
row per variant. A hang fails the test through the timeout instead of blocking CI."""

import pytest

from conftest import run_mpi

pytestmark = pytest.mark.mpi

REPEATS = 10
VARIANTS = {
    "adpsgd-fixed": ["algo=adpsgd", "algo.pattern=fixed"],
    "adpsgd-random": ["algo=adpsgd", "algo.pattern=random"],
    "adpsgd-delay-by-one-fixed": ["algo=adpsgd", "algo.delay_by_one=true"],
    "adpsgd-delay-by-one-random": ["algo=adpsgd", "algo.delay_by_one=true",
                                   "algo.pattern=random"],
    "hadpsgd": ["algo=hadpsgd", "launcher.procs_per_node=2"],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_run_terminates_with_delays_and_a_straggler(tmp_path, variant):
    proc = run_mpi(4, "termination.py", str(tmp_path), str(REPEATS), *VARIANTS[variant],
                   timeout=300)
    assert proc.stdout.count(f"{REPEATS} runs ended") == 4, proc.stdout
    assert len(list(tmp_path.glob("*/summary.json"))) == REPEATS
