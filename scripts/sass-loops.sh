#!/usr/bin/env bash
# The SASS a committed PTX module compiles to, and the instructions of each
# kernel's main loop (its loop with the most FFMA), by opcode: how
# BENCHMARKS.md counts instructions a loop without a GPU.
#
#   scripts/sass-loops.sh gemv_packed.q4_0 [ARCH] [KERNEL ...]
#
# The module by name (crates/m40-kernels/ptx/NAME.ptx.zst, decompressed with
# the zstd tool) or as a path to a .ptx or .ptx.zst file.
# ARCH: sm_90 (default; what the H100 JIT-compiles the PTX for) or sm_52.
# KERNELs: entry names (default: every kernel of the module). ptxas comes
# from target/cuda-tools (`cargo xtask ptx` installs it), nvdisasm from the
# PyPI wheel nvidia-cuda-nvdisasm, fetched once into target/cuda-tools/nvdisasm.
set -euo pipefail
cd "$(dirname "$0")/.."
PTX=${1:?usage: scripts/sass-loops.sh MODULE [ARCH] [KERNEL ...]}
ARCH=${2:-sm_90}
shift $(($# < 2 ? $# : 2))
PTXAS=target/cuda-tools/nvidia/cuda_nvcc/bin/ptxas
[ -x "$PTXAS" ] || { echo "no $PTXAS: run cargo xtask ptx first" >&2; exit 1; }
D=target/cuda-tools/nvdisasm
NVDISASM=$(find "$D" -name nvdisasm -type f 2>/dev/null | head -1 || true)
if [ -z "$NVDISASM" ]; then
    mkdir -p "$D"
    python3 -m pip download -q --no-deps --disable-pip-version-check nvidia-cuda-nvdisasm -d "$D"
    python3 -m zipfile -e "$D"/nvidia_cuda_nvdisasm-*.whl "$D/x"
    NVDISASM=$(find "$D" -name nvdisasm -type f | head -1)
    chmod +x "$NVDISASM"
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
[ -f "$PTX" ] || PTX=crates/m40-kernels/ptx/$PTX.ptx.zst
if [[ "$PTX" == *.zst ]]; then
    command -v zstd >/dev/null || { echo "the zstd tool is needed to read $PTX" >&2; exit 1; }
    zstd -q -dc "$PTX" > "$T/m.ptx"
    PTX=$T/m.ptx
fi
"$PTXAS" -arch="$ARCH" -o "$T/m.cubin" "$PTX"
"$NVDISASM" -c "$T/m.cubin" > "$T/m.sass" 2>/dev/null
if [ $# -eq 0 ]; then
    set -- $(sed -n 's/^\.text\.\(.*\):$/\1/p' "$T/m.sass")
fi
for k in "$@"; do
    awk -v k=".text.$k:" '$0 == k {on = 1; next} on && /^\.text\./ {exit} on' "$T/m.sass" > "$T/k.sass"
    # The span from a label back to a branch to it with the most FFMA: the
    # main loop of the GEMVs and GEMMs (the longest span can be an epilogue's
    # loop; in kernels with more control flow a span may take in more than a
    # loop: read the SASS there).
    read -r a b < <(awk '/^\.L_x_[0-9]+:/ {lab[$1] = NR}
        / FFMA/ {ff[NR] = 1}
        /BRA `\(\.L_x_[0-9]+\)/ {m = $0; sub(/.*\(/, "", m); sub(/\).*/, "", m)
            if ((m ":") in lab) {c = 0; for (i = lab[m ":"]; i <= NR; i++) c += (i in ff); print c, lab[m ":"], NR}}' "$T/k.sass" |
        sort -rn | head -1 | cut -d' ' -f2-) || true
    total=$(grep -cE '^\s+/\*[0-9a-f]+\*/' "$T/k.sass" || true)
    if [ -z "${a:-}" ]; then
        echo "$k ($ARCH): $total instructions, no loop"
        continue
    fi
    ops=$(sed -n "${a},${b}p" "$T/k.sass" | grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_.]+' |
        awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | awk '{printf "%s %s, ", $2, $1}')
    n=$(sed -n "${a},${b}p" "$T/k.sass" | grep -cE '^\s+/\*[0-9a-f]+\*/')
    echo "$k ($ARCH): $total instructions; loop $n: ${ops%, }"
    unset a b
done
