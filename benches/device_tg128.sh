#!/usr/bin/env bash
# tg128 of m40-llm against llama.cpp's llama-bench on the device tool's GPU
# machine, on the same synthesized files, alternating: the method of
# BENCHMARKS.md's issue-34 tables. Three steps:
#
#   benches/device_tg128.sh stage [OLD.gz]
#       here: writes target/carry/llamacpp.tgz (llama.cpp from the PyPI
#       sdist of llama-cpp-python, the version ../shared/testdata was made
#       with, without its docs, models and other backends) and, given a
#       gzip'd m40-llm binary to compare against, target/carry/m40-old.gz.
#       Carry them with target/gpu-pack.tar.xz (`cargo xtask gpu-pack`),
#       under 64 MiB with the tree (carry m40-old.gz in the run call if not).
#   benches/device_tg128.sh prep "SHAPE:TYPE ..."
#       on the device (one call, ~6 min on 16 cores): builds llama-bench
#       (CUDA, arch 90) into /tmp/llama.cpp while `m40-llm synth` writes
#       the files to /tmp/models/SHAPE-TYPE.gguf.
#   benches/device_tg128.sh run "SHAPE-TYPE ..." [ROUNDS] [WHICH]
#       on the device, in a later call of the same lease: per file, ROUNDS
#       (default 2) rounds of WHICH (default "old new llama") in turn.
#
# The pack's binary is "new" (/tmp/gpu-pack/bin/m40-llm, or the one in
# target/gpu-pack.tar.xz, unpacked by prep), the staged one "old".
set -uo pipefail
cd "$(dirname "$0")/.."
VER=0.3.36
case "${1:-}" in
stage)
    set -e
    mkdir -p target/carry target/llamacpp/stage
    S=target/llamacpp/stage
    if [ ! -d "$S/llama.cpp" ]; then
        tar xzf "$(VER=$VER scripts/llamacpp-sdist.sh)" -C "$S"
        mv "$S/llama_cpp_python-$VER/vendor/llama.cpp" "$S/llama.cpp"
        rm -rf "$S/llama_cpp_python-$VER"
        (cd "$S/llama.cpp" && rm -rf docs models media benches examples/*/assets \
            ggml/src/ggml-{vulkan,sycl,opencl,metal,cann,musa,kompute,hip,rpc,webgpu,zdnn})
    fi
    tar czf target/carry/llamacpp.tgz -C "$S" llama.cpp
    [ -n "${2:-}" ] && cp "$2" target/carry/m40-old.gz
    ls -la target/carry
    ;;
prep)
    mkdir -p /tmp/models
    if [ ! -x /tmp/gpu-pack/bin/m40-llm ] && [ -f target/gpu-pack.tar.xz ]; then
        (cd /tmp && tar xJf "$OLDPWD/target/gpu-pack.tar.xz")
    fi
    cp /tmp/gpu-pack/bin/m40-llm /tmp/m40
    [ -f target/carry/m40-old.gz ] && gunzip -c target/carry/m40-old.gz > /tmp/m40-old && chmod +x /tmp/m40-old
    if [ ! -x /tmp/llama.cpp/build/bin/llama-bench ]; then
        (cd /tmp && rm -rf llama.cpp && tar xzf "$OLDPWD/target/carry/llamacpp.tgz")
        cmake -S /tmp/llama.cpp -B /tmp/llama.cpp/build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/cmake.log 2>&1 || tail -30 /tmp/cmake.log
        cmake --build /tmp/llama.cpp/build --target llama-bench -j "$(nproc)" > /tmp/build.log 2>&1 &
        BUILD=$!
    fi
    for st in ${2:-}; do
        f=/tmp/models/${st%%:*}-${st##*:}.gguf
        [ -f "$f" ] || /tmp/m40 synth --shape "${st%%:*}" --type "${st##*:}" "$f" 2>&1 | tail -1
    done
    [ -n "${BUILD:-}" ] && { wait "$BUILD"; tail -1 /tmp/build.log; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    ;;
run)
    export LD_LIBRARY_PATH=/tmp/llama.cpp/build/bin:${LD_LIBRARY_PATH:-}
    date -u
    for m in ${2:-}; do
        f=/tmp/models/$m.gguf
        for _ in $(seq "${3:-2}"); do
            for w in ${4:-old new llama}; do
                echo "== $m $w"
                case $w in
                old) /tmp/m40-old bench "$f" --no-llama-bench -r 3 -p 0 -d 0 2>&1 | grep -E "tg128" ;;
                new) /tmp/m40 bench "$f" --no-llama-bench -r 3 -p 0 -d 0 2>&1 | grep -E "tg128" ;;
                llama) /tmp/llama.cpp/build/bin/llama-bench -m "$f" -p 0 -n 128 -r 3 -ngl 99 -fa 1 2>&1 | grep -E "tg128" ;;
                esac
            done
        done
    done
    date -u
    ;;
*)
    sed -n '2,22p' "$0"
    exit 2
    ;;
esac
