#!/usr/bin/env bash
# Builds libllama (CPU) from the PyPI sdist of llama-cpp-python into
# target/llamacpp once, then one of our C drivers (scripts/NAME.c) against
# it; prints the driver's path.
#   scripts/llamacpp-driver.sh llamacpp_logits | llamacpp_tokenize
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=$1
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
if [ ! -x "$T/$NAME" ] || [ "scripts/$NAME.c" -nt "$T/$NAME" ]; then
    cc -O2 -o "$T/$NAME" "scripts/$NAME.c" -I"$SRC/include" -I"$SRC/ggml/include" \
        -L"$T/build/bin" -lllama -Wl,-rpath,"$T/build/bin" >&2
fi
echo "$T/$NAME"
