#!/usr/bin/env python3
"""llama.cpp's token ids for every tokenizer.ggml.pre value its llama-vocab.cpp
names, over the vocabularies and texts of scripts/pre-vocab.py (in VOCAB_DIR):
crates/m40-tokenizer/tests/data/llamacpp-pre.json, read by
tests/llamacpp_vocab.rs. Run by scripts/pre-references.sh, which builds the
driver (scripts/llamacpp_tokenize.c).
  pre-references.py DRIVER VOCAB_DIR OUT.json"""
import json, re, subprocess, sys, tempfile

driver, vocab_dir, out = sys.argv[1:4]
TEXTS = json.load(open(f"{vocab_dir}/pre-texts.json", encoding="utf-8"))
src = open(f"{vocab_dir}/llama-vocab.cpp", encoding="utf-8").read()
names = list(dict.fromkeys(re.findall(r'tokenizer_pre == "([^"]+)"', src)))
# The pre types that read raw UTF-8 (byte_encode = false), by whether they
# escape spaces as U+2581.
SPM = {"gemma4", "granite-embed-multi-311m", "sarvam-moe"}
RAW = {"whitespace"}


def run(name, vocab, texts):
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(b"\0".join(t.encode() for t in texts))
        f.flush()
        p = subprocess.run(
            [driver, f"{vocab_dir}/pre-{vocab}.gguf", name, "-", f.name],
            capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{name}: {p.stderr[-2000:]}", file=sys.stderr)
        sys.exit(1)
    ids = [[int(x) for x in line.split()] for line in p.stdout.splitlines()]
    assert len(ids) == len(texts), (name, len(ids))
    return ids


result = {"texts": TEXTS, "pre": {}}
for name in names:
    vocab = "spm" if name in SPM else "raw" if name in RAW else "bytes"
    # `whitespace` keeps the whitespace between its words as pieces, and
    # llama.cpp asserts on a merge of two whitespace characters
    # (find_bpe_rank): its texts without two in a row, the others null.
    keep = [vocab != "raw" or not re.search(r"\s\s", t) for t in TEXTS]
    got = iter(run(name, vocab, [t for t, k in zip(TEXTS, keep) if k]))
    result["pre"][name] = {"vocab": vocab, "ids": [next(got) if k else None for k in keep]}
json.dump(result, open(out, "w"), ensure_ascii=False, separators=(",", ":"))
print(f"{len(names)} pre values, {len(TEXTS)} texts -> {out}")
