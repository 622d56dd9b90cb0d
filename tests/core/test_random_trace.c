/*
 * test_random_trace.c -- the samplers inside traces (nb_rng_*) against their eager twins
 * (nb_random_*, which test_random.c checks against JAX): the same bits for several keys and
 * shapes, one trace for many keys, errors that name the op, no gradient through them, and
 * how the compiler's passes treat them (CSE, DCE, constant folding, fusion).
 */
#include "nbtest.h"

#include <math.h>
#include <nabla/random.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cases: one sampler call each ----------------------------------------------- */

enum { SPLIT, FOLD_IN, BITS, UNIFORM, NORMAL, TRUNC, BERNOULLI, PERM, N_KINDS };
static const char *const KIND_NAME[N_KINDS] = {"split",     "fold_in",    "bits",
                                               "uniform",   "normal",     "truncated_normal",
                                               "bernoulli", "permutation"};

typedef struct rcase {
    int kind;
    nb_dtype dtype; /* float samplers; fold_in: the data's dtype */
    int rank;
    int64_t shape[3];
    double a, b; /* bounds, p */
    int64_t n;   /* split, permutation */
} rcase;

#define MAX_RCASES 128
static rcase g_rc[MAX_RCASES];
static int g_n_rc;

static void add_rcase(int kind, nb_dtype dt, int rank, const int64_t *shape, double a, double b,
                      int64_t n) {
    if (g_n_rc >= MAX_RCASES) {
        fail_msg("too many cases");
    }
    rcase *c = &g_rc[g_n_rc++];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->dtype = dt;
    c->rank = rank;
    for (int i = 0; i < rank; i++) {
        c->shape[i] = shape[i];
    }
    c->a = a;
    c->b = b;
    c->n = n;
}

static void build_rcases(void) {
    static const struct {
        int rank;
        int64_t shape[3];
    } S[] = {{0, {0}}, {1, {0}}, {1, {7}}, {2, {3, 5}}, {3, {2, 0, 4}}, {2, {300, 250}}};
    const int ns = (int)(sizeof S / sizeof S[0]);
    add_rcase(SPLIT, NB_DTYPE_I32, 0, NULL, 0, 0, 1);
    add_rcase(SPLIT, NB_DTYPE_I32, 0, NULL, 0, 0, 6);
    add_rcase(FOLD_IN, NB_DTYPE_I32, 0, NULL, 0, 0, 0);
    add_rcase(FOLD_IN, NB_DTYPE_I64, 0, NULL, 0, 0, 0);
    for (int s = 0; s < ns; s++) {
        add_rcase(BITS, NB_DTYPE_I32, S[s].rank, S[s].shape, 0, 0, 0);
        add_rcase(BERNOULLI, NB_DTYPE_BOOL, S[s].rank, S[s].shape, s % 3 == 2 ? 1.0 : 0.3, 0, 0);
        for (int d = 0; d < 2; d++) {
            nb_dtype dt = d ? NB_DTYPE_F64 : NB_DTYPE_F32;
            add_rcase(UNIFORM, dt, S[s].rank, S[s].shape, d ? -2.0 : 0.0, d ? 3.0 : 1.0, 0);
            add_rcase(NORMAL, dt, S[s].rank, S[s].shape, 0, 0, 0);
            add_rcase(TRUNC, dt, S[s].rank, S[s].shape, d ? -2.0 : 0.5, d ? 1.0 : INFINITY, 0);
            /* far in a tail: the tail-stable sampler */
            add_rcase(TRUNC, dt, S[s].rank, S[s].shape, d ? 8.0 : 5.0, d ? 9.0 : 6.0, 0);
            add_rcase(TRUNC, dt, S[s].rank, S[s].shape, -INFINITY, -30.0, 0);
        }
    }
    static const int64_t pn[] = {0, 1, 10, 37, 5000};
    for (int i = 0; i < 5; i++) {
        add_rcase(PERM, NB_DTYPE_I64, 0, NULL, 0, 0, pn[i]);
    }
}

/* The traced call of case c (args = (key, data, case index)). */
static nb_var *traced(const rcase *c, nb_var *key, nb_var *data) {
    switch (c->kind) {
    case SPLIT:
        return nb_rng_split(key, c->n);
    case FOLD_IN:
        return nb_rng_fold_in(key, data);
    case BITS:
        return nb_rng_bits(key, c->rank, c->shape);
    case UNIFORM:
        return nb_rng_uniform(key, c->dtype, c->rank, c->shape, c->a, c->b);
    case NORMAL:
        return nb_rng_normal(key, c->dtype, c->rank, c->shape);
    case TRUNC:
        return nb_rng_truncated_normal(key, c->dtype, c->a, c->b, c->rank, c->shape);
    case BERNOULLI:
        return nb_rng_bernoulli(key, c->a, c->rank, c->shape);
    default:
        return nb_rng_permutation(key, c->n);
    }
}

/* The eager twin (data: fold_in's data value). */
static nb_array *eager(nb_ctx *ctx, const rcase *c, const nb_array *key, int64_t data) {
    nb_array *a = NULL;
    switch (c->kind) {
    case SPLIT:
        NBT_OK(ctx, nb_random_split(key, c->n, &a));
        break;
    case FOLD_IN:
        NBT_OK(ctx, nb_random_fold_in(key, (uint32_t)(uint64_t)data, &a));
        break;
    case BITS:
        NBT_OK(ctx, nb_random_bits(key, c->rank, c->shape, &a));
        break;
    case UNIFORM:
        NBT_OK(ctx, nb_random_uniform(key, c->dtype, c->rank, c->shape, c->a, c->b, &a));
        break;
    case NORMAL:
        NBT_OK(ctx, nb_random_normal(key, c->dtype, c->rank, c->shape, &a));
        break;
    case TRUNC:
        NBT_OK(ctx, nb_random_truncated_normal(key, c->dtype, c->a, c->b, c->rank, c->shape, &a));
        break;
    case BERNOULLI:
        NBT_OK(ctx, nb_random_bernoulli(key, c->a, c->rank, c->shape, &a));
        break;
    default:
        NBT_OK(ctx, nb_random_permutation(key, c->n, &a));
        break;
    }
    return a;
}

static nb_status body_case(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    int64_t i = 0;
    if (nb_tree_get_int(nb_tree_child(args, 2), &i) != NB_OK) {
        return nb_trace_fail(tr, NB_ERR_INVALID, "args[2] is not an int");
    }
    return nb_return(traced(&g_rc[i], nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]")), out);
}

/* ---- helpers ------------------------------------------------------------------------ */

static nb_tree *arr_leaf(nb_ctx *ctx, nb_array *a) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

static nb_tree *int_leaf(nb_ctx *ctx, int64_t v) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, v, &t));
    return t;
}

static nb_array *key_of(nb_ctx *ctx, uint64_t seed) {
    nb_array *k = NULL;
    NBT_OK(ctx, nb_random_key(ctx, seed, &k));
    return k;
}

static nb_array *scalar_int(nb_ctx *ctx, nb_dtype dt, int64_t v) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, 0, NULL, &a));
    if (dt == NB_DTYPE_I64) {
        *(int64_t *)nb_array_data(a) = v;
    } else {
        *(int32_t *)nb_array_data(a) = (int32_t)v;
    }
    return a;
}

static bool same_bits(const nb_array *a, const nb_array *b) {
    if (nb_array_dtype(a) != nb_array_dtype(b) || nb_array_rank(a) != nb_array_rank(b)) {
        return false;
    }
    for (int d = 0; d < nb_array_rank(a); d++) {
        if (nb_array_dim(a, d) != nb_array_dim(b, d)) {
            return false;
        }
    }
    return nb_array_nbytes(a) == nb_array_nbytes(b) &&
           (nb_array_nbytes(a) == 0 ||
            memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a)) == 0);
}

static nb_fn_stats stats_of(const nb_fn *f) {
    nb_fn_stats s;
    NBT_OK(NULL, nb_fn_stats_get(f, &s));
    return s;
}

/* ---- traced == eager, one trace for many keys --------------------------------------- */

static const uint64_t SEEDS[] = {0, 1, 42, 4294967303ull, 0xDEADBEEFCAFEull};
#define N_SEEDS 5
static const int64_t DATA[N_SEEDS] = {7, -1, ((int64_t)1 << 33) + 5, 0x7fffffff, 123456};

static void run_cases(int n_threads) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = n_threads;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    for (int i = 0; i < g_n_rc; i++) {
        const rcase *c = &g_rc[i];
        nb_fn *f = NULL, *jf = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "sample", body_case, NULL, &f));
        NBT_OK(ctx, nb_jit(f, NULL, &jf));
        nb_fn_stats before = stats_of(jf); /* shared by the cases: only the statics differ */
        nb_array *prev = NULL;
        for (int k = 0; k < N_SEEDS; k++) {
            nb_array *key = key_of(ctx, SEEDS[k]);
            nb_dtype ddt = c->kind == FOLD_IN ? c->dtype : NB_DTYPE_I32;
            nb_tree *items[3] = {NULL, arr_leaf(ctx, scalar_int(ctx, ddt, DATA[k])),
                                 int_leaf(ctx, i)};
            NBT_OK(ctx, nb_tree_array(key, &items[0]));
            nb_tree *args = nbt_tuple_take(ctx, 3, items), *out = NULL;
            NBT_OK(ctx, nb_fn_call(jf, args, &out));
            nb_array *got = nb_tree_get_array(out);
            nb_array *want =
                eager(ctx, c, key, c->dtype == NB_DTYPE_I64 ? DATA[k] : (int32_t)DATA[k]);
            if (!same_bits(got, want)) {
                char sg[64], sw[64];
                nb_array_format_sig(got, sg, sizeof sg, NULL);
                nb_array_format_sig(want, sw, sizeof sw, NULL);
                fail_msg("case %d (%s %s, %s): seed %llu: traced %s differs from eager %s", i,
                         KIND_NAME[c->kind], nb_dtype_name(c->dtype), sw,
                         (unsigned long long)SEEDS[k], sg, sw);
            }
            /* another key, other numbers (where there are enough of them to tell) */
            if (prev != NULL && nb_array_size(got) >= 4 && c->kind != BERNOULLI) {
                NBT_TRUE(!same_bits(prev, got));
            }
            nb_array_destroy(prev);
            prev = nb_array_retain(got);
            nb_array_destroy(want);
            nb_array_destroy(key);
            nb_tree_destroy(out);
            nb_tree_destroy(args);
        }
        nb_array_destroy(prev);
        /* one trace: the key is an input, the numbers are made when the code runs */
        NBT_EQ_I64(stats_of(jf).n_traces - before.n_traces, 1);
        NBT_EQ_I64(stats_of(jf).n_hits - before.n_hits, N_SEEDS - 1);
        nb_fn_destroy(jf);
        nb_fn_destroy(f);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_traced_equals_eager(void **state) {
    (void)state;
    run_cases(0);
}

/* Element i depends only on the key and i: the kernels' chunks on threads give the same
 * bits for one and two threads (the [300,250] cases span several chunks). */
static void test_traced_equals_eager_one_thread(void **state) {
    (void)state;
    run_cases(1);
}

/* ---- truncated normals: 1 and 3 threads ---------------------------------------------- */

static nb_status body_tn(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    double ab[2] = {0, 0};
    int64_t dt = 0;
    if (nb_tree_get_float(nb_tree_child(args, 1), &ab[0]) != NB_OK ||
        nb_tree_get_float(nb_tree_child(args, 2), &ab[1]) != NB_OK ||
        nb_tree_get_int(nb_tree_child(args, 3), &dt) != NB_OK) {
        return nb_trace_fail(tr, NB_ERR_INVALID, "args[1..3] are lower, upper and the dtype");
    }
    return nb_return(nb_rng_truncated_normal(nb_get(tr, args, "[0]"), (nb_dtype)dt, ab[0], ab[1], 2,
                                             (int64_t[]){300, 250}),
                     out);
}

/* A large array (several chunks of the kernel's split) of truncated normals, in the body and
 * far in the tails: the same bits with 1 and 3 threads, and the same as the eager call; every
 * value strictly inside the bounds. */
static void test_truncated_normal_threads(void **state) {
    (void)state;
    const double bounds[][2] = {{-2, 1},        {5, 6},           {7, 8},        {8, 9},  {-10, -9},
                                {30, INFINITY}, {-INFINITY, -30}, {3, 3 + 1e-6}, {20, 21}};
    nb_ctx *ctxs[2] = {NULL, NULL};
    for (int t = 0; t < 2; t++) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = t ? 3 : 1;
        NBT_OK(NULL, nb_ctx_create(&o, &ctxs[t]));
    }
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d ? NB_DTYPE_F64 : NB_DTYPE_F32;
        for (size_t c = 0; c < sizeof bounds / sizeof bounds[0]; c++) {
            nb_array *res[2] = {NULL, NULL};
            for (int t = 0; t < 2; t++) {
                nb_ctx *ctx = ctxs[t];
                nb_tree *items[4] = {arr_leaf(ctx, key_of(ctx, 5 + c)), NULL, NULL,
                                     int_leaf(ctx, dt)};
                NBT_OK(ctx, nb_tree_float(ctx, bounds[c][0], &items[1]));
                NBT_OK(ctx, nb_tree_float(ctx, bounds[c][1], &items[2]));
                nb_tree *args = nbt_tuple_take(ctx, 4, items), *out = NULL;
                NBT_OK(ctx, nb_eval(ctx, body_tn, NULL, args, &out));
                res[t] = nb_array_retain(nb_tree_get_array(out));
                nb_array *want = NULL;
                NBT_OK(ctx, nb_random_truncated_normal(nb_tree_get_array(nb_tree_child(args, 0)),
                                                       dt, bounds[c][0], bounds[c][1], 2,
                                                       (int64_t[]){300, 250}, &want));
                if (!same_bits(res[t], want)) {
                    fail_msg("%s (%g, %g), %d thread(s): traced differs from eager",
                             nb_dtype_name(dt), bounds[c][0], bounds[c][1], t ? 3 : 1);
                }
                nb_array_destroy(want);
                nb_tree_destroy(out);
                nb_tree_destroy(args);
            }
            if (!same_bits(res[0], res[1])) {
                fail_msg("%s (%g, %g): 1 and 3 threads differ", nb_dtype_name(dt), bounds[c][0],
                         bounds[c][1]);
            }
            double lo = d ? bounds[c][0] : (float)bounds[c][0];
            double hi = d ? bounds[c][1] : (float)bounds[c][1];
            for (int64_t i = 0; i < nb_array_size(res[0]); i++) {
                double v = d ? ((const double *)nb_array_data(res[0]))[i]
                             : ((const float *)nb_array_data(res[0]))[i];
                if (!(v > lo && v < hi)) {
                    fail_msg("%s (%g, %g): element %lld is %.17g", nb_dtype_name(dt), bounds[c][0],
                             bounds[c][1], (long long)i, v);
                }
            }
            nb_array_destroy(res[0]);
            nb_array_destroy(res[1]);
        }
    }
    for (int t = 0; t < 2; t++) {
        nbt_assert_no_live(ctxs[t]);
        nb_ctx_destroy(ctxs[t]);
    }
}

/* ---- a step counter folded into the key --------------------------------------------- */

static nb_status body_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *k = nb_rng_fold_in(nb_get(tr, args, "[0]"), nb_get(tr, args, "[1]"));
    nb_var *keys = nb_rng_split(k, 3);
    nb_var *k2 = nb_take(keys, nb_scalar_typed(tr, NB_DTYPE_I32, 2), 0); /* row 2 */
    return nb_return(nb_rng_normal(k2, NB_DTYPE_F32, 1, (int64_t[]){6}), out);
}

static void test_fold_in_step_and_split_rows(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "step", body_step, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &jf));
    nb_array *key = key_of(ctx, 2024);
    for (int step = 0; step < 5; step++) {
        nb_tree *items[2] = {NULL, arr_leaf(ctx, scalar_int(ctx, NB_DTYPE_I32, step))};
        NBT_OK(ctx, nb_tree_array(key, &items[0]));
        nb_tree *args = nbt_tuple_take(ctx, 2, items), *out = NULL;
        NBT_OK(ctx, nb_fn_call(jf, args, &out));
        nb_array *k = NULL, *keys = NULL, *row = NULL, *want = NULL;
        NBT_OK(ctx, nb_random_fold_in(key, (uint32_t)step, &k));
        NBT_OK(ctx, nb_random_split(k, 3, &keys));
        NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, &row));
        memcpy(nb_array_data(row), (const int32_t *)nb_array_data(keys) + 4, 8);
        NBT_OK(ctx, nb_random_normal(row, NB_DTYPE_F32, 1, (int64_t[]){6}, &want));
        NBT_TRUE(same_bits(nb_tree_get_array(out), want));
        nb_array_destroy(want);
        nb_array_destroy(row);
        nb_array_destroy(keys);
        nb_array_destroy(k);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    NBT_EQ_I64(stats_of(jf).n_traces, 1);
    nb_array_destroy(key);
    nb_fn_destroy(jf);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- errors: sticky, naming the op, the shapes and the fix -------------------------- */

static nb_status body_err(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    int64_t which = 0;
    nb_tree_get_int(nb_tree_child(args, 1), &which);
    nb_var *key = nb_get(tr, args, "[0]");
    nb_var *f2 = nb_full(tr, NB_DTYPE_F32, 1, (int64_t[]){2}, 0);
    nb_var *k3 = nb_full(tr, NB_DTYPE_I32, 1, (int64_t[]){3}, 0);
    const int64_t s2[2] = {2, -1};
    nb_var *r = NULL;
    switch (which) {
    case 0:
        r = nb_rng_split(f2, 2);
        break;
    case 1:
        r = nb_rng_split(key, 0);
        break;
    case 2:
        r = nb_rng_fold_in(key, nb_scalar(tr, 3));
        break;
    case 3:
        r = nb_rng_bits(k3, 1, (int64_t[]){4});
        break;
    case 4:
        r = nb_rng_bits(key, 2, s2);
        break;
    case 5:
        r = nb_rng_uniform(key, NB_DTYPE_I32, 1, (int64_t[]){4}, 0, 1);
        break;
    case 6:
        r = nb_rng_uniform(key, NB_DTYPE_F32, 1, (int64_t[]){4}, 1, 1);
        break;
    case 7:
        r = nb_rng_normal(key, NB_DTYPE_BOOL, 2, (int64_t[]){2, 2});
        break;
    case 8:
        r = nb_rng_truncated_normal(key, NB_DTYPE_F64, 2, 1, 1, (int64_t[]){3});
        break;
    case 9:
        r = nb_rng_bernoulli(key, 1.5, 1, (int64_t[]){3});
        break;
    case 10:
        r = nb_rng_permutation(key, -1);
        break;
    case 11: /* sticky: the first error is the one reported; later ops pass poison */
        r = nb_rng_uniform(nb_rng_split(key, 0), NB_DTYPE_F32, 0, NULL, 0, 1);
        r = nb_add(r, nb_rng_bernoulli(key, -1, 0, NULL));
        break;
    case 12:
        r = nb_rng_bits(key, 2, NULL);
        break;
    case 13:
        r = nb_rng_normal(nb_get(tr, args, "[2]"), NB_DTYPE_F32, 0, NULL);
        break;
    case 14:
        r = nb_rng_permutation(nb_rng_split(key, 2), 5);
        break;
    default:
        r = nb_rng_fold_in(key, nb_full(tr, NB_DTYPE_I64, 1, (int64_t[]){1}, 0));
        break;
    }
    return nb_return(r, out);
}

static void test_errors_name_the_op(void **state) {
    (void)state;
    static const struct {
        nb_status st;
        const char *has[2];
    } E[] = {
        {NB_ERR_SHAPE, {"nb_rng_split: key is f32[2]; a key is an i32[2] var", "nb_random_key"}},
        {NB_ERR_INVALID, {"nb_rng_split: n is 0 for key i32[2]", "1 <= n"}},
        {NB_ERR_DTYPE, {"nb_rng_fold_in: data is f32[]", "rank-0 i32 or i64"}},
        {NB_ERR_SHAPE, {"nb_rng_bits: key is i32[3]", "nb_rng_split"}},
        {NB_ERR_SHAPE, {"nb_rng_bits: shape [2,-1] has dim 1 < 0", "dims are >= 0"}},
        {NB_ERR_INVALID, {"nb_rng_uniform: dtype i32; samples are f32 or f64", "shape [4]"}},
        {NB_ERR_INVALID, {"nb_rng_uniform: bounds [1, 1) must be finite with lo < hi", "[4]"}},
        {NB_ERR_INVALID, {"nb_rng_normal: dtype bool; samples are f32 or f64", "[2,2]"}},
        {NB_ERR_INVALID,
         {"nb_rng_truncated_normal: bounds [2, 1]: lower must be below upper", "[3]"}},
        {NB_ERR_INVALID, {"nb_rng_bernoulli: p is 1.5; a probability is in [0, 1]", "[3]"}},
        {NB_ERR_INVALID, {"nb_rng_permutation: n is -1", "0 <= n"}},
        {NB_ERR_INVALID, {"nb_rng_split: n is 0", "(in 'errs')"}},
        {NB_ERR_SHAPE, {"nb_rng_bits: rank 2 with a NULL shape", "rank dims"}},
        {NB_ERR_SHAPE, {"nb_rng_normal: key is f64[2]", "operands: args[2]"}},
        {NB_ERR_SHAPE, {"nb_rng_permutation: key is i32[2,2]", "nb_take(keys, i, 0)"}},
        {NB_ERR_DTYPE, {"nb_rng_fold_in: data is i64[1]", "nb_scalar_typed"}},
    };
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "errs", body_err, NULL, &f));
    for (int i = 0; i < (int)(sizeof E / sizeof E[0]); i++) {
        nb_array *bad = NULL;
        NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, &bad));
        nb_tree *items[3] = {arr_leaf(ctx, key_of(ctx, 1)), int_leaf(ctx, i), arr_leaf(ctx, bad)};
        nb_tree *args = nbt_tuple_take(ctx, 3, items), *out = (nb_tree *)&out;
        nb_status st = nb_fn_call(f, args, &out);
        if (st != E[i].st) {
            fail_msg("case %d: %s, wanted %s: %s", i, nb_status_name(st), nb_status_name(E[i].st),
                     nb_ctx_errmsg(ctx));
        }
        NBT_TRUE(out == NULL);
        for (int h = 0; h < 2; h++) {
            if (strstr(nb_ctx_errmsg(ctx), E[i].has[h]) == NULL) {
                fail_msg("case %d: the message lacks \"%s\": %s", i, E[i].has[h],
                         nb_ctx_errmsg(ctx));
            }
        }
        if (i == 11) {
            NBT_TRUE(strstr(nb_ctx_errmsg(ctx), "bernoulli") == NULL);
        }
        nb_tree_destroy(args);
    }
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- no gradient: a sample is a constant to grad ------------------------------------ */

/* loss(p, key) = sum(p.x * u) + sum(normal) with u = uniform(key): d loss / d x = u. */
static nb_status body_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *key = nb_get(tr, args, "[1]");
    nb_var *x = nb_get(tr, args, "[0].x");
    nb_var *u = nb_rng_uniform(key, NB_DTYPE_F64, 1, (int64_t[]){5}, -1, 1);
    nb_var *z = nb_rng_normal(nb_get(tr, args, "[0].k"), NB_DTYPE_F64, 1, (int64_t[]){5});
    nb_var *loss = nb_add(nb_sum(nb_mul(x, u), NULL, 0, false), nb_sum(z, NULL, 0, false));
    return nb_return(loss, out);
}

static void test_grad_treats_samples_as_constants(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL, *jg = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "loss", body_loss, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    NBT_OK(ctx, nb_jit(g, NULL, &jg));
    nb_array *x = NULL;
    NBT_OK(ctx, nb_array_arange(ctx, NB_DTYPE_F64, 1, 6, 1, &x));
    for (int k = 0; k < 3; k++) {
        nb_array *key = key_of(ctx, SEEDS[k]);
        nb_tree *lx = NULL, *lk = NULL, *p = NULL;
        NBT_OK(ctx, nb_tree_array(x, &lx));
        lk = arr_leaf(ctx, key_of(ctx, 99));
        NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "k"}, (nb_tree *[]){lx, lk}, &p));
        nb_tree_destroy(lx);
        nb_tree_destroy(lk);
        nb_tree *items[2] = {p, NULL};
        NBT_OK(ctx, nb_tree_array(key, &items[1]));
        nb_tree *args = nbt_tuple_take(ctx, 2, items), *out = NULL;
        NBT_OK(ctx, nb_fn_call(jg, args, &out));
        /* d/dx = u exactly (the eager uniform); the integer key gets a null gradient */
        nb_array *u = NULL;
        NBT_OK(ctx, nb_random_uniform(key, NB_DTYPE_F64, 1, (int64_t[]){5}, -1, 1, &u));
        NBT_TRUE(same_bits(nb_tree_get_array(nb_tree_get(out, "x")), u));
        NBT_EQ_I64(nb_tree_kind_of(nb_tree_get(out, "k")), NB_TREE_KIND_NULL);
        nb_array_destroy(u);
        nb_array_destroy(key);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    NBT_EQ_I64(stats_of(jg).n_traces, 1);
    nb_array_destroy(x);
    nb_fn_destroy(jg);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- the compiler: CSE, DCE, folding, fusion ---------------------------------------- */

static int count_of(const char *text, const char *word) {
    int n = 0;
    for (const char *p = strstr(text, word); p != NULL; p = strstr(p + 1, word)) {
        n++;
    }
    return n;
}

/* (a - a2, a - b, 2a + 1) with a, a2 from the same key and b from another; plus an unused
 * sample. */
static nb_status body_passes(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *key = nb_get(tr, args, "[0]");
    nb_var *k1 = nb_rng_fold_in(key, nb_scalar_typed(tr, NB_DTYPE_I32, 1));
    nb_var *k2 = nb_rng_fold_in(key, nb_scalar_typed(tr, NB_DTYPE_I32, 2));
    const int64_t sh[1] = {64};
    nb_var *a = nb_rng_uniform(k1, NB_DTYPE_F32, 1, sh, -2, 3);
    nb_var *a2 = nb_rng_uniform(k1, NB_DTYPE_F32, 1, sh, -2, 3);
    nb_var *b = nb_rng_uniform(k2, NB_DTYPE_F32, 1, sh, -2, 3);
    (void)nb_rng_normal(key, NB_DTYPE_F64, 1, (int64_t[]){8}); /* unused */
    nb_var *c = nb_add(nb_mul(a, nb_scalar(tr, 2)), nb_scalar(tr, 1));
    nb_ctx *ctx = nb_trace_ctx(tr);
    return nb_tree_tuple(
        ctx, 3, (nb_tree *[]){nb_leaf(nb_sub(a, a2)), nb_leaf(nb_sub(a, b)), nb_leaf(c)}, out);
}

static nb_array *g_const_key;
static nb_status body_const_key(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    (void)args;
    return nb_return(
        nb_rng_uniform(nb_constant(tr, g_const_key), NB_DTYPE_F64, 1, (int64_t[]){10}, -2, 3), out);
}

static void test_passes(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "passes", body_passes, NULL, &f));
    nb_array *key = key_of(ctx, 5);
    nb_tree *items[1] = {arr_leaf(ctx, nb_array_retain(key))};
    nb_tree *args = nbt_tuple_take(ctx, 1, items), *out = NULL;
    char ir[8192];
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_TRACED, ir, sizeof ir, NULL));
    NBT_TRUE(count_of(ir, "= rng_uniform %") == 3);
    NBT_TRUE(strstr(ir, "{lo=-2, hi=3}") != NULL);
    NBT_TRUE(count_of(ir, "= rng_fold_in %0, %") == 2);
    NBT_TRUE(count_of(ir, "= rng_normal %0") == 1);
    NBT_OK(ctx, nb_fn_format_ir(f, args, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    /* CSE merges the two samplers of the same key (the same numbers), never those of two
     * keys; DCE drops the unused one */
    NBT_TRUE(count_of(ir, "= rng_uniform %") == 2);
    NBT_TRUE(count_of(ir, "rng_normal") == 0);
    NBT_OK(ctx, nb_fn_call(f, args, &out));
    nb_array *same = nb_tree_get_array(nb_tree_child(out, 0));
    nb_array *diff = nb_tree_get_array(nb_tree_child(out, 1));
    nb_array *lin = nb_tree_get_array(nb_tree_child(out, 2));
    nb_array *k1 = NULL, *u1 = NULL;
    NBT_OK(ctx, nb_random_fold_in(key, 1, &k1));
    NBT_OK(ctx, nb_random_uniform(k1, NB_DTYPE_F32, 1, (int64_t[]){64}, -2, 3, &u1));
    int n_diff = 0;
    for (int i = 0; i < 64; i++) {
        NBT_EQ_F64(((const float *)nb_array_data(same))[i], 0.0f);
        n_diff += ((const float *)nb_array_data(diff))[i] != 0.0f;
        float u = ((const float *)nb_array_data(u1))[i];
        NBT_EQ_F64(((const float *)nb_array_data(lin))[i], u * 2.0f + 1.0f);
    }
    NBT_TRUE(n_diff > 60);
    nb_array_destroy(u1);
    nb_array_destroy(k1);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_fn_destroy(f);

    /* a constant key: the sampler is folded at compile time, to the same numbers */
    g_const_key = key;
    nb_tree *empty = nbt_tuple_take(ctx, 0, NULL);
    NBT_OK(ctx, nb_fn_create(ctx, "const_key", body_const_key, NULL, &f));
    NBT_OK(ctx, nb_fn_format_ir(f, empty, NB_IR_OPTIMIZED, ir, sizeof ir, NULL));
    NBT_TRUE(strstr(ir, "rng_") == NULL);
    NBT_OK(ctx, nb_fn_call(f, empty, &out));
    nb_array *want = NULL;
    NBT_OK(ctx, nb_random_uniform(key, NB_DTYPE_F64, 1, (int64_t[]){10}, -2, 3, &want));
    NBT_TRUE(same_bits(nb_tree_get_array(out), want));
    nb_array_destroy(want);
    nb_tree_destroy(out);
    nb_tree_destroy(empty);
    nb_fn_destroy(f);
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures ------------------------------------------------------------ */

/* Trace, compile and run a function with every sampler: each failed allocation returns
 * NB_ERR_OOM and leaks nothing; the context stays usable. */
static nb_status body_all(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *key = nb_get(tr, args, "[0]");
    nb_var *k = nb_rng_fold_in(key, nb_scalar_typed(tr, NB_DTYPE_I64, 3));
    nb_var *ks = nb_rng_split(k, 2);
    const int64_t sh[1] = {6};
    nb_var *v = nb_add(nb_rng_uniform(k, NB_DTYPE_F32, 1, sh, 0, 1),
                       nb_rng_normal(key, NB_DTYPE_F32, 1, sh));
    v = nb_add(v, nb_rng_truncated_normal(key, NB_DTYPE_F32, -1, 1, 1, sh));
    v = nb_add(v, nb_cast(nb_rng_bernoulli(key, 0.5, 1, sh), NB_DTYPE_F32));
    v = nb_add(v, nb_cast(nb_rng_bits(key, 1, sh), NB_DTYPE_F32));
    v = nb_add(v, nb_cast(nb_rng_permutation(key, 6), NB_DTYPE_F32));
    v = nb_add(v, nb_cast(nb_sum(ks, NULL, 0, false), NB_DTYPE_F32));
    return nb_return(v, out);
}

static nb_status scenario_trace(nb_ctx *ctx) {
    nb_array *key = NULL;
    nb_tree *leaf = NULL, *args = NULL, *out = NULL;
    nb_fn *f = NULL;
    nb_status st = nb_random_key(ctx, 9, &key);
    if (st == NB_OK) {
        st = nb_tree_array(key, &leaf);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 1, &leaf, &args);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "all", body_all, NULL, &f);
    }
    if (st == NB_OK) {
        st = nb_fn_call(f, args, &out);
    }
    nb_tree_destroy(out);
    nb_fn_destroy(f);
    nb_tree_destroy(args);
    nb_tree_destroy(leaf);
    nb_array_destroy(key);
    nb_ctx_clear_cache(ctx);
    return st;
}

static void test_allocation_failures(void **state) {
    (void)state;
    int points = nbt_oom_sweep("scenario_trace", scenario_trace, true, true);
    NBT_TRUE(points >= 10);
}

int main(void) {
    build_rcases();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traced_equals_eager),
        cmocka_unit_test(test_traced_equals_eager_one_thread),
        cmocka_unit_test(test_truncated_normal_threads),
        cmocka_unit_test(test_fold_in_step_and_split_rows),
        cmocka_unit_test(test_errors_name_the_op),
        cmocka_unit_test(test_grad_treats_samples_as_constants),
        cmocka_unit_test(test_passes),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
