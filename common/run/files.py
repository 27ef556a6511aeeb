"""The files of a run folder, by name: the one place that spells them.

    case_X/checkpoints/<experiment>_YYYYMMDD_HHMMSS/
    config.json          CONFIG_JSON        the fully resolved config; a resume reads this
    tokenizer.json       TOKENIZER_JSON     the tokenizer fitted on the train split
    asset_info.json      ASSET_INFO_JSON    the asset, category and interval ids (RunInfo)
    data_info.json       DATA_INFO_JSON     cleaning counts, split cuts, volume edges
    tokens/              TOKENS_DIR         the token set (common/tokens/token_set.py)
    training_log.json    TRAINING_LOG_JSON  status, best val loss and epoch, one entry per epoch
    best_model.pt        BEST_MODEL_PT      the best epoch's weights (checkpoint.py: the checkpoints)
    test_results.json    TEST_RESULTS_JSON  the test split's scores
    report.png           REPORT_PNG         the training curves and test scores, drawn
    scorecard.json/.png  SCORECARD_JSON/PNG the price-space scorecard
    calibration.json     CALIBRATION_JSON   `marketgpt calibrate`'s fit on the validation split
    reversion.json       REVERSION_JSON     the volatility reversion fitted at the end of training
    forecasts/           FORECASTS_DIR      `marketgpt forecast`'s outputs

A token shard holds the first four under the same names (a run copies them from it), and an
export folder carries config.json, tokenizer.json and asset_info.json. Standard library only:
`marketgpt status` and `remote` read a run's files without numpy, pandas or torch.
"""

from __future__ import annotations

__all__ = [
    "ASSET_INFO_JSON",
    "BEST_MODEL_PT",
    "CALIBRATION_JSON",
    "CONFIG_JSON",
    "DATA_INFO_JSON",
    "FORECASTS_DIR",
    "REPORT_PNG",
    "REVERSION_JSON",
    "SCORECARD_JSON",
    "SCORECARD_PNG",
    "TEST_RESULTS_JSON",
    "TOKENIZER_JSON",
    "TOKENS_DIR",
    "TRAINING_LOG_JSON",
]

CONFIG_JSON = "config.json"
TOKENIZER_JSON = "tokenizer.json"
ASSET_INFO_JSON = "asset_info.json"
DATA_INFO_JSON = "data_info.json"
TOKENS_DIR = "tokens"
TRAINING_LOG_JSON = "training_log.json"
BEST_MODEL_PT = "best_model.pt"
TEST_RESULTS_JSON = "test_results.json"
REPORT_PNG = "report.png"
SCORECARD_JSON = "scorecard.json"
SCORECARD_PNG = "scorecard.png"
CALIBRATION_JSON = "calibration.json"
REVERSION_JSON = "reversion.json"
FORECASTS_DIR = "forecasts"
