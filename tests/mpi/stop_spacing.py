"""mpiexec -n 2 python stop_spacing.py: the preemption checks are spaced in time, not steps.

Two loops of check points, one a step each, as the trainer passes them:

* slow steps (0.3 s): every point is a check, and a stop asked of rank 1 alone after its step
  4 ends both ranks' loops at the same point, within 2 steps of the request;
* fast steps (2 ms): the checks thin out to one every ``STOP_CHECK_STEPS`` points.

Each rank prints ``slow: stopped at step S (asked after 4), checks C`` and
``fast: stride N after P points, checks C``.
"""

import signal
import time

from runner.checkpoint.preemption import (
    STOP_CHECK_STEPS,
    StopAgreement,
    install_stop_handlers,
    request_stop,
)

from harness import run_on_ranks

ASKED_AFTER = 4


def slow(world) -> str:
    restore = install_stop_handlers()
    agreement = StopAgreement(world, world.Get_rank(), timeout_s=60)
    try:
        for step in range(1, 40):
            time.sleep(0.3)
            if world.Get_rank() == 1 and step == ASKED_AFTER + 1:
                request_stop(signal.SIGINT)  # arrived during step ASKED_AFTER + 1
            if agreement.check(step):
                return (f"stopped at step {step} (asked after {ASKED_AFTER}), "
                        f"checks {agreement.checks}")
        raise AssertionError("no stop within 40 slow steps")
    finally:
        agreement.close()
        restore()


def fast(world) -> str:
    agreement = StopAgreement(world, world.Get_rank(), timeout_s=60)
    points = 8 * STOP_CHECK_STEPS
    for step in range(1, points + 1):
        time.sleep(0.002)
        assert agreement.check(step) is None
    agreement.close()
    return f"stride {agreement.stride} after {points} points, checks {agreement.checks}"


run_on_ranks(lambda world: f"slow: {slow(world)}; fast: {fast(world)}")
