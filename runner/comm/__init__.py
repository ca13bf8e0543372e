"""Communication: who we are (World, and the Seat that holds it with its communicators), flat
buffers, and collectives over MPI or NCCL."""

from .communicator import Communicator, Handle
from .seat import Seat, Seated
from .world import World

__all__ = ["Communicator", "Handle", "Seat", "Seated", "World"]
