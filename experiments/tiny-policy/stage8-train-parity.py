# Stage 8 (stage8.md): the steps of `cargo run --release --example copy_parity -- STEPS OUT` in
# PyTorch/transformers, from the same initial weights and batches (OUT/init, OUT/batches.json):
# python stage8-train-parity.py OUT
import torch, json, sys
from transformers import LlamaForCausalLM
from safetensors.torch import load_file
torch.set_num_threads(2)
m=LlamaForCausalLM.from_pretrained(sys.argv[1]+'/init', torch_dtype=torch.float32)
data=json.load(open(sys.argv[1]+'/batches.json')); steps=len(data)//32
dec=[p for n,p in m.named_parameters() if 'norm' not in n]; nod=[p for n,p in m.named_parameters() if 'norm' in n]
opt=torch.optim.AdamW([{'params':dec,'weight_decay':0.01},{'params':nod,'weight_decay':0.0}],lr=3e-3)
for s in range(steps):
    b=data[s*32:(s+1)*32]; L=max(len(p)+len(r) for p,r,_ in b)
    ids=torch.zeros(32,L,dtype=torch.long); lab=torch.full((32,L),-100); att=torch.zeros(32,L,dtype=torch.long)
    for i,(p,r,mk) in enumerate(b):
        x=p+r; ids[i,:len(x)]=torch.tensor(x); att[i,:len(x)]=1
        lab[i,len(p):len(x)]=torch.tensor([t if k else -100 for t,k in zip(r,mk)])
    loss=m(input_ids=ids,attention_mask=att,labels=lab).loss
    for g in opt.param_groups: g['lr']=3e-3*min(1,(s+1)/50)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(),1.0); opt.step()
    if s%25==0 or s==steps-1: print(s, round(loss.item(),3), flush=True)
