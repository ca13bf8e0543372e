"""mpiexec -n 4 python harness_cases.py RUN_DIR CASES_JSON: the case harness itself. Each case
names what its check does (tests/test_harness.py says what the job must print)."""

from harness import run_cases_on_ranks


def check(world, run_dir, overrides):
    kind = overrides[0]
    if kind == "every-rank-fails-an-assertion":
        world.allgather(1)
        raise AssertionError("failed on every rank, in step")
    if kind == "one-rank-fails-before-a-collective":
        assert world.Get_rank() != 2, "failed on rank 2 alone"
        world.allgather(1)  # the others wait here for rank 2, which never comes
    if kind == "one-rank-raises":
        world.allgather(1)
        if world.Get_rank() == 1:
            raise RuntimeError("an error that is not a failed check")
    return "passed"


run_cases_on_ranks(check)
