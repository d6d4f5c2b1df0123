// Prints llama.cpp's embeddings (CPU, F32 activations; LLAMACPP_GPU=1: every
// layer on the GPU) of texts as JSON: {"pooling": P, "texts": [...],
// "token_ids": [[...] per text], "n_tokens": N, "eval_ms": [...],
// "embeddings": [[n_embd floats] per text]} (pooled as the model's
// pooling_type says, or LLAMACPP_POOLING=mean|cls|last; not normalized).
// LLAMACPP_BATCH=N runs N texts a batch (as llama-embedding does) and
// LLAMACPP_PASSES=P times P passes over all texts after an untimed one
// (eval_ms: each pass's decode calls and their embeddings, summed);
// LLAMACPP_THREADS: CPU threads (default 1).
// Built against the llama.cpp of the PyPI sdist by scripts/llamacpp-driver.sh.
//   llamacpp_embed MODEL.gguf TEXT TEXT ...
// Each text is tokenized as llama-embedding does (special tokens added,
// none parsed).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

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
    mp.n_gpu_layers = getenv("LLAMACPP_GPU") ? 999 : 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    struct llama_context_params cp = llama_context_default_params();
    cp.embeddings = true;
    const char *bs0 = getenv("LLAMACPP_BATCH");
    const int per0 = bs0 && atoi(bs0) > 0 ? atoi(bs0) : 1;
    cp.n_seq_max = per0;
    cp.n_ctx = per0 > 1 ? 512 * per0 : 512;
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    const char *th = getenv("LLAMACPP_THREADS");
    cp.n_threads = th && atoi(th) > 0 ? atoi(th) : 1;
    cp.n_threads_batch = cp.n_threads;
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
    // LLAMACPP_BATCH=N: up to N texts a batch (as llama-embedding packs
    // them), PASSES timed passes after one untimed; else each text alone.
    const char *bs = getenv("LLAMACPP_BATCH");
    const int per = bs && atoi(bs) > 0 ? atoi(bs) : 1;
    const char *ps = getenv("LLAMACPP_PASSES");
    const int passes = ps ? atoi(ps) : 0;
    const int n_texts = argc - 2;
    float *out = malloc(sizeof(float) * (size_t)n_embd * n_texts);
    int32_t *all = malloc(sizeof(int32_t) * 512 * (size_t)n_texts);
    int *lens = malloc(sizeof(int) * n_texts);
    long long n_tokens = 0;
    for (int t = 0; t < n_texts; t++) {
        lens[t] = llama_tokenize(vocab, argv[t + 2], strlen(argv[t + 2]), all + 512 * t, 512, true, false);
        if (lens[t] <= 0) {
            fprintf(stderr, "cannot tokenize text %d\n", t);
            return 1;
        }
        n_tokens += lens[t];
    }
    const int encoder = llama_model_has_encoder(model) && !llama_model_has_decoder(model);
    printf("], \"n_tokens\": %lld, \"eval_ms\": [", n_tokens);
    for (int pass = 0; pass <= passes; pass++) {
        double ms = 0;
        for (int t0 = 0; t0 < n_texts; t0 += per) {
            const int t1 = t0 + per < n_texts ? t0 + per : n_texts;
            int n = 0;
            for (int t = t0; t < t1; t++) n += lens[t];
            llama_memory_clear(llama_get_memory(ctx), true);
            struct llama_batch b = llama_batch_init(n, 0, 1);
            int i = 0;
            for (int t = t0; t < t1; t++)
                for (int j = 0; j < lens[t]; j++, i++) {
                    b.token[i] = all[512 * t + j];
                    b.pos[i] = j;
                    b.n_seq_id[i] = 1;
                    b.seq_id[i][0] = t - t0;
                    b.logits[i] = 1;
                }
            b.n_tokens = n;
            const double start = now_ms();
            const int rc = encoder ? llama_encode(ctx, b) : llama_decode(ctx, b);
            if (rc != 0) {
                fprintf(stderr, "llama_decode failed (%d)\n", rc);
                return 1;
            }
            for (int t = t0; t < t1; t++) {
                const float *e = llama_get_embeddings_seq(ctx, t - t0);
                if (!e) {
                    fprintf(stderr, "no pooled embedding\n");
                    return 1;
                }
                memcpy(out + (size_t)n_embd * t, e, sizeof(float) * n_embd);
            }
            ms += now_ms() - start;
            llama_batch_free(b);
        }
        if (pass > 0) printf("%s%.3f", pass > 1 ? ", " : "", ms);
    }
    printf("], \"embeddings\": [");
    for (int t = 0; t < n_texts; t++) {
        printf("%s\n[", t ? "," : "");
        for (int i = 0; i < n_embd; i++) printf("%s%.7g", i ? ", " : "", out[(size_t)n_embd * t + i]);
        printf("]");
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
