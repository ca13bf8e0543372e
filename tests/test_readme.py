"""Every command in README.md's bash blocks runs as written (docs that rot are a bug)."""

import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from conftest import BIN, REPO

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


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
        assert any(run.endswith("tb") for run in runs), runs
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_every_readme_command_runs(tmp_path):
    commands = readme_commands()
    assert "make demo" in commands and "make test" in commands
    ran = []
    for command in commands:
        if command == "make test":
            # This suite is what `make test` runs; check the wiring instead of recursing.
            dry = shell("make -n test", cwd=REPO)
            assert dry.returncode == 0 and "-m pytest" in dry.stdout, dry.stdout
        elif command.startswith("make "):
            proc = shell(command, cwd=REPO)
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr}"
            if command == "make demo":
                assert "samples/s" in proc.stdout and "status completed" in proc.stdout
        elif command == "source .venv/bin/activate":
            proc = shell(f"{command} && command -v adpsgd-run", cwd=REPO)
            assert proc.stdout.strip() == str(REPO / ".venv" / "bin" / "adpsgd-run")
        elif command.startswith("adpsgd-run"):
            proc = shell(command, cwd=tmp_path)
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr}"
            assert proc.stdout.strip(), command
        elif command.startswith("adpsgd-gap"):
            proc = shell(command, cwd=tmp_path)
            assert proc.returncode == 0, f"{command}\n{proc.stderr}"
            lines = proc.stdout.strip().splitlines()
            assert lines[0].split() == ["topology", "n", "spectral_gap", "rho"], proc.stdout
            assert len(lines) > 1, proc.stdout
        elif command.startswith("tensorboard "):
            check_tensorboard(command, cwd=tmp_path)
        else:
            pytest.fail(f"README command with no check: {command!r}")
        ran.append(command)
    assert ran == commands
