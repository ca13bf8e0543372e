"""The lines adpsgd-run prints under a run's results table (runner/runlog/summary.py)."""

from runner.runlog.summary import replicas_line


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
