/*
 * pass_accumulate.c -- the accumulate pass: add(matmul(a, b), c) becomes one matmul node
 * that adds its product into c (matmul with a third operand; op_linalg.c).
 *
 * Why: reverse mode sums the gradient of a weight over its uses, as products added
 * together -- in a neural ODE's adjoint, each stage's outer product g y^T of a 1000 x 1000
 * weight, six per step. Made separately, each product is a new buffer the size of the
 * weight and the sum one more pass over all of them; accumulated, each product is added
 * into the running sum block by block as it is made (op_linalg.c, "Accumulation"), in the
 * buffer of the sum when the memory plan lets the node take it over (exec.c's
 * nbi_inplace_ok: c read for the last time there). The temporaries and their traffic go:
 * at 1000 x 1000 f32 they no longer fit in the cache together.
 *
 * When: an add of two operands of its own dtype and shape (neither broadcast), one of them
 * a two-operand matmul of at least one multiply-add per output (k >= 1) read by nothing
 * else (not by another node, not as an output of the graph) -- that one becomes the
 * product, the other c. Either order: add(c, matmul) too (the sum is the same number; the
 * kernel adds c to the product). c must also be read by nothing else, or be an input of
 * the graph (a loop's carried sum, written in place when the caller donates it): otherwise
 * its buffer cannot be taken over, and the add -- which fusion would have merged into the
 * elementwise code after it -- would cost a pass over the output more than before. In a chain
 * add(add(m1, m2), m3) each add absorbs one product: m2 is made, m1 is added into it, then m3 into
 * that.
 *
 * Results: the same bits as the product and the add made separately (for a NaN, as
 * with fusion, possibly another sign or payload), so the pass changes no result.
 *
 * It runs after transpose folding (which reads only a matmul's first two operands) and
 * before fusion; not in the debugging pipeline, where every op's result is made and
 * checked on its own.
 */
#include "ad/ir.h"

/* Does add node v absorb its operand m as the product, with c the other operand? */
static bool nbi_acc_fits(const nb_var *v, const nb_var *m, const nb_var *c, const int32_t *uses) {
    if (m->op != NBI_OP_MATMUL || m->n_in != 2 || uses[m->id] != 1 || m->size == 0) {
        return false;
    }
    if (uses[c->id] != 1 && c->op != NBI_OP_PARAM) {
        return false;
    }
    if ((c->flags & (NBI_NODE_WEAK | NBI_NODE_POISON)) != 0 || m->dtype != v->dtype ||
        c->dtype != v->dtype || m->rank != v->rank || c->rank != v->rank) {
        return false;
    }
    for (int d = 0; d < v->rank; d++) {
        if (m->shape[d] != v->shape[d] || c->shape[d] != v->shape[d]) {
            return false;
        }
    }
    /* k, the inner dim, from the first operand (stored transposed when at.axes[0] is set) */
    const nb_var *a = m->in[0];
    bool ta = m->at.axes[0] != 0 && a->rank >= 2;
    return a->rank >= 1 && a->shape[a->rank - (ta ? 2 : 1)] >= 1;
}

nb_status nbi_pass_accumulate(nb_ctx *ctx, const nbi_graph *in, nbi_graph *out) {
    nbi_arena *oa = out->arena != NULL ? out->arena : in->arena; /* set by nbi_optimize */
    nbi_graph_init(out, oa);
    int32_t n = in->n_nodes;
    nb_var **map = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(nb_var *));
    int32_t *uses = nbi_arena_alloc(in->arena, (size_t)(n + 1) * sizeof(int32_t));
    /* for an add that accumulates: 1 + the position of its product operand; else 0 */
    int8_t *prod = nbi_arena_alloc(in->arena, (size_t)(n + 1));
    bool *absorbed = nbi_arena_alloc(in->arena, (size_t)(n + 1));
    out->inputs = nbi_arena_alloc(oa, (size_t)(in->n_inputs + 1) * sizeof(nb_var *));
    out->outputs = nbi_arena_alloc(oa, (size_t)(in->n_outputs + 1) * sizeof(nb_var *));
    if (map == NULL || uses == NULL || prod == NULL || absorbed == NULL || out->inputs == NULL ||
        out->outputs == NULL) {
        return nbi_err(ctx, NB_ERR_OOM, "accumulate: out of memory");
    }
    out->n_inputs = in->n_inputs;
    out->n_fixed = in->n_fixed;
    out->n_outputs = in->n_outputs;
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        for (int32_t j = 0; j < v->n_in; j++) {
            uses[v->in[j]->id]++;
        }
    }
    for (int32_t i = 0; i < in->n_outputs; i++) {
        uses[in->outputs[i]->id]++;
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        if (v->op != NBI_OP_ADD || v->n_in != 2) {
            continue;
        }
        for (int s = 0; s < 2; s++) {
            if (nbi_acc_fits(v, v->in[s], v->in[1 - s], uses)) {
                prod[i] = (int8_t)(1 + s);
                absorbed[v->in[s]->id] = true;
                break;
            }
        }
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = in->nodes[i];
        if (absorbed[i]) {
            continue; /* read only by the add that takes its place */
        }
        nb_var proto = *v;
        nb_var *ins[64], **inp = ins;
        if (v->n_in > 64) {
            inp = nbi_arena_alloc(oa, (size_t)v->n_in * sizeof(nb_var *));
            if (inp == NULL) {
                return nbi_err(ctx, NB_ERR_OOM, "accumulate: out of memory");
            }
        }
        if (prod[i] != 0) {
            /* the add's place, value and provenance; the product's op and attributes */
            const nb_var *m = v->in[prod[i] - 1], *c = v->in[2 - prod[i]];
            proto.op = NBI_OP_MATMUL;
            proto.at = m->at;
            proto.flags = m->flags;
            proto.n_in = 3;
            inp[0] = map[m->in[0]->id];
            inp[1] = map[m->in[1]->id];
            inp[2] = map[c->id];
        } else {
            for (int32_t j = 0; j < v->n_in; j++) {
                inp[j] = map[v->in[j]->id];
            }
            if (v->op == NBI_OP_FUSED) { /* its program lives in the graph's arena */
                nbi_fprog *prog = nbi_arena_alloc_raw(oa, sizeof(nbi_fprog));
                if (prog == NULL) {
                    return nbi_err(ctx, NB_ERR_OOM, "accumulate: out of memory");
                }
                *prog = *(const nbi_fprog *)v->at.callee;
                proto.at.callee = prog;
            }
        }
        proto.in = inp;
        map[i] = nbi_graph_add(out, &proto);
        if (map[i] == NULL) {
            return nbi_err(ctx, NB_ERR_OOM, "accumulate: out of memory");
        }
        if (v->op == NBI_OP_PARAM) {
            out->inputs[k++] = map[i];
        }
    }
    for (int32_t i = 0; i < in->n_outputs; i++) {
        out->outputs[i] = map[in->outputs[i]->id];
    }
    return nbi_verify_ir_enabled() ? nbi_graph_verify(ctx, out, "accumulate") : NB_OK;
}
