"""Resuming with another number of ranks, piece by piece (runner/checkpoint/resize.py): the merged
start state from real checkpoint files, the partial pass that deals the rest of an epoch, the
learning-rate ramp, and which checkpoints may be resized. tests/test_resize_mpi.py runs it
on real ranks."""

from collections import Counter

import pytest
import torch
from omegaconf import OmegaConf

from runner.checkpoint.files import check_compatible, mark_complete, save_rank_state
from runner.checkpoint.resize import merge_ranks, start_here
from runner.config.run_schema import OptimConfig
from runner.errors import ConfigError
from runner.train.data import ShardedBatches
from runner.train.lr_schedule import LRSchedule
from runner.train.run_state import RunState

TRAIN, BATCH, SEED = 103, 4, 7
CONFIG = {"launcher": {"name": "local", "nprocs": 3}, "algo": {"name": "adpsgd"}}


def rank_state(rank: int, position: tuple[int, int], gossips: bool) -> dict:
    """What a rank's checkpoint file holds, with values that tell the ranks apart."""
    algo = {"x": [torch.full((3,), float(rank))], "staleness": torch.tensor([rank])}
    if gossips:  # only some ranks have some keys (H-ADPSGD's leaders)
        algo["gossip"] = {"partners": {rank: rank + 1}}
    return {"model": {"w": torch.full((2, 2), 2.0 * rank), "count": torch.tensor(10 + rank)},
            "optimizer": {"state": {0: {"momentum_buffer": torch.full((2,), 3.0 * rank)}},
                          "param_groups": [{"lr": 0.1, "params": [0]}]},
            "algo": algo,
            "trainer": {"step": 20 + rank, "samples": 0, "position": list(position),
                        "skipped_batches": 0, "elapsed_s": 5.0 + rank,
                        "timers": {"eval": 1.0, "checkpoint": 2.0, "compute": 9.0},
                        "last_milestone": [40, "checkpoint"], "lr": 0.05},
            "data": {}, "history": [{"epoch": 1}] if rank == 0 else None}


@pytest.fixture
def checkpoint(tmp_path):
    """3 asynchronous ranks at different places: rank 0 in epoch 1, ranks 1-2 in epoch 2."""
    positions = [(1, 3), (2, 0), (2, 5)]
    directory = tmp_path / "checkpoints" / "samples-0000000250"
    files = [save_rank_state(directory, r, rank_state(r, positions[r], gossips=r != 1))
             for r in range(3)]
    return mark_complete(directory, 20, 250, 2.4, 3, "scheduled", CONFIG, files), positions


def test_the_merged_state_is_the_mean_of_the_ranks_with_rank_0s_counters(checkpoint):
    found, _ = checkpoint
    merged = merge_ranks(found, TRAIN, BATCH, SEED)
    assert torch.equal(merged["model"]["w"], torch.full((2, 2), 2.0))  # mean of 0, 2, 4
    assert merged["model"]["count"].item() == 10  # integers: rank 0's
    momentum = merged["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, torch.full((2,), 3.0))
    assert torch.equal(merged["algo"]["x"][0], torch.full((3,), 1.0))
    assert merged["algo"]["gossip"]["partners"] == {0: 1}  # a key rank 1 lacked: kept
    assert merged["trainer"]["samples"] == 250 and merged["trainer"]["step"] == 20
    assert merged["trainer"]["lr"] == 0.05 and merged["history"] == [{"epoch": 1}]
    assert merged["algo_name"] == "adpsgd"


def test_the_partial_pass_holds_exactly_what_the_old_ranks_had_not_read(checkpoint):
    found, positions = checkpoint
    merged = merge_ranks(found, TRAIN, BATCH, SEED)
    old = ShardedBatches(TRAIN, 0, 3, BATCH, SEED)
    read, whole = [], []
    for rank, (epoch, step) in enumerate(positions):
        batches = old.epoch_batches(epoch, rank)
        read += [i for b in batches[:step] for i in b.tolist()]
        whole += [i for b in batches for i in b.tolist()]
    new_reads, local = [], []
    for rank in range(2):  # dealt over 2 new ranks
        state, shards = RunState(), ShardedBatches(TRAIN, rank, 2, BATCH, SEED)
        start_here(merged, state, shards)
        epoch, step = state.position
        assert (epoch, step) == (2, 0) and state.samples == 250
        local.append(state.local_samples)
        batches = shards.epoch_batches(epoch)
        assert len(batches) == shards.steps_in(epoch)
        new_reads += [i for b in batches for i in b.tolist()]
        assert sum(shards.counts(k, epoch)[rank] for k in range(len(batches))) == \
            sum(len(b) for b in batches)
        # the pass after it is whole again
        assert sorted(i for b in shards.epoch_batches(3) for i in b.tolist()) == \
            sorted(shards.pass_order(3)[rank::2].tolist())
    assert Counter(read + new_reads) == Counter(whole)
    assert sum(local) == 250  # the new ranks' own counts add up to the global one


def test_ranks_all_at_an_epoch_start_deal_that_epoch_whole(tmp_path):
    directory = tmp_path / "checkpoints" / "samples-0000000206"
    files = [save_rank_state(directory, r, rank_state(r, (2, 0), gossips=True))
             for r in range(3)]
    found = mark_complete(directory, 20, 206, 2.0, 3, "scheduled", CONFIG, files)
    merged = merge_ranks(found, TRAIN, BATCH, SEED)
    state, shards = RunState(), ShardedBatches(TRAIN, 1, 2, BATCH, SEED)
    start_here(merged, state, shards)
    assert shards.partial is None and state.position == (2, 0)
    assert state.local_samples == 103  # 206 dealt over 2


def test_a_resize_to_more_ranks_climbs_to_the_new_rate():
    optim = OptimConfig(lr=0.1, reference_batch=32, resize_warmup_epochs=0.5)
    schedule = LRSchedule(optim, global_batch=128, train_size=1000, epochs=10)
    assert schedule.lr_at(2000) == pytest.approx(0.4)
    schedule.start_ramp(2000, from_rate=0.2)
    rates = [schedule.lr_at(s) for s in (2000, 2250, 2500, 3000)]
    assert rates == pytest.approx([0.2, 0.3, 0.4, 0.4])
    schedule.start_ramp(2000, from_rate=0.8)  # fewer ranks: the lower rate at once
    assert schedule.ramp is None and schedule.lr_at(2000) == pytest.approx(0.4)


def test_another_number_of_ranks_is_resumed_except_a_simulated_runs(checkpoint):
    found, _ = checkpoint
    check_compatible(found, {**CONFIG, "launcher": {"name": "local", "nprocs": 2}}, False)
    simulated = found.__class__(**{**found.__dict__, "config": {
        **CONFIG, "launcher": {"name": "sim", "nprocs": 3}}})
    with pytest.raises(ConfigError, match="holds 3 simulated learners, this job has "
                                          "launcher.nprocs=5"):
        check_compatible(simulated, OmegaConf.to_container(OmegaConf.create(
            {**CONFIG, "launcher": {"name": "sim", "nprocs": 5}})), False)
