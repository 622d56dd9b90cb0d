/*
 * test_array_oracle.c -- nb_array_format against numpy's repr(), byte for byte.
 *
 * The expected texts come from numpy 1.24 (Debian's python3-numpy), stored in
 * tests/core/oracle/numpy_format.txt by tests/core/oracle/gen_numpy_format.py.
 */
#include "nbtest.h"

#include <stdlib.h>

#ifndef NBT_ORACLE_DIR
#define NBT_ORACLE_DIR "tests/core/oracle"
#endif

typedef struct oracle_case {
    nb_dtype dtype;
    int rank;
    int64_t shape[NB_MAX_RANK];
    int64_t n;
    double *values;
    int64_t *ivalues;
    char *expect;
    int line;
} oracle_case;

static bool parse_dtype(const char *s, nb_dtype *d) {
    static const char *names[] = {"f32", "f64", "i32", "i64", "bool"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(s, names[i]) == 0) {
            *d = (nb_dtype)i;
            return true;
        }
    }
    return false;
}

static char *read_line(FILE *f, char *buf, size_t cap) {
    if (fgets(buf, (int)cap, f) == NULL) {
        return NULL;
    }
    size_t len = strlen(buf);
    if (len > 0 && buf[len - 1] == '\n') {
        buf[len - 1] = '\0';
    }
    return buf;
}

/* Build the case's array in nabla. */
static nb_array *build(nb_ctx *ctx, const oracle_case *c) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, c->dtype, c->rank, c->shape, &a));
    void *p = nb_array_data(a);
    for (int64_t i = 0; i < c->n; i++) {
        switch (c->dtype) {
        case NB_DTYPE_F32:
            ((float *)p)[i] = (float)c->values[i];
            break;
        case NB_DTYPE_F64:
            ((double *)p)[i] = c->values[i];
            break;
        case NB_DTYPE_I32:
            ((int32_t *)p)[i] = (int32_t)c->ivalues[i];
            break;
        case NB_DTYPE_I64:
            ((int64_t *)p)[i] = c->ivalues[i];
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)p)[i] = c->ivalues[i] != 0;
            break;
        }
    }
    return a;
}

static void test_numpy_format_oracle(void **state) {
    (void)state;
    const char *dir = getenv("NBT_ORACLE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/numpy_format.txt", dir ? dir : NBT_ORACLE_DIR);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fail_msg("cannot open oracle file %s", path);
    }
    nb_ctx *ctx = nbt_ctx();
    static char line[1 << 16];
    size_t cap = 1 << 20;
    char *expect = malloc(cap);
    char *got = malloc(cap);
    assert_non_null(expect);
    assert_non_null(got);
    int lineno = 0, n_cases = 0, n_bad = 0;
    while (read_line(f, line, sizeof line) != NULL) {
        lineno++;
        if (line[0] == '#' || line[0] == '\0') {
            continue;
        }
        oracle_case c;
        memset(&c, 0, sizeof c);
        char dname[16];
        int off = 0;
        if (sscanf(line, "case %15s %d%n", dname, &c.rank, &off) != 2 ||
            !parse_dtype(dname, &c.dtype)) {
            fail_msg("%s:%d: expected 'case <dtype> <rank> <dims>', got '%s'", path, lineno, line);
        }
        c.line = lineno;
        c.n = 1;
        const char *p = line + off;
        for (int i = 0; i < c.rank; i++) {
            char *end = NULL;
            c.shape[i] = strtoll(p, &end, 10);
            p = end;
            c.n *= c.shape[i];
        }
        c.values = calloc((size_t)(c.n > 0 ? c.n : 1), sizeof(double));
        c.ivalues = calloc((size_t)(c.n > 0 ? c.n : 1), sizeof(int64_t));
        for (int64_t i = 0; i < c.n; i++) {
            if (read_line(f, line, sizeof line) == NULL) {
                fail_msg("%s: truncated values in case at line %d", path, c.line);
            }
            lineno++;
            c.values[i] = strtod(line, NULL);
            c.ivalues[i] = strtoll(line, NULL, 10);
        }
        expect[0] = '\0';
        size_t elen = 0;
        while (read_line(f, line, sizeof line) != NULL) {
            lineno++;
            if (strcmp(line, "end") == 0) {
                break;
            }
            size_t l = strlen(line);
            if (elen + l + 2 >= cap) {
                fail_msg("%s: expected text too long at line %d", path, lineno);
            }
            if (elen > 0) {
                expect[elen++] = '\n';
            }
            memcpy(expect + elen, line, l + 1);
            elen += l;
        }
        nb_array *a = build(ctx, &c);
        size_t need = 0;
        NBT_OK(ctx, nb_array_format(a, got, cap, &need));
        NBT_EQ_I64(need, strlen(got));
        if (strcmp(got, expect) != 0) {
            n_bad++;
            print_error("case at %s:%d (%s rank %d, %lld elements) differs from numpy:\n"
                        "--- numpy\n%s\n--- nabla\n%s\n",
                        path, c.line, dname, c.rank, (long long)c.n, expect, got);
        }
        nb_array_destroy(a);
        free(c.values);
        free(c.ivalues);
        n_cases++;
    }
    fclose(f);
    free(expect);
    free(got);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
    if (n_cases < 30) {
        fail_msg("only %d oracle cases read from %s", n_cases, path);
    }
    if (n_bad > 0) {
        fail_msg("%d of %d cases differ from numpy", n_bad, n_cases);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numpy_format_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
