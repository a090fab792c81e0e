#!/usr/bin/env python3
"""Convert the bundled King James Bible to the input format of `packbert prepare`.

Input (data/kjv-bible.txt.gz, Project Gutenberg layout): a header line per chapter ("Genesis 1",
"1 Samuel 3"), then numbered verses ("  1 In the beginning ...") wrapped over several lines,
with blank lines around the headers and between chapters.

Output: one document per chapter, one verse per line (verse number removed, wrapped lines
joined with a space), a blank line between documents. Written gzip-compressed without a name or
time stamp in the header (like `gzip -n`), so the same input gives the same bytes.

    scripts/kjv_to_documents.py data/kjv-bible.txt.gz data/kjv-bible-docs.txt.gz
"""
import argparse
import gzip
import io
import re
import sys

VERSE = re.compile(r"^\s+(\d+)\s+(.*)$")                   # "  12 And God said ..."
HEADER = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]*? \d+$")  # "Genesis 1", "Song of Solomon 8"


def chapters(lines):
    """Yields (header, [verse text, ...]) per chapter.

    A header is a line like "Genesis 1" that follows a blank line; a wrapped verse line always
    follows its verse directly, so it is never taken for a header.
    """
    header, verses, current, after_blank = None, [], None, True

    def finish():
        if current is not None:
            verses.append(current)

    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            after_blank = True
            continue
        m = VERSE.match(line)
        if m:
            if header is None:
                sys.exit(f"line {lineno}: a verse before the first chapter header")
            finish()
            current = m.group(2).strip()
        elif after_blank and HEADER.match(line):
            finish()
            if header is not None:
                yield header, verses
            header, verses, current = line.strip(), [], None
        elif current is not None and not after_blank:
            current += " " + line.strip()  # a wrapped line continues the verse
        else:
            sys.exit(f"line {lineno}: text outside a verse: {line!r}")
        after_blank = False
    finish()
    if header is not None:
        yield header, verses


def convert(text):
    docs = []
    for header, verses in chapters(io.StringIO(text)):
        if not verses:
            sys.exit(f"chapter {header!r} has no verse")
        docs.append("\n".join(" ".join(v.split()) for v in verses))
    return "\n\n".join(docs) + "\n", len(docs), sum(d.count("\n") + 1 for d in docs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", help="kjv-bible.txt or .txt.gz")
    ap.add_argument("output", help="documents file; .gz is written compressed (gzip -n style)")
    args = ap.parse_args()
    opener = gzip.open if args.input.endswith(".gz") else open
    with opener(args.input, "rt", encoding="utf-8") as f:
        text = f.read()
    out, num_docs, num_verses = convert(text)
    data = out.encode("utf-8")
    if args.output.endswith(".gz"):
        with open(args.output, "wb") as raw:
            # filename="" and mtime=0: no name and no time stamp, the output is reproducible.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
                gz.write(data)
    else:
        with open(args.output, "wb") as f:
            f.write(data)
    print(f"{args.output}: {num_docs} documents, {num_verses} verses, {len(data)} bytes",
          file=sys.stderr)


if __name__ == "__main__":
    main()
