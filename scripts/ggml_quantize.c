// ggml's quantization and dequantization of raw f32 values, for the tests
// of m40-gguf's own (scripts/ggml-quant-reference.sh).
//   ggml_quantize TYPE_ID N < values.f32 > out.json
#include <stdio.h>
#include <stdlib.h>

#include "ggml.h"
#include "ggml-cpu.h"

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TYPE_ID N < values.f32\n", argv[0]);
        return 2;
    }
    const enum ggml_type ty = (enum ggml_type)atoi(argv[1]);
    const long n = atol(argv[2]);
    float* x = malloc(n * sizeof(float));
    if (fread(x, sizeof(float), n, stdin) != (size_t)n) {
        fprintf(stderr, "short input\n");
        return 1;
    }
    const size_t bytes = ggml_row_size(ty, n);
    unsigned char* q = malloc(bytes);
    ggml_quantize_chunk(ty, x, q, 0, 1, n, NULL);
    float* y = malloc(n * sizeof(float));
    ggml_get_type_traits(ty)->to_float(q, y, n);
    printf("{\"type\": \"%s\", \"input\": [", ggml_type_name(ty));
    for (long i = 0; i < n; i++) printf("%s%.9g", i ? ", " : "", x[i]);
    printf("], \"bytes_hex\": \"");
    for (size_t i = 0; i < bytes; i++) printf("%02x", q[i]);
    printf("\", \"dequantized\": [");
    for (long i = 0; i < n; i++) printf("%s%.9g", i ? ", " : "", y[i]);
    printf("]}\n");
    return 0;
}
