"""The simulator (``launcher=sim``, in progress): many learners in one process, in the virtual
time of a modelled cluster. events.py is the event queue; network.py the links and the costs of
the collectives."""
