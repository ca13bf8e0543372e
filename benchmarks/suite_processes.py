"""Where a run's CPU goes, by program, from the kernel's process accounting.

    apt-get install acct                 # accton (Debian's package)
    touch /tmp/suite.pacct && accton /tmp/suite.pacct
    make test
    accton off
    python benchmarks/suite_processes.py /tmp/suite.pacct [--json out.json]

Every process that ended while accounting was on is one record (``struct acct_v3`` of
<linux/acct.h>): its command name, pid and parent, and its CPU seconds. The daemons a test
leaves running (the lab's, SLURM's) are counted too, which the JUnit report's per-test CPU
(benchmarks/suite_profile.py) cannot see. Ranks are the Python processes started by an MPI
launcher (MPICH's hydra_pmi_proxy, Open MPI's prterun or prted, SLURM's slurmstepd): each
imports torch, so their count times the cheapest one's CPU is what the suite pays to start
ranks at all, the part that only fewer ranks can lower.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
from collections import defaultdict
from pathlib import Path

# struct acct_v3: flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float,
# in AHZ ticks), then eight comp_t (utime, stime, mem, io, rw, minflt, majflt, swaps) and a
# 16-byte command name.
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
ACCT_VERSION = 3
TICKS_PER_S = 100  # AHZ for version 3 records
RANK_PARENTS = ("hydra_pmi_proxy", "prterun", "prted", "slurmstepd")


def comp_to_ticks(value: int) -> int:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_records(path: Path) -> list[dict]:
    """One dict per ended process: pid, ppid, command, cpu_s, wall_s."""
    data = path.read_bytes()
    usable = len(data) - len(data) % RECORD.size
    records = []
    for offset in range(0, usable, RECORD.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, _btime, etime, utime, stime,
         *_rest, comm) = RECORD.unpack_from(data, offset)
        if version & 0x7F != ACCT_VERSION:
            raise SystemExit(f"{path}: record {offset // RECORD.size} is version {version}, "
                             f"not {ACCT_VERSION}: not a Linux process-accounting file")
        records.append({"pid": pid, "ppid": ppid,
                        "command": comm.split(b"\0", 1)[0].decode(errors="replace"),
                        "cpu_s": (comp_to_ticks(utime) + comp_to_ticks(stime)) / TICKS_PER_S,
                        "wall_s": etime / TICKS_PER_S})
    return records


def summarize(records: list[dict]) -> dict:
    """CPU seconds by program, and the ranks' count and start-up floor."""
    by_pid = {r["pid"]: r for r in records}
    programs: dict[str, dict] = defaultdict(lambda: {"processes": 0, "cpu_s": 0.0})
    ranks = []
    for record in records:
        name = record["command"]
        parent = by_pid.get(record["ppid"], {}).get("command", "")
        if name.startswith("python") and parent in RANK_PARENTS:
            name = "rank (python)"
            ranks.append(record["cpu_s"])
        programs[name]["processes"] += 1
        programs[name]["cpu_s"] += record["cpu_s"]
    total = sum(r["cpu_s"] for r in records)
    summary = {"processes": len(records), "cpu_s": round(total, 1),
               "programs": {name: {"processes": p["processes"], "cpu_s": round(p["cpu_s"], 1)}
                            for name, p in sorted(programs.items(),
                                                  key=lambda kv: -kv[1]["cpu_s"])}}
    if ranks:
        # The cheapest ranks did little beyond starting: the fifth percentile stands for
        # what any rank pays before its first step.
        floor = sorted(ranks)[len(ranks) // 20]
        summary["ranks"] = {"count": len(ranks), "cpu_s": round(sum(ranks), 1),
                            "median_cpu_s": round(statistics.median(ranks), 2),
                            "start_up_floor_s": round(floor, 2),
                            "start_up_cpu_s": round(floor * len(ranks), 1)}
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pacct", type=Path, help="the file accton wrote")
    parser.add_argument("--top", type=int, default=15, help="programs to list")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    summary = summarize(read_records(args.pacct))
    print(f"{summary['processes']} processes, {summary['cpu_s']} CPU seconds\n")
    print("| program | processes | CPU s | CPU share |\n|---|---|---|---|")
    for name, program in list(summary["programs"].items())[:args.top]:
        share = program["cpu_s"] / summary["cpu_s"] if summary["cpu_s"] else 0.0
        print(f"| {name} | {program['processes']} | {program['cpu_s']} | {share:.1%} |")
    if "ranks" in summary:
        ranks = summary["ranks"]
        print(f"\n{ranks['count']} ranks used {ranks['cpu_s']} CPU s (median "
              f"{ranks['median_cpu_s']} s); at the cheapest ranks' {ranks['start_up_floor_s']} s "
              f"each, starting them cost {ranks['start_up_cpu_s']} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
