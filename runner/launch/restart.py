"""The batch job's steps (runner/launch/batch_steps.py) under the name they had before: a
job.sbatch that an earlier adpsgd-run wrote calls ``python -m runner.launch.restart``, and
SLURM requeues it, or a user submits it again, after the upgrade."""

from .batch_steps import main

if __name__ == "__main__":
    main()
