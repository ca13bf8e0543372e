"""adpsgd: an experiment runner for synchronous, decentralized and asynchronous SGD over MPI."""

import os as _os

__version__ = "0.1.0"

# torch's OpenMP threads wait for work by spinning: where cores are shared, a spinning thread
# holds a core that the thread it waits for needs (a 2-thread simulation beside 2 busy
# processes on 2 cores took 71 s spinning, 33 s sleeping; 17 s either way on a quiet machine).
# Every process of ours (the commands, the ranks) imports this package before torch, which
# reads the setting when it loads; a user's own OMP_WAIT_POLICY wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
