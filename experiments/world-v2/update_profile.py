"""Where a LoRA update's forward + backward spends its time on CPU, by libtorch op: SmolLM2-135M
(f32) with a rank-16 LoRA on every projection (PEFT), the base projections as oneDNN 1x1
convolutions as knowrl runs them on AMD (`kernels::onednn_linear`), SDPA with a boolean
causal mask, a batch shaped like Knowledgeable-R1's PPO micro-batch (B rows of L tokens, the
log-prob of the last R tokens through the LM head). torch.profiler's self CPU time per op, 2
threads. Run: `.venv/bin/python experiments/world-v2/update_profile.py [B L R]`; what it showed is in
docs/performance.md (2026-12-07, Zen 2: the frozen head's gradient in the forward)."""
import os, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model

torch.set_num_threads(2)
B, L, R = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (16, 180, 10)
path = os.path.join(os.environ.get("KNOWRL_MODELS", os.path.expanduser("~/.cache/knowrl/models")), "smollm2-135m-instruct")
model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))


def conv_forward(self, x):  # the base layer of a LoRA'd projection, as oneDNN's 1x1 convolution
    shape = x.shape
    k, n = shape[-1], self.weight.shape[0]
    m = x.numel() // k
    y = torch.nn.functional.conv2d(x.reshape(1, m, 1, k).permute(0, 3, 1, 2), self.weight.view(n, k, 1, 1))
    return y.permute(0, 2, 3, 1).reshape(*shape[:-1], n)


for mod in model.modules():
    if type(mod) is torch.nn.Linear and mod.weight.shape[0] >= 128 and mod.weight.shape[1] >= 128 and not mod.weight.requires_grad and mod.weight.shape[0] < 40000:
        mod.forward = conv_forward.__get__(mod)

ids = torch.randint(0, 49000, (B, L))


def step():
    out = model(input_ids=ids)  # the LM head over every position is wasted; only the last R count
    h = out.logits[:, -R - 1:-1]
    lp = h.log_softmax(-1).gather(-1, ids[:, -R:, None]).mean()
    lp.backward()


def step_hidden():
    out = model.base_model.model.model(input_ids=ids)
    h = out.last_hidden_state[:, -R - 1:-1]
    logits = model.base_model.model.lm_head(h)
    lp = logits.log_softmax(-1).gather(-1, ids[:, -R:, None]).mean()
    lp.backward()


for _ in range(2):
    step_hidden()
t = time.perf_counter()
for _ in range(3):
    step_hidden()
print(f"B {B} L {L} R {R}: forward + backward {(time.perf_counter() - t) / 3 * 1e3:.0f} ms a step")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3):
        step_hidden()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
