"""runner/comm/traffic.py: what a rank counts as sent, per step, across a checkpoint."""

import threading

from runner.comm.traffic import Traffic


def test_sends_inside_aside_are_not_training_traffic_and_only_for_that_thread():
    traffic = Traffic()
    traffic.count("world/exchange", 100)
    other = threading.Thread(target=lambda: traffic.count("world/gossip", 7))
    with traffic.aside():
        traffic.count("world/allreduce", 1000)  # an evaluation's reduction
        other.start()  # the gossip thread goes on counting meanwhile
        other.join()
    traffic.count("world/exchange", 50)
    assert traffic.report(3) == {"total": 157, "per_step": 157 / 3,
                                 "by_kind": {"world/exchange": 150, "world/gossip": 7}}


def test_a_checkpoint_continues_the_counts_and_one_without_them_starts_at_its_step():
    traffic = Traffic()
    traffic.count("world/exchange", 600)
    saved = traffic.state_dict()
    resumed = Traffic()
    resumed.load_state_dict(saved, step=6)
    resumed.count("world/exchange", 400)
    assert resumed.report(10)["per_step"] == 100  # 1,000 bytes over all 10 steps
    older = Traffic()  # a checkpoint written before bytes were counted, at step 6
    older.load_state_dict(None, step=6)
    older.count("world/exchange", 400)
    assert older.report(10) == {"total": 400, "per_step": 100, "by_kind": {"world/exchange": 400}}
    again = Traffic()  # and a checkpoint of that run keeps where its counting began
    again.load_state_dict(older.state_dict(), step=10)
    assert again.report(10)["per_step"] == 100
