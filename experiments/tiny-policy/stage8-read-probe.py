# Stage 8 (stage8.md): greedy EM of a policy on one suite of a world's scenarios (test split), via transformers.
# python stage8-read-probe.py POLICY_DIR WORLD/scenarios.jsonl s1-qa 40
import json,sys,torch
from transformers import AutoTokenizer, AutoModelForCausalLM
pol=sys.argv[1]; scen=sys.argv[2]; which=sys.argv[3]; n=int(sys.argv[4])
tok=AutoTokenizer.from_pretrained(pol); m=AutoModelForCausalLM.from_pretrained(pol).eval()
def flat(c):
    t,_,x=c.partition('\n'); return f"{t.strip(chr(34))}: {x}"
items=[json.loads(l) for l in open(scen)]
items=[d for d in items if d['id'].endswith(which) and d['split']=='test'][:n]
ok=0
for d in items:
    ctx="\n".join(f"Doc {i+1}: {flat(p)}" for i,p in enumerate(d['context']))
    p=f"Retrieved information:\n{ctx}\nQuestion: {d['question']}"
    ids=tok.apply_chat_template([{"role":"user","content":p}],add_generation_prompt=True,return_tensors='pt')
    if not torch.is_tensor(ids): ids=ids['input_ids']
    out=m.generate(ids,max_new_tokens=16,do_sample=False)
    s=tok.decode(out[0,ids.shape[1]:],skip_special_tokens=False)
    g=d['golden_answers'][0]; ok+= g in s
    print(repr(s[:60]),'| gold',g,'| ctx',d.get('context_answer'))
print(ok,len(items))
