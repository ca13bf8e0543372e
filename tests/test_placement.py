"""Where a replacement learner starts (launcher.respawn across hosts,
runner/elastic/respawn.py's placement): the lost learner's host first, only hosts that answer
and that Open MPI's runtime can safely start a process of the job on, with a slot free."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runner.elastic import respawn
from runner.runlog import liveness


def membership(members: list[int], lost_hosts: list[str], launches: list[list[int]] | None = None,
               hosts: list[str] | None = None, capacity: dict[str, int] | None = None):
    """Learners 0-1 on lab1 and 2-3 on lab2 (and any spawned later), 2 slots per host of
    lab1-lab3 by default; ``members``: the numbers alive."""
    hosts = hosts or ["lab1", "lab1", "lab2", "lab2"]
    capacity = capacity if capacity is not None else {"lab1": 2, "lab2": 2, "lab3": 2}
    return SimpleNamespace(members=members, hosts=hosts, lost_hosts=lost_hosts,
                           launches=launches or [[0, 1, 2, 3]],
                           host_capacity=lambda: capacity or None)


@pytest.fixture
def answering(monkeypatch):
    """Set the hosts the launcher's last answer found answering."""
    def answer(*hosts: str) -> None:
        monkeypatch.setattr(liveness, "LINK", SimpleNamespace(answering=frozenset(hosts)))
    return answer


def test_a_host_that_lost_a_learner_takes_none_while_its_launch_lives(answering):
    """Learner 3 killed on lab2 beside learner 2: Open MPI's runtime cannot be trusted to
    start a process of the job beside one that ended, so lab3 (free, answering) takes the
    replacements, though lab2 answers and has a slot; lab1, full, takes none."""
    answering("lab1", "lab2", "lab3")
    m = membership([0, 1, 2], ["lab2"])
    assert respawn.spawn_unsafe_hosts(m) == {"lab2"}
    assert respawn.placement(m, 1) == ["lab3"]
    assert respawn.placement(m, 3) == ["lab3", "lab3"]


def test_a_host_that_lost_every_process_of_a_launch_takes_none(answering):
    """lab2 lost learners 2 and 3, the launch's only processes there: even answering, it
    takes none; lab3 (never used) takes both."""
    answering("lab1", "lab2", "lab3")
    m = membership([0, 1], ["lab2", "lab2"])
    assert respawn.spawn_unsafe_hosts(m) == {"lab2"}
    assert respawn.placement(m, 2) == ["lab3", "lab3"]


def test_a_host_that_does_not_answer_takes_none_and_the_line_says_why(answering):
    answering("lab1")  # lab2 cut (its learners lost), lab3 silent
    m = membership([0, 1], ["lab2", "lab2"])
    assert respawn.placement(m, 2) == []
    assert respawn.why_no_host(m) == (
        "lab2 has lost a process of the job, and Open MPI's runtime cannot reliably start one "
        "there again; lab3 does not answer; no other host of launcher.hostfile has a free slot")
    answering("lab1", "lab3")  # lab3 answers again
    assert respawn.placement(m, 2) == ["lab3", "lab3"]


def test_hosts_with_learners_count_as_answering_and_full_hosts_take_none(answering):
    answering()  # the launcher has not finished a round yet
    m = membership([0, 1, 2, 3], [], capacity={"lab1": 2, "lab2": 3, "lab3": 2})
    assert respawn.placement(m, 1) == ["lab2"]  # learners 2-3 are heard from there
    assert respawn.placement(m, 2) == ["lab2"]  # lab1 is full, lab3 not known to answer
    assert respawn.why_no_host(m) == ("lab3 does not answer; no other host of "
                                      "launcher.hostfile has a free slot")


def test_a_spawned_launch_closes_its_host_after_a_loss_until_none_of_it_lives(answering):
    """Replacements 4-5 were spawned on lab3 and 4 was lost: while 5 lives, lab3 takes no
    other; once both are gone their launch is in no spawn's connect, and lab3 is open
    again (lab2, where the first launch lost learners 2-3, stays closed)."""
    answering("lab1", "lab2", "lab3")
    hosts = ["lab1", "lab1", "lab2", "lab2", "lab3", "lab3"]
    launches = [[0, 1, 2, 3], [4, 5]]
    one_left = membership([0, 1, 5], ["lab3"], launches, hosts)
    assert respawn.spawn_unsafe_hosts(one_left) == {"lab2", "lab3"}
    assert respawn.placement(one_left, 1) == []
    none_left = membership([0, 1], ["lab3", "lab3"], launches, hosts)
    assert respawn.spawn_unsafe_hosts(none_left) == {"lab2"}
    assert respawn.placement(none_left, 2) == ["lab3", "lab3"]


def test_without_a_hostfile_open_mpi_places_them(answering):
    answering("lab1")
    m = membership([0, 1, 2], ["lab2"], capacity={})
    assert respawn.placement(m, 2) == [None, None]


def test_a_processor_name_with_a_domain_matches_the_hostfiles_short_name(answering):
    answering("lab1.cluster", "lab2.cluster", "lab3.cluster")
    m = membership([0, 1, 2], ["lab2.cluster"],
                   hosts=["lab1.cluster", "lab1.cluster", "lab2.cluster", "lab2.cluster"])
    assert respawn.spawn_unsafe_hosts(m) == {"lab2"}
    assert respawn.placement(m, 1) == ["lab3"]
