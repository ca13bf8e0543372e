"""A local launcher's job across hosts (``launcher.hostfile``): mpiexec's arguments for the
hostfile and the command that enters a host, and the check that every host answers before
any rank starts.

``launcher.remote_shell`` is how mpiexec enters a host: ssh on a cluster (the default), or a
command with ssh's calling convention (``COMMAND [-x] HOST COMMAND-LINE``), such as the lab's
(scripts/lab_cluster.sh). MPICH's mpiexec takes it as ``-launcher ssh -launcher-exec``, Open
MPI's as ``--mca plm_rsh_agent``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

from ..comm.hostfile import Host, hostfile_text, read_hostfile
from ..errors import ConfigError, one_line

PROBE_TIMEOUT_S = 20.0  # how long a host may take to run `true`


@cache
def mpi_flavor(mpiexec: str) -> str:
    """``hydra`` (MPICH), ``openmpi`` or ``other``, from ``mpiexec --version``."""
    try:
        probe = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "other"
    text = probe.stdout + probe.stderr
    if "HYDRA" in text:
        return "hydra"
    return "openmpi" if "Open MPI" in text or "OpenRTE" in text else "other"


def remote_shell_path(shell: str | None, key: str) -> str:
    """The command that enters a host, as a path (ConfigError when it does not exist)."""
    found = shutil.which(shell or "ssh")
    if not found:
        raise ConfigError(key, f"{shell or 'ssh'!r} (the command that enters a host) is not "
                          "found", "install ssh, or set launcher.remote_shell to the command "
                          "your cluster uses (ssh's calling convention)")
    return found


def hostfile_args(mpiexec: str, hostfile: str, shell: str, procs_per_node: int | None,
                  key: str = "launcher.hostfile") -> list[str]:
    """mpiexec's arguments that place the job on the hostfile's hosts. mpiexec reads a copy
    of the file in its own form (:func:`~runner.comm.hostfile.hostfile_text`): either form
    works with either MPI."""
    flavor = mpi_flavor(mpiexec)
    if flavor in ("hydra", "openmpi"):
        hostfile = str(own_form(read_hostfile(hostfile, key), flavor))
    if flavor == "hydra":
        args = ["-f", hostfile, "-launcher", "ssh", "-launcher-exec", shell]
        return args + (["-ppn", str(procs_per_node)] if procs_per_node else [])
    if flavor == "openmpi":
        mapping = f"ppr:{procs_per_node}:node" if procs_per_node else "slot"
        return ["--hostfile", hostfile, "--mca", "plm_rsh_agent", shell, "--map-by", mapping]
    raise ConfigError(key, f"{mpiexec} is neither MPICH's nor Open MPI's mpiexec, so the "
                      "launcher does not know how to give it a hostfile",
                      "pass it yourself in launcher.mpiexec_args, or use MPICH or Open MPI")


def own_form(hosts: list[Host], flavor: str) -> Path:
    """A hostfile of ``hosts`` in ``flavor``'s form, written once per content (named by its
    hash, in a directory of this user's under the temporary directory)."""
    text = hostfile_text(hosts, flavor)
    folder = Path(tempfile.gettempdir()) / f"adpsgd-hostfiles-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.{flavor}"
    if not path.exists() or path.read_text() != text:
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.replace(path)  # whole or not at all, should two launchers write it at once
    return path


def host_problem(shell: str, host: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``host`` does not run ``true`` through ``shell`` within ``timeout_s``; None when
    it answers."""
    command = [shell, *(["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, timeout_s):.0f}"]
                        if Path(shell).name == "ssh" else []), host, "true"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:.0f} s"
    except OSError as ex:
        return one_line(ex)
    if done.returncode != 0:
        said = one_line(done.stderr or done.stdout or "")
        return f"exit {done.returncode}" + (f": {said}" if said else "")
    return None


def unanswered_host(shell: str, hosts: list[Host],
                    timeout_s: float = PROBE_TIMEOUT_S) -> tuple[str, str] | None:
    """The first host (in the file's order) that does not run ``true`` through ``shell``
    within ``timeout_s``, with why; None when every host answers. The hosts are asked at
    once."""
    problems: dict[str, str] = {}

    def ask(host: str) -> None:
        if (problem := host_problem(shell, host, timeout_s)) is not None:
            problems[host] = problem

    threads = [threading.Thread(target=ask, args=(host.name,), daemon=True) for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 5)
    for host in hosts:
        if host.name in problems:
            return host.name, problems[host.name]
    return None
