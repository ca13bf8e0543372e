"""scripts/study_scale.py: each study's --quick mode runs and writes JSON of the documented
structure (numbers are not asserted: --quick is the wiring, not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "study_scale.py"


def run_study(study: str, tmp_path) -> dict:
    out = tmp_path / f"{study}.json"
    markdown = tmp_path / f"{study}.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), study, "--quick", "--json", str(out),
                           "--markdown", str(markdown), "--runs", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["study"] == study and result["quick"] is True
    assert {"date", "command", "machine", "load_before", "load_after"} <= set(result)
    assert markdown.read_text().startswith("| date |")
    return result


def test_spectral_quick(tmp_path):
    r = run_study("spectral", tmp_path)
    n = r["nprocs"][0]
    expected = {f"n{n}-ssgd"} | {f"n{n}-{algo}-{peers}" for algo in ("adpsgd", "dpsgd")
                                 for peers in ("fixed_ring", "random_ring", "exponential")}
    assert set(r["runs"]) == expected
    for name, run in r["runs"].items():
        assert run["nprocs"] == n and run["lr"] > 0
        # one evaluation, at the end of the one epoch (asynchronous learners finish the
        # steps they are in, so theirs may come a little later)
        assert len(run["curve"]) == 1 and run["curve"][0]["epoch"] >= 1.0
        assert 0 <= run["final_top1"] <= 100 and run["consensus_distance"] >= 0
        assert (tmp_path / "runs" / name / "metrics.jsonl").exists()
        if run["algo"] == "ssgd":
            assert "mixing" not in run
        else:
            assert set(run["mixing"]) in ({"rho_per_averaging"}, {"spectral_gap", "rho"})
    for algo in ("adpsgd", "dpsgd"):
        verdict = r["verdict"][algo]
        assert set(verdict["ring_deficit_top1_points"]) == {str(n)}
        assert verdict["fixed_ring_falls_behind_at"] in (None, n)


def test_dasgd_quick(tmp_path):
    r = run_study("dasgd", tmp_path)
    cases = {"dasgd_delay1", "dasgd_delay4", "ssgd"}
    assert set(r["runs"]) == {f"n{n}-{case}" for n in r["nprocs"] for case in cases}
    for run in r["runs"].values():
        assert run["step_s"] >= run["compute_only_step_s"] > 0
        assert 0 < run["scale_up_efficiency"] <= 1 + 1e-9
        assert run["overhead"] == pytest.approx(run["step_s"] / run["compute_only_step_s"] - 1)
