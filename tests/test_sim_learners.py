"""The simulator's stacked learners: vectorized gradients equal each model's own autograd
gradients; a model torch.func cannot transform (a packed LSTM) falls back to one call per
learner; the weighted gradient of learners sharing one model (SSGD) is the weighted sum of
their own gradients; StackedSGD is torch.optim.SGD row by row (momentum, Nesterov, decay
groups), and copy_row makes every row (and its momentum) one row's."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runner.algos.optim import parameter_groups
from runner.sim.stacked import StackedLearners, StackedSGD


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.norm(F.relu(self.conv(x)).mean(1).flatten(1)))


class Packed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.fc = nn.Linear(4, 2)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return self.fc(out.mean(1))


def classify(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def sequences(model, batch):
    x, lengths, y = batch
    return F.cross_entropy(model(x, lengths), y)


def reference(model, loss, row, batch, learners):
    learners.load_row(model, row)
    model.zero_grad()
    loss(model, batch).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_vectorized_gradients_equal_each_models_own():
    torch.manual_seed(0)
    model = Tiny().double()
    learners = StackedLearners(model, classify, 5)
    learners.x.add_(torch.randn_like(learners.x) * 0.1)  # five different models
    batches = [(torch.randn(6, 1, 4, 4, dtype=torch.float64), torch.randint(0, 3, (6,)))
               for _ in range(5)]
    counts = [6, 6, 6, 6, 0]  # the last learner has no batch this step
    batches[4] = None
    grads, losses = learners.gradients(learners.x.clone(), list(range(5)), batches, counts)
    check = Tiny().double()
    for i in range(4):
        expected = reference(check, classify, learners.x[i], batches[i], learners)
        assert torch.allclose(grads[i], expected, atol=1e-12, rtol=0)
    assert bool(torch.isfinite(losses[:4]).all()) and torch.isnan(losses[4])
    assert not grads[4].any()


def test_a_model_vmap_cannot_batch_falls_back_to_one_call_each():
    torch.manual_seed(1)
    model = Packed().double()
    learners = StackedLearners(model, sequences, 3)
    learners.x.add_(torch.randn_like(learners.x) * 0.1)
    batches = [(torch.randn(4, 5 + i, 3, dtype=torch.float64), torch.tensor([5 + i, 3, 2, 4]),
                torch.randint(0, 2, (4,))) for i in range(3)]  # padded to different lengths
    grads, _ = learners.gradients(learners.x.clone(), [0, 1, 2], batches, [4, 4, 4])
    check = Packed().double()
    for i in range(3):
        expected = reference(check, sequences, learners.x[i], batches[i], learners)
        assert torch.allclose(grads[i], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_stacked_sgd_is_torch_sgd_row_by_row(nesterov):
    torch.manual_seed(2)
    model = Tiny().double()
    learners = StackedLearners(model, classify, 3)
    learners.x.add_(torch.randn_like(learners.x))
    optimizer = StackedSGD(learners, model, momentum=0.9, nesterov=nesterov,
                           weight_decay=1e-2, no_decay_norm_bias=True)
    copies = []
    for i in range(3):
        copy = Tiny().double()
        learners.load_row(copy, learners.x[i])
        copies.append((copy, torch.optim.SGD(parameter_groups(copy, 1e-2, True), lr=0.1,
                                             momentum=0.9, nesterov=nesterov)))
    rates = torch.tensor([0.1, 0.05, 0.2], dtype=torch.float64)
    for step in range(4):
        grads = torch.randn(3, learners.size, dtype=torch.float64)
        # some steps touch a subset (with different rates, or one row at a single rate)
        rows = {1: torch.tensor([0, 2]), 3: torch.tensor([1])}.get(step)
        chosen = [0, 1, 2] if rows is None else rows.tolist()
        optimizer.step(learners.x, rows, grads[chosen], rates[chosen])
        for i in chosen:
            copy, sgd = copies[i]
            for group in sgd.param_groups:
                group["lr"] = float(rates[i])
            offset = 0
            for p in copy.parameters():
                p.grad = grads[i, offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            sgd.step()
    for i, (copy, _) in enumerate(copies):
        mine = torch.cat([p.detach().reshape(-1) for p in copy.parameters()])
        assert torch.allclose(learners.x[i], mine, atol=1e-13, rtol=0)


@pytest.mark.parametrize("kind", ["vectorized", "fallback"])
def test_weighted_gradient_of_a_shared_model_is_the_weighted_sum(kind):
    torch.manual_seed(3)
    if kind == "vectorized":
        model, loss = Tiny().double(), classify
        batches = [(torch.randn(6, 1, 4, 4, dtype=torch.float64), torch.randint(0, 3, (6,)))
                   for _ in range(4)]
        counts = [6, 6, 6, 0]
    else:  # padded sequences of different lengths cannot be stacked: one call each
        model, loss = Packed().double(), sequences
        batches = [(torch.randn(4, 5 + i, 3, dtype=torch.float64),
                    torch.tensor([5 + i, 3, 2, 4]), torch.randint(0, 2, (4,)))
                   for i in range(4)]
        counts = [4, 4, 4, 0]
    batches[3] = None  # the last learner has no batch this step
    learners = StackedLearners(model, loss, 4)
    weights = torch.tensor([0.5, 0.25, 0.25, 0.0], dtype=torch.float64)
    grad, losses = learners.weighted_gradient(learners.x[0], range(4), batches, counts, weights)
    check = type(model)().double()
    expected = sum(weights[i] * reference(check, loss, learners.x[0], batches[i], learners)
                   for i in range(3))
    assert torch.allclose(grad, expected, atol=1e-12, rtol=0)
    assert bool(torch.isfinite(losses[:3]).all()) and torch.isnan(losses[3])
    learners.load_row(check, learners.x[0])
    assert float(losses[1]) == pytest.approx(loss(check, batches[1]).item(), abs=1e-12)


def test_copy_row_copies_the_model_and_its_momentum():
    model = Tiny().double()
    learners = StackedLearners(model, classify, 3)
    optimizer = StackedSGD(learners, model, momentum=0.9, nesterov=False, weight_decay=0.0,
                           no_decay_norm_bias=False)
    grads = torch.randn(1, learners.size, dtype=torch.float64)
    optimizer.step(learners.x, torch.tensor([1]), grads, torch.tensor([0.1]))
    optimizer.copy_row(learners.x, 1)
    assert bool((learners.x == learners.x[1]).all())
    assert bool((optimizer.buf == optimizer.buf[1]).all()) and bool(optimizer.buf.any())
