"""The modelled cluster (``cluster=NAME``, conf/cluster/): how long a learner computes a step,
and what the network costs, in virtual seconds.

**Compute.** A step of ``b`` samples on learner ``i`` takes on average::

    ((step_overhead_s + b * seconds_per_sample[recipe]) * straggler
     + b * seconds_per_sample[recipe] * contention) * slow

(``straggler``: faults.straggler.factor on faults.straggler.ranks, else 1: the learner's steps
take that many times longer; ``contention``: compute.contention, the extra seconds per compute
second of learners that share processors (waiting for a core, which a straggler does not
lengthen), 0 on a machine with one per learner; ``slow``: compute.slow_factor while
learner ``i`` is in one of its random slow periods, else 1), times a gamma-distributed factor
of mean 1 and coefficient of variation ``compute.jitter``. Slow
periods start as a Poisson process of ``slow_period_rate_per_hour`` per learner and last
``slow_period_s``; a step's factor is the one in force when it starts.

**Network.** A link costs ``alpha + M / B`` per message (runner/sim/network.py); ranks of one
node use ``intra_node``, others ``inter_node``. :class:`ClusterModel` gives the closed forms of
the collectives (its docstrings hold the formulas).

**Measured.** :func:`measured_cluster` fits a cluster to a real run's summary.json
(``cluster=measured cluster.from_summary=RUN_DIR/summary.json``).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..config.cluster import (
    SUMMARY_FIX,
    ClusterConfig,
    ComputeConfig,
    LinkConfig,
    check_fits,
)
from ..errors import ConfigError, UserError
from .network import Link, ring_allreduce_s


def as_link(cfg: LinkConfig) -> Link:
    """Microseconds and gigabits per second to seconds and bytes per second."""
    return Link(latency_s=cfg.latency_us * 1e-6, bandwidth_Bps=cfg.bandwidth_gbps * 1e9 / 8)


# ---- compute ------------------------------------------------------------------------------
JITTER_STREAM, SLOW_STREAM = 0, 1
BLOCK = 256  # jitter factors are drawn per learner in blocks of this many steps


class ComputeModel:
    """Seconds of one learner's step; the same (seed, learner, step) gives the same seconds
    whatever the order of the calls (each learner's draws come from its own seeded streams)."""

    def __init__(self, cfg: ComputeConfig, recipe: str, nprocs: int, seed: int,
                 straggler_ranks: list[int] | tuple[int, ...] = (),
                 straggler_factor: float = 1.0):
        table = dict(cfg.seconds_per_sample)
        if recipe not in table:
            raise ConfigError(f"cluster.compute.seconds_per_sample.{recipe}",
                              f"the cluster gives no compute time for recipe {recipe} (it has: "
                              f"{', '.join(sorted(table)) or 'none'})",
                              f"+cluster.compute.seconds_per_sample.{recipe}=SECONDS (one GPU's "
                              "seconds per sample), or cluster=measured with a run of it")
        self.cfg = cfg
        self.per_sample = float(table[recipe])
        self.seed = int(seed) % 2**63
        self.factor = np.ones(nprocs)
        self.factor[list(straggler_ranks)] = straggler_factor
        self.shape = 1.0 / cfg.jitter**2 if cfg.jitter > 0 else None
        self._draws: dict[int, tuple[int, np.ndarray]] = {}
        self._slow: dict[int, tuple[np.random.Generator, list[float]]] = {}

    def mean_step_s(self, learner: int, batch: int) -> float:
        """The mean of a step outside slow periods."""
        own = (self.cfg.step_overhead_s + batch * self.per_sample) * float(self.factor[learner])
        return own + batch * self.per_sample * self.cfg.contention

    def step_s(self, learner: int, step: int, batch: int, now: float) -> float:
        """Seconds of ``learner``'s step ``step`` of ``batch`` samples, started at ``now``."""
        seconds = self.mean_step_s(learner, batch) * self._jitter(learner, step)
        return seconds * self.cfg.slow_factor if self.in_slow_period(learner, now) else seconds

    def _jitter(self, learner: int, step: int) -> float:
        if self.shape is None:
            return 1.0
        block, index = divmod(step, BLOCK)
        cached = self._draws.get(learner)
        if cached is None or cached[0] != block:
            rng = np.random.default_rng([self.seed, learner, JITTER_STREAM, block])
            cached = (block, rng.standard_gamma(self.shape, BLOCK) / self.shape)
            self._draws[learner] = cached
        return float(cached[1][index])

    def slow_periods(self, learner: int, until: float) -> list[tuple[float, float]]:
        """``learner``'s slow periods (start, end) that start before ``until``."""
        starts = self._starts(learner, until)
        end = bisect.bisect_left(starts, until)
        return [(s, s + self.cfg.slow_period_s) for s in starts[:end]]

    def in_slow_period(self, learner: int, now: float) -> bool:
        if self.cfg.slow_period_rate_per_hour <= 0 or self.cfg.slow_factor == 1:
            return False
        starts = self._starts(learner, now)
        last = bisect.bisect_right(starts, now) - 1  # periods last equally: the latest decides
        return last >= 0 and now < starts[last] + self.cfg.slow_period_s

    def _starts(self, learner: int, until: float) -> list[float]:
        """The start times, generated in order (so independent of the queries) past ``until``."""
        if self.cfg.slow_period_rate_per_hour <= 0:
            return []
        if learner not in self._slow:
            rng = np.random.default_rng([self.seed, learner, SLOW_STREAM])
            self._slow[learner] = (rng, [])
        rng, starts = self._slow[learner]
        mean_gap = 3600.0 / self.cfg.slow_period_rate_per_hour
        while not starts or starts[-1] <= until:
            starts.append((starts[-1] if starts else 0.0) + float(rng.exponential(mean_gap)))
        return starts


# ---- network ------------------------------------------------------------------------------
class ClusterModel:
    """Where ranks sit (``procs_per_node`` consecutive ranks to a node) and what links and
    collectives cost. alpha, B: latency and bandwidth of the slowest link a collective uses
    (the inter-node one as soon as its ranks span two nodes); n ranks, M bytes."""

    def __init__(self, cfg: ClusterConfig, nprocs: int, procs_per_node: int | None = None):
        self.cfg = cfg
        self.nprocs = nprocs
        self.procs_per_node = procs_per_node or cfg.gpus_per_node
        check_fits(cfg, nprocs, self.procs_per_node)
        self.intra, self.inter = as_link(cfg.intra_node), as_link(cfg.inter_node)
        self.node_factor = {int(node): float(f)
                            for node, f in dict(cfg.node_bandwidth_factor).items()}

    def node_of(self, rank: int) -> int:
        return rank // self.procs_per_node

    def node_link(self, node: int) -> Link:
        """A node's own link to the network (inter_node's, unless that node's is slower)."""
        factor = self.node_factor.get(node, 1.0)
        return Link(self.inter.latency_s, self.inter.bandwidth_Bps * factor)

    def link(self, a: int, b: int) -> Link:
        """Within a node the intra-node link; between nodes the slower of the two nodes' own
        links to the network (a message leaves one and enters the other)."""
        na, nb = self.node_of(a), self.node_of(b)
        if na == nb:
            return self.intra
        return min(self.node_link(na), self.node_link(nb), key=lambda k: k.bandwidth_Bps)

    def transfer_s(self, a: int, b: int, nbytes: float) -> float:
        """One message from ``a`` to ``b`` on idle links: alpha + M / B (0 to itself)."""
        return 0.0 if a == b else self.link(a, b).transfer_s(nbytes)

    def _groups(self, ranks: list[int]) -> dict[int, int]:
        groups: dict[int, int] = {}
        for rank in ranks:
            groups[self.node_of(rank)] = groups.get(self.node_of(rank), 0) + 1
        return groups

    def slowest(self, ranks: list[int]) -> Link:
        """The slowest link among ``ranks``: the largest latency, the smallest bandwidth."""
        groups = self._groups(ranks)
        used = ([self.intra] if max(groups.values()) > 1 else []) + (
            [self.node_link(node) for node in groups] if len(groups) > 1 else [])
        return Link(max(link.latency_s for link in used),
                    min(link.bandwidth_Bps for link in used))

    def allreduce_s(self, ranks: list[int], nbytes: float) -> float:
        """Closed forms on idle links (Thakur, Rabenseifner and Gropp 2005), cluster.allreduce,
        and at least ``cluster.rendezvous_s``:

        * ring: ``2 (n-1)/n M/B + 2 (n-1) alpha`` (reduce-scatter, then allgather);
        * tree: ``2 ceil(log2 n) (alpha + M/B)`` (binomial reduce, then binomial broadcast);
        * hierarchical, with S nodes of at most L of the ranks (a = intra-node, e = inter-node
          link): ``2 (L-1)/L M/B_a + 2 (L-1) alpha_a + 2 (S-1)/S M/B_e + 2 (S-1) alpha_e``:
          a ring reduce-scatter inside each node (each local rank then holds M/L of the node's
          sum), the inter-node ring allreduce of those shards (the L shard rings share the
          node's interface, so together they take what one ring of M among the node leaders
          takes), and a ring allgather inside each node. S = 1 or L = 1 give the plain ring.
        """
        if len(ranks) <= 1:
            return 0.0
        return max(self._allreduce_s(ranks, nbytes), self.cfg.rendezvous_s)

    def _allreduce_s(self, ranks: list[int], nbytes: float) -> float:
        n = len(ranks)
        if self.cfg.allreduce == "tree":
            link = self.slowest(ranks)
            return 2 * math.ceil(math.log2(n)) * link.transfer_s(nbytes)
        if self.cfg.allreduce == "hierarchical":
            groups = self._groups(ranks)
            return (ring_allreduce_s(max(groups.values()), nbytes, self.intra)
                    + ring_allreduce_s(len(groups), nbytes, self._leaders(groups)))
        return ring_allreduce_s(n, nbytes, self.slowest(ranks))

    def _leaders(self, groups: dict[int, int]) -> Link:
        """The slowest of the nodes' own links, which a ring among their leaders crosses."""
        if len(groups) <= 1:
            return self.inter
        return self.slowest([self.procs_per_node * node for node in groups])

    def broadcast_s(self, ranks: list[int], nbytes: float) -> float:
        """M bytes from one of ``ranks`` to the others, on idle links (at least
        ``cluster.rendezvous_s``):

        * tree: ``ceil(log2 n) (alpha + M/B)`` (binomial tree);
        * ring: ``(ceil(log2 n) + n - 1) alpha + 2 (n-1)/n M/B`` (binomial scatter of M/n
          pieces, then a ring allgather: van de Geijn's broadcast for large messages);
        * hierarchical: the ring form among the S node leaders (inter-node link), then inside
          each node among its L ranks (intra-node link).
        """
        if len(ranks) <= 1:
            return 0.0
        return max(self._broadcast_s(ranks, nbytes), self.cfg.rendezvous_s)

    def _broadcast_s(self, ranks: list[int], nbytes: float) -> float:
        n = len(ranks)
        if self.cfg.allreduce == "tree":
            return math.ceil(math.log2(n)) * self.slowest(ranks).transfer_s(nbytes)
        if self.cfg.allreduce == "hierarchical":
            groups = self._groups(ranks)
            return (_scatter_allgather_s(len(groups), nbytes, self._leaders(groups))
                    + _scatter_allgather_s(max(groups.values()), nbytes, self.intra))
        return _scatter_allgather_s(n, nbytes, self.slowest(ranks))


def _scatter_allgather_s(n: int, nbytes: float, link: Link) -> float:
    if n <= 1:
        return 0.0
    return ((math.ceil(math.log2(n)) + n - 1) * link.latency_s
            + 2 * (n - 1) / n * nbytes / link.bandwidth_Bps)


# ---- cluster=measured ---------------------------------------------------------------------
# A single run has one message size, so latency and bandwidth cannot both be fitted: the
# latency is assumed (an MPI message between processes of one machine or over a fast fabric
# takes microseconds) and capped at half of the measured time per message.
MEASURED_LATENCY_US = 5.0


def resolved(cfg: ClusterConfig) -> ClusterConfig:
    """The cluster a simulation uses: ``cfg``, or for ``from_summary`` the measured one."""
    return measured_cluster(cfg.from_summary, cfg) if cfg.from_summary else cfg


def measured_cluster(summary_path: str | Path, base: ClusterConfig | None = None
                     ) -> ClusterConfig:
    """A cluster fitted to a completed SSGD run: its summary.json, the .hydra/run.yaml beside
    it and its checkpoints/final_rank0.pt (for the model's bytes). What is set from the run:

    * ``compute.seconds_per_sample[recipe]``: each rank's compute seconds (forward, backward,
      update; data loading and evaluation are timed apart and left out), less the mean
      injected delay (faults.delay_s / 2 per step), divided by the samples it computed
      (the run's samples times its share of the steps); the mean over ranks that were not
      injected stragglers.
    * ``compute.step_overhead_s``: the seconds per step of the slowest rank's training time
      that no compute, comm or idle timer covered (data loading, the loop's own Python). One
      batch size cannot separate a fixed cost inside the compute timer from a per-sample one:
      that part stays in the per-sample time (exact at the run's batch size).
    * ``compute.contention``: on a host with more ranks than cores (summary ``hosts``), a
      rank waiting at SSGD's allreduce is mostly waiting while the others compute on the cores
      it gave up, so that wait (idle less the waits at evaluations and checkpoints) per second
      of compute is part of computing there. With a core per rank it is imbalance, not
      compute, and contention = 0. There, too, ``rendezvous_s`` is the run's allreduce time
      per step: any collective, however small, waits for its ranks to be scheduled (without
      it, H-ADPSGD's per-step flag and count broadcasts would cost microseconds).
    * ``intra_node`` and ``inter_node`` (both the same link): SSGD's communication not hidden
      behind backward (summary ``comm`` seconds per step, mean over ranks) is taken as the
      ring allreduce of the model's floating-point bytes in ``ceil(M / comm.bucket_mb)``
      buckets: ``t = 2 (n-1)/n M/B + k 2 (n-1) alpha``. alpha is assumed (MEASURED_LATENCY_US,
      at most half of t) and B solved for. This is an effective link: a simulated step of
      compute then allreduce, with no overlap, takes what the run's step took. Nothing tells
      an intra-node link from an inter-node one here (the local launcher's nodes share one
      machine), so both get it.
    * ``gpus_per_node`` = the run's procs_per_node; ``nodes`` = 0 (any number);
      ``allreduce`` = ring (the form fitted).

    Everything else (jitter, slow periods, other recipes' times) comes from ``base``.
    """
    path = Path(summary_path)
    summary = _read_json(path)
    run = _read_run_yaml(path)
    algo, n = _field(summary, "algo", path), int(_field(summary, "nprocs", path))
    if _field(summary, "status", path) != "completed":
        raise UserError(f"{path} is the summary of a run that did not complete "
                        f"(status {summary['status']})", SUMMARY_FIX)
    if algo != "ssgd" or n < 2:
        raise UserError(f"{path}: cluster=measured calibrates the network from an SSGD run of 2 "
                        f"or more ranks (one allreduce of the whole gradient per step), not "
                        f"{algo} on {n}", "measure with algo=ssgd launcher.nprocs=2 or more")
    recipe, ppn = _field(summary, "recipe", path), int(_field(summary, "procs_per_node", path))
    per_rank, steps = _field(summary, "per_rank", path), _field(summary, "steps_per_rank", path)
    samples = float(_field(summary, "samples", path))
    if len(per_rank) != n or len(steps) != n or sum(steps) <= 0 or samples <= 0:
        raise UserError(f"{path} has no per-rank times or steps for its {n} ranks",
                        SUMMARY_FIX)
    shared = any(ranks > cores for ranks, cores in _machines(_hosts(summary, path)))
    per_sample, overhead, contention = _fitted_compute(summary, run, path, shared)
    link, comm, nbytes = _fitted_allreduce_link(path, run, per_rank, steps)
    base = _as_cluster(base)
    intra = link
    if base.from_network:
        # The links the network benchmark measured between hosts; inside a host the base's
        # (the lab's hosts are one machine's namespaces: their ranks share memory).
        link, intra = network_link(base.from_network, str(base.network_rate)), base.intra_node
        shared_collectives = False  # the collectives' time is the network's, not scheduling
    else:
        shared_collectives = shared
    compute = dataclasses.replace(
        base.compute, step_overhead_s=overhead, contention=contention,
        seconds_per_sample={**dict(base.compute.seconds_per_sample), recipe: per_sample})
    batch = (run.get("trainer") or {}).get("batch_size")
    return dataclasses.replace(
        base, name="measured", gpus_per_node=max(ppn, base.gpus_per_node), nodes=0,
        compute=compute, intra_node=intra, inter_node=dataclasses.replace(link),
        allreduce="ring", from_summary=str(path),
        rendezvous_s=comm if shared_collectives else 0.0,
        description=f"measured from {path}: {recipe}, ssgd on {n} ranks ({ppn} per node), "
                    f"batch {batch} per rank, {nbytes / 1e6:.3g} MB of parameters"
                    + (f", ranks sharing cores (contention {contention:.2f})"
                       if contention else ""))


def _fitted_compute(summary: dict, run: dict, path: Path, shared: bool
                    ) -> tuple[float, float, float]:
    """``measured_cluster``'s compute: seconds per sample, per-step overhead and contention
    (``shared``: ranks shared a host's cores)."""
    per_rank, steps = summary["per_rank"], summary["steps_per_rank"]
    n, samples = len(per_rank), float(summary["samples"])
    faults = run.get("faults") or {}
    straggler = faults.get("straggler") or {}
    slowed = set(straggler.get("ranks") or []) if straggler.get("factor", 1) > 1 else set()
    delay = float(faults.get("delay_s") or 0.0) / 2
    normal = [r for r in range(n) if r not in slowed] or list(range(n))
    per_sample = float(np.mean([(per_rank[r]["compute"] - steps[r] * delay)
                                / (samples * steps[r] / sum(steps)) for r in normal]))
    train_s = float(_field(summary, "train_s", path))
    timed = np.mean([sum(per_rank[r].get(k, 0.0) for k in ("compute", "comm", "idle"))
                     for r in range(n)])
    overhead = max(0.0, (train_s - float(timed)) / max(steps))
    contention = 0.0
    if shared:
        contention = float(np.mean([
            (per_rank[r].get("idle", 0.0) - per_rank[r].get("milestone_wait", 0.0))
            / max(per_rank[r]["compute"] - steps[r] * delay, 1e-9) for r in normal]))
        contention = max(0.0, contention)
    return per_sample, overhead, contention


def _fitted_allreduce_link(path: Path, run: dict, per_rank: list[dict], steps: list[int]
                           ) -> tuple[LinkConfig, float, int]:
    """``measured_cluster``'s link: the one on which a ring allreduce of the model's bytes
    takes the run's communication seconds per step; those seconds; the model's bytes."""
    n = len(per_rank)
    nbytes = _model_bytes(path.parent / "checkpoints" / "final_rank0.pt")
    buckets = math.ceil(nbytes / (float((run.get("comm") or {}).get("bucket_mb", 4.0)) * 2**20))
    comm = float(np.mean([per_rank[r]["comm"] / max(steps[r], 1) for r in range(n)]))
    if comm <= 0:
        raise UserError(f"{path}: the run spent no measurable time communicating", SUMMARY_FIX)
    messages = 2 * (n - 1) * buckets
    alpha = min(MEASURED_LATENCY_US * 1e-6, comm / (2 * messages))
    bandwidth = 2 * (n - 1) / n * nbytes / (comm - messages * alpha)
    return LinkConfig(latency_us=alpha * 1e6, bandwidth_gbps=bandwidth * 8 / 1e9), comm, nbytes


def network_link(path: str | Path, rate: str) -> LinkConfig:
    """The link between two hosts that a network benchmark (benchmarks/bench_network.py)
    measured at ``rate``: latency and bandwidth fitted (least squares) to its pairwise
    exchanges, ``t = alpha + M / B`` over the message sizes, on the most hosts it ran."""
    path = Path(path)
    fix = ("cluster.from_network=docs/results/network/busbw.json (python "
           "benchmarks/bench_network.py) and a cluster.network_rate it measured")
    data = _read_json(path)
    runs = [r for r in data.get("runs", []) if r.get("rate") == rate
            and (r.get("seconds") or {}).get("exchange")]
    if not runs:
        rates = sorted({str(r.get("rate")) for r in data.get("runs", [])})
        raise UserError(f"{path} has no exchange measured at {rate} (it has: "
                        f"{', '.join(rates) or 'none'})", fix)
    measured = max(runs, key=lambda r: r["hosts"])["seconds"]["exchange"]
    sizes = np.array([int(kb) * 1024.0 for kb in measured])
    seconds = np.array([float(measured[kb]) for kb in measured])
    slope, intercept = np.polyfit(sizes, seconds, 1)
    if slope <= 0:
        raise UserError(f"{path}: the exchanges at {rate} do not take longer as they grow",
                        fix)
    return LinkConfig(latency_us=max(float(intercept), 0.0) * 1e6,
                      bandwidth_gbps=8 / float(slope) / 1e9)


def _as_cluster(base: Any) -> ClusterConfig:
    if base is None:
        return ClusterConfig()
    if isinstance(base, ClusterConfig):
        return base
    from omegaconf import OmegaConf  # a composed DictConfig

    return OmegaConf.to_object(base)


def _hosts(summary: dict, path: Path) -> list[dict]:
    """summary.json's hosts (absent in runs of older versions: none known to be shared)."""
    hosts = summary.get("hosts") or []
    valid = isinstance(hosts, list) and all(
        isinstance(h, dict) and isinstance(h.get("ranks"), int) and isinstance(h.get("cores"), int)
        for h in hosts)
    if not valid:
        raise UserError(f"{path} has a damaged 'hosts' entry (a list of name, cores, ranks)",
                        SUMMARY_FIX)
    return hosts


def _machines(hosts: list[dict]) -> list[tuple[int, int]]:
    """(ranks, cores) per machine: hosts with the same ``machine`` (namespaces of one kernel,
    as in the lab) share its cores; a host without one is a machine of its own."""
    machines: dict[str, list[int]] = {}
    for host in hosts:
        entry = machines.setdefault(str(host.get("machine") or host["name"]), [0, 0])
        entry[0] += host["ranks"]
        entry[1] = max(entry[1], host["cores"])
    return [(ranks, cores) for ranks, cores in machines.values()]


def _field(summary: dict, key: str, path: Path) -> Any:
    if key not in summary:
        raise UserError(f"{path} has no {key!r} entry (not a summary.json of adpsgd-run?)",
                        SUMMARY_FIX)
    return summary[key]


def _read_json(path: Path) -> dict:
    try:
        summary = json.loads(path.read_text())
    except OSError as ex:
        raise UserError(f"cannot read {path}: {ex.strerror or ex}", SUMMARY_FIX) from None
    except ValueError as ex:
        raise UserError(f"{path} is not valid JSON ({ex})", SUMMARY_FIX) from None
    if not isinstance(summary, dict):
        raise UserError(f"{path} is not a summary.json (no JSON object)", SUMMARY_FIX)
    return summary


def _read_run_yaml(summary_path: Path) -> dict:
    import yaml

    path = summary_path.parent / ".hydra" / "run.yaml"
    try:
        run = yaml.safe_load(path.read_text())
    except OSError as ex:
        raise UserError(f"cannot read {path}, the run config beside {summary_path}: "
                        f"{ex.strerror or ex}", SUMMARY_FIX) from None
    except yaml.YAMLError as ex:
        raise UserError(f"{path} is not valid YAML ({' '.join(str(ex).split())})",
                        SUMMARY_FIX) from None
    if not isinstance(run, dict):
        raise UserError(f"{path} is not a run config", SUMMARY_FIX)
    return run


def _model_bytes(path: Path) -> int:
    """Bytes of the floating-point tensors of the run's final model (batch-norm statistics
    included: under 1% of a ResNet-50's, none in the other recipes)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["model"]
        return sum(t.numel() * t.element_size() for t in state.values()
                   if t.is_floating_point())
    except FileNotFoundError:
        raise UserError(f"{path} is missing (a completed run writes its final model there)",
                        SUMMARY_FIX) from None
    except Exception as ex:  # noqa: BLE001 - torch raises many kinds for a damaged file
        raise UserError(f"cannot read the model in {path}: {' '.join(str(ex).split())[:200]}",
                        SUMMARY_FIX) from None
