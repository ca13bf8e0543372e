"""Checkpoints keep every algorithm's state: lockstep algorithms resumed from a checkpoint end
bit for bit where the uninterrupted run ends (communication in flight at the checkpoint is
completed and stored); a stop signal that reaches one rank stops every rank at the same step;
skip_batch drops a non-finite step on exactly the ranks that share its update. One 2-rank job
runs every case (tests/mpi/resume.py)."""

import pytest

from conftest import SMALL_DIGITS_MODEL, case_report, run_mpi_cases

pytestmark = pytest.mark.mpi

CASES = {
    "ssgd": ["scenario=exact", "algo=ssgd"],
    "dpsgd-random-ring": ["scenario=exact", "algo=dpsgd", "topology=random_ring"],
    "dasgd-in-flight": ["scenario=exact", "algo=dasgd", "algo.tau=4", "algo.delay=2"],
    "post-local-sgd": ["scenario=exact", "algo=local_sgd", "algo.switch_epoch=0.5",
                       "algo.period=4"],
    "delay-by-one": ["scenario=exact", "algo=adpsgd", "algo.delay_by_one=true",
                     "algo.pattern=random"],
    "sgp-overlap-in-flight": ["scenario=exact", "algo=sgp", "algo.overlap=true"],
    "diloco": ["scenario=exact", "algo=diloco", "algo.period=4"],
    "choco-qsgd": ["scenario=exact", "algo=choco", "algo.compression=qsgd"],
    "preempt-one-rank": ["scenario=preempt", "algo=ssgd"],
    # SSGD averages the gradient: both ranks drop the step. D-PSGD: only the rank whose loss
    # was NaN drops its own update.
    "skip-ssgd": ["scenario=skip:2,2", "algo=ssgd"],
    "skip-dpsgd": ["scenario=skip:0,2", "algo=dpsgd"],
    "skip-sgp": ["scenario=skip:0,2", "algo=sgp"],  # a skipped step still pushes x, not z
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    cases = {name: [*overrides, *SMALL_DIGITS_MODEL] for name, overrides in CASES.items()}
    return run_mpi_cases(2, "resume.py", tmp_path_factory.mktemp("resume"), cases, timeout=500)


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_resume_and_nonfinite_steps(job, case):
    report = case_report(job, case, 2)
    if CASES[case][0] == "scenario=exact":
        assert report.count("identical") == 2, report
    if case in ("dasgd-in-flight", "delay-by-one", "sgp-overlap-in-flight"):
        assert "with communication in flight" in report, report


# "-beside": checkpoints beside training, each learner's part of the cut taken alone
# (runner/comm/pairwise.py); otherwise the learners meet for each checkpoint.
ASYNC_CASES = {
    "adpsgd-fixed": ["algo=adpsgd", "algo.pattern=fixed"],
    "adpsgd-fixed-beside": ["algo=adpsgd", "algo.pattern=fixed",
                            "trainer.checkpoint_in_background=true"],
    "adpsgd-random": ["algo=adpsgd", "algo.pattern=random", "topology=complete"],
    "hadpsgd": ["algo=hadpsgd", "launcher.procs_per_node=2"],
}


@pytest.fixture(scope="module")
def async_job(tmp_path_factory):
    cases = {name: [*overrides, *SMALL_DIGITS_MODEL] for name, overrides in ASYNC_CASES.items()}
    return run_mpi_cases(4, "async_resume.py", tmp_path_factory.mktemp("async_resume"), cases,
                         timeout=500)


@pytest.mark.parametrize("case", sorted(ASYNC_CASES))
def test_asynchronous_resume_keeps_the_pair_sums_and_the_peer_schedule(async_job, case):
    """A checkpoint of a learning AD-PSGD/H-ADPSGD run is a consistent cut (sum of the models
    = initial sum + updates applied before it), and the run resumed from it conserves the sum
    and continues every active's peer schedule at the saved exchange number."""
    report = case_report(async_job, case, 4)
    assert report.count("a consistent cut") == 4 and report.count("as scheduled") == 4, report
    print(f"{case}: {report.splitlines()[0]}")
