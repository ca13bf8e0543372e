"""make test's workers (pytest-xdist, --dist loadgroup): tests that share a module- or
session-scoped job, or a resource one test at a time may use (the lab, the local SLURM), run
on one worker (conftest.py's worker_groups); the longest chains are queued first."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest

from runner.runlog.liveness import process_alive

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


SLEEPING_FILE = '''
import os
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(2))
def test_sleeps(n):
    mark = Path(os.environ["MARKS"]) / f"{os.getpid()}"
    mark.write_text(f"{os.getsid(0)}")
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        mark.with_suffix(".interrupted").write_text("")
        raise
'''


@pytest.mark.slow
def test_workers_lead_sessions_of_their_own_and_a_ctrl_c_still_stops_them(tmp_path):
    """Each worker leads a session (conftest.py's a_session_per_worker), so the terminal's
    Ctrl-C, sent to the controller's process group, does not reach them itself; it still
    stops them: each test sees its KeyboardInterrupt and no worker is left. (The controller
    passes it on at once; xdist's own teardown would, some 5 s later, which this does not
    tell apart: 8 s here with it, 12 s without.)"""
    (tmp_path / "test_sleeping.py").write_text(SLEEPING_FILE)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]),
           "MARKS": str(marks)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2",
                             "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                             "test_sleeping.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group, as a terminal's job
    workers: dict[int, int] = {}  # pid -> session, as each worker's test wrote them
    try:
        deadline = time.monotonic() + 120
        while len([m for m in marks.iterdir() if not m.suffix]) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        workers = {int(m.name): int(m.read_text()) for m in marks.iterdir() if not m.suffix}
        assert all(sid == pid for pid, sid in workers.items()), workers
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 2 and "KeyboardInterrupt" in out, out[-3000:]
    assert sorted(m.stem for m in marks.glob("*.interrupted")) == sorted(map(str, workers))
    assert not [pid for pid in workers if process_alive(pid)], workers
