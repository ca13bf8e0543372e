"""The studies of scripts/study_scale.py, one module each (docs/scale_studies.md)."""
