#!/usr/bin/env python3
"""llama.cpp's token ids for every tokenizer.ggml.pre value its llama-vocab.cpp
names, over the vocabularies and texts of scripts/pre-vocab.py (in VOCAB_DIR):
DATA/llamacpp-pre.json; and for llama.cpp's one Unigram (`t5`) test
vocabulary, nomic-bert-moe (XLM-R's), on those texts and more, with special
tokens parsed and added and without: DATA/llamacpp-ugm.json. Read by
crates/m40-tokenizer/tests/llamacpp_vocab.rs. Run by scripts/pre-references.sh,
which builds the driver (scripts/llamacpp_tokenize.c).
  pre-references.py DRIVER VOCAB_DIR DATA"""
import json, os, re, subprocess, sys, tempfile

driver, vocab_dir, data = sys.argv[1:4]
out = f"{data}/llamacpp-pre.json"
TEXTS = json.load(open(f"{vocab_dir}/pre-texts.json", encoding="utf-8"))
src = open(f"{vocab_dir}/llama-vocab.cpp", encoding="utf-8").read()
names = list(dict.fromkeys(re.findall(r'tokenizer_pre == "([^"]+)"', src)))
# The pre types that read raw UTF-8 (byte_encode = false), by whether they
# escape spaces as U+2581.
SPM = {"gemma4", "granite-embed-multi-311m", "sarvam-moe"}
RAW = {"whitespace"}


def run(name, vocab, texts, special=False):
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(b"\0".join(t.encode() for t in texts))
        f.flush()
        env = dict(os.environ, LLAMACPP_SPECIAL="1" if special else "0")
        p = subprocess.run(
            [driver, f"{vocab_dir}/{vocab}.gguf", name, "-", f.name],
            capture_output=True, text=True, env=env)
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
    got = iter(run(name, f"pre-{vocab}", [t for t, k in zip(TEXTS, keep) if k]))
    result["pre"][name] = {"vocab": vocab, "ids": [next(got) if k else None for k in keep]}
json.dump(result, open(out, "w"), ensure_ascii=False, separators=(",", ":"))
print(f"{len(names)} pre values, {len(TEXTS)} texts -> {out}")

# Unigram: SentencePiece normalization (the precompiled map: full-width
# forms, ligatures, circled digits, no-break spaces), whitespace runs,
# unknown characters, special tokens between and inside words.
UGM_TEXTS = TEXTS + [
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ﬁ ﬂ ① ⅻ ㍿ ¼",
    "no\u00a0break\u2009thin\u3000ideographic",
    "  two  spaces\t\ttabs \n newline  ",
    "<s>Hello</s> <mask> world<pad><unk>",
    "x<mask>y <s> </s>",
    "\U0001F9D1\u200d\U0001F4BB zero\u200bwidth \ufeffbom",
    "ąęółżźćń ÀÉÎÕÜ ç ñ",
]
ugm = {"texts": UGM_TEXTS}
for special in (False, True):
    ugm["special" if special else "literal"] = run("default", "ggml-vocab-nomic-bert-moe", UGM_TEXTS, special)
json.dump(ugm, open(f"{data}/llamacpp-ugm.json", "w"), ensure_ascii=False, separators=(",", ":"))
print(f"Unigram: {len(UGM_TEXTS)} texts -> {data}/llamacpp-ugm.json")

# WordPiece: llama.cpp's own segmentation (see crates/m40-tokenizer/src/wpm.rs)
# on bert-bge's vocabulary: Hangul (its syllables become their leading
# jamo), Devanagari's and Thai's marks, emoji keycaps and variation
# selectors, accents, CJK, punctuation and symbols, special tokens.
WPM_TEXTS = UGM_TEXTS + [
    "안녕하세요 세계! 한국어 텍스트",
    "नमस्ते दुनिया, हिन्दी में पाठ",
    "1️⃣ 2️⃣ #️⃣ *️⃣ keycaps ❤️ ✔︎",
    "สวัสดีครับ ภาษาไทย",
    "مَرْحَبًا بِالْعَالَم",
    "Tiếng Việt có dấu: ắ ằ ẳ ẵ ặ",
    "中文字符和日本語のテキスト、カタカナ",
    "naïve café résumé Ångström ß ẞ İstanbul",
    "price: $5.99 + €3 = ~£8 @home #tag 50% ^_^ `code` |x| <a>",
    "[CLS] inside [SEP] text [MASK] [UNK] [PAD]",
    "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ and e\u0301 combining and \u200d\u200c joiners",
    "tab\tand\u000bvertical\u0085next\u2028line\u3000wide",
]
wpm = {"texts": WPM_TEXTS}
for special in (False, True):
    wpm["special" if special else "literal"] = run("default", "ggml-vocab-bert-bge", WPM_TEXTS, special)
json.dump(wpm, open(f"{data}/llamacpp-wpm.json", "w"), ensure_ascii=False, separators=(",", ":"))
print(f"WordPiece: {len(WPM_TEXTS)} texts -> {data}/llamacpp-wpm.json")
