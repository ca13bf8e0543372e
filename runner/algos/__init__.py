"""Training algorithms, one module each, registered by name (``algo=NAME``): importing this
package registers them all."""

from . import adpsgd, choco, dasgd, diloco, dpsgd, hadpsgd, local_sgd, sgp, ssgd  # noqa: F401 - they register
from .base import AlgoConfig, Algorithm, TrainContext
from .registry import ALGORITHMS

__all__ = ["ALGORITHMS", "Algorithm", "AlgoConfig", "TrainContext"]
