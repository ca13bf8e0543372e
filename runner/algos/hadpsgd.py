"""H-ADPSGD: hierarchical AD-PSGD (docs/algorithms.md, H-ADPSGD).

The L ranks of a node (``launcher.procs_per_node``; real nodes under SLURM) form a super
learner z_s; the S super learners run AD-PSGD among themselves::

    every step, inside node s:  G_s = (1/L) sum_l g_l(z_s)      (node allreduce)
                                z_s <- z_s - gamma * G_s          (on every rank of the node)
    between nodes, asynchronous: active super learner s and passive r: z_s, z_r <- (z_s + z_r)/2

Every rank of a node applies the same averaged gradient to its own copy of z_s, so the copies
stay identical without sending the model. The node leader (local rank 0) runs the gossip
thread on its copy; before each step it broadcasts whether an averaging changed z_s since the
last step, and only then z_s itself (weight decay is taken at each copy, from the model it
reads). S = 1 is synchronous SGD over the node; L = 1 is AD-PSGD. S must be even (or 1):
actives and passives are paired.

Elastic (launcher.elastic): ranks keep the nodes they were launched in. A node that loses
ranks goes on with the others, led by its lowest rank left, whose z_s (and momentum) is
broadcast to the node first; a node that loses all is lost as an AD-PSGD learner
(docs/algorithms.md). A spare that joins takes the node of the learner it replaces: it gets
that node's z_s, or, when the whole node was lost, the mean of the super learners left.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from ..comm.communicator import Communicator
from ..comm.hostfile import ranks_per_host, read_hostfile
from ..config.section import require
from ..errors import ConfigError
from .adpsgd import ADPSGD, ADPSGDConfig
from .base import Reduction
from .registry import ALGORITHMS


@dataclass
class HADPSGDConfig(ADPSGDConfig):
    name: str = "hadpsgd"

    def check(self, prefix, cfg):
        super().check(prefix, cfg)
        require(not self.delay_by_one, f"{prefix}.delay_by_one",
                "hadpsgd has no delay-by-one variant", "use algo=adpsgd algo.delay_by_one=true")


@ALGORITHMS.register("hadpsgd")
class HADPSGD(ADPSGD):
    Config = HADPSGDConfig
    reduces_to = {"hadpsgd-one-node": Reduction(("launcher.procs_per_node=4",))}
    # A super learner that loses a member goes on with the others (the lowest rank left
    # leads it); one that loses all is lost as an AD-PSGD learner is.
    elastic = True
    keeps_nodes = True

    @classmethod
    def build(cls, cfg, ctx):
        return cls(cfg, ctx)

    @classmethod
    def check_survivors(cls, run_cfg, world):
        # Super learners of unequal sizes after a loss: AD-PSGD over the nodes left.
        super().check_world(OmegaConf.merge(run_cfg, {"launcher": {
            "nprocs": world.num_nodes, "procs_per_node": 1, "hostfile": None}}))

    @classmethod
    def participants(cls, run_cfg) -> int:
        ppn = run_cfg.launcher.procs_per_node
        hostfile = run_cfg.launcher.get("hostfile")
        if not ppn and hostfile:  # the hosts are the nodes (runner/comm/hostfile.py)
            sizes = [n for _, n in ranks_per_host(read_hostfile(hostfile),
                                                  run_cfg.launcher.nprocs, None)]
            if len(set(sizes)) > 1:
                raise ConfigError("launcher.hostfile", f"the hosts of {hostfile} take {sizes} "
                                  "ranks: super learners need the same number of ranks",
                                  "give every host the same slots, or set "
                                  "launcher.procs_per_node")
            return len(sizes)
        if not ppn:
            raise ConfigError("launcher.procs_per_node", "hadpsgd needs nodes to form super "
                              "learners", "set launcher.procs_per_node, e.g. "
                              f"launcher.procs_per_node={max(1, run_cfg.launcher.nprocs // 2)}")
        nprocs = run_cfg.launcher.nprocs
        if ppn > nprocs:  # one node, not full: no gossip at all, SSGD under another name
            raise ConfigError("launcher.procs_per_node", f"{ppn} is more than launcher.nprocs="
                              f"{nprocs}: the ranks would form one super learner, which has "
                              "no one to gossip with", "choose procs_per_node so that nprocs is "
                              f"a multiple of it, e.g. launcher.procs_per_node="
                              f"{max(1, nprocs // 2)}, or algo=ssgd")
        if nprocs % ppn:
            raise ConfigError("launcher.procs_per_node", f"{ppn} does not divide launcher.nprocs="
                              f"{nprocs}: super learners need the same number of ranks",
                              "choose procs_per_node so that nprocs is a multiple of it")
        return -(-nprocs // ppn)

    @classmethod
    def participants_phrase(cls, run_cfg) -> str:
        return (f"{cls.participants(run_cfg)} super learners, launcher.nprocs / "
                "launcher.procs_per_node")

    @classmethod
    def even_fix(cls, run_cfg) -> str:
        ppn = run_cfg.launcher.procs_per_node
        if not ppn:
            return "list an even number of hosts in launcher.hostfile"
        nodes = run_cfg.launcher.nprocs // ppn
        return (f"use an even number of nodes, e.g. launcher.nprocs={ppn * (nodes + 1)} "
                f"with launcher.procs_per_node={ppn}")

    def learner_comm(self) -> Communicator:
        return self.ctx.node_comm
