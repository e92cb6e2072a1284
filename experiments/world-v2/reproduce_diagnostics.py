"""Training-side diagnostics of `knowrl reproduce` runs (#23: why a claim does or does not show).
Per arm × seed, from its metrics.jsonl: mean reward, token entropy, the share of rows whose
advantage was zero (`skipped_rows`: groups whose rewards all tie, no gradient), and the method's
own figures (Knowledgeable-R1: PK / CK path rewards, β; AKBE: category counts), first vs last
quarter of the steps; agent runs also their rollouts' tool calls and CE targets per quarter. Usage: python3 experiments/world-v2/reproduce_diagnostics.py runs/reproduce-knowledgeable-r1
"""
import json
import pathlib
import sys


def mean(v):
    v = [x for x in v if x is not None]
    return sum(v) / len(v) if v else float("nan")


def main(root):
    for run in sorted(pathlib.Path(root).glob("*-seed*")):
        rows = [json.loads(l) for l in open(run / "metrics.jsonl")] if (run / "metrics.jsonl").exists() else []
        if not rows:
            continue
        q = max(1, len(rows) // 4)
        first, last = rows[:q], rows[-q:]

        def f(part, key, extra=False):
            return mean([(r.get("extra", {}) if extra else r).get(key) for r in part])

        skipped = [r.get("extra", {}).get("skipped_rows") for r in rows]
        line = (f"{run.name:<34} steps {len(rows):>3}  reward {f(first,'reward'):.3f}→{f(last,'reward'):.3f}  "
                f"entropy {f(first,'entropy'):.3f}→{f(last,'entropy'):.3f}  skipped rows/step {mean(skipped):.1f}  "
                f"s/step {f(rows,'step_s'):.1f}")
        keys = sorted({k for r in rows for k in r.get("extra", {})})
        own = [k for k in keys if k.startswith(("reward_", "beta", "cat_", "n_"))]
        if own:
            line += "  " + " ".join(f"{k} {f(first,k,True):.3f}→{f(last,k,True):.3f}" for k in own)
        print(line)
        quarters = [rows[i * len(rows) // 4:(i + 1) * len(rows) // 4] for i in range(4)]
        if "tool_calls" in rows[0] and all(quarters):
            per = lambda key, extra=False: " ".join(f"{f(p, key, extra):.2f}" for p in quarters)
            line = f"{'':<34} by quarter: tool calls {per('tool_calls')}"
            if "cat_tool_dependent" in keys:
                line += f"  tool-dependent targets {per('cat_tool_dependent', True)}  targets {per('targets', True)}"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1])
