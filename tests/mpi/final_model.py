"""mpiexec -n 4 python final_model.py RUN_DIR CASES_JSON: the model saved at the end
(checkpoints/final_rank0.pt) is exactly the one the final evaluation scored as rank 0's: no
exchange or merge may change it after it is scored (DaSGD merges its last reduction first)."""

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
    node.close()
    comm.close()
    assert scored, "no final evaluation"
    if trainer.world.rank != 0:
        return "scored"
    saved = torch.load(f"{run_dir}/checkpoints/final_rank0.pt", weights_only=True)["model"]
    changed = [name for name, value in scored.items() if not torch.equal(saved[name], value)]
    assert not changed, f"the saved model differs from the scored one in {changed}"
    return "scored"


if __name__ == "__main__":  # also run beside other checks (algorithm_cases.py)
    run_cases_on_ranks(checks)
