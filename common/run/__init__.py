"""A run: its folder `case_X/checkpoints/<experiment>_YYYYMMDD_HHMMSS/`, the files in it and its
checkpoints, as one typed object that training, forecasting, evaluation, export, the cluster
commands and the benchmark open.

- info.py: `RunInfo`, asset_info.json as a type (the run's assets, categories, intervals and
  series, the ids the model embeds). It is fixed when a token shard is prepared, so it stands on
  the data floor, where the tokens and the model read it; it needs nothing but the data layer.
- folder.py: `Run`, a run folder and its files read back (config, tokenizer, RunInfo, token
  set), made (`Run.create`) and opened (`Run.open`) in one place; the run's config identity
  (which keys a resume may change); its training log. No torch: the ONNX path and
  `marketgpt status` read runs through it.
- log.py: training_log.json (`TrainingLog`, its statuses and epoch keys, the seed's duration
  format); standard library only, for `marketgpt status` and the login-node commands.
- checkpoint.py: the checkpoint files (atomic, CRC32-checked, `weights_only` loadable).
- resume.py: naming a new run, finding an experiment's runs, and which run and checkpoint
  `--resume` continues.

This package file imports nothing, so that the tokens and the model can read `RunInfo` without
loading the floors above them (tests/test_layers.py holds the two floors).
"""
