/*
 * test_fused.c -- fused elementwise programs over tiny index spaces (src/exec/fused.c runs
 * those of up to 64 elements as one planned tile, float arithmetic in line up to 4):
 * at sizes on both sides of those limits, programs with a broadcast row, a scalar, offset,
 * reversed, strided and padded views, stored values (a cluster member also returned) and
 * trailing sums, maxima and minima (f32, f64, i32; NaN and -0.0 among the values) give
 * the bits of the unfused evaluation -- the same program over constants, folded op by op
 * at compile time -- with 1 and 3 threads. And a transcendental's value of an element does
 * not depend on its neighbours (test_fused_lanes).
 */
#include "nbtest.h"

#include <stdlib.h>

#include <nabla/fn.h>
#include <nabla/trace.h>

static bool g_consts; /* trace over the constants g_in: folded op by op, unfused */
static nb_array *g_in[5];
static int64_t g_r, g_c;

#define N_OUT 10

/* args: (x [r, c], w [c], s [], big [2r + 3, 2c + 3], k i32 [r, c]); x, w, s, big f32 or f64 */
static nb_status body_tiny(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = g_consts ? nb_constant(tr, g_in[i]) : nb_get(tr, args, "[%d]", i);
    }
    nb_var *x = v[0], *w = v[1], *s = v[2], *big = v[3], *k = v[4];
    int64_t r = g_r, c = g_c;
    nb_var *v1 = nb_slice(big, (int64_t[]){1, 2}, (int64_t[]){1 + r, 2 + c}, NULL);
    nb_var *v2 = nb_slice(big, (int64_t[]){r, c}, (int64_t[]){0, 0}, (int64_t[]){-1, -1});
    nb_var *v3 = nb_slice(big, (int64_t[]){0, 1}, (int64_t[]){2 * r, 2 * c + 1}, (int64_t[]){2, 2});
    nb_var *p1 = v2; /* padded rows, else padded columns (a 1 x 1 has nothing to pad) */
    if (r >= 2) {
        p1 = nb_pad(nb_slice(big, (int64_t[]){2, 0}, (int64_t[]){r + 1, c}, NULL),
                    (int64_t[]){1, 0}, (int64_t[]){0, 0}, 0.75);
    } else if (c >= 2) {
        p1 = nb_pad(nb_slice(big, (int64_t[]){0, 3}, (int64_t[]){r, c + 2}, NULL),
                    (int64_t[]){0, 0}, (int64_t[]){0, 1}, -2.5);
    }
    nb_var *p2 = v3; /* padded before and after */
    if (c >= 3) {
        p2 = nb_pad(nb_slice(big, (int64_t[]){1, 1}, (int64_t[]){1 + r, c - 1}, NULL),
                    (int64_t[]){0, 1}, (int64_t[]){0, 1}, 0.5);
    }
    nb_var *t = nb_tanh(nb_add(nb_mul(x, w), s));
    nb_var *u = nb_sub(nb_add(nb_mul(t, v1), nb_mul(v2, v3)), nb_div(p1, nb_add(s, p2)));
    nb_var *q = nb_log(nb_add(x, nb_scalar(tr, 0.5))); /* NaN where x < -0.5 */
    nb_var *y = nb_select(nb_gt(u, s), u, nb_mul(u, q));
    nb_var *ki = nb_sub(nb_mul(k, nb_add(k, nb_scalar(tr, 3))), k);
    nb_var *res[N_OUT] = {
        y,
        t, /* also read by u and y's cluster: stored */
        nb_sum(nb_mul(u, y), (int[]){-1}, 1, false),
        nb_max(nb_add(y, q), (int[]){-1}, 1, true),
        nb_min(nb_sub(y, t), (int[]){-1}, 1, false),
        nb_sum(nb_mul(nb_square(x), w), NULL, 0, false),
        nb_sum(ki, (int[]){-1}, 1, false),
        nb_max(ki, (int[]){-1}, 1, false),
        nb_min(nb_neg(ki), NULL, 0, false),
        nb_sqrt(nb_abs(nb_sub(nb_exp(x), nb_cast(k, nb_var_dtype(x))))),
    };
    nb_tree *leaves[N_OUT];
    for (int i = 0; i < N_OUT; i++) {
        leaves[i] = nb_leaf(res[i]);
    }
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), N_OUT, leaves, out);
    for (int i = 0; i < N_OUT; i++) {
        nb_tree_destroy(leaves[i]);
    }
    return st;
}

/* values -1.6 .. 1.6 in steps, with -0.0 at 1 and NaN at 2 (when there is room) */
static nb_array *tiny_values(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape,
                             double scale) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        double v = scale * ((double)(i * 7 % 33) * 0.1 - 1.6);
        v = i == 1 ? -0.0 : i == 2 ? NAN : v;
        if (dt == NB_DTYPE_F32) {
            ((float *)nb_array_data(a))[i] = (float)v;
        } else if (dt == NB_DTYPE_F64) {
            ((double *)nb_array_data(a))[i] = v;
        } else {
            ((int32_t *)nb_array_data(a))[i] = (int32_t)((i * 2654435761u) % 2000003) - 1000000;
        }
    }
    return a;
}

/* a and b bit for bit, but for NaNs, which need only be NaN in both: fused and op-by-op
 * evaluation promise a NaN where there is one, not its sign and payload (the compiler may
 * commute the operands of x * y, and x86 keeps the first NaN operand's). */
static bool same_bits(nb_ctx *ctx, const nb_array *a, const nb_array *b) {
    bool same = false;
    NBT_OK(ctx, nb_array_identical(a, b, &same));
    if (same || nb_array_dtype(a) != nb_array_dtype(b) || nb_array_size(a) != nb_array_size(b)) {
        return same;
    }
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        double x = 0, y = 0;
        NBT_OK(ctx, nb_array_get_flat(a, i, &x));
        NBT_OK(ctx, nb_array_get_flat(b, i, &y));
        if (!(isnan(x) && isnan(y)) && !(x == y && signbit(x) == signbit(y))) {
            return false;
        }
    }
    return true;
}

static int count_of(const char *s, const char *sub) {
    int n = 0;
    for (const char *q = strstr(s, sub); q != NULL; q = strstr(q + 1, sub)) {
        n++;
    }
    return n;
}

static void run_tiny(int threads, nb_dtype dt, int64_t r, int64_t c) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = threads;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    g_r = r;
    g_c = c;
    g_in[0] = tiny_values(ctx, dt, 2, (int64_t[]){r, c}, 1.0);
    g_in[1] = tiny_values(ctx, dt, 1, (int64_t[]){c}, -0.75);
    NBT_OK(ctx, nb_array_scalar(ctx, dt, 0.125, &g_in[2]));
    g_in[3] = tiny_values(ctx, dt, 2, (int64_t[]){2 * r + 3, 2 * c + 3}, 1.25);
    g_in[4] = tiny_values(ctx, NB_DTYPE_I32, 2, (int64_t[]){r, c}, 1.0);
    nb_tree *leaves[5], *args = NULL, *empty = NULL, *out1 = NULL, *out2 = NULL;
    for (int i = 0; i < 5; i++) {
        NBT_OK(ctx, nb_tree_array(g_in[i], &leaves[i]));
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, 5, leaves, &args));
    NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "tiny", body_tiny, NULL, &f));
    g_consts = false;
    static char ir[65536];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    /* fused maps reading views (no slice or pad node left), a stored value, and reductions
     * fused into their maps */
    if (count_of(ir, "] = fused ") < 3 || strstr(ir, "store") == NULL ||
        count_of(ir, "; then ") < 4 || strstr(ir, "] = slice") != NULL ||
        strstr(ir, "] = pad") != NULL || strstr(ir, "view(") == NULL) {
        fail_msg("%s [%lld, %lld]: expected fused maps over views, a stored value and fused "
                 "reductions:\n%s",
                 nb_dtype_name(dt), (long long)r, (long long)c, ir);
    }
    for (int call = 0; call < 2; call++) { /* the second call reuses the executable */
        NBT_OK(ctx, nb_fn_call(f, args, &out1));
        if (call == 0) {
            nb_tree_destroy(out1);
        }
    }
    nb_ctx_clear_cache(ctx);
    g_consts = true;
    NBT_OK(ctx, nb_fn_call(f, empty, &out2));
    NBT_EQ_I64(nb_tree_len(out1), N_OUT);
    for (int64_t i = 0; i < N_OUT; i++) {
        nb_array *a = nb_tree_get_array(nb_tree_child(out1, i));
        nb_array *b = nb_tree_get_array(nb_tree_child(out2, i));
        if (!same_bits(ctx, a, b)) {
            fail_msg("%s [%lld, %lld], %d threads: output %d differs from the unfused one",
                     nb_dtype_name(dt), (long long)r, (long long)c, threads, (int)i);
        }
    }
    nb_tree_destroy(out2);
    nb_tree_destroy(out1);
    nb_fn_destroy(f);
    nb_tree_destroy(empty);
    nb_tree_destroy(args);
    for (int i = 0; i < 5; i++) {
        nb_tree_destroy(leaves[i]);
        nb_array_destroy(g_in[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_fused_tiny(void **state) {
    (void)state;
    /* 1, 2, 4 (in line), 5, 6 (calls), 64 (the last tiny size), 65 and more (tiles) */
    static const int64_t sizes[][2] = {{1, 1},  {1, 2}, {2, 2},  {1, 5},  {2, 3},  {3, 7},
                                       {4, 16}, {8, 8}, {1, 64}, {5, 13}, {1, 65}, {3, 23}};
    static const nb_dtype dts[2] = {NB_DTYPE_F64, NB_DTYPE_F32};
    for (int threads = 1; threads <= 3; threads += 2) {
        for (int d = 0; d < 2; d++) {
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
                run_tiny(threads, dts[d], sizes[i][0], sizes[i][1]);
            }
        }
    }
}

/* Rank 0 (an ODE's scalar parameters): a chain over scalars, one stored, no views. */
static nb_status body_scalar(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *a = g_consts ? nb_constant(tr, g_in[0]) : nb_get(tr, args, "[0]");
    nb_var *b = g_consts ? nb_constant(tr, g_in[1]) : nb_get(tr, args, "[1]");
    nb_var *m = nb_div(nb_sub(nb_mul(a, b), nb_scalar(tr, 0.3)), nb_add(a, b));
    nb_var *y = nb_select(nb_gt(m, a), nb_exp(m), nb_mul(m, nb_tanh(b)));
    nb_tree *leaves[2] = {nb_leaf(y), nb_leaf(m)}; /* the trace's own */
    return nb_tree_tuple(nb_trace_ctx(tr), 2, leaves, out);
}

static void test_fused_scalar(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const double vals[][2] = {{1.5, -0.25}, {-0.0, 2.0}, {0.7, NAN}, {-3.0, 3.0}};
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d == 0 ? NB_DTYPE_F64 : NB_DTYPE_F32;
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
            NBT_OK(ctx, nb_array_scalar(ctx, dt, vals[i][0], &g_in[0]));
            NBT_OK(ctx, nb_array_scalar(ctx, dt, vals[i][1], &g_in[1]));
            nb_tree *leaves[2], *args = NULL, *empty = NULL, *out1 = NULL, *out2 = NULL;
            NBT_OK(ctx, nb_tree_array(g_in[0], &leaves[0]));
            NBT_OK(ctx, nb_tree_array(g_in[1], &leaves[1]));
            NBT_OK(ctx, nb_tree_tuple(ctx, 2, leaves, &args));
            NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
            nb_fn *f = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "scalar", body_scalar, NULL, &f));
            g_consts = false;
            char ir[8192];
            NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
            if (count_of(ir, "] = fused ") != 1 || strstr(ir, "store") == NULL) {
                fail_msg("expected one fused node storing m:\n%s", ir);
            }
            NBT_OK(ctx, nb_fn_call(f, args, &out1));
            nb_ctx_clear_cache(ctx);
            g_consts = true;
            NBT_OK(ctx, nb_fn_call(f, empty, &out2));
            for (int64_t j = 0; j < 2; j++) {
                if (!same_bits(ctx, nb_tree_get_array(nb_tree_child(out1, j)),
                               nb_tree_get_array(nb_tree_child(out2, j)))) {
                    fail_msg("%s (%g, %g): output %d differs from the unfused one",
                             nb_dtype_name(dt), vals[i][0], vals[i][1], (int)j);
                }
            }
            nb_tree_destroy(out2);
            nb_tree_destroy(out1);
            nb_fn_destroy(f);
            nb_tree_destroy(empty);
            nb_tree_destroy(args);
            for (int j = 0; j < 2; j++) {
                nb_tree_destroy(leaves[j]);
                nb_array_destroy(g_in[j]);
            }
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- index spaces with unit dims: a gather merges what each input allows -------------- */

/* args: (a [n, 1, 1, 1], b [1, 1, m, 1], c [n, 1, m, 1]) */
static nb_status body_unit(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = g_consts ? nb_constant(tr, g_in[i]) : nb_get(tr, args, "[%d]", i);
    }
    nb_var *a = v[0], *b = v[1], *c = v[2];
    nb_var *t = nb_transpose(c, (int[]){2, 1, 0, 3}); /* [m, 1, n, 1]: a strided view */
    nb_var *y = nb_select(nb_gt(a, b), nb_mul(a, b), nb_sub(c, a));
    nb_tree *leaves[4] = {
        nb_leaf(y),
        nb_leaf(nb_sum(nb_mul(nb_sub(a, c), b), (int[]){1}, 1, false)), /* over extent 1 */
        nb_leaf(nb_max(nb_add(y, b), (int[]){2}, 1, true)),
        nb_leaf(nb_add(nb_exp(t), nb_transpose(b, (int[]){2, 1, 0, 3}))),
    };
    return nb_tree_tuple(nb_trace_ctx(tr), 4, leaves, out);
}

static void test_fused_unit_dims(void **state) {
    (void)state;
    static const int64_t sizes[][2] = {{70, 33}, {5, 1000}, {1000, 3}};
    for (size_t q = 0; q < sizeof sizes / sizeof sizes[0]; q++) {
        nb_ctx *ctx = nbt_ctx();
        int64_t n = sizes[q][0], m = sizes[q][1];
        const int64_t shapes[3][4] = {{n, 1, 1, 1}, {1, 1, m, 1}, {n, 1, m, 1}};
        nb_tree *leaves[3], *args = NULL, *empty = NULL, *out1 = NULL, *out2 = NULL;
        for (int i = 0; i < 3; i++) {
            NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 4, shapes[i], &g_in[i]));
            double *d = nb_array_data(g_in[i]);
            for (int64_t j = 0; j < nb_array_size(g_in[i]); j++) {
                d[j] = sin(0.37 * (double)j + i) * (j % 11 == 0 ? -0.0 : 2.0);
            }
            NBT_OK(ctx, nb_tree_array(g_in[i], &leaves[i]));
        }
        NBT_OK(ctx, nb_tree_tuple(ctx, 3, leaves, &args));
        NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "unit", body_unit, NULL, &f));
        g_consts = false;
        NBT_OK(ctx, nb_fn_call(f, args, &out1));
        nb_ctx_clear_cache(ctx);
        g_consts = true;
        NBT_OK(ctx, nb_fn_call(f, empty, &out2));
        for (int64_t j = 0; j < 4; j++) {
            if (!same_bits(ctx, nb_tree_get_array(nb_tree_child(out1, j)),
                           nb_tree_get_array(nb_tree_child(out2, j)))) {
                fail_msg("n %lld, m %lld: output %d differs from the unfused one", (long long)n,
                         (long long)m, (int)j);
            }
        }
        nb_tree_destroy(out2);
        nb_tree_destroy(out1);
        nb_fn_destroy(f);
        nb_tree_destroy(empty);
        nb_tree_destroy(args);
        for (int i = 0; i < 3; i++) {
            nb_tree_destroy(leaves[i]);
            nb_array_destroy(g_in[i]);
        }
        nbt_assert_no_live(ctx);
        nb_ctx_destroy(ctx);
    }
}

/* ---- an element's bits do not depend on its neighbours ------------------------------- */

/* self = the op's index in lane_ops */
static const char *const lane_ops[] = {"sin", "cos",   "tan",  "exp", "expm1",
                                       "log", "log1p", "tanh", "erf", "pow"};

static nb_status body_lane(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t k = 0;
    NBT_OK(nb_trace_ctx(tr), nb_tree_get_int(self, &k));
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *ax = nb_abs(x);
    nb_var *y = k == 0   ? nb_sin(x)
                : k == 1 ? nb_cos(x)
                : k == 2 ? nb_tan(x)
                : k == 3 ? nb_exp(nb_mul(x, nb_scalar(tr, 0.01)))
                : k == 4 ? nb_expm1(nb_mul(x, nb_scalar(tr, 0.01)))
                : k == 5 ? nb_log(ax)
                : k == 6 ? nb_log1p(ax)
                : k == 7 ? nb_tanh(nb_mul(x, nb_scalar(tr, 0.01)))
                : k == 8 ? nb_erf(nb_mul(x, nb_scalar(tr, 0.01)))
                         : nb_pow(ax, nb_scalar(tr, 0.37));
    return nb_return(y, out);
}

/* SLEEF's plain sin, cos and tan take a faster argument reduction when every lane of the
 * register is small (|x| < 125 in f32, < 15 in f64): sin(124.f) next to 125.f and alone
 * differed by one ULP (a fuzzer find). Every element of arguments that mix magnitudes
 * around those bounds (and SLEEF's next ones, 39000.f and 1e14) must have the bits it has
 * when computed alone. */
static void test_fused_lanes(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    enum { N = 203 };
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d == 0 ? NB_DTYPE_F32 : NB_DTYPE_F64;
        double vals[N];
        for (int i = 0; i < N; i++) {
            static const double base[] = {124.0, 125.0, 14.5, 15.5, 38999.0, 39001.0, 3e14, 0.7};
            double b = base[(i * 5 + i / 7) % 8];
            vals[i] = (i % 2 ? -1 : 1) * (b + 0.013 * i);
        }
        int64_t shape[1] = {N}, one[1] = {1};
        nb_array *x = NULL;
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, shape, vals, &x));
        nb_array *xd = NULL;
        NBT_OK(ctx, nb_array_cast(x, dt, &xd));
        for (int64_t k = 0; k < (int64_t)(sizeof lane_ops / sizeof lane_ops[0]); k++) {
            nb_tree *self = NULL;
            NBT_OK(ctx, nb_tree_int(ctx, k, &self));
            nb_fn *f = NULL;
            NBT_OK(ctx, nb_fn_create(ctx, "lane", body_lane, self, &f));
            nb_tree *leaf = NULL, *args = NULL, *all = NULL;
            NBT_OK(ctx, nb_tree_array(xd, &leaf));
            NBT_OK(ctx, nb_tree_tuple(ctx, 1, &leaf, &args));
            NBT_OK(ctx, nb_fn_call(f, args, &all));
            const nb_array *ya = nb_tree_get_array(all);
            for (int64_t i = 0; i < N; i++) {
                double v = 0;
                NBT_OK(ctx, nb_array_get_flat(xd, i, &v));
                nb_array *x1 = NULL, *xid = NULL;
                NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, 1, one, &v, &x1));
                NBT_OK(ctx, nb_array_cast(x1, dt, &xid));
                nb_array_destroy(x1);
                nb_tree *l1 = NULL, *a1 = NULL, *o1 = NULL;
                NBT_OK(ctx, nb_tree_array(xid, &l1));
                NBT_OK(ctx, nb_tree_tuple(ctx, 1, &l1, &a1));
                NBT_OK(ctx, nb_fn_call(f, a1, &o1));
                double alone = 0, grouped = 0;
                NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(o1), 0, &alone));
                NBT_OK(ctx, nb_array_get_flat(ya, i, &grouped));
                if (memcmp(&alone, &grouped, sizeof alone) != 0 &&
                    !(isnan(alone) && isnan(grouped))) {
                    fail_msg("%s %s(%.17g): %.17g alone, %.17g among its neighbours",
                             nb_dtype_name(dt), lane_ops[k], v, alone, grouped);
                }
                nb_tree_destroy(o1);
                nb_tree_destroy(a1);
                nb_tree_destroy(l1);
                nb_array_destroy(xid);
            }
            nb_tree_destroy(all);
            nb_tree_destroy(args);
            nb_tree_destroy(leaf);
            nb_fn_destroy(f);
            nb_tree_destroy(self);
        }
        nb_array_destroy(xd);
        nb_array_destroy(x);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_tiny),
        cmocka_unit_test(test_fused_scalar),
        cmocka_unit_test(test_fused_unit_dims),
        cmocka_unit_test(test_fused_lanes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
