#!/usr/bin/env bash
# Before/after on one GPU in one lease (a refactor's "speed unchanged"):
# `m40-llm bench` at batch 1 (pp512, tg128) and `--batch 1,4,32` (llama-batched-bench's
# table) for each model, the two binaries interleaved A B A B so that drift shows as
# a difference between rounds rather than between binaries.
#
#   scripts/bench-before-after.sh BEFORE_BIN AFTER_BIN MODEL...
#
# MODELs are GGUF files (write random-weight ones with `m40-llm synth` first).
set -uo pipefail
before=${1:?usage: scripts/bench-before-after.sh BEFORE_BIN AFTER_BIN MODEL...}
after=${2:?usage}
shift 2
for m in "$@"; do
    for round in 1 2; do
        for bin in "$before" "$after"; do
            name=$([ "$bin" = "$before" ] && echo before || echo after)
            echo "== $name, $(basename "$m"), round $round: batch 1"
            "$bin" bench "$m" -r 3 -d 0 --no-llama-bench 2>&1 | grep -E '^\|' || echo "(failed)"
            echo "== $name, $(basename "$m"), round $round: --batch 1,4,32"
            "$bin" bench "$m" --batch 1,4,32 --npp 128 --ntg 64 --no-llama-bench 2>&1 \
                | grep -E '^\|' || echo "(failed)"
        done
    done
done
