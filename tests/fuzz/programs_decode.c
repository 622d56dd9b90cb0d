/*
 * programs_decode.c -- bytes into a program (tests/fuzz/README.md has the format): the
 * header (checks, value seed, inputs), then ops, each a family byte followed by operand
 * and parameter bytes. Operands are picked among the values that fit the op, counting back
 * from the most recent, so most programs are valid; a few parameter values are out of range
 * on purpose so that refusals are exercised too. Decoding happens while the program is
 * traced for the first time: the shapes of the values so far come from the trace.
 */
#include "programs_internal.h"

#include <math.h>
#include <string.h>

/* Families: what an op byte chooses first (weighted: elementwise ops most often). */
enum {
    NBP_F_UNARY,
    NBP_F_BINARY,
    NBP_F_COMPARE,
    NBP_F_LOGICAL,
    NBP_F_SCALAR,
    NBP_F_SELECT,
    NBP_F_CAST,
    NBP_F_REDUCE,
    NBP_F_ARG,
    NBP_F_SOFT,
    NBP_F_RESHAPE,
    NBP_F_BROADCAST,
    NBP_F_TRANSPOSE,
    NBP_F_EXPAND,
    NBP_F_SLICE,
    NBP_F_CONCAT,
    NBP_F_PAD,
    NBP_F_TAKE,
    NBP_F_DYN,
    NBP_F_MATMUL,
    NBP_F_SOURCE,
    NBP_F_RNG,
    NBP_F_LOOP,
    NBP_F_COUNT
};
static const uint8_t nbp_family_of_byte[32] = {
    NBP_F_UNARY,  NBP_F_UNARY,   NBP_F_UNARY,     NBP_F_UNARY,     NBP_F_BINARY, NBP_F_BINARY,
    NBP_F_BINARY, NBP_F_BINARY,  NBP_F_COMPARE,   NBP_F_LOGICAL,   NBP_F_SCALAR, NBP_F_SCALAR,
    NBP_F_SELECT, NBP_F_CAST,    NBP_F_REDUCE,    NBP_F_REDUCE,    NBP_F_REDUCE, NBP_F_ARG,
    NBP_F_SOFT,   NBP_F_RESHAPE, NBP_F_BROADCAST, NBP_F_TRANSPOSE, NBP_F_EXPAND, NBP_F_SLICE,
    NBP_F_CONCAT, NBP_F_PAD,     NBP_F_TAKE,      NBP_F_DYN,       NBP_F_MATMUL, NBP_F_SOURCE,
    NBP_F_RNG,    NBP_F_LOOP};

/* weak scalars of loop bodies */
static const double nbp_loop_consts[8] = {0.5, -1.0, 2.0, 1.0, 0.25, -0.75, 3.0, 0.0};

/* ---- broadcasting -------------------------------------------------------------------------- */

static bool nbp_bcast(int ra, const int64_t *sa, int rb, const int64_t *sb, int *ro, int64_t *so) {
    int r = ra > rb ? ra : rb;
    for (int i = 0; i < r; i++) {
        int64_t da = i < r - ra ? 1 : sa[i - (r - ra)];
        int64_t db = i < r - rb ? 1 : sb[i - (r - rb)];
        if (da != db && da != 1 && db != 1) {
            return false;
        }
        if (so != NULL) {
            so[i] = da == 1 ? db : da;
        }
    }
    if (ro != NULL) {
        *ro = r;
    }
    return true;
}

/* ---- the decoder: bytes and operand choice ------------------------------------------------- */

static unsigned nbp_u8(nbp_prog *P) {
    return P->at < P->size ? P->data[P->at++] : 0;
}
static int nbp_sbyte(nbp_prog *P, int lo, int hi) { /* lo..hi */
    return lo + (int)(nbp_u8(P) % (unsigned)(hi - lo + 1));
}

typedef bool (*nbp_pred)(const nbp_prog *P, const nbp_val *v, const void *ud);

/* A value satisfying pred, chosen by one byte (0 = the most recent one); the byte 0xff
 * picks any value (which may be refused: the library's errors are tested too). -1 if
 * nothing fits. */
static int nbp_pick(nbp_prog *P, nbp_pred pred, const void *ud) {
    unsigned b = nbp_u8(P);
    int cand[NBP_MAX_VALS], n = 0;
    for (int i = 0; i < P->n_vals; i++) {
        if (pred == NULL || pred(P, &P->vals[i], ud)) {
            cand[n++] = i;
        }
    }
    if (b == 0xff && P->n_vals > 0) {
        return P->n_vals - 1 - (int)(b % (unsigned)P->n_vals);
    }
    if (n == 0) {
        return -1;
    }
    return cand[n - 1 - (int)(b % (unsigned)n)];
}

static bool nbp_p_float(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return nbp_is_float(v->dt);
}

/* Would the optimizer take a sum of value v over its rows (axis 0 of rank 2) as the row sum
 * of a product (src/ad/passes.c, "sums of products over their rows"; docs/semantics.md
 * section 9): a product, maybe under adds and subs, which the rewrite splits, and ops the
 * optimizer can drop (x * 1, x / 1, x - 0, x + -0, neg(neg(x)), a reshape back)? The
 * jitted program then sums in another order than the op run alone -- the same to rounding,
 * not the same bits -- so R1 cannot hold, and the decoder sums such a value over its last
 * axis instead. Conservative: any of these ops on the way counts, at any operand. */
static bool nbp_rowsum_product(const nbp_prog *P, int v, int depth) {
    if (v < 0 || v >= P->n_vals || depth > 8) {
        return false;
    }
    int oi = P->vals[v].op;
    if (oi < 0 || oi >= P->n_ops) {
        return false;
    }
    const nbp_op *op = &P->ops[oi];
    switch (op->code) {
    case NBP_MATMUL:
    case NBP_DOT:
        return P->vals[v].rank == 2;
    case NBP_ADD:
    case NBP_SUB:
    case NBP_MUL:
    case NBP_DIV:
    case NBP_NEG:
    case NBP_SCALAR_BIN:
    case NBP_RESHAPE:
    case NBP_TRANSPOSE:
    case NBP_CAST:
        for (int j = 0; j < op->n_in; j++) {
            if (nbp_rowsum_product(P, op->in[j], depth + 1)) {
                return true;
            }
        }
        return false;
    default:
        return false;
    }
}
static bool nbp_p_numeric(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->dt != NB_DTYPE_BOOL;
}
static bool nbp_p_small_numeric(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->dt != NB_DTYPE_BOOL && v->size <= 125;
}
static bool nbp_p_bool(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->dt == NB_DTYPE_BOOL;
}
static bool nbp_p_int(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return nbp_is_int(v->dt) && v->rank <= 2;
}
static bool nbp_p_int0(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return nbp_is_int(v->dt) && v->rank == 0;
}
static bool nbp_p_key(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->dt == NB_DTYPE_I32 && v->rank == 1 && v->shape[0] == 2;
}
static bool nbp_p_ranked(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->rank >= 1;
}
static bool nbp_p_ranked_numeric(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->rank >= 1 && v->dt != NB_DTYPE_BOOL;
}
static bool nbp_p_ranked_float(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->rank >= 1 && nbp_is_float(v->dt);
}
static bool nbp_p_nonempty_numeric(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->size > 0 && v->dt != NB_DTYPE_BOOL;
}
static bool nbp_p_nonempty_ranked(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->size > 0 && v->rank >= 1 && v->dt != NB_DTYPE_BOOL;
}
static bool nbp_p_vector(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->rank == 1 && v->dt != NB_DTYPE_BOOL;
}
/* scan's xs: a leading dim of at most 64 steps (a checkpointed reversal with one checkpoint
 * recomputes quadratically many) */
static bool nbp_p_scan_xs(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P, (void)ud;
    return v->rank >= 1 && v->shape[0] <= 64 && v->dt != NB_DTYPE_BOOL;
}
static bool nbp_p_rank_le(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    return v->rank <= *(const int *)ud;
}
/* same dtype as ud's value and broadcastable with it */
static bool nbp_p_bcast(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_val *a = ud;
    int r = 0;
    int64_t s[NB_MAX_RANK * 2];
    return v->dt == a->dt && nbp_bcast(a->rank, a->shape, v->rank, v->shape, &r, s) &&
           nbp_size_of(r, s) <= NBP_MAX_SIZE;
}
/* any dtype, broadcastable with ud's value */
static bool nbp_p_bcast_any(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_val *a = ud;
    return nbp_bcast(a->rank, a->shape, v->rank, v->shape, NULL, NULL);
}
static bool nbp_p_same_shape(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_val *a = ud;
    return v->dt == a->dt && v->rank == a->rank &&
           memcmp(v->shape, a->shape, (size_t)a->rank * sizeof(int64_t)) == 0;
}
typedef struct nbp_concat_ud {
    const nbp_val *a;
    int axis;
} nbp_concat_ud;
static bool nbp_p_concat(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_concat_ud *c = ud;
    if (v->dt != c->a->dt || v->rank != c->a->rank) {
        return false;
    }
    for (int i = 0; i < v->rank; i++) {
        if (i != c->axis && v->shape[i] != c->a->shape[i]) {
            return false;
        }
    }
    return true;
}
static bool nbp_p_matmul(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_val *a = ud;
    if (v->dt != a->dt || v->rank < 1 || a->rank < 1) {
        return false;
    }
    int64_t k = a->shape[a->rank - 1];
    if (v->rank == 1) {
        return v->shape[0] == k;
    }
    if (v->shape[v->rank - 2] != k) {
        return false;
    }
    int r = 0;
    int64_t s[NB_MAX_RANK];
    /* the product's size: batch * m * n, bounded */
    int64_t m = a->rank >= 2 ? a->shape[a->rank - 2] : 1, n = v->shape[v->rank - 1];
    return nbp_bcast(a->rank > 2 ? a->rank - 2 : 0, a->shape, v->rank - 2, v->shape, &r, s) &&
           nbp_size_of(r, s) * m * n <= NBP_MAX_BIG;
}
static bool nbp_p_dot(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_val *a = ud;
    return v->dt == a->dt && v->rank == 1 && a->rank == 1 && v->shape[0] == a->shape[0];
}
/* an update for ud's value: same dtype and rank, no dim larger */
static bool nbp_p_update(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_val *a = ud;
    if (v->dt != a->dt || v->rank != a->rank) {
        return false;
    }
    for (int i = 0; i < v->rank; i++) {
        if (v->shape[i] > a->shape[i]) {
            return false;
        }
    }
    return true;
}
/* take_along_axis indices for ud's value */
static bool nbp_p_along(const nbp_prog *P, const nbp_val *v, const void *ud) {
    (void)P;
    const nbp_val *a = ud;
    return nbp_is_int(v->dt) && v->rank == a->rank && v->rank >= 1;
}

/* ---- decoding one op ----------------------------------------------------------------------- */

static int nbp_axis_byte(nbp_prog *P, int rank) { /* -rank..rank-1, rarely out of range */
    unsigned b = nbp_u8(P);
    if (b >= 0xfc) {
        return rank; /* out of range */
    }
    if (rank == 0) {
        return 0;
    }
    int a = (int)(b % (unsigned)rank);
    return (b & 0x80) ? a - rank : a;
}

/* Decode op fields into op (operands in op->in, params in op->p / op->f). Returns false
 * when nothing fits (no op is made; its bytes are used up). */
static bool nbp_decode_fields(nbp_prog *P, nbp_op *op) {
    unsigned fam = nbp_family_of_byte[nbp_u8(P) % 32];
    int64_t *p = op->p;
    int a = -1, b = -1;
    const nbp_val *A = NULL;
    switch (fam) {
    case NBP_F_UNARY: {
        static const int codes[22] = {
            NBP_NEG,        NBP_ABS,      NBP_SIGN, NBP_SQUARE,     NBP_RELU, NBP_STOP_GRADIENT,
            NBP_EXP,        NBP_EXPM1,    NBP_LOG,  NBP_LOG1P,      NBP_SQRT, NBP_RSQRT,
            NBP_RECIPROCAL, NBP_SIN,      NBP_COS,  NBP_TAN,        NBP_TANH, NBP_SIGMOID,
            NBP_GELU,       NBP_SOFTPLUS, NBP_ERF,  NBP_LOGICAL_NOT};
        op->code = codes[nbp_u8(P) % 22];
        nbp_pred pr = op->code == NBP_LOGICAL_NOT     ? nbp_p_bool
                      : op->code == NBP_STOP_GRADIENT ? NULL
                      : op->code <= NBP_RELU          ? nbp_p_numeric
                                                      : nbp_p_float;
        a = nbp_pick(P, pr, NULL);
        if (a < 0) {
            return false;
        }
        op->n_in = 1;
        op->in[0] = a;
        return true;
    }
    case NBP_F_CAST:
        a = nbp_pick(P, NULL, NULL);
        if (a < 0) {
            return false;
        }
        op->code = NBP_CAST;
        op->n_in = 1;
        op->in[0] = a;
        p[0] = nbp_u8(P) % 5;
        return true;
    case NBP_F_BINARY:
    case NBP_F_COMPARE:
    case NBP_F_LOGICAL: {
        unsigned s = nbp_u8(P);
        op->code = fam == NBP_F_BINARY    ? NBP_ADD + (int)(s % 7)
                   : fam == NBP_F_COMPARE ? NBP_EQ + (int)(s % 6)
                                          : NBP_LOGICAL_AND + (int)(s % 2);
        nbp_pred pr = op->code == NBP_POW                          ? nbp_p_float
                      : fam == NBP_F_LOGICAL                       ? nbp_p_bool
                      : (op->code == NBP_EQ || op->code == NBP_NE) ? NULL
                                                                   : nbp_p_numeric;
        a = nbp_pick(P, pr, NULL);
        if (a < 0) {
            return false;
        }
        b = nbp_pick(P, nbp_p_bcast, &P->vals[a]);
        op->n_in = 2;
        op->in[0] = a;
        op->in[1] = b < 0 ? a : b;
        if (s & 0x80) { /* swap */
            op->in[0] = op->in[1];
            op->in[1] = a;
        }
        return true;
    }
    case NBP_F_SCALAR: {
        unsigned s = nbp_u8(P);
        p[0] = NBP_ADD + (int)(s % 13);
        a = nbp_pick(P, p[0] == NBP_POW ? nbp_p_float : nbp_p_numeric, NULL);
        if (a < 0) {
            return false;
        }
        op->code = NBP_SCALAR_BIN;
        op->n_in = 1;
        op->in[0] = a;
        p[1] = (s >> 7) & 1;
        unsigned v = nbp_u8(P);
        op->f[0] = (v & 0x80) ? nbp_special(v) : nbp_loop_consts[v % 8];
        return true;
    }
    case NBP_F_SELECT: {
        int cnd = nbp_pick(P, nbp_p_bool, NULL);
        if (cnd < 0) {
            return false;
        }
        a = nbp_pick(P, nbp_p_bcast_any, &P->vals[cnd]);
        if (a < 0) {
            return false;
        }
        /* b: a's dtype, broadcastable with a (and, likely, with cond) */
        b = nbp_pick(P, nbp_p_bcast, &P->vals[a]);
        op->code = NBP_SELECT;
        op->n_in = 3;
        op->in[0] = cnd;
        op->in[1] = a;
        op->in[2] = b < 0 ? a : b;
        return true;
    }
    case NBP_F_REDUCE: {
        static const int codes[6] = {NBP_SUM, NBP_MEAN, NBP_MAX, NBP_MIN, NBP_PROD, NBP_LOGSUMEXP};
        op->code = codes[nbp_u8(P) % 6];
        a = nbp_pick(P,
                     op->code == NBP_MEAN || op->code == NBP_LOGSUMEXP ? nbp_p_float
                     : op->code == NBP_MAX || op->code == NBP_MIN      ? nbp_p_nonempty_numeric
                                                                       : nbp_p_numeric,
                     NULL);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->n_in = 1;
        op->in[0] = a;
        unsigned m = nbp_u8(P), fl = nbp_u8(P);
        p[9] = fl & 1;
        if (fl & 2) {
            p[0] = -1; /* NULL: every axis */
            return true;
        }
        int n = 0;
        for (int i = 0; i < A->rank; i++) {
            if (m & (1u << i)) {
                p[1 + n++] = (fl & 4) ? i - A->rank : i;
            }
        }
        if ((fl & 0xf8) == 0xf8) {
            p[1 + n++] = A->rank; /* out of range */
        } else if ((fl & 0xf8) == 0xf0 && n > 0 && n < NB_MAX_RANK) {
            p[1 + n] = p[1]; /* a duplicate axis */
            n++;
        }
        p[0] = n;
        if ((op->code == NBP_SUM || op->code == NBP_MEAN) && A->rank == 2 && n == 1 &&
            (p[1] == 0 || p[1] == -2) && nbp_rowsum_product(P, a, 0)) {
            p[1] = (fl & 4) ? -1 : 1; /* not the row sum of a product (R1) */
        }
        return true;
    }
    case NBP_F_ARG:
    case NBP_F_SOFT: {
        unsigned s = nbp_u8(P);
        op->code = fam == NBP_F_ARG ? NBP_ARGMAX + (int)(s % 2) : NBP_SOFTMAX + (int)(s % 2);
        a = nbp_pick(P, fam == NBP_F_ARG ? nbp_p_nonempty_ranked : nbp_p_ranked_float, NULL);
        if (a < 0) {
            return false;
        }
        op->n_in = 1;
        op->in[0] = a;
        p[0] = nbp_axis_byte(P, P->vals[a].rank);
        p[1] = (s >> 7) & 1;
        return true;
    }
    case NBP_F_RESHAPE: {
        a = nbp_pick(P, NULL, NULL);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->code = NBP_RESHAPE;
        op->n_in = 1;
        op->in[0] = a;
        int64_t s = A->size;
        /* candidate shapes: [s], [1,s], [s,1], [d, s/d], [d, 1, s/d], [] for 1, zeros for 0 */
        int64_t cand[24][4];
        int cr[24], nc = 0;
        cr[nc] = 1, cand[nc][0] = s, nc++;
        cr[nc] = 2, cand[nc][0] = 1, cand[nc][1] = s, nc++;
        cr[nc] = 2, cand[nc][0] = s, cand[nc][1] = 1, nc++;
        if (s == 1) {
            cr[nc++] = 0;
        }
        if (s == 0) {
            cr[nc] = 2, cand[nc][0] = 0, cand[nc][1] = 3, nc++;
            cr[nc] = 3, cand[nc][0] = 2, cand[nc][1] = 0, cand[nc][2] = 5, nc++;
        }
        for (int64_t d = 2; d < s && nc < 22; d++) {
            if (s % d == 0) {
                cr[nc] = 2, cand[nc][0] = d, cand[nc][1] = s / d, nc++;
                cr[nc] = 3, cand[nc][0] = d, cand[nc][1] = 1, cand[nc][2] = s / d, nc++;
            }
        }
        unsigned ch = nbp_u8(P), fl = nbp_u8(P);
        int k = (int)(ch % (unsigned)nc);
        p[0] = cr[k];
        for (int i = 0; i < cr[k]; i++) {
            p[1 + i] = cand[k][i];
        }
        if (ch == 0xff) {
            p[0] = 1, p[1] = s + 1; /* a wrong count */
        } else if ((fl & 1) && p[0] > 0) {
            p[1 + (fl >> 1) % (unsigned)p[0]] = -1; /* inferred */
        }
        return true;
    }
    case NBP_F_BROADCAST: {
        int lim = 4;
        a = nbp_pick(P, nbp_p_rank_le, &lim);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->code = NBP_BROADCAST_TO;
        op->n_in = 1;
        op->in[0] = a;
        unsigned fl = nbp_u8(P);
        int nn = (int)(fl % 3);
        if (A->rank + nn > 5) {
            nn = 5 - A->rank;
        }
        p[0] = A->rank + nn;
        for (int i = 0; i < nn; i++) {
            p[1 + i] = nbp_sbyte(P, 0, 4);
        }
        for (int i = 0; i < A->rank; i++) {
            p[1 + nn + i] = A->shape[i] == 1 ? nbp_sbyte(P, 0, 4) : A->shape[i];
        }
        if (fl == 0xff && A->rank > 0) {
            p[1 + nn] = A->shape[0] + 1; /* not broadcastable (unless the dim is 1) */
        }
        if (nbp_size_of((int)p[0], p + 1) > NBP_MAX_SIZE) {
            return false;
        }
        return true;
    }
    case NBP_F_TRANSPOSE: {
        a = nbp_pick(P, NULL, NULL);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->code = NBP_TRANSPOSE;
        op->n_in = 1;
        op->in[0] = a;
        unsigned ch = nbp_u8(P);
        if (ch >= 0xf0) {
            p[0] = 1; /* NULL: reverse */
            return true;
        }
        /* permutation number ch of rank items (Lehmer code) */
        int left[NB_MAX_RANK], nl = A->rank;
        for (int i = 0; i < nl; i++) {
            left[i] = i;
        }
        unsigned x = ch;
        for (int i = 0; i < A->rank; i++) {
            int j = (int)(x % (unsigned)nl);
            x /= (unsigned)nl;
            p[1 + i] = left[j];
            left[j] = left[--nl];
        }
        if (ch == 0xef && A->rank >= 2) {
            p[2] = p[1]; /* not a permutation */
        }
        return true;
    }
    case NBP_F_EXPAND: {
        unsigned s = nbp_u8(P);
        int lim = 5;
        a = nbp_pick(P, (s & 1) ? NULL : nbp_p_rank_le, &lim);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->n_in = 1;
        op->in[0] = a;
        if (!(s & 1)) {
            op->code = NBP_EXPAND_DIMS;
            unsigned b2 = nbp_u8(P);
            p[0] = (int)(b2 % (unsigned)(2 * A->rank + 2)) - (A->rank + 1); /* -rank-1..rank */
            if (b2 == 0xff) {
                p[0] = A->rank + 2;
            }
            return true;
        }
        op->code = NBP_SQUEEZE;
        if (s & 2) {
            p[0] = -1;
            return true;
        }
        int n = 0;
        for (int i = 0; i < A->rank; i++) {
            if (A->shape[i] == 1) {
                p[1 + n++] = (s & 4) ? i - A->rank : i;
            }
        }
        if ((s & 0xf0) == 0xf0 && A->rank > 0 && n < NB_MAX_RANK) {
            p[1 + n++] = 0; /* maybe not of size 1 */
        }
        p[0] = n;
        return true;
    }
    case NBP_F_SLICE: {
        a = nbp_pick(P, nbp_p_ranked, NULL);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->code = NBP_SLICE;
        op->n_in = 1;
        op->in[0] = a;
        static const int64_t steps[8] = {1, 1, 2, -1, 1, 3, -2, 1};
        unsigned fl = nbp_u8(P);
        p[24] = fl & 1;
        for (int i = 0; i < A->rank; i++) {
            unsigned s0 = nbp_u8(P), s1 = nbp_u8(P), s2 = nbp_u8(P);
            p[i] = (s0 & 0x80) ? (int64_t)(s0 % 8) - 7 : (int64_t)(s0 % 7);
            p[8 + i] = (s1 & 0x40)   ? A->shape[i] + (int64_t)(s1 % 3)
                       : (s1 & 0x80) ? -(int64_t)(s1 % 6)
                                     : (int64_t)(s1 % 7);
            p[16 + i] = steps[s2 % 8];
            if (s2 == 0xff) {
                p[16 + i] = 0; /* refused */
            }
        }
        return true;
    }
    case NBP_F_CONCAT: {
        unsigned s = nbp_u8(P);
        bool stack = s & 1;
        int n = (int)((s >> 1) % 4) + 1;
        if ((s >> 3) == 0x1f) {
            n = 0; /* no vars at all */
        }
        op->code = stack ? NBP_STACK : NBP_CONCATENATE;
        p[1] = (s >> 1) & 1; /* with n = 0: NULL xs */
        if (n == 0) {
            op->n_in = 0;
            p[0] = 0;
            nbp_u8(P);
            return true;
        }
        int lim = 4;
        a = nbp_pick(P, stack ? nbp_p_rank_le : nbp_p_ranked, &lim);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        int ax = nbp_axis_byte(P, stack ? A->rank + 1 : A->rank);
        p[0] = ax;
        op->n_in = n;
        op->in[0] = a;
        nbp_concat_ud cu = {A, ax < 0 ? ax + A->rank : ax};
        for (int i = 1; i < n; i++) {
            b = nbp_pick(P, stack ? nbp_p_same_shape : nbp_p_concat, stack ? (const void *)A : &cu);
            op->in[i] = b < 0 ? a : b;
        }
        return true;
    }
    case NBP_F_PAD: {
        a = nbp_pick(P, NULL, NULL);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->code = NBP_PAD;
        op->n_in = 1;
        op->in[0] = a;
        for (int i = 0; i < A->rank; i++) {
            unsigned s = nbp_u8(P);
            p[i] = s % 3;
            p[8 + i] = (s >> 2) % 3;
            if (s == 0xff) {
                p[i] = -1; /* refused */
            }
        }
        op->f[0] = nbp_special(nbp_u8(P));
        return true;
    }
    case NBP_F_TAKE: {
        unsigned s = nbp_u8(P);
        int which = (int)(s % 3);
        bool inl = (s >> 2) & 1;
        p[1] = inl;
        p[2] = (s & 8) ? NB_DTYPE_I64 : NB_DTYPE_I32;
        p[3] = (s >> 4) % 5;
        p[4] = nbp_sbyte(P, -2, 3);
        p[5] = nbp_sbyte(P, -3, 6);
        if (which == 2) { /* one_hot */
            op->code = NBP_ONE_HOT;
            p[0] = nbp_sbyte(P, 0, 5);
            p[6] = nbp_u8(P) % 5;
            if (!inl) {
                a = nbp_pick(P, nbp_p_int, NULL);
                if (a < 0) {
                    p[1] = 1;
                } else {
                    op->n_in = 1;
                    op->in[0] = a;
                }
            }
            return true;
        }
        a = nbp_pick(P, nbp_p_ranked, NULL);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->n_in = 1;
        op->in[0] = a;
        p[0] = nbp_axis_byte(P, A->rank);
        if (which == 0) {
            op->code = NBP_TAKE;
            if (!inl) {
                b = nbp_pick(P, nbp_p_int, NULL);
                if (b < 0) {
                    p[1] = 1;
                } else {
                    op->n_in = 2;
                    op->in[1] = b;
                }
            }
            if (A->size * (p[1] ? p[3] : P->vals[op->in[op->n_in - 1]].size) > NBP_MAX_SIZE * 8) {
                return false;
            }
            return true;
        }
        op->code = NBP_TAKE_ALONG;
        if (!inl) {
            b = nbp_pick(P, nbp_p_along, A);
            if (b < 0) {
                p[1] = 1;
            } else {
                op->n_in = 2;
                op->in[1] = b;
            }
        }
        /* inline indices: x's shape with the axis dim p[3] and, by bits, other dims 1 */
        unsigned ones = nbp_u8(P);
        int ax = (int)(p[0] < 0 ? p[0] + A->rank : p[0]);
        p[6] = A->rank;
        p[7] = ax >= 0 && ax < A->rank ? ax : 0;
        for (int i = 0; i < A->rank; i++) {
            p[8 + i] = i == ax ? p[3] : (ones & (1u << i)) ? 1 : A->shape[i];
        }
        /* the gradient's mask is [result, dim of the axis] (repro/take_grad.c): keep it
         * small */
        if (ax >= 0 && ax < A->rank) {
            const nbp_val *I = op->n_in == 2 ? &P->vals[op->in[1]] : NULL;
            int64_t m = I != NULL && I->rank == A->rank ? I->shape[ax] : p[3];
            int64_t isize = I != NULL ? I->size : 1;
            if (A->size * m > (1 << 20) || isize * A->shape[ax] > (1 << 20)) {
                return false;
            }
        }
        return true;
    }
    case NBP_F_DYN: {
        unsigned s = nbp_u8(P);
        bool upd = s & 1;
        a = nbp_pick(P, NULL, NULL);
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->code = upd ? NBP_DYN_UPDATE : NBP_DYN_SLICE;
        op->n_in = 1;
        op->in[0] = a;
        p[25] = (s & 2) ? NB_DTYPE_I64 : NB_DTYPE_I32;
        if (upd) {
            b = (s & 4) ? -1 : nbp_pick(P, nbp_p_update, A);
            p[26] = b < 0;
            op->f[0] = nbp_special(nbp_u8(P));
            if (b >= 0) {
                op->n_in = 2;
                op->in[1] = b;
            }
        }
        for (int d = 0; d < A->rank; d++) {
            unsigned z = nbp_u8(P), st = nbp_u8(P);
            p[d] = (int64_t)(z % (unsigned)(A->shape[d] + 1));
            if (z == 0xff) {
                p[d] = A->shape[d] + 1; /* too big */
            }
            if (upd && b >= 0) {
                p[d] = P->vals[b].shape[d];
            }
            p[8 + d] = (int64_t)(st % 9) - 3;
            p[16 + d] = -1;
            if ((st & 0xc0) == 0xc0 && op->n_in < NBP_MAX_IN) {
                int sv = nbp_pick(P, nbp_p_int0, NULL);
                if (sv >= 0) {
                    p[16 + d] = op->n_in;
                    op->in[op->n_in++] = sv;
                }
            }
        }
        return true;
    }
    case NBP_F_MATMUL: {
        unsigned s = nbp_u8(P);
        bool dot = s % 4 == 3;
        op->code = dot ? NBP_DOT : NBP_MATMUL;
        a = nbp_pick(P, dot ? nbp_p_vector : nbp_p_ranked_numeric, NULL);
        if (a < 0 && dot) {
            dot = false;
            op->code = NBP_MATMUL;
            a = nbp_pick(P, nbp_p_ranked_numeric, NULL);
        }
        if (a < 0) {
            return false;
        }
        A = &P->vals[a];
        op->in[0] = a;
        op->n_in = 1;
        b = (s & 4) ? -1 : nbp_pick(P, dot ? nbp_p_dot : nbp_p_matmul, A);
        if (b >= 0) {
            op->in[1] = b;
            op->n_in = 2;
            return true;
        }
        /* an inline iota right operand that fits */
        p[0] = 1;
        int64_t k = A->rank >= 1 ? A->shape[A->rank - 1] : 1;
        int64_t m = nbp_sbyte(P, 0, 4);
        if (dot || (s & 8)) {
            p[1] = 1, p[2] = k;
        } else if (s & 16) { /* batched: [batch, k, m] */
            p[1] = 3, p[2] = A->rank >= 3 ? A->shape[A->rank - 3] : nbp_sbyte(P, 1, 5), p[3] = k,
            p[4] = m;
        } else {
            p[1] = 2, p[2] = k, p[3] = m;
        }
        p[10] = (s >> 5) % (unsigned)p[1];
        return true;
    }
    case NBP_F_SOURCE: {
        unsigned s = nbp_u8(P);
        static const nb_dtype dts[8] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_I32,  NB_DTYPE_F64,
                                        NB_DTYPE_I64, NB_DTYPE_F32, NB_DTYPE_BOOL, NB_DTYPE_F64};
        p[0] = dts[(s >> 2) % 8];
        int which = (int)(s % 3);
        if (which == 0 && p[0] == NB_DTYPE_BOOL && s != 0xff) {
            p[0] = NB_DTYPE_I32; /* (iota of bool is refused) */
        }
        op->code = which == 0 ? NBP_IOTA : which == 1 ? NBP_FULL : NBP_SCALAR_TYPED;
        p[1] = which == 2 ? 0 : nbp_sbyte(P, which == 0 ? 1 : 0, 3);
        for (int i = 0; i < p[1]; i++) {
            p[2 + i] = nbp_sbyte(P, 0, 5);
        }
        p[10] = p[1] > 0 ? nbp_u8(P) % (unsigned)p[1] : 0;
        op->f[0] = nbp_special(nbp_u8(P));
        op->n_in = 0;
        return true;
    }
    case NBP_F_RNG: {
        unsigned s = nbp_u8(P);
        op->code = NBP_RNG_BITS + (int)(s % 8);
        int key = (s & 8) ? nbp_pick(P, nbp_p_key, NULL) : -1;
        p[0] = key < 0;
        p[1] = nbp_u8(P);
        if (key >= 0) {
            op->in[op->n_in++] = key;
        }
        unsigned d = nbp_u8(P);
        p[2] = (d & 1) ? NB_DTYPE_F64 : NB_DTYPE_F32;
        if (d == 0xff) {
            p[2] = NB_DTYPE_I32; /* refused for the float samplers */
        }
        p[3] = (d >> 1) % 3;
        for (int i = 0; i < p[3]; i++) {
            p[4 + i] = nbp_sbyte(P, 0, 4);
        }
        /* bounds and probabilities, the last ones (1 in 16) refused */
        static const double lims[16][2] = {
            {0, 1},  {-1, 1}, {-2, 2}, {0.5, 3}, {-3, 0.5},   {0, 1e-300}, {-1e300, 1e300}, {1, 2},
            {-4, 4}, {0, 1},  {-1, 1}, {2, 3},   {-0.5, 0.5}, {-10, 10},   {0, 2},          {1, 1}};
        static const double probs[16] = {0.5,    0.0,  1.0,  0.3, 0.99, 0.01, 0.5, 0.7,
                                         1e-300, 0.25, 0.75, 0.5, 0.1,  0.9,  0.6, 1.5};
        unsigned l = nbp_u8(P);
        op->f[0] = op->code == NBP_RNG_BERNOULLI ? probs[l % 16] : lims[l % 16][0];
        op->f[1] = lims[l % 16][1];
        if (l == 0xff) {
            op->f[0] = NAN;
        }
        unsigned nn = nbp_u8(P);
        p[8] = nn == 0xff ? 0 : 1 + (int64_t)(nn % 5);
        if (op->code == NBP_RNG_FOLD_IN) {
            int dv = (s & 16) ? nbp_pick(P, nbp_p_int0, NULL) : -1;
            p[9] = dv < 0;
            p[10] = (int64_t)nbp_u8(P) - 128;
            if (dv >= 0) {
                op->in[op->n_in++] = dv;
            }
        }
        return true;
    }
    default: { /* NBP_F_LOOP */
        unsigned s = nbp_u8(P);
        static const int codes[6] = {NBP_FORI, NBP_SCAN, NBP_WHILE, NBP_COND, NBP_SWITCH, NBP_CALL};
        op->code = codes[s % 6];
        unsigned k = nbp_u8(P), ms = nbp_u8(P), u = nbp_u8(P), cs = nbp_u8(P);
        p[2] = k % 3; /* lax, checkpointed, bounded */
        /* max_steps: mostly 0 (fori, scan: the trip count; while: unbounded, so a
         * bounded while gets 8) or enough; 1 in 32 too few (refused by fori and scan) */
        p[3] = ms % 2 == 0 ? 0 : 5 + (int64_t)(ms >> 1) % 4;
        if (ms % 32 == 31) {
            p[3] = (ms >> 5) % 3;
        }
        p[4] = (k >> 2) % 3; /* checkpoints */
        op->f[0] = nbp_loop_consts[cs % 8];
        op->f[1] = nbp_loop_consts[(cs >> 3) % 8];
        op->f[2] = nbp_loop_consts[(cs >> 5) % 8];
        int x = -1;
        if (op->code == NBP_COND || op->code == NBP_SWITCH) {
            int pr = nbp_pick(P, NULL, NULL);
            x = nbp_pick(P, nbp_p_small_numeric, NULL);
            if (pr < 0 || x < 0) {
                return false;
            }
            op->n_in = 2;
            op->in[0] = pr;
            op->in[1] = x;
            p[0] = op->code == NBP_SWITCH ? 1 + (int64_t)(k >> 4) % 3 : 2;
        } else {
            x = nbp_pick(P, nbp_p_small_numeric, NULL);
            if (x < 0) {
                return false;
            }
            op->n_in = 1;
            op->in[0] = x;
        }
        bool isint = !nbp_is_float(P->vals[x].dt);
        for (int i = 0; i < 4; i++) {
            unsigned uc = (u >> (2 * i)) * 7 + (unsigned)i * 3 + (k >> 5);
            p[5 + i] = isint ? uc % NBP_U_INT : uc % NBP_U_COUNT;
        }
        switch (op->code) {
        case NBP_FORI:
            p[0] = (s >> 3) % 3;
            p[1] = (s >> 5) % 6;
            break;
        case NBP_SCAN: {
            p[6] = (s >> 3) & 1; /* no xs */
            p[7] = (s >> 4) % 4;
            if (!p[6]) {
                int xs = nbp_pick(P, nbp_p_scan_xs, NULL);
                if (xs < 0 || !nbp_p_scan_xs(P, &P->vals[xs], NULL)) { /* (0xff picks any) */
                    p[6] = 1;
                } else {
                    op->in[op->n_in++] = xs;
                    p[7] = P->vals[xs].shape[0] + (s == 0xff ? 1 : 0);
                    if (!nbp_is_float(P->vals[xs].dt)) {
                        p[8] %= NBP_U_INT;
                    }
                }
            }
            break;
        }
        case NBP_WHILE:
            p[0] = (s >> 3) % 5;
            if (p[2] != 0 && p[3] == 0 && ms != 0xfe) {
                p[3] = 8; /* (bounded and checkpointed while loops need max_steps) */
            }
            break;
        case NBP_CALL:
            p[1] = (s >> 3) & 1; /* a non-inlined jit */
            break;
        default:
            break;
        }
        return true;
    }
    }
}

/* Record op oi's results (after a successful apply). A result too big to go on with
 * (over NBP_MAX_BIG elements, rank over 6) ends the program without the op: it stays in
 * the decoding trace, unused, and is dropped from the listing. Returns false then. */
static bool nbp_record(nbp_prog *P, int oi, nb_var *const *out, int n) {
    for (int k = 0; k < n; k++) {
        if (nb_var_size(out[k]) > NBP_MAX_BIG || nb_var_rank(out[k]) > 6) {
            P->n_ops--;
            return false;
        }
    }
    nbp_op *op = &P->ops[oi];
    op->out0 = P->n_vals;
    op->n_out = n;
    for (int k = 0; k < n; k++) {
        nbp_val *v = &P->vals[P->n_vals++];
        v->dt = nb_var_dtype(out[k]);
        v->rank = nb_var_rank(out[k]);
        memcpy(v->shape, nb_var_shape(out[k]), (size_t)v->rank * sizeof(int64_t));
        v->size = nb_var_size(out[k]);
        v->op = oi;
        v->uses = 0;
    }
    for (int j = 0; j < op->n_in; j++) {
        P->vals[op->in[j]].uses++;
    }
    return true;
}

/* outputs: every value no later op used, the last value, and a quarter of the others */
void nbp_choose_outputs(nbp_prog *P) {
    P->n_outs = 0;
    for (int v = 0; v < P->n_vals; v++) {
        if (P->vals[v].uses == 0 || v == P->n_vals - 1 ||
            nbp_mix(P->seed * 131 + (uint64_t)v) % 4 == 0) {
            P->outs[P->n_outs++] = v;
        }
    }
}

/* decode ops while tracing, until the bytes or the room run out or an op is refused */
void nbp_decode(nb_trace *tr, nbp_prog *P, nb_var **v) {
    while (P->at < P->size && P->n_ops < NBP_MAX_OPS && P->n_vals + 2 <= NBP_MAX_VALS) {
        int oi = P->n_ops;
        nbp_op *op = &P->ops[oi];
        memset(op, 0, sizeof *op);
        if (!nbp_decode_fields(P, op)) {
            continue;
        }
        P->n_ops++;
        nb_var *ins[NBP_MAX_IN], *outs[2] = {NULL, NULL};
        for (int j = 0; j < op->n_in; j++) {
            ins[j] = v[op->in[j]];
        }
        int n = nbp_apply(tr, P, oi, ins, outs);
        bool poison = nb_trace_status(tr) != NB_OK;
        for (int k = 0; k < n; k++) {
            poison = poison || outs[k] == NULL || nb_var_is_poison(outs[k]);
        }
        if (n == 0 && nb_trace_status(tr) == NB_OK) {
            nbp_fail(nb_trace_ctx(tr), "%s returned NULL without recording an error on the trace",
                     nbp_op_names[op->code]);
        }
        if (poison) {
            if (nb_trace_status(tr) == NB_OK) {
                nbp_fail(nb_trace_ctx(tr), "%s returned poison but the trace's status is OK",
                         nbp_op_names[op->code]);
            }
            P->rejected_op = oi;
            return;
        }
        for (int k = 0; k < n; k++) {
            v[P->n_vals + k] = outs[k];
        }
        if (!nbp_record(P, oi, outs, n)) {
            return; /* too big to go on with */
        }
    }
}

/* ---- the header ----------------------------------------------------------------------------- */

void nbp_decode_header(nbp_prog *P) {
    static const nb_dtype dts[8] = {NB_DTYPE_F32, NB_DTYPE_F64, NB_DTYPE_F32, NB_DTYPE_F64,
                                    NB_DTYPE_I32, NB_DTYPE_F64, NB_DTYPE_I64, NB_DTYPE_BOOL};
    static const int64_t dims[8] = {1, 2, 3, 4, 5, 0, 2, 3};
    unsigned f0 = nbp_u8(P), f1 = nbp_u8(P);
    P->flags = f0 & (NBP_GRAD_POSITIVE | NBP_EXTRA_STATIC | NBP_EXTRA_NULL);
    P->flags |= (f1 & 0x03) != 0 ? NBP_NO_THREADS : 0u;
    P->flags |= (f1 & 0x0c) == 0x0c ? NBP_DONATE : 0u;
    P->flags |= (f1 & 0x10) != 0 ? NBP_NO_GRAD : 0u;
    P->flags |= (f1 & 0x20) != 0 ? NBP_NO_HESS : 0u;
    P->flags |= (f1 & 0xc0) == 0xc0 ? NBP_GRAD_SPECIAL : 0u;
    P->flags |= (f0 & 0x07) == 0x07 ? NBP_OOM : 0u;
    P->seed = nbp_u8(P);
    P->seed = P->seed * 256 + nbp_u8(P);
    P->n_inputs = (int)(nbp_u8(P) % (NBP_MAX_INPUTS + 1));
    int leaves = 0;
    for (int k = 0; k < P->n_inputs; k++) {
        nbp_input *in = &P->in[k];
        in->dt = dts[nbp_u8(P) % 8];
        in->rank = (int)(nbp_u8(P) % 4);
        for (int i = 0; i < in->rank; i++) {
            in->shape[i] = dims[nbp_u8(P) % 8];
        }
        unsigned m = nbp_u8(P);
        in->kind = (int)(m % 4);
        in->fill = (int)((m >> 2) % NBP_FILL_COUNT);
        in->tie = -1;
        /* one program in about 32: a first input long enough (16385..40000 elements in the
         * last dim) that kernels split it into several chunks, so that R2 compares thread
         * counts that really split the work */
        if (k == 0 && (m >> 5) == 7 && (P->seed & 3) == 0 && in->rank >= 1) {
            static const int64_t longs[3] = {16385, 32771, 40000};
            for (int i = 0; i < in->rank - 1; i++) {
                in->shape[i] = in->rank == 3 || in->shape[i] == 0 ? 1
                               : in->shape[i] > 2                 ? 2
                                                                  : in->shape[i];
            }
            in->shape[in->rank - 1] = longs[(P->seed >> 2) % 3];
        }
        if (in->kind == NBP_IN_TIED) {
            for (int j = k - 1; j >= 0; j--) {
                if (P->in[j].kind == NBP_IN_PARAM) {
                    in->tie = j;
                    break;
                }
            }
            if (in->tie < 0) {
                in->kind = NBP_IN_PARAM;
            } else {
                const nbp_input *t = &P->in[in->tie];
                in->dt = t->dt;
                in->rank = t->rank;
                memcpy(in->shape, t->shape, sizeof in->shape);
                in->fill = t->fill;
            }
        }
        in->leaf = in->kind == NBP_IN_CONST ? -1 : leaves++;
        /* the input's op and value */
        nbp_op *op = &P->ops[k];
        memset(op, 0, sizeof *op);
        op->code = in->kind == NBP_IN_CONST ? NBP_CONST : NBP_PARAM;
        op->p[0] = k;
        op->n_out = 1;
        op->out0 = k;
        nbp_val *v = &P->vals[k];
        v->dt = in->dt;
        v->rank = in->rank;
        memcpy(v->shape, in->shape, sizeof v->shape);
        v->size = nbp_size_of(in->rank, in->shape);
        v->op = k;
        v->uses = 0;
    }
    P->n_leaves =
        leaves + ((P->flags & NBP_EXTRA_STATIC) ? 1 : 0) + ((P->flags & NBP_EXTRA_NULL) ? 1 : 0);
    P->n_ops = P->n_vals = P->n_inputs;
}
