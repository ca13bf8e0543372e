"""The launcher's watchdog (runner/launch/watchdog.py) orders the deaths it sees, mpiexec's
with the ranks', on real processes: which ended first decides the line a user reads ("mpiexec
was killed from outside" or "rank N died"), and a loaded machine once made the launcher's own
clock name a rank for a kill of mpiexec."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from runner import ctrl_c
from runner.checkpoint.preemption import install_stop_handlers, request_stop, stop_reason
from runner.launch.loss_detector import Sensitivity
from runner.launch.stop_forwarding import ForcedStop, StopForwarding
from runner.launch.watchdog import (
    MPIEXEC_END_SLACK_S,
    ExitPoller,
    HeartbeatListener,
    RankWatchdog,
    clear_rank_files,
    empty_blank_exit_records,
    exit_record,
    ranks_progress,
)
from runner.runlog.failure_events import record_event
from runner.runlog.liveness import (
    HEARTBEAT_S,
    HEARTBEAT_TO,
    LINK_TIMEOUT,
    NETWORK_HEARTBEAT_S,
    LauncherLink,
    datagram_sender,
    process_alive,
    rank_file,
    start_heartbeat,
    stop_requests,
    write_exit_record,
    write_pid_file,
)

pytestmark = pytest.mark.slow


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def seen(condition, what: str):
    deadline = time.monotonic() + 10
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert value, f"the watchdog never saw {what}"
    return value


@pytest.fixture
def job(tmp_path):
    """A stand-in mpiexec and one rank (real processes with a pid file), and the watchdog."""
    mpiexec, rank = sleeper(), sleeper()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.pid").write_text(f"{rank.pid} {socket.gethostname()}\n")
    watchdog = RankWatchdog(tmp_path, 1)
    watchdog.watch_mpiexec(mpiexec.pid)
    # Two wake-ups after it read the pid file, the thread watches the rank and mpiexec.
    seen(lambda: 0 in watchdog.pids, "the pid file")
    start = watchdog.wakeups
    seen(lambda: watchdog.wakeups >= start + 2, "two wake-ups")
    yield watchdog, mpiexec, rank
    for proc in (mpiexec, rank):
        proc.kill()
        proc.wait()
    watchdog.stop()


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def first_death(watchdog: RankWatchdog):
    return seen(watchdog.check, "the rank die")


def test_mpiexec_killed_before_its_rank_is_seen_first(job):
    watchdog, mpiexec, rank = job
    kill(mpiexec)
    seen(lambda: watchdog.mpiexec_wakeup is not None, "mpiexec end")
    kill(rank)
    assert watchdog.mpiexec_ended_first(first_death(watchdog)) is True


def test_a_rank_killed_before_mpiexec_is_seen_first(job):
    watchdog, mpiexec, rank = job
    kill(rank)
    dead = first_death(watchdog)
    time.sleep(MPIEXEC_END_SLACK_S + 0.1)
    kill(mpiexec)
    seen(lambda: watchdog.mpiexec_wakeup is not None, "mpiexec end")
    assert watchdog.mpiexec_ended_first(dead) is False


def test_a_rank_seen_dead_just_before_mpiexec_ends_went_down_with_it(job):
    """A killed mpiexec's proxies take its ranks down as its sockets close, which comes before
    the kernel reports its own end: a rank seen dead less than MPIEXEC_END_SLACK_S before
    mpiexec's end, in an earlier wake-up, counts as taken down with it."""
    watchdog, mpiexec, rank = job
    kill(rank)
    dead = first_death(watchdog)
    kill(mpiexec)
    seen(lambda: watchdog.mpiexec_wakeup is not None, "mpiexec end")
    assert dead.wakeup < watchdog.mpiexec_wakeup  # seen in that order
    gap = watchdog.mpiexec_ended_at - dead.when  # well under the slack unless very loaded
    assert watchdog.mpiexec_ended_first(dead) is (gap < MPIEXEC_END_SLACK_S), gap


def test_without_mpiexec_seen_ending_the_order_is_unknown(job):
    watchdog, _, rank = job
    kill(rank)  # mpiexec still runs
    assert watchdog.mpiexec_ended_first(first_death(watchdog)) is None


def test_processes_that_end_between_two_waits_are_returned_in_the_order_they_ended():
    """Registered in rank order and killed in the reverse one before the watcher looks (a
    teardown on a busy machine): the first to end comes first, not the first registered."""
    sleepers = [sleeper() for _ in range(4)]
    poller = ExitPoller()
    fds = {os.pidfd_open(proc.pid): rank for rank, proc in enumerate(sleepers)}
    for fd in fds:
        poller.register(fd)
    try:
        for proc in reversed(sleepers):
            kill(proc)  # reaped: the next one ends strictly after it
        assert [fds[fd] for fd in poller.ended(1.0)] == [3, 2, 1, 0]
    finally:
        poller.close()
        for fd in fds:
            os.close(fd)


def test_the_launcher_answers_heartbeats_with_the_lost_and_its_silence_cuts_a_rank_off():
    """An elastic job across hosts: a rank hears the learners the launcher declares lost, once
    each, and takes itself for cut off when the launcher falls silent."""
    listener = HeartbeatListener(answer=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    lost, cut_off, gone = [], [], []
    timeout_s = 2.5 * HEARTBEAT_S  # the least launcher.link_timeout_s
    LauncherLink(sock, listener.target, datagram_sender(listener.target, b"0 100 lab1", sock),
                 timeout_s, lost.append, cut_off.append, lambda: gone.append(True))
    try:
        seen(lambda: listener.last(0), "the rank's heartbeat")
        listener.declare_lost([2, 3])
        seen(lambda: lost, "the lost learners reach the rank")
        listener.declare_lost([3, 5])
        seen(lambda: len(lost) == 2, "a further loss reach the rank")
        time.sleep(1.5 * HEARTBEAT_S)  # answers go on, naming them all; each is heard once
        assert lost == [[2, 3], [5]] and not cut_off
        listener.answer = False  # as behind a cut link: heard nothing, and nothing refused
        silent_s = seen(lambda: cut_off, "the rank take itself for cut off")[0]
        assert timeout_s <= silent_s < timeout_s + HEARTBEAT_S, silent_s
        assert not gone
    finally:
        listener.close()


def test_the_launchers_answers_name_the_hosts_that_answer_less_those_of_lost_learners():
    """launcher.respawn across hosts: the rank learns which hosts answered the launcher's
    last round (where a replacement may go); a lost learner's host drops out with the loss
    and comes back only with a round asked after it; a host silent for a round and answering
    the next is reported back."""
    listener = HeartbeatListener(answer=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link = LauncherLink(sock, listener.target,
                        datagram_sender(listener.target, b"0 100 lab1", sock), 60,
                        lambda lost: None, print, lambda: None)
    everyone = {"lab1", "lab2", "lab3"}
    try:
        asked = time.monotonic()
        assert listener.set_answering({"lab1", "lab2"}, everyone, asked) == set()
        seen(lambda: link.answering == {"lab1", "lab2"}, "the answering hosts")
        listener.set_away({"lab2"})  # its learners taken for lost
        seen(lambda: link.answering == {"lab1"}, "lab2 left out with the loss")
        assert listener.set_answering(everyone, everyone, asked) == {"lab3"}  # an older round
        seen(lambda: link.answering == {"lab1", "lab3"}, "lab3 back, lab2 still out")
        assert listener.set_answering(everyone, everyone, time.monotonic()) == {"lab2"}
        seen(lambda: link.answering == everyone, "lab2 back with a later round")
    finally:
        listener.close()


def test_a_rank_hears_that_the_launcher_is_gone_from_its_host():
    """The launcher died (its port closed): its host refuses the heartbeats, which the rank
    hears at once, apart from a silence (then it checkpoints and stops)."""
    listener = HeartbeatListener(answer=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cut_off, gone = [], []
    LauncherLink(sock, listener.target, datagram_sender(listener.target, b"0 100 lab1", sock),
                 60, print, cut_off.append, lambda: gone.append(True))
    seen(lambda: listener.last(0), "the rank's heartbeat")
    listener.close()
    seen(lambda: gone, "the launcher gone")  # within seconds: its link's time-out is 60 s
    assert not cut_off


def test_a_rank_says_it_trains_once_its_start_up_is_over_and_beats_as_often_as_asked(
        tmp_path, monkeypatch):
    """An elastic job across hosts: the rank's network heartbeats come every
    launcher.heartbeat_s, and say "training" only once its first step is taken (its trainer
    exists before that, with samples to report, in a start-up no loss is survived in)."""
    listener = HeartbeatListener(answer=True)
    for name, value in ((HEARTBEAT_TO, listener.target), (LINK_TIMEOUT, "30"),
                        (NETWORK_HEARTBEAT_S, "0.05")):
        monkeypatch.setenv(name, value)
    write_pid_file(tmp_path, 7)
    stepped: list[bool] = []
    try:
        start_heartbeat(tmp_path, 7, progress=lambda: 0, training=lambda: bool(stepped),
                        on_lost=print, on_cut_off=print, on_launcher_gone=lambda: None)
        seen(lambda: listener.last(7), "the rank's heartbeat")
        time.sleep(0.3)
        assert 7 not in listener.training()
        stepped.append(True)
        seen(lambda: 7 in listener.training(), "the rank say it trains")
        time.sleep(0.5)  # about 10 beats, learned from its first "training" one on
        gaps = list(listener.detector._gaps[7])
        assert 5 <= len(gaps) <= 12 and max(gaps) < 0.5, gaps
    finally:
        listener.close()


def started_ranks(run_dir, hosts: list[str]) -> None:
    """Rank i's pid file and blank exit record as a rank writes them when it starts
    (write_pid_file), its pid file then saying pid 100 + i on ``hosts[i]``."""
    for rank, host in enumerate(hosts):
        write_pid_file(run_dir, rank)
        rank_file(run_dir, rank, "pid").write_text(f"{100 + rank} {host}\n")


def heartbeat_sender(listener: HeartbeatListener, hosts: list[str]):
    """A function that sends ``listener`` rank i's heartbeat from ``hosts[i]``, with what
    ``state`` says (" training" once past its start-up)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host, port = listener.target.rsplit(":", 1)

    def beat(rank: int, state: str = "") -> None:
        sock.sendto(f"{rank} {100 + rank} {hosts[rank]}{state}".encode(), (host, int(port)))

    return beat


def test_only_training_ranks_on_other_hosts_silent_past_their_threshold_are_newly_silent(
        tmp_path):
    """Learners 0-3 and a spare, 4. Nobody is taken for lost before every learner has taken
    a step (the job's start-up); then those silent past their threshold are, but not one that
    ended as asked, nor the spare still starting up."""
    hosts = ["lab1", "lab1", "lab1", "lab2", "lab2"]
    started_ranks(tmp_path, hosts)
    listener = HeartbeatListener(answer=True, sensitivity=Sensitivity(
        loss_after_s=0.2, loss_spread=8, link_timeout_s=60))
    watchdog = RankWatchdog(tmp_path, 5, listener)
    beat = heartbeat_sender(listener, hosts)
    try:
        # learner 1 not heard yet (still starting); the spare, 4, still starts up
        for rank, state in ((0, " training"), (2, " training"), (3, " training"), (4, "")):
            beat(rank, state)
        seen(lambda: all(listener.last(rank) for rank in (0, 2, 3, 4)), "the heartbeats")
        time.sleep(0.3)
        assert watchdog.newly_silent(4) == {}  # silent, but learner 1 has not stepped yet
        beat(1, " training")
        seen(lambda: 1 in listener.training(), "learner 1 training")
        write_exit_record(tmp_path, 0, 0)  # ended as asked: silent, not lost
        write_exit_record(tmp_path, 3, 3)  # a rank cut off says so where the run dir is shared
        silent = watchdog.newly_silent(4)
        assert sorted(silent) == [2, 3] and all(0.2 < s < 5 for s in silent.values()), silent
        listener.declare_lost([2, 3])
        assert watchdog.newly_silent(4) == {}  # declared once
        assert watchdog.lost() == {2, 3}
        # 1 killed: the survivors saw it (MPI) and recorded it, long enough ago that the calm
        # it began is over; silent since, it is never named to them again
        record_event(tmp_path, {"time": time.time() - 120, "event": "lost", "learner": 1})
        assert watchdog.newly_silent(4) == {}  # read first
        time.sleep(0.3)
        assert 1 in listener.suspected() and watchdog.newly_silent(4) == {}
    finally:
        watchdog.stop()
        listener.close()


def test_a_join_the_learners_recorded_calms_the_detector_from_when_it_was_recorded(tmp_path):
    """Learner 1 on lab1 falls silent past its threshold just after spares joined (recorded
    in logs/events.jsonl): it is waited for the ceiling, link_timeout_s from the join's
    record, not taken for lost; silent as long after a join recorded long ago, it is."""
    started_ranks(tmp_path, ["lab1", "lab1"])
    listener = HeartbeatListener(answer=True, sensitivity=Sensitivity(
        loss_after_s=0.2, loss_spread=8, link_timeout_s=2))
    watchdog = RankWatchdog(tmp_path, 2, listener)
    beat = heartbeat_sender(listener, ["lab1", "lab1"])
    try:
        for _ in range(4):
            for rank in range(2):
                beat(rank, " training")
            time.sleep(0.05)
        seen(lambda: listener.training() == {0, 1}, "the heartbeats")
        record_event(tmp_path, {"time": time.time() - 60, "event": "joined", "learner": 4})
        record_event(tmp_path, {"time": time.time(), "event": "joined", "learner": 5})
        time.sleep(0.4)  # past the 0.2 s floor
        assert watchdog.newly_silent(2) == {}  # the joins are read: the calm begins
        assert watchdog.newly_silent(2) == {}  # waited for the ceiling, 2 s from the join
        time.sleep(2.0)
        assert sorted(watchdog.newly_silent(2)) == [0, 1]
        record_event(tmp_path, {"time": time.time() - 60, "event": "joined", "learner": 6})
        assert watchdog.newly_silent(2) == {}  # read first
        assert sorted(watchdog.newly_silent(2)) == [0, 1]  # long ago: no calm
    finally:
        watchdog.stop()
        listener.close()


def test_heartbeats_the_launcher_has_not_read_yet_are_not_taken_for_silence():
    """The launcher held up (its heartbeat thread kept from running) while a learner's
    heartbeats arrive: they wait in the socket, and the launcher reads them before it judges
    the learner's silence, so its own delay is not taken for a loss."""
    listener = HeartbeatListener(sensitivity=Sensitivity(loss_after_s=0.5, link_timeout_s=60))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host, port = listener.target.rsplit(":", 1)

    def beat() -> None:
        sock.sendto(b"2 102 lab2 training", (host, int(port)))

    try:
        for _ in range(5):
            beat()
            time.sleep(0.05)
        seen(lambda: 2 in listener.training(), "the heartbeats")
        with listener._lock:  # hold the heartbeat thread: it reads one beat and waits
            beat()
            time.sleep(0.1)
            beat()  # stays in the socket
            time.sleep(1.0)  # past the 0.5 s floor since the last beat the launcher read
            judged = []
            judge = threading.Thread(target=lambda: judged.append(listener.suspected()))
            judge.start()
            time.sleep(0.1)
        judge.join(5)  # the launcher runs again: it reads both beats, then judges
        assert judged == [{}], judged
        time.sleep(0.8)
        assert 2 in listener.suspected()  # silent for real now
    finally:
        listener.close()


@pytest.fixture
def learners_on_two_hosts(tmp_path):
    """Learners 0-1 on lab1 and 2-3 on lab2 (other hosts than the launcher's), each heard
    once: (the watchdog, its listener, a heartbeat sender)."""
    hosts = ["lab1", "lab1", "lab2", "lab2"]
    started_ranks(tmp_path, hosts)
    listener = HeartbeatListener()
    watchdog = RankWatchdog(tmp_path, 4, listener)
    beat = heartbeat_sender(listener, hosts)
    try:
        for rank in range(4):
            beat(rank)
        seen(lambda: all(listener.last(rank) for rank in range(4)), "the heartbeats")
        yield watchdog, listener, beat
    finally:
        watchdog.stop()
        listener.close()


def test_mpiexec_is_not_waited_for_on_lost_learners_behind_a_cut_once_the_others_end(
        learners_on_two_hosts, tmp_path):
    """Ranks 0-3 on two other hosts; 2 and 3 fell silent behind a cut link and the job went
    on without them: once 0 and 1 have ended, they are what mpiexec still waits for."""
    watchdog, _, _ = learners_on_two_hosts
    time.sleep(0.3)  # all silent from here on
    assert watchdog.lost_behind(0.2) == []  # 0 and 1 still train
    record_event(tmp_path, {"event": "lost", "learner": 2, "host": "lab2"})
    write_exit_record(tmp_path, 0, 0)
    write_exit_record(tmp_path, 1, 0)
    assert watchdog.lost_behind(0.2) == []  # rank 3, never lost, may still end
    record_event(tmp_path, {"event": "lost", "learner": 3, "host": "lab2"})
    assert watchdog.lost_behind(0.2) == [2, 3]
    assert watchdog.lost_behind(60) == []  # not silent for that long
    write_exit_record(tmp_path, 3, 3)  # their exit records, where the file system is shared
    assert watchdog.lost_behind(0.2) == [2, 3]


def test_a_learner_lost_while_its_host_answered_and_that_ended_is_not_left_behind(
        learners_on_two_hosts, tmp_path):
    """Learner 1 on lab1, taken for lost while alive (a loaded host), stopped on hearing so
    (its exit record) while learner 0 on lab1 went on being heard: mpiexec saw it end, and
    only 2 and 3, behind the cut of lab2, are what it still waits for. Had 1 not ended, it
    would be."""
    watchdog, listener, beat = learners_on_two_hosts
    time.sleep(0.3)
    beat(0)  # lab1 heard on, 0.3 s after learner 1 fell silent
    seen(lambda: listener.last(0)[0] - listener.last(1)[0] >= 0.3, "learner 0 again")
    time.sleep(0.3)
    for rank in (1, 2, 3):
        record_event(tmp_path, {"event": "lost", "learner": rank})
    write_exit_record(tmp_path, 0, 0)
    assert watchdog.lost_behind(0.2) == [1, 2, 3]  # 1 may still run: mpiexec waits
    write_exit_record(tmp_path, 1, 3)
    write_exit_record(tmp_path, 3, 3)  # behind the cut, where the run dir is shared
    assert watchdog.lost_behind(0.2) == [2, 3]


def test_the_ranks_it_kills_have_exited_when_the_launcher_returns(tmp_path, capsys):
    """A SIGKILLed process still runs its exit: one that touched 1 GiB is alive for ~0.25 s
    after the signal here, longer on a loaded machine. The job returns only once its killed
    ranks are gone (a loaded run of test_dead_rank found one left); one that outlasts the
    wait is named."""
    touched_1gib = "import time; block = b'x' * (1 << 30); print(flush=True); time.sleep(120)"
    for exit_wait_s in (10.0, 0.0):
        run_dir = tmp_path / f"wait{exit_wait_s:g}"
        (run_dir / "logs").mkdir(parents=True)
        rank = subprocess.Popen([sys.executable, "-c", touched_1gib], stdout=subprocess.PIPE)
        rank.stdout.readline()
        (run_dir / "logs" / "rank0.pid").write_text(f"{rank.pid} {socket.gethostname()}\n")
        watchdog = RankWatchdog(run_dir, 1)
        try:
            assert watchdog.kill_leftovers(exit_wait_s) == [0]
            gone = not process_alive(rank.pid)
        finally:
            rank.kill()
            rank.wait()
            watchdog.stop()
        stderr = capsys.readouterr().err
        if exit_wait_s:
            assert gone and stderr == ""
        else:  # no wait: still exiting, and said so
            assert not gone
            assert stderr.startswith(f"adpsgd-run: rank 0 (pid {rank.pid}) was killed but has "
                                     "not exited after 0 s"), stderr


def test_a_ctrl_c_before_any_rank_can_take_it_reaches_the_ranks_through_the_run_dir(tmp_path):
    """A rank can go from its pid file to its first step faster than the launcher looks for
    pid files (a CI machine's rank trained 22 steps after a Ctrl-C at start-up): the launcher
    notes the signal in the run dir, and the rank takes the note as its stop, not as a press
    of its own, so that the forwarded Ctrl-C that follows is not a second one."""
    watchdog = RankWatchdog(tmp_path, 2)
    try:
        with StopForwarding(watchdog):
            signal.raise_signal(signal.SIGINT)  # no rank has a pid file yet
    finally:
        watchdog.stop()
    assert stop_requests(tmp_path) == [signal.SIGINT]
    restore = install_stop_handlers()  # what a rank does, then reads the note
    try:
        for signum in stop_requests(tmp_path):
            request_stop(signum)
        assert stop_reason() == "stopped"
        signal.raise_signal(signal.SIGINT)  # the launcher's forwarded Ctrl-C: still graceful
        with pytest.raises(KeyboardInterrupt):  # a second press: at once
            signal.raise_signal(signal.SIGINT)
    finally:
        restore()
    assert stop_reason() is None
    clear_rank_files(tmp_path, 2)  # the next job in this run dir starts without it
    assert stop_requests(tmp_path) == []
    note = tmp_path / "logs" / "stop.request"
    for damaged in (b"SIGINT\xff\n", b"SIGNIT\n"):  # a flipped byte: no stop, no traceback
        note.write_bytes(damaged)
        assert stop_requests(tmp_path) == []


def test_a_ctrl_c_whose_keyboardinterrupt_was_lost_is_taken_when_the_job_starts(
        tmp_path, capsys):
    """A CI run's Ctrl-C, pressed while adpsgd-run prepared the run, had no effect: its
    KeyboardInterrupt was cleared on the way up, and the run went on to its end. The press
    was noted: the launcher takes it as the first Ctrl-C once it takes the signals over, so
    the ranks stop before their first step, and a second press stops at once."""
    previous = signal.getsignal(signal.SIGINT)
    ctrl_c.install()
    watchdog = RankWatchdog(tmp_path, 2)
    try:
        try:  # library code that swallows every error
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        with StopForwarding(watchdog) as forwarding:
            assert forwarding.received == [signal.SIGINT]
            assert stop_requests(tmp_path) == [signal.SIGINT]
            with pytest.raises(ForcedStop):
                signal.raise_signal(signal.SIGINT)
        assert capsys.readouterr().err.count("adpsgd-run: Ctrl-C: every rank checkpoints") == 1
        # One the command acted on is not taken again by the next job (a sweep's).
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            ctrl_c.answered()
        with StopForwarding(watchdog) as forwarding:
            assert forwarding.received == []
    finally:
        watchdog.stop()
        signal.signal(signal.SIGINT, previous)


def test_a_record_no_rank_wrote_is_emptied_after_the_job_and_a_written_one_kept(tmp_path):
    for rank in (0, 1):
        write_pid_file(tmp_path, rank)
    blank = tmp_path / "logs" / "rank0.exit"
    assert blank.read_bytes().strip() == b"" and blank.stat().st_size > 0
    write_exit_record(tmp_path, 1, 2, "adpsgd: error: something. Fix: this", samples=640)
    empty_blank_exit_records(tmp_path, 3)  # rank 2 never started
    assert blank.read_bytes() == b"" and exit_record(tmp_path, 0) is None
    assert exit_record(tmp_path, 1) == {"status": 2, "samples": 640,
                                        "message": "adpsgd: error: something. Fix: this"}
    # How far the rank got as it ended counts as its progress, ahead of its heartbeats (none
    # here: a job that failed before the first one once recorded at_samples null).
    assert ranks_progress(tmp_path, 3) == [None, 640, None]
    assert not (tmp_path / "logs" / "rank2.exit").exists()


@pytest.mark.parametrize("elastic", [False, True])
def test_an_mpiexec_that_outlives_every_rank_is_stopped_and_the_job_ends_as_its_ranks_did(
        tmp_path, capsys, monkeypatch, elastic):
    """Open MPI's prterun once deadlocked after every rank of an elastic job had aborted
    (1 run in 8 on 2 loaded cores), and the launcher waited for it for ever. Here an mpiexec
    that never ends (a real process in its own session) outlives its 2 ranks, one of which
    failed with status 2: MPIEXEC_HANG_S after the last one ended it is killed with its
    session, one note says so, and the job's status is the failed rank's."""
    from types import SimpleNamespace

    from runner.launch import supervision

    monkeypatch.setattr(supervision, "MPIEXEC_HANG_S", 1.0)
    (tmp_path / "logs").mkdir()
    mpiexec = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               start_new_session=True)
    ranks = [sleeper() for _ in range(2)]
    for rank, proc in enumerate(ranks):
        write_pid_file(tmp_path, rank)  # its blank exit record; the pid is the rank's:
        (tmp_path / "logs" / f"rank{rank}.pid").write_text(f"{proc.pid} {socket.gethostname()}\n")
    watchdog = RankWatchdog(tmp_path, 2)
    cfg = SimpleNamespace(elastic=elastic, hostfile=None, stall_timeout_s=0.0, nprocs=2)
    try:
        seen(lambda: len(watchdog.pids) == 2, "the pid files")
        write_exit_record(tmp_path, 0, 0)
        write_exit_record(tmp_path, 1, 2)
        for proc in ranks:
            kill(proc)
        started = time.monotonic()
        with StopForwarding(watchdog) as forwarding:
            status = supervision.Supervision(cfg).supervise(mpiexec, watchdog, forwarding, 3.0)
        waited = time.monotonic() - started
    finally:
        for proc in (mpiexec, *ranks):
            proc.kill()
            proc.wait()
        watchdog.stop()
    assert status == 2 and mpiexec.returncode == -signal.SIGKILL
    assert 0.5 < waited < 10, waited
    assert capsys.readouterr().err.startswith(
        "adpsgd-run: note: every rank of the job had ended 1 s before and "), "no note"
