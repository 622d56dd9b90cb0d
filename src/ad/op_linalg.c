/*
 * op_linalg.c -- matrix products: matmul (numpy.matmul semantics) and the dot composite.
 *
 * matmul(a, b) multiplies stacks of matrices: a is [..., m, k], b is [..., k, n], the batch
 * dims (all but the last two) broadcast numpy-style, and the result is [batch..., m, n]. A
 * rank-1 a is read as [1, k] and a rank-1 b as [k, 1], and the added dim is dropped from the
 * result, so [k] @ [k] is rank 0. The promotion lives inside the node: it keeps the original
 * operands, its inferred shape already lacks the promoted dims, and the kernel reads a rank-1
 * operand as a one-row (a) or one-column (b) matrix. No reshape nodes are emitted.
 *
 * Float dtypes go to BLIS's typed expert API (bli_sgemm_ex / bli_dgemm_ex), one call per
 * batch element, with the row-major strides passed as they are (rs = row length, cs = 1),
 * and a broadcast batch dim simply revisits the same matrix (zero batch stride). An operand
 * flagged as stored transposed is copied row-major into scratch first: BLIS's summation
 * order depends on how operands are stored (nbi_mm_pack_a), and the product must have the
 * bits of the one made from a materialised transpose. (A transpose of a product is another
 * matter: the optimizer makes it as the swapped product, with that product's bits --
 * passes.c, nbi_pass_transpose_matmul.) Why BLIS: its GotoBLAS-style blocking around
 * one small register-tiled micro-kernel per architecture reaches vendor-BLAS speed with explicit
 * strides for every operand; F. G. Van Zee and R. A. van de Geijn, "BLIS: A Framework for
 * Rapidly Instantiating BLAS Functionality", ACM TOMS 41(3), 2015.
 *
 * Small float products (at most NBI_MM_SMALL multiply-adds), where BLIS's set-up would cost
 * more than the arithmetic, and outer products (k == 1) of any size, use register-tiled
 * loops of their own instead, every output summed over k in increasing order (see "small
 * float products" below). Other matrix-vector products (n == 1, or m == 1) go to BLIS's gemv
 * (bli_sgemv_ex / bli_dgemv_ex, "matrix-vector products" below). Integer dtypes use a plain
 * loop that wraps (two's complement, computed in the unsigned type), every output summed over
 * k in increasing order.
 *
 * Accumulation. A matmul node with a third operand c (of the product's dtype and shape,
 * never broadcast) computes a @ b + c: the optimizer's accumulate pass (pass_accumulate.c)
 * turns add(matmul(a, b), c) into it, so that a weight gradient summed over several uses
 * is added into one buffer block by block instead of each product being made whole and the
 * sum then taken in another pass. The output may be c's own buffer (the memory plan gives
 * it that slot when c is read for the last time there: exec.c's nbi_inplace_ok). Every
 * output is the product's value plus c, rounded once more -- exactly the bits of the
 * product and the add made separately, whichever code makes the product (nbi_mm_block), so
 * the rewrite changes no result.
 *
 * Behaviour pinned by the tests: beta = 0 makes BLIS overwrite C without reading it, so the
 * uninitialised output buffer never leaks NaN or garbage into the result; k == 0 writes zeros
 * here without calling BLIS (BLIS 0.9 also gives zeros then, but the result does not depend
 * on it and no pointer into an empty operand is handed over); an empty result does nothing.
 * The output must not alias an input.
 */
#include "ad/ir.h"

#include <blis.h>
#include <string.h>

/* ---- geometry ----------------------------------------------------------------------- */

/* One matmul as a batch of [m, k] @ [k, n] products over a broadcast batch shape.
 *
 * Transposed operands. The attributes at.axes[0] and at.axes[1] mark the first and second
 * operand as stored transposed (their last two dims swapped): the matmul then multiplies
 * by the transpose of what it is given. Builders never set them; the optimizer's
 * transpose-folding pass does (passes.c), so that matmul(transpose(w), x) makes no
 * transposed array: nabla's small-product loops read w through swapped strides, and for
 * BLIS the block being multiplied is copied row-major into the worker's scratch (BLIS sums
 * a column-stored operand in another order: nbi_mm_pack_a). */
typedef struct nbi_mm_geom {
    int64_t m, n, k;
    int64_t a_rs, a_cs, b_rs, b_cs; /* element strides of one matrix of a and of b */
    int64_t c_rs;                   /* row stride of the output block (n of the full C) */
    int ra_bat, rb_bat;             /* batch ranks of a and b (leading dims of their shapes) */
    int rbat;                       /* rank of the broadcast batch shape */
    bool acc;                       /* a @ b + c ("Accumulation" above, nbi_mm_block) */
    const void *cin; /* acc, nabla's loops: where they read the block's c (nbi_mm_block) */
    int64_t bat[NB_MAX_RANK];
} nbi_mm_geom;

static bool nbi_mm_trans(const nb_var *node, int operand) {
    return node->at.axes[operand] != 0 && node->in[operand]->rank >= 2;
}

/* The geometry of node = a @ b (both of rank >= 1); false if the batch dims do not
 * broadcast. */
static bool nbi_mm_geometry(const nb_var *node, nbi_mm_geom *g) {
    const nb_var *a = node->in[0], *b = node->in[1];
    bool ta = nbi_mm_trans(node, 0), tb = nbi_mm_trans(node, 1);
    /* field by field: a memset of the whole struct is a slow `rep stos` on some CPUs, paid
     * on every call of the kernel */
    for (int d = 0; d < NB_MAX_RANK; d++) {
        g->bat[d] = 0;
    }
    int ra = a->rank, rb = b->rank;
    g->m = ra >= 2 ? a->shape[ra - (ta ? 1 : 2)] : 1;
    g->k = a->shape[ra - (ta ? 2 : 1)];
    g->n = rb >= 2 ? b->shape[rb - (tb ? 2 : 1)] : 1;
    /* row-major storage: [m,k] has strides (k,1); stored as [k,m] it has (1,m) */
    g->a_rs = ta ? 1 : g->k;
    g->a_cs = ta ? g->m : 1;
    g->b_rs = tb ? 1 : g->n;
    g->b_cs = tb ? g->k : 1;
    g->c_rs = g->n;
    g->acc = node->n_in == 3;
    g->cin = NULL;
    g->ra_bat = ra > 2 ? ra - 2 : 0;
    g->rb_bat = rb > 2 ? rb - 2 : 0;
    g->rbat = 0;
    return nbi_broadcast_shapes(g->ra_bat, a->shape, g->rb_bat, b->shape, &g->rbat, g->bat);
}

/* ---- inference ---------------------------------------------------------------------- */

/* Equal, numeric dtypes (shared by nb_matmul's inference and nb_dot). */
static nb_status nbi_mm_check_dtypes(nb_trace *tr, const char *fn, const nb_var *a,
                                     const nb_var *b) {
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    if (a->dtype != b->dtype) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "%s: dtypes differ: %s and %s (convert one with nb_cast)", fn,
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    if (a->dtype == NB_DTYPE_BOOL) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "%s: operands are %s and %s; a matrix product needs a numeric "
                             "dtype (f32, f64, i32 or i64; use nb_cast)",
                             fn, nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    return NB_OK;
}

/* "[d0,d1,...]" of the first rank dims of shape, into buf. */
static const char *nbi_mm_dims(char *buf, size_t cap, int rank, const int64_t *shape) {
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_sbuf_putc(&s, '[');
    for (int i = 0; i < rank; i++) {
        nbi_sbuf_printf(&s, i ? ",%lld" : "%lld", (long long)shape[i]);
    }
    nbi_sbuf_putc(&s, ']');
    return buf;
}

static nb_status nbi_infer_matmul(nb_trace *tr, nb_var *p) {
    if (p->n_in < 2) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL,
                             "nb_matmul: %d operands (2, or 3 with an accumulator)", (int)p->n_in);
    }
    const nb_var *a = p->in[0], *b = p->in[1];
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    nb_status st = nbi_mm_check_dtypes(tr, "nb_matmul", a, b);
    if (st != NB_OK) {
        return st;
    }
    if (a->rank == 0 || b->rank == 0) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_matmul: %s @ %s: the %s operand is rank 0; matmul needs rank "
                             ">= 1 (to scale by a scalar use nb_mul)",
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                             a->rank == 0 ? "first" : "second");
    }
    bool ta = nbi_mm_trans(p, 0), tb = nbi_mm_trans(p, 1);
    int64_t ka = a->shape[a->rank - (ta ? 2 : 1)];
    int64_t kb = b->rank >= 2 ? b->shape[b->rank - (tb ? 1 : 2)] : b->shape[0];
    if (ka != kb) {
        const char *hint;
        if (b->rank >= 2 && b->shape[b->rank - 1] == ka) {
            hint = "did you mean to transpose the second operand?";
        } else if (a->rank >= 2 && a->shape[a->rank - 2] == kb) {
            hint = "did you mean to transpose the first operand?";
        } else {
            hint = b->rank >= 2 ? "the last dim of the first operand must equal the "
                                  "second-to-last dim of the second"
                                : "the last dim of the first operand must equal the length "
                                  "of the second";
        }
        return nbi_trace_err(tr, NB_ERR_SHAPE, "nb_matmul: %s @ %s: inner dims %lld != %lld (%s)",
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                             (long long)ka, (long long)kb, hint);
    }
    nbi_mm_geom g;
    if (!nbi_mm_geometry(p, &g)) {
        char da[NBI_SIG_CAP], db[NBI_SIG_CAP];
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_matmul: %s @ %s: batch dims %s and %s do not broadcast "
                             "(aligned from the right, each pair must be equal or contain a "
                             "1; reshape or nb_expand_dims one operand)",
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                             nbi_mm_dims(da, sizeof da, g.ra_bat, a->shape),
                             nbi_mm_dims(db, sizeof db, g.rb_bat, b->shape));
    }
    int r = g.rbat;
    memcpy(p->shape, g.bat, (size_t)r * sizeof(int64_t));
    if (a->rank >= 2) {
        p->shape[r++] = g.m;
    }
    if (b->rank >= 2) {
        p->shape[r++] = g.n;
    }
    p->rank = (int8_t)r;
    p->dtype = a->dtype;
    if (p->n_in == 3) { /* an accumulating product (pass_accumulate.c): c of the result's type */
        const nb_var *c = p->in[2];
        bool same = c->dtype == p->dtype && c->rank == p->rank;
        for (int d = 0; same && d < r; d++) {
            same = c->shape[d] == p->shape[d];
        }
        if (!same) {
            char sc[NBI_SIG_CAP], sp[NBI_SIG_CAP];
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_matmul: %s @ %s accumulated into %s: the accumulator must "
                                 "have the product's dtype and shape %s",
                                 nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                                 nbi_var_sig(sc, sizeof sc, c), nbi_var_sig(sp, sizeof sp, p));
        }
    } else if (p->n_in != 2) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL,
                             "nb_matmul: %d operands (2, or 3 with an accumulator)", (int)p->n_in);
    }
    return NB_OK;
}

/* ---- builders ----------------------------------------------------------------------- */

nb_var *nb_matmul(nb_var *a, nb_var *b) {
    nb_var *in[2] = {a, b};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, in, &poisoned);
    return tr ? nbi_emit(tr, NBI_OP_MATMUL, 2, in, NULL) : NULL;
}

/* A composite: the [k] @ [k] case of matmul, with its own checks (NULL and foreign inputs
 * too) so that every message names nb_dot; poison passes through. */
nb_var *nb_dot(nb_var *a, nb_var *b) {
    nb_var *in[2] = {a, b};
    bool poisoned;
    nb_trace *tr = nbi_trace_of(2, in, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (tr->status != NB_OK) {
        return tr->poison;
    }
    static const char *const names[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        if (in[i] == NULL) {
            return nbi_trace_errv(tr, NB_ERR_MISUSE,
                                  "nb_dot: %s is a NULL var (pass a rank-1 var of this trace)",
                                  names[i]);
        }
    }
    if (poisoned) {
        return tr->poison;
    }
    for (int i = 0; i < 2; i++) {
        if (in[i]->tr != tr) {
            return nbi_trace_errv(tr, NB_ERR_INVALID,
                                  "nb_dot: %s belongs to another trace (a var was kept after its "
                                  "trace ended, or an outer var was used inside a function "
                                  "without being passed as an argument)",
                                  names[i]);
        }
    }
    if (nbi_mm_check_dtypes(tr, "nb_dot", a, b) != NB_OK) {
        return tr->poison;
    }
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    if (a->rank != 1 || b->rank != 1) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_dot: %s and %s: both operands must be rank 1 (use nb_matmul "
                              "for matrices and batches)",
                              nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    if (a->shape[0] != b->shape[0]) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE, "nb_dot: %s and %s: lengths %lld != %lld",
                              nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b),
                              (long long)a->shape[0], (long long)b->shape[0]);
    }
    return nb_matmul(a, b);
}

/* ---- kernels ------------------------------------------------------------------------ */

/* One [m, k] @ [k, n] product (operands addressed through the geometry's strides) into a
 * row-major c (m, n, k > 0). */
typedef void (*nbi_mm_fn)(const nbi_mm_geom *g, const void *a, const void *b, void *c,
                          void *scratch);

/* BLIS runs with exactly one thread, set on a local runtime object rather than taken from
 * BLIS_NUM_THREADS / OMP_NUM_THREADS or bli_thread_set_num_threads: results and timing must
 * not depend on the environment, and nabla's own pool parallelises over batch elements and
 * blocks of rows and columns whose boundaries never depend on the thread count (below).
 * BLIS does not split the k loop, so each output is summed in an order fixed by the shapes
 * and the micro-kernel BLIS selects for the CPU: results are bit-identical run to run.
 *
 * What BLIS itself does, checked (test_blis_threads_same_bits): Debian's BLIS 0.9.0 (OpenMP
 * build, zen2 kernels on this Zen 3) gives the same bits with 1, 2 and 4 threads of its own
 * for an MLP step's products (128x784 @ 784x256, 256x10, transposed-a weight gradients,
 * k = 10 input gradients) in f32 and f64: it splits the m and n loops, never k. nabla does
 * not rely on that: its blocks fix the bits (a product cut into column blocks can differ
 * from one whole BLIS call, e.g. 128x784 @ 784x256 in f64, see bench_matmul), and one pool
 * instead of two threading runtimes never oversubscribes the cores.
 *
 * Which BLIS build: Debian's single-threaded variant where it is installed (libblis-serial-
 * dev; cmake/FindBLIS.cmake), else the default. The OpenMP build opens a parallel region of
 * one thread for every call -- a team set up and a futex wake-up system call, ~0.5 us, paid
 * ~135 times in a character GRU's train step (8 % of it). Both builds run the same kernels
 * in the same order on one thread: the same bits (the stochastic suite's digest did not
 * move). With the serial build the test above checks only that a thread request changes
 * nothing; `nabla --version` names the build. */
static void nbi_mm_f32(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    (void)scratch;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    float one = 1.0f, beta = g->acc ? 1.0f : 0.0f; /* 1: only in place (nbi_mm_block) */
    /* BLIS's typed API takes non-const pointers; it only reads a and b. */
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g->m, g->n, g->k, &one, (float *)a, g->a_rs,
                 g->a_cs, (float *)b, g->b_rs, g->b_cs, &beta, c, g->c_rs, 1, NULL, &rntm);
}

static void nbi_mm_f64(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    (void)scratch;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    double one = 1.0, beta = g->acc ? 1.0 : 0.0;
    bli_dgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g->m, g->n, g->k, &one, (double *)a, g->a_rs,
                 g->a_cs, (double *)b, g->b_rs, g->b_cs, &beta, c, g->c_rs, 1, NULL, &rntm);
}

/* Matrix-vector products (n == 1: c = A b; or m == 1: c = a B, i.e. c^T = B^T a^T) go to
 * BLIS's gemv instead, which streams the matrix once: a 1000 x 1000 f32 product took 48-52
 * us where gemm with one column took 72 (101 with A stored transposed). What gemv does,
 * read in BLIS 0.9's typed API and checked by the tests: level-2 operations never thread
 * (rntm is not consulted), and the variant is chosen by the matrix's storage alone --
 * row-stored: each output a dot product of a row with x (the dotxf kernel, 8 rows at a
 * time); column-stored: y += A[:, j..j+f) x[j..j+f) for f-column chunks in order (axpyf).
 * Both use FMA and sum in an order fixed by the shapes: not gemm's order, but the same for
 * any alignment of the buffers, run to run, and -- the blocks being fixed -- any thread
 * count (test_matmul_gemv_bits pins the bits to a direct call). */
static void nbi_mv_f32(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    (void)scratch;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    float one = 1.0f, beta = g->acc ? 1.0f : 0.0f;
    if (g->n == 1) {
        bli_sgemv_ex(BLIS_NO_TRANSPOSE, BLIS_NO_CONJUGATE, g->m, g->k, &one, (float *)a, g->a_rs,
                     g->a_cs, (float *)b, g->b_rs, &beta, c, g->c_rs, NULL, &rntm);
    } else {
        bli_sgemv_ex(BLIS_TRANSPOSE, BLIS_NO_CONJUGATE, g->k, g->n, &one, (float *)b, g->b_rs,
                     g->b_cs, (float *)a, g->a_cs, &beta, c, 1, NULL, &rntm);
    }
}

static void nbi_mv_f64(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    (void)scratch;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    double one = 1.0, beta = g->acc ? 1.0 : 0.0;
    if (g->n == 1) {
        bli_dgemv_ex(BLIS_NO_TRANSPOSE, BLIS_NO_CONJUGATE, g->m, g->k, &one, (double *)a, g->a_rs,
                     g->a_cs, (double *)b, g->b_rs, &beta, c, g->c_rs, NULL, &rntm);
    } else {
        bli_dgemv_ex(BLIS_TRANSPOSE, BLIS_NO_CONJUGATE, g->k, g->n, &one, (double *)b, g->b_rs,
                     g->b_cs, (double *)a, g->a_cs, &beta, c, 1, NULL, &rntm);
    }
}

/* Integers: row i of c accumulates a[i, p] * b[p, :] for p = 0, 1, ..., k-1, in the unsigned
 * type (the output is written through the unsigned type, which may alias the signed one). */
#define NBI_MM_INT_FN(name, T, U)                                                                  \
    static void name(const nbi_mm_geom *g, const void *a_, const void *b_, void *c_,               \
                     void *scratch) {                                                              \
        (void)scratch;                                                                             \
        const T *restrict a = a_, *restrict b = b_;                                                \
        U *restrict c = c_;                                                                        \
        for (int64_t i = 0; i < g->m; i++) {                                                       \
            U *restrict ci = c + i * g->c_rs;                                                      \
            for (int64_t j = 0; !g->acc && j < g->n; j++) {                                        \
                ci[j] = 0;                                                                         \
            }                                                                                      \
            for (int64_t p = 0; p < g->k; p++) {                                                   \
                U x = (U)a[i * g->a_rs + p * g->a_cs];                                             \
                const T *restrict bp = b + p * g->b_rs;                                            \
                for (int64_t j = 0; j < g->n; j++) {                                               \
                    ci[j] += x * (U)bp[j * g->b_cs];                                               \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
NBI_MM_INT_FN(nbi_mm_i32, int32_t, uint32_t)
NBI_MM_INT_FN(nbi_mm_i64, int64_t, uint64_t)

/* ---- small float products ------------------------------------------------------------
 *
 * Below NBI_MM_SMALL multiply-adds a BLIS call costs more than the arithmetic (it sets up
 * its blocking and enters its threading layer even for one thread), so small float products
 * run the loops below instead. Every output is computed exactly as
 *   acc = 0; for p = 0, 1, ..., k-1: acc = acc + a[i, p] * b[p, j]
 * with a rounded multiply and a rounded add (never FMA, never reassociated, k never split):
 * the loops only choose which outputs advance together, which changes no output's bits.
 * Accumulating (nbi_mm_block), each finished acc is then added to c: c = acc + c. So
 * the baseline and AVX2 versions, which group outputs differently, give the same bits, and
 * which one runs depends on the shapes and the CPU, never on the thread count.
 *
 * Why register tiles: each output's sum is a chain of dependent adds (3 cycles each on Zen
 * 3), so a loop that advances 16 outputs of one row (two vectors, two chains) waits on that
 * latency. A tile of several rows and columns of c keeps enough independent chains in
 * flight to run at the adds' throughput, and each loaded or broadcast operand serves a whole
 * row or column of the tile (the register blocking of K. Goto and R. A. van de Geijn,
 * "Anatomy of High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008, without the
 * cache blocking that only pays off on larger products). On Zen 3 a load or a broadcast
 * takes an issue slot of the FP unit as a multiply or an add does, so the main tile is
 * 2 rows x 4 vectors: 8 accumulators, and per step p 4 loads of b, 2 broadcasts of a, 8
 * multiplies and 8 adds, ~0.67 cycle per vector multiply-add where 4 rows x 2 vectors took
 * ~0.8. For vectors of L lanes (AVX2: 8 f32 or 4 f64; the baseline's SSE2: 4 or 2):
 *   - whole vectors of columns, 4 at a time: tiles of 2 rows (an odd last row alone); the
 *     1-3 vectors left: tiles of 4 rows, then single rows. The broadcast reads a[i, p]
 *     whatever a's strides, so a stored transposed costs nothing here;
 *   - the last n % L columns (all of them in a matrix-vector product): when a is stored
 *     transposed (a_rs == 1), vectors run across rows instead, lane l holding row i + l,
 *     with b[p, j] broadcast and up to 4 vectors of rows at once; rows left over (fewer than
 *     L) advance as up to 8 independent scalar chains;
 *   - copies into the per-worker scratch (nbi_mm_scratch_of), transposing square blocks in
 *     registers: b stored transposed (b_cs != 1, n > 1) is copied row-major first; an f32 a
 *     not stored transposed, of at least L rows and at most NBI_MM_APACK elements, is copied
 *     transposed when there are columns left over, so that those run across rows.
 * Written with GNU vector extensions (gcc, clang): the same source gives SSE2 code with
 * 16-byte vectors and, in functions with target("avx2"), AVX2 code with 32-byte vectors.
 * The target is "avx2" and not "fma", so not even -ffp-contract=fast can fuse a multiply
 * and an add. Other compilers get the plain loop.
 *
 * Measured on one Zen 3 core (2-core VM): the 8 products of a tiny MLP's forward + backward
 * (2-32-32-1, batch 16: [16,2]@[2,32], [16,32]@[32,32] plain and with b stored transposed,
 * [32,16]@[16,32] with a stored transposed, matrix-vector products, ...), each run through
 * nbi_k_matmul, took 4.35 us with a loop over one row of 16 outputs at a time and scalar
 * column tails, 1.66 us with these loops (the fixed cost of a call, 84 -> 30 ns, included);
 * bench_speed's tiny MLP row went from 9.9 to 7.5 us. */
#define NBI_MM_SMALL 32768
/* Largest a (elements) copied transposed for the columns left over: the copy transposes
 * with a stride of m elements, which stops paying once it leaves the L1 cache (1024 x 32
 * f32 copied took 11x the time of the scalar chains). f32 only: f64 runs half as many
 * lanes and copies at half the rate, and came out no faster. */
#define NBI_MM_APACK 4096

#if defined(__GNUC__)
#define NBI_MM_VEC 1
#define NBI_MM_INLINE static inline __attribute__((always_inline))
/* packing runs once per product, in a function of its own: inlined into the product's
 * function it would compete with it for registers */
#define NBI_MM_PACK_ATTR static __attribute__((noinline))
/* fully unrolled, so that tiles of accumulators live in registers rather than on the stack */
#if defined(__clang__)
#define NBI_UNROLL _Pragma("clang loop unroll(full)")
#else
#define NBI_UNROLL _Pragma("GCC unroll 16")
#endif
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define NBI_MM_SHUF 1 /* gcc >= 12, clang */
#endif
#endif
#ifndef NBI_MM_SHUF
#define NBI_MM_SHUF 0
#endif
typedef float nbi_f32x4 __attribute__((vector_size(16)));
typedef float nbi_f32x8 __attribute__((vector_size(32)));
typedef double nbi_f64x2 __attribute__((vector_size(16)));
typedef double nbi_f64x4 __attribute__((vector_size(32)));
#else
#define NBI_MM_VEC 0
#endif

#if NBI_MM_VEC
#define NBI_MM_MR 4   /* rows of a vector tile, at most */
#define NBI_MM_NV 4   /* vectors of columns of a vector tile, at most */
#define NBI_MM_RV 4   /* vectors of rows of one column, at most (lanes across rows) */
#define NBI_MM_DOTS 8 /* rows advanced together as scalar chains, at most */

/* Packing: pk[r * ldp + q] = s[r * rs + q * cs] for r < rows, q < cols, i.e. a strided
 * matrix copied row-major. Used on an operand stored transposed (rs == 1, cs > 1): there
 * the copy is a transpose, done in registers on square blocks (4x4 or 8x8 f32, 2x2 f64):
 * 4 loads, 8 shuffles and 4 stores per 4x4 block, where copying element by element is bound
 * by one store per element. Other strides and the edges go element by element. */
NBI_MM_PACK_ATTR void nbi_mm_pack_f32x4(float *restrict pk, int64_t ldp, const float *restrict s,
                                        int64_t rs, int64_t cs, int64_t rows, int64_t cols) {
    int64_t q = 0;
#if NBI_MM_SHUF
    for (; rs == 1 && q + 4 <= cols; q += 4) {
        const float *sq = s + q * cs;
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            nbi_f32x4 x0, x1, x2, x3; /* xi = s[r..r+3, q+i] */
            memcpy(&x0, sq + r, sizeof x0);
            memcpy(&x1, sq + cs + r, sizeof x1);
            memcpy(&x2, sq + 2 * cs + r, sizeof x2);
            memcpy(&x3, sq + 3 * cs + r, sizeof x3);
            nbi_f32x4 t0 = __builtin_shufflevector(x0, x1, 0, 4, 1, 5);
            nbi_f32x4 t1 = __builtin_shufflevector(x0, x1, 2, 6, 3, 7);
            nbi_f32x4 t2 = __builtin_shufflevector(x2, x3, 0, 4, 1, 5);
            nbi_f32x4 t3 = __builtin_shufflevector(x2, x3, 2, 6, 3, 7);
            nbi_f32x4 y0 = __builtin_shufflevector(t0, t2, 0, 1, 4, 5); /* s[r, q..q+3] */
            nbi_f32x4 y1 = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
            nbi_f32x4 y2 = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
            nbi_f32x4 y3 = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
            memcpy(pk + r * ldp + q, &y0, sizeof y0);
            memcpy(pk + (r + 1) * ldp + q, &y1, sizeof y1);
            memcpy(pk + (r + 2) * ldp + q, &y2, sizeof y2);
            memcpy(pk + (r + 3) * ldp + q, &y3, sizeof y3);
        }
        for (; r < rows; r++) {
            for (int i = 0; i < 4; i++) {
                pk[r * ldp + q + i] = sq[i * cs + r];
            }
        }
    }
#endif
    for (; q < cols; q++) {
        for (int64_t r = 0; r < rows; r++) {
            pk[r * ldp + q] = s[r * rs + q * cs];
        }
    }
}

NBI_MM_PACK_ATTR void nbi_mm_pack_f64x2(double *restrict pk, int64_t ldp, const double *restrict s,
                                        int64_t rs, int64_t cs, int64_t rows, int64_t cols) {
    int64_t q = 0;
#if NBI_MM_SHUF
    for (; rs == 1 && q + 2 <= cols; q += 2) {
        const double *sq = s + q * cs;
        int64_t r = 0;
        for (; r + 2 <= rows; r += 2) {
            nbi_f64x2 x0, x1;
            memcpy(&x0, sq + r, sizeof x0);
            memcpy(&x1, sq + cs + r, sizeof x1);
            nbi_f64x2 y0 = __builtin_shufflevector(x0, x1, 0, 2);
            nbi_f64x2 y1 = __builtin_shufflevector(x0, x1, 1, 3);
            memcpy(pk + r * ldp + q, &y0, sizeof y0);
            memcpy(pk + (r + 1) * ldp + q, &y1, sizeof y1);
        }
        for (; r < rows; r++) {
            pk[r * ldp + q] = sq[r];
            pk[r * ldp + q + 1] = sq[cs + r];
        }
    }
#endif
    for (; q < cols; q++) {
        for (int64_t r = 0; r < rows; r++) {
            pk[r * ldp + q] = s[r * rs + q * cs];
        }
    }
}

/* R <= NBI_MM_DOTS rows of one column of c as R independent scalar chains (R is a constant
 * once inlined, so the loops unroll and the accumulators stay in registers). */
#define NBI_MM_DOTS_FN(name, T)                                                                    \
    NBI_MM_INLINE void name(int R, int64_t k, const T *restrict a, int64_t a_rs, int64_t a_cs,     \
                            const T *restrict b, int64_t ldb, T *restrict c, int64_t ldc,          \
                            bool add) {                                                            \
        T acc[NBI_MM_DOTS];                                                                        \
        NBI_UNROLL                                                                                 \
        for (int r = 0; r < R; r++) {                                                              \
            acc[r] = 0;                                                                            \
        }                                                                                          \
        for (int64_t p = 0; p < k; p++) {                                                          \
            T y = b[p * ldb];                                                                      \
            NBI_UNROLL                                                                             \
            for (int r = 0; r < R; r++) {                                                          \
                acc[r] = acc[r] + a[r * a_rs + p * a_cs] * y;                                      \
            }                                                                                      \
        }                                                                                          \
        NBI_UNROLL                                                                                 \
        for (int r = 0; r < R; r++) {                                                              \
            c[r * ldc] = add ? acc[r] + c[r * ldc] : acc[r];                                       \
        }                                                                                          \
    }
NBI_MM_DOTS_FN(nbi_mm_dots_f32, float)
NBI_MM_DOTS_FN(nbi_mm_dots_f64, double)

/* The loops for one vector type V of T (S names the instance, P is its packing function,
 * DOTS its scalar tile, ATTR its target). R, NV and RV are constants once inlined, so the
 * loops over them unroll and the accumulators stay in registers.
 *   nbi_mm_tile_S:  c[0..R-1, 0..NV*L-1], R <= NBI_MM_MR rows x NV <= NBI_MM_NV vectors;
 *   nbi_mm_panel_S: NV vectors of columns for all m rows: 4-row tiles, then single rows;
 *   nbi_mm_lanes_S: c[0..RV*L-1, 0], RV <= NBI_MM_RV vectors across rows (a_rs == 1);
 *   nbi_mm_lanes_col_S, nbi_mm_dots_col_S: one column, in lanes or in DOTS;
 *   nbi_mm_small_S: the whole product.
 * A broadcast is written x - (V){0}: subtracting +0 leaves every x as it is (-0 included),
 * and compilers drop the subtraction. */
#define NBI_MM_SMALL_DEFS(S, T, V, P, DOTS, ATTR)                                                  \
    NBI_MM_INLINE void nbi_mm_tile_##S(int R, int NV, int64_t k, const T *restrict a,              \
                                       int64_t a_rs, int64_t a_cs, const T *restrict b,            \
                                       int64_t ldb, T *restrict c, int64_t ldc, bool add) {        \
        enum { L = sizeof(V) / sizeof(T) };                                                        \
        V acc[NBI_MM_MR][NBI_MM_NV];                                                               \
        NBI_UNROLL                                                                                 \
        for (int r = 0; r < R; r++) {                                                              \
            NBI_UNROLL                                                                             \
            for (int v = 0; v < NV; v++) {                                                         \
                acc[r][v] = (V){0};                                                                \
            }                                                                                      \
        }                                                                                          \
        for (int64_t p = 0; p < k; p++) {                                                          \
            V y[NBI_MM_NV];                                                                        \
            NBI_UNROLL                                                                             \
            for (int v = 0; v < NV; v++) {                                                         \
                memcpy(&y[v], b + p * ldb + v * L, sizeof(V));                                     \
            }                                                                                      \
            NBI_UNROLL                                                                             \
            for (int r = 0; r < R; r++) {                                                          \
                V x = a[r * a_rs + p * a_cs] - (V){0};                                             \
                NBI_UNROLL                                                                         \
                for (int v = 0; v < NV; v++) {                                                     \
                    acc[r][v] = acc[r][v] + x * y[v];                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        NBI_UNROLL                                                                                 \
        for (int r = 0; r < R; r++) {                                                              \
            NBI_UNROLL                                                                             \
            for (int v = 0; v < NV; v++) {                                                         \
                if (add) {                                                                         \
                    V old;                                                                         \
                    memcpy(&old, c + r * ldc + v * L, sizeof(V));                                  \
                    acc[r][v] = acc[r][v] + old;                                                   \
                }                                                                                  \
                memcpy(c + r * ldc + v * L, &acc[r][v], sizeof(V));                                \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    NBI_MM_INLINE void nbi_mm_panel_##S(int NV, int64_t m, int64_t k, const T *restrict a,         \
                                        int64_t a_rs, int64_t a_cs, const T *restrict b,           \
                                        int64_t ldb, T *restrict c, int64_t ldc, bool add) {       \
        int64_t i = 0;                                                                             \
        for (; i + NBI_MM_MR <= m; i += NBI_MM_MR) {                                               \
            nbi_mm_tile_##S(NBI_MM_MR, NV, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc,  \
                            add);                                                                  \
        }                                                                                          \
        for (; i < m; i++) {                                                                       \
            nbi_mm_tile_##S(1, NV, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, add);    \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    NBI_MM_INLINE void nbi_mm_lanes_##S(int RV, int64_t k, const T *restrict a, int64_t a_cs,      \
                                        const T *restrict b, int64_t ldb, T *restrict c,           \
                                        int64_t ldc, bool add) {                                   \
        enum { L = sizeof(V) / sizeof(T) };                                                        \
        V acc[NBI_MM_RV];                                                                          \
        NBI_UNROLL                                                                                 \
        for (int v = 0; v < RV; v++) {                                                             \
            acc[v] = (V){0};                                                                       \
        }                                                                                          \
        for (int64_t p = 0; p < k; p++) {                                                          \
            V y = b[p * ldb] - (V){0};                                                             \
            NBI_UNROLL                                                                             \
            for (int v = 0; v < RV; v++) {                                                         \
                V x;                                                                               \
                memcpy(&x, a + p * a_cs + v * L, sizeof x);                                        \
                acc[v] = acc[v] + x * y;                                                           \
            }                                                                                      \
        }                                                                                          \
        NBI_UNROLL                                                                                 \
        for (int v = 0; v < RV; v++) {                                                             \
            if (ldc == 1) {                                                                        \
                if (add) {                                                                         \
                    V old;                                                                         \
                    memcpy(&old, c + v * L, sizeof(V));                                            \
                    acc[v] = acc[v] + old;                                                         \
                }                                                                                  \
                memcpy(c + v * L, &acc[v], sizeof(V));                                             \
                continue;                                                                          \
            }                                                                                      \
            NBI_UNROLL                                                                             \
            for (int l = 0; l < L; l++) {                                                          \
                T *o = c + (v * L + l) * ldc;                                                      \
                *o = add ? acc[v][l] + *o : acc[v][l];                                             \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* One column of c, rows 0..m-1: across rows in vectors (a_rs == 1, m a multiple of L),        \
     * or in scalar chains. Functions of their own, so that their loops get the registers          \
     * (inlined into the product's function, gcc kept a loop counter on the stack). */             \
    ATTR static __attribute__((noinline)) void nbi_mm_lanes_col_##S(                               \
        int64_t m, int64_t k, const T *restrict a, int64_t a_cs, const T *restrict b, int64_t ldb, \
        T *restrict c, int64_t ldc, bool add) {                                                    \
        enum { L = sizeof(V) / sizeof(T) };                                                        \
        int64_t i = 0;                                                                             \
        for (; i + NBI_MM_RV * L <= m; i += NBI_MM_RV * L) {                                       \
            nbi_mm_lanes_##S(NBI_MM_RV, k, a + i, a_cs, b, ldb, c + i * ldc, ldc, add);            \
        }                                                                                          \
        switch ((m - i) / L) {                                                                     \
        case 3:                                                                                    \
            nbi_mm_lanes_##S(3, k, a + i, a_cs, b, ldb, c + i * ldc, ldc, add);                    \
            break;                                                                                 \
        case 2:                                                                                    \
            nbi_mm_lanes_##S(2, k, a + i, a_cs, b, ldb, c + i * ldc, ldc, add);                    \
            break;                                                                                 \
        case 1:                                                                                    \
            nbi_mm_lanes_##S(1, k, a + i, a_cs, b, ldb, c + i * ldc, ldc, add);                    \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    ATTR static __attribute__((noinline)) void nbi_mm_dots_col_##S(                                \
        int64_t m, int64_t k, const T *restrict a, int64_t a_rs, int64_t a_cs,                     \
        const T *restrict b, int64_t ldb, T *restrict c, int64_t ldc, bool add) {                  \
        int64_t i = 0;                                                                             \
        for (; i + NBI_MM_DOTS <= m; i += NBI_MM_DOTS) {                                           \
            DOTS(NBI_MM_DOTS, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, add);         \
        }                                                                                          \
        if (m - i >= 4) {                                                                          \
            DOTS(4, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, add);                   \
            i += 4;                                                                                \
        }                                                                                          \
        if (m - i >= 2) {                                                                          \
            DOTS(2, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, add);                   \
            i += 2;                                                                                \
        }                                                                                          \
        if (m - i >= 1) {                                                                          \
            DOTS(1, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, add);                   \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* k == 1, an outer product: c[i, j] = 0 + a[i] b[j], plus cin[i, j] when accumulating,        \
     * row by row, 4 vectors a step: c streams through once and b stays in the L1 cache. On a      \
     * 1000 x 1000 f32 c accumulated in place: 49 us, BLIS's sger (which fuses with FMA) 48,       \
     * the tiles (walking c in strips of columns) 75. The same operations per output as the        \
     * tiles, so the same bits. cin may be c itself. */                                            \
    NBI_MM_INLINE void nbi_mm_outer_row_##S(int64_t n, T x, const T *b, const T *q, T *o) {        \
        enum { L = sizeof(V) / sizeof(T) };                                                        \
        V xv = x - (V){0};                                                                         \
        int64_t j = 0;                                                                             \
        for (; j + 4 * L <= n; j += 4 * L) {                                                       \
            V p[4];                                                                                \
            NBI_UNROLL                                                                             \
            for (int u = 0; u < 4; u++) {                                                          \
                V y;                                                                               \
                memcpy(&y, b + j + u * L, sizeof y);                                               \
                p[u] = (V){0} + xv * y;                                                            \
            }                                                                                      \
            if (q != NULL) {                                                                       \
                NBI_UNROLL                                                                         \
                for (int u = 0; u < 4; u++) {                                                      \
                    V old;                                                                         \
                    memcpy(&old, q + j + u * L, sizeof old);                                       \
                    p[u] = p[u] + old;                                                             \
                }                                                                                  \
            }                                                                                      \
            NBI_UNROLL                                                                             \
            for (int u = 0; u < 4; u++) {                                                          \
                memcpy(o + j + u * L, &p[u], sizeof p[u]);                                         \
            }                                                                                      \
        }                                                                                          \
        for (; j + L <= n; j += L) {                                                               \
            V y;                                                                                   \
            memcpy(&y, b + j, sizeof y);                                                           \
            V p = (V){0} + xv * y;                                                                 \
            if (q != NULL) {                                                                       \
                V old;                                                                             \
                memcpy(&old, q + j, sizeof old);                                                   \
                p = p + old;                                                                       \
            }                                                                                      \
            memcpy(o + j, &p, sizeof p);                                                           \
        }                                                                                          \
        for (; j < n; j++) {                                                                       \
            T p = (T)0 + x * b[j];                                                                 \
            o[j] = q != NULL ? p + q[j] : p;                                                       \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    ATTR static __attribute__((noinline)) void nbi_mm_outer_##S(const nbi_mm_geom *g, const T *a,  \
                                                                const T *b, T *c) {                \
        for (int64_t i = 0; i < g->m; i++) {                                                       \
            T x = a[i * g->a_rs];                                                                  \
            if (g->acc) {                                                                          \
                nbi_mm_outer_row_##S(g->n, x, b, (const T *)g->cin + i * g->c_rs,                  \
                                     c + i * g->c_rs);                                             \
            } else {                                                                               \
                nbi_mm_outer_row_##S(g->n, x, b, NULL, c + i * g->c_rs);                           \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    ATTR static void nbi_mm_small_##S(const nbi_mm_geom *g, const void *a_, const void *b_,        \
                                      void *c_, void *scratch) {                                   \
        enum { L = sizeof(V) / sizeof(T) };                                                        \
        const T *a = a_, *b = b_;                                                                  \
        T *c = c_;                                                                                 \
        if (g->k == 1) { /* a_rs and b_cs are 1 */                                                 \
            nbi_mm_outer_##S(g, a, b, c);                                                          \
            return;                                                                                \
        }                                                                                          \
        int64_t m = g->m, n = g->n, k = g->k, a_rs = g->a_rs, a_cs = g->a_cs, ldb = g->b_rs;       \
        int64_t ldc = g->c_rs;                                                                     \
        bool add = g->acc;                                                                         \
        if (g->b_cs != 1 && n > 1) {                                                               \
            P(scratch, n, b, g->b_rs, g->b_cs, k, n);                                              \
            b = scratch;                                                                           \
            ldb = n;                                                                               \
        }                                                                                          \
        /* a copied transposed for the columns left over (NBI_MM_APACK) */                         \
        if (sizeof(T) == 4 && n % L != 0 && a_rs != 1 && m >= L && m * k <= NBI_MM_APACK) {        \
            size_t off = g->b_cs != 1 ? ((size_t)(k * n) * sizeof(T) + 63) / 64 * 64 : 0;          \
            T *pa = (T *)((unsigned char *)scratch + off);                                         \
            P(pa, m, a, a_cs, a_rs, k, m);                                                         \
            a = pa;                                                                                \
            a_rs = 1;                                                                              \
            a_cs = m;                                                                              \
        }                                                                                          \
        int64_t nv = n - n % L; /* columns done in whole vectors */                                \
        int64_t j = 0;                                                                             \
        for (; j + NBI_MM_NV * L <= nv; j += NBI_MM_NV * L) {                                      \
            int64_t i = 0;                                                                         \
            for (; i + 2 <= m; i += 2) {                                                           \
                nbi_mm_tile_##S(2, NBI_MM_NV, k, a + i * a_rs, a_rs, a_cs, b + j, ldb,             \
                                c + i * ldc + j, ldc, add);                                        \
            }                                                                                      \
            if (i < m) {                                                                           \
                nbi_mm_tile_##S(1, NBI_MM_NV, k, a + i * a_rs, a_rs, a_cs, b + j, ldb,             \
                                c + i * ldc + j, ldc, add);                                        \
            }                                                                                      \
        }                                                                                          \
        switch ((nv - j) / L) {                                                                    \
        case 3:                                                                                    \
            nbi_mm_panel_##S(3, m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, add);                 \
            break;                                                                                 \
        case 2:                                                                                    \
            nbi_mm_panel_##S(2, m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, add);                 \
            break;                                                                                 \
        case 1:                                                                                    \
            nbi_mm_panel_##S(1, m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, add);                 \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
        for (j = nv; j < n; j++) {                  /* the columns left over, fewer than L */      \
            int64_t mv = a_rs == 1 ? m - m % L : 0; /* rows done across rows */                    \
            if (mv > 0) {                                                                          \
                nbi_mm_lanes_col_##S(mv, k, a, a_cs, b + j, ldb, c + j, ldc, add);                 \
            }                                                                                      \
            if (mv < m) {                                                                          \
                nbi_mm_dots_col_##S(m - mv, k, a + mv * a_rs, a_rs, a_cs, b + j, ldb,              \
                                    c + mv * ldc + j, ldc, add);                                   \
            }                                                                                      \
        }                                                                                          \
    }

NBI_MM_SMALL_DEFS(f32x4, float, nbi_f32x4, nbi_mm_pack_f32x4, nbi_mm_dots_f32, )
NBI_MM_SMALL_DEFS(f64x2, double, nbi_f64x2, nbi_mm_pack_f64x2, nbi_mm_dots_f64, )

static void nbi_mm_small_f32(const nbi_mm_geom *g, const void *a, const void *b, void *c,
                             void *scratch) {
    nbi_mm_small_f32x4(g, a, b, c, scratch);
}

static void nbi_mm_small_f64(const nbi_mm_geom *g, const void *a, const void *b, void *c,
                             void *scratch) {
    nbi_mm_small_f64x2(g, a, b, c, scratch);
}

/* The same loops with 256-bit vectors where the CPU has AVX2. */
#if defined(__x86_64__) || defined(__i386__)
#define NBI_MM_AVX2 1
#if NBI_MM_SHUF
/* One 8x8 block of nbi_mm_pack_f32x8 (s column-stored): pk[r + i, q + j] = s[r + i + (q + j) cs]
 * for i, j < 8, from 8 loads, 24 shuffles and 8 stores of 256-bit vectors. */
__attribute__((target("avx2"), always_inline)) static inline void
nbi_mm_t8x8(float *restrict pk, int64_t ldp, const float *restrict s, int64_t cs, int64_t r,
            int64_t q) {
    const float *sq = s + q * cs;
    nbi_f32x8 x[8], t[8], u[8]; /* x[i] = s[r..r+7, q+i] */
    NBI_UNROLL
    for (int i = 0; i < 8; i++) {
        memcpy(&x[i], sq + i * cs + r, sizeof x[i]);
    }
    NBI_UNROLL
    for (int i = 0; i < 8; i += 2) { /* interleave pairs within 128-bit halves */
        t[i] = __builtin_shufflevector(x[i], x[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(x[i], x[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    NBI_UNROLL
    for (int i = 0; i < 8; i += 4) { /* then pairs of pairs */
        u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    NBI_UNROLL
    for (int i = 0; i < 4; i++) { /* then the halves: rows r+i and r+i+4 */
        nbi_f32x8 lo = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        nbi_f32x8 hi = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        memcpy(pk + (r + i) * ldp + q, &lo, sizeof lo);
        memcpy(pk + (r + i + 4) * ldp + q, &hi, sizeof hi);
    }
}

/* Elements of a copy from which nbi_mm_pack_f32x8 goes along the copy's rows (more than
 * a quarter of a 1 MB L2). Down its columns, each 8-column stripe writes 32 bytes to every
 * row: with rows a power-of-2 multiple of 4 KB apart (2048 floats: a GRU's 64 x 32 steps)
 * those land in one L1 set and are evicted before the stripe beside them fills the rest of
 * the line -- 8 GB/s for a 384 x 2048 copy, where along the rows (8 rows, each written
 * left to right) it is 15 GB/s. Small copies are faster down the columns. The same
 * values either way. */
#define NBI_MM_PACK_ROWWISE (64 * 1024)
#endif

/* nbi_mm_pack_f32x4 with 8x8 blocks of 256-bit vectors (nbi_mm_t8x8), then that function
 * for the columns left over. */
NBI_MM_PACK_ATTR __attribute__((target("avx2"))) void
nbi_mm_pack_f32x8(float *restrict pk, int64_t ldp, const float *restrict s, int64_t rs, int64_t cs,
                  int64_t rows, int64_t cols) {
    int64_t q = 0;
#if NBI_MM_SHUF
    if (rs == 1 && cols >= 8) {
        int64_t q8 = cols - cols % 8, r8 = rows - rows % 8;
        if (rows * cols >= NBI_MM_PACK_ROWWISE) {
            for (int64_t r = 0; r < r8; r += 8) {
                for (int64_t j = 0; j < q8; j += 8) {
                    nbi_mm_t8x8(pk, ldp, s, cs, r, j);
                }
            }
        } else {
            for (int64_t j = 0; j < q8; j += 8) {
                for (int64_t r = 0; r < r8; r += 8) {
                    nbi_mm_t8x8(pk, ldp, s, cs, r, j);
                }
            }
        }
        for (int64_t r = r8; r < rows; r++) {
            for (int64_t j = 0; j < q8; j++) {
                pk[r * ldp + j] = s[r + j * cs];
            }
        }
        q = q8;
    }
#endif
    nbi_mm_pack_f32x4(pk + q, ldp, s + q * cs, rs, cs, rows, cols - q);
}

NBI_MM_SMALL_DEFS(f32x8, float, nbi_f32x8, nbi_mm_pack_f32x8, nbi_mm_dots_f32,
                  __attribute__((target("avx2"))))
NBI_MM_SMALL_DEFS(f64x4, double, nbi_f64x4, nbi_mm_pack_f64x2, nbi_mm_dots_f64,
                  __attribute__((target("avx2"))))

__attribute__((target("avx2"))) static void
nbi_mm_small_f32_avx2(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    nbi_mm_small_f32x8(g, a, b, c, scratch);
}

__attribute__((target("avx2"))) static void
nbi_mm_small_f64_avx2(const nbi_mm_geom *g, const void *a, const void *b, void *c, void *scratch) {
    nbi_mm_small_f64x4(g, a, b, c, scratch);
}
#else
#define NBI_MM_AVX2 0
#endif

#else /* !NBI_MM_VEC: the definition itself, one output at a time */
#define NBI_MM_SMALL_REF_FN(name, T)                                                               \
    static void name(const nbi_mm_geom *g, const void *a_, const void *b_, void *c_,               \
                     void *scratch) {                                                              \
        (void)scratch;                                                                             \
        const T *a = a_, *b = b_;                                                                  \
        T *c = c_;                                                                                 \
        for (int64_t i = 0; i < g->m; i++) {                                                       \
            for (int64_t j = 0; j < g->n; j++) {                                                   \
                T acc = 0;                                                                         \
                for (int64_t p = 0; p < g->k; p++) {                                               \
                    acc = acc + a[i * g->a_rs + p * g->a_cs] * b[p * g->b_rs + j * g->b_cs];       \
                }                                                                                  \
                int64_t o = i * g->c_rs + j;                                                       \
                c[o] = g->acc ? acc + ((const T *)g->cin)[o] : acc;                                \
            }                                                                                      \
        }                                                                                          \
    }
NBI_MM_SMALL_REF_FN(nbi_mm_small_f32, float)
NBI_MM_SMALL_REF_FN(nbi_mm_small_f64, double)
#define NBI_MM_AVX2 0
#endif

/* Which code computes a product, by its dtype and shape alone (never the thread count):
 * nabla's loops for small float products and for every k == 1 product (an outer product:
 * each output is 0 + a[i] b[j], pure memory traffic that BLIS would pack first -- 1000 x
 * 1000 f32 took 71 us through sgemm, 46 through nbi_mm_outer_S), BLIS's gemv for other
 * matrix-vector products, its gemm for the rest. Medians of interleaved runs on one core
 * of this machine (AMD EPYC, Zen 4; BLIS picks its zen3 kernels). */
static bool nbi_mm_is_small(nb_dtype d, const nbi_mm_geom *g) {
    return nb_dtype_is_float(d) && (g->m * g->n * g->k <= NBI_MM_SMALL || g->k == 1);
}

static bool nbi_mm_is_mv(nb_dtype d, const nbi_mm_geom *g) {
    return nb_dtype_is_float(d) && !nbi_mm_is_small(d, g) && (g->m == 1 || g->n == 1);
}

static nbi_mm_fn nbi_mm_fn_of(nb_dtype d, const nbi_mm_geom *g) {
    bool small = nbi_mm_is_small(d, g), mv = nbi_mm_is_mv(d, g);
    if (small && nbi_use_avx2()) {
#if NBI_MM_AVX2
        return d == NB_DTYPE_F32 ? nbi_mm_small_f32_avx2 : nbi_mm_small_f64_avx2;
#endif
    }
    switch (d) {
    case NB_DTYPE_F32:
        return small ? nbi_mm_small_f32 : mv ? nbi_mv_f32 : nbi_mm_f32;
    case NB_DTYPE_F64:
        return small ? nbi_mm_small_f64 : mv ? nbi_mv_f64 : nbi_mm_f64;
    case NB_DTYPE_I32:
        return nbi_mm_i32;
    case NB_DTYPE_I64:
        return nbi_mm_i64;
    default:
        return NULL; /* bool: rejected by inference */
    }
}

/* The work is cut into blocks of rows x cols of the output per batch element (nbi_mm_blocks)
 * -- sizes fixed here by the shapes, never chosen by the thread count -- and each block is
 * one single-threaded BLIS call (or loop of nabla's) on sub-matrices addressed by offsets
 * and strides. The k loop is never split, so each output element is computed by the same
 * code on the same data whatever the number of threads: results are bit-identical. */
#define NBI_MM_ROWS 1024
#define NBI_MM_COLS 256
/* Matrix-vector products whose matrix is read row by row (gemv's dot-product variant; a
 * multiple of its 8-row kernel): blocks of this many outputs, so that 1000 x 1000 runs on
 * two threads. Read column by column (its axpy variant), one block of up to NBI_MM_ROWS:
 * cut into 256-row blocks, 1000 x 1000 f32 went from 47 to 69 us (strided row pieces). */
#define NBI_MV_BLOCK 256
/* Rows per block of an outer product (whole rows: nbi_mm_outer_S streams them). */
#define NBI_MM_OUTER_ROWS 128

/* Columns per block: NBI_MM_COLS, or half that for n <= NBI_MM_COLS so that a product
 * of that width still has two blocks for two threads. Every block is a BLIS call that
 * packs its own panels, so blocks are wide and rows are split only past NBI_MM_ROWS
 * (64-row blocks made a 512x512 f64 product 1.5x slower than one BLIS call). */
static int64_t nbi_mm_cols(int64_t n) {
    return n <= NBI_MM_COLS ? NBI_MM_COLS / 2 : NBI_MM_COLS;
}

static void nbi_mm_blocks(nb_dtype d, const nbi_mm_geom *g, int64_t *rows, int64_t *cols) {
    *rows = NBI_MM_ROWS;
    *cols = nbi_mm_cols(g->n);
    if (nb_dtype_is_float(d) && g->k == 1) {
        *rows = NBI_MM_OUTER_ROWS;
        *cols = g->n;
    } else if (nbi_mm_is_mv(d, g) && g->n == 1) {
        *rows = g->a_cs == 1 ? NBI_MV_BLOCK : NBI_MM_ROWS; /* row-stored a: dot products */
    } else if (nbi_mm_is_mv(d, g)) {
        *cols = g->b_rs == 1 ? NBI_MV_BLOCK : NBI_MM_ROWS; /* b stored transposed: dots */
    }
}

typedef struct nbi_mm_job {
    const nbi_kargs *k;
    nbi_mm_geom g;
    nbi_mm_fn f;
    size_t es;
    bool blis;          /* BLIS computes the product (gemm or gemv) */
    int64_t rows, cols; /* per block (nbi_mm_blocks) */
    int64_t row_blocks, col_blocks;
    size_t scratch_bytes; /* per worker */
    int64_t sa[NB_MAX_RANK], sb[NB_MAX_RANK];
} nbi_mm_job;

/* Accumulation, block by block (see "Accumulation" at the top): out = p + c for the block's
 * product p, rounded as the separate add rounds it, wherever the product comes from.
 *   - BLIS (gemm, gemv) makes the block's product in the output block as usual (beta = 0),
 *     then out += c while the block is in the cache. When the output is c's own buffer (the
 *     memory plan's choice, e.g. a weight gradient summed into a loop's carry step after
 *     step), the block's product is made in the worker's scratch, after the packed
 *     operands, and then added into c: the same operation on the same values. Not beta = 1
 *     into c: BLIS adds C into its micro-tiles with the separate add's rounding in most
 *     shapes but not all -- its kernels for skinny products, k past its 256-deep k-blocks
 *     (where C enters before the last block's sum), gemv over a column-stored matrix (y +=
 *     chunk by chunk) -- and a rewrite of the optimizer must not change results.
 *   - nabla's outer-product loop (float, k == 1) reads c's block and writes the output in
 *     one pass (g->cin), in place or not;
 *   - nabla's other loops (small float products, integers) read the accumulator from the
 *     output block, where c is copied first unless the output is c's own buffer.
 * In place or not, nabla's loops do the same operations on the same values: the same bits. */
static void nbi_mm_acc_copy(const nbi_kargs *k, size_t off, int64_t rows, int64_t cols, int64_t ld,
                            size_t es) {
    if (k->out == k->in[2]) {
        return;
    }
    unsigned char *o = (unsigned char *)k->out + off * es;
    const unsigned char *c = (const unsigned char *)k->in[2] + off * es;
    for (int64_t i = 0; i < rows; i++) {
        memcpy(o + (size_t)(i * ld) * es, c + (size_t)(i * ld) * es, (size_t)cols * es);
    }
}

/* o[i, j] = p[i, j] + c[i, j] over a rows x cols block (row strides ldo, ldp and ldc): the
 * product p plus the accumulator c; o is p (the product made in the output) or c (in
 * place). */
#define NBI_MM_ADD_FN(name, T, ATTR)                                                               \
    ATTR static void name(void *o_, const void *p_, const void *c_, int64_t rows, int64_t cols,    \
                          int64_t ldo, int64_t ldp, int64_t ldc) {                                 \
        for (int64_t i = 0; i < rows; i++) {                                                       \
            T *o = (T *)o_ + i * ldo;                                                              \
            const T *p = (const T *)p_ + i * ldp, *c = (const T *)c_ + i * ldc;                    \
            for (int64_t j = 0; j < cols; j++) {                                                   \
                o[j] = p[j] + c[j];                                                                \
            }                                                                                      \
        }                                                                                          \
    }
NBI_MM_ADD_FN(nbi_mm_add_f32, float, )
NBI_MM_ADD_FN(nbi_mm_add_f64, double, )
/* again with 256-bit vectors on CPUs with AVX2 (the same add per element: the same bits) */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define NBI_MM_ADD_AVX2 1
NBI_MM_ADD_FN(nbi_mm_add_f32_avx2, float, __attribute__((target("avx2"))))
NBI_MM_ADD_FN(nbi_mm_add_f64_avx2, double, __attribute__((target("avx2"))))
#else
#define NBI_MM_ADD_AVX2 0
#endif

typedef void (*nbi_mm_add_fn)(void *, const void *, const void *, int64_t, int64_t, int64_t,
                              int64_t, int64_t);

static nbi_mm_add_fn nbi_mm_add_of(nb_dtype d) {
#if NBI_MM_ADD_AVX2
    if (nbi_use_avx2()) {
        return d == NB_DTYPE_F32 ? nbi_mm_add_f32_avx2 : nbi_mm_add_f64_avx2;
    }
#endif
    return d == NB_DTYPE_F32 ? nbi_mm_add_f32 : nbi_mm_add_f64;
}

/* Operands reach BLIS row-stored. BLIS's order of summation depends on how its operands
 * are stored, not only on the shapes: its kernels for skinny products (the "sup" path, most
 * products of ML sizes) have row- and column-stored variants that sum differently, and so
 * do gemv's two variants. An operand flagged as stored transposed (the transpose-matmul
 * pass) is column-stored, where the same product from a materialised transpose -- the ops
 * run one by one, or without the pass -- is row-stored: the two would differ in the last
 * bits (2 x 32771 @ 32771 x 2 f32 by an ulp; most shapes differ). So a column-stored matrix
 * operand is first copied row-major into the worker's scratch (a transposed copy, the
 * traffic of the transpose the pass saved), and the bits depend on the values and shapes
 * only. A vector operand (m == 1 for a, n == 1 for b) is the same either way. */
static bool nbi_mm_pack_a(const nbi_mm_geom *g) {
    return g->a_cs != 1 && g->m > 1;
}
static bool nbi_mm_pack_b(const nbi_mm_geom *g) {
    return g->b_cs != 1 && g->n > 1;
}

/* The scratch bytes of a block's row-major copies of its column-stored operands (a's, then
 * b's, each rounded up to 64 bytes), as nbi_mm_block lays them out. */
static size_t nbi_mm_pack_bytes(const nbi_mm_geom *g, size_t es) {
    size_t bytes = 0;
    if (nbi_mm_pack_a(g)) {
        bytes += ((size_t)(g->m * g->k) * es + 63) / 64 * 64;
    }
    if (nbi_mm_pack_b(g)) {
        bytes += ((size_t)(g->k * g->n) * es + 63) / 64 * 64;
    }
    return bytes;
}

/* dst[i * cols + j] = src[i * rs + j * cs] for a rows x cols matrix, in 32 x 32 tiles */
static void nbi_mm_pack(void *dst, const void *src, int64_t rows, int64_t cols, int64_t rs,
                        int64_t cs, size_t es) {
#if NBI_MM_VEC
    /* the small products' register-block transposes (8x8 f32 under AVX2) */
    if (es == 4) {
#if NBI_MM_AVX2
        if (nbi_use_avx2()) {
            nbi_mm_pack_f32x8(dst, cols, src, rs, cs, rows, cols);
            return;
        }
#endif
        nbi_mm_pack_f32x4(dst, cols, src, rs, cs, rows, cols);
        return;
    }
    nbi_mm_pack_f64x2(dst, cols, src, rs, cs, rows, cols);
    return;
#endif
    if (rs == 1) { /* column-stored: a transpose, in tiles that read and write along rows */
        nbi_transpose_tiles(dst, cols, src, cs, rows, cols, es);
        return;
    }
    for (int64_t i0 = 0; i0 < rows; i0 += 32) {
        int64_t i1 = i0 + 32 < rows ? i0 + 32 : rows;
        for (int64_t j0 = 0; j0 < cols; j0 += 32) {
            int64_t j1 = j0 + 32 < cols ? j0 + 32 : cols;
            if (es == 4) {
                for (int64_t j = j0; j < j1; j++) {
                    for (int64_t i = i0; i < i1; i++) {
                        ((float *)dst)[i * cols + j] = ((const float *)src)[i * rs + j * cs];
                    }
                }
            } else {
                for (int64_t j = j0; j < j1; j++) {
                    for (int64_t i = i0; i < i1; i++) {
                        ((double *)dst)[i * cols + j] = ((const double *)src)[i * rs + j * cs];
                    }
                }
            }
        }
    }
}

/* One block of the product: sub is its geometry (m, n of the block), a and b its operands,
 * off the element offset of its output (row stride g->n), scratch the worker's. */
static void nbi_mm_block(const nbi_kargs *k, nbi_mm_fn f, bool blis, nbi_mm_geom *sub,
                         const void *a, const void *b, size_t off, void *scratch) {
    nb_dtype d = k->node->dtype;
    size_t es = nb_dtype_size(d);
    size_t packs = blis ? nbi_mm_pack_bytes(sub, es) : 0; /* scratch taken by the copies */
    nbi_mm_geom packed;
    if (blis && (nbi_mm_pack_a(sub) || nbi_mm_pack_b(sub))) {
        packed = *sub;
        unsigned char *s = scratch;
        if (nbi_mm_pack_a(sub)) {
            nbi_mm_pack(s, a, sub->m, sub->k, sub->a_rs, sub->a_cs, es);
            a = s;
            packed.a_rs = sub->k;
            packed.a_cs = 1;
            s += ((size_t)(sub->m * sub->k) * es + 63) / 64 * 64;
        }
        if (nbi_mm_pack_b(sub)) {
            nbi_mm_pack(s, b, sub->k, sub->n, sub->b_rs, sub->b_cs, es);
            b = s;
            packed.b_rs = sub->n;
            packed.b_cs = 1;
        }
        sub = &packed;
    }
    unsigned char *o = (unsigned char *)k->out + off * es;
    int64_t ld = sub->c_rs;
    if (!sub->acc) {
        f(sub, a, b, o, scratch);
        return;
    }
    const unsigned char *c = (const unsigned char *)k->in[2] + off * es;
    if (blis) {
        nbi_mm_geom pg = *sub;
        pg.acc = false;
        unsigned char *p = o;
        if ((const void *)o == (const void *)c) { /* in place: the product into scratch */
            p = (unsigned char *)scratch + packs;
            /* row-stored like the output block: a row stride of 1 (a block one column wide
             * in a wider product) would make BLIS read the block as column-stored and sum
             * in another order -- so at least 2 (test_matmul_accumulate: n = 129, 257) */
            pg.c_rs = sub->n > 1 || ld == 1 ? sub->n : 2;
        }
        f(&pg, a, b, p, scratch);
        nbi_mm_add_of(d)(o, p, c, sub->m, sub->n, ld, pg.c_rs, ld);
    } else if (sub->k == 1 && nb_dtype_is_float(d)) {
        sub->cin = c;
        f(sub, a, b, o, scratch);
    } else {
        nbi_mm_acc_copy(k, off, sub->m, sub->n, ld, es);
        sub->cin = o;
        f(sub, a, b, o, scratch);
    }
}

static void nbi_mm_task(void *ud, int64_t task, int worker) {
    const nbi_mm_job *j = ud;
    const nbi_mm_geom *g = &j->g;
    int64_t per_batch = j->row_blocks * j->col_blocks;
    int64_t t = task / per_batch, rb = (task % per_batch) / j->col_blocks,
            cb = task % j->col_blocks;
    /* the batch element's offsets in a and b (whole matrices), from its multi-index */
    int64_t oa = 0, ob = 0, rest = t;
    for (int d = g->rbat - 1; d >= 0; d--) {
        int64_t i = rest % g->bat[d];
        rest /= g->bat[d];
        oa += i * j->sa[d];
        ob += i * j->sb[d];
    }
    nbi_mm_geom sub = *g;
    int64_t r0 = rb * j->rows, c0 = cb * j->cols;
    sub.m = g->m - r0 < j->rows ? g->m - r0 : j->rows;
    sub.n = g->n - c0 < j->cols ? g->n - c0 : j->cols;
    size_t es = j->es;
    const unsigned char *a = (const unsigned char *)j->k->in[0] +
                             ((size_t)(oa * g->m * g->k) + (size_t)(r0 * g->a_rs)) * es;
    const unsigned char *b = (const unsigned char *)j->k->in[1] +
                             ((size_t)(ob * g->k * g->n) + (size_t)(c0 * g->b_cs)) * es;
    /* no scratch (a product that needs none, or constant folding, which gives none): no
     * offset from a NULL pointer */
    unsigned char *scratch = (unsigned char *)j->k->scratch;
    if (scratch != NULL) {
        scratch += (size_t)worker * j->scratch_bytes;
    }
    size_t off = (size_t)(t * g->m * g->n) + (size_t)(r0 * g->n + c0);
    nbi_mm_block(j->k, j->f, j->blis, &sub, a, b, off, scratch);
}

/* Per worker, for the small-product loops: room for b copied row-major when it is stored
 * transposed (k x the block's columns), then for an f32 a copied transposed when it is not
 * stored so and the last columns do not fill a 256-bit vector (k x the block's rows, at most
 * NBI_MM_APACK elements). k == 1 needs neither: b_cs and a_rs are 1. A function of the
 * shapes only: it covers whichever version (baseline or AVX2, 4 or 8 lanes) runs. */
static size_t nbi_mm_scratch_of(const nbi_mm_geom *g, nb_dtype d) {
    if (!nb_dtype_is_float(d)) {
        return 0;
    }
    if (!nbi_mm_is_small(d, g)) {
        /* BLIS: room for the column-stored operands' copies of the largest block, and when
         * accumulating, for its product (made there when the output is c's buffer) */
        int64_t rows = 0, cols = 0;
        nbi_mm_blocks(d, g, &rows, &cols);
        nbi_mm_geom blk = *g;
        blk.m = g->m < rows ? g->m : rows;
        blk.n = g->n < cols ? g->n : cols;
        size_t es = nb_dtype_size(d), bytes = nbi_mm_pack_bytes(&blk, es);
        if (g->acc) { /* rows at least 2 apart (nbi_mm_block) */
            bytes += ((size_t)(blk.m * (blk.n > 1 ? blk.n : 2)) * es + 63) / 64 * 64;
        }
        return bytes;
    }
    size_t es = nb_dtype_size(d), bytes = 0;
    if (g->b_cs != 1) {
        int64_t cols = g->n < nbi_mm_cols(g->n) ? g->n : nbi_mm_cols(g->n);
        bytes += ((size_t)(g->k * cols) * es + 63) / 64 * 64;
    }
    if (es == 4 && g->a_rs != 1 && g->n % 8 != 0) {
        int64_t rows = g->m < NBI_MM_ROWS ? g->m : NBI_MM_ROWS;
        int64_t elems = g->k * rows < NBI_MM_APACK ? g->k * rows : NBI_MM_APACK;
        bytes += ((size_t)elems * es + 63) / 64 * 64;
    }
    return bytes;
}

static size_t nbi_mm_scratch(const nb_var *node) {
    nbi_mm_geom g;
    if (!nbi_mm_geometry(node, &g)) {
        return 0;
    }
    return nbi_mm_scratch_of(&g, node->dtype);
}

bool nbi_matmul_acc_in_place(const nb_var *node) {
    nbi_mm_geom g;
    if (node->op != NBI_OP_MATMUL || node->n_in != 3 || !nbi_mm_geometry(node, &g)) {
        return false;
    }
    return true; /* BLIS's products too: made in scratch, then added (nbi_mm_block) */
}

/* k == 0: the product is zeros; accumulated, the output is 0 + c (floats: -0 becomes +0, as
 * in add(zeros, c)). */
static void nbi_mm_empty_k(const nbi_kargs *k, size_t es) {
    const nb_var *node = k->node;
    if (node->n_in != 3) {
        memset(k->out, 0, (size_t)node->size * es); /* all-bits-zero is 0 / +0.0 */
        return;
    }
    nbi_mm_acc_copy(k, 0, 1, node->size, 0, es);
    if (node->dtype == NB_DTYPE_F32) {
        float *o = k->out;
        for (int64_t i = 0; i < node->size; i++) {
            o[i] = 0.0f + o[i];
        }
    } else if (node->dtype == NB_DTYPE_F64) {
        double *o = k->out;
        for (int64_t i = 0; i < node->size; i++) {
            o[i] = 0.0 + o[i];
        }
    }
}

static void nbi_k_matmul(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return; /* m, n or a batch dim is 0 */
    }
    nbi_mm_geom g;
    (void)nbi_mm_geometry(node, &g); /* checked by inference */
    size_t es = nb_dtype_size(node->dtype);
    if (g.k == 0) {
        nbi_mm_empty_k(k, es);
        return;
    }
    nbi_mm_fn f = nbi_mm_fn_of(node->dtype, &g);
    if (f == NULL) {
        return;
    }
    bool blis = nb_dtype_is_float(node->dtype) && !nbi_mm_is_small(node->dtype, &g);
    int64_t rows, cols;
    nbi_mm_blocks(node->dtype, &g, &rows, &cols);
    int64_t row_blocks = (g.m + rows - 1) / rows;
    int64_t col_blocks = (g.n + cols - 1) / cols;
    int64_t n_tasks = nbi_shape_size(g.rbat, g.bat) * row_blocks * col_blocks;
    if (n_tasks == 1) {
        /* the one block is the whole product: what nbi_mm_task does for task 0, without
         * setting up a job (small products are dominated by such fixed costs) */
        nbi_mm_block(k, f, blis, &g, k->in[0], k->in[1], 0, k->scratch);
        return;
    }
    const nb_var *x = node->in[0], *y = node->in[1];
    nbi_mm_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    j.es = es;
    j.f = f;
    j.k = k;
    j.blis = blis;
    j.scratch_bytes = nbi_mm_scratch_of(&g, node->dtype);
    nbi_bcast_strides(j.g.ra_bat, x->shape, j.g.rbat, j.g.bat, j.sa);
    nbi_bcast_strides(j.g.rb_bat, y->shape, j.g.rbat, j.g.bat, j.sb);
    j.row_blocks = row_blocks;
    j.rows = rows;
    j.cols = cols;
    j.col_blocks = col_blocks;
    nbi_pool_run(k->pool, n_tasks, nbi_mm_task, &j);
}

/* ---- VJP and JVP rules ---------------------------------------------------------------
 *
 * With A and B the matrices the node multiplies (an operand flagged as stored transposed
 * read through a transpose of its last two axes; a rank-1 a read as [1, k], a rank-1 b as
 * [k, 1]) and C = A @ B over the broadcast batch:
 *   vjp: ct_A = ct @ B^T and ct_B = A^T @ ct, each summed over the batch dims its operand
 *        broadcast (nbi_unbroadcast), then brought back to the operand's stored form (the
 *        promoted dim dropped, a flagged operand transposed back);
 *   jvp: dC = dA @ B + A @ dB (nb_matmul does the promotion itself).
 * Written with the public builders only: the transposes they emit are folded into the
 * products' strides by the optimizer's transpose-matmul pass, as for user code. Integer
 * products never reach these rules (autodiff visits float nodes only). */

/* x with its last two axes swapped (rank >= 2) */
static nb_var *nbi_mm_swap(nb_var *x) {
    int r = nb_var_rank(x), perm[NB_MAX_RANK];
    for (int i = 0; i < r; i++) {
        perm[i] = i;
    }
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    return nb_transpose(x, perm);
}

/* What the node multiplies for operand j (value x of that operand's stored shape): the
 * stored-transposed flag undone and a rank-1 operand promoted to a matrix. */
static nb_var *nbi_mm_operand(const nb_var *node, int j, nb_var *x) {
    if (x == NULL) {
        return NULL;
    }
    if (nbi_mm_trans(node, j)) {
        return nbi_mm_swap(x);
    }
    if (node->in[j]->rank == 1) {
        int64_t k = node->in[j]->shape[0];
        int64_t s[2] = {j == 0 ? 1 : k, j == 0 ? k : 1};
        return nb_reshape(x, 2, s);
    }
    return x;
}

/* The cotangent ctm of operand j's matrix form (batch dims broadcast) back to the operand
 * as stored. */
static nb_var *nbi_mm_back(const nb_var *node, int j, nb_var *ctm) {
    const nb_var *x = node->in[j];
    bool t = nbi_mm_trans(node, j);
    int64_t s[NB_MAX_RANK];
    int r = x->rank;
    if (r == 1) {
        s[0] = j == 0 ? 1 : x->shape[0];
        s[1] = j == 0 ? x->shape[0] : 1;
        r = 2;
    } else {
        memcpy(s, x->shape, (size_t)r * sizeof(int64_t));
        if (t) {
            s[r - 2] = x->shape[r - 1];
            s[r - 1] = x->shape[r - 2];
        }
    }
    nb_var *c = nbi_unbroadcast(ctm, r, s);
    if (t) {
        return nbi_mm_swap(c);
    }
    return nb_reshape(c, x->rank, x->shape); /* drops a promoted dim; no node otherwise */
}

static void nbi_vjp_matmul(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)tr;
    nb_var *a = nbi_mm_operand(node, 0, node->in[0]);
    nb_var *b = nbi_mm_operand(node, 1, node->in[1]);
    /* ct as [batch..., m, n]: the dims a rank-1 operand dropped put back */
    int rbat = node->rank - (node->in[0]->rank >= 2) - (node->in[1]->rank >= 2);
    int64_t s[NB_MAX_RANK];
    memcpy(s, node->shape, (size_t)rbat * sizeof(int64_t));
    s[rbat] = nb_var_dim(a, -2);
    s[rbat + 1] = nb_var_dim(b, -1);
    nb_var *g = nb_reshape(ct, rbat + 2, s);
    in_ct[0] = nbi_mm_back(node, 0, nb_matmul(g, nbi_mm_swap(b)));
    in_ct[1] = nbi_mm_back(node, 1, nb_matmul(nbi_mm_swap(a), g));
    if (node->n_in == 3) {
        in_ct[2] = ct; /* the accumulator is added as it is */
    }
}

static nb_var *nbi_jvp_matmul(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tr;
    nb_var *p = NULL, *q = NULL;
    /* rank-1 operands stay rank 1: nb_matmul promotes them and drops the dims itself */
    nb_var *a = nbi_mm_trans(node, 0) ? nbi_mm_swap(node->in[0]) : node->in[0];
    nb_var *b = nbi_mm_trans(node, 1) ? nbi_mm_swap(node->in[1]) : node->in[1];
    if (tan[0] != NULL) {
        p = nb_matmul(nbi_mm_trans(node, 0) ? nbi_mm_swap(tan[0]) : tan[0], b);
    }
    if (tan[1] != NULL) {
        q = nb_matmul(a, nbi_mm_trans(node, 1) ? nbi_mm_swap(tan[1]) : tan[1]);
    }
    nb_var *t = p && q ? nb_add(p, q) : p ? p : q;
    if (node->n_in == 3 && tan[2] != NULL) {
        t = t != NULL ? nb_add(t, tan[2]) : tan[2];
    }
    return t;
}

/* ---- batching ------------------------------------------------------------------------
 * Lanes of a against one matrix b -- per-example activations times a shared weight, the
 * common case -- become ONE product over every lane's rows ([B * ..., k] @ [k, n]: a single
 * BLIS call, no copies); otherwise the lanes are batch dims of numpy matmul (vectors
 * promoted, the batched operand lifted so that the batch axis lines up). A lane's result is
 * then a row block of a larger product: BLIS may block it differently from the unbatched
 * one, so lanes agree to rounding (a few ulp), not always bit for bit (test_vmap.c). */
static nb_var *nbi_vmap_matmul(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    nb_var *a = node->in[0], *b = node->in[1];
    int ra = a->rank, rb = b->rank;
    int64_t k = a->shape[ra - (nbi_mm_trans(node, 0) ? 2 : 1)], shape[NB_MAX_RANK];
    if (node->rank + 1 > NB_MAX_RANK || ra + 2 > NB_MAX_RANK || rb + 2 > NB_MAX_RANK) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_vmap: a batched matmul beyond the maximum rank %d", NB_MAX_RANK);
    }
    shape[0] = B;
    memcpy(shape + 1, node->shape, (size_t)node->rank * sizeof *shape);
    /* the same op with the operands' stored-transposed flags (at.axes[0..1]; they apply to
     * an operand's last two dims, which lifting keeps), cleared for a promoted vector */
    nbi_attrs at = node->at;
    nb_var *r;
    if (bin[1] == NULL && rb == 2 && !nbi_mm_trans(node, 0)) {
        int64_t rows = B;
        for (int d = 0; d < ra - 1; d++) {
            rows *= a->shape[d];
        }
        at.axes[0] = 0;
        nb_var *in[2] = {nb_reshape(bin[0], 2, (int64_t[]){rows, k}), b};
        r = nbi_emit(tr, NBI_OP_MATMUL, 2, in, &at);
    } else {
        nb_var *A = bin[0] != NULL ? bin[0] : a, *M = bin[1] != NULL ? bin[1] : b;
        if (ra == 1) {
            A = bin[0] != NULL ? nb_reshape(A, 3, (int64_t[]){B, 1, k})
                               : nb_reshape(A, 2, (int64_t[]){1, k});
            at.axes[0] = 0;
        }
        if (rb == 1) {
            M = bin[1] != NULL ? nb_reshape(M, 3, (int64_t[]){B, k, 1})
                               : nb_reshape(M, 2, (int64_t[]){k, 1});
            at.axes[1] = 0;
        }
        int R = (ra > 2 ? ra : 2) > (rb > 2 ? rb : 2) ? (ra > 2 ? ra : 2) : (rb > 2 ? rb : 2);
        if (bin[0] != NULL) {
            A = nbi_vmap_lift(A, R);
        }
        if (bin[1] != NULL) {
            M = nbi_vmap_lift(M, R);
        }
        nb_var *in[2] = {A, M};
        r = nbi_emit(tr, NBI_OP_MATMUL, 2, in, &at);
    }
    r = nb_reshape(r, node->rank + 1, shape);
    if (node->n_in == 3) {
        r = nb_add(r, bin[2] != NULL ? nbi_vmap_lift(bin[2], node->rank) : node->in[2]);
    }
    return r;
}

/* ---- registry entries --------------------------------------------------------------- */

const nbi_op_info nbi_opinfo_matmul = {.name = "matmul",
                                       .n_in = -1, /* 2, or 3 accumulating */
                                       .infer = nbi_infer_matmul,
                                       .kernel = nbi_k_matmul,
                                       .scratch = nbi_mm_scratch,
                                       .vjp = nbi_vjp_matmul,
                                       .jvp = nbi_jvp_matmul,
                                       .vmap = nbi_vmap_matmul};
