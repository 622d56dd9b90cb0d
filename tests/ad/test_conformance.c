/*
 * test_conformance.c -- registry-driven forward conformance of every primitive op.
 *
 * Every op in src/ad/ops.def must have at least one spec here, or the suite fails (an op
 * added without a test spec is caught). A spec is a list of cases: inputs (dtype, shape,
 * value domain), a builder written with the public op API, and a reference computed
 * independently in double precision (exactly, for integer and bool results). Each case
 * runs through the whole pipeline twice: with the inputs as function arguments (trace,
 * passes, compile, run) and with the inputs captured as constants (so constant folding
 * evaluates the op at compile time through the same kernel). Shapes include broadcasting,
 * rank 0, size-1 and size-0 dims.
 *
 * Tolerances (relative to the reference, plus the same amount times the inputs' scale as
 * an absolute floor for results near 0):
 *   - exact: integer and bool results, shape ops, selects, casts, comparisons, max/min,
 *     and the random samplers (against their eager twins, the same bits);
 *   - 4 ulp of the result dtype for single correctly-rounded or SLEEF u10 (<= 1 ulp)
 *     functions and for tanh (SLEEF u35, <= 3.5 ulp), 16 ulp for ones composed of several roundings
 * (sigmoid, softplus, gelu, rsqrt, pow);
 *   - sums and products: n * ulp * sum(|terms|) (the worst case of recursive summation;
 *     the blocked pairwise order does better);
 *   - matmul: k * ulp * sum_p |a_ip b_pj|.
 */
#include "nbtest.h"

#include "ad/ir.h"
#include "nabla/linalg.h"

#include <math.h>
#include <stdlib.h>

#define MAX_IN 4
#define MAX_CASES 4096

/* ---- inputs and references --------------------------------------------------------- */

typedef enum dom { DOM_ANY, DOM_POS, DOM_GT_M1, DOM_SMALL, DOM_NONZERO, DOM_IDX, DOM_BOOL } dom;

typedef struct rarr {
    nb_dtype dt;
    int rank;
    int64_t shape[NB_MAX_RANK];
    int64_t n;
    double *v;
} rarr;

typedef struct tcase tcase;
typedef nb_var *(*un_b)(nb_var *);
typedef nb_var *(*bin_b)(nb_var *, nb_var *);
typedef nb_var *(*red_b)(nb_var *, const int *, int, bool);
typedef double (*un_r)(double);
typedef double (*bin_r)(double, double);
typedef nb_var *(*build_fn)(nb_trace *tr, nb_var *const *in, const tcase *c);
/* Fill out->rank/shape and out->v (allocated by the harness with room for cap values). */
typedef void (*ref_fn)(const rarr *in, int n_in, rarr *out, const tcase *c);

typedef enum tol_kind { TOL_EXACT, TOL_ULP, TOL_SUM, TOL_MATMUL, TOL_LINALG } tol_kind;

struct tcase {
    nbi_op op;
    char label[96];
    int n_in;
    nb_dtype dt[MAX_IN];
    int rank[MAX_IN];
    int64_t shape[MAX_IN][NB_MAX_RANK];
    dom dm[MAX_IN];
    build_fn build;
    ref_fn ref;
    tol_kind tol;
    double ulps;
    /* parameters for builders and references */
    union {
        un_b un;
        bin_b bin;
        red_b red;
    } fn; /* the builder under test */
    union {
        un_r un;
        bin_r bin;
    } fn2;      /* its scalar reference */
    int ip[16]; /* integer parameters (axes, perm, ...) */
    int64_t lp[3][NB_MAX_RANK];
    double dp;
    nb_dtype to;
    bool keepdims;
};

static tcase g_cases[MAX_CASES];
static int g_n_cases;
static bool g_has_spec[NBI_OP_COUNT];
static const char *g_covered_by[NBI_OP_COUNT];

static tcase *add_case(nbi_op op, int n_in, build_fn b, ref_fn r, tol_kind tol, double ulps) {
    if (g_n_cases >= MAX_CASES) {
        fail_msg("too many cases");
    }
    tcase *c = &g_cases[g_n_cases++];
    memset(c, 0, sizeof *c);
    c->op = op;
    c->n_in = n_in;
    c->build = b;
    c->ref = r;
    c->tol = tol;
    c->ulps = ulps;
    g_has_spec[op] = true;
    return c;
}

static void set_in(tcase *c, int i, nb_dtype dt, dom d, int rank, const int64_t *shape) {
    c->dt[i] = dt;
    c->dm[i] = d;
    c->rank[i] = rank;
    for (int k = 0; k < rank; k++) {
        c->shape[i][k] = shape[k];
    }
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

static double gen_value(nb_dtype dt, dom d) {
    bool is_int = dt == NB_DTYPE_I32 || dt == NB_DTYPE_I64;
    if (dt == NB_DTYPE_BOOL || d == DOM_BOOL) {
        return urand() < 0.5 ? 0.0 : 1.0;
    }
    if (d == DOM_IDX) {
        return floor(urand() * 15.0) - 6.0; /* -6..8: out of range on both sides */
    }
    double v;
    switch (d) {
    case DOM_POS:
        v = is_int ? floor(urand() * 5) + 1 : 0.1 + urand() * 3.9;
        break;
    case DOM_GT_M1:
        v = -0.9 + urand() * 3.9;
        break;
    case DOM_SMALL:
        v = -1.2 + urand() * 2.4;
        break;
    case DOM_NONZERO:
        v = is_int ? floor(urand() * 11) - 5 /* includes 0: int division by 0 gives 0 */
                   : (0.5 + urand() * 2.5) * (urand() < 0.5 ? -1 : 1);
        break;
    default:
        v = is_int ? floor(urand() * 11) - 5 : -3.0 + urand() * 6.0;
        break;
    }
    if (dt == NB_DTYPE_F32) {
        v = (double)(float)v;
    }
    return v;
}

static int64_t shape_n(int rank, const int64_t *s) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= s[i];
    }
    return n;
}

/* Offset in an input of the output position idx (rank ro), numpy broadcasting. */
static int64_t bidx(const rarr *a, int ro, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < a->rank; i++) {
        int oi = i + ro - a->rank;
        int64_t k = a->shape[i] == 1 ? 0 : idx[oi];
        off = off * a->shape[i] + k;
    }
    return off;
}

static void unravel(int64_t flat, int rank, const int64_t *shape, int64_t *idx) {
    for (int i = rank - 1; i >= 0; i--) {
        idx[i] = shape[i] ? flat % shape[i] : 0;
        flat = shape[i] ? flat / shape[i] : 0;
    }
}

static void bshape(const rarr *in, int n, rarr *out) {
    int r = 0;
    for (int i = 0; i < n; i++) {
        r = in[i].rank > r ? in[i].rank : r;
    }
    out->rank = r;
    for (int k = 0; k < r; k++) {
        int64_t d = 1;
        for (int i = 0; i < n; i++) {
            int j = k - (r - in[i].rank);
            if (j >= 0 && in[i].shape[j] != 1) {
                d = in[i].shape[j];
            }
        }
        out->shape[k] = d;
    }
    out->n = shape_n(r, out->shape);
}

/* Round a reference value to what the output dtype can hold (casts, int wrap-free). */
static double to_dtype(double v, nb_dtype dt) {
    switch (dt) {
    case NB_DTYPE_F32:
        return (double)(float)v;
    case NB_DTYPE_BOOL:
        return v != 0;
    default:
        return v;
    }
}

/* ---- elementwise -------------------------------------------------------------------- */

static nb_var *b_unary(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return c->fn.un(in[0]);
}

static nb_var *b_binary(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return c->fn.bin(in[0], in[1]);
}

static void r_unary(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    out->rank = in[0].rank;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    out->n = in[0].n;
    for (int64_t i = 0; i < out->n; i++) {
        out->v[i] = c->fn2.un(in[0].v[i]);
    }
}

static void r_binary(const rarr *in, int n, rarr *out, const tcase *c) {
    bshape(in, n, out);
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < out->n; i++) {
        unravel(i, out->rank, out->shape, idx);
        out->v[i] = c->fn2.bin(in[0].v[bidx(&in[0], out->rank, idx)],
                               in[1].v[bidx(&in[1], out->rank, idx)]);
    }
}

static double rf_neg(double x) {
    return -x;
}
static double rf_abs(double x) {
    return fabs(x);
}
static double rf_sign(double x) {
    return x > 0 ? 1 : x < 0 ? -1 : x;
}
static double rf_rsqrt(double x) {
    return 1 / sqrt(x);
}
static double rf_square(double x) {
    return x * x;
}
static double rf_recip(double x) {
    return 1 / x;
}
static double rf_sigmoid(double x) {
    return 1 / (1 + exp(-x));
}
static double rf_relu(double x) {
    return x > 0 ? x : 0;
}
static double rf_softplus(double x) {
    return log1p(exp(x));
}
static double rf_gelu(double x) {
    /* the textbook form, in long double so that its cancellation near tanh = -1 does not
     * make the reference worse than the value under test */
    long double lx = x;
    return (double)(0.5L * lx *
                    (1.0L + tanhl(0.79788456080286535588L * (lx + 0.044715L * lx * lx * lx))));
}
static double rf_not(double x) {
    return x == 0;
}
static double rf_add(double x, double y) {
    return x + y;
}
static double rf_sub(double x, double y) {
    return x - y;
}
static double rf_mul(double x, double y) {
    return x * y;
}
static double rf_div(double x, double y) {
    return x / y;
}
static double rf_idiv(double x, double y) {
    return y == 0 ? 0 : trunc(x / y);
}
static double rf_max(double x, double y) {
    return (x > y || isnan(x)) ? x : y;
}
static double rf_min(double x, double y) {
    return (x < y || isnan(x)) ? x : y;
}
static double rf_eq(double x, double y) {
    return x == y;
}
static double rf_ne(double x, double y) {
    return x != y;
}
static double rf_lt(double x, double y) {
    return x < y;
}
static double rf_le(double x, double y) {
    return x <= y;
}
static double rf_gt(double x, double y) {
    return x > y;
}
static double rf_ge(double x, double y) {
    return x >= y;
}
static double rf_and(double x, double y) {
    return x != 0 && y != 0;
}
static double rf_or(double x, double y) {
    return x != 0 || y != 0;
}

static const nb_dtype FLOATS[] = {NB_DTYPE_F32, NB_DTYPE_F64};
static const nb_dtype NUMERIC[] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32, NB_DTYPE_I64};
static const nb_dtype ALL[] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32, NB_DTYPE_I64,
                               NB_DTYPE_BOOL};

static const struct {
    int rank;
    int64_t shape[3];
} UNARY_SHAPES[] = {{0, {0}}, {1, {1}}, {2, {5, 3}}, {2, {0, 4}}, {3, {2, 1, 3}}};

static void spec_unary(nbi_op op, un_b b, un_r r, dom d, const nb_dtype *dts, int n_dts,
                       double ulps) {
    for (int k = 0; k < n_dts; k++) {
        for (size_t s = 0; s < sizeof UNARY_SHAPES / sizeof UNARY_SHAPES[0]; s++) {
            tcase *c = add_case(op, 1, b_unary, r_unary, ulps > 0 ? TOL_ULP : TOL_EXACT, ulps);
            c->fn.un = b;
            c->fn2.un = r;
            set_in(c, 0, dts[k], d, UNARY_SHAPES[s].rank, UNARY_SHAPES[s].shape);
            snprintf(c->label, sizeof c->label, "%s %s shape #%zu", nbi_op_name(op),
                     nb_dtype_name(dts[k]), s);
        }
    }
}

static const struct {
    int ra, rb;
    int64_t sa[3], sb[3];
} BIN_SHAPES[] = {
    {0, 0, {0}, {0}},       {1, 0, {5}, {0}},       {0, 1, {0}, {5}}, {3, 2, {3, 1, 4}, {2, 4}},
    {2, 2, {2, 3}, {2, 3}}, {2, 2, {0, 3}, {1, 3}}, {1, 1, {1}, {4}}, {2, 1, {4, 1}, {3}},
};

static void spec_binary(nbi_op op, bin_b b, bin_r r, dom da, dom db, const nb_dtype *dts, int n_dts,
                        double ulps) {
    for (int k = 0; k < n_dts; k++) {
        for (size_t s = 0; s < sizeof BIN_SHAPES / sizeof BIN_SHAPES[0]; s++) {
            tcase *c = add_case(op, 2, b_binary, r_binary, ulps > 0 ? TOL_ULP : TOL_EXACT, ulps);
            c->fn.bin = b;
            c->fn2.bin = r;
            set_in(c, 0, dts[k], da, BIN_SHAPES[s].ra, BIN_SHAPES[s].sa);
            set_in(c, 1, dts[k], db, BIN_SHAPES[s].rb, BIN_SHAPES[s].sb);
            snprintf(c->label, sizeof c->label, "%s %s shapes #%zu", nbi_op_name(op),
                     nb_dtype_name(dts[k]), s);
        }
    }
}

/* select(cond, a, b) */
static nb_var *b_select(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    (void)c;
    return nb_select(in[0], in[1], in[2]);
}
static void r_select(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)c;
    bshape(in, n, out);
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < out->n; i++) {
        unravel(i, out->rank, out->shape, idx);
        out->v[i] = in[0].v[bidx(&in[0], out->rank, idx)] != 0
                        ? in[1].v[bidx(&in[1], out->rank, idx)]
                        : in[2].v[bidx(&in[2], out->rank, idx)];
    }
}

/* cast */
static nb_var *b_cast(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_cast(in[0], c->to);
}
static double cast_ref(double v, nb_dtype to) {
    switch (to) {
    case NB_DTYPE_I32:
        return isnan(v)             ? 0
               : v <= -2147483648.0 ? -2147483648.0
               : v >= 2147483647.0  ? 2147483647.0
                                    : trunc(v);
    case NB_DTYPE_I64:
        return isnan(v)                      ? 0
               : v <= -9223372036854775808.0 ? -9223372036854775808.0
               : v >= 9223372036854775808.0  ? 9223372036854775807.0
                                             : trunc(v);
    case NB_DTYPE_BOOL:
        return v != 0;
    case NB_DTYPE_F32:
        return (double)(float)v;
    default:
        return v;
    }
}
static void r_cast(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    out->rank = in[0].rank;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    out->n = in[0].n;
    for (int64_t i = 0; i < out->n; i++) {
        out->v[i] = cast_ref(in[0].v[i], c->to);
    }
}

/* ---- misc: constants, iota, stop_gradient ----------------------------------------- */

static nb_var *b_full(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)in;
    return nb_full(tr, c->to, c->ip[0], c->lp[0], c->dp);
}
static void r_full(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)in;
    (void)n;
    out->rank = c->ip[0];
    memcpy(out->shape, c->lp[0], sizeof out->shape);
    out->n = shape_n(out->rank, out->shape);
    for (int64_t i = 0; i < out->n; i++) {
        out->v[i] = cast_ref(c->dp, c->to);
    }
}
static nb_var *b_iota(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)in;
    return nb_iota(tr, c->to, c->ip[0], c->lp[0], c->ip[1]);
}
static void r_iota(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)in;
    (void)n;
    out->rank = c->ip[0];
    memcpy(out->shape, c->lp[0], sizeof out->shape);
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < out->n; i++) {
        unravel(i, out->rank, out->shape, idx);
        out->v[i] = (double)idx[c->ip[1]];
    }
}
static nb_var *b_constant(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)c;
    /* in[0] is a param in the argument variant; take its data through a constant of a
     * copy made here: the constant op itself is what is under test */
    nb_array *a = NULL;
    nb_array_full(nb_trace_ctx(tr), NB_DTYPE_F64, 2, (int64_t[]){2, 3}, 0.0, &a);
    for (int i = 0; i < 6; i++) {
        ((double *)nb_array_data(a))[i] = i * 1.5 - 2;
    }
    nb_var *k = nb_constant(tr, a);
    nb_array_destroy(a);
    return nb_add(k, in[0]);
}
static void r_constant(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    (void)c;
    out->rank = 2;
    out->shape[0] = 2;
    out->shape[1] = 3;
    out->n = 6;
    for (int i = 0; i < 6; i++) {
        out->v[i] = i * 1.5 - 2 + in[0].v[0];
    }
}
static double rf_id(double x) {
    return x;
}
/* identity has no public builder: gradient transforms emit it (src/ad/transforms.c) */
static nb_var *nbt_identity(nb_var *x) {
    return nbi_emit(nb_var_trace(x), NBI_OP_IDENTITY, 1, &x, NULL);
}

/* implicit(a, b): a's value (b's only for derivatives: src/ode/solve.c's Newton stages) */
static nb_var *nbt_implicit(nb_var *x) {
    return nbi_implicit(x, nb_neg(x));
}

/* ---- random numbers: the traced samplers against their eager twins ------------------ */
/* The reference of an nb_rng_* op is the eager nb_random_* call on the same key value,
 * which tests/core/test_random.c checks against JAX; the results must be the same bits
 * (TOL_EXACT). c->ip[0] = rank, c->lp[0] = shape (or lp[0][0] = n for split and
 * permutation), c->to = dtype, c->ip[1] = the row of RNG_BOUNDS. */
static const double RNG_BOUNDS[][2] = {{0, 1},   {-2, 3}, {-2, 1}, {0.5, INFINITY},
                                       {0.3, 0}, {0, 0},  {1, 0}};
static nb_var *b_rng(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    const double *bd = RNG_BOUNDS[c->ip[1]];
    switch (c->op) {
    case NBI_OP_RNG_SPLIT:
        return nb_rng_split(in[0], c->lp[0][0]);
    case NBI_OP_RNG_FOLD_IN:
        return nb_rng_fold_in(in[0], in[1]);
    case NBI_OP_RNG_BITS:
        return nb_rng_bits(in[0], c->ip[0], c->lp[0]);
    case NBI_OP_RNG_UNIFORM:
        return nb_rng_uniform(in[0], c->to, c->ip[0], c->lp[0], bd[0], bd[1]);
    case NBI_OP_RNG_NORMAL:
        return nb_rng_normal(in[0], c->to, c->ip[0], c->lp[0]);
    case NBI_OP_RNG_TRUNCATED_NORMAL:
        return nb_rng_truncated_normal(in[0], c->to, bd[0], bd[1], c->ip[0], c->lp[0]);
    case NBI_OP_RNG_BERNOULLI:
        return nb_rng_bernoulli(in[0], bd[0], c->ip[0], c->lp[0]);
    default:
        return nb_rng_permutation(in[0], c->lp[0][0]);
    }
}
static void r_rng(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    nb_ctx *ctx = NULL;
    nb_array *key = NULL, *a = NULL;
    NBT_OK(ctx, nb_ctx_create(NULL, &ctx));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, &key));
    ((int32_t *)nb_array_data(key))[0] = (int32_t)in[0].v[0];
    ((int32_t *)nb_array_data(key))[1] = (int32_t)in[0].v[1];
    const double *bd = RNG_BOUNDS[c->ip[1]];
    switch (c->op) {
    case NBI_OP_RNG_SPLIT:
        NBT_OK(ctx, nb_random_split(key, c->lp[0][0], &a));
        break;
    case NBI_OP_RNG_FOLD_IN: /* the low 32 bits of the data */
        NBT_OK(ctx, nb_random_fold_in(key, (uint32_t)(int64_t)in[1].v[0], &a));
        break;
    case NBI_OP_RNG_BITS:
        NBT_OK(ctx, nb_random_bits(key, c->ip[0], c->lp[0], &a));
        break;
    case NBI_OP_RNG_UNIFORM:
        NBT_OK(ctx, nb_random_uniform(key, c->to, c->ip[0], c->lp[0], bd[0], bd[1], &a));
        break;
    case NBI_OP_RNG_NORMAL:
        NBT_OK(ctx, nb_random_normal(key, c->to, c->ip[0], c->lp[0], &a));
        break;
    case NBI_OP_RNG_TRUNCATED_NORMAL:
        NBT_OK(ctx, nb_random_truncated_normal(key, c->to, bd[0], bd[1], c->ip[0], c->lp[0], &a));
        break;
    case NBI_OP_RNG_BERNOULLI:
        NBT_OK(ctx, nb_random_bernoulli(key, bd[0], c->ip[0], c->lp[0], &a));
        break;
    default:
        NBT_OK(ctx, nb_random_permutation(key, c->lp[0][0], &a));
        break;
    }
    out->rank = nb_array_rank(a);
    memcpy(out->shape, nb_array_shape(a), (size_t)out->rank * sizeof(int64_t));
    out->n = nb_array_size(a);
    for (int64_t i = 0; i < out->n; i++) {
        NBT_OK(ctx, nb_array_get_flat(a, i, &out->v[i]));
    }
    nb_array_destroy(a);
    nb_array_destroy(key);
    nb_ctx_destroy(ctx);
}

static void rng_cases(void) {
    static const struct {
        int rank;
        int64_t shape[3];
    } S[] = {{0, {0}}, {1, {0}}, {2, {3, 4}}, {3, {2, 3, 5}}, {2, {100, 170}}};
    static const int64_t ns[] = {1, 5};
    for (size_t i = 0; i < 2; i++) {
        tcase *c = add_case(NBI_OP_RNG_SPLIT, 1, b_rng, r_rng, TOL_EXACT, 0);
        set_in(c, 0, NB_DTYPE_I32, DOM_ANY, 1, (int64_t[]){2});
        c->lp[0][0] = ns[i];
        snprintf(c->label, sizeof c->label, "rng_split n=%lld", (long long)ns[i]);
    }
    for (int k = 0; k < 2; k++) {
        nb_dtype d = k ? NB_DTYPE_I64 : NB_DTYPE_I32;
        tcase *c = add_case(NBI_OP_RNG_FOLD_IN, 2, b_rng, r_rng, TOL_EXACT, 0);
        set_in(c, 0, NB_DTYPE_I32, DOM_ANY, 1, (int64_t[]){2});
        set_in(c, 1, d, DOM_ANY, 0, NULL);
        snprintf(c->label, sizeof c->label, "rng_fold_in data %s", nb_dtype_name(d));
    }
    static const nbi_op samplers[] = {NBI_OP_RNG_BITS, NBI_OP_RNG_UNIFORM, NBI_OP_RNG_NORMAL,
                                      NBI_OP_RNG_TRUNCATED_NORMAL, NBI_OP_RNG_BERNOULLI};
    for (size_t o = 0; o < sizeof samplers / sizeof samplers[0]; o++) {
        for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
            for (int k = 0; k < 2; k++) {
                nbi_op op = samplers[o];
                bool has_dtype = op != NBI_OP_RNG_BITS && op != NBI_OP_RNG_BERNOULLI;
                if (k == 1 && !has_dtype && op != NBI_OP_RNG_BERNOULLI) {
                    continue;
                }
                tcase *c = add_case(op, 1, b_rng, r_rng, TOL_EXACT, 0);
                set_in(c, 0, NB_DTYPE_I32, DOM_ANY, 1, (int64_t[]){2});
                c->ip[0] = S[s].rank;
                memcpy(c->lp[0], S[s].shape, sizeof S[s].shape);
                c->to = k ? NB_DTYPE_F64 : NB_DTYPE_F32;
                c->ip[1] = op == NBI_OP_RNG_UNIFORM            ? k
                           : op == NBI_OP_RNG_TRUNCATED_NORMAL ? 2 + k
                           : op == NBI_OP_RNG_BERNOULLI        ? (int)(4 + (s + k) % 3)
                                                               : 0;
                snprintf(c->label, sizeof c->label, "%s %s rank %d #%zu bounds %d", nbi_op_name(op),
                         has_dtype ? nb_dtype_name(c->to) : "", S[s].rank, s, c->ip[1]);
            }
        }
    }
    static const int64_t pn[] = {0, 1, 10, 37, 3000};
    for (size_t i = 0; i < sizeof pn / sizeof pn[0]; i++) {
        tcase *c = add_case(NBI_OP_RNG_PERMUTATION, 1, b_rng, r_rng, TOL_EXACT, 0);
        set_in(c, 0, NB_DTYPE_I32, DOM_ANY, 1, (int64_t[]){2});
        c->lp[0][0] = pn[i];
        snprintf(c->label, sizeof c->label, "rng_permutation n=%lld", (long long)pn[i]);
    }
}

/* ---- reductions --------------------------------------------------------------------- */

static nb_var *b_reduce(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return c->fn.red(in[0], c->ip[0] < 0 ? NULL : c->ip + 1, c->ip[0] < 0 ? 0 : c->ip[0],
                     c->keepdims);
}

/* Reduced axes as a mask from the case (ip[0] = count or -1 for all, ip[1..] = axes). */
static void red_mask(const tcase *c, int rank, bool *mask) {
    for (int i = 0; i < rank; i++) {
        mask[i] = c->ip[0] < 0;
    }
    for (int k = 0; k < c->ip[0]; k++) {
        int a = c->ip[1 + k] < 0 ? c->ip[1 + k] + rank : c->ip[1 + k];
        mask[a] = true;
    }
}

static void r_reduce(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0];
    bool mask[NB_MAX_RANK];
    red_mask(c, x->rank, mask);
    int r = 0;
    int64_t full[NB_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        full[i] = mask[i] ? 1 : x->shape[i];
        if (!mask[i] || c->keepdims) {
            out->shape[r++] = mask[i] ? 1 : x->shape[i];
        }
    }
    out->rank = r;
    out->n = shape_n(x->rank, full);
    nbi_op op = c->op;
    bool wrap =
        (x->dt == NB_DTYPE_I32 || x->dt == NB_DTYPE_I64) && (op == NBI_OP_SUM || op == NBI_OP_PROD);
    if (wrap) {
        /* integer sums and products wrap: compute them exactly in two's complement */
        int64_t idx2[NB_MAX_RANK];
        uint64_t *acc = calloc((size_t)(out->n + 1), sizeof(uint64_t));
        for (int64_t o = 0; o < out->n; o++) {
            acc[o] = op == NBI_OP_PROD ? 1 : 0;
        }
        for (int64_t i = 0; i < x->n; i++) {
            unravel(i, x->rank, x->shape, idx2);
            int64_t o = 0;
            for (int d = 0; d < x->rank; d++) {
                o = o * full[d] + (mask[d] ? 0 : idx2[d]);
            }
            uint64_t v = (uint64_t)(int64_t)x->v[i];
            acc[o] = op == NBI_OP_PROD ? acc[o] * v : acc[o] + v;
        }
        for (int64_t o = 0; o < out->n; o++) {
            out->v[o] =
                x->dt == NB_DTYPE_I32 ? (double)(int32_t)(uint32_t)acc[o] : (double)(int64_t)acc[o];
        }
        free(acc);
        return;
    }
    for (int64_t o = 0; o < out->n; o++) {
        out->v[o] = op == NBI_OP_SUM    ? 0
                    : op == NBI_OP_PROD ? 1
                    : op == NBI_OP_MAX  ? -INFINITY
                                        : INFINITY;
    }
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < x->n; i++) {
        unravel(i, x->rank, x->shape, idx);
        int64_t o = 0;
        for (int d = 0; d < x->rank; d++) {
            o = o * full[d] + (mask[d] ? 0 : idx[d]);
        }
        double v = x->v[i];
        switch (op) {
        case NBI_OP_SUM:
            out->v[o] += v;
            break;
        case NBI_OP_PROD:
            out->v[o] *= v;
            break;
        case NBI_OP_MAX:
            out->v[o] = rf_max(out->v[o], v) == out->v[o] && !isnan(v) ? out->v[o] : v;
            break;
        default:
            out->v[o] = rf_min(out->v[o], v) == out->v[o] && !isnan(v) ? out->v[o] : v;
            break;
        }
    }
}

static nb_var *b_argmax(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return c->op == NBI_OP_ARGMAX ? nb_argmax(in[0], c->ip[0], c->keepdims)
                                  : nb_argmin(in[0], c->ip[0], c->keepdims);
}
static void r_argmax(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0];
    int ax = c->ip[0] < 0 ? c->ip[0] + x->rank : c->ip[0];
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (i != ax || c->keepdims) {
            out->shape[r++] = i == ax ? 1 : x->shape[i];
        }
    }
    out->rank = r;
    out->n = shape_n(r, out->shape);
    int64_t inner = 1;
    for (int i = ax + 1; i < x->rank; i++) {
        inner *= x->shape[i];
    }
    int64_t len = x->shape[ax];
    for (int64_t o = 0; o < out->n; o++) {
        int64_t outer = o / inner, in_i = o % inner, best = 0;
        double bv = x->v[outer * len * inner + in_i];
        for (int64_t k = 1; k < len; k++) {
            double v = x->v[(outer * len + k) * inner + in_i];
            bool better = isnan(bv)                ? false
                          : isnan(v)               ? true
                          : c->op == NBI_OP_ARGMAX ? v > bv
                                                   : v < bv;
            if (better) {
                best = k;
                bv = v;
            }
        }
        out->v[o] = (double)best;
    }
}

/* ---- shapes ------------------------------------------------------------------------- */

static nb_var *b_reshape(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_reshape(in[0], c->ip[0], c->lp[0]);
}
static void r_reshape(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    out->rank = c->ip[0];
    int64_t known = 1;
    int infer = -1;
    for (int i = 0; i < out->rank; i++) {
        out->shape[i] = c->lp[0][i];
        if (c->lp[0][i] == -1) {
            infer = i;
        } else {
            known *= c->lp[0][i];
        }
    }
    if (infer >= 0) {
        out->shape[infer] = in[0].n / known;
    }
    out->n = in[0].n;
    memcpy(out->v, in[0].v, (size_t)out->n * sizeof(double));
}
static nb_var *b_broadcast(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_broadcast_to(in[0], c->ip[0], c->lp[0]);
}
static void r_broadcast(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    out->rank = c->ip[0];
    memcpy(out->shape, c->lp[0], sizeof out->shape);
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < out->n; i++) {
        unravel(i, out->rank, out->shape, idx);
        out->v[i] = in[0].v[bidx(&in[0], out->rank, idx)];
    }
}
static nb_var *b_transpose(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_transpose(in[0], c->ip[0] ? c->ip + 1 : NULL);
}
static void r_transpose(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0];
    int perm[NB_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        perm[i] =
            c->ip[0] ? (c->ip[1 + i] < 0 ? c->ip[1 + i] + x->rank : c->ip[1 + i]) : x->rank - 1 - i;
    }
    out->rank = x->rank;
    for (int i = 0; i < x->rank; i++) {
        out->shape[i] = x->shape[perm[i]];
    }
    out->n = x->n;
    int64_t idx[NB_MAX_RANK], src[NB_MAX_RANK];
    for (int64_t i = 0; i < out->n; i++) {
        unravel(i, out->rank, out->shape, idx);
        for (int d = 0; d < x->rank; d++) {
            src[perm[d]] = idx[d];
        }
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) {
            off = off * x->shape[d] + src[d];
        }
        out->v[i] = x->v[off];
    }
}

/* Python's slice.indices(), computed independently. */
static int64_t py_slice(int64_t len, int64_t start, int64_t stop, int64_t step, int64_t *first) {
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
    start = start < 0 ? start + len : start;
    stop = stop < 0 ? stop + len : stop;
    start = start < lo ? lo : start > hi ? hi : start;
    stop = stop < lo ? lo : stop > hi ? hi : stop;
    *first = start;
    int64_t cnt = step > 0 ? (stop - start + step - 1) / step : (start - stop - step - 1) / -step;
    return cnt > 0 ? cnt : 0;
}
static nb_var *b_slice(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_slice(in[0], c->lp[0], c->lp[1], c->lp[2]);
}
static void r_slice(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0];
    int64_t first[NB_MAX_RANK];
    out->rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        out->shape[d] = py_slice(x->shape[d], c->lp[0][d], c->lp[1][d], c->lp[2][d], &first[d]);
    }
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < out->n; i++) {
        unravel(i, out->rank, out->shape, idx);
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) {
            off = off * x->shape[d] + first[d] + idx[d] * c->lp[2][d];
        }
        out->v[i] = x->v[off];
    }
}
static nb_var *b_concat(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_concatenate(c->n_in, in, c->ip[0]);
}
static void r_concat(const rarr *in, int n, rarr *out, const tcase *c) {
    int ax = c->ip[0] < 0 ? c->ip[0] + in[0].rank : c->ip[0];
    out->rank = in[0].rank;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    out->shape[ax] = 0;
    for (int i = 0; i < n; i++) {
        out->shape[ax] += in[i].shape[ax];
    }
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < out->n; o++) {
        unravel(o, out->rank, out->shape, idx);
        int k = 0;
        while (idx[ax] >= in[k].shape[ax]) {
            idx[ax] -= in[k].shape[ax];
            k++;
        }
        int64_t off = 0;
        for (int d = 0; d < out->rank; d++) {
            off = off * in[k].shape[d] + idx[d];
        }
        out->v[o] = in[k].v[off];
    }
}
static nb_var *b_pad(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_pad(in[0], c->lp[0], c->lp[1], c->dp);
}
static void r_pad(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0];
    out->rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        out->shape[d] = x->shape[d] + c->lp[0][d] + c->lp[1][d];
    }
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < out->n; o++) {
        unravel(o, out->rank, out->shape, idx);
        bool inside = true;
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) {
            int64_t j = idx[d] - c->lp[0][d];
            inside = inside && j >= 0 && j < x->shape[d];
            off = off * x->shape[d] + j;
        }
        out->v[o] = inside ? x->v[off] : cast_ref(c->dp, x->dt);
    }
}

/* im2col / col2im (op_conv.c): ip[0] = nd; lp[0] = kernel[0..3) stride[3..6); lp[1] = lo,
 * hi; lp[2] = dilation, col2im's spatial sizes; dp = im2col's padding value. */
static nb_var *b_im2col(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nbi_im2col(in[0], c->ip[0], c->lp[0], c->lp[0] + 3, c->lp[2], c->lp[1], c->lp[1] + 3,
                      c->dp);
}
static nb_var *b_col2im(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nbi_col2im(in[0], c->ip[0], c->lp[0], c->lp[0] + 3, c->lp[2], c->lp[1], c->lp[1] + 3,
                      c->lp[2] + 3);
}
/* The input element (flat, in [C, N, S..]) that column entry (c, t, n, o..) reads, or -1
 * for padding; sp: the input's spatial sizes, so: the columns'. */
static int64_t conv_src(const tcase *c, const int64_t *idx, const int64_t *sp, int64_t nch,
                        int64_t nn) {
    int nd = c->ip[0];
    int64_t t = idx[1], tap[3], off = idx[0] * nn + idx[2];
    for (int d = nd - 1; d >= 0; d--) {
        tap[d] = t % c->lp[0][d];
        t /= c->lp[0][d];
    }
    (void)nch;
    for (int d = 0; d < nd; d++) {
        int64_t i = idx[3 + d] * c->lp[0][3 + d] + tap[d] * c->lp[2][d] - c->lp[1][d];
        if (i < 0 || i >= sp[d]) {
            return -1;
        }
        off = off * sp[d] + i;
    }
    return off;
}
static void r_im2col(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0];
    int nd = c->ip[0];
    int64_t k = 1;
    out->rank = nd + 3;
    out->shape[0] = x->shape[0];
    out->shape[2] = x->shape[1];
    for (int d = 0; d < nd; d++) {
        k *= c->lp[0][d];
        int64_t ek = c->lp[2][d] * (c->lp[0][d] - 1) + 1;
        out->shape[3 + d] =
            (x->shape[2 + d] + c->lp[1][d] + c->lp[1][3 + d] - ek) / c->lp[0][3 + d] + 1;
    }
    out->shape[1] = k;
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < out->n; o++) {
        unravel(o, out->rank, out->shape, idx);
        int64_t s = conv_src(c, idx, x->shape + 2, x->shape[0], x->shape[1]);
        out->v[o] = s < 0 ? cast_ref(c->dp, x->dt) : x->v[s];
    }
}
static void r_col2im(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *cols = &in[0];
    int nd = c->ip[0];
    out->rank = nd + 2;
    out->shape[0] = cols->shape[0];
    out->shape[1] = cols->shape[2];
    for (int d = 0; d < nd; d++) {
        out->shape[2 + d] = c->lp[2][3 + d];
    }
    out->n = shape_n(out->rank, out->shape);
    for (int64_t o = 0; o < out->n; o++) {
        out->v[o] = 0;
    }
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < cols->n; i++) {
        unravel(i, cols->rank, cols->shape, idx);
        int64_t s = conv_src(c, idx, out->shape + 2, out->shape[0], out->shape[1]);
        if (s >= 0) { /* rounded to the dtype add by add: the kernel's order, taps in order */
            out->v[s] = cast_ref(out->v[s] + cols->v[i], cols->dt);
        }
    }
}

/* pool_take / pool_scatter (op_conv.c): im2col's parameters (batch first, x [N, C, S..]);
 * dp = pool_take's value at a padding maximum. */
static nb_var *b_pool_take(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nbi_pool_op(NBI_OP_POOL_TAKE, in[0], in[1], c->ip[0], c->lp[0], c->lp[0] + 3, c->lp[2],
                       c->lp[1], c->lp[1] + 3, c->dp);
}
static nb_var *b_pool_scatter(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nbi_pool_op(NBI_OP_POOL_SCATTER, in[0], in[1], c->ip[0], c->lp[0], c->lp[0] + 3,
                       c->lp[2], c->lp[1], c->lp[1] + 3, 0.0);
}
/* The flat offset in x [N, C, S..] of window (n, c, o..)'s first maximum (taps in row-major
 * order, padding -inf, a NaN beating a number), or -1 for a padding position; so: the
 * windows per spatial dim. */
static int64_t pool_src(const tcase *c, const rarr *x, const int64_t *idx) {
    int nd = c->ip[0];
    int64_t k = 1, best_at = -1;
    double best = 0;
    for (int d = 0; d < nd; d++) {
        k *= c->lp[0][d];
    }
    for (int64_t t = 0; t < k; t++) {
        int64_t tap[3], rem = t, off = idx[0] * x->shape[1] + idx[1];
        for (int d = nd - 1; d >= 0; d--) {
            tap[d] = rem % c->lp[0][d];
            rem /= c->lp[0][d];
        }
        bool in = true;
        for (int d = 0; d < nd; d++) {
            int64_t i = idx[2 + d] * c->lp[0][3 + d] + tap[d] * c->lp[2][d] - c->lp[1][d];
            in = in && i >= 0 && i < x->shape[2 + d];
            off = off * x->shape[2 + d] + i;
        }
        double v = in ? x->v[off] : -INFINITY;
        if (t == 0 || v > best || (isnan(v) && !isnan(best))) {
            best = v;
            best_at = in ? off : -1;
        }
    }
    return best_at;
}
static void pool_windows(const tcase *c, const rarr *x, rarr *w) {
    int nd = c->ip[0];
    w->rank = nd + 2;
    w->shape[0] = x->shape[0];
    w->shape[1] = x->shape[1];
    for (int d = 0; d < nd; d++) {
        int64_t ek = c->lp[2][d] * (c->lp[0][d] - 1) + 1;
        w->shape[2 + d] =
            (x->shape[2 + d] + c->lp[1][d] + c->lp[1][3 + d] - ek) / c->lp[0][3 + d] + 1;
    }
    w->n = shape_n(w->rank, w->shape);
}
static void r_pool_take(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    pool_windows(c, &in[0], out);
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < out->n; o++) {
        unravel(o, out->rank, out->shape, idx);
        int64_t s = pool_src(c, &in[0], idx);
        out->v[o] = s < 0 ? cast_ref(c->dp, in[0].dt) : in[1].v[s];
    }
}
static void r_pool_scatter(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    rarr w;
    pool_windows(c, &in[0], &w);
    out->rank = in[0].rank;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    out->n = in[0].n;
    for (int64_t o = 0; o < out->n; o++) {
        out->v[o] = 0;
    }
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < w.n; o++) { /* windows in order, each add rounded to the dtype */
        unravel(o, w.rank, w.shape, idx);
        int64_t s = pool_src(c, &in[0], idx);
        if (s >= 0) {
            out->v[s] = cast_ref(out->v[s] + in[1].v[o], in[1].dt);
        }
    }
}

/* take / take_along_axis: negative indices count back, then clamp (documented choice). */
static int64_t fix_index(double v, int64_t len) {
    int64_t i = (int64_t)v;
    if (i < 0) {
        i += len;
    }
    return i < 0 ? 0 : i >= len ? len - 1 : i;
}
static nb_var *b_take(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_take(in[0], in[1], c->ip[0]);
}
static void r_take(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0], *ix = &in[1];
    int ax = c->ip[0] < 0 ? c->ip[0] + x->rank : c->ip[0];
    int r = 0;
    for (int d = 0; d < ax; d++) {
        out->shape[r++] = x->shape[d];
    }
    for (int d = 0; d < ix->rank; d++) {
        out->shape[r++] = ix->shape[d];
    }
    for (int d = ax + 1; d < x->rank; d++) {
        out->shape[r++] = x->shape[d];
    }
    out->rank = r;
    out->n = shape_n(r, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < out->n; o++) {
        unravel(o, r, out->shape, idx);
        int64_t ioff = 0;
        for (int d = 0; d < ix->rank; d++) {
            ioff = ioff * ix->shape[d] + idx[ax + d];
        }
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) {
            int64_t k = d < ax    ? idx[d]
                        : d == ax ? fix_index(ix->v[ioff], x->shape[ax])
                                  : idx[d + ix->rank - 1];
            off = off * x->shape[d] + k;
        }
        out->v[o] = x->v[off];
    }
}
static nb_var *b_take_along(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_take_along_axis(in[0], in[1], c->ip[0]);
}
static void r_take_along(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0], *ix = &in[1];
    int ax = c->ip[0] < 0 ? c->ip[0] + x->rank : c->ip[0];
    out->rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        out->shape[d] = d == ax ? ix->shape[d] : (x->shape[d] == 1 ? ix->shape[d] : x->shape[d]);
    }
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < out->n; o++) {
        unravel(o, out->rank, out->shape, idx);
        int64_t ioff = 0, off = 0;
        for (int d = 0; d < x->rank; d++) {
            ioff = ioff * ix->shape[d] + (ix->shape[d] == 1 ? 0 : idx[d]);
        }
        for (int d = 0; d < x->rank; d++) {
            int64_t k =
                d == ax ? fix_index(ix->v[ioff], x->shape[ax]) : (x->shape[d] == 1 ? 0 : idx[d]);
            off = off * x->shape[d] + k;
        }
        out->v[o] = x->v[off];
    }
}
static nb_var *b_one_hot(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_one_hot(in[0], c->ip[0], c->to);
}
static void r_one_hot(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    out->rank = in[0].rank + 1;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    out->shape[in[0].rank] = c->ip[0];
    out->n = shape_n(out->rank, out->shape);
    for (int64_t o = 0; o < out->n; o++) {
        int64_t i = o / c->ip[0], k = o % c->ip[0];
        out->v[o] = (double)(in[0].v[i] == (double)k);
    }
}
static nb_var *b_dyn_slice(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    return nb_dynamic_slice(in[0], in + 1, c->lp[0]);
}
static int64_t clamp_start(double s, int64_t dim, int64_t size) {
    int64_t v = (int64_t)s;
    return v < 0 ? 0 : v > dim - size ? dim - size : v;
}
static void r_dyn_slice(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    const rarr *x = &in[0];
    int64_t st[NB_MAX_RANK];
    out->rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        out->shape[d] = c->lp[0][d];
        st[d] = clamp_start(in[1 + d].v[0], x->shape[d], c->lp[0][d]);
    }
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t o = 0; o < out->n; o++) {
        unravel(o, out->rank, out->shape, idx);
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) {
            off = off * x->shape[d] + st[d] + idx[d];
        }
        out->v[o] = x->v[off];
    }
}
static nb_var *b_dyn_update(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    (void)c;
    return nb_dynamic_update_slice(in[0], in[1], in + 2);
}
static void r_dyn_update(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    (void)c;
    const rarr *x = &in[0], *u = &in[1];
    int64_t st[NB_MAX_RANK];
    out->rank = x->rank;
    memcpy(out->shape, x->shape, sizeof out->shape);
    out->n = x->n;
    memcpy(out->v, x->v, (size_t)x->n * sizeof(double));
    for (int d = 0; d < x->rank; d++) {
        st[d] = clamp_start(in[2 + d].v[0], x->shape[d], u->shape[d]);
    }
    int64_t idx[NB_MAX_RANK];
    for (int64_t i = 0; i < u->n; i++) {
        unravel(i, u->rank, u->shape, idx);
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) {
            off = off * x->shape[d] + st[d] + idx[d];
        }
        out->v[off] = u->v[i];
    }
}

/* ---- matmul ------------------------------------------------------------------------- */

static nb_var *b_matmul(nb_trace *tr, nb_var *const *in, const tcase *c) {
    (void)tr;
    (void)c;
    return nb_matmul(in[0], in[1]);
}
static void r_matmul(const rarr *in, int n, rarr *out, const tcase *c) {
    (void)n;
    (void)c;
    rarr a = in[0], b = in[1];
    bool a1 = a.rank == 1, b1 = b.rank == 1;
    if (a1) {
        a.rank = 2;
        a.shape[1] = a.shape[0];
        a.shape[0] = 1;
    }
    if (b1) {
        b.rank = 2;
        b.shape[1] = 1;
    }
    int64_t m = a.shape[a.rank - 2], k = a.shape[a.rank - 1], nn = b.shape[b.rank - 1];
    rarr ab = a, bb = b; /* batch parts */
    ab.rank = a.rank - 2;
    bb.rank = b.rank - 2;
    rarr bat;
    memset(&bat, 0, sizeof bat);
    rarr two[2] = {ab, bb};
    bshape(two, 2, &bat);
    int r = 0;
    for (int i = 0; i < bat.rank; i++) {
        out->shape[r++] = bat.shape[i];
    }
    if (!a1) {
        out->shape[r++] = m;
    }
    if (!b1) {
        out->shape[r++] = nn;
    }
    out->rank = r;
    out->n = bat.n * m * nn;
    int64_t idx[NB_MAX_RANK];
    for (int64_t t = 0; t < bat.n; t++) {
        unravel(t, bat.rank, bat.shape, idx);
        int64_t oa = bidx(&ab, bat.rank, idx), ob = bidx(&bb, bat.rank, idx);
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < nn; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) {
                    s += a.v[(oa * m + i) * k + p] * b.v[(ob * k + p) * nn + j];
                }
                out->v[(t * m + i) * nn + j] = s;
            }
        }
    }
}

/* ---- the specs ---------------------------------------------------------------------- */

static void reduce_cases(nbi_op op, red_b b, const nb_dtype *dts, int n_dts) {
    static const struct {
        int rank;
        int64_t shape[3];
        int n_axes; /* -1: all */
        int axes[3];
    } R[] = {{0, {0}, -1, {0}},    {1, {7}, -1, {0}},         {2, {4, 5}, 1, {1}},
             {2, {4, 5}, 1, {-2}}, {3, {2, 3, 4}, 2, {0, 2}}, {3, {2, 3, 4}, -1, {0}},
             {2, {3, 0}, 1, {1}},  {2, {0, 3}, 1, {1}},       {3, {2, 1, 300}, 1, {-1}},
             {2, {3, 4}, 0, {0}}};
    for (int k = 0; k < n_dts; k++) {
        for (size_t s = 0; s < sizeof R / sizeof R[0]; s++) {
            bool empty_reduced = false;
            for (int q = 0; q < R[s].rank; q++) {
                bool red = R[s].n_axes < 0;
                for (int a = 0; a < R[s].n_axes; a++) {
                    red = red || (R[s].axes[a] + (R[s].axes[a] < 0 ? R[s].rank : 0)) == q;
                }
                empty_reduced = empty_reduced || (red && R[s].shape[q] == 0);
            }
            bool has_out = true;
            for (int q = 0; q < R[s].rank; q++) {
                bool red = R[s].n_axes < 0;
                for (int a = 0; a < R[s].n_axes; a++) {
                    red = red || (R[s].axes[a] + (R[s].axes[a] < 0 ? R[s].rank : 0)) == q;
                }
                has_out = has_out && (red || R[s].shape[q] > 0);
            }
            if ((op == NBI_OP_MAX || op == NBI_OP_MIN) && empty_reduced && has_out) {
                continue; /* an error by design (tested in test_ops_reduce) */
            }
            for (int keep = 0; keep < 2; keep++) {
                tcase *c =
                    add_case(op, 1, b_reduce, r_reduce,
                             (op == NBI_OP_SUM || op == NBI_OP_PROD) ? TOL_SUM : TOL_EXACT, 4);
                c->fn.red = b;
                c->keepdims = keep;
                c->ip[0] = R[s].n_axes;
                for (int a = 0; a < 3; a++) {
                    c->ip[1 + a] = R[s].axes[a];
                }
                set_in(c, 0, dts[k], op == NBI_OP_PROD ? DOM_NONZERO : DOM_ANY, R[s].rank,
                       R[s].shape);
                snprintf(c->label, sizeof c->label, "%s %s #%zu keepdims=%d", nbi_op_name(op),
                         nb_dtype_name(dts[k]), s, keep);
            }
        }
    }
}

static void linalg_cases(void);

static void build_specs(void) {
    /* unary */
    spec_unary(NBI_OP_NEG, nb_neg, rf_neg, DOM_ANY, NUMERIC, 4, 0);
    spec_unary(NBI_OP_ABS, nb_abs, rf_abs, DOM_ANY, NUMERIC, 4, 0);
    spec_unary(NBI_OP_SIGN, nb_sign, rf_sign, DOM_ANY, NUMERIC, 4, 0);
    spec_unary(NBI_OP_EXP, nb_exp, exp, DOM_ANY, FLOATS, 2, 4);
    spec_unary(NBI_OP_EXPM1, nb_expm1, expm1, DOM_ANY, FLOATS, 2, 4);
    spec_unary(NBI_OP_LOG, nb_log, log, DOM_POS, FLOATS, 2, 4);
    spec_unary(NBI_OP_LOG1P, nb_log1p, log1p, DOM_GT_M1, FLOATS, 2, 4);
    spec_unary(NBI_OP_SQRT, nb_sqrt, sqrt, DOM_POS, FLOATS, 2, 4);
    spec_unary(NBI_OP_RSQRT, nb_rsqrt, rf_rsqrt, DOM_POS, FLOATS, 2, 16);
    spec_unary(NBI_OP_SQUARE, nb_square, rf_square, DOM_ANY, NUMERIC, 4, 4);
    spec_unary(NBI_OP_RECIPROCAL, nb_reciprocal, rf_recip, DOM_NONZERO, FLOATS, 2, 4);
    spec_unary(NBI_OP_SIN, nb_sin, sin, DOM_ANY, FLOATS, 2, 4);
    spec_unary(NBI_OP_COS, nb_cos, cos, DOM_ANY, FLOATS, 2, 4);
    spec_unary(NBI_OP_TAN, nb_tan, tan, DOM_SMALL, FLOATS, 2, 4);
    spec_unary(NBI_OP_TANH, nb_tanh, tanh, DOM_ANY, FLOATS, 2, 4);
    spec_unary(NBI_OP_SIGMOID, nb_sigmoid, rf_sigmoid, DOM_ANY, FLOATS, 2, 16);
    spec_unary(NBI_OP_RELU, nb_relu, rf_relu, DOM_ANY, NUMERIC, 4, 0);
    spec_unary(NBI_OP_GELU, nb_gelu, rf_gelu, DOM_ANY, FLOATS, 2, 16);
    spec_unary(NBI_OP_SOFTPLUS, nb_softplus, rf_softplus, DOM_ANY, FLOATS, 2, 16);
    spec_unary(NBI_OP_ERF, nb_erf, erf, DOM_ANY, FLOATS, 2, 4);
    static const nb_dtype BOOLS[] = {NB_DTYPE_BOOL};
    spec_unary(NBI_OP_LOGICAL_NOT, nb_logical_not, rf_not, DOM_BOOL, BOOLS, 1, 0);
    spec_unary(NBI_OP_STOP_GRADIENT, nb_stop_gradient, rf_id, DOM_ANY, ALL, 5, 0);
    spec_unary(NBI_OP_IDENTITY, nbt_identity, rf_id, DOM_ANY, ALL, 5, 0);
    spec_unary(NBI_OP_IMPLICIT, nbt_implicit, rf_id, DOM_ANY, FLOATS, 2, 0);
    /* cast: every pair, plus out-of-range and NaN values saturating */
    for (int f = 0; f < 5; f++) {
        for (int t = 0; t < 5; t++) {
            if (f == t) {
                continue;
            }
            tcase *c = add_case(NBI_OP_CAST, 1, b_cast, r_cast, TOL_EXACT, 0);
            c->to = ALL[t];
            set_in(c, 0, ALL[f], DOM_ANY, 2, (int64_t[]){3, 4});
            snprintf(c->label, sizeof c->label, "cast %s -> %s", nb_dtype_name(ALL[f]),
                     nb_dtype_name(ALL[t]));
        }
    }
    /* binary */
    spec_binary(NBI_OP_ADD, nb_add, rf_add, DOM_ANY, DOM_ANY, NUMERIC, 4, 4);
    spec_binary(NBI_OP_SUB, nb_sub, rf_sub, DOM_ANY, DOM_ANY, NUMERIC, 4, 4);
    spec_binary(NBI_OP_MUL, nb_mul, rf_mul, DOM_ANY, DOM_ANY, NUMERIC, 4, 4);
    spec_binary(NBI_OP_DIV, nb_div, rf_div, DOM_ANY, DOM_NONZERO, FLOATS, 2, 4);
    static const nb_dtype INTS[] = {NB_DTYPE_I32, NB_DTYPE_I64};
    spec_binary(NBI_OP_DIV, nb_div, rf_idiv, DOM_ANY, DOM_NONZERO, INTS, 2, 0);
    spec_binary(NBI_OP_POW, nb_pow, pow, DOM_POS, DOM_ANY, FLOATS, 2, 16);
    spec_binary(NBI_OP_MAXIMUM, nb_maximum, rf_max, DOM_ANY, DOM_ANY, NUMERIC, 4, 0);
    spec_binary(NBI_OP_MINIMUM, nb_minimum, rf_min, DOM_ANY, DOM_ANY, NUMERIC, 4, 0);
    spec_binary(NBI_OP_EQ, nb_eq, rf_eq, DOM_ANY, DOM_ANY, ALL, 5, 0);
    spec_binary(NBI_OP_NE, nb_ne, rf_ne, DOM_ANY, DOM_ANY, ALL, 5, 0);
    spec_binary(NBI_OP_LT, nb_lt, rf_lt, DOM_ANY, DOM_ANY, ALL, 5, 0);
    spec_binary(NBI_OP_LE, nb_le, rf_le, DOM_ANY, DOM_ANY, ALL, 5, 0);
    spec_binary(NBI_OP_GT, nb_gt, rf_gt, DOM_ANY, DOM_ANY, ALL, 5, 0);
    spec_binary(NBI_OP_GE, nb_ge, rf_ge, DOM_ANY, DOM_ANY, ALL, 5, 0);
    spec_binary(NBI_OP_LOGICAL_AND, nb_logical_and, rf_and, DOM_BOOL, DOM_BOOL, BOOLS, 1, 0);
    spec_binary(NBI_OP_LOGICAL_OR, nb_logical_or, rf_or, DOM_BOOL, DOM_BOOL, BOOLS, 1, 0);
    for (int k = 0; k < 5; k++) {
        static const struct {
            int r[3];
            int64_t s[3][3];
        } S[] = {{{2, 2, 2}, {{2, 3}, {2, 3}, {2, 3}}},
                 {{1, 2, 0}, {{3}, {2, 3}, {0}}},
                 {{0, 1, 2}, {{0}, {4}, {0, 4}}}};
        for (size_t s = 0; s < 3; s++) {
            tcase *c = add_case(NBI_OP_SELECT, 3, b_select, r_select, TOL_EXACT, 0);
            set_in(c, 0, NB_DTYPE_BOOL, DOM_BOOL, S[s].r[0], S[s].s[0]);
            set_in(c, 1, ALL[k], DOM_ANY, S[s].r[1], S[s].s[1]);
            set_in(c, 2, ALL[k], DOM_ANY, S[s].r[2], S[s].s[2]);
            snprintf(c->label, sizeof c->label, "select %s #%zu", nb_dtype_name(ALL[k]), s);
        }
    }
    /* misc */
    for (int k = 0; k < 5; k++) {
        tcase *c = add_case(NBI_OP_FULL, 0, b_full, r_full, TOL_EXACT, 0);
        c->to = ALL[k];
        c->ip[0] = 2;
        c->lp[0][0] = 3;
        c->lp[0][1] = 2;
        c->dp = 2.75;
        snprintf(c->label, sizeof c->label, "full %s", nb_dtype_name(ALL[k]));
        c = add_case(NBI_OP_FULL, 0, b_full, r_full, TOL_EXACT, 0);
        c->to = ALL[k];
        c->ip[0] = 0;
        c->dp = -1e300; /* saturates for integers */
        snprintf(c->label, sizeof c->label, "full rank-0 %s", nb_dtype_name(ALL[k]));
    }
    for (int k = 0; k < 4; k++) {
        for (int ax = 0; ax < 3; ax++) {
            tcase *c = add_case(NBI_OP_IOTA, 0, b_iota, r_iota, TOL_EXACT, 0);
            c->to = NUMERIC[k];
            c->ip[0] = 3;
            c->ip[1] = ax;
            c->lp[0][0] = 2;
            c->lp[0][1] = 3;
            c->lp[0][2] = 4;
            snprintf(c->label, sizeof c->label, "iota %s axis %d", nb_dtype_name(NUMERIC[k]), ax);
        }
    }
    {
        tcase *c = add_case(NBI_OP_CONST, 1, b_constant, r_constant, TOL_EXACT, 0);
        set_in(c, 0, NB_DTYPE_F64, DOM_ANY, 0, NULL);
        snprintf(c->label, sizeof c->label, "constant f64[2,3] + scalar");
    }
    g_covered_by[NBI_OP_PARAM] = "every case here (inputs are params)";
    g_covered_by[NBI_OP_CALL] = "test_call_op below, and test_jit.c test_call_not_inlined";
    g_covered_by[NBI_OP_CALL_OUTPUT] = "test_call_op below, and test_jit.c";
    g_covered_by[NBI_OP_LOOP_REVERSE] = "tests/loops/test_loops.c (checkpointed reversal: "
                                        "bits equal to the bounded reversal's)";
    g_covered_by[NBI_OP_WHILE] = "tests/loops/test_loops.c (while, fori, scan, cond, switch "
                                 "against C loops)";
    g_covered_by[NBI_OP_CUSTOM_VJP] = "test_grad.c test_custom_vjp (forward: a copy)";
    g_covered_by[NBI_OP_CUSTOM_JVP] =
        "test_grad_conformance.c custom_jvp cases, test_jacobian.c (forward: a copy)";
    g_covered_by[NBI_OP_CHECK] = "tests/ode/test_ode.c test_max_steps (a failed solve with "
                                 "throw_on_failure fails the call, under jit and grad; a "
                                 "successful one passes its values through)";
    g_covered_by[NBI_OP_PRINT] = "test_jit.c test_debug_print (the value passes through: the "
                                 "sums and gradients there; what it prints, in order)";
    g_covered_by[NBI_OP_FUSED] = "test_passes.c test_fusion_is_bit_identical (made only by the "
                                 "fusion pass; every case here with a chain runs fused)";
    g_covered_by[NBI_OP_FUSED_OUTPUT] = "test_passes.c test_fusion_multi_output (made only by "
                                        "the fusion pass, beside a fused node)";
    /* reductions */
    reduce_cases(NBI_OP_SUM, nb_sum, NUMERIC, 4);
    reduce_cases(NBI_OP_PROD, nb_prod, NUMERIC, 4);
    reduce_cases(NBI_OP_MAX, nb_max, NUMERIC, 4);
    reduce_cases(NBI_OP_MIN, nb_min, NUMERIC, 4);
    for (int op = 0; op < 2; op++) {
        for (int k = 0; k < 5; k++) {
            static const struct {
                int rank;
                int64_t shape[3];
                int axis;
            } A[] = {
                {1, {6}, 0}, {2, {3, 5}, 1}, {2, {3, 5}, -2}, {3, {2, 4, 3}, 1}, {2, {4, 1}, 1}};
            for (size_t s = 0; s < 5; s++) {
                for (int keep = 0; keep < 2; keep++) {
                    tcase *c = add_case(op ? NBI_OP_ARGMIN : NBI_OP_ARGMAX, 1, b_argmax, r_argmax,
                                        TOL_EXACT, 0);
                    c->ip[0] = A[s].axis;
                    c->keepdims = keep;
                    set_in(c, 0, ALL[k], DOM_ANY, A[s].rank, A[s].shape);
                    snprintf(c->label, sizeof c->label, "%s %s #%zu keep=%d",
                             op ? "argmin" : "argmax", nb_dtype_name(ALL[k]), s, keep);
                }
            }
        }
    }
    /* shapes */
    for (int k = 0; k < 5; k++) {
        nb_dtype d = ALL[k];
        tcase *c = add_case(NBI_OP_RESHAPE, 1, b_reshape, r_reshape, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){3, 4});
        c->ip[0] = 3;
        memcpy(c->lp[0], (int64_t[]){2, -1, 3}, 3 * sizeof(int64_t));
        snprintf(c->label, sizeof c->label, "reshape %s [3,4]->[2,-1,3]", nb_dtype_name(d));
        c = add_case(NBI_OP_RESHAPE, 1, b_reshape, r_reshape, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 3, (int64_t[]){1, 1, 1});
        c->ip[0] = 0;
        snprintf(c->label, sizeof c->label, "reshape %s [1,1,1]->[]", nb_dtype_name(d));
        c = add_case(NBI_OP_BROADCAST, 1, b_broadcast, r_broadcast, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){3, 1});
        c->ip[0] = 3;
        memcpy(c->lp[0], (int64_t[]){2, 3, 4}, 3 * sizeof(int64_t));
        snprintf(c->label, sizeof c->label, "broadcast_to %s", nb_dtype_name(d));
        c = add_case(NBI_OP_BROADCAST, 1, b_broadcast, r_broadcast, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 0, NULL);
        c->ip[0] = 2;
        memcpy(c->lp[0], (int64_t[]){0, 5}, 2 * sizeof(int64_t));
        snprintf(c->label, sizeof c->label, "broadcast_to %s scalar->[0,5]", nb_dtype_name(d));
        c = add_case(NBI_OP_TRANSPOSE, 1, b_transpose, r_transpose, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 3, (int64_t[]){2, 3, 4});
        c->ip[0] = 1;
        c->ip[1] = 2;
        c->ip[2] = 0;
        c->ip[3] = -2;
        snprintf(c->label, sizeof c->label, "transpose %s perm [2,0,-2]", nb_dtype_name(d));
        c = add_case(NBI_OP_TRANSPOSE, 1, b_transpose, r_transpose, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){37, 45});
        c->ip[0] = 0;
        snprintf(c->label, sizeof c->label, "transpose %s [37,45] reversed", nb_dtype_name(d));
        c = add_case(NBI_OP_SLICE, 1, b_slice, r_slice, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){7, 6});
        memcpy(c->lp[0], (int64_t[]){1, -1}, 2 * sizeof(int64_t));
        memcpy(c->lp[1], (int64_t[]){100, -7}, 2 * sizeof(int64_t));
        memcpy(c->lp[2], (int64_t[]){2, -2}, 2 * sizeof(int64_t));
        snprintf(c->label, sizeof c->label, "slice %s [1:100:2, -1:-7:-2]", nb_dtype_name(d));
        c = add_case(NBI_OP_SLICE, 1, b_slice, r_slice, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 1, (int64_t[]){5});
        memcpy(c->lp[0], (int64_t[]){3}, sizeof(int64_t));
        memcpy(c->lp[1], (int64_t[]){1}, sizeof(int64_t));
        memcpy(c->lp[2], (int64_t[]){1}, sizeof(int64_t));
        snprintf(c->label, sizeof c->label, "slice %s empty [3:1]", nb_dtype_name(d));
        c = add_case(NBI_OP_CONCAT, 3, b_concat, r_concat, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){2, 3});
        set_in(c, 1, d, DOM_ANY, 2, (int64_t[]){2, 0});
        set_in(c, 2, d, DOM_ANY, 2, (int64_t[]){2, 4});
        c->ip[0] = -1;
        snprintf(c->label, sizeof c->label, "concatenate %s axis -1", nb_dtype_name(d));
        c = add_case(NBI_OP_CONCAT, 2, b_concat, r_concat, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 1, (int64_t[]){1});
        set_in(c, 1, d, DOM_ANY, 1, (int64_t[]){5});
        c->ip[0] = 0;
        snprintf(c->label, sizeof c->label, "concatenate %s axis 0", nb_dtype_name(d));
        if (d == NB_DTYPE_F32 || d == NB_DTYPE_F64) {
            /* im2col: 2-d with stride, dilation and uneven padding; 1-d; 3-d; and with stride
             * 1 and rows as long as the input's, where each plane is one shifted copy
             * (nbi_im2col_plane): 2-d SAME, 2-d dilated with uneven padding, 3-d with a depth
             * stride. col2im: the overlapping windows' sums, exactly: the reference adds in the
             * kernel's order (taps in order, from +0), rounding each add to the dtype (exact
             * in f64 arithmetic for f32: double rounding of a sum is innocuous at 53 >= 2 * 24
             * + 2 bits) */
            static const struct {
                int nd;
                int64_t x[5], k[3], s[3], lo[3], hi[3], dl[3];
            } IC[] = {{2, {2, 3, 5, 6}, {2, 3}, {2, 1}, {1, 0}, {2, 2}, {1, 2}},
                      {1, {3, 2, 7}, {3}, {2}, {1}, {1}, {1}},
                      {3, {1, 2, 3, 2, 3}, {2, 1, 2}, {1, 1, 2}, {0, 1, 1}, {1, 0, 0}, {1, 1, 1}},
                      {2, {2, 3, 5, 6}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}},
                      {2, {1, 2, 4, 5}, {3, 3}, {1, 1}, {2, 3}, {2, 1}, {2, 2}},
                      {3, {1, 2, 3, 4, 5}, {2, 3, 3}, {2, 1, 1}, {1, 0, 2}, {0, 2, 0}, {1, 1, 1}}};
            for (size_t s = 0; s < sizeof IC / sizeof IC[0]; s++) {
                for (int op = 0; op < 2; op++) {
                    c = add_case(op ? NBI_OP_COL2IM : NBI_OP_IM2COL, 1, op ? b_col2im : b_im2col,
                                 op ? r_col2im : r_im2col, TOL_EXACT, 0);
                    int nd = IC[s].nd;
                    c->ip[0] = nd;
                    int64_t so[3], kk = 1;
                    for (int q = 0; q < nd; q++) {
                        c->lp[0][q] = IC[s].k[q];
                        c->lp[0][3 + q] = IC[s].s[q];
                        c->lp[1][q] = IC[s].lo[q];
                        c->lp[1][3 + q] = IC[s].hi[q];
                        c->lp[2][q] = IC[s].dl[q];
                        c->lp[2][3 + q] = IC[s].x[2 + q];
                        int64_t ek = IC[s].dl[q] * (IC[s].k[q] - 1) + 1;
                        so[q] = (IC[s].x[2 + q] + IC[s].lo[q] + IC[s].hi[q] - ek) / IC[s].s[q] + 1;
                        kk *= IC[s].k[q];
                    }
                    c->dp = op ? 0.0 : (s == 0 || s >= 3 ? -2.5 : 0.0);
                    if (op == 0) {
                        set_in(c, 0, d, DOM_ANY, nd + 2, IC[s].x);
                    } else {
                        int64_t cs[6] = {IC[s].x[0], kk, IC[s].x[1]};
                        memcpy(cs + 3, so, (size_t)nd * sizeof(int64_t));
                        set_in(c, 0, d, DOM_ANY, nd + 3, cs);
                    }
                    snprintf(c->label, sizeof c->label, "%s %s %dd #%zu", op ? "col2im" : "im2col",
                             nb_dtype_name(d), nd, s);
                }
                /* pool_take and pool_scatter over the same windows (x read as [N, C, S..]):
                 * the scatter's overlapping windows add in window order, each add rounded */
                for (int op = 0; op < 2; op++) {
                    c = add_case(op ? NBI_OP_POOL_SCATTER : NBI_OP_POOL_TAKE, 2,
                                 op ? b_pool_scatter : b_pool_take,
                                 op ? r_pool_scatter : r_pool_take, TOL_EXACT, 0);
                    int nd = IC[s].nd;
                    c->ip[0] = nd;
                    int64_t ws[5] = {IC[s].x[0], IC[s].x[1]};
                    for (int q = 0; q < nd; q++) {
                        c->lp[0][q] = IC[s].k[q];
                        c->lp[0][3 + q] = IC[s].s[q];
                        c->lp[1][q] = IC[s].lo[q];
                        c->lp[1][3 + q] = IC[s].hi[q];
                        c->lp[2][q] = IC[s].dl[q];
                        int64_t ek = IC[s].dl[q] * (IC[s].k[q] - 1) + 1;
                        ws[2 + q] =
                            (IC[s].x[2 + q] + IC[s].lo[q] + IC[s].hi[q] - ek) / IC[s].s[q] + 1;
                    }
                    c->dp = op ? 0.0 : -3.5;
                    set_in(c, 0, d, DOM_ANY, nd + 2, IC[s].x);
                    set_in(c, 1, d, DOM_ANY, nd + 2, op ? ws : IC[s].x);
                    snprintf(c->label, sizeof c->label, "%s %s %dd #%zu",
                             op ? "pool_scatter" : "pool_take", nb_dtype_name(d), nd, s);
                }
            }
        }
        c = add_case(NBI_OP_PAD, 1, b_pad, r_pad, TOL_EXACT, 0);
        set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){2, 3});
        memcpy(c->lp[0], (int64_t[]){1, 0}, 2 * sizeof(int64_t));
        memcpy(c->lp[1], (int64_t[]){2, 3}, 2 * sizeof(int64_t));
        c->dp = d == NB_DTYPE_BOOL ? 1 : 7.5;
        snprintf(c->label, sizeof c->label, "pad %s", nb_dtype_name(d));
        for (int it = 0; it < 2; it++) {
            nb_dtype id = it ? NB_DTYPE_I64 : NB_DTYPE_I32;
            c = add_case(NBI_OP_TAKE, 2, b_take, r_take, TOL_EXACT, 0);
            set_in(c, 0, d, DOM_ANY, 3, (int64_t[]){3, 5, 2});
            set_in(c, 1, id, DOM_IDX, 2, (int64_t[]){2, 4});
            c->ip[0] = 1;
            snprintf(c->label, sizeof c->label, "take %s idx %s axis 1", nb_dtype_name(d),
                     nb_dtype_name(id));
            c = add_case(NBI_OP_TAKE_ALONG, 2, b_take_along, r_take_along, TOL_EXACT, 0);
            set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){4, 6});
            set_in(c, 1, id, DOM_IDX, 2, (int64_t[]){4, 3});
            c->ip[0] = -1;
            snprintf(c->label, sizeof c->label, "take_along_axis %s idx %s", nb_dtype_name(d),
                     nb_dtype_name(id));
            c = add_case(NBI_OP_ONE_HOT, 1, b_one_hot, r_one_hot, TOL_EXACT, 0);
            set_in(c, 0, id, DOM_IDX, 2, (int64_t[]){2, 3});
            c->ip[0] = 5;
            c->to = d;
            snprintf(c->label, sizeof c->label, "one_hot %s from %s", nb_dtype_name(d),
                     nb_dtype_name(id));
            c = add_case(NBI_OP_DYN_SLICE, 3, b_dyn_slice, r_dyn_slice, TOL_EXACT, 0);
            set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){5, 4});
            set_in(c, 1, id, DOM_IDX, 0, NULL);
            set_in(c, 2, id, DOM_IDX, 0, NULL);
            memcpy(c->lp[0], (int64_t[]){2, 3}, 2 * sizeof(int64_t));
            snprintf(c->label, sizeof c->label, "dynamic_slice %s starts %s", nb_dtype_name(d),
                     nb_dtype_name(id));
            c = add_case(NBI_OP_DYN_UPDATE, 4, b_dyn_update, r_dyn_update, TOL_EXACT, 0);
            set_in(c, 0, d, DOM_ANY, 2, (int64_t[]){5, 4});
            set_in(c, 1, d, DOM_ANY, 2, (int64_t[]){2, 3});
            set_in(c, 2, id, DOM_IDX, 0, NULL);
            set_in(c, 3, id, DOM_IDX, 0, NULL);
            snprintf(c->label, sizeof c->label, "dynamic_update_slice %s starts %s",
                     nb_dtype_name(d), nb_dtype_name(id));
        }
    }
    /* matmul */
    static const struct {
        int ra, rb;
        int64_t sa[4], sb[4];
    } M[] = {{2, 2, {5, 7}, {7, 3}}, {1, 2, {7}, {7, 3}},          {2, 1, {5, 7}, {7}},
             {1, 1, {7}, {7}},       {3, 3, {2, 4, 6}, {2, 6, 3}}, {4, 3, {2, 1, 3, 4}, {5, 4, 2}},
             {2, 2, {3, 0}, {0, 4}}, {2, 2, {0, 3}, {3, 2}},       {2, 2, {40, 70}, {70, 33}}};
    for (int k = 0; k < 4; k++) {
        for (size_t s = 0; s < sizeof M / sizeof M[0]; s++) {
            tcase *c = add_case(NBI_OP_MATMUL, 2, b_matmul, r_matmul, TOL_MATMUL, 4);
            set_in(c, 0, NUMERIC[k], DOM_ANY, M[s].ra, M[s].sa);
            set_in(c, 1, NUMERIC[k], DOM_ANY, M[s].rb, M[s].sb);
            snprintf(c->label, sizeof c->label, "matmul %s #%zu", nb_dtype_name(NUMERIC[k]), s);
        }
    }
    /* random numbers */
    rng_cases();
    linalg_cases();
}

/* ---- linear algebra (nabla/linalg.h) ------------------------------------------------
 *
 * Inputs are raw random matrices X; ip[0] says what the builder makes of them before the
 * op under test: 0 X itself (general: LU pivots), 1 X X^T + n I (positive definite), 2
 * X + (n + 2) I (a triangle with a dominant diagonal). ip[1] holds the op's flags (lower,
 * transpose, unit diagonal), ip[2] the op (lu_solve and cholesky_solve factor first). The
 * reference repeats the algorithm in double: LU with the first largest pivot, Cholesky by
 * rows, substitution. */

enum { LA_LOWER = 1, LA_TRANS = 2, LA_UNIT = 4 };

static nb_var *la_matrix(nb_trace *tr, nb_var *x, int kind) {
    int64_t n = nb_var_dim(x, -1), s[2] = {n, n};
    nb_var *eye =
        nb_cast(nb_eq(nb_iota(tr, NB_DTYPE_I32, 2, s, 0), nb_iota(tr, NB_DTYPE_I32, 2, s, 1)),
                nb_var_dtype(x));
    if (kind == 1) {
        int r = nb_var_rank(x), perm[NB_MAX_RANK];
        for (int i = 0; i < r; i++) {
            perm[i] = i;
        }
        perm[r - 2] = r - 1;
        perm[r - 1] = r - 2;
        return nb_add(nb_matmul(x, nb_transpose(x, perm)), nb_mul(eye, nb_scalar(tr, (double)n)));
    }
    if (kind == 2) {
        return nb_add(x, nb_mul(eye, nb_scalar(tr, (double)n + 2)));
    }
    return x;
}

static nb_var *b_linalg(nb_trace *tr, nb_var *const *in, const tcase *c) {
    nb_var *a = la_matrix(tr, in[0], c->ip[0]);
    int fl = c->ip[1];
    switch ((nbi_op)c->ip[2]) {
    case NBI_OP_LU_FACTOR:
        return nb_lu_factor(a);
    case NBI_OP_LU_SOLVE:
        return nb_lu_solve(nb_lu_factor(a), in[1], (fl & LA_TRANS) != 0);
    case NBI_OP_SOLVE:
        return nb_solve(a, in[1]);
    case NBI_OP_CHOLESKY:
        return nb_cholesky(a);
    case NBI_OP_CHOLESKY_SOLVE:
        return nb_cholesky_solve(nb_cholesky(a), in[1]);
    case NBI_OP_TRI_SOLVE:
        return nb_triangular_solve(a, in[1], fl & LA_LOWER, fl & LA_TRANS, fl & LA_UNIT);
    default: { /* slogdet: (sign, log|det|) stacked */
        nb_var *sign = NULL, *logabs = nb_slogdet(a, &sign);
        return nb_stack(2, (nb_var *[]){sign, logabs}, -1);
    }
    }
}

/* matrix t of input x (its batch element at offset off), made as the builder makes it */
static void la_ref_matrix(const double *x, int64_t n, int kind, double *a) {
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < n; j++) {
            double v = x[i * n + j];
            if (kind == 1) {
                v = i == j ? (double)n : 0;
                for (int64_t q = 0; q < n; q++) {
                    v += x[i * n + q] * x[j * n + q];
                }
            } else if (kind == 2 && i == j) {
                v += (double)n + 2;
            }
            a[i * n + j] = v;
        }
    }
}

/* packed LU of a (n x n) into m ((n + 1) x n), as the kernel defines it */
static void la_ref_lu(const double *a, int64_t n, double *m) {
    memcpy(m, a, (size_t)(n * n) * sizeof *m);
    double *p = m + n * n;
    for (int64_t i = 0; i < n; i++) {
        p[i] = (double)i;
    }
    for (int64_t c = 0; c < n; c++) {
        int64_t piv = c;
        for (int64_t i = c + 1; i < n; i++) {
            if (fabs(m[i * n + c]) > fabs(m[piv * n + c])) {
                piv = i;
            }
        }
        for (int64_t q = 0; q < n; q++) {
            double t = m[c * n + q];
            m[c * n + q] = m[piv * n + q];
            m[piv * n + q] = t;
        }
        double t = p[c];
        p[c] = p[piv];
        p[piv] = t;
        for (int64_t i = c + 1; i < n; i++) {
            m[i * n + c] /= m[c * n + c];
            for (int64_t q = c + 1; q < n; q++) {
                m[i * n + q] -= m[i * n + c] * m[c * n + q];
            }
        }
    }
}

/* x (n x k) := op(A)^{-1} b by Gaussian elimination on a copy (A general, n <= 8) */
static void la_ref_gauss(const double *a, int64_t n, bool trans, double *x, int64_t k) {
    double w[8 * 8];
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < n; j++) {
            w[i * n + j] = trans ? a[j * n + i] : a[i * n + j];
        }
    }
    for (int64_t c = 0; c < n; c++) {
        int64_t piv = c;
        for (int64_t i = c + 1; i < n; i++) {
            if (fabs(w[i * n + c]) > fabs(w[piv * n + c])) {
                piv = i;
            }
        }
        for (int64_t q = 0; q < n; q++) {
            double t = w[c * n + q];
            w[c * n + q] = w[piv * n + q];
            w[piv * n + q] = t;
        }
        for (int64_t q = 0; q < k; q++) {
            double t = x[c * k + q];
            x[c * k + q] = x[piv * k + q];
            x[piv * k + q] = t;
        }
        for (int64_t i = c + 1; i < n; i++) {
            double l = w[i * n + c] / w[c * n + c];
            for (int64_t q = c; q < n; q++) {
                w[i * n + q] -= l * w[c * n + q];
            }
            for (int64_t q = 0; q < k; q++) {
                x[i * k + q] -= l * x[c * k + q];
            }
        }
    }
    for (int64_t i = n - 1; i >= 0; i--) {
        for (int64_t q = 0; q < k; q++) {
            double s = x[i * k + q];
            for (int64_t j = i + 1; j < n; j++) {
                s -= w[i * n + j] * x[j * k + q];
            }
            x[i * k + q] = s / w[i * n + i];
        }
    }
}

static void r_linalg(const rarr *in, int n_in, rarr *out, const tcase *c) {
    const rarr *x = &in[0];
    int64_t n = x->shape[x->rank - 1];
    int fl = c->ip[1];
    nbi_op op = (nbi_op)c->ip[2];
    double a[64], m[72];
    if (op == NBI_OP_LU_FACTOR || op == NBI_OP_CHOLESKY || op == NBI_OP_SLOGDET) {
        int64_t nb = shape_n(x->rank - 2, x->shape);
        out->rank = op == NBI_OP_SLOGDET ? x->rank - 1 : x->rank;
        memcpy(out->shape, x->shape, sizeof out->shape);
        if (op == NBI_OP_LU_FACTOR) {
            out->shape[x->rank - 2] = n + 1;
        } else if (op == NBI_OP_SLOGDET) {
            out->shape[x->rank - 2] = 2;
        }
        out->n = shape_n(out->rank, out->shape);
        for (int64_t t = 0; t < nb; t++) {
            la_ref_matrix(x->v + t * n * n, n, c->ip[0], a);
            if (op == NBI_OP_LU_FACTOR) {
                la_ref_lu(a, n, out->v + t * (n + 1) * n);
            } else if (op == NBI_OP_CHOLESKY) {
                double *l = out->v + t * n * n;
                for (int64_t i = 0; i < n; i++) {
                    for (int64_t j = 0; j < n; j++) {
                        double s = j <= i ? a[i * n + j] : 0;
                        for (int64_t q = 0; q < j && j <= i; q++) {
                            s -= l[i * n + q] * l[j * n + q];
                        }
                        l[i * n + j] = j < i ? s / l[j * n + j] : j == i ? sqrt(s) : 0;
                    }
                }
            } else {
                la_ref_lu(a, n, m);
                double sign = 1, logabs = 0;
                for (int64_t i = 0; i < n; i++) {
                    sign *= m[i * n + i] < 0 ? -1 : 1;
                    logabs += log(fabs(m[i * n + i]));
                }
                for (int64_t i = 0; i < n; i++) { /* parity by sorting a copy */
                    for (int64_t j = i + 1; j < n; j++) {
                        sign *= m[n * n + j] < m[n * n + i] ? -1 : 1;
                    }
                }
                out->v[2 * t] = sign;
                out->v[2 * t + 1] = logabs;
            }
        }
        return;
    }
    /* solves: b vector per matrix (rank 1, or one dim fewer than the matrix) or [..., n, k] */
    (void)n_in;
    const rarr *b = &in[1];
    bool vec = b->rank == 1 || b->rank == x->rank - 1;
    int rb = b->rank - (vec ? 1 : 2);
    int64_t k = vec ? 1 : b->shape[b->rank - 1];
    rarr xb = *x, bb = *b, bat;
    xb.rank = x->rank - 2;
    bb.rank = rb;
    rarr two[2] = {xb, bb};
    memset(&bat, 0, sizeof bat);
    bshape(two, 2, &bat);
    out->rank = bat.rank + (vec ? 1 : 2);
    memcpy(out->shape, bat.shape, (size_t)bat.rank * sizeof(int64_t));
    out->shape[bat.rank] = n;
    if (!vec) {
        out->shape[bat.rank + 1] = k;
    }
    out->n = shape_n(out->rank, out->shape);
    int64_t idx[NB_MAX_RANK];
    for (int64_t t = 0; t < bat.n; t++) {
        unravel(t, bat.rank, bat.shape, idx);
        const double *xt = x->v + bidx(&xb, bat.rank, idx) * n * n;
        const double *bt = b->v + bidx(&bb, bat.rank, idx) * n * k;
        double *o = out->v + t * n * k;
        memcpy(o, bt, (size_t)(n * k) * sizeof *o);
        la_ref_matrix(xt, n, c->ip[0], a);
        if (op == NBI_OP_TRI_SOLVE) {
            bool lower = fl & LA_LOWER;
            for (int64_t i = 0; i < n; i++) {
                for (int64_t j = 0; j < n; j++) {
                    bool keep = lower ? j <= i : j >= i;
                    a[i * n + j] = (fl & LA_UNIT) && i == j ? 1 : keep ? a[i * n + j] : 0;
                }
            }
        }
        la_ref_gauss(a, n, (fl & LA_TRANS) && op != NBI_OP_CHOLESKY_SOLVE, o, k);
    }
}

static void linalg_cases(void) {
    static const struct {
        nbi_op op;
        int kind, flags;
        int ra, rb; /* ranks; rb 0: no b */
        int64_t sa[4], sb[4];
    } L[] = {
        {NBI_OP_LU_FACTOR, 0, 0, 2, 0, {4, 4}, {0}},
        {NBI_OP_LU_FACTOR, 0, 0, 3, 0, {3, 5, 5}, {0}},
        {NBI_OP_LU_FACTOR, 0, 0, 2, 0, {1, 1}, {0}},
        {NBI_OP_LU_FACTOR, 0, 0, 3, 0, {2, 0, 0}, {0}},
        {NBI_OP_LU_SOLVE, 0, 0, 2, 1, {4, 4}, {4}},
        {NBI_OP_LU_SOLVE, 0, LA_TRANS, 3, 3, {2, 3, 3}, {2, 3, 2}},
        {NBI_OP_LU_SOLVE, 0, LA_TRANS, 2, 2, {5, 5}, {5, 3}},
        {NBI_OP_SOLVE, 0, 0, 2, 1, {3, 3}, {3}},
        {NBI_OP_SOLVE, 0, 0, 3, 3, {2, 4, 4}, {2, 4, 2}},
        {NBI_OP_SOLVE, 0, 0, 2, 3, {4, 4}, {5, 4, 2}},       /* one matrix, a batch of b */
        {NBI_OP_SOLVE, 0, 0, 4, 3, {2, 1, 3, 3}, {2, 4, 3}}, /* vectors, batch broadcast */
        {NBI_OP_SOLVE, 0, 0, 2, 1, {0, 0}, {0}},
        {NBI_OP_CHOLESKY, 1, 0, 2, 0, {4, 4}, {0}},
        {NBI_OP_CHOLESKY, 1, 0, 3, 0, {3, 6, 6}, {0}},
        {NBI_OP_CHOLESKY, 1, 0, 2, 0, {1, 1}, {0}},
        {NBI_OP_CHOLESKY_SOLVE, 1, 0, 2, 1, {4, 4}, {4}},
        {NBI_OP_CHOLESKY_SOLVE, 1, 0, 3, 3, {2, 3, 3}, {2, 3, 4}},
        {NBI_OP_TRI_SOLVE, 2, LA_LOWER, 2, 1, {5, 5}, {5}},
        {NBI_OP_TRI_SOLVE, 2, 0, 2, 2, {4, 4}, {4, 3}},
        {NBI_OP_TRI_SOLVE, 2, LA_LOWER | LA_TRANS, 3, 3, {2, 4, 4}, {2, 4, 2}},
        {NBI_OP_TRI_SOLVE, 2, LA_TRANS | LA_UNIT, 2, 1, {6, 6}, {6}},
        {NBI_OP_TRI_SOLVE, 2, LA_LOWER | LA_UNIT, 2, 3, {3, 3}, {2, 3, 2}},
        {NBI_OP_SLOGDET, 0, 0, 2, 0, {4, 4}, {0}},
        {NBI_OP_SLOGDET, 0, 0, 3, 0, {3, 5, 5}, {0}},
        {NBI_OP_SLOGDET, 0, 0, 2, 0, {0, 0}, {0}},
    };
    for (int k = 0; k < 2; k++) {
        for (size_t s = 0; s < sizeof L / sizeof L[0]; s++) {
            tcase *c = add_case(L[s].op, L[s].rb ? 2 : 1, b_linalg, r_linalg, TOL_LINALG, 0);
            c->ip[0] = L[s].kind;
            c->ip[1] = L[s].flags;
            c->ip[2] = (int)L[s].op;
            set_in(c, 0, FLOATS[k], DOM_ANY, L[s].ra, L[s].sa);
            if (L[s].rb) {
                set_in(c, 1, FLOATS[k], DOM_ANY, L[s].rb, L[s].sb);
            }
            snprintf(c->label, sizeof c->label, "%s %s #%zu", nbi_op_name(L[s].op),
                     nb_dtype_name(FLOATS[k]), s);
        }
    }
}

/* ---- running a case ----------------------------------------------------------------- */

typedef struct run_state {
    const tcase *c;
    nb_array *in[MAX_IN];
    bool as_constants;
} run_state;

static run_state g_run;

static nb_status body_case(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const tcase *c = g_run.c;
    nb_var *in[MAX_IN] = {0};
    for (int i = 0; i < c->n_in; i++) {
        in[i] = g_run.as_constants ? nb_constant(tr, g_run.in[i]) : nb_get(tr, args, "[%d]", i);
    }
    return nb_return(c->build(tr, in, c), out);
}

static nb_array *make_input(nb_ctx *ctx, const tcase *c, int i, rarr *r) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, c->dt[i], c->rank[i], c->shape[i], &a));
    r->dt = c->dt[i];
    r->rank = c->rank[i];
    memcpy(r->shape, c->shape[i], sizeof r->shape);
    r->n = nb_array_size(a);
    r->v = calloc((size_t)(r->n + 1), sizeof(double));
    for (int64_t k = 0; k < r->n; k++) {
        double v = gen_value(c->dt[i], c->dm[i]);
        r->v[k] = v;
        switch (c->dt[i]) {
        case NB_DTYPE_F32:
            ((float *)nb_array_data(a))[k] = (float)v;
            break;
        case NB_DTYPE_F64:
            ((double *)nb_array_data(a))[k] = v;
            break;
        case NB_DTYPE_I32:
            ((int32_t *)nb_array_data(a))[k] = (int32_t)v;
            break;
        case NB_DTYPE_I64:
            ((int64_t *)nb_array_data(a))[k] = (int64_t)v;
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)nb_array_data(a))[k] = v != 0;
            break;
        }
    }
    return a;
}

static double ulp_of(nb_dtype dt) {
    return dt == NB_DTYPE_F32 ? 5.96e-8 : 1.11e-16;
}

/* The allowed |got - want| for element i of the output. */
static double allowed(const tcase *c, const rarr *in, const rarr *out, int64_t i, nb_dtype dt) {
    if (c->tol == TOL_EXACT || !nb_dtype_is_float(dt)) {
        return 0;
    }
    double u = ulp_of(dt);
    if (c->tol == TOL_ULP) {
        double scale = 1;
        return c->ulps * u * (fabs(out->v[i]) + scale * 1e-6);
    }
    if (c->tol == TOL_SUM) {
        /* n * ulp * sum|terms| over the whole input: a bound for every output element */
        double s = 0;
        for (int64_t k = 0; k < in[0].n; k++) {
            s += c->op == NBI_OP_PROD ? 0 : fabs(in[0].v[k]);
        }
        if (c->op == NBI_OP_PROD) {
            return (double)(in[0].n + 1) * 2 * u * fabs(out->v[i]);
        }
        return (double)(in[0].n + 1) * u * s;
    }
    if (c->tol == TOL_LINALG) {
        /* factorisations and solves: backward stable, so forward errors scale with the
         * condition number; random matrices of n <= 6 stay below ~1e3: 1e4 n^2 ulp of the
         * result's scale (f64 ~1e-11, f32 ~2e-2 of 1) -- an error in a rule or a pivot is
         * O(1) */
        double mo = 1;
        for (int64_t k = 0; k < out->n; k++) {
            mo = fmax(mo, isfinite(out->v[k]) ? fabs(out->v[k]) : 0);
        }
        int64_t n = in[0].rank >= 2 ? in[0].shape[in[0].rank - 1] : 1;
        return 1e4 * (double)(n * n + 1) * u * mo;
    }
    /* matmul: k * ulp * max |a| * max |b| * k */
    double ma = 0, mb = 0;
    for (int64_t k = 0; k < in[0].n; k++) {
        ma = fmax(ma, fabs(in[0].v[k]));
    }
    for (int64_t k = 0; k < in[1].n; k++) {
        mb = fmax(mb, fabs(in[1].v[k]));
    }
    int64_t kk = in[0].rank ? in[0].shape[in[0].rank - 1] : 1;
    return (double)(kk + 1) * (double)(kk + 1) * u * ma * mb;
}

static bool same_value(double got, double want, double tol) {
    if (isnan(want)) {
        return isnan(got);
    }
    if (isinf(want)) {
        return got == want;
    }
    return fabs(got - want) <= tol;
}

static int g_failures;

static void run_case(nb_ctx *ctx, const tcase *c) {
    rarr in[MAX_IN];
    memset(in, 0, sizeof in);
    nb_tree *leaves[MAX_IN] = {0}, *args = NULL;
    for (int i = 0; i < c->n_in; i++) {
        g_run.in[i] = make_input(ctx, c, i, &in[i]);
        NBT_OK(ctx, nb_tree_array(g_run.in[i], &leaves[i]));
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, c->n_in, leaves, &args));
    rarr want;
    memset(&want, 0, sizeof want);
    want.v = calloc(1 << 16, sizeof(double));
    c->ref(in, c->n_in, &want, c);
    for (int variant = 0; variant < 2; variant++) {
        g_run.c = c;
        g_run.as_constants = variant == 1;
        nb_ctx_clear_cache(ctx); /* every case and variant traces afresh */
        nb_tree *out = NULL, *empty = NULL;
        nb_fn *f = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "case", body_case, NULL, &f));
        NBT_OK(ctx, nb_tree_tuple(ctx, 0, NULL, &empty));
        nb_status st = nb_fn_call(f, variant ? empty : args, &out);
        nb_tree_destroy(empty);
        nb_fn_destroy(f);
        const char *vname = variant ? "as constants" : "as arguments";
        if (st != NB_OK) {
            print_error("FAIL %s (%s): the call failed: %s\n", c->label, vname, nb_ctx_errmsg(ctx));
            g_failures++;
            continue;
        }
        nb_array *got = nb_tree_get_array(out);
        nb_dtype odt = nb_array_dtype(got);
        bool shape_ok = nb_array_rank(got) == want.rank;
        for (int d = 0; shape_ok && d < want.rank; d++) {
            shape_ok = nb_array_dim(got, d) == want.shape[d];
        }
        if (!shape_ok) {
            char sig[128];
            nb_array_format_sig(got, sig, sizeof sig, NULL);
            print_error("FAIL %s (%s): shape %s, expected rank %d\n", c->label, vname, sig,
                        want.rank);
            g_failures++;
        } else {
            int bad = 0;
            for (int64_t i = 0; i < want.n && bad < 3; i++) {
                double g = 0;
                nb_array_get_flat(got, i, &g);
                double w = to_dtype(want.v[i], odt);
                double tol = allowed(c, in, &want, i, odt);
                if (!same_value(g, w, tol)) {
                    print_error("FAIL %s (%s): [%lld] got %.17g, want %.17g (tol %.3g)\n", c->label,
                                vname, (long long)i, g, w, tol);
                    bad++;
                }
            }
            g_failures += bad > 0;
        }
        nb_tree_destroy(out);
    }
    free(want.v);
    nb_tree_destroy(args);
    for (int i = 0; i < c->n_in; i++) {
        nb_tree_destroy(leaves[i]);
        nb_array_destroy(g_run.in[i]);
        g_run.in[i] = NULL;
        free(in[i].v);
    }
}

static void test_every_op_has_a_spec(void **state) {
    (void)state;
    int missing = 0;
    for (int op = 0; op < NBI_OP_COUNT; op++) {
        if (!g_has_spec[op] && g_covered_by[op] == NULL) {
            print_error("op '%s' has no conformance spec: add one to test_conformance.c\n",
                        nbi_op_name((nbi_op)op));
            missing++;
        }
    }
    NBT_EQ_I64(missing, 0);
}

static void test_forward_against_reference(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    int per_op[NBI_OP_COUNT] = {0};
    for (int i = 0; i < g_n_cases; i++) {
        run_case(ctx, &g_cases[i]);
        per_op[g_cases[i].op]++;
    }
    int ops = 0;
    for (int op = 0; op < NBI_OP_COUNT; op++) {
        ops += per_op[op] > 0;
    }
    print_message("%d cases over %d ops, each run as arguments and as constants; %d failed\n",
                  g_n_cases, ops, g_failures);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
    NBT_EQ_I64(g_failures, 0);
}

/* call / call_output: a non-inlined jitted function inside another, checked by value. */
static nb_status body_inner(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_ctx *ctx = nb_trace_ctx(tr);
    return nb_tree_tuple(
        ctx, 2, (nb_tree *[]){nb_leaf(nb_mul(x, x)), nb_leaf(nb_sum(x, NULL, 0, false))}, out);
}
static nb_fn *g_inner;
static nb_status body_outer(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *r = nb_apply(tr, g_inner, args);
    if (r == NULL) {
        return nb_trace_status(tr);
    }
    return nb_return(nb_add(nb_var_of(tr, nb_tree_child(r, 0)), nb_var_of(tr, nb_tree_child(r, 1))),
                     out);
}

static void test_call_op(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *inner = NULL, *outer = NULL;
    nb_jit_opts o = nb_jit_opts_default();
    o.inline_calls = false;
    NBT_OK(ctx, nb_fn_create(ctx, "inner", body_inner, NULL, &inner));
    NBT_OK(ctx, nb_jit(inner, &o, &g_inner));
    NBT_OK(ctx, nb_fn_create(ctx, "outer", body_outer, NULL, &outer));
    nb_array *x = NULL;
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F64, -2, 3, 1, &x));
    nb_tree *lx = NULL, *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_array(x, &lx));
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &lx, &args));
    char ir[2048];
    NBT_OK(ctx, nb_fn_format_ir(outer, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    NBT_TRUE(strstr(ir, "= call ") != NULL && strstr(ir, "= call_output ") != NULL);
    NBT_OK(ctx, nb_fn_call(outer, args, &out));
    for (int i = 0; i < 5; i++) {
        double v = 0;
        NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(out), i, &v));
        NBT_EQ_F64(v, (double)((i - 2) * (i - 2)) + 0.0 /* sum(-2..2) */);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_tree_destroy(lx);
    nb_array_destroy(x);
    nb_fn_destroy(outer);
    nb_fn_destroy(g_inner);
    nb_fn_destroy(inner);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    build_specs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_has_a_spec),
        cmocka_unit_test(test_forward_against_reference),
        cmocka_unit_test(test_call_op),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
