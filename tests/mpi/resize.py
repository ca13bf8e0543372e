"""mpiexec -n 4 python resize.py RUN_DIR CASES_JSON: a run checkpointed by 4 ranks goes on with
2, is checkpointed again and ends on 4 (runner/checkpoint/resize.py).

Per case: A, 4 ranks from scratch to the end, a checkpoint every few steps; B, ranks 0-1 only,
resumed from a checkpoint of A in the middle of an epoch, to the end; C, 4 ranks, resumed from
a checkpoint of B in the middle of an epoch, to the end. Every rank records the dataset
indices of each batch it trains on, with the epoch. Checked:

* each resize uses every sample of the interrupted epochs once: what the old ranks had read of
  their epoch before the checkpoint plus what the new ranks read in their first (partial)
  pass is, as a multiset, the old ranks' whole epoch shards;
* the resumed sessions start from the mean of the checkpoint's models and reach the budget;
* C's final held-out top-1 is within the spread of A's (the uninterrupted run's).
"""

from collections import Counter

from runner.checkpoint.files import complete_checkpoints, load_rank_state
from runner.comm.communicator import Communicator
from runner.train.data import ShardedBatches

from harness import build_trainer, compose_config, run_cases_on_ranks

BASE = ["trainer.epochs=4", "trainer.batch_size=32", "trainer.checkpoint_every=5",
        "trainer.keep_checkpoints=100", "optim.momentum=0.9"]
# Held-out top-1 (%) of C may fall this far below A's. Both are single runs of a short budget
# on 359 held-out digits: over 31 pairs (seeds 0-4 of the five algorithms, quiet and loaded
# machine) C - A had mean +0.38 and standard deviation 1.75 points, its lowest -5.57 (AD-PSGD
# on a loaded machine). The bound is 4 standard deviations. What it does not catch, the data
# check above and tests/test_resize.py do: a resize that jumped to the doubled learning rate
# lost 6-56 points (seed 2, 3 epochs).
# At the recipe's rate the asynchronous algorithms have a longer tail (2026-11-28, beside 2
# busy processes): AD-PSGD's C - A reached -4.74 in 10 pairs, and CI saw -7.5 (C fell mid-run
# to 88.3); one H-ADPSGD A of 10 ended at 84.1. At optim.lr=0.2, which tests/test_resize_mpi.py
# gives them, 28 AD-PSGD pairs (8 quiet, 20 loaded) had mean -0.51, standard deviation 1.12,
# lowest -3.62, and 10 loaded H-ADPSGD pairs mean -1.00, standard deviation 1.02, lowest -2.50.
TOP1_SPREAD = 7.0


def train(mpi_comm, run_dir, overrides):
    """One session on the ranks of ``mpi_comm``; returns the trainer, its summary (rank 0)
    and what this rank read: [(epoch, indices)] per batch, and how many batches it had read
    at each checkpoint (by the checkpoint's samples)."""
    comm = Communicator(mpi_comm, "mpi")
    cfg = compose_config([*BASE, f"launcher.nprocs={mpi_comm.Get_size()}", *overrides])
    trainer, node = build_trainer(mpi_comm, comm, run_dir, cfg)
    read, at_checkpoint = [], {}
    iterate, rank_state = trainer.fetch.iterate, trainer._rank_state

    def recording_iterate(batches):
        for indices, batch in zip(batches, iterate(batches)):
            read.append((trainer.state.position[0], indices.copy()))
            yield batch

    def recording_rank_state():
        at_checkpoint[trainer.state.samples] = len(read)
        return rank_state()

    trainer.fetch.iterate, trainer._rank_state = recording_iterate, recording_rank_state
    summary = trainer.run()
    node.close()
    comm.close()
    return trainer, summary, (read, at_checkpoint)


def mid_epoch(run_dir):
    """The first complete checkpoint of a run dir that is not at an epoch's end."""
    found = [c for c in complete_checkpoints(run_dir)
             if load_rank_state(c, 0)["trainer"]["position"][1] != 0]
    assert found, f"no checkpoint inside an epoch in {run_dir}"
    return found[0]


def interrupted_epoch(checkpoint, old_reads, new_reads, train_size, seed):
    """(what the old ranks read of their epoch + what the new ranks read of the partial
    pass) against the old ranks' whole epoch shards, both as multisets of indices."""
    read_before, whole = [], []
    for rank, (read, at_checkpoint) in enumerate(old_reads):
        state = load_rank_state(checkpoint, rank)
        epoch, step = state["trainer"]["position"]
        shards = ShardedBatches(train_size, rank, checkpoint.nprocs, 32, seed)
        shards.load_state_dict(state.get("data", {}))
        shard = [i for batch in shards.epoch_batches(epoch) for i in batch.tolist()]
        before = read[:at_checkpoint[checkpoint.samples]]
        mine = [i for e, batch in before if e == epoch for i in batch.tolist()]
        assert len(mine) == min(step * 32, len(shard)), (rank, len(mine), step)
        whole += shard
        read_before += mine
    partial_epoch = min(epoch for read, _ in new_reads for epoch, _ in read)
    read_after = [i for read, _ in new_reads for e, batch in read if e == partial_epoch
                  for i in batch.tolist()]
    return Counter(read_before + read_after), Counter(whole)


def checks(world_mpi, run_dir, overrides):
    rank = world_mpi.Get_rank()
    a, a_summary, a_read = train(world_mpi, f"{run_dir}/a", overrides)
    train_size = len(a.train_set)
    a_reads = world_mpi.allgather(a_read)
    first = mid_epoch(f"{run_dir}/a")

    pair = world_mpi.Split(0 if rank < 2 else 1, rank)
    b_read = None
    if rank < 2:
        b, b_summary, b_read = train(pair, f"{run_dir}/b", [*overrides, f"resume={first.path}"])
        assert b.world.size == 2 and b.resumed_from.path == first.path
    pair.Free()
    b_reads = [r for r in world_mpi.allgather(b_read) if r is not None]
    got, expected = interrupted_epoch(first, a_reads, b_reads, train_size, a.cfg.seed)
    assert got == expected, (f"4 -> 2: {sum((got - expected).values())} reads too many, "
                             f"{sum((expected - got).values())} samples never read")

    second = world_mpi.bcast(mid_epoch(f"{run_dir}/b") if rank == 0 else None)
    c, c_summary, c_read = train(world_mpi, f"{run_dir}/c", [*overrides,
                                                             f"resume={second.path}"])
    c_reads = world_mpi.allgather(c_read)
    got, expected = interrupted_epoch(second, b_reads, c_reads, train_size, a.cfg.seed)
    assert got == expected, (f"2 -> 4: {sum((got - expected).values())} reads too many, "
                             f"{sum((expected - got).values())} samples never read")
    if rank != 0:
        return "resized 4 -> 2 -> 4"
    assert c_summary["status"] == "completed", c_summary["status"]
    assert c_summary["samples"] >= 4 * train_size, c_summary["samples"]
    # The ledger went through both checkpoints: every epoch used each sample once (lockstep
    # algorithms; asynchronous ranks each cycle through their own shard and keep none).
    assert c_summary["epoch_samples"] == (None if c.algo.asynchronous else [
        {"epoch": e, "distinct": train_size, "used": train_size}
        for e in range(1, c.cfg.trainer.epochs + 1)]), c_summary["epoch_samples"]
    top1, baseline = c_summary["final"]["top1"], a_summary["final"]["top1"]
    assert top1 >= baseline - TOP1_SPREAD, (top1, baseline)
    return (f"4 -> 2 at {first.samples} samples, 2 -> 4 at {second.samples}: every sample of "
            f"both interrupted epochs read once; top-1 {top1:.2f} (uninterrupted "
            f"{baseline:.2f})")


run_cases_on_ranks(checks)
