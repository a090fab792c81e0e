#!/usr/bin/python3
"""Plot a packbert metrics file (log.metrics_file, JSONL) as a PNG.

    /usr/bin/python3 scripts/plot_metrics.py METRICS.jsonl OUT.png

Three panels over training samples: the training loss; the MLM accuracy (training records as a
line, evaluation records as points); the throughput (samples/s and tokens/s). Records are JSON
objects, one per line: {"event": "train", "samples": ..., "loss": ..., "mlm_accuracy": ...,
"samples_per_s": ..., "tokens_per_s": ...} and {"event": "eval", "samples": ...,
"eval_accuracy": ...}; other events are ignored. Uses matplotlib's Agg backend (no display);
on Debian/Ubuntu: apt-get install python3-matplotlib and run with /usr/bin/python3.
"""
import json
import math
import sys


def fail(msg):
    print(f"plot_metrics.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def number(rec, key):
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if math.isfinite(v) else None


def load(path):
    train, evals = [], []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        fail(f"{path}: cannot open the metrics file: {e.strerror}")
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{lineno}: not a JSON object: {e}")
            if not isinstance(rec, dict):
                fail(f"{path}:{lineno}: not a JSON object")
            if rec.get("event") == "train":
                train.append(rec)
            elif rec.get("event") == "eval":
                evals.append(rec)
    return train, evals


def series(records, key):
    xs, ys = [], []
    for r in records:
        x, y = number(r, "samples"), number(r, key)
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, out = argv[1], argv[2]
    train, evals = load(path)
    if not train and not evals:
        fail(f"{path}: no records (empty metrics file?)")
    if not train:
        fail(f"{path}: no training records (\"event\": \"train\")")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc, ax_tp) = plt.subplots(3, 1, figsize=(8, 10), sharex=True)

    xs, ys = series(train, "loss")
    ax_loss.plot(xs, ys, label="train loss", color="tab:blue")
    xs, ys = series(train, "mlm_loss")
    if xs:
        ax_loss.plot(xs, ys, label="train MLM loss", color="tab:cyan", linewidth=0.8)
    xs, ys = series(evals, "eval_loss")
    if xs:
        ax_loss.plot(xs, ys, "o", label="eval loss", color="tab:red")
    ax_loss.set_ylabel("loss")
    ax_loss.legend(loc="upper right")
    ax_loss.grid(True, alpha=0.3)

    xs, ys = series(train, "mlm_accuracy")
    ax_acc.plot(xs, ys, label="train MLM accuracy", color="tab:blue")
    xs, ys = series(evals, "eval_accuracy")
    if xs:
        ax_acc.plot(xs, ys, "o-", label="eval MLM accuracy", color="tab:red")
    ax_acc.set_ylabel("MLM accuracy")
    ax_acc.legend(loc="lower right")
    ax_acc.grid(True, alpha=0.3)

    xs, ys = series(train, "samples_per_s")
    ax_tp.plot(xs, ys, label="samples/s", color="tab:green")
    ax_tp.set_ylabel("samples/s")
    ax_tp.set_xlabel("training samples")
    ax_tp.grid(True, alpha=0.3)
    ax_tok = ax_tp.twinx()
    xs, ys = series(train, "tokens_per_s")
    ax_tok.plot(xs, ys, label="tokens/s", color="tab:orange", linestyle="--")
    ax_tok.set_ylabel("tokens/s")
    lines = ax_tp.get_lines() + ax_tok.get_lines()
    ax_tp.legend(lines, [l.get_label() for l in lines], loc="lower right")

    fig.suptitle(path)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        fail(f"{out}: cannot write the plot: {e.strerror}")
    print(f"wrote {out} ({len(train)} train records, {len(evals)} eval records)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
