"""mpiexec -n 4 python async_resume.py RUN_DIR CASES_JSON: AD-PSGD and H-ADPSGD resumed from a
checkpoint in the middle of a run keep the pair-sum invariant and the peer schedule.

A first run trains with a checkpoint every few steps (learning for real: float64, momentum,
weight decay, delays) and records every update applied to each learner's x
(harness.Recorder). A second run resumes from a checkpoint in the middle, which is all a run
killed right after it leaves on disk, and records the same. Then:

* the checkpoint is a consistent cut: the sum over learners of the x it holds equals the
  initial sum plus every update applied before it was taken (1e-10 relative): no exchange was
  half-merged into it;
* the resumed run conserves that sum too, and its exchanges match end to end;
* every active's peers after the resume are those the uninterrupted run had from the same
  exchange number on: the schedule continued where the checkpoint left it.
"""

from runner.checkpoint.files import complete_checkpoints, load_rank_state
from runner.comm.communicator import Communicator

from harness import (
    Recorder,
    build_trainer,
    compose_config,
    conservation_error,
    gather_learners,
    matched_exchanges,
    run_cases_on_ranks,
)

TOLERANCE = 1e-10
BASE = ["launcher.nprocs=4", "trainer.dtype=float64", "optim.momentum=0.9",
        "optim.weight_decay=1e-4", "faults.delay_s=0.003", "trainer.epochs=1",
        "trainer.batch_size=32", "trainer.keep_checkpoints=100"]


def train(world_mpi, run_dir, overrides, at_checkpoint=None):
    """One run with a recorder on every learner; ``at_checkpoint(step, recorder)`` is called
    as each checkpoint reads the gossip's counters (met: state_dict; beside training:
    capture_state; both under the model lock, with x), with this rank's step, which its file
    of that checkpoint records."""
    comm = Communicator(world_mpi, "mpi")
    trainer, node = build_trainer(world_mpi, comm, run_dir, compose_config(overrides))
    algo = trainer.algo
    recorder = Recorder(algo) if algo.averager else None
    start = [t.clone() for t in algo.x]
    if recorder and at_checkpoint:
        counters = algo.averager.counters

        def recording():  # under the model lock, right after x was read, met or captured
            at_checkpoint(trainer.state.step, recorder)
            return counters()

        algo.averager.counters = recording
    summary = trainer.run()
    node.close()
    learners = gather_learners(comm, algo, recorder, start)
    comm.close()
    return trainer, summary, learners


def actives_peers(learners) -> dict[int, list[int]]:
    return {r["participant"]: [p for p, _, _ in r["exchanges"]] for r in learners
            if r["participant"] % 2 == 0}


def checks(world_mpi, run_dir, overrides):
    rank = world_mpi.Get_rank()
    # This rank's step at a checkpoint -> (updates applied, exchanges) so far, for each
    # checkpoint taken at that step: an estimate that jumps past two checkpoint milestones
    # takes both at one step, the second beside training after the first was written.
    at: dict[int, list] = {}

    def remember(step, recorder):
        at.setdefault(step, []).append(([t.clone() for t in recorder.applied],
                                        len(recorder.exchanges)))

    first, _, whole = train(world_mpi, f"{run_dir}/whole",
                            [*BASE, *overrides, "trainer.checkpoint_every=4"], remember)
    middle = complete_checkpoints(f"{run_dir}/whole")
    chosen = len(middle) // 2 - 1
    checkpoint = middle[chosen]
    # A mid-run checkpoint, judged by what every rank reads alike: an assertion that one
    # rank fails alone (its own step count against rank 0's, which the marker holds, as
    # a rank starved of CPU did) leaves the others in the collective below.
    assert 0 < checkpoint.samples < middle[-1].samples, [c.samples for c in middle]
    # The checkpoint's x, as the files hold it, against the updates recorded up to it.
    learner = first.algo.averager.rank if first.algo.averager else None
    mine = None
    if learner is not None:
        saved = load_rank_state(checkpoint, rank)
        step = saved["trainer"]["step"]
        earlier = sum(load_rank_state(c, rank)["trainer"]["step"] == step
                      for c in middle[:chosen])
        applied, exchanged = at[step][earlier]
        state = saved["algo"]
        mine = {"participant": learner, "start": next(r for r in whole if r["participant"] ==
                                                     learner)["start"],
                "x": state["x"], "applied": applied, "exchanged": exchanged,
                "exchanges_saved": state["gossip"]["exchanges"]}
    cut = sorted((r for r in world_mpi.allgather(mine) if r), key=lambda r: r["participant"])
    cut_error = conservation_error(cut)
    assert cut_error < TOLERANCE, f"the checkpoint is no consistent cut: off by {cut_error:.3g}"

    second, summary, resumed = train(world_mpi, f"{run_dir}/resumed",
                                     [*BASE, *overrides, f"resume={checkpoint.path}"])
    for r, c in zip(resumed, cut):  # it started from the checkpoint's x
        assert all((a == b).all() for a, b in zip(r["start"], c["x"]))
    resumed_error = conservation_error(resumed)
    assert resumed_error < TOLERANCE, f"the resumed run moved the sum by {resumed_error:.3g}"
    exchanges = matched_exchanges(resumed)
    # The peer schedule goes on from the exchange count the checkpoint saved: each active's
    # peers after the resume are the uninterrupted run's from there, 2 at least (a fixed
    # pattern's whole cycle of 2 passives), 3 per active over all. How many the uninterrupted
    # run made after the capture is the machine's: CI saw an active with 2 (the resumed run
    # made 6 from there, the 2 matching), which one bound of 3 per active failed.
    compared, actives = 0, 0
    before, after = actives_peers(whole), actives_peers(resumed)
    for c in cut:
        if c["participant"] % 2:
            continue
        # Beside training an averaging in flight at the capture may be counted in it (both
        # its halves are in the cut's models): one more than were merged at the capture.
        assert c["exchanges_saved"] - c["exchanged"] in (0, 1), c
        expected = before[c["participant"]][c["exchanges_saved"]:]
        got = after[c["participant"]]
        n = min(len(expected), len(got))
        assert n >= 2 and expected[:n] == got[:n], (
            c["participant"], f"{len(expected)} exchange(s) after the capture, {len(got)} "
            "resumed", expected[:n], got[:n])
        compared, actives = compared + n, actives + 1
    assert compared >= 3 * actives, f"{compared} peers compared for {actives} actives"
    metric = summary.get("top1") if summary else None
    return (f"checkpoint at step {checkpoint.step} a consistent cut ({cut_error:.1e}); resumed "
            f"run conserved to {resumed_error:.1e}, {exchanges} exchanges matched, {compared} "
            "peers as scheduled" + (f", top-1 {metric:.2f}" if metric is not None else ""))


run_cases_on_ranks(checks)
