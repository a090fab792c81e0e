#!/usr/bin/env python3
"""Hugging Face BertForPreTraining on one GPU, the baseline of the GPU benchmark.

The same samples as tests/bench/bench_gpu_step (its --lengths-out file: one line "length masked"
per sample), padded to max_len with an attention mask as users run BERT today: bf16 autocast
over fp32 weights, PyTorch's scaled-dot-product attention (attn_implementation="sdpa"), the MLM
loss on the masked positions only (labels -100 elsewhere) plus NSP, and a fused AdamW step
(cheaper than LAMB, which PyTorch does not ship: the comparison favours the baseline). When the
whole batch does not fit, it runs in equal micro-batches with gradient accumulation, so a step
still trains every sample once. Prints one table line; samples/s and real tokens/s are set
beside bench_gpu_step's by scripts/device_check.sh.

    bench_hf_gpu.py LENGTHS_FILE [--max-len 512] [--steps 5] [--warmup 2] [--model large]
"""
import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lengths")
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--model", default="large", choices=["base", "large"])
    args = ap.parse_args()

    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"skipped: {e}")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0

    samples = []
    with open(args.lengths) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2:
                sys.exit(f"{args.lengths}:{n}: expected 'length masked', got {line!r}")
            length, masked = int(parts[0]), int(parts[1])
            if not 2 <= length <= args.max_len or not 1 <= masked < length:
                sys.exit(f"{args.lengths}:{n}: length {length} / masked {masked} out of range")
            samples.append((length, masked))
    if not samples:
        sys.exit(f"{args.lengths}: no samples")

    large = args.model == "large"
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=1024 if large else 768,
        num_hidden_layers=24 if large else 12, num_attention_heads=16 if large else 12,
        intermediate_size=4096 if large else 3072, max_position_embeddings=512,
        hidden_act="gelu", layer_norm_eps=1e-12)
    dev = torch.device("cuda")
    attn = "sdpa"
    try:
        model = transformers.BertForPreTraining(config, attn_implementation="sdpa")
    except (TypeError, ValueError) as e:  # older transformers: no SDPA for BERT
        print(f"note: SDPA unavailable ({e}); eager attention")
        attn = "eager"
        model = transformers.BertForPreTraining(config)
    model = model.to(dev).train()
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    # The padded batch: random ids (values do not change the time), the masks of real tokens.
    g = torch.Generator().manual_seed(7)
    b, L = len(samples), args.max_len
    ids = torch.randint(999, 30522, (b, L), generator=g)
    mask = torch.zeros(b, L, dtype=torch.long)
    types = torch.zeros(b, L, dtype=torch.long)
    labels = torch.full((b, L), -100, dtype=torch.long)
    for i, (length, masked) in enumerate(samples):
        mask[i, :length] = 1
        types[i, length // 2 + 1:length] = 1
        pos = torch.randperm(length - 1, generator=g)[:masked] + 1
        labels[i, pos] = torch.randint(999, 30522, (masked,), generator=g)
    nsp = torch.randint(0, 2, (b,), generator=g)
    ids, mask, types, labels, nsp = (t.to(dev) for t in (ids, mask, types, labels, nsp))

    def step(micro):
        opt.zero_grad(set_to_none=True)
        for s in range(0, b, micro):
            e = min(b, s + micro)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=ids[s:e], attention_mask=mask[s:e],
                            token_type_ids=types[s:e], labels=labels[s:e],
                            next_sentence_label=nsp[s:e])
            (out.loss * ((e - s) / b)).backward()
        opt.step()

    micro = b
    while True:
        try:
            step(micro)
            torch.cuda.synchronize()
            break
        except torch.cuda.OutOfMemoryError:
            if micro == 1:
                raise
            micro = (micro + 1) // 2
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    for _ in range(args.warmup):
        step(micro)
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(micro)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t = min(times)
    tokens = sum(length for length, _ in samples)
    print(f"hf BertForPreTraining ({args.model}, bf16 autocast, {attn}, padded to {L}, "
          f"torch {torch.__version__}, transformers {transformers.__version__})")
    print(f"{'layout':<9} {'samples':>8} {'micro':>6} {'step ms':>9} {'samples/s':>10} "
          f"{'tokens/s':>12} {'median ms':>10}")
    print(f"{'hf-padded':<9} {b:>8} {micro:>6} {t * 1e3:>9.1f} {b / t:>10.0f} {tokens / t:>12.0f} "
          f"{statistics.median(times) * 1e3:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
