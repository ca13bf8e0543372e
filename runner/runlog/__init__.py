"""What a run leaves behind. Only rank 0 writes. Layout of a run dir (the interface contract):

* ``tb/``            TensorBoard events (runner/runlog/writer.py)
* ``metrics.jsonl``  one JSON object per evaluation: epoch, step, samples, wall_s, train_s
                     (wall less evaluations and checkpoints), split, loss, and top1/top5
                     or wer (writer.py writes it, records.py reads it back)
* ``summary.json``   final metrics, throughput, time split, consensus distance, status
                     (runner/runlog/summary.py)
* ``logs/restarts.json``  the launcher's restarts (records.py)
"""
