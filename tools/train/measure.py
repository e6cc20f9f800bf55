"""Measures an evaluation model as its card reports it, with sieve:

  - held-out perplexity over windows of 1k, 4k, 16k and 32k tokens, all over the same first
    131,072 tokens of the held-out text (llama-perplexity's method: each window's second half
    scored), so the lengths differ only in how much context each scored token sees;
  - the single-needle grid (`sieve eval --task single`): lengths x depths 0, 10, ..., 100%,
    dense f32 KV, greedy.

  /usr/bin/python3 tools/train/measure.py --sieve build/sieve --model models/eval-32k.gguf \\
      --work W --out OUT_DIR [--cases 20] [--long-cases 4] [--lengths 1024,4096,16384,32000]

W is the trainer's work directory (its tokenizer.model cuts the text at an exact token count and
its text/heldout.txt is the haystack). Writes OUT_DIR/summary.json, the eval JSON and heatmaps.
Lengths from 16k on take --long-cases cases per cell (a 32k prefill costs seconds here).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from subproc import run  # noqa: E402

WINDOWS = [1024, 4096, 16384, 32768]
SPAN = 131072  # 4 windows of 32k, 128 of 1k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sieve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--long-cases", type=int, default=4)
    ap.add_argument("--lengths", default="1024,4096,16384,32000")
    ap.add_argument("--skip-ppl", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    heldout = os.path.join(args.work, "text", "heldout.txt")
    summary = {"model": args.model}

    if not args.skip_ppl:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=os.path.join(args.work, "tokenizer.model"))
        text = open(heldout, encoding="utf-8").read()
        ids = sp.encode(text[:SPAN * 6])
        if len(ids) < SPAN + 64:
            sys.exit("the held-out text is shorter than the measured span")
        # sieve adds BOS: SPAN - 1 text tokens, then a little slack that no window reaches.
        span_file = os.path.join(args.out, "heldout-span.txt")
        with open(span_file, "w", encoding="utf-8") as f:
            f.write(sp.decode(ids[:SPAN + 32]))
        summary["perplexity"] = {}
        for n in WINDOWS:
            start = time.time()
            out = json.loads(run([args.sieve, "perplexity", "-m", args.model, "-f", span_file,
                                  "-c", str(n), "--json"]))
            out["seconds"] = round(time.time() - start, 1)
            summary["perplexity"][str(n)] = out
            print(f"perplexity at {n}: {out}", flush=True)

    lengths = [int(x) for x in args.lengths.split(",")]
    summary["needle"] = {}
    for cases, group in ((args.cases, [n for n in lengths if n < 16384]),
                         (args.long_cases, [n for n in lengths if n >= 16384])):
        if not group:
            continue
        tag = "short" if group[0] < 16384 else "long"
        json_out = os.path.join(args.out, f"needle-{tag}.json")
        start = time.time()
        run([args.sieve, "eval", "-m", args.model, "-f", heldout, "--task", "single",
             "--lengths", ",".join(map(str, group)), "--cases", str(cases), "--policies", "full",
             "--json", json_out, "--heatmap-dir", os.path.join(args.out, f"heatmaps-{tag}")])
        result = json.load(open(json_out))["results"][0]
        for cell in result["lengths"]:
            summary["needle"][str(cell["length"])] = {"accuracy": cell["accuracy"],
                                                      "cases_per_depth": cases}
        summary["needle"][f"seconds_{tag}"] = round(time.time() - start, 1)
        print(f"needle {tag}: {summary['needle']}", flush=True)

    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
