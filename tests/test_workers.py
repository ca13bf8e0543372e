"""make test's workers (pytest-xdist, --dist loadgroup): tests that share a module- or
session-scoped job, or a resource one test at a time may use (the lab, the local SLURM), run
on one worker (conftest.py's worker_groups); the longest chains are queued first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace

import pytest

from conftest import REPO, schedule_rank, worker_groups


class FakeItem:
    """What worker_groups reads of a test: its marks and the fixtures it uses."""

    def __init__(self, name: str, resources=(), fixtures=(), marks=()):
        self.name = name
        self.marks = [SimpleNamespace(name="resource", args=(r,)) for r in resources] + [
            SimpleNamespace(name=m, args=()) for m in marks]
        defs = {f: [SimpleNamespace(scope=scope, baseid=where)] for f, scope, where in fixtures}
        self._fixtureinfo = SimpleNamespace(names_closure=list(defs), name2fixturedefs=defs)

    def iter_markers(self, name: str):
        return (m for m in self.marks if m.name == name)

    def get_closest_marker(self, name: str):
        return next(self.iter_markers(name), None)

    def __repr__(self) -> str:
        return self.name


def test_a_shared_job_or_resource_binds_tests_to_one_group_and_others_stay_free():
    job = ("job", "module", "test_a.py")
    items = {
        "alone": FakeItem("alone", fixtures=[("tmp_path", "function", "")]),
        "a1": FakeItem("a1", fixtures=[job]),
        "a2": FakeItem("a2", fixtures=[job, ("tmp_path", "function", "")]),
        "lab1": FakeItem("lab1", resources=["lab"]),
        # uses the lab and a session job of its file: the job's other user joins the lab's group
        "lab2": FakeItem("lab2", resources=["lab"], fixtures=[("env", "session",
                                                               "test_b.py")]),
        "b": FakeItem("b", fixtures=[("env", "session", "test_b.py")]),
        # the local SLURM mostly waits, as the lab does: one worker takes both in turn
        "slurm": FakeItem("slurm", resources=["slurm"]),
        "gpu": FakeItem("gpu", resources=["gpu"]),
        # conftest.py's own fixtures bind nothing
        "c": FakeItem("c", fixtures=[("helper", "session", "conftest.py")]),
    }
    groups = worker_groups(list(items.values()))
    named = {item.name: group for item, group in groups.items()}
    assert named == {"a1": "test_a.py.job", "a2": "test_a.py.job", "lab1": "lab", "lab2": "lab",
                     "b": "lab", "slurm": "lab", "gpu": "gpu"}, named


def test_the_queue_starts_with_shared_resources_then_processes_then_unit_tests():
    items = [FakeItem("unit"), FakeItem("job", marks=["mpi"]), FakeItem("lab", resources=["lab"]),
             FakeItem("cli", marks=["slow"])]
    assert [i.name for i in sorted(items, key=schedule_rank)] == ["lab", "job", "cli", "unit"]


# A test file of this suite's shape: half its tests share a module fixture, half are free.
GROUPED_FILE = """
import pytest


@pytest.fixture(scope="module")
def shared():
    return object()


@pytest.mark.parametrize("n", range(6))
def test_with_the_fixture(shared, n):
    pass


@pytest.mark.parametrize("n", range(6))
def test_alone(n):
    pass
"""


@pytest.mark.slow
def test_tests_of_one_group_run_on_one_worker(tmp_path):
    """Two workers on a file whose tests partly share a module fixture, grouped by this
    suite's conftest: the grouped tests carry their group and all run on one worker. (pytest
    9.2 dropped the group xdist writes into the node id, and the tests were spread over both
    without a word: setup.cfg pins pytest.)"""
    (tmp_path / "test_grouped.py").write_text(GROUPED_FILE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2",
                           "--dist", "loadgroup", "--no-loadscope-reorder", "-v",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "test_grouped.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", proc.stdout, flags=re.M)
    workers = defaultdict(set)
    for worker, nodeid in ran:
        workers[nodeid.rpartition("@")[2] if "@" in nodeid else None].add(worker)
    assert len(ran) == 12 and "test_grouped.py.shared" in workers, proc.stdout[-3000:]
    assert len(workers["test_grouped.py.shared"]) == 1, ran
    assert len([n for n in ran if "@" in n[1]]) == 6, ran
