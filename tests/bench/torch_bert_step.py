#!/usr/bin/python3
"""PyTorch CPU baseline for bench_model_cpu: BERT-mini forward + backward in the standard padded
layout (what users run today), on the same kind of batch, so packbert's tokens/s can be set
against it side by side (scripts/bench_cpu_vs_torch.sh does that).

    /usr/bin/python3 tests/bench/torch_bert_step.py [--threads 2] [--max-len 128|512|both]
        [--tokens 4096] [--reps 2] [--warmup 1] [--model mini] [--optimizer]
        [--lengths FILE] [--histogram PATH] [--seed 7]

Model: the plain-torch BertForPreTraining of tests/reference/make_model_reference.py as
nn.Modules (post-LN, GELU erf, LayerNorm eps 1e-12, tied MLM decoder, pooler tanh + NSP head),
fp32, dropout 0.1 on the embedding output, attention probabilities, attention output and FFN
output (training mode). Preset "mini": 4 layers, 256 hidden, 4 heads, 1024 intermediate,
vocabulary 30522 padded to 30528, 512 positions. The MLM head runs on the masked positions only,
as packbert's does (HF computes it on every position and ignores label -100, which would only
make torch slower). Loss as packbert defines it: MLM sum / masked + NSP sum / samples.

Padded layout: [N, L] ids, an attention mask, and Hugging Face's additive extended mask
(1 - mask) * -10000 added to the attention scores (BertModel.get_extended_attention_mask of
transformers 4.x before it switched to finfo.min; the timing is the same either way).

Batch: --lengths FILE holds "max_len length masked" lines (`bench_model_cpu --print-lengths`
prints its exact batches in that form). Without it, lengths are drawn here from the
Wikipedia histogram (clipped to [2, max_len]) until ~--tokens real tokens, masked =
min(20 | 76, max(1, round(15% of length))) as bench_model_cpu does: the same distribution, not
the same draw.

Timing: --warmup untimed steps, then the best of --reps steps (the C++ bench: 1 warm-up, best
of 2). A step is zero_grad(set_to_none) + forward + backward; with --optimizer a second table
row also times torch.optim.AdamW.step() alone (scripts/bench_cpu_vs_torch.sh runs packbert's
bench with --no-lamb, so both sides time no optimizer; torch has no LAMB). tokens/s counts real
tokens, not padding. Asserts nothing about time.

Output: a header, then one line per configuration starting with "torch":
    torch  max_len  layout  what  threads  samples  rows  tokens  masked  ms  tokens/s
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # layers, hidden, heads, intermediate (src/model/config.cpp's presets)
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
REAL_VOCAB = 30522
VOCAB = 30528  # padded to a multiple of 8 as packbert pads it
POSITIONS = 512
LN_EPS = 1e-12
DROPOUT = 0.1


def gelu(x):
    # Exact (erf) GELU as Hugging Face's "gelu" runs it: torch's fused kernel, the same function
    # as make_model_reference.py's 0.5 x (1 + erf(x / sqrt 2)) but without its extra tensors.
    return F.gelu(x)


class Layer(nn.Module):
    def __init__(self, h, nh, inter):
        super().__init__()
        self.nh, self.d = nh, h // nh
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out = nn.Linear(h, h)
        self.attn_ln = nn.LayerNorm(h, eps=LN_EPS)
        self.inter = nn.Linear(h, inter)
        self.out = nn.Linear(inter, h)
        self.out_ln = nn.LayerNorm(h, eps=LN_EPS)

    def forward(self, x, ext_mask):
        b, s, h = x.shape
        heads = lambda t: t.view(b, s, self.nh, self.d).transpose(1, 2)
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.d)) + ext_mask
        probs = F.dropout(torch.softmax(scores, -1), DROPOUT, self.training)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
        x = self.attn_ln(x + F.dropout(self.attn_out(ctx), DROPOUT, self.training))
        f = self.out(gelu(self.inter(x)))
        return self.out_ln(x + F.dropout(f, DROPOUT, self.training))


class BertForPreTraining(nn.Module):
    def __init__(self, layers, h, nh, inter):
        super().__init__()
        self.word = nn.Embedding(VOCAB, h)
        self.pos = nn.Embedding(POSITIONS, h)
        self.token_type = nn.Embedding(2, h)
        self.emb_ln = nn.LayerNorm(h, eps=LN_EPS)
        self.layers = nn.ModuleList(Layer(h, nh, inter) for _ in range(layers))
        self.pooler = nn.Linear(h, h)
        self.transform = nn.Linear(h, h)
        self.transform_ln = nn.LayerNorm(h, eps=LN_EPS)
        self.mlm_bias = nn.Parameter(torch.zeros(VOCAB))
        self.nsp = nn.Linear(h, 2)
        for m in self.modules():  # BERT's init: N(0, 0.02), zero biases, LayerNorm 1 / 0
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

    def forward(self, ids, seg, mask, mlm_sel, mlm_labels, nsp_labels):
        b, s = ids.shape
        x = self.word(ids) + self.pos.weight[:s][None] + self.token_type(seg)
        x = F.dropout(self.emb_ln(x), DROPOUT, self.training)
        ext = ((1.0 - mask.to(x.dtype)) * -10000.0)[:, None, None, :]  # [b, 1, 1, s]
        for layer in self.layers:
            x = layer(x, ext)
        # MLM on the masked positions only; the decoder is the word embedding (tied).
        t = self.transform_ln(gelu(self.transform(x[mlm_sel])))
        logits = t @ self.word.weight.t() + self.mlm_bias
        mlm_sum = F.cross_entropy(logits, mlm_labels, reduction="sum")
        nsp_logits = self.nsp(torch.tanh(self.pooler(x[:, 0])))
        nsp_sum = F.cross_entropy(nsp_logits, nsp_labels, reduction="sum")
        return mlm_sum / mlm_labels.numel() + nsp_sum / b


def load_histogram(path):
    counts = [0]
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                counts.append(int(line))
    return counts


def draw_lengths(gen, counts, max_len, tokens):
    """[(length, masked)] until >= tokens real tokens, like bench_model_cpu's draw()."""
    probs = torch.tensor(counts, dtype=torch.float64)
    max_pred = 20 if max_len <= 128 else 76
    out, total = [], 0
    while total < tokens:
        n = min(max(int(torch.multinomial(probs, 1, generator=gen)), 2), max_len)
        out.append((n, min(max_pred, max(1, (n * 15 + 50) // 100), n - 1)))
        total += n
    return out


def make_batch(gen, lengths, max_len):
    """Padded inputs for [(length, masked)]: ids in [999, real vocab), [CLS] first, segment B
    after half the sequence, masked positions drawn among 1..length-1."""
    b = len(lengths)
    ids = torch.zeros(b, max_len, dtype=torch.long)
    seg = torch.zeros(b, max_len, dtype=torch.long)
    mask = torch.zeros(b, max_len, dtype=torch.long)
    sel = torch.zeros(b, max_len, dtype=torch.bool)
    for i, (n, m) in enumerate(lengths):
        ids[i, :n] = torch.randint(999, REAL_VOCAB, (n,), generator=gen)
        ids[i, 0] = 101
        seg[i, max(1, n // 2) + 1:n] = 1
        mask[i, :n] = 1
        pos = 1 + torch.randperm(n - 1, generator=gen)[:m]
        sel[i, pos] = True
    labels = torch.randint(999, REAL_VOCAB, (int(sel.sum()),), generator=gen)
    nsp = torch.randint(0, 2, (b,), generator=gen)
    return ids, seg, mask, sel, labels, nsp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--max-len", default="both", choices=["128", "512", "both"])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--model", default="mini", choices=sorted(PRESETS))
    ap.add_argument("--optimizer", action="store_true", help="also time AdamW.step() alone")
    ap.add_argument("--lengths", help='file of "max_len length masked" lines')
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--histogram",
                    default=os.path.join(here, "..", "data", "wikipedia-seqlen-histogram-512.txt"))
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    max_lens = [128, 512] if a.max_len == "both" else [int(a.max_len)]
    batches = {}
    if a.lengths:
        with open(a.lengths) as f:
            for line in f:
                if line.strip():
                    L, n, m = map(int, line.split())
                    batches.setdefault(L, []).append((n, m))
        src = a.lengths
    else:
        counts = load_histogram(a.histogram)
        for L in (128, 512):  # draw both, so the 512 batch does not depend on --max-len
            batches[L] = draw_lengths(gen, counts, L, a.tokens)
        src = a.histogram + " (own draw)"

    layers, h, nh, inter = PRESETS[a.model]
    model = BertForPreTraining(layers, h, nh, inter).train()
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if a.optimizer else None
    print(f"PyTorch {torch.__version__} CPU, BERT-{a.model} (L={layers} H={h} A={nh} I={inter} "
          f"V={VOCAB}), {nparams} parameters, fp32, dropout {DROPOUT}, "
          f"{torch.get_num_threads()} threads, padded layout, {a.warmup} warm-up + best of "
          f"{a.reps}")
    print(f"lengths: {src}\n")
    print(f"{'':5}  {'max_len':>7}  {'layout':<8}  {'what':<8}  {'threads':>7}  {'samples':>7}  "
          f"{'rows':>6}  {'tokens':>7}  {'masked':>7}  {'ms':>9}  {'tokens/s':>10}")
    for L in max_lens:
        if L not in batches:
            print(f"torch_bert_step: no lengths for max_len {L}", file=sys.stderr)
            return 1
        lengths = batches[L]
        inputs = make_batch(gen, lengths, L)
        tokens = sum(n for n, _ in lengths)
        masked = int(inputs[3].sum())
        best_step, best_opt = float("inf"), float("inf")
        for r in range(a.warmup + a.reps):
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            loss = model(*inputs)
            loss.backward()
            t1 = time.perf_counter()
            if opt is not None:
                opt.step()
            t2 = time.perf_counter()
            if not math.isfinite(float(loss)):
                print(f"torch_bert_step: loss {float(loss)} at max_len {L}", file=sys.stderr)
                return 1
            if r >= a.warmup:
                best_step, best_opt = min(best_step, t1 - t0), min(best_opt, t2 - t1)
        rows = [("fwd+bwd", best_step)] + ([("adamw", best_opt)] if opt is not None else [])
        for what, sec in rows:
            print(f"torch  {L:7d}  {'padded':<8}  {what:<8}  {torch.get_num_threads():7d}  "
                  f"{len(lengths):7d}  {len(lengths) * L:6d}  {tokens:7d}  {masked:7d}  "
                  f"{sec * 1e3:9.1f}  {tokens / sec:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
