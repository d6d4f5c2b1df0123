#!/usr/bin/env bash
# Embedding throughput of m40-llm against llama.cpp's llama-embedding on the
# same GGUF file and texts, alternating, ROUNDS rounds (default 3), and how
# close their vectors are. Both run every text of the file in one process
# (m40-llm: one request, its inputs batched in the engine's steps;
# llama-embedding: batches of up to 4096 tokens, 64 sequences); each reports
# the time of the embedding alone, model load excluded. Prints a table of
# medians and the least cosine between the two tools' vectors.
#
#   benches/embed_vs_llamacpp.sh M40_LLM LLAMA_EMBEDDING MODEL.gguf [N_TEXTS] [WORDS]
#
# M40_LLM is the m40-llm binary, LLAMA_EMBEDDING llama.cpp's (built from the
# PyPI sdist of llama-cpp-python: CMake, -DGGML_CUDA=ON for the GPU, target
# llama-embedding). DEVICE="--cpu" runs both on the CPU (default: GPU 0,
# llama.cpp with -ngl 99).
set -euo pipefail
M40=$1
LE=$2
MODEL=$3
N=${4:-256}
WORDS=${5:-40}
ROUNDS=${ROUNDS:-3}
DEVICE=${DEVICE:-"--gpu 0"}
NGL=99
[ "$DEVICE" = "--cpu" ] && NGL=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# N texts of WORDS words each, the same every run.
python3 - "$N" "$WORDS" >"$TMP/texts.txt" <<'PY'
import random, sys
n, w = int(sys.argv[1]), int(sys.argv[2])
vocab = ("the of and to in is for on with as was at by an be this that from or are it "
         "model memory card graphics river mountain city music language data system "
         "network energy history science table window garden market story number").split()
r = random.Random(7)
for i in range(n):
    print(" ".join(r.choice(vocab) for _ in range(w)))
PY
m40_rates=()
lc_rates=()
for round in $(seq 1 "$ROUNDS"); do
    # shellcheck disable=SC2086
    "$M40" embed "$MODEL" $DEVICE <"$TMP/texts.txt" >"$TMP/m40.json"
    m40_rates+=("$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["prompt_eval_count"] / (d["total_duration"] / 1e9))' "$TMP/m40.json")")
    "$LE" -m "$MODEL" -f "$TMP/texts.txt" -ngl "$NGL" -b 4096 -ub 4096 -np 64 -c 65536 \
        --embd-output-format json >"$TMP/lc.json" 2>"$TMP/lc.log"
    lc_rates+=("$(grep -o 'prompt eval time = *[0-9.]* ms / *[0-9]* tokens' "$TMP/lc.log" | tail -1 |
        awk '{print $8 / ($5 / 1000)}')")
    echo "round $round: m40-llm ${m40_rates[-1]} tokens/s, llama.cpp ${lc_rates[-1]} tokens/s" >&2
done
python3 - "$TMP/m40.json" "$TMP/lc.json" "${m40_rates[*]}" "${lc_rates[*]}" "$MODEL" "$N" "$WORDS" <<'PY'
import json, math, statistics, sys
m40, lc = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
mr = [float(x) for x in sys.argv[3].split()]
lr = [float(x) for x in sys.argv[4].split()]
a = m40["embeddings"]
b = [d["embedding"] for d in sorted(lc["data"], key=lambda d: d["index"])]
def cos(x, y):
    return sum(p * q for p, q in zip(x, y)) / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y))
worst = min(cos(x, y) for x, y in zip(a, b))
print(f"| model | texts x words | tokens | m40-llm tokens/s | llama.cpp tokens/s | ratio | least cosine |")
print(f"| {sys.argv[5].split('/')[-1]} | {sys.argv[6]} x {sys.argv[7]} | {m40['prompt_eval_count']} | "
      f"{statistics.median(mr):.0f} | {statistics.median(lr):.0f} | "
      f"{statistics.median(mr) / statistics.median(lr):.2f} | {worst:.6f} |")
PY
