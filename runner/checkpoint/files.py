"""Checkpoints on disk: layout, atomic writes, the completion marker, choosing one to resume.

Layout (one directory per checkpoint, named by the global samples consumed so that names sort
by progress and two checkpoints of the same state have the same name)::

    RUN_DIR/checkpoints/samples-0000001437/rank0.pt ... rank<N-1>.pt   every rank's own state
    RUN_DIR/checkpoints/samples-0000001437/COMPLETE                    written last, by rank 0

A rank's file holds its model (decentralized replicas differ), optimizer state, RNG states,
data position, counters and its algorithm's state (runner/trainer/ decides what). Each file is
written to a temporary name in the same directory, flushed, fsynced and renamed, and the
directory is fsynced; rank 0 writes ``COMPLETE`` only after a barrier that every rank reaches
once its file is durable. A job killed at any moment therefore leaves either a complete
checkpoint or one without a marker, which resuming ignores, and the previous complete
checkpoints are never touched until a newer one is complete (only then are old ones pruned to
``trainer.keep_checkpoints``).

``COMPLETE`` is JSON with the step, samples, epoch, number of ranks, the run config (so the
command line can check that a checkpoint fits the job before any rank starts) and the SHA-256
and size of every rank's file. Loading a rank file checks them: a file changed after it was
written (a flipped byte, a same-size overwrite, a truncation) is named and refused, and a
resume falls back to the newest intact checkpoint (runner/checkpoint/checkpointer.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError, UserError, one_line

CHECKPOINTS = "checkpoints"
MARKER = "COMPLETE"
PREFIX = "samples-"
# Keys whose values must match between a checkpoint and the job resuming from it: they shape
# the state it holds (model, algorithm state, data order, per-rank files) or what a rank reads
# and evaluates (every recipe key: the data, its split into training and held-out parts, the
# features, the decoding). The learning-rate options, epochs, evaluation frequency and logging
# may change (e.g. a lower rate after a divergence), and so may the keys in MAY_CHANGE.
IDENTITY_KEYS = ("recipe", "algo", "topology", "seed", "trainer.batch_size", "trainer.dtype",
                 "launcher.procs_per_node")
MAY_CHANGE = ("algo.timeout_s", "recipe.data.cache_dir", "recipe.data.prepare_workers",
              "recipe.examples")


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint, as its marker describes it."""

    path: Path
    step: int
    samples: int
    epoch: float
    nprocs: int
    reason: str
    config: dict[str, Any]
    # rank file name -> {"sha256", "bytes"}; None for checkpoints written before checksums
    files: dict[str, dict[str, Any]] | None = None

    def rank_file(self, rank: int) -> Path:
        return self.path / f"rank{rank}.pt"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_path(run_dir: str | Path, samples: int) -> Path:
    return checkpoints_dir(run_dir) / f"{PREFIX}{samples:010d}"


def read_checkpoint(path: str | Path) -> Checkpoint | None:
    """The checkpoint at ``path``, or None when it is not complete (no readable marker)."""
    path = Path(path)
    try:
        meta = json.loads((path / MARKER).read_text())
        return Checkpoint(path=path, step=int(meta["step"]), samples=int(meta["samples"]),
                          epoch=float(meta["epoch"]), nprocs=int(meta["nprocs"]),
                          reason=str(meta.get("reason", "")), config=dict(meta["config"]),
                          files=dict(meta["files"]) if "files" in meta else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def complete_checkpoints(run_dir: str | Path) -> list[Checkpoint]:
    """Every complete checkpoint of a run dir, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = (read_checkpoint(p) for p in root.iterdir() if p.name.startswith(PREFIX))
    return sorted((c for c in found if c is not None), key=lambda c: c.samples)


def resolve_resume(resume: str | None, run_dir: str | Path) -> Checkpoint | None:
    """The checkpoint that ``resume`` (null, auto or a path) selects; None: a fresh start."""
    if resume is None:
        return None
    if resume == "auto":
        found = complete_checkpoints(run_dir)
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise ConfigError("resume", f"checkpoint dir {path} does not exist",
                          "give a checkpoint dir (RUN_DIR/checkpoints/samples-N), or "
                          "resume=auto with hydra.run.dir=RUN_DIR")
    found = read_checkpoint(path)
    if found is None:
        # Also a run dir or its checkpoints/ given for a checkpoint: point at its newest one.
        run_dir = (path.parent.parent if path.parent.name == CHECKPOINTS else
                   path.parent if path.name == CHECKPOINTS else path)
        newest = complete_checkpoints(run_dir)
        fix = (f"resume={newest[-1].path}, the newest complete one" if newest else
               "resume=auto hydra.run.dir=RUN_DIR, which takes the newest complete checkpoint "
               "of RUN_DIR")
        raise ConfigError("resume", f"{path} is not a complete checkpoint (no {MARKER} marker: "
                          "its write was interrupted, or it is not a checkpoint dir)", fix)
    return found


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def check_compatible(checkpoint: Checkpoint, cfg: Mapping[str, Any], averaged: bool) -> None:
    """Raise ConfigError (naming the first differing key) when ``checkpoint`` was written by a
    job whose state cannot continue in the job configured by ``cfg``. Another number of ranks
    is fine (runner/checkpoint/resize.py), except for a simulated run; ``averaged``
    (``resume_averaged``) also lets everything but the recipe change."""
    theirs, ours = _flat(checkpoint.config), _flat(cfg)
    simulated = theirs.get("launcher.name") == "sim"
    if simulated != (ours.get("launcher.name") == "sim"):  # one file of every learner, or not
        written = "launcher=sim" if simulated else f"launcher={theirs.get('launcher.name')}"
        raise ConfigError("resume", f"checkpoint {checkpoint.path} was written with {written}, "
                          f"this job has launcher={ours.get('launcher.name')}",
                          f"resume with {written}, or start a new run dir (hydra.run.dir="
                          "NEW_DIR)")
    nprocs = cfg["launcher"]["nprocs"]
    if simulated and checkpoint.nprocs != nprocs:
        raise ConfigError("resume", f"checkpoint {checkpoint.path} holds {checkpoint.nprocs} "
                          f"simulated learners, this job has launcher.nprocs={nprocs}",
                          f"launcher.nprocs={checkpoint.nprocs} (a simulated run resumes with "
                          "its own learners), or start a new run dir (hydra.run.dir=NEW_DIR)")
    keys = ("recipe",) if averaged else IDENTITY_KEYS
    # Group choices (algo.name...) first: another algorithm's options differ as a consequence.
    for key in sorted((k for k in set(theirs) | set(ours)
                       if any(k == p or k.startswith(p + ".") for p in keys)
                       and k not in MAY_CHANGE), key=lambda k: (k.count(".") != 1
                                                                 or not k.endswith(".name"), k)):
        if theirs.get(key) != ours.get(key):
            written = _as_override(key, theirs.get(key))
            raise ConfigError("resume", f"checkpoint {checkpoint.path} was written with "
                              f"{written}, this job has {_as_override(key, ours.get(key))}",
                              f"resume with {written}, or start a new run dir "
                              f"(hydra.run.dir=NEW_DIR) for the new settings")


def _as_override(key: str, value: Any) -> str:
    """How the command line sets ``key``: a config group's choice is ``algo=ssgd``
    (``algo.name=ssgd`` would keep the other algorithm's options)."""
    group, _, leaf = key.partition(".")
    return f"{group}={value}" if leaf == "name" else f"{key}={value}"


# ---- writing -------------------------------------------------------------------------------
def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[IO[bytes]], None], delay_s: float = 0.0) -> None:
    """Write ``path`` through a temporary file in the same directory: fsync, rename, fsync the
    directory. ``delay_s`` (faults.checkpoint_write_delay_s, tests only) pauses after the
    temporary file is written and before the rename. A failed write removes the temporary
    file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if delay_s:
                time.sleep(delay_s)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as ex:
        tmp.unlink(missing_ok=True)  # a full disk (or a stop) leaves no partial file
        if isinstance(ex, OSError) and ex.filename is None:  # name what was being written
            raise OSError(ex.errno, ex.strerror, str(path)) from ex
        raise
    fsync_dir(path.parent)


def save_rank_state(directory: Path, rank: int, state: dict[str, Any],
                    delay_s: float = 0.0) -> dict[str, Any]:
    """Write one rank's state into a checkpoint dir (created when missing); return the
    file's name, SHA-256 and size, for the marker."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rank{rank}.pt"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    write_atomic(path, lambda f: f.write(payload), delay_s)
    return {"name": path.name, "sha256": hashlib.sha256(payload).hexdigest(),
            "bytes": len(payload)}


def mark_complete(directory: Path, step: int, samples: int, epoch: float, nprocs: int,
                  reason: str, config: dict[str, Any],
                  files: list[dict[str, Any]] | None = None) -> Checkpoint:
    """Rank 0, after every rank's file is durable: write the marker that makes it count,
    with every rank file's checksum (``files``: what save_rank_state returned, per rank)."""
    listed = {f["name"]: {"sha256": f["sha256"], "bytes": f["bytes"]} for f in files or []}
    if files is not None:
        # A dir written again by fewer ranks (an elastic job redoing the step that lost a
        # learner) holds only what its marker lists.
        for stray in [*directory.glob("rank*.pt"), *directory.glob(".rank*.pt.tmp*")]:
            if stray.name not in listed:
                stray.unlink()
    meta = {"step": step, "samples": samples, "epoch": epoch, "nprocs": nprocs,
            "reason": reason, "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": config,
            "files": listed}
    payload = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    write_atomic(directory / MARKER, lambda f: f.write(payload))
    return Checkpoint(path=directory, step=step, samples=samples, epoch=epoch, nprocs=nprocs,
                      reason=reason, config=config, files=listed)


def prune(run_dir: str | Path, keep: int) -> list[Path]:
    """Remove all but the ``keep`` newest complete checkpoints, and every incomplete one
    (left by a crash) older than the newest complete one; return what was removed."""
    complete = complete_checkpoints(run_dir)
    if not complete:
        return []
    kept = {c.path for c in complete[-keep:]}
    newest = complete[-1].samples
    removed = []
    for path in sorted(checkpoints_dir(run_dir).glob(f"{PREFIX}*")):
        incomplete_and_old = read_checkpoint(path) is None and _samples_of(path) < newest
        if path not in kept and (read_checkpoint(path) is not None or incomplete_and_old):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove_partial_checkpoints(run_dir: str | Path) -> list[Path]:
    """After every rank of a job is gone: remove what a write cut short (temporary files,
    and checkpoint dirs without their marker, which resuming ignores anyway); return them."""
    removed = []
    root = checkpoints_dir(run_dir)
    for path in sorted(root.glob(f"{PREFIX}*")) if root.is_dir() else []:
        if read_checkpoint(path) is None:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        else:
            for tmp in path.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    return removed


def _samples_of(path: Path) -> int:
    try:
        return int(path.name.removeprefix(PREFIX))
    except ValueError:
        return -1


# ---- reading -------------------------------------------------------------------------------
class DamagedCheckpoint(UserError):
    """A rank file of a complete checkpoint that no longer is what was written."""

    def __init__(self, path: Path, problem: str, fix: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path} is damaged ({problem}; it changed after the checkpoint was "
                         "complete)", fix)


def complete_before(checkpoint: Checkpoint) -> Checkpoint | None:
    """The newest complete checkpoint of the same run dir before ``checkpoint``."""
    older = [c for c in complete_checkpoints(checkpoint.path.parent.parent)
             if c.samples < checkpoint.samples]
    return older[-1] if older else None


def intact_older(checkpoint: Checkpoint) -> Checkpoint | None:
    """The newest complete checkpoint before ``checkpoint`` whose rank files still match
    their checksums (read in full: for a message, not for a hot path)."""
    return newest_intact(checkpoint.path.parent.parent, before=checkpoint.samples)


def newest_intact(run_dir: str | Path, before: int | None = None) -> Checkpoint | None:
    """The newest complete checkpoint (before ``before`` samples) whose rank files still
    match their checksums: what ``resume=auto`` loads (read in full: for a message or a
    restart's decision, not for a hot path)."""
    for checkpoint in reversed(complete_checkpoints(run_dir)):
        if (before is None or checkpoint.samples < before) and all(
                _damage(checkpoint, rank) is None for rank in range(checkpoint.nprocs)):
            return checkpoint
    return None


def _damage(checkpoint: Checkpoint, rank: int, data: bytes | None = None) -> str | None:
    """Why a rank file does not match what its marker recorded, or None."""
    path = checkpoint.rank_file(rank)
    expected = (checkpoint.files or {}).get(path.name)
    try:
        data = path.read_bytes() if data is None else data
    except OSError as ex:
        return f"unreadable: {ex.strerror or ex}"
    if expected is None:
        return None  # written before checksums: nothing to compare with
    if len(data) != expected["bytes"]:
        return f"it has {len(data)} bytes, not the size recorded when it was written"
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        return "its SHA-256 differs from the one recorded when it was written"
    return None


def load_rank_state(checkpoint: Checkpoint, rank: int) -> dict[str, Any]:
    """One rank's state, after checking the file against the marker's checksum. Only tensors
    and plain Python values are unpickled (``weights_only``): loading a checkpoint cannot run
    code. A damaged file raises :class:`DamagedCheckpoint`, naming it and the newest intact
    checkpoint before it."""
    import pickle

    import torch

    path = checkpoint.rank_file(rank)
    try:
        data = path.read_bytes()
        problem = _damage(checkpoint, rank, data)
        if problem is None:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as ex:
        problem = f"{type(ex).__name__}: {one_line(ex).split('. ')[0][:160]}"
    # COMPLETE is written after every file was durable: the file changed since.
    older = intact_older(checkpoint)
    fix = (f"resume={older.path}, the newest intact checkpoint before it" if older else
           "start a new run dir without resume")
    raise DamagedCheckpoint(path, problem, fix) from None
