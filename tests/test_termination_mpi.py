"""Deadlock freedom on real ranks: 4 ranks with random per-step delays, rank 3 ten times
slower and frequent evaluations (each one quiesces the gossip) end every time, twice in a
row per variant (10 runs) (the conservation, straggler, final-model and resume tests run the same
asynchronous core under delays and a straggler too). A hang fails the tests through the
timeout instead of blocking CI."""

import pytest

from conftest import case_report, run_mpi_cases

pytestmark = pytest.mark.mpi

REPEATS = 2
VARIANTS = {
    "adpsgd-fixed": ["algo=adpsgd", "algo.pattern=fixed"],
    "adpsgd-random": ["algo=adpsgd", "algo.pattern=random"],
    "adpsgd-delay-by-one-fixed": ["algo=adpsgd", "algo.delay_by_one=true"],
    "adpsgd-delay-by-one-random": ["algo=adpsgd", "algo.delay_by_one=true",
                                   "algo.pattern=random"],
    "hadpsgd": ["algo=hadpsgd", "launcher.procs_per_node=2"],
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("termination")
    cases = {name: [f"repeats={REPEATS}", *overrides] for name, overrides in VARIANTS.items()}
    return run_mpi_cases(4, "termination.py", run_dir, cases, timeout=500), run_dir


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_run_terminates_with_delays_and_a_straggler(job, variant):
    lines, run_dir = job
    report = case_report(lines, variant, 4)
    assert report.count(f"{REPEATS} runs ended") == 4, report
    assert len(list((run_dir / variant).glob("*/summary.json"))) == REPEATS
