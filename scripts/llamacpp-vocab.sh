#!/usr/bin/env bash
# llama.cpp's tokenizer test vocabularies (vendor/llama.cpp/models/
# ggml-vocab-*.gguf, most with .inp/.out vectors) from the PyPI sdist of
# llama-cpp-python into target/llamacpp-vocab (git-ignored; nothing of
# llama.cpp is committed); prints the folder. The tokenizer tests read it
# from M40_LLAMACPP_VOCAB.
set -euo pipefail
cd "$(dirname "$0")/.."
VER=${VER:-0.3.36}
OUT=$PWD/target/llamacpp-vocab
if [ ! -f "$OUT/.from-$VER" ]; then
    SDIST=$(VER=$VER scripts/llamacpp-sdist.sh)
    TMP=$(mktemp -d)
    tar xzf "$SDIST" -C "$TMP" --wildcards "llama_cpp_python-$VER/vendor/llama.cpp/models/ggml-vocab-*"
    rm -rf "$OUT"
    mkdir -p "$OUT"
    mv "$TMP/llama_cpp_python-$VER/vendor/llama.cpp/models/"ggml-vocab-* "$OUT/"
    rm -rf "$TMP"
    touch "$OUT/.from-$VER"
fi
echo "$OUT"
