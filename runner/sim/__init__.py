"""The simulator (``launcher=sim``): many learners in one process, in the virtual time of a
modelled cluster (docs/simulator.md). engine.py sets a run up and drives it; event_queue.py is
the queue of virtual-time events; network.py the links and the costs of the collectives;
stacked.py the learners' models as one matrix; the algorithms' drivers sit beside them."""
