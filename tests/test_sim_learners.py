"""The simulator's stacked learners: vectorized gradients equal each model's own autograd
gradients; a model torch.func cannot transform (a packed LSTM) falls back to one call per
learner; StackedSGD is torch.optim.SGD row by row (momentum, Nesterov, decay groups)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runner.optim import parameter_groups
from runner.sim.learners import StackedLearners, StackedSGD


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
    for step in range(3):
        grads = torch.randn(3, learners.size, dtype=torch.float64)
        rows = None if step != 1 else torch.tensor([0, 2])  # some steps touch a subset
        chosen = [0, 1, 2] if rows is None else [0, 2]
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
