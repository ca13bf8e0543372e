"""adpsgd: an experiment runner for synchronous, decentralized and asynchronous SGD over MPI."""

__version__ = "0.1.0"
