"""Delay-by-one's matchings (runner/algos/delay_by_one.py) for every number of learners an
elastic job can be left with, and the invariant its docstring states, over them."""

import pytest
import torch

from runner.algos.delay_by_one import MIX, matching_partner, mix_


def partners(pattern: str, n: int, step: int, seed: int = 3) -> list[int]:
    return [matching_partner(pattern, i, n, step, seed) for i in range(n)]


@pytest.mark.parametrize("pattern", ["fixed", "random"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8])
def test_every_step_is_a_matching_and_an_odd_number_leaves_exactly_one_out(pattern, n):
    for step in range(40):
        p = partners(pattern, n, step)
        assert all(p[p[i]] == i for i in range(n)), (step, p)  # both ends know each other
        alone = [i for i in range(n) if p[i] == i]
        assert len(alone) == n % 2, (step, p)


def test_the_fixed_pattern_pairs_an_even_number_as_before_and_rotates_who_sits_out():
    for step in range(6):  # (2m, 2m+1) on even steps, (2m+1, 2m+2 mod n) on odd ones
        assert partners("fixed", 4, step) == ([1, 0, 3, 2] if step % 2 == 0 else [3, 2, 1, 0])
    assert [partners("fixed", 5, step).index(i) for step, i in ((0, 4), (1, 0))] == [4, 0]
    assert partners("fixed", 5, 0) == [1, 0, 3, 2, 4]
    assert partners("fixed", 5, 1) == [0, 2, 1, 4, 3]


@pytest.mark.parametrize("n", [5, 8])
def test_without_gradients_the_conserved_sum_holds_and_the_models_meet_at_its_mean(n):
    """x^{k+1} = (1 - w) x^k + w x_{p(k-1)}^{k-1}: Q_k = sum x^k + w sum x^{k-1} stays, and
    every model tends to Q / (n (1 + w)), an odd number of learners too."""
    torch.manual_seed(0)
    x = torch.randn(n, 16, dtype=torch.float64)
    previous, previous_partners = None, None
    q = None
    for step in range(1500):  # an odd number mixes more slowly (one sits out each step)
        sent, p = x.clone(), partners("fixed", n, step)
        if previous is not None:
            mix_(x, previous[torch.tensor(previous_partners)])
            q_now = x.sum(0) + MIX * sent.sum(0)
            q = q_now if q is None else q
            assert torch.allclose(q_now, q, atol=1e-12)
        previous, previous_partners = sent, p
    assert (x - x.mean(0)).abs().max() < 1e-9
    assert torch.allclose(x[0], q / (n * (1 + MIX)), atol=1e-9)
