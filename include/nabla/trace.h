/*
 * nabla/trace.h -- symbolic values and the primitive ops that build the IR.
 *
 * A user function (an nb_fn, see fn.h) is written once against symbolic values: nabla
 * calls it with a trace (nb_trace) and argument trees whose array leaves have been
 * replaced by vars (nb_var), and every op below appends a node to the trace's IR, checking
 * shapes and dtypes as it goes. No numbers are computed while tracing.
 *
 * Errors are sticky. An op never returns NULL for valid input and never needs its result
 * checked: if it fails (say, a shape mismatch), it records one message on the trace --
 * naming the op, the shapes, the function being traced and, where known, the leaf path --
 * and returns the trace's *poison* var. Every later op that receives poison returns poison
 * without a new message, so the first error is the one reported. The trace then fails with
 * that message, and the body's own return value does not matter. A body reads naturally:
 *
 *     nb_var *h = nb_tanh(nb_add(nb_matmul(x, w1), b1));
 *     nb_var *y = nb_matmul(h, w2);
 *
 * Vars belong to their trace and are freed with it; never keep one after the body returns.
 *
 * Broadcasting follows numpy: shapes are aligned from the right, and a dim of 1 stretches.
 * Binary ops need equal dtypes, except that a *weak* scalar (nb_scalar) takes the dtype of
 * the other operand, as Python scalars do in JAX.
 */
#ifndef NABLA_TRACE_H
#define NABLA_TRACE_H

#include "array.h"
#include "core.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_trace nb_trace;
typedef struct nb_var nb_var;

/* ---- the trace ---------------------------------------------------------------------- */
/* The context of the trace (borrowed). */
NB_API nb_ctx *nb_trace_ctx(const nb_trace *tr);
/* NB_OK while no op has failed, else the sticky error's status. */
NB_API nb_status nb_trace_status(const nb_trace *tr);
/* Record an error of the user's own (e.g. an unexpected argument) with the same sticky
 * rule; returns status. The message gets the traced function's name appended. */
NB_API nb_status nb_trace_fail(nb_trace *tr, nb_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- vars in and out of trees ------------------------------------------------------- */
/* The var at path in t (an argument or bound-data tree handed to the body), e.g.
 * nb_get(tr, args, "x") or nb_get(tr, self, "layers[%d].weight", i) (printf-style). A
 * missing path or a leaf that is not a var is a sticky error naming the path. */
NB_API nb_var *nb_get(nb_trace *tr, const nb_tree *t, const char *path_fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The var held by a var leaf (or poison with an error if leaf is anything else). */
NB_API nb_var *nb_var_of(nb_trace *tr, const nb_tree *leaf);
/* A var leaf for building output trees. The tree is owned by the trace (released when the
 * trace ends), so it can be passed straight to nb_tree_dict & co, which borrow it. */
NB_API nb_tree *nb_leaf(nb_var *v);
/* Finish a body with a single output: *out = a new var leaf of v (owned by the caller, i.e.
 * by nabla's tracing machinery). Returns the trace's status. */
NB_API nb_status nb_return(nb_var *v, nb_tree **out);

/* ---- var accessors ------------------------------------------------------------------ */
NB_API nb_trace *nb_var_trace(const nb_var *v);
NB_API nb_dtype nb_var_dtype(const nb_var *v);
NB_API int nb_var_rank(const nb_var *v);              /* -1 for NULL or poison */
NB_API const int64_t *nb_var_shape(const nb_var *v);  /* borrowed; NULL for NULL/poison */
NB_API int64_t nb_var_dim(const nb_var *v, int axis); /* negative axis counts back */
NB_API int64_t nb_var_size(const nb_var *v);
NB_API bool nb_var_is_poison(const nb_var *v);

/* ---- constants ---------------------------------------------------------------------- */
/* A weak scalar: adopts the other operand's dtype in binary ops (f32 when alone). */
NB_API nb_var *nb_scalar(nb_trace *tr, double value);
/* A double given for an integer dtype -- nb_scalar_typed, nb_full, nb_pad's fill value, like
 * nb_cast of a float -- is converted by one rule everywhere: truncated toward zero, values
 * beyond the type's range saturate at its min/max, NaN becomes 0 (for bool: anything
 * nonzero, NaN included, is true). Fused or not, the same element comes out. */
/* A rank-0 constant of a given dtype (not weak). */
NB_API nb_var *nb_scalar_typed(nb_trace *tr, nb_dtype dtype, double value);
/* A constant array of the shape, every element value. */
NB_API nb_var *nb_full(nb_trace *tr, nb_dtype dtype, int rank, const int64_t *shape, double value);
/* A constant holding a's current data (copied at trace time, so later writes to a are not
 * seen by the compiled function; to feed changing data, pass it as an argument). */
NB_API nb_var *nb_constant(nb_trace *tr, const nb_array *a);
/* numpy-style iota: the index along axis, broadcast over the shape. */
NB_API nb_var *nb_iota(nb_trace *tr, nb_dtype dtype, int rank, const int64_t *shape, int axis);

/* ---- elementwise unary (float dtypes unless noted) ----------------------------------
 * Accuracy. Transcendentals run SLEEF's vector functions (dispatched to the CPU's widest
 * ISA), in one of two variants chosen per op: u10 (error within 1.0 ULP) where the value
 * itself matters -- exp, expm1, log, log1p, sin, cos, tan, erf, pow and the exp/log1p
 * inside sigmoid, softplus and gelu; u35 (within 3.5 ULP, 2.7x faster) for tanh, an
 * activation whose consumers never need the last bits. sqrt, rsqrt (1/sqrt), reciprocal,
 * square and the arithmetic ops are IEEE operations, correctly rounded. Results are the
 * same for any thread count and whether or not ops are fused -- bit for bit, except the
 * bits of a NaN: a NaN is a NaN on every path, but its sign and payload may differ between
 * fused, folded and op-by-op evaluation (IEEE 754 does not fix them either; the CPU's
 * vector and scalar instructions propagate them differently). Thread counts do not change
 * them. */
NB_API nb_var *nb_neg(nb_var *x);    /* any numeric dtype */
NB_API nb_var *nb_abs(nb_var *x);    /* any numeric dtype */
NB_API nb_var *nb_sign(nb_var *x);   /* any numeric dtype; sign(0) = 0, sign(NaN) = NaN */
NB_API nb_var *nb_exp(nb_var *x);    /* SLEEF u10 */
NB_API nb_var *nb_expm1(nb_var *x);  /* SLEEF u10 */
NB_API nb_var *nb_log(nb_var *x);    /* SLEEF u10 */
NB_API nb_var *nb_log1p(nb_var *x);  /* SLEEF u10 */
NB_API nb_var *nb_sqrt(nb_var *x);   /* correctly rounded */
NB_API nb_var *nb_rsqrt(nb_var *x);  /* 1 / sqrt(x): two correctly rounded operations */
NB_API nb_var *nb_square(nb_var *x); /* any numeric dtype */
NB_API nb_var *nb_reciprocal(nb_var *x);
NB_API nb_var *nb_sin(nb_var *x);     /* SLEEF u10 */
NB_API nb_var *nb_cos(nb_var *x);     /* SLEEF u10 */
NB_API nb_var *nb_tan(nb_var *x);     /* SLEEF u10 */
NB_API nb_var *nb_tanh(nb_var *x);    /* SLEEF u35: within 3.5 ULP */
NB_API nb_var *nb_sigmoid(nb_var *x); /* 1 / (1 + exp(-x)), stable for large |x|; exp u10 */
NB_API nb_var *nb_relu(nb_var *x);    /* any numeric dtype; max(x, 0) */
/* gelu, tanh form: x/2 (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))), computed as
 * x sigmoid(2 sqrt(2/pi)(x + 0.044715 x^3)) (the same function, without cancellation;
 * exp u10) */
NB_API nb_var *nb_gelu(nb_var *x);
NB_API nb_var *nb_softplus(nb_var *x); /* log(1 + exp(x)), stable for large |x|; u10 */
NB_API nb_var *nb_erf(nb_var *x);      /* SLEEF u10 */

/* ---- elementwise binary (broadcasting; equal dtypes or a weak scalar) --------------- */
NB_API nb_var *nb_add(nb_var *a, nb_var *b);
NB_API nb_var *nb_sub(nb_var *a, nb_var *b);
NB_API nb_var *nb_mul(nb_var *a, nb_var *b);
/* Float division for float dtypes; for integers, C's truncating division, and division by
 * zero gives 0 (never a trap). */
NB_API nb_var *nb_div(nb_var *a, nb_var *b);
NB_API nb_var *nb_pow(nb_var *a, nb_var *b);     /* float dtypes; SLEEF u10 */
NB_API nb_var *nb_maximum(nb_var *a, nb_var *b); /* NaN-propagating, as numpy */
NB_API nb_var *nb_minimum(nb_var *a, nb_var *b);
/* Comparisons give bool. */
NB_API nb_var *nb_eq(nb_var *a, nb_var *b);
NB_API nb_var *nb_ne(nb_var *a, nb_var *b);
NB_API nb_var *nb_lt(nb_var *a, nb_var *b);
NB_API nb_var *nb_le(nb_var *a, nb_var *b);
NB_API nb_var *nb_gt(nb_var *a, nb_var *b);
NB_API nb_var *nb_ge(nb_var *a, nb_var *b);
/* Logical ops on bool operands. */
NB_API nb_var *nb_logical_and(nb_var *a, nb_var *b);
NB_API nb_var *nb_logical_or(nb_var *a, nb_var *b);
NB_API nb_var *nb_logical_not(nb_var *x);
/* where(cond, a, b): cond is bool; the three broadcast together; a and b share a dtype. */
NB_API nb_var *nb_select(nb_var *cond, nb_var *a, nb_var *b);
/* Debugging: x unchanged, and at run time, each time this point of the computation runs
 * (in order with the other prints, inside loops every step), "label: <x as numpy prints
 * it>" is passed to the context's log callback at NB_LOG_LEVEL_INFO whatever its level, or
 * written to stderr when there is none -- JAX's jax.debug.print. The print is kept even if
 * the returned var is not used; derivatives pass through it (the primal values print).
 * Under reverse mode a loop's steps print in its forward run, once; a checkpointed loop's
 * reversal prints again the steps it recomputes (as JAX under remat).
 * label is copied (its first 255 bytes). */
NB_API nb_var *nb_debug_print(nb_var *x, const char *label);
/* Convert to dtype (C rules; float to int truncates toward zero, out-of-range values
 * saturate, NaN becomes 0; anything nonzero becomes true). */
NB_API nb_var *nb_cast(nb_var *x, nb_dtype dtype);

/* ---- reductions --------------------------------------------------------------------- */
/* Over the n_axes axes listed (negative axes count back; axes may be NULL to reduce over
 * every axis), keeping them as size-1 dims when keepdims. Reductions are computed in a
 * fixed order that does not depend on the thread count: results are bit-identical run to
 * run. sum/prod of ints stay in the dtype (wrapping); mean is for float dtypes. max/min
 * propagate NaN; over an empty axis max/min are an error, sum is 0, prod is 1. */
NB_API nb_var *nb_sum(nb_var *x, const int *axes, int n_axes, bool keepdims);
NB_API nb_var *nb_mean(nb_var *x, const int *axes, int n_axes, bool keepdims);
NB_API nb_var *nb_max(nb_var *x, const int *axes, int n_axes, bool keepdims);
NB_API nb_var *nb_min(nb_var *x, const int *axes, int n_axes, bool keepdims);
NB_API nb_var *nb_prod(nb_var *x, const int *axes, int n_axes, bool keepdims);
/* The first index of the max/min along one axis, as i64 (NaN counts as the max, as numpy). */
NB_API nb_var *nb_argmax(nb_var *x, int axis, bool keepdims);
NB_API nb_var *nb_argmin(nb_var *x, int axis, bool keepdims);
/* Composites, built from the primitives in their numerically stable forms:
 * logsumexp(x) = m + log(sum(exp(x - m))) with m = stop_gradient(max(x)) (m = 0 where
 * max is infinite); softmax = exp(x - m) / sum(...); log_softmax = x - logsumexp(x). */
NB_API nb_var *nb_logsumexp(nb_var *x, const int *axes, int n_axes, bool keepdims);
NB_API nb_var *nb_softmax(nb_var *x, int axis);
NB_API nb_var *nb_log_softmax(nb_var *x, int axis);

/* ---- shapes ------------------------------------------------------------------------- */
/* One dim may be -1 (inferred). */
NB_API nb_var *nb_reshape(nb_var *x, int rank, const int64_t *shape);
NB_API nb_var *nb_broadcast_to(nb_var *x, int rank, const int64_t *shape);
/* perm lists rank axes (a permutation); NULL reverses the axes. */
NB_API nb_var *nb_transpose(nb_var *x, const int *perm);
NB_API nb_var *nb_expand_dims(nb_var *x, int axis);
/* Remove the listed size-1 axes (NULL: every size-1 axis). */
NB_API nb_var *nb_squeeze(nb_var *x, const int *axes, int n_axes);
/* x[start:stop:step] per axis (rank entries each; NULL step means 1). Negative start/stop
 * count back from the end; values are clamped as in Python; step may be negative. */
NB_API nb_var *nb_slice(nb_var *x, const int64_t *start, const int64_t *stop, const int64_t *step);
/* Join n >= 1 vars along an existing axis (concatenate) or a new one (stack). n < 1 or a NULL
 * xs is a sticky error on the trace being traced (NB_ERR_INVALID / NB_ERR_MISUSE). */
NB_API nb_var *nb_concatenate(int n, nb_var *const *xs, int axis);
NB_API nb_var *nb_stack(int n, nb_var *const *xs, int axis);
/* Constant padding: lo[i] and hi[i] >= 0 elements before and after along axis i; value is
 * converted to x's dtype as nb_full converts it (above). */
NB_API nb_var *nb_pad(nb_var *x, const int64_t *lo, const int64_t *hi, double value);
/* numpy.take(x, indices, axis): the result's shape is x.shape[:axis] + indices.shape +
 * x.shape[axis+1:]. indices are i32 or i64; out-of-range indices are clamped (as JAX's
 * default), never read outside x. */
NB_API nb_var *nb_take(nb_var *x, nb_var *indices, int axis);
/* numpy.take_along_axis(x, indices, axis): indices has x's rank and broadcasts with x on
 * every other axis; picks one element per position along axis (clamped). */
NB_API nb_var *nb_take_along_axis(nb_var *x, nb_var *indices, int axis);
/* One-hot encoding of integer indices: shape indices.shape + [depth]; out-of-range indices
 * give a row of zeros. */
NB_API nb_var *nb_one_hot(nb_var *indices, int64_t depth, nb_dtype dtype);
/* A slice of fixed sizes whose start indices are rank-0 integer vars known only at run
 * time; starts are clamped so that the slice stays inside x (as XLA). */
NB_API nb_var *nb_dynamic_slice(nb_var *x, nb_var *const *starts, const int64_t *sizes);
/* x with update written at the (clamped) start indices. */
NB_API nb_var *nb_dynamic_update_slice(nb_var *x, nb_var *update, nb_var *const *starts);

/* ---- linear algebra ----------------------------------------------------------------- */
/* numpy.matmul: rank-1 operands are promoted (and the added dim removed after); batch dims
 * broadcast. Float dtypes go to BLIS; integer dtypes use a plain loop. */
NB_API nb_var *nb_matmul(nb_var *a, nb_var *b);
/* Inner product of two rank-1 vars of equal length (a rank-0 result). */
NB_API nb_var *nb_dot(nb_var *a, nb_var *b);

/* ---- autodiff markers --------------------------------------------------------------- */
/* The identity in the forward pass; blocks gradients (the gradient issue gives it effect). */
NB_API nb_var *nb_stop_gradient(nb_var *x);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_TRACE_H */
