// Prints llama.cpp's token ids for texts, one line of space-separated ids
// per text, with the vocabulary's tokenizer.ggml.pre (and, if given,
// tokenizer.ggml.model) overridden: scripts/pre-references.sh runs it for
// every pre-tokenizer name llama.cpp knows.
//   llamacpp_tokenize VOCAB.gguf PRE MODEL|- TEXTS
// TEXTS holds the texts separated by NUL bytes. Special tokens are neither
// added nor parsed, or with LLAMACPP_SPECIAL=1 both.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void set_str(struct llama_model_kv_override *o, const char *key, const char *val) {
    o->tag = LLAMA_KV_OVERRIDE_TYPE_STR;
    snprintf(o->key, sizeof o->key, "%s", key);
    snprintf(o->val_str, sizeof o->val_str, "%s", val);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s VOCAB.gguf PRE MODEL|- TEXTS\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[4], "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", argv[4]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(len + 1);
    if (fread(buf, 1, len, f) != (size_t)len) return 1;
    buf[len] = 0;
    fclose(f);

    struct llama_model_kv_override ov[3];
    memset(ov, 0, sizeof ov);
    int n_ov = 0;
    set_str(&ov[n_ov++], "tokenizer.ggml.pre", argv[2]);
    if (strcmp(argv[3], "-") != 0) set_str(&ov[n_ov++], "tokenizer.ggml.model", argv[3]);
    ov[n_ov].key[0] = 0;

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    mp.kv_overrides = ov;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const char *sp = getenv("LLAMACPP_SPECIAL");
    const bool special = sp && sp[0] == '1';
    int cap = 1 << 16;
    llama_token *ids = malloc(sizeof(llama_token) * cap);
    for (long at = 0; at < len;) {
        const char *text = buf + at;
        int n_text = (int)strlen(text);
        int n = llama_tokenize(vocab, text, n_text, ids, cap, special, special);
        if (n < 0) {
            fprintf(stderr, "too many tokens\n");
            return 1;
        }
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        at += n_text + 1;
    }
    llama_model_free(model);
    return 0;
}
