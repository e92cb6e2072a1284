"""Probe (#23, AKBE): is the knowledge boundary linearly readable where the agent decides to search?

AKBE's efficiency targets presume the policy can tell, at the start of its response, whether it
knows the answer. The 135M policy's sampled answers carry that signal (modal-share AUROC 0.74,
docs/methods/akbe.md), yet every trained arm moved its search decision on all classes alike.
This fits an L2 logistic regression (features standardised, C = 0.05) on the residual stream of
the agent prompt, per layer, at two positions: the prompt's last token (the one that emits the
first response token, "<search>" or "<answer>") and the last token of the question's subject
name (where a model would recall what it knows of the entity); and, as a what-if for an agent
that recalls before it decides, the last token of the policy's own greedy answer under the
query-only prompt (prompt + answer, the position a decision after a recall step would come
from). Labels: PK (min_searches 0) vs
the rest, over all questions (surface-confounded: hop count shows in the wording) and within
1-hop questions (only the entity differs). 5-fold cross-validation over all splits, folds grouped
by the question's subject entity (37 subjects have two 1-hop questions, and PK-ness is nearly
per entity, so ungrouped folds let the probe recognise a name it was trained on), AUROC of the
pooled held-out scores, mean of 3 shuffles. Control: the base model
without the knowledge adapter, which knows none of the world's facts, so whatever it reads comes
from the surface of the prompt.
Reference (no fitting): AUROC of the mean log-prob of the policy's own greedy query-only answer
tokens, the behavioural signal, on the same 1-hop questions.
Input: `dump_prompts` JSON lines.
Usage: probe_hidden_boundary.py prompts.jsonl world_dir adapter_dir base_dir [--behaviour-only]
"""
import json
import sys

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedGroupKFold
from sklearn.preprocessing import StandardScaler
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

prompts_path, world_dir, adapter_dir, base_dir = sys.argv[1:5]
rows = [json.loads(line) for line in open(prompts_path)]
world = json.load(open(f"{world_dir}/world.json"))
names = {e["id"]: e["name"] for e in world["entities"]}
subject = {f["id"]: f["subject"] for f in world["facts"]}
chains = {q["id"]: q["chain"] for q in map(json.loads, open(f"{world_dir}/questions.jsonl"))}
tok = AutoTokenizer.from_pretrained(base_dir)
torch.set_num_threads(2)


def entity_position(r):
    """Index of the last token of the question's subject name in the agent prompt."""
    ids = r["agent_ids"]
    name = names[subject[chains[r["id"]][0]]]
    end = next((i for i in range(len(ids)) if name in tok.decode(ids[: i + 1])), None)
    assert end is not None, (r["id"], name)
    return end


positions = [entity_position(r) for r in rows]


def hidden(model):
    """Residual stream after every layer (and the embeddings) at the subject's last token and at
    the agent prompt's last token, and at the end of the recalled answer: [questions, 3, layers + 1, d]."""
    out = []
    with torch.no_grad():
        for r, pos in zip(rows, positions):
            hs = model(input_ids=torch.tensor([r["agent_ids"]]), output_hidden_states=True).hidden_states
            recall = model(input_ids=torch.tensor([r["qo_ids"] + r["qo_response"]]), output_hidden_states=True)
            out.append(torch.stack([torch.stack([h[0, pos] for h in hs]), torch.stack([h[0, -1] for h in hs]),
                                    torch.stack([h[0, -1] for h in recall.hidden_states])]))
    return torch.stack(out).float().numpy()


def fit_score(xtr, ytr, xte):
    sc = StandardScaler().fit(xtr)
    clf = LogisticRegression(C=0.05, max_iter=3000).fit(sc.transform(xtr), ytr)
    return clf.decision_function(sc.transform(xte))


def cv_auc(x, y, groups):
    aucs = []
    for seed in range(3):
        score = np.zeros(len(y))
        for tr, te in StratifiedGroupKFold(5, shuffle=True, random_state=seed).split(x, y, groups):
            score[te] = fit_score(x[tr], y[tr], x[te])
        aucs.append(roc_auc_score(y, score))
    return float(np.mean(aucs))


groups = np.array([subject[chains[r["id"]][0]] for r in rows])
pk = np.array([r["min_searches"] == 0 for r in rows], dtype=int)
one_hop = np.array([r["hops"] == 1 for r in rows])
layers = [1, 3, 5, 8, 10, 12, 15, 18, 20, 22, 25, 28, 30]


def answer_logprob(model, r):
    """Mean log-prob of the answer's own tokens (between "<answer>" and "</answer>")."""
    ids = r["qo_ids"] + r["qo_response"]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    text = [tok.decode(ids[: i + 1]) for i in range(len(r["qo_ids"]), len(ids))]
    start = next((i for i, t in enumerate(text) if t.endswith("<answer>") or "<answer> " in t[-10:]), 0)
    end = next((i for i, t in enumerate(text) if "</" in t[len(text[start]):]), len(text))
    pos = range(len(r["qo_ids"]) + start + 1, len(r["qo_ids"]) + max(end, start + 1))
    return float(np.mean([logp[p - 1, ids[p]].item() for p in pos])) if len(pos) else 0.0


policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), adapter_dir).eval()
lp = np.array([answer_logprob(policy, r) if h else 0.0 for r, h in zip(rows, one_hop)])
print(f"behavioural reference, 1-hop: AUROC of the policy's mean answer-token log-prob, PK vs rest "
      f"{roc_auc_score(pk[one_hop], lp[one_hop]):.3f} (mean {lp[one_hop & (pk == 1)].mean():.3f} PK, "
      f"{lp[one_hop & (pk == 0)].mean():.3f} rest)\n")
if "--behaviour-only" in sys.argv:
    sys.exit(0)
results = {}
print(f"{len(rows)} questions; 1-hop {one_hop.sum()} ({pk[one_hop].sum()} PK); AUROC by layer {layers}\n")
print("| model | position | PK vs rest, all (5-fold CV) | PK vs rest, 1-hop (5-fold CV) | 1-hop, best layer |")
print("|---|---|---|---|---|")
for mname, load in [
    ("knowledge adapter (shipped policy)", lambda: policy),
    ("base model, no adapter (surface control)", lambda: AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32).eval()),
]:
    x = hidden(load())
    for p, pname in enumerate(["subject's last token", "prompt's last token (decision)",
                               "end of its own query-only answer (recall, then decide)"]):
        all_q = [cv_auc(x[:, p, l], pk, groups) for l in layers]
        hop1 = [cv_auc(x[one_hop, p, l], pk[one_hop], groups[one_hop]) for l in layers]
        results[f"{mname} / {pname}"] = {"layers": layers, "all_cv": all_q, "one_hop_cv": hop1}
        best = int(np.argmax(hop1))
        print(f"| {mname} | {pname} | {' '.join(f'{a:.2f}' for a in all_q)} | "
              f"{' '.join(f'{a:.2f}' for a in hop1)} | {layers[best]}: {hop1[best]:.3f} |")
        sys.stdout.flush()
json.dump(results, open(prompts_path.replace(".jsonl", "-probe.json"), "w"), indent=1)
