/*
 * test_ir_golden.c -- the IR text form of a small MLP, traced and optimized, pinned by
 * golden files (tests/ad/golden/). The text form is what users read when debugging and
 * what later passes are checked against: a change to it must be deliberate. To accept a
 * deliberate change, run this test with NBT_UPDATE_GOLDEN=1 and review the diff.
 */
#include "nbtest.h"

#include <stdlib.h>

#ifndef NBT_SOURCE_DIR
#define NBT_SOURCE_DIR "."
#endif

/* A 2-16-16-1 MLP with a constant input scale folded away and an unused branch (DCE) and a
 * repeated subexpression (CSE). */
static nb_status body_mlp(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "x");
    /* built one per statement: C leaves the order of argument evaluation open, and the
     * traced node order (so the golden text) must not depend on the compiler */
    nb_var *four = nb_scalar_typed(tr, NB_DTYPE_F32, 4.0);
    nb_var *half = nb_scalar_typed(tr, NB_DTYPE_F32, 0.5);
    nb_var *scale = nb_mul(half, four); /* folds to 2 */
    nb_var *h = nb_mul(x, scale);
    for (int i = 0; i < 3; i++) {
        nb_var *w = nb_get(tr, self, "layers[%d].weight", i);
        nb_var *b = nb_get(tr, self, "layers[%d].bias", i);
        h = nb_add(nb_matmul(h, w), b);
        if (i < 2) {
            h = nb_tanh(h);
        }
    }
    nb_var *unused = nb_exp(x); /* dead */
    (void)unused;
    nb_var *sq1 = nb_square(h), *sq2 = nb_square(h); /* the same value twice */
    nb_var *loss = nb_mean(nb_add(sq1, sq2), NULL, 0, false);
    return nb_return(loss, out);
}

static nb_tree *layer(nb_ctx *ctx, int64_t in, int64_t outn) {
    nb_tree *w = nbt_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){in, outn});
    nb_tree *b = nbt_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){outn});
    nb_tree *d = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"weight", "bias"}, (nb_tree *[]){w, b}, &d));
    nb_tree_destroy(w);
    nb_tree_destroy(b);
    return d;
}

static void check_golden(const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/ad/golden/%s", NBT_SOURCE_DIR, name);
    if (getenv("NBT_UPDATE_GOLDEN") != NULL) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        print_message("updated %s\n", path);
        return;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fail_msg("missing golden file %s (run with NBT_UPDATE_GOLDEN=1 to create it)", path);
    }
    static char want[1 << 16];
    size_t n = fread(want, 1, sizeof want - 1, f);
    want[n] = '\0';
    fclose(f);
    if (strcmp(want, text) != 0) {
        fail_msg("IR differs from %s\n--- golden\n%s--- now\n%s", path, want, text);
    }
}

static void test_mlp_ir_golden(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *l0 = layer(ctx, 2, 16), *l1 = layer(ctx, 16, 16), *l2 = layer(ctx, 16, 1);
    nb_tree *layers = NULL, *self = NULL, *args = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 3, (nb_tree *[]){l0, l1, l2}, &layers));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"layers"}, &layers, &self));
    nb_tree *x = nbt_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){16, 2});
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"x"}, &x, &args));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "mlp_loss", body_mlp, self, &f));
    static char buf[1 << 16];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_TRACED, buf, sizeof buf, NULL));
    check_golden("mlp_traced.ir", buf);
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, buf, sizeof buf, NULL));
    check_golden("mlp_optimized.ir", buf);
    /* The passes did their work: no exp (DCE), one square (CSE), a folded constant. */
    NBT_TRUE(strstr(buf, "= exp") == NULL);
    NBT_TRUE(strstr(buf, "= square") != NULL);
    NBT_TRUE(strstr(strstr(buf, "= square") + 1, "= square") == NULL);
    NBT_TRUE(strstr(buf, "constant {values=[2]}") != NULL);
    /* Formatting does not count as a trace. */
    nb_fn_stats s;
    NBT_OK(ctx, nb_fn_stats_get(f, &s));
    NBT_EQ_I64(s.n_traces, 0);
    nb_fn_destroy(f);
    nb_tree_destroy(x);
    nb_tree_destroy(args);
    nb_tree_destroy(self);
    nb_tree_destroy(layers);
    nb_tree_destroy(l2);
    nb_tree_destroy(l1);
    nb_tree_destroy(l0);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_ir_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
