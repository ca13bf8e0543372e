"""The commands users run, one module each (setup.cfg's console_scripts):

* ``adpsgd-run`` (run.py): compose, validate and launch a training run;
* ``adpsgd-prepare`` (prepare.py): a recipe's data preparation stages, ahead of a job;
* ``adpsgd-gap`` (gap.py): spectral gap and rho of a topology;
* ``adpsgd-report`` (report.py): compare run dirs (curves, time split, a markdown table);
* ``adpsgd-score`` (score.py): Switchboard-style WER of Kaldi text files;
* ``adpsgd-imagenet`` (imagenet.py): sort ImageNet's validation images, or make a fake tree.

Ranks are started as ``python -m runner.worker RUN_DIR`` (by a launcher, never by hand).
"""
