"""Checkpoints: the files and their integrity (files.py), writing and resuming them
collectively (checkpointer.py), the graceful stop that ends in one (preemption.py), and
resuming with another number of ranks (resize.py)."""
