"""Ctrl-C in adpsgd-run's own process, before a job's ranks run.

Until the launcher takes the signals over (runner/launch/local.py, ``StopForwarding``), a
Ctrl-C raises KeyboardInterrupt wherever the command is, and the command ends with one line.
Python code called from C that clears every error (an attribute or dict lookup in a library
that swallows exceptions) can lose that KeyboardInterrupt: a test saw a Ctrl-C pressed while
the command prepared its run have no effect at all, and the run went on to its end. So the
handler notes each press before it raises; a press that no ``except KeyboardInterrupt`` of the
command answered is taken by the launcher when it takes the signals over, as the first Ctrl-C.

(Imports nothing heavy: it is installed before the command's slow imports.)
"""

from __future__ import annotations

import signal

_pressed = 0  # Ctrl-Cs taken by :func:`interrupt`
_answered = 0  # how many of them an ``except KeyboardInterrupt`` of the command acted on


def interrupt(signum: int, frame) -> None:
    """SIGINT's handler: note the press, then raise KeyboardInterrupt where the command is."""
    global _pressed
    _pressed += 1
    raise KeyboardInterrupt


def install() -> None:
    """Take Ctrl-C with :func:`interrupt`, also where SIGINT came ignored (a job started with
    & from a script)."""
    signal.signal(signal.SIGINT, interrupt)


def answered() -> None:
    """Called where the command acts on a KeyboardInterrupt: every press so far is dealt with."""
    global _answered
    _answered = _pressed


def unanswered() -> bool:
    """Whether a Ctrl-C was pressed whose KeyboardInterrupt nobody acted on (it was lost on
    its way up); the press counts as answered from now on."""
    lost = _pressed > _answered
    answered()
    return lost
