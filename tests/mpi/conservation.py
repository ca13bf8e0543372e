"""mpiexec -n 4 python conservation.py RUN_DIR CASES_JSON: AD-PSGD and H-ADPSGD learning for
real (float64, learning rate > 0, momentum and weight decay, random per-step delays, rank 3 ten
times slower, evaluations and checkpoints that pause the gossip).

Every change to a learner's model x is recorded under its lock: each optimizer step (the
update it applied) and each merge. Then, over the learners (ranks for adpsgd, node leaders for
hadpsgd):

* conservation: sum_i x_i(end) = sum_i x_i(0) + sum of every applied update, to 1e-10
  relative: averaging moved no mass, whatever the timing;
* every snapshot a learner sent was a state its x really had (its digest is among the
  digests of x after each change), and in the k-th exchange of a pair each end received
  exactly the snapshot the other end sent: both averaged the same two vectors.
"""

import hashlib
import threading

import torch

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks

TOLERANCE = 1e-10


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


class Recorder:
    """Wraps a leader's update, snapshot and merge to record what they did to x."""

    def __init__(self, algo):
        self.algo, self.averager = algo, algo.averager
        lock = threading.RLock()  # the wrappers hold it around the originals, which take it
        algo.lock = self.averager.lock = lock
        self.lock = lock
        self.applied = [torch.zeros_like(t) for t in algo.x]
        self.states = {digest(algo.x)}
        self.snapshots_existed = []
        self.exchanges = []  # (peer, digest sent, digest received), in order
        self._wrap()

    def _wrap(self):
        algo, averager = self.algo, self.averager
        apply_update, snapshot, merge = algo.apply_update, averager._snapshot, averager._merge

        def recorded_update(optimizer):
            with self.lock:
                before = [t.clone() for t in algo.x]
                apply_update(optimizer)
                for total, now, then in zip(self.applied, algo.x, before):
                    total.add_(now - then)
                self.states.add(digest(algo.x))

        def recorded_snapshot():
            with self.lock:
                counts = snapshot()
                self.snapshots_existed.append(digest(averager.snapshots) in self.states)
                return counts

        def recorded_merge(their_counts, peer, started):
            with self.lock:
                # _merge turns the received buffers into (received - sent) in place.
                sent, got = digest(averager.snapshots), digest(averager.received)
                merge(their_counts, peer, started)
                self.states.add(digest(algo.x))
                self.exchanges.append((peer, sent, got))

        algo.apply_update = recorded_update
        averager._snapshot = recorded_snapshot
        averager._merge = recorded_merge


def checks(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([
        *overrides, "launcher.nprocs=4", "trainer.dtype=float64", "optim.momentum=0.9",
        "optim.weight_decay=1e-4", "faults.straggler.ranks=[3]", "faults.straggler.factor=10",
        "faults.delay_s=0.004", "trainer.epochs=2", "trainer.batch_size=32",
        "trainer.eval_every=5", "trainer.checkpoint_every=7"])
    assert cfg.optim.lr > 0
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    algo = trainer.algo
    recorder = Recorder(algo) if algo.averager else None
    start = [t.clone() for t in algo.x]
    summary = trainer.run()
    node.close()
    leader = recorder is not None
    mine = None
    if leader:
        moved = [end - begin for end, begin in zip(algo.x, start)]
        mine = {"participant": algo.averager.rank, "start": start, "x": [t.clone() for t in
                                                                         algo.x],
                "applied": recorder.applied, "moved": moved,
                "exchanges": recorder.exchanges, "existed": recorder.snapshots_existed}
    learners = sorted((r for r in comm.allgather_objects(mine) if r), key=lambda r:
                      r["participant"])
    comm.close()
    if trainer.world.is_main:
        assert summary["status"] == "completed"
    assert len(learners) == (2 if cfg.algo.name == "hadpsgd" else 4)
    # Conservation: the sum of the models moved by exactly the sum of the updates applied.
    worst = 0.0
    for i in range(len(start)):
        total_start = sum(r["start"][i] for r in learners)
        total_end = sum(r["x"][i] for r in learners)
        applied = sum(r["applied"][i] for r in learners)
        error = (total_end - (total_start + applied)).norm() / total_start.norm()
        worst = max(worst, float(error))
        # ...and the learning was real: the models moved, by more than rounding.
        assert float(applied.norm()) > 1e-3 * float(total_start.norm())
    assert worst < TOLERANCE, f"sum of the models off by {worst:.3g} (relative)"
    # Snapshots that existed, and both ends of every exchange averaging the same two vectors.
    for r in learners:
        assert r["existed"] and all(r["existed"]), f"learner {r['participant']}: a snapshot " \
            "that x never held"
    pairs = 0
    for r in learners:
        for peer in {p for p, _, _ in r["exchanges"]}:
            mine_ = [(s, g) for p, s, g in r["exchanges"] if p == peer]
            theirs = [(s, g) for p, s, g in learners[peer]["exchanges"]
                      if p == r["participant"]]
            assert len(mine_) == len(theirs), (r["participant"], peer)
            for (sent, got), (their_sent, their_got) in zip(mine_, theirs):
                assert got == their_sent and their_got == sent, (r["participant"], peer)
            pairs += len(mine_)
    steps = [s for s in summary.get("steps_per_rank", [])] if summary else []
    return (f"conserved to {worst:.2e}, {pairs // 2} exchanges matched, "
            f"{sum(len(r['existed']) for r in learners)} snapshots existed"
            + (f", steps {steps}" if steps else ""))


run_cases_on_ranks(checks)
