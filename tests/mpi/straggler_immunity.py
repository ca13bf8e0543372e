"""mpiexec -n 4 python straggler_immunity.py RUN_DIR CASES_JSON: rank 3 computes ten times
slower; the steps each rank took (summary.json's ``steps_per_rank``) tell whether the others
went on without it. The first override is ``min_ratio=R``: the slowest other learner's steps
over the straggler's must be at least R (asynchronous algorithms), or, with ``R = 1``, every
rank's steps must be equal (lockstep algorithms, the control).

Each case also checks that the injection itself works: rank 3's compute seconds per step are
well above the others' (the trainer's shared loop injects the delay for every algorithm).

Learners are ranks, except for hadpsgd, where the straggler's node partner is as slow as it
by design (the node is synchronous) and the other node is what must go on.
"""

import statistics

from runner.comm.communicator import Communicator

from harness import build_trainer, compose_config, run_cases_on_ranks


def checks(world_mpi, run_dir, overrides):
    min_ratio = float(overrides[0].removeprefix("min_ratio="))
    comm = Communicator(world_mpi, "mpi")
    cfg = compose_config([*overrides[1:], "launcher.nprocs=4", "launcher.procs_per_node=2",
                          "faults.straggler.ranks=[3]", "faults.straggler.factor=10",
                          "trainer.epochs=2", "trainer.batch_size=16"])
    trainer, node = build_trainer(world_mpi, comm, run_dir, cfg)
    summary = comm.bcast_object(trainer.run())
    node.close()
    per_step = comm.allgather_objects(trainer.timers.seconds["compute"] / trainer.step)
    comm.close()
    assert per_step[3] > 3 * statistics.median(per_step[:3]), f"not slowed: {per_step}"
    steps = summary["steps_per_rank"]
    slow = steps[3]
    others = steps[:2] if cfg.algo.name == "hadpsgd" else steps[:3]
    ratio = min(others) / slow
    if min_ratio == 1:
        assert len(set(steps)) == 1, f"lockstep ranks took different steps: {steps}"
    else:
        # The typical learner goes on at min_ratio; every one at least at 2/3 of it: with 4
        # ranks on 2 loaded cores one learner can lose CPU for reasons that are not the
        # algorithm's (a CI run saw [79, 29, 65, 12]: 2.4x for rank 1, 5.4x for the median).
        typical = statistics.median(others) / slow
        assert typical >= min_ratio and ratio >= 2 * min_ratio / 3, (
            f"steps {steps}: the others took {typical:.2f}x (median), {ratio:.2f}x (least)")
    return f"steps per rank {steps}, ratio {ratio:.2f}"


run_cases_on_ranks(checks)
