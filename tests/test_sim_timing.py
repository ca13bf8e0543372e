"""launcher.timing_only=true: the simulator's schedule without data or learning. A step of SSGD
on an idle cluster takes its compute plus the allreduce's closed form (short last batch
included); a straggler slows every SSGD learner but not AD-PSGD's others; the sizes default to
the recipe's model and training set; the launcher writes summary.json; every algorithm runs."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from recipes import RECIPES
from runner.errors import UserError
from runner.launch.sim import SimLauncher
from runner.sim.timing import SAMPLES_PER_EPOCH, TimingSimulation, model_bytes

from conftest import MPI_SCRIPTS

sys.path.insert(0, str(MPI_SCRIPTS))
from harness import compose_config  # noqa: E402

# conf/cluster/v100_16x4_ethernet.yaml: swb2000 takes 1.8e-2 s per utterance plus 1e-3 s a
# step; 4 GPUs per node, 10 us and 100 Gb/s (12.5 GB/s) between nodes.
PER_SAMPLE, OVERHEAD, ALPHA, BANDWIDTH = 1.8e-2, 1e-3, 10e-6, 12.5e9
M = 1e8  # bytes of the model
IDLE = ["cluster=v100_16x4_ethernet", "cluster.compute.jitter=0"]


def timing(overrides: list[str], tmp_path, n: int = 8, batch: int = 32, **sizes) -> dict:
    sizes = {"model_bytes": M, **sizes}
    cfg = compose_config(["recipe=swb2000", "launcher=sim", f"launcher.nprocs={n}",
                          "launcher.timing_only=true", f"trainer.batch_size={batch}",
                          "trainer.epochs=1", *IDLE, *overrides,
                          *(f"launcher.{k}={v}" for k, v in sizes.items() if v is not None)])
    return TimingSimulation(cfg, tmp_path).run()


def test_ssgd_step_is_compute_plus_the_allreduce(tmp_path):
    # 8 learners on 2 nodes: 10 full steps of 32 each, then a short one of 5 each
    s = timing(["algo=ssgd"], tmp_path, samples_per_epoch=8 * 32 * 10 + 8 * 5)
    allreduce = 2 * 7 / 8 * M / BANDWIDTH + 2 * 7 * ALPHA  # the ring over the inter-node link
    full, short = OVERHEAD + 32 * PER_SAMPLE, OVERHEAD + 5 * PER_SAMPLE
    assert s["steps"] == 11 and s["steps_per_rank"] == [11] * 8
    assert s["virtual_s"] == pytest.approx(10 * (full + allreduce) + short + allreduce)
    assert s["compute_s"] == pytest.approx(10 * full + short)
    assert s["comm_s"] == pytest.approx(11 * allreduce)
    assert s["idle_s"] == pytest.approx(0.0, abs=1e-12)
    assert s["epoch_s"] == pytest.approx(s["virtual_s"])
    assert s["samples_per_s"] == pytest.approx(2600 / s["virtual_s"])
    assert s["step_s"] == pytest.approx(s["virtual_s"] / 11)


def test_a_super_learner_step_waits_for_its_node_collectives(tmp_path):
    # One node of 4 (one super learner, nothing to gossip with, so x never changes between
    # reads): each step is its compute, the allreduce of the gradients and the two control
    # broadcasts (flag, sample count) over NVLink: 3 us, 400 Gb/s = 50 GB/s.
    s = timing(["algo=hadpsgd", "launcher.procs_per_node=4"], tmp_path, n=4,
               samples_per_epoch=4 * 32 * 10)
    alpha, bandwidth = 3e-6, 50e9
    allreduce = 2 * 3 / 4 * M / bandwidth + 2 * 3 * alpha
    control = (2 + 3) * alpha + 2 * 3 / 4 * 64 / bandwidth  # binomial scatter + ring allgather
    step = OVERHEAD + 32 * PER_SAMPLE
    assert s["steps_per_rank"] == [10] * 4
    assert s["virtual_s"] == pytest.approx(10 * (step + allreduce + 2 * control))
    assert s["comm_s"] == pytest.approx(10 * (allreduce + 2 * control))


def step_rates(s: dict, waits: bool = True) -> list[float]:
    """Each learner's steps per second of its own clock (``waits=False``: of its compute and
    communication, leaving out the idle time; AD-PSGD's is the wait at the final milestone)."""
    kinds = ("compute", "comm", "idle") if waits else ("compute", "comm")
    return [steps / sum(t[k] for k in kinds)
            for steps, t in zip(s["steps_per_rank"], s["per_rank"])]


def test_a_straggler_slows_ssgd_but_not_adpsgd_s_other_learners(tmp_path):
    slow = ["faults.straggler.ranks=[3]", "faults.straggler.factor=4"]
    spe = 8 * 32 * 40
    rates = {}
    for algo in (["algo=ssgd"], ["algo=adpsgd", "algo.pattern=fixed"]):
        for straggler in (False, True):
            run_dir = tmp_path / f"{algo[0]}-{straggler}"
            s = timing([*algo, *(slow if straggler else [])], run_dir, samples_per_epoch=spe)
            rates[algo[0], straggler] = step_rates(s, waits=algo[0] == "algo=ssgd")
    even, slowed = rates["algo=ssgd", False], rates["algo=ssgd", True]
    assert max(slowed) < 0.3 * min(even)  # every SSGD learner waits for the straggler
    even, slowed = rates["algo=adpsgd", False], rates["algo=adpsgd", True]
    others = [r for r in range(8) if r != 3]
    assert min(slowed[r] / even[r] for r in others) > 0.95
    assert slowed[3] == pytest.approx(even[3] / 4, rel=0.1)  # it alone runs 4x slower


def test_sizes_default_to_the_recipe_s_model_and_training_set(tmp_path):
    s = timing(["recipe=digit_images", "algo=ssgd"], tmp_path, model_bytes=None)
    cfg = compose_config(["recipe=digit_images"])
    recipe = RECIPES.get("digit_images")(cfg.recipe)
    parameters = sum(p.numel() for p in recipe.build_model().parameters())
    assert s["model_bytes"] == 4 * parameters  # float32
    assert s["samples_per_epoch"] == len(recipe.datasets()[0])
    # Each learner sent its ring share of every step's allreduce (2 (n - 1) / n of a model).
    n = s["nprocs"]
    assert s["bytes_sent"]["per_step"] == [2 * (n - 1) * s["model_bytes"] // n] * n
    # Models sent at 2 bytes a value take half the bytes; the model's size stays.
    half = timing(["recipe=digit_images", "algo=ssgd", "comm.exchange_dtype=bfloat16"],
                  tmp_path / "bf16", model_bytes=None)
    assert half["model_bytes"] == s["model_bytes"]
    assert half["bytes_sent"]["mean_per_step"] == s["bytes_sent"]["mean_per_step"] / 2
    # ImageNet's ResNet-50 without its data: 1,000 classes, 25,557,032 parameters
    imagenet = compose_config(["recipe=imagenet", "trainer.dtype=float64"])
    assert model_bytes(imagenet) == 8 * 25_557_032
    assert SAMPLES_PER_EPOCH["imagenet"] == 1_281_167


def test_an_epoch_of_swb2000_hadpsgd_on_64_gpus_takes_seconds(tmp_path):
    # H-ADPSGD on the machine of its paper: 16 super learners of 4 V100, the BLSTM's bytes
    s = timing(["algo=hadpsgd"], tmp_path, n=64, model_bytes=None)
    assert s["samples_per_epoch"] == 1_800_000 and s["procs_per_node"] == 4
    assert s["model_bytes"] == 4 * 34_856_477
    assert s["samples"] >= 1_800_000 and s["host_s"] < 60
    # compute of one utterance per GPU, 64 GPUs, about 1.8e-2 s each: over 500 s an epoch
    assert 1_800_000 * PER_SAMPLE / 64 < s["epoch_s"] < 1.2 * 1_800_000 * PER_SAMPLE / 64
    assert s["schedule_operations"] > 0 and sum(s["time_split"].values()) == pytest.approx(1)


def test_the_launcher_writes_summary_json(tmp_path, capsys):
    cfg = compose_config(["recipe=swb2000", "launcher=sim", "launcher.nprocs=8",
                          "launcher.timing_only=true", "launcher.model_bytes=1e8",
                          "launcher.samples_per_epoch=5000", "algo=hadpsgd", *IDLE])
    assert SimLauncher(cfg.launcher).launch(cfg, tmp_path) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["timing_only"] is True
    assert summary["algo"] == "hadpsgd" and summary["epoch_s"] > 0
    assert len(summary["steps_per_rank"]) == 8
    assert (tmp_path / "logs" / "sim.log").exists()
    assert "timing: hadpsgd x8 on v100_16x4_ethernet" in capsys.readouterr().out


@pytest.mark.parametrize("algo", [["algo=dpsgd", "topology=ring"],
                                  ["algo=local_sgd", "algo.period=2"], ["algo=dasgd"],
                                  ["algo=adpsgd", "algo.delay_by_one=true"]])
def test_every_lockstep_algorithm_has_a_schedule(algo, tmp_path):
    s = timing(algo, tmp_path, samples_per_epoch=8 * 32 * 6)
    assert s["steps_per_rank"] == [6] * 8 and s["virtual_s"] >= 6 * (OVERHEAD + 32 * PER_SAMPLE)


@pytest.mark.parametrize("override, key", [("launcher.model_bytes=0", "launcher.model_bytes"),
                                           ("launcher.samples_per_epoch=0",
                                            "launcher.samples_per_epoch"),
                                           ("launcher.replay=/tmp", "launcher.replay")])
def test_bad_sizes_are_one_line_errors(override, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        compose_config(["recipe=swb2000", "launcher=sim", "launcher.timing_only=true",
                        override])


def test_no_tensor_work(tmp_path):
    cfg = compose_config(["recipe=swb2000", "launcher=sim", "launcher.nprocs=4", "algo=ssgd",
                          "launcher.timing_only=true", "launcher.model_bytes=1e8", *IDLE])
    sim = TimingSimulation(cfg, tmp_path)
    assert sim.x.shape == (4, 1) and sim.nbytes == 1e8
    assert sim.gradients(sim.x, range(4), [None] * 4, [32] * 4).shape == (4, 1)
    assert torch.count_nonzero(sim.x) == 0


def test_a_background_reduction_between_nodes_costs_the_next_steps_cpu(tmp_path):
    """DaSGD (8 learners in 2 nodes, a reduction every step, merged a step later) reduces in
    the background while the learners compute: each ring allreduce sends 2 (n-1)/n M to the
    next learner; across the two node boundaries learners 3 and 7 send it to the other node,
    0 and 4 receive it from there, and their next step takes cpu_s_per_mb for each MB of it.
    SSGD's blocking allreduce is charged nothing: its CPU is in the time everyone waits."""
    spe = 8 * 32 * 10
    dasgd = ["algo=dasgd", "algo.tau=1", "algo.delay=1"]
    free = timing(dasgd, tmp_path / "free", samples_per_epoch=spe)
    charged = timing([*dasgd, "cluster.cpu_s_per_mb=0.002"], tmp_path / "charged",
                     samples_per_epoch=spe)
    charge = 2 * 7 / 8 * M / 1e6 * 0.002  # 175 MB sent (or received) between nodes a step
    assert charged["compute_s"] - free["compute_s"] == pytest.approx(9 * charge * 4 / 8)
    assert charged["bytes_sent"] == free["bytes_sent"]
    assert charged["virtual_s"] > free["virtual_s"]
    shared = [timing([*dasgd, "cluster.compute.contention=0.5", f"cluster.cpu_s_per_mb={mb_s}"],
                     tmp_path / f"shared{mb_s}", samples_per_epoch=spe)["compute_s"]
              for mb_s in (0.0, 0.002)]  # on shared processors the CPU costs 1.5 times as long
    assert shared[1] - shared[0] == pytest.approx(1.5 * (charged["compute_s"] - free["compute_s"]))
    ssgd = [timing(["algo=ssgd", f"cluster.cpu_s_per_mb={mb_s}"], tmp_path / f"ssgd{mb_s}",
                   samples_per_epoch=spe)["virtual_s"] for mb_s in (0.0, 0.002)]
    assert ssgd[0] == ssgd[1]


def test_asynchronous_exchanges_between_nodes_cost_cpu_and_slow_adpsgd(tmp_path):
    """AD-PSGD's averagings between nodes cost both ends' CPU: with cpu_s_per_mb, the same
    steps take longer; within one node (8 learners on 8 GPUs) nothing is charged."""
    spe = 8 * 32 * 20
    rates = {}
    for nodes, per_node in (("two", 4), ("one", 8)):
        for mb_s in (0.0, 0.002):
            s = timing(["algo=adpsgd", "algo.pattern=fixed", f"launcher.procs_per_node={per_node}",
                        f"cluster.gpus_per_node={per_node}", f"cluster.cpu_s_per_mb={mb_s}"],
                       tmp_path / f"{nodes}-{mb_s}", samples_per_epoch=spe)
            rates[nodes, mb_s] = s["samples_per_s"]
    assert rates["two", 0.002] < 0.9 * rates["two", 0.0]
    assert rates["one", 0.002] == pytest.approx(rates["one", 0.0])


def test_evaluations_beside_training_are_not_waited_for(tmp_path):
    """AD-PSGD scoring its evaluations beside training (trainer.eval_in_background): the
    modelled learners meet only where a checkpoint falls, as real ranks do, so an evaluation
    every few steps costs no waiting; met at each, it does."""
    straggler = ["algo=adpsgd", "trainer.eval_every=2", "faults.straggler.ranks=[1]",
                 "faults.straggler.factor=4"]
    beside = timing([*straggler, "trainer.eval_in_background=true"], tmp_path / "beside")
    met = timing(straggler, tmp_path / "met")
    assert beside["idle_s"] < 0.5 * met["idle_s"], (beside["idle_s"], met["idle_s"])
    assert beside["samples_per_s"] > met["samples_per_s"]
