/*
 * programs_ops.c -- applying a decoded op while tracing (the same code for decoding, for
 * the whole program's replays and for an op alone), the bodies of the control-flow ops'
 * sub-functions, and printing a program as a listing of ops with their parameters, shapes
 * and dtypes.
 */
#include "programs_internal.h"

#include <math.h>
#include <string.h>

#define NBP_NAME_(c, n) n,
const char *const nbp_op_names[NBP_OP_COUNT] = {NBP_OPS(NBP_NAME_)};
#undef NBP_NAME_

static const char *const nbp_u_names[NBP_U_COUNT] = {
    "id", "neg", "abs", "square", "relu", "tanh", "sin", "sigmoid", "exp", "reciprocal", "sqrt"};
static const char *const nbp_in_kinds[4] = {"param", "const", "frozen param", "tied param"};
static const char *const nbp_fill_names[NBP_FILL_COUNT] = {
    "random",   "some specials", "all specials", "small ints",
    "positive", "constant",      "extreme",      "ramp"};

/* ---- applying an op (decode and replay share it) -------------------------------------------- */

static nb_var *nbp_unary(int code, nb_var *x) {
    switch (code) {
    case NBP_NEG:
        return nb_neg(x);
    case NBP_ABS:
        return nb_abs(x);
    case NBP_SIGN:
        return nb_sign(x);
    case NBP_SQUARE:
        return nb_square(x);
    case NBP_RELU:
        return nb_relu(x);
    case NBP_STOP_GRADIENT:
        return nb_stop_gradient(x);
    case NBP_EXP:
        return nb_exp(x);
    case NBP_EXPM1:
        return nb_expm1(x);
    case NBP_LOG:
        return nb_log(x);
    case NBP_LOG1P:
        return nb_log1p(x);
    case NBP_SQRT:
        return nb_sqrt(x);
    case NBP_RSQRT:
        return nb_rsqrt(x);
    case NBP_RECIPROCAL:
        return nb_reciprocal(x);
    case NBP_SIN:
        return nb_sin(x);
    case NBP_COS:
        return nb_cos(x);
    case NBP_TAN:
        return nb_tan(x);
    case NBP_TANH:
        return nb_tanh(x);
    case NBP_SIGMOID:
        return nb_sigmoid(x);
    case NBP_GELU:
        return nb_gelu(x);
    case NBP_SOFTPLUS:
        return nb_softplus(x);
    case NBP_ERF:
        return nb_erf(x);
    default:
        return nb_logical_not(x);
    }
}

static nb_var *nbp_binary(int code, nb_var *a, nb_var *b) {
    switch (code) {
    case NBP_ADD:
        return nb_add(a, b);
    case NBP_SUB:
        return nb_sub(a, b);
    case NBP_MUL:
        return nb_mul(a, b);
    case NBP_DIV:
        return nb_div(a, b);
    case NBP_MAXIMUM:
        return nb_maximum(a, b);
    case NBP_MINIMUM:
        return nb_minimum(a, b);
    case NBP_POW:
        return nb_pow(a, b);
    case NBP_EQ:
        return nb_eq(a, b);
    case NBP_NE:
        return nb_ne(a, b);
    case NBP_LT:
        return nb_lt(a, b);
    case NBP_LE:
        return nb_le(a, b);
    case NBP_GT:
        return nb_gt(a, b);
    case NBP_GE:
        return nb_ge(a, b);
    case NBP_LOGICAL_AND:
        return nb_logical_and(a, b);
    default:
        return nb_logical_or(a, b);
    }
}

static nb_var *nbp_loop_unary(int u, nb_var *x) {
    switch (u) {
    case NBP_U_NEG:
        return nb_neg(x);
    case NBP_U_ABS:
        return nb_abs(x);
    case NBP_U_SQUARE:
        return nb_square(x);
    case NBP_U_RELU:
        return nb_relu(x);
    case NBP_U_TANH:
        return nb_tanh(x);
    case NBP_U_SIN:
        return nb_sin(x);
    case NBP_U_SIGMOID:
        return nb_sigmoid(x);
    case NBP_U_EXP:
        return nb_exp(x);
    case NBP_U_RECIP:
        return nb_reciprocal(x);
    case NBP_U_SQRT:
        return nb_sqrt(x);
    default:
        return x;
    }
}

/* inline integer indices: iota * a + b */
static nb_var *nbp_inline_index(nb_trace *tr, nb_dtype dt, int rank, const int64_t *shape, int axis,
                                int64_t a, int64_t b) {
    nb_var *i = nb_iota(tr, dt, rank, shape, axis);
    return nb_add(nb_mul(i, nb_scalar_typed(tr, dt, (double)a)),
                  nb_scalar_typed(tr, dt, (double)b));
}

static nb_var *nbp_inline_key(nb_trace *tr, int64_t seed) {
    return nbp_inline_index(tr, NB_DTYPE_I32, 1, (int64_t[]){2}, 0, 7, seed);
}

static nb_status nbp_body_sub(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out);

/* the sub-function role of op oi in the trace's context */
enum { NBP_SUB_BODY, NBP_SUB_COND, NBP_SUB_B0, NBP_SUB_B1, NBP_SUB_B2, NBP_SUB_CALL_JIT = 3 };
static nb_fn *nbp_sub_fn(nb_trace *tr, nbp_prog *P, int oi, int role) {
    int ci = nbp_ci(P, tr);
    nbp_op *op = &P->ops[oi];
    int slot = role;
    if (op->code == NBP_SWITCH || op->code == NBP_COND) {
        slot = role - NBP_SUB_B0;
    }
    if (op->fn[ci][slot] != NULL) {
        return op->fn[ci][slot];
    }
    nb_ctx *ctx = nb_trace_ctx(tr);
    nb_fn *f = NULL;
    if (op->code == NBP_CALL && role == NBP_SUB_CALL_JIT) {
        nb_fn *base = nbp_sub_fn(tr, P, oi, NBP_SUB_BODY);
        nb_jit_opts o = nb_jit_opts_default();
        o.inline_calls = false;
        NBP_OK(ctx, nb_jit(base, &o, &f));
    } else {
        nb_tree *self = nbp_self(ctx, P, oi, NBP_ROLE_SUB + role);
        static const char *const names[] = {"body", "cond", "branch0", "branch1", "branch2"};
        NBP_OK(ctx, nb_fn_create(ctx, names[role], nbp_body_sub, self, &f));
    }
    op->fn[ci][slot] = f;
    return f;
}

static nb_loop_opts nbp_loop_opts(const nbp_op *op) {
    nb_loop_opts o = nb_loop_opts_default();
    o.kind = (nb_loop_kind)op->p[2];
    o.max_steps = op->p[3];
    o.checkpoints = op->p[4];
    return o;
}

/* Apply op oi to the vars in; the results go to out. Returns how many (the vars may be
 * poison: the trace's status says). */
int nbp_apply(nb_trace *tr, nbp_prog *P, int oi, nb_var *const *in, nb_var **out) {
    nbp_op *op = &P->ops[oi];
    const int64_t *p = op->p;
    nb_ctx *ctx = nb_trace_ctx(tr);
    int c = op->code;
    out[1] = NULL;
    switch (c) {
    case NBP_CONST:
        out[0] = nb_constant(tr, P->consts[nbp_ci(P, tr)][p[0]]);
        return 1;
    case NBP_IOTA:
        out[0] = nb_iota(tr, (nb_dtype)p[0], (int)p[1], p + 2, (int)p[10]);
        return 1;
    case NBP_FULL:
        out[0] = nb_full(tr, (nb_dtype)p[0], (int)p[1], p + 2, op->f[0]);
        return 1;
    case NBP_SCALAR_TYPED:
        out[0] = nb_scalar_typed(tr, (nb_dtype)p[0], op->f[0]);
        return 1;
    case NBP_CAST:
        out[0] = nb_cast(in[0], (nb_dtype)p[0]);
        return 1;
    case NBP_SCALAR_BIN: {
        nb_var *s = nb_scalar(tr, op->f[0]);
        out[0] = p[1] ? nbp_binary((int)p[0], s, in[0]) : nbp_binary((int)p[0], in[0], s);
        return 1;
    }
    case NBP_SELECT:
        out[0] = nb_select(in[0], in[1], in[2]);
        return 1;
    case NBP_SUM:
    case NBP_MEAN:
    case NBP_MAX:
    case NBP_MIN:
    case NBP_PROD:
    case NBP_LOGSUMEXP: {
        int axes[NB_MAX_RANK];
        for (int i = 0; i < NB_MAX_RANK; i++) {
            axes[i] = (int)p[1 + i];
        }
        const int *ax = p[0] < 0 ? NULL : axes;
        int n = p[0] < 0 ? 0 : (int)p[0];
        bool kd = p[9] != 0;
        out[0] = c == NBP_SUM    ? nb_sum(in[0], ax, n, kd)
                 : c == NBP_MEAN ? nb_mean(in[0], ax, n, kd)
                 : c == NBP_MAX  ? nb_max(in[0], ax, n, kd)
                 : c == NBP_MIN  ? nb_min(in[0], ax, n, kd)
                 : c == NBP_PROD ? nb_prod(in[0], ax, n, kd)
                                 : nb_logsumexp(in[0], ax, n, kd);
        return 1;
    }
    case NBP_ARGMAX:
        out[0] = nb_argmax(in[0], (int)p[0], p[1] != 0);
        return 1;
    case NBP_ARGMIN:
        out[0] = nb_argmin(in[0], (int)p[0], p[1] != 0);
        return 1;
    case NBP_SOFTMAX:
        out[0] = nb_softmax(in[0], (int)p[0]);
        return 1;
    case NBP_LOG_SOFTMAX:
        out[0] = nb_log_softmax(in[0], (int)p[0]);
        return 1;
    case NBP_RESHAPE:
        out[0] = nb_reshape(in[0], (int)p[0], p + 1);
        return 1;
    case NBP_BROADCAST_TO:
        out[0] = nb_broadcast_to(in[0], (int)p[0], p + 1);
        return 1;
    case NBP_TRANSPOSE: {
        int perm[NB_MAX_RANK];
        for (int i = 0; i < NB_MAX_RANK; i++) {
            perm[i] = (int)p[1 + i];
        }
        out[0] = nb_transpose(in[0], p[0] ? NULL : perm);
        return 1;
    }
    case NBP_EXPAND_DIMS:
        out[0] = nb_expand_dims(in[0], (int)p[0]);
        return 1;
    case NBP_SQUEEZE: {
        int axes[NB_MAX_RANK];
        for (int i = 0; i < NB_MAX_RANK; i++) {
            axes[i] = (int)p[1 + i];
        }
        out[0] = nb_squeeze(in[0], p[0] < 0 ? NULL : axes, p[0] < 0 ? 0 : (int)p[0]);
        return 1;
    }
    case NBP_SLICE:
        out[0] = nb_slice(in[0], p, p + 8, p[24] ? NULL : p + 16);
        return 1;
    case NBP_CONCATENATE:
    case NBP_STACK: {
        nb_var *xs[NBP_MAX_IN];
        for (int i = 0; i < op->n_in; i++) {
            xs[i] = in[i];
        }
        nb_var *const *arg = op->n_in == 0 && p[1] ? NULL : xs;
        out[0] = c == NBP_STACK ? nb_stack(op->n_in, arg, (int)p[0])
                                : nb_concatenate(op->n_in, arg, (int)p[0]);
        if (out[0] == NULL) { /* (a NULL result is itself a broken rule; reported below) */
            return 0;
        }
        return 1;
    }
    case NBP_PAD:
        out[0] = nb_pad(in[0], p, p + 8, op->f[0]);
        return 1;
    case NBP_TAKE: {
        nb_var *idx =
            p[1] ? nbp_inline_index(tr, (nb_dtype)p[2], 1, (int64_t[]){p[3]}, 0, p[4], p[5])
                 : in[1];
        out[0] = nb_take(in[0], idx, (int)p[0]);
        return 1;
    }
    case NBP_TAKE_ALONG: {
        nb_var *idx =
            p[1] ? nbp_inline_index(tr, (nb_dtype)p[2], (int)p[6], p + 8, (int)p[7], p[4], p[5])
                 : in[1];
        out[0] = nb_take_along_axis(in[0], idx, (int)p[0]);
        return 1;
    }
    case NBP_ONE_HOT: {
        nb_var *idx =
            p[1] ? nbp_inline_index(tr, (nb_dtype)p[2], 1, (int64_t[]){p[3]}, 0, p[4], p[5])
                 : in[0];
        out[0] = nb_one_hot(idx, p[0], (nb_dtype)p[6]);
        return 1;
    }
    case NBP_DYN_SLICE:
    case NBP_DYN_UPDATE: {
        int r = nb_var_rank(in[0]);
        nb_var *starts[NB_MAX_RANK];
        for (int d = 0; d < r && d < NB_MAX_RANK; d++) {
            starts[d] = p[16 + d] >= 0 ? in[p[16 + d]]
                                       : nb_scalar_typed(tr, (nb_dtype)p[25], (double)p[8 + d]);
        }
        if (c == NBP_DYN_SLICE) {
            out[0] = nb_dynamic_slice(in[0], starts, p);
        } else {
            nb_var *upd = p[26] ? nb_full(tr, nb_var_dtype(in[0]), r, p, op->f[0]) : in[1];
            out[0] = nb_dynamic_update_slice(in[0], upd, starts);
        }
        return 1;
    }
    case NBP_MATMUL:
    case NBP_DOT: {
        nb_var *b = p[0] ? nb_iota(tr, nb_var_dtype(in[0]), (int)p[1], p + 2, (int)p[10]) : in[1];
        out[0] = c == NBP_DOT ? nb_dot(in[0], b) : nb_matmul(in[0], b);
        return 1;
    }
    case NBP_RNG_BITS:
    case NBP_RNG_UNIFORM:
    case NBP_RNG_NORMAL:
    case NBP_RNG_TRUNC:
    case NBP_RNG_BERNOULLI:
    case NBP_RNG_PERM:
    case NBP_RNG_SPLIT:
    case NBP_RNG_FOLD_IN: {
        nb_var *key = p[0] ? nbp_inline_key(tr, p[1]) : in[0];
        int r = (int)p[3];
        const int64_t *sh = p + 4;
        nb_dtype dt = (nb_dtype)p[2];
        switch (c) {
        case NBP_RNG_BITS:
            out[0] = nb_rng_bits(key, r, sh);
            break;
        case NBP_RNG_UNIFORM:
            out[0] = nb_rng_uniform(key, dt, r, sh, op->f[0], op->f[1]);
            break;
        case NBP_RNG_NORMAL:
            out[0] = nb_rng_normal(key, dt, r, sh);
            break;
        case NBP_RNG_TRUNC:
            out[0] = nb_rng_truncated_normal(key, dt, op->f[0], op->f[1], r, sh);
            break;
        case NBP_RNG_BERNOULLI:
            out[0] = nb_rng_bernoulli(key, op->f[0], r, sh);
            break;
        case NBP_RNG_PERM:
            out[0] = nb_rng_permutation(key, p[8]);
            break;
        case NBP_RNG_SPLIT:
            out[0] = nb_rng_split(key, p[8]);
            break;
        default: {
            nb_var *data =
                p[9] ? nb_scalar_typed(tr, NB_DTYPE_I32, (double)p[10]) : in[p[0] ? 0 : 1];
            out[0] = nb_rng_fold_in(key, data);
            break;
        }
        }
        return 1;
    }
    case NBP_FORI: {
        nb_loop_opts o = nbp_loop_opts(op);
        const nb_tree *r =
            nb_fori_loop(tr, p[0], p[1], nbp_sub_fn(tr, P, oi, NBP_SUB_BODY), nb_leaf(in[0]), &o);
        out[0] = r != NULL ? nb_var_of(tr, r) : nb_var_of(tr, NULL);
        return 1;
    }
    case NBP_SCAN: {
        nb_loop_opts o = nbp_loop_opts(op);
        const nb_tree *xs = p[6] ? NULL : nb_leaf(in[1]);
        const nb_tree *r =
            nb_scan(tr, nbp_sub_fn(tr, P, oi, NBP_SUB_BODY), nb_leaf(in[0]), xs, p[7], &o);
        out[0] = nb_var_of(tr, r != NULL ? nb_tree_child(r, 0) : NULL);
        out[1] = nb_var_of(tr, r != NULL ? nb_tree_child(r, 1) : NULL);
        return 2;
    }
    case NBP_WHILE: {
        nb_loop_opts o = nbp_loop_opts(op);
        nb_tree *init = NULL;
        nb_tree *items[2] = {nb_leaf(nb_scalar_typed(tr, NB_DTYPE_I32, 0)), nb_leaf(in[0])};
        nb_status st = nb_tree_tuple(ctx, 2, items, &init);
        if (st != NB_OK) { /* (allocation failures are tested: R7) */
            nb_trace_fail(tr, st, "the while loop's carry: nb_tree_tuple returned %s",
                          nb_status_name(st));
            out[0] = out[1] = nb_var_of(tr, NULL);
            return 2;
        }
        const nb_tree *r = nb_while_loop(tr, nbp_sub_fn(tr, P, oi, NBP_SUB_COND),
                                         nbp_sub_fn(tr, P, oi, NBP_SUB_BODY), init, &o);
        nb_tree_destroy(init);
        out[0] = nb_var_of(tr, r != NULL ? nb_tree_child(r, 1) : NULL);
        out[1] = nb_var_of(tr, r != NULL ? nb_tree_child(r, 0) : NULL);
        return 2;
    }
    case NBP_COND:
    case NBP_SWITCH: {
        nb_var *s = nb_sum(nb_cast(in[0], NB_DTYPE_F64), NULL, 0, false);
        const nb_tree *r;
        if (c == NBP_COND) {
            r = nb_cond(tr, nb_gt(s, nb_scalar(tr, 0.0)), nbp_sub_fn(tr, P, oi, NBP_SUB_B0),
                        nbp_sub_fn(tr, P, oi, NBP_SUB_B1), nb_leaf(in[1]));
        } else {
            nb_fn *br[3];
            for (int i = 0; i < (int)p[0]; i++) {
                br[i] = nbp_sub_fn(tr, P, oi, NBP_SUB_B0 + i);
            }
            r = nb_switch(tr, nb_cast(s, NB_DTYPE_I32), (int)p[0], br, nb_leaf(in[1]));
        }
        out[0] = nb_var_of(tr, r);
        return 1;
    }
    case NBP_CALL:
        out[0] =
            nb_apply1(tr, nbp_sub_fn(tr, P, oi, p[1] ? NBP_SUB_CALL_JIT : NBP_SUB_BODY), in[0]);
        return 1;
    default:
        if (c >= NBP_ADD && c <= NBP_LOGICAL_OR) {
            out[0] = nbp_binary(c, in[0], in[1]);
        } else {
            out[0] = nbp_unary(c, in[0]);
        }
        return 1;
    }
}

/* The bodies of control flow: loop bodies, conds, branches and called functions. Their
 * parameters are those of the op (p[5..8] unary codes, f[0..3] weak scalars). */
static nb_status nbp_body_sub(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    int oi = 0, role = 0;
    nbp_prog *P = nbp_self_get(self, &oi, &role);
    role -= NBP_ROLE_SUB;
    const nbp_op *op = &P->ops[oi];
    const int64_t *p = op->p;
    const double *f = op->f;
    nb_ctx *ctx = nb_trace_ctx(tr);
    switch (op->code) {
    case NBP_FORI: { /* (i, x) -> U(x) a + i b */
        nb_var *i = nb_var_of(tr, nb_tree_child(args, 0)),
               *x = nb_var_of(tr, nb_tree_child(args, 1));
        nb_var *y = nb_add(nb_mul(nbp_loop_unary((int)p[5], x), nb_scalar(tr, f[0])),
                           nb_mul(nb_cast(i, nb_var_dtype(x)), nb_scalar(tr, f[1])));
        return nb_return(y, out);
    }
    case NBP_SCAN: { /* (c, x_i) -> (U(c) a + sum(x_i), U2(x_i) + c.sum) or without xs (U(c) a + b,
                        c b) */
        nb_var *cv = nb_var_of(tr, nb_tree_child(args, 0));
        const nb_tree *xl = nb_tree_child(args, 1);
        nb_var *c2, *y;
        if (nb_tree_kind_of(xl) == NB_TREE_KIND_VAR) {
            nb_var *x = nb_var_of(tr, xl);
            c2 = nb_add(nb_mul(nbp_loop_unary((int)p[5], cv), nb_scalar(tr, f[0])),
                        nb_cast(nb_sum(x, NULL, 0, false), nb_var_dtype(cv)));
            y = nb_add(nbp_loop_unary((int)p[8], x),
                       nb_cast(nb_sum(cv, NULL, 0, false), nb_var_dtype(x)));
        } else {
            c2 = nb_add(nb_mul(nbp_loop_unary((int)p[5], cv), nb_scalar(tr, f[0])),
                        nb_scalar(tr, f[1]));
            y = nb_mul(cv, nb_scalar(tr, f[1]));
        }
        nb_tree *items[2] = {nb_leaf(c2), nb_leaf(y)};
        return nb_tree_tuple(ctx, 2, items, out);
    }
    case NBP_WHILE: {
        nb_var *k = nb_var_of(tr, nb_tree_child(args, 0)),
               *x = nb_var_of(tr, nb_tree_child(args, 1));
        if (role == NBP_SUB_COND) {
            return nb_return(nb_lt(k, nb_scalar_typed(tr, NB_DTYPE_I32, (double)p[0])), out);
        }
        nb_tree *items[2] = {
            nb_leaf(nb_add(k, nb_scalar_typed(tr, NB_DTYPE_I32, 1.0))),
            nb_leaf(nb_add(nb_mul(nbp_loop_unary((int)p[5], x), nb_scalar(tr, f[0])),
                           nb_scalar(tr, f[1])))};
        return nb_tree_tuple(ctx, 2, items, out);
    }
    case NBP_COND:
    case NBP_SWITCH: { /* branch b: U_b(x) f[b] */
        int b = role - NBP_SUB_B0;
        nb_var *x = nb_var_of(tr, args); /* the operand itself */
        return nb_return(nb_mul(nbp_loop_unary((int)p[5 + b], x), nb_scalar(tr, f[b])), out);
    }
    default: { /* CALL: U(x) a + b */
        nb_var *x = nb_var_of(tr, nb_tree_child(args, 0));
        return nb_return(
            nb_add(nb_mul(nbp_loop_unary((int)p[5], x), nb_scalar(tr, f[0])), nb_scalar(tr, f[1])),
            out);
    }
    }
}

/* ---- printing ------------------------------------------------------------------------------- */

void nbp_fmt_shape(char *buf, size_t cap, nb_dtype dt, int rank, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "%s[", nb_dtype_name(dt));
    for (int i = 0; i < rank && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)shape[i]);
    }
    if (n < cap) {
        snprintf(buf + n, cap - n, "]");
    }
}

static void nbp_fmt_ints(char *buf, size_t cap, const int64_t *v, int n) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && k < cap; i++) {
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)v[i]);
    }
    if (k < cap) {
        snprintf(buf + k, cap - k, "]");
    }
}

static void nbp_print_op(FILE *f, const nbp_prog *P, int oi) {
    const nbp_op *op = &P->ops[oi];
    const int64_t *p = op->p;
    char a[160] = "", b[160] = "", c[160] = "";
    int r0 = op->n_in > 0 && op->in[0] < P->n_vals ? P->vals[op->in[0]].rank : 0;
    fprintf(f, "  ");
    for (int k = 0; k < op->n_out; k++) {
        fprintf(f, "%sv%d", k ? ", " : "", op->out0 + k);
    }
    fprintf(f, "%s%s(", op->n_out ? " = " : "(refused) ",
            op->code == NBP_SCALAR_BIN ? nbp_op_names[p[0]] : nbp_op_names[op->code]);
    if (op->code == NBP_SCALAR_BIN && p[1]) {
        fprintf(f, "nb_scalar(%.17g), ", op->f[0]);
    }
    for (int j = 0; j < op->n_in; j++) {
        fprintf(f, "%sv%d", j ? ", " : "", op->in[j]);
    }
    switch (op->code) {
    case NBP_CONST:
        fprintf(f, "input %lld", (long long)p[0]);
        break;
    case NBP_IOTA:
    case NBP_FULL:
        nbp_fmt_shape(a, sizeof a, (nb_dtype)p[0], (int)p[1], p + 2);
        if (op->code == NBP_IOTA) {
            fprintf(f, "%s, axis %lld", a, (long long)p[10]);
        } else {
            fprintf(f, "%s, %.17g", a, op->f[0]);
        }
        break;
    case NBP_SCALAR_TYPED:
        fprintf(f, "%s, %.17g", nb_dtype_name((nb_dtype)p[0]), op->f[0]);
        break;
    case NBP_CAST:
        fprintf(f, ", %s", nb_dtype_name((nb_dtype)p[0]));
        break;
    case NBP_SCALAR_BIN:
        if (!p[1]) {
            fprintf(f, ", nb_scalar(%.17g)", op->f[0]);
        }
        break;
    case NBP_SUM:
    case NBP_MEAN:
    case NBP_MAX:
    case NBP_MIN:
    case NBP_PROD:
    case NBP_LOGSUMEXP:
        if (p[0] < 0) {
            fprintf(f, ", axes NULL");
        } else {
            nbp_fmt_ints(a, sizeof a, p + 1, (int)p[0]);
            fprintf(f, ", axes %s", a);
        }
        fprintf(f, ", keepdims %d", (int)p[9]);
        break;
    case NBP_ARGMAX:
    case NBP_ARGMIN:
        fprintf(f, ", axis %lld, keepdims %d", (long long)p[0], (int)p[1]);
        break;
    case NBP_SOFTMAX:
    case NBP_LOG_SOFTMAX:
    case NBP_EXPAND_DIMS:
    case NBP_CONCATENATE:
    case NBP_STACK:
        fprintf(f, "%saxis %lld", op->n_in ? ", " : "", (long long)p[0]);
        if ((op->code == NBP_CONCATENATE || op->code == NBP_STACK) && op->n_in == 0) {
            fprintf(f, ", n 0, xs %s", p[1] ? "NULL" : "non-NULL");
        }
        break;
    case NBP_RESHAPE:
    case NBP_BROADCAST_TO:
        nbp_fmt_ints(a, sizeof a, p + 1, (int)p[0]);
        fprintf(f, ", %s", a);
        break;
    case NBP_TRANSPOSE:
        nbp_fmt_ints(a, sizeof a, p + 1, r0);
        fprintf(f, ", %s", p[0] ? "NULL" : a);
        break;
    case NBP_SQUEEZE:
        nbp_fmt_ints(a, sizeof a, p + 1, p[0] < 0 ? 0 : (int)p[0]);
        fprintf(f, ", %s", p[0] < 0 ? "NULL" : a);
        break;
    case NBP_SLICE:
        nbp_fmt_ints(a, sizeof a, p, r0);
        nbp_fmt_ints(b, sizeof b, p + 8, r0);
        nbp_fmt_ints(c, sizeof c, p + 16, r0);
        fprintf(f, ", start %s, stop %s, step %s", a, b, p[24] ? "NULL" : c);
        break;
    case NBP_PAD:
        nbp_fmt_ints(a, sizeof a, p, r0);
        nbp_fmt_ints(b, sizeof b, p + 8, r0);
        fprintf(f, ", lo %s, hi %s, value %.17g", a, b, op->f[0]);
        break;
    case NBP_TAKE:
    case NBP_ONE_HOT:
        if (p[1]) {
            fprintf(f, "%sindices iota(%s[%lld]) * %lld + %lld", op->n_in ? ", " : "",
                    nb_dtype_name((nb_dtype)p[2]), (long long)p[3], (long long)p[4],
                    (long long)p[5]);
        }
        if (op->code == NBP_TAKE) {
            fprintf(f, ", axis %lld", (long long)p[0]);
        } else {
            fprintf(f, ", depth %lld, %s", (long long)p[0], nb_dtype_name((nb_dtype)p[6]));
        }
        break;
    case NBP_TAKE_ALONG:
        if (p[1]) {
            nbp_fmt_shape(a, sizeof a, (nb_dtype)p[2], (int)p[6], p + 8);
            fprintf(f, ", indices iota(%s, axis %lld) * %lld + %lld", a, (long long)p[7],
                    (long long)p[4], (long long)p[5]);
        }
        fprintf(f, ", axis %lld", (long long)p[0]);
        break;
    case NBP_DYN_SLICE:
    case NBP_DYN_UPDATE: {
        size_t n = 0;
        for (int d = 0; d < r0 && n < sizeof b; d++) {
            if (p[16 + d] >= 0) {
                n +=
                    (size_t)snprintf(b + n, sizeof b - n, "%sv%d", d ? "," : "", op->in[p[16 + d]]);
            } else {
                n += (size_t)snprintf(b + n, sizeof b - n, "%s%lld", d ? "," : "",
                                      (long long)p[8 + d]);
            }
        }
        nbp_fmt_ints(a, sizeof a, p, r0);
        if (op->code == NBP_DYN_UPDATE && p[26]) {
            fprintf(f, ", update full(%s, %.17g)", a, op->f[0]);
        } else if (op->code == NBP_DYN_SLICE) {
            fprintf(f, ", sizes %s", a);
        }
        fprintf(f, ", starts %s [%s]", b, nb_dtype_name((nb_dtype)p[25]));
        break;
    }
    case NBP_MATMUL:
    case NBP_DOT:
        if (p[0]) {
            nbp_fmt_ints(a, sizeof a, p + 2, (int)p[1]);
            fprintf(f, ", iota(%s, axis %lld)", a, (long long)p[10]);
        }
        break;
    case NBP_RNG_BITS:
    case NBP_RNG_UNIFORM:
    case NBP_RNG_NORMAL:
    case NBP_RNG_TRUNC:
    case NBP_RNG_BERNOULLI:
    case NBP_RNG_PERM:
    case NBP_RNG_SPLIT:
    case NBP_RNG_FOLD_IN:
        if (p[0]) {
            fprintf(f, "%skey iota*7+%lld", op->n_in ? ", " : "", (long long)p[1]);
        }
        nbp_fmt_shape(a, sizeof a, (nb_dtype)p[2], (int)p[3], p + 4);
        fprintf(f, ", %s, f %.17g %.17g, n %lld", a, op->f[0], op->f[1], (long long)p[8]);
        if (op->code == NBP_RNG_FOLD_IN && p[9]) {
            fprintf(f, ", data %lld", (long long)p[10]);
        }
        break;
    case NBP_FORI:
    case NBP_SCAN:
    case NBP_WHILE:
    case NBP_COND:
    case NBP_SWITCH:
    case NBP_CALL: {
        static const char *const kinds[3] = {"lax", "checkpointed", "bounded"};
        if (op->code == NBP_FORI) {
            fprintf(f, ", lo %lld, hi %lld, body x -> %s(x)*%g + i*%g", (long long)p[0],
                    (long long)p[1], nbp_u_names[p[5]], op->f[0], op->f[1]);
        } else if (op->code == NBP_SCAN) {
            fprintf(f, ", length %lld%s, body (c, x) -> (%s(c)*%g + %s, %s)", (long long)p[7],
                    p[6] ? ", xs NULL" : "", nbp_u_names[p[5]], op->f[0], p[6] ? "b" : "sum(x)",
                    p[6] ? "c*b" : nbp_u_names[p[8]]);
        } else if (op->code == NBP_WHILE) {
            fprintf(f, ", (k, x) while k < %lld: (k+1, %s(x)*%g + %g)", (long long)p[0],
                    nbp_u_names[p[5]], op->f[0], op->f[1]);
        } else if (op->code == NBP_CALL) {
            fprintf(f, ", %s x -> %s(x)*%g + %g", p[1] ? "jit(inline_calls=false)" : "inlined",
                    nbp_u_names[p[5]], op->f[0], op->f[1]);
        } else {
            fprintf(f, ", pred/index from sum(v%d), branches", op->in[0]);
            for (int i = 0; i < (op->code == NBP_COND ? 2 : (int)p[0]); i++) {
                fprintf(f, " %s(x)*%g", nbp_u_names[p[5 + i]], op->f[i]);
            }
        }
        if (op->code == NBP_FORI || op->code == NBP_SCAN || op->code == NBP_WHILE) {
            fprintf(f, ", kind %s, max_steps %lld, checkpoints %lld", kinds[p[2]], (long long)p[3],
                    (long long)p[4]);
        }
        break;
    }
    default:
        break;
    }
    fprintf(f, ")");
    for (int k = 0; k < op->n_out; k++) {
        const nbp_val *v = &P->vals[op->out0 + k];
        nbp_fmt_shape(a, sizeof a, v->dt, v->rank, v->shape);
        fprintf(f, "%s%s", k ? ", " : "  : ", a);
    }
    fprintf(f, "\n");
}

void nbp_print_program(FILE *f, const nbp_prog *P) {
    char s[160];
    fprintf(f,
            "==nabla-fuzz== program (value seed %llu; checks:%s%s%s%s%s%s; generic inputs %s):\n",
            (unsigned long long)P->seed, " R1", (P->flags & NBP_NO_THREADS) ? "" : " R2",
            (P->flags & NBP_NO_GRAD)        ? ""
            : (P->flags & NBP_GRAD_SPECIAL) ? " R3-R5 (bits, at the inputs)"
                                            : " R3 R5",
            (P->flags & (NBP_NO_GRAD | NBP_NO_HESS | NBP_GRAD_SPECIAL)) ? "" : " R4",
            (P->flags & NBP_DONATE) ? " donation" : "", (P->flags & NBP_OOM) ? " R6 R7" : " R6",
            (P->flags & NBP_GRAD_POSITIVE) ? "in (0.25, 2)" : "in +-(0.25, 1.5)");
    for (int k = 0; k < P->n_inputs; k++) {
        const nbp_input *in = &P->in[k];
        nbp_fmt_shape(s, sizeof s, in->dt, in->rank, in->shape);
        fprintf(f, "  v%d = %s input %d : %s, fill %s", k, nbp_in_kinds[in->kind], k, s,
                nbp_fill_names[in->fill]);
        if (in->kind == NBP_IN_TIED) {
            fprintf(f, " (the array of input %d)", in->tie);
        }
        if (in->leaf >= 0) {
            fprintf(f, ", args[0][%d]", in->leaf);
        }
        fprintf(f, "\n");
    }
    for (int oi = P->n_inputs; oi < P->n_ops; oi++) {
        if (P->ops[oi].dead) {
            continue;
        }
        if (oi == P->rejected_op) {
            fprintf(f, "  -- refused at trace time:\n");
        }
        nbp_print_op(f, P, oi);
    }
    fprintf(f, "  outputs:");
    for (int j = 0; j < P->n_outs; j++) {
        fprintf(f, " v%d", P->outs[j]);
    }
    fprintf(f, "\n");
}
