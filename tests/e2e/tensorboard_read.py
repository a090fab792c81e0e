#!/usr/bin/env python3
"""What TensorBoard's own readers see in a logdir, as one JSON object on stdout.

  tensorboard_read.py LOGDIR...   (a JSON list: one object per LOGDIR, in order)

- "scalars": [[tag, step, value], ...] (float32 values, as doubles) and "texts": [[tag, step, text], ...] from
  tensorboard's EventAccumulator (the reader behind `tensorboard --load_fast=false`, which drops
  what a SessionLog START orphans), every value kept (size guidance 0);
- "files": for each event file in name order, [name, [[step, [tags...]], ...]]: every event its
  raw loader (EventFileLoader) reads, without any purge;
- "frames": for each file, the end offsets of its complete TFRecord frames, counted from the
  length fields alone (no CRC), to compare with what the loader reads of a file cut short.

Exits 2 when tensorboard cannot be imported (scripts/install_deps.sh --tests installs it).
"""
import json
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util
except ImportError as e:  # the test reports it as a failure, never a skip
    print(f"tensorboard is not importable by {sys.executable}: {e}", file=sys.stderr)
    sys.exit(2)


def frames(path):
    data = open(path, "rb").read()
    ends, pos = [], 0
    while len(data) - pos >= 12:
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        if end > len(data):
            break
        ends.append(end)
        pos = end
    return ends


def read(logdir):
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    scalars, texts = [], []
    for tag in acc.Tags()["scalars"]:
        scalars += [[tag, e.step, e.value] for e in acc.Scalars(tag)]
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name == "text":
            for e in acc.Tensors(tag):
                text = tensor_util.make_ndarray(e.tensor_proto).item().decode("utf-8")
                texts.append([tag, e.step, text])
    files = []
    for name in sorted(os.listdir(logdir)):
        if "tfevents" not in name:
            continue
        path = os.path.join(logdir, name)
        events = []
        for event in event_file_loader.EventFileLoader(path).Load():
            events.append([event.step, [v.tag for v in event.summary.value]])
        files.append([name, events, frames(path)])
    return {"scalars": scalars, "texts": texts, "files": files}


def main():
    json.dump([read(d) for d in sys.argv[1:]], sys.stdout)


if __name__ == "__main__":
    main()
