"""Jobs across hosts, without hosts: the hostfile's grammar and where ranks land, mpiexec's
arguments per MPI, the one-line refusals, and reading mpiexec's per-host exit codes."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from runner.comm.hostfile import Host, ranks_per_host, read_hostfile
from runner.errors import ConfigError
from runner.launch.hosts import hostfile_args, unanswered_host
from runner.launch.job_reports import killed_elsewhere
from runner.launch.mpiexec_output import MpiexecOutput, MpiexecStderr


def hostfile(tmp_path, text: str) -> str:
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def test_both_mpis_forms_and_comments(tmp_path):
    path = hostfile(tmp_path, "# the nodes\nnode1\nnode2:4   # four slots\n\nnode3 slots=2\n"
                              "node4 slots=2 max_slots=8\n")
    assert read_hostfile(path) == [Host("node1", 1), Host("node2", 4), Host("node3", 2),
                                   Host("node4", 2)]


@pytest.mark.parametrize("text, problem", [
    ("", "names no host"),
    ("node1\nnode1:2\n", "hosts:2: host node1 is listed twice"),
    ("node1 junk=3\n", "hosts:1: 'node1 junk=3' is not a host line"),
    ("node1:0\n", "is not a host line"),
])
def test_a_bad_hostfile_is_one_line_naming_the_line(tmp_path, text, problem):
    path = hostfile(tmp_path, text)
    with pytest.raises(ConfigError, match=problem) as error:
        read_hostfile(path)
    assert str(error.value).startswith("launcher.hostfile: ") and "\n" not in str(error.value)


def test_a_missing_hostfile_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the hostfile"):
        read_hostfile(tmp_path / "none")


def test_ranks_per_host_follow_procs_per_node_or_the_slots():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 1)]
    assert ranks_per_host(hosts, 4, 2) == [("a", 2), ("b", 2)]
    assert ranks_per_host(hosts, 5, None) == [("a", 2), ("b", 2), ("c", 1)]
    assert ranks_per_host(hosts, 3, 1) == [("a", 1), ("b", 1), ("c", 1)]
    with pytest.raises(ConfigError, match="need more hosts than the 3 listed, which take 6"):
        ranks_per_host(hosts, 8, 2)
    with pytest.raises(ConfigError, match="each host's slots"):
        ranks_per_host(hosts, 6, None)


def test_mpiexec_arguments_for_mpich_and_open_mpi(tmp_path, monkeypatch):
    """Either form of slots works with either MPI: mpiexec reads the hosts in its own form
    (Open MPI took ``lab1:2`` for a host named so, and lost its daemon there)."""
    path = hostfile(tmp_path, "a:2\nb slots=3\nc\n")
    flavors = {"mpich": "hydra", "ompi": "openmpi", "odd": "other"}
    monkeypatch.setattr("runner.launch.hosts.mpi_flavor", lambda mpiexec: flavors[mpiexec])
    mpich = hostfile_args("mpich", path, "/bin/enter", 2)
    assert mpich[0] == "-f" and mpich[2:] == [
        "-launcher", "ssh", "-launcher-exec", "/bin/enter", "-ppn", "2"]
    assert Path(mpich[1]).read_text() == "a:2\nb:3\nc\n"
    open_mpi = hostfile_args("ompi", path, "/bin/enter", None)
    assert open_mpi[0] == "--hostfile" and open_mpi[2:] == [
        "--mca", "plm_rsh_agent", "/bin/enter", "--map-by", "slot"]
    # A bare name stays bare: each MPI gives it its own default (Open MPI: the host's cores).
    assert Path(open_mpi[1]).read_text() == "a slots=2\nb slots=3\nc\n"
    assert hostfile_args("ompi", path, "/bin/enter", None) == open_mpi  # written once
    with pytest.raises(ConfigError, match="neither MPICH's nor Open MPI's"):
        hostfile_args("odd", path, "/bin/enter", 1)


@pytest.mark.slow  # it starts the remote shell
def test_a_host_that_does_not_answer_is_named_first_in_file_order(tmp_path):
    shell = tmp_path / "enter"
    shell.write_text("#!/bin/sh\ncase \"$1\" in up*) exit 0;; *) echo \"no route to $1\" >&2; "
                     "exit 255;; esac\n")
    os.chmod(shell, 0o755)
    hosts = [Host("up1"), Host("down1"), Host("up2"), Host("down2")]
    assert unanswered_host(str(shell), hosts) == ("down1", "exit 255: no route to down1")
    assert unanswered_host(str(shell), [Host("up1")]) is None


def test_the_ranks_killed_on_other_hosts_are_read_from_mpiexecs_exit_codes(tmp_path):
    """-print-all-exitcodes: the rank a signal from outside killed, not the peers that then
    crashed in MPI (the lab's UCX segfaults); none when no rank died that way."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for rank, host in enumerate(["lab1", "lab1", "lab2", "lab2"]):
        (logs / f"rank{rank}.pid").write_text(f"{100 + rank} {host}\n")
    output = MpiexecOutput(io.StringIO("[mpiexec@head] Exit codes: [lab1] 11,0\n[lab2] 0,9\n"
                                       "training line\n"), logs / "mpiexec.log")
    output.join()
    assert output.exit_codes == {"lab1": [11, 0], "lab2": [0, 9]}
    rank, host, signum, others = killed_elsewhere(tmp_path, 4, output.exit_codes)
    assert (rank, host, signum) == (3, "lab2", 9) and "rank(s) 0 then ended by signal(s) 11" \
        in others
    assert killed_elsewhere(tmp_path, 4, {"lab1": [11, 0], "lab2": [0, 0]}) is None
    assert "Exit codes" in (logs / "mpiexec.log").read_text()


def test_mpiexecs_own_lines_go_to_its_log_and_the_ranks_output_passes(tmp_path, capfd):
    read, write = os.pipe()
    relay = MpiexecStderr(read, tmp_path / "mpiexec.log")
    os.write(write, b"bar 10%\rbar 20%\r[mpiexec@vm] Sending Ctrl-C to processes\n"
                    b"[proxy:0@lab1] write error\nadpsgd-run: the rank's line\n"
                    b"[vm:07137] plm:ssh: Warning: setpgid(7145,7145) failed in parent with "
                    b"errno=Permission denied(13)\n[mpiex")
    os.write(write, b"ec@vm] Press Ctrl-C again\n")
    os.close(write)
    relay.join()
    out = capfd.readouterr().err
    assert out == "bar 10%\rbar 20%\radpsgd-run: the rank's line\n", out
    assert (tmp_path / "mpiexec.log").read_text().count("\n") == 4
