/*
 * op_decomp.c -- linear algebra with derivatives: LU with partial pivoting and its solves,
 * the general solve, Cholesky and its solve, triangular solves and slogdet (nabla/linalg.h),
 * batched over leading dims.
 *
 * The ops (one output each, like every op):
 *   lu_factor(A)         [..., n+1, n]: rows 0..n-1 the packed factors of PA = LU (L unit
 *                        lower strictly below the diagonal, U upper), row n the permutation
 *                        p as values of A's dtype (row i of PA is row p[i] of A)
 *   lu_solve(M, b)       A^{-1} b, or A^{-T} b (flag TRANS), from packed factors M
 *   solve(A, M, b)       A^{-1} b computed from M = lu_factor(A); the kernel reads M and b,
 *                        A is an operand for the derivatives only (dA = -lambda x^T, with
 *                        A^T lambda = g solved from the same M: the factorisation is made
 *                        once and reused by the reverse pass)
 *   cholesky(A)          L, lower with zeros above, of (A + A^T) / 2 (as JAX symmetrises)
 *   cholesky_solve(L, b) (L L^T)^{-1} b, reading L's lower triangle
 *   triangular_solve(T, b)  op(T)^{-1} b for T's lower or upper triangle (flags LOWER,
 *                        TRANS, UNIT: the diagonal taken as ones and not read)
 *   slogdet(A, M)        [..., 2]: (sign, log|det A|) from M = lu_factor(A); A again for
 *                        the derivative (d log|det A| = tr(A^{-1} dA))
 * A right-hand side b is [..., n] (flag VEC: a vector per matrix) or [..., n, k]. Its batch
 * dims are the result's; the matrix operand's batch dims broadcast to them (a matrix solved
 * against a batch of right-hand sides is factored once). The builders decide VEC and
 * broadcast b (nabla/linalg.h).
 *
 * Failure is a value, never a crash: a zero or non-finite pivot makes lu_solve's and
 * solve's whole solution NaN (and slogdet (0, -inf) or NaN), a matrix that is not positive
 * definite makes cholesky's whole factor NaN, and a zero diagonal does the same to
 * cholesky_solve and triangular_solve; nb_lu_singular reports it as a bool per matrix.
 *
 * Derivatives are the adjoint formulas, never the factorisation's loops differentiated:
 *   solve:      lambda = A^{-T} g, ct_A = -lambda x^T, ct_b = lambda; dx = A^{-1}(db - dA x)
 *   lu_factor:  with F = tril(L^T Lbar, -1) + triu(Ubar U^T), ct_A = P^T L^{-T} F U^{-T};
 *               dL = L tril(G, -1), dU = triu(G) U for G = L^{-1} P dA U^{-1}
 *               (S. Walter, "Structured higher-order algorithmic differentiation", 2011;
 *               M. Seeger et al., "Auto-differentiating linear algebra", 2017)
 *   cholesky:   with Phi the lower triangle with its diagonal halved, dL = L Phi(L^{-1} dS
 *               L^{-T}) for dS = sym(dA); ct_A = sym(L^{-T} Phi(L^T Lbar) L^{-1})
 *               (I. Murray, "Differentiation of the Cholesky decomposition", 2016)
 *   triangular and Cholesky solves, lu_solve: as solve with A = op(T), L L^T, P^T L U,
 *               the matrix cotangent projected onto the operand's stored triangle(s)
 *   slogdet:    ct_A = ct_logabs A^{-T}; the sign has none.
 * Each rule is written with the public builders and these ops, so it is traced, fused and
 * differentiated again like user code.
 *
 * Kernels (op_decomp.inc, f32 and f64): unblocked loops up to n = 128 (an LU of n = 16 is
 * ~1.4k flops: BLIS's packing would cost more than the arithmetic), right-looking panels of
 * 64 columns on BLIS's trsm and gemm past that; substitution by loops up to n = 32, by
 * BLIS's trsv/trsm beyond. Batch elements run on the context's threads; one large matrix
 * runs its trailing updates there in fixed column blocks. Bit-identical for any thread
 * count (tests/ad/test_ops_decomp.c).
 */
#include "ad/ir.h"
#include "nabla/linalg.h"

#include <blis.h>
#include <math.h>
#include <string.h>

/* flags in at.ivalue */
enum { NBD_TRANS = 1, NBD_VEC = 2, NBD_LOWER = 4, NBD_UNIT = 8 };

#define NBD_SUBST_SMALL 32 /* substitution by loops up to this n */
#define NBD_LU_SMALL 128   /* unblocked factorisations up to this n */
#define NBD_LU_PANEL 64    /* panel width past it */
#define NBD_GEMM_COLS 256  /* trailing-update column block (a task) */

#define T float
#define NBD(name) name##_f32
#define BLIS_GEMM bli_sgemm_ex
#define BLIS_TRSM bli_strsm_ex
#define BLIS_TRSV bli_strsv_ex
#include "op_decomp.inc"
#undef T
#undef NBD
#undef BLIS_GEMM
#undef BLIS_TRSM
#undef BLIS_TRSV
#define T double
#define NBD(name) name##_f64
#define BLIS_GEMM bli_dgemm_ex
#define BLIS_TRSM bli_dtrsm_ex
#define BLIS_TRSV bli_dtrsv_ex
#include "op_decomp.inc"
#undef T
#undef NBD
#undef BLIS_GEMM
#undef BLIS_TRSM
#undef BLIS_TRSV

/* ---- geometry ------------------------------------------------------------------------ */

/* A solve-like node: the matrix operand (index mi: its last two dims are [n(+1), n]), the
 * right-hand side (index bi) and the result, whose batch dims are b's. */
typedef struct nbd_geom {
    int64_t n, k;
    int rbat;                  /* the result's batch rank */
    int64_t bat[NB_MAX_RANK];  /* its batch dims */
    int64_t mstr[NB_MAX_RANK]; /* the matrix operand's batch strides (in matrices) */
    int64_t nbat;              /* number of batch elements */
    int64_t msize;             /* elements per matrix of the operand */
} nbd_geom;

static void nbd_geometry(const nb_var *node, int mi, int bi, nbd_geom *g) {
    const nb_var *m = node->in[mi], *b = node->in[bi];
    bool vec = (node->at.ivalue & NBD_VEC) != 0;
    g->n = m->shape[m->rank - 1];
    g->k = vec ? 1 : b->shape[b->rank - 1];
    g->rbat = b->rank - (vec ? 1 : 2);
    memcpy(g->bat, b->shape, (size_t)g->rbat * sizeof(int64_t));
    nbi_bcast_strides(m->rank - 2, m->shape, g->rbat, g->bat, g->mstr);
    g->nbat = nbi_shape_size(g->rbat, g->bat);
    g->msize = m->shape[m->rank - 2] * m->shape[m->rank - 1];
}

/* The matrix operand's element offset for batch element t. */
static int64_t nbd_moff(const nbd_geom *g, int64_t t) {
    int64_t off = 0;
    for (int d = g->rbat - 1; d >= 0; d--) {
        off += (t % g->bat[d]) * g->mstr[d];
        t /= g->bat[d];
    }
    return off * g->msize;
}

/* ---- shape inference ----------------------------------------------------------------- */

static const char *const NBD_FN[] = {"lu_factor",      "lu_solve",         "solve",  "cholesky",
                                     "cholesky_solve", "triangular_solve", "slogdet"};

static const char *nbd_fn(const nb_var *p) {
    switch ((nbi_op)p->op) {
    case NBI_OP_LU_FACTOR:
        return NBD_FN[0];
    case NBI_OP_LU_SOLVE:
        return NBD_FN[1];
    case NBI_OP_SOLVE:
        return NBD_FN[2];
    case NBI_OP_CHOLESKY:
        return NBD_FN[3];
    case NBI_OP_CHOLESKY_SOLVE:
        return NBD_FN[4];
    case NBI_OP_TRI_SOLVE:
        return NBD_FN[5];
    default:
        return NBD_FN[6];
    }
}

/* x is a float stack of square matrices (packed: of [n+1, n] factors). */
static nb_status nbd_check_matrix(nb_trace *tr, const char *fn, const nb_var *x, bool packed,
                                  const char *what) {
    char s[NBI_SIG_CAP];
    if (!nb_dtype_is_float(x->dtype)) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_%s: %s is %s; linear algebra needs f32 or f64 (nb_cast it)", fn,
                             what, nbi_var_sig(s, sizeof s, x));
    }
    if (x->rank < 2 || x->shape[x->rank - 2] != x->shape[x->rank - 1] + (packed ? 1 : 0)) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             packed ? "nb_%s: %s is %s; packed LU factors are [..., n+1, n] "
                                      "(pass what nb_lu_factor returned)"
                                    : "nb_%s: %s is %s; it must be a square matrix or a stack "
                                      "of them, [..., n, n]",
                             fn, what, nbi_var_sig(s, sizeof s, x));
    }
    if (x->dtype == NB_DTYPE_F32 && x->shape[x->rank - 1] > (1 << 24)) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_%s: %s is %s; f32 factors hold row indices exactly only up to "
                             "n = 2^24 (use f64)",
                             fn, what, nbi_var_sig(s, sizeof s, x));
    }
    return NB_OK;
}

/* Inputs: matrix operand mi (packed or not), right-hand side bi; the result is b's. */
static nb_status nbd_infer_solve_like(nb_trace *tr, nb_var *p, int mi, int bi, bool packed) {
    const nb_var *m = p->in[mi], *b = p->in[bi];
    nb_status st = nbd_check_matrix(tr, nbd_fn(p), m, packed, "the matrix");
    if (st != NB_OK) {
        return st;
    }
    char sm[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    bool vec = (p->at.ivalue & NBD_VEC) != 0;
    int64_t n = m->shape[m->rank - 1];
    int rb = b->rank - (vec ? 1 : 2);
    if (b->dtype != m->dtype || rb < 0 || b->shape[rb] != n) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_%s: matrix %s and right-hand side %s: b must be [..., %lld] or "
                             "[..., %lld, k] of the matrix's dtype",
                             nbd_fn(p), nbi_var_sig(sm, sizeof sm, m),
                             nbi_var_sig(sb, sizeof sb, b), (long long)n, (long long)n);
    }
    int r = 0;
    int64_t bs[NB_MAX_RANK];
    bool ok = nbi_broadcast_shapes(m->rank - 2, m->shape, rb, b->shape, &r, bs) && r == rb &&
              memcmp(bs, b->shape, (size_t)rb * sizeof(int64_t)) == 0;
    if (!ok) {
        return nbi_trace_err(tr, NB_ERR_SHAPE,
                             "nb_%s: matrix %s and right-hand side %s: the matrix's batch dims "
                             "must broadcast to the right-hand side's",
                             nbd_fn(p), nbi_var_sig(sm, sizeof sm, m),
                             nbi_var_sig(sb, sizeof sb, b));
    }
    p->dtype = b->dtype;
    p->rank = b->rank;
    memcpy(p->shape, b->shape, (size_t)b->rank * sizeof(int64_t));
    return NB_OK;
}

static nb_status nbd_infer_lu_factor(nb_trace *tr, nb_var *p) {
    const nb_var *a = p->in[0];
    nb_status st = nbd_check_matrix(tr, nbd_fn(p), a, false, "the matrix");
    if (st != NB_OK) {
        return st;
    }
    p->dtype = a->dtype;
    p->rank = a->rank;
    memcpy(p->shape, a->shape, (size_t)a->rank * sizeof(int64_t));
    p->shape[a->rank - 2] += 1;
    return NB_OK;
}

static nb_status nbd_infer_lu_solve(nb_trace *tr, nb_var *p) {
    return nbd_infer_solve_like(tr, p, 0, 1, true);
}

/* solve(A, M, b) and slogdet(A, M): M must be A's factors (same dtype and batch). */
static nb_status nbd_check_pair(nb_trace *tr, nb_var *p) {
    const nb_var *a = p->in[0], *m = p->in[1];
    nb_status st = nbd_check_matrix(tr, nbd_fn(p), a, false, "the matrix");
    if (st != NB_OK) {
        return st;
    }
    bool same = m->dtype == a->dtype && m->rank == a->rank &&
                memcmp(m->shape, a->shape, (size_t)(a->rank - 2) * sizeof(int64_t)) == 0 &&
                m->shape[a->rank - 2] == a->shape[a->rank - 2] + 1 &&
                m->shape[a->rank - 1] == a->shape[a->rank - 1];
    if (!same) {
        char sa[NBI_SIG_CAP], sm[NBI_SIG_CAP];
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_%s: factors %s do not belong to %s",
                             nbd_fn(p), nbi_var_sig(sm, sizeof sm, m),
                             nbi_var_sig(sa, sizeof sa, a));
    }
    return NB_OK;
}

static nb_status nbd_infer_solve(nb_trace *tr, nb_var *p) {
    nb_status st = nbd_check_pair(tr, p);
    return st != NB_OK ? st : nbd_infer_solve_like(tr, p, 1, 2, true);
}

static nb_status nbd_infer_cholesky(nb_trace *tr, nb_var *p) {
    const nb_var *a = p->in[0];
    nb_status st = nbd_check_matrix(tr, nbd_fn(p), a, false, "the matrix");
    if (st != NB_OK) {
        return st;
    }
    p->dtype = a->dtype;
    p->rank = a->rank;
    memcpy(p->shape, a->shape, (size_t)a->rank * sizeof(int64_t));
    return NB_OK;
}

static nb_status nbd_infer_tri(nb_trace *tr, nb_var *p) {
    return nbd_infer_solve_like(tr, p, 0, 1, false);
}

static nb_status nbd_infer_slogdet(nb_trace *tr, nb_var *p) {
    nb_status st = nbd_check_pair(tr, p);
    if (st != NB_OK) {
        return st;
    }
    const nb_var *a = p->in[0];
    p->dtype = a->dtype;
    p->rank = (int8_t)(a->rank - 1);
    memcpy(p->shape, a->shape, (size_t)(a->rank - 2) * sizeof(int64_t));
    p->shape[a->rank - 2] = 2;
    return NB_OK;
}

/* ---- kernels ------------------------------------------------------------------------- */

typedef struct nbd_job {
    const nbi_kargs *k;
    nbd_geom g;
    int mi, bi;
    size_t scratch_bytes; /* per worker */
} nbd_job;

/* One batch element of a factorisation node (lu_factor, cholesky: the matrix is in[0]). */
static void nbd_factor_task(void *ud, int64_t t, int worker) {
    (void)worker;
    const nbd_job *j = ud;
    const nb_var *node = j->k->node;
    int64_t n = node->shape[node->rank - 1];
    size_t es = nb_dtype_size(node->dtype);
    const unsigned char *a = (const unsigned char *)j->k->in[0] + (size_t)(t * n * n) * es;
    unsigned char *o = (unsigned char *)j->k->out + (size_t)(t * (node->size / j->g.nbat)) * es;
    nbi_pool *pool = j->g.nbat == 1 ? j->k->pool : NULL;
    bool f32 = node->dtype == NB_DTYPE_F32;
    if (node->op == NBI_OP_LU_FACTOR) {
        memcpy(o, a, (size_t)(n * n) * es);
        if (f32) {
            nbd_lu_f32((float *)o, (float *)o + n * n, n, pool);
        } else {
            nbd_lu_f64((double *)o, (double *)o + n * n, n, pool);
        }
    } else if (f32) {
        nbd_chol_f32((const float *)a, (float *)o, n, pool);
    } else {
        nbd_chol_f64((const double *)a, (double *)o, n, pool);
    }
}

static void nbd_factor_kernel(const nbi_kargs *k) {
    const nb_var *node = k->node, *a = node->in[0];
    if (node->size == 0) {
        return;
    }
    nbd_job j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.g.nbat = nbi_shape_size(a->rank - 2, a->shape);
    if (j.g.nbat == 1) {
        nbd_factor_task(&j, 0, 0);
    } else {
        nbi_pool_run(k->pool, j.g.nbat, nbd_factor_task, &j);
    }
}

/* One batch element of a solve-like node. */
static void nbd_solve_task(void *ud, int64_t t, int worker) {
    const nbd_job *j = ud;
    const nbi_kargs *k = j->k;
    const nb_var *node = k->node;
    const nbd_geom *g = &j->g;
    size_t es = nb_dtype_size(node->dtype);
    int64_t nk = g->n * g->k;
    const unsigned char *m = (const unsigned char *)k->in[j->mi] + (size_t)nbd_moff(g, t) * es;
    const unsigned char *b = (const unsigned char *)k->in[j->bi] + (size_t)(t * nk) * es;
    unsigned char *x = (unsigned char *)k->out + (size_t)(t * nk) * es;
    void *w =
        k->scratch != NULL ? (unsigned char *)k->scratch + (size_t)worker * j->scratch_bytes : NULL;
    int64_t fl = node->at.ivalue;
    bool trans = (fl & NBD_TRANS) != 0, lower = (fl & NBD_LOWER) != 0, unit = (fl & NBD_UNIT) != 0;
    bool f32 = node->dtype == NB_DTYPE_F32;
    switch ((nbi_op)node->op) {
    case NBI_OP_LU_SOLVE:
    case NBI_OP_SOLVE:
        if (f32) {
            nbd_lu_solve_f32((const float *)m, g->n, (const float *)b, (float *)x, g->k, trans, w);
        } else {
            nbd_lu_solve_f64((const double *)m, g->n, (const double *)b, (double *)x, g->k, trans,
                             w);
        }
        break;
    case NBI_OP_CHOLESKY_SOLVE:
        if (f32) {
            nbd_chol_solve_f32((const float *)m, g->n, (const float *)b, (float *)x, g->k);
        } else {
            nbd_chol_solve_f64((const double *)m, g->n, (const double *)b, (double *)x, g->k);
        }
        break;
    default: /* triangular_solve */
        if (f32) {
            nbd_tri_solve_f32((const float *)m, g->n, (const float *)b, (float *)x, g->k, lower,
                              trans, unit);
        } else {
            nbd_tri_solve_f64((const double *)m, g->n, (const double *)b, (double *)x, g->k, lower,
                              trans, unit);
        }
        break;
    }
}

static size_t nbd_solve_scratch(const nb_var *node) {
    if ((node->op != NBI_OP_LU_SOLVE && node->op != NBI_OP_SOLVE) ||
        !(node->at.ivalue & NBD_TRANS)) {
        return 0;
    }
    nbd_geom g;
    nbd_geometry(node, node->op == NBI_OP_SOLVE ? 1 : 0, node->op == NBI_OP_SOLVE ? 2 : 1, &g);
    return (size_t)(g.n * g.k) * nb_dtype_size(node->dtype);
}

static void nbd_solve_kernel(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return;
    }
    nbd_job j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.mi = node->op == NBI_OP_SOLVE ? 1 : 0;
    j.bi = j.mi + 1;
    nbd_geometry(node, j.mi, j.bi, &j.g);
    j.scratch_bytes = (nbd_solve_scratch(node) + 63) / 64 * 64;
    if (j.g.nbat == 1) {
        nbd_solve_task(&j, 0, 0);
    } else {
        nbi_pool_run(k->pool, j.g.nbat, nbd_solve_task, &j);
    }
}

static void nbd_slogdet_kernel(const nbi_kargs *k) {
    const nb_var *node = k->node, *m = node->in[1];
    int64_t n = m->shape[m->rank - 1], nbat = node->size / 2;
    size_t es = nb_dtype_size(node->dtype);
    for (int64_t t = 0; t < nbat; t++) {
        const unsigned char *mt = (const unsigned char *)k->in[1] + (size_t)(t * (n + 1) * n) * es;
        unsigned char *o = (unsigned char *)k->out + (size_t)(2 * t) * es;
        if (node->dtype == NB_DTYPE_F32) {
            nbd_slogdet_f32((const float *)mt, n, (float *)o);
        } else {
            nbd_slogdet_f64((const double *)mt, n, (double *)o);
        }
    }
}

/* ---- helpers for the rules (public builders only) ------------------------------------ */

static nb_var *nbd_mT(nb_var *x) { /* the last two axes swapped */
    int r = nb_var_rank(x), perm[NB_MAX_RANK];
    if (x == NULL || r < 2) { /* NULL after an allocation failure (the trace has the error) */
        return x;
    }
    for (int i = 0; i < r; i++) {
        perm[i] = i;
    }
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    return nb_transpose(x, perm);
}

/* A bool [n, n] mask: lower (row > col, or >= with the diagonal) or upper. */
static nb_var *nbd_mask(nb_trace *tr, int64_t n, bool lower, bool diag) {
    int64_t s[2] = {n, n};
    nb_var *r = nb_iota(tr, NB_DTYPE_I32, 2, s, 0), *c = nb_iota(tr, NB_DTYPE_I32, 2, s, 1);
    if (lower) {
        return diag ? nb_ge(r, c) : nb_gt(r, c);
    }
    return diag ? nb_le(r, c) : nb_lt(r, c);
}

static nb_var *nbd_keep(nb_var *mask, nb_var *x) {
    return nb_select(mask, x, nb_scalar(nb_var_trace(x), 0.0));
}

static nb_var *nbd_eye(nb_trace *tr, nb_dtype dt, int64_t n) {
    int64_t s[2] = {n, n};
    return nb_cast(nb_eq(nb_iota(tr, NB_DTYPE_I32, 2, s, 0), nb_iota(tr, NB_DTYPE_I32, 2, s, 1)),
                   dt);
}

/* rows 0..n-1 of packed factors (L\U) */
static nb_var *nbd_top(nb_var *m) {
    int r = nb_var_rank(m);
    if (m == NULL || r < 2) { /* after an allocation failure (the trace has the error) */
        return NULL;
    }
    int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
    memcpy(stop, nb_var_shape(m), (size_t)r * sizeof(int64_t));
    stop[r - 2] -= 1;
    return nb_slice(m, start, stop, NULL);
}

/* the permutation row of packed factors as i32 [..., n, 1] */
static nb_var *nbd_perm(nb_var *m) {
    int r = nb_var_rank(m);
    if (m == NULL || r < 2) {
        return NULL;
    }
    const int64_t *sh = nb_var_shape(m);
    int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK], s[NB_MAX_RANK];
    memcpy(stop, sh, (size_t)r * sizeof(int64_t));
    start[r - 2] = sh[r - 2] - 1;
    nb_var *p = nb_cast(nb_slice(m, start, stop, NULL), NB_DTYPE_I32);
    memcpy(s, sh, (size_t)r * sizeof(int64_t));
    s[r - 2] = sh[r - 1];
    s[r - 1] = 1;
    return nb_reshape(p, r, s);
}

/* y[..., i, :] = x[..., p[i], :] for x [..., n, c] (p's batch broadcast to x's) */
static nb_var *nbd_rows(nb_var *x, nb_var *p) {
    return nb_take_along_axis(x, nb_broadcast_to(p, nb_var_rank(x), nb_var_shape(x)), -2);
}

/* y[..., p[i], :] = x[..., i, :]: rows taken by the inverse permutation q (q[p[i]] = i) */
static nb_var *nbd_rows_inv(nb_var *x, nb_var *p) {
    nb_trace *tr = nb_var_trace(x);
    int r = nb_var_rank(p);
    if (x == NULL || p == NULL || r < 2) {
        return NULL;
    }
    int64_t n = nb_var_dim(p, -2), s[2] = {1, n};
    nb_var *hit = nb_cast(nb_eq(p, nb_iota(tr, NB_DTYPE_I32, 2, s, 1)), NB_DTYPE_I32);
    nb_var *q = nb_expand_dims(nb_argmax(hit, r - 2, false), -1); /* [..., n, 1] */
    return nbd_rows(x, nb_cast(q, NB_DTYPE_I32));
}

static nb_var *nbd_emit(nbi_op op, int n_in, nb_var *const *in, int64_t flags) {
    nb_trace *tr = nb_var_trace(in[0]);
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.ivalue = flags;
    return nbi_emit(tr, op, n_in, in, &at);
}

static nb_var *nbd_tri(nb_var *t, nb_var *b, bool lower, bool trans, bool unit) {
    return nbd_emit(NBI_OP_TRI_SOLVE, 2, (nb_var *[]){t, b},
                    (lower ? NBD_LOWER : 0) | (trans ? NBD_TRANS : 0) | (unit ? NBD_UNIT : 0));
}

/* A right-hand side or result in matrix form [..., n, k] (a VEC one gets k = 1), and back. */
static nb_var *nbd_as_mat(const nb_var *node, nb_var *x) {
    return (node->at.ivalue & NBD_VEC) ? nb_expand_dims(x, -1) : x;
}
static nb_var *nbd_from_mat(const nb_var *node, nb_var *x) {
    return (node->at.ivalue & NBD_VEC) ? nb_squeeze(x, (int[]){-1}, 1) : x;
}

/* -lambda x^T (or -x lambda^T for a transposed solve): the cotangent of the matrix a solve
 * node (result x, right-hand-side cotangent lambda) solved with, in matrix form. */
static nb_var *nbd_abar(const nb_var *node, nb_var *lam, bool trans) {
    nb_var *lm = nbd_as_mat(node, lam), *xm = nbd_as_mat(node, (nb_var *)node);
    return nb_neg(trans ? nb_matmul(xm, nbd_mT(lm)) : nb_matmul(lm, nbd_mT(xm)));
}

/* A cotangent of the matrix operand's shape (batch dims unbroadcast). */
static nb_var *nbd_unbcast(nb_var *ct, const nb_var *operand) {
    return nbi_unbroadcast(ct, operand->rank, operand->shape);
}

/* The cotangent of packed factors M (of A = P^T L U) from a cotangent Abar of A:
 * Lbar = tril(P Abar U^T, -1), Ubar = triu(L^T P Abar); the permutation row gets zero. */
static nb_var *nbd_lu_mbar(nb_trace *tr, nb_var *m, nb_var *abar) {
    int64_t n = nb_var_dim(m, -1);
    nb_var *top = nbd_top(m);
    nb_var *u = nbd_keep(nbd_mask(tr, n, false, true), top);
    nb_var *l =
        nb_add(nbd_keep(nbd_mask(tr, n, true, false), top), nbd_eye(tr, nb_var_dtype(m), n));
    nb_var *pa = nbd_rows(abar, nbd_perm(m));
    nb_var *lbar = nbd_keep(nbd_mask(tr, n, true, false), nb_matmul(pa, nbd_mT(u)));
    nb_var *ubar = nbd_keep(nbd_mask(tr, n, false, true), nb_matmul(nbd_mT(l), pa));
    int r = nb_var_rank(abar);
    if (abar == NULL || r < 2) {
        return NULL;
    }
    int64_t lo[NB_MAX_RANK] = {0}, hi[NB_MAX_RANK] = {0};
    hi[r - 2] = 1;
    return nb_pad(nb_add(lbar, ubar), lo, hi, 0.0);
}

/* ---- VJP and JVP rules --------------------------------------------------------------- */

/* solve(A, M, b) */
static void nbd_vjp_solve(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)tr;
    nb_var *m = node->in[1];
    nb_var *lam = nbd_emit(NBI_OP_LU_SOLVE, 2, (nb_var *[]){m, ct}, node->at.ivalue | NBD_TRANS);
    in_ct[2] = lam;
    in_ct[0] = nbd_unbcast(nbd_abar(node, lam, false), node->in[0]);
}

static nb_var *nbd_jvp_solve(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tr;
    nb_var *r = tan[2];
    if (tan[0] != NULL) {
        nb_var *ax = nbd_from_mat(node, nb_matmul(tan[0], nbd_as_mat(node, node)));
        r = r != NULL ? nb_sub(r, ax) : nb_neg(ax);
    }
    if (r == NULL) {
        return NULL;
    }
    int64_t fl = node->at.ivalue & ~(int64_t)NBD_TRANS;
    return nbd_emit(NBI_OP_LU_SOLVE, 2, (nb_var *[]){node->in[1], r}, fl);
}

/* lu_solve(M, b): x = A^{-1} b or A^{-T} b with A = P^T L U */
static void nbd_vjp_lu_solve(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    nb_var *m = node->in[0];
    bool trans = (node->at.ivalue & NBD_TRANS) != 0;
    nb_var *lam = nbd_emit(NBI_OP_LU_SOLVE, 2, (nb_var *[]){m, ct}, node->at.ivalue ^ NBD_TRANS);
    in_ct[1] = lam;
    in_ct[0] = nbd_unbcast(nbd_lu_mbar(tr, m, nbd_abar(node, lam, trans)), m);
}

static nb_var *nbd_jvp_lu_solve(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    nb_var *m = node->in[0];
    bool trans = (node->at.ivalue & NBD_TRANS) != 0;
    nb_var *dx = tan[1] != NULL
                     ? nbd_emit(NBI_OP_LU_SOLVE, 2, (nb_var *[]){m, tan[1]}, node->at.ivalue)
                     : NULL;
    if (tan[0] == NULL) {
        return dx;
    }
    int64_t n = nb_var_dim(m, -1);
    nb_var *top = nbd_top(m), *dtop = nbd_top(tan[0]);
    nb_var *dl = nbd_keep(nbd_mask(tr, n, true, false), dtop);
    nb_var *du = nbd_keep(nbd_mask(tr, n, false, true), dtop);
    nb_var *xm = nbd_as_mat(node, node), *r;
    if (!trans) {
        /* dx = -U^{-1} (L^{-1} dL (U x) + dU x) */
        nb_var *u = nbd_keep(nbd_mask(tr, n, false, true), top);
        nb_var *s = nbd_tri(top, nb_matmul(dl, nb_matmul(u, xm)), true, false, true);
        r = nb_neg(nbd_tri(top, nb_add(s, nb_matmul(du, xm)), false, false, false));
    } else {
        /* w = P x; dx = -P^T L^{-T} (dL^T w + U^{-T} dU^T (L^T w)) */
        nb_var *l =
            nb_add(nbd_keep(nbd_mask(tr, n, true, false), top), nbd_eye(tr, nb_var_dtype(m), n));
        nb_var *p = nbd_perm(m);
        nb_var *w = nbd_rows(xm, p);
        nb_var *y = nb_matmul(nbd_mT(l), w);
        nb_var *s = nbd_tri(top, nb_matmul(nbd_mT(du), y), false, true, false);
        s = nb_add(s, nb_matmul(nbd_mT(dl), w));
        r = nb_neg(nbd_rows_inv(nbd_tri(top, s, true, true, true), p));
    }
    r = nbd_from_mat(node, r);
    return dx != NULL ? nb_add(dx, r) : r;
}

/* lu_factor(A) */
static void nbd_vjp_lu_factor(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    int64_t n = nb_var_dim(node, -1);
    nb_var *top = nbd_top(node), *cbar = nbd_top(ct);
    nb_var *u = nbd_keep(nbd_mask(tr, n, false, true), top);
    nb_var *l =
        nb_add(nbd_keep(nbd_mask(tr, n, true, false), top), nbd_eye(tr, nb_var_dtype(node), n));
    nb_var *lbar = nbd_keep(nbd_mask(tr, n, true, false), cbar);
    nb_var *ubar = nbd_keep(nbd_mask(tr, n, false, true), cbar);
    nb_var *f = nb_add(nbd_keep(nbd_mask(tr, n, true, false), nb_matmul(nbd_mT(l), lbar)),
                       nbd_keep(nbd_mask(tr, n, false, true), nb_matmul(ubar, nbd_mT(u))));
    nb_var *x1 = nbd_tri(top, f, true, true, true);                    /* L^{-T} F */
    nb_var *x = nbd_mT(nbd_tri(top, nbd_mT(x1), false, false, false)); /* ... U^{-T} */
    in_ct[0] = nbd_rows_inv(x, nbd_perm(node));
}

static nb_var *nbd_jvp_lu_factor(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    if (tan[0] == NULL) {
        return NULL;
    }
    int64_t n = nb_var_dim(node, -1);
    nb_var *top = nbd_top(node);
    nb_var *u = nbd_keep(nbd_mask(tr, n, false, true), top);
    nb_var *l =
        nb_add(nbd_keep(nbd_mask(tr, n, true, false), top), nbd_eye(tr, nb_var_dtype(node), n));
    nb_var *y = nbd_tri(top, nbd_rows(tan[0], nbd_perm(node)), true, false, true); /* L^{-1} P dA */
    nb_var *g = nbd_mT(nbd_tri(top, nbd_mT(y), false, true, false));               /* ... U^{-1} */
    nb_var *dl = nb_matmul(l, nbd_keep(nbd_mask(tr, n, true, false), g));
    nb_var *du = nb_matmul(nbd_keep(nbd_mask(tr, n, false, true), g), u);
    int r = nb_var_rank(node);
    int64_t lo[NB_MAX_RANK] = {0}, hi[NB_MAX_RANK] = {0};
    hi[r - 2] = 1;
    return nb_pad(nb_add(dl, du), lo, hi, 0.0);
}

/* cholesky(A): Phi(X) = tril(X) with the diagonal halved */
static nb_var *nbd_phi(nb_trace *tr, int64_t n, nb_var *x) {
    nb_var *half =
        nb_select(nbd_mask(tr, n, true, false), nb_scalar(tr, 1.0),
                  nb_select(nbd_mask(tr, n, true, true), nb_scalar(tr, 0.5), nb_scalar(tr, 0.0)));
    return nb_mul(x, nb_cast(half, nb_var_dtype(x)));
}

static nb_var *nbd_sym(nb_var *x) {
    if (x == NULL) {
        return NULL;
    }
    return nb_mul(nb_add(x, nbd_mT(x)), nb_scalar(nb_var_trace(x), 0.5));
}

static void nbd_vjp_cholesky(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    int64_t n = nb_var_dim(node, -1);
    nb_var *p = nbd_phi(tr, n, nb_matmul(nbd_mT(node), ct));
    nb_var *w = nbd_tri(node, p, true, true, false);                 /* L^{-T} P */
    nb_var *q = nbd_mT(nbd_tri(node, nbd_mT(w), true, true, false)); /* ... L^{-1} */
    in_ct[0] = nbd_sym(q);
}

static nb_var *nbd_jvp_cholesky(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    if (tan[0] == NULL) {
        return NULL;
    }
    int64_t n = nb_var_dim(node, -1);
    nb_var *y = nbd_tri(node, nbd_sym(tan[0]), true, false, false); /* L^{-1} dS */
    nb_var *z = nbd_tri(node, nbd_mT(y), true, false, false);       /* L^{-1} dS L^{-T} */
    return nb_matmul(node, nbd_phi(tr, n, z));
}

/* cholesky_solve(L, b): A = L L^T */
static void nbd_vjp_chol_solve(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    nb_var *l = node->in[0];
    int64_t n = nb_var_dim(l, -1);
    nb_var *lam = nbd_emit(NBI_OP_CHOLESKY_SOLVE, 2, (nb_var *[]){l, ct}, node->at.ivalue);
    in_ct[1] = lam;
    nb_var *abar = nbd_abar(node, lam, false);
    nb_var *lbar =
        nbd_keep(nbd_mask(tr, n, true, true),
                 nb_matmul(nb_add(abar, nbd_mT(abar)), nbd_keep(nbd_mask(tr, n, true, true), l)));
    in_ct[0] = nbd_unbcast(lbar, l);
}

static nb_var *nbd_jvp_chol_solve(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    nb_var *l = node->in[0], *r = tan[1];
    if (tan[0] != NULL) {
        int64_t n = nb_var_dim(l, -1);
        nb_var *lm = nbd_keep(nbd_mask(tr, n, true, true), l);
        nb_var *dl = nbd_keep(nbd_mask(tr, n, true, true), tan[0]);
        nb_var *da = nb_add(nb_matmul(dl, nbd_mT(lm)), nb_matmul(lm, nbd_mT(dl)));
        nb_var *ax = nbd_from_mat(node, nb_matmul(da, nbd_as_mat(node, node)));
        r = r != NULL ? nb_sub(r, ax) : nb_neg(ax);
    }
    return r != NULL ? nbd_emit(NBI_OP_CHOLESKY_SOLVE, 2, (nb_var *[]){l, r}, node->at.ivalue)
                     : NULL;
}

/* triangular_solve(T, b): x = op(T)^{-1} b, op(T) = T or T^T of T's triangle */
static nb_var *nbd_tri_part(nb_trace *tr, const nb_var *node, nb_var *x) {
    int64_t fl = node->at.ivalue, n = node->in[0]->shape[node->in[0]->rank - 1];
    return nbd_keep(nbd_mask(tr, n, (fl & NBD_LOWER) != 0, !(fl & NBD_UNIT)), x);
}

static void nbd_vjp_tri(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    nb_var *t = node->in[0];
    bool trans = (node->at.ivalue & NBD_TRANS) != 0;
    nb_var *lam = nbd_emit(NBI_OP_TRI_SOLVE, 2, (nb_var *[]){t, ct}, node->at.ivalue ^ NBD_TRANS);
    in_ct[1] = lam;
    in_ct[0] = nbd_unbcast(nbd_tri_part(tr, node, nbd_abar(node, lam, trans)), t);
}

static nb_var *nbd_jvp_tri(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    nb_var *t = node->in[0], *r = tan[1];
    if (tan[0] != NULL) {
        nb_var *dt = nbd_tri_part(tr, node, tan[0]);
        if (node->at.ivalue & NBD_TRANS) {
            dt = nbd_mT(dt);
        }
        nb_var *ax = nbd_from_mat(node, nb_matmul(dt, nbd_as_mat(node, node)));
        r = r != NULL ? nb_sub(r, ax) : nb_neg(ax);
    }
    return r != NULL ? nbd_emit(NBI_OP_TRI_SOLVE, 2, (nb_var *[]){t, r}, node->at.ivalue) : NULL;
}

/* slogdet(A, M): ct_A = ct_logabs A^{-T}; d logabs = tr(A^{-1} dA) */
static nb_var *nbd_logabs_part(nb_var *x) { /* [..., 2] -> [...] its second entry */
    int r = nb_var_rank(x);
    if (x == NULL || r < 1) {
        return NULL;
    }
    int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
    memcpy(stop, nb_var_shape(x), (size_t)r * sizeof(int64_t));
    start[r - 1] = 1;
    return nb_squeeze(nb_slice(x, start, stop, NULL), (int[]){-1}, 1);
}

static void nbd_vjp_slogdet(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    nb_var *a = node->in[0], *m = node->in[1];
    int64_t n = nb_var_dim(a, -1);
    nb_var *eye = nb_broadcast_to(nbd_eye(tr, nb_var_dtype(a), n), nb_var_rank(a), nb_var_shape(a));
    nb_var *ainvt = nbd_emit(NBI_OP_LU_SOLVE, 2, (nb_var *[]){m, eye}, NBD_TRANS);
    nb_var *c = nb_expand_dims(nb_expand_dims(nbd_logabs_part(ct), -1), -1);
    in_ct[0] = nb_mul(c, ainvt);
}

static nb_var *nbd_jvp_slogdet(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    if (tan[0] == NULL) {
        return NULL;
    }
    nb_var *a = node->in[0];
    int r = nb_var_rank(a);
    int64_t n = nb_var_dim(a, -1);
    nb_var *s = nbd_emit(NBI_OP_LU_SOLVE, 2, (nb_var *[]){node->in[1], tan[0]}, 0);
    nb_var *d = nb_sum(nb_mul(s, nbd_eye(tr, nb_var_dtype(a), n)), (int[]){r - 2, r - 1}, 2, false);
    nb_var *z = nb_full(tr, nb_var_dtype(d), nb_var_rank(d), nb_var_shape(d), 0.0);
    return nb_stack(2, (nb_var *[]){z, d}, -1);
}

/* ---- registry entries ---------------------------------------------------------------- */

const nbi_op_info nbi_opinfo_lu_factor = {.name = "lu_factor",
                                          .n_in = 1,
                                          .infer = nbd_infer_lu_factor,
                                          .kernel = nbd_factor_kernel,
                                          .vjp = nbd_vjp_lu_factor,
                                          .jvp = nbd_jvp_lu_factor,
                                          .vmap = nbi_vmap_unroll};

const nbi_op_info nbi_opinfo_lu_solve = {.name = "lu_solve",
                                         .n_in = 2,
                                         .infer = nbd_infer_lu_solve,
                                         .kernel = nbd_solve_kernel,
                                         .scratch = nbd_solve_scratch,
                                         .vjp = nbd_vjp_lu_solve,
                                         .jvp = nbd_jvp_lu_solve,
                                         .vmap = nbi_vmap_unroll};

const nbi_op_info nbi_opinfo_solve = {.name = "solve",
                                      .n_in = 3,
                                      .infer = nbd_infer_solve,
                                      .kernel = nbd_solve_kernel,
                                      .scratch = nbd_solve_scratch,
                                      .nondiff = 1u << 1,
                                      .vjp = nbd_vjp_solve,
                                      .jvp = nbd_jvp_solve,
                                      .vmap = nbi_vmap_unroll};

const nbi_op_info nbi_opinfo_cholesky = {.name = "cholesky",
                                         .n_in = 1,
                                         .infer = nbd_infer_cholesky,
                                         .kernel = nbd_factor_kernel,
                                         .vjp = nbd_vjp_cholesky,
                                         .jvp = nbd_jvp_cholesky,
                                         .vmap = nbi_vmap_unroll};

const nbi_op_info nbi_opinfo_cholesky_solve = {.name = "cholesky_solve",
                                               .n_in = 2,
                                               .infer = nbd_infer_tri,
                                               .kernel = nbd_solve_kernel,
                                               .vjp = nbd_vjp_chol_solve,
                                               .jvp = nbd_jvp_chol_solve,
                                               .vmap = nbi_vmap_unroll};

const nbi_op_info nbi_opinfo_triangular_solve = {.name = "triangular_solve",
                                                 .n_in = 2,
                                                 .infer = nbd_infer_tri,
                                                 .kernel = nbd_solve_kernel,
                                                 .vjp = nbd_vjp_tri,
                                                 .jvp = nbd_jvp_tri,
                                                 .vmap = nbi_vmap_unroll};

const nbi_op_info nbi_opinfo_slogdet = {.name = "slogdet",
                                        .n_in = 2,
                                        .infer = nbd_infer_slogdet,
                                        .kernel = nbd_slogdet_kernel,
                                        .nondiff = 1u << 1,
                                        .vjp = nbd_vjp_slogdet,
                                        .jvp = nbd_jvp_slogdet,
                                        .vmap = nbi_vmap_unroll};

/* ---- builders (nabla/linalg.h) -------------------------------------------------------- */

/* The trace of a builder's inputs after the common checks (NULL, poison, foreign vars
 * reported by name), or NULL with *ret set to what the builder returns. */
static nb_trace *nbd_begin(const char *fn, int n, nb_var *const *in, const char *const *names,
                           nb_var **ret) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(n, in, &poisoned);
    *ret = NULL;
    if (tr == NULL) {
        return NULL;
    }
    *ret = tr->poison;
    if (tr->status != NB_OK) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (in[i] == NULL) {
            nbi_trace_err(tr, NB_ERR_MISUSE, "nb_%s: %s is a NULL var", fn, names[i]);
            return NULL;
        }
    }
    if (poisoned) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (in[i]->tr != tr) {
            nbi_trace_err(tr, NB_ERR_INVALID,
                          "nb_%s: %s belongs to another trace (a var was kept after its trace "
                          "ended, or an outer var was used inside a function without being "
                          "passed as an argument)",
                          fn, names[i]);
            return NULL;
        }
    }
    return tr;
}

/* b made ready for a solve against matrix operand m (packed: LU factors): *flags gets VEC
 * when b is a vector per matrix, and b is broadcast to the result's batch dims. */
static nb_var *nbd_rhs(nb_trace *tr, const char *fn, nb_var *m, bool packed, nb_var *b,
                       int64_t *flags) {
    if (nbd_check_matrix(tr, fn, m, packed, packed ? "lu" : "the matrix") != NB_OK) {
        return tr->poison;
    }
    char sm[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    int64_t n = m->shape[m->rank - 1];
    bool vec = b->rank == 1 || b->rank == m->rank - 1;
    int rb = b->rank - (vec ? 1 : 2);
    if (b->dtype != m->dtype || rb < 0 || b->shape[rb] != n) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_%s: matrix %s and b %s: b must be [..., %lld] (a vector per "
                              "matrix: rank 1, or one dim fewer than the matrix) or [..., %lld, "
                              "k], of the matrix's dtype",
                              fn, nbi_var_sig(sm, sizeof sm, m), nbi_var_sig(sb, sizeof sb, b),
                              (long long)n, (long long)n);
    }
    int r = 0;
    int64_t bs[NB_MAX_RANK + 2];
    if (!nbi_broadcast_shapes(m->rank - 2, m->shape, rb, b->shape, &r, bs)) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE,
                              "nb_%s: matrix %s and b %s: batch dims do not broadcast (aligned "
                              "from the right, each pair must be equal or contain a 1)",
                              fn, nbi_var_sig(sm, sizeof sm, m), nbi_var_sig(sb, sizeof sb, b));
    }
    *flags = vec ? NBD_VEC : 0;
    if (r + b->rank - rb > NB_MAX_RANK) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE, "nb_%s: matrix %s and b %s: result rank over %d",
                              fn, nbi_var_sig(sm, sizeof sm, m), nbi_var_sig(sb, sizeof sb, b),
                              NB_MAX_RANK);
    }
    if (r == rb && memcmp(bs, b->shape, (size_t)rb * sizeof(int64_t)) == 0) {
        return b;
    }
    memcpy(bs + r, b->shape + rb, (size_t)(b->rank - rb) * sizeof(int64_t));
    return nb_broadcast_to(b, r + b->rank - rb, bs);
}

nb_var *nb_lu_factor(nb_var *a) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("lu_factor", 1, &a, (const char *[]){"a"}, &ret);
    if (tr == NULL || nbd_check_matrix(tr, "lu_factor", a, false, "a") != NB_OK) {
        return tr != NULL ? tr->poison : ret;
    }
    return nbi_emit(tr, NBI_OP_LU_FACTOR, 1, &a, NULL);
}

nb_var *nb_lu_solve(nb_var *lu, nb_var *b, bool transpose) {
    nb_var *ret, *in[2] = {lu, b};
    nb_trace *tr = nbd_begin("lu_solve", 2, in, (const char *[]){"lu", "b"}, &ret);
    if (tr == NULL) {
        return ret;
    }
    int64_t fl = 0;
    b = nbd_rhs(tr, "lu_solve", lu, true, b, &fl);
    return nbd_emit(NBI_OP_LU_SOLVE, 2, (nb_var *[]){lu, b}, fl | (transpose ? NBD_TRANS : 0));
}

nb_var *nb_solve(nb_var *a, nb_var *b) {
    nb_var *ret, *in[2] = {a, b};
    nb_trace *tr = nbd_begin("solve", 2, in, (const char *[]){"a", "b"}, &ret);
    if (tr == NULL) {
        return ret;
    }
    int64_t fl = 0;
    b = nbd_rhs(tr, "solve", a, false, b, &fl);
    nb_var *m = nb_lu_factor(a);
    return nbd_emit(NBI_OP_SOLVE, 3, (nb_var *[]){a, m, b}, fl);
}

nb_var *nb_cholesky(nb_var *a) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("cholesky", 1, &a, (const char *[]){"a"}, &ret);
    if (tr == NULL || nbd_check_matrix(tr, "cholesky", a, false, "a") != NB_OK) {
        return tr != NULL ? tr->poison : ret;
    }
    return nbi_emit(tr, NBI_OP_CHOLESKY, 1, &a, NULL);
}

nb_var *nb_cholesky_solve(nb_var *l, nb_var *b) {
    nb_var *ret, *in[2] = {l, b};
    nb_trace *tr = nbd_begin("cholesky_solve", 2, in, (const char *[]){"l", "b"}, &ret);
    if (tr == NULL) {
        return ret;
    }
    int64_t fl = 0;
    b = nbd_rhs(tr, "cholesky_solve", l, false, b, &fl);
    return nbd_emit(NBI_OP_CHOLESKY_SOLVE, 2, (nb_var *[]){l, b}, fl);
}

nb_var *nb_triangular_solve(nb_var *t, nb_var *b, bool lower, bool transpose, bool unit_diagonal) {
    nb_var *ret, *in[2] = {t, b};
    nb_trace *tr = nbd_begin("triangular_solve", 2, in, (const char *[]){"t", "b"}, &ret);
    if (tr == NULL) {
        return ret;
    }
    int64_t fl = 0;
    b = nbd_rhs(tr, "triangular_solve", t, false, b, &fl);
    return nbd_emit(NBI_OP_TRI_SOLVE, 2, (nb_var *[]){t, b},
                    fl | (lower ? NBD_LOWER : 0) | (transpose ? NBD_TRANS : 0) |
                        (unit_diagonal ? NBD_UNIT : 0));
}

nb_var *nb_diagonal(nb_var *x) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("diagonal", 1, &x, (const char *[]){"x"}, &ret);
    if (tr == NULL) {
        return ret;
    }
    char s[NBI_SIG_CAP];
    if (x->rank < 2) {
        return nbi_trace_errv(tr, NB_ERR_SHAPE, "nb_diagonal: x is %s; it must be [..., r, c]",
                              nbi_var_sig(s, sizeof s, x));
    }
    int r = x->rank;
    int64_t rows = x->shape[r - 2], cols = x->shape[r - 1], m = rows < cols ? rows : cols;
    int64_t flat[NB_MAX_RANK], start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK], step[NB_MAX_RANK];
    memcpy(flat, x->shape, (size_t)(r - 2) * sizeof(int64_t));
    flat[r - 2] = rows * cols;
    memcpy(stop, flat, (size_t)(r - 1) * sizeof(int64_t));
    for (int d = 0; d < r - 1; d++) {
        step[d] = 1;
    }
    stop[r - 2] = m > 0 ? (m - 1) * (cols + 1) + 1 : 0;
    step[r - 2] = cols + 1;
    return nb_slice(nb_reshape(x, r - 1, flat), start, stop, step);
}

/* bool [...]: some entry of d [..., n] is zero or not finite */
static nb_var *nbd_any_bad(nb_var *d, bool zero_bad) {
    nb_trace *tr = nb_var_trace(d);
    nb_var *ok = nb_eq(nb_sub(d, d), nb_scalar(tr, 0.0)); /* false for inf and NaN */
    if (zero_bad) {
        ok = nb_logical_and(ok, nb_ne(d, nb_scalar(tr, 0.0)));
    }
    nb_var *bad = nb_cast(nb_logical_not(ok), NB_DTYPE_I32);
    return nb_gt(nb_max(bad, (int[]){-1}, 1, false), nb_scalar_typed(tr, NB_DTYPE_I32, 0));
}

nb_var *nb_lu_singular(nb_var *lu) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("lu_singular", 1, &lu, (const char *[]){"lu"}, &ret);
    if (tr == NULL || nbd_check_matrix(tr, "lu_singular", lu, true, "lu") != NB_OK) {
        return tr != NULL ? tr->poison : ret;
    }
    if (lu->shape[lu->rank - 1] == 0) {
        return nb_full(tr, NB_DTYPE_BOOL, lu->rank - 2, lu->shape, 0.0);
    }
    return nbd_any_bad(nb_diagonal(nbd_top(lu)), true);
}

nb_var *nb_cholesky_failed(nb_var *l) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("cholesky_failed", 1, &l, (const char *[]){"l"}, &ret);
    if (tr == NULL || nbd_check_matrix(tr, "cholesky_failed", l, false, "l") != NB_OK) {
        return tr != NULL ? tr->poison : ret;
    }
    if (l->shape[l->rank - 1] == 0) {
        return nb_full(tr, NB_DTYPE_BOOL, l->rank - 2, l->shape, 0.0);
    }
    return nbd_any_bad(nb_diagonal(l), false);
}

nb_var *nb_slogdet(nb_var *a, nb_var **sign) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("slogdet", 1, &a, (const char *[]){"a"}, &ret);
    if (tr == NULL || nbd_check_matrix(tr, "slogdet", a, false, "a") != NB_OK) {
        ret = tr != NULL ? tr->poison : ret;
        if (sign != NULL) {
            *sign = ret;
        }
        return ret;
    }
    nb_var *sl = nbi_emit(tr, NBI_OP_SLOGDET, 2, (nb_var *[]){a, nb_lu_factor(a)}, NULL);
    if (sign != NULL) {
        int r = nb_var_rank(sl);
        int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
        memcpy(stop, nb_var_shape(sl), (size_t)r * sizeof(int64_t));
        stop[r - 1] = 1;
        *sign = nb_squeeze(nb_slice(sl, start, stop, NULL), (int[]){-1}, 1);
    }
    return nbd_logabs_part(sl);
}

nb_var *nb_det(nb_var *a) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("det", 1, &a, (const char *[]){"a"}, &ret);
    if (tr == NULL || nbd_check_matrix(tr, "det", a, false, "a") != NB_OK) {
        return tr != NULL ? tr->poison : ret;
    }
    nb_var *sign = NULL;
    nb_var *logabs = nb_slogdet(a, &sign);
    return nb_mul(sign, nb_exp(logabs));
}

nb_var *nb_inv(nb_var *a) {
    nb_var *ret;
    nb_trace *tr = nbd_begin("inv", 1, &a, (const char *[]){"a"}, &ret);
    if (tr == NULL || nbd_check_matrix(tr, "inv", a, false, "a") != NB_OK) {
        return tr != NULL ? tr->poison : ret;
    }
    int64_t n = a->shape[a->rank - 1];
    return nb_solve(a, nb_broadcast_to(nbd_eye(tr, a->dtype, n), a->rank, a->shape));
}
