/*
 * solve.c -- nb_diffeqsolve (nabla/ode.h): explicit Runge-Kutta steps, the PID controller,
 * SaveAt and the adjoints, all as traced ops inside one while loop (nabla/loops.h).
 *
 * Time runs internally from tau0 = s t0 to tau1 = s t1 with s = +1, or -1 for a solve
 * backwards in time (Diffrax's trick): the term is called at t = s tau and its derivative
 * multiplied by s, so every comparison below is "forwards". Negation is exact.
 *
 * The loop's carry (a tuple):
 *   [0] t       the time reached (internal)         [1] tn   the end of the next step
 *   [2] y       the state (y0's tree)               [3] fy   s f(t, y): the next first stage
 *   [4] steps   i32 steps tried (the loop's counter) [5] acc  i32 steps kept
 *   [6] result  i32 nb_ode_result                   [7] pie, [8] ppie: the PID's last two
 *                                                        inverse scaled errors of kept steps
 *   [9] save    null (SaveAt t1); a tuple of one [n_ts, N] leaf per state leaf (ts: dense
 *               output written where a kept step passes a save time); or (ts_buf, ys_buf)
 *               buffers of max_steps rows written at `steps` (every step tried: +inf rows
 *               for rejected ones, compacted after the loop)
 *   [10] at_dtmin  bool: the next step was proposed at dtmin (force_dtmin then keeps it)
 *   [11] stiff  i32[2]: the stiffness test's counters
 *   [12] ev     [n_events]: the event conditions at t (empty without events)
 *   [13] event  i32: the condition that fired (the loop's end), -1 while none has
 *   [14] bdf    the BDF's (D, order, steps of one size, hD); null for the other solvers
 * Carrying f(t, y) makes every method first-same-as-last: a step evaluates stages 2..s and
 * f(t + h, y1), which is both the Hermite interpolant's end slope and the next step's first
 * stage, so non-FSAL methods cost no more than their stage count either.
 */
#include "ad/ir.h"
#include "core/internal.h"
#include "nabla/linalg.h"
#include "nabla/loops.h"
#include "nabla/ode.h"
#include "ode/tableau.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- options ------------------------------------------------------------------------ */

nb_ode_controller nb_ode_constant_step(void) {
    nb_ode_controller c;
    memset(&c, 0, sizeof c);
    c.icoeff = 1.0;
    c.factormin = 0.2;
    c.factormax = 10.0;
    c.safety = 0.9;
    return c;
}

nb_ode_controller nb_ode_pid(double rtol, double atol) {
    nb_ode_controller c = nb_ode_constant_step();
    c.adaptive = true;
    c.rtol = rtol;
    c.atol = atol;
    return c;
}

nb_ode_opts nb_ode_opts_default(void) {
    nb_ode_opts o;
    memset(&o, 0, sizeof o);
    o.solver = NB_ODE_TSIT5;
    o.t0 = 0.0;
    o.t1 = 1.0;
    o.dt0 = 0.0;
    o.saveat.kind = NB_SAVEAT_T1;
    o.controller = nb_ode_constant_step();
    o.adjoint.kind = NB_ADJOINT_RECURSIVE_CHECKPOINT;
    o.adjoint.solver = -1;
    o.adjoint.controller = nb_ode_constant_step();
    o.max_steps = 4096;
    return o;
}

const char *nb_ode_result_string(int result) {
    switch (result) {
    case NB_ODE_SUCCESSFUL:
        return "successful";
    case NB_ODE_MAX_STEPS_REACHED:
        return "max_steps reached";
    case NB_ODE_DT_UNDERFLOW:
        return "step size underflow";
    case NB_ODE_NONFINITE:
        return "non-finite state";
    case NB_ODE_NEWTON_FAILED:
        return "Newton iteration failed";
    default:
        return "unknown result";
    }
}

/* The static configuration a step body reads from its self: a tuple of floats. */
enum {
    CFG_SOLVER,
    CFG_ADAPTIVE,
    CFG_RTOL,
    CFG_ATOL,
    CFG_PCOEFF,
    CFG_ICOEFF,
    CFG_DCOEFF,
    CFG_FACTORMIN,
    CFG_FACTORMAX,
    CFG_SAFETY,
    CFG_DTMIN,
    CFG_DTMAX,
    CFG_FORCE_DTMIN,
    CFG_SIGN,
    CFG_T1,  /* internal end time */
    CFG_DT0, /* constant steps: the step (internal, > 0) */
    CFG_SAVEAT,
    CFG_N_TS,
    CFG_TRACED,  /* traced times: t, tn keep derivatives; t1 is self's var "t1" */
    CFG_N_EVENT, /* the number of event conditions (0: no events) */
    CFG_EVTOL,   /* opts.event_tol */
    CFG_COUNT
};

typedef struct nbo_cfg {
    double v[CFG_COUNT];
    const nbo_tableau *tab;
} nbo_cfg;

/* ---- small builders ---------------------------------------------------------------- */

/* A trace-owned node (tuple or list) of n items (borrowed); NULL after a sticky error. */
static nb_tree *nbo_tuple(nb_trace *tr, int64_t n, nb_tree *const *items) {
    nb_tree *t = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (items[i] == NULL) {
            return NULL; /* an item failed: its error is on the trace */
        }
    }
    if (nb_tree_tuple(tr->ctx, n, items, &t) != NB_OK || nbi_trace_own(tr, t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    return t;
}

static nb_tree *nbo_null(nb_trace *tr) {
    nb_tree *t = NULL;
    if (nb_tree_null(tr->ctx, &t) != NB_OK || nbi_trace_own(tr, t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    return t;
}

static nb_tree *nbo_float(nb_trace *tr, double x) {
    nb_tree *t = NULL;
    if (nb_tree_float(tr->ctx, x, &t) != NB_OK || nbi_trace_own(tr, t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    return t;
}

static nb_var *nbo_i32(nb_trace *tr, int64_t v) {
    return nb_scalar_typed(tr, NB_DTYPE_I32, (double)v);
}

/* The vars of a tree's dynamic leaves, into a trace-lifetime array (NULL on failure). */
static nb_var **nbo_leaves(nb_trace *tr, const nb_tree *t, int64_t *n, nb_treedef **def) {
    nb_tree *list = NULL;
    if (nb_tree_flatten(t, &list, def) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    *n = nb_tree_len(list);
    nb_var **v = nbi_arena_alloc(&tr->arena, (size_t)(*n > 0 ? *n : 1) * sizeof *v);
    if (v == NULL) {
        nb_tree_destroy(list);
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < *n; i++) {
        v[i] = nb_var_of(tr, nb_tree_child(list, i));
    }
    nb_tree_destroy(list);
    return v;
}

/* A trace-owned tree of def's structure holding the vars v as leaves. */
static nb_tree *nbo_build(nb_trace *tr, const nb_treedef *def, int64_t n, nb_var *const *v) {
    nb_tree **l = nbi_arena_alloc(&tr->arena, (size_t)(n > 0 ? n : 1) * sizeof *l);
    if (l == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        if ((l[i] = nb_leaf(v[i])) == NULL) {
            return NULL;
        }
    }
    nb_tree *t = NULL;
    if (nbi_tree_unflatten_leaves(def, l, &t) != NB_OK || nbi_trace_own(tr, t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    return t;
}

static nb_var **nbo_vars(nb_trace *tr, int64_t n) {
    nb_var **v = nbi_arena_alloc(&tr->arena, (size_t)(n > 0 ? n : 1) * sizeof *v);
    if (v == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
    }
    return v;
}

static nb_var *nbo_isfinite(nb_var *x) { /* x - x == 0: false for inf and NaN */
    return nb_eq(nb_sub(x, x), nb_scalar(nb_var_trace(x), 0.0));
}

static bool nbo_cfg_read(nb_trace *tr, const nb_tree *self, nbo_cfg *cfg) {
    const nb_tree *c = nb_tree_get(self, "cfg");
    if (nb_tree_len(c) != CFG_COUNT) {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_diffeqsolve: bad step configuration");
        return false;
    }
    for (int i = 0; i < CFG_COUNT; i++) {
        nb_tree_get_float(nb_tree_child(c, i), &cfg->v[i]);
    }
    cfg->tab = nbo_tableau_get((int)cfg->v[CFG_SOLVER]);
    if (cfg->tab == NULL) {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_diffeqsolve: no tableau");
        return false;
    }
    return true;
}

/* ---- the term ------------------------------------------------------------------------ */

/* Call the user function of self's fnkey (its bound data under selfkey) on (s tau, y, args):
 * its output tree (the caller's to destroy), or NULL with the trace's error set; *name its
 * name, label what it is in messages ("term", "event function", ...). */
static nb_tree *nbo_call_user(nb_trace *tr, const nb_tree *self, const char *fnkey,
                              const char *selfkey, const char *label, double sign, nb_var *tau,
                              const nb_treedef *ydef, int64_t L, nb_var *const *yv,
                              const char **name) {
    nb_fnptr fp = NULL;
    *name = NULL;
    nb_tree_get_fnref(nb_tree_get(self, fnkey), &fp, name);
    const nb_tree *uself = nb_tree_get(self, selfkey);
    if (uself == NULL || nb_tree_kind_of(uself) == NB_TREE_KIND_NULL) {
        uself = NULL;
    }
    nb_tree *ytree = nbo_build(tr, ydef, L, yv);
    nb_var *t = sign < 0 ? nb_neg(tau) : tau;
    nb_tree *targs =
        ytree != NULL
            ? nbo_tuple(tr, 3,
                        (nb_tree *[]){nb_leaf(t), ytree, (nb_tree *)nb_tree_get(self, "args")})
            : NULL;
    if (targs == NULL) {
        return NULL;
    }
    nb_tree *out = NULL;
    nb_status st = ((nb_fn_body)fp)(tr, uself, targs, &out);
    if (tr->status != NB_OK) {
        st = tr->status;
    }
    if (st != NB_OK || out == NULL) {
        nb_tree_destroy(out);
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, st != NB_OK ? st : NB_ERR_MISUSE, "nb_diffeqsolve: the %s '%s' %s",
                          label, *name, st != NB_OK ? "failed" : "returned no output");
        }
        return NULL;
    }
    return out;
}

/* fy[i] = s f(s tau, y, args) for the state leaves yv (tree ydef). self holds fn (the term's
 * body), self (its bound data or null), args (or null). */
static bool nbo_term_one(nb_trace *tr, const nb_tree *self, double sign, nb_var *tau,
                         const nb_treedef *ydef, int64_t L, nb_var *const *yv, nb_var **fy) {
    const char *name = NULL;
    nb_tree *out = nbo_call_user(tr, self, "fn", "self", "term", sign, tau, ydef, L, yv, &name);
    if (out == NULL) {
        return false;
    }
    bool ok = nbi_tree_def_match(out, ydef);
    nb_tree *list = NULL;
    if (ok && nb_tree_flatten(out, &list, NULL) != NB_OK) {
        nb_tree_destroy(out);
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return false;
    }
    char path[NB_PATH_MAX], a[64], b[64];
    for (int64_t i = 0; ok && i < L; i++) {
        const nb_tree *li = nb_tree_child(list, i);
        nb_var *v = nb_tree_kind_of(li) == NB_TREE_KIND_VAR ? nb_var_of(tr, li) : NULL;
        if (v == NULL || v->dtype != yv[i]->dtype || v->rank != yv[i]->rank ||
            memcmp(v->shape, yv[i]->shape, (size_t)v->rank * sizeof *v->shape) != 0) {
            nb_tree_leaf_path(out, i, path, sizeof path, NULL);
            nbi_trace_err(tr, NB_ERR_SHAPE,
                          "nb_diffeqsolve: the term '%s' returned %s at y%s%s where the state has "
                          "%s -- return dy/dt with y0's structure, dtypes and shapes",
                          name, v != NULL ? nbi_var_sig(a, sizeof a, v) : "a non-var leaf",
                          path[0] == '[' || path[0] == 0 ? "" : ".", path,
                          nbi_var_sig(b, sizeof b, yv[i]));
            ok = false;
            break;
        }
        fy[i] = sign < 0 ? nb_neg(v) : v;
    }
    if (!ok && tr->status == NB_OK) {
        char want[256], got[256];
        nb_treedef *od = NULL;
        nb_tree_treedef(out, &od);
        nb_treedef_format(ydef, want, sizeof want, NULL);
        nb_treedef_format(od, got, sizeof got, NULL);
        nb_treedef_destroy(od);
        nbi_trace_err(tr, NB_ERR_STRUCTURE,
                      "nb_diffeqsolve: the term '%s' returned %s where the state is %s -- "
                      "return dy/dt with y0's structure",
                      name, got, want);
    }
    nb_tree_destroy(list);
    nb_tree_destroy(out);
    return ok;
}

/* A self dict for one part of a split term: fn and self from the given keys, args kept. */
static nb_tree *nbo_part(nb_trace *tr, const nb_tree *self, const char *fnkey,
                         const char *selfkey) {
    nb_tree *d = NULL;
    /* the term's part keeps the user's Jacobian of it (opts.jacobian) */
    bool jac = strcmp(fnkey, "fn") == 0 && nb_tree_get(self, "jfn") != NULL;
    if (nb_tree_dict(tr->ctx, jac ? 5 : 3, (const char *[]){"fn", "self", "args", "jfn", "jself"},
                     (nb_tree *[]){(nb_tree *)nb_tree_get(self, fnkey),
                                   (nb_tree *)nb_tree_get(self, selfkey),
                                   (nb_tree *)nb_tree_get(self, "args"),
                                   jac ? (nb_tree *)nb_tree_get(self, "jfn") : NULL,
                                   jac ? (nb_tree *)nb_tree_get(self, "jself") : NULL},
                     &d) != NB_OK ||
        nbi_trace_own(tr, d) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    return d;
}

/* Is there an explicit part (opts.explicit_term: self's "efn" a fnref)? */
static bool nbo_has_efn(const nb_tree *self) {
    const nb_tree *e = nb_tree_get(self, "efn");
    return e != NULL && nb_tree_kind_of(e) != NB_TREE_KIND_NULL;
}

/* fy = s f(s tau, y): the term, plus opts.explicit_term when self carries one ("efn",
 * "eself": dy/dt = f_I + f_E for every solver but the IMEX ones, which call the parts
 * through nbo_part). */
static bool nbo_term(nb_trace *tr, const nb_tree *self, double sign, nb_var *tau,
                     const nb_treedef *ydef, int64_t L, nb_var *const *yv, nb_var **fy) {
    if (!nbo_term_one(tr, self, sign, tau, ydef, L, yv, fy)) {
        return false;
    }
    if (!nbo_has_efn(self)) {
        return true;
    }
    nb_tree *e = nbo_part(tr, self, "efn", "eself");
    nb_var **fe = nbo_vars(tr, L);
    if (e == NULL || fe == NULL || !nbo_term_one(tr, e, sign, tau, ydef, L, yv, fe)) {
        return false;
    }
    for (int64_t i = 0; i < L; i++) {
        fy[i] = nb_add(fy[i], fe[i]);
    }
    return true;
}

/* ---- Rosenbrock methods --------------------------------------------------------------- */

/* The state as one flat vector [N] (its leaves flattened and concatenated), and back. */
static nb_var *nbo_flat(int64_t L, nb_var *const *v) {
    nb_var *parts[64];
    nb_var **p =
        L <= 64 ? parts : nbi_arena_alloc(&nb_var_trace(v[0])->arena, (size_t)L * sizeof *p);
    if (p == NULL) {
        return nbi_trace_errv(nb_var_trace(v[0]), NB_ERR_OOM, "nb_diffeqsolve: out of memory");
    }
    for (int64_t i = 0; i < L; i++) {
        p[i] = nb_reshape(v[i], 1, (int64_t[]){nb_var_size(v[i])});
    }
    return L == 1 ? p[0] : nb_concatenate((int)L, p, 0);
}

static void nbo_unflat(nb_var *flat, int64_t L, nb_var *const *like, nb_var **out) {
    int64_t off = 0;
    for (int64_t i = 0; i < L; i++) {
        int64_t n = nb_var_size(like[i]);
        nb_var *part = L == 1 ? flat : nb_slice(flat, (int64_t[]){off}, (int64_t[]){off + n}, NULL);
        out[i] = nb_reshape(part, nb_var_rank(like[i]), nb_var_shape(like[i]));
        off += n;
    }
}

/* The identity [N, N] of dtype dt. */
static nb_var *nbo_eye(nb_trace *tr, nb_dtype dt, int64_t N) {
    int64_t s[2] = {N, N};
    return nb_cast(nb_eq(nb_iota(tr, NB_DTYPE_I32, 2, s, 0), nb_iota(tr, NB_DTYPE_I32, 2, s, 1)),
                   dt);
}

/* J = d(s f)/dy [N, N] and T = d(s f)/dtau [N] at (tau, y), by forward mode over one more
 * evaluation of the term: N + 1 tangent sweeps (a unit tangent per state element, one on
 * the time). Calls inside the term are inlined (as under nb_jvp) so that every op carries
 * its tangent. */
static bool nbo_user_jacobian(nb_trace *tr, const nb_tree *self, double sign, nb_var *tau,
                              const nb_treedef *ydef, int64_t L, nb_var *const *y, nb_var **J,
                              nb_var **T);

static bool nbo_jacobian(nb_trace *tr, const nb_tree *self, double sign, nb_var *tau,
                         const nb_treedef *ydef, int64_t L, nb_var *const *y, nb_var **J,
                         nb_var **T) {
    const nb_tree *jfn = nb_tree_get(self, "jfn");
    if (jfn != NULL && nb_tree_kind_of(jfn) != NB_TREE_KIND_NULL) {
        return nbo_user_jacobian(tr, self, sign, tau, ydef, L, y, J, T);
    }
    nb_var **f = nbo_vars(tr, L), **ins = nbo_vars(tr, L + 1), **tan = nbo_vars(tr, L + 1);
    nb_var **dout = nbo_vars(tr, L);
    if (f == NULL || ins == NULL || tan == NULL || dout == NULL) {
        return false;
    }
    int32_t begin = tr->g.n_nodes;
    tr->ad_depth++;
    bool ok = nbo_term(tr, self, sign, tau, ydef, L, y, f);
    tr->ad_depth--;
    int32_t end = tr->g.n_nodes;
    if (!ok) {
        return false;
    }
    int64_t N = 0;
    ins[0] = tau;
    for (int64_t i = 0; i < L; i++) {
        ins[i + 1] = y[i];
        N += nb_var_size(y[i]);
    }
    nb_var **cols = nbo_vars(tr, N);
    if (cols == NULL) {
        return false;
    }
    nb_dtype dt = nb_var_dtype(tau);
    int64_t col = 0;
    for (int64_t i = 0; i <= L; i++) {
        int64_t n = i == 0 ? 1 : nb_var_size(y[i - 1]);
        for (int64_t e = 0; e < n; e++) {
            memset(tan, 0, (size_t)(L + 1) * sizeof *tan);
            if (i == 0) {
                tan[0] = nb_scalar_typed(tr, dt, 1.0);
            } else {
                nb_var *hot = nb_cast(
                    nb_eq(nb_iota(tr, NB_DTYPE_I32, 1, (int64_t[]){n}, 0), nbo_i32(tr, e)), dt);
                tan[i] = nb_reshape(hot, nb_var_rank(y[i - 1]), nb_var_shape(y[i - 1]));
            }
            if (nbi_jvp_region(tr, begin, end, (int)L + 1, ins, tan, (int)L, f, dout) != NB_OK) {
                return false;
            }
            nb_var *v = nbo_flat(L, dout);
            if (i == 0) {
                *T = v;
            } else {
                cols[col++] = v;
            }
        }
    }
    *J = nb_stack((int)N, cols, 1);
    return tr->status == NB_OK;
}

/* opts.jacobian: J = s df/dy from the user's function (self's "jfn", "jself"), called on
 * (s tau, y, args) and returning one [N, N] float var (N: the state's elements, its leaves
 * flattened in order); T = d(s f)/dtau by one forward-mode sweep on the time. */
static bool nbo_user_jacobian(nb_trace *tr, const nb_tree *self, double sign, nb_var *tau,
                              const nb_treedef *ydef, int64_t L, nb_var *const *y, nb_var **J,
                              nb_var **T) {
    static const char who[] = "nb_diffeqsolve";
    int64_t N = 0;
    for (int64_t i = 0; i < L; i++) {
        N += nb_var_size(y[i]);
    }
    nb_dtype dt = nb_var_dtype(tau);
    const char *name = NULL;
    nb_tree *out =
        nbo_call_user(tr, self, "jfn", "jself", "Jacobian function", sign, tau, ydef, L, y, &name);
    if (out == NULL) {
        return false;
    }
    nb_var *v = nb_tree_kind_of(out) == NB_TREE_KIND_VAR ? nb_var_of(tr, out) : NULL;
    nb_tree_destroy(out);
    if (v == NULL || v->rank != 2 || v->shape[0] != N || v->shape[1] != N ||
        !nb_dtype_is_float(v->dtype)) {
        char sig[64] = "a tree that is not one var";
        if (v != NULL) {
            nbi_var_sig(sig, sizeof sig, v);
        }
        nbi_trace_err(tr, NB_ERR_SHAPE,
                      "%s: the Jacobian function '%s' returned %s; opts.jacobian must return "
                      "df/dy as one float var of shape [%lld, %lld] (the state's %lld elements, "
                      "its leaves flattened in order)",
                      who, name, sig, (long long)N, (long long)N, (long long)N);
        return false;
    }
    v = nb_cast(v, dt);
    *J = sign < 0 ? nb_neg(v) : v;
    /* T: one tangent on the time through the term */
    nb_var **f = nbo_vars(tr, L), **dout = nbo_vars(tr, L);
    if (f == NULL || dout == NULL) {
        return false;
    }
    int32_t begin = tr->g.n_nodes;
    tr->ad_depth++;
    bool ok = nbo_term(tr, self, sign, tau, ydef, L, y, f);
    tr->ad_depth--;
    int32_t end = tr->g.n_nodes;
    if (!ok ||
        nbi_jvp_region(tr, begin, end, 1, (nb_var *[]){tau},
                       (nb_var *[]){nb_scalar_typed(tr, dt, 1.0)}, (int)L, f, dout) != NB_OK) {
        return false;
    }
    *T = nbo_flat(L, dout);
    return tr->status == NB_OK;
}

/* Rosenbrock23 (Shampine and Reichelt's ode23s): with W = I - h d J and T = df/dt,
 *     W k1 = f0 + h d T,  f1 = f(t + h/2, y0 + h/2 k1),  W (k2 - k1) = f1 - k1,
 *     y1 = y0 + h k2,  f2 = f(t + h, y1),
 *     W k3 = f2 - e32 (k2 - f1) - 2 (k1 - f0) + h d T,  err = h/6 (k1 - 2 k2 + k3),
 * e32 = 6 + sqrt 2; f2 is the next step's f0 (FSAL, returned in f2); K = (k1, k2) for the
 * dense output y0 + h (theta (1 - theta) k1 + theta (theta - 2 d) k2) / (1 - 2 d). */
static bool nbo_ros23_step(nb_trace *tr, const nb_tree *self, double sign, const nbo_rosen *R,
                           nb_var *tau, nb_var *tn, nb_var *h, const nb_treedef *ydef, int64_t L,
                           nb_var *const *y, nb_var *const *fy, nb_var **y1, nb_var **err,
                           nb_var **f2, nb_var ***K) {
    nb_var *J = NULL, *T = NULL;
    if (!nbo_jacobian(tr, self, sign, tau, ydef, L, y, &J, &T)) {
        return false;
    }
    int64_t N = nb_var_dim(J, 0);
    nb_dtype dt = nb_var_dtype(tau);
    nb_var *eye = nbo_eye(tr, dt, N);
    nb_var *hd = nb_mul(h, nb_scalar(tr, R->gamma));
    nb_var *lu = nb_lu_factor(nb_sub(eye, nb_mul(hd, J)));
    nb_var *hdT = nb_mul(hd, T), *half = nb_mul(h, nb_scalar(tr, 0.5));
    nb_var *f0 = nbo_flat(L, fy), *y0 = nbo_flat(L, y);
    nb_var *k1 = nb_lu_solve(lu, nb_add(f0, hdT), false);
    nb_var **u = nbo_vars(tr, L), **fu = nbo_vars(tr, L);
    if (u == NULL || fu == NULL) {
        return false;
    }
    nbo_unflat(nb_add(y0, nb_mul(half, k1)), L, y, u);
    if (!nbo_term(tr, self, sign, nb_add(tau, half), ydef, L, u, fu)) {
        return false;
    }
    nb_var *f1 = nbo_flat(L, fu);
    nb_var *k2 = nb_add(nb_lu_solve(lu, nb_sub(f1, k1), false), k1);
    nb_var *y1f = nb_add(y0, nb_mul(h, k2));
    nbo_unflat(y1f, L, y, y1);
    if (!nbo_term(tr, self, sign, tn, ydef, L, y1, f2)) {
        return false;
    }
    nb_var *rhs =
        nb_sub(nb_sub(nbo_flat(L, f2), nb_mul(nb_sub(k2, f1), nb_scalar(tr, 7.4142135623730949))),
               nb_mul(nb_sub(k1, f0), nb_scalar(tr, 2.0)));
    nb_var *k3 = nb_lu_solve(lu, nb_add(rhs, hdT), false);
    nb_var *e = nb_mul(nb_div(h, nb_scalar(tr, 6.0)),
                       nb_add(nb_sub(k1, nb_mul(k2, nb_scalar(tr, 2.0))), k3));
    nbo_unflat(e, L, y, err);
    for (int r = 0; r < 2; r++) {
        if ((K[r] = nbo_vars(tr, L)) == NULL) {
            return false;
        }
        nbo_unflat(r == 0 ? k1 : k2, L, y, K[r]);
    }
    return tr->status == NB_OK;
}

/* One Rosenbrock step (tableau.h's nbo_rosen) from (tau, y) with step h = tn - tau: the new
 * state y1, the unscaled error estimate err (leaves) and, with an interpolant, K[r] (n_h of
 * them, leaves each). fy is s f(tau, y), the first stage's right-hand side. A singular W
 * makes the solves NaN: the error estimate is then not finite and the controller rejects
 * the step and shrinks h (W = I / (h gamma) - J is regular for h small enough). */
static bool nbo_ros_step(nb_trace *tr, const nb_tree *self, double sign, const nbo_rosen *R,
                         nb_var *tau, nb_var *h, const nb_treedef *ydef, int64_t L,
                         nb_var *const *y, nb_var *const *fy, nb_var **y1, nb_var **err,
                         nb_var ***K) {
    nb_var *J = NULL, *T = NULL;
    if (!nbo_jacobian(tr, self, sign, tau, ydef, L, y, &J, &T)) {
        return false;
    }
    int64_t N = nb_var_dim(J, 0);
    nb_dtype dt = nb_var_dtype(tau);
    nb_var *eye = nbo_eye(tr, dt, N);
    nb_var *hg = nb_mul(h, nb_scalar(tr, R->gamma));
    nb_var *lu = nb_lu_factor(nb_sub(nb_div(eye, hg), J));
    int s = R->stages;
    nb_var **k = nbo_vars(tr, s), **u = nbo_vars(tr, L), **du = nbo_vars(tr, L);
    if (k == NULL || u == NULL || du == NULL) {
        return false;
    }
    nb_var *y0f = nbo_flat(L, y), *duf = nbo_flat(L, fy);
    for (int i = 0; i < s; i++) {
        if (i > 0) {
            /* the stage's argument; the term again unless it equals the previous stage's */
            bool same = i > 1 && R->c[i] == R->c[i - 1];
            for (int j = 0; j < i && same; j++) {
                same = R->A[i * s + j] == R->A[(i - 1) * s + j];
            }
            if (!same) {
                nb_var *uf = y0f;
                for (int j = 0; j < i; j++) {
                    if (R->A[i * s + j] != 0.0) {
                        uf = nb_add(uf, nb_mul(k[j], nb_scalar(tr, R->A[i * s + j])));
                    }
                }
                nbo_unflat(uf, L, y, u);
                nb_var *ti = nb_add(tau, nb_mul(h, nb_scalar(tr, R->c[i])));
                if (!nbo_term(tr, self, sign, ti, ydef, L, u, du)) {
                    return false;
                }
                duf = nbo_flat(L, du);
            }
        }
        nb_var *rhs = duf;
        if (R->d[i] != 0.0) {
            rhs = nb_add(rhs, nb_mul(nb_mul(h, nb_scalar(tr, R->d[i])), T));
        }
        nb_var *acc = NULL;
        for (int j = 0; j < i; j++) {
            if (R->C[i * s + j] != 0.0) {
                nb_var *term = nb_mul(k[j], nb_scalar(tr, R->C[i * s + j]));
                acc = acc == NULL ? term : nb_add(acc, term);
            }
        }
        if (acc != NULL) {
            rhs = nb_add(rhs, nb_div(acc, h));
        }
        k[i] = nb_lu_solve(lu, rhs, false);
    }
    nb_var *y1f = y0f, *ef = NULL;
    for (int i = 0; i < s; i++) {
        if (R->b[i] != 0.0) {
            y1f = nb_add(y1f, nb_mul(k[i], nb_scalar(tr, R->b[i])));
        }
        if (R->btilde[i] != 0.0) {
            nb_var *term = nb_mul(k[i], nb_scalar(tr, R->btilde[i]));
            ef = ef == NULL ? term : nb_add(ef, term);
        }
    }
    nbo_unflat(y1f, L, y, y1);
    nbo_unflat(ef, L, y, err);
    for (int r = 0; r < R->n_h; r++) {
        nb_var *kf = NULL;
        for (int i = 0; i < s; i++) {
            if (R->H[r * s + i] != 0.0) {
                nb_var *term = nb_mul(k[i], nb_scalar(tr, R->H[r * s + i]));
                kf = kf == NULL ? term : nb_add(kf, term);
            }
        }
        if ((K[r] = nbo_vars(tr, L)) == NULL) {
            return false;
        }
        nbo_unflat(kf, L, y, K[r]);
    }
    return tr->status == NB_OK;
}

/* ---- ESDIRK methods: Newton with the implicit function theorem ------------------------- */

/* A tree with every var leaf replaced by its stop_gradient (other leaves kept). */
static nb_status nbo_stop_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                               nb_tree **out) {
    (void)path;
    (void)n;
    nb_trace *tr = ud;
    if (nb_tree_kind_of(leaves[0]) == NB_TREE_KIND_VAR) {
        /* the map takes a reference: nb_leaf's tree is the trace's own */
        nb_tree *l = nb_leaf(nb_stop_gradient(nb_var_of(tr, leaves[0])));
        *out = l != NULL ? nb_tree_retain(l) : NULL;
        return *out != NULL ? NB_OK : NB_ERR_OOM;
    }
    *out = nb_tree_retain((nb_tree *)leaves[0]);
    return NB_OK;
}

static nb_tree *nbo_stopped(nb_trace *tr, const nb_tree *t) {
    nb_tree *o = NULL;
    if (nb_tree_map(t, nbo_stop_leaf, tr, 0, &o) != NB_OK || nbi_trace_own(tr, o) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    return o;
}

/* RMS over every element of the leaves d of d / (atol + rtol |z|) */
static nb_var *nbo_rms_scaled(nb_trace *tr, int64_t L, nb_var *const *d, nb_var *const *z,
                              double rtol, double atol) {
    nb_var *sq = NULL;
    double count = 0;
    for (int64_t i = 0; i < L; i++) {
        nb_var *scale = nb_add(nb_scalar(tr, atol), nb_mul(nb_scalar(tr, rtol), nb_abs(z[i])));
        nb_var *q = nb_sum(nb_square(nb_div(d[i], scale)), NULL, 0, false);
        sq = sq == NULL ? q : nb_add(sq, q);
        count += (double)nb_var_size(d[i]);
    }
    return nb_sqrt(nb_div(sq, nb_scalar(tr, count > 0 ? count : 1.0)));
}

/* The Newton iteration of one implicit stage, in the state's space: the unknown z solves
 *     F(z) = z - psi - h gamma s f(tau_i, z) = 0,
 * iterated as z += -M^{-1} F(z) with M = I - h gamma J(tau0, y0) factored once per step
 * (a simplified, "very chord" Newton as Diffrax's VeryChord and CVODES). Converged when,
 * after at least two iterations, the contraction rate r = |dz_k| / |dz_{k-1}| < 1 and
 * r / (1 - r) |dz_k| <= kappa (norms scaled by atol + rtol |z|: Hairer-Wanner IV.8's test,
 * Diffrax's kappa = 0.01); diverged when r >= 1 or a norm is not finite; failed after
 * NBO_NEWTON_MAX iterations. The carry: (z, |dz_{k-1}|, k, status: 0 running, 1 converged,
 * 2 failed). self: fn, self, args (the term, stopped), psi, hg (h gamma), tau, lu, tol =
 * (sign, rtol, atol, kappa). A correction below kappa / 100 converges at once (the rate of
 * corrections at round-off level is noise). */
#define NBO_NEWTON_MAX 10
#define NBO_NEWTON_KAPPA 0.01

static nb_status nbo_newton_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    (void)self;
    return nb_return(nb_eq(nb_get(tr, args, "[3]"), nbo_i32(tr, 0)), out);
}

static nb_status nbo_newton_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    double tol[6]; /* sign, rtol, atol, kappa, iterations, converged-at-once threshold */
    const nb_tree *tt = nb_tree_get(self, "tol");
    for (int i = 0; i < 6; i++) {
        nb_tree_get_float(nb_tree_child(tt, i), &tol[i]);
    }
    int64_t L = 0, Lp = 0;
    nb_treedef *zdef = NULL;
    nb_var **z = nbo_leaves(tr, nb_tree_child(args, 0), &L, &zdef);
    nb_var **psi = z != NULL ? nbo_leaves(tr, nb_tree_get(self, "psi"), &Lp, NULL) : NULL;
    nb_var **f = nbo_vars(tr, L), **dz = nbo_vars(tr, L), **z2 = nbo_vars(tr, L);
    if (psi == NULL || f == NULL || dz == NULL || z2 == NULL ||
        !nbo_term(tr, self, tol[0], nb_get(tr, self, "tau"), zdef, L, z, f)) {
        nb_treedef_destroy(zdef);
        return tr->status;
    }
    nb_var *hg = nb_get(tr, self, "hg");
    nb_var **F = nbo_vars(tr, L);
    if (F == NULL) {
        nb_treedef_destroy(zdef);
        return tr->status;
    }
    for (int64_t i = 0; i < L; i++) {
        F[i] = nb_neg(nb_sub(nb_sub(z[i], psi[i]), nb_mul(hg, f[i])));
    }
    nbo_unflat(nb_lu_solve(nb_get(tr, self, "lu"), nbo_flat(L, F), false), L, z, dz);
    for (int64_t i = 0; i < L; i++) {
        z2[i] = nb_add(z[i], dz[i]);
    }
    nb_var *d = nbo_rms_scaled(tr, L, dz, z2, tol[1], tol[2]);
    nb_var *dprev = nb_get(tr, args, "[1]"), *it = nb_add(nb_get(tr, args, "[2]"), nbo_i32(tr, 1));
    nb_var *rate = nb_div(d, dprev);
    nb_var *two = nb_ge(it, nbo_i32(tr, 2));
    /* a correction far below the tolerance (1e-2 kappa) is converged whatever the rate: at
     * that size the rate is round-off noise */
    nb_var *conv = nb_logical_or(
        nb_le(d, nb_scalar(tr, tol[5])),
        nb_logical_and(
            two, nb_logical_and(nb_lt(rate, nb_scalar(tr, 1.0)),
                                nb_le(nb_mul(nb_div(rate, nb_sub(nb_scalar(tr, 1.0), rate)), d),
                                      nb_scalar(tr, tol[3])))));
    nb_var *bad = nb_logical_or(nb_logical_not(nbo_isfinite(d)),
                                nb_logical_or(nb_logical_and(two, nb_ge(rate, nb_scalar(tr, 1.0))),
                                              nb_ge(it, nbo_i32(tr, (int64_t)tol[4]))));
    nb_var *status =
        nb_select(conv, nbo_i32(tr, 1), nb_select(bad, nbo_i32(tr, 2), nbo_i32(tr, 0)));
    nb_tree *zt = nbo_build(tr, zdef, L, z2);
    nb_treedef_destroy(zdef);
    nb_tree *res = nbo_tuple(tr, 4, (nb_tree *[]){zt, nb_leaf(d), nb_leaf(it), nb_leaf(status)});
    if (res == NULL) {
        return tr->status;
    }
    *out = nb_tree_retain(res);
    return NB_OK;
}

/* One implicit stage: z solving F(z) = z - psi - hg s f(ti, z) = 0 (iself's term; plus the
 * explicit part, self's "efn", when sum), by the chord Newton loop on stopped data (lu: the
 * factors of I - hg J; the predictor zp), then its derivative by the implicit function theorem
 * at z*. Out: zi (L leaves), *ok and-ed with convergence, *iters (i32: the iterations; NULL: not
 * wanted). cf: the loop's condition (nbo_newton_cond). */
static bool nbo_newton_stage(nb_trace *tr, const nb_tree *self, const nb_tree *iself,
                             nb_tree *sself, nb_tree *sargs, nb_tree *seself, bool sum, double sign,
                             double rtol, double atol, int maxit, nb_var *ti, nb_var *hg,
                             nb_var *lu, nb_var *eye, nb_fn *cf, const nb_treedef *ydef, int64_t L,
                             nb_var *const *psi, nb_var *const *zp, nb_var **zi, nb_var **ok,
                             nb_var **iters) {
    nb_dtype dt = nb_var_dtype(ti);
    nb_var **zs = nbo_vars(tr, L), **F = nbo_vars(tr, L), **dz = nbo_vars(tr, L);
    if (zs == NULL || F == NULL || dz == NULL) {
        return false;
    }
    /* the Newton loop on stopped inputs (IMEX: the implicit part only) */
    nb_tree *spsi = nbo_build(tr, ydef, L, psi), *szp = nbo_build(tr, ydef, L, zp);
    /* converged at once: a correction below kappa/100, or within ~100 ulps of z (below
     * that the rate of corrections is round-off noise) */
    double eps = dt == NB_DTYPE_F64 ? 2.220446049250313e-16 : 1.1920928955078125e-7;
    double at_once = fmax(1e-2 * NBO_NEWTON_KAPPA, rtol > 0 ? 100 * eps / rtol : 0.0);
    nb_tree *tol = nbo_tuple(tr, 6,
                             (nb_tree *[]){nbo_float(tr, sign), nbo_float(tr, rtol),
                                           nbo_float(tr, atol), nbo_float(tr, NBO_NEWTON_KAPPA),
                                           nbo_float(tr, (double)maxit), nbo_float(tr, at_once)});
    nb_tree *bself = NULL;
    nb_fn *bf = NULL;
    if (spsi == NULL || szp == NULL || tol == NULL) {
        return false;
    }
    spsi = nbo_stopped(tr, spsi);
    szp = nbo_stopped(tr, szp);
    if (spsi == NULL || szp == NULL ||
        nb_tree_dict(
            tr->ctx, sum ? 10 : 8,
            (const char *[]){"fn", "self", "args", "psi", "hg", "tau", "lu", "tol", "efn", "eself"},
            (nb_tree *[]){(nb_tree *)nb_tree_get(self, "fn"), sself, sargs, spsi,
                          nb_leaf(nb_stop_gradient(hg)), nb_leaf(nb_stop_gradient(ti)),
                          nb_leaf(nb_stop_gradient(lu)), tol,
                          sum ? (nb_tree *)nb_tree_get(self, "efn") : NULL, seself},
            &bself) != NB_OK ||
        nb_fn_create(tr->ctx, "diffeqsolve_newton", nbo_newton_body, bself, &bf) != NB_OK) {
        nb_tree_destroy(bself);
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return false;
    }
    nb_tree_destroy(bself);
    nb_tree *init = nbo_tuple(tr, 4,
                              (nb_tree *[]){szp, nb_leaf(nb_scalar_typed(tr, dt, 1.0)),
                                            nb_leaf(nbo_i32(tr, 0)), nb_leaf(nbo_i32(tr, 0))});
    nb_loop_opts lo = nb_loop_opts_default();
    lo.max_steps = maxit;
    const nb_tree *fin = init != NULL ? nb_while_loop(tr, cf, bf, init, &lo) : NULL;
    nb_fn_destroy(bf);
    if (fin == NULL) {
        return false;
    }
    int64_t Lz = 0;
    nb_var **zv = nbo_leaves(tr, nb_tree_child(fin, 0), &Lz, NULL);
    if (zv == NULL) {
        return false;
    }
    *ok = nb_logical_and(*ok, nb_eq(nb_get(tr, fin, "[3]"), nbo_i32(tr, 1)));
    if (iters != NULL) {
        *iters = nb_get(tr, fin, "[2]");
    }
    /* the implicit function theorem at z*: z* - M*^{-1} F(z*), M* = I - hg J(ti, z*) */
    for (int64_t l = 0; l < L; l++) {
        zs[l] = nb_stop_gradient(zv[l]);
    }
    nb_var *Jz = NULL, *Tz = NULL;
    nb_var **fz = nbo_vars(tr, L);
    bool good = fz != NULL && nbo_jacobian(tr, iself, sign, ti, ydef, L, zs, &Jz, &Tz) &&
                nbo_term(tr, iself, sign, ti, ydef, L, zs, fz);
    if (!good) {
        return false;
    }
    nb_var *Mz = nb_stop_gradient(nb_lu_factor(nb_sub(eye, nb_mul(nb_stop_gradient(hg), Jz))));
    for (int64_t l = 0; l < L; l++) {
        F[l] = nb_sub(nb_sub(zs[l], psi[l]), nb_mul(hg, fz[l]));
    }
    nbo_unflat(nb_lu_solve(Mz, nbo_flat(L, F), false), L, zs, dz);
    for (int64_t l = 0; l < L; l++) {
        zi[l] = nbi_implicit(zs[l], nb_sub(zs[l], dz[l]));
    }
    return tr->status == NB_OK;
}

/* One ESDIRK step (tableau.h's nbo_dirk: an explicit first stage, then implicit stages),
 * or an additive (IMEX) one when the method has an explicit tableau (KenCarp: the term is
 * the implicit part f_I, opts.explicit_term the explicit part f_E, evaluated only at the
 * stage values). Out: y1, the unscaled error estimate err, f1 = f(tn, y1) for the carry (the
 * last stage when stiffly accurate; the IMEX methods keep the carry's fy, which they do not
 * use), kd (IMEX: the stages' f_E + f_I, for the dense output), and *ok false when a Newton
 * iteration failed (the caller rejects the step).
 *
 * Derivatives: each stage's Newton solution z* is taken as a value only; its derivative is
 * that of z* - M*^{-1} F(z*) with M* = I - h gamma J_I(tau_i, z*) (both stopped): by the
 * implicit function theorem exactly dz = M*^{-1}(dpsi + h gamma s df_I/dp), one linear
 * solve per stage (its transpose in reverse mode) -- never the Newton iterations
 * differentiated. That graph is live only under autodiff (op implicit): a forward-only
 * solve never evaluates J(tau_i, z*). The implicit stage derivative is f_I,i = (z_i - psi_i)
 * / (h gamma), exact at convergence, and consistent with the implicit relation in its
 * derivative as well. */
static bool nbo_dirk_step(nb_trace *tr, const nb_tree *self, double sign, const nbo_dirk *D,
                          double rtol, double atol, int maxit, nb_var *tau, nb_var *tn, nb_var *h,
                          const nb_treedef *ydef, int64_t L, nb_var *const *y, nb_var *const *fy,
                          nb_var **y1, nb_var **err, nb_var **f1, nb_var ***kd, nb_var **ok) {
    int s = D->stages;
    bool imex = D->AE != NULL, has_e = nbo_has_efn(self);
    /* the implicit part's self (IMEX: the term alone), the explicit part's (or NULL) */
    const nb_tree *iself = imex ? nbo_part(tr, self, "fn", "self") : self;
    const nb_tree *eself = imex && has_e ? nbo_part(tr, self, "efn", "eself") : NULL;
    if (iself == NULL || (imex && has_e && eself == NULL)) {
        return false;
    }
    nb_var *J = NULL, *T = NULL;
    if (!nbo_jacobian(tr, iself, sign, tau, ydef, L, y, &J, &T)) {
        return false;
    }
    int64_t N = nb_var_dim(J, 0);
    nb_dtype dt = nb_var_dtype(tau);
    nb_var *eye = nbo_eye(tr, dt, N);
    nb_var *hg = nb_mul(h, nb_scalar(tr, D->gamma));
    nb_var *lu = nb_lu_factor(nb_sub(eye, nb_mul(hg, J)));
    /* the term's data, stopped: no derivative flows into the Newton loops */
    nb_tree *sargs = nbo_stopped(tr, nb_tree_get(self, "args"));
    nb_tree *sself = nbo_stopped(tr, nb_tree_get(self, "self"));
    nb_tree *seself = !imex && has_e ? nbo_stopped(tr, nb_tree_get(self, "eself")) : NULL;
    nb_var ***f = nbi_arena_alloc(&tr->arena, (size_t)s * sizeof *f);   /* f_I (or f) */
    nb_var ***fe = nbi_arena_alloc(&tr->arena, (size_t)s * sizeof *fe); /* IMEX: f_E */
    nb_var **psi = nbo_vars(tr, L), **zp = nbo_vars(tr, L);
    if (sargs == NULL || sself == NULL || (!imex && has_e && seself == NULL) || f == NULL ||
        fe == NULL || psi == NULL || zp == NULL) {
        return false;
    }
    if (imex) {
        /* the first stage's parts, f_I(t0, y0) and f_E(t0, y0) */
        f[0] = nbo_vars(tr, L);
        fe[0] = nbo_vars(tr, L);
        if (f[0] == NULL || fe[0] == NULL ||
            !nbo_term_one(tr, iself, sign, tau, ydef, L, y, f[0]) ||
            (eself != NULL && !nbo_term_one(tr, eself, sign, tau, ydef, L, y, fe[0]))) {
            return false;
        }
        if (eself == NULL) {
            fe[0] = NULL;
        }
    } else {
        f[0] = (nb_var **)fy;
        fe[0] = NULL;
    }
    *ok = nb_scalar_typed(tr, NB_DTYPE_BOOL, 1.0);
    nb_fn *cf = NULL;
    if (nb_fn_create(tr->ctx, "diffeqsolve_newton_cond", nbo_newton_cond, NULL, &cf) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return false;
    }
    bool good = true;
    for (int i = 1; i < s && good; i++) {
        /* psi = y + h sum_j (a_ij f_j + aE_ij fE_j); the predictor z0 = psi + h gamma sum_j
         * alpha_ij f_j */
        nb_var **zi = nbo_vars(tr, L), **fi = nbo_vars(tr, L);
        f[i] = fi;
        fe[i] = NULL;
        good = zi != NULL && fi != NULL;
        for (int64_t l = 0; good && l < L; l++) {
            nb_var *acc = NULL, *pred = NULL;
            for (int j = 0; j < i; j++) {
                if (D->A[i * s + j] != 0.0) {
                    nb_var *term = nb_mul(f[j][l], nb_scalar(tr, D->A[i * s + j]));
                    acc = acc == NULL ? term : nb_add(acc, term);
                }
                if (imex && fe[j] != NULL && D->AE[i * s + j] != 0.0) {
                    nb_var *term = nb_mul(fe[j][l], nb_scalar(tr, D->AE[i * s + j]));
                    acc = acc == NULL ? term : nb_add(acc, term);
                }
                if (D->P[i * s + j] != 0.0) {
                    nb_var *term = nb_mul(f[j][l], nb_scalar(tr, D->P[i * s + j]));
                    pred = pred == NULL ? term : nb_add(pred, term);
                }
            }
            psi[l] = acc == NULL ? y[l] : nb_add(y[l], nb_mul(h, acc));
            zp[l] = pred == NULL ? psi[l] : nb_add(psi[l], nb_mul(hg, pred));
        }
        if (!good) {
            break;
        }
        nb_var *ti = D->c[i] == 1.0 ? tn : nb_add(tau, nb_mul(h, nb_scalar(tr, D->c[i])));
        if (!nbo_newton_stage(tr, self, iself, sself, sargs, seself, !imex && has_e, sign, rtol,
                              atol, maxit, ti, hg, lu, eye, cf, ydef, L, psi, zp, zi, ok, NULL)) {
            good = false;
            break;
        }
        for (int64_t l = 0; l < L; l++) {
            fi[l] = nb_div(nb_sub(zi[l], psi[l]), hg);
        }
        if (imex && eself != NULL) { /* the explicit part at the stage value */
            fe[i] = nbo_vars(tr, L);
            good = fe[i] != NULL && nbo_term_one(tr, eself, sign, ti, ydef, L, zi, fe[i]);
        }
        if (!imex && i == s - 1) {
            memcpy(y1, zi, (size_t)L * sizeof *y1);
        }
    }
    nb_fn_destroy(cf);
    if (!good || tr->status != NB_OK) {
        return false;
    }
    nb_var **k = NULL;
    if (imex) { /* the stages' f_E + f_I */
        k = nbo_vars(tr, (int64_t)s * L);
        if (k == NULL) {
            return false;
        }
        for (int j = 0; j < s; j++) {
            for (int64_t l = 0; l < L; l++) {
                k[j * L + l] = fe[j] != NULL ? nb_add(f[j][l], fe[j][l]) : f[j][l];
            }
        }
    }
    for (int64_t l = 0; l < L; l++) {
        nb_var *acc = NULL, *sol = NULL;
        for (int j = 0; j < s; j++) {
            nb_var *kj = imex ? k[j * L + l] : f[j][l];
            if (D->e[j] != 0.0) {
                nb_var *term = nb_mul(kj, nb_scalar(tr, D->e[j]));
                acc = acc == NULL ? term : nb_add(acc, term);
            }
            if (imex && D->b[j] != 0.0) {
                nb_var *term = nb_mul(kj, nb_scalar(tr, D->b[j]));
                sol = sol == NULL ? term : nb_add(sol, term);
            }
        }
        err[l] = nb_mul(h, acc);
        if (imex) {
            y1[l] = nb_add(y[l], nb_mul(h, sol));
            f1[l] = fy[l];
        } else {
            f1[l] = f[s - 1][l];
        }
    }
    if (kd != NULL) {
        *kd = k;
    }
    return true;
}

/* ---- one step ----------------------------------------------------------------------- */

/* y + h sum_j w_j k[j][i] for each leaf i (k: n stages of L leaves, w[j] == 0 skipped). */
static void nbo_combine(nb_trace *tr, int64_t L, nb_var *const *y, nb_var *h, int n,
                        nb_var *const *const *k, const double *w, nb_var **out) {
    for (int64_t i = 0; i < L; i++) {
        nb_var *acc = NULL;
        for (int j = 0; j < n; j++) {
            if (w[j] == 0.0) {
                continue;
            }
            nb_var *term = nb_mul(k[j][i], nb_scalar(tr, w[j]));
            acc = acc == NULL ? term : nb_add(acc, term);
        }
        out[i] = acc == NULL ? y[i] : nb_add(y[i], nb_mul(h, acc));
    }
}

/* ---- dense output --------------------------------------------------------------------- */

/* What a step's interpolant reads, by solver family: explicit Runge-Kutta k[j][i] (k[0] =
 * f(t, y); the Hermite cubic reads k[0] and f1), Rosenbrock RK (its dense combinations),
 * IMEX dk[j * L + i] (the stages' f_E + f_I). */
typedef struct nbo_dense {
    const nbo_tableau *tab;
    int64_t L;
    nb_var *h;
    nb_var **y, **y1, **f1;
    nb_var ***k;
    nb_var **RK[3];
    nb_var **dk;
} nbo_dense;

/* How many k, RK and dk arrays the interpolant of tab reads (each of L leaves). */
static void nbo_dense_counts(const nbo_tableau *tab, int *nk, int *nr, int *nd) {
    const nbo_rosen *R = tab->ros;
    const nbo_dirk *D = tab->dirk;
    *nk = tab->bdf ? 6 : D == NULL && R == NULL && tab->dense_degree > 0 ? tab->dense_stages : 1;
    *nr = R == NULL ? 0 : R->ros23 ? 2 : R->n_h;
    *nd = D != NULL && D->H != NULL ? D->stages : 0;
}

/* y(t + theta h) of state leaf i at th [n, 1]: [n, N]. */
static nb_var *nbo_dense_eval(nb_trace *tr, const nbo_dense *dd, int64_t i, nb_var *th) {
    const nbo_tableau *tab = dd->tab;
    const nbo_rosen *R = tab->ros;
    const nbo_dirk *D = tab->dirk;
    int64_t L = dd->L, n = nb_var_dim(th, 0), N = nb_var_size(dd->y[i]);
    nb_var *y0f = nb_reshape(dd->y[i], 2, (int64_t[]){1, N});
    nb_var *val;
    if (tab->bdf) {
        /* the BDF's polynomial through the last k + 1 points (k[j]: rows 0..k of its updated
         * differences, zero above k): y1 + sum_j D_j prod_{m<j} (theta - 1 + m) / (m + 1) */
        val = nb_reshape(dd->k[0][i], 2, (int64_t[]){1, N});
        nb_var *p = NULL;
        for (int j = 1; j < 6; j++) {
            nb_var *x =
                nb_div(nb_add(th, nb_scalar(tr, (double)(j - 2))), nb_scalar(tr, (double)j));
            p = p == NULL ? x : nb_mul(p, x);
            val = nb_add(val, nb_mul(p, nb_reshape(dd->k[j][i], 2, (int64_t[]){1, N})));
        }
        if (nb_var_dim(val, 0) != n) {
            val = nb_broadcast_to(val, 2, (int64_t[]){n, N});
        }
    } else if (D != NULL && D->H != NULL) {
        /* KenCarp: y0 + h sum_i theta P_i(theta) (f_E + f_I)_i (Diffrax's) */
        nb_var *sum = NULL;
        for (int j = 0; j < D->stages; j++) {
            nb_var *pj = NULL;
            for (int q = 0; q < D->dense_degree; q++) { /* Horner, highest first */
                double cq = D->H[j * D->dense_degree + q];
                pj = pj == NULL ? nb_mul(th, nb_scalar(tr, cq))
                                : nb_mul(th, nb_add(pj, nb_scalar(tr, cq)));
            }
            bool zero = true;
            for (int q = 0; q < D->dense_degree; q++) {
                zero = zero && D->H[j * D->dense_degree + q] == 0.0;
            }
            if (zero) {
                continue;
            }
            nb_var *kj = nb_reshape(dd->dk[j * L + i], 2, (int64_t[]){1, N});
            nb_var *term = nb_mul(pj, kj);
            sum = sum == NULL ? term : nb_add(sum, term);
        }
        val = nb_add(y0f, nb_mul(dd->h, sum));
    } else if (R != NULL && R->ros23) {
        /* y0 + h (th (1 - th) k1 + th (th - 2 d) k2) / (1 - 2 d) */
        double d = R->gamma, c = 1.0 / (1.0 - 2.0 * d);
        nb_var *k1f = nb_reshape(dd->RK[0][i], 2, (int64_t[]){1, N});
        nb_var *k2f = nb_reshape(dd->RK[1][i], 2, (int64_t[]){1, N});
        nb_var *b1 = nb_mul(nb_mul(th, nb_sub(nb_scalar(tr, 1.0), th)), nb_scalar(tr, c));
        nb_var *b2 = nb_mul(nb_mul(th, nb_sub(th, nb_scalar(tr, 2.0 * d))), nb_scalar(tr, c));
        val = nb_add(y0f, nb_mul(dd->h, nb_add(nb_mul(b1, k1f), nb_mul(b2, k2f))));
    } else if (R != NULL && R->n_h > 0) {
        /* (1 - th) y0 + th (y1 + (1 - th)(K1 + th (K2 + th K3))) */
        nb_var *y1f = nb_reshape(dd->y1[i], 2, (int64_t[]){1, N});
        nb_var *in = nb_reshape(dd->RK[R->n_h - 1][i], 2, (int64_t[]){1, N});
        for (int r = R->n_h - 2; r >= 0; r--) {
            in = nb_add(nb_reshape(dd->RK[r][i], 2, (int64_t[]){1, N}), nb_mul(th, in));
        }
        nb_var *om = nb_sub(nb_scalar(tr, 1.0), th);
        val = nb_add(nb_mul(om, y0f), nb_mul(th, nb_add(y1f, nb_mul(om, in))));
    } else if (tab->dense_degree == 0) {
        /* Hermite: y0 + (y1 - y0) h01 + h (h10 f0 + h11 f1) */
        nb_var *t2 = nb_square(th), *t3 = nb_mul(t2, th);
        nb_var *h01 = nb_sub(nb_mul(nb_scalar(tr, 3.0), t2), nb_mul(nb_scalar(tr, 2.0), t3));
        nb_var *h10 = nb_add(nb_sub(t3, nb_mul(nb_scalar(tr, 2.0), t2)), th);
        nb_var *h11 = nb_sub(t3, t2);
        nb_var *y1f = nb_reshape(dd->y1[i], 2, (int64_t[]){1, N});
        nb_var *f0f = nb_reshape(dd->k[0][i], 2, (int64_t[]){1, N});
        nb_var *f1f = nb_reshape(dd->f1[i], 2, (int64_t[]){1, N});
        val = nb_add(nb_add(y0f, nb_mul(nb_sub(y1f, y0f), h01)),
                     nb_mul(dd->h, nb_add(nb_mul(h10, f0f), nb_mul(h11, f1f))));
    } else {
        /* y0 + h sum_j b_j(theta) k_j with b_j(theta) = sum_p d_jp theta^(p+1), as a
         * polynomial in theta whose coefficients are made once per step (Diffrax's form):
         * c_p = sum_j d_jp k_j ([1, N]), then y0 + h theta (c_0 + theta (c_1 + ...)) by
         * Horner at the n times -- per time deg multiply-adds per component, where the
         * sum over the stages at each time cost about stages x (deg + 2) */
        int deg = tab->dense_degree;
        nb_var *poly = NULL;
        for (int p = deg - 1; p >= 0; p--) {
            nb_var *c = NULL;
            for (int j = 0; j < tab->dense_stages; j++) {
                double d = tab->dense[(size_t)j * deg + p];
                if (d != 0.0) {
                    nb_var *term =
                        nb_mul(nb_reshape(dd->k[j][i], 2, (int64_t[]){1, N}), nb_scalar(tr, d));
                    c = c == NULL ? term : nb_add(c, term);
                }
            }
            poly = poly == NULL ? c : c == NULL ? nb_mul(th, poly) : nb_add(c, nb_mul(th, poly));
        }
        val = poly == NULL ? nb_broadcast_to(y0f, 2, (int64_t[]){n, N})
                           : nb_add(y0f, nb_mul(dd->h, nb_mul(th, poly)));
        if (nb_var_dim(val, 0) != n) {
            val = nb_broadcast_to(val, 2, (int64_t[]){n, N});
        }
    }
    return val;
}

/* The vars of dd as one list (count: 1 + L (3 + nk + nr + nd)), and back. */
static nb_var **nbo_dense_pack(nb_trace *tr, const nbo_dense *dd, int64_t *count) {
    int nk, nr, nd;
    nbo_dense_counts(dd->tab, &nk, &nr, &nd);
    int64_t L = dd->L;
    *count = 1 + L * (3 + nk + nr + nd);
    nb_var **v = nbo_vars(tr, *count);
    if (v == NULL) {
        return NULL;
    }
    int64_t p = 0;
    v[p++] = dd->h;
    for (int64_t i = 0; i < L; i++) {
        v[p++] = dd->y[i];
        v[p++] = dd->y1[i];
        v[p++] = dd->f1[i];
        for (int j = 0; j < nk; j++) {
            v[p++] = dd->k[j][i];
        }
        for (int j = 0; j < nr; j++) {
            v[p++] = dd->RK[j][i];
        }
        for (int j = 0; j < nd; j++) {
            v[p++] = dd->dk[j * L + i];
        }
    }
    return v;
}

static bool nbo_dense_unpack(nb_trace *tr, const nbo_tableau *tab, int64_t L, nb_var *const *v,
                             nbo_dense *dd) {
    int nk, nr, nd;
    nbo_dense_counts(tab, &nk, &nr, &nd);
    memset(dd, 0, sizeof *dd);
    dd->tab = tab;
    dd->L = L;
    dd->y = nbo_vars(tr, L);
    dd->y1 = nbo_vars(tr, L);
    dd->f1 = nbo_vars(tr, L);
    dd->k = nbi_arena_alloc(&tr->arena, (size_t)nk * sizeof *dd->k);
    bool ok = dd->y != NULL && dd->y1 != NULL && dd->f1 != NULL && dd->k != NULL;
    for (int j = 0; ok && j < nk; j++) {
        ok = (dd->k[j] = nbo_vars(tr, L)) != NULL;
    }
    for (int j = 0; ok && j < nr; j++) {
        ok = (dd->RK[j] = nbo_vars(tr, L)) != NULL;
    }
    if (ok && nd > 0) {
        ok = (dd->dk = nbo_vars(tr, (int64_t)nd * L)) != NULL;
    }
    if (!ok) {
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        }
        return false;
    }
    int64_t p = 0;
    dd->h = v[p++];
    for (int64_t i = 0; i < L; i++) {
        dd->y[i] = v[p++];
        dd->y1[i] = v[p++];
        dd->f1[i] = v[p++];
        for (int j = 0; j < nk; j++) {
            dd->k[j][i] = v[p++];
        }
        for (int j = 0; j < nr; j++) {
            dd->RK[j][i] = v[p++];
        }
        for (int j = 0; j < nd; j++) {
            dd->dk[j * L + i] = v[p++];
        }
    }
    return true;
}

/* ---- the BDF ----------------------------------------------------------------------------
 * Variable order 1..5, variable step, in the quasi-constant step-size form of Shampine and
 * Reichelt's ode15s as SciPy's BDF implements it (Shampine & Reichelt 1997; the kappa of
 * the NDF set to 0 but for the BDF's own error constants below, as SciPy): the state's
 * history is the array D of backward differences [8, N] (N: the state flattened), D[0] = y_n,
 * D[j] = nabla^j y_n, for the step size hD it was formed with. A step of h:
 *   - when h != hD, D is re-expressed for h (change_D: D[:k+1] = (R(k, h/hD) U(k))^T D[:k+1]);
 *   - predictor y_p = sum_{j<=k} D[j]; psi = sum_{1<=j<=k} gamma_j D[j] / alpha_k;
 *   - the corrector z solves z - (y_p - psi) - (h / alpha_k) s f(t + h, z) = 0 by the chord
 *     Newton iteration of the ESDIRK stages (J at (t + h, y_p)), differentiated by the implicit
 *     function theorem;
 *   - d = z - y_p; error estimate error_const_k d;
 *   - kept: D[k+2] = d - D[k+1], D[k+1] = d, D[i] += D[i+1] for i = k..0; after k + 1 steps of
 *     one size the order k - 1, k or k + 1 with the largest step factor
 *     err_q^(-1/(q+1)) is taken and h scaled by min(10, safety max factor); otherwise h kept;
 *   - rejected: h scaled by max(0.2, safety err^(-1/(k+1))); 0.5 when Newton failed.
 * safety = 0.9 (2 * 4 + 1) / (2 * 4 + Newton iterations), as SciPy's. The carry holds
 * (D, k, steps of one size, hD). Every factor and the order choice are stopped (as the PID
 * controller's); D's updates are linear maps of D and d, differentiated. */

#define NBO_BDF_ROWS 8 /* MAX_ORDER + 3 */

/* kappa, gamma_k = sum_{i<=k} 1/i, alpha_k = (1 - kappa_k) gamma_k, error_const_k =
 * kappa_k gamma_k + 1/(k+1), k = 0..5 */
static const double nbo_bdf_kappa[6] = {0, -0.1850, -1.0 / 9.0, -0.0823, -0.0415, 0};

static double nbo_bdf_gamma(int k) {
    double g = 0;
    for (int i = 1; i <= k; i++) {
        g += 1.0 / i;
    }
    return g;
}

static double nbo_bdf_alpha(int k) {
    return (1 - nbo_bdf_kappa[k]) * nbo_bdf_gamma(k);
}

static double nbo_bdf_errc(int k) {
    return nbo_bdf_kappa[k] * nbo_bdf_gamma(k) + 1.0 / (k + 1);
}

/* a constant of dtype dt from doubles */
static nb_var *nbo_const(nb_trace *tr, nb_dtype dt, int rank, const int64_t *shape,
                         const double *v) {
    nb_array *a = NULL, *c = NULL;
    if (nb_array_from_data(tr->ctx, NB_DTYPE_F64, rank, shape, v, &a) != NB_OK ||
        nb_array_cast(a, dt, &c) != NB_OK) {
        nb_array_destroy(a);
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    nb_var *m = nb_constant(tr, c);
    nb_array_destroy(a);
    nb_array_destroy(c);
    return m;
}

/* tab[k] for the i32 0-d var k (k in 0..n-1), as a 0-d var of dtype dt */
static nb_var *nbo_lookup(nb_trace *tr, nb_dtype dt, const double *tab, int n, nb_var *k) {
    nb_var *c = nbo_const(tr, dt, 1, (int64_t[]){n}, tab);
    if (c == NULL) {
        return NULL;
    }
    nb_var *hot = nb_cast(nb_eq(nb_iota(tr, NB_DTYPE_I32, 1, (int64_t[]){n}, 0), k), dt);
    return nb_sum(nb_mul(c, hot), NULL, 0, false);
}

/* a constant [r, c] matrix */
static nb_var *nbo_matrix(nb_trace *tr, nb_dtype dt, int r, int c, const double *v) {
    return nbo_const(tr, dt, 2, (int64_t[]){r, c}, v);
}

/* i32 grids [n, n] of row and column indices */
static void nbo_grid(nb_trace *tr, int n, nb_var **I, nb_var **J) {
    *I = nb_iota(tr, NB_DTYPE_I32, 2, (int64_t[]){n, n}, 0);
    *J = nb_iota(tr, NB_DTYPE_I32, 2, (int64_t[]){n, n}, 1);
}

/* R(k, factor) of SciPy's compute_R for k = 5, [6, 6]: M[0, j] = 1, M[i, j] = (i - 1 -
 * factor j) / i, R = cumprod(M, axis 0). (The block for order k is its top-left k + 1.) */
static nb_var *nbo_bdf_R(nb_trace *tr, nb_dtype dt, nb_var *factor) {
    nb_var *rows[6];
    nb_var *j = nb_cast(nb_iota(tr, NB_DTYPE_I32, 1, (int64_t[]){6}, 0), dt);
    rows[0] = nb_full(tr, dt, 1, (int64_t[]){6}, 1.0);
    for (int i = 1; i < 6; i++) {
        nb_var *m = nb_div(nb_sub(nb_scalar(tr, (double)(i - 1)), nb_mul(factor, j)),
                           nb_scalar(tr, (double)i));
        rows[i] = nb_mul(rows[i - 1], m);
    }
    return nb_stack(6, rows, 0);
}

/* D [8, N] re-expressed from step hD to h = factor hD at order k */
static nb_var *nbo_bdf_change(nb_trace *tr, nb_var *D, nb_var *k, nb_var *factor) {
    nb_dtype dt = nb_var_dtype(D);
    double u[36];
    for (int j = 0; j < 6; j++) {
        double p = 1.0;
        u[j] = 1.0;
        for (int i = 1; i < 6; i++) {
            p *= (i - 1 - 1.0 * j) / i;
            u[i * 6 + j] = p;
        }
    }
    nb_var *U = nbo_matrix(tr, dt, 6, 6, u), *R = nbo_bdf_R(tr, dt, factor);
    if (U == NULL) {
        return NULL;
    }
    nb_var *I6 = NULL, *J6 = NULL;
    nbo_grid(tr, 6, &I6, &J6);
    nb_var *B = nb_cast(nb_logical_and(nb_le(I6, k), nb_le(J6, k)), dt); /* the k+1 block */
    nb_var *RU = nb_matmul(nb_mul(R, B), nb_mul(U, B));
    /* T = (RU)^T on the block, the identity elsewhere ([8, 8]) */
    nb_var *T6 = nb_pad(nb_transpose(RU, (int[]){1, 0}), (int64_t[]){0, 0}, (int64_t[]){2, 2}, 0.0);
    nb_var *I8 = NULL, *J8 = NULL;
    nbo_grid(tr, NBO_BDF_ROWS, &I8, &J8);
    nb_var *rest = nb_cast(nb_logical_and(nb_eq(I8, J8), nb_gt(I8, k)), dt);
    return nb_matmul(nb_add(T6, rest), D);
}

/* RMS of v / scale (flat [N] each) */
static nb_var *nbo_rms(nb_trace *tr, nb_var *v, nb_var *scale) {
    double n = (double)nb_var_size(v);
    return nb_sqrt(nb_div(nb_sum(nb_square(nb_div(v, scale)), NULL, 0, false),
                          nb_scalar(tr, n > 0 ? n : 1.0)));
}

/* The BDF's step (above) up to the error estimate. In: the carry's BDF state (D, k, neq, hD)
 * and the step t -> tn. Out: y1, the unscaled error estimate err (L leaves each), *ok false
 * when Newton failed, and for nbo_bdf_next: *Dh (D for this h), *d (flat), *iters, *neq_h
 * (steps of one size, reset when h changed). */
static bool nbo_bdf_step(nb_trace *tr, const nb_tree *self, const nbo_cfg *cfg, nb_var *t,
                         nb_var *tn, nb_var *h, const nb_treedef *ydef, int64_t L, nb_var *const *y,
                         const nb_tree *bdf, nb_var **y1, nb_var **err, nb_var **ok, nb_var **Dh,
                         nb_var **d, nb_var **iters, nb_var **neq_h) {
    double sign = cfg->v[CFG_SIGN];
    bool adaptive = cfg->v[CFG_ADAPTIVE] != 0.0;
    nb_dtype dt = nb_var_dtype(t);
    nb_var *D = nb_var_of(tr, nb_tree_child(bdf, 0)), *k = nb_var_of(tr, nb_tree_child(bdf, 1));
    nb_var *neq = nb_var_of(tr, nb_tree_child(bdf, 2)), *hD = nb_var_of(tr, nb_tree_child(bdf, 3));
    /* a new step size: D re-expressed (a change within rounding is none) */
    nb_var *factor = nb_stop_gradient(nb_div(h, hD));
    nb_var *same = nb_le(nb_abs(nb_sub(factor, nb_scalar(tr, 1.0))),
                         nb_scalar(tr, dt == NB_DTYPE_F64 ? 1e-12 : 1e-5));
    nb_var *Dc = nbo_bdf_change(tr, D, k, factor);
    if (Dc == NULL) {
        return false;
    }
    *Dh = nb_select(same, D, Dc);
    *neq_h = nb_select(same, neq, nbo_i32(tr, 0));
    /* predictor and psi */
    double g8[NBO_BDF_ROWS] = {0};
    for (int j = 1; j <= 5; j++) {
        g8[j] = nbo_bdf_gamma(j);
    }
    double al[6], ec[6];
    for (int j = 0; j < 6; j++) {
        al[j] = j == 0 ? 1.0 : nbo_bdf_alpha(j);
        ec[j] = nbo_bdf_errc(j);
    }
    nb_var *alpha = nbo_lookup(tr, dt, al, 6, k), *gam = nbo_matrix(tr, dt, NBO_BDF_ROWS, 1, g8);
    if (alpha == NULL || gam == NULL) {
        return false;
    }
    nb_var *rows = nb_iota(tr, NB_DTYPE_I32, 2, (int64_t[]){NBO_BDF_ROWS, 1}, 0);
    nb_var *upto = nb_cast(nb_le(rows, k), dt); /* rows 0..k */
    nb_var *ypf = nb_sum(nb_mul(upto, *Dh), (int[]){0}, 1, false);
    nb_var *psif = nb_div(nb_sum(nb_mul(nb_mul(upto, gam), *Dh), (int[]){0}, 1, false), alpha);
    nb_var **yp = nbo_vars(tr, L), **ps = nbo_vars(tr, L), **zi = nbo_vars(tr, L);
    if (yp == NULL || ps == NULL || zi == NULL) {
        return false;
    }
    nbo_unflat(ypf, L, y, yp);
    nbo_unflat(nb_sub(ypf, psif), L, y, ps);
    nb_var *c = nb_div(h, alpha);
    /* the chord Newton iteration: J at (tn, y_p), I - c J factored once */
    nb_var *J = NULL, *T = NULL;
    if (!nbo_jacobian(tr, self, sign, tn, ydef, L, yp, &J, &T)) {
        return false;
    }
    nb_var *eye = nbo_eye(tr, dt, nb_var_dim(J, 0));
    nb_var *lu = nb_lu_factor(nb_sub(eye, nb_mul(c, J)));
    nb_tree *sargs = nbo_stopped(tr, nb_tree_get(self, "args"));
    nb_tree *sself = nbo_stopped(tr, nb_tree_get(self, "self"));
    bool has_e = nbo_has_efn(self);
    nb_tree *seself = has_e ? nbo_stopped(tr, nb_tree_get(self, "eself")) : NULL;
    nb_fn *cf = NULL;
    if (sargs == NULL || sself == NULL || (has_e && seself == NULL) ||
        nb_fn_create(tr->ctx, "diffeqsolve_newton_cond", nbo_newton_cond, NULL, &cf) != NB_OK) {
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        }
        return false;
    }
    double rtol = cfg->v[CFG_RTOL], atol = cfg->v[CFG_ATOL];
    (void)adaptive;
    *ok = nb_scalar_typed(tr, NB_DTYPE_BOOL, 1.0);
    bool good =
        nbo_newton_stage(tr, self, self, sself, sargs, seself, has_e, sign, rtol, atol,
                         NBO_NEWTON_MAX, tn, c, lu, eye, cf, ydef, L, ps, yp, zi, ok, iters);
    nb_fn_destroy(cf);
    if (!good) {
        return false;
    }
    nb_var *zf = nbo_flat(L, zi);
    *d = nb_sub(zf, ypf);
    nb_var *ecv = nbo_lookup(tr, dt, ec, 6, k);
    if (ecv == NULL) {
        return false;
    }
    memcpy(y1, zi, (size_t)L * sizeof *y1);
    nbo_unflat(nb_mul(ecv, *d), L, y, err);
    return tr->status == NB_OK;
}

/* After the step: D updated with d when kept (else Dh), the order and the steps of one size
 * for the carry, and the step-size factor (stopped): order selection after k + 1 steps of
 * one size. scale: atol + rtol max(|y|, |y1|), flat; err_norm: the scaled error norm. */
static bool nbo_bdf_next(nb_trace *tr, nb_var *keep, nb_var *newton_ok, nb_var *Dh, nb_var *d,
                         nb_var *k, nb_var *neq_h, nb_var *iters, nb_var *scale, nb_var *err_norm,
                         nb_var **D_new, nb_var **k_new, nb_var **neq_new, nb_var **factor) {
    nb_dtype dt = nb_var_dtype(Dh);
    int n = NBO_BDF_ROWS;
    nb_var *I = NULL, *J = NULL;
    nbo_grid(tr, n, &I, &J);
    nb_var *one = nbo_i32(tr, 1), *two = nbo_i32(tr, 2);
    nb_var *kp1 = nb_add(k, one), *kp2 = nb_add(k, two);
    /* D_new = A D + b d: rows i <= k: d + sum_{i<=m<=k} D[m]; k+1: d; k+2: d - D[k+1] */
    nb_var *A = nb_logical_and(nb_le(I, k), nb_logical_and(nb_ge(J, I), nb_le(J, k)));
    nb_var *Af = nb_sub(nb_cast(A, dt), nb_cast(nb_logical_and(nb_eq(I, kp2), nb_eq(J, kp1)), dt));
    Af = nb_add(Af, nb_cast(nb_logical_and(nb_gt(I, kp2), nb_eq(I, J)), dt));
    nb_var *rows = nb_iota(tr, NB_DTYPE_I32, 2, (int64_t[]){n, 1}, 0);
    nb_var *b = nb_cast(nb_le(rows, kp2), dt);
    int64_t N = nb_var_size(d);
    nb_var *Dk = nb_add(nb_matmul(Af, Dh), nb_mul(b, nb_reshape(d, 2, (int64_t[]){1, N})));
    *D_new = nb_select(keep, Dk, Dh);

    /* the factor: kept -- 1 until k + 1 steps of one size, then the best order's; rejected --
     * max(0.2, safety err^(-1/(k+1))), 0.5 after a failed Newton iteration. safety is
     * SciPy's 0.9 (2 m + 1) / (2 m + iterations) for its m = 4 iterations at most: the
     * iterations counted up to 4 (this Newton may take up to NBO_NEWTON_MAX) */
    nb_var *it4 = nb_minimum(iters, nbo_i32(tr, 4));
    nb_var *safety = nb_div(nb_scalar(tr, 0.9 * 9.0), nb_add(nb_scalar(tr, 8.0), nb_cast(it4, dt)));
    nb_var *kf = nb_cast(k, dt);
    nb_var *f0 = nb_pow(err_norm, nb_div(nb_scalar(tr, -1.0), nb_add(kf, nb_scalar(tr, 1.0))));
    nb_var *rej = nb_maximum(nb_scalar(tr, 0.2), nb_mul(safety, f0));
    rej = nb_select(newton_ok, rej, nb_scalar_typed(tr, dt, 0.5));
    double ec[7];
    for (int j = 0; j < 6; j++) {
        ec[j] = nbo_bdf_errc(j);
    }
    ec[6] = 0;
    nb_var *ecm = nbo_lookup(tr, dt, ec, 7, nb_maximum(nb_sub(k, one), nbo_i32(tr, 0)));
    nb_var *ecp = nbo_lookup(tr, dt, ec, 7, kp1);
    if (ecm == NULL || ecp == NULL) {
        return false;
    }
    nb_var *row_k = nb_sum(nb_mul(nb_cast(nb_eq(rows, k), dt), Dk), (int[]){0}, 1, false);
    nb_var *row_k2 = nb_sum(nb_mul(nb_cast(nb_eq(rows, kp2), dt), Dk), (int[]){0}, 1, false);
    nb_var *inf = nb_scalar_typed(tr, dt, INFINITY);
    nb_var *nm = nb_select(nb_gt(k, one), nbo_rms(tr, nb_mul(ecm, row_k), scale), inf);
    nb_var *np = nb_select(nb_lt(k, nbo_i32(tr, 5)), nbo_rms(tr, nb_mul(ecp, row_k2), scale), inf);
    /* factors q^(-1/(q+1)) for orders k-1, k, k+1 (a zero norm: inf; inf: 0) */
    nb_var *fm = nb_pow(nm, nb_div(nb_scalar(tr, -1.0), kf));
    nb_var *fp = nb_pow(np, nb_div(nb_scalar(tr, -1.0), nb_add(kf, nb_scalar(tr, 2.0))));
    nb_var *best = nb_maximum(nb_maximum(fm, f0), fp);
    nb_var *dk = nb_select(nb_ge(fm, best), nbo_i32(tr, -1),
                           nb_select(nb_ge(f0, best), nbo_i32(tr, 0), one));
    nb_var *select_now = nb_ge(nb_add(neq_h, one), kp1); /* k + 1 steps of one size */
    nb_var *acc_factor =
        nb_select(select_now, nb_minimum(nb_scalar(tr, 10.0), nb_mul(safety, best)),
                  nb_scalar_typed(tr, dt, 1.0));
    *factor = nb_stop_gradient(nb_select(keep, acc_factor, rej));
    *k_new = nb_select(nb_logical_and(keep, select_now), nb_add(k, dk), k);
    *neq_new =
        nb_select(keep, nb_select(select_now, nbo_i32(tr, 0), nb_add(neq_h, one)), nbo_i32(tr, 0));
    return tr->status == NB_OK;
}

/* ---- events ----------------------------------------------------------------------------- */

/* The conditions (opts.event: self's "evfn", "evself", called on (s tau, y, args)) at
 * (tau, y), as a [n] vector of dtype dt: floats cast, a bool b as b ? 1 : -1. n < 0: any
 * count (*n set); else the count must be n. */
static nb_var *nbo_event_eval(nb_trace *tr, const nb_tree *self, double sign, nb_var *tau,
                              const nb_treedef *ydef, int64_t L, nb_var *const *y, int64_t *n,
                              nb_dtype dt) {
    static const char who[] = "nb_diffeqsolve";
    const char *name = NULL;
    nb_tree *out =
        nbo_call_user(tr, self, "evfn", "evself", "event function", sign, tau, ydef, L, y, &name);
    if (out == NULL) {
        return NULL;
    }
    nb_tree_kind kind = nb_tree_kind_of(out);
    bool seq = kind == NB_TREE_KIND_TUPLE || kind == NB_TREE_KIND_LIST;
    int64_t m = seq ? nb_tree_len(out) : 1;
    nb_var **c = nbo_vars(tr, m > 0 ? m : 1);
    bool ok = c != NULL;
    char sig[64] = "nothing";
    for (int64_t j = 0; ok && j < m; j++) {
        const nb_tree *cj = seq ? nb_tree_child(out, j) : out;
        nb_var *v = nb_tree_kind_of(cj) == NB_TREE_KIND_VAR ? nb_var_of(tr, cj) : NULL;
        if (v == NULL || v->rank != 0 ||
            (!nb_dtype_is_float(v->dtype) && v->dtype != NB_DTYPE_BOOL)) {
            if (v != NULL) {
                nbi_var_sig(sig, sizeof sig, v);
            } else {
                snprintf(sig, sizeof sig, "a %s leaf", nb_tree_kind_name(nb_tree_kind_of(cj)));
            }
            nbi_trace_err(tr, NB_ERR_SHAPE,
                          "%s: the event function '%s' returned %s as condition %lld; each "
                          "condition must be a 0-d float (or bool) var -- return one, or a "
                          "tuple of them",
                          who, name, sig, (long long)j);
            ok = false;
            break;
        }
        c[j] = v->dtype == NB_DTYPE_BOOL
                   ? nb_select(v, nb_scalar_typed(tr, dt, 1.0), nb_scalar_typed(tr, dt, -1.0))
                   : nb_cast(v, dt);
    }
    if (ok && m < 1) {
        ok = false;
        nbi_trace_err(tr, NB_ERR_SHAPE,
                      "%s: the event function '%s' returned an empty %s -- return at least "
                      "one condition",
                      who, name, nb_tree_kind_name(kind));
    }
    nb_tree_destroy(out);
    if (!ok) {
        return NULL;
    }
    if (*n >= 0 && m != *n) {
        nbi_trace_err(tr, NB_ERR_SHAPE,
                      "%s: the event function '%s' returned %lld conditions where %lld were "
                      "expected (opts.n_event_direction, or its first call)",
                      who, name, (long long)m, (long long)*n);
        return NULL;
    }
    *n = m;
    return nb_stack((int)m, c, 0);
}

/* Which conditions fire from a to b ([n] each): a < 0 <= b (rising) or a > 0 >= b (falling),
 * as self's "evdir" allows (0 either, +1 rising, -1 falling). */
static nb_var *nbo_cross(nb_trace *tr, const nb_tree *self, nb_var *a, nb_var *b) {
    const nb_tree *dirs = nb_tree_get(self, "evdir");
    int64_t n = nb_tree_len(dirs);
    nb_var **r = nbo_vars(tr, n), **f = nbo_vars(tr, n);
    if (r == NULL || f == NULL) {
        return NULL;
    }
    for (int64_t j = 0; j < n; j++) {
        double d = 0;
        nb_tree_get_float(nb_tree_child(dirs, j), &d);
        r[j] = nb_scalar_typed(tr, NB_DTYPE_BOOL, d >= 0 ? 1.0 : 0.0);
        f[j] = nb_scalar_typed(tr, NB_DTYPE_BOOL, d <= 0 ? 1.0 : 0.0);
    }
    nb_var *zero = nb_scalar(tr, 0.0);
    nb_var *rise = nb_logical_and(nb_lt(a, zero), nb_ge(b, zero));
    nb_var *fall = nb_logical_and(nb_gt(a, zero), nb_le(b, zero));
    return nb_logical_or(nb_logical_and(rise, nb_stack((int)n, r, 0)),
                         nb_logical_and(fall, nb_stack((int)n, f, 0)));
}

static nb_var *nbo_any(nb_trace *tr, nb_var *mask) {
    return nb_gt(nb_max(nb_cast(mask, NB_DTYPE_I32), NULL, 0, false), nbo_i32(tr, 0));
}

/* The bisection's state from self: the step's dense data ("dd", "ys" for the structure),
 * its start "t" and the event function; all stopped. */
static bool nbo_root_setup(nb_trace *tr, const nb_tree *self, nbo_cfg *cfg, nbo_dense *dd,
                           nb_treedef **ydef) {
    if (!nbo_cfg_read(tr, self, cfg)) {
        return false;
    }
    int64_t L = 0, nv = 0;
    nb_var **ys = nbo_leaves(tr, nb_tree_get(self, "ys"), &L, ydef);
    nb_var **v = ys != NULL ? nbo_leaves(tr, nb_tree_get(self, "dd"), &nv, NULL) : NULL;
    if (v == NULL || !nbo_dense_unpack(tr, cfg->tab, L, v, dd)) {
        nb_treedef_destroy(*ydef);
        *ydef = NULL;
        return false;
    }
    return true;
}

/* y(tau) for the leaves, from the step's dense data (t the step's start) */
static bool nbo_dense_at(nb_trace *tr, const nbo_dense *dd, nb_var *t, nb_var *tau, nb_var **out) {
    nb_var *th = nb_reshape(nb_div(nb_sub(tau, t), dd->h), 2, (int64_t[]){1, 1});
    for (int64_t i = 0; i < dd->L; i++) {
        out[i] = nb_reshape(nbo_dense_eval(tr, dd, i, th), nb_var_rank(dd->y[i]),
                            nb_var_shape(dd->y[i]));
    }
    return tr->status == NB_OK;
}

/* while a condition fires within [lo, hi] and hi - lo > tol */
static nb_status nbo_root_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    double tol = 0, eps = 0;
    nb_tree_get_float(nb_tree_get(self, "etol"), &tol);
    nb_tree_get_float(nb_tree_get(self, "eps"), &eps);
    nb_var *lo = nb_get(tr, args, "[0]"), *hi = nb_get(tr, args, "[1]");
    nb_var *w = nb_sub(hi, lo);
    nb_var *scale = nb_maximum(nb_maximum(nb_abs(lo), nb_abs(hi)), nb_get(tr, self, "hmag"));
    nb_var *tolv = nb_maximum(nb_scalar(tr, tol), nb_mul(scale, nb_scalar(tr, 4.0 * eps)));
    nb_var *fires = nbo_cross(tr, self, nb_get(tr, args, "[2]"), nb_get(tr, args, "[3]"));
    if (fires == NULL) {
        return tr->status;
    }
    return nb_return(nb_logical_and(nbo_any(tr, fires), nb_gt(w, tolv)), out);
}

/* bisection: the half [lo, mid] keeps the bracket when a condition fires in it */
static nb_status nbo_root_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nbo_cfg cfg;
    nbo_dense dd;
    nb_treedef *ydef = NULL;
    if (!nbo_root_setup(tr, self, &cfg, &dd, &ydef)) {
        return tr->status;
    }
    nb_var *lo = nb_get(tr, args, "[0]"), *hi = nb_get(tr, args, "[1]");
    nb_var *clo = nb_get(tr, args, "[2]"), *chi = nb_get(tr, args, "[3]");
    nb_var *mid = nb_add(lo, nb_mul(nb_sub(hi, lo), nb_scalar(tr, 0.5)));
    nb_var **ym = nbo_vars(tr, dd.L);
    int64_t n = nb_var_size(clo);
    nb_var *cm =
        ym != NULL && nbo_dense_at(tr, &dd, nb_get(tr, self, "t"), mid, ym)
            ? nbo_event_eval(tr, self, cfg.v[CFG_SIGN], mid, ydef, dd.L, ym, &n, nb_var_dtype(lo))
            : NULL;
    nb_treedef_destroy(ydef);
    nb_var *left = cm != NULL ? nbo_cross(tr, self, clo, cm) : NULL;
    if (left == NULL) {
        return tr->status;
    }
    nb_var *in_left = nbo_any(tr, left);
    nb_tree *res = nbo_tuple(
        tr, 4,
        (nb_tree *[]){nb_leaf(nb_select(in_left, lo, mid)), nb_leaf(nb_select(in_left, mid, hi)),
                      nb_leaf(nb_select(in_left, clo, cm)), nb_leaf(nb_select(in_left, cm, chi))});
    if (res == NULL) {
        return tr->status;
    }
    *out = nb_tree_retain(res);
    return NB_OK;
}

/* The operand of the event's branches: (t, tn, hi, which, y (the step's start: the state's
 * structure), the step's dense data (nbo_dense_pack's list), the term's args). */
static bool nbo_event_operand(nb_trace *tr, const nb_tree *self, const nb_tree *op, nbo_cfg *cfg,
                              nbo_dense *dd, nb_treedef **ydef) {
    if (!nbo_cfg_read(tr, self, cfg)) {
        return false;
    }
    int64_t L = 0, nv = 0;
    nb_var **ys = nbo_leaves(tr, nb_tree_child(op, 4), &L, ydef);
    nb_var **v = ys != NULL ? nbo_leaves(tr, nb_tree_child(op, 5), &nv, NULL) : NULL;
    if (v == NULL || !nbo_dense_unpack(tr, cfg->tab, L, v, dd)) {
        nb_treedef_destroy(*ydef);
        *ydef = NULL;
        return false;
    }
    return true;
}

/* A condition fired at hi (within 4 ulp): the event time t* = hi with the derivative of the
 * implicit function theorem, dt* = -(dc_j/dp) / (dc_j/dt) along the solution (dc_j/dt by
 * forward mode through the interpolant at hi; a bool condition, or a tangential crossing, has
 * none), and the state there, y(t*). Returns (t*, y(t*)). */
static nb_status nbo_event_hit(nb_trace *tr, const nb_tree *self, const nb_tree *op,
                               nb_tree **out) {
    nbo_cfg cfg;
    nbo_dense dd, dds;
    nb_treedef *ydef = NULL;
    if (!nbo_event_operand(tr, self, op, &cfg, &dd, &ydef)) {
        return tr->status;
    }
    double sign = cfg.v[CFG_SIGN];
    int64_t L = dd.L, n = (int64_t)cfg.v[CFG_N_EVENT];
    nb_var *t = nb_get(tr, op, "[0]"), *hi = nb_stop_gradient(nb_get(tr, op, "[2]"));
    nb_var *j = nb_get(tr, op, "[3]");
    nb_dtype dt = nb_var_dtype(t);
    nb_var *onehot = nb_cast(nb_eq(nb_iota(tr, NB_DTYPE_I32, 1, (int64_t[]){n}, 0), j), dt);
    /* the conditions read evfn, evself and args: live, and stopped for dc/dt */
    nb_tree *live = NULL, *stopped = NULL, *sev = NULL;
    nb_tree *sargs = nbo_stopped(tr, nb_tree_child(op, 6));
    int64_t nv = 0;
    nb_var **v = nbo_dense_pack(tr, &dd, &nv);
    nb_var **vs = v != NULL ? nbo_vars(tr, nv) : NULL;
    nb_var **yh = nbo_vars(tr, L), **yl = nbo_vars(tr, L), **ye = nbo_vars(tr, L);
    bool ok = sargs != NULL && vs != NULL && yh != NULL && yl != NULL && ye != NULL &&
              nb_tree_dict(tr->ctx, 3, (const char *[]){"evfn", "evself", "args"},
                           (nb_tree *[]){(nb_tree *)nb_tree_get(self, "evfn"),
                                         (nb_tree *)nb_tree_get(self, "evself"),
                                         (nb_tree *)nb_tree_child(op, 6)},
                           &live) == NB_OK &&
              nbi_trace_own(tr, live) == NB_OK &&
              (sev = nbo_stopped(tr, nb_tree_get(self, "evself"))) != NULL &&
              nb_tree_dict(tr->ctx, 3, (const char *[]){"evfn", "evself", "args"},
                           (nb_tree *[]){(nb_tree *)nb_tree_get(self, "evfn"), sev, sargs},
                           &stopped) == NB_OK &&
              nbi_trace_own(tr, stopped) == NB_OK;
    for (int64_t i = 0; ok && i < nv; i++) {
        vs[i] = nb_stop_gradient(v[i]);
    }
    ok = ok && nbo_dense_unpack(tr, cfg.tab, L, vs, &dds);
    if (!ok) {
        nb_treedef_destroy(ydef);
        return tr->status != NB_OK ? tr->status
                                   : nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
    }
    nb_var *ts = nb_stop_gradient(t);

    /* dc_j/dt at hi: one tangent sweep on the time through the (stopped) interpolant */
    int32_t begin = tr->g.n_nodes;
    tr->ad_depth++;
    nb_var *cs = nbo_dense_at(tr, &dds, ts, hi, yh)
                     ? nbo_event_eval(tr, stopped, sign, hi, ydef, L, yh, &n, dt)
                     : NULL;
    tr->ad_depth--;
    int32_t end = tr->g.n_nodes;
    nb_var *dc = NULL, *one = nb_scalar_typed(tr, dt, 1.0);
    if (cs == NULL || nbi_jvp_region(tr, begin, end, 1, (nb_var *[]){hi}, (nb_var *[]){one}, 1,
                                     (nb_var *[]){cs}, &dc) != NB_OK) {
        nb_treedef_destroy(ydef);
        return tr->status != NB_OK ? tr->status
                                   : nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
    }
    nb_var *den = nb_sum(nb_mul(dc, onehot), NULL, 0, false);
    nb_var *den_ok = nb_logical_and(nbo_isfinite(den), nb_ne(den, nb_scalar(tr, 0.0)));
    den = nb_stop_gradient(nb_select(den_ok, den, one));

    /* t* = hi - c_j(hi, y(hi; p)) / (dc_j/dt) in its derivative, hi in its value */
    nb_var *cl = nbo_dense_at(tr, &dd, t, hi, yl)
                     ? nbo_event_eval(tr, live, sign, hi, ydef, L, yl, &n, dt)
                     : NULL;
    nb_var *tev = NULL;
    if (cl != NULL) {
        /* a bool condition or a tangential crossing (dc/dt 0 or not finite): no derivative */
        nb_var *cj = nb_select(den_ok, nb_sum(nb_mul(cl, onehot), NULL, 0, false),
                               nb_scalar_typed(tr, dt, 0.0));
        tev = nbi_implicit(hi, nb_sub(hi, nb_div(cj, den)));
    }
    nb_tree *ytree =
        tev != NULL && nbo_dense_at(tr, &dd, t, tev, ye) ? nbo_build(tr, ydef, L, ye) : NULL;
    nb_treedef_destroy(ydef);
    nb_tree *res = ytree != NULL ? nbo_tuple(tr, 2, (nb_tree *[]){nb_leaf(tev), ytree}) : NULL;
    if (res == NULL) {
        return tr->status != NB_OK ? tr->status : NB_ERR_OOM;
    }
    *out = nb_tree_retain(res);
    return NB_OK;
}

/* No condition fired: (tn, y1), of the hit's structure (the caller selects them away). */
static nb_status nbo_event_miss(nb_trace *tr, const nb_tree *self, const nb_tree *op,
                                nb_tree **out) {
    nbo_cfg cfg;
    nbo_dense dd;
    nb_treedef *ydef = NULL;
    if (!nbo_event_operand(tr, self, op, &cfg, &dd, &ydef)) {
        return tr->status;
    }
    nb_tree *ytree = nbo_build(tr, ydef, dd.L, dd.y1);
    nb_treedef_destroy(ydef);
    nb_tree *res = ytree != NULL
                       ? nbo_tuple(tr, 2, (nb_tree *[]){nb_leaf(nb_get(tr, op, "[1]")), ytree})
                       : NULL;
    if (res == NULL) {
        return tr->status != NB_OK ? tr->status : NB_ERR_OOM;
    }
    *out = nb_tree_retain(res);
    return NB_OK;
}

/* The event in one step from (t, y) to (tn, y1), kept or not: c0 the conditions at t (the
 * carry's), dd the step's dense data. Out: *c1 the conditions at tn; *fired (0-d bool: a
 * condition fires in this kept step); *which (i32: the first to fire, lowest index); *t_hit
 * the bracket's far end (stopped; where saving stops); *t_ev the event time with its
 * derivative (implicit function theorem); y_ev the state there (L leaves). */
static bool nbo_event_step(nb_trace *tr, const nb_tree *self, const nbo_cfg *cfg,
                           const nbo_dense *dd, const nb_treedef *ydef, nb_var *t, nb_var *tn,
                           nb_var *keep, nb_var *c0, nb_var **c1, nb_var **fired, nb_var **which,
                           nb_var **t_hit, nb_var **t_ev, nb_var **y_ev) {
    double sign = cfg->v[CFG_SIGN];
    int64_t L = dd->L, n = (int64_t)cfg->v[CFG_N_EVENT];
    nb_dtype dt = nb_var_dtype(t);
    nb_var *c = nbo_event_eval(tr, self, sign, tn, ydef, L, dd->y1, &n, dt);
    if (c == NULL) {
        return false;
    }
    *c1 = nb_stop_gradient(c);
    /* a rejected step fires nothing: its far end is the start's values */
    nb_var *chi = nb_select(keep, *c1, c0);
    nb_var *fires = nbo_cross(tr, self, c0, chi);
    if (fires == NULL) {
        return false;
    }
    *fired = nbo_any(tr, fires);

    /* the bisection, on stopped data; zero iterations unless a condition fires */
    int64_t nv = 0;
    nb_var **v = nbo_dense_pack(tr, dd, &nv);
    nb_var **vs = nbo_vars(tr, nv), **ys = nbo_vars(tr, L);
    if (v == NULL || vs == NULL || ys == NULL) {
        return false;
    }
    for (int64_t i = 0; i < nv; i++) {
        vs[i] = nb_stop_gradient(v[i]);
    }
    for (int64_t i = 0; i < L; i++) {
        ys[i] = nb_stop_gradient(dd->y[i]);
    }
    nb_tree **vl = nbi_arena_alloc(&tr->arena, (size_t)nv * sizeof *vl);
    if (vl == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return false;
    }
    for (int64_t i = 0; i < nv; i++) {
        vl[i] = nb_leaf(vs[i]);
    }
    nb_var *ts = nb_stop_gradient(t), *tns = nb_stop_gradient(tn), *hs = vs[0];
    double eps = dt == NB_DTYPE_F64 ? 2.220446049250313e-16 : 1.1920928955078125e-7;
    nb_tree *sargs = nbo_stopped(tr, nb_tree_get(self, "args"));
    nb_tree *sev = nbo_stopped(tr, nb_tree_get(self, "evself"));
    nb_tree *ddt = nbo_tuple(tr, nv, vl), *yst = nbo_build(tr, ydef, L, ys);
    nb_tree *rself = NULL;
    nb_fn *cf = NULL, *bf = NULL;
    /* the tolerance's scale includes |h| (a root near t = 0) */
    if (sargs == NULL || sev == NULL || ddt == NULL || yst == NULL ||
        nb_tree_dict(tr->ctx, 11,
                     (const char *[]){"cfg", "evfn", "evself", "args", "evdir", "dd", "ys", "t",
                                      "etol", "eps", "hmag"},
                     (nb_tree *[]){
                         (nb_tree *)nb_tree_get(self, "cfg"), (nb_tree *)nb_tree_get(self, "evfn"),
                         sev, sargs, (nb_tree *)nb_tree_get(self, "evdir"), ddt, yst, nb_leaf(ts),
                         nbo_float(tr, cfg->v[CFG_EVTOL]), nbo_float(tr, eps), nb_leaf(nb_abs(hs))},
                     &rself) != NB_OK ||
        nb_fn_create(tr->ctx, "diffeqsolve_event_cond", nbo_root_cond, rself, &cf) != NB_OK ||
        nb_fn_create(tr->ctx, "diffeqsolve_event", nbo_root_body, rself, &bf) != NB_OK) {
        nb_tree_destroy(rself);
        nb_fn_destroy(cf);
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return false;
    }
    nb_tree_destroy(rself);
    nb_tree *init =
        nbo_tuple(tr, 4, (nb_tree *[]){nb_leaf(ts), nb_leaf(tns), nb_leaf(c0), nb_leaf(chi)});
    nb_loop_opts lo = nb_loop_opts_default();
    lo.max_steps = 200; /* halvings from |h| to 4 ulp of t: ~55 in f64 */
    const nb_tree *fin = init != NULL ? nb_while_loop(tr, cf, bf, init, &lo) : NULL;
    nb_fn_destroy(cf);
    nb_fn_destroy(bf);
    if (fin == NULL) {
        return false;
    }
    nb_var *hi = nb_stop_gradient(nb_get(tr, fin, "[1]"));
    nb_var *last = nbo_cross(tr, self, nb_get(tr, fin, "[2]"), nb_get(tr, fin, "[3]"));
    if (last == NULL) {
        return false;
    }
    nb_var *j = nb_cast(nb_argmax(nb_cast(last, NB_DTYPE_I32), 0, false), NB_DTYPE_I32);
    *which = j;
    *t_hit = nb_select(*fired, hi, tn);

    /* the event time's derivative and the state there: only in the step where one fires */
    nb_tree *ddl = NULL, *ytl = nbo_build(tr, ydef, L, dd->y), *bs = NULL;
    {
        nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)nv * sizeof *items);
        if (items == NULL) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
            return false;
        }
        for (int64_t i = 0; i < nv; i++) {
            items[i] = nb_leaf(v[i]);
        }
        ddl = nbo_tuple(tr, nv, items);
    }
    nb_tree *operand =
        ddl != NULL && ytl != NULL
            ? nbo_tuple(tr, 7,
                        (nb_tree *[]){nb_leaf(t), nb_leaf(tn), nb_leaf(hi), nb_leaf(j), ytl, ddl,
                                      (nb_tree *)nb_tree_get(self, "args")})
            : NULL;
    nb_fn *hit = NULL, *miss = NULL;
    if (operand == NULL ||
        nb_tree_dict(tr->ctx, 4, (const char *[]){"cfg", "evfn", "evself", "evdir"},
                     (nb_tree *[]){(nb_tree *)nb_tree_get(self, "cfg"),
                                   (nb_tree *)nb_tree_get(self, "evfn"),
                                   (nb_tree *)nb_tree_get(self, "evself"),
                                   (nb_tree *)nb_tree_get(self, "evdir")},
                     &bs) != NB_OK ||
        nb_fn_create(tr->ctx, "diffeqsolve_event_hit", nbo_event_hit, bs, &hit) != NB_OK ||
        nb_fn_create(tr->ctx, "diffeqsolve_event_miss", nbo_event_miss, bs, &miss) != NB_OK) {
        nb_tree_destroy(bs);
        nb_fn_destroy(hit);
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        }
        return false;
    }
    nb_tree_destroy(bs);
    const nb_tree *r = nb_cond(tr, *fired, hit, miss, operand);
    nb_fn_destroy(hit);
    nb_fn_destroy(miss);
    if (r == NULL) {
        return false;
    }
    *t_ev = nb_get(tr, r, "[0]");
    int64_t Lr = 0;
    nb_var **yr = nbo_leaves(tr, nb_tree_child(r, 1), &Lr, NULL);
    if (yr == NULL) {
        return false;
    }
    memcpy(y_ev, yr, (size_t)L * sizeof *y_ev);
    return true;
}

/* The step body. self: fn, self, args (the term), cfg, ts (internal save times or null). */

/* The solve's loop goes on: t < t1, result successful, no event fired (args: the carry;
 * the loop's cond, and a step's test that it is really taken). */
static nb_var *nbo_running(nb_trace *tr, nb_var *t, nb_var *t1v, const nb_tree *args) {
    nb_var *go = nb_logical_and(nb_lt(t, t1v), nb_eq(nb_get(tr, args, "[6]"), nbo_i32(tr, 0)));
    return nb_logical_and(go, nb_lt(nb_get(tr, args, "[13]"), nbo_i32(tr, 0)));
}

static nb_status nbo_step_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nbo_cfg cfg;
    if (!nbo_cfg_read(tr, self, &cfg)) {
        return tr->status;
    }
    const nbo_tableau *tab = cfg.tab;
    double sign = cfg.v[CFG_SIGN], tau1 = cfg.v[CFG_T1];
    bool adaptive = cfg.v[CFG_ADAPTIVE] != 0.0;
    int saveat = (int)cfg.v[CFG_SAVEAT];
    /* The times carry no derivative: t0, t1, dt0 and the save times' grid are constants
     * (nb_ode_opts), so a cotangent of t or tn only ever flows back into earlier times and
     * ends at those constants. Stopped here, the step's vjp computes none of it -- not the
     * controller's pow that the next step's landing test needs, nor the time chain -- and
     * every other cotangent keeps its bits. */
    bool traced = cfg.v[CFG_TRACED] != 0.0;
    nb_var *t = nb_get(tr, args, "[0]"), *tn = nb_get(tr, args, "[1]");
    if (!traced) {
        t = nb_stop_gradient(t);
        tn = nb_stop_gradient(tn);
    }
    nb_dtype dt = nb_var_dtype(t);
    int64_t L = 0, Lf = 0;
    nb_treedef *ydef = NULL;
    nb_var **y = nbo_leaves(tr, nb_tree_child(args, 2), &L, &ydef);
    nb_var **fy = y != NULL ? nbo_leaves(tr, nb_tree_child(args, 3), &Lf, NULL) : NULL;
    if (fy == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }
    nb_var *steps = nb_get(tr, args, "[4]"), *acc = nb_get(tr, args, "[5]");
    nb_var *result = nb_get(tr, args, "[6]");
    nb_var *pie = nb_get(tr, args, "[7]"), *ppie = nb_get(tr, args, "[8]");
    nb_var *at_dtmin = nb_get(tr, args, "[10]"), *at_dtmin_new = at_dtmin;
    /* A finished lane of a batched solve (vmap) runs the step with its result discarded, its
     * h 0 (t = t1). A step of 0 would divide by it (the Newton matrix I / (h gamma) - J,
     * the dense output) and give infinities whose zero cotangents are NaN (0 * inf) through
     * reverse mode: there -- h 0 and the loop's cond false, never in a step that is taken
     * (a first step too small to move t still fails with dt_underflow) -- the step is 2^-20
     * max(|t|, 1) instead. Elsewhere h is h, bits and derivatives alike. */
    nb_var *h = nb_sub(tn, t);
    {
        nb_var *t1c = traced ? nb_get(tr, self, "t1") : nb_scalar_typed(tr, dt, tau1);
        nb_var *go = nbo_running(tr, t, t1c, args);
        nb_var *hz = nb_logical_and(nb_eq(h, nb_scalar_typed(tr, dt, 0.0)), nb_logical_not(go));
        nb_var *hs = nb_mul(nb_maximum(nb_abs(t), nb_scalar_typed(tr, dt, 1.0)),
                            nb_scalar_typed(tr, dt, 0x1p-20)); /* time runs forwards inside */
        h = nb_select(hz, nb_stop_gradient(hs), h);
    }

    /* stages: k[0] = fy; k[stages] (non-FSAL) = f(tn, y1); extra dense stages after it */
    int S = tab->dense_stages > tab->stages ? tab->dense_stages : tab->stages;
    int nk = S + 1;
    nb_var ***k = nbi_arena_alloc(&tr->arena, (size_t)nk * sizeof *k);
    nb_var **y1 = nbo_vars(tr, L), **f1 = NULL, **tmp = nbo_vars(tr, L);
    if (k == NULL || y1 == NULL || tmp == NULL) {
        nb_treedef_destroy(ydef);
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
    }
    k[0] = fy;
    bool ok = true;
    int s = tab->stages;
    nb_var **stiff_u = NULL;
    const nbo_rosen *R = tab->ros;
    nb_var **rerr = NULL, **RK[3] = {NULL, NULL, NULL};
    const nbo_dirk *D = tab->dirk;
    nb_var *newton_ok = NULL, **dirk_k = NULL;
    nb_var *bdf_Dh = NULL, *bdf_d = NULL, *bdf_iters = NULL, *bdf_neq = NULL; /* the BDF's */
    nb_var *bdf_D = NULL, *bdf_kold = NULL;
    nb_tree *bdf_new = (nb_tree *)nb_tree_child(args, 14);
    if (D != NULL) {
        /* Newton's tolerances: the controller's; with constant steps (no tolerances) far
         * below the method's error, so that the iteration never limits the order */
        double newton_rtol = cfg.v[CFG_RTOL], newton_atol = cfg.v[CFG_ATOL];
        int newton_maxit = NBO_NEWTON_MAX;
        if (!adaptive) {
            newton_rtol = newton_atol = dt == NB_DTYPE_F64 ? 1e-12 : 1e-5;
            newton_maxit = 30; /* a chord iteration to that depth: more iterations */
        }
        rerr = nbo_vars(tr, L);
        f1 = nbo_vars(tr, L);
        ok = rerr != NULL && f1 != NULL &&
             nbo_dirk_step(tr, self, sign, D, newton_rtol, newton_atol, newton_maxit, t, tn, h,
                           ydef, L, y, fy, y1, rerr, f1, &dirk_k, &newton_ok);
        s = 0;
    } else if (R != NULL) {
        /* a Rosenbrock step, then f(tn, y1): the next step's first right-hand side and the
         * Hermite interpolant's end slope */
        rerr = nbo_vars(tr, L);
        f1 = nbo_vars(tr, L);
        if (R->ros23) { /* f(tn, y1) is its own third stage */
            ok = rerr != NULL && f1 != NULL &&
                 nbo_ros23_step(tr, self, sign, R, t, tn, h, ydef, L, y, fy, y1, rerr, f1, RK);
        } else {
            ok = rerr != NULL && f1 != NULL &&
                 nbo_ros_step(tr, self, sign, R, t, h, ydef, L, y, fy, y1, rerr, RK) &&
                 nbo_term(tr, self, sign, tn, ydef, L, y1, f1);
        }
        s = 0; /* no explicit stages below */
    } else if (tab->bdf) {
        rerr = nbo_vars(tr, L);
        ok = rerr != NULL &&
             nbo_bdf_step(tr, self, &cfg, t, tn, h, ydef, L, y, nb_tree_child(args, 14), y1, rerr,
                          &newton_ok, &bdf_Dh, &bdf_d, &bdf_iters, &bdf_neq);
        f1 = (nb_var **)fy; /* the carry's f(t, y): unused by the BDF */
        s = 0;
    }
    for (int i = 1; i < s && ok; i++) {
        k[i] = nbo_vars(tr, L);
        nbo_combine(tr, L, y, h, i, (nb_var *const *const *)k, tab->a + (size_t)i * S, tmp);
        bool last_fsal = tab->fsal && i == s - 1;
        nb_var *ti =
            last_fsal || tab->c[i] == 1.0 ? tn : nb_add(t, nb_mul(h, nb_scalar(tr, tab->c[i])));
        if (last_fsal) {
            memcpy(y1, tmp, (size_t)L * sizeof *y1);
        }
        ok = k[i] != NULL && nbo_term(tr, self, sign, ti, ydef, L, tmp, k[i]);
        if (tab->fsal && i == s - 2) {
            stiff_u = tmp; /* the argument of the stage before the last */
        }
        tmp = nbo_vars(tr, L);
        ok = ok && tmp != NULL;
    }
    if (R != NULL || D != NULL || tab->bdf) {
        /* done above */
    } else if (ok && tab->fsal) {
        f1 = k[s - 1];
    } else if (ok) {
        nbo_combine(tr, L, y, h, s, (nb_var *const *const *)k, tab->b, y1);
        f1 = nbo_vars(tr, L);
        ok = f1 != NULL && nbo_term(tr, self, sign, tn, ydef, L, y1, f1);
        k[s] = f1;
    }
    if (!ok) {
        nb_treedef_destroy(ydef);
        return tr->status != NB_OK ? tr->status : NB_ERR_OOM;
    }

    /* accept or reject, and the next step */
    nb_var *keep, *tn_new, *res_new = result, *pie_new = pie, *ppie_new = ppie;
    nb_var *t_new;
    /* this step's state or slope is not finite: with an error estimate, a non-finite
     * estimate says so (every stage but heun/midpoint/ralston's f(tn, y1) enters it: a NaN
     * there is caught by the next step's estimate); with constant steps, y1 and f1 are
     * checked */
    nb_var *bad_state = NULL;
    if (!adaptive) {
        nb_var *fin = NULL;
        for (int64_t i = 0; i < L; i++) {
            nb_var *a = nbo_isfinite(nb_sum(nb_add(y1[i], f1[i]), NULL, 0, false));
            fin = fin == NULL ? a : nb_logical_and(fin, a);
        }
        bad_state = fin == NULL ? nb_scalar_typed(tr, NB_DTYPE_BOOL, 0) : nb_logical_not(fin);
    }
    if (adaptive) {
        double rtol = cfg.v[CFG_RTOL], atol = cfg.v[CFG_ATOL];
        nb_var *sq = NULL;
        double count = 0.0;
        for (int64_t i = 0; i < L; i++) {
            nb_var *err = NULL;
            for (int j = 0; j < s; j++) {
                if (tab->e[j] == 0.0) {
                    continue;
                }
                nb_var *term = nb_mul(k[j][i], nb_scalar(tr, tab->e[j]));
                err = err == NULL ? term : nb_add(err, term);
            }
            err = R != NULL || D != NULL || tab->bdf ? rerr[i] : nb_mul(h, err);
            nb_var *scale =
                nb_add(nb_scalar(tr, atol),
                       nb_mul(nb_scalar(tr, rtol), nb_maximum(nb_abs(y[i]), nb_abs(y1[i]))));
            nb_var *q = nb_sum(nb_square(nb_div(err, scale)), NULL, 0, false);
            sq = sq == NULL ? q : nb_add(sq, q);
            count += (double)nb_var_size(y[i]);
        }
        /* the controller is not differentiated (as Diffrax): nor is the error that drives it
         * -- sqrt'(0) and 1/0 would make 0 * inf = NaN cotangents when the error is 0 */
        nb_var *scaled =
            nb_stop_gradient(nb_sqrt(nb_div(sq, nb_scalar(tr, count > 0 ? count : 1.0))));
        nb_var *finite = nbo_isfinite(scaled);
        bad_state = nb_logical_not(finite);
        scaled = nb_select(finite, scaled, nb_scalar_typed(tr, dt, INFINITY));
        if (newton_ok != NULL) { /* a failed Newton iteration rejects the step */
            scaled = nb_select(newton_ok, scaled, nb_scalar_typed(tr, dt, INFINITY));
        }
        keep = nb_lt(scaled, nb_scalar(tr, 1.0));
        double dtmin = cfg.v[CFG_DTMIN], dtmax = cfg.v[CFG_DTMAX];
        bool force = cfg.v[CFG_FORCE_DTMIN] != 0.0;
        if (dtmin > 0 && force) {
            keep = nb_logical_or(keep, at_dtmin); /* the step was proposed at dtmin */
            if (newton_ok != NULL) {              /* ... but never a step whose Newton failed */
                keep = nb_logical_and(keep, newton_ok);
            }
        }
        nb_var *inv = nb_div(nb_scalar(tr, 1.0), scaled);
        double order = tab->error_order > 0 ? tab->error_order : 1;
        double pc = cfg.v[CFG_PCOEFF], ic = cfg.v[CFG_ICOEFF], dc = cfg.v[CFG_DCOEFF];
        double c1 = (ic + pc + dc) / order, c2 = -(pc + 2.0 * dc) / order, c3 = dc / order;
        nb_var *factor = nb_scalar(tr, cfg.v[CFG_SAFETY]);
        if (c1 != 0.0) {
            factor = nb_mul(factor, nb_pow(inv, nb_scalar(tr, c1)));
        }
        if (c2 != 0.0) {
            factor = nb_mul(factor, nb_pow(pie, nb_scalar(tr, c2)));
        }
        if (c3 != 0.0) {
            factor = nb_mul(factor, nb_pow(ppie, nb_scalar(tr, c3)));
        }
        nb_var *fmin = nb_select(keep, nb_scalar_typed(tr, dt, 1.0),
                                 nb_scalar_typed(tr, dt, cfg.v[CFG_FACTORMIN]));
        factor = nb_minimum(nb_maximum(factor, fmin), nb_scalar(tr, cfg.v[CFG_FACTORMAX]));
        factor = nb_stop_gradient(factor);
        if (tab->bdf) { /* its own factor and order, and its history for the next step */
            nb_var **sc = nbo_vars(tr, L), *Dn = NULL, *kn = NULL, *nq = NULL;
            for (int64_t i = 0; sc != NULL && i < L; i++) {
                sc[i] =
                    nb_add(nb_scalar(tr, atol),
                           nb_mul(nb_scalar(tr, rtol), nb_maximum(nb_abs(y[i]), nb_abs(y1[i]))));
            }
            nb_var *kcur = nb_get(tr, args, "[14][1]");
            if (sc == NULL ||
                !nbo_bdf_next(tr, keep, newton_ok, bdf_Dh, bdf_d, kcur, bdf_neq, bdf_iters,
                              nbo_flat(L, sc), scaled, &Dn, &kn, &nq, &factor)) {
                nb_treedef_destroy(ydef);
                return tr->status != NB_OK ? tr->status : NB_ERR_OOM;
            }
            bdf_new = nbo_tuple(
                tr, 4,
                (nb_tree *[]){nb_leaf(Dn), nb_leaf(kn), nb_leaf(nq), nb_leaf(nb_stop_gradient(h))});
            bdf_D = Dn;
            bdf_kold = kcur;
        }
        nb_var *dtn = nb_mul(h, factor);
        if (dtmin > 0) {
            if (!force) {
                nb_var *why = nbo_i32(tr, NB_ODE_DT_UNDERFLOW);
                if (newton_ok != NULL) { /* the step shrank because Newton failed */
                    why = nb_select(newton_ok, why, nbo_i32(tr, NB_ODE_NEWTON_FAILED));
                }
                res_new = nb_select(nb_lt(dtn, nb_scalar(tr, dtmin)), why, res_new);
            }
            at_dtmin_new = nb_le(dtn, nb_scalar(tr, dtmin));
            dtn = nb_maximum(dtn, nb_scalar(tr, dtmin));
        }
        if (dtmax > 0) {
            dtn = nb_minimum(dtn, nb_scalar(tr, dtmax));
        }
        t_new = nb_select(keep, tn, t);
        tn_new = nb_add(t_new, nb_stop_gradient(dtn));
        /* a zero or infinite error is remembered as 1 (as Diffrax): the P and D terms of the
         * next factors stay finite */
        nb_var *inv_keep = nb_select(
            nb_logical_or(nb_eq(inv, nb_scalar(tr, 0.0)), nb_logical_not(nbo_isfinite(inv))),
            nb_scalar_typed(tr, dt, 1.0), inv);
        pie_new = nb_select(keep, inv_keep, pie);
        ppie_new = nb_select(keep, pie, ppie);
    } else {
        keep = nb_logical_not(bad_state);
        if (newton_ok != NULL) { /* constant steps cannot shrink: a failed Newton ends it (a
                                    singular Newton matrix makes the state NaN as well: the
                                    Newton failure is the cause reported) */
            keep = nb_logical_and(keep, newton_ok);
            res_new =
                nb_select(nb_logical_not(newton_ok), nbo_i32(tr, NB_ODE_NEWTON_FAILED), res_new);
        }
        res_new = nb_select(nb_logical_and(bad_state, nb_eq(res_new, nbo_i32(tr, 0))),
                            nbo_i32(tr, NB_ODE_NONFINITE), res_new);
        t_new = nb_select(keep, tn, t);
        tn_new = nb_add(t_new, nb_scalar(tr, cfg.v[CFG_DT0]));
    }
    /* Stiffness detection (Hairer-Wanner I, IV.10; DOPRI5's test): for an FSAL method the
     * last two stages are both at t + h, so h |f(y1) - f(u)| / |y1 - u| estimates h |lambda|
     * of the dominant eigenvalue. A kept step past 0.98 of the method's real stability
     * boundary counts; six kept steps in a row below it reset the count; at 15 the step size
     * is being held by stability, not accuracy: stiffness suspected (sticky;
     * stats.stiffness_suspected, and the failure messages name the stiff solvers). The carry
     * holds i32 [count, kept steps below the boundary in a row]. */
    nb_var *stiff = nb_get(tr, args, "[11]"), *stiff_new = stiff;
    if (stiff_u != NULL && adaptive && tab->stiff_bound > 0 && tab->c[s - 2] == 1.0) {
        nb_var *num = NULL, *den = NULL;
        for (int64_t i = 0; i < L; i++) {
            nb_var *a = nb_sum(nb_square(nb_sub(f1[i], k[s - 2][i])), NULL, 0, false);
            nb_var *b = nb_sum(nb_square(nb_sub(y1[i], stiff_u[i])), NULL, 0, false);
            num = num == NULL ? a : nb_add(num, a);
            den = den == NULL ? b : nb_add(den, b);
        }
        nb_var *hl2 = nb_stop_gradient(nb_mul(nb_square(h), num));
        nb_var *over = nb_gt(
            hl2, nb_mul(nb_stop_gradient(den), nb_scalar(tr, tab->stiff_bound * tab->stiff_bound)));
        nb_var *cnt = nb_reshape(nb_slice(stiff, (int64_t[]){0}, (int64_t[]){1}, NULL), 0, NULL);
        nb_var *low = nb_reshape(nb_slice(stiff, (int64_t[]){1}, (int64_t[]){2}, NULL), 0, NULL);
        nb_var *one = nbo_i32(tr, 1), *zero = nbo_i32(tr, 0);
        nb_var *low2 = nb_select(over, zero, nb_add(low, one));
        nb_var *cnt2 =
            nb_select(over, nb_add(cnt, one), nb_select(nb_ge(low2, nbo_i32(tr, 6)), zero, cnt));
        nb_var *live = nb_logical_and(keep, nb_lt(cnt, nbo_i32(tr, 15))); /* 15: sticky */
        cnt2 = nb_select(live, cnt2, cnt);
        low2 = nb_select(live, low2, low);
        stiff_new = nb_concatenate(
            2,
            (nb_var *[]){nb_reshape(cnt2, 1, (int64_t[]){1}), nb_reshape(low2, 1, (int64_t[]){1})},
            0);
    }
    /* land on t1 exactly (Diffrax's tolerance: no sliver of a last step); after a rejected
     * step, halfway there instead (not the same step again) */
    double tol = dt == NB_DTYPE_F64 ? 1e-10 : 1e-6;
    /* traced times: t1 is a var (its derivative reaches the last step through tclip) */
    nb_var *t1v = traced ? nb_get(tr, self, "t1") : nb_scalar_typed(tr, dt, tau1);
    nb_var *tclip =
        nb_select(keep, t1v, nb_add(t_new, nb_mul(nb_scalar(tr, 0.5), nb_sub(t1v, t_new))));
    tn_new = nb_select(nb_gt(tn_new, nb_sub(t1v, nb_scalar(tr, tol))), tclip, tn_new);
    /* a step that no longer moves t: underflow (or a state gone non-finite) */
    nb_var *stuck = nb_logical_and(nb_lt(t_new, t1v), nb_le(tn_new, t_new));
    nb_var *stuck_why = nbo_i32(tr, NB_ODE_DT_UNDERFLOW);
    if (newton_ok != NULL) {
        stuck_why = nb_select(newton_ok, stuck_why, nbo_i32(tr, NB_ODE_NEWTON_FAILED));
    }
    res_new = nb_select(nb_logical_and(stuck, nb_eq(res_new, nbo_i32(tr, 0))),
                        nb_select(bad_state, nbo_i32(tr, NB_ODE_NONFINITE), stuck_why), res_new);

    nb_var **y_new = nbo_vars(tr, L), **fy_new = nbo_vars(tr, L);
    if (y_new == NULL || fy_new == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }
    for (int64_t i = 0; i < L; i++) {
        y_new[i] = nb_select(keep, y1[i], y[i]);
        fy_new[i] = nb_select(keep, f1[i], fy[i]);
    }

    /* the dense output's data, with the extra stages when it is read (SaveAt ts, events) */
    int64_t nev = (int64_t)cfg.v[CFG_N_EVENT];
    nbo_dense dd = {tab, L, h, y, y1, f1, k, {RK[0], RK[1], RK[2]}, dirk_k};
    if (tab->bdf && (saveat == NB_SAVEAT_TS || nev > 0)) {
        /* the step's polynomial: rows 0..k of the updated differences (k: the step's order) */
        dd.k = nbi_arena_alloc(&tr->arena, 6 * sizeof *dd.k);
        nb_var *rows = nb_iota(tr, NB_DTYPE_I32, 2, (int64_t[]){NBO_BDF_ROWS, 1}, 0);
        nb_var *Dm = nb_mul(nb_cast(nb_le(rows, bdf_kold), dt), bdf_D);
        int64_t N = nb_var_dim(Dm, 1);
        for (int j = 0; dd.k != NULL && j < 6; j++) {
            dd.k[j] = nbo_vars(tr, L);
            if (dd.k[j] == NULL) {
                dd.k = NULL;
                break;
            }
            nb_var *row = nb_reshape(nb_slice(Dm, (int64_t[]){j, 0}, (int64_t[]){j + 1, N}, NULL),
                                     1, (int64_t[]){N});
            nbo_unflat(row, L, y, dd.k[j]);
        }
        if (dd.k == NULL) {
            nb_treedef_destroy(ydef);
            return nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        }
    }
    for (int i = (tab->extra_uses_f1 ? s + 1 : s);
         (saveat == NB_SAVEAT_TS || nev > 0) && i < tab->dense_stages && ok; i++) {
        k[i] = nbo_vars(tr, L);
        nbo_combine(tr, L, y, h, i, (nb_var *const *const *)k, tab->a + (size_t)i * S, tmp);
        nb_var *ti = nb_add(t, nb_mul(h, nb_scalar(tr, tab->c[i])));
        ok = k[i] != NULL && nbo_term(tr, self, sign, ti, ydef, L, tmp, k[i]);
        tmp = nbo_vars(tr, L);
        ok = ok && tmp != NULL;
    }
    if (!ok) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }

    /* events: a condition that fires in this kept step ends the solve at its root */
    nb_var *ev = nb_get(tr, args, "[12]"), *ev_new = ev;
    nb_var *event = nb_get(tr, args, "[13]"), *event_new = event;
    nb_var *t_end = tn, *fired = NULL, **y_ev = NULL, *t_ev = NULL;
    if (nev > 0) {
        nb_var *c1 = NULL, *which = NULL;
        y_ev = nbo_vars(tr, L);
        if (y_ev == NULL || !nbo_event_step(tr, self, &cfg, &dd, ydef, t, tn, keep, ev, &c1, &fired,
                                            &which, &t_end, &t_ev, y_ev)) {
            nb_treedef_destroy(ydef);
            return tr->status != NB_OK ? tr->status : NB_ERR_OOM;
        }
        ev_new = nb_select(keep, c1, ev);
        event_new = nb_select(fired, which, event);
        t_new = nb_select(fired, t_ev, t_new);
        for (int64_t i = 0; i < L; i++) {
            y_new[i] = nb_select(fired, y_ev[i], y_new[i]);
        }
    }

    /* saving */
    nb_tree *save = NULL;
    if (saveat == NB_SAVEAT_TS) {
        nb_var *TS = nb_get(tr, self, "ts");
        int64_t n = nb_var_size(TS);
        const nb_tree *sv = nb_tree_child(args, 9);
        nb_var *theta = nb_div(nb_sub(TS, t), h); /* h != 0: see above */
        nb_var *mask = nb_logical_and(keep, nb_logical_and(nb_gt(TS, t), nb_le(TS, t_end)));
        mask = nb_reshape(mask, 2, (int64_t[]){n, 1});
        nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(L > 0 ? L : 1) * sizeof *items);
        if (items == NULL) {
            nb_treedef_destroy(ydef);
            return nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        }
        nb_var *th = nb_reshape(theta, 2, (int64_t[]){n, 1});
        for (int64_t i = 0; i < L; i++) {
            nb_var *val = nbo_dense_eval(tr, &dd, i, th);
            nb_var *old = nb_var_of(tr, nb_tree_child(sv, i));
            items[i] = nb_leaf(nb_select(mask, val, old));
        }
        save = nbo_tuple(tr, L, items);
    } else if (saveat == NB_SAVEAT_STEPS) {
        const nb_tree *sv = nb_tree_child(args, 9);
        nb_var *tsb = nb_var_of(tr, nb_tree_child(sv, 0));
        nb_var *inf = nb_scalar_typed(tr, dt, INFINITY);
        nb_var *zero = nbo_i32(tr, 0);
        nb_var *t_row = fired != NULL ? nb_select(fired, t_ev, tn) : tn;
        nb_var *trow =
            nb_reshape(nb_select(keep, sign < 0 ? nb_neg(t_row) : t_row, inf), 1, (int64_t[]){1});
        nb_tree *ts_item = nb_leaf(nb_dynamic_update_slice(tsb, trow, (nb_var *[]){steps}));
        nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(L > 0 ? L : 1) * sizeof *items);
        if (items == NULL) {
            nb_treedef_destroy(ydef);
            return nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        }
        const nb_tree *ysb = nb_tree_child(sv, 1);
        for (int64_t i = 0; i < L; i++) {
            nb_var *buf = nb_var_of(tr, nb_tree_child(ysb, i));
            int64_t N = nb_var_size(y[i]);
            nb_var *yr = fired != NULL ? nb_select(fired, y_ev[i], y1[i]) : y1[i];
            nb_var *row = nb_reshape(nb_select(keep, yr, inf), 2, (int64_t[]){1, N});
            items[i] = nb_leaf(nb_dynamic_update_slice(buf, row, (nb_var *[]){steps, zero}));
        }
        nb_tree *ys_item = nbo_tuple(tr, L, items);
        save = nbo_tuple(tr, 2, (nb_tree *[]){ts_item, ys_item});
    } else {
        save = nbo_null(tr);
    }

    nb_var *one = nbo_i32(tr, 1);
    nb_tree *ytree = nbo_build(tr, ydef, L, y_new);
    nb_tree *fytree = nbo_build(tr, ydef, L, fy_new);
    nb_treedef_destroy(ydef);
    nb_tree *res = nbo_tuple(
        tr, 15,
        (nb_tree *[]){nb_leaf(t_new), nb_leaf(tn_new), ytree, fytree, nb_leaf(nb_add(steps, one)),
                      nb_leaf(nb_add(acc, nb_cast(keep, NB_DTYPE_I32))), nb_leaf(res_new),
                      nb_leaf(pie_new), nb_leaf(ppie_new), save, nb_leaf(at_dtmin_new),
                      nb_leaf(stiff_new), nb_leaf(ev_new), nb_leaf(event_new), bdf_new});
    if (res == NULL) {
        return tr->status != NB_OK ? tr->status : NB_ERR_OOM;
    }
    *out = nb_tree_retain(res);
    return NB_OK;
}

/* while t < t1 and result == successful */
static nb_status nbo_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    const nb_tree *t1t = nb_tree_get(self, "t1");
    nb_var *t1v;
    if (nb_tree_kind_of(t1t) == NB_TREE_KIND_VAR) { /* traced times */
        t1v = nb_var_of(tr, t1t);
    } else {
        double tau1 = 0.0;
        nb_tree_get_float(t1t, &tau1);
        t1v = nb_scalar(tr, tau1);
    }
    return nb_return(nbo_running(tr, nb_get(tr, args, "[0]"), t1v, args), out);
}

/* ---- compaction of SaveAt steps ------------------------------------------------------- */

/* scan over rows i: idx[count] = i; count += finite(ts[i]). The j-th kept row is idx[j]. */
static nb_status nbo_compact_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    nb_var *count = nb_get(tr, args, "[0][0]"), *idx = nb_get(tr, args, "[0][1]");
    nb_var *i = nb_get(tr, args, "[0][2]");
    nb_var *tsi = nb_get(tr, args, "[1]");
    nb_var *fin = nbo_isfinite(tsi);
    nb_var *idx2 =
        nb_dynamic_update_slice(idx, nb_reshape(i, 1, (int64_t[]){1}), (nb_var *[]){count});
    nb_var *c2 = nb_add(count, nb_cast(fin, NB_DTYPE_I32));
    nb_var *i2 = nb_add(i, nbo_i32(tr, 1));
    nb_tree *carry = nbo_tuple(tr, 3, (nb_tree *[]){nb_leaf(c2), nb_leaf(idx2), nb_leaf(i2)});
    nb_tree *res = carry != NULL ? nbo_tuple(tr, 2, (nb_tree *[]){carry, nbo_null(tr)}) : NULL;
    if (res == NULL) {
        return tr->status;
    }
    *out = nb_tree_retain(res);
    return NB_OK;
}

/* ---- throw_on_failure: the message of a failed solve ------------------------------------ */

/* vals: t reached, result, max_steps, t1 (external times) */
static void nbo_fail_msg(char *buf, size_t cap, const double *v) {
    int r = (int)v[1];
    bool stiff = v[2] != 0;
    const char *fix =
        stiff ? "stiffness suspected: the step size was held by stability, not accuracy, on "
                "15 steps in a row -- use a stiff solver (NB_ODE_KVAERNO5, NB_ODE_RODAS5P, "
                "NB_ODE_KVAERNO3, NB_ODE_ROS3P)"
        : r == NB_ODE_MAX_STEPS_REACHED
            ? "raise max_steps, loosen rtol/atol, or check whether the problem is stiff there"
        : r == NB_ODE_DT_UNDERFLOW ? "the step size fell below dtmin or to the resolution of t: "
                                     "the problem may be stiff or singular there"
        : r == NB_ODE_NEWTON_FAILED
            ? "the implicit solver's Newton iteration failed even at the smallest step: check "
              "the vector field's Jacobian there (singular or not finite), or lower dtmin"
            : "the state or its derivative became NaN or infinite: check the vector field there";
    snprintf(buf, cap,
             "nb_diffeqsolve: the solve stopped at t = %.17g before t1 = %.17g: %s (max_steps "
             "%.0f) -- %s; or set throw_on_failure = false and read the solution's result",
             v[0], v[4], nb_ode_result_string(r), v[3], fix);
}

/* the same for a continuous adjoint's own solve (from t1 back to t0); v[4] its kind */
static void nbo_fail_msg_adjoint(char *buf, size_t cap, const double *v) {
    bool bs = v[4] == NB_ADJOINT_BACKSOLVE;
    snprintf(buf, cap,
             "nb_diffeqsolve: the %s adjoint's solve (from t1 back to t0) stopped at t = %.17g "
             "before t0 = %.17g: %s (max_steps %.0f) -- raise max_steps, loosen the adjoint's "
             "tolerances (nb_ode_adjoint.controller), %sor use the recursive checkpoint adjoint",
             bs ? "backsolve" : "interpolating", v[0], v[3], nb_ode_result_string((int)v[1]), v[2],
             bs ? "for a stiff problem use the interpolating adjoint, " : "");
}

/* traced times that do not fit: vals t0, t1, first ts, last ts, the static direction */
static void nbo_times_msg(char *buf, size_t cap, const double *v) {
    snprintf(buf, cap,
             "nb_diffeqsolve: traced times t0 = %.17g, t1 = %.17g (SaveAt ts from %.17g to "
             "%.17g) do not fit: the solve goes %s (the direction of the static t0, t1), so t1 "
             "must be %s t0 and the ts sorted within [t0, t1], all finite -- pass times in that "
             "order, or set the static t0, t1 to give the direction",
             v[0], v[1], v[2], v[3], v[4] > 0 ? "forwards" : "backwards", v[4] > 0 ? ">=" : "<=");
}

/* ---- nb_diffeqsolve ----------------------------------------------------------------- */

static bool nbo_check_opts(nb_trace *tr, const nb_ode_opts *o) {
    static const char who[] = "nb_diffeqsolve";
    const nbo_tableau *tab = nbo_tableau_get((int)o->solver);
    const nb_ode_controller *c = &o->controller;
    double dir = o->t1 >= o->t0 ? 1.0 : -1.0;
    /* the continuous adjoints (a custom_vjp around a forward-only solve) */
    bool cont =
        o->adjoint.kind == NB_ADJOINT_BACKSOLVE || o->adjoint.kind == NB_ADJOINT_INTERPOLATED;
    const char *aname = o->adjoint.kind == NB_ADJOINT_BACKSOLVE ? "backsolve" : "interpolating";
    if (tab == NULL) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: unknown solver %d -- use an nb_ode_solver value",
                      who, (int)o->solver);
        return false;
    }
    if (!isfinite(o->t0) || !isfinite(o->t1) || !isfinite(o->dt0)) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: t0 = %g, t1 = %g, dt0 = %g must be finite", who,
                      o->t0, o->t1, o->dt0);
        return false;
    }
    if (o->max_steps < 1) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: max_steps = %lld must be >= 1", who,
                      (long long)o->max_steps);
        return false;
    }
    if (o->dt0 != 0.0 && o->dt0 * dir < 0 && o->t0 != o->t1) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: dt0 = %g points away from t1 = %g (t0 = %g) -- give dt0 with the sign "
                      "of t1 - t0",
                      who, o->dt0, o->t1, o->t0);
        return false;
    }
    if (c->adaptive) {
        if (tab->e == NULL && tab->ros == NULL && tab->dirk == NULL && !tab->bdf) {
            nbi_trace_err(tr, NB_ERR_INVALID,
                          "%s: solver %s has no error estimate, so it cannot be used with an "
                          "adaptive controller -- use constant steps (nb_ode_constant_step) or "
                          "a solver with one (heun, bosh3, dopri5, tsit5, dopri8, ros3p, rodas5p)",
                          who, tab->name);
            return false;
        }
        if (!(c->rtol >= 0) || !(c->atol >= 0) || c->rtol + c->atol <= 0 || !isfinite(c->rtol) ||
            !isfinite(c->atol)) {
            nbi_trace_err(tr, NB_ERR_INVALID,
                          "%s: rtol = %g, atol = %g: both must be >= 0 and finite, and one > 0",
                          who, c->rtol, c->atol);
            return false;
        }
        /* the first rule that fails, by name, with the value and what it must be */
        const char *bad = NULL;
        double val = 0;
        if (!(c->factormin > 0 && c->factormin <= 1)) {
            bad = "factormin must be in (0, 1]";
            val = c->factormin;
        } else if (!(c->factormax >= 1) || isnan(c->factormax)) {
            bad = "factormax must be >= 1";
            val = c->factormax;
        } else if (!(c->safety > 0) || !isfinite(c->safety)) {
            bad = "safety must be > 0 and finite";
            val = c->safety;
        } else if (!(c->dtmin >= 0) || !isfinite(c->dtmin)) {
            bad = "dtmin must be >= 0 and finite (0: none)";
            val = c->dtmin;
        } else if (!(c->dtmax >= 0) || isnan(c->dtmax)) {
            bad = "dtmax must be >= 0 (0: none)";
            val = c->dtmax;
        } else if (c->dtmax != 0 && c->dtmax < c->dtmin) {
            bad = "dtmax must be >= dtmin (or 0: none)";
            val = c->dtmax;
        }
        if (bad != NULL) {
            nbi_trace_err(tr, NB_ERR_INVALID,
                          "%s: the controller's %s, got %g (factormin %g, factormax %g, safety "
                          "%g, dtmin %g, dtmax %g)",
                          who, bad, val, c->factormin, c->factormax, c->safety, c->dtmin, c->dtmax);
            return false;
        }
    } else if (tab->bdf) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: the BDF chooses its own step sizes and orders -- give it an adaptive "
                      "controller (nb_ode_pid), not constant steps",
                      who);
        return false;
    } else if (o->dt0 == 0.0 && o->t0 != o->t1) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: constant steps need dt0 != 0 -- give dt0, or use an adaptive "
                      "controller (nb_ode_pid) that can choose the first step",
                      who);
        return false;
    }
    /* traced times: vars of this trace, 0-d floats (t0, t1) and a rank-1 float (ts) */
    nb_var *const tv[3] = {o->t0_traced, o->t1_traced, o->ts_traced};
    static const char *const tn[3] = {"t0_traced", "t1_traced", "ts_traced"};
    for (int i = 0; i < 3; i++) {
        char sig[64];
        if (tv[i] == NULL) {
            continue;
        }
        if (nb_var_is_poison(tv[i])) {
            return false;
        }
        if (tv[i]->tr != tr) {
            nbi_trace_err(tr, NB_ERR_INVALID,
                          "%s: opts.%s belongs to another trace -- pass a var of the trace the "
                          "solve is traced in",
                          who, tn[i]);
            return false;
        }
        if (!nb_dtype_is_float(tv[i]->dtype) || tv[i]->rank != (i == 2 ? 1 : 0)) {
            nbi_trace_err(tr, NB_ERR_SHAPE, "%s: opts.%s is %s; it must be a %s float var", who,
                          tn[i], nbi_var_sig(sig, sizeof sig, tv[i]),
                          i == 2 ? "rank-1 (the n_ts save times)" : "0-d");
            return false;
        }
    }
    if (o->ts_traced != NULL && o->saveat.kind != NB_SAVEAT_TS) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: opts.ts_traced is set but saveat.kind is not NB_SAVEAT_TS -- set "
                      "saveat.kind = NB_SAVEAT_TS (the traced ts replace saveat.ts)",
                      who);
        return false;
    }
    if (o->explicit_term != NULL && cont) {
        nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                      "%s: opts.explicit_term with the %s adjoint is not supported -- use "
                      "the recursive checkpoint or direct adjoint",
                      who, aname);
        return false;
    }
    if ((o->t0_traced != NULL || o->t1_traced != NULL || o->ts_traced != NULL) && cont) {
        nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                      "%s: traced times with the %s adjoint are not supported -- use the "
                      "recursive checkpoint or direct adjoint, or static times",
                      who, aname);
        return false;
    }
    if (o->saveat.kind == NB_SAVEAT_TS && o->ts_traced != NULL) {
        if (nb_var_dim(o->ts_traced, 0) < 1) {
            nbi_trace_err(tr, NB_ERR_INVALID, "%s: SaveAt ts needs n_ts >= 1 times (got 0)", who);
            return false;
        }
    } else if (o->saveat.kind == NB_SAVEAT_TS) {
        if (o->saveat.n_ts < 1) {
            nbi_trace_err(tr, NB_ERR_INVALID, "%s: SaveAt ts needs n_ts >= 1 times (got %lld)", who,
                          (long long)o->saveat.n_ts);
            return false;
        }
        if (o->saveat.ts == NULL) {
            nbi_trace_err(tr, NB_ERR_MISUSE,
                          "%s: SaveAt ts is NULL with n_ts = %lld -- point saveat.ts at %lld "
                          "times (they are copied)",
                          who, (long long)o->saveat.n_ts, (long long)o->saveat.n_ts);
            return false;
        }
        for (int64_t i = 0; i < o->saveat.n_ts; i++) {
            double ti = o->saveat.ts[i] * dir;
            /* with traced t0 or t1 the static ones give the direction only: those ends are
             * checked at run time */
            double prev = i > 0                  ? o->saveat.ts[i - 1] * dir
                          : o->t0_traced != NULL ? -INFINITY
                                                 : o->t0 * dir;
            double last = o->t1_traced != NULL ? INFINITY : o->t1 * dir;
            if (!isfinite(ti) || ti < prev || ti > last) {
                nbi_trace_err(tr, NB_ERR_INVALID,
                              "%s: SaveAt ts[%lld] = %g is %s -- times must be finite, within "
                              "[t0, t1] = [%g, %g] and sorted from t0 towards t1",
                              who, (long long)i, o->saveat.ts[i],
                              !isfinite(ti) ? "not finite"
                              : ti > last   ? "beyond t1"
                              : i > 0       ? "out of order"
                                            : "before t0",
                              o->t0, o->t1);
                return false;
            }
        }
    } else if (o->saveat.kind != NB_SAVEAT_T1 && o->saveat.kind != NB_SAVEAT_STEPS) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: unknown SaveAt kind %d", who, (int)o->saveat.kind);
        return false;
    }
    if (o->adjoint.kind != NB_ADJOINT_RECURSIVE_CHECKPOINT &&
        o->adjoint.kind != NB_ADJOINT_DIRECT && !cont) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: unknown adjoint %d", who, (int)o->adjoint.kind);
        return false;
    }
    if (o->adjoint.checkpoints < 0) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: adjoint checkpoints = %lld must be >= 0", who,
                      (long long)o->adjoint.checkpoints);
        return false;
    }
    if (o->jacobian != NULL && cont) {
        nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                      "%s: opts.jacobian with the %s adjoint is not supported -- use the "
                      "recursive checkpoint or direct adjoint",
                      who, aname);
        return false;
    }
    if (o->jacobian != NULL && o->explicit_term != NULL &&
        (tab->dirk == NULL || tab->dirk->AE == NULL)) {
        nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                      "%s: opts.jacobian with opts.explicit_term and solver %s: the solver "
                      "integrates the sum of both parts, whose Jacobian the function does not "
                      "give -- use a KenCarp solver (which treats only the term implicitly), or "
                      "leave opts.jacobian unset",
                      who, tab->name);
        return false;
    }
    if (o->event != NULL && cont) {
        nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                      "%s: events (opts.event) with the %s adjoint are not supported -- "
                      "use the recursive checkpoint or direct adjoint",
                      who, aname);
        return false;
    }
    if (o->event == NULL && (o->event_direction != NULL || o->n_event_direction != 0)) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: opts.event_direction is set but opts.event is NULL -- give the event "
                      "function, or leave the directions unset",
                      who);
        return false;
    }
    if (o->event != NULL && (o->event_direction != NULL) != (o->n_event_direction > 0)) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: opts.event_direction is %s with n_event_direction = %d -- give both "
                      "(one direction per condition) or neither",
                      who, o->event_direction != NULL ? "set" : "NULL", o->n_event_direction);
        return false;
    }
    for (int j = 0; o->event_direction != NULL && j < o->n_event_direction; j++) {
        int d = o->event_direction[j];
        if (d < -1 || d > 1) {
            nbi_trace_err(tr, NB_ERR_INVALID,
                          "%s: opts.event_direction[%d] = %d -- each must be 0 (either sign "
                          "change), +1 (rising) or -1 (falling)",
                          who, j, d);
            return false;
        }
    }
    if (!(o->event_tol >= 0) || !isfinite(o->event_tol)) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: opts.event_tol = %g must be >= 0 and finite (0: the default, 4 ulp "
                      "of t)",
                      who, o->event_tol);
        return false;
    }
    if (cont && o->saveat.kind != NB_SAVEAT_T1) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: the %s adjoint saves only at t1, not %s -- use SaveAt t1, or "
                      "the recursive checkpoint adjoint",
                      who, aname, o->saveat.kind == NB_SAVEAT_TS ? "at given times" : "every step");
        return false;
    }
    return true;
}

/* The term's body and bound data (through jit/max_traces wrappers). */
static bool nbo_unwrap(nb_trace *tr, const nb_fn *f, nb_fn_body *body, const nb_tree **self,
                       const char *what) {
    if (nb_fn_check(f) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "nb_diffeqsolve: %s is NULL or destroyed", what);
        return false;
    }
    while (f->kind == NBI_FN_JIT || f->kind == NBI_FN_MAXTRACES) {
        f = f->inner;
    }
    if (f->kind != NBI_FN_PLAIN) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "nb_diffeqsolve: %s '%s' is a transformed function (grad, vjp, jvp, "
                      "custom_vjp); give a function made by nb_fn_create (or nb_jit of one)",
                      what, f->name);
        return false;
    }
    *body = f->body;
    *self = f->self;
    return true;
}

typedef struct nbo_solve {
    nb_ode_opts o;
    const nbo_tableau *tab;
    double sign, tau0, tau1;
    bool traced;           /* traced times (nb_ode_opts.t0_traced, ...) */
    nb_var *tau0v, *tau1v; /* the internal start and end times as vars */
    nb_dtype dtype;
    nb_tree *tself; /* dict(fn, self, args, efn, eself, evfn, evself): what the term and
                       the event function need, trace-owned */
    bool evfn;      /* opts.event is set */
    nb_treedef *ydef;
    int64_t L;
    nb_var **y0;
} nbo_solve;

/* An optional function f of the options (NULL: none) as a trace-owned fnref *ref and its
 * bound data *bound (null trees when f is NULL or has none). */
static bool nbo_fn_part(nb_trace *tr, const nb_fn *f, const char *what, nb_tree **ref,
                        nb_tree **bound) {
    *ref = nbo_null(tr);
    *bound = nbo_null(tr);
    if (f == NULL || *ref == NULL || *bound == NULL) {
        return *ref != NULL && *bound != NULL;
    }
    nb_fn_body body = NULL;
    const nb_tree *b = NULL;
    if (!nbo_unwrap(tr, f, &body, &b, what)) {
        return false;
    }
    if (nb_tree_fnref(tr->ctx, (nb_fnptr)body, f->name, ref) != NB_OK ||
        nbi_trace_own(tr, *ref) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return false;
    }
    if (b != NULL) {
        *bound = (nb_tree *)b;
    }
    return true;
}

/* The first step: Hairer's algorithm (as Diffrax's PID controller with dt0 = None). */
static nb_var *nbo_initial_step(nb_trace *tr, nbo_solve *S, nb_var *const *fy0) {
    const nb_ode_controller *c = &S->o.controller;
    nb_var *t0 = S->tau0v;
    nb_var *d0 = NULL, *d1 = NULL;
    double count = 0;
    nb_var **scale = nbo_vars(tr, S->L), **y1 = nbo_vars(tr, S->L), **f1 = nbo_vars(tr, S->L);
    if (scale == NULL || y1 == NULL || f1 == NULL) {
        return NULL;
    }
    for (int64_t i = 0; i < S->L; i++) {
        scale[i] = nb_add(nb_scalar(tr, c->atol), nb_mul(nb_abs(S->y0[i]), nb_scalar(tr, c->rtol)));
        nb_var *a = nb_sum(nb_square(nb_div(S->y0[i], scale[i])), NULL, 0, false);
        nb_var *b = nb_sum(nb_square(nb_div(fy0[i], scale[i])), NULL, 0, false);
        d0 = d0 == NULL ? a : nb_add(d0, a);
        d1 = d1 == NULL ? b : nb_add(d1, b);
        count += (double)nb_var_size(S->y0[i]);
    }
    nb_var *cnt = nb_scalar(tr, count);
    d0 = nb_sqrt(nb_div(d0, cnt));
    d1 = nb_sqrt(nb_div(d1, cnt));
    nb_var *small = nb_logical_or(nb_lt(d0, nb_scalar(tr, 1e-5)), nb_lt(d1, nb_scalar(tr, 1e-5)));
    nb_var *d1s = nb_select(small, nb_scalar_typed(tr, S->dtype, 1.0), d1);
    nb_var *h0 = nb_select(small, nb_scalar_typed(tr, S->dtype, 1e-6),
                           nb_mul(nb_scalar(tr, 0.01), nb_div(d0, d1s)));
    for (int64_t i = 0; i < S->L; i++) {
        y1[i] = nb_add(S->y0[i], nb_mul(h0, fy0[i]));
    }
    if (!nbo_term(tr, S->tself, S->sign, nb_add(t0, h0), S->ydef, S->L, y1, f1)) {
        return NULL;
    }
    nb_var *d2 = NULL;
    for (int64_t i = 0; i < S->L; i++) {
        nb_var *a = nb_sum(nb_square(nb_div(nb_sub(f1[i], fy0[i]), scale[i])), NULL, 0, false);
        d2 = d2 == NULL ? a : nb_add(d2, a);
    }
    d2 = nb_div(nb_sqrt(nb_div(d2, cnt)), h0);
    nb_var *maxd = nb_maximum(d1, d2);
    double order = S->tab->error_order > 0 ? S->tab->error_order : 1;
    nb_var *h1 =
        nb_select(nb_le(maxd, nb_scalar(tr, 1e-15)),
                  nb_maximum(nb_scalar_typed(tr, S->dtype, 1e-6), nb_mul(h0, nb_scalar(tr, 1e-3))),
                  nb_pow(nb_div(nb_scalar(tr, 0.01), maxd), nb_scalar(tr, 1.0 / order)));
    nb_var *h = nb_minimum(nb_mul(h0, nb_scalar(tr, 100.0)), h1);
    /* at least 8 ulp of t0: a smaller step would not move t (t0 = 1e5 with a stiff term's
     * 1e-12), and the BDF rescales its history by h / h0. (States are f32 or f64.) */
    double eps = S->dtype == NB_DTYPE_F64 ? DBL_EPSILON : FLT_EPSILON;
    h = nb_maximum(h, nb_mul(nb_abs(t0), nb_scalar(tr, 8 * eps)));
    return nb_stop_gradient(h);
}

/* The solve with the term given as its body (a fnref leaf) and bound data; opts checked.
 * kind: the loop's kind (the adjoint). Returns the trace-owned solution or NULL. */
static const nb_tree *nbo_core(nb_trace *tr, nb_tree *fnref, const nb_tree *tuself,
                               const nb_tree *y0, const nb_tree *args, const nb_ode_opts *opts,
                               nb_loop_kind kind) {
    static const char who[] = "nb_diffeqsolve";
    nbo_solve S;
    memset(&S, 0, sizeof S);
    S.o = *opts;
    S.tab = nbo_tableau_get((int)S.o.solver);
    S.sign = S.o.t1 >= S.o.t0 ? 1.0 : -1.0;
    S.traced = S.o.t0_traced != NULL || S.o.t1_traced != NULL ||
               (S.o.ts_traced != NULL && S.o.saveat.kind == NB_SAVEAT_TS);
    S.tau0 = S.sign * S.o.t0;
    S.tau1 = S.sign * S.o.t1;

    /* the state */
    S.y0 = nbo_leaves(tr, y0, &S.L, &S.ydef);
    if (S.y0 == NULL) {
        return NULL;
    }
    const nb_tree *result_tree = NULL;
    char path[NB_PATH_MAX], sig[64];
    if (S.L == 0) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: y0 has no array leaves -- give the initial state "
                      "as a tree of float vars",
                      who);
        goto done;
    }
    for (int64_t i = 0; i < S.L; i++) {
        nb_var *v = S.y0[i];
        if (nb_var_is_poison(v)) {
            goto done;
        }
        if (i == 0) {
            S.dtype = v->dtype;
        }
        if (!nb_dtype_is_float(v->dtype) || v->dtype != S.dtype ||
            (v->dtype != NB_DTYPE_F32 && v->dtype != NB_DTYPE_F64)) {
            nb_tree_leaf_path(y0, i, path, sizeof path, NULL);
            nbi_trace_err(tr, NB_ERR_DTYPE,
                          "%s: y0%s is %s; every state leaf must be f32 or f64, all of one "
                          "dtype (the first leaf is %s) -- cast it",
                          who, path, nbi_var_sig(sig, sizeof sig, v), nb_dtype_name(S.dtype));
            goto done;
        }
    }
    {
        nb_ctx *ctx = tr->ctx;
        nb_tree *us = tuself != NULL ? (nb_tree *)tuself : nbo_null(tr);
        nb_tree *ua = args != NULL ? (nb_tree *)args : nbo_null(tr);
        nb_tree *d = NULL;
        /* the optional functions beside the term -- opts.explicit_term (the explicit part),
         * opts.jacobian, opts.event -- as fnrefs and bound data (null when unset) */
        nb_tree *efn = NULL, *eself = NULL, *jfn = NULL, *jself = NULL, *evfn = NULL,
                *evself = NULL;
        if (!nbo_fn_part(tr, S.o.explicit_term, "opts.explicit_term", &efn, &eself) ||
            !nbo_fn_part(tr, S.o.jacobian, "opts.jacobian", &jfn, &jself) ||
            !nbo_fn_part(tr, S.o.event, "opts.event", &evfn, &evself)) {
            goto done;
        }
        S.evfn = S.o.event != NULL;
        if (us == NULL || ua == NULL || efn == NULL || eself == NULL || evfn == NULL ||
            evself == NULL || jfn == NULL || jself == NULL ||
            nb_tree_dict(ctx, 9,
                         (const char *[]){"fn", "self", "args", "efn", "eself", "evfn", "evself",
                                          "jfn", "jself"},
                         (nb_tree *[]){fnref, us, ua, efn, eself, evfn, evself, jfn, jself},
                         &d) != NB_OK ||
            nbi_trace_own(tr, d) != NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
            goto done;
        }
        S.tself = d;
    }
    result_tree = NULL;
    {
        nb_dtype dt = S.dtype;
        const nb_ode_opts *o = &S.o;
        int64_t L = S.L, M = o->max_steps;
        /* the times: static, or traced (cast to the state's dtype, then internal) */
        nb_var *tau0 = nb_scalar_typed(tr, dt, S.tau0), *t1v = nb_scalar_typed(tr, dt, S.tau1);
        nb_var *tsx = NULL; /* traced ts, external */
        if (S.traced) {
            if (o->t0_traced != NULL) {
                tau0 = nb_cast(o->t0_traced, dt);
                tau0 = S.sign < 0 ? nb_neg(tau0) : tau0;
            }
            if (o->t1_traced != NULL) {
                t1v = nb_cast(o->t1_traced, dt);
                t1v = S.sign < 0 ? nb_neg(t1v) : t1v;
            }
            if (o->ts_traced != NULL) {
                tsx = nb_cast(o->ts_traced, dt);
            }
        }
        S.tau0v = tau0;
        S.tau1v = t1v;
        nb_var **fy0 = nbo_vars(tr, L);
        if (fy0 == NULL || !nbo_term(tr, S.tself, S.sign, tau0, S.ydef, L, S.y0, fy0)) {
            goto done;
        }
        nb_var *first;
        if (o->dt0 != 0.0) {
            first = nb_scalar_typed(tr, dt, fabs(o->dt0));
        } else {
            first = nbo_initial_step(tr, &S, fy0);
            if (first == NULL) {
                goto done;
            }
        }
        /* the first step within [dtmin, dtmax] (as Diffrax's PIDController.init) */
        nb_var *at_dtmin0 = nb_scalar_typed(tr, NB_DTYPE_BOOL, 0.0);
        if (o->controller.adaptive && o->controller.dtmax > 0) {
            first = nb_minimum(first, nb_scalar(tr, o->controller.dtmax));
        }
        if (o->controller.adaptive && o->controller.dtmin > 0) {
            at_dtmin0 = nb_le(first, nb_scalar(tr, o->controller.dtmin));
            first = nb_maximum(first, nb_scalar(tr, o->controller.dtmin));
        }
        double tol = dt == NB_DTYPE_F64 ? 1e-10 : 1e-6;
        nb_var *tn0 = nb_minimum(nb_add(tau0, first), t1v);
        tn0 = nb_select(nb_gt(tn0, nb_sub(t1v, nb_scalar(tr, tol))), t1v, tn0);

        /* the save part of the carry */
        nb_tree *save = NULL;
        nb_var *TS = NULL;
        int64_t nts = tsx != NULL ? nb_var_dim(tsx, 0) : o->saveat.n_ts;
        nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)L * sizeof *items);
        if (items == NULL) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
            goto done;
        }
        if (o->saveat.kind == NB_SAVEAT_TS && tsx != NULL) {
            TS = S.sign < 0 ? nb_neg(tsx) : tsx;
        } else if (o->saveat.kind == NB_SAVEAT_TS) {
            nb_array *a = NULL;
            if (nb_array_zeros(tr->ctx, dt, 1, (int64_t[]){nts}, &a) != NB_OK) {
                nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
                goto done;
            }
            for (int64_t j = 0; j < nts; j++) {
                double v = S.sign * o->saveat.ts[j];
                if (dt == NB_DTYPE_F64) {
                    ((double *)nb_array_data(a))[j] = v;
                } else {
                    ((float *)nb_array_data(a))[j] = (float)v;
                }
            }
            TS = nb_constant(tr, a);
            nb_array_destroy(a);
        }
        if (o->saveat.kind == NB_SAVEAT_TS) {
            nb_var *at0 = nb_reshape(nb_le(TS, tau0), 2, (int64_t[]){nts, 1});
            for (int64_t i = 0; i < L; i++) {
                int64_t N = nb_var_size(S.y0[i]);
                nb_var *row = nb_reshape(S.y0[i], 2, (int64_t[]){1, N});
                nb_var *inf = nb_full(tr, dt, 2, (int64_t[]){nts, N}, INFINITY);
                items[i] =
                    nb_leaf(nb_select(at0, nb_broadcast_to(row, 2, (int64_t[]){nts, N}), inf));
            }
            save = nbo_tuple(tr, L, items);
        } else if (o->saveat.kind == NB_SAVEAT_STEPS) {
            for (int64_t i = 0; i < L; i++) {
                items[i] =
                    nb_leaf(nb_full(tr, dt, 2, (int64_t[]){M, nb_var_size(S.y0[i])}, INFINITY));
            }
            nb_tree *ys = nbo_tuple(tr, L, items);
            save = nbo_tuple(
                tr, 2, (nb_tree *[]){nb_leaf(nb_full(tr, dt, 1, (int64_t[]){M}, INFINITY)), ys});
        } else {
            save = nbo_null(tr);
        }
        /* events: the conditions at t0 (their count fixed by this first call) */
        int64_t nev = -1;
        nb_var *ev0 = nb_full(tr, dt, 1, (int64_t[]){0}, 0.0);
        if (S.evfn) {
            if (o->event_direction != NULL) {
                nev = o->n_event_direction;
            }
            ev0 = nbo_event_eval(tr, S.tself, S.sign, tau0, S.ydef, L, S.y0, &nev, dt);
            if (ev0 == NULL) {
                goto done;
            }
            ev0 = nb_stop_gradient(ev0);
        }
        nb_tree *evdir = NULL;
        {
            int64_t nd = nev > 0 ? nev : 0;
            nb_tree **di = nbi_arena_alloc(&tr->arena, (size_t)(nd > 0 ? nd : 1) * sizeof *di);
            if (di == NULL) {
                nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
                goto done;
            }
            for (int64_t j = 0; j < nd; j++) {
                di[j] = nbo_float(tr, o->event_direction != NULL ? o->event_direction[j] : 0);
            }
            evdir = nbo_tuple(tr, nd, di);
        }
        /* the BDF's history: D = (y0, h0 f(t0, y0), 0, ...), order 1, for h0 */
        nb_tree *bdf0 = nbo_null(tr);
        if (S.tab->bdf) {
            nb_var *h0 = nb_stop_gradient(nb_sub(tn0, tau0));
            nb_var *y0f = nbo_flat(L, S.y0), *f0f = nbo_flat(L, fy0);
            int64_t N = nb_var_size(y0f);
            nb_var *D0 = nb_concatenate(
                3,
                (nb_var *[]){nb_reshape(y0f, 2, (int64_t[]){1, N}),
                             nb_reshape(nb_mul(h0, f0f), 2, (int64_t[]){1, N}),
                             nb_full(tr, dt, 2, (int64_t[]){NBO_BDF_ROWS - 2, N}, 0.0)},
                0);
            bdf0 = nbo_tuple(tr, 4,
                             (nb_tree *[]){nb_leaf(D0), nb_leaf(nbo_i32(tr, 1)),
                                           nb_leaf(nbo_i32(tr, 0)), nb_leaf(h0)});
        }
        nb_tree *ytree = nbo_build(tr, S.ydef, L, S.y0);
        nb_tree *fytree = nbo_build(tr, S.ydef, L, fy0);
        nb_tree *init =
            nbo_tuple(tr, 15,
                      (nb_tree *[]){nb_leaf(tau0), nb_leaf(tn0), ytree, fytree,
                                    nb_leaf(nbo_i32(tr, 0)), nb_leaf(nbo_i32(tr, 0)),
                                    nb_leaf(nbo_i32(tr, 0)), nb_leaf(nb_scalar_typed(tr, dt, 1.0)),
                                    nb_leaf(nb_scalar_typed(tr, dt, 1.0)), save, nb_leaf(at_dtmin0),
                                    nb_leaf(nb_full(tr, NB_DTYPE_I32, 1, (int64_t[]){2}, 0.0)),
                                    nb_leaf(ev0), nb_leaf(nbo_i32(tr, -1)), bdf0});
        if (init == NULL || evdir == NULL) {
            goto done;
        }

        /* the step and cond functions */
        const nb_ode_controller *c = &o->controller;
        double cfgv[CFG_COUNT] = {0};
        cfgv[CFG_SOLVER] = (double)o->solver;
        cfgv[CFG_ADAPTIVE] = c->adaptive ? 1.0 : 0.0;
        if (c->adaptive) {
            cfgv[CFG_RTOL] = c->rtol;
            cfgv[CFG_ATOL] = c->atol;
            cfgv[CFG_PCOEFF] = c->pcoeff;
            cfgv[CFG_ICOEFF] = c->icoeff;
            cfgv[CFG_DCOEFF] = c->dcoeff;
            cfgv[CFG_FACTORMIN] = c->factormin;
            cfgv[CFG_FACTORMAX] = c->factormax;
            cfgv[CFG_SAFETY] = c->safety;
            cfgv[CFG_DTMIN] = c->dtmin;
            cfgv[CFG_DTMAX] = c->dtmax;
            cfgv[CFG_FORCE_DTMIN] = c->force_dtmin ? 1.0 : 0.0;
        } else {
            cfgv[CFG_DT0] = fabs(o->dt0);
        }
        cfgv[CFG_SIGN] = S.sign;
        cfgv[CFG_T1] = S.tau1;
        cfgv[CFG_TRACED] = S.traced ? 1.0 : 0.0;
        cfgv[CFG_SAVEAT] = (double)o->saveat.kind;
        cfgv[CFG_N_TS] = (double)(o->saveat.kind == NB_SAVEAT_TS ? nts : 0);
        cfgv[CFG_N_EVENT] = (double)(nev > 0 ? nev : 0);
        cfgv[CFG_EVTOL] = o->event_tol;
        nb_tree *ci[CFG_COUNT];
        for (int i = 0; i < CFG_COUNT; i++) {
            ci[i] = nbo_float(tr, cfgv[i]);
        }
        nb_tree *cfg = nbo_tuple(tr, CFG_COUNT, ci);
        nb_tree *tsleaf = TS != NULL ? nb_leaf(TS) : nbo_null(tr);
        nb_tree *bself = NULL, *cself = NULL;
        nb_fn *bf = NULL, *cf = NULL;
        nb_status st = cfg != NULL && tsleaf != NULL ? NB_OK : NB_ERR_OOM;
        if (st == NB_OK) {
            st = nb_tree_dict(tr->ctx, 13,
                              (const char *[]){"fn", "self", "args", "cfg", "ts", "t1", "efn",
                                               "eself", "evfn", "evself", "evdir", "jfn", "jself"},
                              (nb_tree *[]){(nb_tree *)nb_tree_get(S.tself, "fn"),
                                            (nb_tree *)nb_tree_get(S.tself, "self"),
                                            (nb_tree *)nb_tree_get(S.tself, "args"), cfg, tsleaf,
                                            S.traced ? nb_leaf(t1v) : nbo_float(tr, S.tau1),
                                            (nb_tree *)nb_tree_get(S.tself, "efn"),
                                            (nb_tree *)nb_tree_get(S.tself, "eself"),
                                            (nb_tree *)nb_tree_get(S.tself, "evfn"),
                                            (nb_tree *)nb_tree_get(S.tself, "evself"), evdir,
                                            (nb_tree *)nb_tree_get(S.tself, "jfn"),
                                            (nb_tree *)nb_tree_get(S.tself, "jself")},
                              &bself);
        }
        if (st == NB_OK) {
            st = nb_tree_dict(tr->ctx, 1, (const char *[]){"t1"},
                              (nb_tree *[]){S.traced ? nb_leaf(t1v) : nbo_float(tr, S.tau1)},
                              &cself);
        }
        if (st == NB_OK) {
            st = nb_fn_create(tr->ctx, "diffeqsolve_step", nbo_step_body, bself, &bf);
        }
        if (st == NB_OK) {
            st = nb_fn_create(tr->ctx, "diffeqsolve_cond", nbo_cond, cself, &cf);
        }
        nb_tree_destroy(bself);
        nb_tree_destroy(cself);
        if (st != NB_OK) {
            nb_fn_destroy(bf);
            nb_fn_destroy(cf);
            if (tr->status == NB_OK) {
                nbi_trace_err(tr, st, "%s: out of memory", who);
            }
            goto done;
        }
        nb_loop_opts lo = nb_loop_opts_default();
        lo.max_steps = M;
        lo.kind = kind;
        lo.checkpoints = o->adjoint.checkpoints;
        nb_tree *bufmask = NULL;
        if (o->saveat.kind == NB_SAVEAT_STEPS) {
            nb_tree *bi[15];
            for (int i = 0; i < 15; i++) {
                bi[i] = NULL;
                if (nb_tree_bool(tr->ctx, i == 9, &bi[i]) != NB_OK ||
                    nbi_trace_own(tr, bi[i]) != NB_OK) {
                    bi[i] = NULL;
                    nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
                }
            }
            bufmask = nbo_tuple(tr, 15, bi);
            lo.buffers = bufmask;
        }
        const nb_tree *fin = tr->status == NB_OK ? nb_while_loop(tr, cf, bf, init, &lo) : NULL;
        nb_fn_destroy(bf);
        nb_fn_destroy(cf);
        if (fin == NULL) {
            goto done;
        }

        /* the solution */
        nb_var *t = nb_var_of(tr, nb_tree_child(fin, 0));
        nb_var *result = nb_var_of(tr, nb_tree_child(fin, 6));
        nb_var *eventv = nb_var_of(tr, nb_tree_child(fin, 13));
        result = nb_select(nb_logical_and(nb_logical_and(nb_eq(result, nbo_i32(tr, 0)),
                                                         nb_lt(eventv, nbo_i32(tr, 0))),
                                          nb_lt(t, t1v)),
                           nbo_i32(tr, NB_ODE_MAX_STEPS_REACHED), result);
        nb_var *steps = nb_var_of(tr, nb_tree_child(fin, 4));
        nb_var *accv = nb_var_of(tr, nb_tree_child(fin, 5));
        nb_var *stiffv = nb_cast(nb_ge(nb_reshape(nb_slice(nb_var_of(tr, nb_tree_child(fin, 11)),
                                                           (int64_t[]){0}, (int64_t[]){1}, NULL),
                                                  0, NULL),
                                       nbo_i32(tr, 15)),
                                 NB_DTYPE_I32);
        nb_var *t_ext = S.sign < 0 ? nb_neg(t) : t;
        int64_t L2 = 0;
        nb_var **yf = nbo_leaves(tr, nb_tree_child(fin, 2), &L2, NULL);
        nb_var **ys = nbo_vars(tr, L);
        if (yf == NULL || ys == NULL) {
            goto done;
        }
        nb_var *tsv;
        const nb_tree *fsave = nb_tree_child(fin, 9);
        if (o->saveat.kind == NB_SAVEAT_T1) {
            tsv = nb_reshape(t_ext, 1, (int64_t[]){1});
            for (int64_t i = 0; i < L; i++) {
                ys[i] = nb_expand_dims(yf[i], 0);
            }
        } else if (o->saveat.kind == NB_SAVEAT_TS) {
            if (tsx != NULL) {
                tsv = tsx;
            } else {
                nb_array *a = NULL;
                if (nb_array_zeros(tr->ctx, dt, 1, (int64_t[]){nts}, &a) != NB_OK) {
                    nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
                    goto done;
                }
                for (int64_t j = 0; j < nts; j++) {
                    if (dt == NB_DTYPE_F64) {
                        ((double *)nb_array_data(a))[j] = o->saveat.ts[j];
                    } else {
                        ((float *)nb_array_data(a))[j] = (float)o->saveat.ts[j];
                    }
                }
                tsv = nb_constant(tr, a);
                nb_array_destroy(a);
            }
            for (int64_t i = 0; i < L; i++) {
                nb_var *v = nb_var_of(tr, nb_tree_child(fsave, i));
                int64_t r = S.y0[i]->rank;
                int64_t shp[NB_MAX_RANK + 1];
                shp[0] = nts;
                memcpy(shp + 1, S.y0[i]->shape, (size_t)r * sizeof *shp);
                ys[i] = nb_reshape(v, (int)r + 1, shp);
            }
        } else {
            /* compact the rows of kept steps to the front */
            nb_var *tsb = nb_var_of(tr, nb_tree_child(fsave, 0));
            nb_tree *cinit =
                nbo_tuple(tr, 3,
                          (nb_tree *[]){nb_leaf(nbo_i32(tr, 0)),
                                        nb_leaf(nb_full(tr, NB_DTYPE_I32, 1, (int64_t[]){M}, 0.0)),
                                        nb_leaf(nbo_i32(tr, 0))});
            nb_fn *cb = NULL;
            if (cinit == NULL || nb_fn_create(tr->ctx, "diffeqsolve_compact", nbo_compact_body,
                                              NULL, &cb) != NB_OK) {
                if (tr->status == NB_OK) {
                    nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
                }
                goto done;
            }
            const nb_tree *cr = nb_scan(tr, cb, cinit, nb_leaf(nb_stop_gradient(tsb)), M, NULL);
            nb_fn_destroy(cb);
            if (cr == NULL) {
                goto done;
            }
            nb_var *count = nb_get(tr, cr, "[0][0]"), *idx = nb_get(tr, cr, "[0][1]");
            nb_var *valid = nb_lt(nb_iota(tr, NB_DTYPE_I32, 1, (int64_t[]){M}, 0), count);
            nb_var *inf = nb_scalar_typed(tr, dt, INFINITY);
            tsv = nb_select(valid, nb_take(tsb, idx, 0), inf);
            nb_var *valid2 = nb_reshape(valid, 2, (int64_t[]){M, 1});
            const nb_tree *ysb = nb_tree_child(fsave, 1);
            for (int64_t i = 0; i < L; i++) {
                nb_var *v =
                    nb_select(valid2, nb_take(nb_var_of(tr, nb_tree_child(ysb, i)), idx, 0), inf);
                int64_t r = S.y0[i]->rank;
                int64_t shp[NB_MAX_RANK + 1];
                shp[0] = M;
                memcpy(shp + 1, S.y0[i]->shape, (size_t)r * sizeof *shp);
                ys[i] = nb_reshape(v, (int)r + 1, shp);
            }
        }
        if (S.traced) {
            /* the traced times must go the static direction, ts sorted within [t0, t1]:
             * every output goes through the check (internal times: t0 <= ts <= t1) */
            nb_var *bad = nb_lt(S.tau1v, S.tau0v);
            nb_var *ts_first = NULL, *ts_last = NULL;
            if (TS != NULL && nts > 0) {
                nb_var *ts_lo = nb_slice(TS, (int64_t[]){0}, (int64_t[]){nts - 1}, NULL);
                nb_var *ts_hi = nb_slice(TS, (int64_t[]){1}, (int64_t[]){nts}, NULL);
                nb_var *unsorted =
                    nts > 1
                        ? nb_gt(nb_max(nb_cast(nb_gt(ts_lo, ts_hi), NB_DTYPE_I32), NULL, 0, false),
                                nbo_i32(tr, 0))
                        : nb_scalar_typed(tr, NB_DTYPE_BOOL, 0.0);
                bad = nb_logical_or(
                    bad, nb_logical_or(unsorted, nb_lt(nb_min(TS, NULL, 0, false), S.tau0v)));
                bad = nb_logical_or(bad, nb_gt(nb_max(TS, NULL, 0, false), S.tau1v));
                /* for the message: the first and last as given */
                ts_first = nb_slice(TS, (int64_t[]){0}, (int64_t[]){1}, NULL);
                ts_last = nb_slice(TS, (int64_t[]){nts - 1}, (int64_t[]){nts}, NULL);
                /* NaN anywhere: not finite */
                bad = nb_logical_or(bad, nb_logical_not(nbo_isfinite(nb_sum(TS, NULL, 0, false))));
            }
            bad = nb_logical_or(bad, nb_logical_not(nbo_isfinite(nb_add(S.tau0v, S.tau1v))));
            nb_var *one = nb_full(tr, NB_DTYPE_F64, 1, (int64_t[]){1}, 0.0);
            nb_var *ext0 = nb_cast(S.sign < 0 ? nb_neg(S.tau0v) : S.tau0v, NB_DTYPE_F64);
            nb_var *ext1 = nb_cast(S.sign < 0 ? nb_neg(S.tau1v) : S.tau1v, NB_DTYPE_F64);
            nb_var *vals = nb_concatenate(
                5,
                (nb_var *[]){
                    nb_reshape(ext0, 1, (int64_t[]){1}), nb_reshape(ext1, 1, (int64_t[]){1}),
                    ts_first != NULL ? nb_reshape(nb_cast(S.sign < 0 ? nb_neg(ts_first) : ts_first,
                                                          NB_DTYPE_F64),
                                                  1, (int64_t[]){1})
                                     : one,
                    ts_last != NULL
                        ? nb_reshape(nb_cast(S.sign < 0 ? nb_neg(ts_last) : ts_last, NB_DTYPE_F64),
                                     1, (int64_t[]){1})
                        : one,
                    nb_full(tr, NB_DTYPE_F64, 1, (int64_t[]){1}, S.sign)},
                0);
            bad = nb_stop_gradient(bad);
            for (int64_t i = 0; i < L; i++) {
                ys[i] = nbi_check(ys[i], bad, vals, nbo_times_msg);
            }
            tsv = nbi_check(tsv, bad, vals, nbo_times_msg);
            t_ext = nbi_check(t_ext, bad, vals, nbo_times_msg);
            eventv = nbi_check(eventv, bad, vals, nbo_times_msg);
            result = nbi_check(result, bad, vals, nbo_times_msg);
        }
        if (o->throw_on_failure) {
            /* every output goes through the check, so any use of the solution raises */
            nb_var *fail = nb_ne(result, nbo_i32(tr, 0));
            nb_var *vals = nb_concatenate(
                5,
                (nb_var *[]){
                    nb_reshape(nb_cast(t_ext, NB_DTYPE_F64), 1, (int64_t[]){1}),
                    nb_reshape(nb_cast(result, NB_DTYPE_F64), 1, (int64_t[]){1}),
                    nb_reshape(nb_cast(stiffv, NB_DTYPE_F64), 1, (int64_t[]){1}),
                    nb_full(tr, NB_DTYPE_F64, 1, (int64_t[]){1}, (double)M),
                    nb_reshape(nb_cast(S.sign < 0 ? nb_neg(S.tau1v) : S.tau1v, NB_DTYPE_F64), 1,
                               (int64_t[]){1})},
                0);
            for (int64_t i = 0; i < L; i++) {
                ys[i] = nbi_check(ys[i], fail, vals, nbo_fail_msg);
            }
            tsv = nbi_check(tsv, fail, vals, nbo_fail_msg);
            t_ext = nbi_check(t_ext, fail, vals, nbo_fail_msg);
            eventv = nbi_check(eventv, fail, vals, nbo_fail_msg);
            result = nbi_check(result, fail, vals, nbo_fail_msg);
            steps = nbi_check(steps, fail, vals, nbo_fail_msg);
            accv = nbi_check(accv, fail, vals, nbo_fail_msg);
        }
        nb_tree *ystree = nbo_build(tr, S.ydef, L, ys);
        nb_tree *stats = NULL, *sol = NULL;
        if (ystree != NULL &&
            nb_tree_dict(tr->ctx, 4,
                         (const char *[]){"num_steps", "num_accepted_steps", "num_rejected_steps",
                                          "stiffness_suspected"},
                         (nb_tree *[]){nb_leaf(steps), nb_leaf(accv), nb_leaf(nb_sub(steps, accv)),
                                       nb_leaf(stiffv)},
                         &stats) == NB_OK &&
            nbi_trace_own(tr, stats) == NB_OK &&
            nb_tree_dict(tr->ctx, 6,
                         (const char *[]){"ts", "ys", "result", "t_final", "stats", "event"},
                         (nb_tree *[]){nb_leaf(tsv), ystree, nb_leaf(result), nb_leaf(t_ext), stats,
                                       nb_leaf(eventv)},
                         &sol) == NB_OK &&
            nbi_trace_own(tr, sol) == NB_OK) {
            result_tree = sol;
        } else if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
    }
done:
    nb_treedef_destroy(S.ydef);
    return tr->status == NB_OK ? result_tree : NULL;
}

/* ---- options as static data (for the backsolve adjoint's functions) --------------------- */

enum { OPT_CTRL = 12, OPT_HEAD = 4 + OPT_CTRL + 4 + 2 + OPT_CTRL + 1 };

static void nbo_ctrl_enc(const nb_ode_controller *c, double *v) {
    double w[OPT_CTRL] = {c->adaptive, c->rtol,   c->atol,      c->pcoeff,
                          c->icoeff,   c->dcoeff, c->factormin, c->factormax,
                          c->safety,   c->dtmin,  c->dtmax,     c->force_dtmin};
    memcpy(v, w, sizeof w);
}

static void nbo_ctrl_dec(const double *v, nb_ode_controller *c) {
    c->adaptive = v[0] != 0;
    c->rtol = v[1];
    c->atol = v[2];
    c->pcoeff = v[3];
    c->icoeff = v[4];
    c->dcoeff = v[5];
    c->factormin = v[6];
    c->factormax = v[7];
    c->safety = v[8];
    c->dtmin = v[9];
    c->dtmax = v[10];
    c->force_dtmin = v[11] != 0;
}

/* A trace-owned tuple of floats holding o (ts included). */
static nb_tree *nbo_opts_enc(nb_trace *tr, const nb_ode_opts *o) {
    int64_t nts = o->saveat.kind == NB_SAVEAT_TS ? o->saveat.n_ts : 0;
    int64_t n = OPT_HEAD + nts;
    double *v = nbi_arena_alloc(&tr->arena, (size_t)n * sizeof *v);
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)n * sizeof *items);
    if (v == NULL || items == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    v[0] = o->solver;
    v[1] = o->t0;
    v[2] = o->t1;
    v[3] = o->dt0;
    nbo_ctrl_enc(&o->controller, v + 4);
    double *w = v + 4 + OPT_CTRL;
    w[0] = o->saveat.kind;
    w[1] = (double)o->max_steps;
    w[2] = o->throw_on_failure;
    w[3] = o->adjoint.kind;
    w[4] = (double)o->adjoint.checkpoints;
    w[5] = o->adjoint.solver;
    nbo_ctrl_enc(&o->adjoint.controller, w + 6);
    w[6 + OPT_CTRL] = (double)nts;
    for (int64_t i = 0; i < nts; i++) {
        v[OPT_HEAD + i] = o->saveat.ts[i];
    }
    for (int64_t i = 0; i < n; i++) {
        items[i] = nbo_float(tr, v[i]);
    }
    return nbo_tuple(tr, n, items);
}

static bool nbo_opts_dec(nb_trace *tr, const nb_tree *t, nb_ode_opts *o) {
    int64_t n = nb_tree_len(t);
    double *v = n >= OPT_HEAD ? nbi_arena_alloc(&tr->arena, (size_t)n * sizeof *v) : NULL;
    if (v == NULL) {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_diffeqsolve: bad options record");
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        nb_tree_get_float(nb_tree_child(t, i), &v[i]);
    }
    *o = nb_ode_opts_default();
    o->solver = (nb_ode_solver)v[0];
    o->t0 = v[1];
    o->t1 = v[2];
    o->dt0 = v[3];
    nbo_ctrl_dec(v + 4, &o->controller);
    const double *w = v + 4 + OPT_CTRL;
    o->saveat.kind = (nb_saveat_kind)w[0];
    o->max_steps = (int64_t)w[1];
    o->throw_on_failure = w[2] != 0;
    o->adjoint.kind = (nb_ode_adjoint_kind)w[3];
    o->adjoint.checkpoints = (int64_t)w[4];
    o->adjoint.solver = (int)w[5];
    nbo_ctrl_dec(w + 6, &o->adjoint.controller);
    o->saveat.n_ts = (int64_t)w[6 + OPT_CTRL];
    o->saveat.ts = o->saveat.n_ts > 0 ? v + OPT_HEAD : NULL;
    return true;
}

/* ---- the backsolve adjoint ---------------------------------------------------------------
 * A custom_vjp around a forward-only solve. Its argument is (y0, args, self) -- the term's
 * bound data is an argument so that its vars get cotangents too -- and its output one
 * vector (custom_vjp's contract): every ys leaf flattened, then t_final, result, num_steps
 * and num_accepted_steps as floats (exact). The rule solves the augmented system
 *     dy/dt = f(t, y),  da/dt = -a^T df/dy,  dg/dt = -a^T df/d(args, self)
 * from t1 (y(t1), a = the cotangent of y(t1), g = 0) back to t0, where a and g are the
 * cotangents of y0 and of the float leaves of (args, self). */

static nb_var *nbo_pack(nb_trace *tr, const nb_tree *sol, int64_t L) {
    nb_dtype dt = nb_var_dtype(nb_get(tr, sol, "t_final"));
    nb_var **parts = nbo_vars(tr, L + 5);
    if (parts == NULL) {
        return NULL;
    }
    const nb_tree *ys = nb_tree_get(sol, "ys");
    int64_t n = 0;
    nb_var **yl = nbo_leaves(tr, ys, &n, NULL);
    if (yl == NULL || n != L) {
        return NULL;
    }
    for (int64_t i = 0; i < L; i++) {
        parts[i] = nb_reshape(yl[i], 1, (int64_t[]){-1});
    }
    static const char *const tail[5] = {"t_final", "result", "stats.num_steps",
                                        "stats.num_accepted_steps", "stats.stiffness_suspected"};
    for (int i = 0; i < 5; i++) {
        parts[L + i] = nb_reshape(nb_cast(nb_get(tr, sol, "%s", tail[i]), dt), 1, (int64_t[]){1});
    }
    return nb_concatenate((int)(L + 5), parts, 0);
}

/* The solution dict from a packed vector (SaveAt t1: one row). */
static const nb_tree *nbo_unpack(nb_trace *tr, nb_var *p, const nb_treedef *ydef, int64_t L,
                                 nb_var *const *y0) {
    nb_var **ys = nbo_vars(tr, L);
    if (ys == NULL) {
        return NULL;
    }
    int64_t off = 0;
    for (int64_t i = 0; i < L; i++) {
        int64_t N = nb_var_size(y0[i]), shp[NB_MAX_RANK + 1];
        shp[0] = 1;
        memcpy(shp + 1, y0[i]->shape, (size_t)y0[i]->rank * sizeof *shp);
        ys[i] = nb_reshape(nb_slice(p, (int64_t[]){off}, (int64_t[]){off + N}, NULL),
                           y0[i]->rank + 1, shp);
        off += N;
    }
    nb_var *sc[5];
    for (int i = 0; i < 5; i++) {
        sc[i] =
            nb_reshape(nb_slice(p, (int64_t[]){off + i}, (int64_t[]){off + i + 1}, NULL), 0, NULL);
    }
    nb_var *steps = nb_cast(sc[2], NB_DTYPE_I32), *acc = nb_cast(sc[3], NB_DTYPE_I32);
    nb_tree *ystree = nbo_build(tr, ydef, L, ys), *stats = NULL, *sol = NULL;
    if (ystree != NULL &&
        nb_tree_dict(tr->ctx, 4,
                     (const char *[]){"num_steps", "num_accepted_steps", "num_rejected_steps",
                                      "stiffness_suspected"},
                     (nb_tree *[]){nb_leaf(steps), nb_leaf(acc), nb_leaf(nb_sub(steps, acc)),
                                   nb_leaf(nb_cast(sc[4], NB_DTYPE_I32))},
                     &stats) == NB_OK &&
        nbi_trace_own(tr, stats) == NB_OK &&
        nb_tree_dict(tr->ctx, 6,
                     (const char *[]){"ts", "ys", "result", "t_final", "stats", "event"},
                     (nb_tree *[]){nb_leaf(nb_reshape(sc[0], 1, (int64_t[]){1})), ystree,
                                   nb_leaf(nb_cast(sc[1], NB_DTYPE_I32)), nb_leaf(sc[0]), stats,
                                   nb_leaf(nbo_i32(tr, -1))},
                     &sol) == NB_OK &&
        nbi_trace_own(tr, sol) == NB_OK) {
        return sol;
    }
    if (tr->status == NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
    }
    return NULL;
}

/* Float var leaves of t (depth first), with the matching leaves of ct (a tree of t's
 * structure with nulls, or NULL): appended to vars/cts from *n on (cap entries). */
static void nbo_float_leaves(const nb_tree *t, const nb_tree *ct, nb_var **vars,
                             const nb_tree **cts, int64_t *n, int64_t cap) {
    if (t == NULL) {
        return;
    }
    nb_tree_kind k = nb_tree_kind_of(t);
    if (k == NB_TREE_KIND_LIST || k == NB_TREE_KIND_TUPLE || k == NB_TREE_KIND_DICT) {
        bool node = ct != NULL && nb_tree_len(ct) == nb_tree_len(t) && !nb_tree_is_leaf(ct);
        for (int64_t i = 0; i < nb_tree_len(t); i++) {
            nbo_float_leaves(nb_tree_child(t, i), node ? nb_tree_child(ct, i) : NULL, vars, cts, n,
                             cap);
        }
        return;
    }
    if (k == NB_TREE_KIND_VAR && *n < cap) {
        nb_var *v = (nb_var *)t->u.var.var;
        if (nb_dtype_is_float(v->dtype)) {
            vars[*n] = v;
            if (cts != NULL) {
                cts[*n] = ct != NULL && nb_tree_kind_of(ct) == NB_TREE_KIND_VAR ? ct : NULL;
            }
            (*n)++;
        }
    }
}

/* A trace-owned tree of t's structure with vals[*k..] at its float var leaves (in the order
 * of nbo_float_leaves) and null everywhere else: the cotangent tree custom_vjp wants. */
static nb_tree *nbo_rebuild(nb_trace *tr, const nb_tree *t, nb_var *const *vals, int64_t *k) {
    if (t == NULL) {
        return nbo_null(tr);
    }
    nb_tree_kind kind = nb_tree_kind_of(t);
    if (kind == NB_TREE_KIND_LIST || kind == NB_TREE_KIND_TUPLE || kind == NB_TREE_KIND_DICT) {
        int64_t n = nb_tree_len(t);
        nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(n > 0 ? n : 1) * sizeof *items);
        const char **keys = nbi_arena_alloc(&tr->arena, (size_t)(n > 0 ? n : 1) * sizeof *keys);
        if (items == NULL || keys == NULL) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
            return NULL;
        }
        for (int64_t i = 0; i < n; i++) {
            if ((items[i] = nbo_rebuild(tr, nb_tree_child(t, i), vals, k)) == NULL) {
                return NULL;
            }
            keys[i] = nb_tree_key(t, i);
        }
        nb_tree *out = NULL;
        nb_status st = kind == NB_TREE_KIND_LIST    ? nb_tree_list(tr->ctx, n, items, &out)
                       : kind == NB_TREE_KIND_TUPLE ? nb_tree_tuple(tr->ctx, n, items, &out)
                                                    : nb_tree_dict(tr->ctx, n, keys, items, &out);
        if (st != NB_OK || nbi_trace_own(tr, out) != NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
            return NULL;
        }
        return out;
    }
    if (kind == NB_TREE_KIND_VAR && nb_dtype_is_float(((nb_var *)t->u.var.var)->dtype)) {
        return nb_leaf(vals[(*k)++]);
    }
    return nbo_null(tr);
}

/* The user's term as a function of (t, y, args, self), for nb_vjp. self: dict(fn). */
static nb_status nbo_term_fn(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    nb_fnptr fp = NULL;
    nb_tree_get_fnref(nb_tree_get(self, "fn"), &fp, NULL);
    const nb_tree *uself = nb_tree_child(args, 3);
    if (nb_tree_kind_of(uself) == NB_TREE_KIND_NULL) {
        uself = NULL;
    }
    nb_tree *targs = nbo_tuple(tr, 3,
                               (nb_tree *[]){(nb_tree *)nb_tree_child(args, 0),
                                             (nb_tree *)nb_tree_child(args, 1),
                                             (nb_tree *)nb_tree_child(args, 2)});
    if (targs == NULL) {
        return tr->status;
    }
    return ((nb_fn_body)fp)(tr, uself, targs, out);
}

/* The adjoint part of the augmented vector field at (t, y): fy = f(t, y), and with a (y's
 * structure) and g (a tuple, one entry per float leaf of (ua, us)) *da = -a^T df/dy and *dg =
 * -a^T df/d(ua, us), trees like a and g. self: dict(fn). */
static bool nbo_adj_rhs(nb_trace *tr, const nb_tree *self, nb_tree *t, nb_tree *y, const nb_tree *a,
                        const nb_tree *g, const nb_tree *ua, const nb_tree *us, const nb_tree **fy,
                        nb_tree **da, nb_tree **dg) {
    nb_ctx *ctx = tr->ctx;
    nb_fn *tf = NULL, *vf = NULL;
    nb_status st = nb_fn_create(ctx, "adjoint_term", nbo_term_fn, self, &tf);
    if (st == NB_OK) {
        st = nb_vjp(tf, &vf);
    }
    nb_fn_destroy(tf);
    if (st != NB_OK) {
        nbi_trace_err(tr, st, "nb_diffeqsolve: the adjoint: out of memory");
        return false;
    }
    nb_tree *prim = nbo_tuple(tr, 4, (nb_tree *[]){t, y, (nb_tree *)ua, (nb_tree *)us});
    nb_tree *call = prim != NULL ? nbo_tuple(tr, 2, (nb_tree *[]){prim, (nb_tree *)a}) : NULL;
    const nb_tree *r = call != NULL ? nb_apply(tr, vf, call) : NULL;
    nb_fn_destroy(vf);
    if (r == NULL) {
        return false;
    }
    *fy = nb_tree_child(r, 0);
    const nb_tree *cts = nb_tree_child(r, 1);
    /* da/dt = -ct_y */
    int64_t L = 0;
    nb_treedef *ydef = NULL;
    nb_var **cy = nbo_leaves(tr, nb_tree_child(cts, 1), &L, &ydef);
    int64_t La = 0;
    nb_var **al = cy != NULL ? nbo_leaves(tr, a, &La, NULL) : NULL;
    if (al == NULL) {
        nb_treedef_destroy(ydef);
        return false;
    }
    /* the ct tree drops nulls only where y has non-float leaves: y is all float */
    nb_var **dav = nbo_vars(tr, La);
    for (int64_t i = 0; dav != NULL && i < La; i++) {
        dav[i] = i < L ? nb_neg(cy[i]) : nbi_zeros_like(tr, al[i]);
    }
    nb_treedef_destroy(ydef);
    nb_treedef *adef = NULL;
    nb_tree_treedef(a, &adef);
    *da = dav != NULL && adef != NULL ? nbo_build(tr, adef, La, dav) : NULL;
    nb_treedef_destroy(adef);
    /* dg/dt = -ct of the float leaves of (args, self) */
    int64_t ng = nb_tree_len(g), n = 0;
    nb_var **pv = nbo_vars(tr, ng);
    const nb_tree **pc = nbi_arena_alloc(&tr->arena, (size_t)(ng > 0 ? ng : 1) * sizeof *pc);
    nb_tree **gi = nbi_arena_alloc(&tr->arena, (size_t)(ng > 0 ? ng : 1) * sizeof *gi);
    if (*da == NULL || pv == NULL || pc == NULL || gi == NULL) {
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        }
        return false;
    }
    nbo_float_leaves(ua, nb_tree_child(cts, 2), pv, pc, &n, ng);
    nbo_float_leaves(us, nb_tree_child(cts, 3), pv, pc, &n, ng);
    for (int64_t i = 0; i < ng; i++) {
        nb_var *gv = nb_var_of(tr, nb_tree_child(g, i));
        gi[i] =
            nb_leaf(i < n && pc[i] != NULL ? nb_neg(nb_var_of(tr, pc[i])) : nbi_zeros_like(tr, gv));
    }
    *dg = nbo_tuple(tr, ng, gi);
    return *dg != NULL;
}

/* The augmented vector field. args = (t, z = dict(y, a, g), (args, self)); self: dict(fn). */
static nb_status nbo_aug_term(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    const nb_tree *z = nb_tree_child(args, 1), *aux = nb_tree_child(args, 2);
    const nb_tree *fy = NULL;
    nb_tree *da = NULL, *dg = NULL;
    if (!nbo_adj_rhs(tr, self, (nb_tree *)nb_tree_child(args, 0), (nb_tree *)nb_tree_get(z, "y"),
                     nb_tree_get(z, "a"), nb_tree_get(z, "g"), nb_tree_child(aux, 0),
                     nb_tree_child(aux, 1), &fy, &da, &dg)) {
        return tr->status;
    }
    return nb_tree_dict(tr->ctx, 3, (const char *[]){"y", "a", "g"},
                        (nb_tree *[]){(nb_tree *)fy, da, dg}, out);
}

/* ---- the interpolating adjoint --------------------------------------------------------
 * As the backsolve adjoint's rule, but the forward pass keeps every accepted step's state
 * (the solve with SaveAt steps, t0's row in front: T [M], Y leaves [M, ...], rows 0..nacc)
 * and the reverse pass integrates only (a, g) from t1 back to t0, with y(t) the cubic
 * Hermite interpolant of the step holding t between the kept states and the term's values
 * there. y is never integrated backwards, so stiff dissipative problems are as stable
 * backwards as forwards; memory is the kept states, O(max_steps). */

/* The row i in 0..max(nacc - 1, 0) with T[i] <= t (along dir), by binary search: rows past
 * nacc are never read. */
static nb_var *nbo_ip_find(nb_trace *tr, nb_var *T, nb_var *nacc, nb_var *t, double dir) {
    int64_t M = nb_var_dim(T, 0), step = 1;
    nb_var *last = nb_maximum(nb_sub(nacc, nbo_i32(tr, 1)), nbo_i32(tr, 0));
    nb_var *lo = nbo_i32(tr, 0), *td = dir < 0 ? nb_neg(t) : t;
    while (step * 2 < M) {
        step *= 2;
    }
    for (; step >= 1; step /= 2) {
        nb_var *cand = nb_minimum(nb_add(lo, nbo_i32(tr, step)), last);
        nb_var *tc = nb_take(T, cand, 0);
        lo = nb_select(nb_le(dir < 0 ? nb_neg(tc) : tc, td), cand, lo);
    }
    return lo;
}

/* The term's leaves at (t, y) (y: leaves yv, tree ydef); self: dict(fn). */
static nb_var **nbo_ip_f(nb_trace *tr, const nb_tree *self, nb_var *t, const nb_treedef *ydef,
                         int64_t L, nb_var *const *yv, const nb_tree *ua, const nb_tree *us) {
    nb_tree *y = nbo_build(tr, ydef, L, yv);
    nb_tree *targs =
        y != NULL ? nbo_tuple(tr, 4, (nb_tree *[]){nb_leaf(t), y, (nb_tree *)ua, (nb_tree *)us})
                  : NULL;
    nb_tree *out = NULL;
    if (targs == NULL) {
        return NULL;
    }
    nb_status st = nbo_term_fn(tr, self, targs, &out);
    if (st != NB_OK || tr->status != NB_OK || out == NULL) {
        nb_tree_destroy(out);
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, st != NB_OK ? st : NB_ERR_MISUSE,
                          "nb_diffeqsolve: the interpolating adjoint: the term failed");
        }
        return NULL;
    }
    if (nbi_trace_own(tr, out) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_diffeqsolve: out of memory");
        return NULL;
    }
    int64_t n = 0;
    nb_var **f = nbo_leaves(tr, out, &n, NULL);
    if (f != NULL && n != L) {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_diffeqsolve: the term changed its structure");
        return NULL;
    }
    return f;
}

/* The interpolating adjoint's vector field. args = (t, z = dict(a, g), aux = (args, self,
 * T, Y, nacc)); self: dict(fn, dir, quintic). y(t) interpolates y and y' = f at kept
 * times (Hermite): after an explicit solver (quintic 1) at three -- the ends of the step
 * holding t and the next step's end (the previous step's start for the last step) --
 * O(h^6), as accurate as the 5th-order steps, 3 term calls; after a stiff solver at the
 * step's two ends (the cubic), 2 term calls. Why: the error of the three-point one carries
 * (t - tc)^2 y^(6) / 6! where the cubic's carries y^(4) / 4!, about 3 (h lambda)^2 times
 * more for a mode exp(lambda t) -- a gain where h |lambda| is small (explicit solvers) and a
 * loss on stiff steps, where h |lambda| >> 1. Measured (relative gradient error): Lotka-
 * Volterra with tsit5 at rtol 1e-8, cubic 2.5e-5, three-point 4.0e-8; Robertson with
 * rodas5p at rtol 1e-9, cubic 3.8e-8, three-point 1.6e-6. A quintic from y'' = J f at the
 * step's ends is worse still on stiff problems (8e-2 on Robertson at 1e-10): J amplifies
 * the kept states' off-manifold errors. */
static nb_status nbo_ip_term(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    const nb_tree *z = nb_tree_child(args, 1), *aux = nb_tree_child(args, 2);
    const nb_tree *ua = nb_tree_child(aux, 0), *us = nb_tree_child(aux, 1);
    const nb_tree *Ys = nb_tree_child(aux, 3);
    nb_var *t = nb_var_of(tr, nb_tree_child(args, 0)), *T = nb_var_of(tr, nb_tree_child(aux, 2));
    double dir = 1, quintic = 0;
    nb_tree_get_float(nb_tree_get(self, "dir"), &dir);
    nb_tree_get_float(nb_tree_get(self, "quintic"), &quintic);
    nb_var *nacc = nb_var_of(tr, nb_tree_child(aux, 4));
    nb_var *i = nbo_ip_find(tr, T, nacc, t, dir);
    nb_var *j = nb_add(i, nbo_i32(tr, 1));
    /* the third node: the next kept step's end, or the previous one's start at the last */
    nb_var *after = nb_le(nb_add(i, nbo_i32(tr, 2)), nacc);
    nb_var *kk = nb_select(after, nb_add(i, nbo_i32(tr, 2)),
                           nb_maximum(nb_sub(i, nbo_i32(tr, 1)), nbo_i32(tr, 0)));
    nb_var *three = nb_logical_and(nb_scalar_typed(tr, NB_DTYPE_BOOL, quintic),
                                   nb_le(nbo_i32(tr, 2), nacc)); /* else the cubic */
    nb_var *ta = nb_take(T, i, 0), *tb = nb_take(T, j, 0), *tcr = nb_take(T, kk, 0);
    /* unused (one kept step, or the cubic): the term is evaluated at (tb, yb) again, inside
     * the interval, and the differences see a distinct node with y and f of b's -- finite */
    nb_var *tf = nb_select(three, tcr, tb), *tc = nb_select(three, tcr, nb_sub(nb_add(tb, tb), ta));
    int64_t L = 0;
    nb_treedef *ydef = NULL;
    nb_var **al = nbo_leaves(tr, nb_tree_get(z, "a"), &L, &ydef);
    nb_var **ya = nbo_vars(tr, L), **yb = nbo_vars(tr, L), **yc = nbo_vars(tr, L);
    nb_var **y = nbo_vars(tr, L);
    if (al == NULL || ya == NULL || yb == NULL || yc == NULL || y == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }
    for (int64_t k = 0; k < L; k++) {
        nb_var *Yk = nb_var_of(tr, nb_tree_child(Ys, k));
        ya[k] = nb_take(Yk, i, 0);
        yb[k] = nb_take(Yk, j, 0);
        yc[k] = nb_select(three, nb_take(Yk, kk, 0), yb[k]);
    }
    nb_var **fa = nbo_ip_f(tr, self, ta, ydef, L, ya, ua, us);
    nb_var **fb = fa != NULL ? nbo_ip_f(tr, self, tb, ydef, L, yb, ua, us) : NULL;
    nb_var **fc = fb == NULL     ? NULL
                  : quintic != 0 ? nbo_ip_f(tr, self, tf, ydef, L, yc, ua, us)
                                 : fb;
    if (fc == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }
    /* Hermite interpolation of (y, f) at the nodes a, a, b, b, c, c in Newton's form:
     * y(t) = ya + fa w + c2 w^2 + c3 w^2 (t - tb) + c4 w^2 (t - tb)^2 + c5 w^2 (t - tb)^2
     * (t - tc), w = t - ta, from divided differences; c4 = c5 = 0 with one kept step */
    nb_var *hab = nb_sub(tb, ta), *hbc = nb_sub(tc, tb), *hac = nb_sub(tc, ta);
    nb_var *w = nb_sub(t, ta), *v = nb_sub(t, tb), *w2 = nb_square(w), *w2v = nb_mul(w2, v);
    nb_var *w2v2 = nb_mul(w2v, v), *w2v2x = nb_mul(w2v2, nb_sub(t, tc));
    nb_var *m = nb_cast(three, nb_var_dtype(t));
    for (int64_t k = 0; k < L; k++) {
        nb_var *dab = nb_div(nb_sub(yb[k], ya[k]), hab), *dbc = nb_div(nb_sub(yc[k], yb[k]), hbc);
        nb_var *e012 = nb_div(nb_sub(dab, fa[k]), hab), *e123 = nb_div(nb_sub(fb[k], dab), hab);
        nb_var *e234 = nb_div(nb_sub(dbc, fb[k]), hbc), *e345 = nb_div(nb_sub(fc[k], dbc), hbc);
        nb_var *e0123 = nb_div(nb_sub(e123, e012), hab), *e1234 = nb_div(nb_sub(e234, e123), hac);
        nb_var *e2345 = nb_div(nb_sub(e345, e234), hbc);
        nb_var *e01234 = nb_div(nb_sub(e1234, e0123), hac);
        nb_var *e12345 = nb_div(nb_sub(e2345, e1234), hac);
        nb_var *e012345 = nb_div(nb_sub(e12345, e01234), hac);
        nb_var *cubic =
            nb_add(nb_add(ya[k], nb_mul(fa[k], w)), nb_add(nb_mul(e012, w2), nb_mul(e0123, w2v)));
        nb_var *more = nb_add(nb_mul(e01234, w2v2), nb_mul(e012345, w2v2x));
        y[k] = quintic != 0 ? nb_add(cubic, nb_mul(m, more)) : cubic;
    }
    nb_tree *ytree = nbo_build(tr, ydef, L, y);
    nb_treedef_destroy(ydef);
    const nb_tree *fy = NULL;
    nb_tree *da = NULL, *dg = NULL;
    if (ytree == NULL ||
        !nbo_adj_rhs(tr, self, (nb_tree *)nb_tree_child(args, 0), ytree, nb_tree_get(z, "a"),
                     nb_tree_get(z, "g"), ua, us, &fy, &da, &dg)) {
        return tr->status;
    }
    return nb_tree_dict(tr->ctx, 2, (const char *[]){"a", "g"}, (nb_tree *[]){da, dg}, out);
}

/* Forward solve for the custom_vjp: args = (y0, args, self); self = dict(fn, cfg). */
static const nb_tree *nbo_bs_solve(nb_trace *tr, const nb_tree *self, const nb_tree *args) {
    nb_ode_opts o;
    if (!nbo_opts_dec(tr, nb_tree_get(self, "cfg"), &o)) {
        return NULL;
    }
    const nb_tree *us = nb_tree_child(args, 2), *ua = nb_tree_child(args, 1);
    return nbo_core(tr, (nb_tree *)nb_tree_get(self, "fn"),
                    nb_tree_kind_of(us) == NB_TREE_KIND_NULL ? NULL : us, nb_tree_child(args, 0),
                    nb_tree_kind_of(ua) == NB_TREE_KIND_NULL ? NULL : ua, &o, NB_LOOP_LAX);
}

static nb_status nbo_bs_primal(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    const nb_tree *sol = nbo_bs_solve(tr, self, args);
    if (sol == NULL) {
        return tr->status;
    }
    return nb_return(nbo_pack(tr, sol, nb_tree_num_leaves(nb_tree_child(args, 0))), out);
}

/* The interpolating adjoint's forward pass: the solve with SaveAt steps; *res gets (T, Y,
 * nacc, result) appended (Y a tuple of the state's leaves), and the returned solution is the
 * SaveAt t1 one (ys the row of the last accepted step: the same bits). */
static const nb_tree *nbo_ip_solve(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                   nb_tree **res) {
    nb_ode_opts o;
    if (!nbo_opts_dec(tr, nb_tree_get(self, "cfg"), &o)) {
        return NULL;
    }
    o.saveat.kind = NB_SAVEAT_STEPS;
    const nb_tree *us = nb_tree_child(args, 2), *ua = nb_tree_child(args, 1);
    const nb_tree *sol =
        nbo_core(tr, (nb_tree *)nb_tree_get(self, "fn"),
                 nb_tree_kind_of(us) == NB_TREE_KIND_NULL ? NULL : us, nb_tree_child(args, 0),
                 nb_tree_kind_of(ua) == NB_TREE_KIND_NULL ? NULL : ua, &o, NB_LOOP_LAX);
    if (sol == NULL) {
        return NULL;
    }
    int64_t L = 0;
    nb_treedef *ydef = NULL;
    nb_var **ys = nbo_leaves(tr, nb_tree_get(sol, "ys"), &L, &ydef);
    nb_var **y0 = ys != NULL ? nbo_leaves(tr, nb_tree_child(args, 0), &L, NULL) : NULL;
    nb_var **Y = nbo_vars(tr, L), **yT = nbo_vars(tr, L);
    nb_tree **Yl = nbi_arena_alloc(&tr->arena, (size_t)(L > 0 ? L : 1) * sizeof *Yl);
    if (y0 == NULL || Y == NULL || yT == NULL || Yl == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status == NB_OK ? (nbi_trace_err(tr, NB_ERR_OOM, "out of memory"), NULL) : NULL;
    }
    nb_var *ts = nb_var_of(tr, nb_tree_get(sol, "ts"));
    nb_var *nacc = nb_get(tr, sol, "stats.num_accepted_steps");
    nb_var *T =
        nb_concatenate(2, (nb_var *[]){nb_full(tr, ts->dtype, 1, (int64_t[]){1}, o.t0), ts}, 0);
    for (int64_t i = 0; i < L; i++) {
        int64_t shp[NB_MAX_RANK + 1];
        shp[0] = 1;
        memcpy(shp + 1, y0[i]->shape, (size_t)y0[i]->rank * sizeof *shp);
        Y[i] = nb_concatenate(2, (nb_var *[]){nb_reshape(y0[i], y0[i]->rank + 1, shp), ys[i]}, 0);
        yT[i] = nb_reshape(nb_take(Y[i], nacc, 0), y0[i]->rank + 1, shp);
        Yl[i] = nb_leaf(Y[i]);
    }
    nb_tree *yTt = nbo_build(tr, ydef, L, yT);
    nb_treedef_destroy(ydef);
    nb_tree *out = NULL;
    if (yTt == NULL ||
        nb_tree_dict(tr->ctx, 4, (const char *[]){"ys", "t_final", "result", "stats"},
                     (nb_tree *[]){yTt, (nb_tree *)nb_tree_get(sol, "t_final"),
                                   (nb_tree *)nb_tree_get(sol, "result"),
                                   (nb_tree *)nb_tree_get(sol, "stats")},
                     &out) != NB_OK ||
        nbi_trace_own(tr, out) != NB_OK) {
        return tr->status == NB_OK ? (nbi_trace_err(tr, NB_ERR_OOM, "out of memory"), NULL) : NULL;
    }
    nb_tree *Yt = nbo_tuple(tr, L, Yl);
    *res = Yt != NULL ? nbo_tuple(tr, 4,
                                  (nb_tree *[]){nb_leaf(T), Yt, nb_leaf(nacc),
                                                (nb_tree *)nb_tree_get(sol, "result")})
                      : NULL;
    return *res != NULL ? out : NULL;
}

static nb_status nbo_bs_fwd(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ode_opts o;
    if (!nbo_opts_dec(tr, nb_tree_get(self, "cfg"), &o)) {
        return tr->status;
    }
    nb_tree *ip = NULL;
    const nb_tree *sol = o.adjoint.kind == NB_ADJOINT_INTERPOLATED
                             ? nbo_ip_solve(tr, self, args, &ip)
                             : nbo_bs_solve(tr, self, args);
    if (sol == NULL) {
        return tr->status;
    }
    int64_t L = 0;
    nb_treedef *ydef = NULL;
    nb_var **ys = nbo_leaves(tr, nb_tree_get(sol, "ys"), &L, &ydef);
    nb_var **y0 = ys != NULL ? nbo_leaves(tr, nb_tree_child(args, 0), &L, NULL) : NULL;
    nb_var **yT = nbo_vars(tr, L);
    if (y0 == NULL || yT == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }
    for (int64_t i = 0; i < L; i++) {
        yT[i] = nb_reshape(ys[i], y0[i]->rank, y0[i]->shape);
    }
    nb_tree *yTt = nbo_build(tr, ydef, L, yT);
    nb_treedef_destroy(ydef);
    nb_var *p = nbo_pack(tr, sol, L);
    nb_tree *res = yTt != NULL ? nbo_tuple(tr, ip != NULL ? 4 : 3,
                                           (nb_tree *[]){yTt, (nb_tree *)nb_tree_child(args, 1),
                                                         (nb_tree *)nb_tree_child(args, 2), ip})
                               : NULL;
    nb_tree *pair =
        res != NULL && p != NULL ? nbo_tuple(tr, 2, (nb_tree *[]){nb_leaf(p), res}) : NULL;
    if (pair == NULL) {
        return tr->status;
    }
    *out = nb_tree_retain(pair);
    return NB_OK;
}

static nb_status nbo_bs_bwd(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ode_opts o;
    if (!nbo_opts_dec(tr, nb_tree_get(self, "cfg"), &o)) {
        return tr->status;
    }
    bool interp = o.adjoint.kind == NB_ADJOINT_INTERPOLATED;
    const char *who =
        interp ? "nb_diffeqsolve: interpolating adjoint" : "nb_diffeqsolve: backsolve";
    const nb_tree *res = nb_tree_child(args, 0);
    const nb_tree *ip = interp ? nb_tree_child(res, 3) : NULL;
    nb_var *ct = nb_var_of(tr, nb_tree_child(args, 1));
    const nb_tree *yT = nb_tree_child(res, 0), *ua = nb_tree_child(res, 1),
                  *us = nb_tree_child(res, 2);
    int64_t L = 0;
    nb_treedef *ydef = NULL;
    nb_var **yl = nbo_leaves(tr, yT, &L, &ydef);
    nb_var **al = nbo_vars(tr, L);
    if (yl == NULL || al == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }
    int64_t off = 0;
    for (int64_t i = 0; i < L; i++) {
        int64_t N = nb_var_size(yl[i]);
        al[i] = nb_reshape(nb_slice(ct, (int64_t[]){off}, (int64_t[]){off + N}, NULL), yl[i]->rank,
                           yl[i]->shape);
        off += N;
    }
    /* the float leaves of (args, self), and their accumulators g = 0 */
    int64_t cap = nb_tree_num_leaves(ua) + nb_tree_num_leaves(us) + 1, np = 0;
    nb_var **pv = nbo_vars(tr, cap);
    if (pv == NULL) {
        nb_treedef_destroy(ydef);
        return tr->status;
    }
    nbo_float_leaves(ua, NULL, pv, NULL, &np, cap);
    nbo_float_leaves(us, NULL, pv, NULL, &np, cap);
    nb_dtype dt = yl[0]->dtype;
    nb_tree **gi = nbi_arena_alloc(&tr->arena, (size_t)(np > 0 ? np : 1) * sizeof *gi);
    if (gi == NULL) {
        nb_treedef_destroy(ydef);
        return nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    }
    for (int64_t i = 0; i < np; i++) {
        if (pv[i]->dtype != dt) {
            char sig[64];
            nb_treedef_destroy(ydef);
            return nbi_trace_err(tr, NB_ERR_DTYPE,
                                 "%s: a float leaf of the term's args or bound data is %s while "
                                 "the state is %s -- the augmented system integrates them "
                                 "together: give them the state's dtype (or use the recursive "
                                 "checkpoint adjoint)",
                                 who, nbi_var_sig(sig, sizeof sig, pv[i]), nb_dtype_name(dt));
        }
        gi[i] = nb_leaf(nbi_zeros_like(tr, pv[i]));
    }
    nb_tree *ytree = nbo_build(tr, ydef, L, yl), *atree = nbo_build(tr, ydef, L, al);
    nb_tree *gtree = nbo_tuple(tr, np, gi);
    nb_treedef_destroy(ydef);
    nb_tree *z = NULL;
    if (ytree == NULL || atree == NULL || gtree == NULL ||
        (interp
             ? nb_tree_dict(tr->ctx, 2, (const char *[]){"a", "g"}, (nb_tree *[]){atree, gtree}, &z)
             : nb_tree_dict(tr->ctx, 3, (const char *[]){"y", "a", "g"},
                            (nb_tree *[]){ytree, atree, gtree}, &z)) != NB_OK ||
        nbi_trace_own(tr, z) != NB_OK) {
        return tr->status != NB_OK ? tr->status
                                   : nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    }
    /* the adjoint solve: from t1 back to t0 */
    nb_ode_opts b = o;
    b.t0 = o.t1;
    b.t1 = o.t0;
    b.dt0 = -o.dt0;
    b.solver = o.adjoint.solver >= 0 ? (nb_ode_solver)o.adjoint.solver : o.solver;
    if (o.adjoint.controller.adaptive || o.adjoint.controller.rtol > 0) {
        b.controller = o.adjoint.controller;
    }
    b.saveat.kind = NB_SAVEAT_T1;
    b.saveat.ts = NULL;
    b.saveat.n_ts = 0;
    b.t0_traced = b.t1_traced = b.ts_traced = NULL;
    b.explicit_term = NULL;
    b.jacobian = NULL;
    b.event = NULL;
    b.throw_on_failure = false;
    b.adjoint.kind = NB_ADJOINT_DIRECT;
    if (!nbo_check_opts(tr, &b)) {
        return tr->status;
    }
    nb_tree *fnref = NULL, *aself = NULL, *dirt = nbo_float(tr, o.t1 >= o.t0 ? 1.0 : -1.0);
    const nbo_tableau *ftab = nbo_tableau_get((int)o.solver);
    nb_tree *qt = nbo_float(tr, ftab->ros == NULL && ftab->dirk == NULL && !ftab->bdf ? 1 : 0);
    if (dirt == NULL || qt == NULL ||
        nb_tree_fnref(tr->ctx, interp ? (nb_fnptr)nbo_ip_term : (nb_fnptr)nbo_aug_term,
                      interp ? "interpolating_adjoint" : "backsolve_adjoint", &fnref) != NB_OK ||
        nbi_trace_own(tr, fnref) != NB_OK ||
        nb_tree_dict(tr->ctx, 3, (const char *[]){"fn", "dir", "quintic"},
                     (nb_tree *[]){(nb_tree *)nb_tree_get(self, "fn"), dirt, qt},
                     &aself) != NB_OK ||
        nbi_trace_own(tr, aself) != NB_OK) {
        return nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    }
    nb_tree *aux =
        interp
            ? nbo_tuple(tr, 5,
                        (nb_tree *[]){(nb_tree *)ua, (nb_tree *)us, (nb_tree *)nb_tree_child(ip, 0),
                                      (nb_tree *)nb_tree_child(ip, 1),
                                      (nb_tree *)nb_tree_child(ip, 2)})
            : nbo_tuple(tr, 2, (nb_tree *[]){(nb_tree *)ua, (nb_tree *)us});
    const nb_tree *sol = aux != NULL ? nbo_core(tr, fnref, aself, z, aux, &b, NB_LOOP_LAX) : NULL;
    if (sol == NULL) {
        return tr->status;
    }
    /* cotangents: a(t0) for y0, g(t0) for the float leaves of (args, self) */
    const nb_tree *ys = nb_tree_get(sol, "ys");
    int64_t La = 0, Lg = 0;
    nb_var **a0 = nbo_leaves(tr, nb_tree_get(ys, "a"), &La, NULL);
    nb_var **g0 = a0 != NULL ? nbo_leaves(tr, nb_tree_get(ys, "g"), &Lg, NULL) : NULL;
    if (g0 == NULL) {
        return tr->status;
    }
    /* a failed adjoint solve (max_steps, underflow, non-finite) never gives a gradient:
     * NaN cotangents, or with throw_on_failure the call's NB_ERR_RUNTIME */
    nb_var *bres = nb_get(tr, sol, "result");
    nb_var *bfail = nb_ne(bres, nb_scalar_typed(tr, NB_DTYPE_I32, 0));
    if (interp) { /* and a failed forward solve: its steps do not reach t1 */
        nb_var *fres = nb_var_of(tr, nb_tree_child(ip, 3));
        bfail = nb_logical_or(bfail, nb_ne(fres, nb_scalar_typed(tr, NB_DTYPE_I32, 0)));
    }
    nb_var *vals = nb_concatenate(
        5,
        (nb_var *[]){
            nb_reshape(nb_cast(nb_get(tr, sol, "t_final"), NB_DTYPE_F64), 1, (int64_t[]){1}),
            nb_reshape(nb_cast(bres, NB_DTYPE_F64), 1, (int64_t[]){1}),
            nb_full(tr, NB_DTYPE_F64, 1, (int64_t[]){1}, (double)b.max_steps),
            nb_full(tr, NB_DTYPE_F64, 1, (int64_t[]){1}, b.t1),
            nb_full(tr, NB_DTYPE_F64, 1, (int64_t[]){1}, (double)o.adjoint.kind)},
        0);
    for (int64_t i = 0; i < La + Lg; i++) {
        nb_var **v = i < La ? &a0[i] : &g0[i - La];
        const nb_var *like = i < La ? yl[i] : pv[i - La];
        *v = nb_reshape(*v, like->rank, like->shape);
        *v = nb_select(bfail, nb_scalar_typed(tr, like->dtype, NAN), *v);
        if (o.throw_on_failure) {
            *v = nbi_check(*v, bfail, vals, nbo_fail_msg_adjoint);
        }
    }
    int64_t k0 = 0, k1 = 0;
    nb_tree *c0 = nbo_rebuild(tr, yT, a0, &k0);
    nb_tree *c1 = nbo_rebuild(tr, nb_tree_kind_of(ua) == NB_TREE_KIND_NULL ? NULL : ua, g0, &k1);
    nb_tree *c2 = nbo_rebuild(tr, nb_tree_kind_of(us) == NB_TREE_KIND_NULL ? NULL : us, g0, &k1);
    nb_tree *r =
        c0 != NULL && c1 != NULL && c2 != NULL ? nbo_tuple(tr, 3, (nb_tree *[]){c0, c1, c2}) : NULL;
    if (r == NULL) {
        return tr->status;
    }
    *out = nb_tree_retain(r);
    return NB_OK;
}

static const nb_tree *nbo_backsolve(nb_trace *tr, nb_tree *fnref, const nb_tree *tuself,
                                    const nb_tree *y0, const nb_tree *args, const nb_ode_opts *o) {
    static const char who[] = "nb_diffeqsolve";
    nb_tree *cfg = nbo_opts_enc(tr, o), *self = NULL;
    nb_fn *f = NULL, *fwd = NULL, *bwd = NULL, *cv = NULL;
    nb_status st = cfg != NULL ? NB_OK : NB_ERR_OOM;
    if (st == NB_OK) {
        st = nb_tree_dict(tr->ctx, 2, (const char *[]){"fn", "cfg"}, (nb_tree *[]){fnref, cfg},
                          &self);
    }
    if (st == NB_OK) {
        st = nb_fn_create(tr->ctx, "diffeqsolve_backsolve", nbo_bs_primal, self, &f);
    }
    if (st == NB_OK) {
        st = nb_fn_create(tr->ctx, "diffeqsolve_backsolve_fwd", nbo_bs_fwd, self, &fwd);
    }
    if (st == NB_OK) {
        st = nb_fn_create(tr->ctx, "diffeqsolve_backsolve_bwd", nbo_bs_bwd, self, &bwd);
    }
    if (st == NB_OK) {
        st = nb_custom_vjp(f, fwd, bwd, &cv);
    }
    nb_tree_destroy(self);
    nb_fn_destroy(f);
    nb_fn_destroy(fwd);
    nb_fn_destroy(bwd);
    nb_tree *call = NULL;
    if (st == NB_OK) {
        call = nbo_tuple(tr, 3,
                         (nb_tree *[]){(nb_tree *)y0, args != NULL ? (nb_tree *)args : nbo_null(tr),
                                       tuself != NULL ? (nb_tree *)tuself : nbo_null(tr)});
    }
    if (st != NB_OK) {
        nb_fn_destroy(cv);
        nbi_trace_err(tr, st, "%s: out of memory", who);
        return NULL;
    }
    const nb_tree *r = call != NULL ? nb_apply(tr, cv, call) : NULL;
    nb_fn_destroy(cv);
    if (r == NULL) {
        return NULL;
    }
    int64_t L = 0;
    nb_treedef *ydef = NULL;
    nb_var **yl = nbo_leaves(tr, y0, &L, &ydef);
    const nb_tree *sol = yl != NULL ? nbo_unpack(tr, nb_var_of(tr, r), ydef, L, yl) : NULL;
    nb_treedef_destroy(ydef);
    return sol;
}

/* ---- the entry point ----------------------------------------------------------------- */

const nb_tree *nb_diffeqsolve(nb_trace *tr, nb_fn *term, const nb_tree *y0, const nb_tree *args,
                              const nb_ode_opts *opts) {
    static const char who[] = "nb_diffeqsolve";
    if (tr == NULL || tr->status != NB_OK) {
        return NULL;
    }
    nb_ode_opts o = opts != NULL ? *opts : nb_ode_opts_default();
    if (nb_tree_check(y0) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s: y0 is NULL or destroyed", who);
        return NULL;
    }
    if (args != NULL && nb_tree_check(args) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s: args is destroyed", who);
        return NULL;
    }
    nb_fn_body tbody = NULL;
    const nb_tree *tuself = NULL;
    if (!nbo_unwrap(tr, term, &tbody, &tuself, "the term") || !nbo_check_opts(tr, &o)) {
        return NULL;
    }
    nb_tree *fnref = NULL;
    if (nb_tree_fnref(tr->ctx, (nb_fnptr)tbody, term->name, &fnref) != NB_OK ||
        nbi_trace_own(tr, fnref) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    const nb_tree *sol;
    if (o.adjoint.kind == NB_ADJOINT_BACKSOLVE || o.adjoint.kind == NB_ADJOINT_INTERPOLATED) {
        sol = nbo_backsolve(tr, fnref, tuself, y0, args, &o);
    } else {
        sol =
            nbo_core(tr, fnref, tuself, y0, args, &o,
                     o.adjoint.kind == NB_ADJOINT_DIRECT ? NB_LOOP_BOUNDED : NB_LOOP_CHECKPOINTED);
    }
    return tr->status == NB_OK ? sol : NULL;
}
