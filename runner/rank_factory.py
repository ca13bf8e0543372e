"""Ranks forked from one process that has already loaded torch (``launcher.warm_start``).

Importing torch, the trainer and the recipes costs every rank about 1.7 s of CPU before it
does anything (4 ranks on 2 cores: over 3 s of each job's start-up). With warm start the
local launcher starts one *rank factory* per run (``python -m runner.worker RUN_DIR
--rank-factory``): it loads those modules once, then waits on a Unix socket the launcher
made. mpiexec starts every rank as before, ``python -m runner.worker RUN_DIR``; that process,
the rank's *stand-in*, sends the factory its arguments, environment, working directory and
open file descriptors (mpiexec's pipes, MPICH's PMI socket), and the factory forks a child
that takes them over and runs the rank. Nothing is shared between ranks but the pages of the
loaded libraries (copy-on-write).

The stand-in stays what mpiexec (and Open MPI's daemons, for ULFM) watch: it passes every
signal it gets on to the rank and ends as the rank ended, with its exit status or killed by
the same signal. A rank whose stand-in dies (mpiexec's SIGKILL on an abort) is killed by the
factory, or kills itself where the factory is gone.

A program that runs many jobs (a sweep script, the test suite) can start one factory for
all of them (:func:`shared_rank_factory`): the local launcher then sends its ranks there
(``ADPSGD_SHARED_RANK_FACTORY``) and starts none of its own, which saves each job the factory's
loading. A factory forks only for its own user (the socket's peer credentials) and only ranks
that would import what it loaded (the same Python, ``PYTHONPATH`` and ``LD_PRELOAD``); others
start cold.

The factory loads no MPI (``mpi4py.MPI`` initializes MPI as it is imported), initializes no
CUDA and starts no thread of its own, so a fork is as safe as a DataLoader worker's. Anything
amiss (no factory, one that failed to load, one on another machine, a namespace to join
without root) and the stand-in runs the rank itself, as a cold start: warm start never
decides whether a run works.

A stand-in in other namespaces of this machine (a lab host's network, hostname and mounts,
scripts/lab_cluster.sh) reaches the factory through its socket file and sends its namespaces
with its request; the fork joins them before it takes over, so the rank runs where its
stand-in would have.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

SERVE = "--rank-factory"  # python -m runner.worker RUN_DIR --rank-factory: the factory
FACTORY_ADDRESS = "ADPSGD_RANK_FACTORY"  # the ranks' environment: the factory's socket
# The launcher's environment: a factory that outlives the job, for the launcher to use
SHARED_FACTORY = "ADPSGD_SHARED_RANK_FACTORY"
_LISTENING_FD = "ADPSGD_RANK_FACTORY_FD"  # the factory's: the socket it inherits
# Signals a stand-in passes on: the graceful stops (runner/checkpoint/preemption.py), what
# MPICH's mpiexec sends (SIGUSR1 with -disable-auto-cleanup) and the rest a process may get.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCONT)
# A factory still loading torch on a machine this busy keeps its stand-ins waiting; past this
# they start cold.
ANSWER_TIMEOUT_S = 120.0
_HEADER = struct.Struct("!I")


# --- the launcher's side ----------------------------------------------------------------

def starts_warm(launcher: Any) -> bool:
    """Whether a local launcher's ranks (its config: ``launcher``) fork from a factory: not
    on one rank (it runs inside adpsgd-run). With a hostfile, the ranks on this machine do
    (a lab's hosts are namespaces of it: the fork joins the stand-in's), and those on other
    machines, which find no factory's socket there, start cold. Elastic jobs' too: a killed
    rank's survivors learn of it through their broken connections, and its stand-in follows
    it as soon as the factory reaps it (the runtime's notice, which comes a moment later, is
    of a process they have left behind)."""
    return bool(launcher.warm_start and launcher.nprocs > 1)


@contextlib.contextmanager
def factory_for_sweep(launchers: list[Any]) -> Iterator[None]:
    """One factory for every job of a ``-m`` sweep whose ranks start warm (``launchers``:
    the jobs' launcher configs), where two or more do: each saves the factory's loading.
    If it fails to load, its ranks start cold and the first line of its log is printed."""
    warm = [launcher for launcher in launchers
            if launcher.name == "local" and starts_warm(launcher)]
    if len(warm) < 2 or SHARED_FACTORY in os.environ:
        yield
        return
    import tempfile

    handle, log = tempfile.mkstemp(prefix="adpsgd-sweep-rank-factory-", suffix=".log")
    os.close(handle)
    log_path = Path(log)
    try:
        with shared_rank_factory(log_path):
            yield
    finally:
        said = log_path.read_text(errors="replace").splitlines()
        log_path.unlink(missing_ok=True)
        if said:
            print(f"adpsgd-run: note: the sweep's ranks started cold: {said[0]}",
                  file=sys.stderr, flush=True)


@contextlib.contextmanager
def factory_for_job(run_dir: Path, env: dict[str, str], warm: bool) -> Iterator[dict[str, str]]:
    """The environment entries that send a job's ranks to a factory, for as long as the job
    runs: none if ``warm`` is false, the shared factory's address where the launcher was
    given one (:func:`shared_rank_factory`), else those of the job's own factory."""
    shared = os.environ.get(SHARED_FACTORY)
    if not warm:
        yield {}
    elif shared:
        yield {FACTORY_ADDRESS: shared}
    else:
        with contextlib.ExitStack() as stack:
            try:
                factory = stack.enter_context(
                    rank_factory(str(run_dir), run_dir / "logs" / "warm-start.log", env))
            except OSError as ex:  # no room for its socket file (a full /tmp), say
                print(f"adpsgd-run: note: the ranks start cold (each loads torch): no rank "
                      f"factory: {ex}", file=sys.stderr, flush=True)
                factory = None
            yield {FACTORY_ADDRESS: factory.address} if factory else {}


@contextlib.contextmanager
def shared_rank_factory(log_path: Path) -> Iterator[int]:
    """A factory for every job that this process and its children launch locally: sets
    ``ADPSGD_SHARED_RANK_FACTORY`` in ``os.environ`` for the block and yields the factory's
    pid. Its stderr (a failure to load, which starts every rank cold): ``log_path``."""
    with rank_factory("shared", log_path, dict(os.environ)) as factory:
        os.environ[SHARED_FACTORY] = factory.address
        try:
            yield factory.pid
        finally:
            os.environ.pop(SHARED_FACTORY, None)


@dataclass
class RunningFactory:
    address: str  # of its socket, for the ranks' FACTORY_ADDRESS
    pid: int


@contextlib.contextmanager
def rank_factory(serving: str, log_path: Path, env: dict[str, str]) -> Iterator[RunningFactory]:
    """Start a factory (``serving``: the run dir it serves, for its messages; ``env``: the
    ranks', so that what torch reads as it loads, OMP_NUM_THREADS among it, is what they
    would read). It ends with this block, or on its own if its starter dies (its stdin
    closes). Its stderr: ``log_path`` (a job's: logs/warm-start.log)."""
    import shutil
    import tempfile

    # A socket file, not an abstract socket: those are reachable only from their network
    # namespace, and a lab's hosts (scripts/lab_cluster.sh) are namespaces of their own on
    # this machine. Its folder is our user's alone; ranks on other machines find no file.
    # A socket's path holds at most 107 bytes: a long TMPDIR gives way to /tmp.
    folder = tempfile.mkdtemp(prefix="adpsgd-rank-factory-",
                              dir="/tmp" if len(tempfile.gettempdir()) > 60 else None)
    address = os.path.join(folder, "socket")
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(address)
    listening.listen(4096)  # every stand-in may queue while torch loads
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as factory_log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner.worker", serving, SERVE],
            env={**env, _LISTENING_FD: str(listening.fileno())}, pass_fds=[listening.fileno()],
            stdin=subprocess.PIPE, stdout=factory_log, stderr=factory_log,
            start_new_session=True)  # a Ctrl-C at the terminal is the launcher's to pass on
    # Only the factory holds the socket now: if it dies, waiting stand-ins see it at once.
    listening.close()
    try:
        yield RunningFactory(address, proc.pid)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # its cue to reap the forked ranks and leave
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)  # the factory's own leaving removed it


# --- the factory ------------------------------------------------------------------------

def serve(run_dir: str, load: Callable[[], None]) -> None:
    """The factory: ``load`` what a rank trains with, then fork a rank for each stand-in that
    asks, until the launcher closes our stdin. Returns only in a forked rank, set up as its
    stand-in was."""
    listening = socket.socket(fileno=int(os.environ.pop(_LISTENING_FD)))
    try:
        load()
        if "mpi4py.MPI" in sys.modules:  # forked ranks would share one MPI process
            raise RuntimeError("loading the trainer initialized MPI")
        if sys.modules["torch"].cuda.is_initialized():  # CUDA does not survive a fork
            raise RuntimeError("loading the trainer initialized CUDA")
    except Exception as ex:  # noqa: BLE001 - the stand-ins start cold; the log says why
        print(f"rank factory for {run_dir}: not serving: {type(ex).__name__}: {ex}",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    events = selectors.DefaultSelector()
    events.register(listening, selectors.EVENT_READ)
    events.register(sys.stdin, selectors.EVENT_READ)
    ranks: list[_Forked] = []
    while True:
        for key, _ in events.select():
            if key.fileobj is sys.stdin:  # closed: every rank has ended, or the launcher died
                _leave(ranks, listening.getsockname())
            elif key.fileobj is listening:
                conn, _ = listening.accept()
                pid = _fork_rank(conn, lambda: _forget_the_factory(events, listening, ranks))
                if pid == 0:  # the rank, in the stand-in's place from now on
                    return
                if pid is not None:
                    rank = _Forked(pid, os.pidfd_open(pid), conn)
                    ranks.append(rank)
                    events.register(rank.pidfd, selectors.EVENT_READ, rank)
                    events.register(conn, selectors.EVENT_READ, rank)
            elif key.fd == key.data.pidfd:
                rank = key.data
                ranks.remove(rank)
                _, status = os.waitpid(rank.pid, 0)
                _answer(rank.stand_in, {"status": status})
                rank.close(events)
            elif key.data in ranks:  # the stand-in sends nothing after its request: gone
                # (A rank reaped above in this same batch closed its stand-in's socket too:
                # unwatching that again killed the suite's shared factory once.)
                events.unregister(key.fileobj)
                # Its rank may be stopped (SIGSTOP), where its own watch cannot run.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(key.data.pid, signal.SIGKILL)


@dataclass
class _Forked:
    """A rank the factory forked: its pid, pidfd, and the connection from its stand-in."""
    pid: int
    pidfd: int
    stand_in: socket.socket

    def close(self, events: selectors.BaseSelector | None) -> None:
        """Close its descriptors, unwatched first by ``events`` (None in a forked rank: the
        epoll instance is the factory's too, and unwatching there would unwatch here)."""
        for fileobj in (self.pidfd, self.stand_in) if events else ():
            with contextlib.suppress(KeyError):
                events.unregister(fileobj)
        os.close(self.pidfd)
        self.stand_in.close()


def _leave(ranks: list[_Forked], address: str) -> None:
    """Reap the forked ranks that ended (their CPU time then counts as the launcher's
    children's), remove our socket file (a launcher killed with -9 cannot) and exit; a rank
    still running belongs to a launcher that died, and goes on alone, tied to its stand-in."""
    with contextlib.suppress(OSError):
        os.unlink(address)
        os.rmdir(os.path.dirname(address))
    for rank in ranks:
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(rank.pid, os.WNOHANG)
            if done:
                _answer(rank.stand_in, {"status": status})
    sys.stderr.flush()
    os._exit(0)  # torch's own shutdown takes a second and frees nothing the OS would not


def _answer(conn: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # a stand-in killed meanwhile hears nothing
        conn.sendall(json.dumps(message).encode() + b"\n")


def _fork_rank(conn: socket.socket, forget_the_factory: Callable[[], None]) -> int | None:
    """Fork the rank a stand-in asks for: its pid here, 0 in the rank, None if there is none
    (the stand-in gave up waiting, or the fork failed and it starts cold).
    ``forget_the_factory`` closes, in the rank, what the factory holds."""
    try:
        # The socket is abstract (no file permissions): only our own user's ranks are ours.
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
        if uid != os.getuid():
            raise PermissionError(f"a request from uid {uid}")
        _answer(conn, {"hello": os.getpid()})
        request, fds = _receive_request(conn)
    except (OSError, ValueError):
        conn.close()
        return None
    namespaces: list[tuple[str, int]] = []
    try:
        _check_imports_alike(request)
        fds, namespaces = _split_namespaces(request, fds)
        joined = _namespaces_to_join(namespaces)
        pid = os.fork()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as ex:  # or a bad request
        for fd in fds + [fd for _, fd in namespaces]:
            os.close(fd)
        _answer(conn, {"cold": str(ex)})
        conn.close()
        return None
    if pid == 0:
        try:
            forget_the_factory()  # first: its descriptors' numbers may be the rank's
            _join_namespaces(joined, namespaces)
            _take_over(request, fds, conn)
        except BaseException:  # noqa: BLE001 - nothing of the factory's may run on in the rank
            import traceback

            traceback.print_exc()
            os._exit(1)
        return 0
    # The rank's now: held here too, mpiexec's pipes would never close.
    for fd in fds + [fd for _, fd in namespaces]:
        os.close(fd)
    _answer(conn, {"forked": pid})
    return pid


# The namespaces a stand-in may run in apart from the factory (a lab host: `ip netns exec`
# gives it a network and mounts of its own, lab_cluster.sh a hostname), and setns's flags.
NAMESPACES = {"net": 0x40000000, "uts": 0x04000000, "mnt": 0x00020000}


def _split_namespaces(request: dict, fds: list[int]) -> tuple[list[int], list[tuple[str, int]]]:
    """The stand-in's descriptors for the rank to take over, and its namespaces (the last
    ones it sent, by kind)."""
    kinds = request.get("namespaces", [])
    if len(request["fds"]) + len(kinds) != len(fds) or not set(kinds) <= set(NAMESPACES):
        raise ValueError("the descriptors sent do not match the request")
    return fds[:len(request["fds"])], list(zip(kinds, fds[len(request["fds"]):]))


# Joining a namespace takes CAP_SYS_ADMIN, a mount namespace CAP_SYS_CHROOT as well.
_JOINING_CAPABILITIES = (1 << 21) | (1 << 18)


def _namespaces_to_join(namespaces: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The stand-in's namespaces that are not the factory's, which its fork joins; where the
    factory may not join them (not root, or root in a container without the capabilities)
    the rank starts cold."""
    joined = [(kind, fd) for kind, fd in namespaces
              if os.fstat(fd).st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino]
    if joined:
        status = Path("/proc/self/status").read_text()
        effective = int(status.split("CapEff:")[1].split()[0], 16)
        if effective & _JOINING_CAPABILITIES != _JOINING_CAPABILITIES:
            raise PermissionError(f"the rank runs in another {joined[0][0]} namespace, and "
                                  "joining it needs root's CAP_SYS_ADMIN")
    return joined


def _join_namespaces(joined: list[tuple[str, int]], namespaces: list[tuple[str, int]]
                     ) -> None:
    """In the fork: enter the stand-in's namespaces that differ from the factory's
    (``joined``), then close the descriptors of all it sent (``namespaces``)."""
    if joined:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        for kind, fd in joined:
            if libc.setns(fd, NAMESPACES[kind]) != 0:
                raise OSError(ctypes.get_errno(), f"setns into the stand-in's {kind} namespace")
    for _, fd in namespaces:
        os.close(fd)


_LOADED_WITH = (sys.executable, os.environ.get("PYTHONPATH", ""),
                os.environ.get("LD_PRELOAD", ""))


def _check_imports_alike(request: dict) -> None:
    """A rank whose Python or PYTHONPATH differs from the factory's (another virtual
    environment, a copy of the source tree) would import other code, and one with another
    LD_PRELOAD would load another library before any (a fork has the factory's): it starts
    cold."""
    asked = (request.get("executable"), request["env"].get("PYTHONPATH", ""),
             request["env"].get("LD_PRELOAD", ""))
    if asked != _LOADED_WITH:
        raise ValueError(f"the rank loads from {asked}, the factory loaded from "
                         f"{_LOADED_WITH}")


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(10)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 256)
    try:
        if len(data) < _HEADER.size:
            raise ValueError("no request")
        (size,) = _HEADER.unpack_from(data)
        data = data[_HEADER.size:]
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise ValueError("a cut request")
            data += chunk
    except (OSError, ValueError):
        for fd in fds:  # passed with a request that never came whole
            os.close(fd)
        raise
    conn.settimeout(None)
    return json.loads(data), fds


def _forget_the_factory(events: selectors.BaseSelector, listening: socket.socket,
                        ranks: list[_Forked]) -> None:
    """In a forked rank: close what the factory held (its socket, the other ranks' pidfds and
    stand-ins' connections), as a process mpiexec started would not have them."""
    for rank in ranks:
        rank.close(None)
    events.close()  # this process's copy of the epoll descriptor; the factory keeps its own
    listening.close()


def _take_over(request: dict, fds: list[int], conn: socket.socket) -> None:
    """In the forked rank: become the stand-in's process (its descriptors at their numbers,
    environment, directory, arguments, the cores it may run on), with signals held until the
    rank's handlers are in."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    global _stand_in, _factory
    _factory = os.getppid()
    _stand_in = socket.socket(fileno=_dup_high(conn.fileno()))
    conn.close()
    high = [_dup_high(fd) for fd in fds]  # out of the way of the numbers they go to
    for fd in fds:
        os.close(fd)
    for target in range(3):  # the factory's stdin, log: a rank started without them has none
        if target not in request["fds"]:
            with contextlib.suppress(OSError):
                os.close(target)
    for target, fd in zip(request["fds"], high):
        os.dup2(fd, target)  # inheritable, as they were in the stand-in
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    if sys.path and sys.path[0] == os.getcwd():  # python -m's entry: the directory it ran in
        sys.path[0] = request["cwd"]
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.sched_setaffinity(0, request["cpus"])  # where mpiexec bound the rank (--bind-to core)
    # The rank stays in the factory's session, though MPICH's mpiexec gives a cold rank one
    # of its own: where the kernel shares the CPU between sessions first (autogroup), a
    # waiting rank that yields its core (MPI's poll on oversubscribed cores) hands it only to
    # processes of its own session. Alone in one, it spun on while its job's other ranks
    # waited for the core: 4 ranks on 2 cores took 22 % longer and 26 % more CPU (2026-12-05).
    sys.argv = request["argv"]
    threading.Thread(target=_die_with_stand_in, args=(_stand_in,), name="stand-in",
                     daemon=True).start()


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1000)


def _die_with_stand_in(line: socket.socket) -> None:
    """mpiexec ends a job by killing the processes it started, which are the stand-ins."""
    with contextlib.suppress(OSError):
        while line.recv(64):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


_stand_in: socket.socket | None = None  # in a forked rank: the line to its stand-in
_factory = 0  # in a forked rank: the factory's pid
_told = False


def use_environment_threads() -> None:
    """Size torch's intra-op thread pool from this process's ``OMP_NUM_THREADS``: torch reads
    it as it loads, which a forked rank did in the factory, under the factory's environment."""
    threads = os.environ.get("OMP_NUM_THREADS")
    torch = sys.modules.get("torch")
    if threads and torch is not None:
        torch.set_num_threads(int(threads))


def started_as() -> str:
    """How this rank's process started, for its log."""
    return f"forked from the rank factory (pid {_factory})" if _stand_in else "cold"


def ready() -> None:
    """In a forked rank whose stop handlers are in: tell the stand-in where to send signals
    and let the held ones through. Nothing in a rank that started cold, or the second time."""
    global _told
    if _stand_in is None or _told:
        return
    _told = True
    _answer(_stand_in, {"pid": os.getpid()})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)


# --- the stand-in -----------------------------------------------------------------------

def hand_off() -> None:
    """Have the factory named in the environment fork this rank, pass signals on to it and
    exit as it ends; return at once where there is no factory or it cannot serve us."""
    address = os.environ.pop(FACTORY_ADDRESS, None)
    if not address:
        return
    pending: list[int] = []
    rank_pid: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        if rank_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank_pid[0], signum)
        else:
            pending.append(signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in FORWARDED}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    answers = conn.makefile("rb")
    forked, message = None, {}
    try:
        conn.connect(address)
        conn.settimeout(ANSWER_TIMEOUT_S)  # a factory still loading, or stuck
        if "hello" in _read(answers):
            conn.settimeout(None)  # from the request on, the factory may fork us any time
            _send_request(conn)
            # The factory says "forked", the rank "pid" once its handlers are in (either may
            # come first), the factory "status" as it ends; "cold" or nothing: no fork.
            while (message := _read(answers)) and "status" not in message and \
                    "cold" not in message:
                forked = message.get("forked", message.get("pid", forked))
                if "pid" in message:
                    rank_pid.append(message["pid"])
                    for signum in pending:
                        pass_on(signum, None)
    except (OSError, ValueError):  # no factory here (another machine), or a failed one
        pass
    if forked is None:  # nobody forked this rank: it starts here
        conn.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in pending:
            signal.raise_signal(signum)
        return
    _end_as(message.get("status"), forked)


def _read(answers: BinaryIO) -> dict:
    line = answers.readline()
    return json.loads(line) if line else {}


def _send_request(conn: socket.socket) -> None:
    fds = sorted(fd for fd in map(int, os.listdir("/proc/self/fd"))
                 if fd != conn.fileno() and _inherited(fd))
    # Where this process runs (a lab host's network, name and mounts): the rank goes there.
    namespaces = [os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                  for kind in NAMESPACES]
    umask = os.umask(0)
    os.umask(umask)
    body = json.dumps({"argv": sys.argv, "executable": sys.executable,
                       "env": dict(os.environ), "cwd": os.getcwd(),
                       "umask": umask, "fds": fds, "namespaces": list(NAMESPACES),
                       "cpus": sorted(os.sched_getaffinity(0))}).encode()
    message = _HEADER.pack(len(body)) + body
    try:
        sent = socket.send_fds(conn, [message], fds + namespaces)
    finally:
        for fd in namespaces:
            os.close(fd)
    conn.sendall(message[sent:])


def _inherited(fd: int) -> bool:
    """A descriptor mpiexec gave this process (Python opens its own close-on-exec); not the
    directory listing's own, closed by now."""
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False


def _end_as(status: int | None, rank: int) -> None:
    """Exit as the rank did. ``status``: waitpid's; None if the factory died first, when
    all there is to do is wait for the rank to end (it says how in its own records)."""
    if status is None:
        with contextlib.suppress(OSError):
            select.select([os.pidfd_open(rank)], [], [])
        os._exit(1)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: so are we, for mpiexec to see and report it
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)
