"""Host cost of the small things a Trainer step does, on the GPU (microseconds per call)."""

import time

import torch

from common.distributed.ddp import MultiGPUWrapper, no_sync
from common.training.trainer import step_values

dev = torch.device("cuda")


def t(name, fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    print(f"{name:40s} {dt:8.1f} us")


v = torch.zeros(4, dtype=torch.float64, device=dev)
s3 = torch.zeros(3, dtype=torch.float64, device=dev)
nrm = torch.zeros((), device=dev)
t("empty pinned(4)", lambda: torch.empty(4, dtype=torch.float64, pin_memory=True))
h = torch.empty(4, dtype=torch.float64, pin_memory=True)
t("copy_ d2h nonblocking", lambda: h.copy_(v, non_blocking=True))
t("Event()+record", lambda: torch.cuda.Event().record())
e = torch.cuda.Event()
e.record()
t("event.synchronize (done)", lambda: e.synchronize())
t("tolist(pinned 4)", lambda: h.tolist())
sv = torch.compile(step_values)
sv(s3, nrm)
t("compiled step_values", lambda: sv(s3, nrm))
t("eager step_values", lambda: step_values(s3, nrm))
t("eager add (3,)", lambda: s3 + s3)
m = torch.compile(MultiGPUWrapper(torch.nn.Linear(4, 4), device=dev))
t("no_sync getattr on compiled", lambda: no_sync(m, skip=False))
x = torch.zeros(32, 129, device=dev, dtype=torch.long)
t("view slice x[:, :-1]", lambda: x[:, :-1])
t("mark_step_begin", lambda: torch.compiler.cudagraph_mark_step_begin())


def ac():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        pass


t("autocast ctx", ac)
t("time.monotonic", time.monotonic)
