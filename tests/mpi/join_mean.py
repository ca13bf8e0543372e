"""mpiexec -n 4 python join_mean.py RUN_DIR: spares joining asynchronous learners at a loss
start from the survivors' mean x and momentum (ranks 0-2 survived, rank 3 joins), and the
survivors keep theirs."""

import sys

import torch

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_on_ranks


def momenta(algo) -> list[torch.Tensor]:
    return [algo.optimizer_x.state[p]["momentum_buffer"]
            for group in algo.optimizer_x.param_groups for p in group["params"]]


def checks(world_mpi):
    rank = world_mpi.Get_rank()
    comm = Communicator(world_mpi, "mpi")
    trainer, node = build_trainer(world_mpi, comm, sys.argv[1],
                                  compose_config(["algo=adpsgd", "launcher.nprocs=4"]))
    algo = trainer.algo
    # Survivor r holds x = r + 1 and momentum -(r + 1); the joiner holds its donor's copy
    # (here 100), which the survivors' mean replaces: over all three (AD-PSGD), or over
    # ranks 0 and 1 when rank 2 shares rank 1's super learner (H-ADPSGD: each counted once;
    # its x would be rank 1's, 3 is only a probe that it is left out).
    for counted, mean in ((rank != 3, 2.0), (rank in (0, 1), 1.5)):
        value = 100.0 if rank == 3 else rank + 1.0
        with algo.lock:
            for x in algo.x:
                x.fill_(value)
            for group in algo.optimizer_x.param_groups:
                for p in group["params"]:
                    algo.optimizer_x.state[p]["momentum_buffer"] = torch.full_like(p, -value)
        algo.start_joiners_at_the_mean(comm, joining=rank == 3, counted=counted)
        expected = mean if rank == 3 else value
        assert all(bool((x == expected).all()) for x in algo.x), [x[:3] for x in algo.x]
        assert all(bool((m == -expected).all()) for m in momenta(algo))
        if rank == 3:  # the model its next gradient is computed on
            assert all(bool((r == expected).all()) for r in algo.replica)
    algo.finish()
    node.close()
    comm.close()
    return "joined at the mean" if rank == 3 else "kept its own"


run_on_ranks(checks)
