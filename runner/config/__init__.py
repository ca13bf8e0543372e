"""Configuration: the section primitives every schema shares (section.py), the run's own
schema (run_schema.py) and the name -> class registries (registry.py). Composing and validating
a command line, which names every registry, is the commands' (runner/commands/compose.py)."""
