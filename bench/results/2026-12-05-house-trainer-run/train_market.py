"""Train README's tiny run reading the market (model.market_context, rotary positions, as the case
configs) into ROOT with the code on PYTHONPATH: python train_market.py ROOT TESTS_DIR."""

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[2])
from common.cli import main  # noqa: E402

from test_forecast import TINY  # noqa: E402

root = Path(sys.argv[1])
spec = copy.deepcopy(TINY)
spec["data"] = {"source": "sample", "interval": "1d"}
spec["model"].update(market_context=True, positional="rope")
spec["training"].update(epochs=2, scorecard_origins=4)
cfg = root / "market" / "configs" / "tiny.json"
cfg.parent.mkdir(parents=True)
cfg.write_text(json.dumps(spec))
assert main(["train", "--config", str(cfg)]) == 0
