/*
 * op_elementwise.c -- elementwise unary, binary (broadcasting), comparison, logical,
 * select and cast ops: builders, shape/dtype inference and kernels.
 *
 * Accuracy: transcendental functions go through SLEEF's vector functions (vmath.h): u10
 * for exp, expm1, log, log1p, sin, cos, tan, erf and pow (at most 1.0 ULP), u35 for tanh
 * (at most 3.5 ULP, an activation where that suffices); sqrt and
 * division are correctly rounded (IEEE). Composite activations (sigmoid, softplus, gelu)
 * are evaluated in their stable forms from those: sigmoid as 1/(1+e) or e/(1+e) with
 * e = exp(-|x|), softplus as max(x,0) + log1p(exp(-|x|)), and gelu's tanh form through the
 * identity (1 + tanh(u))/2 = sigmoid(2u), which avoids the cancellation the textbook form
 * suffers where tanh(u) is near -1 (there it loses ~80 ulp in f32).
 * Integer arithmetic wraps (two's complement, computed in unsigned to avoid C's undefined
 * overflow); integer division by zero gives 0.
 */
#include "ad/ir.h"
#include "exec/vmath.h"

#include <math.h>
#include <string.h>

#define NBI_TILE 256

/* ---- dtype classes ------------------------------------------------------------------ */

static bool nbi_is_numeric(nb_dtype d) {
    return d != NB_DTYPE_BOOL;
}

/* Unary ops defined on floats only (the rest also take integers; logical_not only bool). */
static bool nbi_unary_float_only(nbi_op op) {
    switch (op) {
    case NBI_OP_NEG:
    case NBI_OP_ABS:
    case NBI_OP_SIGN:
    case NBI_OP_SQUARE:
    case NBI_OP_RELU:
    case NBI_OP_LOGICAL_NOT:
    case NBI_OP_CAST:
        return false;
    default:
        return true;
    }
}

/* ---- inference ---------------------------------------------------------------------- */

static nb_status nbi_infer_unary(nb_trace *tr, nb_var *p) {
    const nb_var *x = p->in[0];
    nbi_op op = (nbi_op)p->op;
    char sig[NBI_SIG_CAP];
    if (op == NBI_OP_LOGICAL_NOT) {
        if (x->dtype != NB_DTYPE_BOOL) {
            return nbi_trace_err(tr, NB_ERR_DTYPE,
                                 "nb_logical_not: operand is %s; it must be bool (compare "
                                 "first, e.g. nb_ne(x, nb_scalar(tr, 0)))",
                                 nbi_var_sig(sig, sizeof sig, x));
        }
    } else if (op == NBI_OP_CAST) {
        if (nbi_dsize(p->at.to) == 0) {
            return nbi_trace_err(tr, NB_ERR_DTYPE, "nb_cast: unknown target dtype %d",
                                 (int)p->at.to);
        }
    } else if (nbi_unary_float_only(op) ? !nb_dtype_is_float(x->dtype)
                                        : !nbi_is_numeric(x->dtype)) {
        return nbi_trace_err(tr, NB_ERR_DTYPE, "nb_%s: operand is %s; it needs %s (use nb_cast)",
                             nbi_op_name(op), nbi_var_sig(sig, sizeof sig, x),
                             nbi_unary_float_only(op) ? "a float dtype (f32 or f64)"
                                                      : "a numeric dtype (not bool)");
    }
    p->dtype = op == NBI_OP_CAST ? p->at.to : x->dtype;
    p->rank = x->rank;
    memcpy(p->shape, x->shape, sizeof p->shape);
    if ((x->flags & NBI_NODE_WEAK) && op != NBI_OP_CAST) {
        p->flags |= NBI_NODE_WEAK;
    }
    return NB_OK;
}

static bool nbi_is_compare(nbi_op op) {
    return op == NBI_OP_EQ || op == NBI_OP_NE || op == NBI_OP_LT || op == NBI_OP_LE ||
           op == NBI_OP_GT || op == NBI_OP_GE;
}

static nb_status nbi_bcast_or_err(nb_trace *tr, const char *name, int n, nb_var *const *in,
                                  nb_var *p) {
    int r = in[0]->rank;
    int64_t shape[NB_MAX_RANK];
    memcpy(shape, in[0]->shape, sizeof shape);
    for (int i = 1; i < n; i++) {
        int r2;
        int64_t s2[NB_MAX_RANK];
        if (!nbi_broadcast_shapes(r, shape, in[i]->rank, in[i]->shape, &r2, s2)) {
            char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
            return nbi_trace_err(tr, NB_ERR_SHAPE,
                                 "nb_%s: shapes %s and %s do not broadcast (aligned from the "
                                 "right, each dim pair must be equal or contain a 1; reshape "
                                 "or nb_expand_dims one operand)",
                                 name, nbi_var_sig(sa, sizeof sa, in[0]),
                                 nbi_var_sig(sb, sizeof sb, in[i]));
        }
        r = r2;
        memcpy(shape, s2, sizeof shape);
    }
    p->rank = (int8_t)r;
    memcpy(p->shape, shape, sizeof shape);
    return NB_OK;
}

static nb_status nbi_infer_binary(nb_trace *tr, nb_var *p) {
    const nb_var *a = p->in[0], *b = p->in[1];
    nbi_op op = (nbi_op)p->op;
    const char *name = nbi_op_name(op);
    char sa[NBI_SIG_CAP], sb[NBI_SIG_CAP];
    if (a->dtype != b->dtype) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_%s: dtypes differ: %s and %s (convert one with nb_cast)", name,
                             nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    if (op == NBI_OP_LOGICAL_AND || op == NBI_OP_LOGICAL_OR) {
        if (a->dtype != NB_DTYPE_BOOL) {
            return nbi_trace_err(tr, NB_ERR_DTYPE,
                                 "nb_%s: operands are %s and %s; they must be bool", name,
                                 nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
        }
    } else if (op == NBI_OP_POW) {
        if (!nb_dtype_is_float(a->dtype)) {
            return nbi_trace_err(tr, NB_ERR_DTYPE,
                                 "nb_pow: operands are %s and %s; pow needs a "
                                 "float dtype (use nb_cast, or nb_mul for small integer powers)",
                                 nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
        }
    } else if (!nbi_is_compare(op) && !nbi_is_numeric(a->dtype)) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_%s: operands are %s and %s; arithmetic needs a numeric dtype "
                             "(use nb_logical_and/or for bool, or nb_cast)",
                             name, nbi_var_sig(sa, sizeof sa, a), nbi_var_sig(sb, sizeof sb, b));
    }
    nb_status st = nbi_bcast_or_err(tr, name, 2, p->in, p);
    if (st != NB_OK) {
        return st;
    }
    p->dtype = (nbi_is_compare(op) || op == NBI_OP_LOGICAL_AND || op == NBI_OP_LOGICAL_OR)
                   ? NB_DTYPE_BOOL
                   : a->dtype;
    if ((a->flags & NBI_NODE_WEAK) && (b->flags & NBI_NODE_WEAK) && p->dtype != NB_DTYPE_BOOL) {
        p->flags |= NBI_NODE_WEAK;
    }
    return NB_OK;
}

static nb_status nbi_infer_select(nb_trace *tr, nb_var *p) {
    const nb_var *c = p->in[0], *a = p->in[1], *b = p->in[2];
    char s0[NBI_SIG_CAP], s1[NBI_SIG_CAP];
    if (c->dtype != NB_DTYPE_BOOL) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_select: the condition is %s; it must be bool (a comparison)",
                             nbi_var_sig(s0, sizeof s0, c));
    }
    if (a->dtype != b->dtype) {
        return nbi_trace_err(tr, NB_ERR_DTYPE,
                             "nb_select: the branches differ in dtype: %s and %s (use nb_cast)",
                             nbi_var_sig(s0, sizeof s0, a), nbi_var_sig(s1, sizeof s1, b));
    }
    nb_status st = nbi_bcast_or_err(tr, "select", 3, p->in, p);
    p->dtype = a->dtype;
    if ((a->flags & NBI_NODE_WEAK) && (b->flags & NBI_NODE_WEAK)) {
        p->flags |= NBI_NODE_WEAK; /* select of two weak scalars stays weak, as in JAX */
    }
    return st;
}

/* ---- builders ----------------------------------------------------------------------- */

static nb_var *nbi_unary(nbi_op op, nb_var *x, const nbi_attrs *at) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(1, &x, &poisoned);
    return tr ? nbi_emit(tr, op, 1, &x, at) : NULL;
}

/* A rank-0 FULL node of dtype holding value. */
static nb_var *nbi_full0(nb_trace *tr, nb_dtype dtype, double value) {
    return nb_full(tr, dtype, 0, NULL, value);
}

/* Give weak operands the dtype of the first non-weak one (JAX's weak types). */
static void nbi_unweak(nb_trace *tr, int n, nb_var **in) {
    const nb_var *strong = NULL;
    for (int i = 0; i < n; i++) {
        if (!(in[i]->flags & NBI_NODE_WEAK)) {
            strong = in[i];
            break;
        }
    }
    if (strong == NULL) {
        return;
    }
    for (int i = 0; i < n; i++) {
        if ((in[i]->flags & NBI_NODE_WEAK) && in[i]->dtype != strong->dtype) {
            if (in[i]->op == NBI_OP_FULL && in[i]->rank == 0) {
                in[i] = nbi_full0(tr, strong->dtype, in[i]->at.value);
            } else {
                in[i] = nb_cast(in[i], strong->dtype);
            }
        }
    }
}

static nb_var *nbi_nary(nbi_op op, int n, nb_var **in) {
    bool poisoned;
    nb_trace *tr = nbi_trace_of(n, in, &poisoned);
    if (tr == NULL) {
        return NULL;
    }
    if (!poisoned) {
        nbi_unweak(tr, op == NBI_OP_SELECT ? n - 1 : n, op == NBI_OP_SELECT ? in + 1 : in);
    }
    return nbi_emit(tr, op, n, in, NULL);
}

static nb_var *nbi_binary(nbi_op op, nb_var *a, nb_var *b) {
    nb_var *in[2] = {a, b};
    return nbi_nary(op, 2, in);
}

nb_var *nb_neg(nb_var *x) {
    return nbi_unary(NBI_OP_NEG, x, NULL);
}
nb_var *nb_abs(nb_var *x) {
    return nbi_unary(NBI_OP_ABS, x, NULL);
}
nb_var *nb_sign(nb_var *x) {
    return nbi_unary(NBI_OP_SIGN, x, NULL);
}
nb_var *nb_exp(nb_var *x) {
    return nbi_unary(NBI_OP_EXP, x, NULL);
}
nb_var *nb_expm1(nb_var *x) {
    return nbi_unary(NBI_OP_EXPM1, x, NULL);
}
nb_var *nb_log(nb_var *x) {
    return nbi_unary(NBI_OP_LOG, x, NULL);
}
nb_var *nb_log1p(nb_var *x) {
    return nbi_unary(NBI_OP_LOG1P, x, NULL);
}
nb_var *nb_sqrt(nb_var *x) {
    return nbi_unary(NBI_OP_SQRT, x, NULL);
}
nb_var *nb_rsqrt(nb_var *x) {
    return nbi_unary(NBI_OP_RSQRT, x, NULL);
}
nb_var *nb_square(nb_var *x) {
    return nbi_unary(NBI_OP_SQUARE, x, NULL);
}
nb_var *nb_reciprocal(nb_var *x) {
    return nbi_unary(NBI_OP_RECIPROCAL, x, NULL);
}
nb_var *nb_sin(nb_var *x) {
    return nbi_unary(NBI_OP_SIN, x, NULL);
}
nb_var *nb_cos(nb_var *x) {
    return nbi_unary(NBI_OP_COS, x, NULL);
}
nb_var *nb_tan(nb_var *x) {
    return nbi_unary(NBI_OP_TAN, x, NULL);
}
nb_var *nb_tanh(nb_var *x) {
    return nbi_unary(NBI_OP_TANH, x, NULL);
}
nb_var *nb_sigmoid(nb_var *x) {
    return nbi_unary(NBI_OP_SIGMOID, x, NULL);
}
nb_var *nb_relu(nb_var *x) {
    return nbi_unary(NBI_OP_RELU, x, NULL);
}
nb_var *nb_gelu(nb_var *x) {
    return nbi_unary(NBI_OP_GELU, x, NULL);
}
nb_var *nb_softplus(nb_var *x) {
    return nbi_unary(NBI_OP_SOFTPLUS, x, NULL);
}
nb_var *nb_erf(nb_var *x) {
    return nbi_unary(NBI_OP_ERF, x, NULL);
}
nb_var *nb_logical_not(nb_var *x) {
    return nbi_unary(NBI_OP_LOGICAL_NOT, x, NULL);
}

nb_var *nb_cast(nb_var *x, nb_dtype dtype) {
    if (x != NULL && !(x->flags & NBI_NODE_POISON) && x->dtype == dtype &&
        !(x->flags & NBI_NODE_WEAK)) {
        return x; /* a no-op cast adds no node */
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.to = dtype;
    return nbi_unary(NBI_OP_CAST, x, &at);
}

nb_var *nb_add(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_ADD, a, b);
}
nb_var *nb_sub(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_SUB, a, b);
}
nb_var *nb_mul(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_MUL, a, b);
}
nb_var *nb_div(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_DIV, a, b);
}
nb_var *nb_pow(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_POW, a, b);
}
nb_var *nb_maximum(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_MAXIMUM, a, b);
}
nb_var *nb_minimum(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_MINIMUM, a, b);
}
nb_var *nb_eq(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_EQ, a, b);
}
nb_var *nb_ne(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_NE, a, b);
}
nb_var *nb_lt(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_LT, a, b);
}
nb_var *nb_le(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_LE, a, b);
}
nb_var *nb_gt(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_GT, a, b);
}
nb_var *nb_ge(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_GE, a, b);
}
nb_var *nb_logical_and(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_LOGICAL_AND, a, b);
}
nb_var *nb_logical_or(nb_var *a, nb_var *b) {
    return nbi_binary(NBI_OP_LOGICAL_OR, a, b);
}

nb_var *nb_select(nb_var *cond, nb_var *a, nb_var *b) {
    nb_var *in[3] = {cond, a, b};
    return nbi_nary(NBI_OP_SELECT, 3, in);
}

/* ---- unary kernels ------------------------------------------------------------------ */

/* Float unary ops over n contiguous elements, for T = float/double. Tiles of NBI_TILE go
 * through the vector-math table where an op needs a transcendental. */
#define NBI_DEF_UNARY_FLOAT(T, SFX, VM, ABS, SQRT, ATTR)                                           \
    ATTR static void nbi_unary_##SFX(nbi_op op, T *o, const T *x, int64_t n) {                     \
        const nbi_vmath *vm = nbi_vmath_get();                                                     \
        T t[NBI_TILE], u[NBI_TILE];                                                                \
        switch (op) {                                                                              \
        case NBI_OP_NEG:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = -x[i];                                                                      \
            return;                                                                                \
        case NBI_OP_ABS:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = ABS(x[i]);                                                                  \
            return;                                                                                \
        case NBI_OP_SIGN:                                                                          \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = x[i] > 0 ? (T)1 : x[i] < 0 ? (T)-1 : x[i];                                  \
            return;                                                                                \
        case NBI_OP_EXP:                                                                           \
            vm->VM[NBI_VM_EXP](o, x, n);                                                           \
            return;                                                                                \
        case NBI_OP_EXPM1:                                                                         \
            vm->VM[NBI_VM_EXPM1](o, x, n);                                                         \
            return;                                                                                \
        case NBI_OP_LOG:                                                                           \
            vm->VM[NBI_VM_LOG](o, x, n);                                                           \
            return;                                                                                \
        case NBI_OP_LOG1P:                                                                         \
            vm->VM[NBI_VM_LOG1P](o, x, n);                                                         \
            return;                                                                                \
        case NBI_OP_SIN:                                                                           \
            vm->VM[NBI_VM_SIN](o, x, n);                                                           \
            return;                                                                                \
        case NBI_OP_COS:                                                                           \
            vm->VM[NBI_VM_COS](o, x, n);                                                           \
            return;                                                                                \
        case NBI_OP_TAN:                                                                           \
            vm->VM[NBI_VM_TAN](o, x, n);                                                           \
            return;                                                                                \
        case NBI_OP_TANH:                                                                          \
            vm->VM[NBI_VM_TANH](o, x, n);                                                          \
            return;                                                                                \
        case NBI_OP_ERF:                                                                           \
            vm->VM[NBI_VM_ERF](o, x, n);                                                           \
            return;                                                                                \
        case NBI_OP_SQRT:                                                                          \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = SQRT(x[i]);                                                                 \
            return;                                                                                \
        case NBI_OP_RSQRT:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = (T)1 / SQRT(x[i]);                                                          \
            return;                                                                                \
        case NBI_OP_SQUARE:                                                                        \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = x[i] * x[i];                                                                \
            return;                                                                                \
        case NBI_OP_RECIPROCAL:                                                                    \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = (T)1 / x[i];                                                                \
            return;                                                                                \
        case NBI_OP_RELU:                                                                          \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = (x[i] > 0 || x[i] != x[i]) ? x[i] : (T)0;                                   \
            return;                                                                                \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
        for (int64_t i0 = 0; i0 < n; i0 += NBI_TILE) {                                             \
            int64_t m = n - i0 < NBI_TILE ? n - i0 : NBI_TILE;                                     \
            const T *xs = x + i0;                                                                  \
            T *os = o + i0;                                                                        \
            switch (op) {                                                                          \
            case NBI_OP_SIGMOID: /* e = exp(-|x|); x >= 0: 1/(1+e), else e/(1+e) */                \
                for (int64_t i = 0; i < m; i++)                                                    \
                    t[i] = -ABS(xs[i]);                                                            \
                vm->VM[NBI_VM_EXP](u, t, m);                                                       \
                for (int64_t i = 0; i < m; i++) /* a select, then one division: vectorised */      \
                    os[i] = (xs[i] >= 0 ? (T)1 : u[i]) / ((T)1 + u[i]);                            \
                break;                                                                             \
            case NBI_OP_SOFTPLUS: /* max(x,0) + log1p(exp(-|x|)) */                                \
                for (int64_t i = 0; i < m; i++)                                                    \
                    t[i] = -ABS(xs[i]);                                                            \
                vm->VM[NBI_VM_EXP](u, t, m);                                                       \
                vm->VM[NBI_VM_LOG1P](t, u, m);                                                     \
                for (int64_t i = 0; i < m; i++)                                                    \
                    os[i] = (xs[i] > 0 ? xs[i] : (T)0) + t[i];                                     \
                break;                                                                             \
            case NBI_OP_GELU: /* x/2 (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi)(x +             \
                                 0.044715 x^3): no cancellation where tanh(u) -> -1 */             \
                for (int64_t i = 0; i < m; i++)                                                    \
                    t[i] = -ABS((T)1.5957691216057308 *                                            \
                                (xs[i] + (T)0.044715 * xs[i] * xs[i] * xs[i]));                    \
                vm->VM[NBI_VM_EXP](u, t, m);                                                       \
                for (int64_t i = 0; i < m; i++) {                                                  \
                    T z = xs[i] + (T)0.044715 * xs[i] * xs[i] * xs[i];                             \
                    os[i] = xs[i] * ((z >= 0 ? (T)1 : u[i]) / ((T)1 + u[i]));                      \
                }                                                                                  \
                break;                                                                             \
            default:                                                                               \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    }

NBI_DEF_UNARY_FLOAT(float, f32_base, f32, fabsf, sqrtf, )
NBI_DEF_UNARY_FLOAT(double, f64_base, f64, fabs, sqrt, )
/* The same loops with 256-bit vectors on CPUs with AVX2 (3x faster for square, neg, abs;
 * no FMA): every operation is the same correctly rounded IEEE one, so the same bits. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
NBI_DEF_UNARY_FLOAT(float, f32_avx2, f32, fabsf, sqrtf, __attribute__((target("avx2"))))
NBI_DEF_UNARY_FLOAT(double, f64_avx2, f64, fabs, sqrt, __attribute__((target("avx2"))))
#define NBI_UNARY_PICK(S, op, o, x, n)                                                             \
    (nbi_use_avx2() ? nbi_unary_##S##_avx2(op, o, x, n) : nbi_unary_##S##_base(op, o, x, n))
#else
#define NBI_UNARY_PICK(S, op, o, x, n) nbi_unary_##S##_base(op, o, x, n)
#endif
static void nbi_unary_f32(nbi_op op, float *o, const float *x, int64_t n) {
    NBI_UNARY_PICK(f32, op, o, x, n);
}
static void nbi_unary_f64(nbi_op op, double *o, const double *x, int64_t n) {
    NBI_UNARY_PICK(f64, op, o, x, n);
}

/* Integer unary ops wrap: computed in the unsigned type U. */
#define NBI_DEF_UNARY_INT(T, U, SFX)                                                               \
    static void nbi_unary_##SFX(nbi_op op, T *o, const T *x, int64_t n) {                          \
        switch (op) {                                                                              \
        case NBI_OP_NEG:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = (T)(0u - (U)x[i]);                                                          \
            break;                                                                                 \
        case NBI_OP_ABS:                                                                           \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = x[i] < 0 ? (T)(0u - (U)x[i]) : x[i];                                        \
            break;                                                                                 \
        case NBI_OP_SIGN:                                                                          \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = (T)((x[i] > 0) - (x[i] < 0));                                               \
            break;                                                                                 \
        case NBI_OP_SQUARE:                                                                        \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = (T)((U)x[i] * (U)x[i]);                                                     \
            break;                                                                                 \
        case NBI_OP_RELU:                                                                          \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = x[i] > 0 ? x[i] : 0;                                                        \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }

NBI_DEF_UNARY_INT(int32_t, uint32_t, i32)
NBI_DEF_UNARY_INT(int64_t, uint64_t, i64)

/* Conversion of one value to an integer type: saturating, NaN -> 0. */
#define NBI_SAT(T, MIN, MAX, v)                                                                    \
    ((v) != (v) ? (T)0 : (v) <= (double)(MIN) ? (T)(MIN) : (v) >= (double)(MAX) ? (T)(MAX) : (T)(v))

/* The common conversions as plain loops the compiler vectorises: the same conversion of
 * each value as the general loop below (bool is 0 or 1; int32 and float widen exactly, and
 * narrowing rounds the same way), so the same bits. relu's derivative (bool -> float)
 * runs in every MLP's backward pass. */
#define NBI_CAST_LOOP(FROM, TO, EXPR)                                                              \
    do {                                                                                           \
        const FROM *x_ = in;                                                                       \
        TO *o_ = out;                                                                              \
        for (int64_t i = 0; i < n; i++) {                                                          \
            FROM v = x_[i];                                                                        \
            o_[i] = (EXPR);                                                                        \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

static void nbi_cast_kernel(nb_dtype from, nb_dtype to, void *out, const void *in, int64_t n) {
    if (from == NB_DTYPE_BOOL && to == NB_DTYPE_F32) {
        NBI_CAST_LOOP(uint8_t, float, v != 0 ? 1.0f : 0.0f);
    }
    if (from == NB_DTYPE_BOOL && to == NB_DTYPE_F64) {
        NBI_CAST_LOOP(uint8_t, double, v != 0 ? 1.0 : 0.0);
    }
    if (from == NB_DTYPE_F32 && to == NB_DTYPE_F64) {
        NBI_CAST_LOOP(float, double, (double)v);
    }
    if (from == NB_DTYPE_F64 && to == NB_DTYPE_F32) {
        NBI_CAST_LOOP(double, float, (float)v);
    }
    if (from == NB_DTYPE_I32 && to == NB_DTYPE_F32) {
        NBI_CAST_LOOP(int32_t, float, (float)v);
    }
    if (from == NB_DTYPE_I32 && to == NB_DTYPE_F64) {
        NBI_CAST_LOOP(int32_t, double, (double)v);
    }
    for (int64_t i = 0; i < n; i++) {
        double d = 0;
        int64_t q = 0;
        bool is_int = false;
        switch (from) {
        case NB_DTYPE_F32:
            d = ((const float *)in)[i];
            break;
        case NB_DTYPE_F64:
            d = ((const double *)in)[i];
            break;
        case NB_DTYPE_I32:
            q = ((const int32_t *)in)[i];
            is_int = true;
            break;
        case NB_DTYPE_I64:
            q = ((const int64_t *)in)[i];
            is_int = true;
            break;
        case NB_DTYPE_BOOL:
            q = ((const uint8_t *)in)[i] != 0;
            is_int = true;
            break;
        }
        switch (to) {
        case NB_DTYPE_F32:
            ((float *)out)[i] = is_int ? (float)q : (float)d;
            break;
        case NB_DTYPE_F64:
            ((double *)out)[i] = is_int ? (double)q : d;
            break;
        case NB_DTYPE_I32:
            ((int32_t *)out)[i] = is_int ? (q < INT32_MIN   ? INT32_MIN
                                            : q > INT32_MAX ? INT32_MAX
                                                            : (int32_t)q)
                                         : NBI_SAT(int32_t, INT32_MIN, INT32_MAX, d);
            break;
        case NB_DTYPE_I64:
            /* 2^63 is exact in double; values at or above it saturate. */
            ((int64_t *)out)[i] = is_int                        ? q
                                  : d != d                      ? 0
                                  : d <= -9223372036854775808.0 ? INT64_MIN
                                  : d >= 9223372036854775808.0  ? INT64_MAX
                                                                : (int64_t)d;
            break;
        case NB_DTYPE_BOOL:
            ((uint8_t *)out)[i] = is_int ? q != 0 : d != 0;
            break;
        }
    }
}

/* Elementwise work is cut into chunks of this many elements (a multiple of every vector
 * width and of NBI_TILE); the cut never depends on the thread count, and every element is
 * computed the same way in any chunk (SLEEF tails use the vector path too), so results are
 * bit-identical for any number of threads. */
#define NBI_EW_CHUNK 16384

static void nbi_unary_range(void *ud, int64_t first, int64_t n, int worker) {
    (void)worker;
    const nbi_kargs *k = ud;
    const nb_var *node = k->node;
    nbi_op op = (nbi_op)node->op;
    size_t ei = nbi_dsize(node->in[0]->dtype), eo = nbi_dsize(node->dtype);
    const unsigned char *in = (const unsigned char *)k->in[0] + (size_t)first * ei;
    unsigned char *out = (unsigned char *)k->out + (size_t)first * eo;
    if (op == NBI_OP_CAST) {
        nbi_cast_kernel(node->in[0]->dtype, node->dtype, out, in, n);
        return;
    }
    if (op == NBI_OP_LOGICAL_NOT) {
        for (int64_t i = 0; i < n; i++) {
            out[i] = !in[i];
        }
        return;
    }
    switch (node->dtype) {
    case NB_DTYPE_F32:
        nbi_unary_f32(op, (float *)out, (const float *)in, n);
        break;
    case NB_DTYPE_F64:
        nbi_unary_f64(op, (double *)out, (const double *)in, n);
        break;
    case NB_DTYPE_I32:
        nbi_unary_i32(op, (int32_t *)out, (const int32_t *)in, n);
        break;
    case NB_DTYPE_I64:
        nbi_unary_i64(op, (int64_t *)out, (const int64_t *)in, n);
        break;
    case NB_DTYPE_BOOL:
        break;
    }
}

static void nbi_k_unary(const nbi_kargs *k) {
    nbi_par_range(k->pool, k->node->size, NBI_EW_CHUNK, nbi_unary_range, (void *)k);
}

/* ---- binary kernels ----------------------------------------------------------------- */

/* o[i] = EXPR(x = a[i*sa], y = b[i*sb]) for i < n. */
typedef void (*nbi_bin_fn)(void *o, const void *a, const void *b, int64_t n, int64_t sa,
                           int64_t sb);

#define NBI_BIN(fname, T, TO, EXPR) NBI_BIN_ATTR(fname, T, TO, EXPR, )
#define NBI_BIN_ATTR(fname, T, TO, EXPR, ATTR)                                                     \
    ATTR static void fname(void *o_, const void *a_, const void *b_, int64_t n, int64_t sa,        \
                           int64_t sb) {                                                           \
        TO *o = o_;                                                                                \
        const T *a = a_, *b = b_;                                                                  \
        if (sa == 1 && sb == 1) {                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x = a[i], y = b[i];                                                              \
                o[i] = (TO)(EXPR);                                                                 \
            }                                                                                      \
        } else if (sa == 0 && sb == 1) {                                                           \
            T x = a[0];                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T y = b[i];                                                                        \
                o[i] = (TO)(EXPR);                                                                 \
            }                                                                                      \
        } else if (sa == 1 && sb == 0) {                                                           \
            T y = b[0];                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x = a[i];                                                                        \
                o[i] = (TO)(EXPR);                                                                 \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x = a[i * sa], y = b[i * sb];                                                    \
                o[i] = (TO)(EXPR);                                                                 \
            }                                                                                      \
        }                                                                                          \
    }

#define NBI_FMAX(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
#define NBI_FMIN(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define NBI_IDIV(T, U, x, y) ((y) == 0 ? (T)0 : (y) == -1 ? (T)(0u - (U)(x)) : (T)((x) / (y)))

/* Arithmetic for one numeric type: float types direct, integer types wrapping. */
#define NBI_BIN_FLOAT(T, S)                                                                        \
    NBI_BIN(nbi_badd_##S, T, T, x + y)                                                             \
    NBI_BIN(nbi_bsub_##S, T, T, x - y)                                                             \
    NBI_BIN(nbi_bmul_##S, T, T, x *y)                                                              \
    NBI_BIN(nbi_bdiv_##S, T, T, x / y)                                                             \
    NBI_BIN(nbi_bmax_##S, T, T, NBI_FMAX(x, y))                                                    \
    NBI_BIN(nbi_bmin_##S, T, T, NBI_FMIN(x, y))
#define NBI_BIN_INT(T, U, S)                                                                       \
    NBI_BIN(nbi_badd_##S, T, T, (U)x + (U)y)                                                       \
    NBI_BIN(nbi_bsub_##S, T, T, (U)x - (U)y)                                                       \
    NBI_BIN(nbi_bmul_##S, T, T, (U)x *(U)y)                                                        \
    NBI_BIN(nbi_bdiv_##S, T, T, NBI_IDIV(T, U, x, y))                                              \
    NBI_BIN(nbi_bmax_##S, T, T, x > y ? x : y)                                                     \
    NBI_BIN(nbi_bmin_##S, T, T, x < y ? x : y)
#define NBI_BIN_CMP(T, S)                                                                          \
    NBI_BIN(nbi_beq_##S, T, uint8_t, x == y)                                                       \
    NBI_BIN(nbi_bne_##S, T, uint8_t, x != y)                                                       \
    NBI_BIN(nbi_blt_##S, T, uint8_t, x < y)                                                        \
    NBI_BIN(nbi_ble_##S, T, uint8_t, x <= y)                                                       \
    NBI_BIN(nbi_bgt_##S, T, uint8_t, x > y)                                                        \
    NBI_BIN(nbi_bge_##S, T, uint8_t, x >= y)

NBI_BIN_FLOAT(float, f32)
NBI_BIN_FLOAT(double, f64)

/* Float arithmetic again with 256-bit vectors, chosen at run time on CPUs with AVX2: the
 * same IEEE operation per element (no FMA, nothing reassociated), so the same bits. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define NBI_EW_AVX2 1
#define NBI_AVX2_ATTR __attribute__((target("avx2")))
#define NBI_BIN_FLOAT_AVX2(T, S)                                                                   \
    NBI_BIN_ATTR(nbi_badd_##S##_avx2, T, T, x + y, NBI_AVX2_ATTR)                                  \
    NBI_BIN_ATTR(nbi_bsub_##S##_avx2, T, T, x - y, NBI_AVX2_ATTR)                                  \
    NBI_BIN_ATTR(nbi_bmul_##S##_avx2, T, T, x *y, NBI_AVX2_ATTR)                                   \
    NBI_BIN_ATTR(nbi_bdiv_##S##_avx2, T, T, x / y, NBI_AVX2_ATTR)
NBI_BIN_FLOAT_AVX2(float, f32)
NBI_BIN_FLOAT_AVX2(double, f64)
#else
#define NBI_EW_AVX2 0
#endif

int nbi_isa_override = -1;

bool nbi_use_avx2(void) {
#if NBI_EW_AVX2
    /* __builtin_cpu_supports reads what libgcc recorded at start-up */
    return nbi_isa_override != 0 && __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}
NBI_BIN_INT(int32_t, uint32_t, i32)
NBI_BIN_INT(int64_t, uint64_t, i64)
NBI_BIN_CMP(float, f32)
NBI_BIN_CMP(double, f64)
NBI_BIN_CMP(int32_t, i32)
NBI_BIN_CMP(int64_t, i64)
NBI_BIN_CMP(uint8_t, b8)
NBI_BIN(nbi_band_b8, uint8_t, uint8_t, x &&y)
NBI_BIN(nbi_bor_b8, uint8_t, uint8_t, x || y)

/* pow: gather each row into tiles so that every element goes through SLEEF's vector pow. */
#define NBI_DEF_POW(T, S)                                                                          \
    static void nbi_bpow_##S(void *o_, const void *a_, const void *b_, int64_t n, int64_t sa,      \
                             int64_t sb) {                                                         \
        T *o = o_;                                                                                 \
        const T *a = a_, *b = b_;                                                                  \
        const nbi_vmath *vm = nbi_vmath_get();                                                     \
        if (sa == 1 && sb == 1) {                                                                  \
            vm->pow_##S(o, a, b, n);                                                               \
            return;                                                                                \
        }                                                                                          \
        T ta[NBI_TILE], tb[NBI_TILE];                                                              \
        for (int64_t i0 = 0; i0 < n; i0 += NBI_TILE) {                                             \
            int64_t m = n - i0 < NBI_TILE ? n - i0 : NBI_TILE;                                     \
            for (int64_t i = 0; i < m; i++) {                                                      \
                ta[i] = a[(i0 + i) * sa];                                                          \
                tb[i] = b[(i0 + i) * sb];                                                          \
            }                                                                                      \
            vm->pow_##S(o + i0, ta, tb, m);                                                        \
        }                                                                                          \
    }
NBI_DEF_POW(float, f32)
NBI_DEF_POW(double, f64)

/* [op][dtype], NULL where the combination is rejected by inference. */
static nbi_bin_fn nbi_bin_fn_of(nbi_op op, nb_dtype d) {
#if NBI_EW_AVX2
    if ((d == NB_DTYPE_F32 || d == NB_DTYPE_F64) && nbi_use_avx2()) {
        bool f = d == NB_DTYPE_F32;
        switch (op) {
        case NBI_OP_ADD:
            return f ? nbi_badd_f32_avx2 : nbi_badd_f64_avx2;
        case NBI_OP_SUB:
            return f ? nbi_bsub_f32_avx2 : nbi_bsub_f64_avx2;
        case NBI_OP_MUL:
            return f ? nbi_bmul_f32_avx2 : nbi_bmul_f64_avx2;
        case NBI_OP_DIV:
            return f ? nbi_bdiv_f32_avx2 : nbi_bdiv_f64_avx2;
        default:
            break;
        }
    }
#endif
#define NBI_PICK(stem)                                                                             \
    switch (d) {                                                                                   \
    case NB_DTYPE_F32:                                                                             \
        return stem##_f32;                                                                         \
    case NB_DTYPE_F64:                                                                             \
        return stem##_f64;                                                                         \
    case NB_DTYPE_I32:                                                                             \
        return stem##_i32;                                                                         \
    case NB_DTYPE_I64:                                                                             \
        return stem##_i64;                                                                         \
    default:                                                                                       \
        return NULL;                                                                               \
    }
#define NBI_PICK_CMP(stem)                                                                         \
    if (d == NB_DTYPE_BOOL) {                                                                      \
        return stem##_b8;                                                                          \
    }                                                                                              \
    NBI_PICK(stem)
    switch (op) {
    case NBI_OP_ADD:
        NBI_PICK(nbi_badd)
    case NBI_OP_SUB:
        NBI_PICK(nbi_bsub)
    case NBI_OP_MUL:
        NBI_PICK(nbi_bmul)
    case NBI_OP_DIV:
        NBI_PICK(nbi_bdiv)
    case NBI_OP_MAXIMUM:
        NBI_PICK(nbi_bmax)
    case NBI_OP_MINIMUM:
        NBI_PICK(nbi_bmin)
    case NBI_OP_EQ:
        NBI_PICK_CMP(nbi_beq)
    case NBI_OP_NE:
        NBI_PICK_CMP(nbi_bne)
    case NBI_OP_LT:
        NBI_PICK_CMP(nbi_blt)
    case NBI_OP_LE:
        NBI_PICK_CMP(nbi_ble)
    case NBI_OP_GT:
        NBI_PICK_CMP(nbi_bgt)
    case NBI_OP_GE:
        NBI_PICK_CMP(nbi_bge)
    case NBI_OP_POW:
        return d == NB_DTYPE_F32 ? nbi_bpow_f32 : d == NB_DTYPE_F64 ? nbi_bpow_f64 : NULL;
    case NBI_OP_LOGICAL_AND:
        return nbi_band_b8;
    case NBI_OP_LOGICAL_OR:
        return nbi_bor_b8;
    default:
        return NULL;
    }
#undef NBI_PICK_CMP
#undef NBI_PICK
}

/* Walk the output in row-major order, one innermost row at a time; inputs are addressed
 * through broadcast strides. The traversal order is fixed, so results never depend on it. */
typedef struct nbi_bin_job {
    const nbi_kargs *k;
    nbi_bin_fn f;
    int r;
    int64_t inner;
    int64_t sa[NB_MAX_RANK], sb[NB_MAX_RANK];
    size_t eo, ei;
} nbi_bin_job;

/* Rows [first, first+count) of the output; inputs addressed by broadcast strides. */
static void nbi_binary_rows(void *ud, int64_t first, int64_t count, int worker) {
    (void)worker;
    const nbi_bin_job *j = ud;
    const nb_var *node = j->k->node;
    int r = j->r;
    int64_t idx[NB_MAX_RANK] = {0}, oa = 0, ob = 0;
    int64_t row = first;
    for (int d = r - 2; d >= 0; d--) { /* the row's multi-index over the outer dims */
        idx[d] = row % node->shape[d];
        row /= node->shape[d];
        oa += idx[d] * j->sa[d];
        ob += idx[d] * j->sb[d];
    }
    const unsigned char *a = j->k->in[0], *b = j->k->in[1];
    unsigned char *o = j->k->out;
    for (int64_t t = first; t < first + count; t++) {
        j->f(o + (size_t)(t * j->inner) * j->eo, a + (size_t)oa * j->ei, b + (size_t)ob * j->ei,
             j->inner, j->sa[r - 1], j->sb[r - 1]);
        for (int d = r - 2; d >= 0; d--) {
            oa += j->sa[d];
            ob += j->sb[d];
            if (++idx[d] < node->shape[d]) {
                break;
            }
            oa -= j->sa[d] * node->shape[d];
            ob -= j->sb[d] * node->shape[d];
            idx[d] = 0;
        }
    }
}

/* Walk the output in row-major order, one innermost row at a time, in chunks of rows whose
 * boundaries depend only on the shape. */
static void nbi_k_binary(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return;
    }
    const nb_var *x = node->in[0], *y = node->in[1];
    nbi_bin_job j;
    memset(&j, 0, sizeof j);
    j.k = k;
    j.f = nbi_bin_fn_of((nbi_op)node->op, x->dtype);
    j.eo = nbi_dsize(node->dtype);
    j.ei = nbi_dsize(x->dtype);
    j.r = node->rank;
    if (j.r == 0) {
        j.f(k->out, k->in[0], k->in[1], 1, 0, 0);
        return;
    }
    nbi_bcast_strides(x->rank, x->shape, j.r, node->shape, j.sa);
    nbi_bcast_strides(y->rank, y->shape, j.r, node->shape, j.sb);
    j.inner = node->shape[j.r - 1];
    int64_t rows = node->size / j.inner;
    int64_t chunk_rows = j.inner >= NBI_EW_CHUNK ? 1 : NBI_EW_CHUNK / j.inner;
    nbi_par_range(k->pool, rows, chunk_rows, nbi_binary_rows, &j);
}

static void nbi_k_select(const nbi_kargs *k) {
    const nb_var *node = k->node;
    if (node->size == 0) {
        return;
    }
    int r = node->rank;
    size_t es = nbi_dsize(node->dtype);
    int64_t st[3][NB_MAX_RANK] = {{0}}, idx[NB_MAX_RANK] = {0}, off[3] = {0, 0, 0};
    for (int j = 0; j < 3; j++) {
        nbi_bcast_strides(node->in[j]->rank, node->in[j]->shape, r, node->shape, st[j]);
    }
    const uint8_t *c = k->in[0];
    const unsigned char *a = k->in[1], *b = k->in[2];
    unsigned char *o = k->out;
    for (int64_t i = 0; i < node->size; i++) {
        const unsigned char *src = c[off[0]] ? a + (size_t)off[1] * es : b + (size_t)off[2] * es;
        memcpy(o + (size_t)i * es, src, es);
        for (int d = r - 1; d >= 0; d--) {
            for (int j = 0; j < 3; j++) {
                off[j] += st[j][d];
            }
            if (++idx[d] < node->shape[d]) {
                break;
            }
            for (int j = 0; j < 3; j++) {
                off[j] -= st[j][d] * node->shape[d];
            }
            idx[d] = 0;
        }
    }
}

/* ---- batching ------------------------------------------------------------------------
 * Every elementwise op: the same op on the batched operands, each lifted to the output's
 * rank + 1 (1s after the batch axis) so that numpy broadcasting aligns it with the unbatched
 * ones; the kernel computes each element from the same operand elements as unbatched, so
 * the lanes' results are bit for bit the unbatched ones. */
static nb_var *nbi_vmap_ew(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B) {
    (void)B;
    nb_var *in[3];
    for (int32_t j = 0; j < node->n_in && j < 3; j++) {
        in[j] = bin[j] != NULL ? nbi_vmap_lift(bin[j], node->rank) : node->in[j];
    }
    return nbi_emit(tr, (nbi_op)node->op, node->n_in, in, &node->at);
}

/* ---- registry entries --------------------------------------------------------------- */

/* ---- one op over a tile (for fused kernels) ------------------------------------------ */

void nbi_ew_tile(nbi_op op, nb_dtype dtype, nb_dtype in_dtype, int n_in, void *out,
                 const void *const *in, const bool *scalar, int64_t n) {
    if (n_in == 1) {
        if (op == NBI_OP_CAST) {
            nbi_cast_kernel(in_dtype, dtype, out, in[0], n);
        } else if (op == NBI_OP_LOGICAL_NOT) {
            const uint8_t *a = in[0];
            uint8_t *o = out;
            for (int64_t i = 0; i < n; i++) {
                o[i] = !a[i];
            }
        } else {
            switch (dtype) {
            case NB_DTYPE_F32:
                nbi_unary_f32(op, out, in[0], n);
                break;
            case NB_DTYPE_F64:
                nbi_unary_f64(op, out, in[0], n);
                break;
            case NB_DTYPE_I32:
                nbi_unary_i32(op, out, in[0], n);
                break;
            case NB_DTYPE_I64:
                nbi_unary_i64(op, out, in[0], n);
                break;
            case NB_DTYPE_BOOL:
                break;
            }
        }
        return;
    }
    if (op == NBI_OP_SELECT) {
        const uint8_t *c = in[0];
        size_t es = nbi_dsize(dtype);
        int64_t s0 = scalar[0] ? 0 : 1, s1 = scalar[1] ? 0 : 1, s2 = scalar[2] ? 0 : 1;
#define NBI_SELECT_TYPED(T)                                                                        \
    {                                                                                              \
        const T *a = in[1], *b = in[2];                                                            \
        T *o = out;                                                                                \
        if (s0 == 1 && s1 == 1 && s2 == 0) { /* a masked value: pads pushed through maps */        \
            T v = b[0];                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T m = (T)0 - (T)(c[i] != 0);                                                       \
                o[i] = (a[i] & m) | (v & ~m);                                                      \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        for (int64_t i = 0; i < n; i++) {                                                          \
            o[i] = c[i * s0] ? a[i * s1] : b[i * s2];                                              \
        }                                                                                          \
        return;                                                                                    \
    }
        if (es == 8) { /* bit patterns moved as integers: NaN payloads and -0 kept */
            NBI_SELECT_TYPED(uint64_t)
        }
        if (es == 4) {
            NBI_SELECT_TYPED(uint32_t)
        }
#undef NBI_SELECT_TYPED
        for (int64_t i = 0; i < n; i++) {
            memcpy((unsigned char *)out + (size_t)i * es,
                   c[i * s0] ? (const unsigned char *)in[1] + (size_t)(i * s1) * es
                             : (const unsigned char *)in[2] + (size_t)(i * s2) * es,
                   es);
        }
        return;
    }
    nbi_bin_fn_of(op, in_dtype)(out, in[0], in[1], n, scalar[0] ? 0 : 1, scalar[1] ? 0 : 1);
}

void nbi_ew_resolve(nbi_op op, nb_dtype dtype, nb_dtype in_dtype, int n_in, nbi_ew_fast *out) {
    memset(out, 0, sizeof *out);
    if (n_in == 2 && op != NBI_OP_SELECT) {
        out->bin = nbi_bin_fn_of(op, in_dtype);
        out->kind = out->bin != NULL ? 1 : 0;
        return;
    }
    int vm = -1;
    switch (op) {
    case NBI_OP_EXP:
        vm = NBI_VM_EXP;
        break;
    case NBI_OP_EXPM1:
        vm = NBI_VM_EXPM1;
        break;
    case NBI_OP_LOG:
        vm = NBI_VM_LOG;
        break;
    case NBI_OP_LOG1P:
        vm = NBI_VM_LOG1P;
        break;
    case NBI_OP_SIN:
        vm = NBI_VM_SIN;
        break;
    case NBI_OP_COS:
        vm = NBI_VM_COS;
        break;
    case NBI_OP_TAN:
        vm = NBI_VM_TAN;
        break;
    case NBI_OP_TANH:
        vm = NBI_VM_TANH;
        break;
    case NBI_OP_ERF:
        vm = NBI_VM_ERF;
        break;
    default:
        break;
    }
    if (n_in == 1 && vm >= 0 && (dtype == NB_DTYPE_F32 || dtype == NB_DTYPE_F64)) {
        const nbi_vmath *t = nbi_vmath_get();
        out->un32 = t->f32[vm];
        out->un64 = t->f64[vm];
        out->kind = 2;
    }
}

/* ---- VJP and JVP rules ---------------------------------------------------------------
 *
 * Written with the public builders, so they are more IR. x is the (first) input, y the
 * op's own output (reused where the derivative is a function of it: exp, tanh, sigmoid,
 * sqrt, reciprocal), g the output cotangent, t an input tangent (NULL: zero). Binary rules
 * undo broadcasting with nbi_unbroadcast. Kinks follow JAX: relu'(0) = 0, abs'(0) = 0, and
 * maximum/minimum split the gradient equally between tied operands. */

#define NBI_X(v) ((v)->in[0])
#define NBI_S(tr, c) nb_scalar((tr), (c))

/* derivative factor d(y)/d(x) of a unary op, as IR (NULL: no gradient) */
static nb_var *nbi_unary_deriv(nb_trace *tr, nb_var *node) {
    nb_var *x = NBI_X(node), *y = node;
    switch ((nbi_op)node->op) {
    case NBI_OP_NEG:
        return nb_full(tr, x->dtype, 0, NULL, -1.0);
    case NBI_OP_ABS:
        return nb_sign(x);
    case NBI_OP_EXP:
        return y;
    case NBI_OP_EXPM1:
        return nb_add(y, NBI_S(tr, 1.0));
    case NBI_OP_LOG:
        return nb_reciprocal(x);
    case NBI_OP_LOG1P:
        return nb_reciprocal(nb_add(x, NBI_S(tr, 1.0)));
    case NBI_OP_SQRT:
        return nb_div(NBI_S(tr, 0.5), y);
    case NBI_OP_RSQRT: /* -1/2 x^(-3/2) = -1/2 y / x */
        return nb_mul(NBI_S(tr, -0.5), nb_div(y, x));
    case NBI_OP_SQUARE:
        return nb_mul(NBI_S(tr, 2.0), x);
    case NBI_OP_RECIPROCAL:
        return nb_neg(nb_square(y));
    case NBI_OP_SIN:
        return nb_cos(x);
    case NBI_OP_COS:
        return nb_neg(nb_sin(x));
    case NBI_OP_TAN:
        return nb_add(NBI_S(tr, 1.0), nb_square(y));
    case NBI_OP_TANH:
        return nb_sub(NBI_S(tr, 1.0), nb_square(y));
    case NBI_OP_SIGMOID:
        return nb_mul(y, nb_sub(NBI_S(tr, 1.0), y));
    case NBI_OP_RELU: /* 1 where x > 0, else 0 (also at 0) */
        return nb_cast(nb_gt(x, NBI_S(tr, 0.0)), x->dtype);
    case NBI_OP_SOFTPLUS:
        return nb_sigmoid(x);
    case NBI_OP_ERF: /* 2/sqrt(pi) exp(-x^2) */
        return nb_mul(NBI_S(tr, 1.1283791670955126), nb_exp(nb_neg(nb_square(x))));
    case NBI_OP_GELU: {
        /* gelu = x s, s = sigmoid(2u), u = c (x + k x^3): gelu' = s + x s (1 - s) 2 u' */
        nb_var *x3 = nb_mul(nb_square(x), x);
        nb_var *u2 =
            nb_mul(NBI_S(tr, 1.5957691216057308), nb_add(x, nb_mul(NBI_S(tr, 0.044715), x3)));
        nb_var *sg = nb_sigmoid(u2);
        nb_var *du2 = nb_mul(NBI_S(tr, 1.5957691216057308),
                             nb_add(NBI_S(tr, 1.0), nb_mul(NBI_S(tr, 0.134145), nb_square(x))));
        return nb_add(sg, nb_mul(nb_mul(x, nb_mul(sg, nb_sub(NBI_S(tr, 1.0), sg))), du2));
    }
    case NBI_OP_IDENTITY:
        return NULL; /* handled by the caller: the cotangent itself */
    default:
        return NULL;
    }
}

static void nbi_vjp_unary(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    if (node->op == NBI_OP_NEG) {
        in_ct[0] = nb_neg(g);
        return;
    }
    if (node->op == NBI_OP_CAST) {
        in_ct[0] = nbi_is_float_var(NBI_X(node)) ? nb_cast(g, NBI_X(node)->dtype) : NULL;
        return;
    }
    nb_var *d = nbi_unary_deriv(tr, node);
    in_ct[0] = d != NULL ? nb_mul(g, d) : NULL;
}

static nb_var *nbi_jvp_unary(nb_trace *tr, nb_var *node, nb_var *const *t) {
    if (t[0] == NULL) {
        return NULL;
    }
    if (node->op == NBI_OP_NEG) {
        return nb_neg(t[0]);
    }
    if (node->op == NBI_OP_CAST) {
        return nb_cast(t[0], node->dtype);
    }
    nb_var *d = nbi_unary_deriv(tr, node);
    return d != NULL ? nb_mul(t[0], d) : NULL;
}

/* t (an input's tangent, shaped like that input) seen at the node's full shape */
static nb_var *nbi_bcast_to_node(nb_var *t, const nb_var *node) {
    if (t == NULL) {
        return NULL;
    }
    return nb_broadcast_to(t, node->rank, node->shape);
}

/* maximum/minimum: the share of the gradient each operand gets (1, 1/2 on ties, 0) */
static nb_var *nbi_minmax_share(nb_trace *tr, nb_var *node, int which) {
    nb_var *a = node->in[which], *b = node->in[1 - which];
    nb_var *wins = node->op == NBI_OP_MAXIMUM ? nb_gt(a, b) : nb_lt(a, b);
    nb_dtype d = node->dtype;
    nb_var *one = nb_scalar_typed(tr, d, 1.0), *half = nb_scalar_typed(tr, d, 0.5);
    return nb_select(wins, one, nb_select(nb_eq(a, b), half, nb_scalar_typed(tr, d, 0.0)));
}

static void nbi_vjp_binary(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *a = node->in[0], *b = node->in[1], *y = node;
    nb_var *ga = NULL, *gb = NULL;
    switch ((nbi_op)node->op) {
    case NBI_OP_ADD:
        ga = g;
        gb = g;
        break;
    case NBI_OP_SUB:
        ga = g;
        gb = nb_neg(g);
        break;
    case NBI_OP_MUL:
        ga = nb_mul(g, b);
        gb = nb_mul(g, a);
        break;
    case NBI_OP_DIV:
        ga = nb_div(g, b);
        gb = nb_neg(nb_mul(g, nb_div(y, b)));
        break;
    case NBI_OP_POW: {
        /* d/da = b a^(b-1); d/db = y log(a), with log taken of 1 where a == 0 (as JAX) */
        ga = nb_mul(g, nb_mul(b, nb_pow(a, nb_sub(b, NBI_S(tr, 1.0)))));
        nb_var *safe = nb_select(nb_eq(a, NBI_S(tr, 0.0)), nb_scalar_typed(tr, a->dtype, 1.0), a);
        gb = nb_mul(g, nb_mul(y, nb_log(safe)));
        break;
    }
    case NBI_OP_MAXIMUM:
    case NBI_OP_MINIMUM:
        ga = nb_mul(g, nbi_minmax_share(tr, node, 0));
        gb = nb_mul(g, nbi_minmax_share(tr, node, 1));
        break;
    default:
        return;
    }
    in_ct[0] = nbi_unbroadcast(ga, a->rank, a->shape);
    in_ct[1] = nbi_unbroadcast(gb, b->rank, b->shape);
}

static nb_var *nbi_jvp_binary(nb_trace *tr, nb_var *node, nb_var *const *t) {
    nb_var *a = node->in[0], *b = node->in[1], *y = node;
    nb_var *ta = t[0], *tb = t[1], *r = NULL;
    switch ((nbi_op)node->op) {
    case NBI_OP_ADD:
        r = ta && tb ? nb_add(ta, tb) : ta ? ta : tb;
        break;
    case NBI_OP_SUB:
        r = ta && tb ? nb_sub(ta, tb) : ta ? ta : nb_neg(tb);
        break;
    case NBI_OP_MUL: {
        nb_var *p = ta ? nb_mul(ta, b) : NULL, *q = tb ? nb_mul(a, tb) : NULL;
        r = p && q ? nb_add(p, q) : p ? p : q;
        break;
    }
    case NBI_OP_DIV: {
        nb_var *p = ta ? nb_div(ta, b) : NULL, *q = tb ? nb_neg(nb_mul(tb, nb_div(y, b))) : NULL;
        r = p && q ? nb_add(p, q) : p ? p : q;
        break;
    }
    case NBI_OP_POW: {
        nb_var *p = ta ? nb_mul(ta, nb_mul(b, nb_pow(a, nb_sub(b, NBI_S(tr, 1.0))))) : NULL;
        nb_var *q = NULL;
        if (tb) {
            nb_var *safe =
                nb_select(nb_eq(a, NBI_S(tr, 0.0)), nb_scalar_typed(tr, a->dtype, 1.0), a);
            q = nb_mul(tb, nb_mul(y, nb_log(safe)));
        }
        r = p && q ? nb_add(p, q) : p ? p : q;
        break;
    }
    case NBI_OP_MAXIMUM:
    case NBI_OP_MINIMUM: {
        nb_var *p = ta ? nb_mul(ta, nbi_minmax_share(tr, node, 0)) : NULL;
        nb_var *q = tb ? nb_mul(tb, nbi_minmax_share(tr, node, 1)) : NULL;
        r = p && q ? nb_add(p, q) : p ? p : q;
        break;
    }
    default:
        return NULL;
    }
    return nbi_bcast_to_node(r, node);
}

static void nbi_vjp_select(nb_trace *tr, nb_var *node, nb_var *g, nb_var **in_ct) {
    nb_var *c = node->in[0], *a = node->in[1], *b = node->in[2];
    nb_var *zero = NBI_S(tr, 0.0);
    in_ct[1] = nbi_unbroadcast(nb_select(c, g, zero), a->rank, a->shape);
    in_ct[2] = nbi_unbroadcast(nb_select(c, zero, g), b->rank, b->shape);
}

static nb_var *nbi_jvp_select(nb_trace *tr, nb_var *node, nb_var *const *t) {
    nb_var *zero = NBI_S(tr, 0.0);
    return nbi_bcast_to_node(nb_select(node->in[0], t[1] ? t[1] : zero, t[2] ? t[2] : zero), node);
}

/* ---- registry entries --------------------------------------------------------------- */

#define NBI_UNARY_INFO(lname, NDIFF, VJP, JVP)                                                     \
    const nbi_op_info nbi_opinfo_##lname = {.name = #lname,                                        \
                                            .n_in = 1,                                             \
                                            .infer = nbi_infer_unary,                              \
                                            .kernel = nbi_k_unary,                                 \
                                            .nondiff = NDIFF,                                      \
                                            .elementwise = true,                                   \
                                            .vjp = VJP,                                            \
                                            .jvp = JVP,                                            \
                                            .vmap = nbi_vmap_ew};
#define NBI_BINARY_INFO(lname, NDIFF, VJP, JVP)                                                    \
    const nbi_op_info nbi_opinfo_##lname = {.name = #lname,                                        \
                                            .n_in = 2,                                             \
                                            .infer = nbi_infer_binary,                             \
                                            .kernel = nbi_k_binary,                                \
                                            .nondiff = NDIFF,                                      \
                                            .elementwise = true,                                   \
                                            .vjp = VJP,                                            \
                                            .jvp = JVP,                                            \
                                            .vmap = nbi_vmap_ew};

NBI_UNARY_INFO(neg, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(abs, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(sign, 1, NULL, NULL)
NBI_UNARY_INFO(exp, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(expm1, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(log, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(log1p, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(sqrt, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(rsqrt, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(square, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(reciprocal, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(sin, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(cos, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(tan, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(tanh, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(sigmoid, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(relu, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(gelu, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(softplus, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(erf, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_UNARY_INFO(logical_not, 1, NULL, NULL)
NBI_UNARY_INFO(cast, 0, nbi_vjp_unary, nbi_jvp_unary)
NBI_BINARY_INFO(add, 0, nbi_vjp_binary, nbi_jvp_binary)
NBI_BINARY_INFO(sub, 0, nbi_vjp_binary, nbi_jvp_binary)
NBI_BINARY_INFO(mul, 0, nbi_vjp_binary, nbi_jvp_binary)
NBI_BINARY_INFO(div, 0, nbi_vjp_binary, nbi_jvp_binary)
NBI_BINARY_INFO(pow, 0, nbi_vjp_binary, nbi_jvp_binary)
NBI_BINARY_INFO(maximum, 0, nbi_vjp_binary, nbi_jvp_binary)
NBI_BINARY_INFO(minimum, 0, nbi_vjp_binary, nbi_jvp_binary)
NBI_BINARY_INFO(eq, 3, NULL, NULL)
NBI_BINARY_INFO(ne, 3, NULL, NULL)
NBI_BINARY_INFO(lt, 3, NULL, NULL)
NBI_BINARY_INFO(le, 3, NULL, NULL)
NBI_BINARY_INFO(gt, 3, NULL, NULL)
NBI_BINARY_INFO(ge, 3, NULL, NULL)
NBI_BINARY_INFO(logical_and, 3, NULL, NULL)
NBI_BINARY_INFO(logical_or, 3, NULL, NULL)

const nbi_op_info nbi_opinfo_select = {.name = "select",
                                       .n_in = 3,
                                       .infer = nbi_infer_select,
                                       .kernel = nbi_k_select,
                                       .nondiff = 1,
                                       .elementwise = true,
                                       .vjp = nbi_vjp_select,
                                       .jvp = nbi_jvp_select,
                                       .vmap = nbi_vmap_ew};
