"""Attention under autograd (forward + backward) on the shapes of a world update's scoring,
2 threads: libtorch's SDPA (the CPU flash kernel: one tiny MKL GEMM per row, head, 32-query
block and key block) against the math path with the q heads of a kv group stacked (two batched
products and a softmax; autograd's backward is batched products too). Shapes: Knowledgeable-R1's
continuations (64 rows × 11 queries over a ~170-token shared prefix) and prefixes (8 × 170),
GRPO's continuations (16 × 150 over 210 keys) and prefixes (4 × 60). Run:
`.venv/bin/python experiments/world-v2/training_attention.py`."""
import time
import torch

torch.set_num_threads(2)


def bench(f, reps=10):
    for _ in range(3):
        f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps * 1e3


def stacked(q, k, v, mask):
    B, H, Lq, D = q.shape
    G = k.shape[1]
    qs = q.reshape(B, G, (H // G) * Lq, D)
    s = torch.matmul(qs, k.transpose(-1, -2)) * D ** -0.5
    m = mask.expand(B, 1, Lq, -1).repeat(1, 1, H // G, 1)  # [B, 1, (H/G)·Lq, Lk]
    s = s.masked_fill(~m, float("-inf"))
    p = torch.softmax(s, -1)
    return torch.matmul(p, v).reshape(B, H, Lq, D)


for name, B, Lq, Lk in [("K-R1 continuations", 64, 11, 181), ("K-R1 prefixes", 8, 170, 170),
                        ("GRPO continuations", 16, 150, 210), ("GRPO prefixes", 4, 60, 60)]:
    q = torch.randn(B, 9, Lq, 64, requires_grad=True)
    k = torch.randn(B, 3, Lk, 64, requires_grad=True)
    v = torch.randn(B, 3, Lk, 64, requires_grad=True)
    mask = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)[None, None].expand(B, 1, Lq, Lk)
    g = torch.randn(B, 9, Lq, 64)

    def sdpa():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).backward(g)

    def math():
        stacked(q, k, v, mask).backward(g)

    with torch.no_grad():
        o1 = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        o2 = stacked(q, k, v, mask)
    t1, t2 = bench(sdpa), bench(math)
    print(f"{name} (B {B}, {Lq} queries over {Lk} keys): SDPA {t1:.2f} ms, stacked math {t2:.2f} ms "
          f"({t1 / t2:.2f}x), forward max |diff| {(o1 - o2).abs().max().item():.1e}")
