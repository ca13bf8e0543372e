"""Ranks forked from the rank factory (runner/rank_factory.py, launcher.warm_start): they
train as cold ranks do, their stand-ins pass signals on and end as they end, a dead stand-in
takes its rank with it, and without a factory a rank starts cold. Real adpsgd-run, mpiexec,
factory and ranks."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner.rank_factory import (
    FACTORY_ADDRESS,
    SHARED_FACTORY,
    rank_factory,
    shared_rank_factory,
)

from conftest import BIN, REPO, parent_pid, read_run, run_cli, wait_for

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOB = ["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.progress=false"]
LONG = ["trainer.epochs=300", "trainer.checkpoint_every=20", "faults.delay_s=0.2"]


@pytest.fixture(autouse=True)
def own_factories(monkeypatch):
    """These tests are of a job's own factory: not the one the suite shares (conftest.py)."""
    monkeypatch.delenv(SHARED_FACTORY, raising=False)


def pgrep(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def stand_ins(run_dir: Path) -> list[int]:
    """The processes mpiexec started (their command line ends with the run dir)."""
    return pgrep(f"^\\S*python\\S* -m runner.worker {run_dir}$")


def ranks(run_dir: Path) -> list[int]:
    return [int((run_dir / "logs" / f"rank{r}.pid").read_text().split()[0]) for r in range(2)]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def start_long_job(tmp_path: Path, overrides: tuple[str, ...] = ()
                   ) -> tuple[subprocess.Popen, Path]:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(BIN / "adpsgd-run"), *JOB, *LONG, *overrides,
                             f"hydra.run.dir={run_dir}"],
                            cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    wait_for(lambda: (run_dir / "metrics.jsonl").exists(), "the job never evaluated",
             timeout_s=120)
    return proc, run_dir


def end(proc: subprocess.Popen, run_dir: Path) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in pgrep(f"runner.worker {run_dir}"):
        os.kill(pid, signal.SIGKILL)


def test_a_warm_job_trains_as_a_cold_one(tmp_path):
    """The same run, forked and cold: the same evaluations; each rank's log says how it
    started."""
    results = {}
    for warm in ("true", "false"):
        run_dir = tmp_path / f"warm_{warm}"
        run_cli([*JOB, "trainer.epochs=2", f"launcher.warm_start={warm}",
                 f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        metrics, summary = read_run(run_dir)
        assert summary["status"] == "completed"
        results[warm] = [(m["step"], m["split"], m["loss"], m.get("top1")) for m in metrics]
        for rank in range(2):
            log = (run_dir / "logs" / f"rank{rank}.log").read_text()
            assert ("started forked from the rank factory" in log) == (warm == "true"), log
    assert results["true"] == results["false"]
    assert pgrep(f"runner.worker {tmp_path}") == []  # the factory ended with the job


def cores(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines()
                if line.startswith("Cpus_allowed_list:"))


def test_the_ranks_are_the_factorys_and_mpiexec_sees_their_stand_ins(tmp_path):
    """Two stand-ins for two ranks, the ranks children of one factory and bound to the cores
    mpiexec bound their stand-ins to; SIGTERM to the stand-ins reaches the ranks, which
    checkpoint and stop as preempted (status 75), and the stand-ins end with their status."""
    proc, run_dir = start_long_job(tmp_path, ("launcher.mpiexec_args=[-bind-to,core]",))
    try:
        standing = stand_ins(run_dir)
        assert len(standing) == 2
        factory = pgrep(f"runner.worker {run_dir} --rank-factory$")
        parents = {parent_pid(pid) for pid in ranks(run_dir)}
        assert set(factory) & parents == parents and len(parents) == 1, (factory, parents)
        bound = sorted(cores(pid) for pid in standing)
        assert sorted(cores(pid) for pid in ranks(run_dir)) == bound
        if os.cpu_count() >= 2:
            assert bound == ["0", "1"], bound
        for pid in standing:
            os.kill(pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        end(proc, run_dir)
    assert proc.returncode == 75, err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "preempted"
    assert pgrep(f"runner.worker {run_dir}") == []


def test_a_stand_in_killed_takes_its_rank_with_it_even_a_stopped_one(tmp_path):
    """kill -9 of what mpiexec started, its rank stopped (SIGSTOP, where the rank's own watch
    cannot run): the factory kills the rank, the job ends with one line, nothing is left."""
    proc, run_dir = start_long_job(tmp_path)
    try:
        rank_pids = ranks(run_dir)
        for pid in rank_pids:
            os.kill(pid, signal.SIGSTOP)
        os.kill(stand_ins(run_dir)[0], signal.SIGKILL)
        wait_for(lambda: not all(alive(pid) for pid in rank_pids), "the rank outlived its "
                 "stand-in", timeout_s=10)
        _, err = proc.communicate(timeout=120)
        wait_for(lambda: not pgrep(f"runner.worker {run_dir}"), "processes were left",
                 timeout_s=10)
    finally:
        end(proc, run_dir)
    # As for a cold rank killed: named, with the way to continue.
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert "died without reporting an error (killed from outside: kill -9" in err, err
    assert "with resume=auto" in err, err


@pytest.mark.parametrize("factory", ["running", "none"])
def test_a_stand_in_ends_as_its_rank_and_starts_cold_without_a_factory(tmp_path, factory):
    """A rank that ends at once (a usage error: status 2 and the line on its stderr) through
    a factory, and the same with no factory at the address given: the rank starts cold."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "runner.worker", str(run_dir), "--no-such-flag"]
    if factory == "none":
        proc = subprocess.run(command, env={**env, FACTORY_ADDRESS: "adpsgd-no-factory"},
                              capture_output=True, text=True, timeout=60)
    else:
        with rank_factory(str(run_dir), run_dir / "logs" / "warm-start.log", env) as serving:
            proc = subprocess.run(command, env={**env, FACTORY_ADDRESS: serving.address},
                                  capture_output=True, text=True, timeout=120)
        assert (run_dir / "logs" / "warm-start.log").read_text() == ""
    assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m runner.worker")
    assert pgrep(f"runner.worker {run_dir}") == []


def test_jobs_given_a_shared_factory_fork_their_ranks_from_it(tmp_path):
    """A factory started for many jobs (ADPSGD_SHARED_RANK_FACTORY): a job's ranks fork from
    it and the job starts no factory of its own; a job whose PYTHONPATH differs from the
    factory's (it would import other code), one whose LD_PRELOAD does (a fork would lack the
    library) and one with launcher.warm_start=false start cold; the factory outlives the jobs
    and ends with its block."""
    jobs = {"shared": {}, "other_path": {"PYTHONPATH": str(REPO)},
            "other_preload": {"LD_PRELOAD": "libm.so.6"},
            "warm_start_off": {}}
    with shared_rank_factory(tmp_path / "factory.log") as factory:
        for name, env in jobs.items():
            off = ["launcher.warm_start=false"] if name == "warm_start_off" else []
            run_cli([*JOB, "trainer.epochs=1", *off, f"hydra.run.dir={tmp_path / name}"],
                    cwd=tmp_path, env=env)
        assert alive(factory)
    assert not alive(factory) and (tmp_path / "factory.log").read_text() == ""
    for name in jobs:
        logs = tmp_path / name / "logs"
        assert not (logs / "warm-start.log").exists(), name
        for rank in range(2):
            log = (logs / f"rank{rank}.log").read_text()
            started = f"forked from the rank factory (pid {factory})" if name == "shared" \
                else "started cold"
            assert started in log, (name, log)
    evaluations = {name: [(m["step"], m["split"], m["loss"], m.get("top1"))
                          for m in read_run(tmp_path / name)[0]] for name in jobs}
    assert evaluations["shared"] == evaluations["warm_start_off"] == \
        evaluations["other_path"] == evaluations["other_preload"]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to connect as another user")
def test_a_factory_answers_its_own_user_only(tmp_path):
    """The factory's socket file is in a folder of its user alone: another user cannot
    connect; and were the folder opened to all, the factory would still not answer them, so
    it could never have a rank forked as the factory's user."""
    hear = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "s.settimeout(60); print(s.recv(100))")

    def listen_as(user: int, address: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/usr/bin/python3", "-c", hear, address], user=user,
                              capture_output=True, text=True, timeout=120)

    with rank_factory(str(tmp_path), tmp_path / "factory.log", dict(os.environ)) as serving:
        own, other = listen_as(os.getuid(), serving.address), listen_as(65534, serving.address)
        os.chmod(os.path.dirname(serving.address), 0o777)
        os.chmod(serving.address, 0o777)
        other_let_in = listen_as(65534, serving.address)
    assert own.stdout.startswith("b'{\"hello\":"), own
    assert "PermissionError" in other.stderr, other
    assert other_let_in.stdout.strip() == "b''", other_let_in
    assert not os.path.exists(os.path.dirname(serving.address))  # removed as the factory left


def json_objects(text: str) -> list[dict]:
    """The JSON objects in ``text``: mpiexec passes the ranks' output on as it comes, and
    two ranks' lines can arrive glued together (2 of 6 runs of
    test_a_script_run_warm_sees_what_it_sees_run_cold_and_ends_as_it_ends on 2 cores)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        obj, at = decoder.raw_decode(text, at)
        found.append(obj)
    return found


SEEN_FROM_A_NAMESPACE = """
import json, os, socket
from runner.rank_factory import started_as
print(json.dumps({"started": started_as(), "host": socket.gethostname(), "cwd": os.getcwd(),
                  "namespaces": {kind: os.stat(f"/proc/self/ns/{kind}").st_ino
                                 for kind in ("net", "uts", "mnt")}}))
"""


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare (util-linux), to make namespaces")
def test_a_stand_in_in_other_namespaces_has_its_rank_forked_into_them(tmp_path):
    """A stand-in in a network, hostname and mount namespace of its own (as on a lab host,
    scripts/lab_cluster.sh) reaches the factory through its socket file: the fork joins its
    namespaces and sees what a cold start there sees (the host's name, its network, its
    mounts), not the factory's."""
    script = tmp_path / "seen.py"
    script.write_text(SEEN_FROM_A_NAMESPACE)
    inside = ["unshare", "--net", "--uts", "--mount", "sh", "-c",
              'hostname nshost && exec "$@"', "sh", sys.executable]
    env = dict(os.environ)

    def seen(factory: str | None) -> dict:
        proc = subprocess.run([*inside, "-m", "runner.warm_script", str(script)], cwd=tmp_path,
                              env={**env, **({FACTORY_ADDRESS: factory} if factory else {})},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    with rank_factory("namespaces", tmp_path / "factory.log", env) as factory:
        warm = seen(factory.address)
    cold = seen(None)
    ours = {kind: os.stat(f"/proc/self/ns/{kind}").st_ino for kind in ("net", "uts", "mnt")}
    assert warm["started"] == f"forked from the rank factory (pid {factory.pid})", warm
    assert cold["started"] == "cold"
    for name, result in (("warm", warm), ("cold", cold)):
        assert result["host"] == "nshost" and result["cwd"] == str(tmp_path), (name, result)
        assert all(result["namespaces"][kind] != ours[kind] for kind in ours), (name, result)
    assert (tmp_path / "factory.log").read_text() == ""


def test_without_room_for_the_factory_s_socket_the_ranks_start_cold(tmp_path, monkeypatch,
                                                                     capsys):
    """A full /tmp (no room for the socket file's folder) costs the job its warm start, said
    in one line, not the job."""
    import errno
    import tempfile

    from runner.rank_factory import factory_for_job

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/adpsgd-rank-factory-x")

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    with factory_for_job(tmp_path, dict(os.environ), warm=True) as environment:
        assert environment == {}
    assert capsys.readouterr().err == (
        "adpsgd-run: note: the ranks start cold (each loads torch): no rank factory: "
        "[Errno 28] No space left on device: '/tmp/adpsgd-rank-factory-x'\n")


JOINS = """
import os, sys
from runner.rank_factory import NAMESPACES, _namespaces_to_join
fds = [(kind, os.open(f"/proc/{sys.argv[1]}/ns/{kind}", os.O_RDONLY)) for kind in NAMESPACES]
try:
    print(sorted(kind for kind, _ in _namespaces_to_join(fds)))
except PermissionError as ex:
    print("cold:", ex)
"""


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root, unshare and setpriv (util-linux), to make namespaces")
def test_a_factory_that_may_not_join_a_namespace_starts_the_rank_cold():
    """Root in a container without CAP_SYS_ADMIN cannot join another namespace: the factory
    says so before it forks (the stand-in then starts the rank cold) instead of forking a
    rank that would fail; with the capability it joins every namespace that differs."""
    elsewhere = subprocess.Popen(["unshare", "--net", "--uts", "--mount", "sleep", "60"])
    try:
        wait_for(lambda: all(
            os.stat(f"/proc/{elsewhere.pid}/ns/{kind}").st_ino !=
            os.stat(f"/proc/self/ns/{kind}").st_ino for kind in ("net", "uts", "mnt")),
            "the namespaces were not made", timeout_s=10)
        joins = [sys.executable, "-c", JOINS, str(elsewhere.pid)]
        able = subprocess.run(joins, capture_output=True, text=True, timeout=60, cwd=REPO)
        unable = subprocess.run(["setpriv", "--bounding-set=-sys_admin", *joins],
                                capture_output=True, text=True, timeout=60, cwd=REPO)
    finally:
        elsewhere.kill()
        elsewhere.wait()
    assert able.stdout.strip() == "['mnt', 'net', 'uts']", able
    assert unable.stdout.strip() == ("cold: the rank runs in another net namespace, and "
                                     "joining it needs root's CAP_SYS_ADMIN"), unable


def test_the_jobs_of_a_sweep_fork_their_ranks_from_one_factory(tmp_path):
    """adpsgd-run -m with two warm jobs: both jobs' ranks are forks of one factory, which
    ends with the sweep; neither job starts one of its own."""
    run_cli(["-m", *JOB, "trainer.epochs=1", "optim.lr=0.1,0.2",
             f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    logs = sorted((tmp_path / "sweep").glob("*/logs"))
    assert len(logs) == 2 and not any((log / "warm-start.log").exists() for log in logs)
    factories = {re.search(r"started forked from the rank factory \(pid (\d+)\)",
                           (log / f"rank{rank}.log").read_text())[1]
                 for log in logs for rank in range(2)}
    assert len(factories) == 1 and not alive(int(factories.pop()))


def test_a_script_run_warm_sees_what_it_sees_run_cold_and_ends_as_it_ends(tmp_path):
    """python -m runner.warm_script SCRIPT ARGS under mpiexec (how conftest.run_mpi runs
    tests/mpi/): with a factory each rank is a fork of it, and the script sees the arguments,
    ``__main__``, its own directory on sys.path, the working directory and OMP_NUM_THREADS it
    sees run directly; without one it runs cold. A script that fails ends the job with its
    status either way."""
    script = str(REPO / "tests" / "mpi" / "started_as.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def job(factory: str | None, *program: str) -> subprocess.CompletedProcess:
        address = {FACTORY_ADDRESS: factory} if factory else {}
        return subprocess.run([str(BIN / "mpiexec"), "-n", "2", sys.executable, *program],
                              env={**env, **address}, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)

    with rank_factory("scripts", tmp_path / "factory.log", env) as factory:
        warm = job(factory.address, "-m", "runner.warm_script", script, "a", "--b")
        not_a_script = job(factory.address, "-m", "runner.warm_script", "-c")
        failed = job(factory.address, "-m", "runner.warm_script", script, "--exit-with", "3")
    cold = job(None, script, "a", "--b")
    failed_cold = job(None, script, "--exit-with", "3")
    seen = {}
    for name, proc in (("warm", warm), ("cold", cold)):
        assert proc.returncode == 0, proc.stderr
        lines = sorted(json_objects(proc.stdout), key=lambda line: line["rank"])
        assert [line["rank"] for line in lines] == [0, 1], proc.stdout
        started = {line.pop("started") for line in lines}
        assert started == ({f"forked from the rank factory (pid {factory.pid})"}
                           if name == "warm" else {"cold"}), started
        seen[name] = [{k: v for k, v in line.items() if k != "pid"} for line in lines]
    assert seen["warm"] == seen["cold"]
    assert seen["warm"][0]["argv"] == [script, "a", "--b"] and seen["warm"][0]["threads"] == 1
    assert seen["warm"][0]["path0"] == str(REPO / "tests" / "mpi")
    assert seen["warm"][0]["name"] == "__main__" and seen["warm"][0]["cwd"] == str(tmp_path)
    assert failed.returncode == failed_cold.returncode != 0, (failed, failed_cold)
    assert not_a_script.returncode == 2 and "runner.warm_script: no such file: -c; usage" in \
        not_a_script.stderr, not_a_script.stderr
    assert (tmp_path / "factory.log").read_text() == ""


def test_a_rank_and_its_stand_in_ending_at_one_instant_leave_the_factory_serving(tmp_path):
    """A rank ends and its stand-in is killed while the factory is stopped, so that it sees
    both at once: it reaps the rank (which closes the stand-in's socket) and lets the stand-in
    go, and forks the next stand-in's rank. Once it unwatched the socket the reaping had closed
    and died: every later rank of the suite's shared factory started cold."""
    script = tmp_path / "until_go.py"
    script.write_text("import os, sys, time\nfrom pathlib import Path\n"
                      "here = Path(sys.argv[1])\n(here / 'pid').write_text(str(os.getpid()))\n"
                      "while not (here / 'go').exists():\n    time.sleep(0.01)\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def stand_in(address: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "runner.warm_script", str(script),
                                 str(tmp_path)], env={**env, FACTORY_ADDRESS: address},
                                cwd=tmp_path)

    def rank_of(proc: subprocess.Popen) -> int:
        wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(),
                 "the rank never started", timeout_s=60)
        pid = int((tmp_path / "pid").read_text())
        (tmp_path / "pid").unlink()
        return pid

    with rank_factory("scripts", tmp_path / "factory.log", env) as factory:
        first = stand_in(factory.address)
        rank = rank_of(first)
        assert rank != first.pid  # a fork of the factory
        os.kill(factory.pid, signal.SIGSTOP)
        try:
            (tmp_path / "go").touch()
            wait_for(lambda: not alive(rank), "the rank did not end", timeout_s=30)
            first.kill()
            first.wait(timeout=30)
        finally:
            os.kill(factory.pid, signal.SIGCONT)
        second = stand_in(factory.address)
        second_rank = rank_of(second)
        assert second.wait(timeout=60) == 0
        assert second_rank != second.pid and alive(factory.pid)
    assert (tmp_path / "factory.log").read_text() == ""
