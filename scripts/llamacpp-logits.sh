#!/usr/bin/env bash
# llama.cpp's logits for a model and token ids, as JSON on stdout
# (scripts/llamacpp_logits.c): builds libllama (CPU) from the PyPI sdist of
# llama-cpp-python into target/llamacpp once, then the driver against it.
#   scripts/llamacpp-logits.sh MODEL.gguf ID ID ...
set -euo pipefail
cd "$(dirname "$0")/.."
exec "$(scripts/llamacpp-driver.sh llamacpp_logits)" "$@"
