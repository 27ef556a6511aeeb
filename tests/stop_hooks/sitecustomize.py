"""Test hooks for the stop tests of tests/test_remote_direct.py: on the box's PYTHONPATH (set in
remote.json's env line), every Python process there imports this file at start-up; it does
nothing unless one of these is set:

- MARKETGPT_TEST_HOLD_VALIDATION=DIR: the trainer's validation writes DIR/rank<R> and waits
  until this rank has received its stop signal, so that a stop lands during validation however
  fast a tiny model validates.
- MARKETGPT_TEST_FAIL_STOP_SAVE=1: a checkpoint saved while a stop signal is pending fails as
  a full disk does (OSError ENOSPC).

The trainer module is patched when it is imported (a meta path finder), so that processes that
never train (the launcher's state polls) do not import torch.
"""

import errno
import importlib.abc
import importlib.util
import os
import sys
import time

HOLD = os.environ.get("MARKETGPT_TEST_HOLD_VALIDATION")
FAIL = os.environ.get("MARKETGPT_TEST_FAIL_STOP_SAVE")


def _patch(trainer_class):
    from common.training.signals import STOP_SIGNALS

    evaluate, save = trainer_class.evaluate, trainer_class._save

    def held_evaluate(self, split, *args, **kwargs):
        if HOLD and split == "val":
            open(os.path.join(HOLD, f"rank{self.rank}"), "w").close()
            deadline = time.monotonic() + 300  # never held for good
            while self.requests.pending not in STOP_SIGNALS and time.monotonic() < deadline:
                time.sleep(0.05)
        return evaluate(self, split, *args, **kwargs)

    def failing_save(self, name):
        if FAIL and self.requests.pending in STOP_SIGNALS:
            raise OSError(errno.ENOSPC, f"No space left on device (test hook): {name}")
        return save(self, name)

    trainer_class.evaluate, trainer_class._save = held_evaluate, failing_save


class _PatchTrainer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "common.training.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module.Trainer)

        spec.loader.exec_module = exec_module
        return spec


if HOLD or FAIL:
    sys.meta_path.insert(0, _PatchTrainer())
