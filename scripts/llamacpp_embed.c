// Prints llama.cpp's embeddings (CPU, F32 activations) of texts as JSON:
// {"pooling": P, "texts": [...], "token_ids": [[...] per text],
//  "embeddings": [[n_embd floats] per text]} (pooled as the model's
// pooling_type says, or LLAMACPP_POOLING=mean|cls|last; not normalized).
// Built against the llama.cpp of the PyPI sdist by scripts/llamacpp-driver.sh.
//   llamacpp_embed MODEL.gguf TEXT TEXT ...
// Each text is tokenized as llama-embedding does (special tokens added,
// none parsed) and runs alone in its own batch.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void json_string(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf TEXT...\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    struct llama_context_params cp = llama_context_default_params();
    cp.embeddings = true;
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    const char *pool = getenv("LLAMACPP_POOLING");
    if (pool) {
        if (!strcmp(pool, "mean")) cp.pooling_type = LLAMA_POOLING_TYPE_MEAN;
        else if (!strcmp(pool, "cls")) cp.pooling_type = LLAMA_POOLING_TYPE_CLS;
        else if (!strcmp(pool, "last")) cp.pooling_type = LLAMA_POOLING_TYPE_LAST;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const int n_embd = llama_model_n_embd(model);
    printf("{\"pooling\": %d, \"texts\": [", (int)llama_pooling_type(ctx));
    for (int t = 2; t < argc; t++) {
        if (t > 2) printf(", ");
        json_string(argv[t]);
    }
    printf("], \"token_ids\": [");
    int32_t toks[512];
    for (int t = 2; t < argc; t++) {
        int n = llama_tokenize(vocab, argv[t], strlen(argv[t]), toks, 512, true, false);
        printf("%s[", t > 2 ? ", " : "");
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", toks[i]);
        printf("]");
    }
    printf("], \"embeddings\": [");
    for (int t = 2; t < argc; t++) {
        int n = llama_tokenize(vocab, argv[t], strlen(argv[t]), toks, 512, true, false);
        if (n <= 0) {
            fprintf(stderr, "cannot tokenize text %d\n", t - 2);
            return 1;
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        struct llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            b.token[i] = toks[i];
            b.pos[i] = i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = n;
        int rc = llama_model_has_encoder(model) && !llama_model_has_decoder(model)
                     ? llama_encode(ctx, b)
                     : llama_decode(ctx, b);
        if (rc != 0) {
            fprintf(stderr, "llama_decode failed (%d)\n", rc);
            return 1;
        }
        const float *e = llama_get_embeddings_seq(ctx, 0);
        if (!e) {
            fprintf(stderr, "no pooled embedding\n");
            return 1;
        }
        printf("%s\n[", t > 2 ? "," : "");
        for (int i = 0; i < n_embd; i++) printf("%s%.7g", i ? ", " : "", e[i]);
        printf("]");
        llama_batch_free(b);
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
