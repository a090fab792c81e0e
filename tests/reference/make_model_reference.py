#!/usr/bin/python3
"""Writes tests/data/model_reference.bin: a tiny BertForPreTraining's weights, one batch of
inputs, its loss, every parameter gradient and the losses of 3 LAMB steps, computed by PyTorch
(the way llm.c's test_gpt2 gets its reference). tests/model/test_reference.cpp loads the file
and checks packbert's CPU model against it.

The reference runs in float64 (weights are drawn in float32 and stored as float32, so both sides
start from exactly the same numbers): what the C++ test then measures is packbert's fp32 error
alone, not the difference of two fp32 roundings.

The model is a plain-torch BERT written here (post-LN, GELU erf, LayerNorm eps 1e-12, tied MLM
decoder, pooler tanh + NSP head, dropout off: torch's dropout RNG cannot match packbert's Philox
keys). When Hugging Face transformers imports, the script also runs transformers'
BertForPreTraining with the same weights and checks that its loss and gradients agree with the
plain model's, so the reference is the Hugging Face model's too.

Loss, as packbert defines it (DESIGN.md): sum of MLM token losses / number of masked tokens
+ sum of NSP losses / number of samples. For one batch that is HF's mean MLM CE + mean NSP CE;
the script checks the two agree.

LAMB: apex FusedLAMB (adam_w_mode, grad averaging, bias correction, global-norm clipping by
max_grad_norm, trust ratio only on tensors with weight decay; MLPerf's no_decay = bias, gamma,
beta, LayerNorm), learning rate from MLPerf's linear warmup + poly decay schedule.

File format (little endian):
  header:  8 bytes magic b"PBMREF01", u32 version (1), u32 record count
  records: u32 name length, name (ASCII), u32 dtype (0 f32, 1 f64, 2 i32, 3 i64),
           u32 ndim, i64 dims[ndim], data (row major)
  records, in this order:
    config.*            i64 scalars: vocab_size real_vocab_size hidden layers heads intermediate
                        max_position_embeddings type_vocab_size max_seq_len
    lamb.*              f64 scalars: base_lr beta1 beta2 eps weight_decay max_grad_norm
                        poly_power; i64 scalars: max_steps warmup_steps steps
    num_params          i64 scalar: the parameter count (tied decoder counted once)
    sample.{i}.*        per sample: id (i64), input_ids, segment_ids, masked_positions,
                        masked_labels (i32 vectors), nsp_label (i32 scalar)
    param.{name}        f32, every parameter in packbert's ParamTable order, HF names and shapes
    loss                f64 scalar; also mlm_loss_sum, nsp_loss_sum (f64)
    grad.{name}         f32, in the same order
    lamb.lr             f64 [steps]: the rate of updates 1..steps
    lamb.loss           f64 [steps + 1]: the loss before update 1, after update 1, ...

Run with Debian's torch: .venv/bin/python3 tests/reference/make_model_reference.py (the venv of
scripts/install_deps.sh --tests, which sees python3-torch; the committed file was made with
Debian's torch 1.13.1+dfsg-4, which reports 1.13.0a0, and transformers 4.44.2 from pip:
transformers 4.57 silently disables its models with a torch older than 2). The output does not depend on transformers (it is only a
cross-check) and is byte for byte the same on every run.
"""
import math
import os
import struct
import sys

import torch

torch.set_grad_enabled(True)
DT = torch.float64

# ---- configuration (a tiny model; vocabulary padded as packbert pads: 998 -> 1000) ----------
CFG = dict(vocab_size=1000, real_vocab_size=998, hidden=64, layers=2, heads=2, intermediate=256,
           max_position_embeddings=64, type_vocab_size=2, max_seq_len=32)
LAMB = dict(base_lr=0.02, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01,
            max_grad_norm=1.0, poly_power=1.0)
SCHEDULE = dict(max_steps=10, warmup_steps=2)
LAMB_STEPS = 3
LN_EPS = 1e-12
SEED = 20261129
CLS, SEP = 1, 2  # any ids below the first ordinary token


def param_table(c):
    """(name, shape, no_decay) in packbert's ParamTable order (src/model/params.cpp)."""
    v, h, i = c["vocab_size"], c["hidden"], c["intermediate"]
    t = []
    def ln(p):
        t.append((p + ".weight", (h,), True))
        t.append((p + ".bias", (h,), True))
    t.append(("bert.embeddings.word_embeddings.weight", (v, h), False))
    t.append(("bert.embeddings.position_embeddings.weight", (c["max_position_embeddings"], h),
              False))
    t.append(("bert.embeddings.token_type_embeddings.weight", (c["type_vocab_size"], h), False))
    ln("bert.embeddings.LayerNorm")
    for l in range(c["layers"]):
        p = f"bert.encoder.layer.{l}."
        for x in ("query", "key", "value"):
            t.append((p + f"attention.self.{x}.weight", (h, h), False))
        for x in ("query", "key", "value"):
            t.append((p + f"attention.self.{x}.bias", (h,), True))
        t.append((p + "attention.output.dense.weight", (h, h), False))
        t.append((p + "attention.output.dense.bias", (h,), True))
        ln(p + "attention.output.LayerNorm")
        t.append((p + "intermediate.dense.weight", (i, h), False))
        t.append((p + "intermediate.dense.bias", (i,), True))
        t.append((p + "output.dense.weight", (h, i), False))
        t.append((p + "output.dense.bias", (h,), True))
        ln(p + "output.LayerNorm")
    t.append(("bert.pooler.dense.weight", (h, h), False))
    t.append(("bert.pooler.dense.bias", (h,), True))
    t.append(("cls.predictions.transform.dense.weight", (h, h), False))
    t.append(("cls.predictions.transform.dense.bias", (h,), True))
    ln("cls.predictions.transform.LayerNorm")
    t.append(("cls.predictions.bias", (v,), True))
    t.append(("cls.seq_relationship.weight", (2, h), False))
    t.append(("cls.seq_relationship.bias", (2,), True))
    return t


def mlperf_no_decay(name):
    return any(k in name for k in ("bias", "gamma", "beta", "LayerNorm"))


def make_params(gen, table):
    """Seeded random float32 values, not BERT's init alone: biases and LayerNorm parameters get
    noise too, so a wrong use of any of them shows in the loss or a gradient."""
    params = {}
    for name, shape, _ in table:
        if "LayerNorm.weight" in name:
            x = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("bias"):
            x = 0.05 * torch.randn(shape, generator=gen)
        else:
            # 0.1 rather than BERT's 0.02: larger activations make every nonlinearity (GELU,
            # softmax, tanh) work away from its linear region.
            x = 0.1 * torch.randn(shape, generator=gen)
        params[name] = x.to(torch.float32)
    return params


def make_samples(gen, c):
    """Mixed lengths (the longest fills max_seq_len, a minimal one of 5), [CLS] A [SEP] B [SEP],
    masked positions never on [CLS]/[SEP], ids in [3, real_vocab_size)."""
    lengths = [c["max_seq_len"], 17, 5, 26, 11]
    def rint(lo, hi):  # [lo, hi]
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))
    samples = []
    for k, n in enumerate(lengths):
        len_a = rint(2, n - 3)  # position of the first [SEP]
        ids = [rint(3, c["real_vocab_size"] - 1) for _ in range(n)]
        ids[0], ids[len_a], ids[n - 1] = CLS, SEP, SEP
        seg = [1 if i > len_a else 0 for i in range(n)]
        cand = [i for i in range(1, n) if ids[i] != SEP]
        perm = torch.randperm(len(cand), generator=gen).tolist()
        p = min(len(cand), max(1, (n * 3) // 10))
        pos = sorted(cand[j] for j in perm[:p])
        labels = [rint(3, c["real_vocab_size"] - 1) for _ in pos]
        samples.append(dict(id=1000003 * (k + 1) + 17, input_ids=ids, segment_ids=seg,
                            masked_positions=pos, masked_labels=labels,
                            nsp_label=rint(0, 1)))
    return samples


def padded_inputs(samples, c):
    b, s = len(samples), c["max_seq_len"]
    ids = torch.zeros(b, s, dtype=torch.long)
    seg = torch.zeros(b, s, dtype=torch.long)
    mask = torch.zeros(b, s, dtype=torch.long)
    mlm_labels = torch.full((b, s), -100, dtype=torch.long)
    for i, x in enumerate(samples):
        n = len(x["input_ids"])
        ids[i, :n] = torch.tensor(x["input_ids"])
        seg[i, :n] = torch.tensor(x["segment_ids"])
        mask[i, :n] = 1
        for p, l in zip(x["masked_positions"], x["masked_labels"]):
            mlm_labels[i, p] = l
    nsp = torch.tensor([x["nsp_label"] for x in samples], dtype=torch.long)
    return ids, seg, mask, mlm_labels, nsp


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def bert_loss(P, c, ids, seg, mask, mlm_labels, nsp):
    """The plain-torch BertForPreTraining; returns (loss, mlm_sum, nsp_sum)."""
    b, s = ids.shape
    h, nh = c["hidden"], c["heads"]
    d = h // nh
    lin = lambda x, n: x @ P[n + ".weight"].t() + P[n + ".bias"]
    x = (P["bert.embeddings.word_embeddings.weight"][ids]
         + P["bert.embeddings.position_embeddings.weight"][torch.arange(s)][None]
         + P["bert.embeddings.token_type_embeddings.weight"][seg])
    x = layer_norm(x, P["bert.embeddings.LayerNorm.weight"], P["bert.embeddings.LayerNorm.bias"])
    key_pad = (mask == 0)[:, None, None, :]  # [b, 1, 1, s]: keys outside the sequence
    for l in range(c["layers"]):
        p = f"bert.encoder.layer.{l}."
        heads = lambda t: t.view(b, s, nh, d).transpose(1, 2)
        q = heads(lin(x, p + "attention.self.query"))
        k = heads(lin(x, p + "attention.self.key"))
        v = heads(lin(x, p + "attention.self.value"))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(key_pad, float("-inf"))
        ctx = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, s, h)
        x = layer_norm(x + lin(ctx, p + "attention.output.dense"),
                       P[p + "attention.output.LayerNorm.weight"],
                       P[p + "attention.output.LayerNorm.bias"])
        f = lin(gelu(lin(x, p + "intermediate.dense")), p + "output.dense")
        x = layer_norm(x + f, P[p + "output.LayerNorm.weight"], P[p + "output.LayerNorm.bias"])
    # MLM on the masked positions only (packbert's layout; HF computes every position and
    # ignores label -100, the same sum).
    sel = mlm_labels != -100
    t = gelu(lin(x[sel], "cls.predictions.transform.dense"))
    t = layer_norm(t, P["cls.predictions.transform.LayerNorm.weight"],
                   P["cls.predictions.transform.LayerNorm.bias"])
    logits = t @ P["bert.embeddings.word_embeddings.weight"].t() + P["cls.predictions.bias"]
    mlm_sum = torch.nn.functional.cross_entropy(logits, mlm_labels[sel], reduction="sum")
    pooled = torch.tanh(lin(x[:, 0], "bert.pooler.dense"))
    nsp_logits = lin(pooled, "cls.seq_relationship")
    nsp_sum = torch.nn.functional.cross_entropy(nsp_logits, nsp, reduction="sum")
    loss = mlm_sum / int(sel.sum()) + nsp_sum / b
    return loss, mlm_sum, nsp_sum


def lr_at(k):
    """MLPerf's LinearWarmupPolyDecayScheduler (src/optim/lr_schedule.h) for update k >= 1."""
    w, m = SCHEDULE["warmup_steps"], SCHEDULE["max_steps"]
    if k < w:
        return LAMB["base_lr"] * k / w
    return LAMB["base_lr"] * (1.0 - min(k / m, 1.0)) ** LAMB["poly_power"]


def lamb_step(P, G, M, V, table, k):
    """apex FusedLAMB (multi_tensor_lamb, adam_w_mode=1, grad_averaging=1, use_nvlamb=0) with
    packbert's two groups (decay 0.01 / 0.0). Global norm over all gradients; gradients divided
    by norm / max_grad_norm when the norm exceeds it."""
    b1, b2, eps, wd = LAMB["beta1"], LAMB["beta2"], LAMB["eps"], LAMB["weight_decay"]
    gnorm = math.sqrt(sum(float((G[n] ** 2).sum()) for n, _, _ in table))
    clip = gnorm / LAMB["max_grad_norm"] if gnorm > LAMB["max_grad_norm"] else 1.0
    bc1, bc2 = 1.0 - b1 ** k, 1.0 - b2 ** k
    lr = lr_at(k)
    with torch.no_grad():
        for n, _, _ in table:
            decay = 0.0 if mlperf_no_decay(n) else wd
            g = G[n] / clip
            M[n].mul_(b1).add_((1.0 - b1) * g)
            V[n].mul_(b2).add_((1.0 - b2) * g * g)
            u = (M[n] / bc1) / ((V[n] / bc2).sqrt() + eps) + decay * P[n]
            wn, un = float(P[n].norm()), float(u.norm())
            ratio = lr * wn / un if decay != 0.0 and wn != 0.0 and un != 0.0 else lr
            P[n].sub_(ratio * u)
    return lr


def hf_check(params32, c, inputs, loss_ref, grads_ref):
    """The same weights in transformers' BertForPreTraining: loss and gradients must agree with
    the plain model (both float64, so to ~1e-12). Returns the HF parameter count or None."""
    try:
        import transformers
        from transformers import BertConfig, BertForPreTraining
    except Exception as e:  # noqa: BLE001 -- any import failure means "no HF check"
        print(f"transformers not usable ({type(e).__name__}: {e}); plain torch model only")
        return None
    print(f"transformers {transformers.__version__}")
    hc = BertConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden"],
                    num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                    intermediate_size=c["intermediate"], hidden_act="gelu",
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    max_position_embeddings=c["max_position_embeddings"],
                    type_vocab_size=c["type_vocab_size"], layer_norm_eps=LN_EPS)
    model = BertForPreTraining(hc).double().eval()  # eval: no dropout (the rates are 0 anyway)
    sd = model.state_dict()
    with torch.no_grad():
        for n, p in params32.items():
            sd[n].copy_(p.to(DT))
    named = dict(model.named_parameters())
    # HF lists each tied tensor once (the decoder weight is the word embeddings, the decoder bias
    # is cls.predictions.bias), so its parameters are exactly packbert's table.
    assert set(named) == set(params32), sorted(set(named) ^ set(params32))
    hf_count = sum(p.numel() for p in model.parameters())
    ids, seg, mask, mlm_labels, nsp = inputs
    out = model(input_ids=ids, token_type_ids=seg, attention_mask=mask, labels=mlm_labels,
                next_sentence_label=nsp)
    out.loss.backward()
    dl = abs(float(out.loss) - loss_ref) / abs(loss_ref)
    print(f"HF loss {float(out.loss):.12f} (mean MLM CE + mean NSP CE) vs packbert's "
          f"normalisation {loss_ref:.12f}: rel {dl:.1e}")
    assert dl < 1e-10, "HF's loss differs from the plain model's"
    worst = 0.0
    for n, g in grads_ref.items():
        hg = named[n].grad
        e = float((hg - g).norm() / max(float(g.norm()), 1e-300))
        if "attention.self.key.bias" not in n:  # its true gradient is 0: both sides are noise
            worst = max(worst, e)
    print(f"HF gradients vs plain model: worst rel L2 {worst:.1e}")
    assert worst < 1e-9, "HF's gradients differ from the plain model's"
    return hf_count


class Writer:
    CODES = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.int64: 3}

    def __init__(self):
        self.records = []

    def add(self, name, t):
        t = t.detach().contiguous()
        self.records.append((name, t))

    def scalar_i64(self, name, v):
        self.add(name, torch.tensor(v, dtype=torch.int64))

    def scalar_f64(self, name, v):
        self.add(name, torch.tensor(v, dtype=torch.float64))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(b"PBMREF01")
            f.write(struct.pack("<II", 1, len(self.records)))
            for name, t in self.records:
                nb = name.encode("ascii")
                f.write(struct.pack("<I", len(nb)) + nb)
                f.write(struct.pack("<II", self.CODES[t.dtype], t.dim()))
                f.write(struct.pack(f"<{t.dim()}q", *t.shape))
                f.write(t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes())


def main():
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    c = CFG
    table = param_table(c)
    # The table's no_decay column (packbert's ParamTable) is MLPerf's name rule, which LAMB uses.
    assert all(nd == mlperf_no_decay(n) for n, _, nd in table)
    params32 = make_params(gen, table)
    samples = make_samples(gen, c)
    inputs = padded_inputs(samples, c)
    num_params = sum(p.numel() for p in params32.values())
    print(f"torch {torch.__version__}; packbert parameter count {num_params}")

    P = {n: params32[n].to(DT).requires_grad_(True) for n, _, _ in table}
    loss, mlm_sum, nsp_sum = bert_loss(P, c, *inputs)
    loss.backward()
    grads = {n: P[n].grad.detach().clone() for n, _, _ in table}
    masked = sum(len(x["masked_positions"]) for x in samples)
    print(f"loss {float(loss):.12f} = mlm {float(mlm_sum):.6f} / {masked} masked "
          f"+ nsp {float(nsp_sum):.6f} / {len(samples)} samples")
    hf_count = hf_check(params32, c, inputs, float(loss), grads)
    if hf_count is not None:
        print(f"HF BertForPreTraining parameter count {hf_count}")
        assert hf_count == num_params, "HF counts the parameters differently"

    w = Writer()
    for k, v in c.items():
        w.scalar_i64(f"config.{k}", v)
    for k, v in LAMB.items():
        w.scalar_f64(f"lamb.{k}", v)
    w.scalar_i64("lamb.max_steps", SCHEDULE["max_steps"])
    w.scalar_i64("lamb.warmup_steps", SCHEDULE["warmup_steps"])
    w.scalar_i64("lamb.steps", LAMB_STEPS)
    w.scalar_i64("num_params", num_params)
    w.scalar_i64("num_samples", len(samples))
    for i, x in enumerate(samples):
        w.scalar_i64(f"sample.{i}.id", x["id"])
        for key in ("input_ids", "segment_ids", "masked_positions", "masked_labels"):
            w.add(f"sample.{i}.{key}", torch.tensor(x[key], dtype=torch.int32))
        w.add(f"sample.{i}.nsp_label", torch.tensor(x["nsp_label"], dtype=torch.int32))
    for n, _, _ in table:
        w.add(f"param.{n}", params32[n])
    w.scalar_f64("loss", float(loss))
    w.scalar_f64("mlm_loss_sum", float(mlm_sum))
    w.scalar_f64("nsp_loss_sum", float(nsp_sum))
    for n, _, _ in table:
        w.add(f"grad.{n}", grads[n].to(torch.float32))

    # LAMB: the gradient of the current weights, one update, the loss again.
    M = {n: torch.zeros_like(P[n]) for n in P}
    V = {n: torch.zeros_like(P[n]) for n in P}
    losses, lrs = [float(loss)], []
    G = grads
    for k in range(1, LAMB_STEPS + 1):
        lrs.append(lamb_step(P, G, M, V, table, k))
        for p in P.values():
            p.grad = None
        l, _, _ = bert_loss(P, c, *inputs)
        l.backward()
        G = {n: P[n].grad.detach().clone() for n in P}
        losses.append(float(l))
        print(f"LAMB update {k}: lr {lrs[-1]:.6g}, loss {losses[-1]:.12f}")
    w.add("lamb.lr", torch.tensor(lrs, dtype=torch.float64))
    w.add("lamb.loss", torch.tensor(losses, dtype=torch.float64))

    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "..", "data", "model_reference.bin")
    w.write(os.path.normpath(out))
    print(f"wrote {os.path.normpath(out)} ({os.path.getsize(out)} bytes, {len(w.records)} records)")


if __name__ == "__main__":
    sys.exit(main())
