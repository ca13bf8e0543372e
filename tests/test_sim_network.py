"""The simulator's network model against closed forms: an uncontended ring allreduce played out
transfer by transfer takes 2 (n - 1) / n * M / B + 2 (n - 1) * alpha, and flows that share an
interface share its bandwidth."""

from __future__ import annotations

import pytest

from runner.sim.event_queue import EventQueue
from runner.sim.network import Link, SharedChannel, ring_allreduce, ring_allreduce_s

ETHERNET_100G = Link(latency_s=5e-6, bandwidth_Bps=12.5e9)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("nbytes", [4e3, 1.4e8])  # a small message; a 35M-parameter model
def test_ring_allreduce_on_idle_links_takes_its_closed_form(n, nbytes):
    queue = EventQueue()
    channels = [SharedChannel(queue, ETHERNET_100G) for _ in range(n)]
    done = []
    ring_allreduce(queue, channels, nbytes, lambda: done.append(queue.now))
    queue.run()
    expected = 2 * (n - 1) / n * nbytes / 12.5e9 + 2 * (n - 1) * 5e-6
    assert done == [pytest.approx(expected, rel=1e-9)]
    assert ring_allreduce_s(n, nbytes, ETHERNET_100G) == pytest.approx(expected, rel=1e-12)
    assert sum(c.bytes_sent for c in channels) == pytest.approx(2 * (n - 1) * nbytes)


def test_flows_on_one_interface_share_its_bandwidth():
    """100 B/s, no latency: A (100 B) alone for 0.5 s, then A and B (100 B, from t = 0.5) at
    50 B/s each until A ends at 1.5 s; B's last 50 B alone: done at 2.0 s."""
    queue = EventQueue()
    channel = SharedChannel(queue, Link(0.0, 100.0))
    ends = {}
    channel.send(100, lambda: ends.setdefault("a", queue.now))
    queue.at(0.5, lambda: channel.send(100, lambda: ends.setdefault("b", queue.now)))
    queue.run()
    assert ends == {"a": pytest.approx(1.5), "b": pytest.approx(2.0)}


def test_a_ring_shares_interfaces_with_other_traffic():
    """Another 1-step-long transfer on every interface at the start delays the ring by exactly
    what processor sharing predicts: the first step's chunk moves at half speed while it lasts."""
    link = Link(0.0, 1.0)
    queue = EventQueue()
    channels = [SharedChannel(queue, link) for _ in range(4)]
    for channel in channels:  # 1 byte of other traffic each: ends at t = 2 (half speed)
        channel.send(1.0, lambda: None)
    done = []
    ring_allreduce(queue, channels, 4.0, lambda: done.append(queue.now))  # chunks of 1 byte
    queue.run()
    # Idle: 6 steps of 1 s. Shared: the first step takes 2 s, the rest 1 s each.
    assert done == [pytest.approx(7.0)]


def test_events_run_in_time_order_and_ties_in_scheduling_order():
    queue = EventQueue()
    seen = []
    queue.at(2.0, lambda: seen.append("late"))
    queue.at(1.0, lambda: seen.append("first"))
    queue.at(1.0, lambda: seen.append("second"))
    assert queue.run(until=1.5) == 1.5 and seen == ["first", "second"]
    queue.run()
    assert seen == ["first", "second", "late"] and queue.now == 2.0
    with pytest.raises(ValueError):
        queue.at(1.0, lambda: None)
