/*
 * op_conv.c -- the two data-movement ops of a convolution: im2col and its transpose
 * col2im. nn's convolutions (src/nn/conv.c) are one im2col, one matrix product (BLIS) and
 * a reshape; their gradients are the transposed product and one col2im. And max pooling's
 * pair, pool_take and pool_scatter (at the end of the file), which find each window's
 * first maximum in place rather than through im2col's columns.
 *
 *   im2col(x [C, N, S1..Sn]) -> cols [C, K, N, So1..Son]
 *     cols[c, t, n, o] = x[c, n, o * s + t_idx * d - lo]   (v where that is outside x)
 *   col2im(cols [C, K, N, So..]) -> x [C, N, S..]: the sum, into each input element, of
 *     every column entry im2col copies from it (im2col's transpose).
 * n = 1..3 spatial dims; K = prod(kernel), tap t the row-major multi-index t_idx over the
 * kernel; s the stride, d the dilation, lo/hi >= 0 the zeros added before/after each
 * spatial dim, of value v (0 for a convolution, -inf for max pooling; the gradients do not
 * depend on it) (So = (S + lo + hi - d (k - 1) - 1) / s + 1, at least 1). Channels first,
 * so that cols reshaped to [C*K, N*prod(So)] is the right operand of the product with the
 * weight reshaped to [O, C*K].
 *
 * Why ops and not a composition of slices: the composition (a pad, K strided slices and a
 * stack) materialises the padded input and K slices, and its gradient K padded copies of
 * the input summed; these kernels make the columns in one pass reading x once per tap with
 * the padding as a bounds test, and col2im adds each column row into its place in one pass.
 *
 * Layouts: channels first as above (axis = 0), or batch first (axis = 1): x [N, C, S..] and
 * cols [N, C, K, So..], which nn's convolutions use -- each example's columns a [C*K, L]
 * matrix, multiplied by the weight one example at a time into [N, O, L] (NCHW, no
 * transposes; BLIS ran these per-example products at 54-80 GFLOPS where the one product
 * of all the columns ran at 34-41 on this machine: each example's block stays in cache).
 * Attributes: ivalue = n; axis = the layout; value = v (im2col); a[0..n) kernel, a[3..3+n) stride;
 * b[0..n) lo, b[3..3+n) hi; c[0..n) dilation, c[3..3+n) the input's spatial sizes S (col2im's
 * output). Kernels: f32 and f64. Work is split over the C*K column rows (im2col) or the C channels
 * (col2im: each channel's sums stay in one worker, added in the same order at any thread count), so
 * results are bit-identical for any number of threads.
 */
#include "ad/ir.h"

#include <math.h>
#include <string.h>

#define NBI_CONV_ND 3

static bool nbi_conv_is_float(nb_dtype d) {
    return d == NB_DTYPE_F32 || d == NB_DTYPE_F64;
}

/* Shared shape check of both ops: fills so[] (outputs per spatial dim) and K. */
static nb_status nbi_conv_geom(nb_trace *tr, const char *name, const nbi_attrs *at,
                               const int64_t *sp, int64_t *so, int64_t *k, const nb_var *x) {
    char sx[NBI_SIG_CAP];
    int nd = (int)at->ivalue;
    *k = 1;
    for (int d = 0; d < nd; d++) {
        int64_t ks = at->a[d], st = at->a[3 + d], lo = at->b[d], hi = at->b[3 + d], dl = at->c[d];
        if (ks < 1 || st < 1 || dl < 1 || lo < 0 || hi < 0 || ks > ((int64_t)1 << 31) ||
            st > ((int64_t)1 << 31) || dl > ((int64_t)1 << 31) || lo > ((int64_t)1 << 31) ||
            hi > ((int64_t)1 << 31)) {
            return nbi_trace_err(tr, NB_ERR_INVALID,
                                 "%s: spatial dim %d has kernel %lld, stride %lld, dilation "
                                 "%lld, padding (%lld, %lld); each >= 1 (padding >= 0) and at "
                                 "most 2^31",
                                 name, d, (long long)ks, (long long)st, (long long)dl,
                                 (long long)lo, (long long)hi);
        }
        int64_t ek = dl * (ks - 1) + 1, padded = sp[d] + lo + hi;
        if (padded < ek) {
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "%s: %s is %lld along spatial dim %d after padding, smaller "
                                 "than the dilated kernel %lld",
                                 name, nbi_var_sig(sx, sizeof sx, x), (long long)padded, d,
                                 (long long)ek);
        }
        so[d] = (padded - ek) / st + 1;
        *k *= ks;
        if (*k > ((int64_t)1 << 31)) {
            return nbi_trace_err(tr, NB_ERR_INVALID, "%s: more than 2^31 kernel taps", name);
        }
    }
    return NB_OK;
}

static nb_status nbi_infer_im2col(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    char sx[NBI_SIG_CAP];
    int nd = (int)p->at.ivalue;
    bool bf = p->at.axis == 1; /* batch first: x [N, C, S...], cols [N, C, K, So...] */
    if (nd < 1 || nd > NBI_CONV_ND || x->rank != nd + 2 || !nbi_conv_is_float(x->dtype)) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "im2col: x is %s; it must be f32 or f64 %s with %d spatial dims "
                             "(1 to 3)",
                             nbi_var_sig(sx, sizeof sx, x), bf ? "[N, C, S...]" : "[C, N, S...]",
                             nd);
    }
    int64_t so[NBI_CONV_ND], k = 0;
    nb_status st = nbi_conv_geom(tr, "im2col", &p->at, x->shape + 2, so, &k, x);
    if (st != NB_OK) {
        return st;
    }
    p->dtype = x->dtype;
    p->rank = (int8_t)(nd + 3);
    memset(p->shape, 0, sizeof p->shape);
    p->shape[0] = x->shape[0];
    p->shape[1] = bf ? x->shape[1] : k;
    p->shape[2] = bf ? k : x->shape[1];
    int64_t n = p->shape[0];
    bool ovf = __builtin_mul_overflow(n, k, &n) || __builtin_mul_overflow(n, x->shape[1], &n);
    for (int d = 0; d < nd; d++) {
        p->shape[3 + d] = so[d];
        ovf = ovf || __builtin_mul_overflow(n, so[d], &n);
    }
    if (ovf || n > ((int64_t)1 << 48)) {
        return nbi_trace_err(tr, NB_ERR_OVERFLOW, "im2col: the columns of %s are too large",
                             nbi_var_sig(sx, sizeof sx, x));
    }
    p->flags |= x->flags & NBI_NODE_WEAK;
    return NB_OK;
}

static nb_status nbi_infer_col2im(nb_trace *tr, nb_var *p) {
    const nb_var *c = p->in[0];
    char sc[NBI_SIG_CAP];
    int nd = (int)p->at.ivalue;
    bool bf = p->at.axis == 1; /* batch first: cols [N, C, K, So...], x [N, C, S...] */
    if (nd < 1 || nd > NBI_CONV_ND || c->rank != nd + 3 || !nbi_conv_is_float(c->dtype)) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "col2im: cols is %s; it must be f32 or f64 %s with %d spatial dims "
                             "(1 to 3)",
                             nbi_var_sig(sc, sizeof sc, c),
                             bf ? "[N, C, K, So...]" : "[C, K, N, So...]", nd);
    }
    int64_t so[NBI_CONV_ND], k = 0;
    nb_status st = nbi_conv_geom(tr, "col2im", &p->at, p->at.c + 3, so, &k, c);
    if (st != NB_OK) {
        return st;
    }
    bool ok = c->shape[bf ? 2 : 1] == k;
    for (int d = 0; d < nd; d++) {
        ok = ok && c->shape[3 + d] == so[d] && p->at.c[3 + d] >= 0;
    }
    if (!ok) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "col2im: cols is %s; the kernel (%lld taps) and the input's "
                             "spatial sizes make other columns",
                             nbi_var_sig(sc, sizeof sc, c), (long long)k);
    }
    p->dtype = c->dtype;
    p->rank = (int8_t)(nd + 2);
    memset(p->shape, 0, sizeof p->shape);
    p->shape[0] = c->shape[0];
    p->shape[1] = c->shape[bf ? 1 : 2];
    for (int d = 0; d < nd; d++) {
        p->shape[2 + d] = p->at.c[3 + d];
    }
    p->flags |= c->flags & NBI_NODE_WEAK;
    return NB_OK;
}

/* ---- kernels ------------------------------------------------------------------------ */

/* The geometry a kernel needs, in the 3-d form (missing leading spatial dims have size 1,
 * kernel 1, stride 1, no padding). */
typedef struct nbi_cgeo {
    int64_t C, N, K;
    bool bf; /* batch first */
    int64_t S[3], So[3], k[3], s[3], d[3], lo[3];
    size_t es;
    const nbi_kargs *ka;
} nbi_cgeo;

/* Offsets (elements) of x's block (c, n) and of the columns' row (c, t, n), in either
 * layout. */
static inline int64_t nbi_xoff(const nbi_cgeo *g, int64_t c, int64_t n, int64_t sx) {
    return (g->bf ? n * g->C + c : c * g->N + n) * sx;
}
static inline int64_t nbi_coff(const nbi_cgeo *g, int64_t c, int64_t t, int64_t n, int64_t l) {
    return (g->bf ? (n * g->C + c) * g->K + t : (c * g->K + t) * g->N + n) * l;
}

static void nbi_cgeo_make(const nb_var *node, const int64_t *sp, const int64_t *so, int64_t chans,
                          int64_t n, nbi_cgeo *g) {
    int nd = (int)node->at.ivalue;
    for (int i = 0; i < 3; i++) {
        g->S[i] = g->So[i] = g->k[i] = g->s[i] = g->d[i] = 1;
        g->lo[i] = 0;
    }
    for (int d = 0; d < nd; d++) {
        int i = 3 - nd + d;
        g->S[i] = sp[d];
        g->So[i] = so[d];
        g->k[i] = node->at.a[d];
        g->s[i] = node->at.a[3 + d];
        g->lo[i] = node->at.b[d];
        g->d[i] = node->at.c[d];
    }
    g->C = chans;
    g->N = n;
    g->bf = node->at.axis == 1;
    g->K = g->k[0] * g->k[1] * g->k[2];
    g->es = nb_dtype_size(node->dtype);
}

/* A short row's bytes (a multiple of 4): fixed-size copies the compiler writes out -- a
 * call to memcpy per row of an 8-wide image cost more than the row. */
static inline void nbi_row_copy(void *dst, const void *src, size_t bytes) {
    unsigned char *d = dst;
    const unsigned char *q = src;
    if (bytes > 256) {
        memcpy(d, q, bytes);
        return;
    }
    for (; bytes >= 32; bytes -= 32, d += 32, q += 32) {
        memcpy(d, q, 32);
    }
    for (; bytes >= 4; bytes -= 4, d += 4, q += 4) {
        memcpy(d, q, 4);
    }
}

/* The output positions o in [0, so) whose input index o s + off lies in [0, len):
 * [*first, *last). */
static void nbi_valid(int64_t so, int64_t s, int64_t off, int64_t len, int64_t *first,
                      int64_t *last) {
    int64_t f = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t l = len - off <= 0 ? 0 : (len - off - 1) / s + 1;
    *first = f < so ? f : so;
    *last = l < so ? l : so;
    if (*last < *first) {
        *last = *first;
    }
}

#define NBI_CONV_KERNELS(T, SUF)                                                                   \
    /* One tap's column rows for one example, when a row of the output is as long as a row of      \
     * the input and both strides are 1 (SAME padding, stride 1: most convolutions): within        \
     * a plane, output position p reads input position p + off1 * W + off2, so the valid rows      \
     * are one contiguous copy (trimmed so that it reads only inside the input plane; what         \
     * the trim leaves out is padding), and then the padding columns and rows are written.         \
     * The same values as the row-by-row loop below. */                                            \
    static void nbi_im2col_plane_##SUF(const nbi_cgeo *g, T *o, const T *xn, T pv, int64_t off0,   \
                                       int64_t off1, int64_t off2, int64_t a0, int64_t b0,         \
                                       int64_t a1, int64_t b1, int64_t a2, int64_t b2) {           \
        int64_t W = g->S[2], R = g->So[1] * W, Rx = g->S[1] * W, shift = off1 * W + off2;          \
        for (int64_t i0 = 0; i0 < g->So[0]; i0++) {                                                \
            T *op = o + i0 * R;                                                                    \
            if (i0 < a0 || i0 >= b0 || b1 <= a1) {                                                 \
                for (int64_t p = 0; p < R; p++) {                                                  \
                    op[p] = pv;                                                                    \
                }                                                                                  \
                continue;                                                                          \
            }                                                                                      \
            const T *xp = xn + (i0 * g->s[0] + off0) * Rx;                                         \
            int64_t lo = a1 * W, hi = b1 * W;                                                      \
            lo = lo + shift < 0 ? -shift : lo;                                                     \
            hi = hi + shift > Rx ? Rx - shift : hi;                                                \
            if (hi > lo) {                                                                         \
                memcpy(op + lo, xp + lo + shift, (size_t)(hi - lo) * sizeof(T));                   \
            }                                                                                      \
            for (int64_t p = 0; p < a1 * W; p++) {                                                 \
                op[p] = pv;                                                                        \
            }                                                                                      \
            for (int64_t p = b1 * W; p < R; p++) {                                                 \
                op[p] = pv;                                                                        \
            }                                                                                      \
            for (int64_t i1 = a1; i1 < b1; i1++) {                                                 \
                T *row = op + i1 * W;                                                              \
                for (int64_t i2 = 0; i2 < a2; i2++) {                                              \
                    row[i2] = pv;                                                                  \
                }                                                                                  \
                for (int64_t i2 = b2; i2 < W; i2++) {                                              \
                    row[i2] = pv;                                                                  \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* rows [first, first + count) of the [C*K] column rows */                                     \
    static void nbi_im2col_rows_##SUF(void *ud, int64_t first, int64_t count, int worker) {        \
        (void)worker;                                                                              \
        const nbi_cgeo *g = ud;                                                                    \
        const T *x = g->ka->in[0];                                                                 \
        T *out = g->ka->out;                                                                       \
        const T pv = (T)g->ka->node->at.value; /* the padding's value */                           \
        int64_t L = g->So[0] * g->So[1] * g->So[2], Sx = g->S[0] * g->S[1] * g->S[2];              \
        for (int64_t r = first; r < first + count; r++) {                                          \
            int64_t c = r / g->K, t = r % g->K;                                                    \
            int64_t t2 = t % g->k[2], t1 = (t / g->k[2]) % g->k[1], t0 = t / (g->k[2] * g->k[1]);  \
            int64_t off0 = t0 * g->d[0] - g->lo[0], off1 = t1 * g->d[1] - g->lo[1],                \
                    off2 = t2 * g->d[2] - g->lo[2];                                                \
            int64_t a0, b0, a1, b1, a2, b2;                                                        \
            nbi_valid(g->So[0], g->s[0], off0, g->S[0], &a0, &b0);                                 \
            nbi_valid(g->So[1], g->s[1], off1, g->S[1], &a1, &b1);                                 \
            nbi_valid(g->So[2], g->s[2], off2, g->S[2], &a2, &b2);                                 \
            /* stride 1 in the last two dims and rows as long as the input's: each plane a         \
             * shifted copy (nbi_im2col_plane) */                                                  \
            bool plane = g->s[1] == 1 && g->s[2] == 1 && g->So[2] == g->S[2];                      \
            for (int64_t n = 0; n < g->N; n++) {                                                   \
                T *o = out + nbi_coff(g, c, t, n, L);                                              \
                const T *xn = x + nbi_xoff(g, c, n, Sx);                                           \
                if (plane) {                                                                       \
                    nbi_im2col_plane_##SUF(g, o, xn, pv, off0, off1, off2, a0, b0, a1, b1, a2,     \
                                           b2);                                                    \
                    continue;                                                                      \
                }                                                                                  \
                for (int64_t i0 = 0; i0 < g->So[0]; i0++) {                                        \
                    for (int64_t i1 = 0; i1 < g->So[1]; i1++) {                                    \
                        T *row = o + (i0 * g->So[1] + i1) * g->So[2];                              \
                        if (i0 < a0 || i0 >= b0 || i1 < a1 || i1 >= b1) {                          \
                            for (int64_t i2 = 0; i2 < g->So[2]; i2++) {                            \
                                row[i2] = pv;                                                      \
                            }                                                                      \
                            continue;                                                              \
                        }                                                                          \
                        const T *xr =                                                              \
                            xn +                                                                   \
                            ((i0 * g->s[0] + off0) * g->S[1] + (i1 * g->s[1] + off1)) * g->S[2];   \
                        for (int64_t i2 = 0; i2 < a2; i2++) {                                      \
                            row[i2] = pv;                                                          \
                        }                                                                          \
                        if (g->s[2] == 1) {                                                        \
                            nbi_row_copy(row + a2, xr + a2 + off2, (size_t)(b2 - a2) * sizeof(T)); \
                        } else {                                                                   \
                            for (int64_t i2 = a2; i2 < b2; i2++) {                                 \
                                row[i2] = xr[i2 * g->s[2] + off2];                                 \
                            }                                                                      \
                        }                                                                          \
                        for (int64_t i2 = b2; i2 < g->So[2]; i2++) {                               \
                            row[i2] = pv;                                                          \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* channels [first, first + count): each output element's sum over taps in order */            \
    static void nbi_col2im_chans_##SUF(void *ud, int64_t first, int64_t count, int worker) {       \
        (void)worker;                                                                              \
        const nbi_cgeo *g = ud;                                                                    \
        const T *cols = g->ka->in[0];                                                              \
        T *out = g->ka->out;                                                                       \
        int64_t L = g->So[0] * g->So[1] * g->So[2], Sx = g->S[0] * g->S[1] * g->S[2];              \
        for (int64_t c = first; c < first + count; c++) {                                          \
            for (int64_t n = 0; n < g->N; n++) {                                                   \
                memset(out + nbi_xoff(g, c, n, Sx), 0, (size_t)Sx * sizeof(T));                    \
            }                                                                                      \
            for (int64_t t = 0; t < g->K; t++) {                                                   \
                int64_t t2 = t % g->k[2], t1 = (t / g->k[2]) % g->k[1],                            \
                        t0 = t / (g->k[2] * g->k[1]);                                              \
                int64_t off0 = t0 * g->d[0] - g->lo[0], off1 = t1 * g->d[1] - g->lo[1],            \
                        off2 = t2 * g->d[2] - g->lo[2];                                            \
                int64_t a0, b0, a1, b1, a2, b2;                                                    \
                nbi_valid(g->So[0], g->s[0], off0, g->S[0], &a0, &b0);                             \
                nbi_valid(g->So[1], g->s[1], off1, g->S[1], &a1, &b1);                             \
                nbi_valid(g->So[2], g->s[2], off2, g->S[2], &a2, &b2);                             \
                for (int64_t n = 0; n < g->N; n++) {                                               \
                    const T *src = cols + nbi_coff(g, c, t, n, L);                                 \
                    T *xn = out + nbi_xoff(g, c, n, Sx);                                           \
                    for (int64_t i0 = a0; i0 < b0; i0++) {                                         \
                        for (int64_t i1 = a1; i1 < b1; i1++) {                                     \
                            const T *row = src + (i0 * g->So[1] + i1) * g->So[2];                  \
                            T *xr =                                                                \
                                xn + ((i0 * g->s[0] + off0) * g->S[1] + (i1 * g->s[1] + off1)) *   \
                                         g->S[2];                                                  \
                            for (int64_t i2 = a2; i2 < b2; i2++) {                                 \
                                xr[i2 * g->s[2] + off2] += row[i2];                                \
                            }                                                                      \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

NBI_CONV_KERNELS(float, f32)
NBI_CONV_KERNELS(double, f64)

/* Rows per chunk: about 32K elements of work each, fixed by the shapes alone. */
static int64_t nbi_conv_chunk(int64_t per_item) {
    int64_t c = per_item > 0 ? ((int64_t)1 << 15) / per_item : 1;
    return c < 1 ? 1 : c;
}

static void nbi_k_im2col(const nbi_kargs *k) {
    const nb_var *node = k->node, *x = node->in[0];
    if (node->size == 0) {
        return;
    }
    nbi_cgeo g;
    bool bf = node->at.axis == 1;
    nbi_cgeo_make(node, x->shape + 2, node->shape + 3, x->shape[bf], x->shape[!bf], &g);
    g.ka = k;
    int64_t per = g.N * g.So[0] * g.So[1] * g.So[2];
    nbi_par_range(k->pool, g.C * g.K, nbi_conv_chunk(per),
                  node->dtype == NB_DTYPE_F32 ? nbi_im2col_rows_f32 : nbi_im2col_rows_f64, &g);
}

static void nbi_k_col2im(const nbi_kargs *k) {
    const nb_var *node = k->node, *c = node->in[0];
    if (node->size == 0) {
        return;
    }
    nbi_cgeo g;
    bool bf = node->at.axis == 1;
    nbi_cgeo_make(node, node->shape + 2, c->shape + 3, node->shape[bf], node->shape[!bf], &g);
    g.ka = k;
    int64_t per = g.K * g.N * g.So[0] * g.So[1] * g.So[2];
    nbi_par_range(k->pool, g.C, nbi_conv_chunk(per),
                  node->dtype == NB_DTYPE_F32 ? nbi_col2im_chans_f32 : nbi_col2im_chans_f64, &g);
}

/* ---- builders ----------------------------------------------------------------------- */

static void nbi_conv_attrs(nbi_attrs *at, int nd, const int64_t *kernel, const int64_t *stride,
                           const int64_t *dil, const int64_t *lo, const int64_t *hi) {
    memset(at, 0, sizeof *at);
    at->axis = nd >= NBI_CONV_BATCH_FIRST; /* the batch-first layout */
    nd %= NBI_CONV_BATCH_FIRST;
    at->ivalue = nd;
    for (int d = 0; d < nd && d < NBI_CONV_ND; d++) {
        at->a[d] = kernel[d];
        at->a[3 + d] = stride[d];
        at->b[d] = lo[d];
        at->b[3 + d] = hi[d];
        at->c[d] = dil[d];
    }
}

nb_var *nbi_im2col(nb_var *x, int nd, const int64_t *kernel, const int64_t *stride,
                   const int64_t *dil, const int64_t *lo, const int64_t *hi, double pad_value) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &x, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    nbi_conv_attrs(&at, nd, kernel, stride, dil, lo, hi);
    at.value = pad_value;
    return nbi_emit(tr, NBI_OP_IM2COL, 1, &x, &at);
}

nb_var *nbi_col2im(nb_var *cols, int nd, const int64_t *kernel, const int64_t *stride,
                   const int64_t *dil, const int64_t *lo, const int64_t *hi,
                   const int64_t *spatial) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &cols, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    nbi_conv_attrs(&at, nd, kernel, stride, dil, lo, hi);
    for (int d = 0; d < at.ivalue; d++) {
        at.c[3 + d] = spatial[d];
    }
    return nbi_emit(tr, NBI_OP_COL2IM, 1, &cols, &at);
}

/* The other op of the pair on v, with node's attributes. */
static nb_var *nbi_conv_other(const nb_var *node, nb_var *v, const int64_t *spatial) {
    const nbi_attrs *a = &node->at;
    int nd = (int)a->ivalue + (a->axis == 1 ? NBI_CONV_BATCH_FIRST : 0);
    if (node->op == NBI_OP_IM2COL) {
        return nbi_col2im(v, nd, a->a, a->a + 3, a->c, a->b, a->b + 3, spatial);
    }
    return nbi_im2col(v, nd, a->a, a->a + 3, a->c, a->b, a->b + 3, 0.0);
}

/* The same op on v; pad_value for im2col (its own for batching, 0 for a tangent). */
static nb_var *nbi_conv_same(const nb_var *node, nb_var *v, double pad_value) {
    const nbi_attrs *a = &node->at;
    int nd = (int)a->ivalue + (a->axis == 1 ? NBI_CONV_BATCH_FIRST : 0);
    if (node->op == NBI_OP_IM2COL) {
        return nbi_im2col(v, nd, a->a, a->a + 3, a->c, a->b, a->b + 3, pad_value);
    }
    return nbi_col2im(v, nd, a->a, a->a + 3, a->c, a->b, a->b + 3, a->c + 3);
}

/* ---- derivatives: both ops are linear, each the other's transpose --------------------- */

static void nbi_vjp_conv(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    in_ct[0] = nbi_conv_other(node, g, node->in[0]->shape + 2);
}

static nb_var *nbi_jvp_conv(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    return t[0] != NULL ? nbi_conv_same(node, t[0], 0.0) : NULL; /* the padding is constant */
}

/* Batching: the lanes join the N axis. im2col: [B, C, N, S..] -> [C, B*N, S..] -> im2col
 * -> [C, K, B*N, So..] -> [B, C, K, N, So..]; col2im likewise with the K axis. */
static nb_var *nbi_vmap_conv(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)tr;
    nb_var *x = bin[0];
    int r = nb_var_rank(x);   /* the batched input's rank */
    if (node->at.axis == 1) { /* batch first: the lanes join N, the leading axis */
        int64_t shape[NB_MAX_RANK];
        shape[0] = B * nb_var_dim(x, 1);
        memcpy(shape + 1, nb_var_shape(x) + 2, (size_t)(r - 2) * sizeof(int64_t));
        nb_var *y = nbi_conv_same(node, nb_reshape(x, r - 1, shape), node->at.value);
        if (nb_var_is_poison(y)) {
            return y;
        }
        int64_t ys[NB_MAX_RANK];
        ys[0] = B;
        ys[1] = nb_var_dim(x, 1);
        memcpy(ys + 2, nb_var_shape(y) + 1, (size_t)(nb_var_rank(y) - 1) * sizeof(int64_t));
        return nb_reshape(y, nb_var_rank(y) + 1, ys);
    }
    bool im = node->op == NBI_OP_IM2COL;
    int nax = im ? 2 : 3; /* N's axis in the batched input */
    int perm[NB_MAX_RANK], j = 0;
    for (int i = 1; i < r; i++) {
        if (i == nax) {
            perm[j++] = 0;
        }
        perm[j++] = i;
    }
    nb_var *t = nb_transpose(x, perm); /* B just before N */
    int64_t shape[NB_MAX_RANK];
    int rs = 0;
    for (int i = 0; i < r; i++) {
        if (i == nax - 1) {
            shape[rs++] = B * nb_var_dim(t, i + 1);
            i++;
        } else {
            shape[rs++] = nb_var_dim(t, i);
        }
    }
    nb_var *y = nbi_conv_same(node, nb_reshape(t, rs, shape), node->at.value);
    if (nb_var_is_poison(y)) {
        return y;
    }
    int yr = nb_var_rank(y), ynax = im ? 2 : 1; /* N's axis in the unbatched output */
    int64_t ys[NB_MAX_RANK + 1];
    for (int i = 0, o = 0; i < yr; i++) {
        if (i == ynax) {
            ys[o++] = B;
            ys[o++] = nb_var_dim(x, nax); /* N */
        } else {
            ys[o++] = nb_var_dim(y, i);
        }
    }
    y = nb_reshape(y, yr + 1, ys);
    int back[NB_MAX_RANK];
    back[0] = ynax;
    for (int i = 1, o = 0; i <= yr; i++, o++) {
        if (o == ynax) {
            o++;
        }
        back[i] = o;
    }
    return nb_transpose(y, back);
}

const nbi_op_info nbi_opinfo_im2col = {.name = "im2col",
                                       .n_in = 1,
                                       .infer = nbi_infer_im2col,
                                       .kernel = nbi_k_im2col,
                                       .vjp = nbi_vjp_conv,
                                       .jvp = nbi_jvp_conv,
                                       .vmap = nbi_vmap_conv};

const nbi_op_info nbi_opinfo_col2im = {.name = "col2im",
                                       .n_in = 1,
                                       .infer = nbi_infer_col2im,
                                       .kernel = nbi_k_col2im,
                                       .vjp = nbi_vjp_conv,
                                       .jvp = nbi_jvp_conv,
                                       .vmap = nbi_vmap_conv};

/* ---- max pooling's selection: pool_take and pool_scatter -----------------------------
 * Max pooling cut into columns (im2col, argmax, take_along_axis, and for the gradient a
 * masked sum and col2im) moves every window element through memory four times; these two
 * ops find each window's first maximum in place instead:
 *
 *   pool_take(x [N, C, S..], v [N, C, S..]) -> [N, C, So..]: for each window of x (the
 *     layout, kernel, stride, dilation and padding of a batch-first im2col), v's element
 *     at x's first maximum (a NaN counting as the maximum, padding as -inf), or `value`
 *     where that maximum is a padding position (only a window whose real elements are
 *     all -inf and a padding tap comes first, or a window of padding alone).
 *   pool_scatter(x [N, C, S..], g [N, C, So..]) -> [N, C, S..]: zeros, with each window's
 *     g added at x's first maximum (windows in row-major order; one at the padding drops).
 *
 * max_pool(x) is pool_take(x, x) with value -inf: the same values as the columns' argmax
 * and take. Both ops are linear in their second input and piecewise constant in x (whose
 * selection has no derivative), each the other's transpose: pool_take's VJP is
 * pool_scatter(x, g), pool_scatter's is pool_take(x, g) with value 0. For non-overlapping
 * windows each input receives at most one value, so the gradient is exactly the columns'
 * (a sum of one term); where windows overlap, the values an input receives are added in
 * window order instead of tap order (the same to rounding). Work is split over the N*C
 * planes by the shapes alone, so results are bit-identical for any number of threads. */

#define NBI_POOL_TAPS 32
#define NBI_POOL_DENSE_TAPS 64
typedef struct nbi_pgeo {
    nbi_cgeo g;
    int64_t planes, P, L; /* N*C planes of P input and L output elements */
    /* the windows along the last dim that last-dim tap t2 (< NBI_POOL_TAPS) finds inside
     * the input, [va, vb): worked out once per call (two divisions each) */
    int64_t va[NBI_POOL_TAPS], vb[NBI_POOL_TAPS];
    /* every window inside the input (no padding tap) and at most NBI_POOL_DENSE_TAPS taps:
     * tap t's offset from its window's first element (nbi_pool_argmax_dense) */
    bool dense;
    int64_t toff[NBI_POOL_DENSE_TAPS];
} nbi_pgeo;

static size_t nbi_pool_slice(const nbi_pgeo *pg);

/* planes of at most this many windows, with at most NBI_POOL_TAB_MAX taps in all, use a tap
 * table (nbi_pool_argmax_tab) -- but dense ones (nbi_pool_argmax_dense) need none */
#define NBI_POOL_TAB_MAX_L 1024
#define NBI_POOL_TAB_MAX 8192

static bool nbi_pool_use_table(const nbi_pgeo *pg) {
    return !pg->dense && pg->L <= NBI_POOL_TAB_MAX_L && pg->L * pg->g.K <= NBI_POOL_TAB_MAX;
}

/* the worker's slice of the scratch: its window row, then (nbi_pool_use_table) its table */
static int64_t *nbi_pool_scratch(const nbi_pgeo *pg, int worker) {
    return (int64_t *)((unsigned char *)pg->g.ka->scratch + (size_t)worker * nbi_pool_slice(pg));
}

/* The tap table after the window row w, filled; NULL when the plane is too large for one. */
static int64_t *nbi_pool_table(const nbi_pgeo *pg, int64_t *w) {
    if (!nbi_pool_use_table(pg)) {
        return NULL;
    }
    const nbi_cgeo *g = &pg->g;
    int64_t *tab = w + pg->L;
    int64_t o = 0;
    for (int64_t o0 = 0; o0 < g->So[0]; o0++) {
        for (int64_t o1 = 0; o1 < g->So[1]; o1++) {
            for (int64_t o2 = 0; o2 < g->So[2]; o2++, o++) {
                int64_t t = 0;
                for (int64_t t0 = 0; t0 < g->k[0]; t0++) {
                    int64_t p0 = o0 * g->s[0] + t0 * g->d[0] - g->lo[0];
                    for (int64_t t1 = 0; t1 < g->k[1]; t1++) {
                        int64_t p1 = o1 * g->s[1] + t1 * g->d[1] - g->lo[1];
                        for (int64_t t2 = 0; t2 < g->k[2]; t2++, t++) {
                            int64_t p2 = o2 * g->s[2] + t2 * g->d[2] - g->lo[2];
                            bool in = p0 >= 0 && p0 < g->S[0] && p1 >= 0 && p1 < g->S[1] &&
                                      p2 >= 0 && p2 < g->S[2];
                            tab[t * pg->L + o] = in ? (p0 * g->S[1] + p1) * g->S[2] + p2 : -1;
                        }
                    }
                }
            }
        }
    }
    return tab;
}

static nb_status nbi_infer_pool_common(nb_trace *tr, nb_var *p, const char *name, int64_t *so) {
    const nb_var *x = p->in[0], *v = p->in[1];
    char sx[NBI_SIG_CAP], sv[NBI_SIG_CAP];
    int nd = (int)p->at.ivalue;
    if (nd < 1 || nd > NBI_CONV_ND || x->rank != nd + 2 || !nbi_conv_is_float(x->dtype) ||
        v->dtype != x->dtype || v->rank != x->rank || v->shape[0] != x->shape[0] ||
        v->shape[1] != x->shape[1]) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "%s: x is %s and %s %s; x must be f32 or f64 [N, C, S...] with %d "
                             "spatial dims (1 to 3), and the other operand of its dtype with "
                             "the same N and C",
                             name, nbi_var_sig(sx, sizeof sx, x),
                             p->op == NBI_OP_POOL_TAKE ? "v" : "g", nbi_var_sig(sv, sizeof sv, v),
                             nd);
    }
    int64_t k = 0;
    return nbi_conv_geom(tr, name, &p->at, x->shape + 2, so, &k, x);
}

static nb_status nbi_infer_pool_take(nb_trace *tr, nb_var *p) {
    int64_t so[NBI_CONV_ND];
    nb_status st = nbi_infer_pool_common(tr, p, "pool_take", so);
    if (st != NB_OK) {
        return st;
    }
    const nb_var *x = p->in[0], *v = p->in[1];
    for (int d = 0; d < x->rank; d++) {
        if (v->shape[d] != x->shape[d]) {
            char sx[NBI_SIG_CAP], sv[NBI_SIG_CAP];
            return nbi_trace_err(tr, NB_ERR_SHAPE, "pool_take: v %s must have x's shape %s",
                                 nbi_var_sig(sv, sizeof sv, v), nbi_var_sig(sx, sizeof sx, x));
        }
    }
    p->dtype = x->dtype;
    p->rank = x->rank;
    memset(p->shape, 0, sizeof p->shape);
    p->shape[0] = x->shape[0];
    p->shape[1] = x->shape[1];
    for (int d = 0; d < (int)p->at.ivalue; d++) {
        p->shape[2 + d] = so[d];
    }
    p->flags |= (x->flags & v->flags) & NBI_NODE_WEAK;
    return NB_OK;
}

static nb_status nbi_infer_pool_scatter(nb_trace *tr, nb_var *p) {
    int64_t so[NBI_CONV_ND];
    nb_status st = nbi_infer_pool_common(tr, p, "pool_scatter", so);
    if (st != NB_OK) {
        return st;
    }
    const nb_var *x = p->in[0], *g = p->in[1];
    for (int d = 0; d < (int)p->at.ivalue; d++) {
        if (g->shape[2 + d] != so[d]) {
            char sx[NBI_SIG_CAP], sg[NBI_SIG_CAP];
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "pool_scatter: g %s must have the shape of x %s's windows "
                                 "(spatial dim %d: %lld windows)",
                                 nbi_var_sig(sg, sizeof sg, g), nbi_var_sig(sx, sizeof sx, x), d,
                                 (long long)so[d]);
        }
    }
    p->dtype = x->dtype;
    p->rank = x->rank;
    memcpy(p->shape, x->shape, sizeof p->shape);
    p->flags |= (x->flags & g->flags) & NBI_NODE_WEAK;
    return NB_OK;
}

/* Each window's first maximum (nbi_pool_argmax's, below) where every window lies inside
 * the plane (pg->dense, f32): 4 windows of a row at a time, taps outer, compared and
 * selected in 128-bit vectors -- no table, no bounds, no branch on the data. A row's last
 * windows (fewer than 4) go one by one. The tap table's gathers took 9 % of a digits CNN's
 * 2.5 ms train step (its 2x2 pools of 8x8 planes, forward and backward), this 6 %; one
 * window's chain at a time took 24 % (its selects became branches that random data
 * mispredicts). */
#if defined(__GNUC__)
typedef float nbi_pf4 __attribute__((vector_size(16)));
typedef int32_t nbi_pi4 __attribute__((vector_size(16)));
#define NBI_POOL_VEC 1
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define NBI_POOL_SHUF 1
#endif
#endif
#ifndef NBI_POOL_SHUF
#define NBI_POOL_SHUF 0
#endif
#else
#define NBI_POOL_VEC 0
#endif

#if NBI_POOL_VEC
/* p[0], p[s], p[2 s], p[3 s]; room: elements readable from p (for s = 2, the even elements
 * of 8 loaded together where there are 8) */
static inline nbi_pf4 nbi_pool_ld4(const float *p, int64_t s, int64_t room) {
    nbi_pf4 v;
    if (s == 1) {
        memcpy(&v, p, sizeof v);
#if NBI_POOL_SHUF
    } else if (s == 2 && room >= 8) {
        nbi_pf4 lo, hi;
        memcpy(&lo, p, sizeof lo);
        memcpy(&hi, p + 4, sizeof hi);
        v = __builtin_shufflevector(lo, hi, 0, 2, 4, 6);
#endif
    } else {
        v = (nbi_pf4){p[0], p[s], p[2 * s], p[3 * s]};
    }
    (void)room;
    return v;
}
#endif

static void nbi_pool_argmax_dense(const nbi_pgeo *pg, const void *xv, int64_t *restrict w) {
    const float *restrict xp = xv;
    const nbi_cgeo *g = &pg->g;
    const int64_t K = g->K, S1 = g->S[1], S2 = g->S[2], s2 = g->s[2], So2 = g->So[2];
    const int64_t *toff = pg->toff;
    int64_t o = 0;
    for (int64_t o0 = 0; o0 < g->So[0]; o0++) {
        for (int64_t o1 = 0; o1 < g->So[1]; o1++) {
            int64_t row = (o0 * g->s[0] * S1 + o1 * g->s[1]) * S2, o2 = 0;
#if NBI_POOL_VEC
            const nbi_pi4 lane = {0, 1, 2, 3};
            for (; o2 + 4 <= So2; o2 += 4, o += 4) {
                int64_t base = row + o2 * s2;
                nbi_pi4 at0 = (int32_t)base + lane * (int32_t)s2; /* offsets < 2^31 (dense) */
                nbi_pf4 b = nbi_pool_ld4(xp + base, s2, pg->P - base);
                nbi_pi4 bo = at0;
                for (int64_t t = 1; t < K; t++) {
                    nbi_pf4 v = nbi_pool_ld4(xp + base + toff[t], s2, pg->P - base - toff[t]);
                    /* v beats b: greater, or the first NaN */
                    nbi_pi4 m = (v > b) | ((v != v) & (b == b));
                    b = (nbi_pf4)(((nbi_pi4)v & m) | ((nbi_pi4)b & ~m));
                    bo = ((at0 + (int32_t)toff[t]) & m) | (bo & ~m);
                }
                for (int j = 0; j < 4; j++) {
                    w[o + j] = bo[j];
                }
            }
#endif
            for (; o2 < So2; o2++, o++) {
                int64_t base = row + o2 * s2, bo = base;
                for (int64_t t = 1; t < K; t++) {
                    int64_t at = base + toff[t];
                    float v = xp[at], bv = xp[bo];
                    bo = (v > bv) | ((v != v) & (bv == bv)) ? at : bo;
                }
                w[o] = bo;
            }
        }
    }
}

/* Each window's first maximum in the plane xp: the flat offset in the plane, -1 for a
 * padding position. The taps in row-major order, as im2col's rows; a NaN beats a number
 * (the first NaN wins), as the columns' argmax. A row of up to NBI_POOL_BLOCK windows at a
 * time, taps outer: the windows' comparisons are independent (a chain per window, taken
 * one tap at a time, ran at 2.5 ns a tap), and a tap's valid windows are a range
 * (nbi_valid), so the inner loop has no bounds tests. A padding tap holds -inf, which
 * beats nothing: only the first tap can leave a padding position as the maximum. */
#define NBI_POOL_BLOCK 64
#define NBI_POOL_KERNELS(T, SUF)                                                                   \
    static void nbi_pool_argmax_##SUF(const nbi_pgeo *pg, const T *restrict xp,                    \
                                      int64_t *restrict w) {                                       \
        const nbi_cgeo *g = &pg->g;                                                                \
        const int64_t So0 = g->So[0], So1 = g->So[1], So2 = g->So[2], k0 = g->k[0], k1 = g->k[1],  \
                      k2 = g->k[2], s2 = g->s[2], d2 = g->d[2], S1 = g->S[1], S2 = g->S[2];        \
        T best[NBI_POOL_BLOCK];                                                                    \
        int64_t bi[NBI_POOL_BLOCK];                                                                \
        for (int64_t o0 = 0; o0 < So0; o0++) {                                                     \
            for (int64_t o1 = 0; o1 < So1; o1++) {                                                 \
                int64_t *wr = w + (o0 * So1 + o1) * So2;                                           \
                for (int64_t ob = 0; ob < So2; ob += NBI_POOL_BLOCK) {                             \
                    int64_t n = So2 - ob < NBI_POOL_BLOCK ? So2 - ob : NBI_POOL_BLOCK;             \
                    for (int64_t j = 0; j < n; j++) {                                              \
                        best[j] = (T)-INFINITY;                                                    \
                        bi[j] = -1;                                                                \
                    }                                                                              \
                    bool first = true;                                                             \
                    for (int64_t t0 = 0; t0 < k0; t0++) {                                          \
                        int64_t p0 = o0 * g->s[0] + t0 * g->d[0] - g->lo[0];                       \
                        bool in0 = p0 >= 0 && p0 < g->S[0];                                        \
                        for (int64_t t1 = 0; t1 < k1; t1++) {                                      \
                            int64_t p1 = o1 * g->s[1] + t1 * g->d[1] - g->lo[1];                   \
                            bool in1 = in0 && p1 >= 0 && p1 < S1;                                  \
                            int64_t rowoff = in1 ? (p0 * S1 + p1) * S2 : 0;                        \
                            const T *xr = xp + rowoff; /* read only when in1 */                    \
                            for (int64_t t2 = 0; t2 < k2; t2++, first = false) {                   \
                                if (!in1) {                                                        \
                                    continue; /* padding: the -inf set above, or beats nothing */  \
                                }                                                                  \
                                int64_t off2 = t2 * d2 - g->lo[2], a2, b2;                         \
                                if (t2 < NBI_POOL_TAPS) {                                          \
                                    a2 = pg->va[t2];                                               \
                                    b2 = pg->vb[t2];                                               \
                                } else {                                                           \
                                    nbi_valid(So2, s2, off2, S2, &a2, &b2);                        \
                                }                                                                  \
                                a2 = a2 > ob ? a2 - ob : 0;                                        \
                                b2 = b2 - ob < n ? b2 - ob : n;                                    \
                                int64_t base = ob * s2 + off2;                                     \
                                if (first) {                                                       \
                                    for (int64_t j = a2; j < b2; j++) {                            \
                                        best[j] = xr[base + j * s2];                               \
                                        bi[j] = rowoff + base + j * s2;                            \
                                    }                                                              \
                                    continue;                                                      \
                                }                                                                  \
                                for (int64_t j = a2; j < b2; j++) {                                \
                                    T v = xr[base + j * s2];                                       \
                                    bool better =                                                  \
                                        (v > best[j]) | ((v != v) & (best[j] == best[j]));         \
                                    best[j] = better ? v : best[j];                                \
                                    bi[j] = better ? rowoff + base + j * s2 : bi[j];               \
                                }                                                                  \
                            }                                                                      \
                        }                                                                          \
                    }                                                                              \
                    for (int64_t j = 0; j < n; j++) {                                              \
                        wr[ob + j] = bi[j];                                                        \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* The same from a table of every window's taps (tab[t L + o]: the offset, -1 for              \
     * padding), taps outer over all the plane's windows: small planes (a digits CNN's 8x8)        \
     * have windows rows too short for the row loop above to pay its setup */                      \
    static void nbi_pool_argmax_tab_##SUF(const nbi_pgeo *pg, const T *restrict xp,                \
                                          const int64_t *restrict tab, int64_t *restrict w) {      \
        const int64_t L = pg->L, K = pg->g.K;                                                      \
        /* a tap's values gathered into a row (padding -inf, which beats nothing), then            \
         * compared with the best so far row against row: a loop the compiler vectorises */        \
        T best[NBI_POOL_TAB_MAX_L], val[NBI_POOL_TAB_MAX_L];                                       \
        int32_t bt[NBI_POOL_TAB_MAX_L];                                                            \
        for (int64_t o = 0; o < L; o++) {                                                          \
            int64_t at = tab[o];                                                                   \
            best[o] = at >= 0 ? xp[at] : (T)-INFINITY;                                             \
            bt[o] = 0;                                                                             \
        }                                                                                          \
        for (int32_t t = 1; t < (int32_t)K; t++) {                                                 \
            const int64_t *tr = tab + t * L;                                                       \
            for (int64_t o = 0; o < L; o++) {                                                      \
                int64_t at = tr[o];                                                                \
                val[o] = at >= 0 ? xp[at] : (T)-INFINITY;                                          \
            }                                                                                      \
            for (int64_t o = 0; o < L; o++) {                                                      \
                T v = val[o], b = best[o];                                                         \
                bool better = (v > b) | ((v != v) & (b == b));                                     \
                best[o] = better ? v : b;                                                          \
                bt[o] = better ? t : bt[o];                                                        \
            }                                                                                      \
        }                                                                                          \
        for (int64_t o = 0; o < L; o++) {                                                          \
            w[o] = tab[bt[o] * L + o];                                                             \
        }                                                                                          \
    }                                                                                              \
    static void nbi_pool_find_##SUF(const nbi_pgeo *pg, const T *xp, const int64_t *tab,           \
                                    int64_t *w) {                                                  \
        if (pg->dense) { /* f32 only */                                                            \
            nbi_pool_argmax_dense(pg, (const void *)xp, w);                                        \
        } else if (tab != NULL) {                                                                  \
            nbi_pool_argmax_tab_##SUF(pg, xp, tab, w);                                             \
        } else {                                                                                   \
            nbi_pool_argmax_##SUF(pg, xp, w);                                                      \
        }                                                                                          \
    }                                                                                              \
    /* planes [first, first + count) */                                                            \
    static void nbi_pool_take_planes_##SUF(void *ud, int64_t first, int64_t count, int worker) {   \
        const nbi_pgeo *pg = ud;                                                                   \
        const T *x = pg->g.ka->in[0], *v = pg->g.ka->in[1];                                        \
        T *out = pg->g.ka->out;                                                                    \
        const T pv = (T)pg->g.ka->node->at.value;                                                  \
        int64_t *w = nbi_pool_scratch(pg, worker), *tab = nbi_pool_table(pg, w);                   \
        for (int64_t q = first; q < first + count; q++) {                                          \
            nbi_pool_find_##SUF(pg, x + q * pg->P, tab, w);                                        \
            const T *vp = v + q * pg->P;                                                           \
            T *op = out + q * pg->L;                                                               \
            for (int64_t o = 0; o < pg->L; o++) {                                                  \
                op[o] = w[o] >= 0 ? vp[w[o]] : pv;                                                 \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void nbi_pool_scatter_planes_##SUF(void *ud, int64_t first, int64_t count,              \
                                              int worker) {                                        \
        const nbi_pgeo *pg = ud;                                                                   \
        const T *x = pg->g.ka->in[0], *gv = pg->g.ka->in[1];                                       \
        T *out = pg->g.ka->out;                                                                    \
        int64_t *w = nbi_pool_scratch(pg, worker), *tab = nbi_pool_table(pg, w);                   \
        for (int64_t q = first; q < first + count; q++) {                                          \
            nbi_pool_find_##SUF(pg, x + q * pg->P, tab, w);                                        \
            const T *gp = gv + q * pg->L;                                                          \
            T *op = out + q * pg->P;                                                               \
            memset(op, 0, (size_t)pg->P * sizeof(T));                                              \
            for (int64_t o = 0; o < pg->L; o++) {                                                  \
                if (w[o] >= 0) {                                                                   \
                    op[w[o]] += gp[o];                                                             \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

NBI_POOL_KERNELS(float, f32)
NBI_POOL_KERNELS(double, f64)

static void nbi_pgeo_make(const nb_var *node, nbi_pgeo *pg) {
    const nb_var *x = node->in[0];
    int nd = (int)node->at.ivalue;
    int64_t so[NBI_CONV_ND];
    /* the geometry was checked at trace time; recompute the window counts */
    for (int d = 0; d < nd; d++) {
        int64_t ek = node->at.c[d] * (node->at.a[d] - 1) + 1;
        so[d] = (x->shape[2 + d] + node->at.b[d] + node->at.b[3 + d] - ek) / node->at.a[3 + d] + 1;
    }
    nbi_cgeo_make(node, x->shape + 2, so, x->shape[1], x->shape[0], &pg->g);
    pg->planes = x->shape[0] * x->shape[1];
    pg->P = pg->g.S[0] * pg->g.S[1] * pg->g.S[2];
    pg->L = pg->g.So[0] * pg->g.So[1] * pg->g.So[2];
    for (int64_t t2 = 0; t2 < pg->g.k[2] && t2 < NBI_POOL_TAPS; t2++) {
        nbi_valid(pg->g.So[2], pg->g.s[2], t2 * pg->g.d[2] - pg->g.lo[2], pg->g.S[2], &pg->va[t2],
                  &pg->vb[t2]);
    }
    const nbi_cgeo *g = &pg->g;
    pg->dense = g->es == sizeof(float) && g->K <= NBI_POOL_DENSE_TAPS && pg->P < INT32_MAX;
    for (int d = 0; d < 3; d++) { /* the last window's last tap inside, none before the first */
        pg->dense = pg->dense && g->lo[d] == 0 &&
                    (g->So[d] - 1) * g->s[d] + (g->k[d] - 1) * g->d[d] < g->S[d];
    }
    int64_t t = 0;
    for (int64_t t0 = 0; pg->dense && t0 < g->k[0]; t0++) {
        for (int64_t t1 = 0; t1 < g->k[1]; t1++) {
            for (int64_t t2 = 0; t2 < g->k[2]; t2++, t++) {
                pg->toff[t] = (t0 * g->d[0] * g->S[1] + t1 * g->d[1]) * g->S[2] + t2 * g->d[2];
            }
        }
    }
}

/* per worker (each worker's slice this many bytes): a window-index row, and the tap table
 * when the plane is small */
static size_t nbi_pool_slice(const nbi_pgeo *pg) {
    size_t n = (size_t)pg->L + (nbi_pool_use_table(pg) ? (size_t)(pg->L * pg->g.K) : 0);
    return (n * sizeof(int64_t) + 63) / 64 * 64;
}

static size_t nbi_scratch_pool(const nb_var *node) {
    nbi_pgeo pg;
    nbi_pgeo_make(node, &pg);
    return nbi_pool_slice(&pg);
}

static void nbi_k_pool(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return;
    }
    nbi_pgeo pg;
    nbi_pgeo_make(node, &pg);
    pg.g.ka = k;
    bool f32 = node->dtype == NB_DTYPE_F32, take = node->op == NBI_OP_POOL_TAKE;
    nbi_range_fn fn = take ? (f32 ? nbi_pool_take_planes_f32 : nbi_pool_take_planes_f64)
                           : (f32 ? nbi_pool_scatter_planes_f32 : nbi_pool_scatter_planes_f64);
    nbi_par_range(k->pool, pg.planes, nbi_conv_chunk(pg.P * pg.g.K), fn, &pg);
}

nb_var *nbi_pool_op(nbi_op op, nb_var *x, nb_var *v, int nd, const int64_t *kernel,
                    const int64_t *stride, const int64_t *dil, const int64_t *lo, const int64_t *hi,
                    double value) {
    nb_var *ins[2] = {x, v};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, ins, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (poisoned) {
        return tr->poison;
    }
    nbi_attrs at;
    nbi_conv_attrs(&at, nd, kernel, stride, dil, lo, hi);
    at.axis = 1; /* batch first, always */
    at.value = op == NBI_OP_POOL_TAKE ? value : 0.0;
    return nbi_emit(tr, op, 2, ins, &at);
}

/* The other op of the pair (or the same) on (x, w), with node's geometry. */
static nb_var *nbi_pool_again(const nb_var *node, nbi_op op, nb_var *w, double value) {
    const nbi_attrs *a = &node->at;
    return nbi_pool_op(op, node->in[0], w, (int)a->ivalue, a->a, a->a + 3, a->c, a->b, a->b + 3,
                       value);
}

static void nbi_vjp_pool(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    (void)tr;
    /* x selects (no derivative); linear in the second input, each op the other's transpose */
    in_ct[1] = nbi_pool_again(
        node, node->op == NBI_OP_POOL_TAKE ? NBI_OP_POOL_SCATTER : NBI_OP_POOL_TAKE, g, 0.0);
}

static nb_var *nbi_jvp_pool(nb_trace *tr, nb_var *node, nb_var *const *t) {
    (void)tr;
    return t[1] != NULL ? nbi_pool_again(node, (nbi_op)node->op, t[1], 0.0) : NULL;
}

/* Batching: the lanes join N (an unbatched operand broadcast over them first). */
static nb_var *nbi_vmap_pool(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)tr;
    nb_var *in[2];
    for (int i = 0; i < 2; i++) {
        const nb_var *u = node->in[i];
        int64_t shape[NB_MAX_RANK];
        shape[0] = B;
        memcpy(shape + 1, u->shape, (size_t)u->rank * sizeof(int64_t));
        nb_var *b = bin[i] != NULL
                        ? bin[i]
                        : nb_broadcast_to(nb_expand_dims(node->in[i], 0), u->rank + 1, shape);
        shape[1] = B * u->shape[0];
        in[i] = nb_reshape(b, u->rank, shape + 1);
    }
    const nbi_attrs *a = &node->at;
    nb_var *y = nbi_pool_op((nbi_op)node->op, in[0], in[1], (int)a->ivalue, a->a, a->a + 3, a->c,
                            a->b, a->b + 3, a->value);
    if (nb_var_is_poison(y)) {
        return y;
    }
    int64_t ys[NB_MAX_RANK];
    ys[0] = B;
    memcpy(ys + 1, node->shape, (size_t)node->rank * sizeof(int64_t));
    return nb_reshape(y, node->rank + 1, ys);
}

const nbi_op_info nbi_opinfo_pool_take = {.name = "pool_take",
                                          .n_in = 2,
                                          .infer = nbi_infer_pool_take,
                                          .kernel = nbi_k_pool,
                                          .scratch = nbi_scratch_pool,
                                          .nondiff = 1u,
                                          .vjp = nbi_vjp_pool,
                                          .jvp = nbi_jvp_pool,
                                          .vmap = nbi_vmap_pool};

const nbi_op_info nbi_opinfo_pool_scatter = {.name = "pool_scatter",
                                             .n_in = 2,
                                             .infer = nbi_infer_pool_scatter,
                                             .kernel = nbi_k_pool,
                                             .scratch = nbi_scratch_pool,
                                             .nondiff = 1u,
                                             .vjp = nbi_vjp_pool,
                                             .jvp = nbi_jvp_pool,
                                             .vmap = nbi_vmap_pool};
