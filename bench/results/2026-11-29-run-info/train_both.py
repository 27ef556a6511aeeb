"""Train the two tiny runs of README.md into ROOT with the code on PYTHONPATH:
python train_both.py ROOT TESTS_DIR (TESTS_DIR: that code's tests/, for test_forecast.TINY)."""

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[2])
from common.cli import main  # noqa: E402

from test_forecast import TINY  # noqa: E402

root = Path(sys.argv[1])
root.mkdir(parents=True)
for name, data in (
    ("one", {"source": "sample", "interval": "1d"}),
    ("multi", {"source": "sample", "interval": "1d", "intervals": ["1d", "1h"], "interval_split": "per_interval"}),
):
    spec = copy.deepcopy(TINY)
    spec["data"] = data
    spec["training"]["epochs"] = 2
    spec["training"]["scorecard_origins"] = 4
    cfg = root / name / "configs" / "tiny.json"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps(spec))
    assert main(["train", "--config", str(cfg)]) == 0
