/*
 * ir_print.c -- the stable text form of a graph, and the verifier run after every pass.
 *
 * Text form (pinned by golden tests; change it only together with them):
 *     fn mlp(%0: f32[16,2], %1: f32[2,32]) {
 *       %2: f32[16,32] = matmul %0, %1
 *       %3: f32[] = full {value=3}
 *       %4: f32[16,32] = add %2, %3
 *       return (%4)
 *     }
 * Values are numbered by their position in the graph; attributes print in a fixed order.
 */
#include "ad/ir.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void nbi_print_ints32(nbi_sbuf *s, const char *name, const int32_t *v, int n) {
    nbi_sbuf_printf(s, "%s=[", name);
    for (int i = 0; i < n; i++) {
        nbi_sbuf_printf(s, i ? ",%d" : "%d", (int)v[i]);
    }
    nbi_sbuf_putc(s, ']');
}

static void nbi_print_ints64(nbi_sbuf *s, const char *name, const int64_t *v, int n) {
    nbi_sbuf_printf(s, "%s=[", name);
    for (int i = 0; i < n; i++) {
        nbi_sbuf_printf(s, i ? ",%lld" : "%lld", (long long)v[i]);
    }
    nbi_sbuf_putc(s, ']');
}

static void nbi_print_attrs(nbi_sbuf *s, const nb_var *v) {
    const nbi_attrs *a = &v->at;
    int r_in = v->n_in > 0 ? v->in[0]->rank : 0;
    switch ((nbi_op)v->op) {
    case NBI_OP_FULL:
        nbi_sbuf_printf(s, " {value=%.17g}", a->value);
        break;
    case NBI_OP_IOTA:
        nbi_sbuf_printf(s, " {axis=%d}", (int)a->axis);
        break;
    case NBI_OP_CONST: {
        const nb_array *arr = a->array;
        int64_t n = nb_array_size(arr);
        nbi_sbuf_puts(s, " {values=[");
        for (int64_t i = 0; i < n && i < 6; i++) {
            double x = 0;
            nb_array_get_flat(arr, i, &x);
            nbi_sbuf_printf(s, i ? ", %.9g" : "%.9g", x);
        }
        nbi_sbuf_puts(s, n > 6 ? ", ...]}" : "]}");
        break;
    }
    case NBI_OP_CAST:
        nbi_sbuf_printf(s, " {to=%s}", nb_dtype_name(a->to));
        break;
    case NBI_OP_SUM:
    case NBI_OP_MAX:
    case NBI_OP_MIN:
    case NBI_OP_PROD:
        nbi_sbuf_puts(s, " {");
        nbi_print_ints32(s, "axes", a->axes, a->n_axes);
        nbi_sbuf_printf(s, ", keepdims=%s}", a->keepdims ? "true" : "false");
        break;
    case NBI_OP_ARGMAX:
    case NBI_OP_ARGMIN:
        nbi_sbuf_printf(s, " {axis=%d, keepdims=%s}", (int)a->axis, a->keepdims ? "true" : "false");
        break;
    case NBI_OP_TRANSPOSE:
        nbi_sbuf_puts(s, " {");
        nbi_print_ints32(s, "perm", a->axes, r_in);
        nbi_sbuf_putc(s, '}');
        break;
    case NBI_OP_SLICE:
        nbi_sbuf_puts(s, " {");
        nbi_print_ints64(s, "start", a->a, r_in);
        nbi_sbuf_puts(s, ", ");
        nbi_print_ints64(s, "stop", a->b, r_in);
        nbi_sbuf_puts(s, ", ");
        nbi_print_ints64(s, "step", a->c, r_in);
        nbi_sbuf_putc(s, '}');
        break;
    case NBI_OP_PAD:
        nbi_sbuf_puts(s, " {");
        nbi_print_ints64(s, "lo", a->a, r_in);
        nbi_sbuf_puts(s, ", ");
        nbi_print_ints64(s, "hi", a->b, r_in);
        nbi_sbuf_printf(s, ", value=%.17g}", a->value);
        break;
    case NBI_OP_CONCAT:
    case NBI_OP_TAKE:
    case NBI_OP_TAKE_ALONG:
        nbi_sbuf_printf(s, " {axis=%d}", (int)a->axis);
        break;
    case NBI_OP_ONE_HOT:
        nbi_sbuf_printf(s, " {depth=%lld, dtype=%s}", (long long)a->ivalue, nb_dtype_name(a->to));
        break;
    case NBI_OP_DYN_SLICE:
        nbi_sbuf_puts(s, " {");
        nbi_print_ints64(s, "sizes", a->a, v->rank);
        nbi_sbuf_puts(s, nbi_dyn_lanes(v) ? ", per_lane}" : "}");
        break;
    case NBI_OP_DYN_UPDATE:
        if (nbi_dyn_lanes(v)) {
            nbi_sbuf_puts(s, " {per_lane}");
        }
        break;
    case NBI_OP_MATMUL:
        if (a->axes[0] || a->axes[1]) {
            nbi_sbuf_printf(s, " {transposed=[%s%s%s]}", a->axes[0] ? "a" : "",
                            a->axes[0] && a->axes[1] ? "," : "", a->axes[1] ? "b" : "");
        }
        break;
    case NBI_OP_LU_SOLVE:
    case NBI_OP_SOLVE:
    case NBI_OP_CHOLESKY_SOLVE:
    case NBI_OP_TRI_SOLVE: { /* op_decomp.c's flags: 1 transpose, 2 vector, 4 lower, 8 unit */
        static const char *const names[4] = {"transpose", "vector", "lower", "unit_diagonal"};
        bool any = false;
        for (int b = 0; b < 4; b++) {
            if (a->ivalue & (1 << b)) {
                nbi_sbuf_printf(s, "%s%s", any ? ", " : " {", names[b]);
                any = true;
            }
        }
        if (any) {
            nbi_sbuf_putc(s, '}');
        }
        break;
    }
    case NBI_OP_CALL_OUTPUT:
    case NBI_OP_FUSED_OUTPUT:
        nbi_sbuf_printf(s, " {index=%lld}", (long long)a->ivalue);
        break;
    case NBI_OP_RNG_SPLIT:
        nbi_sbuf_printf(s, " {n=%lld}", (long long)a->ivalue);
        break;
    case NBI_OP_RNG_UNIFORM:
    case NBI_OP_RNG_TRUNCATED_NORMAL: { /* the second bound is a double's bits in b[0] */
        double hi;
        memcpy(&hi, &a->b[0], sizeof hi);
        bool u = v->op == NBI_OP_RNG_UNIFORM;
        nbi_sbuf_printf(s, " {%s=%.17g, %s=%.17g}", u ? "lo" : "lower", a->value,
                        u ? "hi" : "upper", hi);
        break;
    }
    case NBI_OP_RNG_BERNOULLI:
        nbi_sbuf_printf(s, " {p=%.17g}", a->value);
        break;
    case NBI_OP_FUSED: { /* {r0 = mul x0 x1; r1 = add r0 x2; r2 = tanh r1} */
        const nbi_fprog *p = a->callee;
        nbi_sbuf_puts(s, " {");
        for (int32_t i = 0; i < p->n_instr; i++) {
            const nbi_finstr *in = &p->ins[i];
            nbi_sbuf_printf(s, "%sr%d = %s", i ? "; " : "", (int)i, nbi_op_name((nbi_op)in->op));
            for (int j = 0; j < in->n_in; j++) {
                if (in->src[j] >= 0) {
                    nbi_sbuf_printf(s, " r%d", (int)in->src[j]);
                } else {
                    nbi_sbuf_printf(s, " x%d", (int)(-in->src[j] - 1));
                }
            }
        }
        for (int32_t e = 0; e < p->n_ext; e++) { /* x1 = view(offset=1, strides=[1]) */
            if (p->view_mask & (1u << e)) {
                nbi_sbuf_printf(s, "; x%d = view(offset=%lld, ", (int)e, (long long)p->view_off[e]);
                nbi_print_ints64(s, "strides", p->view_st[e], p->map_rank);
                if (p->pad_mask & (1u << e)) {
                    nbi_sbuf_puts(s, ", ");
                    nbi_print_ints64(s, "pad_lo", p->pad_lo[e], p->map_rank);
                    nbi_sbuf_printf(s, ", value=%.17g, ", p->pad_value[e]);
                    nbi_print_ints64(s, "within", p->pad_dims[e], p->map_rank);
                }
                nbi_sbuf_putc(s, ')');
            }
        }
        for (int32_t k = 0; k < p->n_store; k++) { /* ; store r2, r5: fused_output 0, 1 */
            nbi_sbuf_printf(s, "%sr%d", k ? ", " : "; store ", (int)p->store[k]);
        }
        if (p->red_op != 0) { /* ; then sum(axes=[1], keepdims=false) */
            int64_t ax[NB_MAX_RANK];
            for (int32_t q = 0; q < p->red_n_axes; q++) {
                ax[q] = p->red_axes[q];
            }
            nbi_sbuf_printf(s, "; then %s(", nbi_op_name((nbi_op)p->red_op));
            nbi_print_ints64(s, "axes", ax, p->red_n_axes);
            nbi_sbuf_printf(s, ", keepdims=%s)", p->red_keepdims ? "true" : "false");
        }
        nbi_sbuf_putc(s, '}');
        break;
    }
    case NBI_OP_POOL_TAKE:
    case NBI_OP_POOL_SCATTER:
    case NBI_OP_IM2COL:
    case NBI_OP_COL2IM: {
        int nd = (int)a->ivalue;
        nbi_sbuf_puts(s, " {");
        nbi_print_ints64(s, "kernel", a->a, nd);
        nbi_sbuf_puts(s, ", ");
        nbi_print_ints64(s, "stride", a->a + 3, nd);
        nbi_sbuf_puts(s, ", ");
        nbi_print_ints64(s, "dilation", a->c, nd);
        nbi_sbuf_puts(s, ", ");
        nbi_print_ints64(s, "lo", a->b, nd);
        nbi_sbuf_puts(s, ", ");
        nbi_print_ints64(s, "hi", a->b + 3, nd);
        if (v->op == NBI_OP_COL2IM) {
            nbi_sbuf_puts(s, ", ");
            nbi_print_ints64(s, "spatial", a->c + 3, nd);
        } else if (v->op != NBI_OP_POOL_SCATTER && a->value != 0) {
            nbi_sbuf_printf(s, ", value=%.17g", a->value);
        }
        nbi_sbuf_putc(s, '}');
        break;
    }
    default:
        break;
    }
}

static void nbi_print_type(nbi_sbuf *s, const nb_var *v) {
    nbi_sbuf_sig(s, v->dtype, v->rank, v->shape);
}

void nbi_graph_format(nbi_sbuf *s, const nbi_graph *g, const char *name) {
    nbi_sbuf_printf(s, "fn %s(", name ? name : "fn");
    for (int32_t i = 0; i < g->n_inputs; i++) {
        nbi_sbuf_printf(s, i ? ", %%%d: " : "%%%d: ", (int)g->inputs[i]->id);
        nbi_print_type(s, g->inputs[i]);
    }
    nbi_sbuf_puts(s, ") {\n");
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const nb_var *v = g->nodes[i];
        if (v->op == NBI_OP_PARAM) {
            continue;
        }
        nbi_sbuf_printf(s, "  %%%d: ", (int)v->id);
        nbi_print_type(s, v);
        nbi_sbuf_printf(s, " = %s", nbi_op_name((nbi_op)v->op));
        for (int32_t j = 0; j < v->n_in; j++) {
            nbi_sbuf_printf(s, j ? ", %%%d" : " %%%d", (int)v->in[j]->id);
        }
        nbi_print_attrs(s, v);
        nbi_sbuf_putc(s, '\n');
    }
    nbi_sbuf_puts(s, "  return (");
    for (int32_t i = 0; i < g->n_outputs; i++) {
        nbi_sbuf_printf(s, i ? ", %%%d" : "%%%d", (int)g->outputs[i]->id);
    }
    nbi_sbuf_puts(s, ")\n}\n");
}

/* ---- verifier ----------------------------------------------------------------------- */

static int nbi_verify_flag(void) {
#ifndef NDEBUG
    return 1;
#else
    const char *e = getenv("NABLA_VERIFY_IR");
    return e != NULL && e[0] != '\0' && strcmp(e, "0") != 0;
#endif
}

bool nbi_verify_ir_enabled(void) {
    /* -1: not read yet; a benign race reads the environment twice, with the same answer */
    static _Atomic int flag = -1;
    int f = atomic_load_explicit(&flag, memory_order_relaxed);
    if (f < 0) {
        f = nbi_verify_flag();
        atomic_store_explicit(&flag, f, memory_order_relaxed);
    }
    return f != 0;
}

nb_status nbi_graph_verify(nb_ctx *ctx, const nbi_graph *g, const char *pass) {
#define NBI_BAD(...)                                                                               \
    do {                                                                                           \
        char msg_[512];                                                                            \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                  \
        return nbi_err(ctx, NB_ERR_INTERNAL, "IR verifier after %s: %s", pass, msg_);              \
    } while (0)
    int32_t n_params = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const nb_var *v = g->nodes[i];
        if (v == NULL || v->id != i) {
            NBI_BAD("node %d has id %d", (int)i, v ? (int)v->id : -1);
        }
        if (v->op >= NBI_OP_COUNT) {
            NBI_BAD("%%%d has unknown op %d", (int)i, (int)v->op);
        }
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        if (info->n_in >= 0 && v->n_in != info->n_in) {
            NBI_BAD("%%%d (%s) has %d inputs, expected %d", (int)i, info->name, (int)v->n_in,
                    info->n_in);
        }
        if (v->op != NBI_OP_PARAM && info->kernel == NULL) {
            NBI_BAD("%%%d (%s) has no kernel", (int)i, info->name);
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            const nb_var *in = v->in[j];
            if (in == NULL || in->id < 0 || in->id >= i || g->nodes[in->id] != in) {
                NBI_BAD("%%%d (%s) input %d is not an earlier node of this graph", (int)i,
                        info->name, (int)j);
            }
        }
        if (v->op == NBI_OP_PARAM) {
            if (v->at.ivalue != n_params || n_params >= g->n_inputs || g->inputs[n_params] != v) {
                NBI_BAD("param %%%d has index %lld, expected %d", (int)i, (long long)v->at.ivalue,
                        (int)n_params);
            }
            n_params++;
        }
        if (v->op == NBI_OP_CONST && nb_array_check(v->at.array) != NB_OK) {
            NBI_BAD("constant %%%d has no live array", (int)i);
        }
        if (v->rank < 0 || v->rank > NB_MAX_RANK || nbi_shape_size(v->rank, v->shape) != v->size) {
            NBI_BAD("%%%d (%s) has an inconsistent shape", (int)i, info->name);
        }
        /* Re-run inference: the node must still have the type its inputs imply. */
        if (info->infer != NULL) {
            nb_var probe = *v;
            probe.rank = 0;
            memset(probe.shape, 0, sizeof probe.shape);
            nb_trace scratch;
            memset(&scratch, 0, sizeof scratch);
            scratch.ctx = ctx;
            scratch.fn_name = "verifier";
            nb_status st = info->infer(&scratch, &probe);
            if (st != NB_OK) {
                NBI_BAD("%%%d (%s) no longer passes its shape inference", (int)i, info->name);
            }
            if (probe.dtype != v->dtype || probe.rank != v->rank ||
                memcmp(probe.shape, v->shape, (size_t)v->rank * sizeof(int64_t)) != 0) {
                char a[NBI_SIG_CAP], b[NBI_SIG_CAP];
                NBI_BAD("%%%d (%s) is %s but its inputs imply %s", (int)i, info->name,
                        nbi_var_sig(a, sizeof a, v), nbi_var_sig(b, sizeof b, &probe));
            }
        }
    }
    if (n_params != g->n_inputs) {
        NBI_BAD("%d params but %d inputs", (int)n_params, (int)g->n_inputs);
    }
    for (int32_t i = 0; i < g->n_outputs; i++) {
        const nb_var *o = g->outputs[i];
        if (o == NULL || o->id < 0 || o->id >= g->n_nodes || g->nodes[o->id] != o) {
            NBI_BAD("output %d is not a node of this graph", (int)i);
        }
    }
    return NB_OK;
#undef NBI_BAD
}
