"""MKL (libtorch's linear) against oneDNN (a 1x1 convolution over a channels-last view, the same
libtorch) on the f32 GEMM shapes of a world RL step, forward and forward+backward (input
gradient only: the base weights of a LoRA run are frozen), 2 threads; then 60 products of
distinct row counts (a new oneDNN primitive each) and the rank-16 LoRA shapes, where oneDNN's
call overhead loses. Why `knowrl_engine::kernels::onednn_linear` exists and which shapes it takes.
Run with the project's venv: `.venv/bin/python experiments/world-v2/onednn_gemm.py`; set
ONEDNN_MAX_CPU_ISA=AVX2 to see oneDNN's AVX2 kernels against MKL's on an AVX-512 machine.
Results: bench/results/onednn-gemm-<machine>.txt."""
import os, random, time
import torch
from cpu_timing import conv_linear, seconds

torch.set_num_threads(2)


bench = seconds


print("torch", torch.__version__, "| ONEDNN_MAX_CPU_ISA =", os.environ.get("ONEDNN_MAX_CPU_ISA"))
print("rows x in x out: GFLOP/s forward MKL / oneDNN | forward+backward MKL / oneDNN | max |diff| y, dx")
for m, k, n in [(2048, 576, 1536), (2048, 1536, 576), (600, 576, 1536), (4096, 576, 576), (137, 576, 576), (2048, 576, 49152)]:
    x = torch.randn(m, k, requires_grad=True)
    w = torch.randn(n, k) / 30
    g = torch.randn(m, n)
    w4 = w.view(n, k, 1, 1)
    flops = 2 * m * k * n
    with torch.no_grad():
        f_mkl = bench(lambda: torch.nn.functional.linear(x, w))
        f_dnn = bench(lambda: conv_linear(x, w4))

    def fb_mkl():
        torch.nn.functional.linear(x, w).backward(g)

    def fb_dnn():
        conv_linear(x, w4).backward(g)

    x.grad = None
    fb_mkl()
    g1 = x.grad.clone()
    x.grad = None
    fb_dnn()
    g2 = x.grad.clone()
    x.grad = None
    with torch.no_grad():
        dy = (torch.nn.functional.linear(x, w) - conv_linear(x, w4)).abs().max().item()
    b_mkl, b_dnn = bench(fb_mkl), bench(fb_dnn)
    print(f"{m} x {k} x {n}: {flops / f_mkl / 1e9:.0f} / {flops / f_dnn / 1e9:.0f} | "
          f"{2 * flops / b_mkl / 1e9:.0f} / {2 * flops / b_dnn / 1e9:.0f} | {dy:.1e}, {(g1 - g2).abs().max().item():.1e}")

random.seed(0)
k, n = 576, 1536
w = torch.randn(n, k) / 30
w4 = w.view(n, k, 1, 1)
xs = [torch.randn(random.randint(65, 3000), k) for _ in range(60)]
flops = sum(2 * x.shape[0] * k * n for x in xs)
with torch.no_grad():
    for rep in range(2):
        t = time.perf_counter()
        for x in xs:
            torch.nn.functional.linear(x, w)
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        for x in xs:
            conv_linear(x, w4)
        t2 = time.perf_counter() - t
        print(f"60 distinct row counts (pass {rep + 1}): MKL {flops / t1 / 1e9:.0f}, oneDNN {flops / t2 / 1e9:.0f} GFLOP/s")

print("LoRA's rank-16 sides, ms (MKL / oneDNN):")
with torch.no_grad():
    for m in [256, 2048]:
        for k, n in [(576, 16), (1536, 16), (16, 576), (16, 1536)]:
            x, w = torch.randn(m, k), torch.randn(n, k)
            w4 = w.view(n, k, 1, 1)
            print(f"  {m} x {k} x {n}: {bench(lambda: torch.nn.functional.linear(x, w), 20) * 1e3:.3f} / "
                  f"{bench(lambda: conv_linear(x, w4), 20) * 1e3:.3f}")
