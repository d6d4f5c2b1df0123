// Prints llama.cpp's logits (CPU, F32 activations) for a token sequence as
// JSON: {"token_ids": [...], "n_vocab": V, "logits": [[V floats] per position]}.
// Built against the llama.cpp of the PyPI sdist by scripts/llamacpp-logits.sh.
//   llamacpp_logits MODEL.gguf ID ID ...
// The context is 64 tokens (or the sequence's length if longer), or
// LLAMACPP_N_CTX where set (LongRoPE chooses its factors by it); the JSON
// records it as "n_ctx".
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf ID...\n", argv[0]);
        return 2;
    }
    const int n = argc - 2;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n < 64 ? 64 : n;
    const char *nc = getenv("LLAMACPP_N_CTX");
    if (nc && atoi(nc) > n) cp.n_ctx = atoi(nc);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = atoi(argv[i + 2]);
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    printf("{\"token_ids\": [");
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", b.token[i]);
    printf("], \"n_vocab\": %d, \"n_ctx\": %u, \"logits\": [", n_vocab, cp.n_ctx);
    for (int i = 0; i < n; i++) {
        const float *l = llama_get_logits_ith(ctx, i);
        printf("%s[", i ? ",\n" : "\n");
        for (int v = 0; v < n_vocab; v++) printf("%s%.7g", v ? ", " : "", l[v]);
        printf("]");
    }
    printf("]}\n");
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
