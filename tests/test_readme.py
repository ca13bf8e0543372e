"""Every command in README.md's bash blocks runs as written (docs that rot are a bug)."""

import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from conftest import BIN, REPO, is_readme_simulation, readme_blocks, readme_commands

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


# The default job (`make demo`, bare `adpsgd-run`) trains spoken digits for about 4 minutes on 2
# cores; docs/RESULTS.md reports that run. Here the commands that train speech run as written
# with these overrides appended (a sixth of the corpus, 1 epoch), so the suite stays short;
# tests/test_speech_e2e.py checks what such a run learns.
SPEECH_TEST_SIZE = ("recipe.synth.num_train=320 recipe.synth.num_eval=32 "
                    "recipe.synth.train_speakers=16 trainer.epochs=1")
# The other training commands (digits, ImageNet) run as written plus this: each still starts
# its ranks, trains, evaluates and leaves a run dir for the report, and its further epochs are
# only what a user waits for (tests/test_e2e_ssgd.py and the recipes' tests check learning).
OTHER_TEST_SIZE = "trainer.epochs=1"
# ...except where the length is part of what the command does: a run dir it names is one that
# a later command resumes (resume=auto to 3 epochs) or reads, and a fault at a step needs the
# run's steps after it. Dry runs start nothing; a simulation's epochs are virtual time (seconds
# of host time here), and its node failures need the whole run.
KEEPS_ITS_LENGTH = ("hydra.run.dir=", "resume=", "faults.sigkill.", "launcher.dry_run=",
                    "launcher=sim")
# `make demo` is exactly `adpsgd-run` with no arguments (Makefile): running it covers both.
COVERED_BY = {"adpsgd-run": "make demo"}


def shrunk(command: str, demo_dir=None) -> str:
    if command == "make demo":  # its run dir in the test's, not in the user's runs/
        return f'make demo DEMO_ARGS="{SPEECH_TEST_SIZE} hydra.run.dir={demo_dir}"'
    words = command.split()
    if words[0] != "adpsgd-run" or any(w.startswith("--") for w in words[1:]):
        return command
    if not any(w.startswith(("recipe=", "experiment=")) and w != "recipe=spoken_digits"
               for w in words[1:]):
        return f"{command} {SPEECH_TEST_SIZE}"
    if OTHER_TEST_SIZE in words or any(w.startswith(KEEPS_ITS_LENGTH) for w in words[1:]):
        return command
    return f"{command} {OTHER_TEST_SIZE}"


def shell(command: str, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def check_tensorboard(command: str, cwd) -> None:
    """Start the server exactly as written, read its run list over HTTP, stop it."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    server = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, output = None, ""
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            output += line
            match = re.search(r"(http://\S+?:\d+/)", line)
            url = match.group(1) if match else None
            assert server.poll() is None or url, output
        assert url, output
        runs = []
        for _ in range(60):  # the first scan of the log dir takes a moment
            with urllib.request.urlopen(url + "data/runs", timeout=10) as reply:
                runs = json.loads(reply.read())
            if runs:
                break
            time.sleep(1)
        # adpsgd-report's links: runs named by their labels, not by paths ending in tb.
        assert runs and not any(run.endswith("tb") for run in runs), runs
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_readme_has_the_commands_a_user_starts_with():
    commands = readme_commands()
    assert commands[:2] == ["make install", "source .venv/bin/activate"], commands[:2]
    assert {"make demo", "make test", "make test-fast", "adpsgd-run"} <= set(commands)
    assert all(COVERED_BY[c] in commands for c in COVERED_BY if c in commands)


# One test per bash block: a block's commands build on each other (a report over the runs
# above it), blocks do not, so that make test's workers can run them side by side.
BLOCKS = {f"{i}-" + re.sub(r"[^A-Za-z0-9]+", "-", " ".join(block[0].split()[:2])): block
          for i, block in enumerate(readme_blocks())}


@pytest.mark.parametrize("block", list(BLOCKS))
def test_every_readme_command_runs(tmp_path, block):
    commands = BLOCKS[block]
    ran = []
    for command in commands:
        if command in COVERED_BY:  # the command it is the same as runs in its own block
            ran.append(command)
            continue
        if is_readme_simulation(command):  # tests/test_sim_runs.py runs it and reads its dir
            ran.append(command)
            continue
        if command == "make test":
            # This suite is what `make test` runs; check the wiring instead of recursing.
            dry = shell("make -n test", cwd=REPO)
            assert dry.returncode == 0 and "-m pytest" in dry.stdout, dry.stdout
        elif command == "make test-fast":
            # Its tests run inside this suite too: check that it selects a tier of them.
            dry = shell("make -n test-fast", cwd=REPO)
            tier = re.search(r'-m pytest .*-m "([^"]+)"', dry.stdout)
            assert dry.returncode == 0 and tier, dry.stdout
            # One collection gives both counts: "767/1143 tests collected (376 deselected)".
            collected = shell(f'{BIN}/python -m pytest --collect-only -q -m "{tier.group(1)}"',
                              REPO).stdout
            fast, total = map(int, re.search(r"(\d+)/(\d+) tests? collected", collected)
                              .groups())
            assert 0 < fast < total and "not mpi" in tier.group(1), (fast, total)
        elif command == "make coverage":
            # The whole suite again under coverage: check what it runs instead of recursing.
            dry = shell("make -n coverage", cwd=REPO)
            assert dry.returncode == 0, dry.stderr
            for step in ("coverage run -m pytest", "coverage combine", "coverage html",
                         "coverage report --format=total"):
                assert step in dry.stdout, (step, dry.stdout)
        elif command.startswith("make "):
            before = sorted((REPO / "runs").rglob("*")) if (REPO / "runs").exists() else []
            proc = shell(shrunk(command, tmp_path / "demo"), cwd=REPO)
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr}"
            after = sorted((REPO / "runs").rglob("*")) if (REPO / "runs").exists() else []
            assert after == before, "a README command left a run in the repository's runs/"
            if command == "make demo":
                assert "samples/s" in proc.stdout and "status completed" in proc.stdout
                # ...and as written it is the bare command (COVERED_BY).
                dry = shell("make -s --no-print-directory -n demo", cwd=REPO).stdout
                dry = dry.strip().splitlines()
                assert dry[-1].split() == [".venv/bin/adpsgd-run"], dry
        elif command == "source .venv/bin/activate":
            proc = shell(f"{command} && command -v adpsgd-run", cwd=REPO)
            assert proc.stdout.strip() == str(REPO / ".venv" / "bin" / "adpsgd-run")
        elif command.startswith("adpsgd-run"):
            proc = shell(shrunk(command), cwd=tmp_path)
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr}"
            assert proc.stdout.strip(), command
        elif command.startswith("adpsgd-score"):
            proc = shell(command, cwd=tmp_path)
            assert proc.returncode == 0, f"{command}\n{proc.stderr}"
            assert re.match(r"%WER \d+\.\d+ \[", proc.stdout), proc.stdout
        elif command.startswith("adpsgd-imagenet"):  # in order, in one folder
            proc = shell(command, cwd=tmp_path)
            assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        elif command.startswith("adpsgd-prepare"):
            proc = shell(command, cwd=tmp_path)
            assert proc.returncode == 0 and proc.stdout.startswith("stage 0: "), proc.stdout
        elif command.startswith("adpsgd-gap"):
            proc = shell(command, cwd=tmp_path)
            assert proc.returncode == 0, f"{command}\n{proc.stderr}"
            lines = proc.stdout.strip().splitlines()
            columns = ["topology", "n", "spectral_gap", "rho"]
            if "--algo adpsgd" in command:
                columns.append("rho_round")
            assert lines[0].split() == columns, proc.stdout
            assert len(lines) > 1, proc.stdout
        elif command.startswith("adpsgd-report"):  # over the runs the commands above left
            proc = shell(command, cwd=tmp_path)
            assert proc.returncode == 0, f"{command}\n{proc.stderr}"
            out = tmp_path / command.split("--out", 1)[1].split()[0]
            assert (out / "table.md").exists() and (out / "curves_wall.png").exists(), command
        elif command.startswith("tensorboard "):
            check_tensorboard(command, cwd=tmp_path)
        else:
            pytest.fail(f"README command with no check: {command!r}")
        ran.append(command)
    assert ran == commands
