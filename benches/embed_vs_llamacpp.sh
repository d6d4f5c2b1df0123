#!/usr/bin/env bash
# Embedding throughput of m40-llm against llama.cpp on the same GGUF file and
# texts, alternating, ROUNDS rounds (default 3), and how close their vectors
# are. m40-llm embeds every text in one request (its inputs batched in the
# engine's steps; `total_duration`: the embedding alone, load excluded).
# llama.cpp runs through scripts/llamacpp_embed.c as llama-embedding batches
# (64 texts a batch; llama-embedding itself times no encoder's batches), its
# median of 3 passes after an untimed one. Prints a table of medians and the
# least cosine between the two tools' vectors.
#
#   benches/embed_vs_llamacpp.sh M40_LLM LLAMACPP_EMBED MODEL.gguf [N_TEXTS] [WORDS]
#
# M40_LLM is the m40-llm binary, LLAMACPP_EMBED scripts/llamacpp_embed.c built
# against libllama (scripts/llamacpp-driver.sh builds it for the CPU; for the
# GPU build libllama from the PyPI sdist of llama-cpp-python with
# -DGGML_CUDA=ON and compile the driver against it). DEVICE="--cpu" runs both
# on the CPU (default: GPU 0, llama.cpp with every layer on the GPU).
set -euo pipefail
M40=$1
LE=$2
MODEL=$3
N=${4:-256}
WORDS=${5:-40}
ROUNDS=${ROUNDS:-3}
DEVICE=${DEVICE:-"--gpu 0"}
GPU=1
[ "$DEVICE" = "--cpu" ] && GPU=
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
    mapfile -t TEXTS <"$TMP/texts.txt"
    LLAMACPP_THREADS=$(nproc) LLAMACPP_GPU=$GPU LLAMACPP_BATCH=64 LLAMACPP_PASSES=3 "$LE" "$MODEL" "${TEXTS[@]}" \
        >"$TMP/lc.json" 2>"$TMP/lc.log"
    lc_rates+=("$(python3 -c 'import json,statistics,sys; d=json.load(open(sys.argv[1])); print(d["n_tokens"] / (statistics.median(d["eval_ms"]) / 1e3))' "$TMP/lc.json")")
    echo "round $round: m40-llm ${m40_rates[-1]} tokens/s, llama.cpp ${lc_rates[-1]} tokens/s" >&2
done
python3 - "$TMP/m40.json" "$TMP/lc.json" "${m40_rates[*]}" "${lc_rates[*]}" "$MODEL" "$N" "$WORDS" <<'PY'
import json, math, statistics, sys
m40, lc = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
mr = [float(x) for x in sys.argv[3].split()]
lr = [float(x) for x in sys.argv[4].split()]
a = m40["embeddings"]
b = lc["embeddings"]
def cos(x, y):
    return sum(p * q for p, q in zip(x, y)) / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y))
worst = min(cos(x, y) for x, y in zip(a, b))
print(f"| model | texts x words | tokens (m40-llm, llama.cpp) | m40-llm tokens/s | llama.cpp tokens/s | ratio | least cosine |")
print(f"| {sys.argv[5].split('/')[-1]} | {sys.argv[6]} x {sys.argv[7]} | {m40['prompt_eval_count']}, {lc['n_tokens']} | "
      f"{statistics.median(mr):.0f} | {statistics.median(lr):.0f} | "
      f"{statistics.median(mr) / statistics.median(lr):.2f} | {worst:.6f} |")
PY
