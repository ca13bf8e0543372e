"""DiLoCo's outer step (runner/algos/diloco.py) against the rule in its docstring, by hand:
theta <- theta - outer_lr (Delta + mu v), v <- mu v + Delta (v starts at the first Delta)."""

import pytest
import torch

from runner.algos.diloco import DiLoCoConfig, outer_optimizer


@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_the_outer_step_is_sgd_with_nesterov_momentum_on_the_pseudo_gradient(mu):
    cfg = DiLoCoConfig(outer_lr=0.7, outer_momentum=mu)
    theta = torch.tensor([1.0, -2.0], dtype=torch.float64)
    theta.grad = torch.zeros_like(theta)
    outer = outer_optimizer([theta], cfg)
    expected, v = theta.clone(), None
    for delta in (torch.tensor([0.5, 0.25]), torch.tensor([-0.1, 0.3])):
        theta.grad.copy_(delta)
        outer.step()
        v = delta.double() if v is None else mu * v + delta
        expected -= cfg.outer_lr * (delta + mu * v)
        assert torch.allclose(theta, expected, rtol=0, atol=1e-15)


def test_outer_lr_1_without_momentum_moves_theta_to_the_mean_of_the_learners():
    learners = torch.tensor([[1.0, 2.0], [3.0, -2.0], [2.0, 0.0]], dtype=torch.float64)
    theta = torch.zeros(2, dtype=torch.float64)
    theta.grad = (theta - learners).mean(0)
    outer_optimizer([theta], DiLoCoConfig(outer_lr=1.0, outer_momentum=0.0)).step()
    assert torch.allclose(theta, learners.mean(0), rtol=0, atol=1e-15)
