/*
 * op_shape.c -- shapes and data movement: reshape, broadcast_to, transpose, slice,
 * concatenate, pad, take, take_along_axis, one_hot, dynamic_slice, dynamic_update_slice
 * (builders, shape/dtype inference, kernels, VJP and JVP rules), and the composites
 * expand_dims and squeeze (reshapes) and stack (expand_dims each input, then concatenate).
 *
 * The kernels move elements without looking at them (one_hot and pad's fill value aside),
 * so they are dtype-agnostic: elements are copied by their byte size. Strided copies walk
 * the output in row-major order and update the input offset incrementally; adjacent axes
 * that are contiguous in both buffers are merged first, so the innermost run is as long as
 * it can be (a plain memcpy when both sides are contiguous).
 *
 * Index semantics, fixed here because trace.h only says "clamped":
 *   - take, take_along_axis: a negative index counts back from the end (numpy, JAX), and
 *     whatever is still out of range is then clamped into [0, dim-1] (JAX's clip mode), so
 *     -1 is the last element, -dim-5 the first and dim+5 the last. A kernel never reads
 *     outside x. An empty axis with a non-empty result is a trace-time error (there is
 *     nothing to clamp to), as numpy's IndexError.
 *   - one_hot: an index outside [0, depth) -- negative ones included -- gives a row of
 *     zeros, as jax.nn.one_hot.
 *   - dynamic_slice, dynamic_update_slice: each start is clamped into [0, dim - size] (XLA's
 *     DynamicSlice); negative starts are not counted back from the end, they clamp to 0.
 *
 * NULL arrays: nb_slice's start or stop NULL means omitted on every axis (Python's x[::k]),
 * nb_pad's lo or hi NULL means no padding on that side; rank-0 x needs no arrays at all.
 *
 * Builders return x itself (no node) for a reshape or broadcast_to to x's own shape, an
 * identity transpose, a slice that selects everything, a pad of zero widths and a
 * concatenation of one array. Shape ops on a weak scalar stay weak (as JAX's weak types
 * through reshape, broadcast_in_dim, slice, pad, ...); concatenate and
 * dynamic_update_slice are weak only when all their data inputs are.
 */
#include "ad/ir.h"

#include <string.h>

/* ---- helpers ------------------------------------------------------------------------ */

static bool nbi_is_index_dtype(nb_dtype d) {
    return d == NB_DTYPE_I32 || d == NB_DTYPE_I64;
}

/* "[2,-1,3]" into buf. */
static const char *nbi_dims_str(char *buf, size_t cap, int rank, const int64_t *dims) {
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_sbuf_putc(&s, '[');
    for (int i = 0; i < rank; i++) {
        nbi_sbuf_printf(&s, i ? ",%lld" : "%lld", (long long)dims[i]);
    }
    nbi_sbuf_putc(&s, ']');
    return buf;
}

/* Row-major element strides of a shape. */
static void nbi_strides(int rank, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
}

static void nbi_copy_shape(nb_var *p, int rank, const int64_t *shape) {
    p->rank = (int8_t)rank;
    memset(p->shape, 0, sizeof p->shape);
    for (int i = 0; i < rank; i++) {
        p->shape[i] = shape[i];
    }
}

static bool nbi_same_shape(const nb_var *x, int rank, const int64_t *shape) {
    if (x->rank != rank) {
        return false;
    }
    for (int i = 0; i < rank; i++) {
        if (x->shape[i] != shape[i]) {
            return false;
        }
    }
    return true;
}

/* The trace of a single-input builder; *poisoned as nbi_trace_of. */
static nb_trace *nbi_trace1(nb_var *x, bool *poisoned) {
    return nbi_trace_of(1, &x, poisoned);
}

/* ---- inference ---------------------------------------------------------------------- */

/* Check a reshape target (at->a, at->n_axes dims) against x and resolve its -1 in place. */
static nb_status nbi_reshape_resolve(nb_trace *tr, const nb_var *x, nbi_attrs *at) {
    char sx[NBI_SIG_CAP], st[NBI_SIG_CAP];
    int r = at->n_axes;
    if (r < 0 || r > NB_MAX_RANK) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_reshape: target rank %d for %s is out of range; a shape has "
                             "0 to %d dims",
                             r, nbi_var_sig(sx, sizeof sx, x), NB_MAX_RANK);
    }
    nbi_var_sig(sx, sizeof sx, x);
    nbi_dims_str(st, sizeof st, r, at->a);
    int infer_at = -1;
    int64_t known = 1;
    for (int i = 0; i < r; i++) {
        if (at->a[i] == -1) {
            if (infer_at >= 0) {
                return nbi_trace_err(tr, NB_ERR_SHAPE,
                                     "nb_reshape: target shape %s for %s has more than one "
                                     "-1; at most one dim can be inferred",
                                     st, sx);
            }
            infer_at = i;
        } else if (at->a[i] < 0) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_reshape: dim %d of the target shape %s for %s is %lld; "
                                 "dims must be >= 0 (or -1 to infer one)",
                                 i, st, sx, (long long)at->a[i]);
        } else if (nbi_mul_i64(known, at->a[i], &known)) {
            return nbi_trace_err(tr, NB_ERR_OVERFLOW,
                                 "nb_reshape: target shape %s for %s has too many elements", st,
                                 sx);
        }
    }
    if (infer_at >= 0) {
        if (known == 0) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_reshape: cannot infer the -1 in %s for %s: the other "
                                 "dims multiply to 0 (give every dim explicitly)",
                                 st, sx);
        }
        if (x->size % known != 0) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_reshape: cannot reshape %s (%lld elements) into %s: %lld "
                                 "is not a multiple of %lld (the element counts must match)",
                                 sx, (long long)x->size, st, (long long)x->size, (long long)known);
        }
        at->a[infer_at] = x->size / known;
        known = x->size;
    }
    if (known != x->size) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_reshape: cannot reshape %s (%lld elements) into %s (%lld "
                             "elements); the element counts must match",
                             sx, (long long)x->size, st, (long long)known);
    }
    return NB_OK;
}

static nb_status nbi_infer_reshape(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    nb_status s = nbi_reshape_resolve(tr, x, &p->at);
    if (s != NB_OK) {
        return s;
    }
    p->dtype = x->dtype;
    nbi_copy_shape(p, p->at.n_axes, p->at.a);
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

static nb_status nbi_infer_broadcast(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    const nbi_attrs *at = &p->at;
    char sx[NBI_SIG_CAP], st[NBI_SIG_CAP];
    int r = at->n_axes;
    if (r < 0 || r > NB_MAX_RANK) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_broadcast_to: target rank %d for %s is out of range; a shape "
                             "has 0 to %d dims",
                             r, nbi_var_sig(sx, sizeof sx, x), NB_MAX_RANK);
    }
    nbi_var_sig(sx, sizeof sx, x);
    nbi_dims_str(st, sizeof st, r, at->a);
    for (int i = 0; i < r; i++) {
        if (at->a[i] < 0) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_broadcast_to: dim %d of the target shape %s is %lld; dims "
                                 "must be >= 0",
                                 i, st, (long long)at->a[i]);
        }
    }
    if (r < x->rank) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_broadcast_to: cannot broadcast %s to %s: the target has fewer "
                             "dims than the input (remove size-1 dims with nb_squeeze or "
                             "nb_reshape first)",
                             sx, st);
    }
    for (int j = 0; j < x->rank; j++) {
        int i = j + (r - x->rank);
        if (x->shape[j] != at->a[i] && x->shape[j] != 1) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_broadcast_to: cannot broadcast %s to %s: input dim %d (%lld) "
                                 "must be 1 or equal the target's dim %d (%lld); shapes are "
                                 "aligned from the right",
                                 sx, st, j, (long long)x->shape[j], i, (long long)at->a[i]);
        }
    }
    p->dtype = x->dtype;
    nbi_copy_shape(p, r, at->a);
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

static nb_status nbi_infer_transpose(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    nbi_attrs *at = &p->at;
    char sx[NBI_SIG_CAP], sp[NBI_SIG_CAP];
    int r = x->rank;
    bool seen[NB_MAX_RANK] = {false};
    bool ok = at->n_axes == r;
    int64_t perm[NB_MAX_RANK];
    for (int i = 0; i < at->n_axes && i < NB_MAX_RANK; i++) {
        perm[i] = at->axes[i];
    }
    for (int i = 0; ok && i < r; i++) {
        int a;
        if (!nbi_norm_axis(at->axes[i], r, &a) || seen[a]) {
            ok = false;
            break;
        }
        seen[a] = true;
        at->axes[i] = a;
    }
    if (!ok) {
        int n = at->n_axes < 0 ? 0 : at->n_axes > NB_MAX_RANK ? NB_MAX_RANK : at->n_axes;
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "nb_transpose: perm %s is not a permutation of the %d axes of %s "
                             "(list each axis once, from 0 to %d or -%d to -1)",
                             nbi_dims_str(sp, sizeof sp, n, perm), r, nbi_var_sig(sx, sizeof sx, x),
                             r - 1, r);
    }
    p->dtype = x->dtype;
    p->rank = (int8_t)r;
    memset(p->shape, 0, sizeof p->shape);
    for (int i = 0; i < r; i++) {
        p->shape[i] = x->shape[at->axes[i]];
    }
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

/* The length of a normalised slice: start a, stop b (both in [-1, len]), step c != 0. */
static int64_t nbi_slice_count(int64_t a, int64_t b, int64_t c) {
    if (c > 0) {
        return b > a ? (int64_t)((uint64_t)(b - a - 1) / (uint64_t)c) + 1 : 0;
    }
    return b < a ? (int64_t)((uint64_t)(a - b - 1) / (0u - (uint64_t)c)) + 1 : 0;
}

/* The attributes hold the canonical slice (nbi_slice_norm): the kernel reads element
 * a + i*c along each axis. Inference checks that every element read is inside x. */
static nb_status nbi_infer_slice(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    const nbi_attrs *at = &p->at;
    char sx[NBI_SIG_CAP];
    p->dtype = x->dtype;
    p->rank = x->rank;
    memset(p->shape, 0, sizeof p->shape);
    for (int d = 0; d < x->rank; d++) {
        int64_t len = x->shape[d], a = at->a[d], b = at->b[d], c = at->c[d];
        if (c == 0) {
            return nbi_trace_err(tr, NB_ERR_INVALID,
                                 "nb_slice: step 0 on axis %d of %s; a step must be nonzero", d,
                                 nbi_var_sig(sx, sizeof sx, x));
        }
        bool ok = a >= -1 && a <= len && b >= -1 && b <= len;
        int64_t n = ok ? nbi_slice_count(a, b, c) : 0;
        if (ok && n > 0) {
            int64_t last = a + (n - 1) * c;
            ok = a >= 0 && a < len && last >= 0 && last < len;
        }
        if (!ok) {
            return nbi_trace_err(tr, NB_ERR_INTERNAL,
                                 "nb_slice: axis %d of %s has unnormalised bounds %lld:%lld:%lld",
                                 d, nbi_var_sig(sx, sizeof sx, x), (long long)a, (long long)b,
                                 (long long)c);
        }
        p->shape[d] = n;
    }
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

static nb_status nbi_infer_concat(nb_trace *tr, nb_var *p) {
    const nb_var *x0 = p->in[0];
    char s0[NBI_SIG_CAP], si[NBI_SIG_CAP];
    int r = x0->rank, ax;
    if (r == 0) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_concatenate: input 0 is %s (rank 0); scalars cannot be "
                             "concatenated (use nb_stack)",
                             nbi_var_sig(s0, sizeof s0, x0));
    }
    if (!nbi_norm_axis(p->at.axis, r, &ax)) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "nb_concatenate: axis %d is out of range for %s (use 0 to %d or -%d "
                             "to -1)",
                             (int)p->at.axis, nbi_var_sig(s0, sizeof s0, x0), r - 1, r);
    }
    p->at.axis = ax;
    int64_t total = 0;
    bool weak = true;
    for (int32_t j = 0; j < p->n_in; j++) {
        const nb_var *xj = p->in[j];
        if (xj->dtype != x0->dtype) {
            return nbi_trace_err(tr, NB_ERR_DTYPE,
                                 "nb_concatenate: input %d is %s but input 0 is %s; all inputs "
                                 "need one dtype (convert with nb_cast)",
                                 (int)j, nbi_var_sig(si, sizeof si, xj),
                                 nbi_var_sig(s0, sizeof s0, x0));
        }
        bool same = xj->rank == r;
        for (int d = 0; same && d < r; d++) {
            same = d == ax || xj->shape[d] == x0->shape[d];
        }
        if (!same) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_concatenate: input %d is %s but input 0 is %s; inputs need "
                                 "the same rank and equal dims except on axis %d",
                                 (int)j, nbi_var_sig(si, sizeof si, xj),
                                 nbi_var_sig(s0, sizeof s0, x0), ax);
        }
        if (__builtin_add_overflow(total, xj->shape[ax], &total)) {
            return nbi_trace_err(tr, NB_ERR_OVERFLOW,
                                 "nb_concatenate: the result's axis %d is too long", ax);
        }
        weak = weak && (xj->flags & NBI_NODE_WEAK);
    }
    p->dtype = x0->dtype;
    nbi_copy_shape(p, r, x0->shape);
    p->shape[ax] = total;
    if (weak) {
        p->flags |= NBI_NODE_WEAK;
    }
    return NB_OK;
}

static nb_status nbi_infer_pad(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    const nbi_attrs *at = &p->at;
    char sx[NBI_SIG_CAP];
    p->dtype = x->dtype;
    p->rank = x->rank;
    memset(p->shape, 0, sizeof p->shape);
    for (int d = 0; d < x->rank; d++) {
        if (at->a[d] < 0 || at->b[d] < 0) {
            bool lo = at->a[d] < 0;
            return nbi_trace_err(tr, NB_ERR_INVALID,
                                 "nb_pad: %s[%d] is %lld for %s; padding must be >= 0 (crop "
                                 "with nb_slice)",
                                 lo ? "lo" : "hi", d, (long long)(lo ? at->a[d] : at->b[d]),
                                 nbi_var_sig(sx, sizeof sx, x));
        }
        int64_t n;
        if (__builtin_add_overflow(x->shape[d], at->a[d], &n) ||
            __builtin_add_overflow(n, at->b[d], &n)) {
            return nbi_trace_err(tr, NB_ERR_OVERFLOW,
                                 "nb_pad: padding axis %d of %s makes it too long", d,
                                 nbi_var_sig(sx, sizeof sx, x));
        }
        p->shape[d] = n;
    }
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

/* The common checks of take-like ops: integer indices and an axis of x. */
static nb_status nbi_check_gather(nb_trace *tr, const char *fn, const nb_var *x, const nb_var *idx,
                                  nbi_attrs *at) {
    char sx[NBI_SIG_CAP], si[NBI_SIG_CAP];
    if (!nbi_is_index_dtype(idx->dtype)) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "%s: indices are %s; they must be i32 or i64 (convert with nb_cast)",
                             fn, nbi_var_sig(si, sizeof si, idx));
    }
    if (x->rank == 0) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "%s: x %s is rank 0 and has no axis to take along (reshape it to "
                             "rank 1 first)",
                             fn, nbi_var_sig(sx, sizeof sx, x));
    }
    int ax;
    if (!nbi_norm_axis(at->axis, x->rank, &ax)) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "%s: axis %d is out of range for x %s (use 0 to %d or -%d to -1)", fn,
                             (int)at->axis, nbi_var_sig(sx, sizeof sx, x), x->rank - 1, x->rank);
    }
    at->axis = ax;
    return NB_OK;
}

/* A non-empty result cannot take from an empty axis. */
static nb_status nbi_check_nonempty(nb_trace *tr, const char *fn, const nb_var *x,
                                    const nb_var *p) {
    char sx[NBI_SIG_CAP];
    int ax = p->at.axis;
    bool empty = false;
    for (int d = 0; d < p->rank; d++) {
        empty = empty || p->shape[d] == 0;
    }
    if (x->shape[ax] == 0 && !empty) {
        return nbi_trace_err(tr, NB_ERR_INDEX,
                             "%s: axis %d of x %s is empty, so there is nothing to take (numpy "
                             "raises here too; check the shapes)",
                             fn, ax, nbi_var_sig(sx, sizeof sx, x));
    }
    return NB_OK;
}

static nb_status nbi_infer_take(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0], *idx = p->in[1];
    char sx[NBI_SIG_CAP], si[NBI_SIG_CAP];
    nb_status s = nbi_check_gather(tr, "nb_take", x, idx, &p->at);
    if (s != NB_OK) {
        return s;
    }
    int ax = p->at.axis;
    int r = x->rank - 1 + idx->rank;
    if (r > NB_MAX_RANK) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_take: x %s with indices %s would give a rank-%d result; the "
                             "most is %d (reshape the indices to fewer dims)",
                             nbi_var_sig(sx, sizeof sx, x), nbi_var_sig(si, sizeof si, idx), r,
                             NB_MAX_RANK);
    }
    p->dtype = x->dtype;
    p->rank = (int8_t)r;
    memset(p->shape, 0, sizeof p->shape);
    int k = 0;
    for (int d = 0; d < ax; d++) {
        p->shape[k++] = x->shape[d];
    }
    for (int d = 0; d < idx->rank; d++) {
        p->shape[k++] = idx->shape[d];
    }
    for (int d = ax + 1; d < x->rank; d++) {
        p->shape[k++] = x->shape[d];
    }
    p->flags |= x->flags & NBI_NODE_WEAK;
    return nbi_check_nonempty(tr, "nb_take", x, p);
}

static nb_status nbi_infer_take_along(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0], *idx = p->in[1];
    char sx[NBI_SIG_CAP], si[NBI_SIG_CAP];
    nb_status s = nbi_check_gather(tr, "nb_take_along_axis", x, idx, &p->at);
    if (s != NB_OK) {
        return s;
    }
    int ax = p->at.axis;
    if (idx->rank != x->rank) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_take_along_axis: indices %s and x %s differ in rank; indices "
                             "need x's rank (add size-1 dims with nb_expand_dims)",
                             nbi_var_sig(si, sizeof si, idx), nbi_var_sig(sx, sizeof sx, x));
    }
    p->dtype = x->dtype;
    p->rank = x->rank;
    memset(p->shape, 0, sizeof p->shape);
    for (int d = 0; d < x->rank; d++) {
        int64_t dx = x->shape[d], di = idx->shape[d];
        if (d == ax) {
            p->shape[d] = di;
        } else if (dx == di || dx == 1 || di == 1) {
            p->shape[d] = dx == 1 ? di : dx;
        } else {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_take_along_axis: indices %s and x %s do not broadcast on "
                                 "axis %d (%lld vs %lld); off the take axis %d, each dim pair "
                                 "must be equal or contain a 1",
                                 nbi_var_sig(si, sizeof si, idx), nbi_var_sig(sx, sizeof sx, x), d,
                                 (long long)di, (long long)dx, ax);
        }
    }
    p->flags |= x->flags & NBI_NODE_WEAK;
    return nbi_check_nonempty(tr, "nb_take_along_axis", x, p);
}

static nb_status nbi_infer_one_hot(nb_trace *tr, nb_var *p) {
    const nb_var *idx = p->in[0];
    const nbi_attrs *at = &p->at;
    char si[NBI_SIG_CAP];
    if (!nbi_is_index_dtype(idx->dtype)) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_one_hot: indices are %s; they must be i32 or i64 (convert with "
                             "nb_cast)",
                             nbi_var_sig(si, sizeof si, idx));
    }
    if (at->ivalue < 0) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "nb_one_hot: depth %lld for indices %s; depth must be >= 0",
                             (long long)at->ivalue, nbi_var_sig(si, sizeof si, idx));
    }
    if (nb_dtype_size(at->to) == 0) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_one_hot: unknown dtype %d for the result (use an NB_DTYPE_ "
                             "value)",
                             (int)at->to);
    }
    if (idx->rank >= NB_MAX_RANK) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_one_hot: indices %s already have %d dims; the result would "
                             "have %d, the most is %d",
                             nbi_var_sig(si, sizeof si, idx), idx->rank, idx->rank + 1,
                             NB_MAX_RANK);
    }
    p->dtype = at->to;
    nbi_copy_shape(p, idx->rank, idx->shape);
    p->shape[idx->rank] = at->ivalue;
    p->rank = (int8_t)(idx->rank + 1);
    return NB_OK;
}

/* Check the start vars of a dynamic slice: rank-0 integers, one per axis of x, from input
 * first on. */
static nb_status nbi_check_starts(nb_trace *tr, const char *fn, const nb_var *p, int first) {
    const nb_var *x = p->in[0];
    char sx[NBI_SIG_CAP], ss[NBI_SIG_CAP];
    if (p->n_in != first + x->rank) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "%s: %d start vars for x %s; pass exactly one per axis (%d)", fn,
                             (int)(p->n_in - first), nbi_var_sig(sx, sizeof sx, x), x->rank);
    }
    for (int d = 0; d < x->rank; d++) {
        const nb_var *s = p->in[first + d];
        if (s->rank != 0 || !nbi_is_index_dtype(s->dtype)) {
            return nbi_trace_err(tr, NB_ERR_DTYPE,
                                 "%s: start %d is %s; starts must be rank-0 i32 or i64 vars "
                                 "(e.g. nb_scalar_typed(tr, NB_DTYPE_I64, 0))",
                                 fn, d, nbi_var_sig(ss, sizeof ss, s));
        }
    }
    return NB_OK;
}

/* The per-lane form's operands (nbi_dyn_lanes): made by the batching rules, so a mismatch
 * is nabla's bug. x's lanes and the block's lanes (blanes) are 1 or B; starts from input
 * first on, one [B] integer vector per axis of x after the first. */
static nb_status nbi_check_lanes(nb_trace *tr, const char *fn, const nb_var *p, int first,
                                 int64_t B, int64_t blanes) {
    const nb_var *x = p->in[0];
    char sx[NBI_SIG_CAP];
    bool ok = x->rank >= 1 && p->n_in == first + x->rank - 1 && B >= 0 &&
              (x->shape[0] == 1 || x->shape[0] == B) && (blanes == 1 || blanes == B);
    for (int32_t j = first; ok && j < p->n_in; j++) {
        const nb_var *s = p->in[j];
        ok = s->rank == 1 && s->shape[0] == B && nbi_is_index_dtype(s->dtype);
    }
    if (!ok) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL,
                             "%s (per lane): x %s, %d start vectors: expected x with 1 or %lld "
                             "lanes and one [%lld] integer start per axis after the first",
                             fn, nbi_var_sig(sx, sizeof sx, x), (int)(p->n_in - first),
                             (long long)B, (long long)B);
    }
    return NB_OK;
}

static nb_status nbi_infer_dyn_slice(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    char sx[NBI_SIG_CAP], sz[NBI_SIG_CAP];
    bool lanes = nbi_dyn_lanes(p);
    nb_status s = lanes ? nbi_check_lanes(tr, "nb_dynamic_slice", p, 1, p->at.a[0], 1)
                        : nbi_check_starts(tr, "nb_dynamic_slice", p, 1);
    if (s != NB_OK) {
        return s;
    }
    for (int d = lanes ? 1 : 0; d < x->rank; d++) {
        if (p->at.a[d] < 0 || p->at.a[d] > x->shape[d]) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_dynamic_slice: sizes %s do not fit in x %s: size %lld on "
                                 "axis %d must be between 0 and the dim (%lld)",
                                 nbi_dims_str(sz, sizeof sz, x->rank, p->at.a),
                                 nbi_var_sig(sx, sizeof sx, x), (long long)p->at.a[d], d,
                                 (long long)x->shape[d]);
        }
    }
    p->dtype = x->dtype;
    nbi_copy_shape(p, x->rank, p->at.a);
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

static nb_status nbi_infer_dyn_update(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0], *u = p->in[1];
    char sx[NBI_SIG_CAP], su[NBI_SIG_CAP];
    if (u->dtype != x->dtype) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_dynamic_update_slice: update %s and x %s differ in dtype "
                             "(convert the update with nb_cast)",
                             nbi_var_sig(su, sizeof su, u), nbi_var_sig(sx, sizeof sx, x));
    }
    bool fits = u->rank == x->rank;
    for (int d = nbi_dyn_lanes(p) ? 1 : 0; fits && d < x->rank; d++) { /* lanes: checked below */
        fits = u->shape[d] <= x->shape[d];
    }
    if (!fits) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_dynamic_update_slice: update %s does not fit in x %s; it needs "
                             "x's rank and dims no larger than x's",
                             nbi_var_sig(su, sizeof su, u), nbi_var_sig(sx, sizeof sx, x));
    }
    nb_status s = nbi_dyn_lanes(p) ? nbi_check_lanes(tr, "nb_dynamic_update_slice", p, 2,
                                                     x->rank >= 1 ? x->shape[0] : 0,
                                                     u->rank >= 1 ? u->shape[0] : 0)
                                   : nbi_check_starts(tr, "nb_dynamic_update_slice", p, 2);
    if (s != NB_OK) {
        return s;
    }
    p->dtype = x->dtype;
    nbi_copy_shape(p, x->rank, x->shape);
    if ((x->flags & NBI_NODE_WEAK) && (u->flags & NBI_NODE_WEAK)) {
        p->flags |= NBI_NODE_WEAK;
    }
    return NB_OK;
}

/* ---- builders ----------------------------------------------------------------------- */

/* Copy a user shape of rank dims into at->a (n_axes = rank); records the error if rank or
 * shape is unusable. */
static nb_status nbi_target_attrs(nb_trace *tr, const char *fn, const nb_var *x, int rank,
                                  const int64_t *shape, nbi_attrs *at) {
    char sx[NBI_SIG_CAP];
    memset(at, 0, sizeof *at);
    if (rank < 0 || rank > NB_MAX_RANK) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "%s: target rank %d for %s is out of range; a shape has 0 to %d "
                             "dims",
                             fn, rank, nbi_var_sig(sx, sizeof sx, x), NB_MAX_RANK);
    }
    if (rank > 0 && shape == NULL) {
        return nbi_trace_err(tr, NB_ERR_MISUSE,
                             "%s: NULL target shape with rank %d for %s; pass %d dims", fn, rank,
                             nbi_var_sig(sx, sizeof sx, x), rank);
    }
    at->n_axes = rank;
    for (int i = 0; i < rank; i++) {
        at->a[i] = shape[i];
    }
    return NB_OK;
}

nb_var *nb_reshape(nb_var *x, int rank, const int64_t *shape) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    if (nbi_target_attrs(tr, "nb_reshape", x, rank, shape, &at) != NB_OK ||
        nbi_reshape_resolve(tr, x, &at) != NB_OK) {
        return tr->poison;
    }
    if (nbi_same_shape(x, rank, at.a)) {
        return x;
    }
    return nbi_emit(tr, NBI_OP_RESHAPE, 1, &x, &at);
}

nb_var *nb_broadcast_to(nb_var *x, int rank, const int64_t *shape) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    if (nbi_target_attrs(tr, "nb_broadcast_to", x, rank, shape, &at) != NB_OK) {
        return tr->poison;
    }
    if (nbi_same_shape(x, rank, at.a)) {
        return x;
    }
    return nbi_emit(tr, NBI_OP_BROADCAST, 1, &x, &at);
}

nb_var *nb_transpose(nb_var *x, const int *perm) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    int r = x->rank;
    at.n_axes = r;
    bool identity = true;
    for (int i = 0; i < r; i++) {
        at.axes[i] = perm != NULL ? perm[i] : r - 1 - i;
        int a;
        identity = identity && nbi_norm_axis(at.axes[i], r, &a) && a == i;
    }
    if (identity) {
        return x;
    }
    return nbi_emit(tr, NBI_OP_TRANSPOSE, 1, &x, &at);
}

/* Python's slice.indices() for one axis of length len and a nonzero step: start and stop
 * (NULL means omitted) counted back from the end when negative, then clamped into
 * [-1, len]. */
static int64_t nbi_slice_bound(int64_t len, const int64_t *v, int64_t step, bool is_start) {
    if (v == NULL) {
        return is_start ? (step > 0 ? 0 : len - 1) : (step > 0 ? len : -1);
    }
    int64_t s = *v;
    if (s < 0) {
        s += len; /* no overflow: len >= 0 */
        return s < 0 ? (step < 0 ? -1 : 0) : s;
    }
    return s >= len ? (step < 0 ? len - 1 : len) : s;
}

/* The canonical form stored in the attributes, so that equal slices have equal attributes
 * (CSE): a is the first index, b one step-direction past the last (last + 1 or last - 1,
 * always in [-1, len]), c the step; an axis of 0 or 1 elements has step 1, and an empty
 * one is 0:0:1. */
static void nbi_slice_norm(int64_t len, const int64_t *start, const int64_t *stop, int64_t step,
                           int64_t *a, int64_t *b, int64_t *c) {
    int64_t first = nbi_slice_bound(len, start, step, true);
    int64_t n = nbi_slice_count(first, nbi_slice_bound(len, stop, step, false), step);
    if (n <= 1) {
        *a = n == 0 ? 0 : first;
        *b = *a + n;
        *c = 1;
        return;
    }
    *a = first;
    *b = first + (n - 1) * step + (step > 0 ? 1 : -1); /* the last index is inside x */
    *c = step;
}

nb_var *nb_slice(nb_var *x, const int64_t *start, const int64_t *stop, const int64_t *step) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    bool identity = true;
    for (int d = 0; d < x->rank; d++) {
        int64_t c = step != NULL ? step[d] : 1;
        if (c == 0) {
            char sx[NBI_SIG_CAP];
            return nbi_trace_errv(tr, NB_ERR_INVALID,
                                  "nb_slice: step 0 on axis %d of %s; a step must be nonzero", d,
                                  nbi_var_sig(sx, sizeof sx, x));
        }
        nbi_slice_norm(x->shape[d], start != NULL ? &start[d] : NULL,
                       stop != NULL ? &stop[d] : NULL, c, &at.a[d], &at.b[d], &at.c[d]);
        identity = identity && at.a[d] == 0 && at.c[d] == 1 && at.b[d] == x->shape[d];
    }
    if (identity) {
        return x;
    }
    return nbi_emit(tr, NBI_OP_SLICE, 1, &x, &at);
}

/* n < 1 or a NULL xs leave no trace to record an error on: the result is NULL. */
/* n < 1 or no array of vars: nothing says which trace, so the one running records it. */
static nb_var *nbi_no_vars(const char *fn, int n, nb_var *const *xs) {
    nb_trace *tr = nbi_trace_current();
    if (tr == NULL) {
        return NULL;
    }
    if (xs == NULL && n > 0) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE, "%s: xs is NULL (with n = %d)", fn, n);
    }
    return nbi_trace_errv(tr, NB_ERR_INVALID,
                          "%s: n is %d: it needs at least one var (an empty result is nb_full "
                          "with a zero-size dim)",
                          fn, n);
}

nb_var *nb_concatenate(int n, nb_var *const *xs, int axis) {
    if (n < 1 || xs == NULL) {
        return nbi_no_vars("nb_concatenate", n, xs);
    }
    bool poisoned;
    nb_trace *tr = nbi_trace_of(n, xs, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    int ax;
    if (!poisoned && n == 1 && nbi_norm_axis(axis, xs[0]->rank, &ax)) {
        return xs[0];
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axis = axis;
    return nbi_emit(tr, NBI_OP_CONCAT, n, xs, &at);
}

nb_var *nb_pad(nb_var *x, const int64_t *lo, const int64_t *hi, double value) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    bool none = true;
    for (int d = 0; d < x->rank; d++) {
        at.a[d] = lo != NULL ? lo[d] : 0; /* NULL: no padding on that side */
        at.b[d] = hi != NULL ? hi[d] : 0;
        none = none && at.a[d] == 0 && at.b[d] == 0;
    }
    at.value = value;
    if (none) {
        return x;
    }
    return nbi_emit(tr, NBI_OP_PAD, 1, &x, &at);
}

nb_var *nb_take(nb_var *x, nb_var *indices, int axis) {
    nb_var *in[2] = {x, indices};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, in, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axis = axis;
    return nbi_emit(tr, NBI_OP_TAKE, 2, in, &at);
}

nb_var *nb_take_along_axis(nb_var *x, nb_var *indices, int axis) {
    nb_var *in[2] = {x, indices};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, in, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axis = axis;
    return nbi_emit(tr, NBI_OP_TAKE_ALONG, 2, in, &at);
}

nb_var *nb_one_hot(nb_var *indices, int64_t depth, nb_dtype dtype) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(indices, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.ivalue = depth;
    at.to = dtype;
    return nbi_emit(tr, NBI_OP_ONE_HOT, 1, &indices, &at);
}

/* in = {x, [update,] starts...}: first is 1 or 2. */
static nb_var *nbi_dyn_emit(nbi_op op, const char *fn, nb_var *x, nb_var *update,
                            nb_var *const *starts, const int64_t *sizes) {
    nb_var *in[2 + NB_MAX_RANK] = {x, update};
    int first = op == NBI_OP_DYN_UPDATE ? 2 : 1;
    bool poisoned;
    nb_trace *tr = nbi_trace_of(first, in, &poisoned);
    if (tr == NULL && starts != NULL && starts[0] != NULL) {
        /* x (and update) NULL: the start vars still name the trace (a NULL x with a non-NULL
         * starts array has at least its first entry: x's rank is >= 1 or starts is NULL) */
        tr = starts[0]->tr;
        if (tr != NULL && tr->status == NB_OK) {
            return nbi_trace_errv(tr, NB_ERR_MISUSE, "%s: x is NULL", fn);
        }
        return tr != NULL ? tr->poison : NULL;
    }
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return nbi_emit(tr, op, first, in, NULL); /* the NULL-input message, or poison */
    }
    char sx[NBI_SIG_CAP];
    int r = x->rank;
    if (r > 0 && (starts == NULL || (op == NBI_OP_DYN_SLICE && sizes == NULL))) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE, "%s: NULL %s for x %s; pass one %s per axis (%d)",
                              fn, starts == NULL ? "starts" : "sizes",
                              nbi_var_sig(sx, sizeof sx, x),
                              starts == NULL ? "rank-0 integer start var" : "size", r);
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    for (int d = 0; d < r; d++) {
        in[first + d] = starts[d];
        if (op == NBI_OP_DYN_SLICE) {
            at.a[d] = sizes[d];
        }
    }
    return nbi_emit(tr, op, first + r, in, &at);
}

nb_var *nb_dynamic_slice(nb_var *x, nb_var *const *starts, const int64_t *sizes) {
    return nbi_dyn_emit(NBI_OP_DYN_SLICE, "nb_dynamic_slice", x, NULL, starts, sizes);
}

nb_var *nb_dynamic_update_slice(nb_var *x, nb_var *update, nb_var *const *starts) {
    return nbi_dyn_emit(NBI_OP_DYN_UPDATE, "nb_dynamic_update_slice", x, update, starts, NULL);
}

/* The per-lane forms (nbi_dyn_lanes): starts has x->rank - 1 entries; sizes the block's
 * dims after the lanes. Inputs are non-NULL vars of one trace (the rules' own). */
nb_var *nbi_dyn_slice_lanes(nb_var *x, nb_var *const *starts, const int64_t *sizes, int64_t B) {
    nb_var *in[1 + NB_MAX_RANK] = {x};
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axis = 1;
    at.a[0] = B;
    for (int d = 1; d < x->rank; d++) {
        in[d] = starts[d - 1];
        at.a[d] = sizes[d - 1];
    }
    return nbi_emit(x->tr, NBI_OP_DYN_SLICE, x->rank, in, &at);
}

nb_var *nbi_dyn_update_lanes(nb_var *x, nb_var *u, nb_var *const *starts) {
    nb_var *in[2 + NB_MAX_RANK] = {x, u};
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axis = 1;
    for (int d = 1; d < x->rank; d++) {
        in[1 + d] = starts[d - 1];
    }
    return nbi_emit(x->tr, NBI_OP_DYN_UPDATE, x->rank + 1, in, &at);
}

/* ---- composites --------------------------------------------------------------------- */

nb_var *nb_expand_dims(nb_var *x, int axis) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    char sx[NBI_SIG_CAP];
    int r = x->rank;
    if (r >= NB_MAX_RANK) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_expand_dims: %s already has %d dims, the most an array can "
                              "have",
                              nbi_var_sig(sx, sizeof sx, x), NB_MAX_RANK);
    }
    int a = axis < 0 ? axis + r + 1 : axis;
    if (a < 0 || a > r) {
        return nbi_trace_errv(tr, NB_ERR_INVALID,
                              "nb_expand_dims: axis %d is out of range for %s (use -%d to %d)",
                              axis, nbi_var_sig(sx, sizeof sx, x), r + 1, r);
    }
    int64_t shape[NB_MAX_RANK];
    for (int i = 0, j = 0; i <= r; i++) {
        shape[i] = i == a ? 1 : x->shape[j++];
    }
    return nb_reshape(x, r + 1, shape);
}

nb_var *nb_squeeze(nb_var *x, const int *axes, int n_axes) {
    bool poisoned;
    nb_trace *tr = nbi_trace1(x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    char sx[NBI_SIG_CAP];
    int r = x->rank;
    bool drop[NB_MAX_RANK] = {false};
    if (axes == NULL) {
        for (int d = 0; d < r; d++) {
            drop[d] = x->shape[d] == 1;
        }
    } else {
        if (n_axes < 0 || n_axes > r) {
            return nbi_trace_errv(tr, NB_ERR_INVALID,
                                  "nb_squeeze: %d axes listed for %s; list 0 to %d axes (or "
                                  "pass NULL to remove every size-1 axis)",
                                  n_axes, nbi_var_sig(sx, sizeof sx, x), r);
        }
        for (int i = 0; i < n_axes; i++) {
            int a;
            if (!nbi_norm_axis(axes[i], r, &a)) {
                return nbi_trace_errv(tr, NB_ERR_INVALID,
                                      "nb_squeeze: axis %d is out of range for %s (use 0 to %d "
                                      "or -%d to -1)",
                                      axes[i], nbi_var_sig(sx, sizeof sx, x), r - 1, r);
            }
            if (drop[a]) {
                return nbi_trace_errv(tr, NB_ERR_INVALID,
                                      "nb_squeeze: axis %d of %s is listed twice; list each "
                                      "axis once",
                                      a, nbi_var_sig(sx, sizeof sx, x));
            }
            if (x->shape[a] != 1) {
                return nbi_trace_errv(tr, NB_ERR_SHAPE,
                                      "nb_squeeze: axis %d of %s has size %lld; only size-1 axes "
                                      "can be removed (use nb_slice or a reduction)",
                                      a, nbi_var_sig(sx, sizeof sx, x), (long long)x->shape[a]);
            }
            drop[a] = true;
        }
    }
    int64_t shape[NB_MAX_RANK];
    int k = 0;
    for (int d = 0; d < r; d++) {
        if (!drop[d]) {
            shape[k++] = x->shape[d];
        }
    }
    return nb_reshape(x, k, shape);
}

/* n < 1 or a NULL xs leave no trace to record an error on: the result is NULL. */
nb_var *nb_stack(int n, nb_var *const *xs, int axis) {
    if (n < 1 || xs == NULL) {
        return nbi_no_vars("nb_stack", n, xs);
    }
    bool poisoned;
    nb_trace *tr = nbi_trace_of(n, xs, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    char s0[NBI_SIG_CAP], si[NBI_SIG_CAP];
    for (int i = 0; i < n; i++) {
        if (xs[i] == NULL) {
            return nbi_trace_errv(tr, NB_ERR_MISUSE, "nb_stack: input %d is a NULL var", i);
        }
    }
    for (int i = 0; i < n; i++) {
        if (xs[i]->flags & NBI_NODE_POISON) {
            return tr->poison;
        }
        if (xs[i]->tr != tr) {
            return nbi_trace_errv(tr, NB_ERR_INVALID,
                                  "nb_stack: input %d belongs to another trace (a var was kept "
                                  "after its trace ended, or an outer var was used inside a "
                                  "function without being passed as an argument)",
                                  i);
        }
        if (xs[i]->dtype != xs[0]->dtype || !nbi_same_shape(xs[i], xs[0]->rank, xs[0]->shape)) {
            return nbi_trace_errv(tr, xs[i]->dtype != xs[0]->dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                                  "nb_stack: input %d is %s but input 0 is %s; stacked inputs "
                                  "need one shape and dtype (nb_concatenate joins along an "
                                  "existing axis)",
                                  i, nbi_var_sig(si, sizeof si, xs[i]),
                                  nbi_var_sig(s0, sizeof s0, xs[0]));
        }
    }
    int r = xs[0]->rank;
    if (r >= NB_MAX_RANK) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_stack: the inputs %s already have %d dims, the most an array "
                              "can have",
                              nbi_var_sig(s0, sizeof s0, xs[0]), NB_MAX_RANK);
    }
    int a = axis < 0 ? axis + r + 1 : axis;
    if (a < 0 || a > r) {
        return nbi_trace_errv(tr, NB_ERR_INVALID,
                              "nb_stack: axis %d is out of range for inputs %s (use -%d to %d)",
                              axis, nbi_var_sig(s0, sizeof s0, xs[0]), r + 1, r);
    }
    nb_var **ex = nbi_arena_alloc(&tr->arena, (size_t)n * sizeof(nb_var *));
    if (ex == NULL) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_stack: out of memory while tracing");
    }
    for (int i = 0; i < n; i++) {
        ex[i] = nb_expand_dims(xs[i], a);
    }
    return nb_concatenate(n, ex, a);
}

/* ---- kernel helpers ----------------------------------------------------------------- */

size_t nbi_elem_from_f64(nb_dtype d, double v, unsigned char *buf) {
    switch (d) {
    case NB_DTYPE_F32: {
        float f = (float)v;
        memcpy(buf, &f, sizeof f);
        return sizeof f;
    }
    case NB_DTYPE_F64:
        memcpy(buf, &v, sizeof v);
        return sizeof v;
    case NB_DTYPE_I32: {
        int32_t q = v != v               ? 0
                    : v <= -2147483648.0 ? INT32_MIN
                    : v >= 2147483647.0  ? INT32_MAX
                                         : (int32_t)v;
        memcpy(buf, &q, sizeof q);
        return sizeof q;
    }
    case NB_DTYPE_I64: {
        int64_t q = v != v                        ? 0
                    : v <= -9223372036854775808.0 ? INT64_MIN
                    : v >= 9223372036854775808.0  ? INT64_MAX
                                                  : (int64_t)v;
        memcpy(buf, &q, sizeof q);
        return sizeof q;
    }
    case NB_DTYPE_BOOL:
        buf[0] = v != 0;
        return 1;
    }
    return 0;
}

/* out[0..n) = the element at elem, by doubling copies. */
static void nbi_fill(unsigned char *out, int64_t n, const unsigned char *elem, size_t es) {
    if (n <= 0) {
        return;
    }
    memcpy(out, elem, es);
    int64_t have = 1;
    while (have < n) {
        int64_t m = have < n - have ? have : n - have;
        memcpy(out + (size_t)have * es, out, (size_t)m * es);
        have += m;
    }
}

static int64_t nbi_read_index(const void *p, nb_dtype d, int64_t i) {
    return d == NB_DTYPE_I32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

/* numpy-style negative index, then clamped into [0, dim-1] (dim > 0). */
static int64_t nbi_fix_index(int64_t i, int64_t dim) {
    if (i < 0) {
        i += dim;
    }
    return i < 0 ? 0 : i >= dim ? dim - 1 : i;
}

/* A block of shape[rank] elements with output and input strides (in elements; input
 * strides may be 0 or negative), merged: size-1 axes dropped and neighbours that are
 * contiguous in both buffers joined. Returns the merged rank, or -1 if the block is empty. */
static int nbi_merge_axes(int rank, const int64_t *shape, const int64_t *ost, const int64_t *ist,
                          int64_t *n, int64_t *so, int64_t *si) {
    int r = 0;
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 0) {
            return -1;
        }
        if (shape[d] == 1) {
            continue;
        }
        if (r > 0 && so[r - 1] == ost[d] * shape[d] && si[r - 1] == ist[d] * shape[d]) {
            n[r - 1] *= shape[d];
            so[r - 1] = ost[d];
            si[r - 1] = ist[d];
            continue;
        }
        n[r] = shape[d];
        so[r] = ost[d];
        si[r] = ist[d];
        r++;
    }
    return r;
}

/* o[k*so] = i[k*si] for k < n, elements of es bytes (offsets from the given pointers). */
static void nbi_copy_row(unsigned char *o, int64_t so, const unsigned char *i, int64_t si,
                         int64_t n, size_t es) {
    if (so == 1 && si == 1) {
        memcpy(o, i, (size_t)n * es);
        return;
    }
    ptrdiff_t bo = (ptrdiff_t)so * (ptrdiff_t)es, bi = (ptrdiff_t)si * (ptrdiff_t)es;
    switch (es) {
    case 1:
        for (int64_t k = 0; k < n; k++) {
            o[k * bo] = i[k * bi];
        }
        break;
    case 4:
        for (int64_t k = 0; k < n; k++) {
            memcpy(o + k * bo, i + k * bi, 4);
        }
        break;
    case 8:
        for (int64_t k = 0; k < n; k++) {
            memcpy(o + k * bo, i + k * bi, 8);
        }
        break;
    default:
        for (int64_t k = 0; k < n; k++) {
            memcpy(o + k * bo, i + k * bi, es);
        }
        break;
    }
}

/* Copy a merged block (nbi_merge_axes) row by row; oo/io are element offsets of the
 * block's first element. Every element touched is inside the buffers. */
static void nbi_copy_merged(unsigned char *out, int64_t oo, const unsigned char *in, int64_t io,
                            int r, const int64_t *n, const int64_t *so, const int64_t *si,
                            size_t es) {
    if (r < 0) {
        return;
    }
    if (r == 0) {
        memcpy(out + (size_t)oo * es, in + (size_t)io * es, es);
        return;
    }
    int64_t idx[NB_MAX_RANK] = {0}, inner = n[r - 1], rows = 1;
    for (int d = 0; d < r - 1; d++) {
        rows *= n[d];
    }
    for (int64_t row = 0; row < rows; row++) {
        nbi_copy_row(out + (size_t)oo * es, so[r - 1], in + (size_t)io * es, si[r - 1], inner, es);
        for (int d = r - 2; d >= 0; d--) {
            oo += so[d];
            io += si[d];
            if (++idx[d] < n[d]) {
                break;
            }
            oo -= so[d] * n[d];
            io -= si[d] * n[d];
            idx[d] = 0;
        }
    }
}

/* Copy a block of shape[rank] elements: the element at multi-index i goes from
 * in[io + sum i[d]*ist[d]] to out[oo + sum i[d]*ost[d]]. */
static void nbi_copy_block(void *out, int64_t oo, const int64_t *ost, const void *in, int64_t io,
                           const int64_t *ist, int rank, const int64_t *shape, size_t es) {
    int64_t n[NB_MAX_RANK], so[NB_MAX_RANK], si[NB_MAX_RANK];
    int r = nbi_merge_axes(rank, shape, ost, ist, n, so, si);
    nbi_copy_merged(out, oo, in, io, r, n, so, si, es);
}

/* ---- kernels ------------------------------------------------------------------------ */

static void nbi_k_reshape(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size > 0 && k->out != k->in[0]) {
        memcpy(k->out, k->in[0], (size_t)node->size * nb_dtype_size(node->dtype));
    }
}

static void nbi_k_broadcast(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    int64_t ost[NB_MAX_RANK], ist[NB_MAX_RANK];
    nbi_strides(node->rank, node->shape, ost);
    nbi_bcast_strides(x->rank, x->shape, node->rank, node->shape, ist);
    nbi_copy_block(k->out, 0, ost, k->in[0], 0, ist, node->rank, node->shape,
                   nb_dtype_size(node->dtype));
}

#define NBI_TR_TILE 32

/* The scatter half of a tile for elements of ES bytes (a constant, so memcpy is one move):
 * tile row c holds input elements r0.., written to output row r at column c0 + c. */
#define NBI_TR_SCATTER(ES)                                                                         \
    for (int64_t r = 0; r < nr; r++) {                                                             \
        unsigned char *orow = o + (size_t)((r0 + r) * ors + c0) * (ES);                            \
        for (int64_t c = 0; c < nc; c++) {                                                         \
            memcpy(orow + (size_t)c * (ES), tile + (size_t)(c * NBI_TR_TILE + r) * (ES), (ES));    \
        }                                                                                          \
    }

/* out[r*ors + c] = in[r + c*ics] for r < rows, c < cols (element offsets): a 2-D transpose
 * with row strides. Done in 32x32 tiles staged in a local buffer, so that both the reads
 * and the writes run along contiguous memory (reading a tile straight across rows would hit
 * the same cache set again and again when the strides are powers of two). */
void nbi_transpose_tiles(unsigned char *o, int64_t ors, const unsigned char *in, int64_t ics,
                         int64_t rows, int64_t cols, size_t es) {
    unsigned char tile[NBI_TR_TILE * NBI_TR_TILE * 8]; /* es <= 8 */
    for (int64_t r0 = 0; r0 < rows; r0 += NBI_TR_TILE) {
        int64_t nr = rows - r0 < NBI_TR_TILE ? rows - r0 : NBI_TR_TILE;
        for (int64_t c0 = 0; c0 < cols; c0 += NBI_TR_TILE) {
            int64_t nc = cols - c0 < NBI_TR_TILE ? cols - c0 : NBI_TR_TILE;
            for (int64_t c = 0; c < nc; c++) {
                memcpy(tile + (size_t)(c * NBI_TR_TILE) * es,
                       in + (size_t)((c0 + c) * ics + r0) * es, (size_t)nr * es);
            }
            switch (es) {
            case 1:
                NBI_TR_SCATTER(1)
                break;
            case 4:
                NBI_TR_SCATTER(4)
                break;
            default:
                NBI_TR_SCATTER(8)
                break;
            }
        }
    }
}

#undef NBI_TR_SCATTER

/* Output axes merged where possible; when the input's contiguous axis p is not the output's
 * last axis, every (p, last) plane is a strided 2-D transpose done in tiles (rank 2 is one
 * plane, a batched matrix transpose one plane per matrix); otherwise a strided copy. */
static void nbi_k_transpose(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    size_t es = nb_dtype_size(node->dtype);
    int64_t ost[NB_MAX_RANK], xst[NB_MAX_RANK], ist[NB_MAX_RANK];
    nbi_strides(node->rank, node->shape, ost);
    nbi_strides(x->rank, x->shape, xst);
    for (int i = 0; i < node->rank; i++) {
        ist[i] = xst[node->at.axes[i]];
    }
    int64_t n[NB_MAX_RANK], so[NB_MAX_RANK], si[NB_MAX_RANK];
    int r = nbi_merge_axes(node->rank, node->shape, ost, ist, n, so, si);
    int p = -1;
    for (int d = 0; d < r - 1; d++) {
        if (si[d] == 1) {
            p = d;
        }
    }
    if (p < 0 || es > 8) {
        nbi_copy_merged(k->out, 0, k->in[0], 0, r, n, so, si, es);
        return;
    }
    /* The other axes, walked row-major; so[r-1] is 1 (the output is dense). */
    int64_t bn[NB_MAX_RANK], bo[NB_MAX_RANK], bi[NB_MAX_RANK], idx[NB_MAX_RANK] = {0};
    int nb = 0;
    int64_t planes = 1;
    for (int d = 0; d < r - 1; d++) {
        if (d != p) {
            bn[nb] = n[d];
            bo[nb] = so[d];
            bi[nb] = si[d];
            planes *= n[d];
            nb++;
        }
    }
    unsigned char *out = k->out;
    const unsigned char *in = k->in[0];
    int64_t oo = 0, io = 0;
    for (int64_t b = 0; b < planes; b++) {
        nbi_transpose_tiles(out + (size_t)oo * es, so[p], in + (size_t)io * es, si[r - 1], n[p],
                            n[r - 1], es);
        for (int d = nb - 1; d >= 0; d--) {
            oo += bo[d];
            io += bi[d];
            if (++idx[d] < bn[d]) {
                break;
            }
            oo -= bo[d] * bn[d];
            io -= bi[d] * bn[d];
            idx[d] = 0;
        }
    }
}

static void nbi_k_slice(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    int64_t ost[NB_MAX_RANK], xst[NB_MAX_RANK], ist[NB_MAX_RANK], io = 0;
    nbi_strides(node->rank, node->shape, ost);
    nbi_strides(x->rank, x->shape, xst);
    for (int d = 0; d < node->rank; d++) {
        /* A single element needs no stride (and a huge step times a stride could overflow). */
        ist[d] = node->shape[d] > 1 ? xst[d] * node->at.c[d] : 0;
        io += node->shape[d] > 0 ? node->at.a[d] * xst[d] : 0;
    }
    nbi_copy_block(k->out, 0, ost, k->in[0], io, ist, node->rank, node->shape,
                   nb_dtype_size(node->dtype));
}

static void nbi_k_concat(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return;
    }
    size_t es = nb_dtype_size(node->dtype);
    int ax = node->at.axis;
    int64_t outer = nbi_shape_size(ax, node->shape);
    int64_t inner = nbi_shape_size(node->rank - ax - 1, node->shape + ax + 1);
    unsigned char *o = k->out;
    for (int64_t i = 0; i < outer; i++) {
        for (int32_t j = 0; j < node->n_in; j++) {
            size_t bytes = (size_t)(node->in[j]->shape[ax] * inner) * es;
            if (bytes > 0) {
                memcpy(o, (const unsigned char *)k->in[j] + (size_t)i * bytes, bytes);
                o += bytes;
            }
        }
    }
}

static void nbi_k_pad(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    unsigned char v[8];
    size_t es = nbi_elem_from_f64(node->dtype, node->at.value, v);
    nbi_fill(k->out, node->size, v, es);
    int64_t ost[NB_MAX_RANK], xst[NB_MAX_RANK], oo = 0;
    nbi_strides(node->rank, node->shape, ost);
    nbi_strides(x->rank, x->shape, xst);
    for (int d = 0; d < node->rank; d++) {
        oo += node->at.a[d] * ost[d];
    }
    if (x->size > 0) {
        nbi_copy_block(k->out, oo, ost, k->in[0], 0, xst, x->rank, x->shape, es);
    }
}

/* out[o, j, i] = x[o, fix(idx[j]), i] with x viewed as [outer, dim, inner]. */
static void nbi_k_take(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0], *ix = node->in[1];
    if (node->size == 0) {
        return;
    }
    size_t es = nb_dtype_size(node->dtype);
    int ax = node->at.axis;
    int64_t outer = nbi_shape_size(ax, x->shape), dim = x->shape[ax];
    int64_t inner = nbi_shape_size(x->rank - ax - 1, x->shape + ax + 1);
    size_t row = (size_t)inner * es;
    const unsigned char *in = k->in[0];
    unsigned char *o = k->out;
    for (int64_t i = 0; i < outer; i++) {
        for (int64_t j = 0; j < ix->size; j++) {
            int64_t q = nbi_fix_index(nbi_read_index(k->in[1], ix->dtype, j), dim);
            memcpy(o, in + (size_t)(i * dim + q) * row, row);
            o += row;
        }
    }
}

/* Walk the output; x and the indices are addressed through broadcast strides, and x's
 * position along the axis comes from the index. */
static void nbi_k_take_along(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0], *ix = node->in[1];
    if (node->size == 0) {
        return;
    }
    size_t es = nb_dtype_size(node->dtype);
    int r = node->rank, ax = node->at.axis;
    int64_t xst[NB_MAX_RANK], sx[NB_MAX_RANK], sj[NB_MAX_RANK], idx[NB_MAX_RANK] = {0};
    nbi_strides(x->rank, x->shape, xst);
    for (int d = 0; d < r; d++) {
        sx[d] = (d == ax || x->shape[d] == 1) ? 0 : xst[d];
    }
    nbi_bcast_strides(ix->rank, ix->shape, r, node->shape, sj);
    const unsigned char *in = k->in[0];
    unsigned char *o = k->out;
    int64_t dim = x->shape[ax], ox = 0, oj = 0;
    for (int64_t i = 0; i < node->size; i++) {
        int64_t q = nbi_fix_index(nbi_read_index(k->in[1], ix->dtype, oj), dim);
        memcpy(o + (size_t)i * es, in + (size_t)(ox + q * xst[ax]) * es, es);
        for (int d = r - 1; d >= 0; d--) {
            ox += sx[d];
            oj += sj[d];
            if (++idx[d] < node->shape[d]) {
                break;
            }
            ox -= sx[d] * node->shape[d];
            oj -= sj[d] * node->shape[d];
            idx[d] = 0;
        }
    }
}

static void nbi_k_one_hot(const nbi_kargs *k) {
    const nb_var *node = k->node, *ix = node->in[0];
    size_t es = nb_dtype_size(node->dtype);
    if (node->size == 0) {
        return;
    }
    memset(k->out, 0, (size_t)node->size * es); /* all-zero bytes are 0 in every dtype */
    unsigned char one[8];
    nbi_elem_from_f64(node->dtype, 1.0, one);
    int64_t depth = node->at.ivalue;
    unsigned char *o = k->out;
    for (int64_t i = 0; i < ix->size; i++) {
        int64_t q = nbi_read_index(k->in[0], ix->dtype, i);
        if (q >= 0 && q < depth) {
            memcpy(o + (size_t)(i * depth + q) * es, one, es);
        }
    }
}

/* The element offset of a block of sizes[] at the clamped run-time starts (inputs from
 * first on) in x. */
static int64_t nbi_dyn_offset(const nbi_kargs *k, int first, const int64_t *sizes,
                              const int64_t *xst) {
    const nb_var *node = k->node, *x = node->in[0];
    int64_t off = 0;
    for (int d = 0; d < x->rank; d++) {
        int64_t s = nbi_read_index(k->in[first + d], node->in[first + d]->dtype, 0);
        int64_t hi = x->shape[d] - sizes[d];
        s = s < 0 ? 0 : s > hi ? hi : s;
        off += s * xst[d];
    }
    return off;
}

/* Lane b's element offset in x (xl: x's lane stride, 0 for one shared lane) of a block of
 * sizes[1..] at its clamped starts (inputs from first on, one [B] vector per axis after the
 * lanes). */
static int64_t nbi_lane_offset(const nbi_kargs *k, int first, const int64_t *sizes,
                               const int64_t *xst, int64_t xl, int64_t b) {
    const nb_var *node = k->node, *x = node->in[0];
    int64_t off = b * xl;
    for (int d = 1; d < x->rank; d++) {
        int64_t s = nbi_read_index(k->in[first + d - 1], node->in[first + d - 1]->dtype, b);
        int64_t hi = x->shape[d] - sizes[d];
        s = s < 0 ? 0 : s > hi ? hi : s;
        off += s * xst[d];
    }
    return off;
}

static void nbi_k_dyn_slice_lanes(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    int64_t ost[NB_MAX_RANK], xst[NB_MAX_RANK], B = node->shape[0];
    nbi_strides(node->rank, node->shape, ost);
    nbi_strides(x->rank, x->shape, xst);
    int64_t xl = x->shape[0] == 1 ? 0 : xst[0];
    size_t es = nb_dtype_size(node->dtype);
    for (int64_t b = 0; b < B; b++) {
        int64_t io = nbi_lane_offset(k, 1, node->shape, xst, xl, b);
        nbi_copy_block(k->out, b * ost[0], ost + 1, k->in[0], io, xst + 1, node->rank - 1,
                       node->shape + 1, es);
    }
}

static void nbi_k_dyn_slice(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    if (node->size == 0) {
        return;
    }
    if (nbi_dyn_lanes(node)) {
        nbi_k_dyn_slice_lanes(k);
        return;
    }
    int64_t ost[NB_MAX_RANK], xst[NB_MAX_RANK];
    nbi_strides(node->rank, node->shape, ost);
    nbi_strides(x->rank, x->shape, xst);
    int64_t io = nbi_dyn_offset(k, 1, node->shape, xst);
    nbi_copy_block(k->out, 0, ost, k->in[0], io, xst, node->rank, node->shape,
                   nb_dtype_size(node->dtype));
}

static void nbi_k_dyn_update(const nbi_kargs *k) {
    const nb_var *node = k->node, *u = node->in[1];
    size_t es = nb_dtype_size(node->dtype);
    if (node->size > 0 && k->out != k->in[0]) {
        memcpy(k->out, k->in[0], (size_t)node->size * es);
    }
    if (u->size == 0 || node->size == 0) {
        return;
    }
    int64_t xst[NB_MAX_RANK], ust[NB_MAX_RANK];
    nbi_strides(node->rank, node->shape, xst);
    nbi_strides(u->rank, u->shape, ust);
    if (nbi_dyn_lanes(node)) {
        int64_t ul = u->shape[0] == 1 ? 0 : ust[0];
        for (int64_t b = 0; b < node->shape[0]; b++) {
            int64_t oo = nbi_lane_offset(k, 2, u->shape, xst, xst[0], b);
            nbi_copy_block(k->out, oo, xst + 1, k->in[1], b * ul, ust + 1, u->rank - 1,
                           u->shape + 1, es);
        }
        return;
    }
    int64_t oo = nbi_dyn_offset(k, 2, u->shape, xst);
    nbi_copy_block(k->out, oo, xst, k->in[1], 0, ust, u->rank, u->shape, es);
}

/* ---- VJP and JVP rules ---------------------------------------------------------------
 *
 * Written with the public builders, so they are more IR and compose (grad of grad, jvp of
 * grad). x is the data input, g the output cotangent, t a tangent (NULL: zero). Every op
 * here is linear in its data inputs, so each JVP applies the op itself to the tangents
 * (zeros standing in for a missing one where there are several data inputs), and each VJP
 * is the op's transpose:
 *   reshape: g reshaped to x's shape;       broadcast_to: g summed back (nbi_unbroadcast);
 *   transpose: g by the inverse permutation; pad: the interior slice of g;
 *   concatenate: g sliced into the inputs' pieces along the axis;
 *   slice: g scattered into zeros at the positions read (nbi_unslice: exact for every
 *     slice nb_slice accepts -- negative and large steps, empty results);
 *   take, take_along_axis: g scatter-added into zeros at the indices the kernel used
 *     (negative ones counted back, then clamped), duplicates accumulating (nbi_vjp_take,
 *     nbi_vjp_take_along); the indices get nothing;
 *   dynamic_slice: g written into zeros at the same clamped starts (dynamic_update_slice
 *     clamps a block of g's size exactly as the forward op clamped it);
 *   dynamic_update_slice: x gets g with the update's block zeroed, the update gets that
 *     block of g; the starts get nothing.
 * one_hot has no rules (integer input). */

static void nbi_vjp_reshape(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    in_ct[0] = nb_reshape(g, node->in[0]->rank, node->in[0]->shape);
}

static nb_var *nbi_jvp_reshape(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    return t[0] ? nb_reshape(t[0], node->rank, node->shape) : NULL;
}

static void nbi_vjp_broadcast(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    in_ct[0] = nbi_unbroadcast(g, node->in[0]->rank, node->in[0]->shape);
}

static nb_var *nbi_jvp_broadcast(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    return t[0] ? nb_broadcast_to(t[0], node->rank, node->shape) : NULL;
}

static void nbi_vjp_transpose(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    int inv[NB_MAX_RANK];
    for (int i = 0; i < node->rank; i++) {
        inv[node->at.axes[i]] = i;
    }
    in_ct[0] = nb_transpose(g, inv);
}

static nb_var *nbi_jvp_transpose(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    if (t[0] == NULL) {
        return NULL;
    }
    int perm[NB_MAX_RANK];
    for (int i = 0; i < node->rank; i++) {
        perm[i] = node->at.axes[i];
    }
    return nb_transpose(t[0], perm);
}

/* v reversed along axis d. */
static nb_var *nbi_reverse_axis(nb_var *v, int d) {
    int64_t step[NB_MAX_RANK];
    for (int i = 0; i < v->rank; i++) {
        step[i] = i == d ? -1 : 1;
    }
    return nb_slice(v, NULL, NULL, step);
}

/* v with s - 1 zeros between consecutive elements along axis d (n >= 1 elements there
 * become (n - 1) s + 1, element i moving to i s): v viewed as [outer, n, 1, inner], padded
 * to [outer, n, s, inner], read as [outer, n s, inner] and cut after the last element. */
static nb_var *nbi_spread_axis(nb_var *v, int d, int64_t s) {
    int64_t outer = nbi_shape_size(d, v->shape), n = v->shape[d];
    int64_t inner = nbi_shape_size(v->rank - d - 1, v->shape + d + 1);
    int64_t span = (n - 1) * s + 1, shape[NB_MAX_RANK];
    nb_var *w = nb_reshape(v, 4, (const int64_t[]){outer, n, 1, inner});
    w = nb_pad(w, NULL, (const int64_t[]){0, 0, s - 1, 0}, 0.0);
    w = nb_reshape(w, 3, (const int64_t[]){outer, n * s, inner});
    w = nb_slice(w, (const int64_t[]){0, 0, 0}, (const int64_t[]){outer, span, inner}, NULL);
    memcpy(shape, v->shape, (size_t)v->rank * sizeof(int64_t));
    shape[d] = span;
    return nb_reshape(w, v->rank, shape);
}

/* The adjoint of a slice: g (the slice's shape) scattered into zeros of x's shape at the
 * positions the slice read. The canonical attributes read a + i c along each axis. Per axis,
 * a negative step is undone by reversing g (the positions are then increasing from
 * a + (n-1) c), a step |c| > 1 by spreading g's elements |c| apart; one pad then places the
 * block at its lowest position. Every element of the result is either an element of g or an
 * exact 0. */
static nb_var *nbi_unslice(nb_trace *tr, const nb_var *node, nb_var *g) {
    const nb_var *x = node->in[0];
    if (g->size == 0) {
        return nbi_zeros_like(tr, x);
    }
    int64_t lo[NB_MAX_RANK], hi[NB_MAX_RANK];
    for (int d = 0; d < x->rank; d++) {
        int64_t n = node->shape[d], a = node->at.a[d], c = node->at.c[d];
        /* canonical: c == 1 unless n >= 2, and then |c| < len, so -c cannot overflow */
        if (c < 0) {
            g = nbi_reverse_axis(g, d);
            a += (n - 1) * c;
            c = -c;
        }
        if (c > 1) {
            g = nbi_spread_axis(g, d, c);
        }
        lo[d] = a;
        hi[d] = x->shape[d] - a - (n - 1) * c - 1;
    }
    return nb_pad(g, lo, hi, 0.0);
}

static void nbi_vjp_slice(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    in_ct[0] = nbi_unslice(tr, node, g);
}

/* The same slice of t: the canonical bounds turned back into nb_slice's arguments (a stop
 * of -1, one below index 0, is written -1 - len so that it is not counted back). */
static nb_var *nbi_jvp_slice(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    if (t[0] == NULL) {
        return NULL;
    }
    const nb_var *x = node->in[0];
    int64_t stop[NB_MAX_RANK];
    for (int d = 0; d < x->rank; d++) {
        stop[d] = node->at.b[d] < 0 ? -1 - x->shape[d] : node->at.b[d];
    }
    return nb_slice(t[0], node->at.a, stop, node->at.c);
}

static void nbi_vjp_concat(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    int ax = node->at.axis, r = node->rank;
    int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
    memcpy(stop, node->shape, (size_t)r * sizeof(int64_t));
    for (int32_t j = 0; j < node->n_in; j++) {
        stop[ax] = start[ax] + node->in[j]->shape[ax];
        in_ct[j] = nb_slice(g, start, stop, NULL);
        start[ax] = stop[ax];
    }
}

static nb_var *nbi_jvp_concat(nb_trace *tr, nb_var *node, nb_var *const *t) {
    bool any = false;
    for (int32_t j = 0; j < node->n_in; j++) {
        any = any || t[j] != NULL;
    }
    if (!any) {
        return NULL;
    }
    nb_var **parts = nbi_arena_alloc(&tr->arena, (size_t)node->n_in * sizeof(nb_var *));
    if (parts == NULL) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_concatenate: out of memory in forward mode");
    }
    for (int32_t j = 0; j < node->n_in; j++) {
        parts[j] = t[j] ? t[j] : nbi_zeros_like(tr, node->in[j]);
    }
    return nb_concatenate(node->n_in, parts, node->at.axis);
}

static void nbi_vjp_pad(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    const nb_var *x = node->in[0];
    int64_t stop[NB_MAX_RANK];
    for (int d = 0; d < x->rank; d++) {
        stop[d] = node->at.a[d] + x->shape[d];
    }
    in_ct[0] = nb_slice(g, node->at.a, stop, NULL);
}

static nb_var *nbi_jvp_pad(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    return t[0] ? nb_pad(t[0], node->at.a, node->at.b, 0.0) : NULL;
}

/* The indices as the take kernels use them, as i64: negative ones counted back from the end
 * of an axis of dim > 0 elements, then clamped into [0, dim - 1] (nbi_fix_index). */
static nb_var *nbi_fixed_indices(nb_trace *tr, nb_var *idx, int64_t dim) {
    nb_var *i = nb_cast(idx, NB_DTYPE_I64);
    nb_var *zero = nb_scalar_typed(tr, NB_DTYPE_I64, 0.0);
    i = nb_select(nb_lt(i, zero), nb_add(i, nb_scalar_typed(tr, NB_DTYPE_I64, (double)dim)), i);
    return nb_minimum(nb_maximum(i, zero), nb_scalar_typed(tr, NB_DTYPE_I64, (double)(dim - 1)));
}

/* take's adjoint. With x as [outer, dim, inner] and g as [outer, n, inner] (n = the number
 * of indices), ct_x[o, d, i] = sum over j of [idx_j == d] g[o, j, i]: a product with the
 * [dim, n] selection matrix S (S[d, j] = 1 where index j picks row d), S @ g, batched over
 * outer. Exact -- every output is 1 * (the sum of the g values its row received) plus
 * exact zeros, duplicates adding up in index order -- deterministic, and O(dim n) memory
 * rather than the O(dim n inner) of a masked sum, which matters for embedding tables. A
 * non-finite g value spreads NaN (0 * inf) to the other rows of its column, where a true
 * scatter-add would leave them 0. */
static void nbi_vjp_take(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *x = node->in[0], *idx = node->in[1];
    if (x->size == 0 || g->size == 0) {
        in_ct[0] = nbi_zeros_like(tr, x);
        return;
    }
    int ax = node->at.axis;
    int64_t outer = nbi_shape_size(ax, x->shape), dim = x->shape[ax], n = idx->size;
    int64_t inner = nbi_shape_size(x->rank - ax - 1, x->shape + ax + 1);
    nb_var *cols = nb_reshape(nbi_fixed_indices(tr, idx, dim), 2, (const int64_t[]){1, n});
    nb_var *rows = nb_iota(tr, NB_DTYPE_I64, 2, (const int64_t[]){dim, 1}, 0);
    nb_var *sel = nb_cast(nb_eq(rows, cols), x->dtype);
    nb_var *g3 = outer == 1 ? nb_reshape(g, 2, (const int64_t[]){n, inner})
                            : nb_reshape(g, 3, (const int64_t[]){outer, n, inner});
    in_ct[0] = nb_reshape(nb_matmul(sel, g3), x->rank, x->shape);
}

static nb_var *nbi_jvp_take(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    return t[0] ? nb_take(t[0], node->in[1], node->at.axis) : NULL;
}

/* take_along_axis's adjoint. The output (g's shape) is [outer, m, inner] around the axis;
 * with the indices broadcast to it, ct[o, d, i] = sum over j < m of [idx[o, j, i] == d]
 * g[o, j, i] -- a masked sum over a [outer, m, dim, inner] mask (select, not a product,
 * so a non-finite g stays in its own position) -- then summed over the axes where x was
 * broadcast (nbi_unbroadcast). Exact and deterministic (duplicates add up in j order). */
static void nbi_vjp_take_along(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *x = node->in[0], *idx = node->in[1];
    if (x->size == 0 || g->size == 0) {
        in_ct[0] = nbi_zeros_like(tr, x);
        return;
    }
    int ax = node->at.axis, r = node->rank;
    int64_t dim = x->shape[ax], m = node->shape[ax], shape[NB_MAX_RANK];
    int64_t outer = nbi_shape_size(ax, node->shape);
    int64_t inner = nbi_shape_size(r - ax - 1, node->shape + ax + 1);
    const int64_t s4[4] = {outer, m, 1, inner};
    nb_var *i4 =
        nb_reshape(nb_broadcast_to(nbi_fixed_indices(tr, idx, dim), r, node->shape), 4, s4);
    nb_var *rows = nb_iota(tr, NB_DTYPE_I64, 4, (const int64_t[]){1, 1, dim, 1}, 2);
    nb_var *picked = nb_select(nb_eq(i4, rows), nb_reshape(g, 4, s4), nb_scalar(tr, 0.0));
    memcpy(shape, node->shape, (size_t)r * sizeof(int64_t));
    shape[ax] = dim;
    nb_var *s = nb_reshape(nb_sum(picked, (const int[]){1}, 1, false), r, shape);
    in_ct[0] = nbi_unbroadcast(s, x->rank, x->shape);
}

static nb_var *nbi_jvp_take_along(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    return t[0] ? nb_take_along_axis(t[0], node->in[1], node->at.axis) : NULL;
}

/* The per-lane forms' rules are the same transposes, lane by lane; an operand with one
 * lane shared by B gets the sum of the lanes' cotangents. */
static nb_var *nbi_lanes_sum(nb_var *ct, const nb_var *like) {
    if (like->shape[0] == ct->shape[0]) {
        return ct;
    }
    int ax = 0;
    return nb_sum(ct, &ax, 1, true);
}

static void nbi_vjp_dyn_slice(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *x = node->in[0];
    if (nbi_dyn_lanes(node)) {
        int64_t shape[NB_MAX_RANK];
        memcpy(shape, x->shape, (size_t)x->rank * sizeof *shape);
        shape[0] = node->shape[0];
        nb_var *z = nb_full(tr, x->dtype, x->rank, shape, 0.0);
        in_ct[0] = nbi_lanes_sum(nbi_dyn_update_lanes(z, g, node->in + 1), x);
        return;
    }
    in_ct[0] = nb_dynamic_update_slice(nbi_zeros_like(tr, x), g, node->in + 1);
}

static nb_var *nbi_jvp_dyn_slice(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    if (t[0] != NULL && nbi_dyn_lanes(node)) {
        return nbi_dyn_slice_lanes(t[0], node->in + 1, node->shape + 1, node->shape[0]);
    }
    return t[0] ? nb_dynamic_slice(t[0], node->in + 1, node->shape) : NULL;
}

static void nbi_vjp_dyn_update(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *u = node->in[1], *const *starts = node->in + 2;
    if (nbi_dyn_lanes(node)) {
        in_ct[0] = nbi_dyn_update_lanes(g, nbi_zeros_like(tr, u), starts);
        in_ct[1] = nbi_lanes_sum(nbi_dyn_slice_lanes(g, starts, u->shape + 1, g->shape[0]), u);
        return;
    }
    in_ct[0] = nb_dynamic_update_slice(g, nbi_zeros_like(tr, u), starts);
    in_ct[1] = nb_dynamic_slice(g, starts, u->shape);
}

static nb_var *nbi_jvp_dyn_update(nb_trace *tr, nb_var *node, nb_var *const *t) {
    if (t[0] == NULL && t[1] == NULL) {
        return NULL;
    }
    nb_var *tx = t[0] ? t[0] : nbi_zeros_like(tr, node->in[0]);
    nb_var *tu = t[1] ? t[1] : nbi_zeros_like(tr, node->in[1]);
    return nbi_dyn_lanes(node) ? nbi_dyn_update_lanes(tx, tu, node->in + 2)
                               : nb_dynamic_update_slice(tx, tu, node->in + 2);
}

/* ---- batching ------------------------------------------------------------------------
 * Shape ops move data without arithmetic, so every rule is exact: the same op with the
 * batch axis 0 added in front (kept whole by slices and pads, carried by reshapes and
 * transposes); an unbatched operand is broadcast only where the op needs every lane's copy
 * (concatenate, dynamic_update_slice's target). Start indices that differ per lane
 * (dynamic_slice, dynamic_update_slice) make their per-lane form (nbi_dyn_lanes): one op,
 * each lane's block at its own starts; the per-lane form batched again runs once per outer
 * lane (nbi_vmap_unroll). */

/* [B] + node's shape into shape; false (an error set) past the maximum rank */
static bool nbi_bshape(nb_trace *tr, const nb_var *node, int64_t B, int64_t *shape) {
    if (node->rank + 1 > NB_MAX_RANK) {
        nbi_trace_err(tr, NB_ERR_SHAPE,
                      "nb_vmap: a batched %s of rank %d exceeds the maximum "
                      "rank %d",
                      nbi_op_name((nbi_op)node->op), node->rank + 1, NB_MAX_RANK);
        return false;
    }
    shape[0] = B;
    memcpy(shape + 1, node->shape, (size_t)node->rank * sizeof *shape);
    return true;
}

static nb_var *nbi_vmap_reshape(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    int64_t shape[NB_MAX_RANK];
    return nbi_bshape(tr, node, B, shape) ? nb_reshape(bin[0], node->rank + 1, shape) : tr->poison;
}

static nb_var *nbi_vmap_broadcast(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    int64_t shape[NB_MAX_RANK];
    if (!nbi_bshape(tr, node, B, shape)) {
        return tr->poison;
    }
    return nb_broadcast_to(nbi_vmap_lift(bin[0], node->rank), node->rank + 1, shape);
}

static nb_var *nbi_vmap_transpose(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)tr;
    (void)B;
    int perm[NB_MAX_RANK];
    perm[0] = 0;
    for (int i = 0; i < node->rank; i++) {
        perm[i + 1] = node->at.axes[i] + 1;
    }
    return nb_transpose(bin[0], perm);
}

static nb_var *nbi_vmap_slice(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)tr;
    const nb_var *x = node->in[0];
    int64_t start[NB_MAX_RANK], stop[NB_MAX_RANK], step[NB_MAX_RANK];
    start[0] = 0;
    stop[0] = B;
    step[0] = 1;
    for (int d = 0; d < x->rank; d++) {
        start[d + 1] = node->at.a[d];
        stop[d + 1] = node->at.b[d] < 0 ? -1 - x->shape[d] : node->at.b[d];
        step[d + 1] = node->at.c[d];
    }
    return nb_slice(bin[0], start, stop, step);
}

static nb_var *nbi_vmap_concat(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    nb_var **parts = nbi_arena_alloc(&tr->arena, (size_t)node->n_in * sizeof *parts);
    if (parts == NULL) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_vmap: out of memory");
    }
    for (int32_t j = 0; j < node->n_in; j++) {
        parts[j] = bin[j] != NULL ? bin[j] : nbi_vmap_bcast(node->in[j], B);
    }
    return nb_concatenate(node->n_in, parts, node->at.axis + 1);
}

static nb_var *nbi_vmap_pad(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)tr;
    (void)B;
    int64_t lo[NB_MAX_RANK], hi[NB_MAX_RANK];
    lo[0] = hi[0] = 0;
    memcpy(lo + 1, node->at.a, (size_t)node->in[0]->rank * sizeof *lo);
    memcpy(hi + 1, node->at.b, (size_t)node->in[0]->rank * sizeof *hi);
    return nb_pad(bin[0], lo, hi, node->at.value);
}

/* take: x batched -- the axis one further; the indices batched -- their lanes' axis moved to
 * the front; both -- one take over the lanes' rows laid end to end, each lane's indices
 * (normalised and clamped as the kernel does) offset by its row. */
static nb_var *nbi_vmap_take(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    int axis = node->at.axis;
    nb_var *x = node->in[0], *idx = node->in[1];
    if (bin[1] == NULL) {
        return nb_take(bin[0], idx, axis + 1);
    }
    if (bin[0] == NULL) {
        return nbi_vmap_move(nb_take(x, bin[1], axis), axis, 0);
    }
    int64_t n = x->shape[axis], rest[NB_MAX_RANK];
    nb_var *bx = nbi_vmap_move(bin[0], axis + 1, 1); /* [B, n, pre..., post...] */
    int rr = 0;
    rest[rr++] = B * n;
    for (int d = 2; d < bx->rank; d++) {
        rest[rr++] = bx->shape[d];
    }
    nb_var *flat = nb_reshape(bx, rr, rest);
    nb_var *fi = n > 0 ? nbi_fixed_indices(tr, bin[1], n) : nb_cast(bin[1], NB_DTYPE_I64);
    int64_t oshape[NB_MAX_RANK];
    oshape[0] = B;
    for (int d = 1; d < fi->rank; d++) {
        oshape[d] = 1;
    }
    nb_var *off = nb_mul(nb_iota(tr, NB_DTYPE_I64, fi->rank, oshape, 0),
                         nb_scalar_typed(tr, NB_DTYPE_I64, (double)n));
    nb_var *r = nb_take(flat, nb_add(fi, off), 0); /* [B, idx..., pre..., post...] */
    /* to [B, pre..., idx..., post...] */
    int q = idx->rank, perm[NB_MAX_RANK], k = 0;
    perm[k++] = 0;
    for (int d = 0; d < axis; d++) {
        perm[k++] = 1 + q + d;
    }
    for (int d = 0; d < q; d++) {
        perm[k++] = 1 + d;
    }
    for (int d = axis + 1; d < x->rank; d++) {
        perm[k++] = q + d;
    }
    return nb_transpose(r, perm);
}

static nb_var *nbi_vmap_take_along(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)tr;
    (void)B;
    nb_var *x = bin[0] != NULL ? bin[0] : nb_expand_dims(node->in[0], 0);
    nb_var *i = bin[1] != NULL ? bin[1] : nb_expand_dims(node->in[1], 0);
    if (bin[0] == NULL) {
        int64_t shape[NB_MAX_RANK];
        shape[0] = B;
        memcpy(shape + 1, node->in[0]->shape, (size_t)node->in[0]->rank * sizeof *shape);
        x = nb_broadcast_to(x, node->in[0]->rank + 1, shape);
    }
    return nb_take_along_axis(x, i, node->at.axis + 1);
}

static nb_var *nbi_vmap_one_hot(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)B;
    return nbi_emit(tr, NBI_OP_ONE_HOT, 1, &bin[0], &node->at);
}

static bool nbi_starts_batched(const nb_var *node, nb_var *const *bin, int32_t first) {
    for (int32_t j = first; j < node->n_in; j++) {
        if (bin[j] != NULL) {
            return true;
        }
    }
    return false;
}

static nb_var **nbi_bstarts(nb_trace *tr, const nb_var *node, int32_t first) {
    int32_t n = node->n_in - first;
    nb_var **s = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof *s);
    if (s == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
        return NULL;
    }
    s[0] = nb_scalar_typed(tr, n > 0 ? node->in[first]->dtype : NB_DTYPE_I32, 0.0);
    memcpy(s + 1, node->in + first, (size_t)n * sizeof *s);
    return s;
}

/* Batched starts: the per-lane form, each start a [B] vector (an unbatched one broadcast:
 * B integers). A per-lane node batched again runs once per outer lane. */
static nb_var **nbi_lane_starts(nb_trace *tr, const nb_var *node, nb_var *const *bin, int32_t first,
                                int64_t B) {
    int32_t n = node->n_in - first;
    nb_var **s = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof *s);
    if (s == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
        return NULL;
    }
    for (int32_t j = 0; j < n; j++) {
        s[j] = bin[first + j] != NULL ? bin[first + j]
                                      : nb_broadcast_to(node->in[first + j], 1, (int64_t[]){B});
    }
    return s;
}

static nb_var *nbi_vmap_dyn_slice(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    if (nbi_dyn_lanes(node)) {
        return nbi_vmap_unroll(tr, node, bin, B);
    }
    int64_t sizes[NB_MAX_RANK];
    if (nbi_starts_batched(node, bin, 1)) {
        nb_var **ls = nbi_lane_starts(tr, node, bin, 1, B);
        if (ls == NULL || !nbi_bshape(tr, node, B, sizes)) {
            return tr->poison;
        }
        nb_var *x = bin[0] != NULL ? bin[0] : nb_expand_dims(node->in[0], 0);
        return nbi_dyn_slice_lanes(x, ls, node->shape, B);
    }
    nb_var **s = nbi_bstarts(tr, node, 1);
    if (s == NULL || !nbi_bshape(tr, node, B, sizes)) {
        return tr->poison;
    }
    return nb_dynamic_slice(bin[0], s, sizes);
}

static nb_var *nbi_vmap_dyn_update(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    if (nbi_dyn_lanes(node)) {
        return nbi_vmap_unroll(tr, node, bin, B);
    }
    if (nbi_starts_batched(node, bin, 2)) {
        int64_t shape[NB_MAX_RANK];
        nb_var **ls = nbi_lane_starts(tr, node, bin, 2, B);
        if (ls == NULL || !nbi_bshape(tr, node, B, shape)) {
            return tr->poison;
        }
        nb_var *x = bin[0] != NULL ? bin[0] : nbi_vmap_bcast(node->in[0], B);
        nb_var *u = bin[1] != NULL ? bin[1] : nb_expand_dims(node->in[1], 0);
        return nbi_dyn_update_lanes(x, u, ls);
    }
    nb_var **s = nbi_bstarts(tr, node, 2);
    if (s == NULL) {
        return tr->poison;
    }
    nb_var *x = bin[0] != NULL ? bin[0] : nbi_vmap_bcast(node->in[0], B);
    nb_var *u = bin[1] != NULL ? bin[1] : nbi_vmap_bcast(node->in[1], B);
    return nb_dynamic_update_slice(x, u, s);
}

/* ---- registry entries --------------------------------------------------------------- */

const nbi_op_info nbi_opinfo_reshape = {.name = "reshape",
                                        .n_in = 1,
                                        .infer = nbi_infer_reshape,
                                        .kernel = nbi_k_reshape,
                                        .vjp = nbi_vjp_reshape,
                                        .jvp = nbi_jvp_reshape,
                                        .vmap = nbi_vmap_reshape};
const nbi_op_info nbi_opinfo_broadcast_to = {.name = "broadcast_to",
                                             .n_in = 1,
                                             .infer = nbi_infer_broadcast,
                                             .kernel = nbi_k_broadcast,
                                             .vjp = nbi_vjp_broadcast,
                                             .jvp = nbi_jvp_broadcast,
                                             .vmap = nbi_vmap_broadcast};
const nbi_op_info nbi_opinfo_transpose = {.name = "transpose",
                                          .n_in = 1,
                                          .infer = nbi_infer_transpose,
                                          .kernel = nbi_k_transpose,
                                          .vjp = nbi_vjp_transpose,
                                          .jvp = nbi_jvp_transpose,
                                          .vmap = nbi_vmap_transpose};
const nbi_op_info nbi_opinfo_slice = {.name = "slice",
                                      .n_in = 1,
                                      .infer = nbi_infer_slice,
                                      .kernel = nbi_k_slice,
                                      .vjp = nbi_vjp_slice,
                                      .jvp = nbi_jvp_slice,
                                      .vmap = nbi_vmap_slice};
const nbi_op_info nbi_opinfo_concatenate = {.name = "concatenate",
                                            .n_in = -1,
                                            .infer = nbi_infer_concat,
                                            .kernel = nbi_k_concat,
                                            .vjp = nbi_vjp_concat,
                                            .jvp = nbi_jvp_concat,
                                            .vmap = nbi_vmap_concat};
const nbi_op_info nbi_opinfo_pad = {.name = "pad",
                                    .n_in = 1,
                                    .infer = nbi_infer_pad,
                                    .kernel = nbi_k_pad,
                                    .vjp = nbi_vjp_pad,
                                    .jvp = nbi_jvp_pad,
                                    .vmap = nbi_vmap_pad};
const nbi_op_info nbi_opinfo_take = {.name = "take",
                                     .n_in = 2,
                                     .infer = nbi_infer_take,
                                     .kernel = nbi_k_take,
                                     .nondiff = 1u << 1,
                                     .vjp = nbi_vjp_take,
                                     .jvp = nbi_jvp_take,
                                     .vmap = nbi_vmap_take};
const nbi_op_info nbi_opinfo_take_along_axis = {.name = "take_along_axis",
                                                .n_in = 2,
                                                .infer = nbi_infer_take_along,
                                                .kernel = nbi_k_take_along,
                                                .nondiff = 1u << 1,
                                                .vjp = nbi_vjp_take_along,
                                                .jvp = nbi_jvp_take_along,
                                                .vmap = nbi_vmap_take_along};
/* Integer input: no gradient. */
const nbi_op_info nbi_opinfo_one_hot = {.name = "one_hot",
                                        .n_in = 1,
                                        .infer = nbi_infer_one_hot,
                                        .kernel = nbi_k_one_hot,
                                        .nondiff = 1,
                                        .vmap = nbi_vmap_one_hot};
/* Every start index (inputs 1.. / 2..) has no gradient. */
const nbi_op_info nbi_opinfo_dynamic_slice = {.name = "dynamic_slice",
                                              .n_in = -1,
                                              .infer = nbi_infer_dyn_slice,
                                              .kernel = nbi_k_dyn_slice,
                                              .nondiff = ~1u,
                                              .vjp = nbi_vjp_dyn_slice,
                                              .jvp = nbi_jvp_dyn_slice,
                                              .vmap = nbi_vmap_dyn_slice};
const nbi_op_info nbi_opinfo_dynamic_update_slice = {.name = "dynamic_update_slice",
                                                     .n_in = -1,
                                                     .infer = nbi_infer_dyn_update,
                                                     .kernel = nbi_k_dyn_update,
                                                     .nondiff = ~3u,
                                                     .vjp = nbi_vjp_dyn_update,
                                                     .jvp = nbi_jvp_dyn_update,
                                                     .vmap = nbi_vmap_dyn_update};
