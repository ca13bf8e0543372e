"""mpiexec -n N python gossip_invariants.py RUN_DIR CASES_JSON: pure gossip (learning rate 0)
from different models per learner keeps the mean model and drives consensus distance to ~0;
asynchronous exchanges never overlap on a rank and always join an active and a passive."""

import torch
from omegaconf import open_dict

from runner.comm.buffers import parameter_digest
from runner.comm.communicator import Communicator
from runner.comm.world import detect_world
from runner.trainer import Trainer

from harness import compose_config, run_cases_on_ranks


def mean_model(trainer):
    return [trainer.comm.allreduce_(flat.detach().clone(), op="mean")
            for flat in trainer.param_buffers]


def checks(world_mpi, run_dir, overrides):
    cfg = compose_config([*overrides, "trainer.dtype=float64", "optim.momentum=0",
                          "optim.nesterov=false", "optim.weight_decay=0"])
    with open_dict(cfg):
        cfg.optim.lr = 0.0  # not a valid user value; here it isolates the gossip
    world, node_mpi = detect_world(world_mpi, cfg.launcher.procs_per_node)
    comm = Communicator(world_mpi, "mpi")
    node = Communicator(node_mpi, "mpi", name="node")
    trainer = Trainer(cfg, run_dir, world, comm, node, torch.device("cpu"))
    algo = trainer.algo
    # A different model per learner (a node is one learner for hadpsgd).
    learner = world.node if cfg.algo.name == "hadpsgd" else world.rank
    noise = torch.Generator().manual_seed(1000 + learner)
    for i, flat in enumerate(trainer.param_buffers):
        flat.add_(torch.randn(flat.shape, generator=noise, dtype=flat.dtype))
        if hasattr(algo, "x"):
            algo.x[i].copy_(flat)
    averager = getattr(algo, "averager", None)
    if averager:
        averager.record_intervals = True
    node_steps = []
    if cfg.algo.name == "hadpsgd":  # every gradient of a node is taken on one model
        compute_gradient = algo.before_backward

        def check_node_replicas(step):
            digests = node.allgather_objects(parameter_digest(trainer.param_buffers))
            assert len(set(digests)) == 1, f"replicas of node {world.node} differ at {step}"
            node_steps.append(digests[0])
            compute_gradient(step)

        algo.before_backward = check_node_replicas
    before_mean, before_xi = mean_model(trainer), trainer.evaluator.consensus_distance()
    trainer.run()
    if node_steps:  # ...and the model changed while the nodes gossiped
        assert len(set(node_steps)) > 1, "the node's model never changed"
    node.close()
    after_mean, after_xi = mean_model(trainer), trainer.evaluator.consensus_distance()
    comm.close()
    for a, b in zip(before_mean, after_mean):
        drift = (a - b).abs().max().item()
        assert drift <= 1e-10 * max(1.0, a.abs().max().item()), f"mean moved by {drift}"
    assert after_xi <= 1e-3 * before_xi, f"consensus {before_xi} -> {after_xi}"
    if averager:
        spans = sorted(averager.intervals)
        assert spans, "no exchange happened"
        assert all(end <= nxt for (_, end, _), (nxt, _, _) in zip(spans, spans[1:])), \
            "two exchanges at once"
        me = world.rank if cfg.algo.name != "hadpsgd" else world.node
        assert all((me + peer) % 2 == 1 for _, _, peer in spans), "exchange inside one role"
    return (f"mean kept, consensus {before_xi:.3g} -> {after_xi:.3g}"
            + (f", {len(averager.intervals)} exchanges" if averager else "")
            + (f", node replicas identical at {len(node_steps)} steps" if node_steps else ""))


if __name__ == "__main__":  # invariants.py runs its checks too
    run_cases_on_ranks(checks)
