#!/usr/bin/env bash
# llama.cpp's embeddings of a few texts for the embedding test shapes (and a
# chat model's mean pooling), committed as tests/data/llamacpp-embed-SHAPE-TYPE.json
# (tests/embeddings.rs writes the same models with `synth` and compares).
# Builds llama.cpp from the PyPI sdist on first use (scripts/llamacpp-driver.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release --bin m40-llm
EMBED=$(scripts/llamacpp-driver.sh llamacpp_embed)
OUT=tests/data
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LONG="the quick brown fox jumps over the lazy dog; $(printf 'and then it ran far away, %.0s' $(seq 1 5))the end."
TEXTS=("hello world" "The cat sat, on the mat!" "Héllo Wörld: ÀÉÎ ümlaut" "x" "$LONG" "안녕하세요 नमस्ते 1️⃣ #️⃣ done")
for shape in ${SHAPES:-bert-tiny nomic-bert-tiny qwen3-embedding-tiny tiny}; do
    # A chat model's embeddings: the mean of its final hidden states.
    POOL=""
    [ "$shape" = tiny ] && POOL=mean
    for ty in F32 F16; do
        target/release/m40-llm synth --shape "$shape" --type "$ty" "$TMP/m.gguf" >&2
        LLAMACPP_POOLING=$POOL "$EMBED" "$TMP/m.gguf" "${TEXTS[@]}" 2>/dev/null \
            >"$OUT/llamacpp-embed-$shape-$ty.json"
        echo "$OUT/llamacpp-embed-$shape-$ty.json" >&2
    done
done
