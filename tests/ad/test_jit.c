/*
 * test_jit.c -- filtered jit: the cache, outputs, nested calls, trace accounting,
 * max_traces in both orders, donation, errors and allocation-failure injection.
 * The seeds' failures 1-3 are tests a, b and c here.
 */
#include "nbtest.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include <nabla/fn.h>
#include <nabla/trace.h>

/* ---- helpers ------------------------------------------------------------------------ */

static nb_tree *arr_leaf(nb_ctx *ctx, int64_t n, float start) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F32, start, start + (double)n, 1, &a));
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static nb_tree *tuple1(nb_ctx *ctx, nb_tree *a) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &a, &t));
    return t;
}

static nb_tree *tuple2(nb_ctx *ctx, nb_tree *a, nb_tree *b) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){a, b}, &t));
    return t;
}

static float out_f32(const nb_tree *out, const char *path, int64_t i) {
    const nb_tree *leaf = NULL;
    nb_status st = nb_tree_lookup(out, path, &leaf);
    if (st != NB_OK || nb_tree_get_array(leaf) == NULL) {
        fail_msg("no array at '%s'", path);
    }
    double v = 0;
    NBT_OK(nb_tree_ctx(out), nb_array_get_flat(nb_tree_get_array(leaf), i, &v));
    return (float)v;
}

static nb_fn_stats stats_of(const nb_fn *f) {
    nb_fn_stats s;
    NBT_OK(NULL, nb_fn_stats_get(f, &s));
    return s;
}

/* ---- bodies ------------------------------------------------------------------------- */

static nb_status body_bar(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_add(nb_get(tr, args, "[0]"), nb_scalar(tr, 3.0)), out);
}

/* foo(x) = bar(x) * 2, with bar called through whatever function self["bar"] names. */
typedef struct foo_cfg {
    nb_fn *bar;
} foo_cfg;

static nb_status body_foo(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *cfgt = NULL;
    nb_fnptr p = NULL;
    const char *name = NULL;
    /* The callee travels as a static fn leaf holding a foo_cfg pointer in its name slot's
     * place: here simply a static pointer through a fnref whose target we cast back. */
    if (nb_tree_lookup(args, "[1]", &cfgt) != NB_OK ||
        nb_tree_get_fnref(cfgt, &p, &name) != NB_OK) {
        return nb_trace_fail(tr, NB_ERR_INVALID, "foo: args[1] must be the callee");
    }
    nb_fn *bar = ((foo_cfg * (*)(void)) p)()->bar;
    nb_var *y = nb_apply1(tr, bar, nb_get(tr, args, "[0]"));
    return nb_return(nb_mul(y, nb_scalar(tr, 2.0)), out);
}

static foo_cfg g_cfg;
static foo_cfg *cfg_get(void) {
    return &g_cfg;
}

/* Outputs: a constant-folded value, an input passed through, a static value. */
static nb_status body_consts(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "x");
    nb_var *c = nb_add(nb_full(tr, NB_DTYPE_I32, 2, (int64_t[]){2, 3}, 4),
                       nb_scalar_typed(tr, NB_DTYPE_I32, 1));
    nb_var *f = nb_exp(nb_scalar_typed(tr, NB_DTYPE_F64, 0.0));
    nb_tree *tag = NULL;
    nb_status st = nb_tree_string(ctx, "tag-7", &tag);
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 4, (const char *[]){"folded", "one", "same", "tag"},
                          (nb_tree *[]){nb_leaf(c), nb_leaf(f), nb_leaf(x), tag}, out);
    }
    nb_tree_destroy(tag);
    return st;
}

static nb_status body_sum2(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_add(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]")), out);
}

/* y = x * self.scale (array) + self.offset (static int). */
static nb_status body_scaled(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    const nb_tree *off = NULL;
    int64_t k = 0;
    if (nb_tree_lookup(self, "offset", &off) != NB_OK || nb_tree_get_int(off, &k) != NB_OK) {
        return nb_trace_fail(tr, NB_ERR_INVALID, "scaled: self.offset must be an int");
    }
    nb_var *y = nb_mul(nb_get(tr, args, "[0]"), nb_get(tr, self, "scale"));
    return nb_return(nb_add(y, nb_scalar(tr, (double)k)), out);
}

static nb_fn *make_scaled(nb_ctx *ctx, float scale, int64_t offset) {
    nb_array *s = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 0, NULL, scale, &s));
    nb_tree *ls = NULL, *lo = NULL, *self = NULL;
    NBT_OK(ctx, nb_tree_array(s, &ls));
    NBT_OK(ctx, nb_tree_int(ctx, offset, &lo));
    NBT_OK(ctx,
           nb_tree_dict(ctx, 2, (const char *[]){"scale", "offset"}, (nb_tree *[]){ls, lo}, &self));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "scaled", body_scaled, self, &f));
    nb_tree_destroy(self);
    nb_tree_destroy(lo);
    nb_tree_destroy(ls);
    nb_array_destroy(s);
    return f;
}

/* A shape error three calls deep. */
static nb_status body_inner_bad(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *w = nb_full(tr, NB_DTYPE_F32, 1, (int64_t[]){5}, 1.0);
    return nb_return(nb_mul(x, w), out);
}

static nb_status body_outer_bad(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    nb_fn *inner = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "inner_layer", body_inner_bad, NULL, &inner);
    if (st != NB_OK) {
        return st;
    }
    nb_var *y = nb_apply1(tr, inner, nb_tanh(nb_get(tr, args, "[0]")));
    nb_fn_destroy(inner);
    y = nb_exp(y); /* ops after the error pass poison through */
    return nb_return(y, out);
}

/* ---- a: outputs are arrays, always ------------------------------------------------- */

static void test_a_nested_inline_and_folded_outputs(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *bar = NULL, *jbar = NULL, *foo = NULL, *jfoo = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "bar", body_bar, NULL, &bar));
    NBT_OK(ctx, nb_jit(bar, NULL, &jbar));
    NBT_OK(ctx, nb_fn_create(ctx, "foo", body_foo, NULL, &foo));
    NBT_OK(ctx, nb_jit(foo, NULL, &jfoo));
    g_cfg.bar = jbar;
    nb_tree *x = arr_leaf(ctx, 4, 1.0f), *callee = NULL;
    NBT_OK(ctx, nb_tree_fnref(ctx, (nb_fnptr)cfg_get, "cfg", &callee));
    nb_tree *args = tuple2(ctx, x, callee), *out = NULL;
    NBT_OK(ctx, nb_fn_call(jfoo, args, &out));
    for (int i = 0; i < 4; i++) {
        NBT_EQ_F64(out_f32(out, "", i), ((float)(i + 1) + 3.0f) * 2.0f);
    }
    nb_tree_destroy(out);

    /* Folded constants and a passed-through input come back as new arrays. */
    nb_fn *consts = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "consts", body_consts, NULL, &consts));
    nb_tree *xin = arr_leaf(ctx, 3, 0.0f), *dargs = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"x"}, &xin, &dargs));
    NBT_OK(ctx, nb_fn_call(consts, dargs, &out));
    const nb_tree *folded = nb_tree_get(out, "folded");
    nb_array *fa = nb_tree_get_array(folded);
    NBT_TRUE(fa != NULL);
    NBT_EQ_I64(nb_array_dtype(fa), NB_DTYPE_I32);
    NBT_EQ_I64(nb_array_rank(fa), 2);
    NBT_EQ_I64(nb_array_dim(fa, 0), 2);
    NBT_EQ_I64(nb_array_dim(fa, 1), 3);
    int64_t v = 0;
    NBT_OK(ctx, nb_array_get_i64(fa, (int64_t[]){1, 2}, &v));
    NBT_EQ_I64(v, 5);
    nb_array *one = nb_tree_get_array(nb_tree_get(out, "one"));
    NBT_EQ_I64(nb_array_dtype(one), NB_DTYPE_F64);
    NBT_EQ_I64(nb_array_rank(one), 0);
    double d = 0;
    NBT_OK(ctx, nb_array_get(one, NULL, &d));
    NBT_EQ_F64(d, 1.0);
    nb_array *same = nb_tree_get_array(nb_tree_get(out, "same"));
    nb_array *orig = nb_tree_get_array(xin);
    NBT_TRUE(same != orig); /* the caller's own copy */
    bool eq = false;
    NBT_OK(ctx, nb_array_identical(same, orig, &eq));
    NBT_TRUE(eq);
    NBT_OK(ctx, nb_array_set(same, (int64_t[]){0}, 99.0));
    NBT_OK(ctx, nb_array_get(orig, (int64_t[]){0}, &d));
    NBT_EQ_F64(d, 0.0);
    const char *tag = NULL;
    NBT_OK(ctx, nb_tree_get_string(nb_tree_get(out, "tag"), &tag));
    NBT_STREQ(tag, "tag-7");
    /* Again from the cache: a fresh array each time, the same values. */
    nb_tree *out2 = NULL;
    NBT_OK(ctx, nb_fn_call(consts, dargs, &out2));
    NBT_TRUE(nb_tree_get_array(nb_tree_get(out2, "folded")) != fa);
    NBT_OK(ctx, nb_tree_equal(nb_tree_get(out2, "folded"), folded, &eq));
    NBT_TRUE(eq);
    NBT_EQ_I64(stats_of(consts).n_traces, 1);
    NBT_EQ_I64(stats_of(consts).n_hits, 1);

    nb_tree_destroy(out2);
    nb_tree_destroy(out);
    nb_tree_destroy(dargs);
    nb_tree_destroy(xin);
    nb_fn_destroy(consts);
    nb_tree_destroy(args);
    nb_tree_destroy(callee);
    nb_tree_destroy(x);
    nb_fn_destroy(jfoo);
    nb_fn_destroy(foo);
    nb_fn_destroy(jbar);
    nb_fn_destroy(bar);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* inline_calls = false: a call to bar's own executable, the same numbers, one compile. */
static void test_call_not_inlined(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *bar = NULL, *jbar = NULL, *foo = NULL;
    nb_jit_opts o = nb_jit_opts_default();
    o.inline_calls = false;
    NBT_OK(ctx, nb_fn_create(ctx, "bar", body_bar, NULL, &bar));
    NBT_OK(ctx, nb_jit(bar, &o, &jbar));
    NBT_OK(ctx, nb_fn_create(ctx, "foo", body_foo, NULL, &foo));
    g_cfg.bar = jbar;
    nb_tree *x = arr_leaf(ctx, 5, -2.0f), *callee = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_fnref(ctx, (nb_fnptr)cfg_get, "cfg", &callee));
    nb_tree *args = tuple2(ctx, x, callee);
    char ir[4096];
    NBT_OK(ctx, nb_fn_format_ir(foo, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    NBT_TRUE(strstr(ir, "= call ") != NULL);
    NBT_TRUE(strstr(ir, "= call_output ") != NULL);
    NBT_OK(ctx, nb_fn_call(foo, args, &out));
    for (int i = 0; i < 5; i++) {
        NBT_EQ_F64(out_f32(out, "", i), ((float)(i - 2) + 3.0f) * 2.0f);
    }
    nb_tree_destroy(out);
    /* Traced once for the first call and once by format_ir? No: format_ir does not count. */
    NBT_EQ_I64(stats_of(jbar).n_traces, 1);
    /* A second caller reuses bar's executable. */
    nb_fn *foo2 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "foo2", body_foo, NULL, &foo2));
    nb_fn *jfoo2 = NULL;
    NBT_OK(ctx, nb_jit(foo2, NULL, &jfoo2));
    NBT_OK(ctx, nb_fn_call(jfoo2, args, &out));
    NBT_EQ_F64(out_f32(out, "", 0), 2.0f);
    NBT_EQ_I64(stats_of(jbar).n_traces, 1);
    NBT_TRUE(stats_of(jbar).n_hits >= 1);
    nb_tree_destroy(out);
    nb_fn_destroy(jfoo2);
    nb_fn_destroy(foo2);
    nb_tree_destroy(args);
    nb_tree_destroy(callee);
    nb_tree_destroy(x);
    nb_fn_destroy(foo);
    nb_fn_destroy(jbar);
    nb_fn_destroy(bar);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- b: max_traces on either side of jit -------------------------------------------- */

static void run_max_traces(nb_fn *f, nb_ctx *ctx, const char *order) {
    int64_t lens[3] = {2, 3, 4};
    for (int k = 0; k < 3; k++) {
        for (int rep = 0; rep < 3; rep++) {
            /* new data each time, same shape: never a retrace */
            nb_tree *a = arr_leaf(ctx, lens[k], (float)(rep * 10)), *b = arr_leaf(ctx, lens[k], 1);
            nb_tree *args = tuple2(ctx, a, b), *out = NULL;
            nb_status st = nb_fn_call(f, args, &out);
            if (k < 2) {
                if (st != NB_OK) {
                    fail_msg("%s: call %d/%d failed: %s", order, k, rep, nb_ctx_errmsg(ctx));
                }
                NBT_EQ_F64(out_f32(out, "", 1), (float)(rep * 10 + 1) + 2.0f);
            } else {
                if (st != NB_ERR_RETRACE) {
                    fail_msg("%s: the third shape gave %s, not ERR_RETRACE: %s", order,
                             nb_status_name(st), nb_ctx_errmsg(ctx));
                }
                NBT_TRUE(out == NULL);
                NBT_ERRMSG_HAS(ctx, "max_traces = 2");
                NBT_ERRMSG_HAS(ctx, "args[0]: f32[3] → f32[4]");
            }
            nb_tree_destroy(out);
            nb_tree_destroy(args);
            nb_tree_destroy(b);
            nb_tree_destroy(a);
        }
    }
}

/* The count a user reads is the number of times the body was traced, however the limit is
 * attached: calls with shapes 3, 4, 4, 3 under a limit of 1 trace the body once (the two
 * f32[4] calls are refused, the last f32[3] call is a cache hit), so the function called
 * reports 1 trace and 0 retraces in every order -- refused attempts are not traces. */
static int g_sq_traces;
static nb_status body_sumsq(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    g_sq_traces++;
    nb_var *x = nb_get(tr, args, "[0]");
    return nb_return(nb_sum(nb_mul(x, x), NULL, 0, false), out);
}

static void run_count(nb_ctx *ctx, nb_fn *called, const char *order) {
    g_sq_traces = 0;
    const int64_t lens[4] = {3, 4, 4, 3};
    const nb_status want[4] = {NB_OK, NB_ERR_RETRACE, NB_ERR_RETRACE, NB_OK};
    for (int k = 0; k < 4; k++) {
        nb_tree *a = arr_leaf(ctx, lens[k], 1.0f), *args = tuple1(ctx, a), *out = NULL;
        nb_status st = nb_fn_call(called, args, &out);
        if (st != want[k]) {
            fail_msg("%s: call %d gave %s: %s", order, k, nb_status_name(st), nb_ctx_errmsg(ctx));
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
        nb_tree_destroy(a);
    }
    nb_fn_stats s = stats_of(called);
    if (s.n_traces != 1 || s.n_retraces != 0 || g_sq_traces != 1 || s.n_calls != 4 ||
        s.n_hits != 1) {
        fail_msg("%s: traces %lld, retraces %lld, calls %lld, hits %lld, body traced %d times "
                 "(want 1, 0, 4, 1, 1)",
                 order, (long long)s.n_traces, (long long)s.n_retraces, (long long)s.n_calls,
                 (long long)s.n_hits, g_sq_traces);
    }
    nb_ctx_clear_cache(ctx);
}

static void test_b_max_traces_count_same_in_every_order(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *j = NULL, *mj = NULL, *m = NULL, *jm = NULL, *jo = NULL, *g = NULL,
          *jg = NULL, *vg = NULL, *mvg = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "sumsq", body_sumsq, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &j));
    NBT_OK(ctx, nb_max_traces(j, 1, &mj));
    run_count(ctx, mj, "max_traces(jit(f))");
    NBT_OK(ctx, nb_max_traces(f, 1, &m));
    NBT_OK(ctx, nb_jit(m, NULL, &jm));
    run_count(ctx, jm, "jit(max_traces(f))");
    nb_jit_opts o = nb_jit_opts_default();
    o.max_traces = 1;
    NBT_OK(ctx, nb_jit(f, &o, &jo));
    run_count(ctx, jo, "jit(f, max_traces=1)");
    /* with a transform between the limit and the function called */
    NBT_OK(ctx, nb_grad(m, NULL, &g));
    NBT_OK(ctx, nb_jit(g, NULL, &jg));
    run_count(ctx, jg, "jit(grad(max_traces(f)))");
    NBT_OK(ctx, nb_value_and_grad(f, NULL, &vg));
    NBT_OK(ctx, nb_max_traces(vg, 1, &mvg));
    run_count(ctx, mvg, "max_traces(value_and_grad(f))");
    nb_fn *all[] = {mvg, vg, jg, g, jo, jm, m, mj, j, f};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_fn_destroy(all[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_b_max_traces_both_orders(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *j = NULL, *mj = NULL, *m = NULL, *jm = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "sum2", body_sum2, NULL, &f));
    /* max_traces outside jit */
    NBT_OK(ctx, nb_jit(f, NULL, &j));
    NBT_OK(ctx, nb_max_traces(j, 2, &mj));
    run_max_traces(mj, ctx, "max_traces(jit(f))");
    NBT_EQ_I64(stats_of(mj).n_traces, 2); /* the refused third trace never happened */
    /* max_traces inside jit */
    nb_ctx_clear_cache(ctx);
    NBT_OK(ctx, nb_max_traces(f, 2, &m));
    NBT_OK(ctx, nb_jit(m, NULL, &jm));
    run_max_traces(jm, ctx, "jit(max_traces(f))");
    NBT_EQ_I64(stats_of(m).n_traces, 2);
    /* and as a jit option */
    nb_ctx_clear_cache(ctx);
    nb_jit_opts o = nb_jit_opts_default();
    o.max_traces = 2;
    nb_fn *jo = NULL;
    NBT_OK(ctx, nb_jit(f, &o, &jo));
    run_max_traces(jo, ctx, "jit(f, max_traces=2)");
    nb_fn_destroy(jo);
    nb_fn_destroy(jm);
    nb_fn_destroy(m);
    nb_fn_destroy(mj);
    nb_fn_destroy(j);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- c: equal functions share the cache; reasons name the leaf ---------------------- */

static void test_c_equal_functions_share_entries(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *x = arr_leaf(ctx, 3, 1.0f);
    nb_tree *args = tuple1(ctx, x), *out = NULL;
    nb_fn *f1 = make_scaled(ctx, 2.0f, 1);
    NBT_OK(ctx, nb_fn_call(f1, args, &out));
    NBT_EQ_F64(out_f32(out, "", 2), 3.0f * 2.0f + 1.0f);
    nb_tree_destroy(out);
    nb_fn_destroy(f1);
    /* Re-created from scratch with equal static data (and different array data): a hit. */
    nb_fn *f2 = make_scaled(ctx, 5.0f, 1);
    NBT_OK(ctx, nb_fn_call(f2, args, &out));
    NBT_EQ_F64(out_f32(out, "", 2), 3.0f * 5.0f + 1.0f);
    nb_tree_destroy(out);
    nb_fn_stats s = stats_of(f2);
    NBT_EQ_I64(s.n_traces, 1);
    NBT_EQ_I64(s.n_hits, 1);
    NBT_EQ_I64(s.n_calls, 2);
    /* A different static value is another identity: its first trace. */
    nb_fn *f3 = make_scaled(ctx, 5.0f, 2);
    NBT_OK(ctx, nb_fn_call(f3, args, &out));
    NBT_EQ_F64(out_f32(out, "", 0), 1.0f * 5.0f + 2.0f);
    nb_tree_destroy(out);
    NBT_EQ_I64(stats_of(f3).n_traces, 1);
    NBT_EQ_I64(stats_of(f2).n_traces, 1);
    nb_fn_destroy(f3);
    nb_fn_destroy(f2);
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Retrace reasons: a static value, a null slot gaining an array, a dict path, a bound array. */
static nb_status body_opt(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *w1 = nb_tree_get(nb_tree_get(nb_tree_get(args, "opt_state"), "mu"), "w1");
    nb_var *x = nb_get(tr, args, "batch.x");
    if (w1 != NULL && nb_tree_kind_of(w1) != NB_TREE_KIND_NULL) {
        x = nb_add(x, nb_sum(nb_var_of(tr, w1), NULL, 0, false));
    }
    return nb_return(x, out);
}

static nb_tree *opt_args(nb_ctx *ctx, int64_t batch, bool with_mu, int64_t step) {
    nb_tree *x = arr_leaf(ctx, batch, 0), *bx = NULL, *mu = NULL, *w1 = NULL, *os = NULL,
            *st = NULL, *a = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"x"}, &x, &bx));
    if (with_mu) {
        w1 = arr_leaf(ctx, 4, 0);
    } else {
        NBT_OK(ctx, nb_tree_null(ctx, &w1));
    }
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"w1"}, &w1, &mu));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"mu"}, &mu, &os));
    NBT_OK(ctx, nb_tree_int(ctx, step, &st));
    NBT_OK(ctx, nb_tree_dict(ctx, 3, (const char *[]){"batch", "opt_state", "step"},
                             (nb_tree *[]){bx, os, st}, &a));
    nb_tree_destroy(x);
    nb_tree_destroy(bx);
    nb_tree_destroy(w1);
    nb_tree_destroy(mu);
    nb_tree_destroy(os);
    nb_tree_destroy(st);
    return a;
}

static void test_retrace_reasons(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "step", body_opt, NULL, &f));
    struct {
        int64_t batch;
        bool mu;
        int64_t step;
        const char *reason;
    } calls[] = {
        {8, false, 0, NULL},
        {8, true, 0, "opt_state.mu.w1: was null, now f32[4]"},
        {6, true, 0, "batch.x: f32[8] → f32[6]"},
        {6, true, 3, "step: static 0 → 3"},
        {6, true, 3, NULL}, /* a hit */
    };
    int64_t retraces = 0;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        nb_tree *a = opt_args(ctx, calls[i].batch, calls[i].mu, calls[i].step), *out = NULL;
        if (nb_fn_call(f, a, &out) != NB_OK) {
            if (strstr(nb_ctx_errmsg(ctx), "nb_sum") == NULL) {
                fail_msg("call %zu failed: %s", i, nb_ctx_errmsg(ctx));
            }
        }
        nb_tree_destroy(out);
        nb_tree_destroy(a);
        if (calls[i].reason != NULL) {
            char buf[512];
            NBT_OK(ctx, nb_fn_retrace_reason(f, retraces++, buf, sizeof buf, NULL));
            NBT_STREQ(buf, calls[i].reason);
        }
    }
    nb_fn_stats s = stats_of(f);
    NBT_EQ_I64(s.n_retraces, 3);
    NBT_EQ_I64(s.n_traces, 4);
    NBT_EQ_I64(s.n_hits, 1);
    char buf[64];
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_fn_retrace_reason(f, 3, buf, sizeof buf, NULL));
    /* A bound array changing shape is named under self. */
    nb_fn *g1 = make_scaled(ctx, 1.0f, 0);
    nb_tree *x = arr_leaf(ctx, 2, 0), *args = tuple1(ctx, x), *out = NULL;
    NBT_OK(ctx, nb_fn_call(g1, args, &out));
    nb_tree_destroy(out);
    nb_array *s2 = NULL;
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, &s2));
    nb_tree *ls = NULL, *lo = NULL, *self = NULL;
    NBT_OK(ctx, nb_tree_array(s2, &ls));
    NBT_OK(ctx, nb_tree_int(ctx, 0, &lo));
    NBT_OK(ctx,
           nb_tree_dict(ctx, 2, (const char *[]){"scale", "offset"}, (nb_tree *[]){ls, lo}, &self));
    nb_fn *g2 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "scaled", body_scaled, self, &g2));
    NBT_OK(ctx, nb_fn_call(g2, args, &out));
    NBT_OK(ctx, nb_fn_retrace_reason(g2, 0, buf, sizeof buf, NULL));
    NBT_STREQ(buf, "self.scale: f32[] → f32[2]");
    nb_tree_destroy(out);
    nb_fn_destroy(g2);
    nb_tree_destroy(self);
    nb_tree_destroy(lo);
    nb_tree_destroy(ls);
    nb_array_destroy(s2);
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nb_fn_destroy(g1);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- errors ------------------------------------------------------------------------- */

static void test_error_deep_in_user_code(void **state) {
    (void)state;
    nbt_alloc al = {0};
    nb_ctx *ctx = nbt_ctx_with(&al);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "mlp_loss", body_outer_bad, NULL, &f));
    nb_tree *x = arr_leaf(ctx, 3, 0), *args = tuple1(ctx, x), *out = NULL;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_fn_call(f, args, &out));
    NBT_TRUE(out == NULL);
    const char *m = nb_ctx_errmsg(ctx);
    NBT_TRUE(strstr(m, "nb_mul") == m); /* one message, starting with the op */
    NBT_ERRMSG_HAS(ctx, "f32[3] and f32[5]");
    NBT_ERRMSG_HAS(ctx, "(in 'inner_layer')");
    if (strstr(m, "nb_exp:") != NULL) {
        fail_msg("a later op added to the message: %s", m);
    }
    /* The error is not cached: fixing the input shape works. */
    nb_tree *x5 = arr_leaf(ctx, 5, 0), *args5 = tuple1(ctx, x5);
    NBT_OK(ctx, nb_fn_call(f, args5, &out));
    nb_tree_destroy(out);
    nb_tree_destroy(args5);
    nb_tree_destroy(x5);
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
    NBT_EQ_I64(al.n_live, 0);
}

/* The style guide's example message, with the leaf paths of the operands. */
static nb_status body_mm_paths(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_var *x = nb_get(tr, args, "batch.x");
    nb_var *w = nb_get(tr, self, "layers[1].weight");
    return nb_return(nb_matmul(x, w), out);
}

static void test_error_names_leaf_paths(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *x = nbt_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){128, 784});
    nb_tree *w = nbt_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){256, 784});
    nb_tree *bx = NULL, *args = NULL, *l0 = NULL, *l1 = NULL, *layers = NULL, *self = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"x"}, &x, &bx));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"batch"}, &bx, &args));
    NBT_OK(ctx, nb_tree_null(ctx, &l0));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"weight"}, &w, &l1));
    NBT_OK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){l0, l1}, &layers));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"layers"}, &layers, &self));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "mlp_loss", body_mm_paths, self, &f));
    nb_tree *out = NULL;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_fn_call(f, args, &out));
    NBT_STREQ(nb_ctx_errmsg(ctx),
              "nb_matmul: f32[128,784] @ f32[256,784]: inner dims 784 != 256 (did you mean to "
              "transpose the second operand?) (in 'mlp_loss'); operands: batch.x, "
              "self.layers[1].weight");
    nb_fn_destroy(f);
    nb_tree *trees[] = {self, layers, l1, l0, args, bx, w, x};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static nb_status body_no_msg(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)tr;
    (void)self;
    (void)args;
    (void)out;
    return NB_ERR_INVALID;
}

static void test_misuse(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    nb_tree *out = NULL;
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_fn_create(ctx, "x", NULL, NULL, &f));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_fn_create(NULL, "x", body_bar, NULL, &f));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_fn_call(NULL, NULL, &out));
    NBT_OK(ctx, nb_fn_create(ctx, "nomsg", body_no_msg, NULL, &f));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_fn_call(f, NULL, &out));
    NBT_ERRMSG_HAS(ctx, "args is a NULL");
    nb_tree *empty = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(f, empty, &out));
    NBT_ERRMSG_HAS(ctx, "without recording a message");
    NBT_ERRMSG_HAS(ctx, "(in 'nomsg')");
    nb_fn *w = NULL;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_max_traces(f, 0, &w));
    NBT_TRUE(w == NULL);
    nb_fn_destroy(f);
    nb_fn_destroy(f); /* destroyed twice: recorded, not a crash */
    NBT_EQ_I64(nb_ctx_errcode(ctx), NB_ERR_MISUSE);
    nbt_expect_double_destroys(1);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_fn_call(f, empty, &out));
    nb_tree_destroy(empty);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- donation ----------------------------------------------------------------------- */

static nb_status body_update(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *p = nb_get(tr, args, "params"), *g = nb_get(tr, args, "grads");
    return nb_return(nb_sub(p, nb_mul(g, nb_scalar(tr, 0.5))), out);
}

static void test_donate(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "update", body_update, NULL, &f));
    nb_tree *p = arr_leaf(ctx, 4, 10.0f), *g = arr_leaf(ctx, 4, 2.0f), *args = NULL;
    NBT_OK(ctx,
           nb_tree_dict(ctx, 2, (const char *[]){"params", "grads"}, (nb_tree *[]){p, g}, &args));
    nb_tree *yes = NULL, *no = NULL, *spec = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &no));
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"params", "grads"}, (nb_tree *[]){yes, no},
                             &spec));
    nb_call_opts o = nb_call_opts_default();
    o.donate = spec;
    for (int step = 0; step < 3; step++) {
        NBT_OK(ctx, nb_fn_call_ex(f, args, &o, &out));
        /* the output is the donated params array itself, updated in place */
        NBT_TRUE(nb_tree_get_array(out) == nb_tree_get_array(p));
        nb_tree_destroy(out);
    }
    double v = 0;
    NBT_OK(ctx, nb_array_get(nb_tree_get_array(p), (int64_t[]){1}, &v));
    NBT_EQ_F64(v, 11.0 - 3 * 0.5 * 3.0);
    NBT_OK(ctx, nb_array_get(nb_tree_get_array(g), (int64_t[]){1}, &v));
    NBT_EQ_F64(v, 3.0);
    /* Without donation the inputs are untouched. */
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    NBT_TRUE(nb_tree_get_array(out) != nb_tree_get_array(p));
    nb_tree_destroy(out);
    /* A donate tree that does not match args. */
    nb_tree *bad = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 1, &yes, &bad));
    o.donate = bad;
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call_ex(f, args, &o, &out));
    NBT_ERRMSG_HAS(ctx, "donate");
    nb_tree_destroy(bad);
    nb_tree_destroy(spec);
    nb_tree_destroy(no);
    nb_tree_destroy(yes);
    nb_tree_destroy(args);
    nb_tree_destroy(g);
    nb_tree_destroy(p);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Tied weights: the same array (or a reshaped view of it) at two argument leaves, both
 * donated. Each buffer takes one output; the other output is a new array -- never one array
 * returned for both. Body (a + 1, b * 2) on x = [1, 2, 3, 4]. */
static nb_status body_tied(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *a = nb_get(tr, args, "[0]"), *b = nb_get(tr, args, "[1]");
    nb_tree *r = NULL;
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 2,
                                 (nb_tree *[]){nb_leaf(nb_add(a, nb_scalar(tr, 1.0))),
                                               nb_leaf(nb_mul(b, nb_scalar(tr, 2.0)))},
                                 &r);
    *out = r;
    return st;
}

static void check_tied(nb_ctx *ctx, nb_fn *f, nb_tree *args, const nb_tree *spec, int round) {
    nb_call_opts o = nb_call_opts_default();
    o.donate = spec;
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_fn_call_ex(f, args, &o, &out));
    const nb_array *y0 = nb_tree_get_array(nb_tree_child(out, 0));
    const nb_array *y1 = nb_tree_get_array(nb_tree_child(out, 1));
    NBT_TRUE(y0 != y1);
    for (int64_t i = 0; i < 4; i++) {
        double v0 = 0, v1 = 0;
        NBT_OK(ctx, nb_array_get(y0, (int64_t[]){i}, &v0));
        NBT_OK(ctx, nb_array_get(y1, (int64_t[]){i}, &v1));
        if (v0 != (double)(i + 1) + 1.0 || v1 != (double)(i + 1) * 2.0) {
            fail_msg("round %d: element %lld: a+1 = %g, b*2 = %g (want %g, %g)", round,
                     (long long)i, v0, v1, (double)(i + 2), (double)(2 * i + 2));
        }
    }
    nb_tree_destroy(out);
}

static void test_donate_same_array_twice(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "tied", body_tied, NULL, &f));
    nb_tree *yes = NULL, *both = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){yes, yes}, &both));
    for (int round = 0; round < 4; round++) {
        /* fresh x = [1, 2, 3, 4] each round (a donated array is consumed) */
        nb_tree *x = arr_leaf(ctx, 4, 1.0f), *args = NULL;
        nb_tree *second = x;
        nb_array *view = NULL;
        nb_tree *vleaf = NULL;
        if (round >= 2) { /* a reshaped view shares x's buffer */
            NBT_OK(ctx, nb_array_reshape(nb_tree_get_array(x), 1, (int64_t[]){4}, &view));
            NBT_OK(ctx, nb_tree_array(view, &vleaf));
            second = vleaf;
        }
        NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){x, second}, &args));
        check_tied(ctx, f, args, round % 2 ? both : yes, round);
        nb_tree_destroy(args);
        nb_tree_destroy(vleaf);
        nb_array_destroy(view);
        nb_tree_destroy(x);
    }
    /* Two different arrays: both still donated in place. */
    nb_tree *x = arr_leaf(ctx, 4, 1.0f), *z = arr_leaf(ctx, 4, 1.0f), *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){x, z}, &args));
    nb_call_opts o = nb_call_opts_default();
    o.donate = yes;
    NBT_OK(ctx, nb_fn_call_ex(f, args, &o, &out));
    NBT_TRUE(nb_tree_get_array(nb_tree_child(out, 0)) == nb_tree_get_array(x));
    NBT_TRUE(nb_tree_get_array(nb_tree_child(out, 1)) == nb_tree_get_array(z));
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_tree_destroy(z);
    nb_tree_destroy(x);
    nb_tree_destroy(both);
    nb_tree_destroy(yes);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Two dynamic_update_slices of one donated input, and a later read of it: the executor
 * moves an update into an input after that input's other readers (to write it in place)
 * -- each update at most once, or the two would pass each other for ever (fuzz_programs
 * found the hang). args (x f32[4]) -> (x with [0] = 10, x with [1] = 20, sum(x)). */
static nb_status body_two_updates(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *i0 = nb_scalar_typed(tr, NB_DTYPE_I32, 0), *i1 = nb_scalar_typed(tr, NB_DTYPE_I32, 1);
    nb_var *a = nb_dynamic_update_slice(x, nb_full(tr, NB_DTYPE_F32, 1, (int64_t[]){1}, 10.0), &i0);
    nb_var *b = nb_dynamic_update_slice(x, nb_full(tr, NB_DTYPE_F32, 1, (int64_t[]){1}, 20.0), &i1);
    nb_var *s = nb_sum(x, NULL, 0, false);
    return nb_tree_tuple(nb_trace_ctx(tr), 3, (nb_tree *[]){nb_leaf(a), nb_leaf(b), nb_leaf(s)},
                         out);
}

static void test_donate_two_updates(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "two_updates", body_two_updates, NULL, &f));
    nb_tree *yes = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
    for (int round = 0; round < 3; round++) {
        nb_tree *x = arr_leaf(ctx, 4, 1.0f), *args = tuple1(ctx, x), *out = NULL;
        nb_call_opts o = nb_call_opts_default();
        o.donate = round > 0 ? yes : NULL;
        NBT_OK(ctx, nb_fn_call_ex(f, args, &o, &out));
        const float *a = nb_array_data(nb_tree_get_array(nb_tree_child(out, 0)));
        const float *b = nb_array_data(nb_tree_get_array(nb_tree_child(out, 1)));
        const float *s = nb_array_data(nb_tree_get_array(nb_tree_child(out, 2)));
        const float wa[4] = {10, 2, 3, 4}, wb[4] = {1, 20, 3, 4};
        for (int i = 0; i < 4; i++) {
            NBT_EQ_F64(a[i], wa[i]);
            NBT_EQ_F64(b[i], wb[i]);
        }
        NBT_EQ_F64(s[0], 10.0);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
        nb_tree_destroy(x);
    }
    nb_tree_destroy(yes);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- debug_nans / debug_infs ------------------------------------------------------------- */

/* loss(x) = sum(log(x - 1)): x = [3, 0.5, 2] makes log(-0.5) = NaN at element 1. */
static nb_status body_lognan(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    return nb_return(nb_sum(nb_log(nb_sub(x, nb_scalar(tr, 1.0))), NULL, 0, false), out);
}

/* (a / b, 1 / a): integer division and a float reciprocal */
static nb_status body_divs(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *a = nb_get(tr, args, "[0]"), *b = nb_get(tr, args, "[1]");
    nb_var *fa = nb_cast(a, NB_DTYPE_F64);
    return nb_tree_tuple(
        nb_trace_ctx(tr), 2,
        (nb_tree *[]){nb_leaf(nb_div(a, b)), nb_leaf(nb_div(nb_scalar(tr, 1.0), fa))}, out);
}

/* a loop whose body takes the log of c - 5 (c counts up from 0: NaN at once) */
static nb_status body_loglog(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *c = nb_get(tr, args, "[1]");
    return nb_return(nb_add(c, nb_exp(nb_log(nb_sub(c, nb_scalar(tr, 5.0))))), out);
}

static nb_status body_loop_nan(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_fn *b = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "loop_body", body_loglog, NULL, &b);
    const nb_tree *r = st == NB_OK ? nb_fori_loop(tr, 0, 3, b, nb_tree_child(args, 0), NULL) : NULL;
    nb_fn_destroy(b);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

static nb_tree *vec_leaf(nb_ctx *ctx, nb_dtype dt, int64_t n, const double *v) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, 1, &n, &a));
    for (int64_t i = 0; i < n; i++) {
        NBT_OK(ctx, nb_array_set(a, &i, v[i]));
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static void test_debug_nans(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_jit_opts dbg = nb_jit_opts_default();
    dbg.debug_nans = true;
    nb_fn *f = NULL, *jf = NULL, *jd = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "loss", body_lognan, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &jf));
    NBT_OK(ctx, nb_jit(f, &dbg, &jd));
    nb_tree *x = vec_leaf(ctx, NB_DTYPE_F32, 3, (double[]){3, 0.5, 2}), *args = tuple1(ctx, x);
    nb_tree *out = NULL;
    /* off: the NaN comes back, nothing is checked */
    NBT_OK(ctx, nb_fn_call(jf, args, &out));
    double v = 0;
    NBT_OK(ctx, nb_array_get(nb_tree_get_array(out), NULL, &v));
    NBT_TRUE(isnan(v));
    nb_tree_destroy(out);
    /* on: the first op making a NaN, where, and what it depends on */
    NBT_STATUS(ctx, NB_ERR_RUNTIME, nb_fn_call(jd, args, &out));
    NBT_TRUE(out == NULL);
    NBT_ERRMSG_HAS(ctx, "debug_nans: NaN in f32[3] = log(f32[3]) at element [1] (1 element)");
    NBT_ERRMSG_HAS(ctx, "in the traced IR of 'loss'");
    NBT_ERRMSG_HAS(ctx, "it depends on args[0]");
    /* the %N named is the traced IR's log */
    const char *m = strstr(nb_ctx_errmsg(ctx), "), %");
    NBT_TRUE(m != NULL);
    int id = atoi(m + 4);
    char ir[4096], want[32];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_TRACED, ir, sizeof ir, NULL));
    snprintf(want, sizeof want, "%%%d: f32[3] = log", id);
    if (strstr(ir, want) == NULL) {
        fail_msg("'%s' not in the traced IR (message: %s):\n%s", want, nb_ctx_errmsg(ctx), ir);
    }
    /* fine data: no error */
    nb_tree *x2 = vec_leaf(ctx, NB_DTYPE_F32, 3, (double[]){3, 1.5, 2}), *args2 = tuple1(ctx, x2);
    NBT_OK(ctx, nb_fn_call(jd, args2, &out));
    nb_tree_destroy(out);

    /* an integer division by zero, and an infinity (debug_infs only) */
    nb_fn *g = NULL, *jg = NULL, *ji = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "divs", body_divs, NULL, &g));
    NBT_OK(ctx, nb_jit(g, &dbg, &jg));
    nb_jit_opts inf = nb_jit_opts_default();
    inf.debug_infs = true;
    NBT_OK(ctx, nb_jit(g, &inf, &ji));
    nb_tree *a = vec_leaf(ctx, NB_DTYPE_I32, 3, (double[]){6, 0, 9});
    nb_tree *b = vec_leaf(ctx, NB_DTYPE_I32, 3, (double[]){2, 3, 0});
    nb_tree *ab = tuple2(ctx, a, b);
    NBT_STATUS(ctx, NB_ERR_RUNTIME, nb_fn_call(jg, ab, &out));
    NBT_ERRMSG_HAS(ctx, "an integer division by zero in i32[3] = div(i32[3], i32[3]) at divisor "
                        "element [2]");
    NBT_ERRMSG_HAS(ctx, "it depends on args[0], args[1]");
    NBT_STATUS(ctx, NB_ERR_RUNTIME, nb_fn_call(ji, ab, &out));
    NBT_ERRMSG_HAS(ctx, "debug_infs: an infinity in f64[3] = div(f64[], f64[3]) at element [1]");

    /* inside a loop body */
    nb_fn *h = NULL, *jh = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "outer", body_loop_nan, NULL, &h));
    NBT_OK(ctx, nb_jit(h, &dbg, &jh));
    nb_tree *c0 = vec_leaf(ctx, NB_DTYPE_F64, 2, (double[]){0, 1}), *cargs = tuple1(ctx, c0);
    NBT_STATUS(ctx, NB_ERR_RUNTIME, nb_fn_call(jh, cargs, &out));
    NBT_ERRMSG_HAS(ctx, "= log(f64[2]) at element [0] (2 elements)");
    NBT_ERRMSG_HAS(ctx, "of 'loop_body'");
    /* the same loop body run by a function without checks: its own executable */
    nb_fn *jh0 = NULL;
    NBT_OK(ctx, nb_jit(h, NULL, &jh0));
    NBT_OK(ctx, nb_fn_call(jh0, cargs, &out));
    nb_tree_destroy(out);

    nb_tree *trees[] = {cargs, c0, ab, b, a, args2, x2, args, x};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_fn *fns[] = {jh0, jh, h, ji, jg, g, jd, jf, f};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        nb_fn_destroy(fns[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- nb_debug_print ----------------------------------------------------------------------- */

static char g_log[4096];
static int g_log_lines;

static void log_collect(void *ud, nb_log_level level, const char *msg) {
    (void)ud;
    if (level == NB_LOG_LEVEL_INFO) {
        size_t n = strlen(g_log);
        snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
        g_log_lines++;
    }
}

/* y = 2x printed as "twice", then an unused print of x ("x, unused"), then sum(y) */
static nb_status body_prints(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *y = nb_debug_print(nb_mul(x, nb_scalar(tr, 2.0)), "twice");
    (void)nb_debug_print(x, "x, unused");
    return nb_return(nb_sum(y, NULL, 0, false), out);
}

static nb_status body_count_print(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_var *c = nb_debug_print(nb_get(tr, args, "[1]"), "step");
    return nb_return(nb_add(c, nb_scalar(tr, 1.0)), out);
}

static nb_status body_loop_prints(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_fn *b = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "count", body_count_print, NULL, &b);
    const nb_tree *r = st == NB_OK ? nb_fori_loop(tr, 0, 3, b, nb_tree_child(args, 0), NULL) : NULL;
    nb_fn_destroy(b);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

/* sum of body_count_print's carry after 3 steps of a bounded (self: true) or checkpointed
 * loop */
static nb_status body_loop_prints_sum(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                      nb_tree **out) {
    bool bounded = false;
    nb_tree_get_bool(self, &bounded);
    nb_fn *b = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "count", body_count_print, NULL, &b);
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = bounded ? NB_LOOP_BOUNDED : NB_LOOP_CHECKPOINTED;
    o.max_steps = 3;
    o.checkpoints = 1;
    const nb_tree *r = st == NB_OK ? nb_fori_loop(tr, 0, 3, b, nb_tree_child(args, 0), &o) : NULL;
    nb_fn_destroy(b);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    return nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out);
}

static void test_debug_print(void **state) {
    (void)state;
    nb_ctx_opts o = nb_ctx_opts_default();
    o.log = log_collect;
    o.log_level = NB_LOG_LEVEL_ERROR; /* prints come through whatever the level */
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    nb_fn *f = NULL, *g = NULL, *h = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "prints", body_prints, NULL, &f));
    nb_tree *x = vec_leaf(ctx, NB_DTYPE_F32, 3, (double[]){1, 2, 3}), *args = tuple1(ctx, x);
    nb_tree *out = NULL;
    g_log[0] = '\0';
    g_log_lines = 0;
    for (int call = 0; call < 2; call++) { /* printed at every run, not at trace time */
        NBT_OK(ctx, nb_fn_call(f, args, &out));
        nb_tree_destroy(out);
    }
    const char *want = "twice: array([2., 4., 6.], dtype=float32)\n"
                       "x, unused: array([1., 2., 3.], dtype=float32)\n"
                       "twice: array([2., 4., 6.], dtype=float32)\n"
                       "x, unused: array([1., 2., 3.], dtype=float32)\n";
    if (strcmp(g_log, want) != 0) {
        fail_msg("printed:\n%s\nwanted:\n%s", g_log, want);
    }
    /* under grad: the forward values print once per call, the gradient is unchanged */
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    g_log[0] = '\0';
    NBT_OK(ctx, nb_fn_call(g, args, &out));
    NBT_EQ_F64(out_f32(out, "", 1), 2.0f);
    NBT_TRUE(strstr(g_log, "twice: array([2., 4., 6.], dtype=float32)") != NULL);
    nb_tree_destroy(out);
    /* inside a loop: every step, in order */
    NBT_OK(ctx, nb_fn_create(ctx, "loop", body_loop_prints, NULL, &h));
    nb_tree *c0 = vec_leaf(ctx, NB_DTYPE_F64, 1, (double[]){10}), *cargs = tuple1(ctx, c0);
    g_log[0] = '\0';
    NBT_OK(ctx, nb_fn_call(h, cargs, &out));
    nb_tree_destroy(out);
    const char *want2 = "step: array([10.])\nstep: array([11.])\nstep: array([12.])\n";
    if (strcmp(g_log, want2) != 0) {
        fail_msg("printed:\n%s\nwanted:\n%s", g_log, want2);
    }
    /* the gradient through a bounded loop: its taped forward run prints every step, once; the
     * reverse sweep (which reads the tapes) and the look at the body that picks its stored
     * values (a dead trace) print nothing. A checkpointed reversal prints again the steps it
     * runs again (as a recomputation under JAX's remat): 3 steps with 1 checkpoint run 6 */
    for (int bounded = 1; bounded >= 0; bounded--) {
        nb_tree *flag = NULL;
        nb_fn *ls = NULL, *gl = NULL;
        NBT_OK(ctx, nb_tree_bool(ctx, bounded == 1, &flag));
        NBT_OK(ctx, nb_fn_create(ctx, "loop_sum", body_loop_prints_sum, flag, &ls));
        NBT_OK(ctx, nb_grad(ls, NULL, &gl));
        g_log[0] = '\0';
        NBT_OK(ctx, nb_fn_call(gl, cargs, &out));
        NBT_EQ_F64(out_f32(out, "", 0), 1.0f);
        nb_tree_destroy(out);
        printf("grad through a %s loop printed:\n%s", bounded ? "bounded" : "checkpointed", g_log);
        if (bounded && strcmp(g_log, want2) != 0) {
            fail_msg("printed:\n%s\nwanted:\n%s", g_log, want2);
        }
        int lines = 0;
        for (const char *p = g_log; (p = strchr(p, '\n')) != NULL; p++) {
            lines++;
        }
        assert_int_equal(lines, bounded ? 3 : 6);
        nb_tree_destroy(flag);
        nb_fn_destroy(gl);
        nb_fn_destroy(ls);
    }
    nb_tree *trees[] = {cargs, c0, args, x};
    for (int i = 0; i < 4; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_fn_destroy(h);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_ctx_destroy(ctx);
}

/* ---- debug_retrace: a body that reads a C global ------------------------------------------ */

static double g_scale = 2.0; /* read by the body: compiled in at the first trace */

static nb_status body_global(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    return nb_return(nb_mul(nb_get(tr, args, "[0]"), nb_scalar(tr, g_scale)), out);
}

static void test_debug_retrace(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *plain = NULL, *checked = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "scaled", body_global, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &plain));
    nb_jit_opts o = nb_jit_opts_default();
    o.debug_retrace = true;
    NBT_OK(ctx, nb_jit(f, &o, &checked));
    nb_tree *x = arr_leaf(ctx, 3, 1.0f), *args = tuple1(ctx, x), *out = NULL;
    g_scale = 2.0;
    NBT_OK(ctx, nb_fn_call(plain, args, &out));
    nb_tree_destroy(out);
    NBT_OK(ctx, nb_fn_call(checked, args, &out));
    NBT_EQ_F64(out_f32(out, "", 2), 6.0f);
    nb_tree_destroy(out);
    NBT_OK(ctx, nb_fn_call(checked, args, &out)); /* unchanged: the same IR, a hit */
    nb_tree_destroy(out);
    g_scale = 3.0;
    /* the rule: the compiled code keeps the value it was traced with ... */
    NBT_OK(ctx, nb_fn_call(plain, args, &out));
    NBT_EQ_F64(out_f32(out, "", 2), 6.0f);
    nb_tree_destroy(out);
    /* ... which debug_retrace catches */
    NBT_STATUS(ctx, NB_ERR_RUNTIME, nb_fn_call(checked, args, &out));
    NBT_TRUE(out == NULL);
    NBT_ERRMSG_HAS(ctx, "debug_retrace: 'scaled' traced again gives another IR");
    NBT_ERRMSG_HAS(ctx, "value=2");
    NBT_ERRMSG_HAS(ctx, "value=3");
    NBT_ERRMSG_HAS(ctx, "a C global");
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nb_fn_destroy(checked);
    nb_fn_destroy(plain);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- one context, two threads ----------------------------------------------------------- */

/* Thread A's body, while tracing, lets thread B try a call on the same context and waits
 * until it has: B must be refused (NB_ERR_MISUSE naming the function), never run beside A
 * (which gave wrong bits silently). */
static pthread_mutex_t g_two_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_two_cv = PTHREAD_COND_INITIALIZER;
static int g_two_phase; /* 1: A is inside its call; 2: B has tried */
static nb_status g_two_b_status;
static char g_two_b_msg[512];

static nb_status body_two(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    pthread_mutex_lock(&g_two_mu);
    g_two_phase = 1;
    pthread_cond_broadcast(&g_two_cv);
    while (g_two_phase != 2) {
        pthread_cond_wait(&g_two_cv, &g_two_mu);
    }
    pthread_mutex_unlock(&g_two_mu);
    return nb_return(nb_mul(nb_get(tr, args, "[0]"), nb_scalar(tr, 2.0)), out);
}

typedef struct two_arg {
    nb_ctx *ctx;
    nb_fn *f;
    nb_tree *args;
} two_arg;

static void *thread_b(void *p) {
    two_arg *a = p;
    pthread_mutex_lock(&g_two_mu);
    while (g_two_phase != 1) {
        pthread_cond_wait(&g_two_cv, &g_two_mu);
    }
    pthread_mutex_unlock(&g_two_mu);
    nb_tree *out = NULL;
    g_two_b_status = nb_fn_call(a->f, a->args, &out);
    snprintf(g_two_b_msg, sizeof g_two_b_msg, "%s", nb_ctx_errmsg(a->ctx));
    nb_tree_destroy(out);
    pthread_mutex_lock(&g_two_mu);
    g_two_phase = 2;
    pthread_cond_broadcast(&g_two_cv);
    pthread_mutex_unlock(&g_two_mu);
    return NULL;
}

static void test_context_two_threads(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "two", body_two, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "sum2", body_sum2, NULL, &g));
    nb_tree *x = arr_leaf(ctx, 4, 1.0f), *args = tuple1(ctx, x), *args2 = tuple2(ctx, x, x);
    two_arg b = {ctx, g, args2};
    g_two_phase = 0;
    pthread_t th;
    NBT_TRUE(pthread_create(&th, NULL, thread_b, &b) == 0);
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &out)); /* A: its body waits for B's attempt */
    pthread_join(th, NULL);
    if (g_two_b_status != NB_ERR_MISUSE || strstr(g_two_b_msg, "nb_fn_call: the context is in "
                                                               "use by another thread") == NULL) {
        fail_msg("thread B got %s: %s", nb_status_name(g_two_b_status), g_two_b_msg);
    }
    NBT_EQ_F64(out_f32(out, "", 3), 8.0f);
    nb_tree_destroy(out);
    /* once A has left, B's call works */
    NBT_OK(ctx, nb_fn_call(g, args2, &out));
    NBT_EQ_F64(out_f32(out, "", 3), 8.0f);
    nb_tree_destroy(out);
    nb_tree_destroy(args2);
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the cache-hit fast paths ------------------------------------------------------- */
/* A hit compares the whole key, however it got there (an args tree seen before, an equal
 * one, one differing in a shape or a static leaf); donation is resolved once per donate
 * spec structure and must give what the spec allows, no more. */

/* args (x, y, ...) -> (x + 1, y * 2) */
static nb_status body_pair(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_tree *a = nb_leaf(nb_add(nb_get(tr, args, "[0]"), nb_scalar(tr, 1.0)));
    nb_tree *b = nb_leaf(nb_mul(nb_get(tr, args, "[1]"), nb_scalar(tr, 2.0)));
    if (a == NULL || b == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(ctx, 2, (nb_tree *[]){a, b}, out);
}

/* args ({w, n: int}, y) -> ({w: w + 1, n: n + self}, y * 2) */
static nb_status body_nested(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int64_t k = 0, d = 0;
    if (nb_tree_get_int(nb_tree_get(nb_tree_child(args, 0), "n"), &k) != NB_OK ||
        nb_tree_get_int(self, &d) != NB_OK) {
        return nb_trace_fail(tr, NB_ERR_INVALID, "nested: args[0].n and self must be ints");
    }
    nb_tree *w = nb_leaf(nb_add(nb_get(tr, args, "[0].w"), nb_scalar(tr, 1.0)));
    nb_tree *y = nb_leaf(nb_mul(nb_get(tr, args, "[1]"), nb_scalar(tr, 2.0)));
    nb_tree *n = NULL, *p = NULL;
    nb_status st = w != NULL && y != NULL ? nb_tree_int(ctx, k + d, &n) : nb_trace_status(tr);
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 2, (const char *[]){"w", "n"}, (nb_tree *[]){w, n}, &p);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){p, y}, out);
    }
    nb_tree_destroy(p);
    nb_tree_destroy(n);
    return st;
}

static nb_tree *bools2(nb_ctx *ctx, bool a, bool b) {
    nb_tree *x = NULL, *y = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, a, &x));
    NBT_OK(ctx, nb_tree_bool(ctx, b, &y));
    nb_tree *t = tuple2(ctx, x, y);
    nb_tree_destroy(x);
    nb_tree_destroy(y);
    return t;
}

static nb_array *child_array(const nb_tree *t, const char *path) {
    const nb_tree *leaf = NULL;
    if (nb_tree_lookup(t, path, &leaf) != NB_OK || nb_tree_get_array(leaf) == NULL) {
        fail_msg("no array at '%s'", path);
    }
    return nb_tree_get_array(leaf);
}

static double at1(const nb_array *a) {
    double v = 0;
    NBT_OK(NULL, nb_array_get_flat(a, 1, &v));
    return v;
}

static void test_hit_compares_the_whole_key(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "pair", body_pair, NULL, &f));
    nb_tree *x = arr_leaf(ctx, 4, 0), *y = arr_leaf(ctx, 4, 10), *x5 = arr_leaf(ctx, 5, 0);
    nb_tree *three = NULL, *four = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, 3, &three));
    NBT_OK(ctx, nb_tree_int(ctx, 4, &four));
    nb_tree *a3 = NULL, *b3 = NULL, *a4 = NULL, *c3 = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){x, y, three}, &a3));
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){x, y, three}, &b3));  /* equal to a3 */
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){x, y, four}, &a4));   /* a static differs */
    NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){x5, y, three}, &c3)); /* a shape differs */
    struct {
        nb_tree *args;
        int64_t traces, hits;
        const char *reason;
    } calls[] = {
        {a3, 1, 0, NULL},
        {a3, 1, 1, NULL},
        {b3, 1, 2, NULL},
        {a4, 2, 2, "args[2]: static 3 → 4"},
        {a4, 2, 3, NULL},
        {a3, 2, 4, NULL},
        {c3, 3, 4, "args[0]: f32[4] → f32[5]"},
        {a3, 3, 5, NULL},
        {c3, 3, 6, NULL},
        {b3, 3, 7, NULL},
        {a4, 3, 8, NULL},
    };
    int64_t retraces = 0;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        NBT_OK(ctx, nb_fn_call(f, calls[i].args, &out));
        nb_fn_stats s = stats_of(f);
        if (s.n_traces != calls[i].traces || s.n_hits != calls[i].hits) {
            fail_msg("call %zu: %lld traces, %lld hits; wanted %lld, %lld", i,
                     (long long)s.n_traces, (long long)s.n_hits, (long long)calls[i].traces,
                     (long long)calls[i].hits);
        }
        if (calls[i].reason != NULL) {
            char buf[256];
            NBT_OK(ctx, nb_fn_retrace_reason(f, retraces++, buf, sizeof buf, NULL));
            NBT_STREQ(buf, calls[i].reason);
        }
        /* the right executable ran: shapes and values of this call's arrays */
        nb_array *o0 = child_array(out, "[0]");
        NBT_EQ_I64(nb_array_size(o0),
                   nb_array_size(nb_tree_get_array(nb_tree_child(calls[i].args, 0))));
        NBT_EQ_F64(at1(o0), 2.0);
        NBT_EQ_F64(at1(child_array(out, "[1]")), 22.0);
        nb_tree_destroy(out);
    }
    /* After the cache is cleared, a function traces again (and counts from zero). */
    nb_ctx_clear_cache(ctx);
    NBT_OK(ctx, nb_fn_call(f, a3, &out));
    nb_tree_destroy(out);
    NBT_OK(ctx, nb_fn_call(f, a3, &out));
    nb_tree_destroy(out);
    nb_fn_stats s = stats_of(f);
    NBT_EQ_I64(s.n_traces, 1);
    NBT_EQ_I64(s.n_hits, 1);
    nb_tree *all[] = {a3, b3, a4, c3, three, four, x, y, x5};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_tree_destroy(all[i]);
    }
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_donate_plans(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx(), *ctx2 = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "pair", body_pair, NULL, &f));
    nb_tree *x = arr_leaf(ctx, 4, 0), *y = arr_leaf(ctx, 4, 10), *out = NULL;
    nb_array *xa = nb_tree_get_array(x), *ya = nb_tree_get_array(y);
    nb_tree *args = tuple2(ctx, x, y);
    nb_tree *tf = bools2(ctx, true, false), *ft = bools2(ctx, false, true);
    nb_tree *tf2 = bools2(ctx, true, false), *tf_other = bools2(ctx2, true, false);
    nb_tree *all = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &all));
    nb_call_opts o = nb_call_opts_default();
    /* Each output goes into the first donated input array of its dtype and shape not yet
     * taken, in leaf order (X: x's array, Y: y's, 0: a new one). */
    enum { NEW, X, Y };
    double xv = 1, yv = 11; /* element 1 of x and y */
    struct {
        nb_tree *spec;
        int o0, o1;
    } calls[] = {
        {tf, X, NEW}, {tf, X, NEW}, {ft, Y, NEW}, {NULL, NEW, NEW},   {tf2, X, NEW},
        {ft, Y, NEW}, {all, X, Y},  {all, X, Y},  {tf_other, X, NEW}, {tf, X, NEW},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        o.donate = calls[i].spec;
        NBT_OK(ctx, nb_fn_call_ex(f, args, &o, &out));
        nb_array *o0 = child_array(out, "[0]"), *o1 = child_array(out, "[1]");
        int w0 = o0 == xa ? X : o0 == ya ? Y : NEW, w1 = o1 == xa ? X : o1 == ya ? Y : NEW;
        if (w0 != calls[i].o0 || w1 != calls[i].o1) {
            fail_msg("call %zu: outputs in %d, %d; wanted %d, %d", i, w0, w1, calls[i].o0,
                     calls[i].o1);
        }
        NBT_EQ_F64(at1(o0), xv + 1);
        NBT_EQ_F64(at1(o1), yv * 2);
        double x1 = w0 == X ? xv + 1 : xv, y1 = w0 == Y ? xv + 1 : w1 == Y ? yv * 2 : yv;
        xv = x1;
        yv = y1;
        NBT_EQ_F64(at1(xa), xv); /* a donated array is an output; the others are untouched */
        NBT_EQ_F64(at1(ya), yv);
        /* every output donated into the array it came from: args' own tree comes back */
        NBT_TRUE((out == args) == (w0 == X && w1 == Y));
        nb_tree_destroy(out);
    }
    NBT_EQ_I64(stats_of(f).n_traces, 1);
    /* A spec that does not match args names where, every time (a failed spec is not kept). */
    nb_tree *inner = NULL, *bad = NULL;
    NBT_OK(ctx, nb_tree_list(ctx, 1, &all, &inner));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){all, inner}, &bad));
    o.donate = bad;
    for (int i = 0; i < 2; i++) {
        NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call_ex(f, args, &o, &out));
        NBT_ERRMSG_HAS(ctx, "the donate tree has list at args[1] where args has an array");
        NBT_TRUE(out == NULL);
    }
    NBT_EQ_F64(at1(xa), xv); /* nothing ran */
    /* A frozen leaf is returned unfrozen (the output's own structure), still in place. */
    nb_tree *fx = NULL, *fargs = NULL;
    NBT_OK(ctx, nb_tree_freeze(x, &fx));
    fargs = tuple2(ctx, fx, y);
    o.donate = all;
    NBT_OK(ctx, nb_fn_call_ex(f, fargs, &o, &out));
    NBT_TRUE(out != fargs);
    NBT_TRUE(child_array(out, "[0]") == xa && child_array(out, "[1]") == ya);
    NBT_TRUE(!nb_tree_is_frozen(nb_tree_child(out, 0)));
    NBT_EQ_F64(at1(xa), xv + 1);
    nb_tree_destroy(out);
    nb_tree *trees[] = {fargs, fx, bad, inner, all, tf_other, tf2, ft, tf, args, x, y};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nbt_assert_no_live(ctx2);
    nb_ctx_destroy(ctx2);
    nb_ctx_destroy(ctx);
}

/* Output subtrees with static leaves: returned as args' own only when every static value
 * is the same. */
static void test_donate_nested(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *zero = NULL, *one = NULL, *all = NULL, *n3 = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, 0, &zero));
    NBT_OK(ctx, nb_tree_int(ctx, 1, &one));
    NBT_OK(ctx, nb_tree_bool(ctx, true, &all));
    NBT_OK(ctx, nb_tree_int(ctx, 3, &n3));
    nb_tree *w = arr_leaf(ctx, 4, 0), *y = arr_leaf(ctx, 4, 10), *p = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "n"}, (nb_tree *[]){w, n3}, &p));
    nb_tree *args = tuple2(ctx, p, y);
    nb_call_opts o = nb_call_opts_default();
    o.donate = all;
    for (int d = 0; d < 2; d++) {
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "nested", body_nested, d ? one : zero, &f));
        for (int rep = 0; rep < 2; rep++) {
            nb_tree *out = NULL;
            NBT_OK(ctx, nb_fn_call_ex(f, args, &o, &out));
            NBT_TRUE(child_array(out, "[0].w") == nb_tree_get_array(w));
            NBT_TRUE(child_array(out, "[1]") == nb_tree_get_array(y));
            int64_t n = 0;
            const nb_tree *nt = NULL;
            NBT_OK(ctx, nb_tree_lookup(out, "[0].n", &nt));
            NBT_OK(ctx, nb_tree_get_int(nt, &n));
            NBT_EQ_I64(n, 3 + d);
            NBT_TRUE((nb_tree_child(out, 0) == p) == (d == 0));
            NBT_TRUE((out == args) == (d == 0));
            nb_tree_destroy(out);
        }
        nb_fn_destroy(f);
    }
    NBT_EQ_F64(at1(nb_tree_get_array(w)), 1.0 + 4);
    nb_tree *trees[] = {args, p, w, y, n3, all, one, zero};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Allocation failures while a donate spec is resolved and kept, and in the calls after. */
static nb_status scenario_donate(nb_ctx *ctx) {
    nb_fn *f = NULL;
    nb_tree *x = NULL, *y = NULL, *args = NULL, *t = NULL, *spec = NULL, *out = NULL;
    nb_array *a = NULL, *b = NULL;
    nb_status st = nb_fn_create(ctx, "pair", body_pair, NULL, &f);
    if (st == NB_OK) {
        st = nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){4}, &a);
    }
    if (st == NB_OK) {
        st = nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){4}, &b);
    }
    if (st == NB_OK) {
        st = nb_tree_array(a, &x);
    }
    if (st == NB_OK) {
        st = nb_tree_array(b, &y);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){x, y}, &args);
    }
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, true, &t);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){t, t}, &spec);
    }
    nb_call_opts o = nb_call_opts_default();
    o.donate = spec;
    for (int i = 0; i < 3 && st == NB_OK; i++) {
        st = nb_fn_call_ex(f, args, i == 1 ? NULL : &o, &out);
        nb_tree_destroy(out);
        out = NULL;
    }
    nb_tree_destroy(spec);
    nb_tree_destroy(t);
    nb_tree_destroy(args);
    nb_tree_destroy(y);
    nb_tree_destroy(x);
    nb_array_destroy(b);
    nb_array_destroy(a);
    nb_fn_destroy(f);
    nb_ctx_clear_cache(ctx);
    return st;
}

static void test_fault_jit_donate(void **state) {
    (void)state;
    int points = 0;
    for (int64_t k = 1;; k++) {
        nbt_alloc al = {0};
        nb_ctx *ctx = nbt_ctx_with(&al);
        al.fail_at = al.n_calls + k;
        nb_status st = scenario_donate(ctx);
        bool injected = al.n_failed > 0;
        al.fail_at = 0;
        if (!injected) {
            NBT_OK(ctx, st);
        } else if (st != NB_ERR_OOM) {
            fail_msg("allocation %lld failed but the scenario returned %s: %s", (long long)k,
                     nb_status_name(st), nb_ctx_errmsg(ctx));
        }
        nbt_assert_no_live(ctx);
        NBT_OK(ctx, scenario_donate(ctx)); /* the context still works */
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
        NBT_EQ_I64(al.n_live, 0);
        if (!injected) {
            break;
        }
        points++;
        if (k > 20000) {
            fail_msg("scenario never completed");
        }
    }
    NBT_TRUE(points > 10);
}

/* Donation hazards. The kernel that makes an output writes it straight into the caller's
 * array -- unless that array is a donated input some kernel still has to read. Each body
 * below has an output whose donated buffer would be read after (or, by a kernel that is
 * not an elementwise map, while) it is written; a donated call must give exactly the
 * values of an undonated one. */

static nb_tree *tuple_out(nb_trace *tr, int n, nb_var **v) {
    nb_tree *leaves[4];
    for (int i = 0; i < n; i++) {
        leaves[i] = nb_leaf(v[i]);
    }
    nb_tree *t = NULL;
    return nb_tree_tuple(nb_trace_ctx(tr), n, leaves, &t) == NB_OK ? t : NULL;
}

#define HAZARD_BODY(name, n_out, ...)                                                              \
    static nb_status name(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) { \
        (void)self;                                                                                \
        nb_var *x = nb_get(tr, args, "[0]");                                                       \
        nb_var *v[] = {__VA_ARGS__};                                                               \
        *out = tuple_out(tr, n_out, v);                                                            \
        return *out != NULL ? nb_trace_status(tr) : NB_ERR_INVALID;                                \
    }

/* the output is made first, x is read again afterwards */
HAZARD_BODY(hz_read_after, 2, nb_mul(x, nb_scalar(tr, 2.0)), nb_add(x, nb_scalar(tr, 1.0)))
/* the same, the reader traced first */
HAZARD_BODY(hz_read_before, 2, nb_add(x, nb_scalar(tr, 1.0)), nb_mul(x, nb_scalar(tr, 2.0)))
/* matmul reads all of x for every element it writes */
HAZARD_BODY(hz_matmul, 1, nb_matmul(x, x))
/* a transpose reads elsewhere than it writes */
HAZARD_BODY(hz_transpose, 1, nb_transpose(x, (int[]){1, 0}))
/* a reduction along rows, broadcast back: the output is made by an elementwise op */
HAZARD_BODY(hz_softmax, 1, nb_softmax(x, -1))
/* a reduction of x, broadcast back against x in the op that makes the output */
HAZARD_BODY(hz_sum_bcast, 1, nb_sub(x, nb_sum(x, NULL, 0, false)))
/* a fused chain reading x in several places: in place is fine here */
HAZARD_BODY(hz_fused, 1, nb_add(nb_mul(nb_tanh(x), x), x))
/* one value as two outputs, and an output read by a later kernel */
HAZARD_BODY(hz_dup, 3, nb_mul(x, nb_scalar(tr, 3.0)), nb_mul(x, nb_scalar(tr, 3.0)),
            nb_sum(nb_exp(x), NULL, 0, false))
HAZARD_BODY(hz_chain, 2, nb_exp(x), nb_mul(nb_exp(x), nb_scalar(tr, 2.0)))
/* one fused kernel making two outputs, the first (stored, also read inside) taking x's
 * array while the kernel still reads x for the second: in place, element by element */
HAZARD_BODY(hz_multi, 2, nb_mul(nb_sin(nb_mul(x, x)), x),
            nb_add(nb_mul(nb_mul(nb_sin(nb_mul(x, x)), x), nb_scalar(tr, 2.0)), x))
/* the same kernel also reading x reversed (a view): not in place */
HAZARD_BODY(hz_multi_view, 2, nb_mul(nb_sin(nb_mul(x, x)), x),
            nb_add(nb_mul(nb_sin(nb_mul(x, x)), x),
                   nb_slice(x, (int64_t[]){2, 2}, (int64_t[]){-4, -4}, (int64_t[]){-1, -1})))

/* a 3x3 f32 matrix, not symmetric */
static nb_tree *mat3_leaf(nb_ctx *ctx) {
    float v[9] = {1, 2, -3, 4, 0.5f, 6, -7, 8, 9};
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 3}, v, &a));
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static void test_donate_hazards(void **state) {
    (void)state;
    nb_fn_body bodies[] = {hz_read_after, hz_read_before, hz_matmul,    hz_transpose,
                           hz_softmax,    hz_sum_bcast,   hz_fused,     hz_dup,
                           hz_chain,      hz_multi,       hz_multi_view};
    const char *names[] = {"read_after", "read_before", "matmul",    "transpose",
                           "softmax",    "sum_bcast",   "fused",     "dup",
                           "chain",      "multi",       "multi_view"};
    for (int threads = 1; threads <= 2; threads++) {
        nb_ctx_opts co = nb_ctx_opts_default();
        co.n_threads = threads;
        nb_ctx *ctx = NULL;
        NBT_OK(ctx, nb_ctx_create(&co, &ctx));
        for (size_t b = 0; b < sizeof bodies / sizeof bodies[0]; b++) {
            nb_fn *f = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, names[b], bodies[b], NULL, &f));
            nb_tree *x1 = mat3_leaf(ctx), *x2 = mat3_leaf(ctx);
            nb_tree *a1 = tuple1(ctx, x1), *a2 = tuple1(ctx, x2), *ref = NULL, *got = NULL;
            nb_tree *yes = NULL, *spec = NULL;
            NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
            spec = tuple1(ctx, yes);
            nb_call_opts o = nb_call_opts_default();
            o.donate = spec;
            NBT_OK(ctx, nb_fn_call(f, a1, &ref));
            NBT_OK(ctx, nb_fn_call_ex(f, a2, &o, &got));
            int64_t n_out = nb_tree_num_leaves(ref);
            NBT_EQ_I64(nb_tree_num_leaves(got), n_out);
            bool took = false;
            for (int64_t i = 0; i < n_out; i++) {
                nb_array *r = nb_tree_get_array(nb_tree_child(ref, i));
                nb_array *g = nb_tree_get_array(nb_tree_child(got, i));
                took = took || g == nb_tree_get_array(x2);
                bool eq = false;
                NBT_OK(ctx, nb_array_equal(r, g, &eq));
                if (!eq) {
                    fail_msg("donated '%s' (%d threads): output %lld differs from the "
                             "undonated call",
                             names[b], threads, (long long)i);
                }
            }
            /* every body has an output of x's shape and dtype: donation took x's array */
            NBT_TRUE(took);
            nb_tree *all[] = {got, ref, spec, yes, a2, a1, x2, x1};
            for (size_t q = 0; q < sizeof all / sizeof all[0]; q++) {
                nb_tree_destroy(all[q]);
            }
            nb_fn_destroy(f);
        }
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
    }
}

/* ---- eager use ---------------------------------------------------------------------- */

static void test_eval_goes_through_the_cache(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *a = arr_leaf(ctx, 3, 1.0f), *b = arr_leaf(ctx, 3, 10.0f);
    nb_tree *args = tuple2(ctx, a, b), *out = NULL;
    for (int i = 0; i < 3; i++) {
        NBT_OK(ctx, nb_eval(ctx, body_sum2, NULL, args, &out));
        NBT_EQ_F64(out_f32(out, "", 2), 3.0f + 12.0f);
        nb_tree_destroy(out);
    }
    nb_fn *same = NULL; /* the identity nb_eval used: same body, no bound data */
    NBT_OK(ctx, nb_fn_create(ctx, "other name", body_sum2, NULL, &same));
    nb_fn_stats s = stats_of(same);
    NBT_EQ_I64(s.n_traces, 1);
    NBT_EQ_I64(s.n_hits, 2);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_eval(ctx, NULL, NULL, args, &out));
    nb_fn_destroy(same);
    nb_tree_destroy(args);
    nb_tree_destroy(b);
    nb_tree_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- weak scalars ------------------------------------------------------------------- */

static nb_status body_weak(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *i = nb_get(tr, args, "[0]");
    nb_var *d = nb_get(tr, args, "[1]");
    nb_ctx *ctx = nb_trace_ctx(tr);
    return nb_tree_tuple(ctx, 2,
                         (nb_tree *[]){nb_leaf(nb_add(i, nb_scalar(tr, 3.0))),
                                       nb_leaf(nb_mul(nb_scalar(tr, 0.1), d))},
                         out);
}

static void test_weak_scalars(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *ia = NULL, *da = NULL;
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_I32, 0, 3, 1, &ia));
    NBT_OK(ctx, nb_array_ones(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, &da));
    nb_tree *li = NULL, *ld = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_array(ia, &li));
    NBT_OK(ctx, nb_tree_array(da, &ld));
    nb_tree *args = tuple2(ctx, li, ld);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "weak", body_weak, NULL, &f));
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    nb_array *a0 = nb_tree_get_array(nb_tree_child(out, 0));
    nb_array *a1 = nb_tree_get_array(nb_tree_child(out, 1));
    NBT_EQ_I64(nb_array_dtype(a0), NB_DTYPE_I32);
    NBT_EQ_I64(nb_array_dtype(a1), NB_DTYPE_F64);
    int64_t iv = 0;
    NBT_OK(ctx, nb_array_get_i64(a0, (int64_t[]){2}, &iv));
    NBT_EQ_I64(iv, 5);
    double dv = 0;
    NBT_OK(ctx, nb_array_get(a1, (int64_t[]){0}, &dv));
    NBT_EQ_F64(dv, 0.1); /* the weak scalar kept its double value */
    nb_tree_destroy(out);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(ld);
    nb_tree_destroy(li);
    nb_array_destroy(da);
    nb_array_destroy(ia);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- fault injection over whole jit calls ------------------------------------------- */

static nb_status scenario_jit(nb_ctx *ctx) {
    nb_status st;
    nb_fn *bar = NULL, *jbar = NULL, *foo = NULL, *f = NULL;
    nb_tree *x = NULL, *callee = NULL, *args = NULL, *out = NULL, *out2 = NULL;
    nb_array *a = NULL;
    nb_jit_opts o = nb_jit_opts_default();
    o.inline_calls = false;
    st = nb_fn_create(ctx, "bar", body_bar, NULL, &bar);
    if (st == NB_OK) {
        st = nb_jit(bar, &o, &jbar);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "foo", body_foo, NULL, &foo);
    }
    if (st == NB_OK) {
        st = nb_jit(foo, NULL, &f);
    }
    if (st == NB_OK) {
        st = nb_array_arange(ctx, NB_DTYPE_F32, 0, 7, 1, &a);
    }
    if (st == NB_OK) {
        st = nb_tree_array(a, &x);
    }
    if (st == NB_OK) {
        st = nb_tree_fnref(ctx, (nb_fnptr)cfg_get, "cfg", &callee);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){x, callee}, &args);
    }
    g_cfg.bar = jbar;
    if (st == NB_OK) {
        st = nb_fn_call(f, args, &out); /* trace, compile (with a sub-executable), run */
    }
    if (st == NB_OK) {
        st = nb_fn_call(f, args, &out2); /* a cache hit */
    }
    if (st == NB_OK) {
        double v = 0;
        nb_array_get_flat(nb_tree_get_array(out2), 6, &v);
        if (v != 18.0) {
            st = NB_ERR_INTERNAL;
        }
    }
    nb_tree_destroy(out2);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_tree_destroy(callee);
    nb_tree_destroy(x);
    nb_array_destroy(a);
    nb_fn_destroy(f);
    nb_fn_destroy(foo);
    nb_fn_destroy(jbar);
    nb_fn_destroy(bar);
    nb_ctx_clear_cache(ctx);
    return st;
}

static void test_fault_jit_call(void **state) {
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        int points = 0;
        for (int64_t k = 1;; k++) {
            nbt_alloc al = {0};
            nb_ctx *ctx = nbt_ctx_with(&al);
            al.fail_at = al.n_calls + k;
            al.fail_all_after = mode == 1;
            nb_status st = scenario_jit(ctx);
            bool injected = al.n_failed > 0;
            al.fail_at = 0;
            if (!injected) {
                NBT_OK(ctx, st);
                nbt_assert_no_live(ctx);
                nb_ctx_destroy(ctx);
                NBT_EQ_I64(al.n_live, 0);
                break;
            }
            points++;
            if (st != NB_ERR_OOM) {
                fail_msg("allocation %lld failed (mode %d) but the call returned %s: %s",
                         (long long)k, mode, nb_status_name(st), nb_ctx_errmsg(ctx));
            }
            NBT_ERRMSG_HAS(ctx, "out of memory");
            nbt_assert_no_live(ctx);
            NBT_OK(ctx, scenario_jit(ctx)); /* the context still works */
            nbt_assert_no_live(ctx);
            nb_ctx_destroy(ctx);
            NBT_EQ_I64(al.n_live, 0);
            if (k > 20000) {
                fail_msg("scenario never completed");
            }
        }
        print_message("jit scenario: %d allocation failure points (mode %d)\n", points, mode);
        NBT_TRUE(points > 40);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_nested_inline_and_folded_outputs),
        cmocka_unit_test(test_call_not_inlined),
        cmocka_unit_test(test_b_max_traces_both_orders),
        cmocka_unit_test(test_b_max_traces_count_same_in_every_order),
        cmocka_unit_test(test_c_equal_functions_share_entries),
        cmocka_unit_test(test_retrace_reasons),
        cmocka_unit_test(test_error_deep_in_user_code),
        cmocka_unit_test(test_error_names_leaf_paths),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_donate),
        cmocka_unit_test(test_donate_hazards),
        cmocka_unit_test(test_hit_compares_the_whole_key),
        cmocka_unit_test(test_donate_plans),
        cmocka_unit_test(test_donate_nested),
        cmocka_unit_test(test_donate_same_array_twice),
        cmocka_unit_test(test_donate_two_updates),
        cmocka_unit_test(test_debug_nans),
        cmocka_unit_test(test_context_two_threads),
        cmocka_unit_test(test_debug_print),
        cmocka_unit_test(test_debug_retrace),
        cmocka_unit_test(test_fault_jit_donate),
        cmocka_unit_test(test_eval_goes_through_the_cache),
        cmocka_unit_test(test_weak_scalars),
        cmocka_unit_test(test_fault_jit_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
