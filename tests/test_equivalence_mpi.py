"""Reductions on real ranks: each setting an algorithm declares (``reduces_to`` on its class)
must give the other run's parameters, SSGD's unless it names another (float64, plain SGD, 4
ranks with a short last batch every epoch). One MPI job runs them all."""

import pytest

from runner.algos import ALGORITHMS

from conftest import RULES_DIGITS, case_report, run_mpi_cases

pytestmark = pytest.mark.mpi


def reduction_cases() -> dict[str, list[str]]:
    """Every algorithm's declared reductions (``reduces_to`` on its class), as the harness's
    overrides: the other run's settings prefixed ``reference:`` unless it is SSGD."""
    cases = {}
    for name in ALGORITHMS.names():
        for case, (overrides, reference) in vars(ALGORITHMS.get(name)).get(
                "reduces_to", {}).items():
            against = [] if reference == ("algo=ssgd",) else [f"reference:{o}" for o in reference]
            cases[case] = [f"algo={name}", *overrides, *against]
    return cases


ALL_CASES = reduction_cases()
CASES = sorted(case for case, o in ALL_CASES.items() if not any(
    item.startswith("reference:") for item in o))
# Reductions to another algorithm than SSGD (with momentum: it is the same on both sides).
OTHER_CASES = sorted(set(ALL_CASES) - set(CASES))


def test_the_reductions_are_declared():
    """The cases come from the algorithms' classes: the ones written when they were listed
    here are all still there (a lost declaration would drop a check without a word)."""
    assert {"dpsgd-complete-graph", "hadpsgd-one-node", "dasgd-blocking-every-step",
            "local-sgd-period-1", "post-local-sgd-before-the-switch"} <= set(CASES)
    assert {"diloco-outer-sgd-1-is-local-sgd",
            "choco-identity-consensus-1-is-dpsgd"} <= set(OTHER_CASES)


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    return run_mpi_cases(4, "equivalence.py", tmp_path_factory.mktemp("equivalence"),
                         {case: [*(f"common:{o}" for o in RULES_DIGITS), *overrides]
                          for case, overrides in ALL_CASES.items()})


@pytest.mark.parametrize("case", CASES)
def test_reduces_to_ssgd(lines, case):
    report = case_report(lines, case, 4)
    assert report.count("equals SSGD") == 4, report


@pytest.mark.parametrize("case", OTHER_CASES)
def test_reduces_to_another_algorithm(lines, case):
    report = case_report(lines, case, 4)
    assert report.count("equals algo=") == 4, report
