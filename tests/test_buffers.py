import pytest
import torch
from torch import nn

from runner.comm.buffers import GradientBuckets, flatten, flatten_parameters, unflatten


def test_flatten_unflatten_round_trip():
    tensors = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]
    flat = flatten(tensors)
    assert flat.shape == (12 + 5 + 8,)
    for original, view in zip(tensors, unflatten(flat, tensors)):
        assert torch.equal(original, view)
        assert view.shape == original.shape
    with pytest.raises(ValueError):
        unflatten(flat[:-1], tensors)


def test_flatten_parameters_makes_the_model_a_view_of_one_buffer():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    before = [p.detach().clone() for p in model.parameters()]
    (flat,) = flatten_parameters(model.parameters())
    assert flat.numel() == sum(p.numel() for p in model.parameters())
    for p, value in zip(model.parameters(), before):
        assert torch.equal(p, value)  # values kept
    flat.mul_(0).add_(1.5)  # writing the buffer changes the model...
    assert all(bool((p == 1.5).all()) for p in model.parameters())
    with torch.no_grad():
        next(model.parameters()).fill_(-2)  # ...and the other way round
    assert (flat[:12] == -2).all()


def test_gradient_buckets_cover_every_parameter_once_in_reverse_order():
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])
    params = list(model.parameters())
    buckets = GradientBuckets(params, bucket_bytes=32 * 33 * 4)  # about one layer per bucket
    seen = [p for members in buckets.members for p in members]
    assert sorted(map(id, seen)) == sorted(map(id, params))
    assert seen[0] is params[-1]  # the last layer's gradients come first in backward
    assert len(buckets.buckets) >= 4


def test_buckets_are_reported_in_order_during_backward_and_hold_the_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
    reference = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
    reference.load_state_dict(model.state_dict())
    buckets = GradientBuckets(list(model.parameters()), bucket_bytes=16 * 17 * 4)
    reported, pending_at_report = [], []
    buckets.watch(lambda i: (reported.append(i), pending_at_report.append(
        sum(buckets._pending))))
    x = torch.randn(8, 16)
    buckets.rearm()
    model(x).square().mean().backward()
    buckets.flush()
    assert reported == list(range(len(buckets.buckets)))
    # The first bucket was handed over while later gradients were still being computed.
    assert pending_at_report[0] > 0
    reference(x).square().mean().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad)


def test_dropped_gradient_view_is_detected():
    model = nn.Linear(4, 4)
    buckets = GradientBuckets(list(model.parameters()), bucket_bytes=1 << 20)
    model.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="set_to_none=False"):
        buckets.rearm()
