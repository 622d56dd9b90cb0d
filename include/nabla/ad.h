/*
 * nabla/ad.h -- automatic differentiation: grad, value_and_grad, vjp, jvp.
 *
 * Each is a function transform: it takes an nb_fn and returns a new nb_fn, which can be
 * called (nb_fn_call), jitted (nb_jit), called inside other functions (nb_apply) and
 * transformed again -- jit(grad(f)), grad(grad(f)) and jvp(grad(f)) (Hessian-vector
 * products) all work and compile into one executable. Differentiation happens on the
 * traced IR: every primitive op has a VJP and a JVP rule written as more IR next to its
 * forward rule (src/ad/op_*.c), checked against central finite differences by
 * tests/ad/test_grad_conformance.c.
 *
 * Filtered gradients (Equinox's filter_grad). grad(f) differentiates with respect to the
 * FIRST argument -- args must be a tuple or list, and args[0] any pytree -- and returns a
 * gradient tree of exactly args[0]'s structure: a float array at every differentiable
 * float array leaf, and null everywhere else: integer and bool arrays, static leaves,
 * null leaves, leaves marked with nb_tree_freeze, and leaves a filter spec excludes. The
 * gradient's treedef therefore depends only on args[0]'s treedef (and the spec), which is
 * what optimizer states are built from (nb_grad_template).
 *
 * Conventions at kinks (as JAX): relu'(0) = 0; abs'(0) = 0 (sign(0)); maximum and minimum
 * split the gradient equally between tied operands; sqrt'(0) = inf; argmax/argmin, sign,
 * comparisons and integer ops have no gradient.
 *
 * Calls inside a differentiated function are always inlined (a non-inlined jit gives the
 * same numbers, traced into the gradient).
 */
#ifndef NABLA_AD_H
#define NABLA_AD_H

#include "core.h"
#include "fn.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_grad_opts {
    /* f returns (loss, aux): the gradient is of loss; aux is returned untouched. */
    bool has_aux;
    /* NULL, or a tree of bools shaped like args[0] (or a prefix of it: a bool at a node
     * applies to its whole subtree); false excludes a leaf from differentiation (its
     * gradient is null). Borrowed and retained by the new function; compared by value. */
    const nb_tree *filter_spec;
} nb_grad_opts;

NB_API nb_grad_opts nb_grad_opts_default(void);

/* g = grad(f): g(args) is the gradient of f(args) -- which must be a rank-0 float array
 * (the loss) -- with respect to args[0], as described above; with has_aux, g returns the
 * tuple (grads, aux). f is borrowed and retained. Returns a new reference. Errors at call
 * time: NB_ERR_STRUCTURE when args is not a tuple/list, NB_ERR_SHAPE when the loss is not
 * a scalar, NB_ERR_DTYPE when it is not float; with the usual message. */
NB_API nb_status nb_grad(nb_fn *f, const nb_grad_opts *opts, nb_fn **out);
/* g = value_and_grad(f): g(args) = (value, grads), or ((value, aux), grads) with has_aux. */
NB_API nb_status nb_value_and_grad(nb_fn *f, const nb_grad_opts *opts, nb_fn **out);

/* g = vjp(f): g((primals, ct)) = (f(primals), ct_primals): primals is f's argument tree,
 * ct has the structure of f's output (a float array for every float array output, null
 * elsewhere), and ct_primals has the structure of primals with null at non-differentiable
 * leaves. Errors at call time: a cotangent of another dtype than its output is
 * NB_ERR_DTYPE, of another shape NB_ERR_SHAPE, not an array or null NB_ERR_KIND (the
 * message names the leaf's path and both signatures). */
NB_API nb_status nb_vjp(nb_fn *f, nb_fn **out);
/* g = jvp(f): g((primals, tangents)) = (f(primals), tangents_out): tangents has the
 * structure of primals (an array of the same dtype and shape at each float array leaf,
 * null where no tangent is given); tangents_out has the structure of f's output (null at
 * non-float leaves). Errors at call time as for nb_vjp: a tangent of another dtype than its
 * primal is NB_ERR_DTYPE, of another shape NB_ERR_SHAPE. */
NB_API nb_status nb_jvp(nb_fn *f, nb_fn **out);

/* g = custom_vjp(f, fwd, bwd), JAX's custom_vjp: g computes what f computes, but reverse
 * mode through it uses a rule of your own instead of differentiating f's body:
 *   fwd(args) returns the pair (out, residuals) -- out as f(args) would, residuals any
 *     tree of values bwd needs;
 *   bwd((residuals, ct)) returns the cotangents of args: a tree of args' structure with
 *     an array of the leaf's dtype and shape at each float array leaf (null elsewhere).
 * out must be a single float array. Forward mode (nb_jvp) through g is an error, as in
 * JAX. f, fwd and bwd are borrowed and retained. Returns a new reference. */
NB_API nb_status nb_custom_vjp(nb_fn *f, nb_fn *fwd, nb_fn *bwd, nb_fn **out);

/* g = custom_jvp(f, jvp), JAX's custom_jvp: g computes what f computes, but derivatives
 * through it come from a rule of your own instead of f's body:
 *   jvp((primals, tangents)) returns the pair (out, tangent_out): out as f(primals) (it is
 *     not used: g's value is f's), tangent_out an array like out, linear in tangents --
 *     tangents has primals' structure with an array at each float array leaf (zeros where
 *     the caller differentiates nothing) and null elsewhere.
 * Forward mode (nb_jvp, jacfwd) calls the rule; reverse mode (grad, vjp, jacrev) applies
 * its transpose, found by reverse mode over the rule with respect to the tangents (JAX
 * transposes the rule likewise), so the rule must be built from differentiable ops and be
 * linear in the tangents. f's output must be a single float array. f and jvp are borrowed
 * and retained. Returns a new reference. */
NB_API nb_status nb_custom_jvp(nb_fn *f, nb_fn *jvp, nb_fn **out);

/* ---- vmap ------------------------------------------------------------------------------
 * g = vmap(f): g(args) computes f on every lane of a batch at once -- JAX's jax.vmap,
 * Equinox's filter_vmap. Each batched argument leaf carries the lanes along one of its
 * axes; f sees one lane (that axis removed), and every output leaf gets the lanes back
 * along its out axis. A value that does not depend on a batched argument is computed once
 * (and broadcast over the lanes only where an output needs it).
 *
 * in_axes: NULL batches every array leaf of args on axis 0 (static leaves never are); or a
 * tree shaped like args, or a prefix of it, whose leaves are an int (the batch axis of every
 * array under that node; negative counts back) or null (not batched: the same for every
 * lane). out_axes likewise for f's output (NULL: axis 0 everywhere; null at an output that
 * depends on a batched argument is an error). axis_size: the number of lanes when no
 * argument is batched (a vmapped init from nothing but static data), else 0 or equal to the
 * batched arguments' size. Every batched leaf must have the same number of lanes (the error
 * names both leaf paths).
 *
 * vmap is a transform of the traced IR like grad: every op has a batching rule next to its
 * other rules (src/ad/op_*.c; an op without one fails with NB_ERR_UNSUPPORTED naming it),
 * so vmap composes with grad, jvp, jit and itself in any order -- jit(vmap(grad(f))),
 * grad(vmap(f)) (the cotangent of an unbatched argument sums the lanes'), vmap(vmap(f)).
 * Calls inside a vmapped function are inlined; nb_debug_print prints the batched value
 * once. Loops (nb_while_loop, fori, scan, cond, switch, nb_diffeqsolve) batch as in JAX:
 * the batched loop runs while any lane's cond holds and a lane whose cond is false keeps
 * its carry (every carry leaf is batched), so each lane ends with its own loop's result --
 * an ODE solve's lanes each with their own steps, step sizes and result code -- and
 * reverse mode through it (checkpointed, bounded; a solve's adjoints) gives each lane its
 * own gradient. The finished lanes' body still runs (its result discarded): a body that
 * divides by something zero there gives NaN cotangents through a derivative unless it
 * guards that division (nb_diffeqsolve does: a finished lane's step of 0 becomes a small
 * step whose result is discarded, for every solver). nb_dynamic_slice and
 * nb_dynamic_update_slice whose start indices differ per lane (a loop counter under a
 * batched cond, an ODE solve's SaveAt steps rows, a direct adjoint's tape) become one
 * per-lane op -- each lane's block at its own starts, in place in a loop's buffer -- so
 * the program does not grow with B. Not yet: a derivative taken around a vmapped
 * nb_custom_vjp function (inside it, vmap(grad(f)), works) -- NB_ERR_UNSUPPORTED naming
 * the op. f is borrowed and retained; in_axes and out_axes are
 * retained and compared by value (part of the jit cache's identity).
 * Returns a new reference.
 *
 * Per-example gradients of a least-squares loss, the weights shared (in_axes null); each is
 * 2 (w . x - y) x:
 * [example vmap_grad.c]
 *     #include <nabla/nabla.h>
 *
 *     #include <stdio.h> // printf, fprintf
 *
 *     // args = (w f64[2], x f64[2], y f64[]): (w . x - y)^2
 *     static nb_status loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
 *                           nb_tree **out) {
 *         (void)self;
 *         nb_var *w = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
 *         nb_var *r = nb_sub(nb_dot(w, x), nb_get(tr, args, "[2]"));
 *         return nb_return(nb_square(r), out);
 *     }
 *
 *     int main(void) {
 *         nb_ctx *ctx = NULL;
 *         if (nb_ctx_create(NULL, &ctx) != NB_OK) return 1;
 *         double w[2] = {1, 2}, x[3][2] = {{1, 0}, {0, 1}, {1, 1}}, y[3] = {0, 1, 2};
 *         nb_array *aw = NULL, *ax = NULL, *ay = NULL;
 *         nb_tree *l[3] = {NULL, NULL, NULL}, *al[3] = {NULL, NULL, NULL};
 *         nb_tree *args = NULL, *axes = NULL, *g = NULL;
 *         nb_fn *f = NULL, *df = NULL, *per = NULL;
 *         nb_status st = nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, w, &aw);
 *         if (st == NB_OK)
 *             st = nb_array_from_data(ctx, NB_DTYPE_F64, 2, (int64_t[]){3, 2}, x, &ax);
 *         if (st == NB_OK)
 *             st = nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){3}, y, &ay);
 *         if (st == NB_OK) st = nb_tree_array(aw, &l[0]);
 *         if (st == NB_OK) st = nb_tree_array(ax, &l[1]);
 *         if (st == NB_OK) st = nb_tree_array(ay, &l[2]);
 *         if (st == NB_OK) st = nb_tree_tuple(ctx, 3, l, &args);
 *         if (st == NB_OK) st = nb_tree_null(ctx, &al[0]);  // w: the same for every example
 *         if (st == NB_OK) st = nb_tree_int(ctx, 0, &al[1]); // x: examples on axis 0
 *         if (st == NB_OK) st = nb_tree_int(ctx, 0, &al[2]); // y likewise
 *         if (st == NB_OK) st = nb_tree_tuple(ctx, 3, al, &axes);
 *         if (st == NB_OK) st = nb_fn_create(ctx, "loss", loss, NULL, &f);
 *         if (st == NB_OK) st = nb_grad(f, NULL, &df);
 *         nb_vmap_opts o = nb_vmap_opts_default();
 *         o.in_axes = axes;
 *         if (st == NB_OK) st = nb_vmap(df, &o, &per);
 *         if (st == NB_OK) st = nb_fn_call(per, args, &g); // dloss/dw per example: f64[3,2]
 *         if (st == NB_OK) {
 *             const double *d = nb_array_data(nb_tree_get_array(g));
 *             for (int i = 0; i < 3; i++)
 *                 printf("example %d: %g %g\n", i, d[2 * i], d[2 * i + 1]);
 *             //   example 0: 2 0
 *             //   example 1: 0 2
 *             //   example 2: 2 2
 *             if (d[0] != 2 || d[1] != 0 || d[3] != 2 || d[4] != 2) st = NB_ERR_INTERNAL;
 *         }
 *         if (st != NB_OK) fprintf(stderr, "%s\n", nb_ctx_errmsg(ctx));
 *         nb_tree_destroy(g); nb_fn_destroy(per); nb_fn_destroy(df); nb_fn_destroy(f);
 *         nb_tree_destroy(axes); nb_tree_destroy(args);
 *         for (int i = 0; i < 3; i++) { nb_tree_destroy(l[i]); nb_tree_destroy(al[i]); }
 *         nb_array_destroy(aw); nb_array_destroy(ax); nb_array_destroy(ay);
 *         nb_ctx_destroy(ctx);
 *         return st == NB_OK ? 0 : 1;
 *     }
 * [end of example]
 */
typedef struct nb_vmap_opts {
    const nb_tree *in_axes;  /* NULL: every array leaf on axis 0 */
    const nb_tree *out_axes; /* NULL: every output leaf on axis 0 */
    int64_t axis_size;       /* 0: from the batched arguments */
} nb_vmap_opts;

NB_API nb_vmap_opts nb_vmap_opts_default(void);
NB_API nb_status nb_vmap(nb_fn *f, const nb_vmap_opts *opts, nb_fn **out);

/* ---- Jacobians --------------------------------------------------------------------------
 * J = jacrev(f), jacfwd(f), jacobian(f): J(args) is the Jacobian of f(args) with respect to
 * args[0] (JAX's jax.jacrev, jax.jacfwd): f's output structure with every float leaf y
 * (shape Sy) replaced by a tree of args[0]'s structure whose float leaves x (shape Sx) hold
 * the block dy/dx of shape Sy + Sx (a scalar y gives the gradient's shapes, a scalar x the
 * output's); non-float leaves on either side are null. jacrev batches f's vjp over the
 * one-hot cotangents of y (one pass per output element, as one vmapped pass); jacfwd f's jvp
 * over the one-hot tangents of args[0]; jacobian picks jacfwd when args[0] has fewer float
 * elements than f's output, else jacrev. The two modes agree to rounding (they sum in
 * different orders). hessian(f) = jacfwd(jacrev(f)) for a scalar f: blocks Sx + Sx'. They
 * compose with jit, grad, vmap and loops like the other transforms; f is borrowed and
 * retained; each returns a new reference. A block of rank above 8 is NB_ERR_SHAPE at the
 * call. */
NB_API nb_status nb_jacrev(nb_fn *f, nb_fn **out);
NB_API nb_status nb_jacfwd(nb_fn *f, nb_fn **out);
NB_API nb_status nb_jacobian(nb_fn *f, nb_fn **out);
NB_API nb_status nb_hessian(nb_fn *f, nb_fn **out);

/* The tree grad would return for params (with filter_spec, which may be NULL), holding
 * zero arrays: a zero array of the leaf's dtype and shape at every differentiable leaf,
 * null elsewhere. Optimizer states are built from it (so their structure matches the
 * gradients from the first step on). Allocates; returns a new reference. */
NB_API nb_status nb_grad_template(const nb_tree *params, const nb_tree *filter_spec, nb_tree **out);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_AD_H */
