#!/usr/bin/env bash
# llama.cpp's logits for the architectures' tiny synthetic models, committed
# as crates/m40-model/tests/data/llamacpp-SHAPE-TYPE.json (the test
# arch_logits.rs writes the same models with `synth` and compares). Builds
# llama.cpp from the PyPI sdist on first use (scripts/llamacpp-logits.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release --bin m40-llm
OUT=crates/m40-model/tests/data
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# BOS, then 15 ids spread over the 512-token vocabulary.
IDS="1 300 45 7 511 260 33 128 77 402 5 219 384 96 150 451"
for shape in ${SHAPES:-qwen3-tiny gemma2-tiny gemma3-tiny granite-tiny mistral3-tiny phi3-tiny smollm3-tiny qwen2-tiny qwen3moe-tiny mixtral-tiny gpt-oss-tiny command-r-tiny command-r-plus-tiny}; do
    TYPES="F32 F16"
    # gpt-oss is published as MXFP4 experts and Q8_0 for the rest.
    [ "$shape" = gpt-oss-tiny ] && TYPES="F32 F16 MXFP4_MOE"
    for ty in $TYPES; do
        target/release/m40-llm synth --shape "$shape" --type "$ty" "$TMP/m.gguf" >&2
        # shellcheck disable=SC2086
        scripts/llamacpp-logits.sh "$TMP/m.gguf" $IDS 2>/dev/null >"$OUT/llamacpp-$shape-$ty.json"
        echo "$OUT/llamacpp-$shape-$ty.json" >&2
        # LongRoPE (phi3-tiny: original context 256): the long factors too.
        if [ "$shape" = phi3-tiny ]; then
            # shellcheck disable=SC2086
            LLAMACPP_N_CTX=512 scripts/llamacpp-logits.sh "$TMP/m.gguf" $IDS 2>/dev/null \
                >"$OUT/llamacpp-$shape-$ty-ctx512.json"
            echo "$OUT/llamacpp-$shape-$ty-ctx512.json" >&2
        fi
    done
done
