"""Shared helpers: run the installed CLI and real MPI ranks from tests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import unittest.mock
from collections.abc import Iterator
from pathlib import Path

import pytest


def one_thread_pool_per_core() -> None:
    """Under make test's N workers, torch's intra-op pool in each worker (and in what it starts
    without an OMP_NUM_THREADS of its own: a one-rank run, a simulation) gets the cores / N
    threads, not every core: as the launcher does for the ranks of one job, for the same
    reason. Three workers with two threads each on 2 cores spent 15 % more CPU on the
    simulator's tests (the pool's threads waiting for each other), for no test that needs a
    second thread. Set before torch loads, which reads it once; a value given is kept."""
    from runner.launch.local import threads_per_process  # torch-free, as the launcher is

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_process(workers)))


one_thread_pool_per_core()


def a_session_per_worker() -> None:
    """Each of make test's workers runs in a session of its own, as each of MPICH's ranks and
    each of under_load.py's busy processes does. Where the kernel shares the CPU between
    sessions first (autogroup, on by default on many Linux systems, on this one too), the
    workers and everything they start outside a job's own session (the command line, its
    simulations, the tests that compute in the worker) otherwise shared one session's part of
    a busy machine: three workers beside two busy processes got a third of the cores between
    them. A Ctrl-C at the terminal reaches the workers through the controller
    (:func:`pytest_configure`), as it reached them in its process group before."""
    if os.environ.get("PYTEST_XDIST_WORKER") and os.getsid(0) != os.getpid():
        os.setsid()


a_session_per_worker()

import recipes  # noqa: E402, F401 - fills the recipe registry, as the commands and the worker do

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
MPI_SCRIPTS = Path(__file__).parent / "mpi"


# A narrower digits CNN (69,610 parameters, not 151,306: a seventh of the compute per step),
# for checks that do not depend on the model's width (means, conservation, push-sum weights,
# resuming bit for bit); its messages (0.14-0.56 MB) still take MPI's large-message path.
SMALL_DIGITS_MODEL = ["recipe.channels=[8,16]", "recipe.hidden=256"]
# For comparing update rules, not what they learn: a smaller CNN still, on 395 training
# digits (7 steps an epoch at 4 ranks x 16, the last short and uneven: 3, 3, 3, 2 samples;
# 7 is no multiple of the period 3 the cases use), a fraction of the defaults' 23 steps.
RULES_DIGITS = ["recipe.channels=[8,16]", "recipe.hidden=32", "recipe.heldout_fraction=0.78"]


def run_cli(args: list[str], cwd: Path | str, timeout: float = 300, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``adpsgd-run ARGS`` as a user would; fail with its output when it fails."""
    proc = subprocess.run([str(BIN / "adpsgd-run"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        pytest.fail(f"adpsgd-run {' '.join(args)} exited {proc.returncode}\n"
                    f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def ctrl_c_simulation(cwd: Path | str, run_dir: Path | str, *args: str, timeout: float = 60,
                      sigint_ignored: bool = False) -> tuple[int, str]:
    """A dpsgd simulation on 4 learners, Ctrl-C'd once its progress bar shows it training;
    returns its exit status and what it printed on stderr. ``sigint_ignored``: started as
    ``&`` in a script starts it (SIGINT inherited ignored)."""
    proc = subprocess.Popen(
        [str(BIN / "adpsgd-run"), "recipe=digit_images", "algo=dpsgd", "launcher=sim",
         "launcher.nprocs=4", f"hydra.run.dir={run_dir}", *args], cwd=cwd,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored
        else None)
    err = b""
    while b"(sim)" not in err:  # the progress bar: the simulation is training
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, err.decode()
        err += chunk
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=timeout)
    return proc.returncode, (err + rest).decode()


def run_mpi(nprocs: int, script: str, *args: str, timeout: float = 180, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run tests/mpi/SCRIPT on ``nprocs`` real ranks with the venv's mpiexec; where the
    tests' rank factory is up, each rank is a fork of it (runner/warm_script.py), which saves
    each the import of torch (about 2 CPU s)."""
    from runner.rank_factory import FACTORY_ADDRESS, SHARED_FACTORY

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    warm = ["-m", "runner.warm_script"] if env.get(SHARED_FACTORY) else []
    if warm:
        env[FACTORY_ADDRESS] = env[SHARED_FACTORY]
    cmd = [str(BIN / "mpiexec"), "-n", str(nprocs), sys.executable, *warm,
           str(MPI_SCRIPTS / script), *args]
    # A session of its own: on a time-out the whole job (mpiexec, its proxies, the ranks) is
    # killed, not mpiexec alone, and what the ranks printed so far is shown.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, start_new_session=True) as job:
        try:
            stdout, stderr = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            stdout, stderr = job.communicate()
            pytest.fail(f"{' '.join(cmd)} still ran after {timeout:.0f} s (killed)\n"
                        f"stdout:\n{stdout[-4000:]}\nstderr:\n{stderr[-4000:]}")
    proc = subprocess.CompletedProcess(cmd, job.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n"
                    f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def run_mpi_cases(nprocs: int, script: str, run_dir: Path, cases: dict[str, list[str]],
                  timeout: float = 300) -> dict[str, list[str]]:
    """Run every case of tests/mpi/SCRIPT in one job (see harness.run_cases_on_ranks);
    return each case's lines, one per rank."""
    proc = run_mpi(nprocs, script, str(run_dir), json.dumps(cases), timeout=timeout)
    lines: dict[str, list[str]] = {name: [] for name in cases}
    # Lines of different ranks can still end up glued together: split at each "rank N:".
    for name, message in re.findall(r"rank \d+: case (\S+): (.*?)(?=rank \d+: case |\n|$)",
                                    proc.stdout):
        lines[name].append(message)
    return lines


def case_report(lines: dict[str, list[str]], case: str, nprocs: int) -> str:
    """The case's message (one per rank, all must have passed); fails the test otherwise."""
    got = lines[case]
    failed = [line for line in got if line.startswith("FAILED")]
    if failed or len(got) != nprocs:
        pytest.fail(f"case {case}: {failed or got}")
    return "\n".join(got)


def wait_for(condition, what: str, timeout_s: float = 180) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command's name (state, ppid, pgrp, session, ...: proc(5)'s
    fields from the third on); FileNotFoundError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def parent_pid(pid: int) -> int:
    return int(stat_fields(pid)[1])


def read_run(run_dir: Path) -> tuple[list[dict], dict]:
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return metrics, json.loads((run_dir / "summary.json").read_text())


def readme_blocks() -> list[list[str]]:
    """The commands of each of README.md's bash blocks, in order (comments left out)."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [[line.strip() for line in block.splitlines()
             if line.strip() and not line.strip().startswith("#")] for block in blocks]


def readme_commands() -> list[str]:
    """The commands of README.md's bash blocks, in order."""
    return [command for block in readme_blocks() for command in block]


def is_readme_simulation(command: str) -> bool:
    """README commands that train under launcher=sim: tests/test_sim_runs.py runs them as
    written (plus a run dir) and checks what they leave, so test_readme.py need not."""
    words = command.split()
    return words[0] == "adpsgd-run" and "launcher=sim" in words and \
        "launcher.timing_only=true" not in words


def pytest_configure(config) -> None:
    """On make test's controller, a Ctrl-C (SIGINT) is passed on to the workers, each in a
    session of its own (:func:`a_session_per_worker`) that the terminal does not reach:
    without it they stopped only when the controller's exit closed their channels, 5 to 15 s
    later."""
    if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        return
    previous = signal.getsignal(signal.SIGINT)

    def pass_on(signum, frame) -> None:
        for pid in workers_in_sessions_of_their_own():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGINT)
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, pass_on)


def workers_in_sessions_of_their_own() -> list[int]:
    """This process's children that lead a session (/proc/PID/stat: ppid, pgrp, session)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = stat_fields(int(entry))
        except (OSError, IndexError):  # gone meanwhile
            continue
        if int(fields[1]) == me and int(fields[3]) == int(entry):
            found.append(int(entry))
    return found


def pytest_sessionstart(session) -> None:
    """matplotlib lists the system's fonts on its first use on a machine (it runs fc-list and
    caches the list), and torch's first import in a process runs ``ldconfig -p`` (CUDA's
    library lookup): both done here, so that a fast-tier test that plots or is the first to
    touch torch (the project's modules import it lazily) is not refused for starting a
    process (a fresh machine, and a test file run alone, failed that way)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.font_manager  # noqa: F401 - builds and caches the font list
    import torch  # noqa: F401


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the marks
def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` need a CUDA GPU: skipped, with the reason, where none is visible.
    Under ``pytest -n N --dist loadgroup`` (make test), each test gets the xdist group that
    keeps it on one worker with the tests it must not run beside or apart from
    (:func:`worker_groups`)."""
    for item, group in worker_groups(items).items():
        item.add_marker(pytest.mark.xdist_group(group))
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and torch.cuda.is_available() is False "
                                   "here; run make test-gpu on a GPU machine")
    for item in gpu_tests:
        item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)  # before xdist sends the collection to its scheduler
def pytest_collection_finish(session) -> None:
    """On an xdist worker the collected order (after pytest's own ordering by fixtures) is
    the order groups are handed out in (``--no-loadscope-reorder``): :func:`schedule_rank`."""
    if hasattr(session.config, "workerinput"):
        session.items.sort(key=schedule_rank)
    if os.environ.get("ADPSGD_TESTS_SHARE_A_FACTORY", "1") != "0" and any(
            item.get_closest_marker(mark) for item in session.items for mark in TIER_MARKS):
        start_shared_rank_factory()


# One rank factory for each pytest process (runner/rank_factory.py, shared_rank_factory): the
# local jobs its tests start fork their ranks from it, instead of each starting a factory
# that loads torch (1.7-2.5 CPU s a job on this machine). tests/test_rank_factory.py runs
# jobs with factories of their own. ADPSGD_TESTS_SHARE_A_FACTORY=0: a factory for each job.
_shared_factory = contextlib.ExitStack()
_shared_factory_pid = 0


def start_shared_rank_factory() -> None:
    global _shared_factory_pid
    from runner.rank_factory import shared_rank_factory

    log = Path(tempfile.mkstemp(prefix="adpsgd-tests-rank-factory-", suffix=".log")[1])
    _shared_factory.callback(log.unlink, missing_ok=True)
    _shared_factory.callback(lambda: log.read_text() and print(
        f"\nthe tests' rank factory said (its ranks started cold):\n{log.read_text()}",
        file=sys.stderr))
    _shared_factory_pid = _shared_factory.enter_context(shared_rank_factory(log))


def pytest_sessionfinish(session) -> None:
    _shared_factory.close()


# Resources whose tests mostly wait (links, heartbeats, SLURM's scheduling: in CI the lab's
# and the SLURM files used 13 CPU seconds in 100 of wall time) share one worker, one after
# another: on their own workers they ran side by side for the suite's first 14 minutes and
# left the cores half idle (1.1 of 2 in use, benchmarks/suite_profile.py), while the other
# workers keep both cores busy with the tests that compute.
WAITING_RESOURCES = ("lab", "slurm")


def worker_groups(items) -> dict:
    """The xdist group of each test that must share a worker with others; tests left out
    run on whichever worker is free.

    Two reasons bind tests to one worker, and a test bound by both joins both groups:
    * a resource that one test at a time may use, named by ``pytest.mark.resource(NAME)``:
      the lab's hosts and links (a test cuts them), the local SLURM, the GPU; the resources
      whose tests mostly wait (:data:`WAITING_RESOURCES`) are one group;
    * a module- or session-scoped fixture of a test file (one job whose results several
      tests check): on two workers it would run twice.
    Groups are the connected parts of the tests and their resources and fixtures."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    bound = {}
    for item in items:
        resources = [mark.args[0] for mark in item.iter_markers("resource")]
        keys = [f"resource {WAITING_RESOURCES[0] if r in WAITING_RESOURCES else r}"
                for r in resources]
        fixtures = getattr(item, "_fixtureinfo", None)
        for name in fixtures.names_closure if fixtures else ():
            for definition in fixtures.name2fixturedefs.get(name, ()):
                if definition.scope in ("module", "session") and \
                        Path(str(definition.baseid).split("::")[0]).name.startswith("test_"):
                    keys.append(f"fixture {definition.baseid}::{name}")
        if keys:
            bound[item] = keys
            for key in keys[1:]:
                parent[find(key)] = find(keys[0])
    members: dict[str, set[str]] = {}
    for keys in bound.values():
        members.setdefault(find(keys[0]), set()).update(keys)
    # A group is named by its resource ("lab"), else by its fixture ("test_x.py.job").
    names = {root: min(keys, key=lambda k: (not k.startswith("resource "), k)).split(" ", 1)[1]
             .split("/")[-1].replace("::", ".") for root, keys in members.items()}
    return {item: names[find(keys[0])] for item, keys in bound.items()}


def schedule_rank(item) -> int:
    """Where a test goes in make test's queue (``--no-loadscope-reorder``: xdist hands the
    workers groups in this order): the longest chains first, so that none is left running
    alone at the end: tests on a shared resource (one after another on one worker), then those
    that start processes, then the unit tests, which fill the gaps."""
    if item.get_closest_marker("resource"):
        return 0
    return 1 if item.get_closest_marker("slow") or item.get_closest_marker("mpi") else 2


# Test tiers: `make test-fast` runs every test not marked with one of these; `make test` runs
# all. A test that starts a process (MPI ranks, the CLI, SLURM, a script) or trains beyond a
# few steps is marked; in the fast tier starting a process, in the test or in a fixture it
# uses, fails the test and names the mark, so the tier stays fast as tests are added.
TIER_MARKS = ("slow", "mpi", "gpu")


def starts_no_process(item) -> contextlib.AbstractContextManager:
    """While a fast-tier test (or a fixture of it) runs, subprocess.Popen fails."""
    if any(item.get_closest_marker(mark) for mark in TIER_MARKS):
        return contextlib.nullcontext()

    def refuse(self, args, *rest, **options):
        raise AssertionError(
            f"{item.nodeid} starts a process ({args!r}): mark it pytest.mark.slow (or mpi) "
            "so that it runs in make test, not make test-fast")

    return unittest.mock.patch.object(subprocess.Popen, "__init__", refuse)


def cpu_seconds() -> float:
    """CPU time of this process and of every process it (or they) waited for: a test's ranks,
    mpiexec, the CLI, and the ranks the shared rank factory forked and reaped. Daemons it
    leaves to others (SLURM's, the lab's) are not counted."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN))
               ) + shared_factory_cpu_seconds()


def shared_factory_cpu_seconds() -> float:
    """The shared factory's own CPU time and its reaped children's (until it ends, when
    RUSAGE_CHILDREN takes them over)."""
    try:
        fields = stat_fields(_shared_factory_pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return sum(int(tick) for tick in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def cpu_counted(item, phase: str) -> Iterator[None]:
    """Record the phase's CPU seconds as the test's property ``cpu_s_PHASE``: JUnit XML
    (``--junitxml``) carries it, and benchmarks/suite_profile.py sums it by file."""
    before = cpu_seconds()
    try:
        yield
    finally:
        item.user_properties.append((f"cpu_s_{phase}", round(cpu_seconds() - before, 3)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # When and where the test ran: suite_profile.py draws from them how busy the cores were.
    item.user_properties += [("started_at", round(time.time(), 2)),
                             ("worker", os.environ.get("PYTEST_XDIST_WORKER", "main"))]
    with cpu_counted(item, "setup"), starts_no_process(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with cpu_counted(item, "call"), starts_no_process(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    with cpu_counted(item, "teardown"):
        yield
