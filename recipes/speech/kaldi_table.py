"""Kaldi's text tables (``text``, ``wav.scp``, ``utt2spk``, ``segments``, a decoder's output):
one ``<id> <rest of the line>`` row per line. The one reader behind the data directories
(kaldi_data.py) and scoring (scoring.py), so both name a bad file, line and id the same way.
"""

from __future__ import annotations

from pathlib import Path

from runner.errors import UserError


class KaldiTable(dict):
    """id -> the rest of its line (stripped; "" for a line with only an id), in file order;
    ``line[id]`` is where each id stands, for messages about a row."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.line: dict[str, int] = {}


def read_table(path: str | Path, expected: str, fix: str, min_fields: int = 1,
               max_fields: int | None = None, id_kind: str = "id",
               what: str = "Kaldi table") -> KaldiTable:
    """Read a Kaldi table; a missing, unreadable or non-UTF-8 file, a row with too few or too
    many fields and a repeated id each raise :class:`UserError` naming the file (and line).
    ``expected`` shows a row's form, ``fix`` ends the message of a bad row, ``what`` names the
    file a missing path should have been."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file",
                        f"give the path of a {what} ('{expected}' per line)") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                        "convert it to UTF-8 (e.g. with iconv)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})",
                        "check the path and its permissions") from None
    table = KaldiTable(path)
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue  # Kaldi never writes blank lines; a trailing one is harmless
        if len(fields) < min_fields or (max_fields is not None and len(fields) > max_fields):
            shown = line if len(line) <= 80 else line[:77] + "..."
            raise UserError(f"{path}:{number}: malformed line {shown!r}, expected '{expected}'",
                            f"correct or remove that line, {fix}")
        key = fields[0]
        if key in table:
            raise UserError(f"{path}:{number}: duplicate {id_kind} {key!r} (first on line "
                            f"{table.line[key]})", f"keep one line per {id_kind}, {fix}")
        rest = line.strip().split(maxsplit=1)
        table[key] = rest[1].strip() if len(rest) > 1 else ""
        table.line[key] = number
    return table
