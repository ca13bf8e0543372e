"""The lines adpsgd-run prints under a run's results table (runner/runlog/summary.py)."""

import io
import json
import re

from runner.runlog.console import CONSOLE_IS_TERMINAL, ProgressBar
from runner.runlog.summary import replicas_line, results_table


def test_identical_replicas_print_no_consensus_distance_of_rounding():
    """SSGD's replicas are bit for bit identical, yet the distance to their mean can come out
    at 1e-11 from the mean's own rounding: a number that reads as a disagreement."""
    ssgd = {"replicas_identical": True, "consensus_distance": 1.93e-11, "top1": 95.1,
            "final": {"top1": 95.1}, "final_rank0": {"top1": 95.1}}
    assert replicas_line(ssgd) is None
    gossip = {**ssgd, "replicas_identical": False, "consensus_distance": 0.42,
              "final_rank0": {"top1": 94.0}}
    assert replicas_line(gossip) == ("held-out top1 95.10 (averaged model), 94.00 (rank 0's "
                                     "own); consensus distance 0.42")


def test_a_simulations_rate_is_labelled_modelled_and_its_progress_the_hosts(tmp_path,
                                                                           monkeypatch):
    summary = {"algo": "adpsgd", "recipe": "digit_images", "nprocs": 64, "samples_per_s": 5120,
               "status": "completed", "launcher": "sim"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert "64 ranks: 5120 modelled samples/s, status completed" in results_table(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "launcher": "local"}))
    assert "64 ranks: 5120 samples/s, status completed" in results_table(tmp_path)
    monkeypatch.delenv(CONSOLE_IS_TERMINAL, raising=False)
    out = io.StringIO()
    ProgressBar(out, 100, 0, "adpsgd x64 (sim)", 3600, "host samples/s").update(50, force=True)
    assert re.search(r"\(50\.0%\), [\d,]+ host samples/s, ", out.getvalue()), out.getvalue()
