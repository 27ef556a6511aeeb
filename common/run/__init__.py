"""A run: its folder `case_X/checkpoints/<experiment>_YYYYMMDD_HHMMSS/`, the files in it and its
checkpoints, as one typed object that training, forecasting, evaluation, export, the cluster
commands and the benchmark open.

- files.py: the name of every file of a run folder (standard library only; a token shard holds
  the first four under the same names, so it stands on the data floor).
- folder.py: `Run`, a run folder and its files read back (config, tokenizer, RunInfo, token
  set), made (`Run.create`) and opened (`Run.open`) in one place; the run's config identity
  (which keys a resume may change); its training log. No torch: the ONNX path and
  `marketgpt status` read runs through it.
- log.py: training_log.json as a type (`RunLog`: read as attributes, written through its
  methods; its statuses and epoch keys, the seed's duration format); standard library only,
  for `marketgpt status` and the login-node commands.
- checkpoint.py: the checkpoint files (atomic, CRC32-checked, `weights_only` loadable).
- resume.py: naming a new run, finding an experiment's runs, and which run and checkpoint
  `--resume` continues.

The ids a run embeds (asset_info.json, `RunInfo`) are fixed when its token shard is prepared:
common/tokens/ids.py. This package file imports nothing, so that the tokens can read files.py
without loading the floors above them (tests/test_layers.py holds the two floors).
"""
