"""A LoRA projection's forward + backward under autograd, four ways of adding the adapter's
h·Bᵀ to the base product (oneDNN's 1x1 convolution, whose output is a view): in place into
the base (what knowrl did: autograd then copies and zero-fills [N, out] around the in-place
write), out-of-place addmm, and h·Bᵀ first with the base added into it (knowrl now, under
grad). Base alone for scale; 2 threads. Run: `.venv/bin/python experiments/world-v2/lora_forms.py`.
Why `layers::Linear::forward` adds the base into h·Bᵀ under autograd (docs/performance.md).
Then the adapter's two sides alone (h·Bᵀ and x·Aᵀ, forward + backward) on MKL against oneDNN's
1x1 convolution: whether the rank-16 products should move to oneDNN (they should not: 0.64–1.72x MKL's time)."""
import torch
from cpu_timing import conv_linear, seconds
torch.set_num_threads(2)
def bench(f):
    return seconds(f, reps=12) * 1e3
for rows,k,n in [(1360,576,1536),(1360,1536,576),(1360,576,192)]:
    W=torch.randn(n,k)/30; W4=W.view(n,k,1,1)
    A=(torch.randn(16,k)/30).requires_grad_(); B=(torch.randn(n,16)/30).requires_grad_()
    x=torch.randn(rows,k,requires_grad=True); g=torch.randn(rows,n)
    def base(): conv_linear(x,W4).backward(g)
    def cur():
        h=torch.nn.functional.linear(x,A)*2.0
        y=conv_linear(x,W4); y.addmm_(h,B.t()); y.backward(g)
    def outplace_addmm():
        h=torch.nn.functional.linear(x,A)*2.0
        y=torch.addmm(conv_linear(x,W4),h,B.t()); y.backward(g)
    def z_first():
        h=torch.nn.functional.linear(x,A)*2.0
        z=h.mm(B.t()); z+=conv_linear(x,W4); z.backward(g)
    def z_first_lin():
        h=torch.nn.functional.linear(x,A)*2.0
        z=torch.nn.functional.linear(h,B); z+=conv_linear(x,W4); z.backward(g)
    r={f.__name__: bench(f) for f in [base,cur,outplace_addmm,z_first,z_first_lin,base,cur]}
    print(rows,k,n, {a: round(b,2) for a,b in r.items()})


for rows in [1360, 700]:
    for n in [1536, 576, 192]:
        h = torch.randn(rows, 16, requires_grad=True)
        B = (torch.randn(n, 16) / 4).requires_grad_()
        g = torch.randn(rows, n)
        b_mkl = bench(lambda: h.mm(B.t()).backward(g))
        b_dnn = bench(lambda: conv_linear(h, B.view(n, 16, 1, 1)).backward(g))
        k = n if n != 192 else 576
        x = torch.randn(rows, k, requires_grad=True)
        A = (torch.randn(16, k) / 30).requires_grad_()
        g2 = torch.randn(rows, 16)
        a_mkl = bench(lambda: torch.nn.functional.linear(x, A).backward(g2))
        a_dnn = bench(lambda: conv_linear(x, A.view(16, k, 1, 1)).backward(g2))
        print(f"rows {rows}: h·Bᵀ 16 -> {n} fwd+bwd MKL {b_mkl:.2f} ms, oneDNN {b_dnn:.2f} | "
              f"x·Aᵀ {k} -> 16 MKL {a_mkl:.2f}, oneDNN {a_dnn:.2f}")
