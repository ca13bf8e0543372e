"""The simulator's cluster model: the collectives' closed forms against hand-computed numbers
and the played-out ring, the compute model's determinism and distributions, the presets of
conf/cluster/, and cluster=measured fitted to a run (a synthetic one with known numbers, and
a real 2-rank SSGD run)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from recipes import RECIPES
from runner.commands.compose import compose_all, validate
from runner.config.cluster import ClusterConfig, ComputeConfig, LinkConfig
from runner.errors import ConfigError, UserError
from runner.sim.cluster import ClusterModel, ComputeModel, measured_cluster, resolved
from runner.sim.event_queue import EventQueue
from runner.sim.network import SharedChannel, ring_allreduce

from conftest import REPO, run_cli

# Two nodes of 4: 2 us and 400 Gb/s (50 GB/s) inside a node, 10 us and 100 Gb/s between.
CLUSTER = ClusterConfig(name="test", gpus_per_node=4, nodes=2,
                        intra_node=LinkConfig(latency_us=2.0, bandwidth_gbps=400.0),
                        inter_node=LinkConfig(latency_us=10.0, bandwidth_gbps=100.0))
A_INTRA, B_INTRA, A_INTER, B_INTER = 2e-6, 50e9, 10e-6, 12.5e9
M = 1e8
PRESETS = sorted(p.stem for p in (REPO / "conf" / "cluster").glob("*.yaml"))


def model(allreduce: str = "ring", nprocs: int = 8, per_node: int = 4) -> ClusterModel:
    return ClusterModel(dataclasses.replace(CLUSTER, allreduce=allreduce), nprocs, per_node)


def test_links_and_transfers():
    cluster = model()
    assert [cluster.node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert cluster.link(0, 3).bandwidth_Bps == pytest.approx(B_INTRA)
    assert cluster.link(3, 4).latency_s == pytest.approx(A_INTER)
    assert cluster.transfer_s(0, 1, M) == pytest.approx(A_INTRA + M / B_INTRA)
    assert cluster.transfer_s(1, 5, M) == pytest.approx(A_INTER + M / B_INTER)
    assert cluster.transfer_s(2, 2, M) == 0.0


@pytest.mark.parametrize("allreduce, ranks, expected", [
    # 2 (n-1)/n M/B + 2 (n-1) alpha, over the slowest link used
    ("ring", range(8), 2 * 7 / 8 * M / B_INTER + 14 * A_INTER),  # 0.01414
    ("ring", range(4), 2 * 3 / 4 * M / B_INTRA + 6 * A_INTRA),  # 0.003012
    # 2 ceil(log2 n) (alpha + M/B)
    ("tree", range(8), 6 * (A_INTER + M / B_INTER)),  # 0.04806
    ("tree", range(5), 6 * (A_INTER + M / B_INTER)),
    ("tree", range(2), 2 * (A_INTRA + M / B_INTRA)),
    # intra ring (L = 4), inter ring (S = 2)
    ("hierarchical", range(8), 1.5 * M / B_INTRA + 6 * A_INTRA + M / B_INTER + 2 * A_INTER),
    ("hierarchical", range(4), 2 * 3 / 4 * M / B_INTRA + 6 * A_INTRA),  # one node: a ring
    ("hierarchical", [0, 4], M / B_INTER + 2 * A_INTER),  # one rank per node: a ring
    ("ring", [3], 0.0),
])
def test_allreduce_closed_forms(allreduce, ranks, expected):
    assert model(allreduce).allreduce_s(list(ranks), M) == pytest.approx(expected, rel=1e-12)


def test_hand_computed_numbers():
    assert model("ring").allreduce_s(list(range(8)), M) == pytest.approx(0.01414)
    assert model("tree").allreduce_s(list(range(8)), M) == pytest.approx(0.04806)
    assert model("hierarchical").allreduce_s(list(range(8)), M) == pytest.approx(0.011032)


@pytest.mark.parametrize("allreduce, expected", [
    ("tree", 3 * (A_INTER + M / B_INTER)),
    ("ring", (3 + 7) * A_INTER + 2 * 7 / 8 * M / B_INTER),
    ("hierarchical", (1 + 1) * A_INTER + M / B_INTER + (2 + 3) * A_INTRA + 1.5 * M / B_INTRA),
])
def test_broadcast_closed_forms(allreduce, expected):
    assert model(allreduce).broadcast_s(list(range(8)), M) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("per_node", [8, 4, 1])  # one node; two nodes of 4; every rank alone
@pytest.mark.parametrize("nbytes", [4e3, M])
def test_ring_closed_form_is_the_ring_played_out(per_node, nbytes):
    """Every rank's outgoing interface is the link to its ring successor; on idle interfaces
    the played-out ring takes the closed form over the slowest link."""
    cluster = ClusterModel(dataclasses.replace(CLUSTER, gpus_per_node=8, nodes=0), 8,
                           per_node)
    queue = EventQueue()
    channels = [SharedChannel(queue, cluster.link(r, (r + 1) % 8)) for r in range(8)]
    done: list[float] = []
    ring_allreduce(queue, channels, nbytes, lambda: done.append(queue.now))
    queue.run()
    assert done == [pytest.approx(cluster.allreduce_s(list(range(8)), nbytes), rel=1e-9)]


def test_a_run_must_fit_the_machine():
    with pytest.raises(ConfigError, match=r"launcher.nprocs: 9 learners need 3 nodes of 4"):
        ClusterModel(CLUSTER, 9, 4)
    with pytest.raises(ConfigError, match=r"launcher.procs_per_node: 8 learners per node"):
        ClusterModel(CLUSTER, 8, 8)
    ClusterModel(dataclasses.replace(CLUSTER, nodes=0), 1024, 4)  # unbounded
    sim = OmegaConf.create({"launcher": {"name": "sim", "nprocs": 16, "procs_per_node": None}})
    with pytest.raises(ConfigError, match="cluster test has 2 .8 GPUs."):
        CLUSTER.check("cluster", sim)


# ---- compute ------------------------------------------------------------------------------
def compute(**values) -> ComputeConfig:
    return ComputeConfig(**{"seconds_per_sample": {"imagenet": 1e-3}, "step_overhead_s": 0.01,
                            **values})


def test_step_seconds_are_deterministic_whatever_the_call_order():
    cfg = compute(jitter=0.3, slow_period_rate_per_hour=30, slow_period_s=20, slow_factor=3)
    keys = [(learner, step, 100.0 * step) for learner in range(4) for step in range(0, 700, 7)]
    forward = ComputeModel(cfg, "imagenet", 4, seed=5)
    first = {key: forward.step_s(key[0], key[1], 32, key[2]) for key in keys}
    shuffled = ComputeModel(cfg, "imagenet", 4, seed=5)
    order = np.random.default_rng(0).permutation(len(keys))
    second = {keys[i]: shuffled.step_s(keys[i][0], keys[i][1], 32, keys[i][2]) for i in order}
    assert first == second
    other = ComputeModel(cfg, "imagenet", 4, seed=6)
    assert first != {key: other.step_s(key[0], key[1], 32, key[2]) for key in keys}
    assert len(set(first.values())) == len(keys)  # the learners' streams differ


def test_without_jitter_a_step_takes_its_mean():
    steps = ComputeModel(compute(), "imagenet", 2, seed=0)
    assert steps.step_s(1, 3, 32, 0.0) == pytest.approx(0.01 + 32 * 1e-3)


def test_jitter_keeps_the_mean_and_has_the_configured_spread():
    steps = ComputeModel(compute(jitter=0.2), "imagenet", 1, seed=1)
    mean = 0.01 + 32e-3
    draws = np.array([steps.step_s(0, k, 32, 0.0) for k in range(20000)]) / mean
    assert draws.min() > 0
    assert draws.mean() == pytest.approx(1.0, abs=0.005)  # 3.5 standard errors
    assert draws.std() == pytest.approx(0.2, rel=0.05)


def test_stragglers_compute_factor_times_slower():
    steps = ComputeModel(compute(jitter=0.1), "imagenet", 4, seed=2, straggler_ranks=[1, 3],
                         straggler_factor=4.0)
    normal = ComputeModel(compute(jitter=0.1), "imagenet", 4, seed=2)
    for learner in range(4):
        ratio = steps.step_s(learner, 9, 32, 0.0) / normal.step_s(learner, 9, 32, 0.0)
        assert ratio == pytest.approx(4.0 if learner in (1, 3) else 1.0)


def test_slow_periods_come_at_the_configured_rate():
    cfg = compute(slow_period_rate_per_hour=2.0, slow_period_s=60.0, slow_factor=3.0)
    steps = ComputeModel(cfg, "imagenet", 8, seed=3)
    hours = 250
    counts = [len(steps.slow_periods(learner, hours * 3600.0)) for learner in range(8)]
    assert sum(counts) == pytest.approx(2.0 * hours * 8, rel=0.05)  # 4,000 +- 63 (1 sigma)
    periods = steps.slow_periods(5, 3600.0 * 10)
    start, end = periods[0]
    assert end - start == 60.0
    mean = 0.01 + 32e-3
    for now in np.linspace(start - 30, end + 30, 121):  # 3x inside a period, 1x outside
        inside = any(s <= now < e for s, e in periods)
        assert steps.step_s(5, 0, 32, now) == pytest.approx(3 * mean if inside else mean)
    # the fraction of time in a slow period: 1 - exp(-rate * duration) for a Poisson process
    grid = np.arange(0.0, hours * 3600.0, 17.0)
    slow = np.mean([steps.in_slow_period(0, t) for t in grid])
    assert slow == pytest.approx(1 - math.exp(-2.0 / 60), abs=0.01)
    # generated lazily in order: a far query first gives the same periods
    again = ComputeModel(cfg, "imagenet", 8, seed=3)
    again.in_slow_period(0, hours * 3600.0)
    assert again.slow_periods(0, 3600.0) == steps.slow_periods(0, 3600.0)


def test_a_recipe_missing_from_the_cluster_is_one_clear_line():
    with pytest.raises(ConfigError) as error:
        ComputeModel(compute(), "swb2000", 2, seed=0)
    message = str(error.value)
    assert message.startswith("cluster.compute.seconds_per_sample.swb2000: the cluster gives no ")
    assert "(it has: imagenet)" in message and "Fix: +cluster.compute" in message
    assert "\n" not in message


# ---- presets ------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "measured"])
def test_every_preset_composes_validates_and_times_every_recipe(preset):
    typed = validate(compose_all([f"cluster={preset}"], False, "config")[0])
    cfg = OmegaConf.to_object(typed.cluster)
    assert cfg.name == preset and cfg.description
    nprocs = cfg.nodes * cfg.gpus_per_node or 1024
    cluster = ClusterModel(cfg, nprocs)
    assert cluster.allreduce_s(list(range(nprocs)), 1.4e8) > 0
    for recipe in RECIPES.names():
        assert ComputeModel(cfg.compute, recipe, nprocs, seed=0).step_s(0, 0, 32, 0.0) > 0


def test_every_preset_extends_the_schema_and_marks_its_assumptions():
    for preset in PRESETS:
        text = (REPO / "conf" / "cluster" / f"{preset}.yaml").read_text()
        assert yaml.safe_load(text)["defaults"] == ["/schema/cluster@_here_", "_self_"]
        assert preset == "measured" or "# assumption:" in text


def test_measured_needs_a_summary():
    with pytest.raises(UserError, match="cluster.from_summary: cluster=measured needs"):
        validate(compose_all(["cluster=measured"], False, "config")[0])


# ---- cluster=measured ---------------------------------------------------------------------
def write_run(run_dir: Path, summary: dict | str | None = None, run: dict | None = None,
              parameters: int = 250_000) -> Path:
    """A run dir as adpsgd-run leaves it: 2 ranks of SSGD, 100 steps each, 6,400 samples,
    1 MB of float32 parameters (one bucket), known times."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    torch.save({"model": {"w": torch.zeros(parameters), "steps": torch.tensor(3)}},
               run_dir / "checkpoints" / "final_rank0.pt")
    base = {"trainer": {"batch_size": 32}, "comm": {"bucket_mb": 4.0},
            "faults": {"straggler": {"ranks": [], "factor": 1.0}, "delay_s": 0.0}}
    (run_dir / ".hydra" / "run.yaml").write_text(yaml.safe_dump({**base, **(run or {})}))
    if summary is None:
        summary = {"status": "completed", "algo": "ssgd", "recipe": "digit_images",
                   "nprocs": 2, "procs_per_node": 2, "samples": 6400, "train_s": 3.41,
                   "steps_per_rank": [100, 100],
                   "per_rank": [{"compute": 3.2, "comm": 0.12, "data": 9.0, "eval": 9.0},
                                {"compute": 3.0, "comm": 0.10, "data": 9.0, "eval": 9.0}]}
    path = run_dir / "summary.json"
    path.write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return path


def test_measured_fits_compute_and_link(tmp_path):
    base = ClusterConfig(compute=ComputeConfig(seconds_per_sample={"imagenet": 1e-3},
                                               jitter=0.1))
    cfg = measured_cluster(write_run(tmp_path / "run"), base)
    # (3.2 + 3.0) / 2 compute seconds per 3,200 samples a rank; data and eval left out
    assert cfg.compute.seconds_per_sample == {"imagenet": 1e-3,
                                              "digit_images": pytest.approx(3.1 / 3200)}
    assert cfg.compute.jitter == 0.1 and cfg.compute.contention == 0.0  # no host shared
    # 3.41 s of training, 3.21 s of it timed (compute + comm + idle, mean rank): 2 ms a step
    assert cfg.compute.step_overhead_s == pytest.approx(0.2 / 100)
    assert (cfg.name, cfg.gpus_per_node, cfg.nodes, cfg.allreduce) == ("measured", 2, 0, "ring")
    # 1.1 ms of comm per step = one ring allreduce of 1 MB over 2 ranks: M/B + 2 alpha
    assert cfg.intra_node == cfg.inter_node and cfg.intra_node.latency_us == 5.0
    assert cfg.intra_node.bandwidth_gbps == pytest.approx(1e6 / (1.1e-3 - 10e-6) * 8 / 1e9)
    assert ClusterModel(cfg, 2).allreduce_s([0, 1], 1e6) == pytest.approx(1.1e-3)


def test_measured_ranks_sharing_cores_count_the_barrier_wait_as_compute(tmp_path):
    summary = json.loads(write_run(tmp_path / "plain").read_text())
    summary["per_rank"][0].update(idle=0.40, milestone_wait=0.10)
    summary["per_rank"][1].update(idle=0.20, milestone_wait=0.10)
    summary["hosts"] = [{"name": "laptop", "cores": 1, "ranks": 2}]
    summary["train_s"] = 3.71  # 3.51 s timed (mean rank), 2 ms a step not
    cfg = measured_cluster(write_run(tmp_path / "shared", summary))
    contention = (0.3 / 3.2 + 0.1 / 3.0) / 2  # waits outside milestones per compute second
    assert cfg.compute.contention == pytest.approx(contention)
    assert cfg.compute.step_overhead_s == pytest.approx(0.2 / 100)
    model = ComputeModel(cfg.compute, "digit_images", 2, seed=0, straggler_ranks=[1],
                         straggler_factor=4)
    per_sample = 3.1 / 3200
    assert model.mean_step_s(0, 32) == pytest.approx(
        cfg.compute.step_overhead_s + 32 * per_sample * (1 + contention))
    # a straggler's own step is 4x; its wait for a core is not
    assert model.mean_step_s(1, 32) == pytest.approx(
        4 * (cfg.compute.step_overhead_s + 32 * per_sample) + 32 * per_sample * contention)
    # any collective takes at least what the run's allreduce took per step (1.1 ms)
    assert cfg.rendezvous_s == pytest.approx(1.1e-3)
    model = ClusterModel(cfg, 2)
    assert model.broadcast_s([0, 1], 64) == pytest.approx(1.1e-3)
    assert model.allreduce_s([0, 1], 1e6) == pytest.approx(1.1e-3)
    assert model.allreduce_s([0, 1], 1e7) == pytest.approx(10 * (1.1e-3 - 10e-6) + 10e-6)
    summary["hosts"] = [{"name": "node", "cores": 8, "ranks": 2}]  # a core per rank
    dedicated = measured_cluster(write_run(tmp_path / "dedicated", summary))
    assert dedicated.compute.contention == 0 and dedicated.rendezvous_s == 0
    assert ClusterModel(dedicated, 2).broadcast_s([0, 1], 64) < 1e-4


def test_measured_leaves_out_stragglers_and_injected_delays(tmp_path):
    faults = {"straggler": {"ranks": [0], "factor": 4.0}, "delay_s": 0.004}
    cfg = measured_cluster(write_run(tmp_path / "run", run={"faults": faults}))
    # rank 1 only, less 100 steps x 2 ms of mean delay
    assert cfg.compute.seconds_per_sample["digit_images"] == pytest.approx(2.8 / 3200)


def test_measured_through_the_config(tmp_path):
    path = write_run(tmp_path / "run")
    typed = validate(compose_all(["cluster=measured", f"cluster.from_summary={path}",
                                  "cluster.compute.jitter=0.05"], False, "config")[0])
    cfg = resolved(OmegaConf.to_object(typed.cluster))
    assert cfg.compute.jitter == 0.05 and cfg.gpus_per_node == 2
    assert ComputeModel(cfg.compute, "digit_images", 4, seed=0).mean_step_s(0, 32) == \
        pytest.approx(0.2 / 100 + 32 * 3.1 / 3200)


@pytest.mark.parametrize("damage, expected", [
    ("no summary", "cannot read .*summary.json: No such file"),
    ("not json", "summary.json is not valid JSON"),
    ("a list", "is not a summary.json"),
    ("no status", "has no 'status' entry"),
    ("failed", "a run that did not complete .status failed."),
    ("adpsgd", "calibrates the network from an SSGD run .* not adpsgd on 2"),
    ("no run.yaml", "cannot read .*run.yaml, the run config beside"),
    ("no checkpoint", "final_rank0.pt is missing"),
    ("bad checkpoint", "cannot read the model in .*final_rank0.pt"),
    ("no comm", "spent no measurable time communicating"),
    ("bad hosts", "has a damaged 'hosts' entry"),
    ("no train_s", "has no 'train_s' entry"),
])
def test_a_missing_or_damaged_run_is_one_line_naming_the_file(tmp_path, damage, expected):
    path = write_run(tmp_path / "run")
    summary = json.loads(path.read_text())
    if damage == "no summary":
        path.unlink()
    elif damage == "not json":
        path.write_text('{"status": "compl')
    elif damage == "a list":
        path.write_text("[]")
    elif damage == "no status":
        path.write_text(json.dumps({k: v for k, v in summary.items() if k != "status"}))
    elif damage in ("failed", "adpsgd"):
        key, value = ("status", "failed") if damage == "failed" else ("algo", "adpsgd")
        path.write_text(json.dumps({**summary, key: value}))
    elif damage == "no run.yaml":
        (path.parent / ".hydra" / "run.yaml").unlink()
    elif damage == "no checkpoint":
        (path.parent / "checkpoints" / "final_rank0.pt").unlink()
    elif damage == "bad checkpoint":
        (path.parent / "checkpoints" / "final_rank0.pt").write_bytes(b"PK\x03\x04 torn")
    elif damage == "no comm":
        for rank in summary["per_rank"]:
            rank["comm"] = 0.0
        path.write_text(json.dumps(summary))
    elif damage == "bad hosts":
        path.write_text(json.dumps({**summary, "hosts": [{"name": "h", "cores": "2"}]}))
    elif damage == "no train_s":
        path.write_text(json.dumps({k: v for k, v in summary.items() if k != "train_s"}))
    with pytest.raises(UserError, match=expected) as error:
        measured_cluster(path)
    fix = "algo=ssgd" if damage == "adpsgd" else "cluster.from_summary=RUN_DIR/summary.json"
    assert "\n" not in str(error.value) and "Fix: " in str(error.value) and fix in str(error.value)


@pytest.mark.slow
def test_measured_from_a_real_ssgd_run(tmp_path):
    run_dir = tmp_path / "calib"
    run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=2", "trainer.epochs=1",
             "trainer.progress=false", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = measured_cluster(run_dir / "summary.json")
    per_rank = summary["samples"] / 2
    expected = np.mean([t["compute"] for t in summary["per_rank"]]) / per_rank
    assert cfg.compute.seconds_per_sample["digit_images"] == pytest.approx(expected)
    state = torch.load(run_dir / "checkpoints" / "final_rank0.pt", weights_only=True)["model"]
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    comm_per_step = np.mean([t["comm"] / s for t, s in zip(summary["per_rank"],
                                                            summary["steps_per_rank"])])
    assert ClusterModel(cfg, 2).allreduce_s([0, 1], nbytes) == pytest.approx(comm_per_step)
    assert cfg.gpus_per_node == summary["procs_per_node"] and "digit_images" in cfg.description


# ---- hosts with slower links, and the lab ------------------------------------------------
def test_a_slow_node_link_limits_what_crosses_it():
    """cluster.node_bandwidth_factor: node 1's link at a tenth; a message between nodes
    takes the slower end's link, a ring allreduce over every node the slowest link's rate."""
    cfg = dataclasses.replace(CLUSTER, nodes=3, node_bandwidth_factor={"1": 0.1})
    model = ClusterModel(cfg, 12)
    assert model.link(0, 4).bandwidth_Bps == pytest.approx(B_INTER / 10)  # node 0 to node 1
    assert model.link(0, 8).bandwidth_Bps == pytest.approx(B_INTER)  # nodes 0 and 2
    assert model.link(4, 5) == model.intra  # inside the slow node: its memory, not its link
    ring = 2 * 2 / 3 * 1e6 / (B_INTER / 10) + 2 * 2 * A_INTER
    assert model.allreduce_s([0, 4, 8], 1e6) == pytest.approx(ring)
    assert model.allreduce_s([0, 8], 1e6) == pytest.approx(1e6 / B_INTER + 2 * A_INTER)
    with pytest.raises(ConfigError, match="node_bandwidth_factor"):
        dataclasses.replace(CLUSTER, node_bandwidth_factor={"1": 2.0}).check("cluster", None)


def test_hosts_of_one_machine_share_its_cores(tmp_path):
    """The lab's hosts are namespaces of one machine (one boot id): four hosts of one rank
    each on 2 cores are ranks sharing cores, as one host of four ranks would be."""
    summary = json.loads(write_run(tmp_path / "plain").read_text())
    summary["per_rank"][0].update(idle=0.40, milestone_wait=0.10)
    summary["hosts"] = [{"name": f"lab{i}", "cores": 2, "ranks": 1, "machine": "b00t"}
                        for i in (1, 2, 3)]
    assert measured_cluster(write_run(tmp_path / "lab", summary)).compute.contention > 0
    for i, host in enumerate(summary["hosts"]):  # three machines: a core per rank
        host["machine"] = f"m{i}"
    assert measured_cluster(write_run(tmp_path / "three", summary)).compute.contention == 0


def test_measured_takes_the_network_benchmarks_link(tmp_path):
    """cluster.from_network: latency and bandwidth fitted to the exchanges measured at the
    rate asked for (here exactly 1 ms + M / 100 MB/s); the run's allreduce fits nothing."""
    sizes = [64, 1024, 16384]
    network = tmp_path / "busbw.json"
    network.write_text(json.dumps({"runs": [
        {"hosts": 4, "rate": "1gbit", "seconds": {
            "exchange": {str(kb): 1e-3 + kb * 1024 / 1e8 for kb in sizes}}},
        {"hosts": 4, "rate": "100mbit", "seconds": {"exchange": {}}}]}))
    base = ClusterConfig(from_network=str(network), network_rate="1gbit", gpus_per_node=2)
    cfg = measured_cluster(write_run(tmp_path / "run"), base)
    assert cfg.inter_node.latency_us == pytest.approx(1000.0)
    assert cfg.inter_node.bandwidth_gbps == pytest.approx(0.8)
    assert cfg.intra_node == base.intra_node and cfg.gpus_per_node == 2
    with pytest.raises(UserError, match="no exchange measured at 100mbit"):
        measured_cluster(write_run(tmp_path / "other"),
                         dataclasses.replace(base, network_rate="100mbit"))

