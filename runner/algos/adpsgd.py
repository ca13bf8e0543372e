"""AD-PSGD: asynchronous decentralized parallel SGD (docs/algorithms.md, AD-PSGD).

Logical update (one gradient of one learner i; one averaging of a pair i, j)::

    x_i, x_j <- (x_i + x_j) / 2               W_k = I - (e_i - e_j)(e_i - e_j)^T / 2
    x_i      <- x_i - gamma * g_i(xhat_i)     xhat_i: a possibly stale read of x_i

where g_i includes weight decay taken at the same read (the gradient of the regularized loss
at xhat_i).

How it runs. Each learner's model x is shared by two threads:

* the training thread computes g on a snapshot of x (copied into the model before every
  forward pass) and applies its optimizer step to x under a short lock. It never waits for
  communication.
* one gossip thread per learner (runner/comm/pairwise.py) owns the averaging: learners are
  split into actives (even) and passives (odd) (runner/topology/pairing.py); only an active
  starts an averaging, always with a passive neighbour in ``topology``'s graph, once per
  local step. ``pattern=fixed`` cycles through the neighbours by ring distance (on the ring:
  right, left, right...; ``topology=bipartite_exponential``: the paper's log-hop peers +-1,
  +-3, +-5, +-9...); ``pattern=random`` picks one uniformly (``topology=complete``: any
  passive, TASLP's randomized pattern). Both ends average exactly the two snapshots they
  exchanged and merge the result into x, which keeps the pair's sum and equals an atomic
  averaging followed by the gradients that arrived in the meantime. Waits only go from actives
  to passives, so no deadlock is possible.

Progress and the learning-rate schedule follow an estimate of global samples (every learner's
count, with when it was counted and its rate, rides on every exchange and is extrapolated to
now, runner/comm/global_clock.py; it is made exact at each evaluation, and the run ends only once
the exact count reached the budget): fast learners take more steps than slow ones. A learner
that reaches a milestone (evaluation, checkpoint) first announces it to every other learner
(runner/comm/milestone_signal.py), so that none lags behind while the others wait.
Evaluation and the end quiesce the gossip (no new exchange, a barrier, in-flight ones
completed): no learner exits while a peer waits on it. Momentum stays local (docs/algorithms.md).

Checkpoints are taken with the gossip quiesced (``pause()``: no exchange in flight anywhere),
under the model lock: each learner stores x, its optimizer state, the progress counters, the
exchange count (the peer schedule is a function of seed, learner and exchange count) and its
staleness record.
A job resumed with another number of ranks starts every learner from the mean of the saved
x and momentum, with a fresh gossip among the new pairs (runner/checkpoint/resize.py).

``delay_by_one=true`` selects the delay-by-one scheme instead (delay_by_one.py;
docs/algorithms.md, Delay-by-one).
Subclassed by hadpsgd.py, where each learner is a node of ranks (a super learner): every rank
of a node applies the same averaged gradient to its own copy of x, and the leader's x, which
alone gossips, is broadcast to the node only at steps after an averaging changed it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..comm.buffers import detached_copy, flatten_gradients
from ..comm.communicator import Communicator
from ..comm.milestone_signal import MilestoneSignal
from ..comm.pairwise import Capture, PairwiseAverager
from ..comm.world import mpi
from ..config.section import require
from ..errors import ConfigError
from ..lazy import torch
from ..topology import TOPOLOGIES
from ..topology.pairing import is_active, passive_peers, peer_schedule
from .base import AlgoConfig, Algorithm, sample_weight
from .registry import ALGORITHMS


@dataclass
class ADPSGDConfig(AlgoConfig):
    name: str = "adpsgd"
    # fixed: cycle through the topology's passive neighbours, nearest first; random: draw one
    pattern: str = "fixed"
    delay_by_one: bool = False  # docs/algorithms.md (Delay-by-one), lockstep
    timeout_s: float = 300.0  # an exchange with no answer for this long ends the job
    # write every operation on each learner's model to RUN_DIR/trace, which the simulator
    # replays (launcher=sim launcher.replay=RUN_DIR/trace)
    record_trace: bool = False

    def check(self, prefix, cfg):
        require(self.pattern in ("fixed", "random"), f"{prefix}.pattern",
                f"must be fixed or random, got {self.pattern!r}", f"{prefix}.pattern=fixed")
        require(self.timeout_s > 0, f"{prefix}.timeout_s", "must be > 0",
                f"{prefix}.timeout_s=300")


@ALGORITHMS.register("adpsgd")
class ADPSGD(Algorithm):
    Config = ADPSGDConfig
    asynchronous = True
    uses_topology = True  # its graph of active-passive pairs
    elastic = True
    background_checkpoints = True  # a cut after Chandy and Lamport (runner/comm/pairwise.py)

    @classmethod
    def build(cls, cfg, ctx):
        if cfg.delay_by_one:
            from .delay_by_one import DelayByOne

            return DelayByOne(cfg, ctx)
        return cls(cfg, ctx)

    @classmethod
    def participants(cls, run_cfg) -> int:
        return run_cfg.launcher.nprocs

    @classmethod
    def topology_ignored(cls, run_cfg) -> str | None:
        if run_cfg.algo.delay_by_one:
            return ("delay-by-one (algo.delay_by_one=true) exchanges along the perfect "
                    "matchings that algo.pattern sets (fixed: the ring's two alternating "
                    "matchings; random: a random matching of all learners)")
        return None

    @classmethod
    def check_world(cls, run_cfg):
        count = cls.participants(run_cfg)
        elastic = bool(run_cfg.launcher.get("elastic"))
        # An elastic job pairs odd numbers too (after a loss): one active more than passives;
        # delay-by-one leaves one learner out of each step's matching.
        if count > 1 and count % 2 and not elastic:
            raise ConfigError("launcher.nprocs", f"{cls.registered_name} pairs active and "
                              f"passive learners, so it needs an even number of them, got "
                              f"{count}", cls.even_fix(run_cfg))
        if count > 1 and not run_cfg.algo.delay_by_one:
            try:
                passive_peers(cls.topology(run_cfg), count)
            except ConfigError as error:
                if f"n={count}" not in error.cause:
                    raise
                # The topology speaks of n: say what n is here.
                raise ConfigError(error.key, f"{error.cause.split(': ', 1)[-1]} (n = "
                                  f"{cls.participants_phrase(run_cfg)})", error.fix) from None

    @classmethod
    def participants_phrase(cls, run_cfg) -> str:
        return f"launcher.nprocs = {cls.participants(run_cfg)} learners"

    @classmethod
    def topology(cls, run_cfg):
        return TOPOLOGIES.get(run_cfg.topology.name)(run_cfg.topology, seed=run_cfg.seed)

    @classmethod
    def even_fix(cls, run_cfg) -> str:
        return f"launcher.nprocs={run_cfg.launcher.nprocs + 1}"

    # ---- the group of ranks that forms one learner ---------------------------------------
    def learner_comm(self) -> Communicator:
        """Ranks that share one model: just this rank (hadpsgd: its node)."""
        return Communicator(mpi().COMM_SELF, "mpi", name="self", traffic=self.comm.traffic)

    def setup(self, model, optimizer):
        super().setup(model, optimizer)
        self.group = self.learner_comm()
        self.group_ranks = self.group.allgather_objects(self.world.rank)
        # Every rank's participant (its super learner's leader, the lowest rank of its group;
        # participants are numbered in their leaders' order) and that participant's size.
        leaders = self.comm.allgather_objects(self.group_ranks[0])
        order = sorted(set(leaders))
        self.participant_of = [order.index(leader) for leader in leaders]
        self.participant_size = [leaders.count(leader) for leader in leaders]
        self.local_samples = 0  # this rank's samples trained, as of its last step
        self.is_leader = self.group.rank == 0
        self.replica = self.ctx.param_buffers  # what forward/backward run on
        self.grads = flatten_gradients(model.parameters())
        self.x = [flat.detach().clone() for flat in self.replica]
        self.lock = threading.Lock()
        # The trainer's parameter groups over views of x. Their weight decay is taken at the
        # replica the gradient was computed on (part of g, see the docstring), so that every
        # rank of a super learner computes the same update whether or not its leader's x has
        # changed by an averaging since.
        from .optim import SGD, flat_param_groups  # a subclass of torch's: imports it

        params = list(model.parameters())
        groups = flat_param_groups(optimizer.param_groups, params, self.x, self.grads)
        at_replica = flat_param_groups(optimizer.param_groups, params, self.replica, self.grads)
        self._decay = [(group["weight_decay"], [p.grad for p in group["params"]],
                        [p.detach() for p in group["params"]])
                       for group in at_replica if group.get("weight_decay")]
        for group in groups:
            group["weight_decay"] = 0.0
        self.optimizer_x = SGD(groups, lr=optimizer.defaults["lr"])
        world_mpi = self.comm.mpi_comm
        leaders = world_mpi.Split(0 if self.is_leader else mpi().UNDEFINED, self.world.rank)
        self.averager = None
        self.signal = None
        self.trace: list[list] | None = None  # operations on x (algo.record_trace)
        self.staleness: list[int] = []
        if self.is_leader and leaders.Get_size() > 1:
            index, count = leaders.Get_rank(), leaders.Get_size()
            peers = passive_peers(self.topology(self.ctx.cfg), count).get(index, [])
            self.averager = PairwiseAverager(
                leaders, self.x, self.lock, is_active=is_active(index),
                next_peer=peer_schedule(self.cfg.pattern, peers, self.ctx.cfg.seed, index),
                timeout_s=self.cfg.timeout_s, traffic=self.comm.traffic, wire=self.wire)
            self.signal = MilestoneSignal(leaders, self.cfg.timeout_s)
            # Elastic: a lost peer is raised before a step (check_peers), never within one.
            self.averager.defer_errors = bool(self.ctx.cfg.launcher.get("elastic"))
            if self.cfg.record_trace:
                self.trace = self.averager.trace = []
                self.trace_index = index
        if leaders != mpi().COMM_NULL:
            leaders.Free()
        self._snapshot_version = 0
        self._shared_version = 0  # the leader's version the node's replicas last received

    def _refresh_replica(self, force: bool = False) -> None:
        """Copy x into the model the next gradient is computed on. In a super learner every
        rank stepped its own x alike; the leader's x is broadcast only when an averaging
        changed it since the last broadcast (or with ``force``)."""
        changed = force
        if self.is_leader:
            with self.lock:
                version = self.averager.version if self.averager else 0
                changed = changed or version != self._shared_version
                for replica, x in zip(self.replica, self.x):
                    replica.copy_(x)
                if self.trace is not None:
                    self.trace.append(["read"])
                self._shared_version = self._snapshot_version = version
        if self.group.size == 1:
            return
        with self.timers.time("comm"):
            changed = self.group.bcast_object(changed, root=0)
            if changed:
                for replica in self.replica:
                    self.group.broadcast_(replica, root=0)
        if not self.is_leader:
            for replica, x in zip(self.replica, self.x):
                x.copy_(replica) if changed else replica.copy_(x)

    # ---- hooks -------------------------------------------------------------------------
    def before_forward(self, step):
        self._refresh_replica()

    def gradient_weight(self, local_count, global_count):
        if self.group.size == 1:
            return 1.0
        # Inside a super learner, like SSGD: the mean over the node's samples of this step.
        node_count = sum(self.ctx.step_counts[r] for r in self.group_ranks)
        return sample_weight(local_count, self.group.size, node_count)

    def after_backward(self, step):
        if self.group.size > 1:  # a super learner averages its members' gradients
            with self.timers.time("comm"):
                for grad in self.grads:
                    self.group.allreduce_(grad, op="mean")

    def apply_update(self, optimizer):
        for group in self.optimizer_x.param_groups:
            group["lr"] = optimizer.param_groups[0]["lr"]
        for weight_decay, grads, params in self._decay:
            torch._foreach_add_(grads, params, alpha=weight_decay)
        with self.lock:
            self.optimizer_x.step()
            if self.trace is not None:
                self.trace.append(["apply", self.optimizer_x.param_groups[0]["lr"]])
            if self.averager:
                self.staleness.append(self.averager.version - self._snapshot_version)

    def global_samples(self, local_samples, lockstep_samples):
        self.local_samples = local_samples
        estimate = 0
        if self.averager:
            # A learner's samples are its members' (equal batches inside a node).
            self.averager.tick(local_samples * self.group.size)
            estimate = max(self.averager.global_samples(), self.signal.latest())
        elif self.is_leader:  # one learner: nothing to estimate
            # A super learner counts its node's samples; a lone learner (an elastic job's
            # last) its own, which the lost learners' are added to (runner/trainer/loop.py).
            estimate = lockstep_samples if self.group.size > 1 else local_samples
        if self.group.size > 1:  # every member follows its leader's clock
            estimate = self.group.bcast_object(estimate, root=0)
        return estimate

    def milestone_reached(self, samples):
        if self.signal:
            self.signal.announce(samples)

    def sync_global_samples(self, exact):
        # Exact per-learner counts, over the world's control communicator (the gossip
        # thread's communicator stays its own). Leaders appear in world-rank order, which is
        # their order among participants.
        table = self.averager.progress if self.averager else None
        mine = int(table.counts[table.rank]) if table else None
        counts = [c for c in self.comm.allgather_objects(mine) if c is not None]
        if table:
            with self.lock:
                table.set_exact(counts)
        if self.signal:
            self.signal.met(exact)

    def pause(self):
        if self.averager:
            self.averager.quiesce(self.comm.barrier)
        else:
            self.comm.barrier()  # take part in the leaders' quiescence barrier
        self._refresh_replica()  # evaluate x itself

    def resume(self):
        if self.averager:
            self.averager.resume()

    def finish(self):
        if self.averager:
            self.averager.stop(self.comm.barrier)
            self.signal.close()
            if self.trace is not None:
                from .trace import write_trace

                write_trace(self.ctx.run_dir / "trace", self.trace_index, self.trace)
        else:
            self.comm.barrier()
        self._refresh_replica()

    def heard_samples(self) -> list[float]:
        """Every rank's samples trained, as this one last heard: its participant's count in
        the progress table (a leader's), shared evenly among the participant's ranks, which
        train alike; this rank's own participant's exactly. A super learner's other members
        know only that one (0 for the others)."""
        counts = None
        if self.averager:
            with self.lock:
                counts = self.averager.progress.counts.astype(float)
        mine = self.participant_of[self.world.rank]
        return [float(self.local_samples) if participant == mine
                else 0.0 if counts is None
                else float(counts[participant]) / self.participant_size[rank]
                for rank, participant in enumerate(self.participant_of)]

    def check_peers(self):
        if self.averager:
            self.averager.raise_if_failed()

    def close(self):
        if self.averager:  # after a loss: its communicators are revoked
            self.averager.abandon()
            self.signal.abandon()

    def continue_after_loss(self, previous):
        # The survivors' samples carry over (exact: each says its own); x, its optimizer
        # state and the staleness record are the same objects' (the trainer's model).
        # A participant's count is its ranks' samples (they train alike): what its members
        # lost with a learner count as the lost learner's (Membership.lost_samples).
        self.local_samples = previous.local_samples
        mine = self.local_samples * self.group.size if self.is_leader else None
        counts = [c for c in self.comm.allgather_objects(mine) if c is not None]
        with self.lock:
            for mine_x, old_x in zip(self.x, previous.x):
                mine_x.copy_(old_x)
            self.optimizer_x.load_state_dict(previous.optimizer_x.state_dict())
            if self.averager:
                self.averager.progress.set_exact(counts)
        self.staleness = previous.staleness
        self._refresh_replica(force=True)
        self._share_leader_momentum()

    def _momentum_buffers(self, comm: Communicator) -> list[torch.Tensor]:
        """x's momentum buffers, if every rank of ``comm`` has them (collective)."""
        buffers = [state["momentum_buffer"] for group in self.optimizer_x.param_groups
                   for p in group["params"]
                   if (state := self.optimizer_x.state.get(p)) is not None
                   and state.get("momentum_buffer") is not None]
        most, fewest = comm.allreduce_numbers([len(buffers), -len(buffers)], op="max")
        return buffers if most == -fewest else []

    def _share_leader_momentum(self) -> None:
        """A super learner's ranks step x alike only with the same momentum: after a loss or
        a join (a spare came with other momentum), the leader's goes to the node."""
        if self.group.size == 1:
            return
        for buffer in self._momentum_buffers(self.group):
            self.group.broadcast_(buffer, root=0)

    def start_joiners_at_the_mean(self, comm: Communicator, joining: bool,
                                  counted: bool) -> None:
        """Collective over ``comm``, the learners after spares joined at a loss (those not
        ``joining`` survived it), before the algorithm is rebuilt for them: a joiner's x and
        momentum become the mean over the participants that survived, each given by one
        ``counted`` survivor (AD-PSGD: every one; a super learner: its lowest rank).
        Averaging keeps the participants' mean model; a joiner started there leaves it where
        it was, where a copy of one learner would pull it towards that one (a fast learner
        far from the others, on a busy machine). A joiner that lands in a super learner with
        survivors takes that one's x and momentum instead, when the algorithm is rebuilt
        (continue_after_loss)."""
        buffers = self._momentum_buffers(comm)
        tensors = list(self.x) + buffers
        with self.lock:
            total = torch.cat([t.reshape(-1).double() for t in tensors])
        if not counted:
            total.zero_()
        participants = comm.allreduce_numbers([int(counted)], op="sum")[0]
        comm.allreduce_(total, "sum")
        if not joining:
            return
        with self.lock:
            offset = 0
            for t in tensors:
                t.copy_(total[offset:offset + t.numel()].view_as(t) / participants)
                offset += t.numel()
        self._refresh_replica(force=True)

    def heard_counts(self, samples, stamps):
        if not self.averager:
            return
        participants = max(self.participant_of) + 1
        counts, when = [0] * participants, [0.0] * participants
        for rank, participant in enumerate(self.participant_of):  # a node's ranks add up
            counts[participant] += samples[rank]
            when[participant] = max(when[participant], stamps[rank])
        with self.lock:
            self.averager.progress.heard(counts, when)

    def copy_parameters(self):
        with self.lock:  # x itself, not the replica the last gradient was computed on
            return [t.clone() for t in self.x]

    def shared_update_group(self):
        return self.group if self.group.size > 1 else None  # a super learner's members

    def _optimizer_state(self) -> dict:
        """Copies of the optimizer's state and the staleness record, which training may go
        on from (under the model lock, which the gossip thread merges under too)."""
        return {"optimizer": detached_copy(self.optimizer_x.state_dict()),
                "staleness": torch.tensor(self.staleness, dtype=torch.int64)}

    def state_dict(self):
        with self.lock:  # the gossip is quiesced; the lock makes that no assumption
            state = {"x": [t.clone() for t in self.x], **self._optimizer_state()}
            if self.averager:
                state["gossip"] = self.averager.counters()
        return state

    def capture_state(self):
        if self.averager:
            return self.averager.capture(self._optimizer_state)
        with self.lock:
            return Capture(0, [t.clone() for t in self.x], {}, self._optimizer_state())

    def captured_state_dict(self, capture):
        if self.averager:
            self.averager.settle(capture)
        return {"x": capture.x, **capture.more,
                **({"gossip": capture.gossip} if capture.gossip else {})}

    def load_state_dict(self, state):
        with self.lock:
            for mine, saved in zip(self.x, state["x"]):
                mine.copy_(saved)
            self.optimizer_x.load_state_dict(state["optimizer"])
            self.staleness = state["staleness"].tolist()
            if self.averager:
                a, gossip = self.averager, state["gossip"]
                a.progress.set_exact(gossip["counts"].tolist())
                a.exchanges, a.version = gossip["exchanges"], gossip["version"]
                a.partners = dict(gossip["partners"])
                self._snapshot_version = self._shared_version = a.version
        self._refresh_replica(force=True)

    def load_merged_state(self, state, step, epoch):
        # x is the model and optimizer_x holds its momentum: both the mean over the old
        # learners. The gossip starts afresh among the new pairs.
        with self.lock:
            for mine, mean in zip(self.x, state["x"]):
                mine.copy_(mean)
            self.optimizer_x.load_state_dict(state["optimizer"])
        self._refresh_replica(force=True)

    def stats(self):
        out = {}
        if not self.averager:
            return out
        staleness = self.staleness or [0]
        averager = self.averager
        if averager.staged and averager.staged_bytes:  # a GPU model staged through the host
            megabytes = averager.staged_bytes / 2**20
            out["staging_ms_per_mb"] = 1000 * averager.staging_s / megabytes
            out["staging_ms_per_exchange"] = 1000 * averager.staging_s / max(1,
                                                                               averager.exchanges)
        return {**out, "exchanges": float(self.averager.exchanges),
                "staleness_mean": float(np.mean(staleness)),
                "staleness_max": float(np.max(staleness))}
