"""f32 GEMM rate of libtorch (MKL) at the shapes of a world RL step on SmolLM2-135M, against the
one shape `knowrl bench world-speed` divides the FLOPs by (512 x 576 x 1536).

Forward x.W^T for every projection (M tokens), the backward's dX = dY.W, and the LoRA products
(rank 16). Usage: .venv/bin/python experiments/world-v2/gemm_shapes.py [threads]
"""
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
torch.manual_seed(0)
HID, INTER, KV, VOCAB, R = 576, 1536, 192, 49152, 16


def rate(m, k, n, reps=None):
    """GFLOP/s of x[m,k] @ w[n,k]^T (the layout of nn.Linear)."""
    x, w = torch.randn(m, k), torch.randn(n, k)
    flop = 2.0 * m * k * n
    reps = reps or max(3, int(2e10 / flop))
    torch.nn.functional.linear(x, w)
    t = time.perf_counter()
    for _ in range(reps):
        torch.nn.functional.linear(x, w)
    return flop * reps / (time.perf_counter() - t) / 1e9


def rate_bwd(m, k, n):
    """GFLOP/s of dX = dY[m,n] @ W[n,k] (the input gradient of a linear layer)."""
    dy, w = torch.randn(m, n), torch.randn(n, k)
    flop = 2.0 * m * k * n
    reps = max(3, int(2e10 / flop))
    dy @ w
    t = time.perf_counter()
    for _ in range(reps):
        dy @ w
    return flop * reps / (time.perf_counter() - t) / 1e9


print(f"threads {torch.get_num_threads()}, torch {torch.__version__}")
print(f"reference 512 x 576 x 1536: {rate(512, HID, INTER):.1f} GFLOP/s")
print("| M | q/o 576->576 | k/v 576->192 | gate/up 576->1536 | down 1536->576 | lm_head 576->49152 | dX q/o | dX gate/up | dX down | LoRA A 576->16 | LoRA B 16->1536 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for m in [32, 200, 512, 2048, 6144]:
    row = [
        rate(m, HID, HID),
        rate(m, HID, KV),
        rate(m, HID, INTER),
        rate(m, INTER, HID),
        rate(m, HID, VOCAB, reps=2 if m > 512 else None),
        rate_bwd(m, HID, HID),
        rate_bwd(m, HID, INTER),
        rate_bwd(m, INTER, HID),
        rate(m, HID, R),
        rate(m, R, INTER),
    ]
    print(f"| {m} | " + " | ".join(f"{r:.0f}" for r in row) + " |")
