import numpy as np
import pytest

from runner.train.data import ShardedBatches


@pytest.mark.parametrize("n_items,size,batch", [(1797, 2, 32), (1437, 4, 32), (100, 3, 7),
                                                (64, 4, 16), (10, 4, 8), (896 * 2 + 1, 2, 32)])
def test_every_sample_exactly_once_per_epoch_with_equal_step_counts(n_items, size, batch):
    shards = [ShardedBatches(n_items, r, size, batch, seed=3) for r in range(size)]
    for epoch in range(2):
        seen = np.concatenate([np.concatenate(s.epoch_batches(epoch)) for s in shards])
        assert sorted(seen.tolist()) == list(range(n_items))
        assert len({len(s.epoch_batches(epoch)) for s in shards}) == 1
        for k in range(shards[0].steps_per_epoch):
            counts = [len(s.epoch_batches(epoch)[k]) for s in shards]
            assert sum(counts) == shards[0].global_count(k)
            assert counts == [shards[0].local_count(r, k) for r in range(size)]


def test_union_of_rank_batches_is_the_single_process_batch():
    n_items, size, batch = 1437, 4, 16
    single = ShardedBatches(n_items, 0, 1, size * batch, seed=11)
    shards = [ShardedBatches(n_items, r, size, batch, seed=11) for r in range(size)]
    for k, big in enumerate(single.epoch_batches(5)):
        union = np.concatenate([s.epoch_batches(5)[k] for s in shards])
        assert sorted(union.tolist()) == sorted(big.tolist())


def test_epochs_are_shuffled_differently_and_reproducibly():
    a = ShardedBatches(500, 0, 2, 10, seed=1)
    b = ShardedBatches(500, 0, 2, 10, seed=1)
    assert not np.array_equal(a.pass_order(0), a.pass_order(1))
    assert np.array_equal(a.pass_order(3), b.pass_order(3))
    assert not np.array_equal(a.pass_order(0), ShardedBatches(500, 0, 2, 10, seed=2).pass_order(0))


def test_digits_read_directly_equal_scikit_learns_loader():
    from sklearn.datasets import load_digits as sklearn_digits

    from recipes.digit_images import load_digits

    pixels, labels = load_digits()
    reference = sklearn_digits()
    assert pixels.shape == (1797, 64)
    np.testing.assert_array_equal(pixels, reference.data)
    np.testing.assert_array_equal(labels, reference.target)
