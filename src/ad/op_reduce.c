/*
 * op_reduce.c -- reductions: sum, max, min and prod over a set of axes, argmax and argmin
 * along one axis (builders, shape/dtype inference, kernels, VJP and JVP rules), and the
 * composites built from them: mean, logsumexp, softmax and log_softmax (which need no rules
 * of their own: they differentiate through their primitives, and the stop_gradient on the
 * shift of the stable forms gives exactly the right gradient).
 *
 * Order of evaluation. Reductions are bit-reproducible: every output element combines its
 * input elements in an order fixed by the shapes alone, whatever path or thread split
 * computes it. The *reduced sequence* of an output element is its input elements in
 * increasing flat index order (row-major over the reduced axes). Along that sequence:
 *  - float sums are blocked pairwise sums: the sequence is cut into blocks of NBI_RBLOCK
 *    (128) consecutive elements; each block is summed left to right, starting from its
 *    first element, in the dtype (f32 sums stay f32, like numpy); the block sums
 *    b_0..b_{n-1} are then combined by the fixed tree T(b_0..b_{n-1}) = T(b_0..b_{p-1}) +
 *    T(b_p..b_{n-1}), with p the largest power of two below n (T of one block is that
 *    block). The error bound is about (128 + log2(n/128)) ulps instead of n ulps (Higham,
 *    "The accuracy of floating point summation", SIAM J. Sci. Comput. 14(4), 1993), and a
 *    split of the work on power-of-two block boundaries reproduces the same tree exactly;
 *  - integer sums and products wrap (computed in unsigned), so they are exact modulo 2^bits
 *    and the order cannot matter;
 *  - float products and max/min go left to right. max/min keep the first of equal values and
 *    propagate NaN (once a NaN is met the result is NaN), like nb_maximum/nb_minimum;
 *  - argmax/argmin give the first index of the extremum; a NaN counts as larger than
 *    everything for argmax and smaller than everything for argmin, so the first NaN wins
 *    (numpy's rule).
 * The kernels visit memory in whichever order is fast -- one contiguous run per output when
 * the reduced axes are innermost, a row of contiguous outputs at a time (column-wise) when
 * they are not -- but every path performs exactly the operations above, in that order.
 */
#include "ad/ir.h"

#include <math.h>
#include <string.h>

#define NBI_RBLOCK 128 /* elements per block of a pairwise float sum */
#define NBI_RILP 8     /* blocks summed side by side on long runs (8 named chains) */
#define NBI_RCOLS 4096 /* outputs per chunk in the column-wise kernels (rows stream in order) */
#define NBI_RSTACK 64  /* pending block sums: at most 2 + log2(2^63 / 128) */

/* ---- axes --------------------------------------------------------------------------- */

/* Validate the user's axes list for x and store it sorted and normalised in at (axes NULL:
 * every axis). name is the op the user called, for messages. */
static nb_status nbi_reduce_attrs(nb_trace *tr, const char *name, const nb_var *x, const int *axes,
                                  int n_axes, bool keepdims, nbi_attrs *at) {
    char sig[NBI_SIG_CAP];
    int r = x->rank;
    memset(at, 0, sizeof *at);
    at->keepdims = keepdims;
    if (axes == NULL) {
        for (int i = 0; i < r; i++) {
            at->axes[i] = i;
        }
        at->n_axes = r;
        return NB_OK;
    }
    if (n_axes < 0) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "nb_%s: n_axes is %d for %s; it must be >= 0 (pass axes NULL to "
                             "reduce every axis)",
                             name, n_axes, nbi_var_sig(sig, sizeof sig, x));
    }
    /* More than r axes must repeat or leave the range: the loop stops at the first. */
    int given[NB_MAX_RANK];
    bool seen[NB_MAX_RANK] = {false};
    for (int i = 0; i < n_axes; i++) {
        int a;
        if (!nbi_norm_axis(axes[i], r, &a)) {
            if (r == 0) {
                return nbi_trace_err(tr, NB_ERR_INVALID,
                                     "nb_%s: axis %d is out of range for %s (a rank-0 operand "
                                     "has no axes)",
                                     name, axes[i], nbi_var_sig(sig, sizeof sig, x));
            }
            return nbi_trace_err(tr, NB_ERR_INVALID,
                                 "nb_%s: axis %d is out of range for %s (valid axes are 0..%d, "
                                 "or -%d..-1 counting back)",
                                 name, axes[i], nbi_var_sig(sig, sizeof sig, x), r - 1, r);
        }
        if (seen[a]) {
            return nbi_trace_err(tr, NB_ERR_INVALID,
                                 "nb_%s: axis %d of %s is listed twice (as %d and %d); list "
                                 "each axis once",
                                 name, a, nbi_var_sig(sig, sizeof sig, x), given[a], axes[i]);
        }
        seen[a] = true;
        given[a] = axes[i];
    }
    for (int a = 0; a < r; a++) {
        if (seen[a]) {
            at->axes[at->n_axes++] = a;
        }
    }
    return NB_OK;
}

/* The number of elements each output of a reduction of x over at's axes combines. */
static int64_t nbi_reduced_count(const nb_var *x, const nbi_attrs *at) {
    int64_t n = 1;
    for (int i = 0; i < at->n_axes; i++) {
        n *= x->shape[at->axes[i]];
    }
    return n;
}

/* The result shape: the reduced axes removed, or kept as 1 with keepdims. */
static int nbi_reduced_shape(const nb_var *x, const nbi_attrs *at, int64_t *shape) {
    bool red[NB_MAX_RANK] = {false};
    for (int i = 0; i < at->n_axes; i++) {
        red[at->axes[i]] = true;
    }
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (!red[i]) {
            shape[r++] = x->shape[i];
        } else if (at->keepdims) {
            shape[r++] = 1;
        }
    }
    return r;
}

/* ---- inference ---------------------------------------------------------------------- */

static nb_status nbi_infer_reduce(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    nbi_op op = (nbi_op)p->op;
    const char *name = nbi_op_name(op);
    char sig[NBI_SIG_CAP];
    if (x->dtype == NB_DTYPE_BOOL) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_%s: operand is %s; reductions need a numeric dtype (cast "
                             "first, e.g. nb_cast(x, NB_DTYPE_I32) to count or to test any/all)",
                             name, nbi_var_sig(sig, sizeof sig, x));
    }
    const nbi_attrs *at = &p->at;
    bool ok = at->n_axes >= 0 && at->n_axes <= x->rank;
    for (int i = 0; ok && i < at->n_axes; i++) {
        ok = at->axes[i] >= 0 && at->axes[i] < x->rank && (i == 0 || at->axes[i - 1] < at->axes[i]);
    }
    if (!ok) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL,
                             "nb_%s: the axes attribute of a reduction of %s is not sorted and "
                             "normalised (a bug in the pass that built it)",
                             name, nbi_var_sig(sig, sizeof sig, x));
    }
    p->dtype = x->dtype;
    p->rank = (int8_t)nbi_reduced_shape(x, at, p->shape);
    if ((op == NBI_OP_MAX || op == NBI_OP_MIN) && nbi_reduced_count(x, at) == 0 &&
        nbi_shape_size(p->rank, p->shape) > 0) {
        char axs[64];
        nbi_sbuf s = nbi_sbuf_make(axs, sizeof axs);
        for (int i = 0; i < at->n_axes; i++) {
            nbi_sbuf_printf(&s, i ? ",%d" : "%d", (int)at->axes[i]);
        }
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_%s: %s reduced over axes [%s] has no elements, and %s has no "
                             "identity; reduce over non-empty axes (or use nb_sum/nb_prod, "
                             "which give 0/1 there)",
                             name, nbi_var_sig(sig, sizeof sig, x), axs, name);
    }
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

static nb_status nbi_infer_arg(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    const char *name = nbi_op_name((nbi_op)p->op);
    char sig[NBI_SIG_CAP];
    int ax = p->at.axis;
    if (ax < 0 || ax >= x->rank) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL,
                             "nb_%s: axis attribute %d is not normalised for %s (a bug in the "
                             "pass that built it)",
                             name, ax, nbi_var_sig(sig, sizeof sig, x));
    }
    p->dtype = NB_DTYPE_I64;
    p->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (i != ax) {
            p->shape[p->rank++] = x->shape[i];
        } else if (p->at.keepdims) {
            p->shape[p->rank++] = 1;
        }
    }
    if (x->shape[ax] == 0 && nbi_shape_size(p->rank, p->shape) > 0) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_%s: axis %d of %s is empty, so there is no index to return; "
                             "take it along a non-empty axis",
                             name, ax, nbi_var_sig(sig, sizeof sig, x));
    }
    return NB_OK;
}

/* ---- builders ----------------------------------------------------------------------- */

static nb_var *nbi_reduce(nbi_op op, nb_var *x, const int *axes, int n_axes, bool keepdims) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    if (nbi_reduce_attrs(tr, nbi_op_name(op), x, axes, n_axes, keepdims, &at) != NB_OK) {
        return tr->poison;
    }
    return nbi_emit(tr, op, 1, &x, &at);
}

nb_var *nb_sum(nb_var *x, const int *axes, int n_axes, bool keepdims) {
    return nbi_reduce(NBI_OP_SUM, x, axes, n_axes, keepdims);
}
nb_var *nb_max(nb_var *x, const int *axes, int n_axes, bool keepdims) {
    return nbi_reduce(NBI_OP_MAX, x, axes, n_axes, keepdims);
}
nb_var *nb_min(nb_var *x, const int *axes, int n_axes, bool keepdims) {
    return nbi_reduce(NBI_OP_MIN, x, axes, n_axes, keepdims);
}
nb_var *nb_prod(nb_var *x, const int *axes, int n_axes, bool keepdims) {
    return nbi_reduce(NBI_OP_PROD, x, axes, n_axes, keepdims);
}

static nb_var *nbi_argreduce(nbi_op op, nb_var *x, int axis, bool keepdims) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    char sig[NBI_SIG_CAP];
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    int ax;
    if (!nbi_norm_axis(axis, x->rank, &ax)) {
        if (x->rank == 0) {
            return nbi_trace_errv(tr, NB_ERR_INVALID,
                                  "nb_%s: axis %d is out of range for %s (a rank-0 operand has "
                                  "no axes; its index is always 0)",
                                  nbi_op_name(op), axis, nbi_var_sig(sig, sizeof sig, x));
        }
        return nbi_trace_errv(tr, NB_ERR_INVALID,
                              "nb_%s: axis %d is out of range for %s (valid axes are 0..%d, or "
                              "-%d..-1 counting back)",
                              nbi_op_name(op), axis, nbi_var_sig(sig, sizeof sig, x), x->rank - 1,
                              x->rank);
    }
    at.axis = ax;
    at.keepdims = keepdims;
    return nbi_emit(tr, op, 1, &x, &at);
}

nb_var *nb_argmax(nb_var *x, int axis, bool keepdims) {
    return nbi_argreduce(NBI_OP_ARGMAX, x, axis, keepdims);
}
nb_var *nb_argmin(nb_var *x, int axis, bool keepdims) {
    return nbi_argreduce(NBI_OP_ARGMIN, x, axis, keepdims);
}

/* ---- composites --------------------------------------------------------------------- */

/* The prologue of a composite over float x. Returns true when the composite may be built:
 * then *at holds the normalised axes (with keepdims) and *tr the trace. Otherwise *res is
 * what the composite returns: NULL if x is NULL; poison if x is poison, the trace already
 * failed, x is not float or the axes are invalid (recording the error). */
static bool nbi_composite_begin(const char *name, nb_var *x, const int *axes, int n_axes,
                                bool keepdims, nb_trace **trp, nbi_attrs *at, nb_var **res) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &x, &poisoned);
    *trp = tr;
    *res = tr ? tr->poison : NULL;
    if (tr == NULL || poisoned) {
        return false;
    }
    if (!nb_dtype_is_float(x->dtype)) {
        char sig[NBI_SIG_CAP];
        nbi_trace_err(tr, NB_ERR_DTYPE,
                      "nb_%s: operand is %s; it needs a float dtype (f32 or f64): convert "
                      "with nb_cast first",
                      name, nbi_var_sig(sig, sizeof sig, x));
        return false;
    }
    return nbi_reduce_attrs(tr, name, x, axes, n_axes, keepdims, at) == NB_OK;
}

/* mean = sum / count: a correctly rounded division, as numpy and JAX do; over zero elements
 * that is 0/0 = NaN, as numpy. */
nb_var *nb_mean(nb_var *x, const int *axes, int n_axes, bool keepdims) {
    nb_trace *tr;
    nbi_attrs at;
    nb_var *res;
    if (!nbi_composite_begin("mean", x, axes, n_axes, keepdims, &tr, &at, &res)) {
        return res;
    }
    nb_var *s = nbi_emit(tr, NBI_OP_SUM, 1, &x, &at);
    return nb_div(s, nb_scalar(tr, (double)nbi_reduced_count(x, &at)));
}

/* The shift of the stable forms: m = stop_gradient(max(x, keepdims)), with 0 where that is
 * not finite (so a slice of -inf gives -inf rather than -inf - -inf = NaN; +inf and NaN
 * then come out of the exp-sum as they should) and 0 when there is nothing to reduce (the
 * sum of no exps is 0 and its log -inf, which needs no max). at has keepdims set. The
 * finiteness test is |m| < inf, which is false for NaN as well. */
static nb_var *nbi_shift(nb_trace *tr, nb_var *x, const nbi_attrs *at) {
    if (nbi_reduced_count(x, at) == 0) {
        int64_t shape[NB_MAX_RANK];
        int r = nbi_reduced_shape(x, at, shape);
        return nb_full(tr, x->dtype, r, shape, 0.0);
    }
    nb_var *m = nbi_emit(tr, NBI_OP_MAX, 1, &x, at);
    nb_var *finite = nb_lt(nb_abs(m), nb_scalar(tr, INFINITY));
    return nb_stop_gradient(nb_select(finite, m, nb_scalar(tr, 0.0)));
}

nb_var *nb_logsumexp(nb_var *x, const int *axes, int n_axes, bool keepdims) {
    nb_trace *tr;
    nbi_attrs at;
    nb_var *res;
    if (!nbi_composite_begin("logsumexp", x, axes, n_axes, true, &tr, &at, &res)) {
        return res;
    }
    nb_var *m = nbi_shift(tr, x, &at);
    nb_var *e = nb_exp(nb_sub(x, m));
    at.keepdims = keepdims;
    nb_var *s = nbi_emit(tr, NBI_OP_SUM, 1, &e, &at);
    if (!keepdims) {
        int64_t shape[NB_MAX_RANK];
        int r = nbi_reduced_shape(x, &at, shape);
        m = nb_reshape(m, r, shape); /* drop m's kept size-1 dims */
    }
    return nb_add(m, nb_log(s));
}

nb_var *nb_softmax(nb_var *x, int axis) {
    nb_trace *tr;
    nbi_attrs at;
    nb_var *res;
    if (!nbi_composite_begin("softmax", x, &axis, 1, true, &tr, &at, &res)) {
        return res;
    }
    nb_var *e = nb_exp(nb_sub(x, nbi_shift(tr, x, &at)));
    return nb_div(e, nbi_emit(tr, NBI_OP_SUM, 1, &e, &at));
}

/* x - logsumexp(x) computed as (x - m) - log(sum(exp(x - m))): m cancels exactly, and the
 * shifted form keeps the result accurate where |x| is large (JAX's form). */
nb_var *nb_log_softmax(nb_var *x, int axis) {
    nb_trace *tr;
    nbi_attrs at;
    nb_var *res;
    if (!nbi_composite_begin("log_softmax", x, &axis, 1, true, &tr, &at, &res)) {
        return res;
    }
    nb_var *shifted = nb_sub(x, nbi_shift(tr, x, &at));
    nb_var *e = nb_exp(shifted);
    return nb_sub(shifted, nb_log(nbi_emit(tr, NBI_OP_SUM, 1, &e, &at)));
}

/* ---- the reduction plan ------------------------------------------------------------- */

/* A multi-index over some dims of the input, with its flat offset. */
typedef struct nbi_odo {
    int n;
    int64_t size[NB_MAX_RANK], stride[NB_MAX_RANK], idx[NB_MAX_RANK];
    int64_t off;
} nbi_odo;

static void nbi_odo_reset(nbi_odo *d) {
    memset(d->idx, 0, sizeof d->idx);
    d->off = 0;
}

/* Advance to the next multi-index in row-major order (wrapping to 0 after the last). */
static void nbi_odo_step(nbi_odo *d) {
    for (int i = d->n - 1; i >= 0; i--) {
        d->off += d->stride[i];
        if (++d->idx[i] < d->size[i]) {
            return;
        }
        d->off -= d->stride[i] * d->size[i];
        d->idx[i] = 0;
    }
}

/* The input's dims with size-1 dims dropped and neighbours of the same kind (kept or
 * reduced) merged; merging keeps row-major order, so the reduced sequences are unchanged.
 * Row mode (the innermost dim is reduced, or nothing is): out[o] reduces nred / inner runs
 * of inner contiguous elements, at the offsets `red` walks from the offset `kept` gives.
 * Column mode (the innermost dim is kept): the outputs come in rows of inner contiguous
 * elements; `kept` gives each row's offset and `red` walks the reduced sequence. */
typedef struct nbi_rplan {
    int64_t nout, nred, inner;
    bool column;
    nbi_odo kept, red;
} nbi_rplan;

static void nbi_rplan_make(const nb_var *node, nbi_rplan *p) {
    const nb_var *x = node->in[0];
    bool isred[NB_MAX_RANK] = {false};
    for (int i = 0; i < node->at.n_axes; i++) {
        isred[node->at.axes[i]] = true;
    }
    /* Coalesced dims, innermost first. */
    int64_t size[NB_MAX_RANK], stride[NB_MAX_RANK];
    bool cls[NB_MAX_RANK];
    int nd = 0;
    int64_t st = 1;
    memset(p, 0, sizeof *p);
    p->nout = 1;
    p->nred = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        int64_t n = x->shape[i];
        if (isred[i]) {
            p->nred *= n;
        } else {
            p->nout *= n;
        }
        if (n != 1) {
            if (nd > 0 && cls[nd - 1] == isred[i]) {
                size[nd - 1] *= n;
            } else {
                size[nd] = n;
                stride[nd] = st;
                cls[nd] = isred[i];
                nd++;
            }
        }
        st *= n;
    }
    bool any_red = false;
    for (int i = 0; i < nd; i++) {
        any_red |= cls[i];
    }
    p->column = nd > 0 && !cls[0] && any_red;
    bool has_inner = nd > 0 && (cls[0] || p->column);
    p->inner = has_inner ? size[0] : 1;
    for (int i = nd - 1; i >= (has_inner ? 1 : 0); i--) {
        nbi_odo *d = cls[i] ? &p->red : &p->kept;
        d->size[d->n] = size[i];
        d->stride[d->n++] = stride[i];
    }
}

/* Levels of pending block sums a column-wise pairwise sum of nred elements needs. */
static int nbi_psum_levels(int64_t nred) {
    int h = 1;
    for (int64_t nblk = (nred + NBI_RBLOCK - 1) / NBI_RBLOCK; nblk > 0; nblk >>= 1) {
        h++;
    }
    return h;
}

/* ---- reduction kernels -------------------------------------------------------------- */

#define NBI_FADD(a, b) ((a) + (b))
#define NBI_FMUL(a, b) ((a) * (b))
#define NBI_FMAX(acc, v) (((v) > (acc) || (v) != (v)) ? (v) : (acc))
#define NBI_FMIN(acc, v) (((v) < (acc) || (v) != (v)) ? (v) : (acc))
#define NBI_IMAX(acc, v) ((v) > (acc) ? (v) : (acc))
#define NBI_IMIN(acc, v) ((v) < (acc) ? (v) : (acc))

/* Per element type T (suffix S): FOLD(op, acc, x, n) folds n contiguous elements into acc
 * left to right; a pairwise-sum state (float types only) feeds runs block by block; the row
 * and column drivers walk a plan. ADD/MUL/MAX/MIN give the element operations; PAIRWISE
 * says whether sums use the blocked pairwise scheme (floats) or a plain fold (integers,
 * whose wrapping sums are order-independent). */
#define NBI_DEF_REDUCE(T, S, ADD, MUL, MAX, MIN, PAIRWISE)                                         \
    static T nbi_fold_##S(nbi_op op, T acc, const T *restrict x, int64_t n) {                      \
        switch (op) {                                                                              \
        case NBI_OP_SUM:                                                                           \
            for (int64_t i = 0; i < n; i++) {                                                      \
                acc = ADD(acc, x[i]);                                                              \
            }                                                                                      \
            break;                                                                                 \
        case NBI_OP_PROD:                                                                          \
            for (int64_t i = 0; i < n; i++) {                                                      \
                acc = MUL(acc, x[i]);                                                              \
            }                                                                                      \
            break;                                                                                 \
        case NBI_OP_MAX:                                                                           \
            for (int64_t i = 0; i < n; i++) {                                                      \
                acc = MAX(acc, x[i]);                                                              \
            }                                                                                      \
            break;                                                                                 \
        case NBI_OP_MIN:                                                                           \
            for (int64_t i = 0; i < n; i++) {                                                      \
                acc = MIN(acc, x[i]);                                                              \
            }                                                                                      \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
        return acc;                                                                                \
    }                                                                                              \
                                                                                                   \
    /* acc[c] = op(acc[c], x[c]) for c < w. */                                                     \
    static void nbi_vfold_##S(nbi_op op, T *restrict acc, const T *restrict x, int64_t w) {        \
        switch (op) {                                                                              \
        case NBI_OP_SUM:                                                                           \
            for (int64_t c = 0; c < w; c++) {                                                      \
                acc[c] = ADD(acc[c], x[c]);                                                        \
            }                                                                                      \
            break;                                                                                 \
        case NBI_OP_PROD:                                                                          \
            for (int64_t c = 0; c < w; c++) {                                                      \
                acc[c] = MUL(acc[c], x[c]);                                                        \
            }                                                                                      \
            break;                                                                                 \
        case NBI_OP_MAX:                                                                           \
            for (int64_t c = 0; c < w; c++) {                                                      \
                acc[c] = MAX(acc[c], x[c]);                                                        \
            }                                                                                      \
            break;                                                                                 \
        case NBI_OP_MIN:                                                                           \
            for (int64_t c = 0; c < w; c++) {                                                      \
                acc[c] = MIN(acc[c], x[c]);                                                        \
            }                                                                                      \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* A pairwise sum in progress: cur is the partial sum of the current block (pos                \
     * elements so far); stk holds the pending block sums of the binary-counter tree. */           \
    typedef struct nbi_psum_##S {                                                                  \
        T stk[NBI_RSTACK];                                                                         \
        T cur;                                                                                     \
        int64_t pos, nblk;                                                                         \
        int top;                                                                                   \
    } nbi_psum_##S;                                                                                \
                                                                                                   \
    /* Close the current block: push its sum, then combine equal-sized subtrees. */                \
    static void nbi_psum_push_##S(nbi_psum_##S *s) {                                               \
        s->stk[s->top++] = s->cur;                                                                 \
        s->pos = 0;                                                                                \
        for (int64_t b = ++s->nblk; (b & 1) == 0; b >>= 1) {                                       \
            s->stk[s->top - 2] = s->stk[s->top - 2] + s->stk[s->top - 1];                          \
            s->top--;                                                                              \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void nbi_psum_feed_##S(nbi_psum_##S *s, const T *restrict x, int64_t n) {               \
        while (n > 0) {                                                                            \
            if (s->pos == 0 && n >= NBI_RILP * NBI_RBLOCK) {                                       \
                /* NBI_RILP (8) whole blocks as independent chains, kept in registers: the         \
                 * same sums as one block at a time, without waiting on each add. */               \
                const T *x0 = x, *x1 = x + NBI_RBLOCK, *x2 = x + 2 * NBI_RBLOCK;                   \
                const T *x3 = x + 3 * NBI_RBLOCK, *x4 = x + 4 * NBI_RBLOCK;                        \
                const T *x5 = x + 5 * NBI_RBLOCK, *x6 = x + 6 * NBI_RBLOCK;                        \
                const T *x7 = x + 7 * NBI_RBLOCK;                                                  \
                T c0 = x0[0], c1 = x1[0], c2 = x2[0], c3 = x3[0];                                  \
                T c4 = x4[0], c5 = x5[0], c6 = x6[0], c7 = x7[0];                                  \
                for (int i = 1; i < NBI_RBLOCK; i++) {                                             \
                    c0 = c0 + x0[i];                                                               \
                    c1 = c1 + x1[i];                                                               \
                    c2 = c2 + x2[i];                                                               \
                    c3 = c3 + x3[i];                                                               \
                    c4 = c4 + x4[i];                                                               \
                    c5 = c5 + x5[i];                                                               \
                    c6 = c6 + x6[i];                                                               \
                    c7 = c7 + x7[i];                                                               \
                }                                                                                  \
                const T c[NBI_RILP] = {c0, c1, c2, c3, c4, c5, c6, c7};                            \
                for (int j = 0; j < NBI_RILP; j++) {                                               \
                    s->cur = c[j];                                                                 \
                    nbi_psum_push_##S(s);                                                          \
                }                                                                                  \
                x += NBI_RILP * NBI_RBLOCK;                                                        \
                n -= NBI_RILP * NBI_RBLOCK;                                                        \
                continue;                                                                          \
            }                                                                                      \
            int64_t m = NBI_RBLOCK - s->pos < n ? NBI_RBLOCK - s->pos : n;                         \
            T c = s->pos == 0 ? x[0] : s->cur + x[0];                                              \
            for (int64_t i = 1; i < m; i++) {                                                      \
                c = c + x[i];                                                                      \
            }                                                                                      \
            s->cur = c;                                                                            \
            s->pos += m;                                                                           \
            x += m;                                                                                \
            n -= m;                                                                                \
            if (s->pos == NBI_RBLOCK) {                                                            \
                nbi_psum_push_##S(s);                                                              \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* The total (at least one element was fed): fold the pending sums right to left. */           \
    static T nbi_psum_end_##S(nbi_psum_##S *s) {                                                   \
        if (s->nblk == 0) {                                                                        \
            return s->cur;                                                                         \
        }                                                                                          \
        if (s->pos > 0) {                                                                          \
            s->stk[s->top++] = s->cur;                                                             \
        }                                                                                          \
        T r = s->stk[s->top - 1];                                                                  \
        for (int l = s->top - 2; l >= 0; l--) {                                                    \
            r = s->stk[l] + r;                                                                     \
        }                                                                                          \
        return r;                                                                                  \
    }                                                                                              \
                                                                                                   \
    static void nbi_rrow_##S(nbi_rplan *p, nbi_op op, const T *restrict x, T *restrict out) {      \
        int64_t L = p->inner, runs = p->nred / p->inner;                                           \
        bool pw = (PAIRWISE) && op == NBI_OP_SUM;                                                  \
        nbi_odo_reset(&p->kept);                                                                   \
        for (int64_t o = 0; o < p->nout; o++) {                                                    \
            const T *xb = x + p->kept.off;                                                         \
            nbi_odo_reset(&p->red);                                                                \
            if (pw) {                                                                              \
                nbi_psum_##S s;                                                                    \
                s.cur = 0;                                                                         \
                s.pos = s.nblk = 0;                                                                \
                s.top = 0;                                                                         \
                for (int64_t r = 0; r < runs; r++) {                                               \
                    nbi_psum_feed_##S(&s, xb + p->red.off, L);                                     \
                    nbi_odo_step(&p->red);                                                         \
                }                                                                                  \
                out[o] = nbi_psum_end_##S(&s);                                                     \
            } else {                                                                               \
                T acc = nbi_fold_##S(op, xb[0], xb + 1, L - 1);                                    \
                for (int64_t r = 1; r < runs; r++) {                                               \
                    nbi_odo_step(&p->red);                                                         \
                    acc = nbi_fold_##S(op, acc, xb + p->red.off, L);                               \
                }                                                                                  \
                out[o] = acc;                                                                      \
            }                                                                                      \
            nbi_odo_step(&p->kept);                                                                \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* Column mode: each chunk of up to NBI_RCOLS contiguous outputs accumulates in place,         \
     * one input row per step of the reduced sequence. Pending block sums of pairwise sums         \
     * go to stk (nbi_psum_levels(nred) rows of the chunk width, from the scratch). */             \
    static void nbi_rcol_##S(nbi_rplan *p, nbi_op op, const T *restrict x, T *restrict out,        \
                             T *restrict stk) {                                                    \
        int64_t M = p->inner;                                                                      \
        bool pw = (PAIRWISE) && op == NBI_OP_SUM;                                                  \
        nbi_odo_reset(&p->kept);                                                                   \
        for (int64_t g = 0; g < p->nout / M; g++) {                                                \
            for (int64_t c0 = 0; c0 < M; c0 += NBI_RCOLS) {                                        \
                int64_t w = M - c0 < NBI_RCOLS ? M - c0 : NBI_RCOLS;                               \
                T *acc = out + g * M + c0;                                                         \
                const T *xb = x + p->kept.off + c0;                                                \
                int64_t pos = 0, nblk = 0;                                                         \
                int top = 0;                                                                       \
                nbi_odo_reset(&p->red);                                                            \
                for (int64_t j = 0; j < p->nred; j++) {                                            \
                    if (j == 0 || (pw && pos == 0)) {                                              \
                        memcpy(acc, xb + p->red.off, (size_t)w * sizeof(T));                       \
                    } else {                                                                       \
                        nbi_vfold_##S(op, acc, xb + p->red.off, w);                                \
                    }                                                                              \
                    if (pw && ++pos == NBI_RBLOCK) {                                               \
                        memcpy(stk + top * w, acc, (size_t)w * sizeof(T));                         \
                        top++;                                                                     \
                        pos = 0;                                                                   \
                        for (int64_t b = ++nblk; (b & 1) == 0; b >>= 1) {                          \
                            nbi_vfold_##S(NBI_OP_SUM, stk + (top - 2) * w, stk + (top - 1) * w,    \
                                          w);                                                      \
                            top--;                                                                 \
                        }                                                                          \
                    }                                                                              \
                    nbi_odo_step(&p->red);                                                         \
                }                                                                                  \
                if (pw && nblk > 0) {                                                              \
                    if (pos > 0) {                                                                 \
                        memcpy(stk + top * w, acc, (size_t)w * sizeof(T));                         \
                        top++;                                                                     \
                    }                                                                              \
                    memcpy(acc, stk + (top - 1) * w, (size_t)w * sizeof(T));                       \
                    for (int l = top - 2; l >= 0; l--) {                                           \
                        for (int64_t c = 0; c < w; c++) {                                          \
                            acc[c] = stk[l * w + c] + acc[c];                                      \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            nbi_odo_step(&p->kept);                                                                \
        }                                                                                          \
    }

#define NBI_IADD_I32(a, b) (int32_t)((uint32_t)(a) + (uint32_t)(b))
#define NBI_IMUL_I32(a, b) (int32_t)((uint32_t)(a) * (uint32_t)(b))
#define NBI_IADD_I64(a, b) (int64_t)((uint64_t)(a) + (uint64_t)(b))
#define NBI_IMUL_I64(a, b) (int64_t)((uint64_t)(a) * (uint64_t)(b))

NBI_DEF_REDUCE(float, f32, NBI_FADD, NBI_FMUL, NBI_FMAX, NBI_FMIN, true)
NBI_DEF_REDUCE(double, f64, NBI_FADD, NBI_FMUL, NBI_FMAX, NBI_FMIN, true)
NBI_DEF_REDUCE(int32_t, i32, NBI_IADD_I32, NBI_IMUL_I32, NBI_IMAX, NBI_IMIN, false)
NBI_DEF_REDUCE(int64_t, i64, NBI_IADD_I64, NBI_IMUL_I64, NBI_IMAX, NBI_IMIN, false)

/* ---- reductions fed in pieces (fused kernels) --------------------------------------- */

_Static_assert(NBI_RSEG % NBI_RBLOCK == 0 &&
                   ((NBI_RSEG / NBI_RBLOCK) & (NBI_RSEG / NBI_RBLOCK - 1)) == 0,
               "a segment must be a power-of-two number of pairwise blocks");
_Static_assert(sizeof(nbi_psum_f64) <= sizeof(((nbi_rstream *)0)->st) &&
                   sizeof(nbi_psum_f32) <= sizeof(((nbi_rstream *)0)->st),
               "nbi_rstream too small for a pairwise sum");

static bool nbi_rstream_pairwise(const nbi_rstream *s) {
    return s->op == NBI_OP_SUM && nb_dtype_is_float(s->dtype);
}

void nbi_rstream_begin(nbi_rstream *s, nbi_op op, nb_dtype dtype) {
    s->op = (uint16_t)op;
    s->dtype = dtype;
    s->n = 0;
    /* only the pairwise state's scalars (its stack is written before it is read): a run of
     * ten elements per output must not pay for a 600-byte memset */
    if (dtype == NB_DTYPE_F64) {
        nbi_psum_f64 *ps = (nbi_psum_f64 *)(void *)s->st;
        ps->cur = 0;
        ps->pos = ps->nblk = 0;
        ps->top = 0;
    } else if (dtype == NB_DTYPE_F32) {
        nbi_psum_f32 *ps = (nbi_psum_f32 *)(void *)s->st;
        ps->cur = 0;
        ps->pos = ps->nblk = 0;
        ps->top = 0;
    }
}

/* The pairwise state's cur/pos/nblk/top start at zero (nbi_rstream_begin), as in the row
 * kernel. A plain fold keeps its accumulator in st, started from the first element. */
#define NBI_RSTREAM_FEED(S, T)                                                                     \
    if (nbi_rstream_pairwise(s)) {                                                                 \
        nbi_psum_feed_##S((nbi_psum_##S *)(void *)s->st, x, n);                                    \
    } else {                                                                                       \
        T *acc = (T *)(void *)s->st;                                                               \
        const T *xs = x;                                                                           \
        if (s->n == 0) {                                                                           \
            *acc = nbi_fold_##S((nbi_op)s->op, xs[0], xs + 1, n - 1);                              \
        } else {                                                                                   \
            *acc = nbi_fold_##S((nbi_op)s->op, *acc, xs, n);                                       \
        }                                                                                          \
    }

void nbi_rstream_feed(nbi_rstream *s, const void *x, int64_t n) {
    if (n <= 0) {
        return;
    }
    switch (s->dtype) {
    case NB_DTYPE_F32:
        NBI_RSTREAM_FEED(f32, float)
        break;
    case NB_DTYPE_F64:
        NBI_RSTREAM_FEED(f64, double)
        break;
    case NB_DTYPE_I32:
        NBI_RSTREAM_FEED(i32, int32_t)
        break;
    case NB_DTYPE_I64:
        NBI_RSTREAM_FEED(i64, int64_t)
        break;
    case NB_DTYPE_BOOL:
        break;
    }
    s->n += n;
}
#undef NBI_RSTREAM_FEED

/* Short runs (a softmax's 10 classes): a stream gives fold(op, x[0], x[1..len-1]) left to
 * right for them (a float sum's first block is a plain fold while it is open), so four runs
 * advance together as independent chains -- each its own order, the same bits -- instead of
 * a begin/feed/end per run waiting on one chain of dependent adds. */
#define NBI_SHORT_RUNS(T, OP)                                                                      \
    do {                                                                                           \
        const T *xs = x;                                                                           \
        T *o = out;                                                                                \
        int64_t r = 0;                                                                             \
        for (; r + 4 <= rows; r += 4) {                                                            \
            const T *x0 = xs + r * len, *x1 = x0 + len, *x2 = x1 + len, *x3 = x2 + len;            \
            T a0 = x0[0], a1 = x1[0], a2 = x2[0], a3 = x3[0];                                      \
            for (int64_t i = 1; i < len; i++) {                                                    \
                a0 = OP(a0, x0[i]);                                                                \
                a1 = OP(a1, x1[i]);                                                                \
                a2 = OP(a2, x2[i]);                                                                \
                a3 = OP(a3, x3[i]);                                                                \
            }                                                                                      \
            o[r] = a0;                                                                             \
            o[r + 1] = a1;                                                                         \
            o[r + 2] = a2;                                                                         \
            o[r + 3] = a3;                                                                         \
        }                                                                                          \
        for (; r < rows; r++) {                                                                    \
            const T *x0 = xs + r * len;                                                            \
            T a0 = x0[0];                                                                          \
            for (int64_t i = 1; i < len; i++) {                                                    \
                a0 = OP(a0, x0[i]);                                                                \
            }                                                                                      \
            o[r] = a0;                                                                             \
        }                                                                                          \
    } while (0)

bool nbi_reduce_short_runs(nbi_op op, nb_dtype dtype, const void *x, int64_t rows, int64_t len,
                           void *out) {
    if (len < 1 || (dtype != NB_DTYPE_F32 && dtype != NB_DTYPE_F64) ||
        (op == NBI_OP_SUM && len >= NBI_RBLOCK) ||
        (op != NBI_OP_SUM && op != NBI_OP_MAX && op != NBI_OP_MIN)) {
        return false;
    }
    if (dtype == NB_DTYPE_F32) {
        if (op == NBI_OP_SUM) {
            NBI_SHORT_RUNS(float, NBI_FADD);
        } else if (op == NBI_OP_MAX) {
            NBI_SHORT_RUNS(float, NBI_FMAX);
        } else {
            NBI_SHORT_RUNS(float, NBI_FMIN);
        }
    } else {
        if (op == NBI_OP_SUM) {
            NBI_SHORT_RUNS(double, NBI_FADD);
        } else if (op == NBI_OP_MAX) {
            NBI_SHORT_RUNS(double, NBI_FMAX);
        } else {
            NBI_SHORT_RUNS(double, NBI_FMIN);
        }
    }
    return true;
}
#undef NBI_SHORT_RUNS

void nbi_rstream_end(nbi_rstream *s, void *out) {
    switch (s->dtype) {
    case NB_DTYPE_F32:
        *(float *)out = nbi_rstream_pairwise(s) ? nbi_psum_end_f32((nbi_psum_f32 *)(void *)s->st)
                                                : *(float *)(void *)s->st;
        break;
    case NB_DTYPE_F64:
        *(double *)out = nbi_rstream_pairwise(s) ? nbi_psum_end_f64((nbi_psum_f64 *)(void *)s->st)
                                                 : *(double *)(void *)s->st;
        break;
    case NB_DTYPE_I32:
        *(int32_t *)out = *(int32_t *)(void *)s->st;
        break;
    case NB_DTYPE_I64:
        *(int64_t *)out = *(int64_t *)(void *)s->st;
        break;
    case NB_DTYPE_BOOL:
        break;
    }
}

/* Segment results of a pairwise sum are complete subtrees of NBI_RSEG / NBI_RBLOCK blocks
 * (but the last): pushed as block sums of a coarser binary counter, they give the tree the
 * whole run would have built, and the final right-to-left fold is the one psum_end does.
 * Folds (max, min, integer sums) combine left to right. */
#define NBI_RSTREAM_COMBINE(S, T)                                                                  \
    {                                                                                              \
        const T *pt = parts;                                                                       \
        if (op == NBI_OP_SUM && nb_dtype_is_float(dtype)) {                                        \
            nbi_psum_##S ps;                                                                       \
            memset(&ps, 0, sizeof ps);                                                             \
            for (int64_t i = 0; i < n; i++) {                                                      \
                ps.cur = pt[i];                                                                    \
                nbi_psum_push_##S(&ps);                                                            \
            }                                                                                      \
            *(T *)out = nbi_psum_end_##S(&ps);                                                     \
        } else {                                                                                   \
            *(T *)out = nbi_fold_##S(op, pt[0], pt + 1, n - 1);                                    \
        }                                                                                          \
    }

void nbi_rstream_combine(nbi_op op, nb_dtype dtype, const void *parts, int64_t n, void *out) {
    switch (dtype) {
    case NB_DTYPE_F32:
        NBI_RSTREAM_COMBINE(f32, float)
        break;
    case NB_DTYPE_F64:
        NBI_RSTREAM_COMBINE(f64, double)
        break;
    case NB_DTYPE_I32:
        NBI_RSTREAM_COMBINE(i32, int32_t)
        break;
    case NB_DTYPE_I64:
        NBI_RSTREAM_COMBINE(i64, int64_t)
        break;
    case NB_DTYPE_BOOL:
        break;
    }
}
#undef NBI_RSTREAM_COMBINE

/* Fill n outputs with the identity of op (only sum and prod have one; inference rejects
 * max/min over nothing, so their branch is never taken). */
static void nbi_reduce_identity(nbi_op op, nb_dtype d, void *out, int64_t n) {
    double one = op == NBI_OP_PROD ? 1.0 : 0.0;
    for (int64_t i = 0; i < n; i++) {
        switch (d) {
        case NB_DTYPE_F32:
            ((float *)out)[i] = (float)one;
            break;
        case NB_DTYPE_F64:
            ((double *)out)[i] = one;
            break;
        case NB_DTYPE_I32:
            ((int32_t *)out)[i] = (int32_t)one;
            break;
        case NB_DTYPE_I64:
            ((int64_t *)out)[i] = (int64_t)one;
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)out)[i] = (uint8_t)one;
            break;
        }
    }
}

static void nbi_k_reduce(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return;
    }
    nbi_op op = (nbi_op)node->op;
    nbi_rplan p;
    nbi_rplan_make(node, &p);
    if (p.nred == 0) {
        nbi_reduce_identity(op, node->dtype, k->out, node->size);
        return;
    }
    if (p.nred == 1) { /* only size-1 axes reduced: each output is its one element */
        memcpy(k->out, k->in[0], (size_t)node->size * nbi_dsize(node->dtype));
        return;
    }
#define NBI_RUN(S, T)                                                                              \
    if (p.column) {                                                                                \
        nbi_rcol_##S(&p, op, k->in[0], k->out, (T *)k->scratch);                                   \
    } else {                                                                                       \
        nbi_rrow_##S(&p, op, k->in[0], k->out);                                                    \
    }
    switch (node->dtype) {
    case NB_DTYPE_F32:
        NBI_RUN(f32, float)
        break;
    case NB_DTYPE_F64:
        NBI_RUN(f64, double)
        break;
    case NB_DTYPE_I32:
        NBI_RUN(i32, int32_t)
        break;
    case NB_DTYPE_I64:
        NBI_RUN(i64, int64_t)
        break;
    case NB_DTYPE_BOOL:
        break;
    }
#undef NBI_RUN
}

/* Column-wise float sums over more than one block keep their pending block sums here. */
static size_t nbi_scratch_reduce(const nb_var *node) {
    if (node->op != NBI_OP_SUM || !nb_dtype_is_float(node->dtype) || node->size == 0) {
        return 0;
    }
    nbi_rplan p;
    nbi_rplan_make(node, &p);
    if (!p.column || p.nred < NBI_RBLOCK) {
        return 0;
    }
    int64_t w = p.inner < NBI_RCOLS ? p.inner : NBI_RCOLS;
    return (size_t)nbi_psum_levels(p.nred) * (size_t)w * nbi_dsize(node->dtype);
}

/* ---- argmax / argmin kernels -------------------------------------------------------- */

#define NBI_LD(v) (v)
#define NBI_LD_BOOL(v) ((v) != 0)
/* NaN beats a number (the first NaN wins); bitwise, not short-circuit: no branch to
 * mispredict on random data (max pooling's argmax), and the column loop vectorises */
#define NBI_FGT(v, b) (((v) > (b)) | (((v) != (v)) & ((b) == (b))))
#define NBI_FLT(v, b) (((v) < (b)) | (((v) != (v)) & ((b) == (b))))
#define NBI_GT(v, b) ((v) > (b))
#define NBI_LT(v, b) ((v) < (b))

/* For each of outer slices [n, inner]: the first i whose element beats every earlier one. */
#define NBI_DEF_ARG(T, S, LD, BETTER)                                                              \
    static void nbi_arg_##S(const T *restrict x, int64_t *restrict o, int64_t outer, int64_t n,    \
                            int64_t inner) {                                                       \
        for (int64_t a = 0; a < outer; a++) {                                                      \
            const T *xa = x + a * n * inner;                                                       \
            int64_t *oa = o + a * inner;                                                           \
            if (inner == 1) {                                                                      \
                T best = (T)LD(xa[0]);                                                             \
                int64_t bi = 0;                                                                    \
                for (int64_t i = 1; i < n; i++) {                                                  \
                    T v = (T)LD(xa[i]);                                                            \
                    if (BETTER(v, best)) {                                                         \
                        best = v;                                                                  \
                        bi = i;                                                                    \
                    }                                                                              \
                }                                                                                  \
                oa[0] = bi;                                                                        \
                continue;                                                                          \
            }                                                                                      \
            /* columns 64 at a time, their best values kept (not reloaded through the              \
             * index: a dependent load per element), branch-free selects on 32-bit indices         \
             * (vectorised; n past 2^31 rows takes 64-bit ones) */                                 \
            for (int64_t c0 = 0; c0 < inner && n > INT32_MAX; c0++) {                              \
                int64_t b = 0;                                                                     \
                for (int64_t i = 1; i < n; i++) {                                                  \
                    if (BETTER((T)LD(xa[i * inner + c0]), (T)LD(xa[b * inner + c0]))) {            \
                        b = i;                                                                     \
                    }                                                                              \
                }                                                                                  \
                oa[c0] = b;                                                                        \
            }                                                                                      \
            for (int64_t c0 = 0; c0 < inner && n <= INT32_MAX; c0 += 64) {                         \
                int64_t m = inner - c0 < 64 ? inner - c0 : 64;                                     \
                T best[64];                                                                        \
                int32_t bi[64];                                                                    \
                for (int64_t c = 0; c < m; c++) {                                                  \
                    best[c] = (T)LD(xa[c0 + c]);                                                   \
                    bi[c] = 0;                                                                     \
                }                                                                                  \
                for (int64_t i = 1; i < n; i++) {                                                  \
                    const T *row = xa + i * inner + c0;                                            \
                    for (int64_t c = 0; c < m; c++) {                                              \
                        T v = (T)LD(row[c]);                                                       \
                        bool better = BETTER(v, best[c]);                                          \
                        best[c] = better ? v : best[c];                                            \
                        bi[c] = better ? (int32_t)i : bi[c];                                       \
                    }                                                                              \
                }                                                                                  \
                for (int64_t c = 0; c < m; c++) {                                                  \
                    oa[c0 + c] = bi[c];                                                            \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

NBI_DEF_ARG(float, max_f32, NBI_LD, NBI_FGT)
NBI_DEF_ARG(float, min_f32, NBI_LD, NBI_FLT)
NBI_DEF_ARG(double, max_f64, NBI_LD, NBI_FGT)
NBI_DEF_ARG(double, min_f64, NBI_LD, NBI_FLT)
NBI_DEF_ARG(int32_t, max_i32, NBI_LD, NBI_GT)
NBI_DEF_ARG(int32_t, min_i32, NBI_LD, NBI_LT)
NBI_DEF_ARG(int64_t, max_i64, NBI_LD, NBI_GT)
NBI_DEF_ARG(int64_t, min_i64, NBI_LD, NBI_LT)
NBI_DEF_ARG(uint8_t, max_b8, NBI_LD_BOOL, NBI_GT)
NBI_DEF_ARG(uint8_t, min_b8, NBI_LD_BOOL, NBI_LT)

static void nbi_k_arg(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    if (node->size == 0) {
        return;
    }
    int ax = node->at.axis;
    int64_t outer = 1, inner = 1, n = x->shape[ax];
    for (int i = 0; i < ax; i++) {
        outer *= x->shape[i];
    }
    for (int i = ax + 1; i < x->rank; i++) {
        inner *= x->shape[i];
    }
    bool is_max = node->op == NBI_OP_ARGMAX;
    const void *in = k->in[0];
    int64_t *o = k->out;
    switch (x->dtype) {
    case NB_DTYPE_F32:
        (is_max ? nbi_arg_max_f32 : nbi_arg_min_f32)(in, o, outer, n, inner);
        break;
    case NB_DTYPE_F64:
        (is_max ? nbi_arg_max_f64 : nbi_arg_min_f64)(in, o, outer, n, inner);
        break;
    case NB_DTYPE_I32:
        (is_max ? nbi_arg_max_i32 : nbi_arg_min_i32)(in, o, outer, n, inner);
        break;
    case NB_DTYPE_I64:
        (is_max ? nbi_arg_max_i64 : nbi_arg_min_i64)(in, o, outer, n, inner);
        break;
    case NB_DTYPE_BOOL:
        (is_max ? nbi_arg_max_b8 : nbi_arg_min_b8)(in, o, outer, n, inner);
        break;
    }
}

/* ---- VJP and JVP rules ---------------------------------------------------------------
 *
 * Written with the public builders, so they are more IR and compose (grad of grad, jvp of
 * grad). x is the input, y the node (the reduction's output), g the output cotangent and t
 * the input tangent (NULL: zero). The rules read the node's normalised axes and keepdims.
 *   sum:      vjp: g with the reduced axes put back as size 1 (when keepdims was false),
 *             broadcast to x's shape; jvp: the same sum of t.
 *   max, min: JAX's convention: the gradient goes in equal shares to every position that
 *             equals the extremum (ties split it; a NaN extremum, which no element equals,
 *             gives 0/0 = NaN as in JAX): vjp: where(x == y, g / count, 0); jvp:
 *             sum(where(x == y, t, 0)) / count, count being the number of such positions.
 *   prod:     through a product tree (see nbi_ptree below), exact at zeros.
 *   argmax, argmin: no rules (integer output). */

/* The node's axes as the ints the builders take; returns their number. */
static int nbi_rule_axes(const nb_var *node, int *axes) {
    for (int i = 0; i < node->at.n_axes; i++) {
        axes[i] = node->at.axes[i];
    }
    return node->at.n_axes;
}

/* v, shaped like the reduction node's output, with the reduced axes as size-1 dims (no node
 * when keepdims was already set). */
static nb_var *nbi_keep_dims(nb_var *v, const nb_var *node) {
    if (node->at.keepdims) {
        return v;
    }
    nbi_attrs at = node->at;
    at.keepdims = true;
    int64_t shape[NB_MAX_RANK];
    int r = nbi_reduced_shape(node->in[0], &at, shape);
    return nb_reshape(v, r, shape);
}

static void nbi_vjp_sum(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    const nb_var *x = node->in[0];
    in_ct[0] = nb_broadcast_to(nbi_keep_dims(g, node), x->rank, x->shape);
}

static nb_var *nbi_jvp_sum(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    if (t[0] == NULL) {
        return NULL;
    }
    int axes[NB_MAX_RANK];
    int n = nbi_rule_axes(node, axes);
    return nb_sum(t[0], axes, n, node->at.keepdims);
}

/* max/min: where x equals its extremum (bool, x's shape). */
static nb_var *nbi_extremum_hits(nb_var *node) {
    return nb_eq(node->in[0], nbi_keep_dims(node, node));
}

static void nbi_vjp_extremum(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *x = node->in[0];
    int axes[NB_MAX_RANK];
    int n = nbi_rule_axes(node, axes);
    nb_var *hit = nbi_extremum_hits(node);
    nb_var *count = nb_sum(nb_cast(hit, x->dtype), axes, n, true);
    nb_var *share = nb_div(nbi_keep_dims(g, node), count);
    in_ct[0] = nb_select(hit, share, nb_scalar(tr, 0.0));
}

static nb_var *nbi_jvp_extremum(nb_trace *tr, nb_var *node, nb_var *const *t) {
    if (t[0] == NULL) {
        return NULL;
    }
    nb_var *x = node->in[0];
    int axes[NB_MAX_RANK];
    int n = nbi_rule_axes(node, axes);
    bool keep = node->at.keepdims;
    nb_var *hit = nbi_extremum_hits(node);
    nb_var *count = nb_sum(nb_cast(hit, x->dtype), axes, n, keep);
    return nb_div(nb_sum(nb_select(hit, t[0], nb_scalar(tr, 0.0)), axes, n, keep), count);
}

/* prod's derivatives go through a product tree, as JAX's _reduce_prod_jvp_rule: x is viewed
 * as a matrix [n, m] whose rows run over the reduced axes (moved to the front and
 * flattened), and the rows are multiplied pairwise -- the first half of the rows times the
 * second half, padded with a row of ones when the count is odd -- level by level, down to
 * one row. Each level is an elementwise product, whose rules are exact however many zeros x
 * holds: the derivative with respect to x_i comes out as the product of the other elements
 * (nonzero at the single zero of a slice with one zero, 0 with two or more, never NaN), not
 * as y / x_i, and it is itself differentiable, so Hessians are right at zeros too. The
 * kernel's own left-to-right product is still the forward value; the tree only carries the
 * derivatives. Cost: about 2nm multiplications and log2(n) levels of slices, pads and
 * concatenations per rule. */
#define NBI_PTREE_LEVELS 64 /* n < 2^63 rows halve to one in at most 63 levels */

typedef struct nbi_ptree {
    int perm[NB_MAX_RANK];       /* the reduced axes first, then the kept ones */
    int64_t tshape[NB_MAX_RANK]; /* x's shape in perm's order */
    int64_t n, m;                /* x as [n, m] */
    int levels;                  /* level k multiplies a[k] * b[k] (rows[k] rows before) */
    nb_var *a[NBI_PTREE_LEVELS]; /* the first half of the rows */
    nb_var *b[NBI_PTREE_LEVELS]; /* the second half, padded with a row of ones if odd */
    int64_t rows[NBI_PTREE_LEVELS];
} nbi_ptree;

/* rows [lo, hi) of a [*, m] matrix */
static nb_var *nbi_rows(nb_var *v, int64_t lo, int64_t hi, int64_t m) {
    return nb_slice(v, (const int64_t[]){lo, 0}, (const int64_t[]){hi, m}, NULL);
}

/* v (shaped like x) as the tree's [n, m] matrix */
static nb_var *nbi_ptree_in(const nbi_ptree *p, nb_var *v) {
    return nb_reshape(nb_transpose(v, p->perm), 2, (const int64_t[]){p->n, p->m});
}

/* The levels of the tree of node's input (whose size must be > 0). */
static void nbi_ptree_build(nb_var *node, nbi_ptree *p) {
    nb_var *x = node->in[0];
    bool red[NB_MAX_RANK] = {false};
    int k = 0;
    p->n = 1;
    for (int i = 0; i < node->at.n_axes; i++) {
        red[node->at.axes[i]] = true;
        p->perm[k] = node->at.axes[i];
        p->tshape[k++] = x->shape[node->at.axes[i]];
        p->n *= x->shape[node->at.axes[i]];
    }
    for (int i = 0; i < x->rank; i++) {
        if (!red[i]) {
            p->perm[k] = i;
            p->tshape[k++] = x->shape[i];
        }
    }
    p->m = x->size / p->n;
    nb_var *v = nbi_ptree_in(p, x);
    p->levels = 0;
    for (int64_t len = p->n; len > 1 && p->levels < NBI_PTREE_LEVELS;) {
        int64_t n1 = (len + 1) / 2;
        nb_var *a = nbi_rows(v, 0, n1, p->m), *b = nbi_rows(v, n1, len, p->m);
        if (2 * n1 != len) {
            b = nb_pad(b, NULL, (const int64_t[]){1, 0}, 1.0);
        }
        p->a[p->levels] = a;
        p->b[p->levels] = b;
        p->rows[p->levels++] = len;
        v = nb_mul(a, b);
        len = n1;
    }
}

static void nbi_vjp_prod(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *x = node->in[0];
    if (x->size == 0) { /* nothing to differentiate (an empty product is the constant 1) */
        in_ct[0] = nbi_zeros_like(tr, x);
        return;
    }
    nbi_ptree p;
    nbi_ptree_build(node, &p);
    nb_var *c = nb_reshape(g, 2, (const int64_t[]){1, p.m});
    for (int k = p.levels - 1; k >= 0; k--) {
        int64_t len = p.rows[k], n1 = (len + 1) / 2;
        nb_var *parts[2] = {nb_mul(c, p.b[k]), nb_mul(c, p.a[k])};
        if (2 * n1 != len) {
            parts[1] = nbi_rows(parts[1], 0, len - n1, p.m); /* drop the padding row */
        }
        c = nb_concatenate(2, parts, 0);
    }
    int inv[NB_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        inv[p.perm[i]] = i;
    }
    in_ct[0] = nb_transpose(nb_reshape(c, x->rank, p.tshape), inv);
}

static nb_var *nbi_jvp_prod(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    nb_var *x = node->in[0];
    if (t[0] == NULL || x->size == 0) {
        return NULL;
    }
    nbi_ptree p;
    nbi_ptree_build(node, &p);
    nb_var *d = nbi_ptree_in(&p, t[0]);
    for (int k = 0; k < p.levels; k++) {
        int64_t len = p.rows[k], n1 = (len + 1) / 2;
        nb_var *da = nbi_rows(d, 0, n1, p.m), *db = nbi_rows(d, n1, len, p.m);
        if (2 * n1 != len) {
            db = nb_pad(db, NULL, (const int64_t[]){1, 0}, 0.0);
        }
        d = nb_add(nb_mul(da, p.b[k]), nb_mul(p.a[k], db));
    }
    return nb_reshape(d, node->rank, node->shape);
}

/* ---- registry entries --------------------------------------------------------------- */

/* ---- batching ------------------------------------------------------------------------
 * The same reduction over the same axes, one further (the batch axis 0 is kept). Each
 * output element combines the same elements in the kernel's fixed order, so the lanes are
 * bit for bit the unbatched results (tests/ad/test_vmap.c checks it per op). */
static nb_var *nbi_vmap_reduce(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)B;
    nbi_attrs at = node->at;
    for (int i = 0; i < at.n_axes; i++) {
        at.axes[i] += 1;
    }
    if (node->op == NBI_OP_ARGMAX || node->op == NBI_OP_ARGMIN) {
        at.axis += 1;
    }
    return nbi_emit(tr, (nbi_op)node->op, 1, &bin[0], &at);
}

const nbi_op_info nbi_opinfo_sum = {.name = "sum",
                                    .n_in = 1,
                                    .infer = nbi_infer_reduce,
                                    .kernel = nbi_k_reduce,
                                    .scratch = nbi_scratch_reduce,
                                    .vjp = nbi_vjp_sum,
                                    .jvp = nbi_jvp_sum,
                                    .vmap = nbi_vmap_reduce};
const nbi_op_info nbi_opinfo_max = {.name = "max",
                                    .n_in = 1,
                                    .infer = nbi_infer_reduce,
                                    .kernel = nbi_k_reduce,
                                    .vjp = nbi_vjp_extremum,
                                    .jvp = nbi_jvp_extremum,
                                    .vmap = nbi_vmap_reduce};
const nbi_op_info nbi_opinfo_min = {.name = "min",
                                    .n_in = 1,
                                    .infer = nbi_infer_reduce,
                                    .kernel = nbi_k_reduce,
                                    .vjp = nbi_vjp_extremum,
                                    .jvp = nbi_jvp_extremum,
                                    .vmap = nbi_vmap_reduce};
const nbi_op_info nbi_opinfo_prod = {.name = "prod",
                                     .n_in = 1,
                                     .infer = nbi_infer_reduce,
                                     .kernel = nbi_k_reduce,
                                     .vjp = nbi_vjp_prod,
                                     .jvp = nbi_jvp_prod,
                                     .vmap = nbi_vmap_reduce};
/* An index has no gradient. */
const nbi_op_info nbi_opinfo_argmax = {.name = "argmax",
                                       .n_in = 1,
                                       .infer = nbi_infer_arg,
                                       .kernel = nbi_k_arg,
                                       .nondiff = 1,
                                       .vmap = nbi_vmap_reduce};
const nbi_op_info nbi_opinfo_argmin = {.name = "argmin",
                                       .n_in = 1,
                                       .infer = nbi_infer_arg,
                                       .kernel = nbi_k_arg,
                                       .nondiff = 1,
                                       .vmap = nbi_vmap_reduce};
