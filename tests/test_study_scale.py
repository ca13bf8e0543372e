"""benchmarks/study_scale.py: each study's --quick mode runs and writes JSON of the documented
structure (numbers are not asserted: --quick is the wiring, not a measurement)."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

SCRIPT = REPO / "benchmarks" / "study_scale.py"


@functools.cache
def load_script():
    """The script as a module: the studies run in this process (they simulate in-process
    anyway), sparing each a fresh interpreter's imports; test_a_bad_study_option_is_one_line
    runs the file itself."""
    spec = importlib.util.spec_from_file_location("study_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_study(study: str, tmp_path, *options: str) -> dict:
    out = tmp_path / f"{study}.json"
    markdown = tmp_path / f"{study}.md"
    # main's status: 0, or 2 with the one-line error on stderr (pytest shows it)
    assert load_script().main([study, "--quick", "--json", str(out), "--markdown",
                               str(markdown), "--runs", str(tmp_path / "runs"), *options]) == 0
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


def test_batch_quick(tmp_path):
    r = run_study("batch", tmp_path)
    n = r["nprocs"][0]
    batches = sorted(r["batch_sizes"])
    assert set(r["points"]) == {f"n{n}-{algo}-b{b}" for algo in ("ssgd", "adpsgd")
                                for b in batches}
    for point in r["points"].values():
        assert set(point["rules"]) == {"sqrt", "linear"}
        best = max(rule["final_top1"] for rule in point["rules"].values())
        assert point["final_top1"] == best == point["rules"][point["best_rule"]]["final_top1"]
        assert point["global_batch"] == n * point["batch_size"]
        assert set(point["within_margin"]) == {"1", "2"}
        # the smallest batch is the reference, within its own margin by definition
        assert all(point["within_margin"].values()) or point["batch_size"] > batches[0]
        # a wider margin tolerates at least what a narrower one does
        assert point["within_margin"]["2"] or not point["within_margin"]["1"]
    for margin in ("1", "2"):
        tolerance = r["tolerance"][margin][str(n)]
        assert set(tolerance["largest_batch"]) == {"ssgd", "adpsgd"}
        assert tolerance["adpsgd_over_ssgd"] == (tolerance["largest_batch"]["adpsgd"]
                                                 / tolerance["largest_batch"]["ssgd"])
    assert r["verdict"] in ("held", "partly", "not held")


def test_heterogeneity_quick(tmp_path):
    r = run_study("heterogeneity", tmp_path)
    # --quick: SSGD and AD-PSGD, even and with a straggler (the full study: five and four)
    assert r["algos"] == ["ssgd", "adpsgd"] and set(r["conditions"]) == {"even", "straggler"}
    assert set(r["runs"]) == {f"{c}-{a}" for c in r["conditions"] for a in r["algos"]}
    for run in r["runs"].values():
        assert run["epoch_s"] > 0 and len(run["curve"]) >= 2
        epochs = run["epochs_to_target"]
        if epochs is None:
            assert max(p["top1"] for p in run["curve"]) < r["target_top1"]
            assert run["time_to_target_s"] is None
        else:
            hit = next(p for p in run["curve"] if p["top1"] >= r["target_top1"])
            assert 0 < epochs <= hit["epoch"]
            assert run["time_to_target_s"] == pytest.approx(epochs * run["epoch_s"])
        learned = json.loads((tmp_path / "runs" / f"{run['condition']}-{run['algo']}"
                              / "summary.json").read_text())
        timed = json.loads((tmp_path / "runs" / f"{run['condition']}-{run['algo']}-timing"
                            / "summary.json").read_text())
        # every exchange was timed for ResNet-50, not for the digits' CNN, in both runs
        assert learned["exchange_bytes"] == timed["model_bytes"] == r["timed_as"]["model_bytes"]
        assert timed["timing_only"] and timed["epoch_s"] == run["epoch_s"]
    runs = r["runs"]
    # the 4x straggler stretches SSGD's epoch, which waits for it every step, not AD-PSGD's
    assert runs["straggler-ssgd"]["epoch_s"] > 2 * runs["even-ssgd"]["epoch_s"]
    assert runs["straggler-adpsgd"]["epoch_s"] < 2 * runs["even-adpsgd"]["epoch_s"]
    assert set(r["summary"]) == set(r["conditions"])
    assert r["summary"]["straggler"]["ssgd_epoch_over_adpsgd"] > 1.5


def test_tables_quick(tmp_path):
    r = run_study("tables", tmp_path)
    assert set(r["runs"]) == {"hadpsgd_64_v100_ethernet", "hadpsgd_64_v100_ethernet_paper_rate",
                              "ssgd_64_v100_ethernet", "adpsgd_delay_by_one_64_p9",
                              "adpsgd_delay_by_one_128_p9"}
    for name, run in r["runs"].items():
        assert run["projected_h"] > 0 and abs(sum(run["shares"].values()) - 1) < 1e-9
        assert (run["paper_h"] is None) == (name not in ("hadpsgd_64_v100_ethernet",
                                                         "adpsgd_delay_by_one_64_p9",
                                                         "adpsgd_delay_by_one_128_p9"))
    runs = r["runs"]
    # the same schedule at the rate 5.2 h implies: only the compute seconds change
    slower = runs["hadpsgd_64_v100_ethernet_paper_rate"]["epoch_s"]
    assert slower > 2 * runs["hadpsgd_64_v100_ethernet"]["epoch_s"]
    assert runs["adpsgd_delay_by_one_128_p9"]["nprocs"] == 128

    # Run again: a finished run of the same settings is read, not run; a run dir of other
    # settings is replaced whole (a simulation appends to metrics.jsonl and tb/).
    run_dir = tmp_path / "runs" / "ssgd_64_v100_ethernet"
    finished = (run_dir / "summary.json").stat().st_mtime_ns
    run_study("tables", tmp_path)
    assert (run_dir / "summary.json").stat().st_mtime_ns == finished
    (run_dir / "left_by_an_earlier_run").write_text("")
    assert run_study("tables", tmp_path, "--epochs", "2")["epochs"] == 2
    assert not (run_dir / "left_by_an_earlier_run").exists()
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 2


def test_a_bad_study_option_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "heterogeneity", "--quick",
                           "--nprocs", "7", "--runs", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--nprocs must be even" in proc.stderr
    assert "Traceback" not in proc.stderr
    # a prefix of an option is not taken for it (batch has --margins; a full study would run
    # and overwrite docs/results/scale/batch.json)
    proc = subprocess.run([sys.executable, str(SCRIPT), "batch", "--margin", "1", "--runs",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unrecognized arguments: --margin 1" in proc.stderr


def test_failures_quick(tmp_path):
    r = run_study("failures", tmp_path)
    policies = {"restart, 5 min", "restart, Young", "restart, Daly", "elastic",
                "elastic, 2 spare nodes"}
    assert {c["policy"] for c in r["cells"]} == policies
    assert len(r["cells"]) == 2 * 2 * len(policies)  # 2 sizes x 2 MTBFs
    for cell in r["cells"]:
        assert 0 < cell["goodput"] <= 1 and cell["goodput_std"] >= 0
        assert cell["failure_free_h"] > 0 and cell["checkpoint_s"] > 0
        assert cell["job_mtbf_h"] == cell["node_mtbf_h"] / (cell["nprocs"] // 4)
        assert (cell["interval_min"] is None) is cell["policy"].startswith("elastic")
    # The restart policy simulated whole, beside the model at the same interval.
    loop = r["event_loop"]
    assert {(c["nprocs"], c["node_mtbf_h"]) for c in loop} == {(8, 1.0), (8, 10.0), (16, 1.0),
                                                               (16, 10.0)}
    assert {c["policy"] for c in loop} == {"restart", "restart, auto (Young)", "elastic"}
    for cell in loop:
        assert cell["runs"] == 2 and 0 < cell["goodput"] <= 1 and 0 < cell["model_goodput"] <= 1
        assert cell["per_epoch"] in ((1, 2, 4, None) if cell["policy"] == "restart" else (None,))
        if cell["policy"] == "restart, auto (Young)":
            # the runs planned Young's period from the modelled write and the node MTBF
            young = math.sqrt(2 * cell["checkpoint_s"] * cell["job_mtbf_h"] * 3600)
            assert cell["planned_period_s"] == [pytest.approx(young, abs=1e-3)], cell
            assert cell["interval_min"] == pytest.approx(young / 60), cell
        assert cell["failures_mean"] >= 0
