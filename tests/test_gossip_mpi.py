"""Invariants of the decentralized algorithms on real ranks (docs/algorithms.md): with
learning rate 0, gossip or averaging keeps the mean model and drives the consensus distance to
~0; DaSGD's merge keeps the mean while training. Every case runs in one 4-rank MPI job
(tests/mpi/invariants.py: starting ranks costs more than a case)."""

import pytest

from conftest import SMALL_DIGITS_MODEL, case_report, run_mpi, run_mpi_cases

pytestmark = pytest.mark.mpi

COMMON = ["launcher.nprocs=4", "trainer.epochs=1", "trainer.batch_size=16"]
CASES = {
    "dpsgd-ring": ["algo=dpsgd", "topology=ring"],
    "dpsgd-random-ring": ["algo=dpsgd", "topology=random_ring"],
    "dpsgd-exponential": ["algo=dpsgd", "topology=exponential"],
    "dpsgd-step-then-average": ["algo=dpsgd", "algo.ordering=step_then_average"],
    # A gossip thread averages at most once per step (rate-limited) and may lag behind the
    # 23 steps: a quiet machine did 13 exchanges, a CI worker so few that a random pattern
    # cut the consensus distance by only 227x. Steps slowed by 20 ms let it keep up.
    "adpsgd-fixed": ["algo=adpsgd", "algo.pattern=fixed", "faults.delay_s=0.02"],
    "adpsgd-random": ["algo=adpsgd", "algo.pattern=random", "faults.delay_s=0.02"],
    "adpsgd-delay-by-one": ["algo=adpsgd", "algo.delay_by_one=true"],
    "adpsgd-delay-by-one-random": ["algo=adpsgd", "algo.delay_by_one=true",
                                   "algo.pattern=random"],
    "hadpsgd": ["algo=hadpsgd", "launcher.procs_per_node=2"],
    "dasgd": ["algo=dasgd", "algo.tau=2", "algo.delay=1"],
    "dasgd-delay-equals-tau": ["algo=dasgd", "algo.tau=3", "algo.delay=3"],
    "local-sgd": ["algo=local_sgd", "algo.period=3"],
}
# Real learning (learning rate > 0, momentum, weight decay, delays, a 10x straggler).
CONSERVATION_CASES = {
    "adpsgd-fixed": ["algo=adpsgd", "algo.pattern=fixed"],
    "adpsgd-random": ["algo=adpsgd", "algo.pattern=random", "topology=complete"],
    "hadpsgd": ["algo=hadpsgd", "launcher.procs_per_node=2"],
    # Snapshots in bfloat16: both ends average the same two rounded vectors.
    "adpsgd-bfloat16": ["algo=adpsgd", "algo.pattern=fixed", "comm.exchange_dtype=bfloat16"],
}
PUSH_SUM_CASES = {"sgp": ["algo=sgp"], "sgp-overlap": ["algo=sgp", "algo.overlap=true"],
                  # The pushed half rounded by its sender, who keeps the rest: no mass lost.
                  "sgp-bfloat16": ["algo=sgp", "comm.exchange_dtype=bfloat16"],
                  "sgp-overlap-float16": ["algo=sgp", "algo.overlap=true",
                                          "comm.exchange_dtype=float16"]}
MERGE_CASES = {"tau3-delay1": ["algo.tau=3", "algo.delay=1"],
               "tau2-delay2": ["algo.tau=2", "algo.delay=2"]}


# Each family of cases and the script whose checks run it (tests/mpi/invariants.py runs them
# all in one 4-rank job).
FAMILIES = {"gossip_invariants": {name: [*overrides, *COMMON] for name, overrides in CASES.items()},
            "conservation": CONSERVATION_CASES, "push_sum": PUSH_SUM_CASES,
            "dasgd_merge": MERGE_CASES}


@pytest.fixture(scope="module")
def invariant_lines(tmp_path_factory):
    # The narrow CNN: none of these invariants depends on the width (conftest)
    cases = {f"{script}.{name}": [f"check={script}", *overrides, *SMALL_DIGITS_MODEL]
             for script, family in FAMILIES.items() for name, overrides in family.items()}
    return run_mpi_cases(4, "invariants.py", tmp_path_factory.mktemp("invariants"), cases,
                         timeout=600)


def family_report(lines: dict[str, list[str]], script: str, case: str) -> str:
    return case_report(lines, f"{script}.{case}", 4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gossip_keeps_the_mean_and_reaches_consensus(invariant_lines, case):
    report = family_report(invariant_lines, "gossip_invariants", case)
    assert report.count("mean kept") == 4, report
    if case.startswith(("adpsgd-fixed", "adpsgd-random")) or case == "hadpsgd":
        assert "exchanges" in report
    if case == "hadpsgd":  # on every rank, at every step
        assert report.count("node replicas identical") == 4, report


@pytest.mark.parametrize("case", sorted(MERGE_CASES))
def test_dasgd_merge_keeps_the_mean_and_the_local_progress(invariant_lines, case):
    report = family_report(invariant_lines, "dasgd_merge", case)
    assert report.count("kept the mean and the local progress") == 4, report


def test_no_exchange_starts_after_quiesce_or_stop_and_captures_alone_keep_the_sum():
    """The active's gossip thread is held between its permission check and the start of its
    exchange while quiesce() (then stop()) runs: nothing may be exchanged afterwards. Between
    the two, checkpoint captures taken alone (an averaging in flight; a partner that captured
    first) keep the pair's sum in the copies."""
    proc = run_mpi(2, "quiesce_race.py", timeout=120)
    assert proc.stdout.count("no exchange after quiesce or stop") == 2, proc.stdout
    assert proc.stdout.count("a capture in flight kept the sum") == 2, proc.stdout
    assert proc.stdout.count("a capture before serving kept the sum") == 2, proc.stdout


@pytest.mark.parametrize("case", sorted(CONSERVATION_CASES))
def test_averaging_conserves_the_sum_of_the_models_while_learning(invariant_lines, case):
    """sum_i x_i(end) = sum_i x_i(0) + every applied update, to 1e-10 relative, and every
    exchange averaged two snapshots that existed, the same two on both ends."""
    report = family_report(invariant_lines, "conservation", case)
    assert report.count("conserved to") == 4 and report.count("exchanges matched") == 4, report
    print(f"{case}: {report.splitlines()[0]}")


@pytest.mark.parametrize("case", sorted(PUSH_SUM_CASES))
def test_push_sum_weights_sum_to_n_and_pushing_moves_no_mass(invariant_lines, case):
    """SGP learning for real: the weights (with the share in flight) sum to n after every
    step, and sum_i x_i moves only by the updates the optimizer applied (1e-10)."""
    report = family_report(invariant_lines, "push_sum", case)
    assert report.count("weights summed to n") == 4, report
    print(f"{case}: {report.splitlines()[0]}")
