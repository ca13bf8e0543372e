"""The modelled cluster's settings (``cluster=NAME``, conf/cluster/): the schema of the
``cluster`` section that runner/sim/cluster.py models, here beside the run's other
sections (runner/config/run_schema.py) so that the config stands below the simulator."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .section import Section, require

ALLREDUCE = ("ring", "tree", "hierarchical")
SUMMARY_FIX = ("cluster.from_summary=RUN_DIR/summary.json of a completed run "
               "(e.g. adpsgd-run recipe=digit_images algo=ssgd launcher.nprocs=2)")


@dataclass
class LinkConfig(Section):
    latency_us: float = 25.0  # alpha: microseconds per message
    bandwidth_gbps: float = 10.0  # B: gigabits per second, each direction

    def check(self, prefix: str, cfg: Any) -> None:
        require(self.latency_us >= 0, f"{prefix}.latency_us",
                f"must be >= 0, got {self.latency_us}", self.hint(prefix, "latency_us"))
        require(self.bandwidth_gbps > 0, f"{prefix}.bandwidth_gbps",
                f"must be > 0, got {self.bandwidth_gbps}", self.hint(prefix, "bandwidth_gbps"))


@dataclass
class ComputeConfig(Section):
    # One GPU's seconds per training sample (forward, backward and update), per recipe name.
    seconds_per_sample: dict[str, float] = field(default_factory=dict)
    step_overhead_s: float = 0.0  # fixed seconds per step, whatever its batch
    # Extra seconds per second of compute when learners share processors (cluster=measured
    # on a host with more ranks than cores); 0 with a processor per learner.
    contention: float = 0.0
    jitter: float = 0.0  # coefficient of variation of a step's time (gamma, mean kept)
    slow_period_rate_per_hour: float = 0.0  # slow periods per learner per hour (Poisson)
    slow_period_s: float = 0.0  # how long a slow period lasts
    slow_factor: float = 1.0  # a step started in a slow period takes this many times longer

    def check(self, prefix: str, cfg: Any) -> None:
        for recipe, seconds in dict(self.seconds_per_sample).items():
            require(seconds >= 0, f"{prefix}.seconds_per_sample.{recipe}",
                    f"must be >= 0, got {seconds}",
                    f"{prefix}.seconds_per_sample.{recipe}=0.001")
        for key in ("step_overhead_s", "contention", "jitter", "slow_period_rate_per_hour",
                    "slow_period_s"):
            value = getattr(self, key)
            require(value >= 0, f"{prefix}.{key}", f"must be >= 0, got {value}",
                    self.hint(prefix, key))
        require(self.slow_factor >= 1, f"{prefix}.slow_factor",
                f"must be >= 1, got {self.slow_factor}", f"{prefix}.slow_factor=2")
        require(self.slow_period_rate_per_hour == 0 or self.slow_period_s > 0,
                f"{prefix}.slow_period_s", "slow periods need a duration > 0",
                f"{prefix}.slow_period_s=60 (or {prefix}.slow_period_rate_per_hour=0)")


@dataclass
class FailuresConfig(Section):
    # Each node fails at random, a Poisson process of this mean (hours); null: never.
    node_mtbf_hours: Optional[float] = None
    # A node also fails at these virtual seconds of the run (explicit kills).
    at_s: list[float] = field(default_factory=list)
    # assumption: from a failure to training again from the newest checkpoint (noticed,
    # requeued, started, the checkpoint read); the failed node's place taken by another.
    restart_s: float = 300.0
    # assumption: launcher.elastic: from a failure to the others training again without the
    # node (noticed, agreed, shrunk, the epoch's rest dealt; 4 ranks here took 0.05-0.24 s)
    recovery_s: float = 1.0

    def check(self, prefix: str, cfg: Any) -> None:
        require(self.node_mtbf_hours is None or self.node_mtbf_hours > 0,
                f"{prefix}.node_mtbf_hours", f"must be > 0 (or null: nodes do not fail), got "
                f"{self.node_mtbf_hours}", f"{prefix}.node_mtbf_hours=1000")
        for at in self.at_s:
            require(at >= 0, f"{prefix}.at_s", f"virtual seconds must be >= 0, got {at}",
                    f"{prefix}.at_s=[3600]")
        require(self.restart_s >= 0, f"{prefix}.restart_s",
                f"must be >= 0, got {self.restart_s}", f"{prefix}.restart_s=300")
        require(self.recovery_s >= 0, f"{prefix}.recovery_s",
                f"must be >= 0, got {self.recovery_s}", f"{prefix}.recovery_s=1")

    @property
    def any(self) -> bool:
        return self.node_mtbf_hours is not None or bool(self.at_s)


@dataclass
class ClusterConfig(Section):
    name: str = "custom"
    description: str = ""
    gpus_per_node: int = 1
    nodes: int = 0  # how many the machine has; 0: as many as a run needs
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    intra_node: LinkConfig = field(default_factory=LinkConfig)
    inter_node: LinkConfig = field(default_factory=LinkConfig)
    allreduce: str = "ring"  # ring | tree | hierarchical (closed forms: ClusterModel)
    # Nodes whose link to the network is slower than inter_node's (a shared or older uplink):
    # node index -> that link's bandwidth as a fraction of inter_node's, e.g. {"1": 0.1}.
    node_bandwidth_factor: dict[str, float] = field(default_factory=dict)
    # The least a blocking collective (allreduce, broadcast) takes, whatever its size: all its
    # ranks must be running, which on a host with more ranks than cores means waiting to be
    # scheduled (cluster=measured sets it there). 0: the closed forms alone.
    rendezvous_s: float = 0.0
    # CPU seconds a host's processors spend for every MB (1e6 bytes) its network interface
    # sends or receives to another node while the learners compute: the network stack's work,
    # which takes a core from them. About 0 where the interface does it (RDMA); the lab's
    # user-space stack pays it in full (benchmarks/bench_network.py measures it: 1.26 ms).
    cpu_s_per_mb: float = 0.0
    from_summary: Optional[str] = None  # cluster=measured: a real run's summary.json
    # cluster=measured: the links of a network benchmark (benchmarks/bench_network.py's JSON)
    # at this rate (tc's syntax, e.g. 1gbit) instead of a link fitted to the run's allreduce.
    from_network: Optional[str] = None
    network_rate: Optional[str] = None
    # Writing a checkpoint (every learner's model and optimizer state, at once) at this
    # bandwidth of the job's storage, in Gb/s; null: checkpoints take no virtual time.
    storage_gbps: Optional[float] = None
    failures: FailuresConfig = field(default_factory=FailuresConfig)

    def check(self, prefix: str, cfg: Any) -> None:
        require(self.gpus_per_node >= 1, f"{prefix}.gpus_per_node",
                f"must be >= 1, got {self.gpus_per_node}", f"{prefix}.gpus_per_node=8")
        require(self.nodes >= 0, f"{prefix}.nodes", f"must be >= 0 (0: unbounded), got "
                f"{self.nodes}", self.hint(prefix, "nodes"))
        require(self.allreduce in ALLREDUCE, f"{prefix}.allreduce",
                f"must be one of {', '.join(ALLREDUCE)}, got {self.allreduce!r}",
                self.hint(prefix, "allreduce"))
        require(self.rendezvous_s >= 0, f"{prefix}.rendezvous_s",
                f"must be >= 0, got {self.rendezvous_s}", self.hint(prefix, "rendezvous_s"))
        require(self.cpu_s_per_mb >= 0, f"{prefix}.cpu_s_per_mb",
                f"must be >= 0, got {self.cpu_s_per_mb}", self.hint(prefix, "cpu_s_per_mb"))
        for node, factor in dict(self.node_bandwidth_factor).items():
            require(str(node).isdigit() and 0 < float(factor) <= 1,
                    f"{prefix}.node_bandwidth_factor.{node}", "needs a node index and a "
                    f"fraction in (0, 1], got {node}: {factor}",
                    f"+{prefix}.node_bandwidth_factor.1=0.1")
        require(not self.from_network or bool(self.network_rate), f"{prefix}.network_rate",
                "cluster.from_network needs the rate whose links to use",
                f"{prefix}.network_rate=1gbit")
        require(self.storage_gbps is None or self.storage_gbps > 0, f"{prefix}.storage_gbps",
                f"must be > 0 (or null: checkpoints take no time), got {self.storage_gbps}",
                f"{prefix}.storage_gbps=80")
        self.failures.check(f"{prefix}.failures", cfg)
        self.compute.check(f"{prefix}.compute", cfg)
        self.intra_node.check(f"{prefix}.intra_node", cfg)
        self.inter_node.check(f"{prefix}.inter_node", cfg)
        require(self.name != "measured" or bool(self.from_summary), f"{prefix}.from_summary",
                "cluster=measured needs the summary.json of a real run", SUMMARY_FIX)
        if self.from_summary:
            require(Path(self.from_summary).is_file(), f"{prefix}.from_summary",
                    f"no such file: {self.from_summary}", SUMMARY_FIX)
        launcher = getattr(cfg, "launcher", None)
        if launcher is not None and launcher.get("name") == "sim" and not self.from_summary:
            check_fits(self, int(launcher.get("nprocs") or 1),
                       launcher.get("procs_per_node") or self.gpus_per_node)


def check_fits(cfg: ClusterConfig, nprocs: int, procs_per_node: int) -> None:
    """ConfigError unless ``nprocs`` learners, ``procs_per_node`` to a node, fit the machine."""
    require(procs_per_node <= cfg.gpus_per_node, "launcher.procs_per_node",
            f"{procs_per_node} learners per node do not fit cluster {cfg.name}'s "
            f"{cfg.gpus_per_node} GPUs per node", f"launcher.procs_per_node={cfg.gpus_per_node}")
    needed = math.ceil(nprocs / procs_per_node)
    require(cfg.nodes == 0 or needed <= cfg.nodes, "launcher.nprocs",
            f"{nprocs} learners need {needed} nodes of {procs_per_node}; cluster {cfg.name} has "
            f"{cfg.nodes} ({cfg.nodes * cfg.gpus_per_node} GPUs)",
            f"launcher.nprocs={cfg.nodes * procs_per_node}, or a larger machine "
            f"(cluster.nodes={needed}, or cluster=p9_v100_infiniband)")
