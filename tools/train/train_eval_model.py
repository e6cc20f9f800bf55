"""Trains sieve's long-context evaluation model (issue 36) on CPU, and exports it as GGUF.

  /usr/bin/python3 tools/train/train_eval_model.py prep   --work W            # text, tokenizer, ids
  /usr/bin/python3 tools/train/train_eval_model.py train  --work W --minutes M
  /usr/bin/python3 tools/train/train_eval_model.py export --work W --out models/eval-32k.gguf
  /usr/bin/python3 tools/train/train_eval_model.py curve  --work W --out tools/train/loss.svg

See README.md beside this file for the method, the data and the commands that made the
committed model.
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gguf_write import F16, F32, FLOAT32, INT32, STRING, UINT32, BOOL, GGUFWriter  # noqa: E402
from model import Config, Llama  # noqa: E402

BOS, EOS, UNK = 1, 2, 0
NEEDLE_PREFIX = " The secret code of"  # exactly sieve eval's needle sentence (src/eval)


# ---------------------------------------------------------------------------------------------
# prep: text from Debian packages -> SentencePiece vocabulary -> token ids


def cmd_prep(args):
    import sentencepiece as spm

    os.makedirs(args.work, exist_ok=True)
    data = os.path.join(args.work, "text")
    if not os.path.exists(os.path.join(data, "train.txt")):
        subprocess.run([sys.executable, os.path.join(HERE, "data.py"), data] +
                       (["--smoke"] if args.smoke else []), check=True)
    train_text = open(os.path.join(data, "train.txt"), encoding="utf-8").read()
    heldout_text = open(os.path.join(data, "heldout.txt"), encoding="utf-8").read()

    # SentencePiece reads one sentence per line (longer lines are skipped).
    sentences = os.path.join(args.work, "spm_input.txt")
    with open(sentences, "w", encoding="utf-8") as f:
        for s in re.split(r"(?<=[.!?;:])\s+|\n+", train_text):
            if s.strip():
                f.write(s.strip() + "\n")
    spm.SentencePieceTrainer.train(
        input=sentences, model_prefix=os.path.join(args.work, "tokenizer"), model_type="bpe",
        vocab_size=args.vocab, byte_fallback=True, split_digits=True, character_coverage=1.0,
        unk_id=UNK, bos_id=BOS, eos_id=EOS, pad_id=-1,
        # No normalisation and whitespace kept as is: llama.cpp's and sieve's SPM tokenizers
        # apply none, so the ids must not depend on it.
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        num_threads=2, input_sentence_size=2_000_000, shuffle_input_sentence=True, seed_sentencepiece_size=1_000_000,
        train_extremely_large_corpus=False)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.work, "tokenizer.model"))

    def encode(text):
        ids = []
        for doc in text.split("\n\n"):
            if doc.strip():
                ids.append(BOS)
                ids.extend(sp.encode(doc))
        return np.array(ids, dtype=np.uint16)

    train_ids, heldout_ids = encode(train_text), encode(heldout_text)
    np.save(os.path.join(args.work, "train.npy"), train_ids)
    np.save(os.path.join(args.work, "heldout.npy"), heldout_ids)
    # Words for synthetic keys and values, from the training text only.
    counts = Counter(re.findall(r"\b[A-Za-z]+\b", train_text))
    values = sorted(w for w, c in counts.items() if c >= 20 and re.fullmatch(r"[a-z]{3,10}", w))
    keys = sorted(w for w, c in counts.items() if c >= 5 and re.fullmatch(r"[A-Z][a-z]{3,10}", w))
    with open(os.path.join(args.work, "words.json"), "w") as f:
        json.dump({"keys": keys, "values": values}, f)
    print(f"prep: {len(train_ids)} training tokens, {len(heldout_ids)} held-out tokens, "
          f"{len(keys)} key words, {len(values)} value words")


# ---------------------------------------------------------------------------------------------
# training data: language-model windows and retrieval rows, with PoSE positions


class Data:
    def __init__(self, work, rng):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=os.path.join(work, "tokenizer.model"))
        self.train = np.load(os.path.join(work, "train.npy")).astype(np.int64)
        self.heldout = np.load(os.path.join(work, "heldout.npy")).astype(np.int64)
        words = json.load(open(os.path.join(work, "words.json")))
        self.keys, self.values = words["keys"], words["values"]
        self.rng = rng
        self.prefix = self.after_word(NEEDLE_PREFIX)
        self.is_ = self.after_word(" is")
        self.dot = self.after_word(".")

    def after_word(self, text):
        """The tokens of `text` where it stands in running text, after a word. SentencePiece's
        encode() would add its dummy prefix: " is" alone becomes "▁" "▁is", "." becomes "▁."."""
        anchor = self.sp.encode("so")
        ids = self.sp.encode("so" + text)
        assert ids[:len(anchor)] == anchor, f"the tokenizer joins {text!r} to the word before it"
        return ids[len(anchor):]

    def window(self, source, n):
        start = self.rng.randrange(0, len(source) - n)
        return list(source[start:start + n])

    def value_tokens(self):
        n = self.rng.randint(6, 10)
        words = []
        ids = []
        while len(ids) < n:
            if self.rng.random() < 0.15:
                words.append(str(self.rng.randrange(10, 10000)))
            else:
                words.append(self.rng.choice(self.values))
            ids = self.after_word(" " + " ".join(words))
        return ids

    def key_tokens(self, used):
        while True:
            k = self.rng.choice(self.keys)
            if k not in used:
                used.add(k)
                return self.after_word(" " + k)

    def retrieval_row(self, t, max_skip, source=None, hay_weight=1.0):
        """Haystack with needles `The secret code of KEY is VALUE.` in its first part and, after
        a positional skip (PoSE), questions `The secret code of KEY is` answered with VALUE.
        Returns tokens, positions, loss weights (values in answers weigh most; random needle
        values and keys are not predictable, so they carry no loss)."""
        source = self.train if source is None else source
        used = set()
        kind = self.rng.random()
        n_needles = 1 if kind < 0.4 else self.rng.randint(2, 5)
        needles = [(self.key_tokens(used), self.value_tokens()) for _ in range(n_needles)]
        asked = list(range(n_needles)) if self.rng.random() < 0.5 else [self.rng.randrange(n_needles)]
        # Part 1: haystack with needles at random places; part 2: haystack then the questions.
        hay = self.window(source, t)
        tokens, weights = [], []
        cut = self.rng.randrange(t // 4, t // 2)
        part1 = hay[:cut]
        spots = sorted(self.rng.randrange(0, len(part1) + 1) for _ in needles)
        out1, w1 = [], []
        prev = 0
        for (key, val), spot in zip(needles, spots):
            out1 += part1[prev:spot]
            w1 += [hay_weight] * (spot - prev)
            sent = self.prefix + key + self.is_ + val + self.dot
            out1 += sent
            w1 += [0.0] * len(sent)
            prev = spot
        out1 += part1[prev:]
        w1 += [hay_weight] * (len(part1) - prev)
        out2, w2 = [], []
        for i in asked:
            key, val = needles[i]
            q = self.prefix + key + self.is_
            dot = self.dot
            out2 += q + val + dot
            w2 += [0.5] * len(self.prefix) + [0.0] * (len(key) + len(self.is_)) + [8.0] * len(val) + [1.0] * len(dot)
        room = t - len(out1) - len(out2)
        if room < 8:
            return self.retrieval_row(t, max_skip, source, hay_weight)
        filler = hay[cut:cut + room]
        tokens = out1 + filler + out2
        weights = w1 + [hay_weight] * len(filler) + w2
        tokens, weights = tokens[:t], weights[:t]
        split = len(out1) + self.rng.randrange(0, len(filler) + 1)
        pos = self.pose_positions(t, split, max_skip)
        value_mask = [1 if w == 8.0 else 0 for w in weights]
        return tokens, pos, weights, value_mask

    def copy_row(self, t, max_skip, hay_weight=1.0):
        """A span (text or random tokens) and, later, the same span again: loss on the repeat."""
        span_len = self.rng.randint(8, 48)
        if self.rng.random() < 0.5:
            span = self.window(self.train, span_len)
        else:
            span = [self.rng.randrange(3, self.sp.get_piece_size()) for _ in range(span_len)]
        hay = self.window(self.train, t)
        a = self.rng.randrange(0, t // 3)
        first = hay[:a] + span
        rest = t - len(first) - span_len
        filler = hay[a:a + rest]
        tokens = first + filler + span
        weights = [hay_weight] * a + [0.0] * span_len + [hay_weight] * len(filler) + [0.0] + [3.0] * (span_len - 1)
        split = len(first) + self.rng.randrange(0, len(filler) + 1)
        return tokens, self.pose_positions(t, split, max_skip), weights, [0] * t

    def copy_only_row(self, t):
        """Uniform random spans, each followed at once by itself again: the loss is on the
        repeats only. Copy-only batches formed induction within ~100 steps where language
        modelling with copies mixed in had not (../shared/docs/training-notes.md)."""
        tokens, weights = [BOS], [0.0]
        vocab = self.sp.get_piece_size()
        while len(tokens) < t:
            n = self.rng.randint(8, 40)
            span = [self.rng.randrange(3, vocab) for _ in range(n)]
            gap = [self.rng.randrange(3, vocab) for _ in range(self.rng.randint(0, 24))]
            tokens += span + gap + span
            weights += [0.0] * (n + len(gap)) + [0.0] + [1.0] * (n - 1)
        return tokens[:t], list(range(t)), weights[:t], [1 if w > 0 else 0 for w in weights[:t]]

    def lm_row(self, t, max_skip):
        tokens = self.window(self.train, t)
        split = self.rng.randrange(t // 4, 3 * t // 4)
        return tokens, self.pose_positions(t, split, max_skip), [1.0] * t, [0] * t

    def pose_positions(self, t, split, max_skip):
        """PoSE (Zhu et al., 2023, "PoSE: Efficient Context Window Extension of LLMs via
        Positional Skip-wise Training"): the window's two chunks get positions with a random skip
        between them (and a random start), so relative distances up to the target context appear
        in short windows."""
        skip = self.rng.randrange(0, max_skip + 1) if max_skip > 0 else 0
        start = self.rng.randrange(0, max(1, max_skip - skip + 1)) if max_skip > 0 else 0
        return [start + i if i < split else start + i + skip for i in range(t)]


# ---------------------------------------------------------------------------------------------
# the previous-token head, set by hand and held


def prev_token_setup(model, cfg, embed_const, scale, pairs_weights):
    """Layer 0, query head 0 attends to position t-1 from the start (found necessary on this
    machine: a randomly initialised model sits on the unigram plateau for hundreds of steps, and
    a free previous-token head drifts away; ../shared/docs/training-notes.md). Every token's
    embedding carries a constant in dimension 0; the head's query and its KV head's key read only
    that constant, the key rotated by one RoPE step in the fastest pairs, so the score is
    sum_p a_p cos((delta - 1) theta_p): largest at delta = 1. The weights a_p over the first ten
    pairs were chosen (random search, base 1e9) to keep every other distance up to 32k at least
    0.14 below the peak. Returns the (parameter, index, value) triples to hold."""
    with torch.no_grad():
        model.embed.weight[:, 0] = embed_const
        blk = model.blocks[0]
        # Expected normalised value of dimension 0 at the start (RMS over the embedding row).
        rms = math.sqrt((embed_const ** 2 + (cfg.dim - 1) * 0.02 ** 2) / cfg.dim)
        n0 = embed_const / rms
        hd = cfg.head_dim
        theta = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        blk.wq.weight[0:hd, :] = 0
        blk.wk.weight[0:2 * len(pairs_weights), :] = 0
        for p, a in enumerate(pairs_weights):
            amp = math.sqrt(scale * math.sqrt(hd) * a) / n0
            blk.wq.weight[2 * p, 0] = amp
            blk.wk.weight[2 * p, 0] = amp * math.cos(theta[p])
            blk.wk.weight[2 * p + 1, 0] = amp * math.sin(theta[p])
    held = [
        (model.embed.weight, (slice(None), 0), model.embed.weight[:, 0].clone()),
        (blk.wq.weight, (slice(0, hd), slice(None)), blk.wq.weight[0:hd].clone()),
        (blk.wk.weight, (slice(0, 2 * len(pairs_weights)), slice(None)),
         blk.wk.weight[0:2 * len(pairs_weights)].clone()),
        (blk.attn_norm.weight, (0,), blk.attn_norm.weight[0].clone()),
    ]
    return held


PAIRS_WEIGHTS = [0.299, 0.257, 0.061, 0.063, 0.025, 0.064, 0.027, 0.036, 0.022, 0.147]


# Residual dimensions the wired circuit owns (dim 256); the other 132 are the language model's.
CONST = [0]
CUR = list(range(1, 49))  # the token's own 48-dim code (fixed, +-CODE_SCALE)
MATCH_BITS = 9  # the first dims of CUR that the match compares (3 tokens x 9 fill the slow pairs)
PREV1 = list(range(49, 58))  # code (first MATCH_BITS dims) of the token one back
PREV2 = list(range(58, 67))  # ... two back
PREV3 = list(range(67, 76))  # ... three back
COPY = list(range(76, 124))  # code of the token the induction head copies
CODE_SCALE = 4.0
SLOW_FIRST_PAIR = 18  # RoPE pairs 18..31 turn under 0.3 rad over 32k positions at base 1e9


def wired_setup(model, cfg, seed, match_logit, copy_logit, sink_matches):
    """Builds a copy (induction) circuit into reserved residual dimensions and holds it, so the
    model retrieves at any distance by construction while everything else is trained around it
    (the fallback ../shared/docs/training-notes.md names; two attempts here to learn the circuit
    within a CPU's few hundred steps failed: tools/train/README.md).

    - Every token's embedding carries a constant and a fixed random +-4 code in CUR.
    - Layer 0, query heads 0, 1 (KV head 0) and 2 (KV head 1): positional heads peaking at t-1,
      t-2 and t-3 (keys and queries read only the constant; see prev_token_setup); their value is
      the first MATCH_BITS dims of CUR; head 0 writes it to PREV1, head 1 to PREV2, head 2 to
      PREV3.
    - Layer 1, query head 0 (KV head 0): the induction head. Query = [CUR[:9], PREV1, PREV2],
      key = [PREV1, PREV2, PREV3], all in the slowly rotating RoPE pairs, so it scores a
      three-token match (the current and two previous tokens against the key position's three
      predecessors) the same at any distance. Two tokens were not enough: subword pairs such as
      ("ing", " can") recur in any long haystack, and at 4k the copy followed them about half the
      time. Value = CUR, written to COPY; the output matrix reads COPY as each token's code, so
      the copied token's logit rises by about copy_logit.
    - Nothing else writes to the reserved dimensions (those rows of every output projection and
      feed-forward down projection are held at zero); reading them is free.
    Returns (parameter, mask, value) triples: the masked entries are held at value."""
    g = torch.Generator().manual_seed(seed + 1000)
    codes = (torch.randint(0, 2, (cfg.vocab, len(CUR)), generator=g) * 2 - 1).float() * CODE_SCALE
    hd = cfg.head_dim
    reserved = CONST + CUR + PREV1 + PREV2 + PREV3 + COPY
    held = []

    def hold(p, mask):
        held.append((p, mask, p.detach().clone()))

    with torch.no_grad():
        emb = model.embed.weight
        emb[:, reserved] = 0
        emb[:, CONST] = CODE_SCALE
        emb[:, CUR] = codes
        m = torch.zeros_like(emb)
        m[:, reserved] = 1
        hold(emb, m)
        # Nominal RMS at the layers' inputs: reserved energy dominates (free dims start ~0.02).
        free = cfg.dim - len(reserved)
        rms0 = math.sqrt((CODE_SCALE ** 2 * (1 + len(CUR)) + free * 0.02 ** 2) / cfg.dim)
        rms1 = math.sqrt((CODE_SCALE ** 2 * (1 + len(CUR) + 3 * MATCH_BITS) + free * 0.1 ** 2)
                         / cfg.dim)
        theta = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        for li, blk in enumerate(model.blocks):
            for norm in (blk.attn_norm, blk.ffn_norm):
                norm.weight[reserved] = 1.0
            # No trained writer touches the reserved dimensions.
            blk.wo.weight[reserved, :] = 0
            blk.w_down.weight[reserved, :] = 0
        model.norm.weight[COPY] = 1.0

        b0 = model.blocks[0]
        n0 = CODE_SCALE / rms0
        b0.wq.weight[0:3 * hd] = 0
        b0.wk.weight[0:2 * hd] = 0
        b0.wv.weight[0:2 * hd] = 0
        for p, a in enumerate(PAIRS_WEIGHTS):
            amp = math.sqrt(200.0 * math.sqrt(hd) * a) / n0
            for head, back in ((0, 0), (1, 1), (2, 2)):  # query rotated `back` steps further: t-1-back
                b0.wq.weight[head * hd + 2 * p, CONST[0]] = amp * math.cos(back * theta[p])
                b0.wq.weight[head * hd + 2 * p + 1, CONST[0]] = -amp * math.sin(back * theta[p])
            for kv in (0, 1):  # head 2 reads KV head 1: the same positional key
                b0.wk.weight[kv * hd + 2 * p, CONST[0]] = amp * math.cos(theta[p])
                b0.wk.weight[kv * hd + 2 * p + 1, CONST[0]] = amp * math.sin(theta[p])
        for i in range(MATCH_BITS):
            b0.wv.weight[i, CUR[i]] = 1.0  # value = CUR[:MATCH_BITS] (normalised; rms0 undoes it)
            b0.wv.weight[hd + i, CUR[i]] = 1.0
            b0.wo.weight[PREV1[i], i] = rms0  # head 0 -> PREV1 (+-CODE_SCALE again)
            b0.wo.weight[PREV2[i], hd + i] = rms0  # head 1 -> PREV2
            b0.wo.weight[PREV3[i], 2 * hd + i] = rms0  # head 2 -> PREV3
        b0.wo.weight[PREV1 + PREV2 + PREV3, 3 * hd:] = 0
        m = torch.zeros_like(b0.wq.weight); m[0:3 * hd] = 1; hold(b0.wq.weight, m)
        m = torch.zeros_like(b0.wk.weight); m[0:2 * hd] = 1; hold(b0.wk.weight, m)
        m = torch.zeros_like(b0.wv.weight); m[0:2 * hd] = 1; hold(b0.wv.weight, m)
        m = torch.zeros_like(b0.wo.weight); m[:, 0:3 * hd] = 1; m[reserved, :] = 1; hold(b0.wo.weight, m)

        b1 = model.blocks[1]
        slow = list(range(2 * SLOW_FIRST_PAIR, hd))
        assert 3 * MATCH_BITS <= len(slow)
        # One matched code adds match_logit: (a^2 * MATCH_BITS * CODE_SCALE^2 / rms1^2) / sqrt(hd).
        a = math.sqrt(match_logit * math.sqrt(hd) * rms1 ** 2 / (MATCH_BITS * CODE_SCALE ** 2))
        b1.wq.weight[0:hd] = 0
        b1.wk.weight[0:hd] = 0
        b1.wv.weight[0:hd] = 0
        for i in range(MATCH_BITS):
            for j, (q_src, k_src) in enumerate(((CUR, PREV1), (PREV1, PREV2), (PREV2, PREV3))):
                b1.wq.weight[slow[j * MATCH_BITS + i], q_src[i]] = a
                b1.wk.weight[slow[j * MATCH_BITS + i], k_src[i]] = a
        # Every key also scores sink_matches codes' worth through the constant (in the last slow
        # dimension): a partial (two-token) match loses to the spread over all keys, whose mean
        # code copies nothing, so only a whole three-token match copies. Without it the head
        # copied after every repeated bigram, and a copy logit strong enough to beat the language
        # model's prior at 16k cost perplexity.
        if sink_matches > 0:
            assert 3 * MATCH_BITS < len(slow)
            ac = a * math.sqrt(sink_matches * MATCH_BITS)
            b1.wq.weight[slow[3 * MATCH_BITS], CONST[0]] = ac
            b1.wk.weight[slow[3 * MATCH_BITS], CONST[0]] = ac
        for i in range(len(COPY)):
            b1.wv.weight[i, CUR[i]] = 1.0
            b1.wo.weight[COPY[i], i] = rms1  # COPY = the attended token's CUR code (+-CODE_SCALE)
        m = torch.zeros_like(b1.wq.weight); m[0:hd] = 1; hold(b1.wq.weight, m)
        m = torch.zeros_like(b1.wk.weight); m[0:hd] = 1; hold(b1.wk.weight, m)
        m = torch.zeros_like(b1.wv.weight); m[0:hd] = 1; hold(b1.wv.weight, m)
        m = torch.zeros_like(b1.wo.weight); m[:, 0:hd] = 1; m[reserved, :] = 1; hold(b1.wo.weight, m)
        for blk in model.blocks[2:]:
            m = torch.zeros_like(blk.wo.weight); m[reserved, :] = 1; hold(blk.wo.weight, m)
        m0 = torch.zeros_like(b0.w_down.weight); m0[reserved, :] = 1
        for blk in model.blocks:
            hold(blk.w_down.weight, m0.clone())
            for norm in (blk.attn_norm, blk.ffn_norm):
                m = torch.zeros_like(norm.weight); m[reserved] = 1; hold(norm.weight, m)
        m = torch.zeros_like(model.norm.weight); m[COPY] = 1; hold(model.norm.weight, m)
        # Output: the copied token's logit rises by copy_logit (final RMS ~ that of layer 1's input).
        rms_f = math.sqrt((CODE_SCALE ** 2 * (1 + len(CUR) + 3 * MATCH_BITS + len(COPY))
                           + free * 0.1 ** 2) / cfg.dim)
        beta = copy_logit * rms_f / (len(COPY) * CODE_SCALE ** 2)
        model.output.weight[:, COPY] = beta * codes
        m = torch.zeros_like(model.output.weight); m[:, COPY] = 1; hold(model.output.weight, m)
    return held


# ---------------------------------------------------------------------------------------------
# train


def batch_tensors(rows):
    tokens = torch.tensor([r[0] for r in rows])
    pos = torch.tensor([r[1] for r in rows])
    weights = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    vmask = torch.tensor([r[3] for r in rows])
    return tokens, pos, weights, vmask


def weighted_loss(logits, tokens, weights):
    # Predict token i + 1 from position i; weight of the target token.
    lp = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                         reduction="none").view(tokens.shape[0], -1)
    w = weights[:, 1:]
    return (lp * w).sum() / w.sum().clamp(min=1), lp


@torch.no_grad()
def probe(model, data, cases, t, skip, seed):
    """Held-out retrieval: answers' tokens all argmax-correct (teacher forced), and held-out LM
    loss on plain windows. `skip` > 0 puts the questions `skip` positions further away."""
    model.eval()
    rng_state = data.rng.getstate()
    data.rng.seed(seed)
    rows = [data.retrieval_row(t, 0, source=data.heldout) for _ in range(cases)]
    if skip:
        for r in rows:
            # Questions start after the filler: shift every position after the haystack's middle.
            split = t // 2
            r[1][:] = [p if i < split else p + skip for i, p in enumerate(r[1])]
    tokens, pos, weights, vmask = batch_tensors(rows)
    logits = model(tokens, pos)
    pred = logits[:, :-1].argmax(-1)
    ok = (pred == tokens[:, 1:]) | (vmask[:, 1:] == 0)
    exact = ok.all(dim=1).float().mean().item()
    windows = [list(data.heldout[i * t:(i + 1) * t]) for i in range(1, 5)]
    tk = torch.tensor(windows)
    lm = F.cross_entropy(model(tk, torch.arange(t).expand(len(windows), t))[:, :-1].reshape(-1, model.cfg.vocab),
                         tk[:, 1:].reshape(-1)).item()
    data.rng.setstate(rng_state)
    model.train()
    return exact, lm


def cmd_train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    data = Data(args.work, rng)
    cfg = Config(vocab=data.sp.get_piece_size(), dim=args.dim, layers=args.layers, heads=args.heads,
                 kv_heads=args.kv_heads, ffn=args.ffn, context=args.context, rope_base=args.rope_base)
    model = Llama(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    for blk in model.blocks:  # residual branches start small (GPT-2's scaled init)
        torch.nn.init.normal_(blk.wo.weight, std=0.02 / math.sqrt(2 * cfg.layers))
        torch.nn.init.normal_(blk.w_down.weight, std=0.02 / math.sqrt(2 * cfg.layers))
    if args.wired:
        held = wired_setup(model, cfg, args.seed, args.match_logit, args.copy_logit, args.sink_matches)
    else:
        held = prev_token_setup(model, cfg, args.embed_const, args.prev_scale, PAIRS_WEIGHTS)
    resumed = None
    if args.resume:
        # Continue from a checkpoint's weights (the held values are the checkpoint's own).
        resumed = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(resumed["model"])
        held = [(p, idx, p.detach().clone() if isinstance(idx, torch.Tensor) else p[idx].detach().clone())
                for p, idx, _ in held]
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    log = open(os.path.join(args.work, "log.jsonl"), "a" if resumed else "w")
    t = args.window
    max_skip = 0
    target_skip = cfg.context - t
    acc_ema = 0.0
    first_step = 0
    if args.wired:
        max_skip = target_skip  # the wired circuit is position-free: every distance from the start
    if resumed:
        if "opt" in resumed:
            opt.load_state_dict(resumed["opt"])
        max_skip = resumed.get("max_skip", 0)
        acc_ema = resumed.get("acc_ema", 0.0)
        first_step = resumed["step"]
    last_grow = 0
    start = time.time()
    budget = args.minutes * 60
    step = first_step
    best = None
    while time.time() - start < budget and (args.steps == 0 or step - first_step < args.steps):
        frac = (step - first_step) / args.steps if args.steps else (time.time() - start) / budget
        lr = args.lr * min(1.0, (step - first_step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        # Until retrieval works at the full distance, three quarters of the rows are retrieval and
        # copy rows whose haystack weighs little (a copy signal diluted by language modelling did
        # not form the induction circuit in an earlier attempt); after, a quarter, weighed fully.
        widening = max_skip < target_skip
        synthetic = (3 * args.batch) // 4 if widening else max(1, args.batch // 4)
        hay_weight = args.synthetic_lm_weight if widening else 1.0
        rows = []
        if step - first_step < args.copy_warmup:
            rows = [data.copy_only_row(args.copy_window) for _ in range(args.copy_batch)]
        long_step = rows == [] and (max_skip >= target_skip and args.long_every > 0 and step % args.long_every == 0)
        if long_step:
            # Once retrieval works at every distance, some steps train on one longer window of
            # retrieval with more haystack between needle and question (more keys to beat).
            rows = [data.retrieval_row(args.long_window, min(max_skip, cfg.context - args.long_window))]
        for i in range(0 if long_step or rows else args.batch):
            if i < synthetic:
                rows.append(data.retrieval_row(t, max_skip, hay_weight=hay_weight)
                            if i % 2 == 0 or synthetic == 1 else data.copy_row(t, max_skip, hay_weight))
            else:
                rows.append(data.lm_row(t, max_skip))
        tokens, pos, weights, vmask = batch_tensors(rows)
        logits = model(tokens, pos)
        loss, lp = weighted_loss(logits, tokens, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for p, idx, value in held:
                if isinstance(idx, torch.Tensor):
                    p.copy_(torch.where(idx > 0, value, p))
                else:
                    p[idx] = value
            pred = logits[:, :-1].argmax(-1)
            vm = vmask[:, 1:] == 1
            if vm.any():
                acc = (pred[vm] == tokens[:, 1:][vm]).float().mean().item()
                acc_ema = 0.9 * acc_ema + 0.1 * acc
            lm_w = (weights[:, 1:] == 1.0)
            lm_loss = lp[lm_w].mean().item()
        # Widen the positional skips only once retrieval works at the current ones.
        if (acc_ema > 0.85 and step - last_grow >= 20 and max_skip < target_skip
                and step - first_step > args.copy_warmup + 20):
            max_skip = min(target_skip, max(t, int(max_skip * 1.6)))
            last_grow = step
        step += 1
        rec = {"step": step, "time": round(time.time() - start, 1), "loss": round(loss.item(), 4),
               "lm_loss": round(lm_loss, 4), "value_acc_ema": round(acc_ema, 3), "max_skip": max_skip,
               "lr": round(lr, 6)}
        if step % args.eval_every == 0:
            near, held_lm = probe(model, data, 16, t, 0, 1234)
            far, _ = probe(model, data, 16, t, cfg.context - 2 * t, 1234)
            rec.update({"heldout_lm_loss": round(held_lm, 4), "probe_exact": near, "probe_exact_far": far})
            torch.save({"cfg": cfg.to_dict(), "model": model.state_dict(), "step": step,
                        "opt": opt.state_dict(), "max_skip": max_skip, "acc_ema": acc_ema},
                       os.path.join(args.work, "last.pt"))
            score = held_lm - 2.0 * far - 1.0 * near
            if max_skip >= target_skip and (best is None or score < best):
                best = score
                torch.save({"cfg": cfg.to_dict(), "model": model.state_dict(), "step": step},
                           os.path.join(args.work, "best.pt"))
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if step % 10 == 0 or "probe_exact" in rec:
            print(json.dumps(rec), flush=True)
    torch.save({"cfg": cfg.to_dict(), "model": model.state_dict(), "step": step},
               os.path.join(args.work, "last.pt"))
    if best is None:
        torch.save({"cfg": cfg.to_dict(), "model": model.state_dict(), "step": step},
                   os.path.join(args.work, "best.pt"))


# ---------------------------------------------------------------------------------------------
# export


def cmd_export(args):
    ck = torch.load(os.path.join(args.work, args.checkpoint), map_location="cpu")
    cfg = Config(**ck["cfg"])
    sd = ck["model"]
    if args.copy_scale != 1.0:
        # The wired copy circuit's output (held in training): its logit, scaled. The language
        # model's prior grows stronger than the copy logit it trained with at a few positions
        # (" so" -> " his" beat " so" -> "fa" of a needle's "sofa" at 16k); 1.5x retrieves them
        # at ~10% of 1k perplexity (tools/train/README.md).
        sd["output.weight"][:, COPY] *= args.copy_scale
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.work, "tokenizer.model"))
    w = GGUFWriter()
    w.add("general.architecture", STRING, "llama")
    w.add("general.name", STRING, args.name)
    w.add("general.file_type", UINT32, 1 if args.f16 else 0)
    w.add("llama.context_length", UINT32, cfg.context)
    w.add("llama.embedding_length", UINT32, cfg.dim)
    w.add("llama.block_count", UINT32, cfg.layers)
    w.add("llama.feed_forward_length", UINT32, cfg.ffn)
    w.add("llama.attention.head_count", UINT32, cfg.heads)
    w.add("llama.attention.head_count_kv", UINT32, cfg.kv_heads)
    w.add("llama.rope.dimension_count", UINT32, cfg.head_dim)
    w.add("llama.rope.freq_base", FLOAT32, cfg.rope_base)
    w.add("llama.attention.layer_norm_rms_epsilon", FLOAT32, cfg.norm_eps)
    w.add("llama.vocab_size", UINT32, cfg.vocab)
    w.add("tokenizer.ggml.model", STRING, "llama")
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        pieces.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)
    w.add_array("tokenizer.ggml.tokens", STRING, pieces)
    w.add_array("tokenizer.ggml.scores", FLOAT32, scores)
    w.add_array("tokenizer.ggml.token_type", INT32, types)
    w.add("tokenizer.ggml.bos_token_id", UINT32, BOS)
    w.add("tokenizer.ggml.eos_token_id", UINT32, EOS)
    w.add("tokenizer.ggml.unknown_token_id", UINT32, UNK)
    w.add("tokenizer.ggml.add_bos_token", BOOL, True)
    w.add("tokenizer.ggml.add_eos_token", BOOL, False)
    mat = F16 if args.f16 else F32

    def t(name, key, kind):
        w.add_tensor(name, sd[key].float().numpy(), kind)

    t("token_embd.weight", "embed.weight", mat)
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        t(f"blk.{i}.attn_norm.weight", b + "attn_norm.weight", F32)
        t(f"blk.{i}.attn_q.weight", b + "wq.weight", mat)
        t(f"blk.{i}.attn_k.weight", b + "wk.weight", mat)
        t(f"blk.{i}.attn_v.weight", b + "wv.weight", mat)
        t(f"blk.{i}.attn_output.weight", b + "wo.weight", mat)
        t(f"blk.{i}.ffn_norm.weight", b + "ffn_norm.weight", F32)
        t(f"blk.{i}.ffn_gate.weight", b + "w_gate.weight", mat)
        t(f"blk.{i}.ffn_up.weight", b + "w_up.weight", mat)
        t(f"blk.{i}.ffn_down.weight", b + "w_down.weight", mat)
    t("output_norm.weight", "norm.weight", F32)
    t("output.weight", "output.weight", mat)
    w.write(args.out)
    print(f"export: {args.out} ({os.path.getsize(args.out)} bytes, step {ck['step']})")


@torch.no_grad()
def cmd_ppl(args):
    """Perplexity of the checkpoint on the held-out ids as llama-perplexity counts it (each
    window's second half scored), for comparing with sieve's and llama.cpp's."""
    ck = torch.load(os.path.join(args.work, args.checkpoint), map_location="cpu")
    cfg = Config(**ck["cfg"])
    model = Llama(cfg)
    model.load_state_dict(ck["model"])
    model.eval()
    torch.set_num_threads(args.threads)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.work, "tokenizer.model"))
    ids = [BOS] + sp.encode(open(args.text, encoding="utf-8").read())
    n = args.ctx
    nll, count = 0.0, 0
    for c in range(min(args.chunks, len(ids) // n)):
        chunk = ids[c * n:(c + 1) * n]
        chunk[0] = BOS
        tk = torch.tensor([chunk])
        logits = model(tk, torch.arange(n)[None])
        lp = F.log_softmax(logits[0, :-1].float(), -1)
        tgt = tk[0, 1:]
        first = n // 2  # llama-perplexity scores the logits of positions first .. n - 2
        nll -= lp[first:, :].gather(1, tgt[first:, None]).sum().item()
        count += n - 1 - first
    print(json.dumps({"ctx": n, "chunks": min(args.chunks, len(ids) // n), "ppl": math.exp(nll / count)}))


def cmd_curve(args):
    rows = [json.loads(l) for l in open(os.path.join(args.work, "log.jsonl"))]
    width, height, pad = 720, 360, 50
    steps = [r["step"] for r in rows]
    series = [("training loss (weighted)", [r["loss"] for r in rows], "#888"),
              ("LM loss (training rows)", [r["lm_loss"] for r in rows], "#1f77b4")]
    held = [(r["step"], r["heldout_lm_loss"]) for r in rows if "heldout_lm_loss" in r]
    ymax = max(max(s[1]) for s in series[1:]) * 1.05
    ymax = min(ymax, 10.0)
    x = lambda s: pad + (width - 2 * pad) * (s - steps[0]) / max(1, steps[-1] - steps[0])
    y = lambda v: height - pad - (height - 2 * pad) * min(v, ymax) / ymax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle">eval-32k training: loss per step</text>']
    for v in np.linspace(0, ymax, 6):
        out.append(f'<line x1="{pad}" x2="{width - pad}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{pad - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    for frac in np.linspace(0, 1, 6):
        s = steps[0] + frac * (steps[-1] - steps[0])
        out.append(f'<text x="{x(s):.1f}" y="{height - pad + 16}" text-anchor="middle">{int(s)}</text>')
    out.append(f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">step</text>')
    for i, (name, vals, colour) in enumerate(series):
        k = max(1, len(vals) // 400)
        pts = " ".join(f"{x(steps[j]):.1f},{y(np.mean(vals[max(0, j - 9):j + 1])):.1f}"
                       for j in range(0, len(vals), k))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{pts}"/>')
        out.append(f'<text x="{width - pad - 200}" y="{40 + 16 * i}" fill="{colour}">{name}</text>')
    if held:
        pts = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in held)
        out.append(f'<polyline fill="none" stroke="#d62728" stroke-width="2" points="{pts}"/>')
        out.append(f'<text x="{width - pad - 200}" y="{40 + 16 * len(series)}" fill="#d62728">held-out LM loss</text>')
    out.append("</svg>")
    open(args.out, "w").write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prep")
    p.add_argument("--work", required=True)
    p.add_argument("--smoke", action="store_true", help="a few books only (the quick test)")
    p.add_argument("--vocab", type=int, default=4096)
    p = sub.add_parser("train")
    p.add_argument("--work", required=True)
    p.add_argument("--minutes", type=float, default=45)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: minutes)")
    p.add_argument("--resume", default=None, help="a checkpoint (.pt) to continue from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--long-window", type=int, default=2048)
    p.add_argument("--long-every", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--rope-base", type=float, default=1e9)
    p.add_argument("--embed-const", type=float, default=0.5)
    p.add_argument("--prev-scale", type=float, default=200.0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--synthetic-lm-weight", type=float, default=0.1)
    p.add_argument("--wired", action="store_true", help="build the copy circuit in and hold it")
    p.add_argument("--match-logit", type=float, default=100.0)
    p.add_argument("--copy-logit", type=float, default=55.0)
    p.add_argument("--sink-matches", type=float, default=2.5,
                   help="wired: codes' worth of score every key gets (between a two- and a three-token match)")
    p.add_argument("--copy-warmup", type=int, default=0, help="steps of copy-only batches first")
    p.add_argument("--copy-window", type=int, default=256)
    p.add_argument("--copy-batch", type=int, default=16)
    p = sub.add_parser("export")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default="best.pt")
    p.add_argument("--name", default="sieve-eval-32k")
    p.add_argument("--f16", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--copy-scale", type=float, default=1.0,
                   help="wired: scale the copy circuit's output logit (the committed model: 1.5)")
    p = sub.add_parser("ppl")
    p.add_argument("--work", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint", default="best.pt")
    p = sub.add_parser("curve")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = ap.parse_args()
    {"prep": cmd_prep, "train": cmd_train, "export": cmd_export, "ppl": cmd_ppl,
     "curve": cmd_curve}[args.cmd](args)


if __name__ == "__main__":
    main()
