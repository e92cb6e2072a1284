"""libtorch's CPU attention paths on a world step's shapes (9 query heads over 3 kv heads, head
size 64), 2 threads: (1) SDPA (flash) with the boolean mask against the math path with the q
heads of a kv group stacked (one batched product for the scores, one for the values), no grad;
(2) SDPA with the explicit causal+padding mask against `is_causal=True` on right-padded batches,
forward and forward+backward. Why `knowrl_engine::kernels::prefill_attention` exists and why
training attention stays on SDPA (docs/performance.md, 2026-12-07, AVX2-only AMD). Run with the
project's venv: `.venv/bin/python experiments/world-v2/attention_paths.py`; results in
bench/results/attention-paths-amd-avx2.txt."""
import torch
from cpu_timing import seconds

torch.set_num_threads(2)


bench = seconds

print('(1) no grad: flash vs the stacked math path')
for (B,Lq,Lk) in [(1,100,450),(1,160,300),(1,30,500),(8,100,450),(16,300,300),(32,200,200)]:
    q=torch.randn(B,9,Lq,64); k=torch.randn(B,3,Lk,64); v=torch.randn(B,3,Lk,64)
    mask=torch.ones(B,1,Lq,Lk,dtype=torch.bool).tril(Lk-Lq)
    flops=4*B*9*Lq*Lk*64
    with torch.no_grad():
        f1=lambda: torch.nn.functional.scaled_dot_product_attention(q,k,v,attn_mask=mask,enable_gqa=True)
        def f2():
            qs=q.view(B,3,3*Lq,64)   # heads of one kv group stacked (heads are [kv, group] major)
            s=torch.matmul(qs,k.transpose(-1,-2))*0.125
            s=s.view(B,3,3,Lq,Lk).masked_fill_(~mask.view(B,1,1,Lq,Lk),float('-inf'))
            p=torch.softmax(s.view(B,3,3*Lq,Lk),-1)
            return torch.matmul(p,v).view(B,9,Lq,64)
        r1=f1(); r2=f2()
        err=(r1-r2).abs().max().item()
        t1=bench(f1); t2=bench(f2)
    print(f"B{B} Lq{Lq} Lk{Lk}: flash {t1*1e3:.2f} ms {flops/t1/1e9:.0f} GF/s | stacked math {t2*1e3:.2f} ms {flops/t2/1e9:.0f} GF/s | x{t1/t2:.2f} err {err:.1e}")

print('(2) explicit mask vs is_causal')
for (B,T) in [(22,170),(16,300),(8,450),(32,100)]:
    lens=torch.randint(T//2,T+1,(B,)); lens[0]=T
    key_ok=torch.arange(T)[None,:]<lens[:,None]
    causal=torch.ones(T,T,dtype=torch.bool).tril()
    mask=(causal[None]&key_ok[:,None,:])|torch.eye(T,dtype=torch.bool)[None]
    mask=mask[:,None]
    q=torch.randn(B,9,T,64,requires_grad=True); k=torch.randn(B,3,T,64,requires_grad=True); v=torch.randn(B,3,T,64,requires_grad=True)
    g=torch.randn(B,9,T,64)*(torch.arange(T)[None,None,:,None]<lens[:,None,None,None])
    sdpa=torch.nn.functional.scaled_dot_product_attention
    def fm(): return sdpa(q,k,v,attn_mask=mask,enable_gqa=True)
    def fc(): return sdpa(q,k,v,is_causal=True,enable_gqa=True)
    with torch.no_grad():
        a=fm(); b=fc()
        valid=(torch.arange(T)[None,:]<lens[:,None])[:,None,:,None]
        err=((a-b).abs()*valid).max().item()
        tm=bench(fm); tc=bench(fc)
    def bm(): fm().backward(g)
    def bc(): fc().backward(g)
    q.grad=None;k.grad=None;v.grad=None; bm(); gm=[x.grad.clone() for x in (q,k,v)]
    q.grad=None;k.grad=None;v.grad=None; bc(); gc=[x.grad.clone() for x in (q,k,v)]
    gerr=max((x-y).abs().max().item() for x,y in zip(gm,gc))
    tbm=bench(bm); tbc=bench(bc)
    print(f"B{B} T{T}: fwd mask {tm*1e3:.1f} causal {tc*1e3:.1f} ms (x{tm/tc:.2f}) | fwd+bwd mask {tbm*1e3:.1f} causal {tbc*1e3:.1f} (x{tbm/tbc:.2f}) | err {err:.1e} grad err {gerr:.1e}")
