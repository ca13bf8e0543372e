"""CHOCO-SGD's compressions (runner/algos/choco.py): what a rank sends is what its peer
decodes, of the size stated, and each operator keeps what its definition says."""

import math

import pytest
import torch
from test_cli import assert_one_line_error

from runner.algos.choco import COMPRESSIONS, ChocoConfig, compress, decode, draws, message_bytes
from runner.commands.run import check_command_line


@pytest.mark.parametrize("dtype,wire", [(torch.float32, None), (torch.float64, None),
                                        (torch.float32, torch.bfloat16),
                                        (torch.float64, torch.float16)])
@pytest.mark.parametrize("name", COMPRESSIONS)
def test_the_peer_decodes_what_was_sent_and_the_size_is_the_stated_one(name, dtype, wire):
    """Also with the values in a lower precision (comm.exchange_dtype): the sender's Q(v) is
    the rounded message, so both ends' public copies agree."""
    cfg = ChocoConfig(compression=name, ratio=0.05, levels=15)
    v = torch.randn(1001, generator=torch.Generator().manual_seed(1), dtype=dtype)
    message, value = compress(v, cfg, draws(0, 1, 7, 0), wire)
    assert message.dtype == torch.uint8 and message.numel() == message_bytes(v, cfg, wire)
    assert value.dtype == dtype and torch.equal(decode(message.clone(), v, cfg, wire), value)
    again, _ = compress(v, cfg, draws(0, 1, 7, 0), wire)  # the same draws on a rank and the sim
    assert torch.equal(again, message)
    if wire is not None and name in ("identity", "topk"):  # the values, rounded once
        full = compress(v, cfg, draws(0, 1, 7, 0))[1]
        assert torch.equal(value, full.to(wire).to(dtype))
        assert message.numel() < message_bytes(v, cfg)


def test_each_operator_keeps_what_its_definition_says():
    v = torch.tensor([0.5, -3.0, 0.1, 2.0, -0.2, 0.0, 1.0, -1.5], dtype=torch.float64)
    top = ChocoConfig(compression="topk", ratio=0.25)  # k = 2: -3 and 2
    assert compress(v, top, draws(0, 0, 0, 0))[1].tolist() == [0, -3.0, 0, 2.0, 0, 0, 0, 0]
    _, signs = compress(v, ChocoConfig(compression="sign"), draws(0, 0, 0, 0))
    assert torch.allclose(signs.abs(), v.abs().mean().expand(8))
    assert (signs[v < 0] < 0).all() and (signs[v >= 0] > 0).all()
    randomk = compress(v, ChocoConfig(compression="randomk", ratio=0.5), draws(0, 0, 3, 0))[1]
    kept = randomk != 0
    assert int(kept.sum()) <= 4 and torch.equal(randomk[kept], v[kept])  # not rescaled


def test_qsgd_is_unbiased_before_its_scaling_and_uses_the_given_levels():
    cfg = ChocoConfig(compression="qsgd", levels=4)
    v = torch.tensor([0.3, -1.2, 0.05, 0.9], dtype=torch.float64)
    d, s = 4, 4
    tau = 1 + min(d / s**2, math.sqrt(d) / s)
    mean = torch.stack([compress(v, cfg, draws(0, 0, step, 0))[1]
                        for step in range(4000)]).mean(0)
    assert torch.allclose(mean * tau, v, atol=0.03)
    levels = compress(v, cfg, draws(0, 0, 1, 0))[1] * tau / v.norm() * s
    assert torch.allclose(levels, levels.round(), atol=1e-9)


@pytest.mark.parametrize("args,cause,fix", [
    (["topology=random_ring"], "choco keeps its neighbours' public copies, so it needs a "
     "fixed, undirected topology; random_ring is time-varying", "topology=ring"),
    (["topology=exponential"], "exponential is directed", "topology=ring"),
    (["algo.compression=top1"], "algo.compression: must be one of identity, topk, randomk, "
     "qsgd, sign, got 'top1'", "algo.compression=topk"),
    (["algo.levels=300"], "algo.levels: must be between 1 and 127, got 300", "algo.levels=127"),
    (["algo.gamma=0"], "algo.gamma: must be in (0, 1], got 0", "algo.gamma=0.5"),
    (["algo.ratoi=0.1"], "unknown key 'algo.ratoi'", "algo.ratio"),
])
def test_choco_settings_that_cannot_work_end_with_one_line(capsys, args, cause, fix):
    with pytest.raises(SystemExit) as exit_info:
        check_command_line(["recipe=digit_images", "algo=choco", *args])
    assert_one_line_error(exit_info.value.code, capsys.readouterr().err, cause, fix)
