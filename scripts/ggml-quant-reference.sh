#!/usr/bin/env bash
# ggml's MXFP4 quantization and dequantization of a fixed set of values,
# committed as crates/m40-gguf/tests/data/ggml-mxfp4.json (tests/mxfp4.rs
# compares m40-gguf's). Builds llama.cpp's CPU libraries from the PyPI
# sdist on first use (scripts/llamacpp-logits.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VER=${VER:-0.3.36}
T=$PWD/target/llamacpp
SRC=$T/llama_cpp_python-$VER/vendor/llama.cpp
# llamacpp-logits.sh builds the libraries on its first run; given no model
# its driver then fails, which is ignored here.
[ -f "$T/build/bin/libllama.so" ] || scripts/llamacpp-logits.sh >/dev/null 2>&1 || true
cc -O2 -o "$T/ggml_quantize" scripts/ggml_quantize.c -I"$SRC/ggml/include" \
    -L"$T/build/bin" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$T/build/bin"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# 64 blocks: random values over magnitudes 2^-20..2^20 (one scale a block),
# a zero block, blocks of exact level values and of midpoints (ties), a
# block with one huge value, tiny (subnormal-scale) values.
python3 - "$TMP/x.f32" <<'PY'
import random, struct, sys
r = random.Random(34)
xs = []
for b in range(56):
    s = 2.0 ** r.uniform(-20, 20)
    xs += [r.uniform(-1, 1) * s for _ in range(32)]
xs += [0.0] * 32
lv = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
xs += [v * (1 if i % 2 else -1) for i, v in enumerate(lv * 4)]
xs += [(lv[i % 7] + lv[i % 7 + 1]) / 2 * (-1) ** i for i in range(32)]
xs += [1e6] + [r.uniform(-1, 1) for _ in range(31)]
xs += [r.uniform(-1, 1) * 1e-39 for _ in range(32)]
xs += [r.uniform(-1, 1) * 3e-38 for _ in range(32)]
xs += [6.0] * 16 + [-6.0] * 16
xs += [r.choice([0.75, -0.75, 5.0, -5.0, 10.0, 7.0]) for _ in range(32)]
open(sys.argv[1], "wb").write(struct.pack(f"<{len(xs)}f", *xs))
print(len(xs), file=sys.stderr)
PY
N=$(( $(stat -c %s "$TMP/x.f32") / 4 ))
"$T/ggml_quantize" 39 "$N" <"$TMP/x.f32" >crates/m40-gguf/tests/data/ggml-mxfp4.json
echo crates/m40-gguf/tests/data/ggml-mxfp4.json >&2
