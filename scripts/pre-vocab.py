#!/usr/bin/env python3
"""Vocabularies that show a pre-tokenizer's split in its token ids: every
substring of our texts up to MAX_LEN characters is a token and every split of
one into two tokens a merge (shorter merged pieces first), so each piece of
the split that is no longer than that becomes exactly one token.
Writes into DIR (the tokenizer tests' llama.cpp vocabulary folder):
  pre-bytes.gguf   GPT-2's byte-level text (the byte-level pre types)
  pre-spm.gguf     raw UTF-8 with spaces as U+2581, <0xXX> byte tokens
                   (gemma4's kind: gemma4, sarvam-moe, ...)
  pre-raw.gguf     raw UTF-8 without whitespace in any merge, <0xXX> bytes
                   (`whitespace`)
  pre-texts.json   the texts
Both llama.cpp (scripts/pre-references.py) and our tests read these files.
  pre-vocab.py DIR"""
import json, os, struct, sys, unicodedata

MAX_LEN = 16

TEXTS = [
    "Hello world",
    " Hello World's CamelCase HTTPServer don't I'M YOU'LL we'd they've she's",
    "1 12 123 1234 12345 1234567 3.14159 1,000,000 9876543210",
    "   leading spaces\n\n\ttabs\t\r\n  trailing   ",
    "Hello, world! (parens) [brackets] {braces} <tags> a+b=c ^~|` $100 #hash @user",
    "中文测试：你好，世界！日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "हिन्दी भाषा বাংলা ভাষা ไทย ภาษา",
    "İstanbul'da yaşıyorum, Ankara'ya gittim.",
    "Ελληνικά Кириллица العربية עברית",
    "emoji 🦙🚀 and symbols → ∑ ≤ ≥ … — “quotes” ‘single’",
    "<sentinel:12> IMGIMGABZ IMGIMGCDEFZ <sentinel:3>",
    "def f(x):\n    return x**2  # code\n\n\n",
    "a.b,c!d?e…f。g，h、i।j۔k،l",
    "line one\nline two\n\nline three\n",
    "   ",
    "\n",
    "x",
    "ŉ µ ǅ ʰ ﬀ ǈ ᾈ",
    "abc123def4567 2024-11-26 v1.2.3 0x1F 1e-5",
    "Ünïcödé café naïve résumé",
    " " * 40 + "x" + "\n" * 5 + "\t" * 3 + " y",
    "WORD word Word wORD 'quoted' \"double\" it's IT'S",
    "1234567890123 12,345,678 $1,234.56 100%",
    "混合mixed中文and English文字123数字",
    "iPhone McDonald YouTube JavaScript eBay iOS ABCdef abcDEF",
    "x'S y'Ll z'VE a'd b'RE",
]
TEXTS = [unicodedata.normalize("NFC", t) for t in TEXTS]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def vocabulary(texts, base, allowed):
    """Tokens (base first, then substrings by length) and merges."""
    subs = set()
    for t in texts:
        for i in range(len(t)):
            for j in range(i + 1, min(len(t), i + MAX_LEN) + 1):
                s = t[i:j]
                if allowed(s):
                    subs.add(s)
    tokens = list(base)
    seen = set(tokens)
    for s in sorted(subs, key=lambda s: (len(s), s)):
        if s not in seen:
            seen.add(s)
            tokens.append(s)
    merges = []
    for s in sorted((s for s in subs if len(s) > 1), key=lambda s: (len(s), s)):
        for i in range(1, len(s)):
            merges.append(f"{s[:i]} {s[i:]}")
    return tokens, merges


def gguf(path, tokens, types, merges):
    def string(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def kv_str(k, v):
        return string(k) + struct.pack("<I", 8) + string(v)

    def kv_arr(k, ty, items, enc):
        return string(k) + struct.pack("<IIQ", 9, ty, len(items)) + b"".join(enc(x) for x in items)

    kvs = [
        kv_str("general.architecture", "llama"),
        kv_str("tokenizer.ggml.model", "gpt2"),
        kv_str("tokenizer.ggml.pre", "default"),
        kv_arr("tokenizer.ggml.tokens", 8, tokens, string),
        kv_arr("tokenizer.ggml.token_type", 5, types, lambda t: struct.pack("<i", t)),
        kv_arr("tokenizer.ggml.merges", 8, merges, string),
    ]
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))


def main(out):
    os.makedirs(out, exist_ok=True)
    b2u = bytes_to_unicode()
    # Byte-level: the texts as GPT-2's byte characters; the 256 bytes first.
    level = ["".join(b2u[b] for b in t.encode("utf-8")) for t in TEXTS]
    base = [b2u[b] for b in range(256)]
    tokens, merges = vocabulary(level, base, lambda s: True)
    gguf(f"{out}/pre-bytes.gguf", tokens, [1] * len(tokens), merges)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    nows = lambda s: len(s) == 1 or not any(c.isspace() for c in s)
    for name, texts, allowed in [
        ("spm", [t.replace(" ", "\u2581") for t in TEXTS], lambda s: True),
        ("raw", TEXTS, nows),
    ]:
        tokens, merges = vocabulary(texts, byte_tokens, allowed)
        # SentencePiece-style byte tokens are type 6 (BYTE).
        types = [6] * 256 + [1] * (len(tokens) - 256)
        gguf(f"{out}/pre-{name}.gguf", tokens, types, merges)
    json.dump(TEXTS, open(f"{out}/pre-texts.json", "w"), ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
