"""The training loop's parts (runner/trainer/ holds the loop): per-rank data shards, the
compute path, held-out evaluation, the learning-rate schedule, the milestones every rank
meets, the run's counters and random state, injected faults, what a NaN loss does, and
elastic training's losses, spares and new worlds."""
