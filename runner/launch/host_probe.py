"""Which hosts of the hostfile answer (launcher.respawn across hosts).

In an elastic job across hosts with launcher.respawn, this thread asks every host of the
hostfile, through the command that enters the hosts (``launcher.remote_shell``, as mpiexec
does), to run ``true``, in a round every ASK_EVERY_S. The launcher's answers to the
heartbeats name the hosts that answered the last round (watchdog.py's HeartbeatListener),
and a replacement is spawned only on one of them or on a host where the job's learners are
heard (runner/elastic/respawn.py): starting a process on a host that cannot be reached
would block the learners inside ``MPI_Comm_spawn``. The host of learners taken for lost
because they fell silent (a cut link, a host gone down or hung) is left out at once, in the
very answer that names the loss, until a round asked after it says it answers again; that
is an event in logs/events.jsonl (as is any host answering again after a silent round), and
replacements that waited for room may start then.

It tells a host that answers, not an MPI daemon that works: on a host whose processes are
stopped but whose shell answers (SIGSTOP), the spawn waits for the daemon, and the
launcher's stall time-out (launcher.stall_timeout_s) ends the job.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ..runlog.failure_events import record_event
from .hosts import host_problem
from .watchdog import HeartbeatListener

ASK_EVERY_S = 2.0  # from the start of a round of questions to the next
ANSWER_WITHIN_S = 3.0  # a host that takes longer has not answered (this round)


class HostProbe:
    """A daemon thread that asks ``hosts`` in rounds, and tells ``listener`` which answer."""

    def __init__(self, listener: HeartbeatListener, shell: str, hosts: list[str],
                 run_dir: Path) -> None:
        self.listener, self.shell, self.hosts, self.run_dir = listener, shell, hosts, run_dir
        self._stopped = threading.Event()
        threading.Thread(target=self._rounds, name="host-probe", daemon=True).start()

    def _rounds(self) -> None:
        while not self._stopped.is_set():
            asked_at = time.monotonic()
            problems = self._ask_every_host()
            back = self.listener.set_answering(
                {host for host, problem in problems.items() if problem is None},
                set(self.hosts), asked_at)
            for host in sorted(back):
                record_event(self.run_dir, {
                    "time": round(time.time(), 3), "event": "host answers", "host": host,
                    "cause": f"{host} runs a command again: a replacement learner may go "
                             "there"})
            self._stopped.wait(max(0.0, asked_at + ASK_EVERY_S - time.monotonic()))

    def _ask_every_host(self) -> dict[str, str | None]:
        """Host -> why it does not answer (None: it does), the hosts asked at once."""
        problems: dict[str, str | None] = {}

        def ask(host: str) -> None:
            problems[host] = host_problem(self.shell, host, ANSWER_WITHIN_S)

        askers = [threading.Thread(target=ask, args=(host,), daemon=True) for host in self.hosts]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(ANSWER_WITHIN_S + 1)
        return problems

    def stop(self) -> None:
        self._stopped.set()
