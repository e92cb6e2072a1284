"""TRL's GRPOTrainer on the same settings as `knowrl bench grpo` (the peer a user would
otherwise pick): one process, CPU, fixed threads, SmolLM2-135M-Instruct, 4 prompts x 8
completions, 64 new tokens, temperature 1, no KL, one optimiser step per batch.
Prints one JSON line: seconds per step (mean over the measured steps, as knowrl's side) and a breakdown.
Usage: trl_grpo.py MODEL_DIR STEPS THREADS [DEVICE [DTYPE]]   (DEVICE cpu | cuda..., DTYPE f32 | bf16)
"""
import json
import sys
import tempfile
import time

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in the solar system?",
    "In which country is the city of Kyoto?",
]
ANSWERS = ["paris", "shakespeare", "jupiter", "japan"]


def reward(completions, answer, **_):
    return [float(a in c[0]["content"].lower()) for c, a in zip(completions, answer)]


class Timer(TrainerCallback):
    def __init__(self):
        self.t, self.steps = None, []

    def on_step_begin(self, *_, **__):
        self.t = time.perf_counter()

    def on_step_end(self, *_, **__):
        self.steps.append(time.perf_counter() - self.t)


def main():
    model, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    dtype = sys.argv[5] if len(sys.argv) > 5 else "f32"
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in zip(QUESTIONS, ANSWERS)] * (steps + 2)
    )
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=32,
            num_generations=8,
            max_completion_length=64,
            temperature=1.0,
            beta=0.0,
            learning_rate=1e-6,
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=device == "cpu",
            bf16=dtype == "bf16",
            seed=0,
            shuffle_dataset=False,
            dataloader_num_workers=0,
        )
        timer = Timer()
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, callbacks=[timer])
        trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    measured = timer.steps[1:] or timer.steps
    print(json.dumps({
        "seconds_per_step": sum(measured) / len(measured),
        "all_steps": timer.steps,
        "mean_completion_tokens": sum(h["completions/mean_length"] for h in logs) / max(len(logs), 1),
        "trl": __import__("trl").__version__,
        "torch": torch.__version__,
        "threads": threads,
        "device": device,
        "dtype": dtype,
    }))


if __name__ == "__main__":
    main()
