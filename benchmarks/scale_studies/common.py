"""What the studies share: the grown-digits workload, running cases in the simulator, the
learning-rate rule and reading a run's held-out curve."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from .. import harness as bench

REPO = Path(__file__).resolve().parents[2]

RESULTS = REPO / "docs" / "results" / "scale"

# A small CNN (38k parameters): big enough to show gradient noise and consensus effects,
# small enough for 128 learners on a CPU.
STUDY_MODEL = ["recipe.channels=[16,32]", "recipe.hidden=64"]
# n x b is a tenth of an epoch at 128 x 16 (docs/scale_studies.md, The workload)
TRAIN_SIZE, HELDOUT_SIZE = 20480, 3590


def digits(train_size: int, heldout_size: int) -> list[str]:
    """The grown digit-images workload (0, 0: the 1,437 and 359 originals)."""
    return ["recipe=digit_images", f"recipe.train_size={train_size}",
            f"recipe.heldout_size={heldout_size}", *STUDY_MODEL]


def sqrt_scaled_lr(base: float, n: int, batch_size: int) -> float:
    """``base`` at a global batch of 256, scaled by the square root of n x b / 256."""
    return round(base * math.sqrt(n * batch_size / 256), 4)


def already_run(run_dir: Path, cfg: Any) -> bool:
    """A completed run of exactly this config (a run dir left by other settings is not)."""
    from omegaconf import OmegaConf

    from runner.rank import RUN_CONFIG

    if not bench.completed(run_dir) or not (run_dir / RUN_CONFIG).exists():
        return False
    saved = OmegaConf.to_container(OmegaConf.load(run_dir / RUN_CONFIG))
    return saved == OmegaConf.to_container(cfg)


def simulate(root: Path, cases: dict[str, list[str]],
             divergence_is_a_result: bool = False) -> dict[str, dict[str, Any]]:
    """Run every case under launcher=sim in this process (a completed run dir of the same
    config is kept) and return :func:`benchmarks.harness.read_run` of each. With
    ``divergence_is_a_result``, a run stopped by a non-finite loss is returned as
    ``{"run_dir", "summary": None, "metrics": [], "diverged": the one-line error}`` (and run
    again next time) instead of ending the study."""
    from runner.errors import UserError
    from runner.sim.engine import Simulation
    from runner.sim.timing import TimingSimulation

    configs = {name: bench.compose(overrides) for name, overrides in cases.items()}
    todo = {name: cases[name] for name in cases if not already_run(root / name, configs[name])}
    for name in todo:  # a run of other settings, or an unfinished one: its metrics.jsonl and
        shutil.rmtree(root / name, ignore_errors=True)  # events would be appended to
    run_dirs = bench.prepare_cases(root, todo) if todo else {}
    diverged = {}
    for name, run_dir in run_dirs.items():
        print(f"{name} ...", flush=True)
        cfg = configs[name]
        kind = TimingSimulation if cfg.launcher.timing_only else Simulation
        try:
            kind(cfg, run_dir).run()
        except UserError as error:
            if not (divergence_is_a_result and str(error).startswith("non-finite")):
                raise
            print(f"{name}: {error}", flush=True)
            diverged[name] = {"run_dir": str(run_dir), "summary": None, "metrics": [],
                              "diverged": str(error)}
    return {name: diverged.get(name) or bench.read_run(root / name) for name in cases}


def curve(run: dict[str, Any]) -> list[dict[str, float]]:
    """The held-out evaluations of a run: epoch, virtual seconds, top-1, loss, consensus
    distance."""
    return [{"epoch": round(row["epoch"], 3), "wall_s": row.get("wall_s"), "top1": row["top1"],
             "loss": row["loss"], "consensus_distance": row.get("consensus_distance")}
            for row in run["metrics"] if row.get("split") == "eval"]
