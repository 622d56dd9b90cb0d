/*
 * test_grad_conformance.c -- registry-driven gradient conformance of every primitive op.
 *
 * Every op in src/ad/ops.def is accounted for, or the suite fails naming it: an op whose
 * registry entry has a VJP rule must have a gradient spec here, and an op without one must
 * be listed in NO_GRAD below with the reason it has no gradient (bool or integer output,
 * no inputs, stop_gradient, ...). An op that gains a rule while still listed, an op with a
 * spec but no rule, and an op with only one of the two rules fail as well. So a new op
 * cannot slip through.
 *
 * A spec is a list of cases: inputs (dtype, shape, value domain or explicit values), and a
 * builder that applies the op with the public API. Every case builds f(x_1..x_n) = the op
 * as an nb_fn and checks, with random data:
 *   (a) VJP: with a random output cotangent u, ct = vjp(f)((xs), u) against central finite
 *       differences of <u, f(x)> with respect to every element of every differentiable
 *       input (h = 1e-6 max(1, |x|)); non-float inputs (indices, conditions) must get a
 *       null cotangent;
 *   (b) JVP: with random tangents v, jvp(f)((xs), (vs)) against the central difference
 *       (f(x + h v) - f(x - h v)) / 2h of every output element (h = 1e-6 max(1, max|x|));
 *   (c) consistency: <u, J v> (from the JVP) equals <J^T u, v> (from the VJP);
 * and that the primal outputs of vjp(f) and jvp(f) equal f(x). Cases with random inputs
 * run three draws (new x, u, v each time, one compile). Every forward evaluation of the
 * finite differences runs through nabla (nb_fn_call on the plain function, served by the
 * compile cache after the first call). An op with a spec but no rule is not run (the
 * accounting test names it). custom_vjp is checked with a hand-written bwd, and its JVP
 * must be an error (as JAX).
 *
 * Tolerances: FD checks |got - fd| <= 1e-6 max(1, |fd|) (central differences with h = 1e-6
 * have truncation error ~1e-12 |f'''| and rounding error ~1e-10 |f|, so 1e-6 leaves room
 * for the steeper cases -- tan near 1.2, pow with base 0.2 -- while a wrong rule is off by
 * O(1)); consistency |a - b| <= 1e-10 max(1, sum |terms|) (both sides are exact up to
 * rounding). The cast cases through f32 use a larger step and looser tolerances (f32
 * rounding), stated where they are made.
 *
 * Domains keep FD away from kinks and singularities: relu/abs/reciprocal/div away from 0,
 * log/sqrt/rsqrt/pow positive, tan inside (-1.2, 1.2), max/min reductions over distinct
 * values spaced well above h. Kinks get dedicated cases: maximum/minimum and max/min
 * reductions with exact two-way ties (where the central difference is exactly the equal
 * split of ad.h's convention: (max(v1, v2) + min(v1, v2)) / 2 = (v1 + v2) / 2), prod with
 * zeros (a polynomial: FD is exact there, and a y/x rule would give NaN), and relu, abs and
 * sqrt at 0 against the documented values.
 *
 * Shapes include broadcasting (binary ops, select, matmul batches), rank 0, size-1 and
 * size-0 dims, keepdims both ways and negative axes (reductions), the shape ops'
 * parameters (negative steps, -1 in reshape, clamped indices), the matmul operand flags
 * that mark operands stored transposed, and a few randomly drawn broadcast and reduction
 * shapes. Composite ops (mean, logsumexp, softmax, log_softmax, dot, expand_dims, squeeze,
 * stack) and a few chains are checked the same way, and higher order separately: grad of
 * grad of sin(x) exp(x) against its closed form, and Hessian-vector products of Rosenbrock
 * (jvp of grad, and vjp of grad) against the analytic Hessian.
 */
#include "nbtest.h"

#include "ad/ir.h"
#include "nabla/linalg.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#define MAX_IN 5
#define MAX_CASES 1024
#define COMPOSITE (-1)

/* ---- the registry's view: family files and the no-gradient list --------------------- */

static const char *const FAMILY[NBI_OP_COUNT] = {
#define NBI_OP(NAME, name, family) #family,
#include "ad/ops.def"
#undef NBI_OP
};

/* Ops without a gradient, and why. An op listed here must have no VJP/JVP rule. */
static const struct {
    nbi_op op;
    const char *why;
} NO_GRAD[] = {
    {NBI_OP_PARAM, "a function input: gradients flow to it, not through it"},
    {NBI_OP_CONST, "no inputs: a constant"},
    {NBI_OP_FULL, "no inputs: a constant"},
    {NBI_OP_IOTA, "no inputs: a constant"},
    {NBI_OP_STOP_GRADIENT, "blocks gradients by definition (checked in test_stop_gradient)"},
    {NBI_OP_CALL, "calls are inlined under grad/vjp/jvp (ad.h): autodiff never meets one"},
    {NBI_OP_SIGN, "piecewise constant: derivative 0 almost everywhere, as JAX (x*sign(x) case)"},
    {NBI_OP_LOGICAL_NOT, "bool output"},
    {NBI_OP_EQ, "bool output"},
    {NBI_OP_NE, "bool output"},
    {NBI_OP_LT, "bool output"},
    {NBI_OP_LE, "bool output"},
    {NBI_OP_GT, "bool output"},
    {NBI_OP_GE, "bool output"},
    {NBI_OP_LOGICAL_AND, "bool output"},
    {NBI_OP_LOGICAL_OR, "bool output"},
    {NBI_OP_ARGMAX, "integer output (argmax-scaled case checks it carries nothing)"},
    {NBI_OP_ARGMIN, "integer output"},
    {NBI_OP_ONE_HOT, "its only input is integer indices (one_hot case checks a null cotangent)"},
    {NBI_OP_FUSED, "made by the fusion pass after autodiff: gradients are taken of the "
                   "unfused ops"},
    {NBI_OP_FUSED_OUTPUT, "made by the fusion pass after autodiff, like fused"},
    {NBI_OP_LOOP_REVERSE, "made by reverse mode through a checkpointed loop: derivatives of "
                          "derivatives through loops are not built"},
    {NBI_OP_RNG_SPLIT, "integer key in, integer keys out"},
    {NBI_OP_RNG_FOLD_IN, "integer key and data in, integer key out"},
    {NBI_OP_RNG_BITS, "integer key in, integer output"},
    {NBI_OP_RNG_UNIFORM, "a sample: a function of the integer key alone, a constant to "
                         "autodiff (random.h; tests/core/test_random_trace.c checks grad)"},
    {NBI_OP_RNG_NORMAL, "a sample of the integer key: a constant to autodiff (random.h)"},
    {NBI_OP_RNG_TRUNCATED_NORMAL, "a sample of the integer key: a constant to autodiff"},
    {NBI_OP_RNG_BERNOULLI, "bool output"},
    {NBI_OP_RNG_PERMUTATION, "integer output"},
};

/* ---- cases -------------------------------------------------------------------------- */

typedef enum dom {
    DOM_ANY,      /* [-2, 2] */
    DOM_AWAY0,    /* [0.2, 2] with a random sign */
    DOM_UNIT,     /* [0.5, 1.5] with a random sign (prod: moderate products) */
    DOM_POS,      /* [0.2, 3] */
    DOM_GT_M1,    /* [-0.8, 2] */
    DOM_SMALL,    /* [-1.2, 1.2] */
    DOM_DISTINCT, /* [-2, 2], pairwise at least 2/n apart (max/min without ties) */
    DOM_IDX,      /* integers in [-6, 8]: negative and out of range on both sides */
    DOM_BOOL
} dom;

typedef struct gcase gcase;
typedef nb_var *(*un_b)(nb_var *);
typedef nb_var *(*bin_b)(nb_var *, nb_var *);
typedef nb_var *(*red_b)(nb_var *, const int *, int, bool);
typedef nb_var *(*build_fn)(nb_trace *tr, nb_var *const *in, const gcase *c);

struct gcase {
    int op;            /* the nbi_op under test, or COMPOSITE */
    const char *group; /* composites: the builder's name */
    char label[128];
    int n_in;
    nb_dtype dt[MAX_IN];
    int rank[MAX_IN];
    int64_t shape[MAX_IN][NB_MAX_RANK];
    dom dm[MAX_IN];
    const double *vals[MAX_IN]; /* explicit values (ties, zeros), or NULL: random */
    build_fn build;
    union {
        un_b un;
        bin_b bin;
        red_b red;
    } fn;
    int ip[16]; /* axes, perm, flags, ... */
    int64_t lp[3][NB_MAX_RANK];
    double dp;
    nb_dtype to;
    bool keepdims;
    double h_rel;   /* FD step relative to max(1, |x|) */
    double tol;     /* FD tolerance relative to max(1, |fd|) */
    double ctol;    /* consistency tolerance */
    bool jvp_fails; /* forward mode through it is an error by design (custom_vjp) */
};

static gcase g_cases[MAX_CASES];
static int g_n_cases;
static int g_n_spec[NBI_OP_COUNT];

static gcase *add_case(int op, const char *group, int n_in, build_fn b) {
    if (g_n_cases >= MAX_CASES) {
        fail_msg("too many cases");
    }
    gcase *c = &g_cases[g_n_cases++];
    memset(c, 0, sizeof *c);
    c->op = op;
    c->group = group;
    c->n_in = n_in;
    c->build = b;
    c->h_rel = 1e-6;
    c->tol = 1e-6;
    c->ctol = 1e-10;
    if (op >= 0) {
        g_n_spec[op]++;
    }
    return c;
}

static void set_in(gcase *c, int i, nb_dtype dt, dom d, int rank, const int64_t *shape) {
    c->dt[i] = dt;
    c->dm[i] = d;
    c->rank[i] = rank;
    for (int k = 0; k < rank; k++) {
        c->shape[i][k] = shape[k];
    }
}

static const char *case_name(const gcase *c) {
    return c->op >= 0 ? nbi_op_name((nbi_op)c->op) : c->group;
}

/* ---- random numbers ----------------------------------------------------------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static int irand(int n) {
    return (int)(urand() * n) % n;
}

static double gen_value(dom d) {
    double sgn = urand() < 0.5 ? -1.0 : 1.0;
    switch (d) {
    case DOM_AWAY0:
        return sgn * (0.2 + urand() * 1.8);
    case DOM_UNIT:
        return sgn * (0.5 + urand());
    case DOM_POS:
        return 0.2 + urand() * 2.8;
    case DOM_GT_M1:
        return -0.8 + urand() * 2.8;
    case DOM_SMALL:
        return -1.2 + urand() * 2.4;
    case DOM_IDX:
        return floor(urand() * 15.0) - 6.0;
    case DOM_BOOL:
        return urand() < 0.5 ? 0.0 : 1.0;
    default:
        return -2.0 + urand() * 4.0;
    }
}

/* ---- builders ----------------------------------------------------------------------- */

static nb_var *b_unary(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return c->fn.un(in[0]);
}
static nb_var *b_binary(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return c->fn.bin(in[0], in[1]);
}
static nb_var *b_select(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    return nb_select(in[0], in[1], in[2]);
}
static nb_var *b_cast(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_cast(in[0], c->to);
}
/* identity has no public builder: gradient transforms emit it (src/ad/transforms.c) */
static nb_var *b_identity(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)c;
    return nbi_emit(tr, NBI_OP_IDENTITY, 1, in, NULL);
}
/* implicit(stop_gradient(g(x)), g(x)): g(x)'s value through the first operand, its
 * derivative through the second (how the Newton stages of src/ode/solve.c use it) */
static nb_var *b_implicit(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    nb_var *g = nb_mul(nb_sin(in[0]), in[0]);
    return nbi_implicit(nb_stop_gradient(g), g);
}
/* ip[0] = number of axes (-1: NULL, every axis), ip[1..] = the axes */
static nb_var *b_reduce(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return c->fn.red(in[0], c->ip[0] < 0 ? NULL : c->ip + 1, c->ip[0] < 0 ? 0 : c->ip[0],
                     c->keepdims);
}
static nb_var *b_reshape(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_reshape(in[0], c->ip[0], c->lp[0]);
}
static nb_var *b_broadcast(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_broadcast_to(in[0], c->ip[0], c->lp[0]);
}
static nb_var *b_transpose(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_transpose(in[0], c->ip[0] ? c->ip + 1 : NULL);
}
static nb_var *b_slice(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_slice(in[0], c->lp[0], c->lp[1], c->ip[0] ? c->lp[2] : NULL);
}
static nb_var *b_concat(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_concatenate(c->n_in, in, c->ip[0]);
}
static nb_var *b_pad(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_pad(in[0], c->lp[0], c->lp[1], c->dp);
}
/* ip[0] = nd; lp[0] = kernel, stride; lp[1] = lo, hi; lp[2] = dilation, spatial sizes */
static nb_var *b_im2col(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nbi_im2col(in[0], c->ip[0], c->lp[0], c->lp[0] + 3, c->lp[2], c->lp[1], c->lp[1] + 3,
                      c->dp);
}
static nb_var *b_col2im(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nbi_col2im(in[0], c->ip[0], c->lp[0], c->lp[0] + 3, c->lp[2], c->lp[1], c->lp[1] + 3,
                      c->lp[2] + 3);
}
/* pool_take / pool_scatter: im2col's parameters, batch first; x (input 0) selects */
static nb_var *b_pool_take(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nbi_pool_op(NBI_OP_POOL_TAKE, in[0], in[1], c->ip[0], c->lp[0], c->lp[0] + 3, c->lp[2],
                       c->lp[1], c->lp[1] + 3, c->dp);
}
static nb_var *b_pool_scatter(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nbi_pool_op(NBI_OP_POOL_SCATTER, in[0], in[1], c->ip[0], c->lp[0], c->lp[0] + 3,
                       c->lp[2], c->lp[1], c->lp[1] + 3, 0.0);
}
static nb_var *b_take(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_take(in[0], in[1], c->ip[0]);
}
static nb_var *b_take_along(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_take_along_axis(in[0], in[1], c->ip[0]);
}
static nb_var *b_dyn_slice(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_dynamic_slice(in[0], in + 1, c->lp[0]);
}
static nb_var *b_dyn_update(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    return nb_dynamic_update_slice(in[0], in[1], in + 2);
}
/* ip[0], ip[1]: the operand flags "stored transposed" (set by the optimizer in real
 * graphs; emitted directly here so that the rules are checked with them set) */
static nb_var *b_matmul(nb_trace *tr, nb_var *const *in, const gcase *c) {
    if (c->ip[0] == 0 && c->ip[1] == 0) {
        return nb_matmul(in[0], in[1]);
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.axes[0] = c->ip[0];
    at.axes[1] = c->ip[1];
    return nbi_emit(tr, NBI_OP_MATMUL, 2, in, &at);
}
/* composites */
static nb_var *b_softmax(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return c->ip[1] ? nb_log_softmax(in[0], c->ip[0]) : nb_softmax(in[0], c->ip[0]);
}
static nb_var *b_expand_dims(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_expand_dims(in[0], c->ip[0]);
}
static nb_var *b_squeeze(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_squeeze(in[0], c->ip[0] < 0 ? NULL : c->ip + 1, c->ip[0] < 0 ? 0 : c->ip[0]);
}
static nb_var *b_stack(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    return nb_stack(c->n_in, in, c->ip[0]);
}
/* chains that pass through ops without gradients */
static nb_var *b_x_sign(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    return nb_mul(in[0], nb_sign(in[0])); /* |x|: sign contributes nothing */
}
static nb_var *b_int_path(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    /* trunc(x) through i32 is piecewise constant: only the second term has a gradient */
    return nb_add(nb_cast(nb_cast(in[0], NB_DTYPE_I32), NB_DTYPE_F64), nb_mul(in[0], in[0]));
}
static nb_var *b_argmax_scaled(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    return nb_mul(in[0], nb_cast(nb_argmax(in[0], -1, true), NB_DTYPE_F64));
}
static nb_var *b_one_hot_mul(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    return nb_mul(nb_one_hot(in[1], nb_var_dim(in[0], -1), NB_DTYPE_F64), in[0]);
}
static nb_var *b_compare_select(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)tr;
    (void)c;
    nb_var *x = in[0], *y = in[1];
    nb_var *cond = nb_logical_or(nb_gt(x, y), nb_logical_not(nb_le(y, nb_scalar(tr, 0.5))));
    return nb_select(cond, nb_mul(x, y), nb_sub(x, nb_exp(y)));
}
static nb_var *b_layer(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)c;
    nb_var *h = nb_tanh(nb_add(nb_matmul(in[0], in[1]), in[2]));
    return nb_mul(nb_sigmoid(h), nb_scalar(tr, 2.0));
}

/* custom_vjp: g = custom_vjp(f, fwd, bwd) with f(x, y) = sin(x) y and a hand-written
 * (correct) bwd; built in test_vjp_jvp_against_finite_differences. */
static nb_fn *g_custom;

static nb_status body_cv_f(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_mul(nb_sin(nb_get(tr, args, "[0]")), nb_get(tr, args, "[1]")), out);
}
static nb_status body_cv_fwd(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_var *x = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]");
    nb_var *s = nb_sin(x);
    nb_tree *res = NULL;
    nb_status st =
        nb_tree_tuple(ctx, 3, (nb_tree *[]){nb_leaf(nb_cos(x)), nb_leaf(s), nb_leaf(y)}, &res);
    if (st != NB_OK) {
        return st;
    }
    st = nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(nb_mul(s, y)), res}, out);
    nb_tree_destroy(res);
    return st;
}
/* ((cos x, sin x, y), ct) -> (ct cos(x) y, sum over x's leading dims of ct sin(x)) */
static nb_status body_cv_bwd(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *cx = nb_get(tr, args, "[0][0]"), *sx = nb_get(tr, args, "[0][1]");
    nb_var *y = nb_get(tr, args, "[0][2]"), *ct = nb_get(tr, args, "[1]");
    nb_var *gy = nb_mul(ct, sx);
    int lead = nb_var_rank(gy) - nb_var_rank(y), axes[NB_MAX_RANK];
    for (int i = 0; i < lead; i++) {
        axes[i] = i;
    }
    if (lead > 0) {
        gy = nb_sum(gy, axes, lead, false);
    }
    return nb_tree_tuple(nb_trace_ctx(tr), 2,
                         (nb_tree *[]){nb_leaf(nb_mul(nb_mul(ct, cx), y)), nb_leaf(gy)}, out);
}
static nb_var *b_custom(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)c;
    nb_tree *a = NULL;
    if (nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(in[0]), nb_leaf(in[1])}, &a) !=
        NB_OK) {
        return NULL;
    }
    const nb_tree *r = nb_apply(tr, g_custom, a);
    nb_tree_destroy(a);
    return r != NULL ? nb_var_of(tr, r) : NULL;
}
static void make_custom(nb_ctx *ctx) {
    nb_fn *f = NULL, *fwd = NULL, *bwd = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "cv_f", body_cv_f, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "cv_fwd", body_cv_fwd, NULL, &fwd));
    NBT_OK(ctx, nb_fn_create(ctx, "cv_bwd", body_cv_bwd, NULL, &bwd));
    NBT_OK(ctx, nb_custom_vjp(f, fwd, bwd, &g_custom));
    nb_fn_destroy(bwd);
    nb_fn_destroy(fwd);
    nb_fn_destroy(f);
}

/* custom_jvp: g = custom_jvp(f, rule) with f(x, y) = sin(x) y and the rule's tangent
 * cos(x) tx y + sin(x) ty: the JVP is the rule, the VJP its transpose (reverse mode over the
 * rule): both against finite differences of f. */
static nb_fn *g_custom_jvp;
static nb_status body_cj_rule(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0][0]"), *y = nb_get(tr, args, "[0][1]");
    nb_var *tx = nb_get(tr, args, "[1][0]"), *ty = nb_get(tr, args, "[1][1]");
    nb_var *t = nb_add(nb_mul(nb_mul(nb_cos(x), tx), y), nb_mul(nb_sin(x), ty));
    return nb_tree_tuple(nb_trace_ctx(tr), 2,
                         (nb_tree *[]){nb_leaf(nb_mul(nb_sin(x), y)), nb_leaf(t)}, out);
}
static nb_var *b_custom_jvp(nb_trace *tr, nb_var *const *in, const gcase *c) {
    (void)c;
    nb_tree *a = NULL;
    if (nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(in[0]), nb_leaf(in[1])}, &a) !=
        NB_OK) {
        return NULL;
    }
    const nb_tree *r = nb_apply(tr, g_custom_jvp, a);
    nb_tree_destroy(a);
    return r != NULL ? nb_var_of(tr, r) : NULL;
}
static void make_custom_jvp(nb_ctx *ctx) {
    nb_fn *f = NULL, *rule = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "cj_f", body_cv_f, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "cj_rule", body_cj_rule, NULL, &rule));
    NBT_OK(ctx, nb_custom_jvp(f, rule, &g_custom_jvp));
    nb_fn_destroy(rule);
    nb_fn_destroy(f);
}

/* ---- the specs ---------------------------------------------------------------------- */

static const struct {
    int rank;
    int64_t shape[3];
} UNARY_SHAPES[] = {{0, {0}}, {1, {1}}, {1, {6}}, {2, {2, 3}}, {3, {2, 1, 3}}};

static void spec_unary(nbi_op op, un_b b, dom d) {
    for (size_t s = 0; s < sizeof UNARY_SHAPES / sizeof UNARY_SHAPES[0]; s++) {
        gcase *c = add_case(op, NULL, 1, b_unary);
        c->fn.un = b;
        set_in(c, 0, NB_DTYPE_F64, d, UNARY_SHAPES[s].rank, UNARY_SHAPES[s].shape);
        snprintf(c->label, sizeof c->label, "%s shape #%zu", nbi_op_name(op), s);
    }
}

static const struct {
    int ra, rb;
    int64_t sa[3], sb[3];
} BIN_SHAPES[] = {
    {0, 0, {0}, {0}},          {1, 0, {4}, {0}},    {0, 1, {0}, {4}}, {2, 2, {2, 3}, {2, 3}},
    {3, 2, {3, 1, 4}, {2, 4}}, {2, 1, {4, 1}, {3}}, {1, 1, {1}, {4}}, {3, 3, {2, 1, 3}, {1, 2, 1}},
};

/* A random pair of shapes that broadcast: rank <= 3, dims <= 3, some stretched. */
static void random_bcast_pair(int *ra, int64_t *sa, int *rb, int64_t *sb) {
    int r = irand(4);
    int64_t full[3];
    for (int i = 0; i < r; i++) {
        full[i] = 1 + irand(3);
    }
    *ra = r;
    for (int i = 0; i < r; i++) {
        sa[i] = urand() < 0.3 ? 1 : full[i];
    }
    int drop = irand(r + 1);
    *rb = r - drop;
    for (int i = 0; i < *rb; i++) {
        sb[i] = urand() < 0.3 ? 1 : full[i + drop];
    }
}

static void spec_binary(nbi_op op, bin_b b, dom da, dom db) {
    size_t ns = sizeof BIN_SHAPES / sizeof BIN_SHAPES[0];
    for (size_t s = 0; s < ns + 2; s++) {
        gcase *c = add_case(op, NULL, 2, b_binary);
        c->fn.bin = b;
        if (s < ns) {
            set_in(c, 0, NB_DTYPE_F64, da, BIN_SHAPES[s].ra, BIN_SHAPES[s].sa);
            set_in(c, 1, NB_DTYPE_F64, db, BIN_SHAPES[s].rb, BIN_SHAPES[s].sb);
            snprintf(c->label, sizeof c->label, "%s shapes #%zu", nbi_op_name(op), s);
        } else {
            int ra, rb;
            int64_t sa[3], sb[3];
            random_bcast_pair(&ra, sa, &rb, sb);
            set_in(c, 0, NB_DTYPE_F64, da, ra, sa);
            set_in(c, 1, NB_DTYPE_F64, db, rb, sb);
            snprintf(c->label, sizeof c->label, "%s random shapes #%zu", nbi_op_name(op), s - ns);
        }
    }
}

/* Two-way ties, for the kink conventions: a and b equal at positions 0 and 2. */
static const double TIE_A[] = {0.5, -1.0, 2.0, 0.3};
static const double TIE_B[] = {0.5, 1.0, 2.0, -0.3};
static const double TIE_M[] = {0.25, -1.0, 1.5, 0.25, 0.7, -0.4}; /* ties with 0.25 */
static const double TIE_S[] = {0.25};

static void spec_binary_ties(nbi_op op, bin_b b) {
    gcase *c = add_case(op, NULL, 2, b_binary);
    c->fn.bin = b;
    set_in(c, 0, NB_DTYPE_F64, DOM_ANY, 1, (int64_t[]){4});
    set_in(c, 1, NB_DTYPE_F64, DOM_ANY, 1, (int64_t[]){4});
    c->vals[0] = TIE_A;
    c->vals[1] = TIE_B;
    snprintf(c->label, sizeof c->label, "%s with ties (split equally)", nbi_op_name(op));
    c = add_case(op, NULL, 2, b_binary);
    c->fn.bin = b;
    set_in(c, 0, NB_DTYPE_F64, DOM_ANY, 2, (int64_t[]){2, 3});
    set_in(c, 1, NB_DTYPE_F64, DOM_ANY, 0, NULL);
    c->vals[0] = TIE_M;
    c->vals[1] = TIE_S;
    snprintf(c->label, sizeof c->label, "%s with a broadcast scalar tied twice", nbi_op_name(op));
}

static const struct {
    int rank;
    int64_t shape[3];
    int n_axes; /* -1: NULL (every axis) */
    int axes[3];
} RED_SHAPES[] = {
    {0, {0}, -1, {0}},      {1, {5}, -1, {0}},         {2, {3, 4}, 1, {1}},
    {2, {3, 4}, 1, {-2}},   {3, {2, 3, 4}, 2, {0, 2}}, {3, {2, 3, 4}, -1, {0}},
    {3, {3, 1, 2}, 1, {1}}, {2, {3, 4}, 0, {0}},       {3, {2, 3, 4}, 2, {-1, 0}},
    {1, {1}, 1, {0}},
};

static void reduce_case(gcase *c, int rank, const int64_t *shape, int n_axes, const int *axes,
                        bool keep, dom d, const char *what) {
    c->keepdims = keep;
    c->ip[0] = n_axes;
    for (int a = 0; a < n_axes; a++) {
        c->ip[1 + a] = axes[a];
    }
    set_in(c, 0, NB_DTYPE_F64, d, rank, shape);
    char ax[32] = "all";
    if (n_axes >= 0) {
        int k = snprintf(ax, sizeof ax, "(");
        for (int a = 0; a < n_axes; a++) {
            k += snprintf(ax + k, sizeof ax - (size_t)k, a ? ",%d" : "%d", axes[a]);
        }
        snprintf(ax + k, sizeof ax - (size_t)k, ")");
    }
    char sh[48];
    int k = snprintf(sh, sizeof sh, "[");
    for (int i = 0; i < rank; i++) {
        k += snprintf(sh + k, sizeof sh - (size_t)k, i ? ",%lld" : "%lld", (long long)shape[i]);
    }
    snprintf(sh + k, sizeof sh - (size_t)k, "]");
    snprintf(c->label, sizeof c->label, "%s %s axes %s keepdims=%d%s", what, sh, ax, keep,
             c->vals[0] ? " (explicit values)" : "");
}

static void spec_reduce(int op, const char *group, red_b b, dom d) {
    const char *name = op >= 0 ? nbi_op_name((nbi_op)op) : group;
    for (size_t s = 0; s < sizeof RED_SHAPES / sizeof RED_SHAPES[0]; s++) {
        for (int keep = 0; keep < 2; keep++) {
            gcase *c = add_case(op, group, 1, b_reduce);
            c->fn.red = b;
            reduce_case(c, RED_SHAPES[s].rank, RED_SHAPES[s].shape, RED_SHAPES[s].n_axes,
                        RED_SHAPES[s].axes, keep, d, name);
        }
    }
    for (int r = 0; r < 2; r++) { /* random shapes and axes */
        int rank = 1 + irand(3), axes[3], n = 0;
        int64_t shape[3];
        for (int i = 0; i < rank; i++) {
            shape[i] = 1 + irand(rank == 3 ? 3 : 4);
            if (urand() < 0.5) {
                axes[n++] = urand() < 0.5 ? i - rank : i;
            }
        }
        gcase *c = add_case(op, group, 1, b_reduce);
        c->fn.red = b;
        reduce_case(c, rank, shape, n, axes, urand() < 0.5, d, name);
    }
}

/* max/min with two-way ties in every row (max and min both tied), and prod with zeros */
static const double TIE_ROWS[] = {1.5, -0.3, 1.5, -0.3, 0.7, -1.1, -1.1, 0.7};
static const double TIE_ALL[] = {0.4, -0.2, 0.4, -0.2};
static const double ZERO_ROWS[] = {0.0, 1.5, -2.0, 0.7, 0.0, 0.0, 1.2, -0.8, 0.9};

static void spec_reduce_kinks(nbi_op op, red_b b) {
    const char *name = nbi_op_name(op);
    for (int keep = 0; keep < 2; keep++) {
        gcase *c;
        if (op == NBI_OP_PROD) {
            c = add_case(op, NULL, 1, b_reduce);
            c->fn.red = b;
            c->vals[0] = ZERO_ROWS;
            reduce_case(c, 2, (int64_t[]){3, 3}, 1, (int[]){1}, keep, DOM_ANY, "prod with zeros");
            c = add_case(op, NULL, 1, b_reduce);
            c->fn.red = b;
            c->vals[0] = ZERO_ROWS;
            reduce_case(c, 2, (int64_t[]){3, 3}, 1, (int[]){-2}, keep, DOM_ANY, "prod with zeros");
            continue;
        }
        c = add_case(op, NULL, 1, b_reduce);
        c->fn.red = b;
        c->vals[0] = TIE_ROWS;
        reduce_case(c, 2, (int64_t[]){2, 4}, 1, (int[]){-1}, keep, DOM_ANY, name);
        snprintf(c->label + strlen(c->label), sizeof c->label - strlen(c->label), " 2-way ties");
        c = add_case(op, NULL, 1, b_reduce);
        c->fn.red = b;
        c->vals[0] = TIE_ALL;
        reduce_case(c, 1, (int64_t[]){4}, -1, NULL, keep, DOM_ANY, name);
        snprintf(c->label + strlen(c->label), sizeof c->label - strlen(c->label), " 2-way ties");
    }
}

static void spec_shapes(void) {
    gcase *c;
    const nb_dtype F = NB_DTYPE_F64;
    /* reshape */
    static const struct {
        int ri;
        int64_t si[3];
        int ro;
        int64_t so[3];
    } RS[] = {{2, {3, 4}, 3, {2, -1, 3}},
              {3, {1, 1, 1}, 0, {0}},
              {0, {0}, 2, {1, 1}},
              {2, {2, 3}, 1, {6}},
              {3, {2, 1, 3}, 2, {3, 2}}};
    for (size_t s = 0; s < sizeof RS / sizeof RS[0]; s++) {
        c = add_case(NBI_OP_RESHAPE, NULL, 1, b_reshape);
        set_in(c, 0, F, DOM_ANY, RS[s].ri, RS[s].si);
        c->ip[0] = RS[s].ro;
        memcpy(c->lp[0], RS[s].so, sizeof RS[s].so);
        snprintf(c->label, sizeof c->label, "reshape #%zu", s);
    }
    /* broadcast_to */
    static const struct {
        int ri;
        int64_t si[3];
        int ro;
        int64_t so[3];
    } BS[] = {{2, {3, 1}, 3, {2, 3, 4}},    {0, {0}, 2, {2, 3}},    {1, {1}, 1, {4}},
              {3, {2, 1, 3}, 3, {2, 4, 3}}, {2, {2, 3}, 2, {2, 3}}, {1, {3}, 2, {0, 3}}};
    for (size_t s = 0; s < sizeof BS / sizeof BS[0]; s++) {
        c = add_case(NBI_OP_BROADCAST, NULL, 1, b_broadcast);
        set_in(c, 0, F, DOM_ANY, BS[s].ri, BS[s].si);
        c->ip[0] = BS[s].ro;
        memcpy(c->lp[0], BS[s].so, sizeof BS[s].so);
        snprintf(c->label, sizeof c->label, "broadcast_to #%zu", s);
    }
    /* transpose */
    static const struct {
        int r;
        int64_t s[4];
        int has_perm;
        int perm[4];
    } TS[] = {{3, {2, 3, 4}, 1, {2, 0, -2}},
              {2, {3, 4}, 0, {0}},
              {3, {2, 1, 3}, 1, {1, 2, 0}},
              {4, {2, 1, 3, 2}, 1, {3, 1, 0, 2}},
              {1, {5}, 0, {0}}};
    for (size_t s = 0; s < sizeof TS / sizeof TS[0]; s++) {
        c = add_case(NBI_OP_TRANSPOSE, NULL, 1, b_transpose);
        set_in(c, 0, F, DOM_ANY, TS[s].r, TS[s].s);
        c->ip[0] = TS[s].has_perm;
        for (int i = 0; i < TS[s].r; i++) {
            c->ip[1 + i] = TS[s].perm[i];
        }
        snprintf(c->label, sizeof c->label, "transpose #%zu", s);
    }
    /* slice: start, stop, step (ip[0] = 0: step NULL) */
    static const struct {
        int r;
        int64_t s[3], lo[3], hi[3], st[3];
        int has_step;
    } SL[] = {{2, {7, 6}, {1, -1}, {100, -7}, {2, -2}, 1},
              {1, {5}, {3}, {1}, {1}, 1},
              {2, {4, 3}, {1, 0}, {3, 3}, {0}, 0},
              {3, {2, 3, 4}, {-1, 0, 3}, {-3, 3, 0}, {-1, 2, -1}, 1},
              {1, {6}, {-100}, {100}, {3}, 1}};
    for (size_t s = 0; s < sizeof SL / sizeof SL[0]; s++) {
        c = add_case(NBI_OP_SLICE, NULL, 1, b_slice);
        set_in(c, 0, F, DOM_ANY, SL[s].r, SL[s].s);
        memcpy(c->lp[0], SL[s].lo, sizeof SL[s].lo);
        memcpy(c->lp[1], SL[s].hi, sizeof SL[s].hi);
        memcpy(c->lp[2], SL[s].st, sizeof SL[s].st);
        c->ip[0] = SL[s].has_step;
        snprintf(c->label, sizeof c->label, "slice #%zu", s);
    }
    /* concatenate */
    c = add_case(NBI_OP_CONCAT, NULL, 3, b_concat);
    set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){2, 3});
    set_in(c, 1, F, DOM_ANY, 2, (int64_t[]){2, 0});
    set_in(c, 2, F, DOM_ANY, 2, (int64_t[]){2, 4});
    c->ip[0] = -1;
    snprintf(c->label, sizeof c->label, "concatenate [2,3],[2,0],[2,4] axis -1");
    c = add_case(NBI_OP_CONCAT, NULL, 2, b_concat);
    set_in(c, 0, F, DOM_ANY, 1, (int64_t[]){1});
    set_in(c, 1, F, DOM_ANY, 1, (int64_t[]){5});
    snprintf(c->label, sizeof c->label, "concatenate [1],[5] axis 0");
    c = add_case(NBI_OP_CONCAT, NULL, 4, b_concat);
    set_in(c, 0, F, DOM_ANY, 3, (int64_t[]){2, 1, 2});
    set_in(c, 1, F, DOM_ANY, 3, (int64_t[]){2, 3, 2});
    set_in(c, 2, F, DOM_ANY, 3, (int64_t[]){2, 1, 2});
    set_in(c, 3, F, DOM_ANY, 3, (int64_t[]){2, 2, 2});
    c->ip[0] = 1;
    snprintf(c->label, sizeof c->label, "concatenate 4 inputs axis 1");
    c = add_case(NBI_OP_CONCAT, NULL, 1, b_concat);
    set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){2, 3});
    snprintf(c->label, sizeof c->label, "concatenate a single input");
    /* pad */
    static const struct {
        int r;
        int64_t s[3], lo[3], hi[3];
        double v;
    } PD[] = {{2, {2, 3}, {1, 0}, {2, 3}, 7.5},
              {1, {4}, {0}, {2}, 0.0},
              {3, {2, 1, 2}, {0, 2, 1}, {1, 0, 0}, -1.0},
              {2, {2, 2}, {0, 0}, {0, 0}, 3.0}};
    /* im2col / col2im: linear, each the other's transpose */
    for (int op = 0; op < 2; op++) {
        c = add_case(op ? NBI_OP_COL2IM : NBI_OP_IM2COL, NULL, 1, op ? b_col2im : b_im2col);
        c->ip[0] = 2;
        memcpy(c->lp[0], (int64_t[]){2, 3, 0, 2, 1}, 5 * sizeof(int64_t));
        memcpy(c->lp[1], (int64_t[]){1, 0, 0, 1, 2}, 5 * sizeof(int64_t));
        memcpy(c->lp[2], (int64_t[]){1, 2, 0, 5, 6}, 5 * sizeof(int64_t));
        c->dp = op ? 0.0 : -1.5;
        /* x [2, 3, 5, 6] -> cols [2, 6, 3, 3, 4] */
        if (op == 0) {
            set_in(c, 0, F, DOM_ANY, 4, (int64_t[]){2, 3, 5, 6});
        } else {
            set_in(c, 0, F, DOM_ANY, 5, (int64_t[]){2, 6, 3, 3, 4});
        }
        snprintf(c->label, sizeof c->label, "%s 2d", op ? "col2im" : "im2col");
    }
    /* pool_take / pool_scatter: linear in input 1, each the other's transpose (x [2, 3, 5, 6]
     * read as [N, C, S..], windows [3, 4]); x selects and gets no gradient */
    for (int op = 0; op < 2; op++) {
        c = add_case(op ? NBI_OP_POOL_SCATTER : NBI_OP_POOL_TAKE, NULL, 2,
                     op ? b_pool_scatter : b_pool_take);
        c->ip[0] = 2;
        memcpy(c->lp[0], (int64_t[]){2, 3, 0, 2, 1}, 5 * sizeof(int64_t));
        memcpy(c->lp[1], (int64_t[]){1, 0, 0, 1, 2}, 5 * sizeof(int64_t));
        memcpy(c->lp[2], (int64_t[]){1, 2}, 2 * sizeof(int64_t));
        c->dp = op ? 0.0 : -1.5;
        set_in(c, 0, F, DOM_ANY, 4, (int64_t[]){2, 3, 5, 6});
        if (op == 0) {
            set_in(c, 1, F, DOM_ANY, 4, (int64_t[]){2, 3, 5, 6});
        } else {
            set_in(c, 1, F, DOM_ANY, 4, (int64_t[]){2, 3, 3, 4});
        }
        snprintf(c->label, sizeof c->label, "%s 2d", op ? "pool_scatter" : "pool_take");
    }
    for (size_t s = 0; s < sizeof PD / sizeof PD[0]; s++) {
        c = add_case(NBI_OP_PAD, NULL, 1, b_pad);
        set_in(c, 0, F, DOM_ANY, PD[s].r, PD[s].s);
        memcpy(c->lp[0], PD[s].lo, sizeof PD[s].lo);
        memcpy(c->lp[1], PD[s].hi, sizeof PD[s].hi);
        c->dp = PD[s].v;
        snprintf(c->label, sizeof c->label, "pad #%zu", s);
    }
    for (int it = 0; it < 2; it++) {
        nb_dtype id = it ? NB_DTYPE_I64 : NB_DTYPE_I32;
        const char *idn = nb_dtype_name(id);
        /* take: indices repeat and go out of range (clamped): the VJP must scatter-add */
        c = add_case(NBI_OP_TAKE, NULL, 2, b_take);
        set_in(c, 0, F, DOM_ANY, 3, (int64_t[]){3, 5, 2});
        set_in(c, 1, id, DOM_IDX, 2, (int64_t[]){2, 4});
        c->ip[0] = 1;
        snprintf(c->label, sizeof c->label, "take [3,5,2] idx %s[2,4] axis 1", idn);
        c = add_case(NBI_OP_TAKE, NULL, 2, b_take);
        set_in(c, 0, F, DOM_ANY, 1, (int64_t[]){6});
        set_in(c, 1, id, DOM_IDX, 0, NULL);
        snprintf(c->label, sizeof c->label, "take [6] idx %s[] axis 0", idn);
        c = add_case(NBI_OP_TAKE, NULL, 2, b_take);
        set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){4, 3});
        set_in(c, 1, id, DOM_IDX, 1, (int64_t[]){7});
        c->ip[0] = -1;
        snprintf(c->label, sizeof c->label, "take [4,3] idx %s[7] axis -1", idn);
        /* take_along_axis */
        c = add_case(NBI_OP_TAKE_ALONG, NULL, 2, b_take_along);
        set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){4, 6});
        set_in(c, 1, id, DOM_IDX, 2, (int64_t[]){4, 3});
        c->ip[0] = -1;
        snprintf(c->label, sizeof c->label, "take_along_axis [4,6] idx %s[4,3] axis -1", idn);
        c = add_case(NBI_OP_TAKE_ALONG, NULL, 2, b_take_along);
        set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){5, 4});
        set_in(c, 1, id, DOM_IDX, 2, (int64_t[]){3, 4});
        c->ip[0] = 0;
        snprintf(c->label, sizeof c->label, "take_along_axis [5,4] idx %s[3,4] axis 0", idn);
        c = add_case(NBI_OP_TAKE_ALONG, NULL, 2, b_take_along);
        set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){4, 6});
        set_in(c, 1, id, DOM_IDX, 2, (int64_t[]){1, 3});
        c->ip[0] = 1;
        snprintf(c->label, sizeof c->label, "take_along_axis [4,6] idx %s[1,3] (broadcast)", idn);
        /* dynamic_slice: starts clamped so that the slice stays inside */
        c = add_case(NBI_OP_DYN_SLICE, NULL, 3, b_dyn_slice);
        set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){5, 4});
        set_in(c, 1, id, DOM_IDX, 0, NULL);
        set_in(c, 2, id, DOM_IDX, 0, NULL);
        c->lp[0][0] = 2;
        c->lp[0][1] = 3;
        snprintf(c->label, sizeof c->label, "dynamic_slice [5,4] sizes [2,3] starts %s", idn);
        c = add_case(NBI_OP_DYN_SLICE, NULL, 2, b_dyn_slice);
        set_in(c, 0, F, DOM_ANY, 1, (int64_t[]){6});
        set_in(c, 1, id, DOM_IDX, 0, NULL);
        c->lp[0][0] = 3;
        snprintf(c->label, sizeof c->label, "dynamic_slice [6] size 3 start %s", idn);
        /* dynamic_update_slice */
        c = add_case(NBI_OP_DYN_UPDATE, NULL, 4, b_dyn_update);
        set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){5, 4});
        set_in(c, 1, F, DOM_ANY, 2, (int64_t[]){2, 3});
        set_in(c, 2, id, DOM_IDX, 0, NULL);
        set_in(c, 3, id, DOM_IDX, 0, NULL);
        snprintf(c->label, sizeof c->label, "dynamic_update_slice [5,4] <- [2,3] starts %s", idn);
        c = add_case(NBI_OP_DYN_UPDATE, NULL, 3, b_dyn_update);
        set_in(c, 0, F, DOM_ANY, 1, (int64_t[]){6});
        set_in(c, 1, F, DOM_ANY, 1, (int64_t[]){2});
        set_in(c, 2, id, DOM_IDX, 0, NULL);
        snprintf(c->label, sizeof c->label, "dynamic_update_slice [6] <- [2] start %s", idn);
    }
}

static void spec_matmul(void) {
    static const struct {
        int ra, rb;
        int64_t sa[4], sb[4];
        int ta, tb; /* operands stored transposed */
    } M[] = {
        {2, 2, {3, 4}, {4, 2}, 0, 0},
        {1, 2, {4}, {4, 2}, 0, 0},
        {2, 1, {3, 4}, {4}, 0, 0},
        {1, 1, {4}, {4}, 0, 0},
        {3, 3, {2, 3, 4}, {2, 4, 2}, 0, 0},
        {4, 3, {2, 1, 2, 3}, {3, 3, 2}, 0, 0}, /* batch broadcast both ways */
        {2, 3, {3, 4}, {2, 4, 2}, 0, 0},       /* a broadcast over b's batch */
        {3, 2, {2, 3, 4}, {4, 2}, 0, 0},
        {1, 3, {3}, {2, 3, 2}, 0, 0}, /* rank-1 a with a batched b */
        {3, 1, {2, 2, 3}, {3}, 0, 0}, /* batched a with a rank-1 b */
        {3, 3, {1, 2, 3}, {2, 3, 2}, 0, 0},
        {2, 2, {3, 0}, {0, 2}, 0, 0}, /* k = 0 */
        {2, 2, {4, 3}, {4, 2}, 1, 0}, /* a stored as [k, m] */
        {2, 2, {3, 4}, {2, 4}, 0, 1}, /* b stored as [n, k] */
        {2, 2, {4, 3}, {2, 4}, 1, 1}, /* both */
        {3, 2, {2, 4, 3}, {4, 2}, 1, 0},
        {3, 3, {2, 4, 3}, {1, 2, 4}, 1, 1},
        {1, 2, {4}, {2, 4}, 1, 1}, /* the flag of a rank-1 operand has no effect */
        {2, 1, {4, 3}, {4}, 1, 0},
    };
    for (size_t s = 0; s < sizeof M / sizeof M[0]; s++) {
        gcase *c = add_case(NBI_OP_MATMUL, NULL, 2, b_matmul);
        set_in(c, 0, NB_DTYPE_F64, DOM_ANY, M[s].ra, M[s].sa);
        set_in(c, 1, NB_DTYPE_F64, DOM_ANY, M[s].rb, M[s].sb);
        c->ip[0] = M[s].ta;
        c->ip[1] = M[s].tb;
        snprintf(c->label, sizeof c->label, "matmul #%zu%s%s", s, M[s].ta ? " a^T" : "",
                 M[s].tb ? " b^T" : "");
    }
}

/* ---- linear algebra ------------------------------------------------------------------
 * ip[0] the op (or a composite's index), ip[1] what the builder makes of input 0 (0: X;
 * 1: X + (n + 2) I, well conditioned, not symmetric; 2: packed LU factors [X + (n + 2) I;
 * the reversed permutation] so that lu_solve's rule for the factors is checked by itself),
 * ip[2] flags (1 lower, 2 transpose, 4 unit diagonal). */

static nb_var *la_eye(nb_trace *tr, int64_t n) {
    int64_t s[2] = {n, n};
    return nb_cast(nb_eq(nb_iota(tr, NB_DTYPE_I32, 2, s, 0), nb_iota(tr, NB_DTYPE_I32, 2, s, 1)),
                   NB_DTYPE_F64);
}

static nb_var *la_input(nb_trace *tr, nb_var *x, int kind) {
    int64_t n = nb_var_dim(x, -1);
    if (kind == 0) {
        return x;
    }
    nb_var *a = nb_add(x, nb_mul(la_eye(tr, n), nb_scalar(tr, (double)n + 2)));
    if (kind == 1) {
        return a;
    }
    int r = nb_var_rank(x);
    int64_t ps[NB_MAX_RANK];
    memcpy(ps, nb_var_shape(x), (size_t)r * sizeof(int64_t));
    ps[r - 2] = 1;
    nb_var *rev =
        nb_sub(nb_scalar(tr, (double)n - 1), nb_iota(tr, NB_DTYPE_F64, 2, (int64_t[]){1, n}, 1));
    return nb_concatenate(2, (nb_var *[]){a, nb_broadcast_to(rev, r, ps)}, -2);
}

static nb_var *b_linalg(nb_trace *tr, nb_var *const *in, const gcase *c) {
    nb_var *a = la_input(tr, in[0], c->ip[1]);
    int fl = c->ip[2];
    switch (c->ip[0]) {
    case NBI_OP_LU_FACTOR:
        return nb_lu_factor(a);
    case NBI_OP_LU_SOLVE:
        return nb_lu_solve(c->ip[1] == 2 ? a : nb_lu_factor(a), in[1], fl & 2);
    case NBI_OP_SOLVE:
        return nb_solve(a, in[1]);
    case NBI_OP_CHOLESKY:
        return nb_cholesky(a);
    case NBI_OP_CHOLESKY_SOLVE:
        return nb_cholesky_solve(a, in[1]);
    case NBI_OP_TRI_SOLVE:
        return nb_triangular_solve(a, in[1], fl & 1, fl & 2, fl & 4);
    case NBI_OP_SLOGDET: {
        nb_var *sign = NULL, *logabs = nb_slogdet(a, &sign);
        return nb_stack(2, (nb_var *[]){sign, logabs}, -1);
    }
    case 1000:
        return nb_inv(a);
    case 1001:
        return nb_det(a);
    case 1002:
        return nb_diagonal(a);
    default: /* cholesky of a product: the usual way a covariance is factored */
        return nb_cholesky(nb_add(nb_matmul(a, nb_transpose(a, (int[]){1, 0})),
                                  nb_mul(la_eye(tr, nb_var_dim(a, -1)), nb_scalar(tr, 1.0))));
    }
}

static void spec_linalg(void) {
    static const struct {
        int op, kind, flags;
        int ra, rb;
        int64_t sa[4], sb[4];
        const char *name;
    } L[] = {
        {NBI_OP_LU_FACTOR, 0, 0, 2, 0, {4, 4}, {0}, NULL},
        {NBI_OP_LU_FACTOR, 0, 0, 3, 0, {2, 3, 3}, {0}, NULL},
        {NBI_OP_LU_SOLVE, 2, 0, 2, 1, {4, 4}, {4}, NULL},
        {NBI_OP_LU_SOLVE, 2, 2, 2, 2, {3, 3}, {3, 2}, NULL},
        {NBI_OP_LU_SOLVE, 2, 2, 3, 3, {2, 3, 3}, {2, 3, 2}, NULL},
        {NBI_OP_LU_SOLVE, 2, 0, 2, 3, {3, 3}, {2, 3, 2}, NULL}, /* factors broadcast */
        {NBI_OP_LU_SOLVE, 0, 0, 2, 1, {4, 4}, {4}, NULL},       /* through lu_factor */
        {NBI_OP_LU_SOLVE, 0, 2, 2, 2, {3, 3}, {3, 2}, NULL},
        {NBI_OP_SOLVE, 0, 0, 2, 1, {3, 3}, {3}, NULL},
        {NBI_OP_SOLVE, 0, 0, 3, 3, {2, 3, 3}, {2, 3, 2}, NULL},
        {NBI_OP_SOLVE, 0, 0, 2, 3, {3, 3}, {2, 3, 2}, NULL}, /* a broadcast over b */
        {NBI_OP_SOLVE, 0, 0, 4, 3, {2, 1, 3, 3}, {2, 2, 3}, NULL},
        {NBI_OP_CHOLESKY, 1, 0, 2, 0, {4, 4}, {0}, NULL},
        {NBI_OP_CHOLESKY, 1, 0, 3, 0, {2, 3, 3}, {0}, NULL},
        {NBI_OP_CHOLESKY_SOLVE, 1, 0, 2, 1, {4, 4}, {4}, NULL},
        {NBI_OP_CHOLESKY_SOLVE, 1, 0, 3, 3, {2, 3, 3}, {2, 3, 2}, NULL},
        {NBI_OP_CHOLESKY_SOLVE, 1, 0, 2, 3, {3, 3}, {2, 3, 1}, NULL},
        {NBI_OP_TRI_SOLVE, 1, 1, 2, 1, {4, 4}, {4}, NULL},
        {NBI_OP_TRI_SOLVE, 1, 0, 2, 2, {4, 4}, {4, 2}, NULL},
        {NBI_OP_TRI_SOLVE, 1, 3, 3, 3, {2, 3, 3}, {2, 3, 2}, NULL},
        {NBI_OP_TRI_SOLVE, 1, 2, 2, 1, {4, 4}, {4}, NULL},
        {NBI_OP_TRI_SOLVE, 1, 5, 2, 3, {3, 3}, {2, 3, 2}, NULL},
        {NBI_OP_TRI_SOLVE, 1, 6, 2, 1, {4, 4}, {4}, NULL},
        {NBI_OP_SLOGDET, 0, 0, 2, 0, {4, 4}, {0}, NULL},
        {NBI_OP_SLOGDET, 0, 0, 3, 0, {2, 3, 3}, {0}, NULL},
        {1000, 0, 0, 2, 0, {3, 3}, {0}, "inv"},
        {1000, 0, 0, 3, 0, {2, 3, 3}, {0}, "inv"},
        {1001, 0, 0, 2, 0, {3, 3}, {0}, "det"},
        {1002, 0, 0, 3, 0, {2, 3, 4}, {0}, "diagonal"},
        {1003, 0, 0, 2, 0, {4, 4}, {0}, "cholesky(a a^T + I)"},
    };
    for (size_t s = 0; s < sizeof L / sizeof L[0]; s++) {
        bool comp = L[s].op >= 1000;
        gcase *c = add_case(comp ? COMPOSITE : L[s].op, L[s].name, L[s].rb ? 2 : 1, b_linalg);
        c->ip[0] = L[s].op;
        c->ip[1] = L[s].kind;
        c->ip[2] = L[s].flags;
        set_in(c, 0, NB_DTYPE_F64, DOM_ANY, L[s].ra, L[s].sa);
        if (L[s].rb) {
            set_in(c, 1, NB_DTYPE_F64, DOM_ANY, L[s].rb, L[s].sb);
        }
        snprintf(c->label, sizeof c->label, "%s #%zu (input %d, flags %d)",
                 comp ? L[s].name : nbi_op_name((nbi_op)L[s].op), s, L[s].kind, L[s].flags);
    }
}

static void spec_composites(void) {
    gcase *c;
    const nb_dtype F = NB_DTYPE_F64;
    for (size_t s = 0; s < sizeof RED_SHAPES / sizeof RED_SHAPES[0]; s += 2) {
        for (int keep = 0; keep < 2; keep++) {
            c = add_case(COMPOSITE, "mean", 1, b_reduce);
            c->fn.red = nb_mean;
            reduce_case(c, RED_SHAPES[s].rank, RED_SHAPES[s].shape, RED_SHAPES[s].n_axes,
                        RED_SHAPES[s].axes, keep, DOM_ANY, "mean");
            c = add_case(COMPOSITE, "logsumexp", 1, b_reduce);
            c->fn.red = nb_logsumexp;
            reduce_case(c, RED_SHAPES[s + 1].rank, RED_SHAPES[s + 1].shape,
                        RED_SHAPES[s + 1].n_axes, RED_SHAPES[s + 1].axes, keep, DOM_ANY,
                        "logsumexp");
        }
    }
    static const struct {
        int r;
        int64_t s[3];
        int axis;
    } SM[] = {{1, {5}, 0}, {2, {3, 4}, -1}, {2, {3, 4}, 0}, {3, {2, 3, 2}, 1}, {2, {4, 1}, 1}};
    for (int log = 0; log < 2; log++) {
        for (size_t s = 0; s < sizeof SM / sizeof SM[0]; s++) {
            c = add_case(COMPOSITE, log ? "log_softmax" : "softmax", 1, b_softmax);
            set_in(c, 0, F, DOM_ANY, SM[s].r, SM[s].s);
            c->ip[0] = SM[s].axis;
            c->ip[1] = log;
            snprintf(c->label, sizeof c->label, "%s #%zu axis %d", c->group, s, SM[s].axis);
        }
    }
    static const int64_t DOT_N[] = {1, 5};
    for (int s = 0; s < 2; s++) {
        c = add_case(COMPOSITE, "dot", 2, b_binary);
        c->fn.bin = nb_dot;
        set_in(c, 0, F, DOM_ANY, 1, &DOT_N[s]);
        set_in(c, 1, F, DOM_ANY, 1, &DOT_N[s]);
        snprintf(c->label, sizeof c->label, "dot [%lld]", (long long)DOT_N[s]);
    }
    static const struct {
        int r;
        int64_t s[3];
        int axis;
    } ED[] = {{0, {0}, 0}, {2, {2, 3}, -1}, {2, {2, 3}, 1}};
    for (size_t s = 0; s < sizeof ED / sizeof ED[0]; s++) {
        c = add_case(COMPOSITE, "expand_dims", 1, b_expand_dims);
        set_in(c, 0, F, DOM_ANY, ED[s].r, ED[s].s);
        c->ip[0] = ED[s].axis;
        snprintf(c->label, sizeof c->label, "expand_dims #%zu axis %d", s, ED[s].axis);
    }
    c = add_case(COMPOSITE, "squeeze", 1, b_squeeze);
    set_in(c, 0, F, DOM_ANY, 3, (int64_t[]){2, 1, 3});
    c->ip[0] = -1;
    snprintf(c->label, sizeof c->label, "squeeze [2,1,3] every size-1 axis");
    c = add_case(COMPOSITE, "squeeze", 1, b_squeeze);
    set_in(c, 0, F, DOM_ANY, 3, (int64_t[]){1, 3, 1});
    c->ip[0] = 1;
    c->ip[1] = -1;
    snprintf(c->label, sizeof c->label, "squeeze [1,3,1] axis -1");
    for (int axis = -1; axis < 2; axis++) {
        c = add_case(COMPOSITE, "stack", 3, b_stack);
        for (int i = 0; i < 3; i++) {
            set_in(c, i, F, DOM_ANY, 1, (int64_t[]){4});
        }
        c->ip[0] = axis;
        snprintf(c->label, sizeof c->label, "stack 3 x [4] axis %d", axis);
    }
    /* chains through the ops without gradients, and a dense layer */
    c = add_case(COMPOSITE, "x*sign(x)", 1, b_x_sign);
    set_in(c, 0, F, DOM_AWAY0, 2, (int64_t[]){2, 3});
    snprintf(c->label, sizeof c->label, "x*sign(x): sign has no gradient");
    c = add_case(COMPOSITE, "cast through i32", 1, b_int_path);
    set_in(c, 0, F, DOM_ANY, 1, (int64_t[]){6});
    snprintf(c->label, sizeof c->label, "f64(i32(x)) + x^2: the integer path carries nothing");
    c = add_case(COMPOSITE, "x*argmax(x)", 1, b_argmax_scaled);
    set_in(c, 0, F, DOM_DISTINCT, 2, (int64_t[]){3, 4});
    snprintf(c->label, sizeof c->label, "x * f64(argmax(x, -1))");
    c = add_case(COMPOSITE, "one_hot(i)*x", 2, b_one_hot_mul);
    set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){5, 4});
    set_in(c, 1, NB_DTYPE_I32, DOM_IDX, 1, (int64_t[]){5});
    snprintf(c->label, sizeof c->label, "one_hot(idx, 4) * x: idx gets a null cotangent");
    c = add_case(COMPOSITE, "comparisons+select", 2, b_compare_select);
    set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){2, 3});
    set_in(c, 1, F, DOM_ANY, 1, (int64_t[]){3});
    snprintf(c->label, sizeof c->label, "select(x > y | !(y <= 0.5), x y, x - exp(y))");
    c = add_case(COMPOSITE, "dense layer", 3, b_layer);
    set_in(c, 0, F, DOM_ANY, 2, (int64_t[]){3, 4});
    set_in(c, 1, F, DOM_ANY, 2, (int64_t[]){4, 2});
    set_in(c, 2, F, DOM_ANY, 1, (int64_t[]){2});
    snprintf(c->label, sizeof c->label, "2 sigmoid(tanh(x @ w + b))");
}

static void spec_custom_vjp(void) {
    static const struct {
        int ra, rb;
        int64_t sa[3], sb[3];
    } CV[] = {{2, 1, {2, 3}, {3}}, {0, 0, {0}, {0}}, {1, 1, {4}, {4}}};
    for (size_t s = 0; s < sizeof CV / sizeof CV[0]; s++) {
        gcase *c = add_case(NBI_OP_CUSTOM_VJP, NULL, 2, b_custom);
        set_in(c, 0, NB_DTYPE_F64, DOM_ANY, CV[s].ra, CV[s].sa);
        set_in(c, 1, NB_DTYPE_F64, DOM_ANY, CV[s].rb, CV[s].sb);
        c->jvp_fails = true; /* as JAX: forward mode through custom_vjp is an error */
        snprintf(c->label, sizeof c->label, "custom_vjp sin(x) y #%zu (jvp must fail)", s);
    }
}

static void spec_custom_jvp(void) {
    static const struct {
        int ra, rb;
        int64_t sa[3], sb[3];
    } CJ[] = {{2, 2, {2, 3}, {2, 3}}, {0, 0, {0}, {0}}, {1, 1, {4}, {4}}};
    for (size_t s = 0; s < sizeof CJ / sizeof CJ[0]; s++) {
        gcase *c = add_case(NBI_OP_CUSTOM_JVP, NULL, 2, b_custom_jvp);
        set_in(c, 0, NB_DTYPE_F64, DOM_ANY, CJ[s].ra, CJ[s].sa);
        set_in(c, 1, NB_DTYPE_F64, DOM_ANY, CJ[s].rb, CJ[s].sb);
        snprintf(c->label, sizeof c->label, "custom_jvp sin(x) y #%zu", s);
    }
}

static void build_specs(void) {
    /* elementwise unary */
    spec_unary(NBI_OP_NEG, nb_neg, DOM_ANY);
    spec_unary(NBI_OP_ABS, nb_abs, DOM_AWAY0);
    spec_unary(NBI_OP_EXP, nb_exp, DOM_ANY);
    spec_unary(NBI_OP_EXPM1, nb_expm1, DOM_ANY);
    spec_unary(NBI_OP_LOG, nb_log, DOM_POS);
    spec_unary(NBI_OP_LOG1P, nb_log1p, DOM_GT_M1);
    spec_unary(NBI_OP_SQRT, nb_sqrt, DOM_POS);
    spec_unary(NBI_OP_RSQRT, nb_rsqrt, DOM_POS);
    spec_unary(NBI_OP_SQUARE, nb_square, DOM_ANY);
    spec_unary(NBI_OP_RECIPROCAL, nb_reciprocal, DOM_AWAY0);
    spec_unary(NBI_OP_SIN, nb_sin, DOM_ANY);
    spec_unary(NBI_OP_COS, nb_cos, DOM_ANY);
    spec_unary(NBI_OP_TAN, nb_tan, DOM_SMALL);
    spec_unary(NBI_OP_TANH, nb_tanh, DOM_ANY);
    spec_unary(NBI_OP_SIGMOID, nb_sigmoid, DOM_ANY);
    spec_unary(NBI_OP_RELU, nb_relu, DOM_AWAY0);
    spec_unary(NBI_OP_GELU, nb_gelu, DOM_ANY);
    spec_unary(NBI_OP_SOFTPLUS, nb_softplus, DOM_ANY);
    spec_unary(NBI_OP_ERF, nb_erf, DOM_ANY);
    for (size_t s = 0; s < sizeof UNARY_SHAPES / sizeof UNARY_SHAPES[0]; s++) {
        gcase *c = add_case(NBI_OP_IDENTITY, NULL, 1, b_identity);
        set_in(c, 0, NB_DTYPE_F64, DOM_ANY, UNARY_SHAPES[s].rank, UNARY_SHAPES[s].shape);
        snprintf(c->label, sizeof c->label, "identity shape #%zu", s);
        c = add_case(NBI_OP_IMPLICIT, NULL, 1, b_implicit);
        set_in(c, 0, NB_DTYPE_F64, DOM_ANY, UNARY_SHAPES[s].rank, UNARY_SHAPES[s].shape);
        snprintf(c->label, sizeof c->label, "implicit shape #%zu", s);
    }
    /* cast between floats. f64 -> f32: the output rounds to 2^-24 relative, so the step is
     * 1e-3 (the function is the identity up to that rounding: no truncation error), FD is
     * good to ~1e-4 and <u, J v> to f32 rounding. f32 -> f64: the input step rounds in f32
     * (the harness divides by the step actually taken); the cotangent is rounded to f32. */
    for (int dir = 0; dir < 2; dir++) {
        for (int s = 2; s < 4; s++) {
            gcase *c = add_case(NBI_OP_CAST, NULL, 1, b_cast);
            c->to = dir ? NB_DTYPE_F64 : NB_DTYPE_F32;
            set_in(c, 0, dir ? NB_DTYPE_F32 : NB_DTYPE_F64, DOM_ANY, UNARY_SHAPES[s].rank,
                   UNARY_SHAPES[s].shape);
            c->h_rel = 1e-3;
            c->tol = 1e-3;
            c->ctol = 1e-6;
            snprintf(c->label, sizeof c->label, "cast %s -> %s shape #%d", dir ? "f32" : "f64",
                     dir ? "f64" : "f32", s);
        }
    }
    /* elementwise binary */
    spec_binary(NBI_OP_ADD, nb_add, DOM_ANY, DOM_ANY);
    spec_binary(NBI_OP_SUB, nb_sub, DOM_ANY, DOM_ANY);
    spec_binary(NBI_OP_MUL, nb_mul, DOM_ANY, DOM_ANY);
    spec_binary(NBI_OP_DIV, nb_div, DOM_ANY, DOM_AWAY0);
    spec_binary(NBI_OP_POW, nb_pow, DOM_POS, DOM_ANY);
    spec_binary(NBI_OP_MAXIMUM, nb_maximum, DOM_ANY, DOM_ANY);
    spec_binary(NBI_OP_MINIMUM, nb_minimum, DOM_ANY, DOM_ANY);
    spec_binary_ties(NBI_OP_MAXIMUM, nb_maximum);
    spec_binary_ties(NBI_OP_MINIMUM, nb_minimum);
    /* select: the condition is bool (null cotangent); the three broadcast together */
    static const struct {
        int r[3];
        int64_t s[3][3];
    } S[] = {{{2, 2, 2}, {{2, 3}, {2, 3}, {2, 3}}},
             {{1, 2, 0}, {{3}, {2, 3}, {0}}},
             {{0, 1, 2}, {{0}, {4}, {2, 4}}},
             {{2, 2, 2}, {{2, 1}, {1, 3}, {2, 3}}},
             {{3, 1, 1}, {{2, 1, 3}, {1}, {3}}}};
    for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
        gcase *c = add_case(NBI_OP_SELECT, NULL, 3, b_select);
        set_in(c, 0, NB_DTYPE_BOOL, DOM_BOOL, S[s].r[0], S[s].s[0]);
        set_in(c, 1, NB_DTYPE_F64, DOM_ANY, S[s].r[1], S[s].s[1]);
        set_in(c, 2, NB_DTYPE_F64, DOM_ANY, S[s].r[2], S[s].s[2]);
        snprintf(c->label, sizeof c->label, "select #%zu", s);
    }
    /* reductions */
    spec_reduce(NBI_OP_SUM, NULL, nb_sum, DOM_ANY);
    spec_reduce(NBI_OP_PROD, NULL, nb_prod, DOM_UNIT);
    spec_reduce(NBI_OP_MAX, NULL, nb_max, DOM_DISTINCT);
    spec_reduce(NBI_OP_MIN, NULL, nb_min, DOM_DISTINCT);
    spec_reduce_kinks(NBI_OP_PROD, nb_prod);
    spec_reduce_kinks(NBI_OP_MAX, nb_max);
    spec_reduce_kinks(NBI_OP_MIN, nb_min);
    spec_shapes();
    spec_matmul();
    spec_linalg();
    spec_custom_vjp();
    spec_custom_jvp();
    spec_composites();
}

/* ---- running a case ----------------------------------------------------------------- */

static nb_status body_case(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t ci = 0;
    if (nb_tree_get_int(self, &ci) != NB_OK || ci < 0 || ci >= g_n_cases) {
        return nb_trace_fail(tr, NB_ERR_INVALID, "bad case index");
    }
    const gcase *c = &g_cases[ci];
    nb_var *in[MAX_IN] = {0};
    for (int i = 0; i < c->n_in; i++) {
        in[i] = nb_get(tr, args, "[%d]", i);
    }
    return nb_return(c->build(tr, in, c), out);
}

static double aget(const nb_array *a, int64_t i) {
    double v = 0;
    nb_array_get_flat(a, i, &v);
    return v;
}

static void aset(nb_array *a, int64_t i, double v) {
    void *p = nb_array_data(a);
    switch (nb_array_dtype(a)) {
    case NB_DTYPE_F32:
        ((float *)p)[i] = (float)v;
        break;
    case NB_DTYPE_F64:
        ((double *)p)[i] = v;
        break;
    case NB_DTYPE_I32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    case NB_DTYPE_I64:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    case NB_DTYPE_BOOL:
        ((uint8_t *)p)[i] = v != 0;
        break;
    }
}

static nb_array *new_array(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    return a;
}

/* Random values of dtype/shape in [-1, 1] (cotangents and tangents). */
static nb_array *random_like(nb_ctx *ctx, const nb_array *x) {
    nb_array *a = new_array(ctx, nb_array_dtype(x), nb_array_rank(x), nb_array_shape(x));
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        aset(a, i, -1.0 + 2.0 * urand());
    }
    return a;
}

static nb_tree *leaf(nb_array *a) {
    nb_tree *t = NULL;
    NBT_OK(nb_array_ctx(a), nb_tree_array(a, &t));
    return t;
}

static nb_tree *pair(nb_ctx *ctx, nb_tree *a, nb_tree *b) {
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){a, b}, &t));
    return t;
}

static bool same_sig(const nb_array *a, const nb_array *b) {
    if (a == NULL || b == NULL || nb_array_dtype(a) != nb_array_dtype(b) ||
        nb_array_rank(a) != nb_array_rank(b)) {
        return false;
    }
    for (int d = 0; d < nb_array_rank(a); d++) {
        if (nb_array_dim(a, d) != nb_array_dim(b, d)) {
            return false;
        }
    }
    return true;
}

static const char *sig(const nb_array *a, char *buf, size_t cap) {
    if (a == NULL) {
        snprintf(buf, cap, "(not an array)");
    } else {
        nb_array_format_sig(a, buf, cap, NULL);
    }
    return buf;
}

typedef struct case_env {
    nb_ctx *ctx;
    const gcase *c;
    nb_fn *f;
    nb_tree *args;
    nb_array *x[MAX_IN];
    bool diff[MAX_IN];
    int bad; /* messages printed for this case */
} case_env;

static int g_failed_cases;
static int g_failed_by_op[NBI_OP_COUNT];
static int64_t g_fd_evals;
static int64_t g_n_draws;

static void report(case_env *e, const char *fmt, ...) NBI_PRINTF(2, 3);
static void report(case_env *e, const char *fmt, ...) {
    if (e->bad++ < 6) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        print_error("FAIL %s [%s]: %s\n", e->c->label, case_name(e->c), msg);
    }
}

/* f(args) as a new array (the inputs' current data), or NULL with a report. */
static nb_array *eval_f(case_env *e) {
    nb_tree *out = NULL;
    g_fd_evals++;
    nb_status st = nb_fn_call(e->f, e->args, &out);
    if (st != NB_OK) {
        report(e, "f failed: %s", nb_ctx_errmsg(e->ctx));
        return NULL;
    }
    nb_array *y = nb_array_retain(nb_tree_get_array(out));
    nb_tree_destroy(out);
    return y;
}

static double dot_arrays(const nb_array *a, const nb_array *b, double *abs_sum) {
    double s = 0, as = 0;
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        double p = aget(a, i) * aget(b, i);
        s += p;
        as += fabs(p);
    }
    if (abs_sum != NULL) {
        *abs_sum += as;
    }
    return s;
}

static bool close_to(double got, double want, double tol) {
    return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

/* Primal outputs of the transforms must be f(x) (same kernels; rounding may differ only
 * by a reordered sum after different fusion/CSE decisions). */
static void check_primal(case_env *e, const nb_array *got, const nb_array *y0, const char *who) {
    char s1[64], s2[64];
    if (!same_sig(got, y0)) {
        report(e, "%s primal output is %s, f gives %s", who, sig(got, s1, sizeof s1),
               sig(y0, s2, sizeof s2));
        return;
    }
    for (int64_t i = 0; i < nb_array_size(y0); i++) {
        if (!close_to(aget(got, i), aget(y0, i), 1e-12)) {
            report(e, "%s primal output [%lld] = %.17g, f gives %.17g", who, (long long)i,
                   aget(got, i), aget(y0, i));
            return;
        }
    }
}

/* Fill input i with the case's values or a fresh random draw of its domain. */
static void fill_input(const gcase *c, int i, nb_array *x) {
    int64_t n = nb_array_size(x);
    if (c->vals[i] != NULL) {
        for (int64_t k = 0; k < n; k++) {
            aset(x, k, c->vals[i][k]);
        }
    } else if (c->dm[i] == DOM_DISTINCT) {
        /* a shuffled grid: pairwise at least 2/n apart, far above the FD step */
        for (int64_t k = 0; k < n; k++) {
            aset(x, k, -2.0 + 4.0 * ((double)k + 0.5 * urand()) / (double)n);
        }
        for (int64_t k = n - 1; k > 0; k--) {
            int64_t j = (int64_t)(urand() * (double)(k + 1)) % (k + 1);
            double t = aget(x, k);
            aset(x, k, aget(x, j));
            aset(x, j, t);
        }
    } else {
        for (int64_t k = 0; k < n; k++) {
            aset(x, k, gen_value(c->dm[i]));
        }
    }
}

/* (a) VJP against central differences of <u, f(x)>; fills ct[] (borrowed from *vout). */
static bool check_vjp(case_env *e, nb_fn *vf, const nb_array *y0, const nb_array *u, nb_tree **vout,
                      nb_array **ct) {
    const gcase *c = e->c;
    char s1[64], s2[64];
    nb_tree *ul = leaf((nb_array *)u), *vargs = pair(e->ctx, e->args, ul);
    nb_status st = nb_fn_call(vf, vargs, vout);
    nb_tree_destroy(vargs);
    nb_tree_destroy(ul);
    if (st != NB_OK) {
        report(e, "vjp(f) failed: %s", nb_ctx_errmsg(e->ctx));
        return false;
    }
    check_primal(e, nb_tree_get_array(nb_tree_child(*vout, 0)), y0, "vjp");
    const nb_tree *cts = nb_tree_child(*vout, 1);
    for (int i = 0; i < c->n_in; i++) {
        const nb_tree *ci_t = nb_tree_child(cts, i);
        if (!nb_dtype_is_float(c->dt[i])) {
            if (nb_tree_kind_of(ci_t) != NB_TREE_KIND_NULL) {
                report(e, "input %d is %s: its cotangent must be null, got a %s", i,
                       nb_dtype_name(c->dt[i]), nb_tree_kind_name(nb_tree_kind_of(ci_t)));
            }
            continue;
        }
        ct[i] = nb_tree_get_array(ci_t);
        if (!same_sig(ct[i], e->x[i])) {
            report(e, "the cotangent of input %d is %s, the input %s", i, sig(ct[i], s1, sizeof s1),
                   sig(e->x[i], s2, sizeof s2));
            ct[i] = NULL;
            continue;
        }
        if (!e->diff[i]) {
            continue; /* a float input marked nondiff: its cotangent is zeros, unchecked */
        }
        int shown = 0;
        for (int64_t k = 0; k < nb_array_size(e->x[i]); k++) {
            double x0 = aget(e->x[i], k), h = c->h_rel * fmax(1.0, fabs(x0));
            aset(e->x[i], k, x0 + h);
            double xp = aget(e->x[i], k);
            nb_array *yp = eval_f(e);
            aset(e->x[i], k, x0 - h);
            double xm = aget(e->x[i], k);
            nb_array *ym = eval_f(e);
            aset(e->x[i], k, x0);
            if (yp == NULL || ym == NULL) {
                nb_array_destroy(yp);
                nb_array_destroy(ym);
                return false;
            }
            double fd = (dot_arrays(u, yp, NULL) - dot_arrays(u, ym, NULL)) / (xp - xm);
            nb_array_destroy(yp);
            nb_array_destroy(ym);
            double got = aget(ct[i], k);
            if (!close_to(got, fd, c->tol) && shown++ < 3) {
                report(e, "VJP d<u,f>/dx%d[%lld] at x = %.6g: got %.12g, FD %.12g (tol %.1g)", i,
                       (long long)k, x0, got, fd, c->tol * fmax(1.0, fabs(fd)));
            }
        }
    }
    return true;
}

/* (b) JVP against the central difference along v; *t borrowed from *jout. */
static bool check_jvp(case_env *e, nb_fn *jf, const nb_array *y0, nb_array **v, nb_tree **jout,
                      nb_array **t) {
    const gcase *c = e->c;
    char s1[64], s2[64];
    nb_tree *vl[MAX_IN] = {0}, *vt = NULL;
    double xmax = 0;
    for (int i = 0; i < c->n_in; i++) {
        if (v[i] != NULL) {
            vl[i] = leaf(v[i]);
            for (int64_t k = 0; k < nb_array_size(e->x[i]); k++) {
                xmax = fmax(xmax, fabs(aget(e->x[i], k)));
            }
        } else {
            NBT_OK(e->ctx, nb_tree_null(e->ctx, &vl[i]));
        }
    }
    NBT_OK(e->ctx, nb_tree_tuple(e->ctx, c->n_in, vl, &vt));
    nb_tree *jargs = pair(e->ctx, e->args, vt);
    nb_status st = nb_fn_call(jf, jargs, jout);
    nb_tree_destroy(jargs);
    nb_tree_destroy(vt);
    for (int i = 0; i < c->n_in; i++) {
        nb_tree_destroy(vl[i]);
    }
    if (c->jvp_fails) {
        if (st == NB_OK) {
            report(e, "jvp(f) succeeded; forward mode through this op must be an error");
        }
        return false;
    }
    if (st != NB_OK) {
        report(e, "jvp(f) failed: %s", nb_ctx_errmsg(e->ctx));
        return false;
    }
    check_primal(e, nb_tree_get_array(nb_tree_child(*jout, 0)), y0, "jvp");
    *t = nb_tree_get_array(nb_tree_child(*jout, 1));
    if (!same_sig(*t, y0)) {
        report(e, "the tangent output is %s, f gives %s", sig(*t, s1, sizeof s1),
               sig(y0, s2, sizeof s2));
        *t = NULL;
        return false;
    }
    /* x +- h v from saved originals (restored exactly afterwards); the steps actually taken
     * are recorded, since an f32 input rounds x + h v */
    double h = c->h_rel * fmax(1.0, xmax);
    double *orig[MAX_IN] = {0}, *taken[MAX_IN] = {0};
    for (int i = 0; i < c->n_in; i++) {
        int64_t n = nb_array_size(e->x[i]);
        if (v[i] != NULL) {
            orig[i] = calloc((size_t)n + 1, sizeof(double));
            taken[i] = calloc((size_t)n + 1, sizeof(double));
            for (int64_t k = 0; k < n; k++) {
                orig[i][k] = aget(e->x[i], k);
            }
        }
    }
    nb_array *yy[2] = {NULL, NULL};
    for (int sgn = 0; sgn < 2; sgn++) {
        for (int i = 0; i < c->n_in; i++) {
            for (int64_t k = 0; v[i] != NULL && k < nb_array_size(e->x[i]); k++) {
                aset(e->x[i], k, orig[i][k] + (sgn ? -h : h) * aget(v[i], k));
                taken[i][k] += (sgn ? -1 : 1) * aget(e->x[i], k);
            }
        }
        yy[sgn] = eval_f(e);
    }
    for (int i = 0; i < c->n_in; i++) {
        for (int64_t k = 0; v[i] != NULL && k < nb_array_size(e->x[i]); k++) {
            aset(e->x[i], k, orig[i][k]);
        }
    }
    if (yy[0] != NULL && yy[1] != NULL) {
        int shown = 0;
        for (int64_t j = 0; j < nb_array_size(*t); j++) {
            double fd = (aget(yy[0], j) - aget(yy[1], j)) / (2 * h);
            if (c->dt[0] == NB_DTYPE_F32) {
                /* the f32 cast cases: one elementwise input; divide by the step taken */
                double d = taken[0][j];
                fd = d == 0 ? 0 : (aget(yy[0], j) - aget(yy[1], j)) / d * aget(v[0], j);
            }
            if (!close_to(aget(*t, j), fd, c->tol) && shown++ < 3) {
                report(e, "JVP output [%lld]: got %.12g, FD %.12g (tol %.1g)", (long long)j,
                       aget(*t, j), fd, c->tol * fmax(1.0, fabs(fd)));
            }
        }
    }
    nb_array_destroy(yy[0]);
    nb_array_destroy(yy[1]);
    for (int i = 0; i < c->n_in; i++) {
        free(orig[i]);
        free(taken[i]);
    }
    return true;
}

/* Random draws per case (explicit-value cases: one). Every draw reuses the compiled f,
 * vjp(f) and jvp(f). */
#define N_DRAWS 3

/* (d) vmap: vmap(f) over lanes of random inputs equals f on each lane -- with every input
 * batched on axis 0 (3 lanes, then 1 and 0), and with each input batched alone on its last
 * axis (in_axes -1; 2 lanes), the others passed unbatched (in_axes null). Bit for bit,
 * except where a lane is a block of a larger BLIS product or factorisation (matmul, the
 * linear-algebra ops and the composites built on them): within 1e-12 relative. */
static int64_t g_vmap_checks;

static bool vmap_exact(const gcase *c) {
    if (c->op == NBI_OP_MATMUL || c->op == COMPOSITE) {
        return c->op != COMPOSITE ||
               (strcmp(c->group, "dot") != 0 && strstr(c->group, "mm") == NULL);
    }
    return strcmp(FAMILY[c->op], "decomp") != 0 && strcmp(FAMILY[c->op], "linalg") != 0;
}

static void check_vmap_config(case_env *e, int mask, int B, bool last_axis) {
    const gcase *c = e->c;
    nb_ctx *ctx = e->ctx;
    nb_array *lane[MAX_IN][4] = {{0}}, *bx[MAX_IN] = {0};
    nb_tree *axl[MAX_IN] = {0}, *inl[MAX_IN] = {0}, *axes = NULL, *bargs = NULL, *out = NULL;
    for (int i = 0; i < c->n_in; i++) {
        bool b = (mask >> i) & 1;
        if (!b) {
            NBT_OK(ctx, nb_tree_null(ctx, &axl[i]));
            inl[i] = leaf(e->x[i]);
            continue;
        }
        int r = c->rank[i], ax = last_axis ? r : 0;
        int64_t shape[NB_MAX_RANK];
        for (int d = 0, k = 0; d <= r; d++) {
            shape[d] = d == ax ? B : c->shape[i][k++];
        }
        bx[i] = new_array(ctx, c->dt[i], r + 1, shape);
        int64_t n = nb_array_size(e->x[i]);
        for (int l = 0; l < B; l++) {
            lane[i][l] = new_array(ctx, c->dt[i], r, c->shape[i]);
            fill_input(c, i, lane[i][l]);
            for (int64_t k = 0; k < n; k++) {
                aset(bx[i], last_axis ? k * B + l : l * n + k, aget(lane[i][l], k));
            }
        }
        NBT_OK(ctx, nb_tree_int(ctx, last_axis ? -1 : 0, &axl[i]));
        inl[i] = leaf(bx[i]);
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, c->n_in, axl, &axes));
    NBT_OK(ctx, nb_tree_tuple(ctx, c->n_in, inl, &bargs));
    nb_vmap_opts o = nb_vmap_opts_default();
    o.in_axes = axes;
    nb_fn *vf = NULL;
    NBT_OK(ctx, nb_vmap(e->f, &o, &vf));
    g_vmap_checks++;
    nb_status st = nb_fn_call(vf, bargs, &out);
    char s1[64];
    if (st != NB_OK) {
        report(e, "vmap(f) (inputs mask %d, %d lanes%s) failed: %s", mask, B,
               last_axis ? ", axis -1" : "", nb_ctx_errmsg(ctx));
    } else {
        const nb_array *y = nb_tree_get_array(out);
        for (int l = 0; l < B && e->bad == 0; l++) {
            nb_tree *ll[MAX_IN] = {0}, *largs = NULL, *lo = NULL;
            for (int i = 0; i < c->n_in; i++) {
                ll[i] = leaf((mask >> i) & 1 ? lane[i][l] : e->x[i]);
            }
            NBT_OK(ctx, nb_tree_tuple(ctx, c->n_in, ll, &largs));
            NBT_OK(ctx, nb_fn_call(e->f, largs, &lo));
            const nb_array *yl = nb_tree_get_array(lo);
            int64_t n = nb_array_size(yl);
            if (y == NULL || nb_array_rank(y) != nb_array_rank(yl) + 1 || nb_array_dim(y, 0) != B ||
                nb_array_size(y) != n * B) {
                report(e, "vmap(f) gave %s for %d lanes of %s", sig(y, s1, sizeof s1), B,
                       sig(yl, s1, sizeof s1));
            }
            for (int64_t k = 0; k < n && e->bad == 0; k++) {
                double got = aget(y, l * n + k), want = aget(yl, k);
                bool ok = vmap_exact(c) ? (got == want || (isnan(got) && isnan(want)) ||
                                           (got == 0 && want == 0))
                                        : (fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want)) ||
                                           (isnan(got) && isnan(want)));
                if (!ok) {
                    report(e,
                           "vmap(f) (inputs mask %d, %d lanes%s) lane %d [%lld] = %.17g, f "
                           "gives %.17g",
                           mask, B, last_axis ? ", axis -1" : "", l, (long long)k, got, want);
                }
            }
            for (int i = 0; i < c->n_in; i++) {
                nb_tree_destroy(ll[i]);
            }
            nb_tree_destroy(largs);
            nb_tree_destroy(lo);
        }
        if (B == 0 && (y == NULL || nb_array_dim(y, 0) != 0)) {
            report(e, "vmap(f) over 0 lanes gave %s", sig(y, s1, sizeof s1));
        }
    }
    nb_tree_destroy(out);
    nb_fn_destroy(vf);
    nb_tree_destroy(axes);
    nb_tree_destroy(bargs);
    for (int i = 0; i < c->n_in; i++) {
        nb_tree_destroy(axl[i]);
        nb_tree_destroy(inl[i]);
        nb_array_destroy(bx[i]);
        for (int l = 0; l < 4; l++) {
            nb_array_destroy(lane[i][l]);
        }
    }
}

static void check_vmap(case_env *e) {
    const gcase *c = e->c;
    if (c->n_in == 0 || c->jvp_fails) {
        return;
    }
    int all = (1 << c->n_in) - 1;
    static const int sizes[3] = {3, 1, 0};
    /* under the native check (every executable compiled to C: code generation, which one
     * configuration exercises) the other configurations are left to the interpreted run */
    const char *nat = getenv("NABLA_NATIVE");
    if (nat != NULL && strcmp(nat, "check") == 0) {
        static bool seen[NBI_OP_COUNT]; /* and one case of each op */
        if (c->op < 0 || !seen[c->op]) {
            check_vmap_config(e, all, 3, false);
        }
        if (c->op >= 0) {
            seen[c->op] = true;
        }
        return;
    }
    for (int s = 0; s < 3 && e->bad == 0; s++) {
        check_vmap_config(e, all, sizes[s], false);
    }
    for (int i = 0; i < c->n_in && c->n_in > 1 && e->bad == 0; i++) {
        check_vmap_config(e, 1 << i, 2, true);
    }
    if (c->n_in == 1 && e->bad == 0) {
        check_vmap_config(e, 1, 2, true);
    }
}

static void run_case(nb_ctx *ctx, int ci) {
    const gcase *c = &g_cases[ci];
    case_env e;
    memset(&e, 0, sizeof e);
    e.ctx = ctx;
    e.c = c;
    nb_ctx_clear_cache(ctx); /* bound the cache: each case compiles f, vjp(f), jvp(f) */
    const nbi_op_info *info = c->op >= 0 ? nbi_op_get((nbi_op)c->op) : NULL;
    nb_tree *leaves[MAX_IN] = {0};
    bool random = false;
    for (int i = 0; i < c->n_in; i++) {
        e.x[i] = new_array(ctx, c->dt[i], c->rank[i], c->shape[i]);
        e.diff[i] = nb_dtype_is_float(c->dt[i]) && !(info && (info->nondiff & (1u << i)));
        random = random || c->vals[i] == NULL;
        leaves[i] = leaf(e.x[i]);
    }
    NBT_OK(ctx, nb_tree_tuple(ctx, c->n_in, leaves, &e.args));
    nb_tree *self = NULL;
    NBT_OK(ctx, nb_tree_int(ctx, ci, &self));
    NBT_OK(ctx, nb_fn_create(ctx, "grad_case", body_case, self, &e.f));
    nb_fn *vf = NULL, *jf = NULL;
    NBT_OK(ctx, nb_vjp(e.f, &vf));
    NBT_OK(ctx, nb_jvp(e.f, &jf));
    for (int draw = 0; draw < (random ? N_DRAWS : 1) && e.bad == 0; draw++) {
        for (int i = 0; i < c->n_in; i++) {
            fill_input(c, i, e.x[i]);
        }
        nb_array *y0 = eval_f(&e), *u = NULL, *ct[MAX_IN] = {0}, *v[MAX_IN] = {0}, *t = NULL;
        nb_tree *vout = NULL, *jout = NULL;
        char s1[64];
        if (y0 != NULL && !nb_dtype_is_float(nb_array_dtype(y0))) {
            report(&e, "the output is %s, not float", sig(y0, s1, sizeof s1));
        } else if (y0 != NULL) {
            u = random_like(ctx, y0);
            for (int i = 0; i < c->n_in; i++) {
                v[i] = e.diff[i] ? random_like(ctx, e.x[i]) : NULL;
            }
            bool vok = check_vjp(&e, vf, y0, u, &vout, ct);
            bool jok = check_jvp(&e, jf, y0, v, &jout, &t);
            /* (c) <u, J v> == <J^T u, v> */
            if (vok && jok && t != NULL) {
                double scale = 0, a = dot_arrays(u, t, &scale), b = 0;
                for (int i = 0; i < c->n_in; i++) {
                    if (v[i] != NULL && ct[i] != NULL) {
                        b += dot_arrays(ct[i], v[i], &scale);
                    }
                }
                if (!(fabs(a - b) <= c->ctol * fmax(1.0, scale))) {
                    report(&e, "<u, J v> = %.17g but <J^T u, v> = %.17g (tol %.1g)", a, b,
                           c->ctol * fmax(1.0, scale));
                }
            }
        }
        nb_tree_destroy(vout);
        nb_tree_destroy(jout);
        nb_array_destroy(u);
        nb_array_destroy(y0);
        for (int i = 0; i < c->n_in; i++) {
            nb_array_destroy(v[i]);
        }
        g_n_draws++;
    }
    if (e.bad == 0) {
        check_vmap(&e);
    }
    if (e.bad > 0) {
        g_failed_cases++;
        if (c->op >= 0) {
            g_failed_by_op[c->op]++;
        }
    }
    for (int i = 0; i < c->n_in; i++) {
        nb_tree_destroy(leaves[i]);
        nb_array_destroy(e.x[i]);
    }
    nb_fn_destroy(jf);
    nb_fn_destroy(vf);
    nb_fn_destroy(e.f);
    nb_tree_destroy(self);
    nb_tree_destroy(e.args);
}

/* Ops whose derivative rules are checked by another suite, and where. */
static const struct {
    nbi_op op;
    const char *where;
} ELSEWHERE[] = {
    {NBI_OP_WHILE, "tests/loops/test_loops.c (loops' derivatives, and the errors that say "
                   "what a loop of a given kind cannot do)"},
    {NBI_OP_CALL_OUTPUT, "tests/loops/test_loops.c: it reads a loop's carry (a call's outputs "
                         "are inlined before autodiff); its rule defers to the loop's"},
    {NBI_OP_CHECK, "tests/ode/test_ode.c test_lv_gradients: gradients through a solve with "
                   "throw_on_failure (checks on every output) equal those without, bit for bit"},
    {NBI_OP_PRINT, "tests/ad/test_jit.c test_debug_print: the gradient through a print is the "
                   "gradient without it (cotangents pass through)"},
};

/* ---- the tests ---------------------------------------------------------------------- */

static const char *elsewhere(int op) {
    for (size_t i = 0; i < sizeof ELSEWHERE / sizeof ELSEWHERE[0]; i++) {
        if ((int)ELSEWHERE[i].op == op) {
            return ELSEWHERE[i].where;
        }
    }
    return NULL;
}

static const char *no_grad_reason(int op) {
    for (size_t i = 0; i < sizeof NO_GRAD / sizeof NO_GRAD[0]; i++) {
        if ((int)NO_GRAD[i].op == op) {
            return NO_GRAD[i].why;
        }
    }
    return NULL;
}

/* Every op is accounted for: a rule and a spec, or no rule and a listed reason. */
/* Batching rules (nb_vmap): every op has one, except those never batched (listed with why)
 * and those not batched yet (listed as such: nb_vmap fails naming them). Listing an op that
 * has a rule, or leaving out one without, fails. The rules themselves are checked by (d)
 * over every case above, and by tests/ad/test_vmap.c for the ops without gradient cases. */
static const struct {
    nbi_op op;
    const char *why;
} NO_VMAP[] = {
    {NBI_OP_PARAM, "no inputs: never batched (a batched argument is a batched value)"},
    {NBI_OP_CONST, "no inputs: never batched"},
    {NBI_OP_FULL, "no inputs: never batched"},
    {NBI_OP_IOTA, "no inputs: never batched"},
    {NBI_OP_FUSED, "made by the fusion pass after tracing: never in a traced region"},
    {NBI_OP_FUSED_OUTPUT, "made by the fusion pass, like fused"},
    {NBI_OP_WHILE, "several outputs: batched by the region itself (nbi_loop_vmap in "
                   "src/loops/loop.c), its call_output nodes read the batched carry"},
    {NBI_OP_LOOP_REVERSE, "several outputs: batched by the region itself, like while (the "
                          "batched loop's reverse)"},
};

static void test_every_op_has_a_batching_rule(void **state) {
    (void)state;
    int bad = 0, with = 0, pending = 0;
    for (int op = 0; op < NBI_OP_COUNT; op++) {
        const nbi_op_info *info = nbi_op_get((nbi_op)op);
        const char *why = NULL;
        for (size_t k = 0; k < sizeof NO_VMAP / sizeof NO_VMAP[0]; k++) {
            why = (int)NO_VMAP[k].op == op ? NO_VMAP[k].why : why;
        }
        if (info->vmap != NULL && why != NULL) {
            print_error("op '%s' has a batching rule but is listed in NO_VMAP (\"%s\"): remove "
                        "it from the list\n",
                        info->name, why);
            bad++;
        } else if (info->vmap == NULL && why == NULL) {
            print_error("op '%s' has no batching rule (src/ad/op_%s.c): add one, or list it in "
                        "NO_VMAP with the reason\n",
                        info->name, FAMILY[op]);
            bad++;
        }
        with += info->vmap != NULL;
        pending += why != NULL && strncmp(why, "NOT YET", 7) == 0;
    }
    print_message("batching rules: %d of %d ops; %d not batched yet\n", with, NBI_OP_COUNT,
                  pending);
    NBT_EQ_I64(bad, 0);
}

static void test_every_op_is_accounted_for(void **state) {
    (void)state;
    int bad = 0;
    for (int op = 0; op < NBI_OP_COUNT; op++) {
        const nbi_op_info *info = nbi_op_get((nbi_op)op);
        const char *name = nbi_op_name((nbi_op)op), *why = no_grad_reason(op);
        bool vjp = info->vjp != NULL, jvp = info->jvp != NULL;
        if (vjp != jvp) {
            print_error("op '%s' has a %s rule but no %s rule (src/ad/op_%s.c)\n", name,
                        vjp ? "VJP" : "JVP", vjp ? "JVP" : "VJP", FAMILY[op]);
            bad++;
        }
        if (elsewhere(op) != NULL) {
            if (!vjp || why != NULL) {
                print_error("op '%s' is listed as checked elsewhere but has no rule or is also "
                            "in NO_GRAD\n",
                            name);
                bad++;
            }
        } else if (why != NULL && g_n_spec[op] > 0) {
            print_error("op '%s' is in NO_GRAD and has gradient cases: pick one\n", name);
            bad++;
        } else if (why != NULL && (vjp || jvp)) {
            print_error("op '%s' is listed as having no gradient (\"%s\") but has a rule: "
                        "remove it from NO_GRAD and add a gradient spec\n",
                        name, why);
            bad++;
        } else if (why == NULL && (vjp || jvp) && g_n_spec[op] == 0) {
            print_error("op '%s' has a gradient rule but no gradient spec: add cases to "
                        "test_grad_conformance.c\n",
                        name);
            bad++;
        } else if (why == NULL && !vjp && g_n_spec[op] > 0) {
            print_error("op '%s' has %d gradient cases but no VJP/JVP rule in the registry "
                        "(src/ad/op_%s.c)\n",
                        name, g_n_spec[op], FAMILY[op]);
            bad++;
        } else if (why == NULL && !vjp && g_n_spec[op] == 0) {
            print_error("op '%s' has no gradient rule and is not in NO_GRAD: add a rule and a "
                        "spec, or list it with the reason it has no gradient\n",
                        name);
            bad++;
        }
    }
    NBT_EQ_I64(bad, 0);
}

static void test_vjp_jvp_against_finite_differences(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    make_custom(ctx);
    make_custom_jvp(ctx);
    clock_t t0 = clock();
    int run = 0, skipped = 0, ops = 0, composites = 0;
    bool seen[NBI_OP_COUNT] = {false};
    for (int i = 0; i < g_n_cases; i++) {
        const gcase *c = &g_cases[i];
        if (c->op >= 0 && nbi_op_get((nbi_op)c->op)->vjp == NULL) {
            skipped++; /* reported by test_every_op_is_accounted_for */
            continue;
        }
        if (c->op >= 0 && !seen[c->op]) {
            seen[c->op] = true;
            ops++;
        }
        composites += c->op < 0;
        run_case(ctx, i);
        run++;
    }
    for (int op = 0; op < NBI_OP_COUNT; op++) {
        if (g_failed_by_op[op] > 0) {
            print_error("op '%s': %d of %d cases failed\n", nbi_op_name((nbi_op)op),
                        g_failed_by_op[op], g_n_spec[op]);
        }
    }
    print_message("%d cases run over %d ops (+%d composite cases), %d skipped (op without a "
                  "rule), %lld random draws, %lld forward evaluations, %lld vmap checks, %d "
                  "failed, %.2f s CPU\n",
                  run, ops, composites, skipped, (long long)g_n_draws, (long long)g_fd_evals,
                  (long long)g_vmap_checks, g_failed_cases,
                  (double)(clock() - t0) / CLOCKS_PER_SEC);
    nb_fn_destroy(g_custom);
    nb_fn_destroy(g_custom_jvp);
    g_custom = NULL;
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
    NBT_EQ_I64(g_failed_cases, 0);
}

/* ---- kinks, stop_gradient ----------------------------------------------------------- */

/* self selects: relu(x), abs(x), sqrt(x), x sg(y), x sg(x) */
static nb_status body_kink(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    int64_t k = 0;
    nb_tree_get_int(self, &k);
    nb_var *x = nb_get(tr, args, "[0]"), *y = nb_get(tr, args, "[1]");
    nb_var *r = k == 0   ? nb_relu(x)
                : k == 1 ? nb_abs(x)
                : k == 2 ? nb_sqrt(x)
                : k == 3 ? nb_mul(x, nb_stop_gradient(y))
                         : nb_mul(x, nb_stop_gradient(x));
    return nb_return(r, out);
}

/* relu'(0) = 0, abs'(0) = 0, sqrt'(0) = inf (ad.h); stop_gradient: d(x sg(y)) = sg(y) dx
 * with no cotangent for y, and d(x sg(x)) = sg(x) dx -- where FD would say 2x. */
static void test_kinks_and_stop_gradient(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    const int64_t n = 3;
    static const char *const NAMES[] = {"relu", "abs", "sqrt", "x*sg(y)", "x*sg(x)"};
    for (int k = 0; k < 5; k++) {
        double xv = k < 3 ? 0.0 : 0.75, yv = 1.5, uv = 2.0;
        double want_x = k < 2 ? 0.0 : k == 2 ? INFINITY : k == 3 ? yv * uv : xv * uv;
        nb_array *x = NULL, *y = NULL, *u = NULL;
        NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F64, 1, &n, xv, &x));
        NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F64, 1, &n, yv, &y));
        NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F64, 1, &n, uv, &u));
        nb_tree *self = NULL, *xl = leaf(x), *yl = leaf(y), *ul = leaf(u), *xs = NULL, *out = NULL;
        NBT_OK(ctx, nb_tree_int(ctx, k, &self));
        NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){xl, yl}, &xs));
        nb_tree *args = pair(ctx, xs, ul);
        nb_fn *f = NULL, *vf = NULL;
        NBT_OK(ctx, nb_fn_create(ctx, "kink", body_kink, self, &f));
        NBT_OK(ctx, nb_vjp(f, &vf));
        NBT_OK(ctx, nb_fn_call(vf, args, &out));
        const nb_tree *cts = nb_tree_child(out, 1);
        nb_array *gx = nb_tree_get_array(nb_tree_child(cts, 0));
        nb_array *gy = nb_tree_get_array(nb_tree_child(cts, 1));
        NBT_TRUE(gx != NULL && gy != NULL);
        for (int64_t i = 0; i < n; i++) {
            if (!(aget(gx, i) == want_x) || aget(gy, i) != 0.0) {
                fail_msg("%s at x = %g: dx = %.17g (want %.17g), dy = %.17g (want 0)", NAMES[k], xv,
                         aget(gx, i), want_x, aget(gy, i));
            }
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
        nb_fn_destroy(vf);
        nb_fn_destroy(f);
        nb_tree_destroy(xs);
        nb_tree_destroy(self);
        nb_tree_destroy(xl);
        nb_tree_destroy(yl);
        nb_tree_destroy(ul);
        nb_array_destroy(x);
        nb_array_destroy(y);
        nb_array_destroy(u);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- higher order ------------------------------------------------------------------- */

static nb_status body_sin_exp(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    return nb_return(nb_mul(nb_sin(x), nb_exp(x)), out);
}

/* f = sin(x) e^x: f' = e^x (sin x + cos x), f'' = 2 e^x cos x, f''' = 2 e^x (cos x - sin x) */
static void test_grad_of_grad(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g1 = NULL, *g2 = NULL, *g3 = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "sin_exp", body_sin_exp, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g1));
    NBT_OK(ctx, nb_grad(g1, NULL, &g2));
    NBT_OK(ctx, nb_grad(g2, NULL, &g3));
    static const double XS[] = {-1.3, 0.0, 0.4, 2.1};
    for (size_t i = 0; i < sizeof XS / sizeof XS[0]; i++) {
        double x = XS[i], ex = exp(x);
        double want[3] = {ex * (sin(x) + cos(x)), 2 * ex * cos(x), 2 * ex * (cos(x) - sin(x))};
        nb_fn *gs[3] = {g1, g2, g3};
        nb_array *xa = NULL;
        NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F64, x, &xa));
        nb_tree *xl = leaf(xa), *args = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 1, &xl, &args));
        for (int k = 0; k < 3; k++) {
            nb_tree *out = NULL;
            NBT_OK(ctx, nb_fn_call(gs[k], args, &out));
            double got = aget(nb_tree_get_array(out), 0);
            if (!close_to(got, want[k], 1e-13)) {
                fail_msg("order %d derivative of sin(x) exp(x) at %g: got %.17g, want %.17g", k + 1,
                         x, got, want[k]);
            }
            nb_tree_destroy(out);
        }
        nb_tree_destroy(args);
        nb_tree_destroy(xl);
        nb_array_destroy(xa);
    }
    nb_fn_destroy(g3);
    nb_fn_destroy(g2);
    nb_fn_destroy(g1);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

#define RB_N 5

/* Rosenbrock: sum_i 100 (x[i+1] - x[i]^2)^2 + (1 - x[i])^2, i < n - 1 */
static nb_status body_rosenbrock(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_var *a = nb_slice(x, (int64_t[]){0}, (int64_t[]){RB_N - 1}, NULL);
    nb_var *b = nb_slice(x, (int64_t[]){1}, (int64_t[]){RB_N}, NULL);
    nb_var *t1 = nb_mul(nb_scalar(tr, 100.0), nb_square(nb_sub(b, nb_square(a))));
    nb_var *t2 = nb_square(nb_sub(nb_scalar(tr, 1.0), a));
    return nb_return(nb_sum(nb_add(t1, t2), NULL, 0, false), out);
}

static void rosenbrock_grad_hess(const double *x, double *g, double H[RB_N][RB_N]) {
    memset(H, 0, sizeof(double) * RB_N * RB_N);
    for (int i = 0; i < RB_N; i++) {
        g[i] = 0;
    }
    for (int i = 0; i + 1 < RB_N; i++) {
        double a = x[i], b = x[i + 1];
        g[i] += -400 * a * (b - a * a) - 2 * (1 - a);
        g[i + 1] += 200 * (b - a * a);
        H[i][i] += 1200 * a * a - 400 * b + 2;
        H[i][i + 1] += -400 * a;
        H[i + 1][i] += -400 * a;
        H[i + 1][i + 1] += 200;
    }
}

/* Hessian-vector products two ways: forward over reverse (jvp of grad) and reverse over
 * reverse (vjp of grad; H is symmetric, so H^T u = H u), against the analytic Hessian. */
static void test_rosenbrock_hvp(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *gf = NULL, *hvp = NULL, *vhp = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "rosenbrock", body_rosenbrock, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &gf));
    NBT_OK(ctx, nb_jvp(gf, &hvp));
    NBT_OK(ctx, nb_vjp(gf, &vhp));
    const int64_t n = RB_N;
    for (int trial = 0; trial < 3; trial++) {
        double xv[RB_N], vv[RB_N], g[RB_N], H[RB_N][RB_N];
        nb_array *x = new_array(ctx, NB_DTYPE_F64, 1, &n), *v = new_array(ctx, NB_DTYPE_F64, 1, &n);
        for (int i = 0; i < RB_N; i++) {
            xv[i] = trial == 0 ? 1.0 : -1.5 + 3 * urand(); /* trial 0: the minimum */
            vv[i] = -1 + 2 * urand();
            aset(x, i, xv[i]);
            aset(v, i, vv[i]);
        }
        rosenbrock_grad_hess(xv, g, H);
        nb_tree *xl = leaf(x), *vl = leaf(v), *xs = NULL, *vs = NULL, *out = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 1, &xl, &xs));
        NBT_OK(ctx, nb_tree_tuple(ctx, 1, &vl, &vs));
        for (int mode = 0; mode < 2; mode++) {
            /* jvp: ((x,), (v,)) -> (grad, H v); vjp: ((x,), v) -> (grad, (H v,)) */
            nb_tree *args = pair(ctx, xs, mode ? vl : vs);
            NBT_OK(ctx, nb_fn_call(mode ? vhp : hvp, args, &out));
            nb_array *ga = nb_tree_get_array(nb_tree_child(out, 0));
            const nb_tree *hv_t = nb_tree_child(out, 1);
            nb_array *hva = nb_tree_get_array(mode ? nb_tree_child(hv_t, 0) : hv_t);
            NBT_TRUE(ga != NULL && hva != NULL);
            for (int i = 0; i < RB_N; i++) {
                double want = 0;
                for (int j = 0; j < RB_N; j++) {
                    want += H[i][j] * vv[j];
                }
                if (!close_to(aget(ga, i), g[i], 1e-12) || !close_to(aget(hva, i), want, 1e-12)) {
                    fail_msg("Rosenbrock %s at trial %d, i = %d: grad %.17g (want %.17g), H v "
                             "%.17g (want %.17g)",
                             mode ? "vjp(grad)" : "jvp(grad)", trial, i, aget(ga, i), g[i],
                             aget(hva, i), want);
                }
            }
            nb_tree_destroy(out);
            nb_tree_destroy(args);
        }
        nb_tree_destroy(xs);
        nb_tree_destroy(vs);
        nb_tree_destroy(xl);
        nb_tree_destroy(vl);
        nb_array_destroy(x);
        nb_array_destroy(v);
    }
    nb_fn_destroy(vhp);
    nb_fn_destroy(hvp);
    nb_fn_destroy(gf);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    build_specs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_is_accounted_for),
        cmocka_unit_test(test_every_op_has_a_batching_rule),
        cmocka_unit_test(test_vjp_jvp_against_finite_differences),
        cmocka_unit_test(test_kinks_and_stop_gradient),
        cmocka_unit_test(test_grad_of_grad),
        cmocka_unit_test(test_rosenbrock_hvp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
