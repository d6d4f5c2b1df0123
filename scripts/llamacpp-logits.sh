#!/usr/bin/env bash
# llama.cpp's logits for a model and token ids, as JSON on stdout
# (scripts/llamacpp_logits.c): builds libllama (CPU) from the PyPI sdist of
# llama-cpp-python into target/llamacpp once, then the driver against it.
#   scripts/llamacpp-logits.sh MODEL.gguf ID ID ...
set -euo pipefail
cd "$(dirname "$0")/.."
VER=${VER:-0.3.36}
T=$PWD/target/llamacpp
SRC=$T/llama_cpp_python-$VER/vendor/llama.cpp
if [ ! -f "$T/build/bin/libllama.so" ]; then
    mkdir -p "$T"
    [ -d "$SRC" ] || tar xzf "$(VER=$VER scripts/llamacpp-sdist.sh)" -C "$T"
    CMAKE=$(command -v cmake || true)
    if [ -z "$CMAKE" ]; then
        [ -x "$T/cmake/bin/cmake" ] || python3 -m pip install -q --target "$T/cmake" cmake
        CMAKE="$T/cmake/bin/cmake"
        export PYTHONPATH="$T/cmake${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$CMAKE" -S "$SRC" -B "$T/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF >&2
    "$CMAKE" --build "$T/build" --target llama -j "$(nproc)" >&2
fi
if [ ! -x "$T/llamacpp_logits" ] || [ scripts/llamacpp_logits.c -nt "$T/llamacpp_logits" ]; then
    cc -O2 -o "$T/llamacpp_logits" scripts/llamacpp_logits.c -I"$SRC/include" -I"$SRC/ggml/include" \
        -L"$T/build/bin" -lllama -Wl,-rpath,"$T/build/bin"
fi
exec "$T/llamacpp_logits" "$@"
