"""What autograd keeps per token per block in knowrl's training forward (#24's memory-model gap).
Replays the engine's op sequence for one Llama/Qwen2 block (crates/engine/src/models/llama.rs,
layers.rs: f32 RMSNorm, linear + LoRA, RoPE as x*cos + rotate_half(x)*sin, SDPA with a bool mask
and enable_gqa, SiLU MLP) in PyTorch, and sums the bytes of the tensors autograd saves, by op,
counting each storage once. Usage: .venv/bin/python experiments/memory/saved_tensors.py
"""
import collections
import torch

torch.manual_seed(0)
B, L, h, i, H, KV, d, r = 2, 512, 896, 4864, 14, 2, 64, 16  # Qwen2.5-0.5B, micro-batch 2 x 512


def lin(n_in, n_out, bias):
    w = torch.randn(n_out, n_in) * 0.02
    b = torch.zeros(n_out) if bias else None
    a = (torch.randn(r, n_in) * 0.02).requires_grad_()
    bb = torch.zeros(n_out, r).requires_grad_()
    return lambda x: torch.nn.functional.linear(x, w, b) + torch.nn.functional.linear(torch.nn.functional.linear(x, a), bb) * 2.0


q_proj, k_proj, v_proj, o_proj = lin(h, H * d, True), lin(h, KV * d, True), lin(h, KV * d, True), lin(H * d, h, False)
gate, up, down = lin(h, i, False), lin(h, i, False), lin(i, h, False)
w1, w2 = torch.ones(h, requires_grad=True), torch.ones(h, requires_grad=True)


def norm(x, w):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * (var + 1e-6).rsqrt())


def rot(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([-x2, x1], -1)


pos = torch.arange(L).float()
inv = 1.0 / 1e6 ** (torch.arange(0, d, 2).float() / d)
ang = torch.cat([pos[:, None] * inv] * 2, -1)
cos, sin = ang.cos()[None, None], ang.sin()[None, None]
mask = torch.ones(L, L, dtype=torch.bool).tril()[None, None].expand(B, 1, L, L)

saved = collections.Counter()
seen = set()


weights = set()


def pack(t):
    key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    if key not in seen:
        seen.add(key)
        # Weights (frozen base, LoRA, norms) are saved too, but they are not per-token memory.
        bucket = "weights" if key in weights else current[0]
        saved[bucket] += t.untyped_storage().nbytes()
    return t


current = ["input"]
for f in list(globals().values()):
    for cell in getattr(f, "__closure__", None) or []:
        if isinstance(cell.cell_contents, torch.Tensor):
            weights.add((cell.cell_contents.untyped_storage().data_ptr(), cell.cell_contents.untyped_storage().nbytes()))
for t in (w1, w2):
    weights.add((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
x = torch.randn(B * L, h, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    def step(name, f):
        current[0] = name
        return f()

    n1 = step("norm1", lambda: norm(x, w1))
    q = step("q_proj", lambda: q_proj(n1))
    k = step("k_proj", lambda: k_proj(n1))
    v = step("v_proj", lambda: v_proj(n1))
    heads = lambda y, n: y.view(B, L, n, d).transpose(1, 2)
    q, k, v = heads(q, H), heads(k, KV), heads(v, KV)
    q = step("rope q", lambda: q * cos + rot(q) * sin)
    k = step("rope k", lambda: k * cos + rot(k) * sin)
    y = step("sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    y = step("o_proj", lambda: o_proj(y.transpose(1, 2).reshape(B * L, H * d)))
    x2 = x + y
    n2 = step("norm2", lambda: norm(x2, w2))
    m = step("mlp", lambda: down(torch.nn.functional.silu(gate(n2)) * up(n2)))
    out = x2 + m

tokens = B * L
total = sum(v_ for k_, v_ in saved.items() if k_ != "weights")
print(f"saved activations per token per block: {total / tokens / 1024:.1f} KB (weights aside)")
for k_, v_ in saved.items():
    print(f"  {k_:<8} {v_ / tokens / 1024:7.1f} KB")
