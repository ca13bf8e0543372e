"""Where a rank sits: the world of learners and its communicators, in one object that every
part of a trainer which talks to the others reads (the algorithm's context, checkpoints,
evaluation). Going on with another set of learners (launcher.elastic) moves the seat, and
with it every part at once: none keeps a world or a communicator of its own."""

from __future__ import annotations

from dataclasses import dataclass

from .communicator import Communicator
from .world import World


@dataclass
class Seat:
    world: World
    comm: Communicator  # all learners
    node_comm: Communicator  # the learners of this (real or emulated) node

    def move(self, world: World, comm: Communicator, node_comm: Communicator
             ) -> tuple[Communicator, Communicator]:
        """Sit in ``world`` from now on; returns the communicators left behind (the caller
        closes and frees them)."""
        left = (self.comm, self.node_comm)
        self.world, self.comm, self.node_comm = world, comm, node_comm
        return left


class Seated:
    """A part that reads the world and its communicators from its ``seat`` (never a copy)."""

    seat: Seat

    @property
    def world(self) -> World:
        return self.seat.world

    @property
    def comm(self) -> Communicator:
        return self.seat.comm
