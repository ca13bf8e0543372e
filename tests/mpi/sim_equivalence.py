"""mpiexec -n 4 python sim_equivalence.py RUN_DIR CASES_JSON: train each case on 4 real ranks
(tests/test_sim_equivalence.py then runs it under launcher=sim and compares the final models).
AD-PSGD and H-ADPSGD record their operations for the replay (algo.record_trace=true)."""

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks


def train(world_mpi, run_dir, overrides):
    comm = Communicator(world_mpi, "mpi")
    trainer, node = build_trainer(world_mpi, comm, run_dir, compose_config(overrides))
    trainer.run()
    node.close()
    comm.close()
    return "trained"


run_cases_on_ranks(train)
