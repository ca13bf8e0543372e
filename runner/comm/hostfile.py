"""Hostfiles: the hosts of a job that spans machines (``launcher.hostfile``), and where its
ranks land on them.

A hostfile follows the MPI convention: one host per line, optionally with its slots, as
MPICH writes them (``node7:4``) or as Open MPI does (``node7 slots=4``); ``#`` starts a
comment. The launcher places ranks in the file's order:

* ``launcher.procs_per_node=K``: K consecutive ranks per host (mpiexec's ``-ppn K``), on as
  many hosts as the job needs; the hosts' slots do not matter;
* ``launcher.procs_per_node=null``: each host takes as many consecutive ranks as it has
  slots (1 when the file gives none), and the ranks of a host form one node (hadpsgd's super
  learners are then the hosts themselves).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

# NAME, NAME:SLOTS, or NAME slots=SLOTS [max_slots=N] (Open MPI's form).
_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+)(?::(?P<colon>\d+)|\s+slots\s*=\s*(?P<slots>\d+)"
                   r"(?:\s+max_slots\s*=\s*\d+)?)?$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1
    # Whether the file gave the slots: MPI reads a bare name as the host's cores (Open MPI)
    # or 1 (MPICH), and a hostfile in MPI's own form must say the same (hostfile_text).
    slots_given: bool = field(default=False, compare=False)


def hostfile_text(hosts: list[Host], flavor: str) -> str:
    """``hosts`` as ``flavor``'s mpiexec reads them: ``NAME:SLOTS`` for MPICH (``hydra``),
    ``NAME slots=SLOTS`` for Open MPI, which takes ``lab1:2`` for a host of that name."""
    form = "{0.name} slots={0.slots}" if flavor == "openmpi" else "{0.name}:{0.slots}"
    return "".join((form.format(h) if h.slots_given else h.name) + "\n" for h in hosts)


def read_hostfile(path: str | Path, key: str = "launcher.hostfile") -> list[Host]:
    """The hosts of ``path``, in order; ConfigError (one line, naming the file and the line)
    for a missing file, an unreadable line, a host listed twice or no host at all."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as ex:
        raise ConfigError(key, f"cannot read the hostfile {path} ({ex.strerror or ex})",
                          "give the path of a file with one host per line") from None
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        slots = match and (match.group("colon") or match.group("slots"))
        if not match or (slots is not None and int(slots) < 1):
            raise ConfigError(key, f"{path}:{number}: {raw.strip()!r} is not a host line",
                              "write one host per line: NAME, NAME:SLOTS or NAME slots=SLOTS")
        host = Host(match.group("host"), int(slots) if slots else 1, slots is not None)
        if any(h.name == host.name for h in hosts):
            raise ConfigError(key, f"{path}:{number}: host {host.name} is listed twice",
                              "list each host once (give it more slots instead)")
        hosts.append(host)
    if not hosts:
        raise ConfigError(key, f"the hostfile {path} names no host",
                          "write one host per line: NAME, NAME:SLOTS or NAME slots=SLOTS")
    return hosts


def ranks_per_host(hosts: list[Host], nprocs: int, procs_per_node: int | None,
                   key: str = "launcher.hostfile") -> list[tuple[str, int]]:
    """(host, ranks) for each host the job uses, in rank order; ConfigError when the hosts
    cannot take ``nprocs`` ranks that way (mpiexec would wrap around and put ranks of several
    nodes on one host)."""
    placed: list[tuple[str, int]] = []
    left = nprocs
    for host in hosts:
        if left == 0:
            break
        take = min(left, procs_per_node or host.slots)
        placed.append((host.name, take))
        left -= take
    if left:
        per_host = (f"{procs_per_node} per host (launcher.procs_per_node)" if procs_per_node
                    else "each host's slots (launcher.procs_per_node=null)")
        capacity = nprocs - left
        fix = (f"list {-(-left // procs_per_node)} more host(s), or raise "
               "launcher.procs_per_node" if procs_per_node
               else "give the hosts more slots (NAME:SLOTS), or set launcher.procs_per_node")
        raise ConfigError(key, f"{nprocs} ranks at {per_host} need more hosts than the "
                          f"{len(hosts)} listed, which take {capacity}", fix)
    return placed
