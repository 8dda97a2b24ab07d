"""One core's fp32 matrix-multiply rate (FLOP/s), the peak that MFU is measured against.

Prints JSON: {"gflops": ..., "n": ..., "threads": 1}. The best of several
timed products of an n x n by n x n matrix (2 n^3 FLOPs each).
"""
import json
import time

import torch

torch.set_num_threads(1)
n = 1024
a = torch.randn(n, n)
b = torch.randn(n, n)
for _ in range(3):
    torch.mm(a, b)
best = float("inf")
for _ in range(10):
    start = time.perf_counter()
    torch.mm(a, b)
    best = min(best, time.perf_counter() - start)
print(json.dumps({"gflops": 2 * n**3 / best / 1e9, "n": n, "threads": 1}))
