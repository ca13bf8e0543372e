"""Configuration: the section primitives every schema shares (section.py), the run's own
schema (run_schema.py), the name -> class registries (registry.py), and composing and
validating a command line exactly as adpsgd-run does (compose.py)."""
