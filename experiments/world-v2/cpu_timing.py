"""Shared by the CPU timing scripts here (`onednn_gemm.py`, `attention_paths.py`, `lora_forms.py`,
`training_attention.py`): a warm-up-then-average timer, and x·Wᵀ as oneDNN's 1x1 convolution
over a channels-last view, the way `knowrl_engine::kernels::onednn_linear` runs it."""
import time

import torch


def seconds(f, reps=10):
    """Mean wall time of `f()` over `reps` calls after 3 warm-up calls."""
    for _ in range(3):
        f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps


def conv_linear(x, w4):
    """x [m, k] · w [n, k]ᵀ with w given as [n, k, 1, 1]: a 1x1 convolution, output [m, n]."""
    m, k = x.shape
    y = torch.nn.functional.conv2d(x.view(1, m, 1, k).permute(0, 3, 1, 2), w4)
    return y.permute(0, 2, 3, 1).reshape(m, -1)
