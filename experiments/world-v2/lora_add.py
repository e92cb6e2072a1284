"""A rank-16 LoRA on a 576 -> 1,536 projection over 7,000 training tokens, 2 threads: the base
product alone, the adapter as a separate product added to it (y + (x.A^T.s).B^T), and the
adapter's product accumulated into the base output in place (y.addmm_(h, B^T)), which
`layers::Linear::forward` now does for many rows. Usage: .venv/bin/python experiments/world-v2/lora_add.py
"""
import time

import torch

torch.set_num_threads(2)
N, I, O, R = 7000, 576, 1536, 16
x, W, A, B = torch.randn(N, I), torch.randn(O, I), torch.randn(R, I), torch.randn(O, R)
lin = torch.nn.functional.linear


def ms(f, reps=20):
    f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps * 1e3


def accumulated():
    y = lin(x, W)
    return y.addmm_(lin(x, A) * 2.0, B.T)


for _ in range(3):
    base = ms(lambda: lin(x, W))
    separate = ms(lambda: lin(x, W) + lin(lin(x, A) * 2.0, B))
    print(f"base {base:.1f} ms, separate {separate:.1f} ms (+{separate / base - 1:.0%}), "
          f"accumulated {ms(accumulated):.1f} ms (+{ms(accumulated) / base - 1:.0%})")
