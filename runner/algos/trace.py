"""AD-PSGD's and H-ADPSGD's operations on each learner's model, and their batched execution.

Everything that happens to a participant's model x (a learner; hadpsgd: a super learner) is a
sequence of four operations, the same whether a real run records them (under the model lock,
``algo.record_trace=true``: runner/algos/adpsgd.py, runner/comm/pairwise.py) or the
simulator's schedule produces them (runner/sim/drivers/adpsgd.py)::

    ["read"]                replica <- x                 (the next gradient is taken here)
    ["apply", lr]           x <- SGD step with the gradient at the replica (weight decay at
                            the replica), the members' gradients averaged (hadpsgd)
    ["snap", a, p, k]       this side's snapshot of x for the k-th averaging of active a and
                            passive p
    ["merge", a, p, k]      x <- x + (theirs - mine)/2, both snapshots of that averaging
                            (runner/comm/pairwise.merge_average_, the rule real ranks run)

:class:`TraceExecutor` runs the sequences on the stacked models: reads, snapshots and merges
as soon as their inputs exist, and every participant waiting at an ``apply`` in one batched
gradient call, so N learners cost a few large calls per step rather than N small ones. The
result does not depend on how the sequences interleave, only on each one's order (merges
read snapshots, which are fixed once taken).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ..comm.pairwise import merge_average_
from ..errors import UserError
from .base import sample_weight

READ, APPLY, SNAP, MERGE = "read", "apply", "snap", "merge"
TRACE_NAME = "participant{index}.jsonl"


class TraceExecutor:
    def __init__(self, sim: Any, members: list[list[int]]):
        self.sim, self.members = sim, members
        self.replica = sim.x.clone()
        self.snaps: dict[tuple, dict[int, torch.Tensor]] = {}
        self.merged: dict[tuple, int] = {}
        self.rank_steps = [0] * sim.n  # local steps taken per rank: its data position
        self.samples = 0  # samples of every applied step

    def run(self, ops: list[list[list]]) -> None:
        """Execute every participant's ``ops`` (consumed in place). Each round takes every
        participant's next operation: reads, snapshots and merges whose snapshots exist run
        at once, one batched tensor operation per kind (they touch distinct rows); when none
        can, every participant waiting at an ``apply`` steps in one gradient call."""
        position = [0] * len(ops)
        x = self.sim.x
        while True:
            heads: dict[str, list[int]] = {READ: [], SNAP: [], MERGE: [], APPLY: []}
            for s, sequence in enumerate(ops):
                if position[s] < len(sequence):
                    kind = sequence[position[s]][0]
                    if kind not in heads:
                        raise UserError(f"the exchange trace has an unknown operation "
                                        f"{sequence[position[s]]!r}",
                                        "record the trace again with this version of adpsgd")
                    heads[kind].append(s)
            if not any(heads.values()):
                break
            done: list[int] = []
            if heads[READ]:
                if len(heads[READ]) == len(ops):  # everyone: no gather and scatter
                    self.replica.copy_(x)
                else:
                    index = torch.tensor(heads[READ])
                    self.replica[index] = x[index]
                done += heads[READ]
            if heads[SNAP]:
                rows = x[torch.tensor(heads[SNAP])]  # advanced indexing copies
                for j, s in enumerate(heads[SNAP]):
                    self.snaps.setdefault(tuple(ops[s][position[s]][1:]), {})[s] = rows[j]
                done += heads[SNAP]
            ready = [s for s in heads[MERGE] if len(self.snaps.get(
                tuple(ops[s][position[s]][1:]), {})) == 2]
            if ready:
                self._merge(ready, [tuple(ops[s][position[s]][1:]) for s in ready])
                done += ready
            if not done and heads[APPLY]:
                self._apply(heads[APPLY], [ops[s][position[s]][1] for s in heads[APPLY]])
                done = heads[APPLY]
            if not done:
                s = heads[MERGE][0]
                raise UserError(f"the exchange trace cannot be replayed: participant {s} "
                                f"waits at {ops[s][position[s]]} for a snapshot no one takes",
                                "record the trace again from a complete run")
            for s in done:
                position[s] += 1
        for sequence in ops:
            sequence.clear()

    def _merge(self, participants: list[int], keys: list[tuple]) -> None:
        """x_s <- x_s + (theirs - mine)/2 for every participant whose averaging is done."""
        mine, theirs = [], []
        for s, key in zip(participants, keys):
            taken = self.snaps[key]
            partner = key[1] if s == key[0] else key[0]
            mine.append(taken[s])
            theirs.append(taken[partner])
        merge_average_(self.sim.x, torch.stack(mine), torch.stack(theirs),
                       rows=torch.tensor(participants))
        for key in keys:
            self.merged[key] = self.merged.get(key, 0) + 1
            if self.merged[key] == 2:
                del self.snaps[key], self.merged[key]

    def _apply(self, participants: list[int], lrs: list[float]) -> None:
        sim = self.sim
        ranks, rows, batches, counts = [], [], [], []
        steps = sim.steps_per_epoch
        for s in participants:
            for r in self.members[s]:
                j = self.rank_steps[r]
                batch, count = sim.data.batch(r, j // steps, j % steps)
                ranks.append(r)
                rows.append(s)
                batches.append(batch)
                counts.append(count)
                self.rank_steps[r] += 1
        everyone = len(participants) == len(self.members)
        index = None if everyone else torch.tensor(participants)  # None: every row in place
        models = self.replica if everyone and len(ranks) == len(participants) else \
            self.replica[torch.tensor(rows)]
        grads = sim.gradients(models, ranks, batches, counts)
        size = len(self.members[participants[0]])
        if size > 1:  # a super learner: the mean over its members of c_l L / C_node g_l
            weights = []
            for q in range(len(participants)):  # ranks hold each participant's members in turn
                members = counts[q * size:(q + 1) * size]
                weights += [sample_weight(c, size, sum(members)) for c in members]
            grads = grads * torch.tensor(weights, dtype=grads.dtype).unsqueeze(1)
            grads = grads.view(len(participants), size, -1).mean(1)
        self.samples += sum(counts)
        if index is None:
            decay_at = self.replica
        else:  # one row per participant: the models the gradients were taken at
            decay_at = models if size == 1 else self.replica[index]
        sim.apply_update(index, grads, torch.tensor(lrs, dtype=torch.float64),
                         decay_at=decay_at)


def write_trace(directory: Path, index: int, ops: list[list]) -> Path:
    """One participant's operations, a JSON array per line, and a last line with the SHA-256
    of the lines before it (a damaged file is refused, not replayed differently)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / TRACE_NAME.format(index=index)
    body = "".join(json.dumps(op) + "\n" for op in ops)
    digest = hashlib.sha256(body.encode()).hexdigest()
    path.write_text(body + json.dumps({"sha256": digest}) + "\n")
    return path


def read_traces(directory: str | Path, participants: int) -> list[list[list]]:
    """Every participant's recorded operations (one line per operation)."""
    directory = Path(directory)
    ops = []
    for index in range(participants):
        path = directory / TRACE_NAME.format(index=index)
        if not path.exists():
            raise UserError(f"{path} is missing: the trace in {directory} is not from a run "
                            f"with {participants} participants",
                            "replay with the recording run's launcher.nprocs and "
                            "procs_per_node")
        try:
            lines = path.read_text().splitlines(keepends=True)
            body, trailer = "".join(lines[:-1]), json.loads(lines[-1]) if lines else {}
            intact = hashlib.sha256(body.encode()).hexdigest() == trailer.get("sha256")
            if intact:
                ops.append([json.loads(line) for line in lines[:-1]])
        except (ValueError, UnicodeDecodeError, AttributeError):
            intact = False
        if not intact:
            raise UserError(f"{path} is damaged or incomplete (its checksum does not match)",
                            "record the trace again (algo.record_trace=true)")
    return ops
