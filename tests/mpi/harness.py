"""Run checks on every rank; a failing rank aborts the whole job instead of hanging peers."""

import hashlib
import json
import os
import sys
import threading
import time
import traceback

import torch

from runner.comm.world import mpi


def run_on_ranks(check) -> None:
    """Call ``check(world_comm)`` on this rank; print its message, or abort every rank."""
    world = mpi().COMM_WORLD
    try:
        message = check(world)
    except BaseException:  # noqa: BLE001 - any failure must end the job with a non-zero status
        print(f"rank {world.Get_rank()}: FAILED", flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
        sys.exit(1)  # in case Abort returns before the process is killed
    print(f"rank {world.Get_rank()}: {message}", flush=True)


def run_cases_on_ranks(check) -> None:
    """Run ``check(world_comm, run_dir, overrides)`` for every case of one job.

    ``sys.argv[1]`` is a run dir and ``sys.argv[2]`` a JSON object {case: [override, ...]}.
    Starting ranks costs seconds (imports), so one job runs many cases. Each rank prints its
    own line per case (``rank R: case NAME: MESSAGE`` or ``... FAILED ...``) as soon as it has
    one, then the ranks agree on every rank's outcome before the next case starts:

    * all passed, or only assertions failed: the ranks are in step, the next case runs;
    * some rank raised anything else: every rank has reported, the job aborts;
    * some rank does not end the case within ``CASE_AGREE_S`` of the first one that did (a
      rank that failed early left its peers inside a collective it never joined): the ranks
      that did end it say which ranks are missing, and the job aborts instead of hanging.
    """
    world = mpi().COMM_WORLD
    # Outcomes travel on a communicator of their own, so that they can never be matched
    # with a collective that a case left pending on the world communicator.
    outcomes = world.Dup()
    run_dir, cases = sys.argv[1], json.loads(sys.argv[2])
    for case_number, (name, overrides) in enumerate(cases.items()):
        # The ranks start each case together (the first after imports that take seconds
        # more on one rank than another), so that ending it measures only the case.
        outcomes.Barrier()
        fatal = ""  # the traceback of an error other than a failed assertion
        try:
            message = check(world, f"{run_dir}/{name}", overrides)
        except AssertionError as failure:
            message = f"FAILED {failure}"
        except BaseException:  # noqa: BLE001 - any other failure must end the job
            message, fatal = "FAILED with the traceback below", traceback.format_exc()
        report(world, name, message)
        if fatal:
            sys.stderr.write(fatal)
            sys.stderr.flush()
        missing, fatal_anywhere = agree(outcomes, case_number, fatal)
        if missing:
            report(world, name, f"FAILED rank(s) {', '.join(map(str, missing))} did not end "
                   f"this case within {CASE_AGREE_S:.0f} s of rank {world.Get_rank()}: they "
                   "wait in a collective that a failed rank left; aborting the job")
        if missing or fatal_anywhere:
            # Abort kills the job's output path too: give mpiexec time to pass on the lines
            # just written (a loaded machine lost "did not end this case" without it).
            time.sleep(2)
            world.Abort(1)
            sys.exit(1)  # in case Abort returns before the process is killed
    outcomes.Free()


# How long a rank that ended a case waits for the others to end it too. Ranks of one case end
# within seconds of each other (they share collectives); this only bounds a broken case.
CASE_AGREE_S = float(os.environ.get("ADPSGD_TEST_CASE_AGREE_S", "120"))


def agree(outcomes, case_number: int, fatal: bool | str) -> tuple[list[int], bool]:
    """Tell every rank whether this rank's case ended in a fatal error and hear theirs, with
    point-to-point messages so that a rank that never comes is seen, by name. Returns the
    ranks not heard from within CASE_AGREE_S and whether any rank heard from was fatal."""
    me, size = outcomes.Get_rank(), outcomes.Get_size()
    sends = [outcomes.isend(bool(fatal), dest=r, tag=case_number) for r in range(size) if r != me]
    pending = {r: outcomes.irecv(source=r, tag=case_number) for r in range(size) if r != me}
    fatal_anywhere = bool(fatal)
    deadline = time.monotonic() + CASE_AGREE_S
    while pending and time.monotonic() < deadline:
        for r, request in list(pending.items()):
            done, theirs = request.test()
            if done:
                fatal_anywhere |= bool(theirs)
                del pending[r]
        time.sleep(0.02)
    if not pending:
        for request in sends:
            request.wait()
    return sorted(pending), fatal_anywhere


def report(world, case: str, message: str) -> None:
    # One write per line: mpiexec merges the ranks' output streams.
    sys.stdout.write(f"rank {world.Get_rank()}: case {case}: {' '.join(message.split())}\n")
    sys.stdout.flush()


def compose_config(overrides: list[str]):
    """The validated run config for ``overrides``, as the CLI would compose it (on the
    digit images unless the overrides pick another recipe)."""
    from hydra import compose, initialize_config_module

    import recipes  # noqa: F401 - fills the recipe registry, as the commands do
    from runner.commands.compose import validate

    with initialize_config_module(config_module="runner.conf", version_base=None):
        return validate(compose("config", overrides=[
            "recipe=digit_images", "trainer.progress=false", *overrides]))


def build_trainer(world_mpi, comm, run_dir, cfg):
    """A Trainer on this rank for ``cfg``; returns it and the node communicator to close."""
    from runner.comm.communicator import Communicator
    from runner.comm.world import detect_world
    from runner.trainer import Trainer

    world, node_mpi = detect_world(world_mpi, cfg.launcher.procs_per_node)
    node = Communicator(node_mpi, "mpi", name="node", traffic=comm.traffic)
    return Trainer(cfg, run_dir, world, comm, node, torch.device("cpu")), node


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Recorder:
    """Wraps an AD-PSGD learner's update, snapshot and merge (a leader's, for H-ADPSGD) to
    record, under its lock, what they did to x: the sum of the updates applied, the digests of
    every state x had, whether each snapshot sent was one of them, and each exchange's peer
    with the digests of the two snapshots averaged. With a lower precision on the wire
    (comm.exchange_dtype) the states are x's values rounded to it, as snapshots are."""

    def __init__(self, algo):
        self.algo, self.averager = algo, algo.averager
        lock = threading.RLock()  # the wrappers hold it around the originals, which take it
        algo.lock = self.averager.lock = lock
        self.lock = lock
        self.applied = [torch.zeros_like(t) for t in algo.x]
        self.wire = self.averager.snapshots[0].dtype
        self.states = {self.state()}
        self.snapshots_existed = []
        self.exchanges = []  # (peer, digest sent, digest received), in order
        self._wrap()

    def state(self) -> str:
        return digest([t.to(self.wire) for t in self.algo.x])

    def _wrap(self):
        algo, averager = self.algo, self.averager
        apply_update, snapshot, merge = algo.apply_update, averager._snapshot, averager._merge

        def recorded_update(optimizer):
            with self.lock:
                before = [t.clone() for t in algo.x]
                apply_update(optimizer)
                for total, now, then in zip(self.applied, algo.x, before):
                    total.add_(now - then)
                self.states.add(self.state())

        def recorded_snapshot(*key):
            with self.lock:
                counts = snapshot(*key)
                self.snapshots_existed.append(digest(averager.snapshots) in self.states)
                return counts

        def recorded_merge(their_counts, peer, started, *key):
            with self.lock:
                # _merge turns the received buffers into (received - sent) in place.
                sent, got = digest(averager.snapshots), digest(averager.received)
                merge(their_counts, peer, started, *key)
                self.states.add(self.state())
                self.exchanges.append((peer, sent, got))

        algo.apply_update = recorded_update
        averager._snapshot = recorded_snapshot
        averager._merge = recorded_merge


def gather_learners(comm, algo, recorder, start) -> list[dict]:
    """Every learner's record (leaders only; ordered by participant): its x at ``start`` and
    now, and what its recorder saw."""
    mine = None
    if recorder is not None:
        mine = {"participant": algo.averager.rank, "start": start,
                "x": [t.clone() for t in algo.x], "applied": recorder.applied,
                "exchanges": recorder.exchanges, "existed": recorder.snapshots_existed}
    return sorted((r for r in comm.allgather_objects(mine) if r),
                  key=lambda r: r["participant"])


def conservation_error(learners) -> float:
    """Largest relative error, over the flat buffers, of sum_i x_i = sum_i start_i + sum of
    every update applied; also checks that the models really learned."""
    worst = 0.0
    for i in range(len(learners[0]["x"])):
        total_start = sum(r["start"][i] for r in learners)
        total_end = sum(r["x"][i] for r in learners)
        applied = sum(r["applied"][i] for r in learners)
        error = (total_end - (total_start + applied)).norm() / total_start.norm()
        worst = max(worst, float(error))
        # ...and the learning was real: the models moved, by more than rounding.
        assert float(applied.norm()) > 1e-3 * float(total_start.norm()), "nothing learned"
    return worst


def matched_exchanges(learners) -> int:
    """Check that every snapshot sent was a state its x had and that in the k-th exchange of
    a pair each end received exactly what the other sent; return the number of exchanges."""
    for r in learners:
        assert r["existed"] and all(r["existed"]), \
            f"learner {r['participant']}: a snapshot that x never held"
    ends = 0
    for r in learners:
        for peer in {p for p, _, _ in r["exchanges"]}:
            mine = [(s, g) for p, s, g in r["exchanges"] if p == peer]
            theirs = [(s, g) for p, s, g in learners[peer]["exchanges"]
                      if p == r["participant"]]
            assert len(mine) == len(theirs), (r["participant"], peer)
            for (sent, got), (their_sent, their_got) in zip(mine, theirs):
                assert got == their_sent and their_got == sent, (r["participant"], peer)
            ends += len(mine)
    return ends // 2
