#!/usr/bin/env bash
# llama.cpp's token ids for every tokenizer.ggml.pre value on our texts
# and for the Unigram and WordPiece test vocabularies (scripts/pre-references.py)
# into crates/m40-tokenizer/tests/data/llamacpp-{pre,ugm,wpm}.json.
set -euo pipefail
cd "$(dirname "$0")/.."
DRIVER=$(scripts/llamacpp-driver.sh llamacpp_tokenize)
VOCAB=$(scripts/llamacpp-vocab.sh)
python3 scripts/pre-references.py "$DRIVER" "$VOCAB" crates/m40-tokenizer/tests/data
