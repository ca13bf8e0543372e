"""Communication: who we are (World), flat buffers, and collectives over MPI or NCCL."""

from .communicator import Communicator, Handle
from .world import World

__all__ = ["Communicator", "Handle", "World"]
