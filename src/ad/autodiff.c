/*
 * autodiff.c -- reverse and forward mode as transforms of a traced region.
 *
 * A region is a run of nodes of one trace (what a function's body emitted). Reverse mode
 * walks it backwards from the outputs' cotangents, calling each op's VJP rule; forward
 * mode walks it forwards from the inputs' tangents, calling each op's JVP rule. The rules
 * build more IR in the same trace with the public builders, so the result is an ordinary
 * graph: it compiles like any other, and transforms compose (grad of grad walks the
 * backward nodes of the inner grad like any others; jvp of grad gives Hessian-vector
 * products).
 *
 * Only *active* nodes are visited: nodes that depend on a differentiated input through
 * differentiable inputs and have a float output. Integer and bool values, and
 * stop_gradient, cut the dependence.
 */
#include "ad/ir.h"

#include <string.h>

bool nbi_is_float_var(const nb_var *v) {
    return v != NULL && nb_dtype_is_float(v->dtype);
}

nb_var *nbi_zeros_like(nb_trace *tr, const nb_var *v) {
    return nb_full(tr, v->dtype, v->rank, v->shape, 0.0);
}

nb_var *nbi_unbroadcast(nb_var *ct, int rank, const int64_t *shape) {
    if (ct == NULL || nb_var_is_poison(ct)) {
        return ct;
    }
    int r = ct->rank;
    int axes[NB_MAX_RANK];
    int n = 0;
    for (int i = 0; i < r; i++) {
        int j = i - (r - rank);
        if (j < 0 || (shape[j] == 1 && ct->shape[i] != 1)) {
            axes[n++] = i;
        }
    }
    nb_var *s = n > 0 ? nb_sum(ct, axes, n, true) : ct;
    return nb_reshape(s, rank, shape); /* drops the leading dims; no node when equal */
}

/* Mark the nodes of [0, end) that depend on a seed through differentiable inputs. */
static bool *nbi_active(nb_trace *tr, int32_t begin, int32_t end, int n_seed,
                        nb_var *const *seeds) {
    bool *act = nbi_arena_alloc(&tr->arena, (size_t)end + 1);
    if (act == NULL) {
        return NULL;
    }
    for (int i = 0; i < n_seed; i++) {
        if (seeds[i] != NULL && seeds[i]->id >= 0 && seeds[i]->id < end &&
            nbi_is_float_var(seeds[i])) {
            act[seeds[i]->id] = true;
        }
    }
    for (int32_t i = begin; i < end; i++) {
        nb_var *v = tr->g.nodes[i];
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        /* a loop's value is a byte buffer of its carry: active like a float value, so that
         * its rule runs (and reports what reverse mode through it needs) */
        if (act[i] || info->vjp == NULL || (!nbi_is_float_var(v) && v->op != NBI_OP_WHILE)) {
            continue;
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            if (!nbi_input_nondiff(info, j) && act[v->in[j]->id]) {
                act[i] = true;
                break;
            }
        }
    }
    return act;
}

nb_status nbi_vjp_region(nb_trace *tr, int32_t begin, int32_t end, int n_out, nb_var *const *outs,
                         nb_var *const *out_ct, int n_wrt, nb_var *const *wrt, nb_var **wrt_ct) {
    bool *act = nbi_active(tr, begin, end, n_wrt, wrt);
    nb_var ***loop_ct = NULL; /* per while node: its carry leaves' cotangents */
    nb_var **ct = nbi_arena_alloc(&tr->arena, ((size_t)end + 1) * sizeof(nb_var *));
    nb_var **in_ct = nbi_arena_alloc(&tr->arena, 64 * sizeof(nb_var *));
    if (act == NULL || ct == NULL || in_ct == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in reverse mode");
    }
    for (int i = 0; i < n_out; i++) {
        nb_var *o = outs[i];
        if (o == NULL || out_ct[i] == NULL || o->id < 0 || o->id >= end || !act[o->id]) {
            continue;
        }
        ct[o->id] = ct[o->id] ? nb_add(ct[o->id], out_ct[i]) : out_ct[i];
    }
    for (int32_t i = end - 1; i >= begin && tr->status == NB_OK; i--) {
        nb_var *v = tr->g.nodes[i];
        if (!act[i] || ct[i] == NULL) {
            continue;
        }
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        if (v->op == NBI_OP_CALL_OUTPUT && v->in[0]->op == NBI_OP_WHILE) {
            /* a loop's outputs: gather their cotangents for the loop's own rule */
            nb_var *w = v->in[0];
            int64_t k = v->at.ivalue, n_carry = w->at.a[2];
            if (loop_ct == NULL) {
                loop_ct = nbi_arena_alloc(&tr->arena, ((size_t)end + 1) * sizeof(nb_var **));
            }
            if (loop_ct != NULL && loop_ct[w->id] == NULL) {
                loop_ct[w->id] =
                    nbi_arena_alloc(&tr->arena, (size_t)(n_carry + 1) * sizeof(nb_var *));
            }
            if (loop_ct == NULL || loop_ct[w->id] == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in reverse mode");
            }
            nb_var **slot = &loop_ct[w->id][k];
            *slot = *slot ? nb_add(*slot, ct[i]) : ct[i];
            if (ct[w->id] == NULL) {
                ct[w->id] = ct[i]; /* marks the loop as reached */
            }
            continue;
        }
        if (v->n_in > 64) {
            in_ct = nbi_arena_alloc(&tr->arena, (size_t)v->n_in * sizeof(nb_var *));
            if (in_ct == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in reverse mode");
            }
        }
        memset(in_ct, 0, (size_t)v->n_in * sizeof(nb_var *));
        if (v->op == NBI_OP_WHILE) {
            nb_var **cts = loop_ct != NULL ? loop_ct[i] : NULL;
            if (cts == NULL) {
                cts = nbi_arena_alloc(&tr->arena, (size_t)(v->at.a[2] + 1) * sizeof(nb_var *));
                if (cts == NULL) {
                    return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in reverse mode");
                }
            }
            nbi_while_vjp(tr, v, cts, in_ct);
        } else {
            info->vjp(tr, v, ct[i], in_ct);
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            nb_var *x = v->in[j];
            if (in_ct[j] == NULL || nbi_input_nondiff(info, j) || !act[x->id]) {
                continue;
            }
            ct[x->id] = ct[x->id] ? nb_add(ct[x->id], in_ct[j]) : in_ct[j];
        }
    }
    for (int k = 0; k < n_wrt; k++) {
        nb_var *w = wrt[k];
        nb_var *c = (w->id >= 0 && w->id < end) ? ct[w->id] : NULL;
        wrt_ct[k] = c != NULL ? c : nbi_zeros_like(tr, w);
    }
    return tr->status;
}

nb_status nbi_jvp_region(nb_trace *tr, int32_t begin, int32_t end, int n_in, nb_var *const *ins,
                         nb_var *const *in_tan, int n_out, nb_var *const *outs, nb_var **out_tan) {
    nb_var **tan = nbi_arena_alloc(&tr->arena, ((size_t)end + 1) * sizeof(nb_var *));
    nb_var ***loop_tan = NULL; /* per while node: its carry leaves' tangents */
    nb_var **args = nbi_arena_alloc(&tr->arena, 64 * sizeof(nb_var *));
    if (tan == NULL || args == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in forward mode");
    }
    for (int i = 0; i < n_in; i++) {
        if (ins[i] != NULL && in_tan[i] != NULL && ins[i]->id >= 0 && ins[i]->id < end &&
            nbi_is_float_var(ins[i])) {
            nb_var *t = in_tan[i];
            tan[ins[i]->id] = tan[ins[i]->id] ? nb_add(tan[ins[i]->id], t) : t;
        }
    }
    for (int32_t i = begin; i < end && tr->status == NB_OK; i++) {
        nb_var *v = tr->g.nodes[i];
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        if ((info->jvp == NULL && v->op != NBI_OP_LOOP_REVERSE) ||
            (!nbi_is_float_var(v) && v->op != NBI_OP_WHILE && v->op != NBI_OP_LOOP_REVERSE) ||
            tan[i] != NULL) {
            continue;
        }
        bool any = false;
        if (v->op == NBI_OP_CALL_OUTPUT && v->in[0]->op == NBI_OP_WHILE) {
            /* a loop's output: its tangent was made with the loop's */
            nb_var **lt = loop_tan != NULL ? loop_tan[v->in[0]->id] : NULL;
            tan[i] = lt != NULL ? lt[v->at.ivalue] : NULL;
            continue;
        }
        if (v->n_in > 64) {
            args = nbi_arena_alloc(&tr->arena, (size_t)v->n_in * sizeof(nb_var *));
            if (args == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in forward mode");
            }
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            args[j] = nbi_input_nondiff(info, j) ? NULL : tan[v->in[j]->id];
            any = any || args[j] != NULL;
        }
        if (any && v->op == NBI_OP_LOOP_REVERSE) {
            return nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                                 "forward mode through the reverse of a checkpointed loop (a "
                                 "second derivative through a loop) is not supported");
        }
        if (any && v->op == NBI_OP_WHILE) {
            if (v->at.a[4] != NB_LOOP_LAX && v->at.a[4] != NB_LOOP_BOUNDED &&
                v->at.a[4] != NB_LOOP_CHECKPOINTED) {
                return nbi_trace_err(tr, NB_ERR_INTERNAL, "a loop of unknown kind");
            }
            if (loop_tan == NULL) {
                loop_tan = nbi_arena_alloc(&tr->arena, ((size_t)end + 1) * sizeof(nb_var **));
            }
            nb_var **lt = nbi_arena_alloc(&tr->arena, (size_t)(v->at.a[2] + 1) * sizeof(nb_var *));
            if (loop_tan == NULL || lt == NULL) {
                return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in forward mode");
            }
            nbi_while_jvp(tr, v, args, lt);
            loop_tan[i] = lt;
            continue;
        }
        if (any) {
            tan[i] = info->jvp(tr, v, args);
        }
    }
    for (int k = 0; k < n_out; k++) {
        nb_var *o = outs[k];
        nb_var *t = (o->id >= 0 && o->id < end) ? tan[o->id] : NULL;
        out_tan[k] = t != NULL ? t : nbi_zeros_like(tr, o);
    }
    return tr->status;
}
