#!/usr/bin/env bash
# llama.cpp's tokenizer test vocabularies (vendor/llama.cpp/models/
# ggml-vocab-*.gguf, most with .inp/.out vectors, and src/llama-vocab.cpp, whose
# table of tokenizer.ggml.pre values the tests check ours against) from the PyPI sdist of
# llama-cpp-python into target/llamacpp-vocab (git-ignored; nothing of
# llama.cpp is committed); prints the folder. The tokenizer tests read it
# from M40_LLAMACPP_VOCAB. Beside them, scripts/pre-vocab.py's vocabularies.
set -euo pipefail
cd "$(dirname "$0")/.."
VER=${VER:-0.3.36}
OUT=$PWD/target/llamacpp-vocab
if [ ! -f "$OUT/.from-$VER" ] || [ ! -f "$OUT/llama-vocab.cpp" ]; then
    SDIST=$(VER=$VER scripts/llamacpp-sdist.sh)
    TMP=$(mktemp -d)
    L=llama_cpp_python-$VER/vendor/llama.cpp
    tar xzf "$SDIST" -C "$TMP" --wildcards "$L/models/ggml-vocab-*" "$L/src/llama-vocab.cpp"
    rm -rf "$OUT"
    mkdir -p "$OUT"
    mv "$TMP/$L/models/"ggml-vocab-* "$TMP/$L/src/llama-vocab.cpp" "$OUT/"
    rm -rf "$TMP"
    touch "$OUT/.from-$VER"
fi
# Our vocabularies that show a pre-tokenizer's split (scripts/pre-vocab.py).
[ "$OUT/pre-texts.json" -nt scripts/pre-vocab.py ] || python3 scripts/pre-vocab.py "$OUT" >&2
echo "$OUT"
