"""Speech recipes: Kaldi data directories, log-mel features, a BLSTM-CTC acoustic model and
Switchboard-style WER scoring; the spoken-digits corpus is synthesized locally."""
