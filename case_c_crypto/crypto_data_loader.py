"""Seed-guide entry point: `cd case_c_crypto && python crypto_data_loader.py`.

Downloads (or updates) this case's universe into its cache, exactly like
`marketgpt data download --case case_c_crypto`; extra arguments pass through (e.g. --set ...).
"""

import sys
from pathlib import Path

CASE = Path(__file__).resolve().parent
sys.path.insert(0, str(CASE.parent))  # find `common` without installing the package

from common.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["data", "download", "--case", str(CASE), *sys.argv[1:]]))
