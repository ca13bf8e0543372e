"""The MPI case harness (tests/mpi/harness.py) reports a failed check instead of hanging: a
CI run once waited 500 s because one rank failed an assertion that its peers passed and left
them inside a collective."""

import json

import pytest

from conftest import run_mpi

pytestmark = pytest.mark.mpi

AGREE_S = 10  # ranks that start a case together end a passing one within milliseconds


def run_cases(tmp_path, cases: dict[str, list[str]]):
    return run_mpi(4, "harness_cases.py", str(tmp_path), json.dumps(cases), timeout=120,
                   check=False, env={"ADPSGD_TEST_CASE_AGREE_S": str(AGREE_S)})


def lines_of(proc, case: str) -> list[str]:
    return [line for line in proc.stdout.splitlines() if f": case {case}: " in line]


def test_a_failed_assertion_on_every_rank_is_reported_and_the_next_case_runs(tmp_path):
    proc = run_cases(tmp_path, {"a": ["every-rank-fails-an-assertion"], "b": ["passes"]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(lines_of(proc, "a")) == 4
    assert all("FAILED failed on every rank" in line for line in lines_of(proc, "a"))
    assert sorted(lines_of(proc, "b")) == [f"rank {r}: case b: passed" for r in range(4)]


def test_a_rank_that_fails_alone_before_a_collective_ends_the_job_naming_the_others(tmp_path):
    proc = run_cases(tmp_path, {"a": ["passes"], "c": ["one-rank-fails-before-a-collective"],
                                   "d": ["passes"]})
    assert proc.returncode != 0
    assert len(lines_of(proc, "a")) == 4
    assert "rank 2: case c: FAILED failed on rank 2 alone" in proc.stdout
    assert (f"rank 2: case c: FAILED rank(s) 0, 1, 3 did not end this case within {AGREE_S} s"
            in proc.stdout), proc.stdout
    assert not lines_of(proc, "d"), "a case ran after the ranks fell out of step"


def test_an_error_that_is_not_an_assertion_ends_the_job_after_every_rank_reported(tmp_path):
    proc = run_cases(tmp_path, {"e": ["one-rank-raises"], "f": ["passes"]})
    assert proc.returncode != 0
    lines = lines_of(proc, "e")
    assert len(lines) == 4, proc.stdout
    assert "rank 1: case e: FAILED with the traceback below" in lines
    assert "RuntimeError: an error that is not a failed check" in proc.stderr
    assert not lines_of(proc, "f")
