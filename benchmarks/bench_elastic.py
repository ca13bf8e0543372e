"""Elastic training: what losing a learner costs.

For each algorithm, three jobs of the digit images on 4 ranks, started the same way:

* ``plain``: launcher.elastic=false, nobody killed (the reference throughput and accuracy),
  on the venv's MPICH and on the Open MPI 5 that elastic jobs use (``plain-openmpi``);
* ``elastic``: launcher.elastic=true, nobody killed (against ``plain-openmpi``: what the
  per-step transaction costs);
* ``killed``: launcher.elastic=true, one learner kill -9'd from outside once a third of the
  sample budget is done; measured: seconds from the kill to training again (the survivors'
  event record, written when they train on), samples/s before the kill and after it (from
  the evaluations' rows), the held-out metric, and that every epoch used each sample once;
* ``rejoined``: the same kill with ``launcher.spares=1``: seconds from the kill to training
  on 4 learners again (the join's event record), what the join itself took, samples/s after
  it, the held-out metric against the spread of uninterrupted elastic runs (``--seeds``).
  Not for hadpsgd (run with 2 ranks per node; the victim leads the second), whose rows
  were measured before its super learners took spares. DiLoCo runs half the epochs (its
  outer step diverges past about 8 at the digits' rate). Asynchronous learners, which each
  go through passes of their own, count no samples per epoch::

    python benchmarks/bench_elastic.py --json docs/results/elastic.json
    python benchmarks/bench_elastic.py --algos ssgd dpsgd --epochs 12
    python benchmarks/bench_elastic.py --quick       # ssgd, 2 epochs: checks the wiring

``--quick`` kills a learner only once, with the spare (``rejoined``, which measures the kill
before the join the way ``killed`` does): the kill without one is the full mode's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runner.errors import UserError
from runner.launch.ulfm_mpi import ULFM_PREFIX

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file from anywhere: this checkout's benchmarks
    sys.path.insert(0, str(REPO))

from benchmarks import harness as bench  # noqa: E402

NAME = "elastic"
BIN = Path(sys.executable).parent
NPROCS, VICTIM = 4, 2
# hadpsgd: 2 super learners of 2 ranks; the victim leads the second. Its super learners take
# no spares yet.
ALGO_ARGS = {"hadpsgd": ["launcher.procs_per_node=2"]}
NO_SPARES = {"hadpsgd"}
# DiLoCo's outer step diverges past about 8 epochs at the digits' learning rate,
# uninterrupted too (docs/RESULTS.md, the respawn benchmark): it runs half the epochs.
EPOCHS_SCALE = {"diloco": 0.5}
FULL = {"algos": ["ssgd", "dpsgd", "local_sgd", "dasgd", "adpsgd", "hadpsgd", "sgp", "choco",
                  "diloco"], "epochs": 12, "seeds": [1, 2, 3, 4]}
QUICK = {"algos": ["ssgd"], "epochs": 2, "seeds": []}  # and no ``killed`` job
MD_HEADER = ("| date | algorithm | ranks | plain samples/s (MPICH / Open MPI) | elastic "
             "samples/s | kill to training | samples/s before / after | top-1 plain / killed "
             "| spare: kill to 4 learners (join) | samples/s after the join | top-1 rejoined "
             "| top-1 uninterrupted (seeds) | every sample once |\n" + "|---" * 13 + "|\n")


def start(run_dir: Path, algo: str, epochs: int, elastic: bool, *extra: str
          ) -> subprocess.Popen:
    command = [str(BIN / "adpsgd-run"), "recipe=digit_images", f"algo={algo}",
               f"launcher.nprocs={NPROCS}", f"launcher.elastic={str(elastic).lower()}",
               f"trainer.epochs={epochs}", "trainer.eval_every=4", "trainer.progress=false",
               f"hydra.run.dir={run_dir}", *ALGO_ARGS.get(algo, []), *extra]
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.stderr", "w") as stderr:  # the job has its own
        return subprocess.Popen(command, cwd=run_dir.parent, stdout=subprocess.DEVNULL,
                                stderr=stderr, start_new_session=True)


def stop(job: subprocess.Popen, grace_s: float = 30) -> None:
    """Stop ``job`` if it still runs, as Ctrl-C would (SIGINT to its launcher, which stops
    its mpiexec and ranks), killing it after ``grace_s`` or at a second Ctrl-C: a benchmark
    ended by Ctrl-C, a time-out or an error leaves no job going on in a session of its own."""
    if job.poll() is not None:
        return
    os.killpg(job.pid, signal.SIGINT)
    try:
        job.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def wait(job: subprocess.Popen, run_dir: Path, timeout_s: float) -> dict:
    try:
        job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"{run_dir.name} ran over {timeout_s:.0f} s",
                        "raise --timeout on a slow machine") from None
    finally:
        stop(job)
    if job.returncode != 0:
        raise UserError(f"{run_dir.name} exited with status {job.returncode}",
                        f"read {run_dir.parent / (run_dir.name + '.stderr')}")
    return json.loads((run_dir / "summary.json").read_text())


def rows_of(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "eval"]


def rate(rows: list[dict]) -> float | None:
    """Samples per second of training time between the first and the last of ``rows``."""
    if len(rows) < 2 or rows[-1]["train_s"] <= rows[0]["train_s"]:
        return None
    return (rows[-1]["samples"] - rows[0]["samples"]) / (rows[-1]["train_s"] - rows[0]["train_s"])


def wait_for_a_third(job: subprocess.Popen, run_dir: Path, epochs: int, timeout_s: float,
                     fault: str) -> None:
    """Until an evaluation of ``job`` has seen a third of its samples: the moment for
    ``fault`` (a UserError when it never comes)."""
    budget = epochs * 1438  # the digits' training set
    deadline = time.monotonic() + timeout_s
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and any(r["samples"] >= budget / 3 for r in rows_of(run_dir))):
        if job.poll() is not None or time.monotonic() > deadline:
            raise UserError(f"{run_dir.name}: the moment for {fault} never came",
                            "raise --timeout on a slow machine, or --epochs")
        time.sleep(0.05)


def killed_run(run_dir: Path, algo: str, epochs: int, timeout_s: float, *extra: str) -> dict:
    job = start(run_dir, algo, epochs, True, *extra)
    try:
        wait_for_a_third(job, run_dir, epochs, timeout_s, "the kill")
        pid = int((run_dir / "logs" / f"rank{VICTIM}.pid").read_text().split()[0])
        killed_rows = len(rows_of(run_dir))
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
    except BaseException:  # the moment never came, or Ctrl-C: the job does not go on alone
        stop(job)
        raise
    summary = wait(job, run_dir, timeout_s)
    events = list(map(json.loads, (run_dir / "logs" / "events.jsonl").read_text().splitlines()))
    lost = [e for e in events if e["event"] == "lost"]
    joined = [e for e in events if e["event"] == "joined"]
    rows = rows_of(run_dir)
    measured = {"summary": summary, "kill_to_training_s": round(lost[0]["time"] - killed_at, 3),
                "recovered_s": summary["membership"][0]["recovered_s"],
                "samples_per_s_before": rate(rows[:killed_rows]),
                "samples_per_s_after": rate(rows[killed_rows:])}
    if joined:
        measured.update(kill_to_joined_s=round(joined[0]["time"] - killed_at, 3),
                        joined_s=[m["joined_s"] for m in summary["membership"]
                                  if m["event"] == "joined"][0])
    return measured


# every_sample_once()'s answer in a markdown cell.
ONCE_CELL = {True: "yes", False: "NO", None: "not counted"}


def every_sample_once(summary: dict) -> bool | None:
    """None: not counted (asynchronous learners each go through their own passes)."""
    if summary.get("epoch_samples") is None:
        return None
    return all(e["distinct"] == e["used"] == 1438 for e in summary["epoch_samples"])


def measure(args: argparse.Namespace) -> dict:
    record = bench.Record(NAME, "benchmarks/bench_elastic.py", args.argv, args.quick)
    cases = []
    for algo in args.algos:
        root = args.runs / algo
        epochs = max(1, round(args.epochs * EPOCHS_SCALE.get(algo, 1)))
        plain = wait(start(root / "plain", algo, epochs, False), root / "plain",
                     args.timeout)
        open_mpi = wait(start(root / "plain-openmpi", algo, epochs, False,
                              f"launcher.mpiexec={ULFM_PREFIX / 'bin' / 'mpiexec'}"),
                        root / "plain-openmpi", args.timeout)
        elastic = wait(start(root / "elastic", algo, epochs, True), root / "elastic",
                       args.timeout)
        uninterrupted = {0: elastic["top1"]}  # the elastic runs' top-1 by seed
        for seed in args.seeds:
            uninterrupted[seed] = wait(start(root / f"elastic-seed{seed}", algo, epochs,
                                             True, f"seed={seed}"),
                                       root / f"elastic-seed{seed}", args.timeout)["top1"]
        # --quick: the kill with a spare only, whose run goes through killed_run() as the
        # kill without one does (an algorithm that takes no spares is killed without).
        killed = (killed_run(root / "killed", algo, epochs, args.timeout)
                  if not args.quick or algo in NO_SPARES else
                  dict.fromkeys(["summary", "kill_to_training_s", "recovered_s",
                                 "samples_per_s_before", "samples_per_s_after"]))
        summary = killed.pop("summary")
        rejoined = (killed_run(root / "rejoined", algo, epochs, args.timeout,
                               "launcher.spares=1") if algo not in NO_SPARES else None)
        rejoined_summary = rejoined.pop("summary") if rejoined else None
        once = [every_sample_once(s) for s in (summary, rejoined_summary) if s]
        case = {"algo": algo, "nprocs": NPROCS, "epochs": epochs,
                "plain_samples_per_s": plain["samples_per_s"],
                "plain_openmpi_samples_per_s": open_mpi["samples_per_s"],
                "elastic_samples_per_s": elastic["samples_per_s"],
                "plain_top1": plain["top1"], "elastic_top1": elastic["top1"],
                "killed_top1": summary and summary["top1"], "killed_learner": VICTIM,
                "every_sample_once": None if None in once else all(once), **killed,
                "rejoined": rejoined and {**rejoined, "top1": rejoined_summary["top1"],
                                          "learners_at_end": rejoined_summary["learners_at_end"]},
                "uninterrupted_top1": uninterrupted}
        cases.append(case)
        joined = (f", to 4 learners {rejoined['kill_to_joined_s']:.2f} s, rejoined top-1 "
                  f"{rejoined_summary['top1']:.2f}" if rejoined else "")
        kill = (f"kill to training {case['kill_to_training_s']:.2f} s; top-1 "
                f"{case['plain_top1']:.2f} -> {case['killed_top1']:.2f}" if summary else
                f"top-1 {case['plain_top1']:.2f}")
        print(f"{algo}: {kill}{joined}", file=sys.stderr, flush=True)
    return record.finish({"cases": cases, "run_dirs": str(args.runs)})


def markdown_rows(r: dict) -> list[str]:
    def number(value: float | None, fmt: str = ".0f") -> str:
        return "-" if value is None else format(value, fmt)

    def rejoined(c: dict) -> str:
        j = c["rejoined"]
        if not j:  # no spares (hadpsgd)
            return "- | - | -"
        return (f"{j['kill_to_joined_s']:.2f} s ({j['joined_s']:.2f} s) | "
                f"{number(j['samples_per_s_after'])} | {j['top1']:.2f}")

    def killed_s(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds:.2f} s"  # None: --quick

    once = ONCE_CELL
    return [f"| {r['date'][:10]} | {c['algo']} | {c['nprocs']} | "
            f"{number(c['plain_samples_per_s'])} / {number(c['plain_openmpi_samples_per_s'])} | "
            f"{number(c['elastic_samples_per_s'])} | "
            f"{killed_s(c['kill_to_training_s'])} | "
            f"{number(c['samples_per_s_before'])} / {number(c['samples_per_s_after'])} | "
            f"{c['plain_top1']:.2f} / {number(c['killed_top1'], '.2f')} | {rejoined(c)} | "
            f"{min(c['uninterrupted_top1'].values()):.2f}-"
            f"{max(c['uninterrupted_top1'].values()):.2f} ({len(c['uninterrupted_top1'])}) | "
            f"{once[c['every_sample_once']]} |"
            for c in r["cases"]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench.add_common_arguments(parser, NAME, timeout_s=600)
    parser.add_argument("--algos", nargs="+", choices=FULL["algos"],
                        help=f"default: {' '.join(FULL['algos'])}; --quick: ssgd")
    parser.add_argument("--epochs", type=int, help="default: 12; --quick: 2")
    parser.add_argument("--seeds", type=int, nargs="*", help="more uninterrupted elastic runs "
                        "for the spread of top-1, beside seed 0's; default: 1 2 3 4; "
                        "--quick: none")
    args = parser.parse_args(argv)
    bench.fill_defaults(args, argv, QUICK, FULL)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return bench.measure_and_write("bench_elastic", args, measure, MD_HEADER, markdown_rows)


if __name__ == "__main__":
    raise SystemExit(main())
