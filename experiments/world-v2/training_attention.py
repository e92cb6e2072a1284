"""Attention under autograd (forward + backward) on the shapes of a world update's scoring,
2 threads: libtorch's SDPA (the CPU flash kernel: one tiny MKL GEMM per row, head, 32-query
block and key block) against the math path with the q heads of a kv group stacked (two batched
products and a softmax; autograd's backward is batched products too). Shapes: Knowledgeable-R1's
continuations (64 rows × 11 queries over a ~170-token shared prefix) and prefixes (8 × 170),
GRPO's continuations (16 × 150 over 210 keys) and prefixes (4 × 60). Run:
`.venv/bin/python experiments/world-v2/training_attention.py`. Last: Knowledgeable-R1's
continuations grouped by shared prefix (8 groups of 8 rows: 88 queries over the prefix and the
group's 88 continuation keys, a block mask) against one attention row per sample, both SDPA;
timing only (the grouped call reads the first row's prefix for the group)."""
import torch
from cpu_timing import seconds

torch.set_num_threads(2)


def bench(f):
    return seconds(f) * 1e3


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


# Rows sharing a prefix as one attention row: queries of the group's 8 continuations stacked,
# keys = prefix ‖ every continuation of the group; each query sees the prefix and its own row.
G, per, Lp, Lc = 8, 8, 170, 11
q = torch.randn(G * per, 9, Lc, 64, requires_grad=True)
k = torch.randn(G * per, 3, Lp + Lc, 64, requires_grad=True)
v = torch.randn(G * per, 3, Lp + Lc, 64, requires_grad=True)
g = torch.randn(G * per, 9, Lc, 64)
row_mask = torch.ones(Lc, Lp + Lc, dtype=torch.bool).tril(Lp)[None, None].expand(G * per, 1, Lc, Lp + Lc)
gm = torch.zeros(per * Lc, Lp + per * Lc, dtype=torch.bool)
gm[:, :Lp] = True
for r in range(per):
    gm[r * Lc:(r + 1) * Lc, Lp + r * Lc:Lp + (r + 1) * Lc] = torch.ones(Lc, Lc, dtype=torch.bool).tril()
gm = gm[None, None].expand(G, 1, per * Lc, Lp + per * Lc)


def per_row():
    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=row_mask, enable_gqa=True).backward(g)


def grouped():
    # The same values: queries [G, H, per·Lc, D]; keys: the group's prefix once, then its rows'.
    qg = q.view(G, per, 9, Lc, 64).transpose(1, 2).reshape(G, 9, per * Lc, 64)
    kp, kc = k.view(G, per, 3, Lp + Lc, 64)[:, 0, :, :Lp], k.view(G, per, 3, Lp + Lc, 64)[:, :, :, Lp:]
    vp, vc = v.view(G, per, 3, Lp + Lc, 64)[:, 0, :, :Lp], v.view(G, per, 3, Lp + Lc, 64)[:, :, :, Lp:]
    kg = torch.cat([kp, kc.transpose(1, 2).reshape(G, 3, per * Lc, 64)], 2)
    vg = torch.cat([vp, vc.transpose(1, 2).reshape(G, 3, per * Lc, 64)], 2)
    o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, attn_mask=gm, enable_gqa=True)
    o.view(G, 9, per, Lc, 64).transpose(1, 2).reshape(G * per, 9, Lc, 64).backward(g)


t1, t2 = bench(per_row), bench(grouped)
print(f"K-R1 continuations, one attention row per sample: {t1:.2f} ms; grouped by prefix: {t2:.2f} ms ({t1 / t2:.2f}x)")
