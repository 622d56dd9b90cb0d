/*
 * programs.c -- random traced programs and the rules every accepted one must keep
 * (tests/fuzz/README.md, "fuzz_programs"). Shared by the libFuzzer target
 * (fuzz_programs.c) and the seeded driver (programs_main.c); the interface is programs.h,
 * and programs_internal.h lists the other files of the checker.
 *
 * An input's bytes are decoded into a program while it is traced for the first time
 * (programs_decode.c); the decoded op list is then replayed for every other run
 * (programs_ops.c), so all runs see one program. This file runs it every way and checks
 * these rules for every accepted program (a violation prints the program and aborts):
 *   R1 the jitted whole program's outputs are bit-identical to the same ops run one by one,
 *      each as its own nb_eval (fused and constant-folded vs unfused);
 *   R2 a context with 3 threads gives the same bits as one with 1 thread;
 *   R3 with a scalar loss L = sum_k sum(f64(out_k) * w_k) over the float outputs:
 *      jit(grad(L)) and grad(L) give the same bits (also at 3 threads); at generic inputs,
 *      the jvp of L along u agrees with <grad L, u> (relative 1e-9 in f64, 2e-3 when an f32
 *      value is involved, scaled by the program's largest value and multiplier) where the
 *      loss, the gradient and the jvp are finite;
 *   R4 for programs whose float values are all f64: u^T H v == v^T H u, H v from
 *      jvp(grad(L)) (relative 1e-7, scaled the same way);
 *   R5 grad's tree has nb_grad_template's structure (null at int, static, null and frozen
 *      leaves), each array of its leaf's dtype and shape;
 *   R6 afterwards, with the caches cleared, both contexts hold as many live arrays, trees,
 *      treedefs, buffers and functions and as many bytes as before the input;
 *   R7 with an allocation failing, the program's call returns NB_ERR_OOM with a message (or
 *      the same bits), and the next call works.
 * A program the library refuses at trace time must fail with a status and a message that
 * names the refused op; its valid prefix is then checked as above. A call that fails after
 * its trace was accepted, or a single op that fails alone, breaks a rule. With the
 * donation flag the program also runs with every argument donated (tied inputs: one array
 * at two leaves) and must give the same bits.
 */
#include "programs_internal.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- state ------------------------------------------------------------------------------ */

void (*nbp_on_fail)(const uint8_t *data, size_t size);

/* ctx A's allocator: counts calls and fails one (or every one from some point) on request
 * (R7) */
typedef struct nbp_alloc {
    nb_allocator real;
    int64_t calls;
    int64_t fail_at; /* -1: never */
    bool sticky;
    int64_t failures;
} nbp_alloc;

static struct {
    nb_ctx *ctx[2];
    nbp_alloc alloc;
    nb_ctx_stats base[2];
    bool debug;
    bool nan_bits;
    bool no_leak_check; /* the warm-up run, before the baseline */
    nbp_stats stats;
    nbp_prog *cur; /* the program being checked (for the failure report) */
    /* the minimizer: a broken rule jumps back to it instead of aborting */
    bool catching;
    jmp_buf jump;
    char fail_msg[1024];
    nbp_prog *fail_prog; /* a copy of the failing program */
} g_nbp;

static void *nbp_alloc_fn(void *ud, size_t size, size_t align) {
    nbp_alloc *a = ud;
    int64_t k = a->calls++;
    if (a->fail_at >= 0 && (k == a->fail_at || (a->sticky && k > a->fail_at))) {
        a->failures++;
        return NULL;
    }
    return a->real.alloc(a->real.ud, size, align);
}

static void nbp_free_fn(void *ud, void *ptr, size_t size) {
    nbp_alloc *a = ud;
    a->real.free(a->real.ud, ptr, size);
}

static void nbp_alloc_arm(int64_t fail_at, bool sticky) {
    g_nbp.alloc.calls = 0;
    g_nbp.alloc.fail_at = fail_at;
    g_nbp.alloc.sticky = sticky;
    g_nbp.alloc.failures = 0;
}

/* ---- small helpers ------------------------------------------------------------------------ */

uint64_t nbp_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

typedef struct nbp_rng {
    uint64_t s;
} nbp_rng;

static uint64_t nbp_next(nbp_rng *r) {
    r->s += 0x9e3779b97f4a7c15u;
    return nbp_mix(r->s);
}

static double nbp_unit(nbp_rng *r) { /* [0, 1) */
    return (double)(nbp_next(r) >> 11) * 0x1.0p-53;
}

static double nbp_bits_f64(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

double nbp_special(unsigned i) {
    static const double t[NBP_N_SPECIALS - 4] = {
        0.0,          -0.0,          1.0,           -1.0,     0.5,          -2.5,
        3.0,          7.0,           NAN,           INFINITY, -INFINITY,    4.9e-324,
        2.0e-308,     1e-40,         1.1754944e-38, FLT_MAX,  -FLT_MAX,     3.5e38,
        DBL_MAX,      -DBL_MAX,      1e300,         -1e300,   2147483647.0, -2147483648.0,
        2147483648.0, -2147483649.0, 4294967296.0,  9.3e18,   1e10,         -1e10,
        88.8,         710.0,         -745.2,        1e-7,     0.7,          100.0,
        16777217.0,   2.5,           -0.5,          65504.0};
    i %= NBP_N_SPECIALS;
    if (i < NBP_N_SPECIALS - 4) {
        return t[i];
    }
    switch (i - (NBP_N_SPECIALS - 4)) {
    case 0:
        return -NAN;
    case 1:
        return nbp_bits_f64(0x7ff8000000000123u); /* a quiet NaN with a payload */
    case 2:
        return nbp_bits_f64(0x7ff0000000000001u); /* a signalling NaN */
    default:
        return -4.9e-324;
    }
}

static int64_t nbp_special_int(unsigned i, nb_dtype dt) {
    static const int64_t t[14] = {0,         1,   -1, 2,      3,     5,         INT32_MAX,
                                  INT32_MIN, 255, -7, 100000, 65536, INT64_MAX, INT64_MIN};
    int64_t v = t[i % 14];
    if (dt == NB_DTYPE_I32 && (v > INT32_MAX || v < INT32_MIN)) {
        v = v > 0 ? INT32_MAX : INT32_MIN;
    }
    return v;
}

int64_t nbp_size_of(int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= shape[i];
    }
    return n;
}

bool nbp_is_float(nb_dtype d) {
    return d == NB_DTYPE_F32 || d == NB_DTYPE_F64;
}
bool nbp_is_int(nb_dtype d) {
    return d == NB_DTYPE_I32 || d == NB_DTYPE_I64;
}

static void nbp_print_input_values(FILE *f, const nbp_prog *P);

void nbp_fail(nb_ctx *ctx, const char *fmt, ...) {
    va_list ap;
    static bool failing; /* (the report itself must not report again) */
    nbp_alloc_arm(-1, false);
    if (failing) {
        va_start(ap, fmt);
        fprintf(stderr, "\n==nabla-fuzz== while reporting: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
        abort();
    }
    if (g_nbp.catching) {
        va_start(ap, fmt);
        vsnprintf(g_nbp.fail_msg, sizeof g_nbp.fail_msg, fmt, ap);
        va_end(ap);
        if (g_nbp.cur != NULL && g_nbp.fail_prog != NULL) {
            memcpy(g_nbp.fail_prog, g_nbp.cur, sizeof *g_nbp.fail_prog);
        }
        longjmp(g_nbp.jump, 1);
    }
    failing = true;
    va_start(ap, fmt);
    fprintf(stderr, "\n==nabla-fuzz== BROKEN RULE: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n==nabla-fuzz== last error on the context: %s\n",
            ctx != NULL ? nb_ctx_errmsg(ctx) : "(none)");
    const nbp_prog *P = g_nbp.cur;
    if (P != NULL) {
        nbp_print_program(stderr, P);
        nbp_print_input_values(stderr, P);
        fprintf(stderr, "==nabla-fuzz== input (%zu bytes):", P->size);
        for (size_t i = 0; i < P->size; i++) {
            fprintf(stderr, "%s%02x", i % 32 == 0 ? "\n  " : " ", P->data[i]);
        }
        fprintf(stderr, "\n");
        if (nbp_on_fail != NULL) {
            nbp_on_fail(P->data, P->size);
        }
    }
    fflush(stderr);
    abort();
}

/* ---- things to destroy at the end of an input ------------------------------------------ */

typedef struct nbp_gc {
    int n, cap;
    struct {
        int kind; /* 0 tree, 1 array, 2 fn */
        void *p;
    } * items;
} nbp_gc;

static nbp_gc g_gc;

static void nbp_keep(int kind, void *p) {
    if (p == NULL) {
        return;
    }
    if (g_gc.n == g_gc.cap) {
        int cap = g_gc.cap ? g_gc.cap * 2 : 256;
        void *q = realloc(g_gc.items, (size_t)cap * sizeof g_gc.items[0]);
        if (q == NULL) {
            nbp_fail(NULL, "out of memory in the harness");
        }
        g_gc.items = q;
        g_gc.cap = cap;
    }
    g_gc.items[g_gc.n].kind = kind;
    g_gc.items[g_gc.n++].p = p;
}
static nb_tree *nbp_kt(nb_tree *t) {
    nbp_keep(0, t);
    return t;
}
static nb_array *nbp_ka(nb_array *a) {
    nbp_keep(1, a);
    return a;
}
static nb_fn *nbp_kf(nb_fn *f) {
    nbp_keep(2, f);
    return f;
}

static void nbp_gc_run(void) {
    for (int i = g_gc.n - 1; i >= 0; i--) {
        switch (g_gc.items[i].kind) {
        case 0:
            nb_tree_destroy(g_gc.items[i].p);
            break;
        case 1:
            nb_array_destroy(g_gc.items[i].p);
            break;
        default:
            nb_fn_destroy(g_gc.items[i].p);
            break;
        }
    }
    g_gc.n = 0;
}

/* ---- trees ------------------------------------------------------------------------------- */

static nb_tree *nbp_tuple(nb_ctx *ctx, int n, nb_tree *const *items) {
    nb_tree *t = NULL;
    NBP_OK(ctx, nb_tree_tuple(ctx, n, items, &t));
    return nbp_kt(t);
}
static nb_tree *nbp_leaf_of(nb_array *a) {
    nb_tree *t = NULL;
    NBP_OK(nb_array_ctx(a), nb_tree_array(a, &t));
    return nbp_kt(t);
}
static nb_tree *nbp_null(nb_ctx *ctx) {
    nb_tree *t = NULL;
    NBP_OK(ctx, nb_tree_null(ctx, &t));
    return nbp_kt(t);
}
static nb_tree *nbp_int(nb_ctx *ctx, int64_t v) {
    nb_tree *t = NULL;
    NBP_OK(ctx, nb_tree_int(ctx, v, &t));
    return nbp_kt(t);
}

/* self of every body: (program pointer, op index, role) */
nb_tree *nbp_self(nb_ctx *ctx, const nbp_prog *P, int op, int role) {
    nb_tree *items[3] = {nbp_int(ctx, (int64_t)(intptr_t)P), nbp_int(ctx, op), nbp_int(ctx, role)};
    return nbp_tuple(ctx, 3, items);
}
nbp_prog *nbp_self_get(const nb_tree *self, int *op, int *role) {
    int64_t p = 0, o = 0, r = 0;
    nb_tree_get_int(nb_tree_child(self, 0), &p);
    nb_tree_get_int(nb_tree_child(self, 1), &o);
    nb_tree_get_int(nb_tree_child(self, 2), &r);
    *op = (int)o;
    *role = (int)r;
    return (nbp_prog *)(intptr_t)p;
}
int nbp_ci(const nbp_prog *P, const nb_trace *tr) {
    return nb_trace_ctx(tr) == P->ctx[1] ? 1 : 0;
}

/* ---- arrays ------------------------------------------------------------------------------ */

static double nbp_get(const nb_array *a, int64_t i) {
    const void *d = nb_array_data(a);
    switch (nb_array_dtype(a)) {
    case NB_DTYPE_F32:
        return ((const float *)d)[i];
    case NB_DTYPE_F64:
        return ((const double *)d)[i];
    case NB_DTYPE_I32:
        return ((const int32_t *)d)[i];
    case NB_DTYPE_I64:
        return (double)((const int64_t *)d)[i];
    default:
        return ((const uint8_t *)d)[i];
    }
}

static uint64_t nbp_get_bits(const nb_array *a, int64_t i) {
    const uint8_t *d = nb_array_data(a);
    size_t es = nb_dtype_size(nb_array_dtype(a));
    uint64_t u = 0;
    memcpy(&u, d + (size_t)i * es, es);
    return u;
}

/* store v (double) into element i of a buffer of dtype dt */
static void nbp_put(void *buf, nb_dtype dt, int64_t i, double v, int64_t iv, bool use_int) {
    switch (dt) {
    case NB_DTYPE_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case NB_DTYPE_F64:
        ((double *)buf)[i] = v;
        break;
    case NB_DTYPE_I32:
        if (!use_int) {
            iv = isnan(v)             ? 0
                 : v >= 2147483647.0  ? INT32_MAX
                 : v <= -2147483648.0 ? INT32_MIN
                                      : (int64_t)v;
        }
        ((int32_t *)buf)[i] = (int32_t)(iv > INT32_MAX   ? INT32_MAX
                                        : iv < INT32_MIN ? INT32_MIN
                                                         : iv);
        break;
    case NB_DTYPE_I64:
        if (!use_int) {
            iv = isnan(v) ? 0 : v >= 9.2e18 ? INT64_MAX : v <= -9.2e18 ? INT64_MIN : (int64_t)v;
        }
        ((int64_t *)buf)[i] = iv;
        break;
    default:
        ((uint8_t *)buf)[i] = use_int ? iv != 0 : v != 0;
        break;
    }
}

/* The data of input k: its fill (generic: finite values away from kinks, for R3/R4). */
static nb_array *nbp_make_input(const nbp_prog *P, int k, nb_ctx *ctx, bool generic) {
    const nbp_input *in = &P->in[k];
    int64_t n = nbp_size_of(in->rank, in->shape);
    size_t es = nb_dtype_size(in->dt);
    uint8_t *buf = calloc((size_t)(n > 0 ? n : 1), es);
    if (buf == NULL) {
        nbp_fail(ctx, "out of memory in the harness");
    }
    nbp_rng r = {nbp_mix(P->seed * 31 + (uint64_t)k + (generic ? 1000 : 0))};
    double c = nbp_special((unsigned)nbp_next(&r));
    int64_t ci = nbp_special_int((unsigned)nbp_next(&r), in->dt);
    for (int64_t i = 0; i < n; i++) {
        double u = nbp_unit(&r);
        uint64_t w = nbp_next(&r);
        if (generic) {
            if (nbp_is_float(in->dt)) {
                /* away from 0, where 1/x, log(x) and x/x have huge derivatives and what
                 * rounding leaves of cancelling terms is huge too */
                double v = (P->flags & NBP_GRAD_POSITIVE) ? 0.25 + 1.75 * u
                           : (w & 1)                      ? 0.25 + 1.25 * u
                                                          : -0.25 - 1.25 * u;
                nbp_put(buf, in->dt, i, v, 0, false);
            } else {
                nbp_put(buf, in->dt, i, 0, (int64_t)(w % 7) - 2, true);
            }
            continue;
        }
        bool is_int = nbp_is_int(in->dt);
        switch (in->fill) {
        case 0:
            nbp_put(buf, in->dt, i, -3.0 + 6.0 * u, (int64_t)(w % 11) - 5, is_int);
            break;
        case 1:
            if (w % 4 == 0) {
                nbp_put(buf, in->dt, i, nbp_special((unsigned)(w >> 8)),
                        nbp_special_int((unsigned)(w >> 8), in->dt), is_int);
            } else {
                nbp_put(buf, in->dt, i, -3.0 + 6.0 * u, (int64_t)(w % 11) - 5, is_int);
            }
            break;
        case 2:
            nbp_put(buf, in->dt, i, nbp_special((unsigned)(w >> 8)),
                    nbp_special_int((unsigned)(w >> 8), in->dt), is_int);
            break;
        case 3:
            nbp_put(buf, in->dt, i, (double)((int64_t)(w % 7) - 3), (int64_t)(w % 5), is_int);
            break;
        case 4:
            nbp_put(buf, in->dt, i, 0.1 + 2.9 * u, (int64_t)(w % 4) - 2, is_int);
            break;
        case 5:
            nbp_put(buf, in->dt, i, c, ci, is_int);
            break;
        case 6: {
            static const double ex[8] = {1e30, -1e30, 1e-30, -1e-39, 3e38, 1e-310, 1e200, -1e-300};
            nbp_put(buf, in->dt, i, ex[w % 8] * (1.0 + u), (int64_t)(w >> 1), is_int);
            break;
        }
        default:
            nbp_put(buf, in->dt, i, (double)i, i, is_int);
            break;
        }
    }
    nb_array *a = NULL;
    NBP_OK(ctx, nb_array_from_data(ctx, in->dt, in->rank, in->shape, buf, &a));
    free(buf);
    return nbp_ka(a);
}

/* random f64 / float array (weights, tangents) */
static nb_array *nbp_make_random(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape,
                                 uint64_t seed) {
    int64_t n = nbp_size_of(rank, shape);
    void *buf = calloc((size_t)(n > 0 ? n : 1), 8);
    if (buf == NULL) {
        nbp_fail(ctx, "out of memory in the harness");
    }
    nbp_rng r = {nbp_mix(seed)};
    for (int64_t i = 0; i < n; i++) {
        nbp_put(buf, dt, i, -1.0 + 2.0 * nbp_unit(&r), 0, false);
    }
    nb_array *a = NULL;
    NBP_OK(ctx, nb_array_from_data(ctx, dt, rank, shape, buf, &a));
    free(buf);
    return nbp_ka(a);
}

/* ---- the bodies ----------------------------------------------------------------------------- */

/* vars of the inputs */
static void nbp_inputs(nb_trace *tr, nbp_prog *P, const nb_tree *params, nb_var **v) {
    for (int k = 0; k < P->n_inputs; k++) {
        if (P->in[k].kind == NBP_IN_CONST) {
            v[k] = nb_constant(tr, P->consts[nbp_ci(P, tr)][k]);
        } else {
            v[k] = nb_var_of(tr, nb_tree_child(params, P->in[k].leaf));
        }
    }
}

static void nbp_replay(nb_trace *tr, nbp_prog *P, nb_var **v) {
    for (int oi = P->n_inputs; oi < P->n_ops; oi++) {
        nbp_op *op = &P->ops[oi];
        nb_var *ins[NBP_MAX_IN], *outs[2] = {NULL, NULL};
        if (op->dead) {
            continue;
        }
        for (int j = 0; j < op->n_in; j++) {
            ins[j] = v[op->in[j]];
        }
        nbp_apply(tr, P, oi, ins, outs);
        for (int k = 0; k < op->n_out; k++) {
            v[op->out0 + k] = outs[k];
        }
    }
}

/* the whole program (ROLE_MAIN: a tuple of the outputs) or its loss (ROLE_LOSS) */
static nb_status nbp_body_main(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    int oi = 0, role = 0;
    nbp_prog *P = nbp_self_get(self, &oi, &role);
    nb_var *v[NBP_MAX_VALS] = {0};
    nbp_inputs(tr, P, nb_tree_child(args, 0), v);
    if (!P->decoded) {
        P->decoded = true;
        nbp_decode(tr, P, v);
        if (P->rejected_op >= 0) {
            return nb_trace_status(tr);
        }
        nbp_choose_outputs(P);
    } else {
        nbp_replay(tr, P, v);
    }
    if (nb_trace_status(tr) != NB_OK) {
        return nb_trace_status(tr);
    }
    nb_ctx *ctx = nb_trace_ctx(tr);
    if (role == NBP_ROLE_MAIN) {
        nb_tree *items[NBP_MAX_VALS];
        for (int j = 0; j < P->n_outs; j++) {
            items[j] = nb_leaf(v[P->outs[j]]);
        }
        return nb_tree_tuple(ctx, P->n_outs, items, out);
    }
    if (role == NBP_ROLE_ALL) { /* every float value */
        nb_tree *items[NBP_MAX_VALS];
        int n = 0;
        for (int i = 0; i < P->n_vals; i++) {
            if (!P->ops[P->vals[i].op].dead && nbp_is_float(P->vals[i].dt)) {
                items[n++] = nb_leaf(v[i]);
            }
        }
        return nb_tree_tuple(ctx, n, items, out);
    }
    /* loss = sum_k sum(f64(out_k) * w_k) over the float outputs */
    const nb_tree *w = nb_tree_child(args, 1);
    nb_var *loss = NULL;
    int k = 0;
    for (int j = 0; j < P->n_outs; j++) {
        nb_var *o = v[P->outs[j]];
        if (!nbp_is_float(nb_var_dtype(o))) {
            continue;
        }
        nb_var *t = nb_sum(nb_mul(nb_cast(o, NB_DTYPE_F64), nb_var_of(tr, nb_tree_child(w, k++))),
                           NULL, 0, false);
        loss = loss == NULL ? t : nb_add(loss, t);
    }
    return nb_return(loss, out);
}

/* one op alone: args holds its operands' arrays */
static nb_status nbp_body_op(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    int oi = 0, role = 0;
    nbp_prog *P = nbp_self_get(self, &oi, &role);
    nbp_op *op = &P->ops[oi];
    nb_var *ins[NBP_MAX_IN], *outs[2] = {NULL, NULL};
    for (int j = 0; j < op->n_in; j++) {
        ins[j] = nb_var_of(tr, nb_tree_child(args, j));
    }
    int n = nbp_apply(tr, P, oi, ins, outs);
    if (nb_trace_status(tr) != NB_OK) {
        return nb_trace_status(tr);
    }
    nb_tree *items[2] = {NULL, NULL};
    for (int k = 0; k < n; k++) {
        items[k] = nb_leaf(outs[k]);
    }
    return nb_tree_tuple(nb_trace_ctx(tr), n, items, out);
}

/* ---- printing the inputs ---------------------------------------------------------------- */

static void nbp_print_input_values(FILE *f, const nbp_prog *P) {
    if (P->ctx[0] == NULL) {
        return;
    }
    for (int k = 0; k < P->n_inputs; k++) {
        nb_array *a = nbp_make_input(P, k, P->ctx[0], false);
        if (nb_array_size(a) <= 64) {
            fprintf(f, "  input %d = ", k);
            nb_array_fprint(a, f);
        }
    }
}

/* ---- comparing ------------------------------------------------------------------------------ */

/* x and y bit for bit. trace.h promises every bit for any thread count, but for fused,
 * folded and op-by-op evaluation of the same ops only a NaN's NaN-ness, not its sign and
 * payload: nan_bits says which (NABLA_FUZZ_NAN_BITS=1 makes every comparison strict). */
static void nbp_require_same(nb_ctx *ctx, const nb_array *x, const nb_array *y, const char *what,
                             bool nan_bits) {
    char sx[96], sy[96];
    nb_array_format_sig(x, sx, sizeof sx, NULL);
    nb_array_format_sig(y, sy, sizeof sy, NULL);
    if (strcmp(sx, sy) != 0) {
        nbp_fail(ctx, "%s: %s vs %s", what, sx, sy);
    }
    int64_t n = nb_array_size(x);
    bool fl = nbp_is_float(nb_array_dtype(x));
    for (int64_t i = 0; i < n; i++) {
        uint64_t bx = nbp_get_bits(x, i), by = nbp_get_bits(y, i);
        if (bx == by) {
            continue;
        }
        if (fl && !nan_bits && !g_nbp.nan_bits && isnan(nbp_get(x, i)) && isnan(nbp_get(y, i))) {
            continue;
        }
        nbp_fail(ctx,
                 "%s: %s differ at flat index %lld: %.17g (bits 0x%llx) vs %.17g (bits 0x%llx)",
                 what, sx, (long long)i, nbp_get(x, i), (unsigned long long)bx, nbp_get(y, i),
                 (unsigned long long)by);
    }
}

static void nbp_require_same_trees(nb_ctx *ctx, const nb_tree *x, const nb_tree *y,
                                   const char *what, bool nan_bits) {
    nb_tree *lx = NULL, *ly = NULL;
    NBP_OK(ctx, nb_tree_flatten(x, &lx, NULL));
    NBP_OK(nb_tree_ctx(y), nb_tree_flatten(y, &ly, NULL));
    if (nb_tree_len(lx) != nb_tree_len(ly)) {
        nbp_fail(ctx, "%s: %lld vs %lld arrays", what, (long long)nb_tree_len(lx),
                 (long long)nb_tree_len(ly));
    }
    for (int64_t i = 0; i < nb_tree_len(lx); i++) {
        char w[200];
        snprintf(w, sizeof w, "%s, array %lld", what, (long long)i);
        nbp_require_same(ctx, nb_tree_get_array(nb_tree_child(lx, i)),
                         nb_tree_get_array(nb_tree_child(ly, i)), w, nan_bits);
    }
    nb_tree_destroy(lx);
    nb_tree_destroy(ly);
}

/* A refusal must carry a status and a message naming the op (a composite or control-flow
 * op may name the primitive or body op that refused). */
static void nbp_check_refusal(nb_ctx *ctx, const nbp_prog *P, nb_status st) {
    const nbp_op *op = &P->ops[P->rejected_op];
    const char *msg = nb_ctx_errmsg(ctx);
    if (st == NB_OK || nb_ctx_errcode(ctx) != st) {
        nbp_fail(ctx, "refused op %s: the call returned %s but the context's error is %s",
                 nbp_op_names[op->code], nb_status_name(st), nb_status_name(nb_ctx_errcode(ctx)));
    }
    if (st == NB_ERR_INTERNAL) {
        nbp_fail(ctx, "refused op %s: an internal error", nbp_op_names[op->code]);
    }
    if (msg == NULL || msg[0] == '\0') {
        nbp_fail(ctx, "refused op %s: %s with an empty message", nbp_op_names[op->code],
                 nb_status_name(st));
    }
    const char *name = op->code == NBP_SCALAR_BIN ? nbp_op_names[op->p[0]] : nbp_op_names[op->code];
    bool composite = op->code == NBP_LOGSUMEXP || op->code == NBP_SOFTMAX ||
                     op->code == NBP_LOG_SOFTMAX || op->code == NBP_MEAN ||
                     (op->code >= NBP_RNG_BITS && op->code <= NBP_RNG_FOLD_IN) ||
                     op->code >= NBP_FORI || op->code == NBP_TAKE || op->code == NBP_TAKE_ALONG ||
                     op->code == NBP_ONE_HOT || op->code == NBP_MATMUL || op->code == NBP_DOT ||
                     op->code == NBP_DYN_SLICE || op->code == NBP_DYN_UPDATE;
    if (strstr(msg, name) == NULL && !(composite && strstr(msg, "nb_") != NULL)) {
        nbp_fail(ctx, "refused op %s: the message does not name it: %s", name, msg);
    }
}

/* ---- the checks ----------------------------------------------------------------------------- */

static bool nbp_has_loops(const nbp_prog *P) {
    for (int oi = P->n_inputs; oi < P->n_ops; oi++) {
        if (P->ops[oi].code >= NBP_FORI && P->ops[oi].code <= NBP_SWITCH) {
            return true;
        }
    }
    return false;
}

/* float values: any f32? any at all? */
static void nbp_float_kinds(const nbp_prog *P, bool *any_f32, bool *any_float) {
    *any_f32 = *any_float = false;
    for (int v = 0; v < P->n_vals; v++) {
        *any_f32 = *any_f32 || P->vals[v].dt == NB_DTYPE_F32;
        *any_float = *any_float || nbp_is_float(P->vals[v].dt);
    }
    for (int oi = P->n_inputs; oi < P->n_ops; oi++) {
        const nbp_op *op = &P->ops[oi];
        /* loops, casts and rng ops may make f32 values inside */
        if ((op->code == NBP_CAST && op->p[0] == NB_DTYPE_F32) ||
            ((op->code == NBP_RNG_UNIFORM || op->code == NBP_RNG_NORMAL ||
              op->code == NBP_RNG_TRUNC) &&
             op->p[2] == NB_DTYPE_F32)) {
            *any_f32 = true;
        }
    }
}

/* The largest factor a weak scalar multiplies or divides a float value by (the values
 * themselves, fills and samples included, are measured separately): rounding residues,
 * where a derivative's terms cancel, grow with it (4294967296 * (x - x) leaves 1e-8 after a
 * softmax), so the R3/R4 tolerances are scaled by it. */
static double nbp_const_scale(const nbp_prog *P) {
    double m = 1;
    for (int oi = P->n_inputs; oi < P->n_ops; oi++) {
        const nbp_op *op = &P->ops[oi];
        if (op->dead) {
            continue;
        }
        double c = fabs(op->f[0]);
        if (op->code == NBP_SCALAR_BIN && isfinite(c) && c > 0 &&
            nbp_is_float(P->vals[op->in[0]].dt) &&
            (op->p[0] == NBP_MUL || op->p[0] == NBP_DIV || op->p[0] == NBP_POW)) {
            m = fmax(m, fmax(c, 1 / c));
        }
    }
    return m;
}

/* the params tuple of a context: input arrays as leaves (frozen where asked), extras */
static nb_tree *nbp_params(const nbp_prog *P, nb_ctx *ctx, nb_array *const *arr) {
    nb_tree *items[NBP_MAX_INPUTS + 2];
    for (int k = 0; k < P->n_inputs; k++) {
        const nbp_input *in = &P->in[k];
        if (in->leaf < 0) {
            continue;
        }
        nb_tree *l = nbp_leaf_of(arr[in->kind == NBP_IN_TIED ? in->tie : k]);
        if (in->kind == NBP_IN_FROZEN) {
            nb_tree *fz = NULL;
            NBP_OK(ctx, nb_tree_freeze(l, &fz));
            l = nbp_kt(fz);
        }
        items[in->leaf] = l;
    }
    int n = P->n_leaves;
    if (P->flags & NBP_EXTRA_STATIC) {
        items[--n] = nbp_int(ctx, 3);
    }
    if (P->flags & NBP_EXTRA_NULL) {
        items[--n] = nbp_null(ctx);
    }
    return nbp_tuple(ctx, P->n_leaves, items);
}

/* tangents for params: random arrays at the differentiable leaves, null elsewhere */
static nb_tree *nbp_tangents(const nbp_prog *P, nb_ctx *ctx, uint64_t seed, nb_array **tan) {
    nb_tree *items[NBP_MAX_INPUTS + 2];
    for (int i = 0; i < P->n_leaves; i++) {
        items[i] = nbp_null(ctx);
    }
    for (int k = 0; k < P->n_inputs; k++) {
        const nbp_input *in = &P->in[k];
        tan[k] = NULL;
        if (in->leaf < 0 || in->kind == NBP_IN_FROZEN || !nbp_is_float(in->dt)) {
            continue;
        }
        tan[k] = nbp_make_random(ctx, in->dt, in->rank, in->shape, seed * 7 + (uint64_t)k);
        items[in->leaf] = nbp_leaf_of(tan[k]);
    }
    return nbp_tuple(ctx, P->n_leaves, items);
}

/* <tree of arrays at the param leaves, tangent arrays>: the sum, the sum of magnitudes and
 * the largest |tree element| (the scale of the partial derivatives) */
static bool nbp_dot(const nbp_prog *P, const nb_tree *g, nb_array *const *tan, double *dot,
                    double *mag, double *gmax) {
    *dot = *mag = *gmax = 0;
    for (int k = 0; k < P->n_inputs; k++) {
        if (tan[k] == NULL) {
            continue;
        }
        nb_array *ga = nb_tree_get_array(nb_tree_child(g, P->in[k].leaf));
        if (ga == NULL) {
            nbp_fail(nb_array_ctx(tan[k]), "no gradient array at args[0][%d] (input %d, %s)",
                     P->in[k].leaf, k, nb_dtype_name(P->in[k].dt));
        }
        for (int64_t i = 0; i < nb_array_size(ga); i++) {
            double t = nbp_get(ga, i) * nbp_get(tan[k], i);
            *dot += t;
            *mag += fabs(t);
            *gmax = fmax(*gmax, fabs(nbp_get(ga, i)));
        }
    }
    return isfinite(*dot) && isfinite(*mag);
}

static bool nbp_tree_finite(const nb_tree *t) {
    nb_tree *l = NULL;
    if (nb_tree_flatten(t, &l, NULL) != NB_OK) {
        return false;
    }
    bool ok = true;
    for (int64_t i = 0; ok && i < nb_tree_len(l); i++) {
        nb_array *a = nb_tree_get_array(nb_tree_child(l, i));
        if (!nbp_is_float(nb_array_dtype(a))) {
            continue;
        }
        for (int64_t j = 0; ok && j < nb_array_size(a); j++) {
            ok = isfinite(nbp_get(a, j));
        }
    }
    nb_tree_destroy(l);
    return ok;
}

/* A transformed call that fails: fine only for programs with loops (reverse mode through a
 * lax loop, second derivatives through loops), and only with a message. */
static bool nbp_transform_refused(nb_ctx *ctx, const nbp_prog *P, nb_status st, const char *what) {
    if (st == NB_OK) {
        return false;
    }
    const char *msg = nb_ctx_errmsg(ctx);
    if (!nbp_has_loops(P) || st == NB_ERR_INTERNAL || msg == NULL || msg[0] == '\0') {
        nbp_fail(ctx, "%s returned %s", what, nb_status_name(st));
    }
    if (g_nbp.debug) {
        fprintf(stderr, "[nabla-fuzz] %s refused: %s\n", what, msg);
    }
    nb_ctx_clear_error(ctx);
    return true;
}

static void nbp_check_grads(nbp_prog *P, nb_array *const *arrA, nb_array *const *arrB,
                            const nb_tree *outA) {
    nb_ctx *ca = P->ctx[0], *cb = P->ctx[1];
    /* weights, one f64 array per float output */
    nb_tree *wa[NBP_MAX_VALS], *wb[NBP_MAX_VALS], *na[NBP_MAX_VALS];
    int nw = 0;
    for (int j = 0; j < P->n_outs; j++) {
        const nbp_val *v = &P->vals[P->outs[j]];
        if (!nbp_is_float(v->dt)) {
            continue;
        }
        uint64_t s = P->seed * 1000003u + (uint64_t)j;
        wa[nw] = nbp_leaf_of(nbp_make_random(ca, NB_DTYPE_F64, v->rank, v->shape, s));
        wb[nw] = nbp_leaf_of(nbp_make_random(cb, NB_DTYPE_F64, v->rank, v->shape, s));
        na[nw] = nbp_null(ca);
        nw++;
    }
    (void)outA;
    if (nw == 0) {
        return;
    }
    nb_tree *pa = nbp_params(P, ca, arrA), *pb = nbp_params(P, cb, arrB);
    nb_tree *argsA = nbp_tuple(ca, 2, (nb_tree *[]){pa, nbp_tuple(ca, nw, wa)});
    nb_tree *argsB = nbp_tuple(cb, 2, (nb_tree *[]){pb, nbp_tuple(cb, nw, wb)});

    nb_fn *L = NULL, *gL = NULL, *jgL = NULL;
    NBP_OK(ca, nb_fn_create(ca, "loss", nbp_body_main, nbp_self(ca, P, -1, NBP_ROLE_LOSS), &L));
    nbp_kf(L);
    NBP_OK(ca, nb_grad(L, NULL, &gL));
    nbp_kf(gL);
    NBP_OK(ca, nb_jit(gL, NULL, &jgL));
    nbp_kf(jgL);
    nb_tree *g1 = NULL, *g2 = NULL;
    nb_status s1 = nb_fn_call(gL, argsA, &g1);
    nbp_kt(g1);
    if (nbp_transform_refused(ca, P, s1, "grad(L)")) {
        nb_status s2 = nb_fn_call(jgL, argsA, &g2);
        nbp_kt(g2);
        if (s2 != s1) {
            nbp_fail(ca, "grad(L) returned %s but jit(grad(L)) %s", nb_status_name(s1),
                     nb_status_name(s2));
        }
        nb_ctx_clear_error(ca);
        g_nbp.stats.grad_refused++;
        return;
    }
    NBP_OK(ca, nb_fn_call(jgL, argsA, &g2));
    nbp_kt(g2);
    /* R3: jit(grad) == grad */
    nbp_require_same_trees(ca, g1, g2, "R3: grad(L) vs jit(grad(L))", false);
    /* R5: the gradient's structure is the template's */
    nb_tree *tmpl = NULL;
    NBP_OK(ca, nb_grad_template(pa, NULL, &tmpl));
    nbp_kt(tmpl);
    bool same = false;
    NBP_OK(ca, nb_tree_structure_equal(g1, tmpl, &same));
    if (!same) {
        char d[512] = "";
        bool differ = false;
        nb_tree_diff(g1, tmpl, NB_TREE_DIFF_STRUCTURE, &differ, d, sizeof d, NULL);
        nbp_fail(ca, "R5: grad's tree differs from nb_grad_template's: %s", d);
    }
    for (int i = 0; i < P->n_leaves; i++) {
        nb_array *ga = nb_tree_get_array(nb_tree_child(g1, i));
        nb_array *ta = nb_tree_get_array(nb_tree_child(tmpl, i));
        if ((ga == NULL) != (ta == NULL)) {
            nbp_fail(ca, "R5: args[0][%d]: grad %s an array, the template %s", i,
                     ga ? "has" : "lacks", ta ? "has" : "lacks");
        }
        char s1g[96], s2g[96];
        if (ga != NULL) {
            nb_array_format_sig(ga, s1g, sizeof s1g, NULL);
            nb_array_format_sig(ta, s2g, sizeof s2g, NULL);
            if (strcmp(s1g, s2g) != 0) {
                nbp_fail(ca, "R5: args[0][%d]: grad %s, template %s", i, s1g, s2g);
            }
        }
    }
    /* R2 for the gradient: 3 threads */
    if (!(P->flags & NBP_NO_THREADS)) {
        nb_fn *Lb = NULL, *gLb = NULL;
        NBP_OK(cb,
               nb_fn_create(cb, "loss", nbp_body_main, nbp_self(cb, P, -1, NBP_ROLE_LOSS), &Lb));
        nbp_kf(Lb);
        NBP_OK(cb, nb_grad(Lb, NULL, &gLb));
        nbp_kf(gLb);
        nb_tree *g3 = NULL;
        NBP_OK(cb, nb_fn_call(gLb, argsB, &g3));
        nbp_kt(g3);
        nbp_require_same_trees(ca, g1, g3, "R2: grad(L) at 1 vs 3 threads", true);
    }
    /* R3: jvp along u vs <grad, u> */
    bool any_f32 = false, any_float = false;
    nbp_float_kinds(P, &any_f32, &any_float);
    nb_array *u[NBP_MAX_INPUTS], *vv[NBP_MAX_INPUTS];
    nb_tree *tu = nbp_tangents(P, ca, P->seed + 11, u);
    int64_t n_tan = 0; /* elements with a tangent: rounding residues add up over them */
    for (int k = 0; k < P->n_inputs; k++) {
        n_tan += u[k] != NULL ? nb_array_size(u[k]) : 0;
    }
    nb_tree *tv = nbp_tangents(P, ca, P->seed + 23, vv);
    nb_tree *nullw = nbp_tuple(ca, nw, na);
    nb_fn *J = NULL;
    NBP_OK(ca, nb_jvp(L, &J));
    nbp_kf(J);
    nb_tree *jargs =
        nbp_tuple(ca, 2, (nb_tree *[]){argsA, nbp_tuple(ca, 2, (nb_tree *[]){tu, nullw})});
    nb_tree *jo = NULL;
    nb_status sj = nb_fn_call(J, jargs, &jo);
    nbp_kt(jo);
    if (nbp_transform_refused(ca, P, sj, "jvp(L)")) {
        g_nbp.stats.grad_refused++;
        return;
    }
    nb_array *loss = nb_tree_get_array(nb_tree_child(jo, 0));
    nb_array *dl = nb_tree_get_array(nb_tree_child(jo, 1));
    if (loss == NULL || dl == NULL || nb_array_size(dl) != 1) {
        nbp_fail(ca, "jvp(L) did not return (loss, dloss) arrays");
    }
    double dot = 0, mag = 0, gmax = 0;
    bool fin = nbp_dot(P, g1, u, &dot, &mag, &gmax) && nbp_tree_finite(g1) && nbp_tree_finite(jo);
    /* at the special inputs (2^24 in f32, 1e-300, ...) rounding decides; compare there only
     * the bits above */
    if (P->flags & NBP_GRAD_SPECIAL) {
        return;
    }
    /* Where the derivative's terms cancel (x / x), what is left is rounding, times every
     * derivative after it: a loop of exp turns 1e-7 into 1e4. So the tolerances grow with
     * the largest finite value of the program (every float value at these inputs, one more
     * compile) and its largest constant; where they would pass anything, no check. */
    double vmax = 0;
    {
        nb_fn *fa = NULL;
        nb_tree *all = NULL, *leaves = NULL;
        NBP_OK(ca, nb_fn_create(ca, "all", nbp_body_main, nbp_self(ca, P, -1, NBP_ROLE_ALL), &fa));
        nbp_kf(fa);
        NBP_OK(ca, nb_fn_call(fa, nbp_tuple(ca, 1, (nb_tree *[]){pa}), &all));
        nbp_kt(all);
        NBP_OK(ca, nb_tree_flatten(all, &leaves, NULL));
        nbp_kt(leaves);
        for (int64_t i = 0; i < nb_tree_len(leaves); i++) {
            nb_array *a = nb_tree_get_array(nb_tree_child(leaves, i));
            for (int64_t e = 0; e < nb_array_size(a); e++) {
                double x = fabs(nbp_get(a, e));
                vmax = isfinite(x) ? fmax(vmax, x) : vmax;
            }
        }
    }
    double scale = nbp_const_scale(P) * fmax(1, vmax);
    fin = fin && scale < (any_f32 ? 250 : 1e8); /* (beyond, the tolerances say little) */
    if (!fin) {
        g_nbp.stats.grad_skipped++;
    } else {
        double j = nbp_get(dl, 0);
        /* relative to the terms, plus a floor for the rounding left where terms cancel
         * (x / x has the derivative 1/x - x/x^2: about eps/x, not 0, in one mode) */
        double rtol = (any_f32 ? 2e-3 : 1e-9) * scale, afloor = (any_f32 ? 1e-3 : 1e-9) * scale;
        double err = fabs(j - dot),
               tol = rtol * (mag + fabs(j)) + afloor * (1 + gmax) * (1 + (double)n_tan / 4096);
        if (!(err <= tol)) {
            nbp_fail(
                ca,
                "R3: jvp(L)(x; u) = %.17g but <grad L(x), u> = %.17g (|diff| %.3g > tol %.3g; sum "
                "|g_i u_i| = %.3g, max |g_i| = %.3g, rtol %g)",
                j, dot, err, tol, mag, gmax, rtol);
        }
        g_nbp.stats.grad_checked++;
    }
    /* R4: Hessian symmetry for all-f64 programs */
    if (any_f32 || !any_float || !fin || (P->flags & NBP_NO_HESS)) {
        return;
    }
    nb_fn *H = NULL;
    NBP_OK(ca, nb_jvp(gL, &H));
    nbp_kf(H);
    nb_tree *hu = NULL, *hv = NULL;
    nb_tree *ha =
        nbp_tuple(ca, 2, (nb_tree *[]){argsA, nbp_tuple(ca, 2, (nb_tree *[]){tu, nullw})});
    nb_tree *hb =
        nbp_tuple(ca, 2, (nb_tree *[]){argsA, nbp_tuple(ca, 2, (nb_tree *[]){tv, nullw})});
    nb_status sh = nb_fn_call(H, ha, &hu);
    nbp_kt(hu);
    if (nbp_transform_refused(ca, P, sh, "jvp(grad(L))")) {
        return;
    }
    NBP_OK(ca, nb_fn_call(H, hb, &hv));
    nbp_kt(hv);
    /* hu = (grad, H u): a grad tree shaped like (params, weights)? grad is of args[0] */
    const nb_tree *Hu = nb_tree_child(hu, 1), *Hv = nb_tree_child(hv, 1);
    if (!nbp_tree_finite(hu) || !nbp_tree_finite(hv)) {
        return;
    }
    double uhv = 0, muhv = 0, vhu = 0, mvhu = 0, m1 = 0, m2 = 0;
    nbp_dot(P, Hv, u, &uhv, &muhv, &m1);
    nbp_dot(P, Hu, vv, &vhu, &mvhu, &m2);
    if (!isfinite(uhv) || !isfinite(vhu)) {
        return;
    }
    double err = fabs(uhv - vhu),
           tol = scale *
                 (1e-7 * (muhv + mvhu) + 1e-10 * (1 + fmax(m1, m2)) * (1 + (double)n_tan / 4096));
    if (!(err <= tol)) {
        nbp_fail(ca, "R4: u^T H v = %.17g but v^T H u = %.17g (|diff| %.3g > tol %.3g)", uhv, vhu,
                 err, tol);
    }
    g_nbp.stats.hess_checked++;
}

/* The leak check: the object counters back to the baseline; the bytes in use too, except
 * that a context keeps some memory that only grows (high-water marks: the slabs that array
 * and tree headers are carved from, the leaf and node buffers of nb_fn_call, kernel
 * scratch). So bytes above the baseline make nbp_run replay the same input once more, with
 * the baseline raised: a second growth is a leak. (ASan's LeakSanitizer catches memory that
 * nothing points to.) Returns whether the bytes moved. */
static bool nbp_check_nothing_live(int ci, bool strict) {
    nb_ctx *ctx = g_nbp.ctx[ci];
    nb_ctx_stats s;
    NBP_OK(ctx, nb_ctx_stats_get(ctx, &s));
    const nb_ctx_stats *b = &g_nbp.base[ci];
    size_t bytes = s.bytes_in_use;
    bool moved = bytes != b->bytes_in_use;
    if (s.live_arrays != b->live_arrays || s.live_trees != b->live_trees ||
        s.live_treedefs != b->live_treedefs || s.live_buffers != b->live_buffers ||
        s.live_fns != b->live_fns || (strict && moved)) {
        nbp_fail(
            ctx,
            "R6: leak in the %d-thread context%s: live arrays %lld (expected %lld), trees %lld "
            "(%lld), treedefs %lld (%lld), buffers %lld (%lld), fns %lld (%lld), bytes in use %zu "
            "(%zu)",
            ci ? 3 : 1, strict ? " (the input run a second time)" : "", (long long)s.live_arrays,
            (long long)b->live_arrays, (long long)s.live_trees, (long long)b->live_trees,
            (long long)s.live_treedefs, (long long)b->live_treedefs, (long long)s.live_buffers,
            (long long)b->live_buffers, (long long)s.live_fns, (long long)b->live_fns, bytes,
            b->bytes_in_use);
    }
    return moved;
}

static void nbp_rebase(void) {
    for (int ci = 0; ci < 2; ci++) {
        nb_ctx_stats_get(g_nbp.ctx[ci], &g_nbp.base[ci]);
    }
}

/* R7: the whole program traced, compiled and run once more with one allocation failing
 * (or every one from some point on), picked by a hash of the input so that a saved input
 * replays the same failure: the call returns NB_ERR_OOM with a message and no outputs (or,
 * if the library could do without that allocation, the same bits), and the context still
 * works -- the next call gives the same bits. Leaks are R6's. */
static void nbp_check_oom(nbp_prog *P, nb_fn *jf, const nb_tree *args, const nb_tree *outA) {
    nb_ctx *ca = P->ctx[0];
    nb_tree *o = NULL;
    nb_ctx_clear_cache(ca);
    nbp_alloc_arm(-1, false);
    NBP_OK(ca, nb_fn_call(jf, args, &o));
    int64_t n = g_nbp.alloc.calls;
    nb_tree_destroy(o);
    if (n == 0) {
        return;
    }
    uint64_t h = nbp_mix(P->seed);
    for (size_t i = 0; i < P->size; i++) {
        h = nbp_mix(h ^ P->data[i]);
    }
    int64_t at = (int64_t)(h % (uint64_t)n);
    bool sticky = (h >> 63) & 1;
    nb_ctx_clear_cache(ca);
    nbp_alloc_arm(at, sticky);
    o = NULL;
    nb_status st = nb_fn_call(jf, args, &o);
    int64_t failures = g_nbp.alloc.failures;
    nbp_alloc_arm(-1, false);
    if (failures > 0) {
        char what[160];
        snprintf(what, sizeof what, "R7: the program with allocation %lld of %lld failing%s",
                 (long long)at, (long long)n, sticky ? " (and every one after)" : "");
        if (st == NB_OK) {
            nbp_require_same_trees(ca, outA, o, what, false);
        } else if (st != NB_ERR_OOM || o != NULL) {
            nbp_fail(ca, "%s returned %s%s", what, nb_status_name(st),
                     o != NULL ? " with outputs" : "");
        } else if (nb_ctx_errcode(ca) != NB_ERR_OOM || nb_ctx_errmsg(ca)[0] == '\0') {
            nbp_fail(ca, "%s returned ERR_OOM but the context's error is %s (\"%s\")", what,
                     nb_status_name(nb_ctx_errcode(ca)), nb_ctx_errmsg(ca));
        }
        if (g_nbp.debug) {
            fprintf(stderr, "[nabla-fuzz] %s: %s (%s)\n", what, nb_status_name(st),
                    nb_ctx_errmsg(ca));
        }
    }
    nb_tree_destroy(o);
    nb_ctx_clear_error(ca);
    o = NULL;
    nb_status again = nb_fn_call(jf, args, &o);
    nbp_kt(o);
    if (again != NB_OK) {
        nbp_fail(ca, "R7: after an allocation failure the program's next call returned %s",
                 nb_status_name(again));
    }
    nbp_require_same_trees(ca, outA, o, "R7: the call after an allocation failure", false);
    g_nbp.stats.oom_checked++;
}

/* ---- one input ------------------------------------------------------------------------------- */

/* one run of an input; returns whether the bytes in use moved (strict: that is a leak) */
static bool nbp_run_once(const uint8_t *data, size_t size, bool strict, const nbp_prog *fixed) {
    nbp_prog *P = calloc(1, sizeof *P);
    if (P == NULL) {
        nbp_fail(NULL, "out of memory in the harness");
    }
    if (fixed != NULL) { /* an already decoded program (the minimizer's) */
        memcpy(P, fixed, sizeof *P);
        memset(P->consts, 0, sizeof P->consts);
        for (int oi = 0; oi < NBP_MAX_OPS; oi++) {
            memset(P->ops[oi].fn, 0, sizeof P->ops[oi].fn);
        }
        P->decoded = true;
    }
    P->data = data;
    P->size = size;
    P->rejected_op = -1;
    P->ctx[0] = g_nbp.ctx[0];
    P->ctx[1] = g_nbp.ctx[1];
    g_nbp.cur = P;
    if (fixed == NULL) {
        nbp_decode_header(P);
    }
    nb_ctx *ca = P->ctx[0], *cb = P->ctx[1];

    nb_array *arrA[NBP_MAX_INPUTS] = {0}, *arrB[NBP_MAX_INPUTS] = {0};
    for (int k = 0; k < P->n_inputs; k++) {
        if (P->in[k].kind == NBP_IN_TIED) {
            arrA[k] = arrA[P->in[k].tie];
            arrB[k] = arrB[P->in[k].tie];
            continue;
        }
        arrA[k] = nbp_make_input(P, k, ca, false);
        arrB[k] = nbp_make_input(P, k, cb, false);
        if (P->in[k].kind == NBP_IN_CONST) {
            P->consts[0][k] = arrA[k];
            P->consts[1][k] = arrB[k];
        }
    }
    nb_tree *argsA = nbp_tuple(ca, 1, (nb_tree *[]){nbp_params(P, ca, arrA)});
    nb_fn *f = NULL, *jf = NULL;
    NBP_OK(ca, nb_fn_create(ca, "program", nbp_body_main, nbp_self(ca, P, -1, NBP_ROLE_MAIN), &f));
    nbp_kf(f);
    NBP_OK(ca, nb_jit(f, NULL, &jf));
    nbp_kf(jf);

    /* the first trace decodes the program */
    nb_tree *outA = NULL;
    nb_status st = nb_fn_call(jf, argsA, &outA);
    nbp_kt(outA);
    if (P->rejected_op >= 0) {
        g_nbp.stats.rejected++;
        nbp_check_refusal(ca, P, st);
        if (g_nbp.debug) {
            fprintf(stderr, "[nabla-fuzz] refused: %s\n", nb_ctx_errmsg(ca));
        }
        nb_ctx_clear_error(ca);
        /* go on with the valid prefix */
        P->n_ops = P->rejected_op;
        int nv = P->n_inputs;
        for (int oi = P->n_inputs; oi < P->n_ops; oi++) {
            nv = P->ops[oi].out0 + P->ops[oi].n_out;
        }
        P->n_vals = nv;
        for (int v = 0; v < P->n_vals; v++) {
            P->vals[v].uses = 0;
        }
        for (int oi = P->n_inputs; oi < P->n_ops; oi++) {
            for (int j = 0; j < P->ops[oi].n_in; j++) {
                P->vals[P->ops[oi].in[j]].uses++;
            }
        }
        nbp_choose_outputs(P);
        P->rejected_op = -1;
        if (P->n_vals == 0) {
            goto done;
        }
        st = nb_fn_call(jf, argsA, &outA);
        nbp_kt(outA);
    }
    if (P->n_vals == 0) {
        goto done;
    }
    if (g_nbp.debug) {
        nbp_print_program(stderr, P);
    }
    if (st != NB_OK) {
        nbp_fail(ca, "the program was accepted at trace time but its call returned %s",
                 nb_status_name(st));
    }
    g_nbp.stats.programs++;
    g_nbp.stats.ops += P->n_ops - P->n_inputs;
    if (nb_tree_len(outA) != P->n_outs) {
        nbp_fail(ca, "the program returned %lld outputs, not %d", (long long)nb_tree_len(outA),
                 P->n_outs);
    }

    /* R1: op by op, each op its own nb_eval */
    nb_array *val[NBP_MAX_VALS] = {0};
    for (int oi = 0; oi < P->n_ops; oi++) {
        nbp_op *op = &P->ops[oi];
        if (op->code == NBP_PARAM) {
            val[op->out0] = arrA[oi];
            continue;
        }
        if (op->dead) {
            continue;
        }
        nb_tree *items[NBP_MAX_IN];
        for (int j = 0; j < op->n_in; j++) {
            items[j] = nbp_leaf_of(val[op->in[j]]);
        }
        nb_tree *oargs = nbp_tuple(ca, op->n_in, items), *oout = NULL;
        nb_status so = nb_eval(ca, nbp_body_op, nbp_self(ca, P, oi, NBP_ROLE_OP), oargs, &oout);
        nbp_kt(oout);
        if (so != NB_OK) {
            nbp_fail(ca, "R1: op v%d = %s alone returned %s though the whole program was accepted",
                     op->out0, nbp_op_names[op->code], nb_status_name(so));
        }
        for (int k = 0; k < op->n_out; k++) {
            nb_array *a = nb_tree_get_array(nb_tree_child(oout, k));
            const nbp_val *v = &P->vals[op->out0 + k];
            if (a == NULL || nb_array_dtype(a) != v->dt || nb_array_rank(a) != v->rank ||
                memcmp(nb_array_shape(a), v->shape, (size_t)v->rank * sizeof(int64_t)) != 0) {
                char s1[96] = "?", s2[96];
                if (a != NULL) {
                    nb_array_format_sig(a, s1, sizeof s1, NULL);
                }
                nbp_fmt_shape(s2, sizeof s2, v->dt, v->rank, v->shape);
                nbp_fail(ca, "R1: op v%d = %s alone gives %s, traced in the program %s",
                         op->out0 + k, nbp_op_names[op->code], s1, s2);
            }
            val[op->out0 + k] = a;
        }
    }
    for (int j = 0; j < P->n_outs; j++) {
        char w[160];
        snprintf(w, sizeof w, "R1: output v%d, whole program (jit) vs op by op", P->outs[j]);
        nbp_require_same(ca, nb_tree_get_array(nb_tree_child(outA, j)), val[P->outs[j]], w, false);
    }

    /* R2: 3 threads */
    if (!(P->flags & NBP_NO_THREADS)) {
        nb_tree *argsB = nbp_tuple(cb, 1, (nb_tree *[]){nbp_params(P, cb, arrB)});
        nb_fn *fb = NULL, *jfb = NULL;
        NBP_OK(cb,
               nb_fn_create(cb, "program", nbp_body_main, nbp_self(cb, P, -1, NBP_ROLE_MAIN), &fb));
        nbp_kf(fb);
        NBP_OK(cb, nb_jit(fb, NULL, &jfb));
        nbp_kf(jfb);
        nb_tree *outB = NULL;
        NBP_OK(cb, nb_fn_call(jfb, argsB, &outB));
        nbp_kt(outB);
        nbp_require_same_trees(ca, outA, outB, "R2: the program at 1 vs 3 threads", true);
    }

    /* donation: every argument donated (tied inputs: one array at two leaves) */
    if (P->flags & NBP_DONATE) {
        nb_array *cp[NBP_MAX_INPUTS] = {0};
        for (int k = 0; k < P->n_inputs; k++) {
            if (P->in[k].kind == NBP_IN_TIED) {
                cp[k] = cp[P->in[k].tie];
            } else if (P->in[k].kind != NBP_IN_CONST) {
                NBP_OK(ca, nb_array_copy(arrA[k], &cp[k]));
                nbp_ka(cp[k]);
            } else {
                cp[k] = arrA[k];
            }
        }
        nb_tree *dargs = nbp_tuple(ca, 1, (nb_tree *[]){nbp_params(P, ca, cp)});
        nb_tree *don = NULL, *outD = NULL;
        NBP_OK(ca, nb_tree_bool(ca, true, &don));
        nbp_kt(don);
        nb_call_opts o = nb_call_opts_default();
        o.donate = don;
        NBP_OK(ca, nb_fn_call_ex(jf, dargs, &o, &outD));
        nbp_kt(outD);
        nbp_require_same_trees(ca, outA, outD, "donated arguments vs not", false);
        g_nbp.stats.donate_checked++;
    }

    if (P->flags & NBP_OOM) {
        nbp_check_oom(P, jf, argsA, outA);
    }

    /* R3-R5 */
    if (!(P->flags & NBP_NO_GRAD)) {
        nb_array *ga[NBP_MAX_INPUTS] = {0}, *gb[NBP_MAX_INPUTS] = {0};
        for (int k = 0; k < P->n_inputs; k++) {
            if (P->flags & NBP_GRAD_SPECIAL) {
                ga[k] = arrA[k];
                gb[k] = arrB[k];
            } else if (P->in[k].kind == NBP_IN_TIED) {
                ga[k] = ga[P->in[k].tie];
                gb[k] = gb[P->in[k].tie];
            } else {
                ga[k] = nbp_make_input(P, k, ca, true);
                gb[k] = nbp_make_input(P, k, cb, true);
            }
            if (P->in[k].kind == NBP_IN_CONST) {
                P->consts[0][k] = ga[k];
                P->consts[1][k] = gb[k];
            }
        }
        nbp_check_grads(P, ga, gb, outA);
    }

done:
    nbp_gc_run();
    for (int ci = 0; ci < 2; ci++) {
        for (int oi = 0; oi < NBP_MAX_OPS; oi++) {
            for (int s = NBP_MAX_FNS - 1; s >= 0; s--) {
                nb_fn_destroy(P->ops[oi].fn[ci][s]);
                P->ops[oi].fn[ci][s] = NULL;
            }
        }
    }
    bool moved = false;
    for (int ci = 0; ci < 2; ci++) {
        nb_ctx_clear_cache(g_nbp.ctx[ci]);
        nb_ctx_clear_error(g_nbp.ctx[ci]);
        if (!g_nbp.no_leak_check) {
            moved = nbp_check_nothing_live(ci, strict) || moved;
        }
    }
    g_nbp.cur = NULL;
    free(P);
    return moved;
}

int nbp_run(const uint8_t *data, size_t size) {
    g_nbp.stats.inputs++;
    if (nbp_run_once(data, size, false, NULL)) {
        nbp_stats keep = g_nbp.stats;
        nbp_rebase();
        nbp_run_once(data, size, true, NULL);
        g_nbp.stats = keep;
        g_nbp.stats.reruns++;
    }
    return 0;
}

/* ---- set-up ------------------------------------------------------------------------------- */

int nbp_init(void) {
    const char *dbg = getenv("NABLA_FUZZ_DEBUG");
    g_nbp.debug = dbg != NULL && dbg[0] != '\0' && dbg[0] != '0';
    const char *nb = getenv("NABLA_FUZZ_NAN_BITS");
    g_nbp.nan_bits = nb != NULL && nb[0] != '\0' && nb[0] != '0';
    g_nbp.alloc.real = nb_allocator_default();
    nbp_alloc_arm(-1, false);
    for (int ci = 0; ci < 2; ci++) {
        nb_ctx_opts o = nb_ctx_opts_default();
        o.n_threads = ci == 0 ? 1 : 3;
        if (ci == 0) {
            o.allocator.alloc = nbp_alloc_fn;
            o.allocator.free = nbp_free_fn;
            o.allocator.ud = &g_nbp.alloc;
        }
        if (nb_ctx_create(&o, &g_nbp.ctx[ci]) != NB_OK) {
            fprintf(stderr, "nabla-fuzz: nb_ctx_create failed\n");
            return -1;
        }
    }
    /* warm up (tables made lazily, the pool's threads, the cache's table), then take the
     * baseline: one small program with a matmul, a reduction and a loop */
    static const uint8_t warm[] = {0x00, 0x00, 0, 1,  2, 1, 2, 1, 1,  0, 1, 2, 1, 0, 0, 28,
                                   0,    0,    0, 14, 0, 0, 0, 0, 31, 0, 0, 0, 0, 0, 0};
    bool debug = g_nbp.debug;
    g_nbp.debug = false;
    g_nbp.no_leak_check = true;
    nbp_run(warm, sizeof warm);
    g_nbp.no_leak_check = false;
    g_nbp.debug = debug;
    memset(&g_nbp.stats, 0, sizeof g_nbp.stats);
    nbp_rebase();
    return 0;
}

void nbp_fini(void) {
    for (int ci = 0; ci < 2; ci++) {
        nb_ctx_destroy(g_nbp.ctx[ci]);
        g_nbp.ctx[ci] = NULL;
    }
    free(g_gc.items);
    g_gc.items = NULL;
    g_gc.n = g_gc.cap = 0;
}

nbp_stats nbp_stats_get(void) {
    return g_nbp.stats;
}

void nbp_stats_print(FILE *f, const char *prefix) {
    const nbp_stats *s = &g_nbp.stats;
    fprintf(
        f,
        "%s%lld inputs: %lld programs checked (%lld ops), %lld refused at trace time; grad "
        "checks %lld (skipped %lld: non-finite or too large values; %lld refused), Hessian checks "
        "%lld, donation checks %lld, allocation-failure checks %lld, inputs run twice %lld\n",
        prefix, (long long)s->inputs, (long long)s->programs, (long long)s->ops,
        (long long)s->rejected, (long long)s->grad_checked, (long long)s->grad_skipped,
        (long long)s->grad_refused, (long long)s->hess_checked, (long long)s->donate_checked,
        (long long)s->oom_checked, (long long)s->reruns);
}

/* ---- inputs for the driver ------------------------------------------------------------------ */

size_t nbp_random_input(uint64_t seed, uint64_t index, uint8_t *buf, size_t cap) {
    nbp_rng r = {nbp_mix(seed * 0x100000001b3u + index)};
    size_t n = 24 + (size_t)(nbp_next(&r) % 140);
    if (n > cap) {
        n = cap;
    }
    for (size_t i = 0; i < n; i++) {
        buf[i] = (uint8_t)nbp_next(&r);
    }
    return n;
}

/* ---- the minimizer -------------------------------------------------------------------------- */

/* Run a decoded program (or the bytes when P is NULL); returns true if a rule broke, with
 * the message in g_nbp.fail_msg and the program in *failed. The contexts are made again
 * after a failure (a jump may leave them mid-call). */
static bool nbp_try(const uint8_t *data, size_t size, const nbp_prog *P, nbp_prog *failed) {
    g_nbp.catching = true;
    g_nbp.fail_prog = failed;
    g_nbp.fail_msg[0] = '\0';
    volatile bool broke = false;
    if (setjmp(g_nbp.jump) == 0) {
        if (nbp_run_once(data, size, false, P)) {
            nbp_rebase();
            nbp_run_once(data, size, true, P);
        }
    } else {
        broke = true;
        g_gc.n = 0; /* (whatever was live goes with the contexts) */
        g_nbp.cur = NULL;
        for (int ci = 0; ci < 2; ci++) {
            nb_ctx_destroy(g_nbp.ctx[ci]);
            g_nbp.ctx[ci] = NULL;
        }
        g_nbp.catching = false;
        nbp_init();
    }
    g_nbp.catching = false;
    return broke;
}

static size_t nbp_rule_len(const char *msg) {
    const char *c = strchr(msg, ':');
    return c != NULL ? (size_t)(c - msg) : strlen(msg);
}

/* drop the ops nothing kept needs */
static void nbp_dce(nbp_prog *P) {
    bool need[NBP_MAX_VALS] = {false};
    for (int j = 0; j < P->n_outs; j++) {
        need[P->outs[j]] = true;
    }
    for (int oi = P->n_ops - 1; oi >= P->n_inputs; oi--) {
        nbp_op *op = &P->ops[oi];
        if (op->dead) {
            continue;
        }
        bool live = false;
        for (int k = 0; k < op->n_out; k++) {
            live = live || need[op->out0 + k];
        }
        if (!live) {
            op->dead = true;
            continue;
        }
        for (int j = 0; j < op->n_in; j++) {
            need[op->in[j]] = true;
        }
    }
}

static bool nbp_same_rule(const char *rule, size_t rl) {
    return strncmp(g_nbp.fail_msg, rule, rl) == 0 && nbp_rule_len(g_nbp.fail_msg) == rl;
}

int nbp_minimize(const uint8_t *data, size_t size) {
    nbp_prog *best = calloc(1, sizeof *best), *cand = calloc(1, sizeof *cand);
    nbp_prog *got = calloc(1, sizeof *got);
    if (best == NULL || cand == NULL || got == NULL) {
        free(best), free(cand), free(got);
        return -1;
    }
    if (!nbp_try(data, size, NULL, best)) {
        fprintf(stderr, "nabla-fuzz: the input breaks no rule\n");
        free(best), free(cand), free(got);
        return 1;
    }
    char rule[1024];
    snprintf(rule, sizeof rule, "%s", g_nbp.fail_msg);
    size_t rl = nbp_rule_len(rule);
    fprintf(stderr, "nabla-fuzz: the input breaks: %s\nminimizing...\n", rule);
    if (best->rejected_op >= 0 || !best->decoded) {
        fprintf(stderr, "nabla-fuzz: it breaks while decoding; nothing to minimize\n");
        free(best), free(cand), free(got);
        return 0;
    }
    /* checks switched off, donation off, outputs dropped (with the ops only they need),
     * outputs replaced by their op's operands (shorter chains) */
    static const unsigned off[] = {NBP_NO_THREADS, NBP_NO_HESS, NBP_NO_GRAD};
    bool progress = true;
    for (int round = 0; progress && round < 20; round++) {
        progress = false;
        for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
            if (best->flags & off[i]) {
                continue;
            }
            memcpy(cand, best, sizeof *cand);
            cand->flags |= off[i];
            if (nbp_try(data, size, cand, got) && nbp_same_rule(rule, rl)) {
                memcpy(best, cand, sizeof *best);
                progress = true;
            }
        }
        if (best->flags & NBP_DONATE) {
            memcpy(cand, best, sizeof *cand);
            cand->flags &= ~(unsigned)NBP_DONATE;
            if (nbp_try(data, size, cand, got) && nbp_same_rule(rule, rl)) {
                memcpy(best, cand, sizeof *best);
                progress = true;
            }
        }
        for (int j = best->n_outs - 1; j >= 0 && best->n_outs > 1; j--) {
            memcpy(cand, best, sizeof *cand);
            memmove(cand->outs + j, cand->outs + j + 1,
                    (size_t)(cand->n_outs - j - 1) * sizeof(int));
            cand->n_outs--;
            nbp_dce(cand);
            if (nbp_try(data, size, cand, got) && nbp_same_rule(rule, rl)) {
                memcpy(best, cand, sizeof *best);
                progress = true;
            }
        }
        for (int j = 0; j < best->n_outs; j++) {
            const nbp_op *op = &best->ops[best->vals[best->outs[j]].op];
            for (int k = 0; k < op->n_in; k++) {
                memcpy(cand, best, sizeof *cand);
                cand->outs[j] = op->in[k];
                bool dup = false;
                for (int m = 0; m < cand->n_outs; m++) {
                    dup = dup || (m != j && cand->outs[m] == cand->outs[j]);
                }
                if (dup) {
                    continue;
                }
                nbp_dce(cand);
                if (nbp_try(data, size, cand, got) && nbp_same_rule(rule, rl)) {
                    memcpy(best, cand, sizeof *best);
                    progress = true;
                    break;
                }
            }
        }
    }
    nbp_try(data, size, best, got);
    fprintf(stderr, "nabla-fuzz: minimized; it breaks: %s\n", g_nbp.fail_msg);
    best->data = data;
    best->size = size;
    best->ctx[0] = g_nbp.ctx[0];
    best->ctx[1] = g_nbp.ctx[1];
    nbp_print_program(stderr, best);
    nbp_print_input_values(stderr, best);
    free(best), free(cand), free(got);
    return 0;
}
