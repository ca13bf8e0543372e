"""The commands users run, one module each (setup.cfg's console_scripts):

* ``adpsgd-run`` (run.py): compose, validate and launch a training run;
* ``adpsgd-prepare`` (prepare.py): a recipe's data preparation stages, ahead of a job;
* ``adpsgd-gap`` (gap.py): spectral gap and rho of a topology;
* ``adpsgd-report`` (report.py): compare run dirs (curves, time split, a markdown table);
* ``adpsgd-score`` (score.py): Switchboard-style WER of Kaldi text files;
* ``adpsgd-imagenet`` (imagenet.py): sort ImageNet's validation images, or make a fake tree.

Ranks are started as ``python -m runner.worker RUN_DIR`` (by a launcher, never by hand).
"""


def run() -> None:
    """adpsgd-run's entry point. Its modules take a second to load (Hydra, NumPy): a Ctrl-C
    then ends it with one line, not a traceback; and it takes Ctrl-C also where SIGINT came
    ignored (a job started with & from a script), as every later stage of the command does
    (runner/ctrl_c.py: also a Ctrl-C whose KeyboardInterrupt got lost on its way up)."""
    import signal
    import sys

    from .. import ctrl_c

    ctrl_c.install()
    try:
        from .run import main

        if ctrl_c.unanswered():  # pressed during the imports, and lost on the way up
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        print("\nadpsgd-run: interrupted (Ctrl-C) while starting; nothing was run",
              file=sys.stderr)
        raise SystemExit(130) from None
    try:
        main()
    except BrokenPipeError:  # `adpsgd-run --help | head`: the reader left before the end
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        raise SystemExit(128 + signal.SIGPIPE) from None
