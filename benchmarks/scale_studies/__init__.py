"""The studies of benchmarks/study_scale.py, one module each (docs/scale_studies.md)."""
