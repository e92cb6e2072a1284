# Stage 8 (stage8.md): copy drills over real world-name words in PyTorch/transformers, from transformers' init
# (N(0, 0.02)) or, with 'uniform', from the uniform ±1/sqrt(in) init knowrl used before: python stage8-init.py 400 3e-3 [uniform]
# Needs WORLD dirs /tmp/shw and /tmp/tw (knowrl world build --seed 987654 / 46648989112 --out ...) ; run from the repository root.
# Independent check: can this architecture learn the copy drill in PyTorch/transformers?
import torch, random, json, sys, time
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
torch.manual_seed(0); random.seed(0); torch.set_num_threads(2)
pol='assets/world/policy'  # the architecture and tokenizer only
tok=AutoTokenizer.from_pretrained(pol)
cfg=LlamaConfig(**{k:v for k,v in json.load(open(pol+'/config.json')).items() if k not in('architectures','dtype')})
m=LlamaForCausalLM(cfg)
if 'uniform' in sys.argv:
    with torch.no_grad():
        for n,p in m.named_parameters():
            if p.dim()==2 and 'embed' not in n:
                b=1/p.shape[1]**0.5; p.uniform_(-b,b)
    print('uniform init')
steps=int(sys.argv[1]); lr=float(sys.argv[2])
syl=['ka','zo','dre','vi','lu','sha','mor','te','bri','nu','gai','fo','rou','ske','thi','pa','wen','ix','ol','ard']
import glob
NAMES=[]
for f in ['/tmp/shw/world.json','/tmp/tw/world.json']:
    for e in json.load(open(f))['entities']:
        NAMES += e['name'].split()
NAMES=sorted(set(NAMES)); print(len(NAMES))
def name(): return random.choice(NAMES)
def ex():
    t=', '.join(name() if random.random()<.6 else name()+' '+name() for _ in range(random.randint(4,8)))
    p=tok.apply_chat_template([{"role":"user","content":"Repeat: "+t}],add_generation_prompt=True,tokenize=True)
    p=list(p["input_ids"]) if not isinstance(p,list) else p
    r=tok.encode(t,add_special_tokens=False)+[tok.convert_tokens_to_ids('<|im_end|>')]
    return p,r
opt=torch.optim.AdamW(m.parameters(),lr=lr,weight_decay=0.01)
sched=torch.optim.lr_scheduler.LambdaLR(opt,lambda s: min(1,(s+1)/50))
t0=time.time()
for s in range(steps):
    b=[ex() for _ in range(32)]; L=max(len(p)+len(r) for p,r in b)
    ids=torch.zeros(32,L,dtype=torch.long); lab=torch.full((32,L),-100); att=torch.zeros(32,L,dtype=torch.long)
    for i,(p,r) in enumerate(b):
        x=p+r; ids[i,:len(x)]=torch.tensor(x); att[i,:len(x)]=1; lab[i,len(p):len(x)]=torch.tensor(r)
    loss=m(input_ids=ids,attention_mask=att,labels=lab).loss
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(),1.0); opt.step(); sched.step()
    if s%50==0 or s==steps-1: print(s, round(loss.item(),3), round(time.time()-t0), flush=True)
