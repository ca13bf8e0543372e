"""The training loop's parts (runner/trainer.py holds the loop): per-rank data shards,
the compute path, held-out evaluation, the learning-rate schedule, the optimizer's groups,
the milestones every rank meets, the run's counters, timers, injected faults and what a
NaN loss does."""
