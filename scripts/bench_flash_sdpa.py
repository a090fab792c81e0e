#!/usr/bin/env python3
"""PyTorch's FlashAttention (scaled_dot_product_attention with the flash backend forced) on the
fixed-length BERT-Large shape that tests/bench/bench_fmha_gpu.cpp times: 32 sequences of 512,
16 heads, head dim 64, bf16, no mask, forward and forward + backward. The rows are named as
bench_fmha_gpu's, with the same TFLOP/s formula (real work only, FlashAttention's convention:
forward 4 * d * heads * batch * len^2, forward + backward 3.5x that), so the two tables can be
set side by side.

    python3 scripts/bench_flash_sdpa.py [--reps 20] [--batch 32] [--dropout 0.0]

Needs only torch and a CUDA device; without one it prints "skipped: ..." and exits 0.
Time: CUDA events around each call, median of --reps after warm-up.
"""
import argparse
import contextlib
import statistics
import sys

HEADS, HEAD_DIM, SEQ_LEN = 16, 64, 512


def flash_only():
    """A context that lets SDPA use the flash kernel only (an error if it cannot)."""
    import torch

    try:  # torch >= 2.3
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        pass
    if hasattr(torch.backends.cuda, "sdp_kernel"):  # torch 2.0 .. 2.2
        return torch.backends.cuda.sdp_kernel(
            enable_flash=True, enable_math=False, enable_mem_efficient=False
        )
    print("warning: no way to force the flash backend in this torch; timing the default",
          file=sys.stderr)
    return contextlib.nullcontext()


def median_ms(torch, fn, reps):
    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0

    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    batch = args.batch
    torch.manual_seed(0)
    shape = (batch, HEADS, SEQ_LEN, HEAD_DIM)  # SDPA's [batch, heads, len, d]
    q, k, v = (torch.empty(shape, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
               for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(True)
    dout = torch.empty(shape, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    p = args.dropout

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, dropout_p=p)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        out.backward(dout)

    fwd_flops = 4.0 * HEAD_DIM * HEADS * batch * SEQ_LEN * SEQ_LEN
    name = f"L512 B{batch} H16 d64"
    rows = []
    with flash_only():
        rows.append((f"fwd {name}", median_ms(torch, fwd, args.reps), fwd_flops))
        rows.append((f"fwd+bwd {name}", median_ms(torch, fwd_bwd, args.reps), 3.5 * fwd_flops))

    print(f"\nflash SDPA, dropout p = {p:.2f}, median of {args.reps} (TFLOP/s: real work only, "
          "fwd = 4 d heads sum len^2, fwd+bwd = 3.5 x fwd)")
    print(f"{'dtype':<8} {'case':<48} {'ms':>10} {'TFLOP/s':>10}")
    for row_name, ms, flops in rows:
        print(f"{'bf16':<8} {row_name:<48} {ms:>10.3f} {flops / (ms * 1e-3) / 1e12:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
