#!/usr/bin/env bash
# CPU speed of m40-llm against llama.cpp on this machine, side by side:
# llama.cpp's llama-bench, built from the PyPI sdist of llama-cpp-python
# (the version ../shared/testdata was made with) into target/llamacpp, and
# `m40-llm bench --cpu`, alternating, on the same GGUF file, at 1 and 2
# threads (or THREADS="..."), ROUNDS rounds (default 3). Prints the load
# average before each round and a table of medians at the end.
#
#   benches/cpu_vs_llamacpp.sh [MODEL.gguf]     (default: the default model)
set -euo pipefail
cd "$(dirname "$0")/.."
VER=0.3.36
T=$PWD/target/llamacpp
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-"1 2"}
PP=${PP:-128}
TG=${TG:-64}

if [ ! -x "$T/build/bin/llama-bench" ]; then
    echo "== building llama-bench from llama-cpp-python==$VER (PyPI sdist) into $T" >&2
    mkdir -p "$T"
    tar xzf "$(VER=$VER scripts/llamacpp-sdist.sh)" -C "$T"
    CMAKE=$(command -v cmake || true)
    if [ -z "$CMAKE" ]; then
        python3 -m pip install -q --target "$T/cmake" cmake
        CMAKE="$T/cmake/bin/cmake"
        export PYTHONPATH="$T/cmake${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$CMAKE" -S "$T/llama_cpp_python-$VER/vendor/llama.cpp" -B "$T/build" \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    "$CMAKE" --build "$T/build" --target llama-bench -j "$(nproc)" >/dev/null
fi

cargo build -q --release --bin m40-llm
M40=target/release/m40-llm
[ -n "${BUILD_ONLY:-}" ] && exit 0
MODEL=${1:-$($M40 pull smollm2:135m | cut -f2)}
echo "model: $MODEL" >&2

results=$(mktemp)
for round in $(seq "$ROUNDS"); do
    echo "== round $round, load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for t in $THREADS; do
        "$T/build/bin/llama-bench" -m "$MODEL" -p "$PP" -n "$TG" -t "$t" -r 3 -o json 2>/dev/null |
            python3 -c '
import json, sys
for r in json.load(sys.stdin):
    test = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print("llama.cpp", sys.argv[1], test, r["avg_ts"])' "$t" >>"$results"
        "$M40" bench "$MODEL" --cpu -t "$t" -p "$PP" -n "$TG" -r 3 --json |
            python3 -c '
import json, sys
r = json.load(sys.stdin)
for x in r["tests"]:
    print("m40-llm", sys.argv[1], x["test"], x["tokens_per_s"])' "$t" >>"$results"
    done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, t, test, v = line.split()
    rows.setdefault((int(t), test), {}).setdefault(who, []).append(float(v))
print("| threads | test | llama.cpp t/s | m40-llm t/s | m40-llm / llama.cpp |")
print("|---|---|---|---|---|")
for (t, test), d in sorted(rows.items()):
    a, b = statistics.median(d["llama.cpp"]), statistics.median(d["m40-llm"])
    print(f"| {t} | {test} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
PY
