"""De-quantise a GGUF checkpoint with transformers' GGUF loader and save a plain HF directory.

transformers refuses to save a GGUF-loaded model; dropping the quantizer marker first makes the
de-quantised float32 weights save like any other model (see shared/reference/real-models.md).
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

src, gguf, out = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tok.save_pretrained(out)
print(f"saved {type(model).__name__} with {sum(p.numel() for p in model.parameters()):,} parameters to {out}")
