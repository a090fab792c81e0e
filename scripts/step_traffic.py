#!/usr/bin/env python3
"""Device memory traffic of one BERT training step on the CUDA backend, before and after two
changes, computed from the code's sizes (no GPU needed):

  MLM decoder backward (bf16)  row blocks -> vocabulary blocks
                               (kernels/cuda/cuda_losses.cpp, mlm_loss_lowp): the
                               word-embedding gradient read and written once per mlm_loss call
                               instead of once per block of rows
  NSP head (bf16)              the widening adapter (kernels/common/lowp_adapter.h nsp_loss:
                               x and dx [rows, H] staged in fp32) -> nsp_loss_lowp (the [CLS]
                               rows and the weights widened)

The host's synchronisations, launches and pageable copies per step are counted, not computed:
scripts/step_counts.py.

The default is BERT-Large phase 2 as configs/bert_large_phase2_mlperf.toml runs it: bf16, 32
samples per GPU and micro-step (global batch 256 on 8 GPUs, no accumulation), unpadded, M = 1,
lengths drawn from the Wikipedia histogram at 512 (tests/data/wikipedia-seqlen-histogram-512.txt)
and each sample's masked count as `prepare` makes it: min(76, max(1, round(0.15 * length))).
"mean" uses the expected length and masked count per sample, "max" 32 samples of 512 tokens and
76 masked positions.

Bytes count each operand of a GEMM read once and its output written once (beta = 1: read too),
each elementwise kernel's reads and writes; what is the same before and after (the decoder's
forward GEMM and softmax, the NSP head's own GEMMs) is left out. GB = 1e9 bytes.

    python3 scripts/step_traffic.py [--batch 32] [--mst-chunks 1] [--micro-steps 1]
"""
import argparse
import math
import os

MIB = 1 << 20
BLOCK_BYTES = 64 * MIB  # kMlmBackwardBlockBytes (cuda_losses.cpp)
BF16 = 2
F32 = 4


def histogram(path):
    counts = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                counts.append(int(line))
    return counts  # counts[i]: sequences of length i + 1


def masked_count(length, max_pred=76, prob=0.15):
    return min(max_pred, max(1, round(length * prob)))  # round: half to even, as nearbyint


def mlm_backward_rows_before(m, h, v):
    """Row blocks of floor(64 MiB / (V * 2)) rows; returns (bytes, word-embedding passes)."""
    block = max(1, min(m, BLOCK_BYTES // (v * BF16)))
    total, passes = 0, 0
    for r0 in range(0, m, block):
        n = min(block, m - r0)
        total += n * v * (F32 + BF16)  # convert: fp32 gradient -> bf16 block
        total += n * h * BF16 + n * v * BF16 + 2 * v * h * F32  # dW += g^T x (all of dW)
        total += v * F32 + 3 * v * F32  # BGRADB scratch, db += scratch
        total += v * h * BF16 + n * v * BF16 + n * h * BF16  # dx block = g w (all of w)
        passes += 1
    return total, passes


def block_columns(m, v, es=BF16):
    """mlm_backward_block_columns (cuda_losses.cpp)."""
    fit = BLOCK_BYTES // max(1, m * es)
    if fit >= v:
        return v
    return max(min(8, v), fit // 8 * 8)


def mlm_backward_columns_after(m, h, v):
    """Vocabulary blocks: each block's dW rows written once; dx accumulated in fp32."""
    block = block_columns(m, v)
    if block >= v:  # one block: the row-block code's single block, dx written in bf16 directly
        return mlm_backward_rows_before(m, h, v) + (1,)
    total, blocks = 0, 0
    for c0 in range(0, v, block):
        c = min(block, v - c0)
        total += m * c * (F32 + BF16)  # convert_rows
        total += m * h * BF16 + m * c * BF16 + 2 * c * h * F32  # dW[c0:c0+c] += g^T x
        total += c * F32 + 3 * c * F32  # BGRADB scratch, db += scratch
        total += c * h * BF16 + m * c * BF16 + m * h * F32 * (2 if c0 > 0 else 1)  # dx32 (+)=
        blocks += 1
    total += m * h * (F32 + BF16)  # dx32 -> dx, once
    return total, 1, blocks


def nsp_before(rows, s, h):
    """The adapter: widen x, widen dx, fp32 op (gather, scatter), narrow dx; the weights."""
    total = rows * h * (BF16 + F32)  # x widened
    total += 2 * rows * h * (BF16 + F32)  # dx widened, then narrowed
    total += (h * h + 2 * h) * (BF16 + F32)  # dense_w, cls_w widened
    total += 2 * s * h * F32  # gather of the [CLS] rows from the widened x
    total += 3 * s * h * F32 + (rows + 1) * 4  # ordered scatter into the widened dx (+ scratch)
    return total


def nsp_after(rows, s, h):
    total = (h * h + 2 * h) * (BF16 + F32)  # dense_w, cls_w widened
    total += 2 * s * h * BF16 + s * h * (BF16 + F32)  # gather the bf16 [CLS] rows, widen them
    total += s * h * (F32 + 2 * BF16)  # dx[cls] += dcls, in fp32, rounded once
    return total


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32, help="samples per GPU and micro-step")
    ap.add_argument("--micro-steps", type=int, default=1)
    ap.add_argument("--mst-chunks", type=int, default=1, help="model.mst_chunks M (MLM chunks)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=30528)
    ap.add_argument("--max-pred", type=int, default=76)
    ap.add_argument("--histogram", default=os.path.join(
        here, "..", "tests", "data", "wikipedia-seqlen-histogram-512.txt"))
    a = ap.parse_args()
    counts = histogram(a.histogram)
    n = sum(counts)
    mean_len = sum((i + 1) * c for i, c in enumerate(counts)) / n
    mean_masked = sum(masked_count(i + 1, a.max_pred) * c for i, c in enumerate(counts)) / n
    h, v, b, mc = a.hidden, a.vocab, a.batch, a.mst_chunks
    print(f"BERT H={h} V={v}, {b} samples per micro-step, {a.micro_steps} micro-step(s), "
          f"M={mc}; Wikipedia-512 histogram: mean length {mean_len:.1f}, "
          f"mean masked {mean_masked:.2f} per sample")
    print()
    cases = [("mean", round(b * mean_len), round(b * mean_masked)),
             ("max", b * len(counts), b * a.max_pred)]
    gb = 1e9
    print("| item | case | rows | masked | before GB/step | after GB/step | dW passes before "
          "-> after |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, rows, m in cases:
        chunk = math.ceil(m / mc)  # masked rows per mlm_loss call (MST)
        before = after = 0
        passes_b = passes_a = 0
        for first in range(0, m, chunk):
            rows_m = min(chunk, m - first)
            tb, pb = mlm_backward_rows_before(rows_m, h, v)
            ta, pa, _ = mlm_backward_columns_after(rows_m, h, v)
            before, after = before + tb, after + ta
            passes_b, passes_a = passes_b + pb, passes_a + pa
        ms = a.micro_steps
        print(f"| MLM decoder backward (bf16) | {name} | {rows} | {m} | {ms * before / gb:.3f} | "
              f"{ms * after / gb:.3f} | {ms * passes_b} -> {ms * passes_a} |")
    for name, rows, m in cases:
        ms = a.micro_steps
        print(f"| NSP head staging (bf16) | {name} | {rows} | {m} | "
              f"{ms * nsp_before(rows, b, h) / gb:.3f} | {ms * nsp_after(rows, b, h) / gb:.4f} "
              f"| - |")


if __name__ == "__main__":
    main()
