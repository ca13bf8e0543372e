"""mpiexec -n 4 python termination.py RUN_DIR CASES_JSON: per case, train REPEATS times (the
first override, ``repeats=N``) with random per-step delays, rank 3 ten times slower, and
evaluations every few steps; every repetition must end (the pytest wrapper kills the job if one
hangs)."""

import time

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks


def checks(world_mpi, run_dir, overrides):
    repeats = int(overrides[0].removeprefix("repeats="))
    comm = Communicator(world_mpi, "mpi")
    durations = []
    for repeat in range(repeats):
        cfg = compose_config([
            *overrides[1:], f"seed={repeat}", "launcher.nprocs=4", "faults.straggler.ranks=[3]",
            "faults.straggler.factor=10", "faults.delay_s=0.004", "trainer.eval_every=3",
            "trainer.epochs=1", "trainer.batch_size=64"])
        started = time.perf_counter()
        trainer, node = build_trainer(world_mpi, comm, f"{run_dir}/{repeat}", cfg)
        summary = trainer.run()
        node.close()
        durations.append(time.perf_counter() - started)
        if trainer.world.is_main:
            assert summary["status"] == "completed"
    comm.close()
    return f"{repeats} runs ended, longest {max(durations):.1f} s"


run_cases_on_ranks(checks)
