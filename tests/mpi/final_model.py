"""mpiexec -n 4 python final_model.py RUN_DIR CASES_JSON: the model saved at the end
(checkpoints/final_rank0.pt) is exactly the one the final evaluation scored as rank 0's: no
exchange or merge may change it after it is scored (DaSGD merges its last reduction first).
Where the replicas differ, rank 0's model scored by rank 0 alone on the whole held-out set
gives what it gives broadcast and scored by every rank (runner/train/evaluation.py)."""

import math

import torch

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks


def checks(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([*overrides, "launcher.nprocs=4", "launcher.procs_per_node=2",
                          "trainer.epochs=2", "trainer.batch_size=16", "faults.delay_s=0.002"])
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    scored = {}
    evaluate = trainer.evaluate

    def recording_evaluate(final=False, **met):
        evaluate(final=final, **met)
        if final:  # what rank 0's split of the final evaluation scored
            scored.update({name: p.detach().clone()
                           for name, p in trainer.model.named_parameters()})

    trainer.evaluate = recording_evaluate
    trainer.run()
    alone = rank0_alone_equals_broadcast(trainer)
    node.close()
    comm.close()
    assert scored, "no final evaluation"
    if trainer.world.rank == 0:
        saved = torch.load(f"{run_dir}/checkpoints/final_rank0.pt", weights_only=True)["model"]
        changed = [name for name, value in scored.items() if not torch.equal(saved[name], value)]
        assert not changed, f"the saved model differs from the scored one in {changed}"
    return f"scored{alone}"


def rank0_alone_equals_broadcast(trainer) -> str:
    """Score eval_rank0 both ways (Evaluator.broadcast_s 0: broadcast; inf: rank 0 alone)
    once the final models are saved, each rank's moved apart from the others'; the same
    metrics, the sums taken in another order aside."""
    if trainer.algo.identical_replicas:
        return ""
    evaluator = trainer.evaluator
    noise = torch.Generator().manual_seed(trainer.world.rank)
    for flat in trainer.param_buffers:  # rank 0's model far from the others' and their mean
        flat.add_(torch.randn(flat.shape, generator=noise), alpha=0.02 * trainer.world.rank)
    evaluator.broadcast_s = 0.0
    sent = evaluator.score(identical_replicas=False, final=False).results["eval_rank0"]
    evaluator.broadcast_s = math.inf
    alone = evaluator.score(identical_replicas=False, final=False).results["eval_rank0"]
    assert sent.keys() == alone.keys() and all(
        math.isclose(sent[k], alone[k], rel_tol=1e-5, abs_tol=1e-9) for k in sent), (sent, alone)
    # A learner that joined an elastic job has measured no broadcast: every rank still takes
    # the same way (once, each decided from its own number, the collectives did not match).
    evaluator.broadcast_s = None if trainer.world.rank == trainer.world.size - 1 else math.inf
    joined = evaluator.score(identical_replicas=False, final=False).results["eval_rank0"]
    assert joined == alone, (joined, alone)
    return f"; rank 0's model alone as broadcast, top-1 {alone['top1']:.2f}"


if __name__ == "__main__":  # also run beside other checks (algorithm_cases.py)
    run_cases_on_ranks(checks)
