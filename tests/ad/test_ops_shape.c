/*
 * test_ops_shape.c -- the shape family (src/ad/op_shape.c): reshape, broadcast_to,
 * transpose, slice, concatenate, pad, take, take_along_axis, one_hot, dynamic_slice,
 * dynamic_update_slice, and the composites expand_dims, squeeze and stack.
 *
 * Builders are checked for the dtype and shape they infer and for every error path (status
 * and message); kernels run directly on plain buffers, node by node, against
 * straightforward reference loops, for every dtype. Data-movement results are compared byte
 * for byte with the input element the reference says they come from.
 *
 * The VJP and JVP rules are checked twice: called directly on nodes (the dtype and shape of
 * what they build; the adjoints of slice, take, take_along_axis and the dynamic slices,
 * exactly, against reference scatters), and through the public API (nb_vjp, nb_jvp,
 * nb_grad on small f64 functions) against central finite differences.
 */
#include "nbtest.h"

#include "ad/ir.h"

#include <math.h>
#include <stdlib.h>

#define F32 NB_DTYPE_F32
#define F64 NB_DTYPE_F64
#define I32 NB_DTYPE_I32
#define I64 NB_DTYPE_I64
#define BOOL NB_DTYPE_BOOL

/* A shape literal. */
#define S(...) ((const int64_t[]){__VA_ARGS__})

static const nb_dtype k_dtypes[] = {F32, F64, I32, I64, BOOL};
#define N_DTYPES 5

/* ---- helpers ------------------------------------------------------------------------ */

static void begin(nb_trace *tr, nb_ctx *ctx) {
    NBT_OK(ctx, nbi_trace_init(tr, ctx, "test"));
}

static nb_var *param(nb_trace *tr, int index, nb_dtype dt, int rank, const int64_t *shape) {
    nb_var *v = nbi_emit_param(tr, index, dt, rank, shape, NULL);
    assert_non_null(v);
    assert_false(nb_var_is_poison(v));
    return v;
}

static int64_t prod(int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= shape[i];
    }
    return n;
}

static void expect_type(const nb_var *v, nb_dtype dt, int rank, const int64_t *shape) {
    assert_non_null(v);
    if (nb_var_is_poison(v)) {
        fail_msg("unexpected poison: %s", nb_ctx_errmsg(v->tr->ctx));
    }
    NBT_EQ_I64(v->dtype, dt);
    NBT_EQ_I64(v->rank, rank);
    for (int i = 0; i < rank; i++) {
        NBT_EQ_I64(v->shape[i], shape[i]);
    }
    NBT_EQ_I64(v->size, prod(rank, shape));
}

/* v is poison, the trace failed with st, and the message holds every substring (a NULL
 * terminated list) and the traced function's name. */
static void expect_fail(nb_trace *tr, const nb_var *v, nb_status st, ...) {
    if (!nb_var_is_poison(v)) {
        fail_msg("expected an error, got a var (trace status %s)",
                 nb_status_name(nb_trace_status(tr)));
    }
    NBT_STATUS(tr->ctx, st, nb_trace_status(tr));
    va_list ap;
    va_start(ap, st);
    for (const char *sub = va_arg(ap, const char *); sub != NULL; sub = va_arg(ap, const char *)) {
        NBT_ERRMSG_HAS(tr->ctx, sub);
    }
    va_end(ap);
    NBT_ERRMSG_HAS(tr->ctx, "(in 'test')");
}
#define EXPECT_FAIL(tr, v, st, ...) expect_fail((tr), (v), (st), __VA_ARGS__, (const char *)NULL)

/* One error scenario on a fresh trace T whose param 0 is X (dtype dt, rank, shape): expr
 * must fail with st and a message holding the substrings. */
#define ERR_CASE(ctx, dt, rank, shape, expr, st, ...)                                              \
    do {                                                                                           \
        nb_trace T_;                                                                               \
        nb_trace *T = &T_;                                                                         \
        begin(T, (ctx));                                                                           \
        nb_var *X = param(T, 0, (dt), (rank), (shape));                                            \
        nb_var *V_ = (expr);                                                                       \
        (void)X;                                                                                   \
        EXPECT_FAIL(T, V_, (st), __VA_ARGS__);                                                     \
        nbi_trace_release(T);                                                                      \
    } while (0)

/* n elements of dt with distinct bytes per element (bool: a 0/1 pattern), from seed. */
static void *pattern(nb_dtype dt, int64_t n, int seed) {
    size_t es = nb_dtype_size(dt);
    unsigned char *p = malloc((size_t)(n > 0 ? n : 1) * es);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = i + 1000 * (int64_t)seed + 1;
        switch (dt) {
        case F32: {
            float f = (float)v + 0.25f;
            memcpy(p + (size_t)i * es, &f, es);
            break;
        }
        case F64: {
            double d = (double)v + 0.125;
            memcpy(p + (size_t)i * es, &d, es);
            break;
        }
        case I32: {
            int32_t q = (int32_t)(v * 3 - 7);
            memcpy(p + (size_t)i * es, &q, es);
            break;
        }
        case I64: {
            int64_t q = v * 5 + ((int64_t)(seed + 1) << 40);
            memcpy(p + (size_t)i * es, &q, es);
            break;
        }
        case BOOL:
            p[i] = (uint8_t)((i * 5 + seed) % 3 == 0);
            break;
        }
    }
    return p;
}

/* An index buffer of dt (i32 or i64) holding vals. */
static void *index_buf(nb_dtype dt, int64_t n, const int64_t *vals) {
    size_t es = nb_dtype_size(dt);
    unsigned char *p = malloc((size_t)(n > 0 ? n : 1) * es);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) {
        if (dt == I32) {
            int32_t q = (int32_t)vals[i];
            memcpy(p + (size_t)i * es, &q, es);
        } else {
            memcpy(p + (size_t)i * es, &vals[i], es);
        }
    }
    return p;
}

/* Run one node's kernel on input buffers; returns a malloc'd output (pre-filled with 0xAB
 * bytes, so elements the kernel forgets show up). */
static void *run1(const nb_var *v, const void *const *ins) {
    const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
    assert_non_null(info);
    assert_non_null(info->kernel);
    size_t bytes = (size_t)v->size * nb_dtype_size(v->dtype);
    void *out = malloc(bytes ? bytes : 1);
    assert_non_null(out);
    memset(out, 0xAB, bytes);
    void *scratch = NULL;
    if (info->scratch != NULL) {
        size_t sb = (info->scratch(v) + 63) / 64 * 64;
        scratch = aligned_alloc(64, sb ? sb : 64);
        assert_non_null(scratch);
    }
    nbi_kargs k = {.node = v, .out = out, .in = ins, .scratch = scratch};
    info->kernel(&k);
    free(scratch);
    return out;
}

/* Run the trace's graph node by node in order (PARAM i reads params[i]; FULL and CONST run
 * their kernels) and return a malloc'd copy of v's value. */
static void *run_graph(const nb_trace *tr, const void *const *params, const nb_var *v) {
    const nbi_graph *g = &tr->g;
    const void **vals = calloc((size_t)g->n_nodes + 1, sizeof *vals);
    void **owned = calloc((size_t)g->n_nodes + 1, sizeof *owned);
    assert_non_null(vals);
    assert_non_null(owned);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const nb_var *node = g->nodes[i];
        if (node->op == NBI_OP_PARAM) {
            vals[i] = params[node->at.ivalue];
            continue;
        }
        const void **ins = calloc((size_t)node->n_in + 1, sizeof *ins);
        assert_non_null(ins);
        for (int32_t j = 0; j < node->n_in; j++) {
            ins[j] = vals[node->in[j]->id];
        }
        owned[i] = run1(node, ins);
        vals[i] = owned[i];
        free(ins);
    }
    size_t bytes = (size_t)v->size * nb_dtype_size(v->dtype);
    void *res = malloc(bytes ? bytes : 1);
    assert_non_null(res);
    if (bytes > 0) {
        memcpy(res, vals[v->id], bytes);
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        free(owned[i]);
    }
    free(owned);
    free(vals);
    return res;
}

/* The trace's graph passes the IR verifier (which re-runs every node's inference on its
 * stored attributes). */
static void verify(nb_trace *tr) {
    nbi_graph *g = &tr->g;
    nb_var *inputs[64];
    int32_t n = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i]->op == NBI_OP_PARAM) {
            assert_true(n < 64);
            inputs[n++] = g->nodes[i];
        }
    }
    g->inputs = inputs;
    g->n_inputs = n;
    NBT_OK(tr->ctx, nbi_graph_verify(tr->ctx, g, "test"));
    g->inputs = NULL;
    g->n_inputs = 0;
}

static void unravel(int64_t i, int rank, const int64_t *shape, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
}

static int64_t ravel(int rank, const int64_t *shape, const int64_t *idx) {
    int64_t f = 0;
    for (int d = 0; d < rank; d++) {
        f = f * shape[d] + idx[d];
    }
    return f;
}

/* out[i] must equal in[src[i]] byte for byte (src[i] < 0: the element fill). */
static void expect_map(const void *out, const void *in, size_t es, int64_t n, const int64_t *src,
                       const void *fill) {
    const unsigned char *o = out, *x = in;
    for (int64_t i = 0; i < n; i++) {
        const void *want = src[i] >= 0 ? x + (size_t)src[i] * es : fill;
        if (memcmp(o + (size_t)i * es, want, es) != 0) {
            fail_msg("element %lld differs from the reference (source %lld)", (long long)i,
                     (long long)src[i]);
        }
    }
}

static int64_t *alloc_src(int64_t n) {
    int64_t *src = malloc((size_t)(n > 0 ? n : 1) * sizeof *src);
    assert_non_null(src);
    return src;
}

/* numpy's negative index, then clamped into [0, dim-1]. */
static int64_t ref_fix(int64_t i, int64_t dim) {
    if (i < 0) {
        i += dim;
    }
    return i < 0 ? 0 : i >= dim ? dim - 1 : i;
}

/* Element i of buf = v in dtype dt (test-side conversion; v is exactly representable). */
static void put_value(nb_dtype dt, void *buf, int64_t i, double v) {
    switch (dt) {
    case F32:
        ((float *)buf)[i] = (float)v;
        break;
    case F64:
        ((double *)buf)[i] = v;
        break;
    case I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case BOOL:
        ((uint8_t *)buf)[i] = v != 0;
        break;
    }
}

/* Concatenate n buffers of dt with counts[i] elements into one (for multi-input
 * references); offsets[i] receives the element offset of buffer i. */
static void *join(nb_dtype dt, int n, void *const *bufs, const int64_t *counts, int64_t *offsets) {
    size_t es = nb_dtype_size(dt);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        offsets[i] = total;
        total += counts[i];
    }
    unsigned char *p = malloc((size_t)(total > 0 ? total : 1) * es);
    assert_non_null(p);
    for (int i = 0; i < n; i++) {
        if (counts[i] > 0) {
            memcpy(p + (size_t)offsets[i] * es, bufs[i], (size_t)counts[i] * es);
        }
    }
    return p;
}

/* ---- reshape ------------------------------------------------------------------------ */

/* nb_concatenate / nb_stack of no vars: the running trace records why (they returned NULL,
 * and the call said "returned ERR_MISUSE without recording a message"). self: {op, n}. */
static nb_status body_join_none(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    int64_t op = 0, n = 0;
    nb_tree_get_int(nb_tree_get(self, "op"), &op);
    nb_tree_get_int(nb_tree_get(self, "n"), &n);
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *xs[1] = {x};
    nb_var *const *p = n > 0 ? NULL : xs; /* n > 0 with a NULL array of vars */
    nb_var *y = op == 0 ? nb_concatenate((int)n, p, 0) : nb_stack((int)n, p, 0);
    return nb_return(nb_add(y, x), out);
}

static void test_join_no_vars(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const char *names[2] = {"nb_concatenate", "nb_stack"};
    for (int op = 0; op < 2; op++) {
        for (int n = 0; n < 2; n++) {
            nb_tree *ol = NULL, *nl = NULL, *self = NULL, *x = NULL, *args = NULL, *out = NULL;
            nb_array *a = NULL;
            NBT_OK(ctx, nb_tree_int(ctx, op, &ol));
            NBT_OK(ctx, nb_tree_int(ctx, n, &nl));
            NBT_OK(ctx,
                   nb_tree_dict(ctx, 2, (const char *[]){"op", "n"}, (nb_tree *[]){ol, nl}, &self));
            NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, &a));
            NBT_OK(ctx, nb_tree_array(a, &x));
            NBT_OK(ctx, nb_tree_tuple(ctx, 1, &x, &args));
            nb_status st = nb_eval(ctx, body_join_none, self, args, &out);
            NBT_TRUE(out == NULL);
            if (n == 0) {
                NBT_TRUE(st == NB_ERR_INVALID);
                NBT_ERRMSG_HAS(ctx, names[op]);
                NBT_ERRMSG_HAS(ctx, "n is 0: it needs at least one var");
            } else {
                NBT_TRUE(st == NB_ERR_MISUSE);
                NBT_ERRMSG_HAS(ctx, "xs is NULL (with n = 1)");
            }
            nb_tree *all[] = {args, x, self, nl, ol};
            for (int i = 0; i < 5; i++) {
                nb_tree_destroy(all[i]);
            }
            nb_array_destroy(a);
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* nb_pad of an integer array with a fill value that does not fit: NaN, +-inf, +-1e20, +-3.7.
 * The pad alone (its own kernel) and the pad fused into an elementwise op give the same
 * elements, by nb_cast's rule: NaN -> 0, saturation, truncation toward zero. (The fused
 * path cast with a plain C cast: NaN -> INT_MIN, undefined behaviour under UBSan.) */
static double g_padv;
static nb_status body_pad_int(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]"), *ones = nb_get(tr, args, "[1]");
    nb_var *alone = nb_pad(x, (int64_t[]){1}, (int64_t[]){1}, g_padv);
    nb_var *fused = nb_mul(nb_pad(x, (int64_t[]){1}, (int64_t[]){1}, g_padv), ones);
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(alone), nb_leaf(fused)}, out);
}

static void test_pad_int_fill_rule(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const double vals[] = {NAN, INFINITY, -INFINITY, 1e20, -1e20, 3.7, -3.7, 2147483647.5};
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d == 0 ? NB_DTYPE_I32 : NB_DTYPE_I64;
        for (size_t v = 0; v < sizeof vals / sizeof vals[0]; v++) {
            g_padv = vals[v];
            nb_array *x = NULL, *ones = NULL;
            NBT_OK(ctx, nb_array_full(ctx, dt, 1, (int64_t[]){3}, 5, &x));
            NBT_OK(ctx, nb_array_full(ctx, dt, 1, (int64_t[]){5}, 1, &ones));
            nb_tree *lx = NULL, *lo = NULL, *args = NULL, *out = NULL;
            NBT_OK(ctx, nb_tree_array(x, &lx));
            NBT_OK(ctx, nb_tree_array(ones, &lo));
            NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){lx, lo}, &args));
            nb_ctx_clear_cache(ctx); /* the fill value is baked into the trace */
            NBT_OK(ctx, nb_eval(ctx, body_pad_int, NULL, args, &out));
            double f = vals[v];
            int64_t lim_hi = d == 0 ? INT32_MAX : INT64_MAX,
                    lim_lo = d == 0 ? INT32_MIN : INT64_MIN;
            int64_t want = f != f                                                 ? 0
                           : f >= (d == 0 ? 2147483647.0 : 9.2233720368547758e18) ? lim_hi
                           : f <= (double)lim_lo                                  ? lim_lo
                                                                                  : (int64_t)f;
            for (int which = 0; which < 2; which++) {
                const nb_array *r = nb_tree_get_array(nb_tree_child(out, which));
                for (int64_t i = 0; i < 5; i++) {
                    int64_t got = 0;
                    NBT_OK(ctx, nb_array_get_i64(r, (int64_t[]){i}, &got));
                    int64_t w = i == 0 || i == 4 ? want : 5;
                    if (got != w) {
                        fail_msg("%s pad %g, %s: element %lld is %lld, want %lld",
                                 d == 0 ? "i32" : "i64", f, which ? "fused" : "alone", (long long)i,
                                 (long long)got, (long long)w);
                    }
                }
            }
            nb_tree_destroy(out);
            nb_tree_destroy(args);
            nb_tree_destroy(lo);
            nb_tree_destroy(lx);
            nb_array_destroy(ones);
            nb_array_destroy(x);
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_reshape(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        nb_trace tr;
        begin(&tr, ctx);
        nb_var *x = param(&tr, 0, dt, 3, S(2, 3, 4));
        nb_var *a = nb_reshape(x, 2, S(4, -1));
        expect_type(a, dt, 2, S(4, 6));
        NBT_EQ_I64(a->op, NBI_OP_RESHAPE);
        nb_var *b = nb_reshape(a, 1, S(-1));
        expect_type(b, dt, 1, S(24));
        nb_var *c = nb_reshape(b, 4, S(1, 2, 12, 1));
        expect_type(c, dt, 4, S(1, 2, 12, 1));
        void *in = pattern(dt, 24, t);
        void *out = run_graph(&tr, (const void *const[]){in}, c);
        assert_memory_equal(out, in, 24 * nb_dtype_size(dt));
        free(out);
        free(in);
        verify(&tr);
        nbi_trace_release(&tr);
    }

    /* Same shape: x itself, no node; rank 0; size-0 dims. */
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 3, S(2, 3, 4));
    nb_var *s = param(&tr, 1, I64, 0, NULL);
    nb_var *z = param(&tr, 2, BOOL, 3, S(2, 0, 3));
    int32_t n0 = tr.g.n_nodes;
    assert_ptr_equal(nb_reshape(x, 3, S(2, 3, 4)), x);
    assert_ptr_equal(nb_reshape(x, 3, S(2, -1, 4)), x);
    assert_ptr_equal(nb_reshape(s, 0, NULL), s);
    NBT_EQ_I64(tr.g.n_nodes, n0);
    nb_var *s11 = nb_reshape(s, 2, S(1, 1));
    expect_type(s11, I64, 2, S(1, 1));
    nb_var *s0 = nb_reshape(s11, 0, NULL);
    expect_type(s0, I64, 0, NULL);
    expect_type(nb_reshape(s, 1, S(-1)), I64, 1, S(1));
    expect_type(nb_reshape(z, 2, S(-1, 3)), BOOL, 2, S(0, 3));
    expect_type(nb_reshape(z, 3, S(3, 0, 7)), BOOL, 3, S(3, 0, 7));
    expect_type(nb_reshape(z, 1, S(0)), BOOL, 1, S(0));
    int64_t sval = -1234567890123LL;
    float xbuf[24] = {0};
    uint8_t zbuf[1] = {0};
    int64_t *o = run_graph(&tr, (const void *const[]){xbuf, &sval, zbuf}, s0);
    NBT_EQ_I64(o[0], sval);
    free(o);
    NBT_OK(ctx, nb_trace_status(&tr));
    verify(&tr);
    nbi_trace_release(&tr);

    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, 2, S(4, 2)), NB_ERR_SHAPE,
             "nb_reshape: ", "f32[2,3] (6 elements)", "[4,2] (8 elements)", "counts must match");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, 2, S(4, -1)), NB_ERR_SHAPE,
             "nb_reshape: ", "f32[2,3]", "[4,-1]", "not a multiple of 4");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, 3, S(-1, -1, 6)), NB_ERR_SHAPE,
             "nb_reshape: ", "[-1,-1,6]", "more than one -1");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, 2, S(2, -3)), NB_ERR_SHAPE,
             "nb_reshape: ", "dim 1 of the target shape [2,-3] for f32[2,3] is -3", ">= 0");
    ERR_CASE(ctx, F32, 2, S(0, 3), nb_reshape(X, 2, S(0, -1)), NB_ERR_SHAPE,
             "nb_reshape: ", "cannot infer the -1 in [0,-1] for f32[0,3]", "multiply to 0");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, 9, S(1, 1, 1, 1, 1, 1, 1, 2, 3)), NB_ERR_SHAPE,
             "nb_reshape: target rank 9 for f32[2,3]", "0 to 8 dims");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, -1, NULL), NB_ERR_SHAPE,
             "nb_reshape: target rank -1");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, 2, NULL), NB_ERR_MISUSE,
             "nb_reshape: NULL target shape with rank 2 for f32[2,3]");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_reshape(X, 3, S(INT64_MAX / 2, 4, -1)), NB_ERR_OVERFLOW,
             "nb_reshape: ", "too many elements");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- broadcast_to ------------------------------------------------------------------- */

static void ref_broadcast(int xr, const int64_t *xs, int r, const int64_t *os, int64_t *src) {
    int64_t oi[NB_MAX_RANK], xi[NB_MAX_RANK];
    for (int64_t i = 0; i < prod(r, os); i++) {
        unravel(i, r, os, oi);
        for (int d = 0; d < xr; d++) {
            xi[d] = xs[d] == 1 ? 0 : oi[d + r - xr];
        }
        src[i] = ravel(xr, xs, xi);
    }
}

typedef struct bcase {
    int xr;
    int64_t xs[NB_MAX_RANK];
    int r;
    int64_t os[NB_MAX_RANK];
} bcase;

static void test_broadcast_to(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const bcase cases[] = {
        {1, {3}, 2, {2, 3}},       {3, {2, 1, 4}, 4, {3, 2, 5, 4}},
        {2, {3, 1}, 2, {3, 4}},    {2, {1, 4}, 2, {3, 4}},
        {0, {0}, 2, {2, 2}},       {1, {1}, 1, {0}},
        {2, {1, 1}, 3, {2, 3, 1}}, {0, {0}, 0, {0}},
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const bcase *bc = &cases[c];
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, bc->xr, bc->xs);
            nb_var *v = nb_broadcast_to(x, bc->r, bc->os);
            int64_t n = prod(bc->r, bc->os);
            expect_type(v, dt, bc->r, bc->os);
            void *in = pattern(dt, prod(bc->xr, bc->xs), t);
            void *out = run_graph(&tr, (const void *const[]){in}, v);
            int64_t *src = alloc_src(n);
            ref_broadcast(bc->xr, bc->xs, bc->r, bc->os, src);
            expect_map(out, in, es, n, src, NULL);
            free(src);
            free(out);
            free(in);
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 2, S(1, 3));
    int32_t n0 = tr.g.n_nodes;
    assert_ptr_equal(nb_broadcast_to(x, 2, S(1, 3)), x);
    NBT_EQ_I64(tr.g.n_nodes, n0);
    nb_var *big = nb_broadcast_to(x, 2, S(1000, 3));
    expect_type(big, F32, 2, S(1000, 3));
    nbi_trace_release(&tr);

    ERR_CASE(ctx, F32, 2, S(2, 3), nb_broadcast_to(X, 2, S(2, 4)), NB_ERR_SHAPE,
             "nb_broadcast_to: cannot broadcast f32[2,3] to [2,4]", "input dim 1 (3)",
             "target's dim 1 (4)");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_broadcast_to(X, 3, S(2, 4, 3)), NB_ERR_SHAPE,
             "input dim 0 (2)", "target's dim 1 (4)", "aligned from the right");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_broadcast_to(X, 1, S(3)), NB_ERR_SHAPE,
             "nb_broadcast_to: cannot broadcast f32[2,3] to [3]", "fewer dims");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_broadcast_to(X, 2, S(-1, 3)), NB_ERR_SHAPE,
             "nb_broadcast_to: dim 0 of the target shape [-1,3] is -1");
    ERR_CASE(ctx, I32, 1, S(3), nb_broadcast_to(X, 9, S(1, 1, 1, 1, 1, 1, 1, 1, 3)), NB_ERR_SHAPE,
             "nb_broadcast_to: target rank 9 for i32[3]");
    ERR_CASE(ctx, I32, 1, S(3), nb_broadcast_to(X, 2, NULL), NB_ERR_MISUSE,
             "nb_broadcast_to: NULL target shape");
    ERR_CASE(ctx, I32, 1, S(3), nb_broadcast_to(X, 2, S(INT64_MAX, 3)), NB_ERR_OVERFLOW,
             "nb_broadcast_to");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- transpose ---------------------------------------------------------------------- */

typedef struct tcase {
    int r;
    int64_t xs[NB_MAX_RANK];
    bool reverse; /* perm NULL */
    int perm[NB_MAX_RANK];
} tcase;

static void test_transpose(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const tcase cases[] = {
        {3, {2, 3, 4}, true, {0}},
        {3, {2, 3, 4}, false, {1, 2, 0}},
        {3, {2, 3, 4}, false, {-1, 0, -2}},
        {2, {70, 45}, true, {0}},
        {2, {64, 64}, false, {1, 0}},
        {3, {3, 33, 40}, false, {0, 2, 1}},
        {4, {2, 3, 4, 5}, false, {3, 1, 0, 2}},
        {3, {5, 1, 7}, false, {2, 1, 0}},
        {2, {0, 3}, true, {0}},
        {3, {1, 1, 5}, false, {2, 0, 1}},
        {2, {1, 37}, true, {0}},
        {3, {2, 3, 4}, false, {1, 0, 2}}, /* contiguous rows: a strided copy */
        {4, {2, 3, 4, 5}, false, {0, 2, 1, 3}},
        {3, {40, 3, 70}, false, {2, 1, 0}}, /* planes of tiles with remainders */
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const tcase *tc = &cases[c];
            int r = tc->r, perm[NB_MAX_RANK];
            for (int i = 0; i < r; i++) {
                perm[i] = tc->reverse ? r - 1 - i : (tc->perm[i] + r) % r;
            }
            int64_t os[NB_MAX_RANK];
            for (int i = 0; i < r; i++) {
                os[i] = tc->xs[perm[i]];
            }
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, r, tc->xs);
            nb_var *v = nb_transpose(x, tc->reverse ? NULL : tc->perm);
            expect_type(v, dt, r, os);
            NBT_EQ_I64(v->op, NBI_OP_TRANSPOSE);
            for (int i = 0; i < r; i++) {
                NBT_EQ_I64(v->at.axes[i], perm[i]); /* stored normalised */
            }
            int64_t n = prod(r, os);
            void *in = pattern(dt, n, t);
            void *out = run_graph(&tr, (const void *const[]){in}, v);
            int64_t *src = alloc_src(n);
            int64_t oi[NB_MAX_RANK], xi[NB_MAX_RANK];
            for (int64_t i = 0; i < n; i++) {
                unravel(i, r, os, oi);
                for (int k = 0; k < r; k++) {
                    xi[perm[k]] = oi[k];
                }
                src[i] = ravel(r, tc->xs, xi);
            }
            expect_map(out, in, es, n, src, NULL);
            free(src);
            free(out);
            free(in);
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 3, S(2, 3, 4));
    nb_var *v1 = param(&tr, 1, F32, 1, S(5));
    nb_var *s = param(&tr, 2, F32, 0, NULL);
    int32_t n0 = tr.g.n_nodes;
    assert_ptr_equal(nb_transpose(x, (const int[]){0, 1, 2}), x);
    assert_ptr_equal(nb_transpose(x, (const int[]){-3, -2, -1}), x);
    assert_ptr_equal(nb_transpose(v1, NULL), v1);
    assert_ptr_equal(nb_transpose(s, NULL), s);
    assert_ptr_equal(nb_transpose(s, (const int[]){0}), s);
    NBT_EQ_I64(tr.g.n_nodes, n0);
    nbi_trace_release(&tr);

    ERR_CASE(ctx, F32, 3, S(2, 3, 4), nb_transpose(X, (const int[]){0, 0, 1}), NB_ERR_INVALID,
             "nb_transpose: perm [0,0,1] is not a permutation of the 3 axes of f32[2,3,4]");
    ERR_CASE(ctx, F32, 3, S(2, 3, 4), nb_transpose(X, (const int[]){0, 1, 3}), NB_ERR_INVALID,
             "nb_transpose: perm [0,1,3]", "from 0 to 2 or -3 to -1");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_transpose(X, (const int[]){-3, 0}), NB_ERR_INVALID,
             "perm [-3,0]");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- slice -------------------------------------------------------------------------- */

/* The bounds and steps of the slice oracle: B[0] means "omitted" (a NULL array). */
static const int64_t k_bounds[] = {0, -9, -5, -2, 0, 2, 5, 9, INT64_MIN, INT64_MAX};
static const int64_t k_steps[] = {-3, -1, 1, 2, INT64_MAX, INT64_MIN};
static const int64_t k_lens[] = {0, 1, 5};

/* (count, first) of range(n)[s:e:k] for n in k_lens, s and e in k_bounds (None first), k in
 * k_steps, in that loop order. Generated by CPython 3 (slices are the reference for
 * nb_slice's semantics):
 *   B = [None, -9, -5, -2, 0, 2, 5, 9, -2**63, 2**63-1]; K = [-3, -1, 1, 2, 2**63-1, -2**63]
 *   for n in (0, 1, 5): for s in B: for e in B: for k in K:
 *       r = range(n)[s:e:k]; print(len(r), r[0] if len(r) else 0)
 */
static const int64_t k_slice_oracle[] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0,
    1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0,
    1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0,
    1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0,
    1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0,
    1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0,
    1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0,
    1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0,
    0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0,
    0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0,
    1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0,
    1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    2, 4, 5, 4, 5, 0, 3, 0, 1, 0, 1, 4, 2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4, 2, 4, 4, 4, 0, 0, 0, 0,
    0, 0, 1, 4, 1, 4, 1, 4, 3, 0, 2, 0, 1, 0, 1, 4, 2, 4, 4, 4, 0, 0, 0, 0, 0, 0, 1, 4, 1, 4, 2, 4,
    2, 0, 1, 0, 1, 0, 1, 4, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0,
    2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0,
    1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    3, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 1, 0, 1, 0, 5, 0, 3, 0, 1, 0, 1, 0, 1, 0, 1, 0,
    0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 2, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0,
    1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0,
    5, 0, 3, 0, 1, 0, 0, 0, 2, 3, 4, 3, 2, 3, 1, 3, 1, 3, 1, 3, 2, 3, 4, 3, 0, 0, 0, 0, 0, 0, 1, 3,
    1, 3, 3, 3, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 3, 0, 0, 0, 0,
    0, 0, 1, 3, 1, 3, 1, 3, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0, 2, 3, 1, 3, 1, 3, 0, 0, 0, 0, 0, 0,
    2, 3, 1, 3, 1, 3, 0, 0, 2, 3, 4, 3, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0, 2, 3, 1, 3, 1, 3, 0, 0,
    1, 0, 1, 0, 5, 0, 3, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    2, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0,
    1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 1, 2, 3, 2, 3, 2, 2, 2,
    1, 2, 1, 2, 1, 2, 3, 2, 0, 0, 0, 0, 0, 0, 1, 2, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0,
    1, 2, 1, 2, 1, 2, 0, 0, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 3, 2, 2, 2, 1, 2, 0, 0, 0, 0, 0, 0, 3, 2, 2, 2, 1, 2, 0, 0, 1, 2, 3, 2, 0, 0, 0, 0,
    0, 0, 1, 2, 0, 0, 0, 0, 3, 2, 2, 2, 1, 2, 0, 0, 2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4, 2, 4, 5, 4,
    0, 0, 0, 0, 0, 0, 1, 4, 2, 4, 4, 4, 0, 0, 0, 0, 0, 0, 1, 4, 1, 4, 1, 4, 0, 0, 0, 0, 0, 0, 1, 4,
    2, 4, 4, 4, 0, 0, 0, 0, 0, 0, 1, 4, 1, 4, 2, 4, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4, 2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4,
    2, 4, 4, 4, 0, 0, 0, 0, 0, 0, 1, 4, 1, 4, 1, 4, 0, 0, 0, 0, 0, 0, 1, 4, 2, 4, 4, 4, 0, 0, 0, 0,
    0, 0, 1, 4, 1, 4, 2, 4, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    2, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 3, 0, 1, 0, 0, 0, 2, 4, 5, 4, 0, 0, 0, 0,
    0, 0, 1, 4, 2, 4, 5, 4, 0, 0, 0, 0, 0, 0, 1, 4, 2, 4, 4, 4, 0, 0, 0, 0, 0, 0, 1, 4, 1, 4, 1, 4,
    0, 0, 0, 0, 0, 0, 1, 4, 2, 4, 4, 4, 0, 0, 0, 0, 0, 0, 1, 4, 1, 4, 2, 4, 0, 0, 0, 0, 0, 0, 1, 4,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 5, 4, 0, 0, 0, 0,
    0, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

static void test_slice_python_oracle(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const size_t nb = sizeof k_bounds / sizeof k_bounds[0];
    const size_t nk = sizeof k_steps / sizeof k_steps[0];
    NBT_EQ_I64(sizeof k_slice_oracle / sizeof k_slice_oracle[0], 2 * 3 * nb * nb * nk);
    size_t row = 0;
    for (size_t l = 0; l < 3; l++) {
        int64_t len = k_lens[l];
        nb_trace tr;
        begin(&tr, ctx);
        nb_var *x = param(&tr, 0, I64, 1, &len);
        void *in = pattern(I64, len, 3);
        const int64_t *xv = in;
        for (size_t si = 0; si < nb; si++) {
            for (size_t ei = 0; ei < nb; ei++) {
                for (size_t ki = 0; ki < nk; ki++, row++) {
                    int64_t count = k_slice_oracle[2 * row], first = k_slice_oracle[2 * row + 1];
                    int64_t step = k_steps[ki];
                    nb_var *v = nb_slice(x, si == 0 ? NULL : &k_bounds[si],
                                         ei == 0 ? NULL : &k_bounds[ei], &step);
                    expect_type(v, I64, 1, &count);
                    if (v == x) { /* everything, in order */
                        NBT_TRUE(count == len && (count == 0 || first == 0) &&
                                 (count <= 1 || step == 1));
                        continue;
                    }
                    NBT_EQ_I64(v->op, NBI_OP_SLICE);
                    /* canonical attributes: first, one past the last, step (1 if <= 1 element) */
                    NBT_EQ_I64(v->at.a[0], count > 0 ? first : 0);
                    NBT_EQ_I64(v->at.c[0], count > 1 ? step : 1);
                    NBT_EQ_I64(v->at.b[0], count > 1
                                               ? first + (count - 1) * step + (step > 0 ? 1 : -1)
                                               : v->at.a[0] + count);
                    int64_t *out = run1(v, (const void *const[]){in});
                    for (int64_t i = 0; i < count; i++) {
                        int64_t want = xv[first + (i > 0 ? i * step : 0)];
                        if (out[i] != want) {
                            fail_msg("len %lld [%s%lld:%s%lld:%lld] element %lld: %lld != %lld",
                                     (long long)len, si ? "" : "None~", (long long)k_bounds[si],
                                     ei ? "" : "None~", (long long)k_bounds[ei], (long long)step,
                                     (long long)i, (long long)out[i], (long long)want);
                        }
                    }
                    free(out);
                }
            }
        }
        free(in);
        NBT_OK(ctx, nb_trace_status(&tr));
        verify(&tr);
        nbi_trace_release(&tr);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

typedef struct scase {
    bool null_start, null_stop, null_step;
    int64_t start[3], stop[3], step[3];
    int64_t first[3], count[3], ostep[3]; /* expected, from CPython */
} scase;

static void test_slice(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t xs[3] = {4, 5, 6};
    static const scase cases[] = {
        /* range(4)[-1:-5:-1], range(5)[1:100:2], range(6)[MAX:0:-4] */
        {false,
         false,
         false,
         {-1, 1, INT64_MAX},
         {-5, 100, 0},
         {-1, 2, -4},
         {3, 1, 5},
         {4, 2, 2},
         {-1, 2, -4}},
        /* range(4)[-100:2], range(5)[4:-100:-2], range(6)[2:3] */
        {false,
         false,
         false,
         {-100, 4, 2},
         {2, -100, 3},
         {1, -2, 1},
         {0, 4, 2},
         {2, 3, 1},
         {1, -2, 1}},
        /* range(4)[::-1], range(5)[::1], range(6)[::3] */
        {true, true, false, {0}, {0}, {-1, 1, 3}, {3, 0, 0}, {4, 5, 2}, {-1, 1, 3}},
        /* [1:3], [0:5], [0:6], step NULL */
        {false, false, true, {1, 0, 0}, {3, 5, 6}, {0}, {1, 0, 0}, {2, 5, 6}, {1, 1, 1}},
        /* an empty axis: range(5)[3:1] */
        {false, false, true, {0, 3, 0}, {4, 1, 6}, {0}, {0, 0, 0}, {4, 0, 6}, {1, 1, 1}},
        /* single elements with huge steps: range(4)[2::MAX], range(5)[-1::MIN], [0:6:5] */
        {false,
         true,
         false,
         {2, -1, 0},
         {0},
         {INT64_MAX, INT64_MIN, 5},
         {2, 4, 0},
         {1, 1, 2},
         {INT64_MAX, INT64_MIN, 5}},
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const scase *sc = &cases[c];
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, 3, xs);
            nb_var *v = nb_slice(x, sc->null_start ? NULL : sc->start,
                                 sc->null_stop ? NULL : sc->stop, sc->null_step ? NULL : sc->step);
            expect_type(v, dt, 3, sc->count);
            NBT_EQ_I64(v->op, NBI_OP_SLICE);
            int64_t n = prod(3, sc->count);
            for (int d = 0; d < 3 && n > 0; d++) {
                NBT_EQ_I64(v->at.a[d], sc->first[d]); /* normalised start */
                NBT_EQ_I64(v->at.c[d], sc->count[d] > 1 ? sc->ostep[d] : 1);
            }
            void *in = pattern(dt, prod(3, xs), t);
            void *out = run_graph(&tr, (const void *const[]){in}, v);
            int64_t *src = alloc_src(n);
            int64_t oi[3], xi[3];
            for (int64_t i = 0; i < n; i++) {
                unravel(i, 3, sc->count, oi);
                for (int d = 0; d < 3; d++) {
                    xi[d] = sc->first[d] + (oi[d] > 0 ? oi[d] * sc->ostep[d] : 0);
                }
                src[i] = ravel(3, xs, xi);
            }
            expect_map(out, in, es, n, src, NULL);
            free(src);
            free(out);
            free(in);
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }
    /* Everything selected, and rank 0: x itself. */
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 3, xs);
    nb_var *s = param(&tr, 1, F32, 0, NULL);
    int32_t n0 = tr.g.n_nodes;
    assert_ptr_equal(nb_slice(x, S(0, 0, 0), S(4, 5, 6), NULL), x);
    assert_ptr_equal(nb_slice(x, NULL, NULL, NULL), x);
    assert_ptr_equal(nb_slice(x, S(-4, INT64_MIN, 0), S(100, INT64_MAX, 6), S(1, 1, 1)), x);
    assert_ptr_equal(nb_slice(s, NULL, NULL, NULL), s);
    NBT_EQ_I64(tr.g.n_nodes, n0);
    /* Empty slices are stored canonically as 0:0. */
    nb_var *e = nb_slice(x, S(3, 0, 0), S(1, 5, 6), NULL);
    expect_type(e, F32, 3, S(0, 5, 6));
    NBT_EQ_I64(e->at.a[0], 0);
    NBT_EQ_I64(e->at.b[0], 0);
    NBT_EQ_I64(e->at.c[0], 1);
    /* Equal slices written differently have equal attributes: [0:3:2] and [0:4:2] (len 5),
     * [2:3] and [2::9] (one element). */
    nb_var *p1 = nb_slice(x, S(0, 0, 2), S(3, 3, 3), S(1, 2, 1));
    nb_var *p2 = nb_slice(x, S(0, 0, 2), S(3, 4, INT64_MAX), S(1, 2, 9));
    expect_type(p1, F32, 3, S(3, 2, 1));
    for (int d = 0; d < 3; d++) {
        NBT_EQ_I64(p1->at.a[d], p2->at.a[d]);
        NBT_EQ_I64(p1->at.b[d], p2->at.b[d]);
        NBT_EQ_I64(p1->at.c[d], p2->at.c[d]);
    }
    /* Reversing a length-1 axis selects everything. */
    nb_var *one = param(&tr, 2, F32, 2, S(1, 3));
    assert_ptr_equal(nb_slice(one, NULL, NULL, S(-1, 1)), one);
    verify(&tr);
    nbi_trace_release(&tr);

    ERR_CASE(ctx, F32, 2, S(2, 3), nb_slice(X, S(0, 0), S(2, 3), S(1, 0)), NB_ERR_INVALID,
             "nb_slice: step 0 on axis 1 of f32[2,3]", "nonzero");
    ERR_CASE(ctx, I64, 1, S(0), nb_slice(X, NULL, NULL, S(0)), NB_ERR_INVALID,
             "nb_slice: step 0 on axis 0 of i64[0]");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- concatenate -------------------------------------------------------------------- */

typedef struct ccase {
    int n, r, axis;
    int64_t xs[3][NB_MAX_RANK];
} ccase;

static void test_concatenate(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const ccase cases[] = {
        {3, 3, 1, {{2, 1, 3}, {2, 0, 3}, {2, 4, 3}}},
        {3, 3, -2, {{2, 1, 3}, {2, 0, 3}, {2, 4, 3}}},
        {2, 2, 0, {{1, 2}, {3, 2}}},
        {3, 1, 0, {{3}, {0}, {2}}},
        {2, 2, -1, {{2, 3}, {2, 1}}},
        {2, 2, 1, {{0, 3}, {0, 1}}},
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const ccase *cc = &cases[c];
            int r = cc->r, ax = (cc->axis + r) % r;
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *xs[3];
            void *bufs[3];
            int64_t counts[3], offs[3], os[NB_MAX_RANK], starts[3];
            memcpy(os, cc->xs[0], sizeof os);
            os[ax] = 0;
            for (int j = 0; j < cc->n; j++) {
                xs[j] = param(&tr, j, dt, r, cc->xs[j]);
                counts[j] = prod(r, cc->xs[j]);
                bufs[j] = pattern(dt, counts[j], t + j);
                starts[j] = os[ax];
                os[ax] += cc->xs[j][ax];
            }
            nb_var *v = nb_concatenate(cc->n, xs, cc->axis);
            expect_type(v, dt, r, os);
            NBT_EQ_I64(v->at.axis, ax);
            void *out = run_graph(&tr, (const void *const *)bufs, v);
            void *all = join(dt, cc->n, bufs, counts, offs);
            int64_t n = prod(r, os);
            int64_t *src = alloc_src(n);
            int64_t oi[NB_MAX_RANK];
            for (int64_t i = 0; i < n; i++) {
                unravel(i, r, os, oi);
                int j = cc->n - 1;
                while (oi[ax] < starts[j] || cc->xs[j][ax] == 0) {
                    j--;
                }
                oi[ax] -= starts[j];
                src[i] = offs[j] + ravel(r, cc->xs[j], oi);
            }
            expect_map(out, all, es, n, src, NULL);
            free(src);
            free(all);
            free(out);
            for (int j = 0; j < cc->n; j++) {
                free(bufs[j]);
            }
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 2, S(2, 3));
    int32_t n0 = tr.g.n_nodes;
    assert_ptr_equal(nb_concatenate(1, &x, -1), x);
    NBT_EQ_I64(tr.g.n_nodes, n0);
    assert_null(nb_concatenate(0, &x, 0));
    assert_null(nb_concatenate(2, NULL, 0));
    NBT_OK(ctx, nb_trace_status(&tr));
    nbi_trace_release(&tr);

    ERR_CASE(ctx, F32, 0, NULL, nb_concatenate(2, ((nb_var *[]){X, X}), 0), NB_ERR_SHAPE,
             "nb_concatenate: input 0 is f32[] (rank 0)", "nb_stack");
    ERR_CASE(ctx, F32, 0, NULL, nb_concatenate(1, &X, 0), NB_ERR_SHAPE, "rank 0");
    ERR_CASE(ctx, F32, 2, S(2, 3),
             nb_concatenate(2, ((nb_var *[]){X, param(T, 1, F64, 2, S(2, 3))}), 0), NB_ERR_DTYPE,
             "nb_concatenate: input 1 is f64[2,3] but input 0 is f32[2,3]", "nb_cast");
    ERR_CASE(ctx, F32, 2, S(2, 3),
             nb_concatenate(2, ((nb_var *[]){X, param(T, 1, F32, 2, S(3, 3))}), 1), NB_ERR_SHAPE,
             "nb_concatenate: input 1 is f32[3,3] but input 0 is f32[2,3]", "except on axis 1");
    ERR_CASE(ctx, F32, 2, S(2, 3),
             nb_concatenate(2, ((nb_var *[]){X, param(T, 1, F32, 3, S(2, 3, 1))}), 0), NB_ERR_SHAPE,
             "input 1 is f32[2,3,1]", "same rank");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_concatenate(2, ((nb_var *[]){X, X}), 2), NB_ERR_INVALID,
             "nb_concatenate: axis 2 is out of range for f32[2,3]");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_concatenate(1, &X, -3), NB_ERR_INVALID,
             "nb_concatenate: axis -3");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_concatenate(2, ((nb_var *[]){X, NULL}), 0), NB_ERR_MISUSE,
             "nb_concatenate: input 1 is a NULL var");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- pad ---------------------------------------------------------------------------- */

static void test_pad(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        struct {
            int r;
            int64_t xs[3], lo[3], hi[3];
            bool null_lo, null_hi;
        } cases[] = {
            {2, {2, 3}, {1, 0}, {2, 3}, false, false},
            {3, {2, 1, 3}, {0, 2, 1}, {1, 0, 0}, false, false},
            {2, {2, 3}, {0}, {0, 2}, true, false},
            {2, {0, 2}, {1, 0}, {0}, false, true},
            {1, {4}, {0}, {3}, false, false},
            {2, {3, 4}, {0, 1}, {0, 1}, false, false},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int r = cases[c].r;
            const int64_t *xs = cases[c].xs;
            int64_t lo[3] = {0}, hi[3] = {0}, os[3];
            for (int d = 0; d < r; d++) {
                lo[d] = cases[c].null_lo ? 0 : cases[c].lo[d];
                hi[d] = cases[c].null_hi ? 0 : cases[c].hi[d];
                os[d] = lo[d] + xs[d] + hi[d];
            }
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, r, xs);
            nb_var *v = nb_pad(x, cases[c].null_lo ? NULL : cases[c].lo,
                               cases[c].null_hi ? NULL : cases[c].hi, 7.0);
            expect_type(v, dt, r, os);
            NBT_EQ_I64(v->op, NBI_OP_PAD);
            void *in = pattern(dt, prod(r, xs), t);
            void *out = run_graph(&tr, (const void *const[]){in}, v);
            _Alignas(8) unsigned char fill[8];
            put_value(dt, fill, 0, 7.0);
            int64_t n = prod(r, os);
            int64_t *src = alloc_src(n);
            int64_t oi[3], xi[3];
            for (int64_t i = 0; i < n; i++) {
                unravel(i, r, os, oi);
                src[i] = 0;
                for (int d = 0; d < r; d++) {
                    xi[d] = oi[d] - lo[d];
                    if (xi[d] < 0 || xi[d] >= xs[d]) {
                        src[i] = -1;
                    }
                }
                if (src[i] == 0) {
                    src[i] = ravel(r, xs, xi);
                }
            }
            expect_map(out, in, es, n, src, fill);
            free(src);
            free(out);
            free(in);
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }

    /* The value is converted to the dtype as nb_full does: saturating, NaN -> 0. */
    struct {
        nb_dtype dt;
        double value;
        double want;
    } conv[] = {
        {F32, 1.5, 1.5},
        {F64, -0.1, -0.1},
        {I32, 1.9, 1},
        {I32, -2.7, -2},
        {I32, -1e20, INT32_MIN},
        {I32, 1e20, INT32_MAX},
        {I32, NAN, 0},
        {I64, 1e30, (double)INT64_MAX},
        {I64, -1e30, (double)INT64_MIN},
        {I64, NAN, 0},
        {I64, -3.0, -3},
        {BOOL, 0.5, 1},
        {BOOL, 0.0, 0},
        {BOOL, -2.0, 1},
    };
    for (size_t c = 0; c < sizeof conv / sizeof conv[0]; c++) {
        nb_trace tr;
        begin(&tr, ctx);
        nb_var *x = param(&tr, 0, conv[c].dt, 1, S(1));
        nb_var *v = nb_pad(x, S(1), S(0), conv[c].value);
        expect_type(v, conv[c].dt, 1, S(2));
        _Alignas(8) unsigned char in[8] = {0};
        unsigned char *out = run_graph(&tr, (const void *const[]){in}, v);
        _Alignas(8) unsigned char want[8] = {0};
        if (conv[c].dt == I64) {
            int64_t q = conv[c].want == (double)INT64_MAX   ? INT64_MAX
                        : conv[c].want == (double)INT64_MIN ? INT64_MIN
                                                            : (int64_t)conv[c].want;
            memcpy(want, &q, 8);
        } else {
            put_value(conv[c].dt, want, 0, conv[c].want);
        }
        if (memcmp(out, want, nb_dtype_size(conv[c].dt)) != 0) {
            fail_msg("pad value %g as %s is wrong", conv[c].value, nb_dtype_name(conv[c].dt));
        }
        free(out);
        nbi_trace_release(&tr);
    }

    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 2, S(2, 3));
    nb_var *s = param(&tr, 1, F32, 0, NULL);
    int32_t n0 = tr.g.n_nodes;
    assert_ptr_equal(nb_pad(x, S(0, 0), S(0, 0), 1.0), x);
    assert_ptr_equal(nb_pad(x, NULL, NULL, 1.0), x);
    assert_ptr_equal(nb_pad(s, NULL, NULL, 1.0), s);
    NBT_EQ_I64(tr.g.n_nodes, n0);
    nbi_trace_release(&tr);

    ERR_CASE(ctx, F32, 2, S(2, 3), nb_pad(X, S(-1, 0), S(0, 0), 0), NB_ERR_INVALID,
             "nb_pad: lo[0] is -1 for f32[2,3]", "nb_slice");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_pad(X, NULL, S(0, -2), 0), NB_ERR_INVALID,
             "nb_pad: hi[1] is -2 for f32[2,3]");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_pad(X, S(INT64_MAX, 0), NULL, 0), NB_ERR_OVERFLOW,
             "nb_pad: padding axis 0 of f32[2,3]");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- take --------------------------------------------------------------------------- */

typedef struct gcase {
    int xr;
    int64_t xs[4];
    int ir;
    int64_t is[3];
    int64_t iv[12];
    int axis;
} gcase;

static void test_take(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const gcase cases[] = {
        {3, {3, 4, 2}, 2, {2, 3}, {0, 3, -1, -4, 7, -9}, 1},
        {3, {3, 4, 2}, 1, {2}, {5, -3}, -1},
        {2, {4, 2}, 0, {0}, {2}, 0},
        {2, {4, 2}, 0, {0}, {-1}, -2},
        {1, {5}, 2, {2, 2}, {INT32_MIN, INT32_MAX, 4, -5}, 0},
        {2, {0, 5}, 1, {2}, {1, 2}, 1},
        {2, {2, 0}, 1, {0}, {0}, 1},
        {2, {3, 4}, 1, {0}, {0}, 0},
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (int it = 0; it < 2; it++) {
            nb_dtype idt = it ? I64 : I32;
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                const gcase *g = &cases[c];
                int ax = (g->axis + g->xr) % g->xr;
                int r = g->xr - 1 + g->ir, k = 0;
                int64_t os[NB_MAX_RANK];
                for (int d = 0; d < ax; d++) {
                    os[k++] = g->xs[d];
                }
                for (int d = 0; d < g->ir; d++) {
                    os[k++] = g->is[d];
                }
                for (int d = ax + 1; d < g->xr; d++) {
                    os[k++] = g->xs[d];
                }
                nb_trace tr;
                begin(&tr, ctx);
                nb_var *x = param(&tr, 0, dt, g->xr, g->xs);
                nb_var *ix = param(&tr, 1, idt, g->ir, g->is);
                nb_var *v = nb_take(x, ix, g->axis);
                expect_type(v, dt, r, os);
                NBT_EQ_I64(v->at.axis, ax);
                void *in = pattern(dt, prod(g->xr, g->xs), t);
                void *ib = index_buf(idt, prod(g->ir, g->is), g->iv);
                void *out = run_graph(&tr, (const void *const[]){in, ib}, v);
                int64_t n = prod(r, os);
                int64_t *src = alloc_src(n);
                int64_t oi[NB_MAX_RANK], xi[NB_MAX_RANK];
                for (int64_t i = 0; i < n; i++) {
                    unravel(i, r, os, oi);
                    for (int d = 0; d < ax; d++) {
                        xi[d] = oi[d];
                    }
                    xi[ax] = ref_fix(g->iv[ravel(g->ir, g->is, oi + ax)], g->xs[ax]);
                    for (int d = ax + 1; d < g->xr; d++) {
                        xi[d] = oi[d - 1 + g->ir];
                    }
                    src[i] = ravel(g->xr, g->xs, xi);
                }
                expect_map(out, in, es, n, src, NULL);
                free(src);
                free(out);
                free(ib);
                free(in);
                verify(&tr);
                nbi_trace_release(&tr);
            }
        }
    }
    ERR_CASE(ctx, F32, 2, S(3, 4), nb_take(X, param(T, 1, F32, 1, S(2)), 0), NB_ERR_DTYPE,
             "nb_take: indices are f32[2]", "i32 or i64");
    ERR_CASE(ctx, F32, 2, S(3, 4), nb_take(X, param(T, 1, BOOL, 1, S(2)), 0), NB_ERR_DTYPE,
             "nb_take: indices are bool[2]");
    ERR_CASE(ctx, F32, 2, S(3, 4), nb_take(X, param(T, 1, I32, 1, S(2)), 2), NB_ERR_INVALID,
             "nb_take: axis 2 is out of range for x f32[3,4]");
    ERR_CASE(ctx, F32, 0, NULL, nb_take(X, param(T, 1, I32, 1, S(2)), 0), NB_ERR_INVALID,
             "nb_take: x f32[] is rank 0", "no axis");
    ERR_CASE(ctx, F32, 8, S(1, 1, 1, 1, 1, 1, 1, 2), nb_take(X, param(T, 1, I32, 2, S(2, 2)), 0),
             NB_ERR_SHAPE, "nb_take: x f32[1,1,1,1,1,1,1,2] with indices i32[2,2]",
             "rank-9 result");
    ERR_CASE(ctx, F32, 2, S(2, 0), nb_take(X, param(T, 1, I64, 1, S(3)), 1), NB_ERR_INDEX,
             "nb_take: axis 1 of x f32[2,0] is empty");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_take(X, NULL, 1), NB_ERR_MISUSE,
             "nb_take: input 1 is a NULL var");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- take_along_axis ---------------------------------------------------------------- */

static void test_take_along_axis(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const gcase cases[] = {
        {2, {3, 4}, 2, {3, 2}, {0, 3, -1, 9, -9, 2}, 1},
        {2, {1, 4}, 2, {3, 2}, {0, 3, -1, 9, -9, 2}, 1},
        {2, {3, 4}, 2, {1, 2}, {-2, 1}, 1},
        {2, {3, 4}, 2, {2, 4}, {0, 1, 2, 3, -1, -2, 5, -7}, 0},
        {2, {3, 4}, 2, {2, 4}, {0, 1, 2, 3, -1, -2, 5, -7}, -2},
        {3, {2, 3, 4}, 3, {2, 1, 4}, {0, 1, 2, -1, 2, 1, 0, 9}, 1},
        {3, {2, 3, 4}, 3, {1, 5, 1}, {0, 1, 2, -1, -3}, 1},
        {3, {2, 1, 4}, 3, {1, 3, 1}, {0, 5, -1}, 1},
        {2, {2, 0}, 2, {2, 0}, {0}, 1},
        {1, {5}, 1, {3}, {4, -6, 6}, 0},
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (int it = 0; it < 2; it++) {
            nb_dtype idt = it ? I64 : I32;
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                const gcase *g = &cases[c];
                int r = g->xr, ax = (g->axis + r) % r;
                int64_t os[NB_MAX_RANK];
                for (int d = 0; d < r; d++) {
                    os[d] = d == ax ? g->is[d] : g->xs[d] == 1 ? g->is[d] : g->xs[d];
                }
                nb_trace tr;
                begin(&tr, ctx);
                nb_var *x = param(&tr, 0, dt, r, g->xs);
                nb_var *ix = param(&tr, 1, idt, r, g->is);
                nb_var *v = nb_take_along_axis(x, ix, g->axis);
                expect_type(v, dt, r, os);
                void *in = pattern(dt, prod(r, g->xs), t);
                void *ib = index_buf(idt, prod(r, g->is), g->iv);
                void *out = run_graph(&tr, (const void *const[]){in, ib}, v);
                int64_t n = prod(r, os);
                int64_t *src = alloc_src(n);
                int64_t oi[NB_MAX_RANK], xi[NB_MAX_RANK], ii[NB_MAX_RANK];
                for (int64_t i = 0; i < n; i++) {
                    unravel(i, r, os, oi);
                    for (int d = 0; d < r; d++) {
                        ii[d] = g->is[d] == 1 ? 0 : oi[d];
                        xi[d] = g->xs[d] == 1 ? 0 : oi[d];
                    }
                    xi[ax] = ref_fix(g->iv[ravel(r, g->is, ii)], g->xs[ax]);
                    src[i] = ravel(r, g->xs, xi);
                }
                expect_map(out, in, es, n, src, NULL);
                free(src);
                free(out);
                free(ib);
                free(in);
                verify(&tr);
                nbi_trace_release(&tr);
            }
        }
    }
    ERR_CASE(ctx, F32, 2, S(3, 4), nb_take_along_axis(X, param(T, 1, I32, 1, S(3)), 1),
             NB_ERR_SHAPE, "nb_take_along_axis: indices i32[3] and x f32[3,4] differ in rank");
    ERR_CASE(ctx, F32, 2, S(3, 4), nb_take_along_axis(X, param(T, 1, F64, 2, S(3, 1)), 1),
             NB_ERR_DTYPE, "nb_take_along_axis: indices are f64[3,1]");
    ERR_CASE(ctx, F32, 2, S(3, 4), nb_take_along_axis(X, param(T, 1, I64, 2, S(2, 2)), 1),
             NB_ERR_SHAPE, "nb_take_along_axis: indices i64[2,2] and x f32[3,4]",
             "do not broadcast on axis 0 (2 vs 3)");
    ERR_CASE(ctx, F32, 2, S(2, 0), nb_take_along_axis(X, param(T, 1, I64, 2, S(2, 3)), 1),
             NB_ERR_INDEX, "nb_take_along_axis: axis 1 of x f32[2,0] is empty");
    ERR_CASE(ctx, F32, 2, S(3, 4), nb_take_along_axis(X, param(T, 1, I64, 2, S(3, 4)), -3),
             NB_ERR_INVALID, "nb_take_along_axis: axis -3 is out of range");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- one_hot ------------------------------------------------------------------------ */

static void test_one_hot(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t iv[6] = {0, 2, -1, 3, 1, 100};
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (int it = 0; it < 2; it++) {
            nb_dtype idt = it ? I64 : I32;
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *ix = param(&tr, 0, idt, 2, S(2, 3));
            nb_var *s = param(&tr, 1, idt, 0, NULL);
            nb_var *v = nb_one_hot(ix, 3, dt);
            expect_type(v, dt, 3, S(2, 3, 3));
            nb_var *v0 = nb_one_hot(s, 4, dt);
            expect_type(v0, dt, 1, S(4));
            nb_var *ve = nb_one_hot(ix, 0, dt);
            expect_type(ve, dt, 3, S(2, 3, 0));
            void *ib = index_buf(idt, 6, iv);
            void *sb = index_buf(idt, 1, (const int64_t[]){1});
            const void *params[2] = {ib, sb};
            void *out = run_graph(&tr, params, v);
            _Alignas(8) unsigned char want[18 * 8];
            for (int64_t i = 0; i < 18; i++) {
                put_value(dt, want, i, iv[i / 3] == i % 3 ? 1.0 : 0.0);
            }
            assert_memory_equal(out, want, 18 * es);
            free(out);
            out = run_graph(&tr, params, v0);
            for (int64_t i = 0; i < 4; i++) {
                put_value(dt, want, i, i == 1 ? 1.0 : 0.0);
            }
            assert_memory_equal(out, want, 4 * es);
            free(out);
            free(sb);
            free(ib);
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }
    ERR_CASE(ctx, F32, 1, S(2), nb_one_hot(X, 3, F32), NB_ERR_DTYPE,
             "nb_one_hot: indices are f32[2]", "i32 or i64");
    ERR_CASE(ctx, I32, 1, S(2), nb_one_hot(X, -1, F32), NB_ERR_INVALID,
             "nb_one_hot: depth -1 for indices i32[2]", ">= 0");
    ERR_CASE(ctx, I32, 1, S(2), nb_one_hot(X, 3, (nb_dtype)9), NB_ERR_DTYPE,
             "nb_one_hot: unknown dtype 9");
    ERR_CASE(ctx, I64, 8, S(1, 1, 1, 1, 1, 1, 1, 2), nb_one_hot(X, 3, BOOL), NB_ERR_SHAPE,
             "nb_one_hot: indices i64[1,1,1,1,1,1,1,2] already have 8 dims");
    ERR_CASE(ctx, I64, 1, S(2), nb_one_hot(X, INT64_MAX, F64), NB_ERR_OVERFLOW, "nb_one_hot");
    assert_null(nb_one_hot(NULL, 3, F32));
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- dynamic_slice ------------------------------------------------------------------ */

static int64_t clampi(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Rank-0 start params (alternately i32 and i64) with indices first..first+r-1. */
static void start_params(nb_trace *tr, int first, int r, nb_var **starts) {
    for (int d = 0; d < r; d++) {
        starts[d] = param(tr, first + d, d % 2 ? I64 : I32, 0, NULL);
    }
}

typedef struct dcase {
    int r;
    int64_t xs[3], sizes[3];
    int n_runs;
    int64_t st[4][3]; /* start values per run */
} dcase;

static void test_dynamic_slice(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const dcase cases[] = {
        {2, {4, 5}, {2, 3}, 4, {{1, 1}, {-3, 10}, {3, 3}, {INT32_MIN, INT64_MAX}}},
        {2, {4, 5}, {4, 5}, 2, {{5, 5}, {-1, 0}}},
        {2, {4, 5}, {0, 5}, 1, {{2, 0}}},
        {3, {3, 4, 5}, {2, 1, 3}, 2, {{1, 2, 1}, {2, 9, -9}}},
        {3, {3, 4, 5}, {3, 4, 1}, 1, {{0, 0, 4}}},
        {1, {6}, {1}, 3, {{0}, {5}, {-1}}},
        {0, {0}, {0}, 1, {{0}}},
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const dcase *dc = &cases[c];
            int r = dc->r;
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, r, dc->xs);
            nb_var *starts[3];
            start_params(&tr, 1, r, starts);
            nb_var *v = nb_dynamic_slice(x, r ? starts : NULL, r ? dc->sizes : NULL);
            expect_type(v, dt, r, dc->sizes);
            NBT_EQ_I64(v->op, NBI_OP_DYN_SLICE);
            NBT_EQ_I64(v->n_in, 1 + r);
            void *in = pattern(dt, prod(r, dc->xs), t);
            int64_t n = prod(r, dc->sizes);
            for (int run = 0; run < dc->n_runs; run++) {
                void *sb[3];
                const void *params[4] = {in};
                int64_t s0[3];
                for (int d = 0; d < r; d++) {
                    sb[d] = index_buf(d % 2 ? I64 : I32, 1, &dc->st[run][d]);
                    params[1 + d] = sb[d];
                    int64_t sv = d % 2 ? dc->st[run][d] : (int32_t)dc->st[run][d];
                    s0[d] = clampi(sv, 0, dc->xs[d] - dc->sizes[d]);
                }
                void *out = run_graph(&tr, params, v);
                int64_t *src = alloc_src(n);
                int64_t oi[3], xi[3];
                for (int64_t i = 0; i < n; i++) {
                    unravel(i, r, dc->sizes, oi);
                    for (int d = 0; d < r; d++) {
                        xi[d] = s0[d] + oi[d];
                    }
                    src[i] = ravel(r, dc->xs, xi);
                }
                expect_map(out, in, es, n, src, NULL);
                free(src);
                free(out);
                for (int d = 0; d < r; d++) {
                    free(sb[d]);
                }
            }
            free(in);
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }
    nb_var *st[2];
    ERR_CASE(ctx, F32, 2, S(4, 5),
             (st[0] = param(T, 1, I32, 0, NULL), st[1] = param(T, 2, F32, 0, NULL),
              nb_dynamic_slice(X, st, S(1, 1))),
             NB_ERR_DTYPE, "nb_dynamic_slice: start 1 is f32[]", "rank-0 i32 or i64");
    ERR_CASE(ctx, F32, 2, S(4, 5),
             (st[0] = param(T, 1, I32, 1, S(1)), st[1] = param(T, 2, I64, 0, NULL),
              nb_dynamic_slice(X, st, S(1, 1))),
             NB_ERR_DTYPE, "nb_dynamic_slice: start 0 is i32[1]");
    ERR_CASE(ctx, F32, 2, S(4, 5), (start_params(T, 1, 2, st), nb_dynamic_slice(X, st, S(5, 1))),
             NB_ERR_SHAPE, "nb_dynamic_slice: sizes [5,1] do not fit in x f32[4,5]",
             "size 5 on axis 0");
    ERR_CASE(ctx, F32, 2, S(4, 5), (start_params(T, 1, 2, st), nb_dynamic_slice(X, st, S(1, -1))),
             NB_ERR_SHAPE, "size -1 on axis 1", "between 0 and the dim (5)");
    ERR_CASE(ctx, F32, 2, S(4, 5), nb_dynamic_slice(X, NULL, S(1, 1)), NB_ERR_MISUSE,
             "nb_dynamic_slice: NULL starts for x f32[4,5]");
    ERR_CASE(ctx, F32, 2, S(4, 5), (start_params(T, 1, 2, st), nb_dynamic_slice(X, st, NULL)),
             NB_ERR_MISUSE, "nb_dynamic_slice: NULL sizes for x f32[4,5]");
    ERR_CASE(ctx, F32, 2, S(4, 5),
             (st[0] = param(T, 1, I32, 0, NULL), st[1] = NULL, nb_dynamic_slice(X, st, S(1, 1))),
             NB_ERR_MISUSE, "nb_dynamic_slice: input 2 is a NULL var");
    assert_null(nb_dynamic_slice(NULL, NULL, NULL));
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- dynamic_update_slice ----------------------------------------------------------- */

typedef struct ucase {
    int r;
    int64_t xs[3], us[3];
    int n_runs;
    int64_t st[3][3];
} ucase;

static void test_dynamic_update_slice(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    static const ucase cases[] = {
        {2, {4, 5}, {2, 3}, 3, {{1, 1}, {-1, 7}, {3, 3}}},
        {2, {4, 5}, {0, 3}, 1, {{1, 1}}},
        {2, {4, 5}, {4, 5}, 1, {{2, -2}}},
        {3, {3, 4, 5}, {1, 4, 2}, 2, {{1, 0, 3}, {9, 9, 9}}},
        {1, {6}, {1}, 2, {{5}, {-100}}},
        {0, {0}, {0}, 1, {{0}}},
    };
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const ucase *uc = &cases[c];
            int r = uc->r;
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, r, uc->xs);
            nb_var *u = param(&tr, 1, dt, r, uc->us);
            nb_var *starts[3];
            start_params(&tr, 2, r, starts);
            nb_var *v = nb_dynamic_update_slice(x, u, r ? starts : NULL);
            expect_type(v, dt, r, uc->xs);
            NBT_EQ_I64(v->n_in, 2 + r);
            int64_t counts[2] = {prod(r, uc->xs), prod(r, uc->us)}, offs[2];
            void *bufs[2] = {pattern(dt, counts[0], t), pattern(dt, counts[1], t + 7)};
            void *all = join(dt, 2, bufs, counts, offs);
            for (int run = 0; run < uc->n_runs; run++) {
                void *sb[3];
                const void *params[5] = {bufs[0], bufs[1]};
                int64_t s0[3];
                for (int d = 0; d < r; d++) {
                    sb[d] = index_buf(d % 2 ? I64 : I32, 1, &uc->st[run][d]);
                    params[2 + d] = sb[d];
                    s0[d] = clampi(uc->st[run][d], 0, uc->xs[d] - uc->us[d]);
                }
                void *out = run_graph(&tr, params, v);
                int64_t n = counts[0];
                int64_t *src = alloc_src(n);
                int64_t oi[3], ui[3];
                for (int64_t i = 0; i < n; i++) {
                    unravel(i, r, uc->xs, oi);
                    bool inside = counts[1] > 0;
                    for (int d = 0; d < r; d++) {
                        ui[d] = oi[d] - s0[d];
                        inside = inside && ui[d] >= 0 && ui[d] < uc->us[d];
                    }
                    src[i] = inside ? offs[1] + ravel(r, uc->us, ui) : i;
                }
                expect_map(out, all, es, n, src, NULL);
                free(src);
                free(out);
                for (int d = 0; d < r; d++) {
                    free(sb[d]);
                }
            }
            free(all);
            free(bufs[0]);
            free(bufs[1]);
            verify(&tr);
            nbi_trace_release(&tr);
        }
    }
    nb_var *st[2];
    ERR_CASE(
        ctx, F32, 2, S(4, 5),
        (start_params(T, 2, 2, st), nb_dynamic_update_slice(X, param(T, 1, F64, 2, S(2, 3)), st)),
        NB_ERR_DTYPE, "nb_dynamic_update_slice: update f64[2,3] and x f32[4,5] differ");
    ERR_CASE(ctx, F32, 2, S(4, 5),
             (start_params(T, 2, 2, st), nb_dynamic_update_slice(X, param(T, 1, F32, 1, S(2)), st)),
             NB_ERR_SHAPE, "nb_dynamic_update_slice: update f32[2] does not fit in x f32[4,5]");
    ERR_CASE(
        ctx, F32, 2, S(4, 5),
        (start_params(T, 2, 2, st), nb_dynamic_update_slice(X, param(T, 1, F32, 2, S(5, 1)), st)),
        NB_ERR_SHAPE, "update f32[5,1] does not fit in x f32[4,5]", "no larger");
    ERR_CASE(ctx, F32, 2, S(4, 5),
             (st[0] = param(T, 2, F32, 0, NULL), st[1] = param(T, 3, I64, 0, NULL),
              nb_dynamic_update_slice(X, param(T, 1, F32, 2, S(1, 1)), st)),
             NB_ERR_DTYPE, "nb_dynamic_update_slice: start 0 is f32[]");
    ERR_CASE(ctx, F32, 2, S(4, 5), nb_dynamic_update_slice(X, param(T, 1, F32, 2, S(1, 1)), NULL),
             NB_ERR_MISUSE, "nb_dynamic_update_slice: NULL starts");
    ERR_CASE(ctx, F32, 2, S(4, 5), nb_dynamic_update_slice(X, NULL, NULL), NB_ERR_MISUSE,
             "nb_dynamic_update_slice: input 1 is a NULL var");
    assert_null(nb_dynamic_update_slice(NULL, NULL, NULL));
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- composites: expand_dims, squeeze, stack ---------------------------------------- */

static void test_expand_dims(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        nb_trace tr;
        begin(&tr, ctx);
        nb_var *x = param(&tr, 0, dt, 2, S(2, 3));
        nb_var *s = param(&tr, 1, dt, 0, NULL);
        expect_type(nb_expand_dims(x, 0), dt, 3, S(1, 2, 3));
        expect_type(nb_expand_dims(x, 1), dt, 3, S(2, 1, 3));
        expect_type(nb_expand_dims(x, 2), dt, 3, S(2, 3, 1));
        expect_type(nb_expand_dims(x, -1), dt, 3, S(2, 3, 1));
        expect_type(nb_expand_dims(x, -2), dt, 3, S(2, 1, 3));
        expect_type(nb_expand_dims(x, -3), dt, 3, S(1, 2, 3));
        expect_type(nb_expand_dims(s, 0), dt, 1, S(1));
        nb_var *v = nb_expand_dims(nb_expand_dims(s, -1), 1);
        expect_type(v, dt, 2, S(1, 1));
        NBT_EQ_I64(v->op, NBI_OP_RESHAPE);
        nb_var *w = nb_expand_dims(x, 1);
        void *xb = pattern(dt, 6, t), *sb = pattern(dt, 1, t + 1);
        void *out = run_graph(&tr, (const void *const[]){xb, sb}, w);
        assert_memory_equal(out, xb, 6 * nb_dtype_size(dt));
        free(out);
        out = run_graph(&tr, (const void *const[]){xb, sb}, v);
        assert_memory_equal(out, sb, nb_dtype_size(dt));
        free(out);
        free(sb);
        free(xb);
        verify(&tr);
        nbi_trace_release(&tr);
    }
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_expand_dims(X, 3), NB_ERR_INVALID,
             "nb_expand_dims: axis 3 is out of range for f32[2,3]", "-3 to 2");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_expand_dims(X, -4), NB_ERR_INVALID,
             "nb_expand_dims: axis -4");
    ERR_CASE(ctx, F32, 0, NULL, nb_expand_dims(X, 1), NB_ERR_INVALID,
             "nb_expand_dims: axis 1 is out of range for f32[]", "-1 to 0");
    ERR_CASE(ctx, F32, 8, S(1, 1, 1, 1, 1, 1, 1, 2), nb_expand_dims(X, 0), NB_ERR_SHAPE,
             "nb_expand_dims: f32[1,1,1,1,1,1,1,2] already has 8 dims");
    assert_null(nb_expand_dims(NULL, 0));
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_squeeze(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        nb_trace tr;
        begin(&tr, ctx);
        nb_var *x = param(&tr, 0, dt, 4, S(1, 2, 1, 3));
        nb_var *y = param(&tr, 1, dt, 2, S(2, 3));
        nb_var *s = param(&tr, 2, dt, 0, NULL);
        nb_var *o = param(&tr, 3, dt, 2, S(1, 1));
        nb_var *all = nb_squeeze(x, NULL, 0);
        expect_type(all, dt, 2, S(2, 3));
        NBT_EQ_I64(all->op, NBI_OP_RESHAPE);
        expect_type(nb_squeeze(x, NULL, 3), dt, 2, S(2, 3)); /* NULL: n_axes ignored */
        expect_type(nb_squeeze(x, (const int[]){0}, 1), dt, 3, S(2, 1, 3));
        expect_type(nb_squeeze(x, (const int[]){2}, 1), dt, 3, S(1, 2, 3));
        expect_type(nb_squeeze(x, (const int[]){-2, 0}, 2), dt, 2, S(2, 3));
        expect_type(nb_squeeze(o, NULL, 0), dt, 0, NULL);
        expect_type(nb_squeeze(o, (const int[]){-1}, 1), dt, 1, S(1));
        int32_t n0 = tr.g.n_nodes;
        assert_ptr_equal(nb_squeeze(y, NULL, 0), y);
        assert_ptr_equal(nb_squeeze(s, NULL, 0), s);
        assert_ptr_equal(nb_squeeze(x, (const int[]){0}, 0), x);
        NBT_EQ_I64(tr.g.n_nodes, n0);
        void *xb = pattern(dt, 6, t);
        void *out = run_graph(&tr, (const void *const[]){xb, xb, xb, xb}, all);
        assert_memory_equal(out, xb, 6 * nb_dtype_size(dt));
        free(out);
        free(xb);
        verify(&tr);
        nbi_trace_release(&tr);
    }
    ERR_CASE(ctx, F32, 4, S(1, 2, 1, 3), nb_squeeze(X, (const int[]){1}, 1), NB_ERR_SHAPE,
             "nb_squeeze: axis 1 of f32[1,2,1,3] has size 2", "only size-1 axes");
    ERR_CASE(ctx, F32, 4, S(1, 2, 1, 3), nb_squeeze(X, (const int[]){0, -4}, 2), NB_ERR_INVALID,
             "nb_squeeze: axis 0 of f32[1,2,1,3] is listed twice");
    ERR_CASE(ctx, F32, 4, S(1, 2, 1, 3), nb_squeeze(X, (const int[]){4}, 1), NB_ERR_INVALID,
             "nb_squeeze: axis 4 is out of range for f32[1,2,1,3]");
    ERR_CASE(ctx, F32, 1, S(1), nb_squeeze(X, (const int[]){0, 0}, 2), NB_ERR_INVALID,
             "nb_squeeze: 2 axes listed for f32[1]");
    ERR_CASE(ctx, F32, 1, S(1), nb_squeeze(X, (const int[]){0}, -1), NB_ERR_INVALID,
             "nb_squeeze: -1 axes listed");
    assert_null(nb_squeeze(NULL, NULL, 0));
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_stack(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int t = 0; t < N_DTYPES; t++) {
        nb_dtype dt = k_dtypes[t];
        size_t es = nb_dtype_size(dt);
        const int64_t xs[2] = {2, 3};
        for (int axis = -3; axis <= 2; axis++) {
            int ax = axis < 0 ? axis + 3 : axis;
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *in[3];
            void *bufs[3];
            int64_t counts[3] = {6, 6, 6}, offs[3];
            for (int j = 0; j < 3; j++) {
                in[j] = param(&tr, j, dt, 2, xs);
                bufs[j] = pattern(dt, 6, t + 3 * j);
            }
            nb_var *v = nb_stack(3, in, axis);
            int64_t os[3];
            for (int d = 0, k = 0; d < 3; d++) {
                os[d] = d == ax ? 3 : xs[k++];
            }
            expect_type(v, dt, 3, os);
            NBT_EQ_I64(v->op, NBI_OP_CONCAT);
            void *out = run_graph(&tr, (const void *const *)bufs, v);
            void *all = join(dt, 3, bufs, counts, offs);
            int64_t src[18], oi[3], xi[2];
            for (int64_t i = 0; i < 18; i++) {
                unravel(i, 3, os, oi);
                for (int d = 0, k = 0; d < 3; d++) {
                    if (d != ax) {
                        xi[k++] = oi[d];
                    }
                }
                src[i] = offs[oi[ax]] + ravel(2, xs, xi);
            }
            expect_map(out, all, es, 18, src, NULL);
            free(all);
            free(out);
            for (int j = 0; j < 3; j++) {
                free(bufs[j]);
            }
            verify(&tr);
            nbi_trace_release(&tr);
        }
        /* Scalars, and one input. */
        nb_trace tr;
        begin(&tr, ctx);
        nb_var *sc[4];
        void *bufs[4];
        for (int j = 0; j < 4; j++) {
            sc[j] = param(&tr, j, dt, 0, NULL);
            bufs[j] = pattern(dt, 1, t + j);
        }
        nb_var *v = nb_stack(4, sc, 0);
        expect_type(v, dt, 1, S(4));
        nb_var *one = nb_stack(1, sc, -1);
        expect_type(one, dt, 1, S(1));
        void *out = run_graph(&tr, (const void *const *)bufs, v);
        for (int j = 0; j < 4; j++) {
            assert_memory_equal((unsigned char *)out + (size_t)j * es, bufs[j], es);
        }
        free(out);
        for (int j = 0; j < 4; j++) {
            free(bufs[j]);
        }
        verify(&tr);
        nbi_trace_release(&tr);
    }
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_stack(2, ((nb_var *[]){X, param(T, 1, F32, 2, S(3, 2))}), 0),
             NB_ERR_SHAPE, "nb_stack: input 1 is f32[3,2] but input 0 is f32[2,3]",
             "one shape and dtype");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_stack(2, ((nb_var *[]){X, param(T, 1, I32, 2, S(2, 3))}), 0),
             NB_ERR_DTYPE, "nb_stack: input 1 is i32[2,3] but input 0 is f32[2,3]");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_stack(2, ((nb_var *[]){X, X}), 3), NB_ERR_INVALID,
             "nb_stack: axis 3 is out of range for inputs f32[2,3]", "-3 to 2");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_stack(2, ((nb_var *[]){X, X}), -4), NB_ERR_INVALID,
             "nb_stack: axis -4");
    ERR_CASE(ctx, F32, 2, S(2, 3), nb_stack(2, ((nb_var *[]){X, NULL}), 0), NB_ERR_MISUSE,
             "nb_stack: input 1 is a NULL var");
    ERR_CASE(ctx, F32, 8, S(1, 1, 1, 1, 1, 1, 1, 2), nb_stack(2, ((nb_var *[]){X, X}), 0),
             NB_ERR_SHAPE, "nb_stack: the inputs f32[1,1,1,1,1,1,1,2] already have 8 dims");
    assert_null(nb_stack(0, NULL, 0));
    assert_null(nb_stack(2, ((nb_var *[]){NULL, NULL}), 0));
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- sticky errors, poison, NULL and foreign vars ----------------------------------- */

/* Every builder of the family on x (f32[2,3]) and integer vars; returns how many of the
 * results are poison. */
static int poison_count(nb_trace *tr, nb_var *x, nb_var *i0, nb_var *iv) {
    nb_var *st[2] = {i0, i0};
    nb_var *r[] = {
        nb_reshape(x, 1, S(6)),
        nb_broadcast_to(x, 3, S(4, 2, 3)),
        nb_transpose(x, NULL),
        nb_slice(x, S(0, 0), S(1, 2), NULL),
        nb_concatenate(2, ((nb_var *[]){x, x}), 0),
        nb_pad(x, S(1, 1), S(1, 1), 0),
        nb_take(x, iv, 1),
        nb_take_along_axis(x, nb_reshape(iv, 2, S(1, 2)), 1),
        nb_one_hot(iv, 4, NB_DTYPE_F32),
        nb_dynamic_slice(x, st, S(1, 1)),
        nb_dynamic_update_slice(x, x, st),
        nb_expand_dims(x, 0),
        nb_squeeze(nb_reshape(x, 3, S(2, 1, 3)), NULL, 0),
        nb_stack(2, ((nb_var *[]){x, x}), 0),
    };
    (void)tr;
    int n = 0;
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        assert_non_null(r[i]);
        n += nb_var_is_poison(r[i]);
    }
    return n;
}

static void test_sticky_poison_null(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 2, S(2, 3));
    nb_var *i0 = param(&tr, 1, I64, 0, NULL);
    nb_var *iv = param(&tr, 2, I32, 1, S(2));
    NBT_EQ_I64(poison_count(&tr, x, i0, iv), 0);
    NBT_OK(ctx, nb_trace_status(&tr));
    verify(&tr);

    /* The first error sticks: every later op is poison, and the message stays. */
    nb_var *bad = nb_reshape(x, 1, S(7));
    EXPECT_FAIL(&tr, bad, NB_ERR_SHAPE, "nb_reshape");
    char first[512];
    snprintf(first, sizeof first, "%s", nb_ctx_errmsg(ctx));
    int32_t n0 = tr.g.n_nodes;
    NBT_EQ_I64(poison_count(&tr, x, i0, iv), 14);
    NBT_EQ_I64(tr.g.n_nodes, n0);
    NBT_STREQ(nb_ctx_errmsg(ctx), first);
    /* Poison in, poison out. */
    assert_ptr_equal(nb_reshape(bad, 1, S(6)), tr.poison);
    assert_ptr_equal(nb_stack(2, ((nb_var *[]){x, bad}), 0), tr.poison);
    NBT_STREQ(nb_ctx_errmsg(ctx), first);
    nbi_trace_release(&tr);

    /* NULL vars without any trace give NULL (nothing to record the error on). */
    assert_null(nb_reshape(NULL, 1, S(6)));
    assert_null(nb_broadcast_to(NULL, 1, S(6)));
    assert_null(nb_transpose(NULL, NULL));
    assert_null(nb_slice(NULL, NULL, NULL, NULL));
    assert_null(nb_concatenate(1, ((nb_var *[]){NULL}), 0));
    assert_null(nb_pad(NULL, NULL, NULL, 0));
    assert_null(nb_take(NULL, NULL, 0));
    assert_null(nb_take_along_axis(NULL, NULL, 0));

    /* Vars of another trace. */
    nb_trace t1, t2;
    begin(&t1, ctx);
    begin(&t2, ctx);
    nb_var *a = param(&t1, 0, F32, 2, S(2, 3));
    nb_var *b = param(&t2, 0, F32, 2, S(2, 3));
    nb_var *ib = param(&t2, 1, I32, 1, S(2));
    EXPECT_FAIL(&t1, nb_concatenate(2, ((nb_var *[]){a, b}), 0), NB_ERR_INVALID,
                "nb_concatenate: input 1 belongs to another trace");
    nbi_trace_release(&t1);
    begin(&t1, ctx);
    a = param(&t1, 0, F32, 2, S(2, 3));
    EXPECT_FAIL(&t1, nb_stack(2, ((nb_var *[]){a, b}), 0), NB_ERR_INVALID,
                "nb_stack: input 1 belongs to another trace");
    nbi_trace_release(&t1);
    begin(&t1, ctx);
    a = param(&t1, 0, F32, 2, S(2, 3));
    EXPECT_FAIL(&t1, nb_take(a, ib, 0), NB_ERR_INVALID, "nb_take: input 1 belongs to another");
    NBT_OK(ctx, nb_trace_status(&t2));
    nbi_trace_release(&t1);
    nbi_trace_release(&t2);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Shape ops keep a weak scalar weak (JAX's weak types); one_hot never is. */
static void test_weak(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *w = nb_scalar(&tr, 2.0);
    nb_var *x = param(&tr, 0, F32, 1, S(3));
    nb_var *b = nb_broadcast_to(w, 2, S(2, 3));
    NBT_TRUE(b->flags & NBI_NODE_WEAK);
    NBT_TRUE(nb_reshape(b, 1, S(6))->flags & NBI_NODE_WEAK);
    NBT_TRUE(nb_transpose(b, NULL)->flags & NBI_NODE_WEAK);
    NBT_TRUE(nb_slice(b, S(0, 1), S(2, 3), NULL)->flags & NBI_NODE_WEAK);
    NBT_TRUE(nb_pad(b, S(1, 0), S(0, 0), 0)->flags & NBI_NODE_WEAK);
    NBT_TRUE(nb_concatenate(2, ((nb_var *[]){b, b}), 0)->flags & NBI_NODE_WEAK);
    NBT_TRUE(nb_stack(2, ((nb_var *[]){w, w}), 0)->flags & NBI_NODE_WEAK);
    nb_var *xb = nb_broadcast_to(x, 2, S(2, 3));
    NBT_TRUE(!(xb->flags & NBI_NODE_WEAK));
    NBT_TRUE(!(nb_concatenate(2, ((nb_var *[]){b, xb}), 0)->flags & NBI_NODE_WEAK));
    NBT_OK(ctx, nb_trace_status(&tr));
    /* A weak f32 broadcast still adopts an f64 partner's dtype in a binary op. */
    nb_var *y = param(&tr, 1, F64, 2, S(2, 3));
    nb_var *sum = nb_add(y, b);
    expect_type(sum, F64, 2, S(2, 3));
    nbi_trace_release(&tr);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Inference re-run on stored attributes (as the IR verifier does) rejects attributes no
 * builder makes: the checks that guard the kernels hold on their own. */
static nb_status reinfer(nb_ctx *ctx, const nb_var *v, void (*corrupt)(nb_var *)) {
    nb_var p = *v;
    corrupt(&p);
    nb_trace scratch;
    memset(&scratch, 0, sizeof scratch);
    scratch.ctx = ctx;
    scratch.fn_name = "test";
    return nbi_op_get((nbi_op)p.op)->infer(&scratch, &p);
}

static void bad_slice_start(nb_var *p) {
    p->at.a[0] = -1; /* reads index -1 */
}
static void bad_slice_past_end(nb_var *p) {
    p->at.a[1] = 7;
}
static void bad_slice_step(nb_var *p) {
    p->at.c[1] = 0;
}
static void bad_starts(nb_var *p) {
    p->n_in = 2;
}
static void bad_perm(nb_var *p) {
    p->at.n_axes = 1;
}
static void bad_rank(nb_var *p) {
    p->at.n_axes = 9;
}
static void bad_neg_rank(nb_var *p) {
    p->at.n_axes = -1;
}

static void test_infer_rejects_bad_attrs(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 2, S(4, 5));
    nb_var *i0 = param(&tr, 1, I32, 0, NULL);
    nb_var *sl = nb_slice(x, S(1, 0), S(3, 5), S(1, 2));
    nb_var *ds = nb_dynamic_slice(x, ((nb_var *[]){i0, i0}), S(1, 1));
    nb_var *tp = nb_transpose(x, NULL);
    nb_var *rs = nb_reshape(x, 1, S(20));
    nb_var *bc = nb_broadcast_to(x, 3, S(2, 4, 5));
    NBT_OK(ctx, nb_trace_status(&tr));
    verify(&tr);
    NBT_STATUS(ctx, NB_ERR_INTERNAL, reinfer(ctx, sl, bad_slice_start));
    NBT_ERRMSG_HAS(ctx, "nb_slice: axis 0 of f32[4,5] has unnormalised bounds -1:");
    NBT_STATUS(ctx, NB_ERR_INTERNAL, reinfer(ctx, sl, bad_slice_past_end));
    NBT_ERRMSG_HAS(ctx, "axis 1 of f32[4,5]");
    NBT_STATUS(ctx, NB_ERR_INVALID, reinfer(ctx, sl, bad_slice_step));
    NBT_ERRMSG_HAS(ctx, "nb_slice: step 0 on axis 1");
    NBT_STATUS(ctx, NB_ERR_INVALID, reinfer(ctx, ds, bad_starts));
    NBT_ERRMSG_HAS(ctx, "nb_dynamic_slice: 1 start vars for x f32[4,5]; pass exactly one per axis");
    NBT_STATUS(ctx, NB_ERR_INVALID, reinfer(ctx, tp, bad_perm));
    NBT_ERRMSG_HAS(ctx, "nb_transpose: perm [1] is not a permutation");
    NBT_STATUS(ctx, NB_ERR_SHAPE, reinfer(ctx, rs, bad_rank));
    NBT_ERRMSG_HAS(ctx, "nb_reshape: target rank 9");
    NBT_STATUS(ctx, NB_ERR_SHAPE, reinfer(ctx, bc, bad_neg_rank));
    NBT_ERRMSG_HAS(ctx, "nb_broadcast_to: target rank -1");
    nbi_trace_release(&tr);

    /* The concatenated axis overflows int64. */
    ERR_CASE(ctx, BOOL, 1, S(INT64_C(1) << 62), nb_concatenate(2, ((nb_var *[]){X, X}), 0),
             NB_ERR_OVERFLOW, "nb_concatenate: the result's axis 0 is too long");
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- gradients through the public API ----------------------------------------------
 *
 * Each case is a small function of one or two f64 arrays, built from the family's ops. It
 * is checked through nb_vjp, nb_jvp and nb_grad (include/nabla/ad.h) against central finite
 * differences of the forward function called through nb_fn_call at perturbed inputs (step
 * h = 1e-6 max(1, |x_k|), tolerance 1e-7 relative to max(1, |value|)):
 *   - vjp: ct_x for a random cotangent u, element by element against <u, (f(x + h e_k) -
 *     f(x - h e_k)) / 2h>;
 *   - jvp: the output tangent for a random tangent v against (f(x + h v) - f(x - h v)) / 2h;
 *   - grad of <u, f(x)> (u passed as a second, non-differentiated argument) equal to the
 *     vjp's ct_x;
 *   - <u, J v> = <J^T u, v> between the two modes (to 1e-12);
 *   - second order: jvp(grad(sum(u sin f(x)))) along v against central differences of
 *     that gradient (the rules' own IR differentiates again);
 *   - every cotangent and tangent has the dtype and shape of its primal.
 * Cases at a kink (ties of max/min) give exact expected values instead of differences. */

typedef nb_var *(*gfn)(nb_trace *tr, nb_var *const *x);

typedef struct adcase {
    const char *name;
    gfn f;
    int n_in;
    int rank[2];
    int64_t shape[2][4];
    const double *data[2]; /* fixed inputs (ties, zeros), or NULL for random values */
    const double *want[2]; /* exact expected ct_x for the all-ones cotangent (kinks), or NULL */
} adcase;

static double g_fd_err; /* the largest FD error seen, relative to max(1, |value|) */
static int g_fd_checks;

static gfn fn_of(const nb_tree *self) {
    nb_fnptr p = NULL;
    const char *name = NULL;
    if (nb_tree_get_fnref(self, &p, &name) != NB_OK) {
        return NULL;
    }
    return (gfn)p;
}

/* f(args): args = (x0[, x1]). */
static nb_status body_f(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    gfn f = fn_of(self);
    nb_var *x[2] = {nb_get(tr, args, "[0]"), NULL};
    if (nb_tree_len(args) > 1) {
        x[1] = nb_get(tr, args, "[1]");
    }
    return nb_return(f(tr, x), out);
}

/* <u, f(x)>: args = ((x0[, x1]), u). */
static nb_status body_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    gfn f = fn_of(self);
    const nb_tree *xs = nb_tree_child(args, 0);
    nb_var *x[2] = {nb_get(tr, args, "[0][0]"), NULL};
    if (nb_tree_len(xs) > 1) {
        x[1] = nb_get(tr, args, "[0][1]");
    }
    nb_var *u = nb_get(tr, args, "[1]");
    return nb_return(nb_sum(nb_mul(f(tr, x), u), NULL, 0, false), out);
}

static nb_tree *leaf_f64(nb_ctx *ctx, int rank, const int64_t *shape, const double *d) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F64, rank, shape, d, &a));
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* The f64 array at path of t, checked against rank/shape, copied into d (n elements). */
static void read_f64(const nb_tree *t, const char *path, int rank, const int64_t *shape,
                     double *d) {
    const nb_tree *leaf = NULL;
    if (nb_tree_lookup(t, path, &leaf) != NB_OK || nb_tree_get_array(leaf) == NULL) {
        fail_msg("no array at '%s'", path);
    }
    const nb_array *a = nb_tree_get_array(leaf);
    NBT_EQ_I64(nb_array_dtype(a), NB_DTYPE_F64);
    NBT_EQ_I64(nb_array_rank(a), rank);
    for (int i = 0; i < rank; i++) {
        NBT_EQ_I64(nb_array_shape(a)[i], shape[i]);
    }
    int64_t n = nb_array_size(a);
    if (n > 0) {
        memcpy(d, nb_array_data(a), (size_t)n * sizeof(double));
    }
}

typedef struct gctx {
    nb_ctx *ctx;
    const adcase *c;
    nb_fn *f;
    int64_t nx[2], ny;
    int yrank;
    int64_t yshape[NB_MAX_RANK];
} gctx;

static nb_tree *args_of(gctx *g, double *const *x) {
    nb_tree *items[2] = {NULL, NULL};
    for (int i = 0; i < g->c->n_in; i++) {
        items[i] = leaf_f64(g->ctx, g->c->rank[i], g->c->shape[i], x[i]);
    }
    return nbt_tuple_take(g->ctx, g->c->n_in, items);
}

/* y = f(x) into y (g->ny elements). */
static void eval_f(gctx *g, double *const *x, double *y) {
    nb_tree *args = args_of(g, x), *out = NULL;
    NBT_OK(g->ctx, nb_fn_call(g->f, args, &out));
    read_f64(out, "", g->yrank, g->yshape, y);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
}

static void fd_expect(const char *what, const char *name, int64_t k, double got, double want,
                      double tol) {
    double scale = fmax(1.0, fmax(fabs(got), fabs(want)));
    double e = fabs(got - want) / scale;
    g_fd_checks++;
    if (e > g_fd_err) {
        g_fd_err = e;
    }
    if (!(e <= tol)) {
        fail_msg("%s: %s[%lld] = %.17g, expected %.17g (relative error %.3g > %.3g)", name, what,
                 (long long)k, got, want, e, tol);
    }
}

/* A deterministic sequence in [-1, 1) (a 64-bit LCG). */
static uint64_t g_grng = 987654321;
static double rnd_g(void) {
    g_grng = g_grng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(g_grng >> 11) / 4503599627370496.0 - 1.0;
}

/* sum(u * sin(f(x))): args = ((x0[, x1]), u); its Hessian is not zero where f is linear. */
static nb_status body_loss2(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    gfn f = fn_of(self);
    const nb_tree *xs = nb_tree_child(args, 0);
    nb_var *x[2] = {nb_get(tr, args, "[0][0]"), NULL};
    if (nb_tree_len(xs) > 1) {
        x[1] = nb_get(tr, args, "[0][1]");
    }
    nb_var *u = nb_get(tr, args, "[1]");
    return nb_return(nb_sum(nb_mul(nb_sin(f(tr, x)), u), NULL, 0, false), out);
}

/* grad(loss2) at (x, u) into gx[i]. */
static void eval_grad2(gctx *g, nb_fn *grad2, double *const *x, const double *u, double **gx) {
    nb_tree *items[2] = {args_of(g, x), leaf_f64(g->ctx, g->yrank, g->yshape, u)};
    nb_tree *args = nbt_tuple_take(g->ctx, 2, items), *out = NULL;
    NBT_OK(g->ctx, nb_fn_call(grad2, args, &out));
    for (int i = 0; i < g->c->n_in; i++) {
        char path[16];
        snprintf(path, sizeof path, "[%d]", i);
        read_f64(out, path, g->c->rank[i], g->c->shape[i], gx[i]);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
}

/* Second order: the Hessian-vector product jvp(grad(loss2)) along v against central
 * differences of grad(loss2) at x +- h v (xs, xm): the rules' IR differentiates again. */
static void check_second_order(gctx *g, const nb_tree *self, double *const *x, const double *u,
                               double *const *v, double *const *xs, double *const *xm, double h) {
    const adcase *c = g->c;
    nb_fn *loss2 = NULL, *grad2 = NULL, *hvp = NULL;
    NBT_OK(g->ctx, nb_fn_create(g->ctx, c->name, body_loss2, self, &loss2));
    NBT_OK(g->ctx, nb_grad(loss2, NULL, &grad2));
    NBT_OK(g->ctx, nb_jvp(grad2, &hvp));
    double *hv[2] = {NULL, NULL}, *gp[2] = {NULL, NULL}, *gm[2] = {NULL, NULL};
    for (int i = 0; i < c->n_in; i++) {
        size_t b = (size_t)(g->nx[i] > 0 ? g->nx[i] : 1) * sizeof(double);
        hv[i] = malloc(b);
        gp[i] = malloc(b);
        gm[i] = malloc(b);
        assert_true(hv[i] && gp[i] && gm[i]);
    }
    nb_tree *vt[2] = {NULL, NULL}, *ut = NULL;
    for (int i = 0; i < c->n_in; i++) {
        vt[i] = leaf_f64(g->ctx, c->rank[i], c->shape[i], v[i]);
    }
    NBT_OK(g->ctx, nb_tree_null(g->ctx, &ut));
    nb_tree *prim[2] = {args_of(g, x), leaf_f64(g->ctx, g->yrank, g->yshape, u)};
    nb_tree *tang[2] = {nbt_tuple_take(g->ctx, c->n_in, vt), ut};
    nb_tree *items[2] = {nbt_tuple_take(g->ctx, 2, prim), nbt_tuple_take(g->ctx, 2, tang)};
    nb_tree *args = nbt_tuple_take(g->ctx, 2, items), *out = NULL;
    NBT_OK(g->ctx, nb_fn_call(hvp, args, &out));
    for (int i = 0; i < c->n_in; i++) {
        char path[16];
        snprintf(path, sizeof path, "[1][%d]", i);
        read_f64(out, path, c->rank[i], c->shape[i], hv[i]);
    }
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    eval_grad2(g, grad2, xs, u, gp);
    eval_grad2(g, grad2, xm, u, gm);
    for (int i = 0; i < c->n_in; i++) {
        for (int64_t k = 0; k < g->nx[i]; k++) {
            fd_expect("Hv", c->name, k, hv[i][k], (gp[i][k] - gm[i][k]) / (2 * h), 1e-7);
        }
        free(hv[i]);
        free(gp[i]);
        free(gm[i]);
    }
    nb_fn_destroy(hvp);
    nb_fn_destroy(grad2);
    nb_fn_destroy(loss2);
}

static void check_grad_case(const adcase *c) {
    gctx g;
    memset(&g, 0, sizeof g);
    g.ctx = nbt_ctx();
    g.c = c;
    nb_tree *self = NULL;
    NBT_OK(g.ctx, nb_tree_fnref(g.ctx, (nb_fnptr)c->f, c->name, &self));
    nb_fn *loss = NULL, *vjp = NULL, *jvp = NULL, *grad = NULL;
    NBT_OK(g.ctx, nb_fn_create(g.ctx, c->name, body_f, self, &g.f));
    NBT_OK(g.ctx, nb_fn_create(g.ctx, c->name, body_loss, self, &loss));
    NBT_OK(g.ctx, nb_vjp(g.f, &vjp));
    NBT_OK(g.ctx, nb_jvp(g.f, &jvp));
    NBT_OK(g.ctx, nb_grad(loss, NULL, &grad));

    double *x[2] = {NULL, NULL}, *v[2] = {NULL, NULL}, *ct[2] = {NULL, NULL}, *gr[2] = {NULL, NULL};
    for (int i = 0; i < c->n_in; i++) {
        g.nx[i] = 1;
        for (int d = 0; d < c->rank[i]; d++) {
            g.nx[i] *= c->shape[i][d];
        }
        size_t b = (size_t)(g.nx[i] > 0 ? g.nx[i] : 1) * sizeof(double);
        x[i] = malloc(b);
        v[i] = malloc(b);
        ct[i] = malloc(b);
        gr[i] = malloc(b);
        assert_true(x[i] && v[i] && ct[i] && gr[i]);
        for (int64_t k = 0; k < g.nx[i]; k++) {
            x[i][k] = c->data[i] ? c->data[i][k] : 2.0 * rnd_g();
            v[i][k] = rnd_g();
        }
    }
    /* the output's signature, from one forward call */
    {
        nb_tree *args = args_of(&g, x), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(g.f, args, &out));
        const nb_array *y = nb_tree_get_array(out);
        assert_non_null(y);
        g.yrank = nb_array_rank(y);
        memcpy(g.yshape, nb_array_shape(y), (size_t)g.yrank * sizeof(int64_t));
        g.ny = nb_array_size(y);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    size_t yb = (size_t)(g.ny > 0 ? g.ny : 1) * sizeof(double);
    double *u = malloc(yb), *y0 = malloc(yb), *yp = malloc(yb), *ym = malloc(yb), *ty = malloc(yb);
    assert_true(u && y0 && yp && ym && ty);
    for (int64_t k = 0; k < g.ny; k++) {
        u[k] = c->want[0] ? 1.0 : rnd_g();
    }
    eval_f(&g, x, y0);

    /* vjp: ((x...), u) -> (y, (ct...)) */
    {
        nb_tree *items[2] = {args_of(&g, x), leaf_f64(g.ctx, g.yrank, g.yshape, u)};
        nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(vjp, args, &out));
        double *yv = malloc(yb);
        read_f64(out, "[0]", g.yrank, g.yshape, yv);
        for (int64_t k = 0; k < g.ny; k++) {
            NBT_EQ_F64(yv[k], y0[k]);
        }
        free(yv);
        for (int i = 0; i < c->n_in; i++) {
            char path[16];
            snprintf(path, sizeof path, "[1][%d]", i);
            read_f64(out, path, c->rank[i], c->shape[i], ct[i]);
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    /* grad of <u, f(x)>: args ((x...), u) -> (ct...) */
    {
        nb_tree *items[2] = {args_of(&g, x), leaf_f64(g.ctx, g.yrank, g.yshape, u)};
        nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(grad, args, &out));
        for (int i = 0; i < c->n_in; i++) {
            char path[16];
            snprintf(path, sizeof path, "[%d]", i);
            read_f64(out, path, c->rank[i], c->shape[i], gr[i]);
            for (int64_t k = 0; k < g.nx[i]; k++) {
                if (!(fabs(gr[i][k] - ct[i][k]) <= 1e-14 * fmax(1.0, fabs(ct[i][k])))) {
                    fail_msg("%s: grad[%d][%lld] = %.17g but the vjp gives %.17g", c->name, i,
                             (long long)k, gr[i][k], ct[i][k]);
                }
            }
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    /* jvp: ((x...), (v...)) -> (y, ty) */
    {
        nb_tree *vt[2] = {NULL, NULL};
        for (int i = 0; i < c->n_in; i++) {
            vt[i] = leaf_f64(g.ctx, c->rank[i], c->shape[i], v[i]);
        }
        nb_tree *items[2] = {args_of(&g, x), nbt_tuple_take(g.ctx, c->n_in, vt)};
        nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
        NBT_OK(g.ctx, nb_fn_call(jvp, args, &out));
        read_f64(out, "[1]", g.yrank, g.yshape, ty);
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    /* with two inputs, a null tangent for either: the two partial tangents add up */
    if (c->n_in == 2) {
        double *part = malloc(yb);
        assert_non_null(part);
        for (int64_t j = 0; j < g.ny; j++) {
            part[j] = 0;
        }
        for (int which = 0; which < 2; which++) {
            nb_tree *vt[2] = {NULL, NULL};
            vt[which] = leaf_f64(g.ctx, c->rank[which], c->shape[which], v[which]);
            NBT_OK(g.ctx, nb_tree_null(g.ctx, &vt[1 - which]));
            nb_tree *items[2] = {args_of(&g, x), nbt_tuple_take(g.ctx, 2, vt)};
            nb_tree *args = nbt_tuple_take(g.ctx, 2, items), *out = NULL;
            NBT_OK(g.ctx, nb_fn_call(jvp, args, &out));
            read_f64(out, "[1]", g.yrank, g.yshape, yp);
            for (int64_t j = 0; j < g.ny; j++) {
                part[j] += yp[j];
            }
            nb_tree_destroy(out);
            nb_tree_destroy(args);
        }
        for (int64_t j = 0; j < g.ny; j++) {
            if (!(fabs(part[j] - ty[j]) <= 1e-14 * fmax(1.0, fabs(ty[j])))) {
                fail_msg("%s: partial tangents add up to %.17g at %lld, the full one is %.17g",
                         c->name, part[j], (long long)j, ty[j]);
            }
        }
        free(part);
    }
    /* <u, J v> = <J^T u, v> */
    double ujv = 0, jtuv = 0, mag = 0;
    for (int64_t k = 0; k < g.ny; k++) {
        ujv += u[k] * ty[k];
        mag += fabs(u[k] * ty[k]);
    }
    for (int i = 0; i < c->n_in; i++) {
        for (int64_t k = 0; k < g.nx[i]; k++) {
            jtuv += ct[i][k] * v[i][k];
            mag += fabs(ct[i][k] * v[i][k]);
        }
    }
    if (!(fabs(ujv - jtuv) <= 1e-12 * fmax(1.0, mag))) {
        fail_msg("%s: <u, Jv> = %.17g but <J^T u, v> = %.17g", c->name, ujv, jtuv);
    }

    if (c->want[0] != NULL) { /* a kink: exact values */
        for (int i = 0; i < c->n_in; i++) {
            for (int64_t k = 0; k < g.nx[i]; k++) {
                if (!(ct[i][k] == c->want[i][k])) {
                    fail_msg("%s: ct_x%d[%lld] = %.17g, expected exactly %.17g", c->name, i,
                             (long long)k, ct[i][k], c->want[i][k]);
                }
            }
        }
    } else {
        /* vjp element by element */
        for (int i = 0; i < c->n_in; i++) {
            for (int64_t k = 0; k < g.nx[i]; k++) {
                double x0 = x[i][k], h = 1e-6 * fmax(1.0, fabs(x0));
                x[i][k] = x0 + h;
                eval_f(&g, x, yp);
                x[i][k] = x0 - h;
                eval_f(&g, x, ym);
                x[i][k] = x0;
                double d = 0;
                for (int64_t j = 0; j < g.ny; j++) {
                    d += u[j] * (yp[j] - ym[j]);
                }
                fd_expect("ct_x", c->name, k, ct[i][k], d / (2 * h), 1e-7);
            }
        }
        /* jvp along v */
        double xn = 0;
        for (int i = 0; i < c->n_in; i++) {
            for (int64_t k = 0; k < g.nx[i]; k++) {
                xn = fmax(xn, fabs(x[i][k]));
            }
        }
        double h = 1e-6 * fmax(1.0, xn);
        double *xs[2] = {NULL, NULL}, *xm[2] = {NULL, NULL};
        for (int i = 0; i < c->n_in; i++) {
            size_t b = (size_t)(g.nx[i] > 0 ? g.nx[i] : 1) * sizeof(double);
            xs[i] = malloc(b);
            xm[i] = malloc(b);
            assert_true(xs[i] && xm[i]);
            for (int64_t k = 0; k < g.nx[i]; k++) {
                xs[i][k] = x[i][k] + h * v[i][k];
                xm[i][k] = x[i][k] - h * v[i][k];
            }
        }
        eval_f(&g, xs, yp);
        eval_f(&g, xm, ym);
        for (int64_t j = 0; j < g.ny; j++) {
            fd_expect("t_y", c->name, j, ty[j], (yp[j] - ym[j]) / (2 * h), 1e-7);
        }
        check_second_order(&g, self, x, u, v, xs, xm, h);
        for (int i = 0; i < c->n_in; i++) {
            free(xs[i]);
            free(xm[i]);
        }
    }

    for (int i = 0; i < c->n_in; i++) {
        free(x[i]);
        free(v[i]);
        free(ct[i]);
        free(gr[i]);
    }
    free(u);
    free(y0);
    free(yp);
    free(ym);
    free(ty);
    nb_fn_destroy(grad);
    nb_fn_destroy(jvp);
    nb_fn_destroy(vjp);
    nb_fn_destroy(loss);
    nb_fn_destroy(g.f);
    nb_tree_destroy(self);
    nbt_assert_no_live(g.ctx);
    nb_ctx_destroy(g.ctx);
}

static void check_grad_cases(const adcase *cases, int n) {
    g_fd_err = 0;
    g_fd_checks = 0;
    for (int i = 0; i < n; i++) {
        check_grad_case(&cases[i]);
    }
    print_message("%d cases, %d checks against finite differences; largest relative error "
                  "%.3g\n",
                  n, g_fd_checks, g_fd_err);
}

#define AX(...) ((const int[]){__VA_ARGS__})

/* An integer constant of the trace (indices). */
static nb_var *const_idx(nb_trace *tr, nb_dtype dt, int rank, const int64_t *shape,
                         const int64_t *vals) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    int64_t n = prod(rank, shape);
    void *buf = index_buf(dt, n, vals);
    nb_array *a = NULL;
    nb_status st = nb_array_from_data(ctx, dt, rank, shape, buf, &a);
    free(buf);
    if (st != NB_OK) {
        nb_trace_fail(tr, st, "const_idx: %s", nb_ctx_errmsg(ctx));
        return nb_scalar(tr, 0.0);
    }
    nb_var *v = nb_constant(tr, a);
    nb_array_destroy(a);
    return v;
}

static nb_var *start_of(nb_trace *tr, int64_t v) {
    return nb_scalar_typed(tr, I64, (double)v);
}

static nb_var *gf_reshape(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_reshape(x[0], 3, S(3, -1, 2));
}
static nb_var *gf_reshape_chain(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_mul(nb_reshape(x[0], 2, S(4, 3)), nb_reshape(nb_sin(x[0]), 2, S(4, 3)));
}
static nb_var *gf_expand_squeeze(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_squeeze(nb_expand_dims(x[0], -1), NULL, 0);
}
static nb_var *gf_bcast_mid(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_broadcast_to(x[0], 3, S(2, 3, 4));
}
static nb_var *gf_bcast_scalar(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_broadcast_to(x[0], 2, S(2, 2));
}
static nb_var *gf_bcast_two(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_mul(nb_broadcast_to(x[0], 2, S(3, 4)), x[1]);
}
static nb_var *gf_transpose(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_transpose(x[0], AX(2, 0, 1));
}
static nb_var *gf_transpose_rev(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_transpose(x[0], NULL);
}
static nb_var *gf_transpose_neg(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_mul(nb_transpose(x[0], AX(-1, -3, -2)), nb_transpose(nb_cos(x[0]), AX(2, 0, 1)));
}
static nb_var *gf_slice_step2(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_slice(x[0], S(1, 0), S(4, 6), S(1, 2));
}
static nb_var *gf_slice_neg(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_slice(x[0], NULL, NULL, S(-2, -1));
}
static nb_var *gf_slice_neg3(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_slice(x[0], S(-2), S(0), S(-3));
}
static nb_var *gf_slice_bigstep(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_slice(x[0], NULL, NULL, S(INT64_MAX, INT64_MIN));
}
static nb_var *gf_slice_empty(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_slice(x[0], S(3, 0), S(1, 3), NULL);
}
static nb_var *gf_slice_3d(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_slice(x[0], S(0, 3, 1), S(3, -10, 5), S(2, -1, 3));
}
static nb_var *gf_slice_twice(nb_trace *tr, nb_var *const *x) { /* x[::-1] * x[1::2]-ish */
    (void)tr;
    nb_var *a = nb_slice(x[0], S(6), S(-9), S(-2)); /* 6, 4, 2, 0 */
    nb_var *b = nb_slice(x[0], S(1), S(8), S(2));   /* 1, 3, 5, 7 */
    return nb_mul(a, nb_exp(b));
}
static nb_var *gf_concat(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_concatenate(3, (nb_var *const[]){x[0], x[1], x[0]}, -1);
}
static nb_var *gf_concat_chain(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_concatenate(2, (nb_var *const[]){nb_square(x[0]), x[0]}, 0);
}
static nb_var *gf_stack(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_stack(2, (nb_var *const[]){x[0], nb_sin(x[0])}, -1);
}
static nb_var *gf_pad(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_pad(x[0], S(1, 0), S(2, 3), 1.5);
}
static nb_var *gf_pad_null(nb_trace *tr, nb_var *const *x) {
    (void)tr;
    return nb_mul(nb_pad(x[0], NULL, S(0, 2), -1.0), nb_pad(nb_sin(x[0]), S(0, 2), NULL, 2.0));
}
static nb_var *gf_take_dup(nb_trace *tr, nb_var *const *x) {
    return nb_take(x[0], const_idx(tr, I64, 1, S(6), S(0, 3, -1, 7, 0, -9)), 0);
}
static nb_var *gf_take_mid(nb_trace *tr, nb_var *const *x) {
    return nb_take(x[0], const_idx(tr, I32, 2, S(2, 2), S(2, 0, 2, -2)), 1);
}
static nb_var *gf_take_scalar(nb_trace *tr, nb_var *const *x) {
    return nb_take(x[0], const_idx(tr, I64, 0, NULL, S(-2)), -2);
}
static nb_var *gf_take_last(nb_trace *tr, nb_var *const *x) {
    nb_var *i = const_idx(tr, I32, 1, S(4), S(1, 1, 3, 100));
    return nb_mul(nb_take(x[0], i, -1), nb_take(nb_cos(x[0]), i, -1));
}
static nb_var *gf_take_along(nb_trace *tr, nb_var *const *x) {
    return nb_take_along_axis(x[0], const_idx(tr, I64, 2, S(3, 2), S(1, 1, -1, 9, 0, -9)), 1);
}
static nb_var *gf_take_along_bx(nb_trace *tr, nb_var *const *x) { /* x broadcast on axis 0 */
    return nb_take_along_axis(x[0], const_idx(tr, I32, 2, S(3, 2), S(1, 1, -1, 2, 0, 0)), 1);
}
static nb_var *gf_take_along_bi(nb_trace *tr, nb_var *const *x) { /* indices broadcast */
    return nb_take_along_axis(x[0], const_idx(tr, I64, 2, S(1, 5), S(0, 3, 3, -1, 2)), -1);
}
static nb_var *gf_take_along_0(nb_trace *tr, nb_var *const *x) {
    nb_var *i = const_idx(tr, I64, 3, S(3, 1, 2), S(0, 3, 3, 3, -4, 1));
    return nb_take_along_axis(x[0], i, 0);
}
static nb_var *gf_one_hot(nb_trace *tr, nb_var *const *x) { /* no rules needed: int input */
    nb_var *oh = nb_one_hot(const_idx(tr, I64, 1, S(3), S(2, 0, 7)), 4, F64);
    return nb_mul(oh, nb_square(x[0]));
}
static nb_var *gf_dyn_slice(nb_trace *tr, nb_var *const *x) { /* starts clamp to (2, 0) */
    return nb_dynamic_slice(x[0], (nb_var *const[]){start_of(tr, 3), start_of(tr, -2)}, S(3, 2));
}
static nb_var *gf_dyn_slice_in(nb_trace *tr, nb_var *const *x) {
    return nb_mul(
        nb_dynamic_slice(x[0], (nb_var *const[]){start_of(tr, 1), start_of(tr, 1)}, S(2, 2)),
        nb_dynamic_slice(nb_exp(x[0]), (nb_var *const[]){start_of(tr, 9), start_of(tr, 0)},
                         S(2, 2)));
}
static nb_var *gf_dyn_slice_full(nb_trace *tr, nb_var *const *x) { /* clamps to (0, 0) */
    return nb_dynamic_slice(x[0], (nb_var *const[]){start_of(tr, 2), start_of(tr, 9)}, S(5, 4));
}
static nb_var *gf_dyn_update(nb_trace *tr, nb_var *const *x) { /* (4, 1) clamps to (3, 1) */
    return nb_dynamic_update_slice(x[0], x[1], (nb_var *const[]){start_of(tr, 4), start_of(tr, 1)});
}
static nb_var *gf_dyn_update_neg(nb_trace *tr, nb_var *const *x) { /* (-1, 7) -> (0, 1) */
    nb_var *y = nb_dynamic_update_slice(nb_sin(x[0]), nb_square(x[1]),
                                        (nb_var *const[]){start_of(tr, -1), start_of(tr, 7)});
    return nb_mul(y, x[0]);
}
static nb_var *gf_mixed(nb_trace *tr, nb_var *const *x) { /* a chain through several ops */
    nb_var *t = nb_transpose(nb_pad(x[0], S(1, 0), S(0, 2), 0.5), NULL); /* [5, 4] */
    nb_var *s = nb_slice(t, S(4, 0), S(-6, 4), S(-2, 3));                /* [3, 2] */
    nb_var *k = nb_take(s, const_idx(tr, I64, 1, S(3), S(1, 1, 0)), 1);  /* [3, 3] */
    nb_var *c = nb_concatenate(2, (nb_var *const[]){k, nb_broadcast_to(x[1], 2, S(3, 3))}, 0);
    return nb_mul(c, nb_reshape(nb_tanh(x[0]), 2, S(6, 1))); /* [6, 3] */
}

#define G1(nm, fn, r, ...)                                                                         \
    {                                                                                              \
        .name = nm, .f = fn, .n_in = 1, .rank = {r}, .shape = { {__VA_ARGS__} }                    \
    }
#define G2(nm, fn, r0, r1, s0, s1)                                                                 \
    {                                                                                              \
        .name = nm, .f = fn, .n_in = 2, .rank = {r0, r1}, .shape = { s0, s1 }                      \
    }
#define L(...)                                                                                     \
    { __VA_ARGS__ }

static const adcase k_shape_grad_cases[] = {
    G1("reshape with -1", gf_reshape, 2, 2, 6),
    G1("reshape * reshape(sin)", gf_reshape_chain, 2, 3, 4),
    G1("squeeze(expand_dims)", gf_expand_squeeze, 3, 3, 1, 2),
    G1("broadcast_to [3,1] -> [2,3,4]", gf_bcast_mid, 2, 3, 1),
    {.name = "broadcast_to a scalar", .f = gf_bcast_scalar, .n_in = 1},
    G2("broadcast_to [4] -> [3,4] times x1", gf_bcast_two, 1, 2, L(4), L(3, 4)),
    G1("transpose (2,0,1)", gf_transpose, 3, 2, 3, 4),
    G1("transpose reversed", gf_transpose_rev, 3, 2, 3, 4),
    G1("transpose negative perm", gf_transpose_neg, 3, 2, 3, 2),
    G1("slice step 2", gf_slice_step2, 2, 5, 6),
    G1("slice steps -2, -1", gf_slice_neg, 2, 5, 6),
    G1("slice -2:0:-3", gf_slice_neg3, 1, 7),
    G1("slice steps INT64_MAX, INT64_MIN", gf_slice_bigstep, 2, 4, 5),
    G1("slice empty", gf_slice_empty, 2, 4, 3),
    G1("slice 3-d mixed steps", gf_slice_3d, 3, 3, 4, 5),
    G1("two overlapping slices", gf_slice_twice, 1, 8),
    G2("concatenate (x0, x1, x0) axis -1", gf_concat, 2, 2, L(2, 3), L(2, 5)),
    G1("concatenate (x^2, x)", gf_concat_chain, 2, 2, 3),
    G1("stack (x, sin x) axis -1", gf_stack, 2, 3, 2),
    G1("pad", gf_pad, 2, 2, 3),
    G1("pad with NULL sides", gf_pad_null, 2, 2, 3),
    G1("take duplicates, negative, clamped", gf_take_dup, 2, 4, 3),
    G1("take i32 [2,2] indices on axis 1", gf_take_mid, 3, 2, 3, 4),
    G1("take rank-0 index", gf_take_scalar, 2, 5, 2),
    G1("take on the last axis * take(cos)", gf_take_last, 2, 3, 4),
    G1("take_along_axis duplicates, clamped", gf_take_along, 2, 3, 4),
    G1("take_along_axis, x broadcast", gf_take_along_bx, 2, 1, 4),
    G1("take_along_axis, indices broadcast", gf_take_along_bi, 2, 3, 4),
    G1("take_along_axis on axis 0, rank 3", gf_take_along_0, 3, 4, 2, 2),
    G1("one_hot * x^2", gf_one_hot, 2, 3, 4),
    G1("dynamic_slice clamped starts", gf_dyn_slice, 2, 5, 4),
    G1("dynamic_slice twice", gf_dyn_slice_in, 2, 5, 4),
    G1("dynamic_slice of everything", gf_dyn_slice_full, 2, 5, 4),
    G2("dynamic_update_slice clamped", gf_dyn_update, 2, 2, L(5, 4), L(2, 3)),
    G2("dynamic_update_slice negative start", gf_dyn_update_neg, 2, 2, L(5, 4), L(2, 3)),
    G2("pad, transpose, slice, take, concatenate", gf_mixed, 2, 1, L(2, 3), L(3)),
};

static void test_grad_through_api(void **state) {
    (void)state;
    check_grad_cases(k_shape_grad_cases,
                     (int)(sizeof k_shape_grad_cases / sizeof k_shape_grad_cases[0]));
}

/* ---- the rules, called directly ------------------------------------------------------ */

/* The slice adjoint against a reference scatter, for every slice of the Python oracle's
 * grid on lengths 0, 1, 5 and 7 and on a rank-3 array with a step per axis: in_ct has x's
 * dtype and shape, holds g at exactly the positions read and exact zeros elsewhere; the JVP
 * rule is the same slice. f32 and f64. */
static void check_unslice(nb_ctx *ctx, nb_dtype dt, int r, const int64_t *xs, const int64_t *start,
                          const int64_t *stop, const int64_t *step) {
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, dt, r, xs);
    nb_var *y = nb_slice(x, start, stop, step);
    if (y == x || nb_var_is_poison(y)) {
        NBT_OK(ctx, nb_trace_status(&tr));
        nbi_trace_release(&tr);
        return;
    }
    const nbi_op_info *info = nbi_op_get(NBI_OP_SLICE);
    nb_var *g = param(&tr, 1, dt, y->rank, y->shape);
    nb_var *in_ct[1] = {NULL};
    info->vjp(&tr, y, g, in_ct);
    expect_type(in_ct[0], dt, r, xs);
    nb_var *ty = info->jvp(&tr, y, (nb_var *const[]){x});
    expect_type(ty, dt, y->rank, y->shape);
    NBT_OK(ctx, nb_trace_status(&tr));
    verify(&tr);
    int64_t nx = prod(r, xs);
    void *bx = pattern(dt, nx, 1), *bg = pattern(dt, y->size, 2);
    char *ct = run_graph(&tr, (const void *const[]){bx, bg}, in_ct[0]);
    char *yv = run_graph(&tr, (const void *const[]){bx, bg}, y);
    char *tv = run_graph(&tr, (const void *const[]){bx, bg}, ty);
    size_t es = nb_dtype_size(dt);
    NBT_TRUE(y->size == 0 || memcmp(yv, tv, (size_t)y->size * es) == 0);
    /* reference: src[k] = the index into g of x's element k, or -1 */
    int64_t *src = alloc_src(nx);
    for (int64_t k = 0; k < nx; k++) {
        src[k] = -1;
    }
    for (int64_t i = 0; i < y->size; i++) {
        int64_t yi[NB_MAX_RANK], xi[NB_MAX_RANK];
        unravel(i, r, y->shape, yi);
        for (int d = 0; d < r; d++) {
            xi[d] = y->at.a[d] + yi[d] * y->at.c[d];
        }
        src[ravel(r, xs, xi)] = i;
    }
    const double zero = 0.0;
    const float zf = 0.0f;
    expect_map(ct, bg, es, nx, src, dt == F32 ? (const void *)&zf : (const void *)&zero);
    free(src);
    free(ct);
    free(yv);
    free(tv);
    free(bx);
    free(bg);
    nbi_trace_release(&tr);
}

static void test_slice_rules_direct(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const size_t nb = sizeof k_bounds / sizeof k_bounds[0];
    const size_t nk = sizeof k_steps / sizeof k_steps[0];
    const int64_t lens[4] = {0, 1, 5, 7};
    for (int di = 0; di < 2; di++) {
        nb_dtype dt = di ? F64 : F32;
        for (size_t l = 0; l < 4; l++) {
            for (size_t si = 0; si < nb; si++) {
                for (size_t ei = 0; ei < nb; ei++) {
                    for (size_t ki = 0; ki < nk; ki++) {
                        check_unslice(ctx, dt, 1, &lens[l], si == 0 ? NULL : &k_bounds[si],
                                      ei == 0 ? NULL : &k_bounds[ei], &k_steps[ki]);
                    }
                }
            }
        }
        /* rank 3: every combination of steps -3, -1, 1, 2, 3 on [4, 5, 6] (full ranges) */
        const int64_t st[5] = {-3, -1, 1, 2, 3};
        for (int a = 0; a < 5; a++) {
            for (int b = 0; b < 5; b++) {
                for (int c = 0; c < 5; c++) {
                    check_unslice(ctx, dt, 3, S(4, 5, 6), NULL, NULL, S(st[a], st[b], st[c]));
                    check_unslice(ctx, dt, 3, S(4, 5, 6), S(1, -1, 2), S(-1, 0, 6),
                                  S(st[a], st[b], st[c]));
                }
            }
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* take / take_along_axis / dynamic_slice / dynamic_update_slice adjoints on integer-valued
 * data (so that sums are exact in any order) against reference scatter-adds, with
 * duplicate, negative and out-of-range indices and run-time start values (params) that
 * clamp. */
static void test_gather_rules_direct(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    for (int di = 0; di < 2; di++) {
        nb_dtype dt = di ? F64 : F32;
        /* take: x [2, 4, 3] on axis 1 with indices [2, 3] */
        {
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, 3, S(2, 4, 3));
            nb_var *ix = param(&tr, 1, I32, 2, S(2, 3));
            nb_var *y = nb_take(x, ix, -2); /* [2, 2, 3, 3] */
            nb_var *g = param(&tr, 2, dt, y->rank, y->shape);
            nb_var *in_ct[2] = {NULL, NULL};
            nbi_op_get(NBI_OP_TAKE)->vjp(&tr, y, g, in_ct);
            expect_type(in_ct[0], dt, 3, S(2, 4, 3));
            assert_null(in_ct[1]);
            NBT_OK(ctx, nb_trace_status(&tr));
            verify(&tr);
            const int64_t iv[6] = {1, 1, -1, 9, -9, 1};
            double gv[36], want[24] = {0};
            for (int i = 0; i < 36; i++) {
                gv[i] = (double)(i % 7) - 3.0;
            }
            for (int o = 0; o < 2; o++) {
                for (int j = 0; j < 6; j++) {
                    for (int k = 0; k < 3; k++) {
                        want[(o * 4 + ref_fix(iv[j], 4)) * 3 + k] += gv[(o * 6 + j) * 3 + k];
                    }
                }
            }
            void *bx = pattern(dt, 24, 1), *bi = index_buf(I32, 6, iv), *bg = malloc(36 * 8);
            for (int i = 0; i < 36; i++) {
                put_value(dt, bg, i, gv[i]);
            }
            char *ct = run_graph(&tr, (const void *const[]){bx, bi, bg}, in_ct[0]);
            for (int i = 0; i < 24; i++) {
                double got = dt == F32 ? ((float *)ct)[i] : ((double *)ct)[i];
                NBT_EQ_F64(got, want[i]);
            }
            free(ct);
            free(bx);
            free(bi);
            free(bg);
            nbi_trace_release(&tr);
        }
        /* take_along_axis: x [3, 1] (broadcast on axis 1) with indices [2, 4] on axis 0 */
        {
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, 2, S(3, 1));
            nb_var *ix = param(&tr, 1, I64, 2, S(2, 4));
            nb_var *y = nb_take_along_axis(x, ix, 0); /* [2, 4] */
            expect_type(y, dt, 2, S(2, 4));
            nb_var *g = param(&tr, 2, dt, 2, S(2, 4));
            nb_var *in_ct[2] = {NULL, NULL};
            nbi_op_get(NBI_OP_TAKE_ALONG)->vjp(&tr, y, g, in_ct);
            expect_type(in_ct[0], dt, 2, S(3, 1));
            assert_null(in_ct[1]);
            NBT_OK(ctx, nb_trace_status(&tr));
            verify(&tr);
            const int64_t iv[8] = {0, 2, -1, 5, 0, 0, -3, -7};
            double gv[8] = {1, 2, 3, 4, 5, 6, 7, 8}, want[3] = {0};
            for (int j = 0; j < 8; j++) {
                want[ref_fix(iv[j], 3)] += gv[j];
            }
            void *bx = pattern(dt, 3, 1), *bi = index_buf(I64, 8, iv), *bg = malloc(8 * 8);
            for (int i = 0; i < 8; i++) {
                put_value(dt, bg, i, gv[i]);
            }
            char *ct = run_graph(&tr, (const void *const[]){bx, bi, bg}, in_ct[0]);
            for (int i = 0; i < 3; i++) {
                double got = dt == F32 ? ((float *)ct)[i] : ((double *)ct)[i];
                NBT_EQ_F64(got, want[i]);
            }
            free(ct);
            free(bx);
            free(bi);
            free(bg);
            nbi_trace_release(&tr);
        }
        /* dynamic_slice and dynamic_update_slice with run-time starts that clamp */
        const int64_t starts[4][2] = {{0, 0}, {3, -2}, {-5, 9}, {1, 2}};
        for (int s = 0; s < 4; s++) {
            nb_trace tr;
            begin(&tr, ctx);
            nb_var *x = param(&tr, 0, dt, 2, S(4, 5));
            nb_var *u = param(&tr, 1, dt, 2, S(2, 3));
            nb_var *s0 = param(&tr, 2, I64, 0, NULL), *s1 = param(&tr, 3, I32, 0, NULL);
            nb_var *g = param(&tr, 4, dt, 2, S(2, 3));
            nb_var *gx = param(&tr, 5, dt, 2, S(4, 5));
            nb_var *ds = nb_dynamic_slice(x, (nb_var *const[]){s0, s1}, S(2, 3));
            nb_var *du = nb_dynamic_update_slice(x, u, (nb_var *const[]){s0, s1});
            nb_var *c1[3] = {NULL, NULL, NULL}, *c2[4] = {NULL, NULL, NULL, NULL};
            nbi_op_get(NBI_OP_DYN_SLICE)->vjp(&tr, ds, g, c1);
            nbi_op_get(NBI_OP_DYN_UPDATE)->vjp(&tr, du, gx, c2);
            expect_type(c1[0], dt, 2, S(4, 5));
            expect_type(c2[0], dt, 2, S(4, 5));
            expect_type(c2[1], dt, 2, S(2, 3));
            NBT_TRUE(c1[1] == NULL && c1[2] == NULL && c2[2] == NULL && c2[3] == NULL);
            nb_var *t =
                nbi_op_get(NBI_OP_DYN_UPDATE)->jvp(&tr, du, (nb_var *const[]){NULL, u, NULL, NULL});
            expect_type(t, dt, 2, S(4, 5));
            NBT_OK(ctx, nb_trace_status(&tr));
            verify(&tr);
            int64_t r0 = clampi(starts[s][0], 0, 2), r1 = clampi(starts[s][1], 0, 2);
            void *bx = pattern(dt, 20, 1), *bu = pattern(dt, 6, 2), *bg = pattern(dt, 6, 3);
            void *bgx = pattern(dt, 20, 4);
            void *b0 = index_buf(I64, 1, &starts[s][0]), *b1 = index_buf(I32, 1, &starts[s][1]);
            const void *const ins[6] = {bx, bu, b0, b1, bg, bgx};
            char *a = run_graph(&tr, ins, c1[0]), *b = run_graph(&tr, ins, c2[0]);
            char *c = run_graph(&tr, ins, c2[1]), *tv = run_graph(&tr, ins, t);
            size_t es = nb_dtype_size(dt);
            const double zero = 0.0;
            const float zf = 0.0f;
            const void *z = dt == F32 ? (const void *)&zf : (const void *)&zero;
            int64_t src_a[20], src_b[20], src_t[20], src_c[6];
            for (int i = 0; i < 4; i++) {
                for (int j = 0; j < 5; j++) {
                    bool in = i >= r0 && i < r0 + 2 && j >= r1 && j < r1 + 3;
                    int64_t k = (i - r0) * 3 + (j - r1);
                    src_a[i * 5 + j] = in ? k : -1;
                    src_b[i * 5 + j] = in ? -1 : i * 5 + j;
                    src_t[i * 5 + j] = in ? k : -1;
                    if (in) {
                        src_c[k] = i * 5 + j;
                    }
                }
            }
            expect_map(a, bg, es, 20, src_a, z);  /* g at the clamped block, zeros around */
            expect_map(b, bgx, es, 20, src_b, z); /* gx with the block zeroed */
            expect_map(c, bgx, es, 6, src_c, z);  /* the block of gx */
            expect_map(tv, bu, es, 20, src_t, z); /* zeros with the update's tangent in */
            free(a);
            free(b);
            free(c);
            free(tv);
            free(bx);
            free(bu);
            free(bg);
            free(bgx);
            free(b0);
            free(b1);
            nbi_trace_release(&tr);
        }
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Every differentiable op's rules build vars of exactly the right dtype and shape, and
 * nothing for the index inputs; shape ops without a tangent give none (NULL). */
static void test_rule_signatures(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_trace tr;
    begin(&tr, ctx);
    nb_var *x = param(&tr, 0, F32, 3, S(2, 3, 4));
    nb_var *one = param(&tr, 1, F32, 2, S(3, 1));
    nb_var *ix = param(&tr, 2, I64, 2, S(2, 2));
    nb_var *ix3 = param(&tr, 3, I32, 3, S(2, 5, 1));
    nb_var *s0 = nb_scalar_typed(&tr, I32, 1);
    nb_var *nodes[] = {
        nb_reshape(x, 2, S(6, 4)),
        nb_broadcast_to(one, 3, S(5, 3, 4)),
        nb_transpose(x, AX(1, 2, 0)),
        nb_slice(x, S(1, -1, 0), S(2, -4, 4), S(1, -2, 3)),
        nb_concatenate(3, (nb_var *const[]){x, x, nb_slice(x, NULL, S(2, 3, 1), NULL)}, -1),
        nb_pad(x, S(0, 1, 2), S(3, 0, 1), 7.0),
        nb_take(x, ix, 2),
        nb_take_along_axis(x, ix3, 1),
        nb_dynamic_slice(x, (nb_var *const[]){s0, s0, s0}, S(1, 2, 3)),
        nb_dynamic_update_slice(x, nb_slice(x, NULL, S(1, 3, 2), NULL),
                                (nb_var *const[]){s0, s0, s0}),
    };
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        nb_var *v = nodes[i];
        assert_false(nb_var_is_poison(v));
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        assert_non_null(info->vjp);
        assert_non_null(info->jvp);
        nb_var *g = param(&tr, 4 + (int)i, F32, v->rank, v->shape);
        nb_var *in_ct[8] = {NULL}, *tan[8] = {NULL};
        info->vjp(&tr, v, g, in_ct);
        assert_null(info->jvp(&tr, v, tan)); /* no tangents: zero */
        for (int32_t j = 0; j < v->n_in; j++) {
            nb_var *xj = v->in[j];
            if (info->nondiff & (1u << j)) {
                assert_null(in_ct[j]);
                continue;
            }
            expect_type(in_ct[j], xj->dtype, xj->rank, xj->shape);
            tan[j] = xj;
            nb_var *t = info->jvp(&tr, v, tan);
            expect_type(t, v->dtype, v->rank, v->shape);
            tan[j] = NULL;
        }
    }
    NBT_OK(ctx, nb_trace_status(&tr));
    verify(&tr);
    nbi_trace_release(&tr);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_registry(void **state) {
    (void)state;
    static const struct {
        nbi_op op;
        const char *name;
        int n_in;
        uint32_t nondiff;
    } ops[] = {
        {NBI_OP_RESHAPE, "reshape", 1, 0},
        {NBI_OP_BROADCAST, "broadcast_to", 1, 0},
        {NBI_OP_TRANSPOSE, "transpose", 1, 0},
        {NBI_OP_SLICE, "slice", 1, 0},
        {NBI_OP_CONCAT, "concatenate", -1, 0},
        {NBI_OP_PAD, "pad", 1, 0},
        {NBI_OP_TAKE, "take", 2, 2},
        {NBI_OP_TAKE_ALONG, "take_along_axis", 2, 2},
        {NBI_OP_ONE_HOT, "one_hot", 1, 1},
        {NBI_OP_DYN_SLICE, "dynamic_slice", -1, ~1u},
        {NBI_OP_DYN_UPDATE, "dynamic_update_slice", -1, ~3u},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        const nbi_op_info *info = nbi_op_get(ops[i].op);
        assert_non_null(info);
        NBT_STREQ(info->name, ops[i].name);
        NBT_STREQ(nbi_op_name(ops[i].op), ops[i].name);
        NBT_EQ_I64(info->n_in, ops[i].n_in);
        NBT_EQ_I64(info->nondiff, ops[i].nondiff);
        assert_non_null(info->infer);
        assert_non_null(info->kernel);
        assert_null(info->scratch);
        assert_false(info->elementwise);
        /* rules for every op but one_hot (whose input is an integer) */
        bool diff = ops[i].op != NBI_OP_ONE_HOT;
        NBT_TRUE((info->vjp != NULL) == diff && (info->jvp != NULL) == diff);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_no_vars),
        cmocka_unit_test(test_pad_int_fill_rule),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_broadcast_to),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_slice_python_oracle),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_concatenate),
        cmocka_unit_test(test_pad),
        cmocka_unit_test(test_take),
        cmocka_unit_test(test_take_along_axis),
        cmocka_unit_test(test_one_hot),
        cmocka_unit_test(test_dynamic_slice),
        cmocka_unit_test(test_dynamic_update_slice),
        cmocka_unit_test(test_expand_dims),
        cmocka_unit_test(test_squeeze),
        cmocka_unit_test(test_stack),
        cmocka_unit_test(test_sticky_poison_null),
        cmocka_unit_test(test_weak),
        cmocka_unit_test(test_infer_rejects_bad_attrs),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_rule_signatures),
        cmocka_unit_test(test_slice_rules_direct),
        cmocka_unit_test(test_gather_rules_direct),
        cmocka_unit_test(test_grad_through_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
