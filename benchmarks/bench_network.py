"""Bandwidth over the lab's shaped links (scripts/lab_cluster.sh): SSGD's allreduce and
AD-PSGD's pairwise exchange, as fractions of the link rate, for messages of 64 kB to 64 MB.

    python benchmarks/bench_network.py                   # 2 and 4 hosts, 1 Gbit/s and 100 Mbit/s
    python benchmarks/bench_network.py --json docs/results/network/busbw.json
    python benchmarks/bench_network.py --quick           # 2 hosts, 2 sizes: seconds

Needs root (the lab's network namespaces); it brings the lab up when it has fewer hosts than
it needs, sets every link to each rate in turn, and leaves the lab up with the rates it found
(``scripts/lab_cluster.sh down`` removes it). One rank per host, started by the local
launcher's own mpiexec command across the lab's hostfile, times the library's own operations
on flat float32 buffers:

* **allreduce**: ``Communicator.allreduce_`` (what SSGD's buckets run), reported as bus
  bandwidth, nccl-tests' measure: ``bytes x 2(n-1)/n / seconds``, which is the link rate for a
  bandwidth-optimal allreduce whatever n is; with each ``comm.allreduce`` setting asked for
  (``--allreduce``: ring, the default, and auto, the MPI library's own choice);
* **exchange**: AD-PSGD's ``PairwiseAverager`` (runner/comm/pairwise.py), actives 0, 2, ...
  each with a fixed passive peer, one exchange per tick: both snapshots cross the link at once,
  one each way, so ``bytes / seconds`` of one exchange is the bandwidth each direction got.

* **CPU per MB** (``--cpu-seconds``, at the first rate): what moving bytes between two hosts
  costs the machine's processors, ``cluster.cpu_s_per_mb`` of the simulator: the seconds
  the processors were busy (/proc/stat: every process and the kernel) while a TCP stream ran
  from the first host to the second, less those of a stream of no length (its two ends'
  start-up), medians of 3, over the MB it moved, counted once where they left and once where
  they arrived. Nothing else may run meanwhile. About 0 where the network interface does the
  work; the lab's hosts are one machine's namespaces, whose network stack takes the cores
  the ranks compute on.

Each figure is the median of the repeats, divided by the shaped rate. The goal is 0.8 of the
link from 4 MB up. Prints one JSON object and markdown rows; never asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402
from runner.errors import UserError  # noqa: E402

NAME = "network"
LAB = REPO / "scripts" / "lab_cluster.sh"
MD_HEADER = ("| date | hosts | link | operation | 64 kB | 1 MB | 4 MB | 16 MB | 64 MB |\n"
             "|---|---|---|---|---|---|---|---|---|\n")
KB = 1024
FULL = {"hosts": [2, 4], "rates": ["1gbit", "100mbit"],
        "sizes_kb": [64, 256, KB, 4 * KB, 16 * KB, 64 * KB], "repeats": 5,
        "allreduce": ["ring", "auto"], "cpu_seconds": 10.0}
# Quick: sizes far apart, so the shaper's floor for 4 MB (34 ms at 1 Gbit/s) stays above a
# 64 kB exchange that a busy machine's scheduler delayed, and an odd number of repeats, so
# the median is a measured time that one delayed repeat cannot move (a mean of 2 can).
QUICK = {"hosts": [2], "rates": ["1gbit"], "sizes_kb": [64, 4 * KB], "repeats": 5,
         "allreduce": ["ring"], "cpu_seconds": 1.0}
STREAM_PORT = 47311  # the CPU measurement's TCP stream, on the second host


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, nargs="+", help=f"default {FULL['hosts']}")
    p.add_argument("--rates", nargs="+", help=f"link rates (tc's syntax), default {FULL['rates']}")
    p.add_argument("--sizes-kb", type=int, nargs="+", help=f"default {FULL['sizes_kb']}")
    p.add_argument("--repeats", type=int, help=f"default {FULL['repeats']}")
    p.add_argument("--allreduce", nargs="+", choices=("ring", "auto"),
                   help=f"comm.allreduce settings to time, default {FULL['allreduce']}")
    p.add_argument("--cpu-seconds", type=float,
                   help=f"seconds of each TCP stream of the CPU-per-MB measurement (0: skip it), "
                        f"default {FULL['cpu_seconds']}")
    p.add_argument("--timeout", type=float, default=1800, help="per job, seconds")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a rank of the job: its JSON spec
    bench.add_common_arguments(p, NAME, trains=False)
    args = p.parse_args(argv)
    if args.child:
        return args
    bench.fill_defaults(args, argv, QUICK, FULL)
    if min(args.hosts) < 2 or args.repeats < 1 or min(args.sizes_kb) < 1 or \
            args.cpu_seconds < 0:
        p.error("--hosts must be >= 2, --repeats and --sizes-kb >= 1, --cpu-seconds >= 0")
    return args


def lab(*words: str) -> str:
    """Run scripts/lab_cluster.sh WORDS; its output (one UserError line if it fails)."""
    done = subprocess.run(["bash", str(LAB), *words], capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"scripts/lab_cluster.sh {' '.join(words)} failed: "
                        f"{(done.stderr or done.stdout).strip().splitlines()[-1]}",
                        "run the benchmark as root on Linux (network namespaces)")
    return done.stdout


def lab_with(hosts: int, rate: str) -> tuple[list[str], str, dict[str, str]]:
    """The lab with at least ``hosts`` hosts (brought up at ``rate`` when it has fewer; a
    larger lab is kept as it is): its host names, its remote shell, and each host's rate now
    (to put back afterwards)."""
    status = subprocess.run(["bash", str(LAB), "status"], capture_output=True, text=True)
    rates = dict(re.findall(r"^(\S+) +\S+ +link \w+ +rate (\S+)$", status.stdout, re.M))
    if status.returncode != 0 or len(rates) < hosts:
        lab("up", str(hosts), rate)
        status = subprocess.run(["bash", str(LAB), "status"], capture_output=True, text=True)
        rates = dict(re.findall(r"^(\S+) +\S+ +link \w+ +rate (\S+)$", status.stdout,
                                re.M))
    shell = re.search(r"launcher\.remote_shell=(\S+)", status.stdout).group(1)
    return list(rates), shell, rates


def rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, factor in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * factor
    raise UserError(f"--rates: {rate!r} is not in kbit, mbit or gbit", "e.g. --rates 1gbit")


# ---- a rank of the job ---------------------------------------------------------------------
def child(spec: dict[str, Any]) -> None:
    """Time every size on this rank; rank 0 prints one JSON line of medians (seconds)."""
    import os

    import torch

    from runner.comm.world import mpi_environment

    os.environ.update(mpi_environment(spec["allreduce"]))  # as the worker does (MPI reads it)
    from runner.comm.communicator import Communicator
    from runner.comm.pairwise import PairwiseAverager
    from runner.comm.world import mpi

    world = mpi().COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = Communicator(world, "mpi", timeout_s=600)
    results: dict[str, dict[str, float]] = {"allreduce": {}, "exchange": {}}
    for kb in spec["sizes_kb"]:
        flat = torch.ones(kb * KB // 4)
        times = []
        for repeat in range(spec["repeats"] + 1):  # the first one warms the connections
            comm.barrier()
            started = time.perf_counter()
            comm.allreduce_(flat)
            took = comm.allreduce_numbers([time.perf_counter() - started], op="max")[0]
            if repeat:
                times.append(float(took))
        results["allreduce"][str(kb)] = statistics.median(times)
        if not spec["exchange"]:
            continue
        # AD-PSGD's exchange: even ranks active, each with the odd rank after it.
        averager = PairwiseAverager(world, [flat], threading.Lock(), rank % 2 == 0,
                                    lambda k: rank + 1, timeout_s=600)
        averager.record_intervals = True
        if averager.is_active:
            for done in range(1, spec["repeats"] + 2):
                averager.tick(0)  # one exchange per tick
                while len(averager.intervals) < done:
                    time.sleep(0.001)
                    averager.raise_if_failed()
        averager.stop(comm.barrier)
        mine = [end - start for start, end, _ in averager.intervals[1:]] or [0.0]
        slowest = comm.allreduce_numbers([statistics.median(mine)], op="max")[0]
        results["exchange"][str(kb)] = float(slowest)
    comm.close()
    if rank == 0:
        print("RESULT " + json.dumps({"ranks": size, **results}), flush=True)


# ---- the benchmark ---------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> dict[str, Any]:
    record = bench.Record(NAME, "benchmarks/bench_network.py", args.argv, args.quick)
    names, shell, before = lab_with(max(args.hosts), args.rates[0])
    runs, cpu = [], None
    try:
        if args.cpu_seconds:
            for host in names:
                lab("rate", host, args.rates[0])
            cpu = network_cpu(names[:2], args.rates[0], args.cpu_seconds)
        for rate in args.rates:
            for host in names:
                lab("rate", host, rate)
            for hosts in args.hosts:
                for setting in args.allreduce:  # the exchange is timed once, with the first
                    runs.append(run_job(args, names[:hosts], rate, setting,
                                        exchange=setting == args.allreduce[0], shell=shell))
    finally:
        for host, rate in before.items():  # the links as they were
            lab("rate", host, rate)
    return record.finish({"sizes_kb": args.sizes_kb, "repeats": args.repeats, "runs": runs,
                          "goal": ">= 0.8 of the link rate from 4 MB up", "cpu": cpu,
                          "cpu_s_per_mb": cpu["cpu_s_per_mb"] if cpu else None})


STREAM_SERVER = ("import socket, sys\ns = socket.create_server(('', int(sys.argv[1])))\n"
                 "print('listening', flush=True)\nc, _ = s.accept(); total = 0\n"
                 "while (chunk := c.recv(1 << 20)):\n    total += len(chunk)\nprint(total)")
STREAM_CLIENT = ("import socket, sys, time\nc = socket.create_connection((sys.argv[1], "
                 "int(sys.argv[2])))\nend = time.perf_counter() + float(sys.argv[3]); "
                 "block = bytes(1 << 20)\nwhile time.perf_counter() < end:\n"
                 "    c.sendall(block)\nc.close()")


def busy_seconds() -> float:
    """CPU seconds this machine's processors have been busy (every process, the kernel's
    work included), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def stream(hosts: list[str], address: str, seconds: float) -> tuple[float, int]:
    """A TCP stream of ``seconds`` from ``hosts[0]`` to ``hosts[1]``: the machine's busy CPU
    seconds while it ran (its two ends' start-up included), and the bytes it moved."""
    remote = ["bash", str(LAB), "ssh"]
    server = subprocess.Popen([*remote, hosts[1], sys.executable, "-c",
                               shlex.quote(STREAM_SERVER), str(STREAM_PORT)],
                              stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "listening":
            raise UserError(f"the stream's receiver on {hosts[1]} did not start",
                            "check the lab: scripts/lab_cluster.sh status")
        before = busy_seconds()
        subprocess.run([*remote, hosts[0], sys.executable, "-c", shlex.quote(STREAM_CLIENT),
                        address, str(STREAM_PORT), str(seconds)], check=True)
        moved = int(server.communicate(timeout=60)[0].split()[-1])
        return busy_seconds() - before, moved
    finally:
        if server.poll() is None:
            server.kill()


def network_cpu(hosts: list[str], rate: str, seconds: float, rounds: int = 3
                ) -> dict[str, Any]:
    """CPU seconds per MB sent or received between ``hosts[0]`` and ``hosts[1]`` (see the
    module's docstring): medians over ``rounds`` of a stream of ``seconds`` less one of none
    (its ends' start-up), on a machine doing nothing else."""
    address = lab("ssh", hosts[1], "hostname -I").split()[0]
    empty = statistics.median(stream(hosts, address, 0.0)[0] for _ in range(rounds))
    runs = [stream(hosts, address, seconds) for _ in range(rounds)]
    taken_s = max(0.0, statistics.median(cpu for cpu, _ in runs) - empty)
    mb = statistics.median(moved for _, moved in runs) / 1e6
    result = {"hosts": hosts[:2], "rate": rate, "seconds": seconds, "rounds": rounds,
              "busy_cpu_s": [round(cpu, 3) for cpu, _ in runs],
              "busy_cpu_s_empty_stream": round(empty, 3), "mb_moved": round(mb, 1),
              "cpu_s_taken": round(taken_s, 3),
              "cpu_s_per_mb": taken_s / (2 * mb) if mb else None}
    print(f"  CPU: a stream of {mb:.0f} MB in {seconds:g} s kept the processors busy "
          f"{taken_s:.2f} s: {result['cpu_s_per_mb'] * 1e3:.2f} ms per MB sent or received",
          file=sys.stderr, flush=True)
    return result


def run_job(args: argparse.Namespace, hosts: list[str], rate: str, allreduce: str,
            exchange: bool, shell: str) -> dict[str, Any]:
    """One job of one rank per host; what it measured, as fractions of the link rate."""
    with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
        f.write("\n".join(hosts) + "\n")
    spec = {"sizes_kb": args.sizes_kb, "repeats": args.repeats, "allreduce": allreduce,
            "exchange": exchange}
    before = veth_bytes(hosts)
    started = time.perf_counter()
    try:
        stdout = bench.run_ranks(
            len(hosts), [str(Path(__file__).resolve()), "--child", json.dumps(spec)],
            args.timeout, f"the network benchmark at {rate} on {len(hosts)} hosts",
            {"hostfile": f.name, "remote_shell": shell, "procs_per_node": 1})
    finally:
        Path(f.name).unlink()
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    seconds = json.loads(line[len("RESULT "):])
    n, link = len(hosts), rate_bits(rate) / 8  # bytes/s each way
    busbw = {kb: (int(kb) * KB * 2 * (n - 1) / n / t) / link
             for kb, t in seconds["allreduce"].items()}
    pairs = {kb: (int(kb) * KB / t) / link for kb, t in seconds["exchange"].items()}
    print(f"  {n} hosts at {rate}: allreduce ({allreduce}) {fractions(busbw)}"
          + (f"; exchange {fractions(pairs)}" if pairs else ""), file=sys.stderr, flush=True)
    return {"hosts": n, "rate": rate, "allreduce": allreduce, "link_bytes_per_s": link,
            "seconds": {k: seconds[k] for k in ("allreduce", "exchange")},
            "allreduce_busbw_fraction": busbw, "exchange_fraction": pairs,
            "veth_bytes": veth_bytes(hosts) - before,
            "wall_s": round(time.perf_counter() - started, 1)}


def veth_bytes(hosts: list[str]) -> int:
    """Bytes through the head's ends of the hosts' links so far (both directions)."""
    total = 0
    for host in hosts:
        for way in ("rx", "tx"):
            path = Path(f"/sys/class/net/{host}-h/statistics/{way}_bytes")
            total += int(path.read_text()) if path.exists() else 0
    return total


def fractions(values: dict[str, float]) -> str:
    return ", ".join(f"{int(kb) // KB if int(kb) >= KB else kb}{' MB' if int(kb) >= KB else ' kB'}"
                     f" {v:.2f}" for kb, v in values.items())


def markdown_rows(result: dict[str, Any]) -> list[str]:
    rows = []
    date = result["date"][:10]
    for run in result["runs"]:
        for operation, key in ((f"allreduce busbw ({run['allreduce']})",
                                "allreduce_busbw_fraction"), ("exchange", "exchange_fraction")):
            if not run[key]:
                continue
            cells = [f"{run[key][str(kb)]:.2f}" if str(kb) in run[key] else "-"
                     for kb in (64, KB, 4 * KB, 16 * KB, 64 * KB)]
            rows.append(f"| {date} | {run['hosts']} | {run['rate']} | {operation} | "
                        + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    return bench.measure_and_write(NAME, args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
