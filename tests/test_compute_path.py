"""The GPU data and compute path, checked on CPU: channels-last batches, bf16 autocast,
torch.compile wiring, persistent loader workers, and parameter groups without weight decay on
norm and bias (equal for the trainer's optimizer and AD-PSGD's flat masters)."""

import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from runner.algos.optim import flat_param_groups, parameter_groups
from runner.comm.buffers import flatten_gradients, flatten_parameters
from runner.errors import UserError
from runner.train.compute_path import ComputePath, amp_dtype, to_channels_last
from runner.train.data import BatchFetcher, ShardedBatches


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)
        self.ln = nn.LayerNorm(3)

    def forward(self, x):
        return self.ln(self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))))


class PassThrough:
    """A recipe's to_device: what the compute path calls."""

    def to_device(self, batch, device, dtype):
        return tuple(t.to(device, dtype if t.is_floating_point() else None) for t in batch)


def test_channels_last_converts_4d_float_tensors_only():
    images, labels, volume = torch.randn(2, 3, 5, 5), torch.tensor([1, 2]), torch.randn(2, 5, 5)
    out = to_channels_last({"x": (images, labels), "y": [volume]})
    assert out["x"][0].is_contiguous(memory_format=torch.channels_last)
    assert not out["x"][0].is_contiguous()
    assert torch.equal(out["x"][0], images) and out["x"][1] is labels and out["y"][0] is volume


def test_amp_choice_per_device_and_dtype():
    cpu = torch.device("cpu")
    assert amp_dtype("none", cpu, torch.float32) is None
    assert amp_dtype("bf16", cpu, torch.float32) is torch.bfloat16
    assert amp_dtype("auto", cpu, torch.float32) is None  # CPUs emulate bf16, slowly
    assert amp_dtype("bf16", cpu, torch.float64) is None


def test_bf16_autocast_and_channels_last_train_with_float32_gradients():
    torch.manual_seed(0)
    model = SmallNet()
    flatten_parameters(model.parameters())
    path = ComputePath(device=torch.device("cpu"), amp=torch.bfloat16, channels_last=True)
    host = (torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0]))
    images, labels = path.batch(PassThrough(), host)
    assert images.is_contiguous(memory_format=torch.channels_last)
    with path.autocast():
        logits = model.fc(torch.relu(model.bn(model.conv(images))).mean(dim=(2, 3)))
        loss = nn.functional.cross_entropy(logits, labels)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 and p.grad.isfinite().all()
               for p in model.parameters() if p.grad is not None)


def test_compiled_model_and_its_copy_each_run_their_own_weights():
    torch.manual_seed(0)
    model = SmallNet()
    path = ComputePath(device=torch.device("cpu"), compile=True, compile_backend="eager")
    path.prepare_model(model)
    assert model._compiled_call_impl is not None
    x = torch.randn(2, 3, 6, 6)
    before = model(x)
    copy = path.copy_model(model)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(1.0)
    assert copy._compiled_call_impl is not None
    assert not torch.allclose(copy(x), before)  # not the original's compiled call
    assert torch.equal(model(x), before)
    assert set(model.state_dict()) == set(SmallNet().state_dict())  # names unchanged


def test_norm_and_bias_parameters_are_exempt_from_weight_decay_only_when_asked():
    model = SmallNet()
    [single] = parameter_groups(model, 1e-4, False)
    assert single["weight_decay"] == 1e-4 and len(single["params"]) == 8
    decay, exempt = parameter_groups(model, 1e-4, True)
    assert decay["params"] == [model.conv.weight, model.fc.weight]
    assert exempt["weight_decay"] == 0.0
    assert exempt["params"] == [model.conv.bias, model.bn.weight, model.bn.bias, model.fc.bias,
                                model.ln.weight, model.ln.bias]


@pytest.mark.parametrize("no_decay", [False, True])
def test_sgd_over_flat_master_views_updates_exactly_like_sgd_over_the_model(no_decay):
    """What AD-PSGD does (runner/algos/adpsgd.py): the trainer's groups over flat copies."""
    torch.manual_seed(0)
    model = SmallNet()
    buffers = flatten_parameters(model.parameters())
    grads = flatten_gradients(model.parameters())
    masters = [b.clone() for b in buffers]
    settings = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05)
    direct = torch.optim.SGD(parameter_groups(model, 0.05, no_decay), **settings)
    groups = flat_param_groups(direct.param_groups, list(model.parameters()), masters, grads)
    if not no_decay:  # one group: one view per whole buffer, as before groups existed
        assert [g["params"][0].numel() for g in groups] == [b.numel() for b in buffers]
    flat = torch.optim.SGD(groups, lr=0.1)
    for _ in range(3):
        for g in grads:
            g.copy_(torch.randn_like(g))
        direct.step()
        flat.step()
        for buffer, master in zip(buffers, masters):
            assert torch.equal(buffer, master)
    if no_decay:  # and the exemption changed the result
        plain = [b.clone() for b in buffers]
        other = torch.optim.SGD(flat_param_groups(
            torch.optim.SGD(parameter_groups(model, 0.05, False), **settings).param_groups,
            list(model.parameters()), plain, grads), lr=0.1)
        other.step()
        flat.step()
        assert not all(torch.equal(a, b) for a, b in zip(plain, masters))


class WorkerPid(Dataset):
    def __len__(self):
        return 17

    def __getitem__(self, index):
        return index, os.getpid()


def collate_pairs(samples):
    return [s[0] for s in samples], {s[1] for s in samples}


@pytest.mark.parametrize("persistent", [True, False])
def test_one_loader_serves_every_epoch_with_the_shard_order_and_empty_batches(persistent):
    shards = ShardedBatches(17, 3, 4, 2, seed=4)  # rank 3's last batch is empty
    fetcher = BatchFetcher(WorkerPid(), collate_pairs, num_workers=2,
                           persistent_workers=persistent)
    pids = []
    for epoch in range(3):
        batches = shards.epoch_batches(epoch)
        got = list(fetcher.iterate(batches))
        assert len(got) == len(batches) == shards.steps_per_epoch
        for idx, batch in zip(batches, got):
            if len(idx) == 0:
                assert batch is None
            else:
                assert batch[0] == idx.tolist()
                pids.append(batch[1])
    assert any(len(idx) == 0 for idx in shards.epoch_batches(0))  # the case was exercised
    workers = set().union(*pids)
    assert os.getpid() not in workers
    assert (len(workers) == 2) == persistent  # the same 2 processes, or new ones per epoch
    assert fetcher.loader.persistent_workers == persistent


class DamagedAtFive(Dataset):
    """Sample 5 stands for a damaged data file."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5:
            raise UserError("cannot read sample 5", "replace its file")
        return index


@pytest.mark.parametrize("workers", [0, 2])
def test_a_user_error_while_loading_arrives_as_the_same_one_line_error(workers):
    """torch re-raises a worker's exception with the worker's traceback as its message; the
    fetcher hands the trainer the original one-line error instead."""
    fetcher = BatchFetcher(DamagedAtFive(), list, num_workers=workers)
    with pytest.raises(UserError) as error:
        list(fetcher.iterate([np.arange(4), np.arange(4, 8)]))
    message = str(error.value)
    # The loader's worker processes end here: its traceback kept them, and ended later by
    # pytest's clean-up they waited for torch's join timeout (5 s a worker).
    del error, fetcher
    assert message == "cannot read sample 5. Fix: replace its file"


def test_interrupted_pass_does_not_leak_into_the_next():
    """Asynchronous ranks stop mid-epoch; the persistent loader must restart cleanly."""
    shards = ShardedBatches(17, 0, 1, 3, seed=1)
    fetcher = BatchFetcher(WorkerPid(), collate_pairs, num_workers=2, persistent_workers=True)
    stream = fetcher.iterate(shards.epoch_batches(0))
    next(stream), next(stream)
    batches = shards.epoch_batches(1)
    assert [b[0] for b in fetcher.iterate(batches)] == [idx.tolist() for idx in batches]
    assert np.concatenate(batches).size == 17


def test_compile_null_compiles_on_a_gpu_only_for_runs_long_enough_to_pay_it_back():
    from runner.train.compute_path import should_compile

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert should_compile(None, cuda, 5_000, 4_400)
    assert not should_compile(None, cuda, 4_000, 4_400)  # a short run: not worth a compile
    assert not should_compile(None, cuda, 10**6, None)  # a recipe nobody measured
    assert not should_compile(None, cpu, 10**6, 4_400)
    assert should_compile(True, cpu, 1, None) and not should_compile(False, cuda, 10**6, 1)
