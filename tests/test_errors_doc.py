"""Every row of docs/errors.md, run for real: the command-line overrides of the row must end
with exactly the line the row documents, as one line with exit status 2, found where the row
says (so the page cannot rot).

Rows found on the command line go through the check adpsgd-run's main() runs first, in this
process (seconds for the whole table); rows found later run the installed adpsgd-run on tiny
data made here: a real Kaldi data dir, real JPEGs, a checkpoint of a real one-rank run.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import kaldiio
import numpy as np
import pytest
from test_imagenet_recipe import corrupt
from test_speech_e2e import (
    break_empty_text,
    break_empty_transcript,
    break_missing_text,
    break_missing_wav,
    break_utterance_not_in_wav_scp,
    kaldi_dir,
)

from recipes.imagenet.synthetic import write_fake_imagenet

from conftest import REPO, run_cli

ERRORS_DOC = REPO / "docs" / "errors.md"
HEADER = ("mistake", "overrides", "found", "adpsgd-run prints")
FOUND = ("command line", "before ranks", "in a rank")
# The last line adpsgd-run prints before the launcher starts the ranks.
LAUNCHING = re.compile(r"^adpsgd-run: \S+ on \S+ with \d+ rank\(s\); run dir ", re.M)
# Rank 0's progress (stderr): tqdm's bar on a terminal, a plain line elsewhere; the only other
# thing allowed next to the error line.
PROGRESS_BAR = re.compile(r"^\S+ x\d+: +(\d+%\||[\d,]+/[\d,]+ samples )")
SWITCHBOARD_RATE = 8000  # recipe=swb300 expects 8 kHz audio
PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Row:
    mistake: str
    overrides: str
    found: str
    line: str

    @property
    def id(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.mistake.lower()).strip("-")

    @property
    def placeholders(self) -> set[str]:
        return set(PLACEHOLDER.findall(self.overrides + self.line))


def table_cells(line: str) -> list[str]:
    """The cells of one markdown table line; ``\\|`` is a literal bar inside a cell."""
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip().replace("\\|", "|") for cell in cells]


def code(cell: str) -> str:
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"docs/errors.md: {cell!r} must be one `code span`"
    return match.group(1)


def doc_rows() -> list[Row]:
    """The rows of the page's one table."""
    lines = [line for line in ERRORS_DOC.read_text().splitlines() if line.startswith("|")]
    assert tuple(table_cells(lines[0])) == HEADER, lines[0]
    rows = []
    for line in lines[2:]:  # after the header and its |---| line
        mistake, overrides, found, printed = table_cells(line)
        rows.append(Row(mistake, code(overrides), found, code(printed)))
    return rows


def documented_placeholders() -> set[str]:
    """Placeholders explained under the table (each as a `{name}` code span)."""
    below = ERRORS_DOC.read_text().rpartition("\n|")[2]
    return set(re.findall(r"`\{(\w+)\}`", below))


# ------------------------------------------------------------------------ the data rows use


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """The run dir of a real one-rank run that left a complete checkpoint."""
    root = tmp_path_factory.mktemp("trained")
    run_cli(["recipe=digit_images", "algo=ssgd", "launcher.nprocs=1", "trainer.epochs=1",
             "trainer.progress=false", f"hydra.run.dir={root / 'run'}"], cwd=root, timeout=300)
    return root / "run"


def only_checkpoint(run_dir: Path) -> Path:
    [checkpoint] = (run_dir / "checkpoints").glob("samples-*")
    return checkpoint


def corrupt_wav(root: Path) -> Path:
    data = kaldi_dir(root, "train", rate=SWITCHBOARD_RATE)
    (root / "train-audio" / "u2.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEnot audio")
    return data


def corrupt_ark(root: Path) -> Path:
    """A data dir with its own (Kaldi-computed) features whose ark lost its last bytes."""
    data = kaldi_dir(root, "train", rate=SWITCHBOARD_RATE)
    rng = np.random.default_rng(0)
    kaldiio.save_ark(str(data / "feats.ark"),
                     {utt: rng.standard_normal((50, 40)).astype(np.float32)
                      for utt in ("u1", "u2", "u3")}, scp=str(data / "feats.scp"))
    ark = (data / "feats.ark").read_bytes()
    (data / "feats.ark").write_bytes(ark[:-100])  # u3, the last matrix, is cut short
    return data


def jpegs(root: Path, broken: bool) -> Path:
    fake = write_fake_imagenet(root, classes=2, train_per_class=2, val_per_class=1, size=16)
    if broken:
        corrupt(root / "train" / fake.wnids[1] / "broken.JPEG")
    else:
        for image in (root / "train").glob("*/*.JPEG"):
            image.unlink()
    return root


def file_at(path: Path) -> Path:
    path.write_text("a regular file\n")
    return path


def damaged_checkpoint(trained_run: Path, root: Path) -> Path:
    """A copy of the checkpoint alone (no older one beside it) whose rank file is cut short."""
    source = only_checkpoint(trained_run)
    copy = shutil.copytree(source, root / "checkpoints" / source.name)
    rank_file = copy / "rank0.pt"
    rank_file.write_bytes(rank_file.read_bytes()[:5000])
    return copy


class Placeholders:
    """The paths the table's ``{name}`` placeholders stand for, made on first use."""

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest):
        self.tmp_path, self.request = tmp_path, request
        self.made: dict[str, Path] = {}

    def builders(self) -> dict[str, Callable[[Path], Path]]:
        run = lambda: self.request.getfixturevalue("trained_run")  # noqa: E731 - lazy
        return {
            "missing": lambda root: root / "nothing-here",
            "file": lambda root: file_at(root / "a-file"),
            "eval": lambda root: kaldi_dir(root, "eval", rate=SWITCHBOARD_RATE),
            "no_text": break_missing_text,
            "empty_text": break_empty_text,
            "orphan": break_utterance_not_in_wav_scp,
            "no_words": break_empty_transcript("u2"),
            "missing_wav": break_missing_wav,
            "wav_16k": lambda root: kaldi_dir(root, "train", rate=16000),
            "corrupt_wav": corrupt_wav,
            "corrupt_ark": corrupt_ark,
            "bad_jpeg": lambda root: jpegs(root, broken=True),
            "no_images": lambda root: jpegs(root, broken=False),
            "checkpoint": lambda root: only_checkpoint(run()),
            "run": lambda root: shutil.copytree(run(), root / "run"),
            "damaged_checkpoint": lambda root: damaged_checkpoint(run(), root),
        }

    def path(self, name: str) -> Path:
        if name not in self.made:
            root = self.tmp_path / name
            root.mkdir()
            self.made[name] = self.builders()[name](root)
        return self.made[name]

    def fill(self, text: str) -> str:
        return PLACEHOLDER.sub(lambda m: str(self.path(m.group(1))), text)


# Placeholders whose data comes from a real training run: rows using them are slow.
NEEDS_A_RUN = {"checkpoint", "run", "damaged_checkpoint"}


def row_param(row: Row):
    slow = row.found != "command line" or row.placeholders & NEEDS_A_RUN
    return pytest.param(row, id=row.id, marks=[pytest.mark.slow] if slow else [])


# ------------------------------------------------------------------------------------ tests


def test_the_page_has_one_well_formed_table_of_at_least_24_mistakes():
    rows = doc_rows()
    assert len(rows) >= 24
    assert len({row.id for row in rows}) == len(rows), "two rows describe the same mistake"
    used = set().union(*(row.placeholders for row in rows))
    assert used == documented_placeholders(), "placeholders used and explained differ"
    assert used == set(Placeholders(Path(), None).builders())
    for row in rows:
        assert row.found in FOUND, row
        assert re.fullmatch(r"adpsgd-run: error: .+\. Fix: .+", row.line), row.line
        words = shlex.split(row.overrides)
        assert any(w.startswith("recipe=") for w in words), row  # never the default job


@pytest.mark.timeout(300)
@pytest.mark.parametrize("row", [row_param(row) for row in doc_rows()])
def test_every_documented_mistake_prints_its_documented_line(row, tmp_path, request,
                                                             monkeypatch, capsys):
    if "trainer.device=cuda" in row.overrides:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here: trainer.device=cuda is no mistake")
    paths = Placeholders(tmp_path, request)
    args = [paths.fill(word) for word in shlex.split(row.overrides)]
    expected = paths.fill(row.line)
    monkeypatch.chdir(tmp_path)  # the default run dir (runs/...) goes here
    if row.found == "command line":
        from runner.commands.run import check_command_line

        with pytest.raises(SystemExit) as exit_info:
            check_command_line(args)
        status, stdout, stderr = exit_info.value.code, "", capsys.readouterr().err
    else:
        proc = run_cli(args, cwd=tmp_path, check=False, timeout=240,
                       env={"ADPSGD_CACHE": str(tmp_path / "cache")})
        status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        # "before ranks": stopped before the launcher; "in a rank": a rank said it.
        assert bool(LAUNCHING.search(stdout)) == (row.found == "in a rank"), stdout
    assert status == 2, (status, stderr)
    assert "Traceback" not in stderr + stdout
    lines = [line for line in re.split(r"[\r\n]", stderr) if line.strip()]
    errors = [line for line in lines if "adpsgd-run: error:" in line]
    assert errors == [expected], stderr  # one line, starting the line, exactly as documented
    if row.found == "command line":
        assert lines == errors
    if row.found == "in a rank":  # the run dir says how the job ended, as for any failure
        ended = [json.loads(path.read_text()) for path in tmp_path.rglob("summary.json")]
        assert any(s["status"] == "failed" and s.get("exit_status") == 2 for s in ended), ended
    else:  # besides it only the runner's own closing line and rank 0's progress bar
        assert all(line.startswith("adpsgd-run: ") or PROGRESS_BAR.match(line)
                   for line in lines), stderr
