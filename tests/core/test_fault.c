/*
 * test_fault.c -- allocation-failure injection over whole scenarios (SQLite's *fault.test,
 * Lua's memerr.lua): fail the 1st, 2nd, 3rd ... allocation of a scenario until it
 * succeeds. Every failure must return NB_ERR_OOM with a message, leak nothing (live-object
 * counters and the allocator's own count of live blocks), and leave the context usable.
 */
#include "nbtest.h"

#include <stdlib.h>

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != NB_OK) {                                                                         \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static nb_status scale_cb(void *ud, const char *path, int n, const nb_tree *const *leaves,
                          nb_tree **out) {
    (void)ud;
    (void)path;
    (void)n;
    nb_array *a = nb_tree_get_array(leaves[0]), *b = NULL;
    nb_status st = nb_array_cast(a, NB_DTYPE_F64, &b);
    if (st != NB_OK) {
        return st;
    }
    st = nb_tree_array(b, out);
    nb_array_destroy(b);
    return st;
}

/* A scenario touching every allocating path of arrays and trees: build a nested tree,
 * flatten, map, unflatten, filter/partition/combine, diff, format and print. */
static nb_status scenario_trees(nb_ctx *ctx) {
    nb_status st = NB_OK;
    nb_array *w = NULL, *b = NULL, *steps = NULL, *view = NULL;
    nb_tree *lw = NULL, *lb = NULL, *ls = NULL, *act = NULL, *name = NULL, *nul = NULL;
    nb_tree *layer = NULL, *layers = NULL, *model = NULL, *leaves = NULL, *rebuilt = NULL;
    nb_tree *mapped = NULL, *match = NULL, *rest = NULL, *combined = NULL, *big = NULL;
    nb_tree *many[20] = {0};
    nb_treedef *def = NULL;
    char text[256];
    bool eq = false, differ = false;
    FILE *sink = NULL;

    TRY(nb_array_arange(ctx, NB_DTYPE_F32, 0, 12, 1, &w));
    TRY(nb_array_reshape(w, 2, (int64_t[]){3, 4}, &view));
    TRY(nb_array_linspace(ctx, NB_DTYPE_F32, -1, 1, 3, &b));
    TRY(nb_array_full(ctx, NB_DTYPE_I32, 0, NULL, 7, &steps));
    TRY(nb_tree_array(view, &lw));
    TRY(nb_tree_array(b, &lb));
    TRY(nb_tree_array(steps, &ls));
    TRY(nb_tree_fnref(ctx, (nb_fnptr)scale_cb, "scale", &act));
    TRY(nb_tree_string(ctx, "model-name", &name));
    TRY(nb_tree_null(ctx, &nul));
    TRY(nb_tree_dict(ctx, 3, (const char *[]){"weight", "bias", "frozen"},
                     (nb_tree *[]){lw, lb, nul}, &layer));
    TRY(nb_tree_list(ctx, 2, (nb_tree *[]){layer, layer}, &layers));
    TRY(nb_tree_dict(ctx, 4, (const char *[]){"layers", "act", "step", "name"},
                     (nb_tree *[]){layers, act, ls, name}, &model));
    /* A node with more than 16 children takes the heap path in the builder. */
    for (int i = 0; i < 20; i++) {
        TRY(nb_tree_int(ctx, i, &many[i]));
    }
    TRY(nb_tree_tuple(ctx, 20, many, &big));

    TRY(nb_tree_flatten(model, &leaves, &def));
    TRY(nb_tree_unflatten(def, leaves, &rebuilt));
    TRY(nb_tree_equal(model, rebuilt, &eq));
    TRY(nb_tree_map(model, scale_cb, NULL, 0, &mapped));
    TRY(nb_tree_partition(model, nb_tree_pred_is_inexact_array, NULL, &match, &rest));
    TRY(nb_tree_combine(2, (const nb_tree *const[]){match, rest}, &combined));
    TRY(nb_tree_diff(model, mapped, NB_TREE_DIFF_SIGNATURE, &differ, text, sizeof text, NULL));
    size_t need = 0;
    if (nb_tree_format(model, text, 16, &need) != NB_ERR_TRUNCATED || need < 100) {
        st = NB_ERR_INTERNAL;
        goto done;
    }
    sink = fopen("/dev/null", "w");
    if (sink != NULL) {
        TRY(nb_tree_fprint(model, sink));
        TRY(nb_tree_fprint_leaves(model, sink));
        TRY(nb_array_fprint(view, sink));
    }
    if (!eq || !differ) {
        fprintf(stderr, "scenario_trees: eq %d differ %d (%s)\n", eq, differ, text);
        st = NB_ERR_INTERNAL;
    }
done:
    if (sink != NULL) {
        fclose(sink);
    }
    for (int i = 0; i < 20; i++) {
        nb_tree_destroy(many[i]);
    }
    nb_tree_destroy(big);
    nb_tree_destroy(combined);
    nb_tree_destroy(rest);
    nb_tree_destroy(match);
    nb_tree_destroy(mapped);
    nb_tree_destroy(rebuilt);
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    nb_tree_destroy(model);
    nb_tree_destroy(layers);
    nb_tree_destroy(layer);
    nb_tree_destroy(nul);
    nb_tree_destroy(name);
    nb_tree_destroy(act);
    nb_tree_destroy(ls);
    nb_tree_destroy(lb);
    nb_tree_destroy(lw);
    nb_array_destroy(view);
    nb_array_destroy(steps);
    nb_array_destroy(b);
    nb_array_destroy(w);
    return st;
}

/* Array-only operations: copies, casts, constructors. */
static nb_status scenario_arrays(nb_ctx *ctx) {
    nb_status st = NB_OK;
    nb_array *a = NULL, *c = NULL, *d = NULL, *e = NULL, *f = NULL, *g = NULL;
    TRY(nb_array_eye(ctx, NB_DTYPE_F64, 4, 5, 1, &a));
    TRY(nb_array_copy(a, &c));
    TRY(nb_array_cast(c, NB_DTYPE_I64, &d));
    TRY(nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){3}, (int32_t[]){1, 2, 3}, &e));
    TRY(nb_array_ones(ctx, NB_DTYPE_BOOL, 2, (int64_t[]){2, 2}, &f));
    TRY(nb_array_scalar(ctx, NB_DTYPE_F32, 2.5, &g));
done:
    nb_array_destroy(g);
    nb_array_destroy(f);
    nb_array_destroy(e);
    nb_array_destroy(d);
    nb_array_destroy(c);
    nb_array_destroy(a);
    return st;
}

typedef nb_status (*scenario_fn)(nb_ctx *ctx);

/* Run fn with the k-th allocation (counted from the scenario's start) failing, for
 * k = 1, 2, ... until a run sees no injected failure. Returns the number of failure
 * points. */
static int run_with_faults(scenario_fn fn, bool fail_all_after) {
    int points = 0;
    for (int64_t k = 1; k < 100000; k++) {
        nbt_alloc st = {0};
        nb_ctx *ctx = nbt_ctx_with(&st);
        int64_t base_live = st.n_live;
        st.fail_at = st.n_calls + k;
        st.fail_all_after = fail_all_after;
        nb_status s = fn(ctx);
        bool injected = st.n_failed > 0;
        st.fail_at = 0;
        if (!injected) {
            NBT_OK(ctx, s);
            nbt_assert_no_live(ctx);
            nb_ctx_destroy(ctx);
            NBT_EQ_I64(st.n_live, 0);
            return points;
        }
        points++;
        if (s != NB_ERR_OOM) {
            fail_msg("allocation %lld failed (%s) but the scenario returned %s: %s", (long long)k,
                     fail_all_after ? "and all after" : "alone", nb_status_name(s),
                     nb_ctx_errmsg(ctx));
        }
        if (strstr(nb_ctx_errmsg(ctx), "out of memory") == NULL) {
            fail_msg("allocation %lld failed but the message does not say so: '%s'", (long long)k,
                     nb_ctx_errmsg(ctx));
        }
        nbt_assert_no_live(ctx);
        /* Only the context's own blocks (itself and its object slabs) may remain. */
        nb_ctx_stats cs;
        NBT_OK(ctx, nb_ctx_stats_get(ctx, &cs));
        if (cs.bytes_in_use != st.live_bytes) {
            fail_msg("allocation %lld: the context counts %zu bytes, the allocator %zu",
                     (long long)k, cs.bytes_in_use, st.live_bytes);
        }
        (void)base_live;
        /* The context still works: the same scenario now succeeds. */
        nb_ctx_clear_error(ctx);
        NBT_OK(ctx, fn(ctx));
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
        NBT_EQ_I64(st.n_live, 0);
        NBT_EQ_I64(st.live_bytes, 0);
    }
    fail_msg("scenario never completed");
    return points;
}

static void test_fault_trees_single(void **state) {
    (void)state;
    int points = run_with_faults(scenario_trees, false);
    print_message("scenario_trees: %d allocation failure points, each failing alone\n", points);
    NBT_TRUE(points >= 30);
}

static void test_fault_trees_all_after(void **state) {
    (void)state;
    int points = run_with_faults(scenario_trees, true);
    print_message("scenario_trees: %d failure points, failing every allocation from there\n",
                  points);
    NBT_TRUE(points >= 30);
}

static void test_fault_arrays(void **state) {
    (void)state;
    int points = run_with_faults(scenario_arrays, false);
    NBT_TRUE(points >= 6);
    points = run_with_faults(scenario_arrays, true);
    NBT_TRUE(points >= 6);
}

/* Context creation itself under allocation failure. */
static void test_fault_ctx_create(void **state) {
    (void)state;
    nbt_alloc st = {0};
    st.fail_at = 1;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.allocator = nbt_alloc_make(&st);
    nb_ctx *ctx = (nb_ctx *)&st;
    NBT_STATUS(NULL, NB_ERR_OOM, nb_ctx_create(&o, &ctx));
    NBT_TRUE(ctx == NULL);
    NBT_EQ_I64(st.n_live, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_ctx_create),
        cmocka_unit_test(test_fault_arrays),
        cmocka_unit_test(test_fault_trees_single),
        cmocka_unit_test(test_fault_trees_all_after),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
