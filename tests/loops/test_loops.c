/*
 * test_loops.c -- control flow inside traces (nabla/loops.h): while_loop, fori_loop, scan,
 * cond and switch against plain C loops; closure conversion (the seeds' failure 4: a cond
 * that closes over a traced threshold, a body over traced weights; no retrace with new
 * data); nesting; max_steps; errors, including reverse mode through a lax loop.
 */
#include "nbtest.h"

#include "loops/checkpoint.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static nb_tree *leaf_of(nb_array *a) {
    nb_tree *t = NULL;
    assert_int_equal(nb_tree_array(a, &t), NB_OK);
    nb_array_destroy(a);
    return t;
}

static nb_tree *vec_f64(nb_ctx *ctx, int64_t n, const double *v) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){n}, v, &a));
    return leaf_of(a);
}

/* ---- while: (i, x) -> (i + 1, 0.5 x + 1) while i < n -------------------------------- */

static nb_status w_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t n = 0;
    nb_tree_get_int(nb_tree_get(self, "n"), &n);
    return nb_return(nb_lt(nb_get(tr, args, "[0]"), nb_scalar_typed(tr, NB_DTYPE_I32, (double)n)),
                     out);
}

static nb_status w_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *i = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    nb_tree *a = nb_leaf(nb_add(i, nb_scalar_typed(tr, NB_DTYPE_I32, 1)));
    nb_tree *b = nb_leaf(nb_add(nb_mul(x, nb_scalar(tr, 0.5)), nb_scalar(tr, 1.0)));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){a, b}, out);
}

static nb_fn *g_cond, *g_body;

static nb_status w_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_tree *carry = NULL;
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 2,
                                 (nb_tree *[]){nb_leaf(nb_scalar_typed(tr, NB_DTYPE_I32, 0)),
                                               (nb_tree *)nb_tree_child(args, 0)},
                                 &carry);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    int64_t max_steps = 0;
    nb_tree_get_int(nb_tree_child(args, 1), &max_steps);
    o.max_steps = max_steps;
    const nb_tree *res = nb_while_loop(tr, g_cond, g_body, carry, &o);
    nb_tree_destroy(carry);
    if (res == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)res);
    return NB_OK;
}

/* ---- a body's loop-invariant prefix, and a cond that calls the body's function ----------
 * step(self {w}, x) = tanh(x @ w^T) + 0.5; the loop: while sum(step_{w2}(x)) > 4.15 (the cond
 * applies the same function to the carry with other bound data, w2), x = step_w(x). The
 * body's transpose of w is made once per loop (its executable's prefix, after a loop of the
 * body alone compiled it first); were the cond's call to run the same executable on w2
 * between two steps, the loop would make it again every step (nbi_exec_reaches) -- as
 * compiled today the cond's call is an executable of its own. Checked against the same
 * loop written out in C, 3 steps. */
#define PX_N 4
static nb_status px_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_var_of(tr, args), *w = nb_get(tr, self, "w");
    return nb_return(nb_add(nb_tanh(nb_matmul(x, nb_transpose(w, NULL))), nb_scalar(tr, 0.5)), out);
}

static nb_status px_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_fn *other = NULL;
    nb_tree *s = NULL;
    nb_status st = nb_tree_dict(nb_trace_ctx(tr), 1, (const char *[]){"w"},
                                (nb_tree *[]){(nb_tree *)nb_tree_get(self, "w2")}, &s);
    if (st == NB_OK) {
        st = nb_fn_create(nb_trace_ctx(tr), "px_step", px_step, s, &other);
    }
    nb_tree_destroy(s);
    const nb_tree *y = st == NB_OK ? nb_apply(tr, other, args) : NULL;
    nb_fn_destroy(other);
    if (y == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    return nb_return(nb_gt(nb_sum(nb_var_of(tr, y), NULL, 0, false), nb_scalar(tr, 4.15)), out);
}

/* ---- a body that calls a function (not inlined at its own trace) ------------------------
 * The reverse and forward sweeps trace the body again to differentiate it, as grad does:
 * with calls inlined -- a call node has no derivative rule, and a gradient through a body
 * calling an nb_jit(inline_calls = false) function was all zeros. The loss: 3 steps of
 * x = g(x), g(x) = tanh(1.3 x) sin(x) 0.7 + 0.9 x, sum(x^2); g called (jit, not inlined) or
 * inlined; bounded and checkpointed loops; grad and jvp(grad) (the latter also traces the
 * residual probe under a derivative: every trace of the body must make the same nodes). */
static nb_fn *cb_inner;

static nb_status cb_g(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_var_of(tr, nb_tree_child(args, 0)); /* nb_apply1's args: (x,) */
    nb_var *a = nb_tanh(nb_mul(x, nb_scalar(tr, 1.3)));
    nb_var *b = nb_mul(nb_sin(x), nb_scalar(tr, 0.7));
    return nb_return(nb_add(nb_mul(a, b), nb_mul(x, nb_scalar(tr, 0.9))), out);
}

static nb_status cb_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_apply1(tr, cb_inner, nb_var_of(tr, nb_tree_child(args, 1))), out);
}

static nb_status cb_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t ck = 0; /* checkpoints + 10 jit: the jit flag makes a function of its own */
    nb_tree_get_int(self, &ck);
    ck %= 10;
    nb_fn *b = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "cb_body", cb_body, NULL, &b);
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = ck > 0 ? NB_LOOP_CHECKPOINTED : NB_LOOP_BOUNDED;
    o.max_steps = 3;
    o.checkpoints = ck;
    const nb_tree *r = st == NB_OK ? nb_fori_loop(tr, 0, 3, b, nb_tree_child(args, 0), &o) : NULL;
    nb_fn_destroy(b);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    nb_var *v = nb_var_of(tr, r);
    return nb_return(nb_sum(nb_mul(v, v), NULL, 0, false), out);
}

static void test_body_calls(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double x0[4] = {0.3, -0.2, 0.5, 0.1}, t0[4] = {1, 0.5, -0.25, 2};
    nb_tree *prim = nbt_tuple_take(ctx, 1, (nb_tree *[]){vec_f64(ctx, 4, x0)});
    nb_tree *pt =
        nbt_tuple_take(ctx, 2,
                       (nb_tree *[]){nb_tree_retain(prim),
                                     nbt_tuple_take(ctx, 1, (nb_tree *[]){vec_f64(ctx, 4, t0)})});
    double g[2][2][4], hv[2][2][4];
    for (int jit = 0; jit < 2; jit++) {
        nb_fn *in = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "cb_g", cb_g, NULL, &in));
        if (jit) {
            nb_jit_opts jo = nb_jit_opts_default();
            jo.inline_calls = false;
            NBT_OK(ctx, nb_jit(in, &jo, &cb_inner));
            nb_fn_destroy(in);
        } else {
            cb_inner = in;
        }
        for (int ck = 0; ck < 2; ck++) {
            nb_tree *ckt = NULL, *out = NULL;
            nb_fn *l = NULL, *gl = NULL, *jg = NULL;
            NBT_OK(ctx, nb_tree_int(ctx, ck + 10 * jit, &ckt));
            NBT_OK(ctx, nb_fn_create(ctx, "cb_loss", cb_loss, ckt, &l));
            NBT_OK(ctx, nb_grad(l, NULL, &gl));
            NBT_OK(ctx, nb_fn_call(gl, prim, &out));
            memcpy(g[jit][ck], nb_array_data(nb_tree_get_array(out)), sizeof g[0][0]);
            nb_tree_destroy(out);
            if (ck == 0) { /* jvp of a checkpointed grad is refused (test_bounded_reverse) */
                NBT_OK(ctx, nb_jvp(gl, &jg));
                NBT_OK(ctx, nb_fn_call(jg, pt, &out));
                memcpy(hv[jit][ck], nb_array_data(nb_tree_get_array(nb_tree_child(out, 1))),
                       sizeof hv[0][0]);
                nb_tree_destroy(out);
                nb_fn_destroy(jg);
            }
            nb_fn_destroy(gl);
            nb_fn_destroy(l);
            nb_tree_destroy(ckt);
        }
        nb_fn_destroy(cb_inner);
        cb_inner = NULL;
    }
    /* the gradient in C: d/dx0 sum(x3^2) = 2 x3 g'(x2) g'(x1) g'(x0) */
    for (int i = 0; i < 4; i++) {
        double x = x0[i], d = 1;
        for (int s = 0; s < 3; s++) {
            double a = tanh(1.3 * x), da = 1.3 * (1 - a * a);
            d *= da * 0.7 * sin(x) + a * 0.7 * cos(x) + 0.9;
            x = a * 0.7 * sin(x) + 0.9 * x;
        }
        double want = 2 * x * d;
        for (int jit = 0; jit < 2; jit++) {
            for (int ck = 0; ck < 2; ck++) {
                NBT_NEAR(g[jit][ck][i], want, 1e-12 * (1 + fabs(want)));
            }
        }
    }
    printf("a body calling a function not inlined: grad %.17g (inlined %.17g); jvp(grad) %.17g "
           "(inlined %.17g)\n",
           g[1][0][0], g[0][0][0], hv[1][0][0], hv[0][0][0]);
    /* the call inlined for the derivative: the same ops, the same bits */
    assert_memory_equal(g[1], g[0], sizeof g[0]);
    assert_memory_equal(hv[1][0], hv[0][0], sizeof hv[0][0]);
    nb_tree_destroy(pt);
    nb_tree_destroy(prim);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* sum(x) > -100: true on every step here */
static nb_status px_always(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *s = nb_sum(nb_var_of(tr, args), NULL, 0, false);
    return nb_return(nb_gt(s, nb_scalar(tr, -100.0)), out);
}

static nb_status px_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_tree *bs = NULL, *cs = NULL;
    nb_fn *body = NULL, *cond = NULL;
    nb_status st = nb_tree_dict(ctx, 1, (const char *[]){"w"},
                                (nb_tree *[]){(nb_tree *)nb_tree_child(args, 0)}, &bs);
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 1, (const char *[]){"w2"},
                          (nb_tree *[]){(nb_tree *)nb_tree_child(args, 1)}, &cs);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "px_step", px_step, bs, &body);
    }
    bool plain = false; /* the body alone, 3 steps (its executable compiled first) */
    nb_tree_get_bool(self, &plain);
    if (st == NB_OK) {
        st = plain ? nb_fn_create(ctx, "px_always", px_always, NULL, &cond)
                   : nb_fn_create(ctx, "px_cond", px_cond, cs, &cond);
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.max_steps = plain ? 3 : 50;
    const nb_tree *r =
        st == NB_OK ? nb_while_loop(tr, cond, body, nb_tree_child(args, 2), &o) : NULL;
    nb_tree_destroy(bs);
    nb_tree_destroy(cs);
    nb_fn_destroy(body);
    nb_fn_destroy(cond);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

/* one step in C (f64): y = tanh(x w^T) + 0.5 for x [2, N], w [N, N] */
static void px_step_c(const double *w, const double *x, double *y) {
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < PX_N; j++) {
            double a = 0;
            for (int k = 0; k < PX_N; k++) {
                a += x[i * PX_N + k] * w[j * PX_N + k];
            }
            y[i * PX_N + j] = tanh(a) + 0.5;
        }
    }
}

static void test_prefix_cond_runs_body(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double w[PX_N * PX_N], w2[PX_N * PX_N], x[2 * PX_N];
    for (int i = 0; i < PX_N * PX_N; i++) {
        w[i] = 0.3 * sin(1.3 * i + 0.1);
        w2[i] = -0.4 * cos(0.7 * i);
    }
    for (int i = 0; i < 2 * PX_N; i++) {
        x[i] = 0.2 * i - 0.5;
    }
    nb_array *a[3] = {nbt_arr_f64(ctx, 2, (int64_t[]){PX_N, PX_N}, w),
                      nbt_arr_f64(ctx, 2, (int64_t[]){PX_N, PX_N}, w2),
                      nbt_arr_f64(ctx, 2, (int64_t[]){2, PX_N}, x)};
    nb_tree *l[3];
    for (int i = 0; i < 3; i++) {
        NBT_OK(ctx, nb_tree_array(a[i], &l[i]));
        nb_array_destroy(a[i]);
    }
    nb_tree *args = nbt_tuple_take(ctx, 3, l), *res = NULL, *yes = NULL, *no = NULL;
    nb_fn *f = NULL, *f0 = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &no));
    /* the body's executable, with its prefix, compiled first: then the cond's call finds it */
    NBT_OK(ctx, nb_fn_create(ctx, "px_loop", px_loop, yes, &f0));
    NBT_OK(ctx, nb_fn_call(f0, args, &res));
    nb_tree_destroy(res);
    NBT_OK(ctx, nb_fn_create(ctx, "px_loop", px_loop, no, &f));
    NBT_OK(ctx, nb_fn_call(f, args, &res));
    /* in C: while sum(step_w2(x)) > 4.15: x = step_w(x) */
    double y[2 * PX_N];
    int steps = 0;
    for (; steps < 50; steps++) {
        px_step_c(w2, x, y);
        double s = 0;
        for (int i = 0; i < 2 * PX_N; i++) {
            s += y[i];
        }
        if (!(s > 4.15)) {
            break;
        }
        px_step_c(w, x, y);
        memcpy(x, y, sizeof x);
    }
    const double *got = nb_array_data(nb_tree_get_array(res));
    double worst = 0;
    for (int i = 0; i < 2 * PX_N; i++) {
        worst = nbt_max(worst, fabs(got[i] - x[i]));
    }
    printf("a cond that runs the body's executable: %d steps, max |diff| vs C %.3g\n", steps,
           worst);
    assert_true(steps >= 3);
    assert_true(worst < 1e-12);
    nb_tree_destroy(res);
    nb_tree_destroy(args);
    nb_tree_destroy(yes);
    nb_tree_destroy(no);
    nb_fn_destroy(f);
    nb_fn_destroy(f0);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_while(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *cself = NULL, *nleaf = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, 10, &nleaf));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"n"}, &nleaf, &cself));
    NBT_OK(ctx, nb_fn_create(ctx, "w_cond", w_cond, cself, &g_cond));
    NBT_OK(ctx, nb_fn_create(ctx, "w_body", w_body, NULL, &g_body));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "outer", w_outer, NULL, &f));
    for (int trial = 0; trial < 3; trial++) {
        double x0[3] = {1.0 + trial, -2.0, 0.25 * trial};
        for (int maxs = 0; maxs <= 4; maxs += 4) {
            nb_tree *ms = NULL, *res = NULL;
            NBT_OK(ctx, nb_tree_int(ctx, maxs, &ms));
            nb_tree *args = nbt_tuple_take(ctx, 2, (nb_tree *[]){vec_f64(ctx, 3, x0), ms});
            NBT_OK(ctx, nb_fn_call(f, args, &res));
            int steps = maxs > 0 ? maxs : 10;
            const int32_t *i = nb_array_data(nb_tree_get_array(nb_tree_child(res, 0)));
            const double *x = nb_array_data(nb_tree_get_array(nb_tree_child(res, 1)));
            NBT_EQ_I64(*i, steps);
            for (int k = 0; k < 3; k++) {
                double want = x0[k];
                for (int s = 0; s < steps; s++) {
                    want = want * 0.5 + 1.0;
                }
                NBT_EQ_F64(x[k], want);
            }
            nb_tree_destroy(args);
            nb_tree_destroy(res);
        }
    }
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(f, &st));
    NBT_EQ_I64(st.n_traces, 2); /* max_steps 0 and 4 are two static values */
    NBT_OK(ctx, nb_fn_stats_get(g_body, &st));
    NBT_EQ_I64(st.n_traces, 1); /* the body's sub-graph was traced once */
    nb_fn_destroy(f);
    nb_fn_destroy(g_cond);
    nb_fn_destroy(g_body);
    nb_tree_destroy(cself);
    nb_tree_destroy(nleaf);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- failure 4: cond closes over a traced threshold, body over traced weights ---------- */
/* outer(params = {w: f64[n,n], scale: f64[]}, x0): thr = scale * 1e-9 (traced);
 * while ||x||^2 > thr: x = tanh(W x) (W contracting). Returns (x, steps). */

static nb_status f4_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[1]");
    return nb_return(nb_gt(nb_sum(nb_square(x), NULL, 0, false), nb_get(tr, self, "thr")), out);
}

static nb_status f4_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[1]");
    nb_var *w = nb_get(tr, self, "w");
    nb_tree *a = nb_leaf(nb_add(nb_get(tr, args, "[0]"), nb_scalar_typed(tr, NB_DTYPE_I32, 1)));
    nb_tree *b = nb_leaf(nb_tanh(nb_matmul(w, x)));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){a, b}, out);
}

static nb_status f4_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *thr = nb_mul(nb_get(tr, args, "[0].scale"), nb_scalar(tr, 1e-9));
    nb_tree *cself = NULL, *bself = NULL, *carry = NULL;
    nb_fn *c = NULL, *b = NULL;
    nb_status st =
        nb_tree_dict(ctx, 1, (const char *[]){"thr"}, (nb_tree *[]){nb_leaf(thr)}, &cself);
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 1, (const char *[]){"w"},
                          (nb_tree *[]){(nb_tree *)nb_tree_get(nb_tree_child(args, 0), "w")},
                          &bself);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "f4_cond", f4_cond, cself, &c);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "f4_body", f4_body, bself, &b);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2,
                           (nb_tree *[]){nb_leaf(nb_scalar_typed(tr, NB_DTYPE_I32, 0)),
                                         (nb_tree *)nb_tree_child(args, 1)},
                           &carry);
    }
    nb_loop_opts o = nb_loop_opts_default();
    int64_t ck = 0;
    if (self != NULL) {
        nb_tree_get_int(nb_tree_get(self, "checkpoints"), &ck);
    }
    if (ck > 0) {
        o.kind = NB_LOOP_CHECKPOINTED;
        o.max_steps = 200;
        o.checkpoints = ck;
    }
    const nb_tree *res = st == NB_OK ? nb_while_loop(tr, c, b, carry, &o) : NULL;
    if (res != NULL) {
        *out = nb_tree_retain((nb_tree *)res);
    }
    nb_tree_destroy(cself);
    nb_tree_destroy(bself);
    nb_tree_destroy(carry);
    nb_fn_destroy(c);
    nb_fn_destroy(b);
    return res != NULL ? NB_OK : (st != NB_OK ? st : nb_trace_status(tr));
}

#define F4_N 6

static nb_status f4_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_tree *res = NULL;
    nb_status st = f4_outer(tr, self, args, &res);
    if (st != NB_OK) {
        return st;
    }
    nb_var *x = nb_var_of(tr, nb_tree_child(res, 1));
    nb_tree_destroy(res);
    return nb_return(nb_sum(x, NULL, 0, false), out);
}

static nb_tree *f4_params(nb_ctx *ctx, double scale, double wscale) {
    double w[F4_N * F4_N];
    for (int i = 0; i < F4_N * F4_N; i++) {
        w[i] = wscale * sin(1.0 + 0.7 * i) / 2.0;
    }
    nb_array *wa = NULL, *sa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){F4_N, F4_N}, w, &wa));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, scale, &sa));
    nb_tree *lw = leaf_of(wa), *ls = leaf_of(sa), *t = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "scale"}, (nb_tree *[]){lw, ls}, &t));
    nb_tree_destroy(lw);
    nb_tree_destroy(ls);
    return t;
}

/* the same loop in C */
static int f4_reference(double scale, double wscale, const double *x0, double *x) {
    double w[F4_N * F4_N], y[F4_N];
    for (int i = 0; i < F4_N * F4_N; i++) {
        w[i] = wscale * sin(1.0 + 0.7 * i) / 2.0;
    }
    memcpy(x, x0, F4_N * sizeof(double));
    int steps = 0;
    for (;;) {
        double s = 0.0;
        for (int i = 0; i < F4_N; i++) {
            s += x[i] * x[i];
        }
        if (!(s > scale * 1e-9)) {
            break;
        }
        for (int i = 0; i < F4_N; i++) {
            double a = 0.0;
            for (int j = 0; j < F4_N; j++) {
                a += w[i * F4_N + j] * x[j];
            }
            y[i] = tanh(a);
        }
        memcpy(x, y, sizeof y);
        steps++;
    }
    return steps;
}

static void test_failure4_closures(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "f4_outer", f4_outer, NULL, &f));
    nb_jit_opts jo = nb_jit_opts_default();
    jo.max_traces = 1;
    NBT_OK(ctx, nb_jit(f, &jo, &jf));
    for (int trial = 0; trial < 4; trial++) {
        double scale = 1.0 + trial, wscale = 0.9 + 0.1 * trial, x0[F4_N], want[F4_N];
        for (int i = 0; i < F4_N; i++) {
            x0[i] = cos(0.3 * i + trial);
        }
        int steps = f4_reference(scale, wscale, x0, want);
        nb_tree *args = nbt_tuple_take(
            ctx, 2, (nb_tree *[]){f4_params(ctx, scale, wscale), vec_f64(ctx, F4_N, x0)});
        nb_tree *res = NULL;
        NBT_OK(ctx, nb_fn_call(jf, args, &res));
        const int32_t *n = nb_array_data(nb_tree_get_array(nb_tree_child(res, 0)));
        const double *x = nb_array_data(nb_tree_get_array(nb_tree_child(res, 1)));
        NBT_EQ_I64(*n, steps);
        assert_true(steps > 3);
        for (int i = 0; i < F4_N; i++) {
            NBT_NEAR(x[i], want[i], 1e-15);
        }
        nb_tree_destroy(args);
        nb_tree_destroy(res);
    }
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(jf, &st));
    NBT_EQ_I64(st.n_traces, 1); /* new data, new traced threshold and weights: no retrace */
    NBT_EQ_I64(st.n_hits, 3);

    /* reverse mode through the (lax) loop: an error naming the fix, nothing leaked */
    nb_fn *lf = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "f4_loss", f4_loss, NULL, &lf));
    NBT_OK(ctx, nb_grad(lf, NULL, &g));
    double x0[F4_N] = {1, 0.5, -0.5, 0.25, 0.1, -1};
    nb_tree *args =
        nbt_tuple_take(ctx, 2, (nb_tree *[]){f4_params(ctx, 1.0, 1.0), vec_f64(ctx, F4_N, x0)});
    nb_tree *res = NULL;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(g, args, &res));
    NBT_ERRMSG_HAS(ctx, "reverse mode through a loop of kind lax");
    NBT_ERRMSG_HAS(ctx, "NB_LOOP_CHECKPOINTED with max_steps or checkpoints");
    assert_null(res);
    /* forward mode works through a lax loop: the tangent of the loss along the weights
     * matches central differences (the trip count stays put for small steps) */
    nb_fn *jv = NULL;
    NBT_OK(ctx, nb_jvp(lf, &jv));
    double dw[F4_N * F4_N], dx[F4_N] = {0};
    for (int i = 0; i < F4_N * F4_N; i++) {
        dw[i] = cos(0.9 * i);
    }
    nb_array *dwa = NULL, *dsa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){F4_N, F4_N}, dw, &dwa));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, 0.0, &dsa));
    nb_tree *ldw = leaf_of(dwa), *lds = leaf_of(dsa), *dp = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "scale"}, (nb_tree *[]){ldw, lds}, &dp));
    nb_tree_destroy(ldw);
    nb_tree_destroy(lds);
    nb_tree *tangents = nbt_tuple_take(ctx, 2, (nb_tree *[]){dp, vec_f64(ctx, F4_N, dx)});
    nb_tree *pt = nbt_tuple_take(ctx, 2, (nb_tree *[]){nb_tree_retain(args), tangents});
    NBT_OK(ctx, nb_fn_call(jv, pt, &res));
    double tan_out = *(const double *)nb_array_data(nb_tree_get_array(nb_tree_child(res, 1)));
    nb_tree_destroy(res);
    double fd = 0.0;
    {
        const double h = 1e-6;
        double vals[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            /* loss at w + s h dw, evaluated through lf itself */
            double wv[F4_N * F4_N];
            for (int i = 0; i < F4_N * F4_N; i++) {
                wv[i] = 1.0 * sin(1.0 + 0.7 * i) / 2.0 + (sgn ? -h : h) * dw[i];
            }
            nb_array *wa = NULL, *sa = NULL;
            NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){F4_N, F4_N}, wv, &wa));
            NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, 1.0, &sa));
            nb_tree *lw = leaf_of(wa), *ls = leaf_of(sa), *pp = NULL, *r2 = NULL;
            NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "scale"}, (nb_tree *[]){lw, ls},
                                     &pp));
            nb_tree_destroy(lw);
            nb_tree_destroy(ls);
            nb_tree *a2 = nbt_tuple_take(ctx, 2, (nb_tree *[]){pp, vec_f64(ctx, F4_N, x0)});
            NBT_OK(ctx, nb_fn_call(lf, a2, &r2));
            vals[sgn] = *(const double *)nb_array_data(nb_tree_get_array(r2));
            nb_tree_destroy(a2);
            nb_tree_destroy(r2);
        }
        fd = (vals[0] - vals[1]) / (2 * h);
    }
    printf("jvp through a lax while loop: %.12g, central differences %.12g\n", tan_out, fd);
    NBT_NEAR(tan_out, fd, 1e-7 + 1e-6 * fabs(fd));
    assert_true(fabs(tan_out) > 1e-6);
    nb_tree_destroy(pt);
    nb_fn_destroy(jv);
    nb_tree_destroy(args);
    nb_fn_destroy(g);
    nb_fn_destroy(lf);

    /* the same while loop made checkpointed (3 slots): grad w.r.t. the weights it closes
     * over matches central differences, under jit, tracing once for new data */
    nb_tree *ckl = NULL, *ckself = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, 3, &ckl));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"checkpoints"}, &ckl, &ckself));
    nb_fn *lf2 = NULL, *g2 = NULL, *jg2 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "f4_loss", f4_loss, ckself, &lf2));
    NBT_OK(ctx, nb_grad(lf2, NULL, &g2));
    NBT_OK(ctx, nb_jit(g2, &jo, &jg2));
    for (int trial = 0; trial < 2; trial++) {
        double x1[F4_N];
        for (int i = 0; i < F4_N; i++) {
            x1[i] = cos(0.3 * i + trial);
        }
        nb_tree *a1 = nbt_tuple_take(
            ctx, 2, (nb_tree *[]){f4_params(ctx, 1.0 + trial, 1.0), vec_f64(ctx, F4_N, x1)});
        nb_tree *gres = NULL;
        NBT_OK(ctx, nb_fn_call(jg2, a1, &gres));
        /* a while loop: the online schedule, its counters those of the simulation */
        nb_loop_stats ls;
        NBT_OK(ctx, nb_loop_last_stats(&ls));
        nbl_ckpt_counts want;
        int64_t work[256];
        NBT_OK(ctx, nbl_online_simulate(ls.taped_steps, 3, work, 256, &want));
        assert_false(ls.offline);
        assert_true(ls.taped_steps > 5);
        NBT_EQ_I64(ls.forward_sweep_steps, want.forward);
        NBT_EQ_I64(ls.recomputed_steps, want.recomputed);
        NBT_EQ_I64(ls.peak_checkpoints, want.peak_slots);
        if (ls.taped_steps <= nbl_online_optimal_limit(3)) {
            NBT_EQ_I64(ls.recomputed_steps, ls.taped_steps - 3); /* Stumm-Walther optimal */
        } else {
            assert_true(ls.recomputed_steps >= nbl_ckpt_min_recomputations(ls.taped_steps, 3));
        }
        const nb_tree *wl = NULL;
        NBT_OK(ctx, nb_tree_lookup(a1, "[0].w", &wl));
        double *wv = nb_array_data(nb_tree_get_array(wl));
        const double *gw = nb_array_data(nb_tree_get_array(nb_tree_get(gres, "w")));
        for (int i = 0; i < F4_N * F4_N; i += 5) {
            double keep = wv[i], h = 1e-7, vals[2];
            for (int sg = 0; sg < 2; sg++) {
                wv[i] = keep + (sg ? -h : h);
                nb_tree *r2 = NULL;
                NBT_OK(ctx, nb_fn_call(lf2, a1, &r2));
                vals[sg] = *(const double *)nb_array_data(nb_tree_get_array(r2));
                nb_tree_destroy(r2);
            }
            wv[i] = keep;
            double fdw = (vals[0] - vals[1]) / (2 * h);
            NBT_NEAR(gw[i], fdw, 1e-7 + 1e-5 * fabs(fdw));
        }
        nb_tree_destroy(gres);
        nb_tree_destroy(a1);
    }
    NBT_OK(ctx, nb_fn_stats_get(jg2, &st));
    NBT_EQ_I64(st.n_traces, 1);
    nb_fn_destroy(jg2);
    nb_fn_destroy(g2);
    nb_fn_destroy(lf2);
    nb_tree_destroy(ckself);
    nb_tree_destroy(ckl);
    nb_fn_destroy(jf);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- fori, scan, cond, switch, nesting ------------------------------------------------- */

/* fori body: x = 1.1 x + i (self.k scales: closure over a traced value) */
static nb_status fo_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *i = nb_cast(nb_get(tr, args, "[0]"), NB_DTYPE_F64), *x = nb_get(tr, args, "[1]");
    return nb_return(nb_add(nb_mul(x, nb_get(tr, self, "k")), i), out);
}

/* inner while of the nested test: halve x until sum(|x|) < lim (a carry-only cond) */
static nb_status in_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_gt(nb_sum(nb_abs(nb_var_of(tr, args)), NULL, 0, false), nb_scalar(tr, 1.0)),
                     out);
}
static nb_status in_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_mul(nb_var_of(tr, args), nb_scalar(tr, 0.5)), out);
}
static nb_fn *g_in_cond, *g_in_body;

/* nested: for i: x = while(sum|x| > 1: x/2)(x * (i + 3)) */
static nb_status ne_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *i = nb_cast(nb_get(tr, args, "[0]"), NB_DTYPE_F64);
    nb_var *x = nb_mul(nb_get(tr, args, "[1]"), nb_add(i, nb_scalar(tr, 3.0)));
    const nb_tree *r = nb_while_loop(tr, g_in_cond, g_in_body, nb_leaf(x), NULL);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

/* scan body: (c, x) -> (c + x, c * x) */
static nb_status sc_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *c = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    return nb_tree_tuple(nb_trace_ctx(tr), 2,
                         (nb_tree *[]){nb_leaf(nb_add(c, x)), nb_leaf(nb_mul(c, x))}, out);
}

static nb_status br_double(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_mul(nb_var_of(tr, args), nb_scalar(tr, 2.0)), out);
}
static nb_status br_minus(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_sub(nb_var_of(tr, args), nb_scalar(tr, 1.0)), out);
}
static nb_status br_square(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_square(nb_var_of(tr, args)), out);
}

/* args = (x f64[3], xs f64[5,2], k f64[], idx i32[]) ->
 *   (fori(0, 7) x, nested(0, 3) x, scan carry, scan ys, cond(sum x > 0), switch(idx)) */
static nb_status cf_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[0]");
    nb_tree *kself = NULL;
    nb_fn *fb = NULL, *nb = NULL, *sb = NULL, *b0 = NULL, *b1 = NULL, *b2 = NULL;
    nb_tree *kleaf = (nb_tree *)nb_tree_child(args, 2);
    nb_status st = nb_tree_dict(ctx, 1, (const char *[]){"k"}, &kleaf, &kself);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "fo_body", fo_body, kself, &fb);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "ne_body", ne_body, NULL, &nb);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "sc_body", sc_body, NULL, &sb);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "double", br_double, NULL, &b0);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "minus1", br_minus, NULL, &b1);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "square", br_square, NULL, &b2);
    }
    const nb_tree *r1 = st == NB_OK ? nb_fori_loop(tr, 0, 7, fb, nb_leaf(x), NULL) : NULL;
    const nb_tree *r2 = r1 ? nb_fori_loop(tr, 0, 3, nb, nb_leaf(x), NULL) : NULL;
    nb_var *c0 = nb_full(tr, NB_DTYPE_F64, 1, (int64_t[]){2}, 0.5);
    const nb_tree *r3 = r2 ? nb_scan(tr, sb, nb_leaf(c0), nb_tree_child(args, 1), 5, NULL) : NULL;
    nb_var *pred = nb_gt(nb_sum(x, NULL, 0, false), nb_scalar(tr, 0.0));
    const nb_tree *r4 = r3 ? nb_cond(tr, pred, b0, b1, nb_leaf(x)) : NULL;
    const nb_tree *r5 =
        r4 ? nb_switch(tr, nb_get(tr, args, "[3]"), 3, (nb_fn *[]){b0, b1, b2}, nb_leaf(x)) : NULL;
    if (r5 != NULL) {
        st = nb_tree_tuple(
            ctx, 6,
            (nb_tree *[]){(nb_tree *)r1, (nb_tree *)r2, (nb_tree *)nb_tree_child(r3, 0),
                          (nb_tree *)nb_tree_child(r3, 1), (nb_tree *)r4, (nb_tree *)r5},
            out);
    }
    nb_tree_destroy(kself);
    nb_fn *fs[] = {fb, nb, sb, b0, b1, b2};
    for (int i = 0; i < 6; i++) {
        nb_fn_destroy(fs[i]);
    }
    return r5 != NULL ? st : (st != NB_OK ? st : nb_trace_status(tr));
}

static void test_fori_scan_cond(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    NBT_OK(ctx, nb_fn_create(ctx, "in_cond", in_cond, NULL, &g_in_cond));
    NBT_OK(ctx, nb_fn_create(ctx, "in_body", in_body, NULL, &g_in_body));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "cf_outer", cf_outer, NULL, &f));
    for (int trial = 0; trial < 4; trial++) {
        double x[3] = {0.5 - trial, 1.25, -0.75 + 0.5 * trial}, xs[10], k = 1.1 + 0.01 * trial;
        for (int i = 0; i < 10; i++) {
            xs[i] = sin(0.4 * i + trial);
        }
        nb_array *xsa = NULL, *ka = NULL, *ia = NULL;
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){5, 2}, xs, &xsa));
        NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, k, &ka));
        NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_I32, trial == 3 ? 7 : trial - 1, &ia));
        nb_tree *args = nbt_tuple_take(
            ctx, 4, (nb_tree *[]){vec_f64(ctx, 3, x), leaf_of(xsa), leaf_of(ka), leaf_of(ia)});
        nb_tree *res = NULL;
        NBT_OK(ctx, nb_fn_call(f, args, &res));
        const double *r[6];
        for (int i = 0; i < 6; i++) {
            r[i] = nb_array_data(nb_tree_get_array(nb_tree_child(res, i)));
        }
        double sum = x[0] + x[1] + x[2];
        for (int j = 0; j < 3; j++) {
            double v = x[j];
            for (int i = 0; i < 7; i++) {
                v = v * k + i;
            }
            NBT_EQ_F64(r[0][j], v);
        }
        double n[3] = {x[0], x[1], x[2]};
        for (int i = 0; i < 3; i++) {
            for (int j = 0; j < 3; j++) {
                n[j] *= i + 3.0;
            }
            while (fabs(n[0]) + fabs(n[1]) + fabs(n[2]) > 1.0) {
                for (int j = 0; j < 3; j++) {
                    n[j] *= 0.5;
                }
            }
        }
        for (int j = 0; j < 3; j++) {
            NBT_EQ_F64(r[1][j], n[j]);
        }
        double c[2] = {0.5, 0.5};
        for (int i = 0; i < 5; i++) {
            for (int j = 0; j < 2; j++) {
                NBT_EQ_F64(r[3][i * 2 + j], c[j] * xs[i * 2 + j]);
                c[j] += xs[i * 2 + j];
            }
        }
        NBT_EQ_F64(r[2][0], c[0]);
        NBT_EQ_F64(r[2][1], c[1]);
        int idx = trial == 3 ? 2 : (trial - 1 < 0 ? 0 : trial - 1); /* clamped */
        for (int j = 0; j < 3; j++) {
            NBT_EQ_F64(r[4][j], sum > 0 ? 2 * x[j] : x[j] - 1);
            double want = idx == 0 ? 2 * x[j] : idx == 1 ? x[j] - 1 : x[j] * x[j];
            NBT_EQ_F64(r[5][j], want);
        }
        nb_tree_destroy(args);
        nb_tree_destroy(res);
    }
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(f, &st));
    NBT_EQ_I64(st.n_traces, 1);
    nb_fn_destroy(f);
    nb_fn_destroy(g_in_cond);
    nb_fn_destroy(g_in_body);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- reverse mode: bounded loops ------------------------------------------------------ */
/* loss(p = {w f64[R,R], b f64[R], x0 f64[R]}) = sum(x_T^2), x_{t+1} = tanh(w x_t + b) + 0.1 t,
 * T = RT_STEPS, as a bounded fori loop whose body closes over w and b -- and unrolled. */
#define RT_N 8
#define RT_STEPS 30

static nb_status rt_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *t = nb_cast(nb_get(tr, args, "[0]"), NB_DTYPE_F64), *x = nb_get(tr, args, "[1]");
    nb_var *y = nb_tanh(nb_add(nb_matmul(nb_get(tr, self, "w"), x), nb_get(tr, self, "b")));
    return nb_return(nb_add(y, nb_mul(t, nb_scalar(tr, 0.1))), out);
}

static nb_status rt_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    bool unrolled = false;
    nb_tree_get_bool(nb_tree_get(self, "unrolled"), &unrolled);
    const nb_tree *p = nb_tree_child(args, 0);
    nb_var *x = nb_get(tr, p, "x0");
    if (unrolled) {
        nb_var *w = nb_get(tr, p, "w"), *b = nb_get(tr, p, "b");
        for (int t = 0; t < RT_STEPS; t++) {
            x = nb_add(nb_tanh(nb_add(nb_matmul(w, x), b)), nb_scalar(tr, 0.1 * t));
        }
    } else {
        nb_tree *bself = NULL;
        nb_fn *body = NULL;
        nb_status st = nb_tree_dict(
            nb_trace_ctx(tr), 2, (const char *[]){"w", "b"},
            (nb_tree *[]){(nb_tree *)nb_tree_get(p, "w"), (nb_tree *)nb_tree_get(p, "b")}, &bself);
        if (st == NB_OK) {
            st = nb_fn_create(nb_trace_ctx(tr), "rt_body", rt_body, bself, &body);
        }
        nb_tree_destroy(bself);
        if (st != NB_OK) {
            return st;
        }
        nb_loop_opts o = nb_loop_opts_default();
        int64_t ck = 0;
        nb_tree_get_int(nb_tree_get(self, "checkpoints"), &ck);
        o.kind = ck > 0 ? NB_LOOP_CHECKPOINTED : NB_LOOP_BOUNDED;
        o.max_steps = RT_STEPS;
        o.checkpoints = ck;
        const nb_tree *r = nb_fori_loop(tr, 0, RT_STEPS, body, nb_leaf(x), &o);
        nb_fn_destroy(body);
        if (r == NULL) {
            return nb_trace_status(tr);
        }
        x = nb_var_of(tr, r);
    }
    return nb_return(nb_sum(nb_square(x), NULL, 0, false), out);
}

static nb_tree *rt_params(nb_ctx *ctx, const double *w, const double *b, const double *x0) {
    nb_array *wa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){RT_N, RT_N}, w, &wa));
    nb_tree *lw = leaf_of(wa), *lb = vec_f64(ctx, RT_N, b), *lx = vec_f64(ctx, RT_N, x0), *t = NULL;
    NBT_OK(ctx,
           nb_tree_dict(ctx, 3, (const char *[]){"w", "b", "x0"}, (nb_tree *[]){lw, lb, lx}, &t));
    nb_tree_destroy(lw);
    nb_tree_destroy(lb);
    nb_tree_destroy(lx);
    return t;
}

static double rt_eval(nb_ctx *ctx, nb_fn *f, const double *w, const double *b, const double *x0) {
    nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){rt_params(ctx, w, b, x0)}), *res = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &res));
    double v = *(const double *)nb_array_data(nb_tree_get_array(res));
    nb_tree_destroy(args);
    nb_tree_destroy(res);
    return v;
}

/* value_and_grad (rt_vg) applied, only the value returned: the gradient is dead */
static nb_fn *rt_vg;
static nb_status rt_value_only(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    const nb_tree *r = nb_apply(tr, rt_vg, args);
    return nb_return(nb_var_of(tr, nb_tree_child(r, 0)), out);
}

/* The "bool[N] = while" sizes of f's optimised IR, in order, into sz (at most 4); the
 * count. */
static int rt_while_sizes(nb_ctx *ctx, nb_fn *f, const nb_tree *args, long long *sz) {
    size_t need = 0;
    (void)nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, NULL, 0, &need); /* NB_ERR_TRUNCATED */
    char *ir = malloc(need + 1);
    assert_non_null(ir);
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, need + 1, NULL));
    int n = 0;
    for (const char *p = ir; (p = strstr(p, " = while ")) != NULL; p++) {
        const char *b = p;
        while (b > ir && *b != '[') {
            b--;
        }
        if (n < 4) {
            sz[n] = atoll(b + 1);
        }
        n++;
    }
    free(ir);
    return n;
}

/* The lines holding pat (e.g. the products, "= matmul:") of each function of f's native C
 * source for args, into per[] (at most cap functions); the number of functions. A loop
 * body's second function without its loop-invariant prefix (nbx_f<k>_r) repeats its lines:
 * not counted; nor is the program's own nbx_run, before the first function. */
static int rt_native_lines(nb_ctx *ctx, nb_fn *f, const nb_tree *args, const char *pat, int *per,
                           int cap) {
    size_t need = 0;
    (void)nb_fn_format_ir(f, args, NB_IR_NATIVE_C, NULL, 0, &need); /* NB_ERR_TRUNCATED */
    char *src = malloc(need + 1);
    assert_non_null(src);
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_NATIVE_C, src, need + 1, NULL));
    int n = -1; /* products before the first function (the program's own): not counted */
    bool rest = false;
    for (char *p = src, *e = NULL; p != NULL; p = e != NULL ? e + 1 : NULL) {
        e = strchr(p, '\n');
        if (e != NULL) {
            *e = '\0'; /* p: one line */
        }
        if (strncmp(p, "static void nbx_f", 17) == 0 && strchr(p, ';') == NULL) {
            rest = strstr(p, "_r(") != NULL; /* a definition, not a declaration */
            n += !rest;
        } else if (strstr(p, pat) != NULL && !rest && n >= 0 && n < cap) {
            per[n]++;
        }
    }
    free(src);
    return n + 1;
}

static void test_bounded_reverse(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f[2] = {NULL, NULL}, *g[2] = {NULL, NULL};
    for (int u = 0; u < 2; u++) {
        nb_tree *fl = NULL, *self = NULL;
        NBT_OK(ctx, nb_tree_bool(ctx, u == 1, &fl));
        NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"unrolled"}, &fl, &self));
        NBT_OK(ctx, nb_fn_create(ctx, "rt_loss", rt_loss, self, &f[u]));
        NBT_OK(ctx, nb_grad(f[u], NULL, &g[u]));
        nb_tree_destroy(fl);
        nb_tree_destroy(self);
    }
    double w[RT_N * RT_N], b[RT_N], x0[RT_N];
    for (int i = 0; i < RT_N * RT_N; i++) {
        w[i] = 0.6 * sin(0.37 * i + 0.2);
    }
    for (int i = 0; i < RT_N; i++) {
        b[i] = 0.1 * cos(1.1 * i);
        x0[i] = 0.5 * sin(2.0 * i + 1.0);
    }
    nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){rt_params(ctx, w, b, x0)});
    nb_tree *gr[2] = {NULL, NULL};
    for (int u = 0; u < 2; u++) {
        NBT_OK(ctx, nb_fn_call(g[u], args, &gr[u]));
    }
    NBT_NEAR(rt_eval(ctx, f[0], w, b, x0), rt_eval(ctx, f[1], w, b, x0), 1e-12);
    /* the loop's gradient against the unrolled graph's, and central differences */
    const char *names[3] = {"w", "b", "x0"};
    double *vals[3] = {w, b, x0};
    int sizes[3] = {RT_N * RT_N, RT_N, RT_N};
    double worst_unrolled = 0.0, worst_fd = 0.0;
    for (int k = 0; k < 3; k++) {
        const double *ga = nb_array_data(nb_tree_get_array(nb_tree_get(gr[0], names[k])));
        const double *gb = nb_array_data(nb_tree_get_array(nb_tree_get(gr[1], names[k])));
        for (int i = 0; i < sizes[k]; i++) {
            worst_unrolled =
                nbt_max(worst_unrolled, fabs(ga[i] - gb[i]) / fmax(1e-12, fabs(gb[i])));
            if (i % 7 == 0) {
                double h = 1e-6, keep = vals[k][i];
                vals[k][i] = keep + h;
                double up = rt_eval(ctx, f[1], w, b, x0);
                vals[k][i] = keep - h;
                double dn = rt_eval(ctx, f[1], w, b, x0);
                vals[k][i] = keep;
                double fd = (up - dn) / (2 * h);
                /* central differences with h = 1e-6 are good to ~1e-8 absolute here */
                worst_fd = nbt_max(worst_fd, fabs(ga[i] - fd) / (1e-7 + 1e-6 * fabs(fd)));
            }
        }
    }
    printf("bounded loop gradient: max rel diff vs unrolled %.3g; vs central differences %.3g "
           "of the tolerance 1e-7 + 1e-6 |fd|\n",
           worst_unrolled, worst_fd);
    NBT_EQ_F64(worst_unrolled, 0.0); /* the same ops in the same order: the same bits */
    assert_true(worst_fd <= 1.0);
    /* value and gradient: the loop runs forward once -- the taped run of reverse mode gives
     * the value too (nbi_pass_loop_share): 3 while ops traced, 2 compiled -- and the value
     * has the plain call's bits, the gradient grad's */
    {
        nb_fn *vg = NULL;
        nb_tree *res = NULL;
        NBT_OK(ctx, nb_value_and_grad(f[0], NULL, &vg));
        NBT_OK(ctx, nb_fn_call(vg, args, &res));
        double v = *(const double *)nb_array_data(nb_tree_get_array(nb_tree_child(res, 0)));
        NBT_EQ_F64(v, rt_eval(ctx, f[0], w, b, x0));
        bool same = false;
        NBT_OK(ctx, nb_tree_equal(nb_tree_child(res, 1), gr[0], &same));
        assert_true(same);
        int whiles[2] = {0, 0};
        for (int which = 0; which < 2; which++) {
            size_t need = 0;
            int ir_kind = which == 0 ? NB_IR_TRACED : NB_IR_OPTIMIZED;
            (void)nb_fn_format_ir(vg, args, ir_kind, NULL, 0, &need); /* NB_ERR_TRUNCATED */
            char *ir = malloc(need + 1);
            assert_non_null(ir);
            NBT_OK(ctx, nb_fn_format_ir(vg, args, ir_kind, ir, need + 1, NULL));
            for (const char *p = ir; (p = strstr(p, " = while ")) != NULL; p++) {
                whiles[which]++;
            }
            free(ir);
        }
        printf("value_and_grad through a bounded loop: %d while ops traced, %d compiled\n",
               whiles[0], whiles[1]);
        assert_int_equal(whiles[0], 3);
        assert_int_equal(whiles[1], 2);
        /* the gradient never read: the taped loop and its reverse sweep go, and the plain
         * loop (no tape in its state: the same size as f's own) stays */
        nb_tree *vr = NULL;
        nb_fn *vo = NULL;
        rt_vg = vg;
        NBT_OK(ctx, nb_fn_create(ctx, "rt_value_only", rt_value_only, NULL, &vo));
        long long s_plain[4], s_vo[4];
        assert_int_equal(rt_while_sizes(ctx, f[0], args, s_plain), 1);
        assert_int_equal(rt_while_sizes(ctx, vo, args, s_vo), 1);
        printf("the value alone: its loop's state %lld bytes, the plain loop's %lld\n", s_vo[0],
               s_plain[0]);
        assert_true(s_vo[0] == s_plain[0]);
        NBT_OK(ctx, nb_fn_call(vo, args, &vr));
        NBT_EQ_F64(*(const double *)nb_array_data(nb_tree_get_array(vr)),
                   rt_eval(ctx, f[0], w, b, x0));
        nb_tree_destroy(vr);
        nb_fn_destroy(vo);
        rt_vg = NULL;
        nb_tree_destroy(res);
        nb_fn_destroy(vg);
    }
    /* stored residuals: the reverse sweep reads the step's carry-dependent values from the
     * taped run instead of running the forward step again -- the gradient's program has the
     * taped step's product (w x) and the reverse step's two (w^T ct, ct x^T), and no
     * fourth (the forward product made again in the reverse body) */
    {
        int per[16] = {0}, n_fn = rt_native_lines(ctx, g[0], args, "= matmul:", per, 16), total = 0,
            most = 0;
        for (int q = 0; q < n_fn && q < 16; q++) {
            total += per[q];
            most = per[q] > most ? per[q] : most;
        }
        printf("grad through a bounded loop: %d products in %d functions, at most %d in one\n",
               total, n_fn, most);
        assert_int_equal(total, 3);
        assert_int_equal(most, 2);
    }
    /* forward mode: the loop's jvp equals the unrolled graph's */
    double jv_out[2];
    for (int u = 0; u < 2; u++) {
        nb_fn *jf = NULL;
        NBT_OK(ctx, nb_jvp(f[u], &jf));
        double dw[RT_N * RT_N], db[RT_N], dx[RT_N];
        for (int i = 0; i < RT_N * RT_N; i++) {
            dw[i] = cos(0.5 * i);
        }
        for (int i = 0; i < RT_N; i++) {
            db[i] = sin(0.3 * i);
            dx[i] = 1.0 - 0.1 * i;
        }
        nb_tree *tan = nbt_tuple_take(ctx, 1, (nb_tree *[]){rt_params(ctx, dw, db, dx)});
        nb_tree *pt = nbt_tuple_take(ctx, 2, (nb_tree *[]){nb_tree_retain(args), tan}), *res = NULL;
        NBT_OK(ctx, nb_fn_call(jf, pt, &res));
        jv_out[u] = *(const double *)nb_array_data(nb_tree_get_array(nb_tree_child(res, 1)));
        nb_tree_destroy(res);
        nb_tree_destroy(pt);
        nb_fn_destroy(jf);
    }
    printf("jvp through a bounded fori loop %.17g, unrolled %.17g\n", jv_out[0], jv_out[1]);
    NBT_EQ_F64(jv_out[0], jv_out[1]);
    /* checkpointed reversal with c slots: the same gradient bits, the schedule's counters */
    const int64_t cs[4] = {2, 5, 10, 40};
    for (int q = 0; q < 4; q++) {
        nb_tree *fl = NULL, *cl = NULL, *self = NULL, *gc = NULL;
        nb_fn *fc = NULL, *gfc = NULL;
        NBT_OK(ctx, nb_tree_bool(ctx, false, &fl));
        NBT_OK(ctx, nb_tree_int(ctx, cs[q], &cl));
        NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"unrolled", "checkpoints"},
                                 (nb_tree *[]){fl, cl}, &self));
        NBT_OK(ctx, nb_fn_create(ctx, "rt_loss", rt_loss, self, &fc));
        NBT_OK(ctx, nb_grad(fc, NULL, &gfc));
        NBT_OK(ctx, nb_fn_call(gfc, args, &gc));
        bool eq = false;
        NBT_OK(ctx, nb_tree_equal(gc, gr[0], &eq));
        nb_loop_stats ls;
        NBT_OK(ctx, nb_loop_last_stats(&ls));
        printf("checkpointed c = %lld: gradient %s the bounded one; primal %lld, recomputed "
               "%lld, taped %lld, peak checkpoints %lld (%zu bytes)\n",
               (long long)cs[q], eq ? "bit-identical to" : "DIFFERS from",
               (long long)ls.primal_steps, (long long)ls.recomputed_steps,
               (long long)ls.taped_steps, (long long)ls.peak_checkpoints, ls.peak_checkpoint_bytes);
        assert_true(eq);
        if (q == 0) {
            /* jvp of a checkpointed grad: a second derivative through the loop, refused */
            nb_fn *jg = NULL;
            NBT_OK(ctx, nb_jvp(gfc, &jg));
            nb_tree *pt = nbt_tuple_take(ctx, 2,
                                         (nb_tree *[]){nb_tree_retain(args), nb_tree_retain(args)}),
                    *jr = NULL;
            NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_fn_call(jg, pt, &jr));
            NBT_ERRMSG_HAS(ctx, "reverse of a checkpointed loop");
            nb_tree_destroy(pt);
            nb_fn_destroy(jg);
        }
        NBT_EQ_I64(ls.primal_steps, RT_STEPS);
        NBT_EQ_I64(ls.taped_steps, RT_STEPS);
        assert_true(ls.peak_checkpoints <= cs[q]);
        NBT_EQ_I64(ls.peak_checkpoint_bytes, (size_t)ls.peak_checkpoints * ls.state_bytes);
        /* a fori loop: the trip count is known, so the offline (revolve) schedule runs,
         * with exactly Griewank's t(l, c) unrecorded steps */
        assert_true(ls.offline);
        NBT_EQ_I64(ls.forward_sweep_steps + ls.recomputed_steps,
                   nbl_revolve_advances(RT_STEPS, cs[q]));
        nb_tree_destroy(gc);
        nb_fn_destroy(gfc);
        nb_fn_destroy(fc);
        nb_tree_destroy(self);
        nb_tree_destroy(fl);
        nb_tree_destroy(cl);
    }
    for (int u = 0; u < 2; u++) {
        nb_tree_destroy(gr[u]);
        nb_fn_destroy(g[u]);
        nb_fn_destroy(f[u]);
    }
    nb_tree_destroy(args);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the rows: 1000 steps of a matmul + tanh recurrence, and 10^5 steps ----------- */
#define LG_N 256

static nb_status lg_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *x = nb_get(tr, args, "[1]");
    nb_var *y = nb_tanh(nb_add(nb_matmul(nb_get(tr, self, "w"), x), nb_get(tr, self, "b")));
    return nb_return(y, out);
}

/* self = {steps, checkpoints (0: bounded)}; args = ({w, b, x0}) -> sum(x_T) */
static nb_status lg_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t steps = 0, ck = 0;
    nb_tree_get_int(nb_tree_get(self, "steps"), &steps);
    nb_tree_get_int(nb_tree_get(self, "checkpoints"), &ck);
    const nb_tree *p = nb_tree_child(args, 0);
    nb_tree *bself = NULL;
    nb_fn *body = NULL;
    nb_status st = nb_tree_dict(
        nb_trace_ctx(tr), 2, (const char *[]){"w", "b"},
        (nb_tree *[]){(nb_tree *)nb_tree_get(p, "w"), (nb_tree *)nb_tree_get(p, "b")}, &bself);
    if (st == NB_OK) {
        st = nb_fn_create(nb_trace_ctx(tr), "lg_body", lg_body, bself, &body);
    }
    nb_tree_destroy(bself);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = ck > 0 ? NB_LOOP_CHECKPOINTED : ck < 0 ? NB_LOOP_LAX : NB_LOOP_BOUNDED;
    o.max_steps = steps;
    o.checkpoints = ck > 0 ? ck : 0;
    const nb_tree *r = nb_fori_loop(tr, 0, steps, body, nb_tree_get(p, "x0"), &o);
    nb_fn_destroy(body);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out);
}

static nb_tree *lg_grad(nb_ctx *ctx, const nb_tree *args, int64_t steps, int64_t ck,
                        nb_loop_stats *ls, double *loss) {
    nb_tree *sl = NULL, *cl = NULL, *self = NULL, *res = NULL;
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, steps, &sl));
    NBT_OK(ctx, nb_tree_int(ctx, ck, &cl));
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"steps", "checkpoints"},
                             (nb_tree *[]){sl, cl}, &self));
    NBT_OK(ctx, nb_fn_create(ctx, "lg_loss", lg_loss, self, &f));
    nb_grad_opts go = nb_grad_opts_default();
    NBT_OK(ctx, nb_value_and_grad(f, &go, &g));
    NBT_OK(ctx, nb_fn_call(g, args, &res));
    *loss = *(const double *)nb_array_data(nb_tree_get_array(nb_tree_child(res, 0)));
    nb_tree *grads = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
    if (ls != NULL) {
        NBT_OK(ctx, nb_loop_last_stats(ls));
    }
    nb_tree_destroy(res);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_tree_destroy(self);
    nb_tree_destroy(sl);
    nb_tree_destroy(cl);
    return grads;
}

/* the loss alone (a lax loop: forward only) */
static double lg_value(nb_ctx *ctx, const nb_tree *args, int64_t steps) {
    nb_tree *sl = NULL, *cl = NULL, *self = NULL, *res = NULL;
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, steps, &sl));
    NBT_OK(ctx, nb_tree_int(ctx, -1, &cl)); /* -1: a lax loop */
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"steps", "checkpoints"},
                             (nb_tree *[]){sl, cl}, &self));
    NBT_OK(ctx, nb_fn_create(ctx, "lg_loss", lg_loss, self, &f));
    NBT_OK(ctx, nb_fn_call(f, args, &res));
    double v = *(const double *)nb_array_data(nb_tree_get_array(res));
    nb_tree_destroy(res);
    nb_fn_destroy(f);
    nb_tree_destroy(self);
    nb_tree_destroy(sl);
    nb_tree_destroy(cl);
    return v;
}

static nb_tree *lg_args(nb_ctx *ctx, double wscale, int n) {
    static double w[LG_N * LG_N], b[LG_N], x0[LG_N];
    for (int i = 0; i < n * n; i++) {
        w[i] = wscale * sin(0.731 * i + 0.3) / sqrt((double)n);
    }
    for (int i = 0; i < n; i++) {
        b[i] = 0.05 * cos(0.37 * i);
        x0[i] = 0.3 * sin(1.7 * i);
    }
    nb_array *wa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){n, n}, w, &wa));
    nb_tree *lw = leaf_of(wa), *lb = vec_f64(ctx, n, b), *lx = vec_f64(ctx, n, x0), *p = NULL;
    NBT_OK(ctx,
           nb_tree_dict(ctx, 3, (const char *[]){"w", "b", "x0"}, (nb_tree *[]){lw, lb, lx}, &p));
    nb_tree_destroy(lw);
    nb_tree_destroy(lb);
    nb_tree_destroy(lx);
    return nbt_tuple_take(ctx, 1, (nb_tree *[]){p});
}

static void test_checkpointed_rows(void **state) {
    (void)state;
    nb_ctx_opts co_ = nb_ctx_opts_default();
    co_.n_threads = getenv("NBT_THREADS") ? atoi(getenv("NBT_THREADS")) : 0;
    nb_ctx *ctx = NULL;
    NBT_OK(ctx, nb_ctx_create(&co_, &ctx));
    nb_tree *args = lg_args(ctx, 1.2, LG_N);
    double loss_b = 0.0, loss = 0.0;
    nb_tree *gb = lg_grad(ctx, args, 1000, 0, NULL, &loss_b);
    const int64_t cs[3] = {2, 10, 50};
    for (int q = 0; q < 3; q++) {
        nb_loop_stats ls;
        nb_tree *gc = lg_grad(ctx, args, 1000, cs[q], &ls, &loss);
        bool eq = false;
        NBT_OK(ctx, nb_tree_equal(gc, gb, &eq));
        if (!eq) {
            char how[256];
            bool differ = false;
            nb_tree_diff(gc, gb, NB_TREE_DIFF_VALUES, &differ, how, sizeof how, NULL);
            printf("differs: %s\n", how);
        }
        printf("1000 steps, state f64[%d], c = %lld: bit-identical to bounded: %s; revolve "
               "advances %lld + %lld (%.2f per step), peak checkpoint bytes %zu (bounded tape: "
               "%zu)\n",
               LG_N, (long long)cs[q], eq ? "yes" : "NO", (long long)ls.forward_sweep_steps,
               (long long)ls.recomputed_steps,
               (double)(ls.forward_sweep_steps + ls.recomputed_steps) / 1000.0,
               ls.peak_checkpoint_bytes, (size_t)1000 * ls.state_bytes);
        assert_true(eq);
        NBT_EQ_F64(loss, loss_b);
        NBT_EQ_I64(ls.taped_steps, 1000);
        assert_true(ls.peak_checkpoints <= cs[q]);
        /* the executed reversal's counters are the schedule's (simulated alone) */
        nbl_ckpt_counts want;
        size_t wl = nbl_ckpt_rev_work_len(cs[q]);
        int64_t *work = calloc(wl, sizeof(int64_t));
        assert_non_null(work);
        NBT_OK(ctx, nbl_revolve_simulate(1000, cs[q], work, wl, &want));
        free(work);
        assert_true(ls.offline);
        NBT_EQ_I64(ls.forward_sweep_steps, want.forward);
        NBT_EQ_I64(ls.forward_sweep_steps + ls.recomputed_steps, nbl_revolve_advances(1000, cs[q]));
        NBT_EQ_I64(ls.recomputed_steps, want.recomputed);
        NBT_EQ_I64(ls.taped_steps, want.taped);
        NBT_EQ_I64(ls.peak_checkpoints, want.peak_slots);
        nb_tree_destroy(gc);
    }
    /* central differences on a few entries of w, b and x0 */
    const char *names[3] = {"w", "b", "x0"};
    for (int k = 0; k < 3; k++) {
        const nb_tree *leaf = NULL;
        char path[32];
        snprintf(path, sizeof path, "[0].%s", names[k]);
        NBT_OK(ctx, nb_tree_lookup(args, path, &leaf));
        double *v = nb_array_data(nb_tree_get_array(leaf));
        const double *g = nb_array_data(nb_tree_get_array(nb_tree_get(gb, names[k])));
        for (int i = 0; i < 2; i++) {
            int at = (i * 37 + 5) % (k == 0 ? LG_N * LG_N : LG_N);
            double keep = v[at], h = 1e-6, up = 0.0, dn = 0.0;
            v[at] = keep + h;
            up = lg_value(ctx, args, 1000);
            v[at] = keep - h;
            dn = lg_value(ctx, args, 1000);
            v[at] = keep;
            double fd = (up - dn) / (2 * h);
            NBT_NEAR(g[at], fd, 1e-6 + 1e-5 * fabs(fd));
        }
    }
    nb_tree_destroy(gb);
    nb_tree_destroy(args);
    /* 10^5 steps with 100 checkpoints: at most 100 states held (a bounded tape: 10^5) */
    nb_tree *a2 = lg_args(ctx, 0.5, 16); /* a small state: the point is the memory bound */
    nb_loop_stats ls;
    nb_tree *g2 = lg_grad(ctx, a2, 100000, 100, &ls, &loss);
    printf("10^5 steps, c = 100: peak checkpoints %lld (%zu bytes; a bounded tape would be %zu), "
           "recomputed %lld (%.2f per step)\n",
           (long long)ls.peak_checkpoints, ls.peak_checkpoint_bytes,
           (size_t)100000 * ls.state_bytes, (long long)ls.recomputed_steps,
           (double)ls.recomputed_steps / 1e5);
    assert_true(ls.peak_checkpoints <= 100);
    NBT_EQ_I64(ls.taped_steps, 100000);
    assert_true(isfinite(loss));
    nb_tree_destroy(g2);
    nb_tree_destroy(a2);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- buffers: scan's stacked outputs stay out of checkpoints ------------------------------- */
#define SB_N 16
#define SB_LEN 200

static nb_status sb_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *c = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    nb_var *c2 = nb_tanh(nb_add(nb_matmul(nb_get(tr, self, "w"), c), x));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(c2), nb_leaf(nb_square(c))},
                         out);
}

/* self = {checkpoints (0: bounded)}; args = ({w, c0, xs}) -> sum(ys) + sum(c_T) */
static nb_status sb_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t ck = 0;
    nb_tree_get_int(nb_tree_get(self, "checkpoints"), &ck);
    const nb_tree *p = nb_tree_child(args, 0);
    nb_tree *bself = NULL;
    nb_fn *body = NULL;
    nb_status st = nb_tree_dict(nb_trace_ctx(tr), 1, (const char *[]){"w"},
                                (nb_tree *[]){(nb_tree *)nb_tree_get(p, "w")}, &bself);
    if (st == NB_OK) {
        st = nb_fn_create(nb_trace_ctx(tr), "sb_body", sb_body, bself, &body);
    }
    nb_tree_destroy(bself);
    if (st != NB_OK) {
        return st;
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = ck > 0 ? NB_LOOP_CHECKPOINTED : NB_LOOP_BOUNDED;
    o.max_steps = SB_LEN;
    o.checkpoints = ck;
    const nb_tree *r = nb_scan(tr, body, nb_tree_get(p, "c0"), nb_tree_get(p, "xs"), SB_LEN, &o);
    nb_fn_destroy(body);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *ys = nb_var_of(tr, nb_tree_child(r, 1)), *cT = nb_var_of(tr, nb_tree_child(r, 0));
    return nb_return(nb_add(nb_sum(ys, NULL, 0, false), nb_sum(cT, NULL, 0, false)), out);
}

static void test_scan_buffers(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static double w[SB_N * SB_N], c0[SB_N], xs[SB_LEN * SB_N];
    for (int i = 0; i < SB_N * SB_N; i++) {
        w[i] = 0.9 * sin(0.61 * i) / sqrt((double)SB_N);
    }
    for (int i = 0; i < SB_N; i++) {
        c0[i] = 0.2 * cos(1.3 * i);
    }
    for (int i = 0; i < SB_LEN * SB_N; i++) {
        xs[i] = 0.1 * sin(0.017 * i);
    }
    nb_array *wa = NULL, *xa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){SB_N, SB_N}, w, &wa));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){SB_LEN, SB_N}, xs, &xa));
    nb_tree *lw = leaf_of(wa), *lc = vec_f64(ctx, SB_N, c0), *lx = leaf_of(xa), *p = NULL;
    NBT_OK(ctx,
           nb_tree_dict(ctx, 3, (const char *[]){"w", "c0", "xs"}, (nb_tree *[]){lw, lc, lx}, &p));
    nb_tree_destroy(lw);
    nb_tree_destroy(lc);
    nb_tree_destroy(lx);
    nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){p});
    nb_tree *g[2] = {NULL, NULL};
    nb_loop_stats ls;
    for (int q = 0; q < 2; q++) {
        nb_tree *cl = NULL, *self = NULL, *res = NULL;
        nb_fn *f = NULL, *gf = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, q == 0 ? 0 : 6, &cl));
        NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"checkpoints"}, &cl, &self));
        NBT_OK(ctx, nb_fn_create(ctx, "sb_loss", sb_loss, self, &f));
        NBT_OK(ctx, nb_grad(f, NULL, &gf));
        NBT_OK(ctx, nb_fn_call(gf, args, &res));
        g[q] = res;
        if (q == 1) {
            NBT_OK(ctx, nb_loop_last_stats(&ls));
        }
        nb_fn_destroy(gf);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
        nb_tree_destroy(cl);
    }
    bool eq = false;
    NBT_OK(ctx, nb_tree_equal(g[0], g[1], &eq));
    printf("scan of %d steps, checkpointed c = 6: gradient %s the bounded one; a checkpoint "
           "holds %zu bytes (the ys buffer, %zu bytes, is kept once), peak %zu bytes\n",
           SB_LEN, eq ? "bit-identical to" : "DIFFERS from", ls.state_bytes, ls.buffer_bytes,
           ls.peak_checkpoint_bytes);
    assert_true(eq);
    assert_true(ls.buffer_bytes >= (size_t)SB_LEN * SB_N * sizeof(double));
    assert_true(ls.state_bytes < 1024); /* i, c: no buffer in a checkpoint */
    NBT_EQ_I64(ls.peak_checkpoint_bytes, (size_t)ls.peak_checkpoints * ls.state_bytes);
    /* the gradient reaches xs through the scan's slices */
    const double *gx = nb_array_data(nb_tree_get_array(nb_tree_get(g[0], "xs")));
    double nz = 0.0;
    for (int i = 0; i < SB_LEN * SB_N; i++) {
        nz += fabs(gx[i]);
    }
    assert_true(nz > 0.0);
    nb_tree_destroy(g[0]);
    nb_tree_destroy(g[1]);
    nb_tree_destroy(args);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* A bounded scan's reverse sweep accumulates its bound data's cotangents: a scan input's
 * row a step is added into its block alone (not a pass over all of xs every step), and a
 * bound leaf the body does not differentiate (u, closed over with w) is no pass at all.
 * self = {unrolled}; args = ({w, u, c0, xs}) -> sum(c_T * c_T) + sum(ys) + sum(u * u) */
#define SA_N 3
#define SA_T 12
#define SA_U 5

static nb_status sa_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *c = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    nb_var *c2 = nb_tanh(nb_add(nb_matmul(nb_get(tr, self, "w"), c), nb_mul(x, x)));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(c2), nb_leaf(nb_sin(c))}, out);
}

static nb_status sa_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    bool unrolled = false;
    nb_tree_get_bool(nb_tree_get(self, "unrolled"), &unrolled);
    const nb_tree *p = nb_tree_child(args, 0);
    nb_tree *bself = NULL;
    nb_fn *body = NULL;
    nb_status st = nb_tree_dict(
        nb_trace_ctx(tr), 2, (const char *[]){"w", "u"},
        (nb_tree *[]){(nb_tree *)nb_tree_get(p, "w"), (nb_tree *)nb_tree_get(p, "u")}, &bself);
    if (st == NB_OK) {
        st = nb_fn_create(nb_trace_ctx(tr), "sa_body", sa_body, bself, &body);
    }
    nb_tree_destroy(bself);
    if (st != NB_OK) {
        return st;
    }
    nb_var *xs = nb_get(tr, p, "xs"), *u = nb_get(tr, p, "u");
    nb_var *cT = NULL, *ys_sum = NULL;
    if (unrolled) { /* the same steps traced one after another */
        nb_var *c = nb_get(tr, p, "c0");
        for (int t = 0; t < SA_T && c != NULL; t++) {
            nb_var *starts[2] = {nb_scalar_typed(tr, NB_DTYPE_I32, t),
                                 nb_scalar_typed(tr, NB_DTYPE_I32, 0)};
            nb_var *x = nb_reshape(nb_dynamic_slice(xs, starts, (int64_t[]){1, SA_N}), 1,
                                   (int64_t[]){SA_N});
            nb_tree *a = NULL;
            if (nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(c), nb_leaf(x)}, &a) !=
                NB_OK) {
                break;
            }
            const nb_tree *r = nb_apply(tr, body, a);
            nb_tree_destroy(a);
            if (r == NULL) {
                break;
            }
            c = nb_var_of(tr, nb_tree_child(r, 0));
            nb_var *y = nb_sum(nb_var_of(tr, nb_tree_child(r, 1)), NULL, 0, false);
            ys_sum = ys_sum != NULL ? nb_add(ys_sum, y) : y;
        }
        cT = c;
    } else {
        nb_loop_opts o = nb_loop_opts_default();
        o.kind = NB_LOOP_BOUNDED;
        o.max_steps = SA_T;
        const nb_tree *r = nb_scan(tr, body, nb_tree_get(p, "c0"), nb_leaf(xs), SA_T, &o);
        if (r != NULL) {
            cT = nb_var_of(tr, nb_tree_child(r, 0));
            /* ys [T, N]: rows summed in step order, as the unrolled sum adds them */
            nb_var *ys = nb_var_of(tr, nb_tree_child(r, 1));
            nb_var *rows = nb_sum(ys, (int[]){1}, 1, false);
            for (int t = 0; t < SA_T; t++) {
                nb_var *y =
                    nb_reshape(nb_slice(rows, (int64_t[]){t}, (int64_t[]){t + 1}, NULL), 0, NULL);
                ys_sum = ys_sum != NULL ? nb_add(ys_sum, y) : y;
            }
        }
    }
    nb_fn_destroy(body);
    if (cT == NULL || ys_sum == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *l = nb_add(nb_add(nb_sum(nb_mul(cT, cT), NULL, 0, false), ys_sum),
                       nb_sum(nb_mul(u, u), NULL, 0, false));
    return nb_return(l, out);
}

/* Lines of f's native C source for args holding pat, in all its functions (loop bodies;
 * rt_native_lines). */
static int sa_count_in_fns(nb_ctx *ctx, nb_fn *f, const nb_tree *args, const char *pat) {
    int per[16] = {0}, n = rt_native_lines(ctx, f, args, pat, per, 16), total = 0;
    for (int k = 0; k < n && k < 16; k++) {
        total += per[k];
    }
    return total;
}

static void test_scan_accumulate(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double w[SA_N * SA_N], u[SA_U], c0[SA_N], xs[SA_T * SA_N];
    for (int i = 0; i < SA_N * SA_N; i++) {
        w[i] = 0.7 * sin(0.53 * i + 0.1);
    }
    for (int i = 0; i < SA_U; i++) {
        u[i] = 0.3 * i - 0.5;
    }
    for (int i = 0; i < SA_N; i++) {
        c0[i] = 0.4 * cos(1.7 * i);
    }
    for (int i = 0; i < SA_T * SA_N; i++) {
        xs[i] = 0.8 * sin(0.29 * i + 0.3);
    }
    xs[4] = -0.0; /* its step's cotangent 2 x g is a signed zero; the gradient sums zeros */
    nb_array *wa = NULL, *xa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){SA_N, SA_N}, w, &wa));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){SA_T, SA_N}, xs, &xa));
    nb_tree *lw = leaf_of(wa), *lu = vec_f64(ctx, SA_U, u), *lc = vec_f64(ctx, SA_N, c0);
    nb_tree *lx = leaf_of(xa), *p = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"w", "u", "c0", "xs"},
                             (nb_tree *[]){lw, lu, lc, lx}, &p));
    nb_tree_destroy(lw);
    nb_tree_destroy(lu);
    nb_tree_destroy(lc);
    nb_tree_destroy(lx);
    nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){p});
    nb_tree *g[2] = {NULL, NULL};
    int xs_adds = -1, u_adds = -1;
    for (int q = 0; q < 2; q++) {
        nb_tree *fl = NULL, *self = NULL;
        nb_fn *f = NULL, *gf = NULL;
        NBT_OK(ctx, nb_tree_bool(ctx, q == 1, &fl));
        NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"unrolled"}, &fl, &self));
        NBT_OK(ctx, nb_fn_create(ctx, "sa_loss", sa_loss, self, &f));
        NBT_OK(ctx, nb_grad(f, NULL, &gf));
        NBT_OK(ctx, nb_fn_call(gf, args, &g[q]));
        if (q == 0) { /* the loop bodies' adds over all of xs, over all of u */
            xs_adds = sa_count_in_fns(ctx, gf, args, "= add: f64[12,3] */");
            u_adds = sa_count_in_fns(ctx, gf, args, "= add: f64[5] */");
        }
        nb_fn_destroy(gf);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
        nb_tree_destroy(fl);
    }
    bool eq = true; /* bit for bit, leaf by leaf (-0 is not +0 here) */
    for (int k = 0; k < 4; k++) {
        static const char *const leaf[4] = {"w", "u", "c0", "xs"};
        bool same = false;
        NBT_OK(ctx, nb_array_identical(nb_tree_get_array(nb_tree_get(g[0], leaf[k])),
                                       nb_tree_get_array(nb_tree_get(g[1], leaf[k])), &same));
        eq = eq && same;
    }
    printf("scan of %d steps: the bounded gradient %s the unrolled one; adds over all of xs "
           "in the loop bodies: %d, over all of u: %d\n",
           SA_T, eq ? "bit-identical to" : "DIFFERS from", xs_adds, u_adds);
    assert_true(eq);
    NBT_EQ_I64(xs_adds, 0); /* 1 when every step adds a padded row into all of xs */
    NBT_EQ_I64(u_adds, 0);  /* 1 when every step adds u's zero cotangent */
    const double *gx = nb_array_data(nb_tree_get_array(nb_tree_get(g[0], "xs")));
    const double *gu = nb_array_data(nb_tree_get_array(nb_tree_get(g[0], "u")));
    for (int i = 0; i < SA_U; i++) {
        NBT_EQ_I64(gu[i] == 2.0 * u[i], 1); /* only the outside use: 2u, exactly */
    }
    NBT_EQ_I64(signbit(gx[4]) == 0 && gx[4] == 0.0, 1); /* +0, as the sum of zeros gives */
    nb_tree_destroy(g[0]);
    nb_tree_destroy(g[1]);
    nb_tree_destroy(args);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* user buffers through nb_loop_opts.buffers: fori over (x, out) writing out[i] = x */
#define UB_STEPS 40

static nb_status ub_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_var *i = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1].x");
    nb_var *buf = nb_get(tr, args, "[1].out");
    int64_t misuse = 0;
    nb_tree_get_int(nb_tree_get(self, "misuse"), &misuse);
    nb_var *zero = nb_scalar_typed(tr, NB_DTYPE_I32, 0);
    nb_var *starts[2] = {misuse == 4 ? zero : i, zero};
    nb_var *nbuf = nb_dynamic_update_slice(buf, nb_expand_dims(x, 0), starts);
    if (misuse == 3) { /* a second write in the same step */
        nbuf = nb_dynamic_update_slice(nbuf, nb_expand_dims(x, 0), starts);
    }
    nb_var *nx = nb_tanh(nb_matmul(nb_get(tr, self, "w"), x));
    bool reads = misuse == 2;
    if (reads) { /* a misuse: reading the buffer */
        nx = nb_add(nx, nb_sum(buf, NULL, 0, false));
    }
    nb_tree *d = NULL;
    nb_status st = nb_tree_dict(nb_trace_ctx(tr), 2, (const char *[]){"x", "out"},
                                (nb_tree *[]){nb_leaf(nx), nb_leaf(nbuf)}, &d);
    *out = d;
    return st;
}

static nb_status ub_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t ck = 0, bad = 0;
    nb_tree_get_int(nb_tree_get(self, "checkpoints"), &ck);
    nb_tree_get_int(nb_tree_get(self, "bad"), &bad);
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *p = nb_tree_child(args, 0);
    nb_tree *bself = NULL, *carry = NULL, *mask = NULL, *t = NULL, *f = NULL;
    nb_fn *body = NULL;
    nb_var *out0 = nb_full(tr, NB_DTYPE_F64, 2, (int64_t[]){UB_STEPS, 8}, 0.0);
    nb_tree *rl = NULL;
    nb_status st = nb_tree_int(ctx, bad, &rl);
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 2, (const char *[]){"w", "misuse"},
                          (nb_tree *[]){(nb_tree *)nb_tree_get(p, "w"), rl}, &bself);
    }
    nb_tree_destroy(rl);
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "ub_body", ub_body, bself, &body);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 2, (const char *[]){"x", "out"},
                          (nb_tree *[]){(nb_tree *)nb_tree_get(p, "x0"), nb_leaf(out0)}, &carry);
    }
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, true, &t);
    }
    if (st == NB_OK) {
        st = nb_tree_bool(ctx, false, &f);
    }
    if (st == NB_OK) {
        /* bad: a list where the carry is a dict */
        st = bad == 1
                 ? nb_tree_list(ctx, 2, (nb_tree *[]){f, t}, &mask)
                 : nb_tree_dict(ctx, 2, (const char *[]){"x", "out"}, (nb_tree *[]){f, t}, &mask);
    }
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = ck > 0 ? NB_LOOP_CHECKPOINTED : NB_LOOP_BOUNDED;
    o.max_steps = UB_STEPS;
    o.checkpoints = ck;
    o.buffers = mask;
    const nb_tree *r = st == NB_OK ? nb_fori_loop(tr, 0, UB_STEPS, body, carry, &o) : NULL;
    nb_fn_destroy(body);
    nb_tree *ts[] = {bself, carry, mask, t, f};
    for (int i = 0; i < 5; i++) {
        nb_tree_destroy(ts[i]);
    }
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    nb_var *o1 = nb_get(tr, r, "out"), *x = nb_get(tr, r, "x");
    return nb_return(nb_add(nb_sum(nb_square(o1), NULL, 0, false), nb_sum(x, NULL, 0, false)), out);
}

static void test_user_buffers(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double w[64], x0[8];
    for (int i = 0; i < 64; i++) {
        w[i] = 0.8 * sin(0.3 * i + 1.0) / sqrt(8.0);
    }
    for (int i = 0; i < 8; i++) {
        x0[i] = cos(0.7 * i);
    }
    nb_array *wa = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){8, 8}, w, &wa));
    nb_tree *lw = leaf_of(wa), *lx = vec_f64(ctx, 8, x0), *p = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "x0"}, (nb_tree *[]){lw, lx}, &p));
    nb_tree_destroy(lw);
    nb_tree_destroy(lx);
    nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){p});
    nb_tree *g[2] = {NULL, NULL};
    nb_loop_stats ls;
    for (int q = 0; q < 6; q++) {
        nb_tree *cl = NULL, *bl = NULL, *self = NULL, *res = NULL;
        nb_fn *f = NULL, *gf = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, q == 0 ? 0 : 3, &cl));
        NBT_OK(ctx, nb_tree_int(ctx, q < 2 ? 0 : q - 1, &bl));
        NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"checkpoints", "bad"},
                                 (nb_tree *[]){cl, bl}, &self));
        NBT_OK(ctx, nb_fn_create(ctx, "ub_loss", ub_loss, self, &f));
        NBT_OK(ctx, nb_grad(f, NULL, &gf));
        if (q < 2) {
            NBT_OK(ctx, nb_fn_call(gf, args, &res));
            g[q] = res;
        } else if (q == 2) {
            NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call(gf, args, &res));
            NBT_ERRMSG_HAS(ctx, "buffers does not fit the carry");
        } else if (q == 3) {
            NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(gf, args, &res));
            NBT_ERRMSG_HAS(ctx, "the loop body reads the buffer at [1].out (op sum)");
        } else {
            NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(gf, args, &res));
            NBT_ERRMSG_HAS(ctx, "the loop body's writes to the buffer at [1].out are not "
                                "provably at distinct indices");
            NBT_ERRMSG_HAS(ctx, q == 4 ? "written more than once in a step"
                                       : "its row index is not the loop's step counter");
        }
        if (q == 1) {
            NBT_OK(ctx, nb_loop_last_stats(&ls));
        }
        nb_fn_destroy(gf);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
        nb_tree_destroy(cl);
        nb_tree_destroy(bl);
    }
    bool eq = false;
    NBT_OK(ctx, nb_tree_equal(g[0], g[1], &eq));
    assert_true(eq);
    assert_true(ls.buffer_bytes >= (size_t)UB_STEPS * 8 * sizeof(double));
    assert_true(ls.state_bytes < 256);
    nb_tree_destroy(g[0]);
    nb_tree_destroy(g[1]);
    nb_tree_destroy(args);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- no allocation per iteration --------------------------------------------------------- */
static void test_no_allocation_per_step(void **state) {
    (void)state;
    nbt_alloc al = {0};
    nb_ctx *ctx = nbt_ctx_with(&al);
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "f4_outer", f4_outer, NULL, &f));
    int64_t calls[2] = {0, 0}, steps[2] = {0, 0};
    for (int run = 0; run < 3; run++) {
        /* a threshold 1e-9 * scale: scale 1e8 stops after a few steps, 1 after many more */
        double scale = run == 1 ? 1e8 : 1.0, x0[F4_N];
        for (int i = 0; i < F4_N; i++) {
            x0[i] = cos(0.3 * i);
        }
        nb_tree *args = nbt_tuple_take(
            ctx, 2, (nb_tree *[]){f4_params(ctx, scale, 1.0), vec_f64(ctx, F4_N, x0)});
        nb_tree *res = NULL;
        int64_t before = al.n_calls;
        NBT_OK(ctx, nb_fn_call(f, args, &res));
        if (run > 0) { /* run 0 traced and compiled */
            calls[run - 1] = al.n_calls - before;
            steps[run - 1] =
                *(const int32_t *)nb_array_data(nb_tree_get_array(nb_tree_child(res, 0)));
        }
        nb_tree_destroy(res);
        nb_tree_destroy(args);
    }
    printf("allocations per call: %lld for %lld loop steps, %lld for %lld steps\n",
           (long long)calls[0], (long long)steps[0], (long long)calls[1], (long long)steps[1]);
    assert_true(steps[1] > steps[0] + 3);
    NBT_EQ_I64(calls[0], calls[1]);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- reverse mode through cond, zero-trip fori, option limits ------------------------------ */
static nb_fn *g_b0, *g_b1;

static nb_status cg_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    const nb_tree *r =
        nb_cond(tr, nb_gt(nb_sum(x, NULL, 0, false), nb_scalar(tr, 0.0)), g_b0, g_b1, nb_leaf(x));
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    /* a fori loop of zero trips is the identity on its carry */
    const nb_tree *z = nb_fori_loop(tr, 3, 3, g_b0, r, NULL);
    if (z == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_sum(nb_square(nb_var_of(tr, z)), NULL, 0, false), out);
}

static nb_fn *g_cg_grad;

/* sum of the gradient: differentiating it again is a second derivative through the loops */
static nb_status cg_grad_sum(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    const nb_tree *gr = nb_apply(tr, g_cg_grad, args);
    if (gr == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_sum(nb_var_of(tr, gr), NULL, 0, false), out);
}

static nb_status big_ck(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = NB_LOOP_CHECKPOINTED;
    o.checkpoints = (int64_t)1 << 61;
    const nb_tree *r = nb_fori_loop(tr, 0, 3, g_b0, nb_tree_child(args, 0), &o);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

static void test_cond_reverse_and_limits(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    NBT_OK(ctx, nb_fn_create(ctx, "double", br_double, NULL, &g_b0));
    NBT_OK(ctx, nb_fn_create(ctx, "minus1", br_minus, NULL, &g_b1));
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "cg_loss", cg_loss, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    for (int trial = 0; trial < 2; trial++) {
        double x[3] = {trial ? 1.0 : -1.0, 0.5, trial ? 0.25 : -0.75};
        nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){vec_f64(ctx, 3, x)}), *res = NULL;
        NBT_OK(ctx, nb_fn_call(g, args, &res));
        const double *gx = nb_array_data(nb_tree_get_array(res));
        for (int j = 0; j < 3; j++) {
            /* sum > 0: y = 2x, d/dx sum(y^2) = 8x; else y = x - 1: 2(x - 1) */
            NBT_EQ_F64(gx[j], trial ? 8.0 * x[j] : 2.0 * (x[j] - 1.0));
        }
        nb_tree_destroy(res);
        nb_tree_destroy(args);
    }
    /* a second derivative through the loops: refused with what works instead */
    {
        g_cg_grad = g;
        nb_fn *hs = NULL, *hg = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "cg_grad_sum", cg_grad_sum, NULL, &hs));
        NBT_OK(ctx, nb_grad(hs, NULL, &hg));
        double x2[3] = {1.0, 0.5, 0.25};
        nb_tree *a2 = nbt_tuple_take(ctx, 1, (nb_tree *[]){vec_f64(ctx, 3, x2)}), *r2 = NULL;
        NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_fn_call(hg, a2, &r2));
        NBT_ERRMSG_HAS(ctx, "a second derivative through a loop) is not supported");
        nb_tree_destroy(a2);
        nb_fn_destroy(hg);
        nb_fn_destroy(hs);
    }
    /* an absurd checkpoint count is an error, not a crash */
    nb_fn *bf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "big_ck", big_ck, NULL, &bf));
    double x[3] = {1, 2, 3};
    nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){vec_f64(ctx, 3, x)}), *res = NULL;
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_fn_call(bf, args, &res));
    NBT_ERRMSG_HAS(ctx, "0 <= checkpoints <= 2^40");
    nb_tree_destroy(args);
    nb_fn_destroy(bf);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nb_fn_destroy(g_b0);
    nb_fn_destroy(g_b1);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- errors ------------------------------------------------------------------------------ */
static nb_status bad_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_tree *a = nb_leaf(nb_get(tr, args, "[0]"));
    nb_tree *b = nb_leaf(nb_cast(nb_get(tr, args, "[1]"), NB_DTYPE_F32));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){a, b}, out);
}
static nb_status bad_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_get(tr, args, "[1]"), out);
}

static nb_status err_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t which = 0;
    nb_tree_get_int(nb_tree_get(self, "which"), &which);
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *c = NULL, *b = NULL;
    nb_tree *nl = NULL, *cself = NULL;
    nb_tree_int(ctx, 3, &nl);
    nb_tree_dict(ctx, 1, (const char *[]){"n"}, &nl, &cself);
    nb_fn_create(ctx, "cond", which == 1 ? bad_cond : w_cond, cself, &c);
    nb_fn_create(ctx, "body", which == 0 ? bad_body : w_body, NULL, &b);
    nb_tree *carry = NULL;
    nb_tree_tuple(ctx, 2,
                  (nb_tree *[]){nb_leaf(nb_scalar_typed(tr, NB_DTYPE_I32, 0)),
                                (nb_tree *)nb_tree_child(args, 0)},
                  &carry);
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = which == 2 ? NB_LOOP_CHECKPOINTED : NB_LOOP_LAX;
    const nb_tree *r = nb_while_loop(tr, c, b, carry, &o);
    nb_tree_destroy(carry);
    nb_tree_destroy(nl);
    nb_tree_destroy(cself);
    nb_fn_destroy(c);
    nb_fn_destroy(b);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

/* A loop whose trip count is known at trace time cannot be cut short by max_steps:
 * fori(0, 10) or scan(length 10) with max_steps 3 is an error in every kind (it ran 3 steps
 * and said NB_OK); max_steps >= the trip count is fine. self: {kind, max_steps, scan}. */
static nb_status ms_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_add(nb_get(tr, args, "[1]"), nb_scalar(tr, 1.0)), out);
}

static nb_status ms_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t kind = 0, max_steps = 0, scan = 0;
    nb_tree_get_int(nb_tree_get(self, "kind"), &kind);
    nb_tree_get_int(nb_tree_get(self, "max_steps"), &max_steps);
    nb_tree_get_int(nb_tree_get(self, "scan"), &scan);
    nb_fn *b = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "ms_body", scan ? sc_body : ms_body, NULL, &b);
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = (nb_loop_kind)kind;
    o.max_steps = max_steps;
    const nb_tree *r = NULL;
    if (st == NB_OK && scan) {
        nb_var *xs = nb_full(tr, NB_DTYPE_F64, 2, (int64_t[]){10, 3}, 1.0);
        r = nb_scan(tr, b, nb_tree_child(args, 0), nb_leaf(xs), 10, &o);
        r = r != NULL ? nb_tree_child(r, 0) : NULL;
    } else if (st == NB_OK) {
        r = nb_fori_loop(tr, 0, 10, b, nb_tree_child(args, 0), &o);
    }
    nb_fn_destroy(b);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)r);
    return NB_OK;
}

static void test_max_steps_below_trip_count(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int scan = 0; scan < 2; scan++) {
        for (int kind = NB_LOOP_LAX; kind <= NB_LOOP_BOUNDED; kind++) {
            for (int k = 0; k < 3; k++) {
                const int64_t ms = k == 0 ? 3 : k == 1 ? 10 : 20;
                nb_tree *kl = NULL, *ml = NULL, *sl = NULL, *self = NULL;
                NBT_OK(ctx, nb_tree_int(ctx, kind, &kl));
                NBT_OK(ctx, nb_tree_int(ctx, ms, &ml));
                NBT_OK(ctx, nb_tree_int(ctx, scan, &sl));
                NBT_OK(ctx, nb_tree_dict(ctx, 3, (const char *[]){"kind", "max_steps", "scan"},
                                         (nb_tree *[]){kl, ml, sl}, &self));
                nb_fn *f = NULL;
                NBT_OK(ctx, nb_fn_create(ctx, "ms_outer", ms_outer, self, &f));
                double x[3] = {1, 2, 3};
                nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){vec_f64(ctx, 3, x)});
                nb_tree *res = NULL;
                nb_status st = nb_fn_call(f, args, &res);
                if (ms < 10) {
                    if (st != NB_ERR_INVALID) {
                        fail_msg("%s kind %d max_steps %lld: %s (%s)", scan ? "scan" : "fori", kind,
                                 (long long)ms, nb_status_name(st), nb_ctx_errmsg(ctx));
                    }
                    NBT_ERRMSG_HAS(ctx, scan ? "max_steps = 3 is less than the length 10"
                                             : "max_steps = 3 is less than the trip count 10");
                    assert_null(res);
                } else {
                    if (st != NB_OK) {
                        fail_msg("%s kind %d max_steps %lld: %s", scan ? "scan" : "fori", kind,
                                 (long long)ms, nb_ctx_errmsg(ctx));
                    }
                    double v = 0;
                    NBT_OK(ctx, nb_array_get(nb_tree_get_array(res), (int64_t[]){0}, &v));
                    NBT_EQ_F64(v, 11.0); /* 10 steps of +1 from 1 (scan: c + x, x = 1) */
                }
                nb_tree_destroy(res);
                nb_tree_destroy(args);
                nb_fn_destroy(f);
                nb_tree *all[] = {self, sl, ml, kl};
                for (int i = 0; i < 4; i++) {
                    nb_tree_destroy(all[i]);
                }
            }
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* lax.scan of length 0 (as fori over an empty range): the initial carry and ys with a
 * leading dim of 0, jitted and under grad (d sum(carry) / d c0 = 1). */
static nb_status s0_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_fn *b = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "sc_body", sc_body, NULL, &b);
    const nb_tree *r = st == NB_OK
                           ? nb_scan(tr, b, nb_tree_child(args, 0), nb_tree_child(args, 1), 0, NULL)
                           : NULL;
    nb_fn_destroy(b);
    if (r == NULL) {
        return st != NB_OK ? st : nb_trace_status(tr);
    }
    nb_var *c = nb_var_of(tr, nb_tree_child(r, 0)), *ys = nb_var_of(tr, nb_tree_child(r, 1));
    return nb_tree_tuple(nb_trace_ctx(tr), 3,
                         (nb_tree *[]){nb_leaf(nb_sum(c, NULL, 0, false)), nb_leaf(c), nb_leaf(ys)},
                         out);
}

static nb_status s0_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_tree *r = NULL;
    nb_status st = s0_outer(tr, self, args, &r);
    if (st != NB_OK) {
        return st;
    }
    st = nb_return(nb_var_of(tr, nb_tree_child(r, 0)), out);
    nb_tree_destroy(r);
    return st;
}

static void test_scan_length_zero(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double c0[2] = {1.5, -2.0};
    nb_array *xs = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 2, (int64_t[]){0, 2}, &xs));
    nb_tree *args = nbt_tuple_take(ctx, 2, (nb_tree *[]){vec_f64(ctx, 2, c0), leaf_of(xs)});
    nb_fn *f = NULL, *l = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "s0", s0_outer, NULL, &f));
    nb_tree *res = NULL;
    NBT_OK(ctx, nb_fn_call(f, args, &res));
    double v = 0;
    NBT_OK(ctx, nb_array_get(nb_tree_get_array(nb_tree_child(res, 0)), NULL, &v));
    NBT_EQ_F64(v, -0.5);
    const nb_array *ys = nb_tree_get_array(nb_tree_child(res, 2));
    NBT_EQ_I64(nb_array_rank(ys), 2);
    NBT_EQ_I64(nb_array_shape(ys)[0], 0);
    NBT_EQ_I64(nb_array_shape(ys)[1], 2);
    nb_tree_destroy(res);
    NBT_OK(ctx, nb_fn_create(ctx, "s0_loss", s0_loss, NULL, &l));
    NBT_OK(ctx, nb_grad(l, NULL, &g));
    NBT_OK(ctx, nb_fn_call(g, args, &res));
    for (int64_t i = 0; i < 2; i++) {
        NBT_OK(ctx, nb_array_get(nb_tree_get_array(res), (int64_t[]){i}, &v));
        NBT_EQ_F64(v, 1.0);
    }
    nb_tree_destroy(res);
    nb_fn_destroy(g);
    nb_fn_destroy(l);
    nb_fn_destroy(f);
    nb_tree_destroy(args); /* xs went into it (leaf_of) */
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const char *want[3] = {
        "nb_while_loop: the body 'body' returns f32[3] at [1] where the carry is f64[3]",
        "nb_while_loop: the cond 'cond' returns f64[3]; it must return a 0-d bool",
        "a checkpointed loop needs max_steps or checkpoints"};
    const nb_status want_st[3] = {NB_ERR_STRUCTURE, NB_ERR_SHAPE, NB_ERR_INVALID};
    for (int which = 0; which < 3; which++) {
        nb_tree *wl = NULL, *self = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, which, &wl));
        NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"which"}, &wl, &self));
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "err_outer", err_outer, self, &f));
        double x[3] = {1, 2, 3};
        nb_tree *args = nbt_tuple_take(ctx, 1, (nb_tree *[]){vec_f64(ctx, 3, x)});
        nb_tree *res = NULL;
        NBT_STATUS(ctx, want_st[which], nb_fn_call(f, args, &res));
        NBT_ERRMSG_HAS(ctx, want[which]);
        assert_null(res);
        nb_tree_destroy(args);
        nb_fn_destroy(f);
        nb_tree_destroy(self);
        nb_tree_destroy(wl);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_while),
        cmocka_unit_test(test_failure4_closures),
        cmocka_unit_test(test_fori_scan_cond),
        cmocka_unit_test(test_bounded_reverse),
        cmocka_unit_test(test_prefix_cond_runs_body),
        cmocka_unit_test(test_body_calls),
        cmocka_unit_test(test_checkpointed_rows),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_max_steps_below_trip_count),
        cmocka_unit_test(test_scan_length_zero),
        cmocka_unit_test(test_scan_buffers),
        cmocka_unit_test(test_scan_accumulate),
        cmocka_unit_test(test_user_buffers),
        cmocka_unit_test(test_cond_reverse_and_limits),
        cmocka_unit_test(test_no_allocation_per_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
