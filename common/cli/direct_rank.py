"""One rank of a direct launch under torchrun (common.cluster.direct_launch): `marketgpt train`
with the rank's exit code recorded beside the launch's log.

`python -m common.cli.direct_rank CASE LAUNCH_ID -- train ...`, as torchrun starts it. After a
stop signal torchrun exits 1 whatever its ranks did, so the launcher reads these records: the
launch is STOPPED only if every rank exited 75 (checkpoint saved). A rank killed before it could
exit leaves a record without an exit code.
"""

from __future__ import annotations

import os
import sys

from common.cli import exit_process, main
from common.cluster.direct_launch import RankRecord


def run_rank(argv: list[str]) -> None:
    """Record this rank as started, run the command, record its exit code and leave with it."""
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit("usage: python -m common.cli.direct_rank CASE LAUNCH_ID -- train ...")
    case, launch_id, args = argv[0], argv[1], argv[3:]
    record = RankRecord(case, launch_id, int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    record.started()
    code = 1  # an exception on its way out
    try:
        code = main(args)
    except SystemExit as e:  # argparse's usage error
        code = e.code if isinstance(e.code, int) else 1
        raise
    finally:
        record.exited(code)
    exit_process(code)


if __name__ == "__main__":
    run_rank(sys.argv[1:])
