#!/usr/bin/env python3
"""The inputs of docs/own_corpus.md's example, made from the bundled corpus.

  make_own_corpus_example.py CORPUS.txt.gz OUTDIR [VOCAB_SIZE]

Writes OUTDIR/corpus.jsonl (one {"text": ...} document per line: each chapter of the bundled
King James Bible, its verses joined by spaces) and OUTDIR/tokenizer.json, a byte-level BPE
(RoBERTa's pre-tokenizer and post-processor, special tokens <s> <pad> </s> <unk> <mask>, vocabulary
VOCAB_SIZE, 8192 by default) trained on it with the `tokenizers` library. A user brings both
files of their own instead. Deterministic for the same tokenizers version.
"""
import gzip
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


def documents(path):
    doc = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                doc.append(line)
            elif doc:
                yield " ".join(doc)
                doc = []
    if doc:
        yield " ".join(doc)


def main():
    corpus, out = sys.argv[1], sys.argv[2]
    vocab_size = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    os.makedirs(out, exist_ok=True)
    docs = list(documents(corpus))
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    bpe.save(os.path.join(out, "tokenizer.json"))
    print(f"{out}/corpus.jsonl: {len(docs)} documents; {out}/tokenizer.json: byte-level BPE, "
          f"{bpe.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
