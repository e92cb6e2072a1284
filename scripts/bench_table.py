"""Prints the README's performance tables from bench/results/*.json (run after `make bench`)."""
import json
import os

root = os.path.join(os.path.dirname(__file__), "..", "bench", "results")


def load(name):
    p = os.path.join(root, name)
    return json.load(open(p)) if os.path.exists(p) else None


e = load("engine.json")
if e:
    t = e["tasks"]
    print(f"Engine (`knowrl bench engine`, {e['model']}, {e['settings']['threads']} threads, "
          f"{e['settings'].get('rounds', 1)} alternating rounds of separate processes, median):\n")
    print("| task | knowrl | peer | ratio | peak RSS knowrl / peer |\n|---|---|---|---|---|")
    rows = {"generate-f32": ("generation f32, 16 ragged prompts × 64 new tokens, sampling (tok/s)", "transformers `generate`"),
            "generate-bf16": ("generation bf16, same (tok/s)", "transformers `generate`"),
            "train-f32": ("training f32, fwd+bwd+clip+AdamW, 8 × 256 tokens (tok/s)", "plain PyTorch loop")}
    for k, (name, peer) in rows.items():
        v = t[k]
        print(f"| {name} | {v['knowrl']['tokens_per_s']:.1f} | {v['peer']['tokens_per_s']:.1f} ({peer}) | "
              f"{v['speedup']:.2f}x | {v['knowrl']['peak_rss_mb']:.0f} / {v['peer']['peak_rss_mb']:.0f} MB |")
    print()
r = load("retrieval.json")
if r:
    b, f, c = r["bm25"], r["flat"], r["encode"]
    print(f"Retrieval (`knowrl bench retrieval`, {r['threads']} threads):\n")
    print("| task | knowrl | peer | ratio |\n|---|---|---|---|")
    print(f"| BM25 queries/s, HotpotQA-IRCoT pool (4,858 passages, 500 questions) | {b['knowrl']['qps']:.0f} | {b['peer']['qps']:.0f} (bm25s) | {b['qps_speedup']:.2f}x |")
    print(f"| BM25 index build (s) | {b['knowrl']['build_s']:.2f} | {b['peer']['build_s']:.2f} (bm25s) | {b['build_speedup']:.2f}x |")
    print(f"| exact dense search queries/s, {f['n'] // 1000}k × {f['dim']} f32, {f['queries']:,} queries, k={f['k']} | {f['knowrl']['qps']:.0f} | {f['peer']['qps']:.0f} (faiss IndexFlatIP) | {f['speedup']:.2f}x |")
    print(f"| corpus encoding passages/s, all-MiniLM-L6-v2, batch {c['batch']} | {c['knowrl']['passages_per_s']:.1f} | {c['peer']['passages_per_s']:.1f} (sentence-transformers) | {c['speedup']:.2f}x |")
    print(f"\nBM25 top-10 overlap with bm25s (same k1, b, stemmer): {b['top10_overlap']:.3f}. "
          f"Dense top-10 identical to faiss on {f['identical_topk_fraction'] * 100:.0f}% of queries.")
