"""What the benchmarks under ``benchmarks/bench_*.py`` share: the machine record, real training
jobs on real ranks, and the JSON and markdown they write.

A benchmark is only worth its context: every result records the CPU model, cores, memory, GPU,
the load average before and after (this machine is shared, so a number taken under load must
say so), the date and the exact command. Numbers are never asserted; the smoke test checks
structure and sanity only.

Training jobs run as the worker runs them, minus the process start: :func:`prepare_cases`
composes and validates each case's overrides exactly as ``adpsgd-run`` does and saves
``RUN_DIR/.hydra/run.yaml``; :func:`run_cases` then starts ONE ``mpiexec`` job (``python
benchmarks/harness.py RUN_DIR ...``) whose ranks call :func:`runner.rank.run_rank` on every run
dir in turn. Starting ranks costs 5-10 s of imports here, more than many cases train, and one
job for many cases is what makes a ``--quick`` mode take seconds. Each case leaves an ordinary
run dir (``metrics.jsonl``, ``summary.json``, ``tb/``), which ``adpsgd-report`` reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError


# ---- the machine and the moment --------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: how busy the shared machine was."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """Where a number was measured (GPU fields are None without CUDA)."""
    import torch

    gpu = torch.cuda.is_available()
    return {"host": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "memory_gib": memory_gib(), "gpu": torch.cuda.get_device_name(0) if gpu else None,
            "gpus": torch.cuda.device_count() if gpu else 0, "torch": torch.__version__,
            "python": platform.python_version()}


class Record:
    """One benchmark's result: context first (printed at once, so a long run says what it is
    doing), then the measured numbers; :meth:`finish` adds the load average after."""

    def __init__(self, benchmark: str, script: str, argv: Sequence[str], quick: bool):
        self.data: dict[str, Any] = {
            "benchmark": benchmark,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(["python", script, *argv]),
            "quick": quick,
            "machine": machine(),
            "load_before": load_average(),
        }
        self._started = time.perf_counter()
        m = self.data["machine"]
        print(f"{benchmark}: {self.data['date']} on {m['cpu']} ({m['cores']} cores"
              f"{', GPU ' + m['gpu'] if m['gpu'] else ''}), load average "
              f"{self.data['load_before']}\ncommand: {self.data['command']}", flush=True)

    def finish(self, results: dict[str, Any]) -> dict[str, Any]:
        self.data.update(results)
        self.data["load_after"] = load_average()
        self.data["elapsed_s"] = round(time.perf_counter() - self._started, 1)
        return self.data


def write_outputs(result: dict[str, Any], json_path: Path | None, markdown_path: Path | None,
                  header: str, rows: list[str]) -> None:
    """Print the JSON and the markdown rows; write the JSON to ``json_path`` and append the
    rows to ``markdown_path`` (with the header when the file is new)."""
    text = json.dumps(result, indent=2)
    print(text)
    print(header + "".join(row + "\n" for row in rows), end="")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n")
    if markdown_path:
        new = not markdown_path.exists()
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        with open(markdown_path, "a") as f:
            f.write((header if new else "") + "".join(row + "\n" for row in rows))


def add_common_arguments(parser: argparse.ArgumentParser, name: str, trains: bool = True,
                         timeout_s: float = 3600) -> None:
    """--quick, --json, --markdown, and for benchmarks that train, --runs and --timeout: the
    same in every benchmark."""
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long smoke run (numbers are not meaningful)")
    parser.add_argument("--json", type=Path, help="write the JSON result to this file")
    parser.add_argument("--markdown", type=Path, help="append the markdown row(s) to this file")
    if not trains:
        return
    stamp = datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    parser.add_argument("--runs", type=Path, default=Path("runs") / "bench" / f"{stamp}-{name}",
                        help="where the run dirs go (default: runs/bench/DATE/TIME-NAME)")
    parser.add_argument("--timeout", type=float, default=timeout_s,
                        help=f"seconds the MPI job may take before it is an error "
                             f"(default {timeout_s:.0f})")


def fill_defaults(args: argparse.Namespace, argv: Sequence[str] | None,
                  quick: dict[str, Any], full: dict[str, Any]) -> None:
    """Record the command line, resolve --runs, and give every option left unset (or 0/empty)
    its --quick or full value."""
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if getattr(args, "runs", None) is not None:
        args.runs = args.runs.resolve()
    for key, value in (quick if args.quick else full).items():
        if not getattr(args, key):
            setattr(args, key, value)


def measure_and_write(prog: str, args: argparse.Namespace,
                      measure: Callable[[argparse.Namespace], dict[str, Any]], header: str,
                      rows: Callable[[dict[str, Any]], list[str]]) -> int:
    """The main of a benchmark: measure, print and write the JSON and markdown rows."""
    def body() -> None:
        result = measure(args)
        write_outputs(result, args.json, args.markdown, header, rows(result))

    return run_benchmark(prog, body)


def run_benchmark(prog: str, body: Callable[[], object]) -> int:
    """Run ``body``; a user error (bad override, failed job) ends as one line, status 2, and
    Ctrl-C as one line, status 130."""
    try:
        body()
    except UserError as ex:
        print(f"{prog}: error: {ex}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: stopped by Ctrl-C before its results were written (run dirs it "
              "finished are kept)", file=sys.stderr)
        return 130
    return 0


@dataclass
class TimedSteps:
    """What :func:`time_training_steps` measured."""
    seconds: float  # the timed steps, the device synchronised before and after
    warmup_s: float
    final_loss: float
    peak_memory_gib: float | None  # CUDA only: the most the timed steps held


PROFILED_STEPS = 10  # time_training_steps(profile=...): steps under torch's profiler


def time_training_steps(model: Any, recipe: Any, path: Any, optimizer: Any, host_batch: Any,
                        warmup: int, steps: int,
                        clip_grad_norm: float | None = None,
                        profile: Path | None = None) -> TimedSteps:
    """The benchmarks' training step, as the trainer takes it on one rank: the host batch to
    the device (``path``: runner.train.compute_path.ComputePath), forward under autocast, backward,
    gradient clipping where the recipe clips (``optim.clip_grad_norm``), optimizer step.
    ``host_batch`` is one batch used every step, or a callable giving each step's batch.
    ``warmup`` untimed steps first (compilation, cuDNN autotuning, allocator), then ``steps``
    timed ones; CUDA launches are asynchronous, so the device is synchronised at both ends of
    each interval. ``profile``: after the timed steps, ``PROFILED_STEPS`` more under torch's
    profiler (every thread's kernels on the device, a prefetching thread's too), its table of
    operators by their own device time (CPU time without a GPU) written to this file."""
    import torch

    cuda = path.device.type == "cuda"

    def step() -> torch.Tensor:
        batch = path.batch(recipe, host_batch() if callable(host_batch) else host_batch)
        with path.autocast():
            loss = recipe.loss(model, batch)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        if clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        optimizer.step()
        return loss

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(path.device)

    started = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warmup_s = time.perf_counter() - started
    if cuda:
        torch.cuda.reset_peak_memory_stats(path.device)
    started = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(path.device) / 2**30 if cuda else None
    if profile is not None:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with profiler(activities=activities) as profiled:
            for _ in range(PROFILED_STEPS):
                step()
            sync()
        profile.write_text(profiled.key_averages().table(
            sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=40))
    return TimedSteps(seconds, warmup_s, float(loss.detach()), peak)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# ---- training jobs -------------------------------------------------------------------------
# Every algorithm as the benchmarks compare them: name -> adpsgd-run overrides.
ALGORITHM_VARIANTS: dict[str, list[str]] = {
    "ssgd": ["algo=ssgd"],
    "dpsgd": ["algo=dpsgd", "topology=ring"],
    "adpsgd": ["algo=adpsgd", "algo.pattern=fixed"],
    "adpsgd_random": ["algo=adpsgd", "algo.pattern=random"],
    # AD-PSGD with its evaluations scored beside training (trainer.eval_in_background), and
    # with its checkpoints taken alone and written beside training too
    "adpsgd_eval_beside": ["algo=adpsgd", "algo.pattern=fixed",
                           "trainer.eval_in_background=true"],
    "adpsgd_all_beside": ["algo=adpsgd", "algo.pattern=fixed",
                          "trainer.eval_in_background=true",
                          "trainer.checkpoint_in_background=true"],
    "adpsgd_delay_by_one": ["algo=adpsgd", "algo.delay_by_one=true"],
    "hadpsgd": ["algo=hadpsgd"],
    "dasgd": ["algo=dasgd"],
    "local_sgd": ["algo=local_sgd"],
    # The peers' algorithms (docs/algorithms.md): SGP, CHOCO-SGD top-1% and 8-bit QSGD on the
    # ring, DiLoCo at two periods.
    "sgp": ["algo=sgp"],
    "sgp_overlap": ["algo=sgp", "algo.overlap=true"],
    "choco_top1": ["algo=choco", "topology=ring", "algo.compression=topk", "algo.ratio=0.01"],
    "choco_qsgd8": ["algo=choco", "topology=ring", "algo.compression=qsgd", "algo.levels=127"],
    "diloco_p10": ["algo=diloco", "algo.period=10"],
    "diloco_p50": ["algo=diloco", "algo.period=50"],
}


def compose(overrides: Sequence[str]) -> Any:
    """The typed config of ``overrides``, composed and validated as adpsgd-run does (a
    mistake is one UserError line)."""
    import recipes  # noqa: F401 - fills the recipe registry, as the commands do
    from runner.commands.compose import compose_all, validate_job

    return validate_job(compose_all(list(overrides), False, "config")[0])


def prepare_cases(root: Path, cases: dict[str, list[str]]) -> dict[str, Path]:
    """Validate every case (one-line UserError before any rank starts), write each run dir's
    ``.hydra/run.yaml`` as adpsgd-run would, and prepare the recipes' data caches."""
    from omegaconf import OmegaConf

    from runner.rank import RUN_CONFIG
    from runner.recipe import RECIPES

    run_dirs, prepared = {}, set()
    for name, overrides in cases.items():
        typed = compose(overrides)
        run_dir = root / name
        for sub in ("tb", "logs", "checkpoints", ".hydra"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        OmegaConf.save(typed, run_dir / RUN_CONFIG)
        recipe_key = json.dumps(OmegaConf.to_container(typed.recipe), sort_keys=True)
        # a timing-only simulation reads no data
        if recipe_key not in prepared and not typed.launcher.get("timing_only"):
            RECIPES.get(typed.recipe.name)(typed.recipe).prepare()
            prepared.add(recipe_key)
        run_dirs[name] = run_dir
    return run_dirs


def completed(run_dir: Path) -> bool:
    path = run_dir / "summary.json"
    return path.exists() and json.loads(path.read_text()).get("status") == "completed"


def read_run(run_dir: Path) -> dict[str, Any]:
    """``{"run_dir", "summary", "metrics"}`` of a finished run dir."""
    from runner.runlog.records import read_metrics

    return {"run_dir": str(run_dir), "summary": json.loads((run_dir / "summary.json").read_text()),
            "metrics": read_metrics(run_dir)}


def simulate_cases(root: Path, cases: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Every case under launcher=sim, in this process, as adpsgd-run's launcher=sim runs it
    (composed and validated by benchmarks.harness.prepare_cases); read_run of each."""
    from runner.launch import LAUNCHERS

    run_dirs = prepare_cases(root, cases)
    runs = {}
    for name, run_dir in run_dirs.items():
        # The validated config, typed as adpsgd-run hands it to the launcher (the saved
        # run.yaml is plain YAML, which the measured cluster cannot be built from).
        cfg = compose(cases[name])
        started = time.perf_counter()
        status = LAUNCHERS.get(cfg.launcher.name)(cfg.launcher).launch(cfg, run_dir)
        if status != 0:
            raise UserError(f"the simulation of {name} ended with status {status}",
                            f"see {run_dir / 'logs' / 'sim.log'}")
        runs[name] = read_run(run_dir)
        print(f"  simulated {name}: {runs[name]['summary']['samples_per_s']:.0f} samples/s "
              f"({time.perf_counter() - started:.1f} s here)", file=sys.stderr, flush=True)
    return runs


def parameter_count(run_dir: str | Path) -> int:
    """Parameters of the model a run dir's config builds."""
    from recipes import RECIPES
    from runner.rank import load_run_config

    cfg = load_run_config(Path(run_dir))
    model = RECIPES.get(cfg.recipe.name)(cfg.recipe).build_model()
    return sum(p.numel() for p in model.parameters())


def rank_command(nprocs: int, program: Sequence[str], placement: dict[str, Any] | None = None
                 ) -> tuple[list[str], dict[str, str]]:
    """``mpiexec -n N python PROGRAM...`` and the environment the local launcher gives its
    ranks (one BLAS thread pool per core, not per rank). ``placement``: launcher keys of a
    job across hosts (hostfile, remote_shell, procs_per_node), placed as the launcher does.
    Where a shared rank factory is up (the test suite's, runner/rank_factory.py), the ranks
    are forks of it, as the launcher's are (``python -m runner.warm_script PROGRAM...``):
    each saves loading torch (1-2 CPU s)."""
    from runner.launch.local import LocalConfig, LocalLauncher
    from runner.rank_factory import FACTORY_ADDRESS, SHARED_FACTORY

    launcher = LocalLauncher(LocalConfig(nprocs=nprocs, **(placement or {})))
    env = launcher.environment()
    shared = os.environ.get(SHARED_FACTORY)
    if shared:
        program, env[FACTORY_ADDRESS] = ["-m", "runner.warm_script", *program], shared
    return launcher.mpiexec_command(list(program), cleanup_by_watchdog=False), env


def run_ranks(nprocs: int, program: Sequence[str], timeout_s: float, what: str,
              placement: dict[str, Any] | None = None) -> str:
    """Run ``python PROGRAM...`` (e.g. ``["benchmarks/harness.py", DIR]``) on ``nprocs`` real
    ranks, placed as :func:`rank_command` says; return its stdout. A failure or a timeout is
    one UserError line with the output's last lines."""
    from runner.launch.stop_forwarding import stop_process_group

    command, env = rank_command(nprocs, program, placement)
    # Its own session, so that a timeout or Ctrl-C stops every rank, not only mpiexec.
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process_group(proc)
        raise UserError(f"{what} on {nprocs} ranks did not finish within {timeout_s:.0f} s",
                        "rerun on a less loaded machine or raise --timeout") from None
    except KeyboardInterrupt:
        stop_process_group(proc)
        raise
    if proc.returncode != 0:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-4:])
        raise UserError(f"{what} on {nprocs} ranks exited with status {proc.returncode} "
                        f"({tail})", "see the run dirs' logs/rank<N>.log")
    return stdout


def run_cases(root: Path, cases: dict[str, list[str]], nprocs: int, timeout_s: float = 3600,
              reuse: bool = False, placement: dict[str, Any] | None = None
              ) -> dict[str, dict[str, Any]]:
    """Train every case (overrides must give ``launcher.nprocs=nprocs``, and the same
    ``placement`` when the job spans hosts) in one job on ``nprocs`` ranks; return
    :func:`read_run` of each. With ``reuse``, cases whose run dir already holds a completed
    summary are read, not trained again."""
    todo = {name: o for name, o in cases.items() if not (reuse and completed(root / name))}
    if todo:
        run_dirs = prepare_cases(root, todo)
        run_ranks(nprocs, [__file__, *(str(run_dirs[n]) for n in todo)],
                  timeout_s, f"training {len(todo)} case(s) under {root}", placement)
    return {name: read_run(root / name) for name in cases}


def main(argv: Sequence[str] | None = None) -> int:
    """Rank side of :func:`run_cases`: train each RUN_DIR in turn, as runner/rank.py would."""
    from runner.rank import run_rank

    logger = logging.getLogger("adpsgd")
    for run_dir in (sys.argv[1:] if argv is None else argv):
        status = run_rank(run_dir, in_process=True)
        for handler in list(logger.handlers):  # the next run dir gets its own rank log
            logger.removeHandler(handler)
            handler.close()
        if status != 0:  # run_rank has already aborted the other ranks
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
