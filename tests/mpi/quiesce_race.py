"""mpiexec -n 2 python quiesce_race.py: an active's gossip thread is held inside the window
between its permission check and the start of its exchange while the training thread
quiesces (and, last, stops). No exchange may happen after quiesce() returns on either rank,
and stop() must not leave the active talking to a passive that already stopped.

In between, the two learners take their parts of checkpoints without meeting
(PairwiseAverager.capture) at the two awkward moments: the active while its averaging is in
flight (its request sent, the reply not merged: the copy takes its half when it merges), and
the passive before it serves an averaging that the active started before its own capture (the
active then waits for its capture before merging). Either way the copies hold the pair's sum.

Rank 0 is the active, rank 1 the passive; each model is one vector of the rank's number.
"""

import threading
import time

import torch

from runner.comm.pairwise import PairwiseAverager

from harness import run_on_ranks

HOLD_S = 0.5  # how long the active's gossip thread stays inside the window
WATCH_S = 1.5  # how long after quiesce() nothing may change


class Window:
    """The ``before_exchange`` hook: once armed, the next active round that passed its
    permission check signals it and sleeps there, handing the processor to the other
    threads."""

    def __init__(self):
        self.armed = False
        self.reached = threading.Event()

    def __call__(self):
        if self.armed:
            self.armed = False
            self.reached.set()
            time.sleep(HOLD_S)

    def hold_next_round(self, averager):
        self.reached.clear()
        self.armed = True
        averager.tick(0)  # a tick lets the rate-limited active start a round
        assert self.reached.wait(10), "the active never reached the window"


def frozen_after(averager, x, comm, what):
    """Nothing changes on this rank for WATCH_S after the collective pause ``what``."""
    before = (averager.exchanges, x.clone())
    time.sleep(WATCH_S)
    assert averager.exchanges == before[0], (
        f"{averager.exchanges - before[0]} exchange(s) after {what}() returned")
    assert torch.equal(x, before[1]), f"the model changed after {what}() returned"
    comm.Barrier()


def check(world):
    rank = world.Get_rank()
    assert world.Get_size() == 2
    x = torch.full((1000,), float(rank), dtype=torch.float64)
    active = rank == 0
    averager = PairwiseAverager(world, [x], threading.Lock(), is_active=active,
                                next_peer=lambda k: 1, timeout_s=4.0)
    window = Window()
    averager.before_exchange = window
    for _ in range(5):  # ordinary exchanges first
        averager.tick(0)
        time.sleep(0.02)
    world.Barrier()

    # 1. quiesce() while the active is held inside the window.
    if active:
        window.hold_next_round(averager)
    averager.quiesce(world.Barrier)
    frozen_after(averager, x, world, "quiesce")
    total = world.allreduce(float(x.sum()))
    assert abs(total - 1000.0) < 1e-9, f"the pair's sum moved: {total}"
    averager.resume()
    world.Barrier()
    captured = capture_in_flight(world, averager, active) + capture_before_serving(
        world, averager, active)

    # 2. stop() while the active is held inside the window: the passive stops for good.
    if active:
        window.hold_next_round(averager)
    averager.stop(world.Barrier)
    frozen_after(averager, x, world, "stop")
    averager.raise_if_failed()
    return (f"no exchange after quiesce or stop ({averager.exchanges} exchanges before); "
            f"{captured}")


def wait_for(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def copies_sum(world, capture) -> float:
    return world.allreduce(float(sum(t.sum() for t in capture.x)))


def capture_in_flight(world, averager, active) -> str:
    """The active captures inside its averaging (after the request, before the merge); the
    passive, after it has merged that averaging."""
    before = averager.exchanges
    if active:
        catch_up, taken = averager._catch_up, []

        def capture_inside(generation, peer):  # the gossip thread, between request and merge
            taken.append(averager.capture())
            catch_up(generation, peer)

        averager._catch_up = capture_inside
        averager.tick(0)
        wait_for(lambda: taken, "the active never started an averaging")
        capture = averager.settle(taken[0])
        averager._catch_up = catch_up
        assert capture.gossip["exchanges"] == before + 1, "the copy missed the averaging"
    else:
        wait_for(lambda: averager.exchanges == before + 1, "the passive never served it")
        capture = averager.settle(averager.capture())
    total = copies_sum(world, capture)
    assert abs(total - 1000.0) < 1e-9, f"the copies lost the pair's sum: {total}"
    world.Barrier()
    return "a capture in flight kept the sum"


def capture_before_serving(world, averager, active) -> str:
    """The passive captures first; the active's next averaging (its request from before its
    own capture) waits, unmerged, until the active has captured too."""
    if not active:
        capture = averager.capture()
    world.Barrier()
    if active:
        before = averager.exchanges
        averager.tick(0)
        time.sleep(0.3)
        assert averager.exchanges == before, "merged before this learner's capture"
        capture = averager.capture()
        wait_for(lambda: averager.exchanges == before + 1, "the averaging never ended")
        assert capture.gossip["exchanges"] == before, "the copy took an averaging of after"
    averager.settle(capture)
    total = copies_sum(world, capture)
    assert abs(total - 1000.0) < 1e-9, f"the copies lost the pair's sum: {total}"
    world.Barrier()
    return "a capture before serving kept the sum"


run_on_ranks(check)
