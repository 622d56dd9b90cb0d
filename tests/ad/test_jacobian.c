/*
 * test_jacobian.c -- nb_jacrev, nb_jacfwd, nb_jacobian, nb_hessian (nabla/ad.h):
 *   - closed forms: a 3 x 2 Jacobian and a 2 x 2 Hessian, f64, every mode within 4 ulp;
 *   - a linear map: every mode gives the matrix itself, bit for bit (one nonzero per sum);
 *   - pytrees: a dict argument with an integer leaf and an output tuple with an integer
 *     leaf: blocks of shape Sy + Sx, null where either side is not float, values against
 *     closed forms;
 *   - composition: jit(jacrev) traced once, vmap(jacfwd) over a batch of points, grad of a
 *     loss of the Jacobian (against its closed form), the Jacobian of a fori loop;
 *   - custom_jvp: a rule that is not f's derivative (a clipped one) is what jvp, jacfwd,
 *     grad and jacrev see, under jit;
 *   - errors; allocation failures over jit(jacrev): NB_ERR_OOM, nothing leaked.
 */
#include "nbtest.h"

#include <math.h>
#include <string.h>

static nb_var *el(nb_var *x, int64_t i) {
    return nb_slice(x, (int64_t[]){i}, (int64_t[]){i + 1}, NULL);
}

/* f(x) = [sin(x0) x1, x0^2, exp(x1)] */
static nb_status body_f(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *x0 = el(x, 0), *x1 = el(x, 1);
    return nb_return(
        nb_concatenate(3, (nb_var *[]){nb_mul(nb_sin(x0), x1), nb_mul(x0, x0), nb_exp(x1)}, 0),
        out);
}

/* g(x) = sin(x0) x1^2 + x0^3 */
static nb_status body_g(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *x0 = el(x, 0), *x1 = el(x, 1);
    nb_var *s = nb_add(nb_mul(nb_sin(x0), nb_mul(x1, x1)), nb_mul(x0, nb_mul(x0, x0)));
    return nb_return(nb_sum(s, NULL, 0, false), out);
}

static nb_tree *vec_args(nb_ctx *ctx, int64_t n, const double *v) {
    nb_array *a = nbt_arr_f64(ctx, 1, &n, v);
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_tree_array(a, &l));
    nb_array_destroy(a);
    return nbt_tuple_take(ctx, 1, (nb_tree *[]){l});
}

static double at(const nb_tree *t, int64_t i) {
    double v = NAN;
    nb_array_get_flat(nb_tree_get_array(t), i, &v);
    return v;
}

static void near_ulps(double got, double want, double ulps) {
    double tol = ulps * 2.220446049250313e-16 * fmax(1.0, fabs(want));
    if (!(fabs(got - want) <= tol)) {
        fail_msg("%.17g is not within %g ulp of %.17g", got, ulps, want);
    }
}

static void test_closed_forms(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL, *j[3] = {NULL}, *h = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "f", body_f, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "g", body_g, NULL, &g));
    NBT_OK(ctx, nb_jacrev(f, &j[0]));
    NBT_OK(ctx, nb_jacfwd(f, &j[1]));
    NBT_OK(ctx, nb_jacobian(f, &j[2]));
    NBT_OK(ctx, nb_hessian(g, &h));
    double a = 0.7, b = 1.3;
    nb_tree *args = vec_args(ctx, 2, (double[]){a, b});
    double want[6] = {cos(a) * b, sin(a), 2 * a, 0, 0, exp(b)};
    for (int m = 0; m < 3; m++) {
        nb_tree *o = NULL;
        NBT_OK(ctx, nb_fn_call(j[m], args, &o));
        NBT_EQ_I64(nb_array_rank(nb_tree_get_array(o)), 2);
        NBT_EQ_I64(nb_array_dim(nb_tree_get_array(o), 0), 3);
        NBT_EQ_I64(nb_array_dim(nb_tree_get_array(o), 1), 2);
        for (int k = 0; k < 6; k++) {
            near_ulps(at(o, k), want[k], 4);
        }
        nb_tree_destroy(o);
    }
    nb_tree *o = NULL;
    NBT_OK(ctx, nb_fn_call(h, args, &o));
    double hw[4] = {-sin(a) * b * b + 6 * a, 2 * b * cos(a), 2 * b * cos(a), 2 * sin(a)};
    for (int k = 0; k < 4; k++) {
        near_ulps(at(o, k), hw[k], 8);
    }
    NBT_EQ_F64(at(o, 1), at(o, 2)); /* symmetric */
    nb_tree_destroy(o);
    nb_tree_destroy(args);
    for (int m = 0; m < 3; m++) {
        nb_fn_destroy(j[m]);
    }
    nb_fn_destroy(h);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* a linear map y = A x, A 4 x 3 */
static const double A43[12] = {0.3, -1.7, 2.25, 0.1, 5.5, -0.125, 3.0, 1e-3, -7.75, 0.6, 0.0, 1.1};
static nb_status body_lin(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *A = nb_reshape(nb_iota(tr, NB_DTYPE_F64, 1, (int64_t[]){12}, 0), 2, (int64_t[]){4, 3});
    /* A's values: constants from a table (iota picks the element) */
    nb_var *tab = nb_full(tr, NB_DTYPE_F64, 2, (int64_t[]){4, 3}, 0.0);
    for (int k = 0; k < 12; k++) {
        tab = nb_add(tab,
                     nb_mul(nb_cast(nb_eq(A, nb_scalar_typed(tr, NB_DTYPE_F64, k)), NB_DTYPE_F64),
                            nb_scalar_typed(tr, NB_DTYPE_F64, A43[k])));
    }
    return nb_return(nb_matmul(tab, nb_get(tr, args, "[0]")), out);
}

static void test_linear_exact(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *jr = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "lin", body_lin, NULL, &f));
    NBT_OK(ctx, nb_jacrev(f, &jr));
    NBT_OK(ctx, nb_jacfwd(f, &jf));
    nb_tree *args = vec_args(ctx, 3, (double[]){0.5, -2.0, 3.25}), *r = NULL, *w = NULL;
    NBT_OK(ctx, nb_fn_call(jr, args, &r));
    NBT_OK(ctx, nb_fn_call(jf, args, &w));
    for (int k = 0; k < 12; k++) {
        NBT_EQ_F64(at(r, k), A43[k]);
        NBT_EQ_F64(at(w, k), A43[k]);
    }
    nb_tree_destroy(r);
    nb_tree_destroy(w);
    nb_tree_destroy(args);
    nb_fn_destroy(jf);
    nb_fn_destroy(jr);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* args[0] = dict(a f64[2,3], b f64[], n i32[]) -> (y1 f64[4], y2 f64[], count i32[]):
 *   y1[k] = sum_ij C[k,i,j] a[i,j]^2 + b,  C[k,i,j] = k + i - j;  y2 = b^2 sum(a) */
static nb_status body_tree(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *a = nb_get(tr, args, "[0].a"), *b = nb_get(tr, args, "[0].b");
    nb_var *n = nb_get(tr, args, "[0].n");
    nb_var *C = nb_add(nb_sub(nb_iota(tr, NB_DTYPE_F64, 3, (int64_t[]){4, 2, 3}, 0),
                              nb_iota(tr, NB_DTYPE_F64, 3, (int64_t[]){4, 2, 3}, 2)),
                       nb_iota(tr, NB_DTYPE_F64, 3, (int64_t[]){4, 2, 3}, 1));
    nb_var *y1 = nb_add(nb_sum(nb_mul(C, nb_mul(a, a)), (int[]){1, 2}, 2, false), b);
    nb_var *y2 = nb_mul(nb_mul(b, b), nb_sum(a, NULL, 0, false));
    nb_var *cnt = nb_add(n, nb_scalar_typed(tr, NB_DTYPE_I32, 1));
    return nb_tree_tuple(nb_trace_ctx(tr), 3, (nb_tree *[]){nb_leaf(y1), nb_leaf(y2), nb_leaf(cnt)},
                         out);
}

static nb_tree *tree_args(nb_ctx *ctx, const double *av, double b) {
    nb_array *a = nbt_arr_f64(ctx, 2, (int64_t[]){2, 3}, av), *bs = NULL, *ns = NULL;
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, b, &bs));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_I32, 4, &ns));
    nb_tree *l[3] = {NULL}, *d = NULL;
    NBT_OK(ctx, nb_tree_array(a, &l[0]));
    NBT_OK(ctx, nb_tree_array(bs, &l[1]));
    NBT_OK(ctx, nb_tree_array(ns, &l[2]));
    NBT_OK(ctx, nb_tree_dict(ctx, 3, (const char *[]){"a", "b", "n"}, l, &d));
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(l[i]);
    }
    nb_array_destroy(a);
    nb_array_destroy(bs);
    nb_array_destroy(ns);
    return nbt_tuple_take(ctx, 1, (nb_tree *[]){d});
}

static void test_pytrees(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double av[6] = {0.5, -1.0, 2.0, 1.5, 0.25, -0.75}, b = 1.25, sa = 0;
    for (int i = 0; i < 6; i++) {
        sa += av[i];
    }
    nb_fn *f = NULL, *jm[2] = {NULL};
    NBT_OK(ctx, nb_fn_create(ctx, "tree", body_tree, NULL, &f));
    NBT_OK(ctx, nb_jacrev(f, &jm[0]));
    NBT_OK(ctx, nb_jacfwd(f, &jm[1]));
    nb_tree *args = tree_args(ctx, av, b);
    for (int m = 0; m < 2; m++) {
        nb_tree *o = NULL;
        NBT_OK(ctx, nb_fn_call(jm[m], args, &o));
        NBT_EQ_I64(nb_tree_len(o), 3);
        const nb_tree *j1 = nb_tree_child(o, 0), *j2 = nb_tree_child(o, 1);
        NBT_EQ_I64(nb_tree_kind_of(nb_tree_child(o, 2)), NB_TREE_KIND_NULL);  /* i32 output */
        NBT_EQ_I64(nb_tree_kind_of(nb_tree_get(j1, "n")), NB_TREE_KIND_NULL); /* i32 input */
        NBT_EQ_I64(nb_tree_kind_of(nb_tree_get(j2, "n")), NB_TREE_KIND_NULL);
        const nb_array *d1a = nb_tree_get_array(nb_tree_get(j1, "a"));
        const nb_array *d1b = nb_tree_get_array(nb_tree_get(j1, "b"));
        const nb_array *d2a = nb_tree_get_array(nb_tree_get(j2, "a"));
        const nb_array *d2b = nb_tree_get_array(nb_tree_get(j2, "b"));
        NBT_EQ_I64(nb_array_rank(d1a), 3); /* [4] + [2,3] */
        NBT_EQ_I64(nb_array_dim(d1a, 0), 4);
        NBT_EQ_I64(nb_array_dim(d1a, 2), 3);
        NBT_EQ_I64(nb_array_rank(d1b), 1); /* [4] + [] */
        NBT_EQ_I64(nb_array_rank(d2a), 2); /* [] + [2,3] */
        NBT_EQ_I64(nb_array_rank(d2b), 0);
        for (int k = 0; k < 4; k++) {
            for (int i = 0; i < 2; i++) {
                for (int jj = 0; jj < 3; jj++) {
                    double got = 0;
                    NBT_OK(ctx, nb_array_get(d1a, (int64_t[]){k, i, jj}, &got));
                    near_ulps(got, 2.0 * (k + i - jj) * av[i * 3 + jj], 4);
                }
            }
            double got = 0;
            NBT_OK(ctx, nb_array_get_flat(d1b, k, &got));
            NBT_EQ_F64(got, 1.0);
        }
        for (int q = 0; q < 6; q++) {
            double got = 0;
            NBT_OK(ctx, nb_array_get_flat(d2a, q, &got));
            NBT_EQ_F64(got, b * b);
        }
        double got = 0;
        NBT_OK(ctx, nb_array_get_flat(d2b, 0, &got));
        near_ulps(got, 2 * b * sa, 4);
        nb_tree_destroy(o);
    }
    nb_tree_destroy(args);
    nb_fn_destroy(jm[0]);
    nb_fn_destroy(jm[1]);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* loss(x) = sum(jacrev(f)(x)^2): grad of a function of the Jacobian */
static nb_fn *g_jac;
static nb_status body_jloss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *J = nb_apply(tr, g_jac, args);
    if (J == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *j = nb_var_of(tr, J);
    return nb_return(nb_sum(nb_mul(j, j), NULL, 0, false), out);
}

/* x -> fori 3 times: x <- sin(x) * 1.5 (elementwise), as a loop */
static nb_status body_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[1]");
    return nb_return(nb_mul(nb_sin(x), nb_scalar_typed(tr, NB_DTYPE_F64, 1.5)), out);
}
static nb_status body_loop(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_fn *stepf = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "step", body_step, NULL, &stepf);
    if (st != NB_OK) {
        return st;
    }
    /* self true: checkpointed (reverse mode through it), else lax (forward only) */
    bool ckpt = false;
    nb_tree_get_bool(self, &ckpt);
    nb_loop_opts lo = nb_loop_opts_default();
    lo.kind = ckpt ? NB_LOOP_CHECKPOINTED : NB_LOOP_LAX;
    const nb_tree *r = nb_fori_loop(tr, 0, 3, stepf, nb_tree_child(args, 0), &lo);
    nb_fn_destroy(stepf);
    return r != NULL ? nb_return(nb_var_of(tr, r), out) : nb_trace_status(tr);
}

static void test_composition(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *jr = NULL, *jj = NULL, *jf = NULL, *vj = NULL, *loss = NULL, *gl = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "f", body_f, NULL, &f));
    NBT_OK(ctx, nb_jacrev(f, &jr));
    NBT_OK(ctx, nb_jit(jr, NULL, &jj));
    NBT_OK(ctx, nb_jacfwd(f, &jf));
    /* jit(jacrev): one trace for new values */
    for (int t = 0; t < 3; t++) {
        nb_tree *args = vec_args(ctx, 2, (double[]){0.1 * t, 1.0 + t}), *o = NULL;
        NBT_OK(ctx, nb_fn_call(jj, args, &o));
        near_ulps(at(o, 5), exp(1.0 + t), 4);
        nb_tree_destroy(o);
        nb_tree_destroy(args);
    }
    nb_fn_stats s;
    NBT_OK(ctx, nb_fn_stats_get(jj, &s));
    NBT_EQ_I64(s.n_traces, 1);
    /* vmap(jacfwd) over 4 points: [4, 3, 2] */
    NBT_OK(ctx, nb_vmap(jf, NULL, &vj));
    double xs[8] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
    nb_array *xa = nbt_arr_f64(ctx, 2, (int64_t[]){4, 2}, xs);
    nb_tree *xl = NULL, *o = NULL;
    NBT_OK(ctx, nb_tree_array(xa, &xl));
    nb_array_destroy(xa);
    nb_tree *bargs = nbt_tuple_take(ctx, 1, (nb_tree *[]){xl});
    NBT_OK(ctx, nb_fn_call(vj, bargs, &o));
    NBT_EQ_I64(nb_array_rank(nb_tree_get_array(o)), 3);
    for (int p = 0; p < 4; p++) {
        double a = xs[2 * p], b = xs[2 * p + 1];
        near_ulps(at(o, p * 6 + 0), cos(a) * b, 4);
        near_ulps(at(o, p * 6 + 2), 2 * a, 4);
        near_ulps(at(o, p * 6 + 5), exp(b), 4);
    }
    nb_tree_destroy(o);
    nb_tree_destroy(bargs);
    /* grad of sum(J^2) = grad of (cos(a) b)^2 + sin(a)^2 + 4 a^2 + exp(2 b):
     * d/da = -2 cos(a) sin(a) b^2 + 2 sin(a) cos(a) + 8 a; d/db = 2 cos(a)^2 b + 2 exp(2 b) */
    g_jac = jr;
    NBT_OK(ctx, nb_fn_create(ctx, "jloss", body_jloss, NULL, &loss));
    NBT_OK(ctx, nb_grad(loss, NULL, &gl));
    double a = 0.4, b = 0.9;
    nb_tree *args = vec_args(ctx, 2, (double[]){a, b});
    NBT_OK(ctx, nb_fn_call(gl, args, &o));
    near_ulps(at(o, 0), -2 * cos(a) * sin(a) * b * b + 2 * sin(a) * cos(a) + 8 * a, 16);
    near_ulps(at(o, 1), 2 * cos(a) * cos(a) * b + 2 * exp(2 * b), 16);
    nb_tree_destroy(o);
    nb_tree_destroy(args);
    /* the Jacobian of a fori loop: diagonal, the product of 1.5 cos(x_t) along the iterates;
     * jacfwd through a lax loop, jacrev through a checkpointed one */
    nb_fn *lp[2] = {NULL, NULL}, *jl[2] = {NULL, NULL};
    nb_tree *kind[2] = {NULL, NULL};
    args = vec_args(ctx, 2, (double[]){0.3, -1.1});
    for (int m = 0; m < 2; m++) {
        NBT_OK(ctx, nb_tree_bool(ctx, m == 1, &kind[m]));
        NBT_OK(ctx, nb_fn_create(ctx, "loop", body_loop, kind[m], &lp[m]));
        NBT_OK(ctx, m == 0 ? nb_jacfwd(lp[m], &jl[m]) : nb_jacrev(lp[m], &jl[m]));
        NBT_OK(ctx, nb_fn_call(jl[m], args, &o));
        for (int i = 0; i < 2; i++) {
            double x = i == 0 ? 0.3 : -1.1, d = 1;
            for (int t = 0; t < 3; t++) {
                d *= 1.5 * cos(x);
                x = 1.5 * sin(x);
            }
            near_ulps(at(o, i * 2 + i), d, 16);
            NBT_EQ_F64(at(o, i * 2 + (1 - i)), 0.0);
        }
        nb_tree_destroy(o);
        nb_tree_destroy(kind[m]);
    }
    nb_tree_destroy(args);
    nb_fn *fns[] = {jl[0], jl[1], lp[0], lp[1], gl, loss, vj, jf, jj, jr, f};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        nb_fn_destroy(fns[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* f(x) = log(1 + exp(x)) (softplus, elementwise); the rule says its derivative is
 * min(sigmoid(x), 0.75): not f's, so every derivative seen is the rule's */
static nb_status body_sp(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    return nb_return(nb_log(nb_add(nb_exp(x), nb_scalar_typed(tr, NB_DTYPE_F64, 1.0))), out);
}
static nb_status body_sp_rule(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0][0]"), *t = nb_get(tr, args, "[1][0]");
    nb_var *d = nb_minimum(nb_sigmoid(x), nb_scalar_typed(tr, NB_DTYPE_F64, 0.75));
    nb_var *y = nb_log(nb_add(nb_exp(x), nb_scalar_typed(tr, NB_DTYPE_F64, 1.0)));
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(y), nb_leaf(nb_mul(d, t))},
                         out);
}
static nb_fn *g_sp;
static nb_status body_sp_sum(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    const nb_tree *r = nb_apply(tr, g_sp, args);
    return r != NULL ? nb_return(nb_sum(nb_var_of(tr, r), NULL, 0, false), out)
                     : nb_trace_status(tr);
}

static void test_custom_jvp(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *rule = NULL, *g = NULL, *jr = NULL, *jf = NULL, *jj = NULL, *s = NULL;
    nb_fn *gr = NULL, *jv = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "softplus", body_sp, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "softplus_rule", body_sp_rule, NULL, &rule));
    NBT_OK(ctx, nb_custom_jvp(f, rule, &g));
    NBT_OK(ctx, nb_jacrev(g, &jr));
    NBT_OK(ctx, nb_jacfwd(g, &jf));
    NBT_OK(ctx, nb_jit(jr, NULL, &jj));
    g_sp = g;
    NBT_OK(ctx, nb_fn_create(ctx, "sp_sum", body_sp_sum, NULL, &s));
    NBT_OK(ctx, nb_grad(s, NULL, &gr));
    NBT_OK(ctx, nb_jvp(g, &jv));
    double xs[3] = {-1.0, 0.5, 3.0};
    nb_tree *args = vec_args(ctx, 3, xs), *o = NULL;
    /* the value is f's */
    NBT_OK(ctx, nb_fn_call(g, args, &o));
    for (int i = 0; i < 3; i++) {
        near_ulps(at(o, i), log1p(exp(xs[i])), 4);
    }
    nb_tree_destroy(o);
    nb_fn *ms[3] = {jr, jf, jj};
    for (int m = 0; m < 3; m++) {
        NBT_OK(ctx, nb_fn_call(ms[m], args, &o));
        for (int i = 0; i < 3; i++) {
            for (int k = 0; k < 3; k++) {
                double d = fmin(1.0 / (1.0 + exp(-xs[i])), 0.75);
                near_ulps(at(o, i * 3 + k), i == k ? d : 0.0, 4);
            }
        }
        nb_tree_destroy(o);
    }
    NBT_OK(ctx, nb_fn_call(gr, args, &o));
    near_ulps(at(o, 2), 0.75, 1); /* sigmoid(3) = 0.95 clipped: the rule's */
    near_ulps(at(o, 0), 1.0 / (1.0 + exp(1.0)), 4);
    nb_tree_destroy(o);
    /* jvp with a tangent of 2 */
    nb_tree *tan = vec_args(ctx, 3, (double[]){2, 2, 2});
    nb_tree *pt = nbt_tuple_take(ctx, 2, (nb_tree *[]){nb_tree_retain(args), tan});
    NBT_OK(ctx, nb_fn_call(jv, pt, &o));
    near_ulps(at(nb_tree_child(o, 1), 2), 1.5, 1);
    nb_tree_destroy(o);
    nb_tree_destroy(pt);
    nb_tree_destroy(args);
    nb_fn *fns[] = {jv, gr, s, jj, jf, jr, g, rule, f};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        nb_fn_destroy(fns[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *j = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "f", body_f, NULL, &f));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_jacrev(f, NULL));
    NBT_ERRMSG_HAS(ctx, "nb_jacrev: out is NULL");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_jacfwd(NULL, &j));
    NBT_TRUE(j == NULL);
    NBT_OK(ctx, nb_jacrev(f, &j));
    nb_tree *x = NULL, *o = NULL;
    nb_array *a = nbt_arr_f64(ctx, 1, (int64_t[]){2}, (double[]){1, 2});
    NBT_OK(ctx, nb_tree_array(a, &x));
    nb_array_destroy(a);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call(j, x, &o)); /* not a tuple */
    NBT_ERRMSG_HAS(ctx, "they must be a tuple or list whose first element is what the Jacobian "
                        "is taken with respect to");
    nb_tree_destroy(x);
    nb_fn_destroy(j);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static nb_status scenario_jac(nb_ctx *ctx) {
    nb_fn *f = NULL, *j = NULL, *jj = NULL;
    nb_tree *args = NULL, *o = NULL, *l = NULL;
    nb_array *a = NULL;
    nb_status st = nb_fn_create(ctx, "f", body_f, NULL, &f);
    if (st == NB_OK) {
        st = nb_hessian(f, &j);
    }
    if (st == NB_OK) {
        st = nb_jit(j, NULL, &jj);
    }
    if (st == NB_OK) {
        st = nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){0.5, 1.5}, &a);
    }
    if (st == NB_OK) {
        st = nb_tree_array(a, &l);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 1, &l, &args);
    }
    if (st == NB_OK) {
        st = nb_fn_call(jj, args, &o);
    }
    nb_tree_destroy(o);
    nb_tree_destroy(args);
    nb_tree_destroy(l);
    nb_array_destroy(a);
    nb_fn_destroy(jj);
    nb_fn_destroy(j);
    nb_fn_destroy(f);
    return st;
}

static void test_out_of_memory(void **state) {
    (void)state;
    int n = nbt_oom_sweep("scenario_jac", scenario_jac, true, true);
    printf("allocation failures: %d points, each NB_ERR_OOM with nothing leaked\n", n);
    NBT_TRUE(n > 50);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_forms),  cmocka_unit_test(test_linear_exact),
        cmocka_unit_test(test_pytrees),       cmocka_unit_test(test_composition),
        cmocka_unit_test(test_custom_jvp),    cmocka_unit_test(test_errors),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
