"""Sets an induction (copy) circuit into a partly trained checkpoint, by regression on its own
activations, so training continues from a model that already copies.

  /usr/bin/python3 tools/train/wire_induction.py --work W --checkpoint IN.pt --out OUT.pt

Why: on this machine's budget (a few hundred steps) the copy circuit did not form by itself,
here as in an earlier attempt (../shared/docs/training-notes.md); the fallback those notes
name is to set it by hand and train the rest around it. What is set:
  - layer 0, query head 1: a second positional head, peaking at t-2 (its query rotated one RoPE
    step further than head 0's, which peaks at t-1); held during training like head 0.
  - layer 1, KV head 0 with query head 0: an induction head. Its query carries random codes of
    the current and the previous token, its key the codes of the previous two tokens, each code
    decoded from the layer's (normalised) input by ridge regression; the codes sit only in the
    slowly rotating RoPE pairs (p >= 18 at base 1e9: under 0.3 rad at 32k), so a match scores
    the same at any distance. A two-token match is needed, not one: the questions' first value
    token follows `KEY is`, and common words recur in any haystack.
  - its value/output: a rank-64 map, fitted the same way, from the attended token's input to
    its unembedding direction, so attending to a token raises that token's logit.
Everything is trained afterwards except the two positional heads.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import Config, Llama  # noqa: E402

SLOW_FIRST_PAIR = 18


def ridge(x, y, lam):
    """argmin_W |x W - y|^2 + lam |W|^2, x (n, d), y (n, k) -> W (d, k)."""
    d = x.shape[1]
    return torch.linalg.solve(x.T @ x + lam * torch.eye(d, dtype=x.dtype), x.T @ y)


def collect(model, windows, positions):
    """Layer 1's normalised attention input for every token of the windows."""
    captured = []
    hook = model.blocks[1].attn_norm.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
    with torch.no_grad():
        model(windows, positions)
    hook.remove()
    return captured[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--windows", type=int, default=48)
    ap.add_argument("--match-logit", type=float, default=40.0,
                    help="attention logit of a one-token code match (two tokens: twice)")
    ap.add_argument("--copy-logit", type=float, default=12.0,
                    help="logit the copied token gains when the head attends to it alone")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ck = torch.load(args.checkpoint, map_location="cpu")
    cfg = Config(**ck["cfg"])
    model = Llama(cfg)
    model.load_state_dict(ck["model"])
    model.eval()
    hd = cfg.head_dim
    theta = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)

    # Layer 0, query head 1 -> t-2: the same pairs and weights as head 0's query, rotated by -theta.
    blk0 = model.blocks[0]
    with torch.no_grad():
        q0 = blk0.wq.weight[0:hd, 0].clone()
        blk0.wq.weight[hd:2 * hd, :] = 0
        for p in range(hd // 2):
            a = q0[2 * p].item()
            if a != 0.0:
                blk0.wq.weight[hd + 2 * p, 0] = a * math.cos(theta[p])
                blk0.wq.weight[hd + 2 * p + 1, 0] = -a * math.sin(theta[p])

    # Samples: text windows and uniform random tokens (every code must decode, not just common ones).
    train = np.load(os.path.join(args.work, "train.npy")).astype(np.int64)
    rng = np.random.default_rng(args.seed)
    t = 512
    rows = []
    for i in range(args.windows):
        if i % 2 == 0:
            s = rng.integers(0, len(train) - t)
            rows.append(train[s:s + t])
        else:
            rows.append(rng.integers(3, cfg.vocab, t))
    tokens = torch.tensor(np.stack(rows))
    positions = torch.arange(t).expand(len(rows), t)
    x = collect(model, tokens, positions)[:, 2:].reshape(-1, cfg.dim).double()
    cur = tokens[:, 2:].reshape(-1)
    prev1 = tokens[:, 1:-1].reshape(-1)
    prev2 = tokens[:, :-2].reshape(-1)

    slow = list(range(2 * SLOW_FIRST_PAIR, hd))  # the slowly rotating dimensions
    half = len(slow) // 2
    codes = torch.randn(cfg.vocab, half, dtype=torch.float64)
    codes /= codes.norm(dim=1, keepdim=True)
    lam = 1e-2 * x.shape[0]
    g_q = ridge(x, torch.cat([codes[cur], codes[prev1]], 1), lam)  # (dim, 2 * half)
    g_k = ridge(x, torch.cat([codes[prev1], codes[prev2]], 1), lam)
    # How well the codes decode: nearest code among the vocabulary = the true token.
    def decode_acc(g, target_ids, part):
        est = (x[:4000] @ g)[:, part * half:(part + 1) * half]
        return ((est @ codes.T).argmax(1) == target_ids[:4000]).double().mean().item()
    print(f"decode accuracy: q current {decode_acc(g_q, cur, 0):.3f}, q previous {decode_acc(g_q, prev1, 1):.3f}, "
          f"k previous {decode_acc(g_k, prev1, 0):.3f}, k two back {decode_acc(g_k, prev2, 1):.3f}")

    # Scale: a one-code match of unit codes gives logit match_logit (scores are q.k / sqrt(hd)).
    amp = math.sqrt(args.match_logit * math.sqrt(hd))
    blk1 = model.blocks[1]
    with torch.no_grad():
        blk1.wq.weight[0:hd, :] = 0
        blk1.wk.weight[0:hd, :] = 0
        blk1.wq.weight[slow, :] = (amp * g_q.T).float()
        blk1.wk.weight[slow, :] = (amp * g_k.T).float()

    # Value / output: attending to token j should add copy_logit to token j's logit. Target
    # residual direction d / |d|^2 * copy_logit * rms, d = output row * final norm gain.
    with torch.no_grad():
        captured = []
        hook = model.norm.register_forward_hook(lambda m, i, o: captured.append(i[0].detach()))
        model(tokens[:8], positions[:8])
        hook.remove()
        final_rms = captured[0].pow(2).mean(-1).sqrt().mean().item()
        d = (model.output.weight * model.norm.weight[None, :]).double()  # (vocab, dim)
        target_dir = d / d.pow(2).sum(1, keepdim=True) * args.copy_logit * final_rms
        m = ridge(x, target_dir[cur], lam)  # (dim, dim): input at j -> residual direction of tok_j
        u, s, vt = torch.linalg.svd(m.T)  # m.T: (dim out, dim in)
        s = s[:hd]
        w_o = (u[:, :hd] * s.sqrt()).float()  # (dim, hd)
        w_v = (s.sqrt()[:, None] * vt[:hd]).float()  # (hd, dim)
        blk1.wv.weight[0:hd, :] = w_v
        blk1.wo.weight[:, 0:hd] = w_o
        blk1.wo.weight[:, hd:2 * hd] = 0  # query head 1 shares the new values; it starts silent
        # Check: the copied token's logit gain through the fitted map.
        gain = ((x[:2000].float() @ w_v.T @ w_o.T).double() @ d.T / final_rms)
        rank = (gain.argmax(1) == cur[:2000]).double().mean().item()
        print(f"value/output map: copied token is the top boosted logit for {rank:.3f} of samples")
    ck["model"] = model.state_dict()
    ck.pop("opt", None)
    torch.save(ck, args.out)
    print(f"wired: {args.out}")


if __name__ == "__main__":
    main()
