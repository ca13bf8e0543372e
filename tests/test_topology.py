"""Topologies and spectral quantities against docs/algorithms.md (D-PSGD, AD-PSGD, Topologies
and spectral gap)."""

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from runner.errors import ConfigError
from runner.topology import TOPOLOGIES, build
from runner.topology.graphs import BipartiteExponential
from runner.topology.pairing import is_active, passive_peers, peer_schedule
from runner.topology.random_ring import RandomRing
from runner.topology.spectral import (
    centering,
    pairwise_matrix,
    pairwise_rho,
    rho_from_gram,
    slem,
    spectral_gap,
    summarize,
)
from runner.topology.torus import Torus, TorusConfig

SIZES = [*range(1, 17), 64, 128]
TABLE_N = [4, 8, 16, 64, 128]


def valid(name, n):
    """Whether docs/algorithms.md allows n learners for this topology."""
    if name == "exponential":
        return n & (n - 1) == 0
    if name == "bipartite_exponential":
        return n % 2 == 0
    return True


def cases():
    for name in TOPOLOGIES.names():
        for n in SIZES:
            if valid(name, n):
                yield name, n


@pytest.mark.parametrize("name,n", list(cases()))
def test_every_w_is_doubly_stochastic_symmetric_when_undirected_and_matches_its_weights(name, n):
    topology = build(name, seed=5)
    for step in (0, 1, 7) if topology.time_varying else (0,):
        w = topology.mixing_matrix(n, step)
        assert w.shape == (n, n) and w.dtype == np.float64
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
        if not topology.directed:
            np.testing.assert_array_equal(w, w.T)
        for rank in range(n):
            column = {i: w[i, rank] for i in range(n) if w[i, rank] != 0}
            assert topology.in_weights(rank, n, step) == column
            assert rank in column
            row = [j for j in range(n) if j != rank and w[rank, j] != 0]
            assert topology.out_peers(rank, n, step) == row


@pytest.mark.parametrize("name", TOPOLOGIES.names())
def test_expectations_of_fixed_topologies_are_w_and_w_transpose_w(name):
    topology, n = build(name), 8
    if topology.time_varying:
        return
    w = topology.mixing_matrix(n)
    np.testing.assert_array_equal(topology.expected_mixing(n), w)
    np.testing.assert_allclose(topology.expected_gram(n), w.T @ w)
    assert spectral_gap(w) == pytest.approx(1 - slem(w), abs=1e-12)  # all W here are normal


@pytest.mark.parametrize("name,n,problem_key", [
    ("exponential", 12, "topology.name"), ("exponential", 3, "topology.name"),
    ("bipartite_exponential", 7, "topology.name"), ("ring", 0, "topology.name"),
    ("complete", -1, "topology.name"),
])
def test_impossible_sizes_are_config_errors(name, n, problem_key):
    topology = build(name)
    for call in (topology.check_size, topology.mixing_matrix, lambda k: topology.in_weights(0, k)):
        with pytest.raises(ConfigError) as info:
            call(n)
        assert info.value.key == problem_key and "Fix:" in str(info.value)


def test_torus_grids_rows_and_bad_rows():
    torus = build("torus")
    assert [torus.grid(n) for n in TABLE_N] == [(2, 2), (2, 4), (4, 4), (8, 8), (8, 16)]
    assert Torus({"name": "torus", "rows": 4}).grid(8) == (4, 2)
    with pytest.raises(ConfigError) as info:
        Torus(TorusConfig(rows=3)).check_size(8)
    assert info.value.key == "topology.rows"
    with pytest.raises(ConfigError, match="topology.rows"):
        TorusConfig(rows=0).check("topology", OmegaConf.create({}))
    # 2x2: both neighbours along each side coincide and their 1/5 weights add up.
    assert torus.in_weights(0, 4) == {0: 0.2, 1: 0.4, 2: 0.4}


def test_config_accepts_dictconfig_and_rejects_unknown_keys():
    section = OmegaConf.structured(TorusConfig(rows=2))
    assert TOPOLOGIES.get("torus")(section).grid(8) == (2, 4)
    with pytest.raises(ConfigError, match="topology.colums"):
        build({"name": "ring", "colums": 3})
    assert build(OmegaConf.create({"name": "random_ring", "seed": 9}), seed=1).seed == 9
    with pytest.raises(ConfigError, match="seed"):
        build("random_ring", seed=-1)


def test_small_rings():
    ring = build("ring")
    np.testing.assert_array_equal(ring.mixing_matrix(1), [[1.0]])
    np.testing.assert_array_equal(ring.mixing_matrix(2), [[0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_allclose(ring.mixing_matrix(3), np.full((3, 3), 1 / 3))
    assert ring.in_weights(0, 5) == {0: 1 / 3, 1: 1 / 3, 4: 1 / 3}


# --- docs/algorithms.md: Fixed mixing matrices; Fixed ring versus randomized ring ----------

GAPS_9_2 = {
    "ring": [0.666667, 0.195262, 0.050747, 0.003210, 0.000803],
    "torus": [0.400000, 0.400000, 0.400000, 0.117157, 0.030448],
    "exponential": [0.666667, 0.500000, 0.400000, 0.285714, 0.250000],
    "exponential_undirected": [1.000000, 0.666667, 0.500000, 0.333333, 0.285714],
    "complete": [1.0] * 5,
}
RHO_9_3 = {"ring": [0.111111, 0.647603, 0.901081, 0.993590, 0.998395],
           "random_ring": [0.111111, 0.238095, 0.288889, 0.322751, 0.328084]}


@pytest.mark.parametrize("name", GAPS_9_2)
def test_table_9_2_spectral_gaps(name):
    topology = build(name)
    for n, expected in zip(TABLE_N, GAPS_9_2[name]):
        assert summarize(topology, n)["spectral_gap"] == pytest.approx(expected, abs=1e-6)
        assert spectral_gap(topology.mixing_matrix(n)) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", RHO_9_3)
def test_table_9_3_fixed_versus_random_ring_rho(name):
    topology = build(name)
    for n, expected in zip(TABLE_N, RHO_9_3[name]):
        assert summarize(topology, n)["rho"] == pytest.approx(expected, abs=1e-6)
        assert rho_from_gram(topology.expected_gram(n)) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("n", [4, 5, 8, 16, 33, 64, 128])
def test_closed_forms(n):
    c = 1 - math.cos(2 * math.pi / n)
    ring = build("ring").mixing_matrix(n)
    eig = np.sort(np.linalg.eigvalsh(ring))
    expected_eig = np.sort(1 / 3 + 2 / 3 * np.cos(2 * np.pi * np.arange(n) / n))
    np.testing.assert_allclose(eig, expected_eig, atol=1e-12)
    assert 1 - slem(ring) == pytest.approx(2 / 3 * c, abs=1e-12)
    assert summarize(build("ring"), n)["rho"] == pytest.approx((1 - 2 / 3 * c) ** 2, abs=1e-9)
    rho_random = 1 / 3 - 2 / (3 * (n - 1))
    assert summarize(build("random_ring"), n)["rho"] == pytest.approx(rho_random, abs=1e-9)
    gram = (1 / 3) * np.eye(n) + 2 / (3 * (n - 1)) * (np.ones((n, n)) - np.eye(n))
    np.testing.assert_allclose(build("random_ring").expected_gram(n), gram, atol=1e-15)
    p, q = build("torus").grid(n)
    if q >= 4:
        assert 1 - slem(build("torus").mixing_matrix(n)) == pytest.approx(
            2 / 5 * (1 - math.cos(2 * math.pi / q)), abs=1e-12)
    if n & (n - 1) == 0:
        m = int(math.log2(n))
        assert 1 - slem(build("exponential").mixing_matrix(n)) == pytest.approx(2 / (m + 1))
        degree = len(build("exponential_undirected").in_weights(0, n)) - 1
        assert degree == {4: 3, 8: 5, 16: 7, 64: 11, 128: 13}[n]


# --- docs/algorithms.md: AD-PSGD pairwise averaging -------------------------------------------

PAIRWISE_9_4 = {  # per-event 1 - rho / per-round 1 - rho^(n/2)
    "ring": [(0.250000, 0.4375), (0.036612, 0.1386), (0.004758, 0.0374), (0.000075, 0.0024),
             (0.000009, 0.0006)],
    "complete": [(0.333333, 0.5556), (0.142857, 0.4602), (0.066667, 0.4242), (0.015873, 0.4007),
                 (0.007874, 0.3971)],
    "complete_bipartite": [(0.25, 0.4375), (0.125, 0.4138), (0.0625, 0.4033),
                           (0.015625, 0.3959), (0.007812, 0.3947)],
    "bipartite_exponential": [(0.25, 0.4375), (0.125, 0.4138), (0.0625, 0.4033),
                              (0.009439, 0.2618), (0.003922, 0.2224)],
}


def edges_of(name, n):
    if name == "complete_bipartite":
        return [(min(a, p), max(a, p)) for a in range(1, n, 2) for p in range(0, n, 2)]
    return build(name).pairwise_edges(n)


@pytest.mark.parametrize("name", PAIRWISE_9_4)
def test_table_9_4_pairwise_averaging(name):
    for n, (per_event, per_round) in zip(TABLE_N, PAIRWISE_9_4[name]):
        rho = pairwise_rho(edges_of(name, n), n)
        assert 1 - rho == pytest.approx(per_event, abs=1e-6)
        assert 1 - rho ** (n / 2) == pytest.approx(per_round, abs=1e-4)
        closed = {"ring": (1 - math.cos(2 * math.pi / n)) / n, "complete": 1 / (n - 1),
                  "complete_bipartite": 1 / n}.get(name)
        if closed is not None:
            assert 1 - rho == pytest.approx(closed, abs=1e-12)


def test_pairwise_step_is_a_projection_that_keeps_the_pair_sum():
    w = pairwise_matrix(1, 4, 6)
    np.testing.assert_allclose(w @ w, w, atol=1e-15)
    np.testing.assert_array_equal(w, w.T)
    x = np.random.default_rng(0).normal(size=(3, 6))
    y = x @ w
    np.testing.assert_allclose(y[:, 1] + y[:, 4], x[:, 1] + x[:, 4])
    spread = ((x - x.mean(1, keepdims=True)) ** 2).sum()
    assert spread - ((y - y.mean(1, keepdims=True)) ** 2).sum() == pytest.approx(
        ((x[:, 1] - x[:, 4]) ** 2).sum() / 2)


@pytest.mark.parametrize("n,gap_two_steps", [(4, 1.0), (8, 0.292893), (16, 0.076120),
                                             (64, 0.004815), (128, 0.001205)])
def test_table_9_4_simultaneous_matchings(n, gap_two_steps):
    first = np.linalg.multi_dot([pairwise_matrix(i, i + 1, n) for i in range(0, n, 2)])
    second = np.linalg.multi_dot([pairwise_matrix(i, (i + 1) % n, n) for i in range(1, n, 2)])
    assert spectral_gap(first @ second) == pytest.approx(gap_two_steps, abs=1e-6)
    # Random active-passive matching: E[W] = I - Lap(K_{n/2,n/2}) / n, so 1 - rho = 1/2.
    expected = np.eye(n) - np.diag(np.full(n, 0.5))
    expected += np.fromfunction(lambda i, j: ((i + j) % 2 == 1) / n, (n, n))
    assert 1 - rho_from_gram(expected) == pytest.approx(0.5, abs=1e-12)


def test_bipartite_exponential_offsets_and_roles():
    topology = BipartiteExponential()
    assert topology.peer_offsets(128) == [1, 3, 5, 9, 17, 33, 65]
    assert topology.peer_offsets(4) == [1, 3]
    for n in (2, 4, 8, 16, 64, 128):
        assert all((i + j) % 2 == 1 for i, j in topology.pairwise_edges(n))
    assert is_active(4) and not is_active(3)  # the project's one role convention


def test_ad_psgd_peers_follow_the_topology():
    ring = passive_peers(build("ring"), 8)
    assert ring == {0: [1, 7], 2: [3, 1], 4: [5, 3], 6: [7, 5]}  # right, then left
    assert passive_peers(build("ring"), 2) == {0: [1]}
    # The paper's log-hop peers: offsets +-1, +-3, +-5, +-9, +-17, +-33 by ring distance.
    assert passive_peers(build("bipartite_exponential"), 64)[0] == [
        1, 63, 3, 61, 5, 59, 9, 55, 17, 47, 31, 33]
    complete = passive_peers(build("complete"), 8)
    assert all(sorted(peers) == [1, 3, 5, 7] for peers in complete.values())
    # Edges between two actives or two passives are not used (torus 4x4: rank 0 has
    # neighbours 1, 3, 4 and 12; 4 and 12 are active like it). What is left are the rows,
    # which never average with each other: refused, not a run that can never reach consensus.
    with pytest.raises(ConfigError, match="split the 16 participants into 4 groups"):
        passive_peers(build("torus"), 16)


def test_ad_psgd_peer_schedules():
    peers = [1, 7, 3, 5]
    fixed = peer_schedule("fixed", peers, seed=0, active=0)
    assert [fixed(k) for k in range(6)] == [1, 7, 3, 5, 1, 7]
    draws = [peer_schedule("random", peers, seed=3, active=2)(k) for k in range(4000)]
    assert set(draws) == set(peers)
    assert all(abs(draws.count(p) / 4000 - 0.25) < 0.03 for p in peers)
    again = peer_schedule("random", peers, seed=3, active=2)
    assert [again(k) for k in range(50)] == draws[:50]  # a function of k: resumable


@pytest.mark.parametrize("name,n,message", [
    ("random_ring", 8, "draws a new graph every step"),
    ("exponential", 6, "cannot use n=6"),
])
def test_ad_psgd_peers_refuse_graphs_they_cannot_use(name, n, message):
    with pytest.raises(ConfigError, match=message):
        passive_peers(build(name), n)


@pytest.mark.parametrize("n", [4, 8, 16, 32, 64, 128])
def test_one_peer_exponential_product_is_exact_averaging(n):
    shift = np.roll(np.eye(n), 1, axis=1)
    product = np.eye(n)
    for m in range(int(math.log2(n))):
        product = product @ (np.eye(n) + np.linalg.matrix_power(shift, 2**m)) / 2
    np.testing.assert_allclose(product, np.full((n, n), 1 / n), atol=1e-12)


# --- docs/algorithms.md: Randomized ring --------------------------------------------------------

def test_random_ring_permutation_is_shared_and_peers_are_consistent():
    n, seed = 16, 123
    ranks = [RandomRing(None, seed=seed) for _ in range(n)]  # one object per simulated rank
    for step in range(5):
        expected = np.random.default_rng([seed, step]).permutation(n)
        for topology in ranks:
            np.testing.assert_array_equal(topology.permutation(n, step), expected)
        for i in range(n):
            left, right = ranks[i].neighbours(i, n, step)
            assert ranks[right].neighbours(right, n, step)[0] == i
            assert ranks[left].neighbours(left, n, step)[1] == i
            assert ranks[i].out_peers(i, n, step) == sorted({left, right})
    perms = {tuple(ranks[0].permutation(n, step)) for step in range(10)}
    assert len(perms) == 10
    assert not np.array_equal(RandomRing(None, seed=1).permutation(n, 0),
                              RandomRing(None, seed=2).permutation(n, 0))


def test_random_ring_monte_carlo_gram_matches_closed_form():
    n, draws = 8, 20_000
    topology = RandomRing(None, seed=0)
    total = np.zeros((n, n))
    for step in range(draws):
        w = topology.mixing_matrix(n, step)
        total += w.T @ w
    assert abs(rho_from_gram(total / draws) - 0.238095) < 0.01
    np.testing.assert_allclose(total / draws, topology.expected_gram(n), atol=0.01)


@pytest.mark.parametrize("n", [8, 16, 32])
def test_pure_gossip_contracts_faster_on_the_random_ring(n):
    x0 = np.random.default_rng(n).normal(size=(10, n))
    fixed, random = build("ring"), build("random_ring", seed=3)

    def consensus_distance(topology, steps=30):
        x = x0.copy()
        for step in range(steps):
            y = x @ topology.mixing_matrix(n, step)
            np.testing.assert_allclose(y.mean(1), x.mean(1), atol=1e-12)  # mean preserved
            xi_before = ((x @ centering(n)) ** 2).sum()
            x = y
            assert ((x @ centering(n)) ** 2).sum() <= xi_before + 1e-12  # never increases
        return ((x @ centering(n)) ** 2).sum() / n

    assert consensus_distance(random) < 1e-3 * consensus_distance(fixed)
