"""The trainer's quick test (CI): a few books, a tiny vocabulary and model, a few steps, exported
to GGUF and loaded by sieve, which must tokenize like SentencePiece and give PyTorch's perplexity.

  /usr/bin/python3 tools/train/smoke_test.py --sieve build/sieve [--work DIR]
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from subproc import run  # noqa: E402

TRAIN = [sys.executable, os.path.join(HERE, "train_eval_model.py")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sieve", required=True)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    if args.work is None:
        with tempfile.TemporaryDirectory(prefix="sieve-train-smoke-") as work:
            smoke(args.sieve, work)
    else:
        smoke(args.sieve, args.work)


def smoke(sieve, work):
    run(TRAIN + ["prep", "--work", work, "--vocab", "512", "--smoke"])
    run(TRAIN + ["train", "--work", work, "--steps", "12", "--dim", "64", "--layers", "2", "--heads", "2",
                 "--kv-heads", "1", "--ffn", "128", "--context", "4096", "--window", "128", "--batch", "4",
                 "--long-window", "256", "--eval-every", "6", "--lr", "3e-3"])
    gguf = os.path.join(work, "tiny.gguf")
    run(TRAIN + ["export", "--work", work, "--out", gguf, "--checkpoint", "last.pt", "--no-f16",
                 "--name", "smoke"])
    heldout = os.path.join(work, "text", "heldout.txt")

    # Tokenization: sieve's SPM tokenizer on the exported vocabulary equals SentencePiece's.
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(work, "tokenizer.model"))
    text = open(heldout, encoding="utf-8").read()
    samples = [text[:400], text[1000:1300], "The secret code of Marlow is 4821 lantern.",
               "  two  spaces, digits 2026 and \u00e9\u00e8 accents\nnew line"]
    for s in samples:
        ours = json.loads(run([sieve, "tokenize", "-m", gguf, "--ids", "--no-bos", s]))
        theirs = sp.encode(s)
        if ours != theirs:
            sys.exit(f"tokenization differs on {s[:40]!r}: sieve {ours[:12]}... spm {theirs[:12]}...")

    # Perplexity: sieve equals PyTorch (same chunks, llama-perplexity's scoring).
    ctx = 256
    torch_ppl = json.loads(run(TRAIN + ["ppl", "--work", work, "--text", heldout, "--ctx", str(ctx),
                                        "--chunks", "3", "--checkpoint", "last.pt"]).strip().splitlines()[-1])["ppl"]
    first3 = os.path.join(work, "first3.txt")
    # sieve perplexity reads the whole file: give it exactly as many tokens as three chunks need.
    ids = [1] + sp.encode(text)
    open(first3, "w", encoding="utf-8").write(sp.decode(ids[1:3 * ctx + 1]))
    ids3 = [1] + sp.encode(open(first3, encoding="utf-8").read())
    if ids3[:3 * ctx] != ids[:3 * ctx]:
        sys.exit("re-encoding the first chunks changed their tokens")
    out = json.loads(run([sieve, "perplexity", "-m", gguf, "-f", first3, "-c", str(ctx), "--json"]))
    sieve_ppl = out["perplexity"] if "perplexity" in out else out["ppl"]
    rel = abs(sieve_ppl - torch_ppl) / torch_ppl
    print(f"perplexity: PyTorch {torch_ppl:.5f}, sieve {sieve_ppl:.5f} (relative difference {rel:.2e})")
    if rel > 1e-3:
        sys.exit("sieve and PyTorch perplexities differ")
    gen = run([sieve, "run", "-m", gguf, "-p", "The secret code of", "-n", "8", "--temp", "0"])
    print("generation:", gen.strip()[:120])
    print("smoke test passed")


if __name__ == "__main__":
    main()
