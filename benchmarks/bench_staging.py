"""What it costs to move a GPU model through host memory, in ms per MB: AD-PSGD's staging per
exchange, and the MPI path's staging of a collective when ranks share a GPU.

    python benchmarks/bench_staging.py                      # 1, 16 and 98 MB (98: ResNet-50)
    python benchmarks/bench_staging.py --json staging.json --markdown docs/bench.md
    python benchmarks/bench_staging.py --quick              # seconds on a CPU (not meaningful)

AD-PSGD's gossip thread sends host memory over MPI: each exchange snapshots the model x into
page-locked host buffers (runner/comm/pairwise.py: copy_snapshots, one device-to-host copy)
and merges the peer's snapshot back (merge_all: the difference on the host, one host-to-device
copy and the add). The collectives of ranks that share a GPU (runner/comm/communicator.py:
HostStaging) copy out before and back after. Both are timed here with the library's own
functions on flat float32 buffers, without the network transfer between them, which the
benchmarks of the algorithms measure. Prints one JSON object and markdown rows; never asserts
a speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from runner.comm.communicator import HostStaging
from runner.comm.pairwise import _host_like, copy_snapshots, merge_all

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "staging"
MD_HEADER = ("| date | device | MB | snapshot ms | merge ms | exchange ms/MB | collective "
             "ms/MB |\n|---|---|---|---|---|---|---|\n")
# 98 MB: ResNet-50's 25.6 M float32 parameters.
FULL = {"megabytes": [1.0, 16.0, 98.0], "repeats": 20}
QUICK = {"megabytes": [0.25], "repeats": 2}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megabytes", type=float, nargs="+", help=f"default {FULL['megabytes']}")
    p.add_argument("--repeats", type=int, help=f"timed repetitions, default {FULL['repeats']}")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    bench.add_common_arguments(p, NAME, trains=False)
    args = p.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    if args.repeats < 1 or min(args.megabytes) <= 0:
        p.error("--repeats must be >= 1 and --megabytes > 0")
    return args


def timed_ms(fn, repeats: int, sync) -> float:
    fn()  # warm: first-touch of pinned pages, CUDA's lazy set-up
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return 1000 * (time.perf_counter() - start) / repeats


def measure_size(megabytes: float, device: torch.device, repeats: int) -> dict:
    numel = int(megabytes * 2**20 / 4)
    x = [torch.randn(numel, device=device)]
    snapshots, received = [_host_like(b) for b in x], [_host_like(b) for b in x]
    received[0].normal_()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def exchange_merge():
        merge_all(x, snapshots, received)

    snapshot_ms = timed_ms(lambda: copy_snapshots(snapshots, x), repeats, sync)
    merge_ms = timed_ms(exchange_merge, repeats, sync)
    staging = HostStaging()

    def collective_round_trip():
        with staging.host(x[0]):
            pass

    collective_ms = timed_ms(collective_round_trip, repeats, sync)
    exact_mb = numel * 4 / 2**20
    return {"megabytes": round(exact_mb, 3), "snapshot_ms": snapshot_ms, "merge_ms": merge_ms,
            "exchange_ms": snapshot_ms + merge_ms,
            "exchange_ms_per_mb": (snapshot_ms + merge_ms) / exact_mb,
            "collective_ms": collective_ms, "collective_ms_per_mb": collective_ms / exact_mb,
            "pinned": bool(snapshots[0].is_pinned())}


def benchmark(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_staging.py", args.argv, args.quick)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    sizes = [measure_size(mb, device, args.repeats) for mb in args.megabytes]
    return record.finish({
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if use_cuda else bench.cpu_model(),
        "repeats": args.repeats, "sizes": sizes, "torch": torch.__version__,
    })


def markdown_rows(r: dict) -> list[str]:
    return [f"| {r['date'][:10]} | {r['device_name']} ({r['device']}) | {s['megabytes']:.1f} | "
            f"{s['snapshot_ms']:.2f} | {s['merge_ms']:.2f} | {s['exchange_ms_per_mb']:.3f} | "
            f"{s['collective_ms_per_mb']:.3f} |" for s in r["sizes"]]


def main(argv: list[str] | None = None) -> int:
    return bench.measure_and_write("bench_staging", parse_args(argv), benchmark, MD_HEADER,
                                   markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
