"""runner.algos.optim.SGD: torch's SGD, step for step, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from runner.algos.optim import SGD


def two_group_models() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4),
                               torch.nn.Linear(4, 3))
    twin.load_state_dict(model.state_dict())
    return model, twin


def groups(model: torch.nn.Module) -> list[dict]:
    params = list(model.parameters())
    return [{"params": params[:2], "weight_decay": 1e-3}, {"params": params[2:],
                                                          "weight_decay": 0.0}]


@pytest.mark.parametrize("nesterov", [False, True])
def test_the_same_updates_and_state_as_torch_sgd(nesterov):
    model, twin = two_group_models()
    ours = SGD(groups(model), lr=0.1, momentum=0.9, nesterov=nesterov)
    theirs = torch.optim.SGD(groups(twin), lr=0.1, momentum=0.9, nesterov=nesterov)
    x = torch.randn(8, 5)
    for step in range(4):
        for net, optimizer in ((model, ours), (twin, theirs)):
            optimizer.zero_grad()
            net(x + step).pow(2).mean().backward()
            optimizer.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert ours_state["param_groups"] == theirs_state["param_groups"]
    for key in theirs_state["state"]:
        assert torch.equal(ours_state["state"][key]["momentum_buffer"],
                           theirs_state["state"][key]["momentum_buffer"])
    # Checkpoints go both ways: torch's SGD resumes from ours and ours from torch's.
    resumed = torch.optim.SGD(groups(model), lr=0.5)
    resumed.load_state_dict(ours_state)
    back = SGD(groups(twin), lr=0.5)
    back.load_state_dict(theirs_state)
    assert resumed.param_groups[0]["lr"] == back.param_groups[0]["lr"] == 0.1


def test_step_hooks_run_and_the_step_records_no_graph():
    model, _ = two_group_models()
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    calls = []
    optimizer.register_step_pre_hook(lambda *_: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *_: calls.append("post"))
    model(torch.randn(4, 5)).sum().backward()
    with torch.enable_grad():
        optimizer.step()
    assert calls == ["pre", "post"]
    assert all(p.grad_fn is None for p in model.parameters())


@pytest.mark.slow
def test_building_stepping_and_saving_it_imports_no_dynamo():
    """The point of it: torch.optim.SGD imports torch._dynamo (seconds) on its first step."""
    code = ("import sys, torch\n"
            "from runner.algos.optim import SGD\n"
            "model = torch.nn.Linear(3, 2)\n"
            "optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)\n"
            "model(torch.ones(1, 3)).sum().backward()\n"
            "optimizer.step(); optimizer.zero_grad()\n"
            "optimizer.load_state_dict(optimizer.state_dict())\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
