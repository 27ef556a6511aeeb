"""The seed guide's import path: `from common.distributed_utils import MultiGPUWrapper`.

The DDP wrapper lives in `common.distributed.ddp`; this name is kept for users' scripts.
"""

from __future__ import annotations

from common.distributed.ddp import MultiGPUWrapper

__all__ = ["MultiGPUWrapper"]
