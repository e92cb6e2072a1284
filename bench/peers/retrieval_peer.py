"""The peer side of `knowrl bench retrieval`: bm25s (BM25), faiss-cpu IndexFlatIP (exact dense
search) and sentence-transformers (corpus encoding), on the same data and threads as knowrl.
Prints one JSON line."""
import argparse
import json
import os
import resource
import time

ap = argparse.ArgumentParser()
ap.add_argument("--task", required=True, choices=["bm25", "flat", "encode"])
ap.add_argument("--dir", required=True)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
import numpy as np  # noqa: E402

spec = json.load(open(os.path.join(a.dir, "spec.json")))
out = {"task": a.task}

if a.task == "bm25":
    import bm25s
    import Stemmer

    corpus = [json.loads(l)["contents"] for l in open(os.path.join(a.dir, "corpus.jsonl"))]
    queries = json.load(open(os.path.join(a.dir, "queries.json")))
    stemmer = Stemmer.Stemmer("english")
    t0 = time.perf_counter()
    tok = bm25s.tokenize(corpus, stopwords=None, stemmer=stemmer, show_progress=False)
    # k1/b as tantivy's (Lucene's) defaults, so rankings are comparable.
    r = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
    r.index(tok, show_progress=False)
    out["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    qt = bm25s.tokenize(queries, stopwords=None, stemmer=stemmer, show_progress=False)
    docs, scores = r.retrieve(qt, k=10, show_progress=False, n_threads=a.threads)
    dt = time.perf_counter() - t0
    out["qps"] = len(queries) / dt
    out["top10"] = docs.tolist()
elif a.task == "flat":
    import faiss

    faiss.omp_set_num_threads(a.threads)
    n, d, nq, k = spec["n"], spec["dim"], spec["nq"], spec["k"]
    x = np.fromfile(os.path.join(a.dir, "vectors.f32"), dtype=np.float32).reshape(n, d)
    q = np.fromfile(os.path.join(a.dir, "queries.f32"), dtype=np.float32).reshape(nq, d)
    index = faiss.IndexFlatIP(d)
    index.add(x)
    index.search(q[:8], k)  # warm-up
    times = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        D, I = index.search(q, k)
        times.append(time.perf_counter() - t0)
    out["qps"] = nq / sorted(times)[len(times) // 2]
    out["ids"] = I.tolist()
else:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(a.threads)
    texts = [json.loads(l)["contents"] for l in open(os.path.join(a.dir, "encode.jsonl"))]
    m = SentenceTransformer(spec["model"], device="cpu")
    m.encode(texts[:64], batch_size=64)
    t0 = time.perf_counter()
    m.encode(texts, batch_size=64, convert_to_numpy=True)
    out["passages_per_s"] = len(texts) / (time.perf_counter() - t0)
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
