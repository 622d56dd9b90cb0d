/*
 * src/exec/exec.c -- executables: a fixed list of kernels over one workspace.
 *
 * Compilation copies the graph's nodes into memory the executable owns (so the trace's
 * arena can go), gives every value computed by a kernel a slot in one workspace, and
 * plans the slots from value lifetimes: a value's slot returns to a free list after its
 * last use and is handed to a later value of at most its size (best fit), so the
 * workspace is close to the peak of live bytes rather than their sum. Parameters are read
 * straight from the caller's arrays. Every graph output gets its own workspace value (a
 * copy when the output is a parameter). At run time the kernel that makes an output
 * writes it straight into the caller's array, and later kernels read it there, unless
 * the array is a donated input that is still to be read: then the output is made in its
 * workspace slot and copied out after all kernels have run. (An elementwise kernel may
 * overwrite the input it reads at the same index, so an output may take the buffer of an
 * input last read by the kernel that makes it.) The slots of outputs written in place are
 * never touched, so their pages are never faulted in. Running allocates nothing.
 *
 * A fused node that stores several values (fused_output nodes) is one instruction making
 * several values: each gets its slot (or takes over an input's) when the kernel runs, and
 * the kernel gets their buffers in nbi_kargs.outs.
 *
 * A loop's body (a callee whose first inputs, its bound data, are the same in every step:
 * nbi_graph.n_fixed) puts the instructions that depend only on those inputs and on
 * constants first -- the transposed weights of a recurrent cell's products -- and keeps
 * their values read later in slots of their own to the end: the while kernel runs that
 * prefix at the first step only (nbi_exec_run_step). The same kernels on the same values:
 * the same bits.
 *
 * Views and aliases. A call's or loop's output (call_output, and a reshape of one) is not
 * copied out of the buffer the call wrote: it is a view, a slot inside its root's, with no
 * instruction, and the root lives until the last reader of any view. A reshape, or a
 * dynamic slice whose block is contiguous in its operand, keeps its instruction (the
 * interpreter copies) but is an alias (alias_of): native code reads it through a pointer
 * into its root, so the root lives until the alias's last reader and no instruction
 * reading the alias takes over the root's slot in place (param_last marks such a read of
 * an input, so a donated run does not write that input's buffer there either).
 */
#include "exec/exec.h"
#include "exec/native.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Constants up to this size live in the workspace for the executable's lifetime. */
#define NBI_RESIDENT_MAX_BYTES ((size_t)64 * 1024)

static size_t nbi_round64(size_t n) {
    return (n + 63) / 64 * 64;
}

/* Hand out the next 64-byte aligned piece of a block sized by the same roundings. */
static void *nbi_carve(unsigned char **p, size_t bytes) {
    void *r = *p;
    *p += nbi_round64(bytes);
    return r;
}

static size_t nbi_value_bytes(const nb_var *v) {
    return nbi_round64((size_t)v->size * nbi_dsize(v->dtype));
}

/* ---- the memory plan ---------------------------------------------------------------- */

typedef struct nbi_block {
    size_t off, size;
} nbi_block;

typedef struct nbi_planner {
    nbi_block *free;
    int32_t n_free, cap_free;
    size_t top;
} nbi_planner;

static size_t nbi_plan_take(nbi_planner *p, size_t size) {
    int32_t best = -1;
    for (int32_t i = 0; i < p->n_free; i++) {
        if (p->free[i].size >= size && (best < 0 || p->free[i].size < p->free[best].size)) {
            best = i;
        }
    }
    if (best < 0) {
        size_t off = p->top;
        p->top += size;
        return off;
    }
    nbi_block b = p->free[best];
    if (b.size > size) {
        p->free[best].off += size;
        p->free[best].size -= size;
    } else {
        p->free[best] = p->free[--p->n_free];
    }
    return b.off;
}

/* The slots an instruction's input x holds: which 0, its own (none for a view); which 1,
 * its root's (a view's buffer, an alias's root); -1: none. */
static int32_t nbi_plan_slot(int32_t x, int which, const int32_t *view_of,
                             const int32_t *alias_of) {
    if (which == 0) {
        return view_of[x] >= 0 ? -1 : x;
    }
    return view_of[x] >= 0 ? view_of[x] : alias_of[x];
}

static void nbi_plan_give(nbi_planner *p, size_t off, size_t size) {
    /* Merge with an adjacent free block where possible; the list never holds more blocks
     * than there are values (cap_free). */
    for (int32_t i = 0; i < p->n_free; i++) {
        if (p->free[i].off + p->free[i].size == off) {
            p->free[i].size += size;
            return;
        }
        if (off + size == p->free[i].off) {
            p->free[i].off = off;
            p->free[i].size += size;
            return;
        }
    }
    p->free[p->n_free].off = off;
    p->free[p->n_free].size = size;
    p->n_free++;
}

static bool nbi_inplace_ok(const nb_var *o, const nb_var *x);

/* ---- compile ------------------------------------------------------------------------ */

/* Debugging: the nodes' function names and leaf paths point into the trace, which is gone
 * when a check fails: copy them into the executable. */
static nb_status nbi_exec_debug_strings(nbi_exec *e) {
    size_t bytes = 1;
    for (int32_t i = 0; i < e->n_nodes; i++) {
        const nb_var *v = &e->nodes[i];
        bytes += (v->fn ? strlen(v->fn) : 0) + 1 + (v->path ? strlen(v->path) : 0) + 1;
    }
    char *s = nbi_alloc(e->ctx, bytes, 8);
    if (s == NULL) {
        return nbi_oom(e->ctx, "compile", bytes);
    }
    e->dbg_strings = s;
    e->dbg_bytes = bytes;
    for (int32_t i = 0; i < e->n_nodes; i++) {
        nb_var *v = &e->nodes[i];
        const char *parts[2] = {v->fn ? v->fn : "", v->path ? v->path : ""};
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(parts[k]) + 1;
            memcpy(s, parts[k], len);
            if (k == 0) {
                v->fn = s;
            } else {
                v->path = v->op == NBI_OP_PARAM ? s : NULL;
            }
            s += len;
        }
    }
    return NB_OK;
}

static bool nbi_reads(const nb_var *y, int32_t id) {
    for (int32_t j = 0; j < y->n_in; j++) {
        if (y->in[j]->id == id) {
            return true;
        }
    }
    return false;
}

/* The order the nodes run in: their own (topological), except that a dynamic_update_slice
 * whose data operand is an input moves to just after the last other reader of that input
 * when no node in between depends on it -- once: two updates of one input would otherwise
 * pass each other for ever. dep: 2n flags, all false (dep, then moved). */
static void nbi_exec_order(const nbi_exec *e, int32_t n, int32_t *order, bool *dep) {
    bool *moved = dep + n;
    for (int32_t i = 0; i < n; i++) {
        order[i] = i;
    }
    for (int32_t pos = 0; pos < n; pos++) {
        const nb_var *v = &e->nodes[order[pos]];
        if (v->op != NBI_OP_DYN_UPDATE || v->in[0]->op != NBI_OP_PARAM || moved[order[pos]]) {
            continue;
        }
        int32_t pid = v->in[0]->id, last = -1;
        for (int32_t q = pos + 1; q < n; q++) {
            if (nbi_reads(&e->nodes[order[q]], pid)) {
                last = q;
            }
        }
        if (last < 0) {
            continue;
        }
        bool free_to_move = true;
        dep[order[pos]] = true;
        for (int32_t q = pos + 1; q <= last; q++) {
            const nb_var *y = &e->nodes[order[q]];
            for (int32_t j = 0; j < y->n_in && !dep[order[q]]; j++) {
                dep[order[q]] = dep[y->in[j]->id];
            }
            free_to_move = free_to_move && !dep[order[q]];
        }
        for (int32_t q = pos; q <= last; q++) {
            dep[order[q]] = false;
        }
        if (free_to_move) { /* after the move, no reader of pid follows it: it stays put */
            int32_t x = order[pos];
            moved[x] = true;
            memmove(order + pos, order + pos + 1, (size_t)(last - pos) * sizeof(int32_t));
            order[last] = x;
            pos--; /* the node now at pos is looked at in its turn */
        }
    }
}

/* Does an instruction of this op stay in every step of a loop, whatever it reads? Outputs
 * (checked apart), what a run must do each time (prints, checks), calls and loops (their
 * callees' own prefixes do the rest), and updates that may write into an input. */
static bool nbi_pre_barrier(uint16_t op) {
    return op == NBI_OP_PRINT || op == NBI_OP_CHECK || op == NBI_OP_CALL || op == NBI_OP_WHILE ||
           op == NBI_OP_LOOP_REVERSE || op == NBI_OP_DYN_UPDATE || op == NBI_OP_CALL_OUTPUT;
}

/* The loop-invariant prefix (e->n_pre): pre[i] for the nodes that depend only on the
 * graph's first g->n_fixed inputs and on constants, are not outputs (nor stored by a fused
 * node with an output among its values) and are no barrier; then order is partitioned
 * stably, those nodes first (they read nothing else, so the order stays topological). */
static void nbi_exec_prefix(const nbi_exec *e, const nbi_graph *g, int32_t *order, bool *pre,
                            int32_t *rest) {
    int32_t n = e->n_nodes;
    if (g->n_fixed <= 0) {
        return; /* pre stays all false */
    }
    for (int32_t i = 0; i < n; i++) {
        pre[i] = true;
    }
    for (int32_t i = 0; i < e->n_outputs; i++) {
        const nb_var *o = &e->nodes[e->outputs[i]];
        pre[o->id] = false;
        if (o->op == NBI_OP_FUSED_OUTPUT) {
            pre[o->in[0]->id] = false; /* its kernel makes it: stays too */
        }
    }
    int32_t n_pre = 0;
    for (int32_t oi = 0; oi < n; oi++) {
        int32_t i = order[oi];
        const nb_var *v = &e->nodes[i];
        if (v->op == NBI_OP_PARAM) {
            pre[i] = e->param_of[i] < g->n_fixed;
            continue;
        }
        bool ok = pre[i] && !nbi_pre_barrier(v->op);
        for (int32_t j = 0; ok && j < v->n_in; j++) {
            ok = pre[v->in[j]->id];
        }
        pre[i] = ok;
        n_pre += ok;
    }
    if (n_pre == 0) {
        return;
    }
    /* a fused node's stored values are made by its kernel: pre with it */
    for (int32_t i = 0; i < n; i++) {
        if (e->nodes[i].op == NBI_OP_FUSED_OUTPUT) {
            pre[i] = pre[e->nodes[i].in[0]->id];
        }
    }
    int32_t k = 0, r = 0;
    for (int32_t oi = 0; oi < n; oi++) {
        int32_t i = order[oi];
        if (pre[i] && e->nodes[i].op != NBI_OP_PARAM) {
            order[k++] = i;
        } else {
            rest[r++] = i;
        }
    }
    memcpy(order + k, rest, (size_t)r * sizeof(int32_t));
}

nb_status nbi_exec_compile(nb_ctx *ctx, const nbi_graph *g, unsigned debug, nbi_exec **out) {
    static const char fn[] = "compile";
    *out = NULL;
    /* Outputs that are parameters get a copy node, so every output lives in the workspace.
     * Count those extra nodes first. */
    int32_t extra = 0;
    for (int32_t i = 0; i < g->n_outputs; i++) {
        if (g->outputs[i]->op == NBI_OP_PARAM) {
            extra++;
        }
    }
    int32_t n = g->n_nodes + extra;
    int64_t total_in = 0;
    int32_t n_fused = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        total_in += g->nodes[i]->n_in;
        n_fused += g->nodes[i]->op == NBI_OP_FUSED;
    }
    total_in += extra;
    size_t bytes = nbi_round64(sizeof(nbi_exec)) + nbi_round64((size_t)n * sizeof(nb_var)) +
                   nbi_round64((size_t)total_in * sizeof(nb_var *)) +
                   nbi_round64((size_t)n * sizeof(int64_t)) +
                   nbi_round64((size_t)n * sizeof(int32_t)) +
                   nbi_round64((size_t)n * sizeof(nbi_instr)) +
                   nbi_round64((size_t)total_in * sizeof(int32_t)) +
                   nbi_round64((size_t)(g->n_outputs + 1) * sizeof(int32_t)) * 3 +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* out_of */ +
                   nbi_round64((size_t)(g->n_inputs + 1) * sizeof(int32_t)) * 2 +
                   nbi_round64((size_t)(g->n_inputs + 1) * sizeof(int64_t)) /* param_bytes */ +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* last use */ +
                   nbi_round64((size_t)n * sizeof(bool)) /* resident */ +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* view_of */ +
                   nbi_round64((size_t)n * sizeof(int64_t)) /* view_at */ +
                   nbi_round64((size_t)n * sizeof(bool)) /* viewed */ +
                   nbi_round64((size_t)n * sizeof(bool)) * 2 /* unread, as a carry */ +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* alias_of */ +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* alias_last */ +
                   nbi_round64((size_t)n * sizeof(bool)) /* updated */ +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* first_update */ +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* order */ +
                   nbi_round64((size_t)n * 2 * sizeof(bool)) /* after: dep, moved */ +
                   nbi_round64((size_t)n * sizeof(bool)) /* pre */ +
                   nbi_round64((size_t)n * sizeof(int32_t)) /* order, partitioned */ +
                   nbi_round64((size_t)(n + 1) * sizeof(nbi_block)) +
                   nbi_round64((size_t)n_fused * sizeof(nbi_fprog)) +
                   nbi_round64((size_t)n_fused * NBI_FUSE_MAX_STORE * sizeof(int32_t));
    unsigned char *mem = nbi_alloc(ctx, bytes, 64);
    if (mem == NULL) {
        return nbi_oom(ctx, fn, bytes);
    }
    memset(mem, 0, bytes);
    unsigned char *p = mem;
    nbi_exec *e = nbi_carve(&p, sizeof(nbi_exec));
    e->ctx = ctx;
    e->refcount = 1;
    e->mem = mem;
    e->mem_bytes = bytes;
    e->n_nodes = n;
    e->nodes = nbi_carve(&p, (size_t)n * sizeof(nb_var));
    nb_var **in_store = nbi_carve(&p, (size_t)total_in * sizeof(nb_var *));
    e->offset = nbi_carve(&p, (size_t)n * sizeof(int64_t));
    e->param_of = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    e->instrs = nbi_carve(&p, (size_t)n * sizeof(nbi_instr));
    int32_t *instr_in = nbi_carve(&p, (size_t)total_in * sizeof(int32_t));
    e->outputs = nbi_carve(&p, (size_t)(g->n_outputs + 1) * sizeof(int32_t));
    e->out_instr = nbi_carve(&p, (size_t)(g->n_outputs + 1) * sizeof(int32_t));
    e->out_first = nbi_carve(&p, (size_t)(g->n_outputs + 1) * sizeof(int32_t));
    e->out_of = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    e->param_last = nbi_carve(&p, (size_t)(g->n_inputs + 1) * sizeof(int32_t));
    e->param_node = nbi_carve(&p, (size_t)(g->n_inputs + 1) * sizeof(int32_t));
    e->param_bytes = nbi_carve(&p, (size_t)(g->n_inputs + 1) * sizeof(int64_t));
    int32_t *last_use = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    bool *resident = nbi_carve(&p, (size_t)n * sizeof(bool));
    int32_t *view_of = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    int64_t *view_at = nbi_carve(&p, (size_t)n * sizeof(int64_t));
    bool *viewed = nbi_carve(&p, (size_t)n * sizeof(bool));
    bool *unread = nbi_carve(&p, (size_t)n * sizeof(bool));
    bool *unread_carry = nbi_carve(&p, (size_t)n * sizeof(bool));
    e->alias_of = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    int32_t *alias_last = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    bool *updated = nbi_carve(&p, (size_t)n * sizeof(bool));
    int32_t *first_update = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    int32_t *order = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    bool *after = nbi_carve(&p, (size_t)n * 2 * sizeof(bool));
    bool *pre = nbi_carve(&p, (size_t)n * sizeof(bool));
    int32_t *rest = nbi_carve(&p, (size_t)n * sizeof(int32_t));
    nbi_block *free_blocks = nbi_carve(&p, (size_t)(n + 1) * sizeof(nbi_block));
    nbi_fprog *progs = nbi_carve(&p, (size_t)n_fused * sizeof(nbi_fprog));
    int32_t *stores = nbi_carve(&p, (size_t)n_fused * NBI_FUSE_MAX_STORE * sizeof(int32_t));
    nbi_fprog *const progs0 = progs;
    for (int32_t f = 0; f < n_fused * NBI_FUSE_MAX_STORE; f++) {
        stores[f] = -1;
    }

    /* Copy the nodes, remapping inputs into the copy. */
    int64_t k_in = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const nb_var *src = g->nodes[i];
        nb_var *dst = &e->nodes[i];
        *dst = *src;
        dst->id = i;
        dst->tr = NULL;
        dst->in = in_store + k_in;
        for (int32_t j = 0; j < src->n_in; j++) {
            dst->in[j] = &e->nodes[src->in[j]->id];
        }
        k_in += src->n_in;
        e->param_of[i] = src->op == NBI_OP_PARAM ? (int32_t)src->at.ivalue : -1;
        if (src->op == NBI_OP_FUSED) { /* the program lives in the pass's arena: copy it */
            *progs = *(const nbi_fprog *)src->at.callee;
            dst->at.callee = progs++;
            nbi_fused_prepare(dst); /* its inputs are earlier nodes, already copied */
        } else if (src->op == NBI_OP_FUSED_OUTPUT) { /* value k of its fused node's kernel */
            ptrdiff_t f = (const nbi_fprog *)dst->in[0]->at.callee - progs0;
            stores[f * NBI_FUSE_MAX_STORE + src->at.ivalue] = i;
        }
    }
    e->n_inputs = g->n_inputs;
    e->n_outputs = g->n_outputs;
    int32_t next = g->n_nodes;
    for (int32_t i = 0; i < g->n_outputs; i++) {
        const nb_var *o = g->outputs[i];
        if (o->op == NBI_OP_PARAM) {
            nb_var *copy = &e->nodes[next];
            *copy = e->nodes[o->id];
            copy->op = NBI_OP_STOP_GRADIENT; /* the identity kernel: a copy */
            copy->n_in = 1;
            copy->in = in_store + k_in++;
            copy->in[0] = &e->nodes[o->id];
            copy->id = next;
            e->param_of[next] = -1;
            e->outputs[i] = next++;
        } else {
            e->outputs[i] = o->id;
        }
    }
    /* Constants and callees stay alive as long as the executable. */
    for (int32_t i = 0; i < n; i++) {
        if (e->nodes[i].op == NBI_OP_CONST) {
            nb_array_retain(e->nodes[i].at.array);
        } else if (e->nodes[i].op == NBI_OP_CALL) {
            ((nbi_exec *)e->nodes[i].at.callee)->refcount++;
        } else if (e->nodes[i].op == NBI_OP_WHILE || e->nodes[i].op == NBI_OP_LOOP_REVERSE) {
            ((nbi_exec *)e->nodes[i].at.callee)->refcount++;
            ((nbi_exec *)e->nodes[i].at.callee2)->refcount++;
            if (e->nodes[i].at.callee3 != NULL) {
                ((nbi_exec *)e->nodes[i].at.callee3)->refcount++;
            }
        }
    }

    /* Resident constants: a small full, iota or constant node that is not an output is
     * computed once, here, into a slot of the workspace that no other value ever takes; it
     * has no instruction (a loop body re-ran every scalar coefficient each step). */
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = &e->nodes[i];
        resident[i] = v->n_in == 0 && nbi_value_bytes(v) <= NBI_RESIDENT_MAX_BYTES &&
                      (v->op == NBI_OP_FULL || v->op == NBI_OP_IOTA || v->op == NBI_OP_CONST);
    }
    for (int32_t i = 0; i < g->n_outputs; i++) {
        resident[e->outputs[i]] = false;
    }
    /* Views: a value a call or loop made, taken from its buffer (call_output), and a reshape
     * of such a value, are that buffer's bytes at an offset -- not copied out (a loop's tapes
     * went through a copy of every row between the forward and the reverse sweep). A view
     * has no instruction; its buffer (the root) lives until the last reader of any of its
     * views, and no instruction takes over the slot of a root with views or of a view. Not
     * for outputs, nor views of one (an output may be the caller's buffer); not with the
     * debugging checks, which check every instruction's value (a view has none). view_of:
     * the root, -1 (no view), -2 (an output) while this runs. A view keeps its whole root
     * (every carry of a loop) until its last reader: memory for copies. */
    for (int32_t i = 0; i < n; i++) {
        view_of[i] = -1;
    }
    for (int32_t i = 0; i < e->n_outputs; i++) {
        view_of[e->outputs[i]] = -2;
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = &e->nodes[i];
        if (view_of[i] != -1 || v->n_in != 1 || debug != 0) {
            continue;
        }
        const nb_var *x = v->in[0];
        if (v->op == NBI_OP_CALL_OUTPUT && view_of[x->id] == -1 &&
            (x->op == NBI_OP_CALL || x->op == NBI_OP_WHILE || x->op == NBI_OP_LOOP_REVERSE)) {
            view_of[i] = x->id;
            view_at[i] = v->at.a[0];
            viewed[x->id] = true;
        } else if (v->op == NBI_OP_RESHAPE && view_of[x->id] >= 0) {
            view_of[i] = view_of[x->id];
            view_at[i] = view_at[x->id];
        }
    }
    /* Unread zero fills: a full of zero bits (not resident, not an output) that only loops
     * read -- as a carry's initial value, or as bound data their cond or body never reads (a
     * reverse loop is handed its forward loop's operands) -- is never read: nbi_k_while and
     * native code's loops clear such a carry themselves, or leave unwritten a tape every step
     * writes a row of (ir.h's nbi_while_uninit). So it has no instruction (a GRU layer's train
     * step wrote 5 MB of zeros for nothing). Its pointer, set after the plan, is valid and of
     * its size, never read: into its first reader's carry that starts from it, else one
     * workspace slot all such fulls share. Not with the debugging checks. */
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = &e->nodes[i];
        unread[i] = debug == 0 && !resident[i] && view_of[i] == -1 && v->n_in == 0 && v->size > 0 &&
                    nbi_is_zero_fill(v);
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = &e->nodes[i];
        int64_t nc = v->op == NBI_OP_WHILE ? v->at.a[0] : 0,
                nb = v->op == NBI_OP_WHILE ? v->at.a[1] : 0;
        for (int32_t j = 0; j < v->n_in; j++) {
            int32_t x = v->in[j]->id;
            if (!unread[x]) {
                continue;
            }
            if (v->op != NBI_OP_WHILE) {
                unread[x] = false;
            } else if (j >= nc + nb) {
                unread_carry[x] = true;
            } else {
                const nbi_exec *callee = j < nc ? v->at.callee2 : v->at.callee;
                unread[x] = callee->param_last[j < nc ? j : j - nc] < 0;
            }
        }
    }
    size_t unread_bytes = 0; /* the shared slot */
    for (int32_t i = 0; i < n; i++) {
        size_t b = nbi_value_bytes(&e->nodes[i]);
        unread_bytes = unread[i] && !unread_carry[i] && b > unread_bytes ? b : unread_bytes;
    }
    /* Instructions: every node with a kernel, in order -- but a dynamic_update_slice into an
     * input waits for that input's other readers where none of them needs its result: then
     * it can write into a donated input in place (a loop's reverse step reads a row of its
     * cotangent buffer and then clears it; in graph order the clearing came first, and the
     * whole buffer was copied every step). */
    nbi_exec_order(e, n, order, after);
    nbi_exec_prefix(e, g, order, pre, rest);
    for (int32_t i = 0; i < n; i++) {
        last_use[i] = -1;
    }
    int32_t n_instr = 0;
    int64_t k_ins = 0;
    e->max_in = 1;
    for (int32_t oi = 0; oi < n; oi++) {
        const int32_t i = order[oi];
        const nb_var *v = &e->nodes[i];
        if (v->op == NBI_OP_PARAM || v->op == NBI_OP_FUSED_OUTPUT || resident[i] ||
            view_of[i] >= 0 || unread[i]) {
            continue; /* fused outputs: made by their fused node's instruction */
        }
        nbi_instr *ins = &e->instrs[n_instr];
        ins->node = i;
        ins->n_in = v->n_in;
        ins->in = instr_in + k_ins;
        if (v->op == NBI_OP_FUSED) {
            const nbi_fprog *fp = v->at.callee;
            ins->n_store = fp->n_store;
            ins->store = stores + (fp - progs0) * NBI_FUSE_MAX_STORE;
        }
        for (int32_t j = 0; j < v->n_in; j++) {
            ins->in[j] = v->in[j]->id;
            last_use[v->in[j]->id] = n_instr;
        }
        k_ins += v->n_in;
        if (v->n_in > e->max_in) {
            e->max_in = v->n_in;
        }
        e->n_pre += pre[i];
        n_instr++;
    }
    e->n_instrs = n_instr;
    /* Aliases (e->alias_of): a reshape, or a dynamic slice whose block is contiguous, of a
     * value that no dynamic_update_slice writes into (a tape read row by row, not a
     * cotangent buffer cleared row by row: the update could no longer be made in place) --
     * or, a dynamic slice, of one (no alias, no view) every update of which comes after the
     * slice's last reader (a reverse loop's row of a cotangent buffer read, added to and
     * written back: the update is made after the row is read, in place as before). A
     * reshape only where the interpreter copies too (its operand read later, an input, a
     * view) or of an alias; not for outputs. The root is the first value that is no alias:
     * codegen (nbx_gen_fn_ex) must write an alias as a pointer wherever it writes an alias
     * of it as one -- it does so for every alias after a body's prefix, and a prefix's
     * values live to the end. The interpreter copies aliases but keeps their roots as long
     * (the plan is one for both tiers). */
    int32_t *instr_of = rest; /* free since the prefix's partition */
    for (int32_t t = 0; t < n_instr; t++) {
        instr_of[e->instrs[t].node] = t;
    }
    for (int32_t i = 0; i < n; i++) {
        e->alias_of[i] = -1;
        alias_last[i] = -1;
        first_update[i] = n_instr;
    }
    for (int32_t i = 0; i < n; i++) {
        if (e->nodes[i].op == NBI_OP_DYN_UPDATE) {
            int32_t x = e->nodes[i].in[0]->id;
            updated[x] = true;
            first_update[x] = instr_of[i] < first_update[x] ? instr_of[i] : first_update[x];
        }
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *v = &e->nodes[i];
        if (view_of[i] != -1 || resident[i] || v->n_in < 1 || v->size == 0 ||
            (v->op != NBI_OP_RESHAPE && v->op != NBI_OP_DYN_SLICE) || e->param_of[i] >= 0) {
            continue;
        }
        const nb_var *x = v->in[0];
        int32_t root = e->alias_of[x->id] >= 0 ? e->alias_of[x->id]
                       : view_of[x->id] >= 0   ? view_of[x->id]
                                               : x->id;
        bool ok = false;
        bool read_first = v->op == NBI_OP_DYN_SLICE && root == x->id && view_of[x->id] < 0 &&
                          last_use[i] < first_update[x->id];
        if ((updated[x->id] || updated[root]) && !read_first) {
            ok = false;
        } else if (v->op == NBI_OP_RESHAPE) {
            ok = v->n_in == 1 && v->dtype == x->dtype && v->size == x->size &&
                 (root != x->id || e->param_of[x->id] >= 0 || view_of[x->id] == -2 ||
                  resident[x->id] || last_use[x->id] != instr_of[i]);
        } else if (!nbi_dyn_lanes(v) && v->dtype == x->dtype) {
            int d = 0;
            while (d < x->rank && v->shape[d] == 1) {
                d++;
            }
            ok = true;
            for (d = d + 1; d < x->rank; d++) {
                ok = ok && v->shape[d] == x->shape[d];
            }
            for (d = 0; d < x->rank; d++) {
                nb_dtype it = v->in[1 + d]->dtype;
                ok = ok && (it == NB_DTYPE_I32 || it == NB_DTYPE_I64);
            }
        }
        if (ok) {
            e->alias_of[i] = root;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        view_of[i] = view_of[i] < 0 ? -1 : view_of[i];
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t r = e->alias_of[i];
        if (r >= 0 && last_use[i] > alias_last[r]) {
            alias_last[r] = last_use[i];
        }
    }
    for (int32_t i = 0; i < g->n_inputs; i++) {
        e->param_last[i] = -1;
        e->param_node[i] = -1;
    }
    for (int32_t i = 0; i < n; i++) {
        if (e->param_of[i] >= 0) {
            int32_t d = last_use[i] >= 0 ? 2 * last_use[i] : -1;
            int32_t a = alias_last[i] >= 0 ? 2 * alias_last[i] + 1 : -1;
            e->param_last[e->param_of[i]] = d > a ? d : a;
            e->param_node[e->param_of[i]] = i;
            e->param_bytes[e->param_of[i]] =
                e->nodes[i].size * (int64_t)nbi_dsize(e->nodes[i].dtype);
        }
    }
    for (int32_t i = 0; i < n; i++) { /* a root lives as long as its views and aliases */
        if (alias_last[i] > last_use[i]) {
            last_use[i] = alias_last[i];
        }
    }
    for (int32_t i = 0; i < n; i++) {
        if (view_of[i] >= 0 && last_use[i] > last_use[view_of[i]]) {
            last_use[view_of[i]] = last_use[i];
        }
    }
    /* the prefix's values read after it: live to the end (never given back, never taken
     * over in place), so a loop's later steps find them */
    for (int32_t t = 0; t < e->n_pre; t++) {
        const nbi_instr *ins = &e->instrs[t];
        if (last_use[ins->node] >= e->n_pre) {
            last_use[ins->node] = n_instr;
        }
        for (int32_t s = 0; s < ins->n_store; s++) {
            if (ins->store[s] >= 0 && last_use[ins->store[s]] >= e->n_pre) {
                last_use[ins->store[s]] = n_instr;
            }
        }
    }
    for (int32_t i = 0; i < n; i++) {
        e->out_of[i] = -1;
    }
    for (int32_t t = 0; t < n_instr; t++) {
        if (e->out_of[e->instrs[t].node] == -1) {
            e->out_of[e->instrs[t].node] = -2 - t; /* the producing instruction, for now */
        }
        for (int32_t s = 0; s < e->instrs[t].n_store; s++) {
            if (e->instrs[t].store[s] >= 0) {
                e->out_of[e->instrs[t].store[s]] = -2 - t;
            }
        }
    }
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int32_t o = e->outputs[i];
        if (e->out_of[o] <= -2) {
            e->out_instr[i] = -2 - e->out_of[o];
            e->out_of[o] = i;
        } else {
            e->out_instr[i] = e->out_instr[e->out_of[o]];
        }
        e->out_first[i] = e->out_of[o];
    }
    for (int32_t i = 0; i < n; i++) {
        if (e->out_of[i] < 0) {
            e->out_of[i] = -1;
        }
    }
    for (int32_t i = 0; i < g->n_outputs; i++) {
        last_use[e->outputs[i]] = n_instr; /* live to the end */
    }

    /* Plan: allocate each value when produced, free its inputs after their last use. An
     * elementwise kernel (or fused map) whose input of the same shape and element size is
     * read for the last time by that kernel takes over the input's slot (in place: it
     * reads each element before writing it, at the same index). */
    nbi_planner pl = {free_blocks, 0, n + 1, 0};
    size_t scratch = 0;
    for (int32_t i = 0; i < n; i++) {
        e->offset[i] = -1;
    }
    for (int32_t i = 0; i < n; i++) {
        if (resident[i] && last_use[i] >= 0) { /* never given back, never written over */
            e->offset[i] = (int64_t)nbi_plan_take(&pl, nbi_value_bytes(&e->nodes[i]));
        }
    }
    int64_t unread_off = unread_bytes > 0 ? (int64_t)nbi_plan_take(&pl, unread_bytes) : -1;
    for (int32_t t = 0; t < n_instr; t++) {
        const nbi_instr *ins = &e->instrs[t];
        const nb_var *v = &e->nodes[ins->node];
        /* the values the instruction makes: its node's, then those a fused node stores */
        int32_t made[1 + NBI_FUSE_MAX_STORE], reused[1 + NBI_FUSE_MAX_STORE], n_made = 0;
        made[n_made++] = ins->node;
        for (int32_t s = 0; s < ins->n_store; s++) {
            if (ins->store[s] >= 0) {
                made[n_made++] = ins->store[s];
            }
        }
        for (int32_t m = 0; m < n_made; m++) {
            const nb_var *o = &e->nodes[made[m]];
            reused[m] = -1;
            for (int32_t j = 0; j < ins->n_in && reused[m] < 0; j++) {
                int32_t src = ins->in[j];
                bool dup = false;
                for (int32_t q = 0; q < ins->n_in; q++) {
                    dup = dup || (q != j && ins->in[q] == src);
                }
                for (int32_t q = 0; q < m; q++) { /* one output per input's slot */
                    dup = dup || reused[q] == src;
                }
                if (!dup && e->param_of[src] < 0 && !resident[src] && !viewed[src] &&
                    view_of[src] < 0 && alias_last[src] != t && e->offset[src] >= 0 &&
                    last_use[src] == t && nbi_value_bytes(&e->nodes[src]) == nbi_value_bytes(o) &&
                    nbi_inplace_ok(o, &e->nodes[src])) {
                    reused[m] = src;
                }
            }
            e->offset[made[m]] = reused[m] >= 0 ? e->offset[reused[m]]
                                                : (int64_t)nbi_plan_take(&pl, nbi_value_bytes(o));
        }
        const nbi_op_info *info = nbi_op_get((nbi_op)v->op);
        if (info->scratch != NULL) {
            size_t s = nbi_round64(info->scratch(v));
            scratch = s > scratch ? s : scratch;
        }
        for (int32_t m = 0; m < n_made; m++) {
            if (last_use[made[m]] < 0) {
                /* Computed but never read (DCE removes these; a traced graph may have them).
                 * Given back only now: the kernel writes all its values at once. */
                nbi_plan_give(&pl, (size_t)e->offset[made[m]], nbi_value_bytes(&e->nodes[made[m]]));
            }
        }
        /* given back: each input's slot (a view has none) and its root's (a view's, an
         * alias's), at their last use, once */
        for (int32_t j = 0; j < 2 * ins->n_in; j++) {
            int32_t src = nbi_plan_slot(ins->in[j / 2], j % 2, view_of, e->alias_of);
            bool dup = src < 0;
            for (int32_t q = 0; q < j && !dup; q++) {
                dup = nbi_plan_slot(ins->in[q / 2], q % 2, view_of, e->alias_of) == src;
            }
            for (int32_t q = 0; q < n_made && !dup; q++) {
                dup = reused[q] == src;
            }
            if (!dup && last_use[src] == t && e->offset[src] >= 0 && !resident[src]) {
                nbi_plan_give(&pl, (size_t)e->offset[src], nbi_value_bytes(&e->nodes[src]));
            }
        }
    }
    for (int32_t i = 0; i < n; i++) {
        if (view_of[i] >= 0 && e->offset[view_of[i]] >= 0) {
            e->offset[i] = e->offset[view_of[i]] + view_at[i];
        }
    }
    for (int32_t t = 0; t < n_instr; t++) { /* the unread zero fills' pointers (above) */
        const nb_var *w = &e->nodes[e->instrs[t].node];
        if (w->op != NBI_OP_WHILE) {
            continue;
        }
        const nbi_exec *body = w->at.callee;
        int64_t first_carry = w->at.a[0] + w->at.a[1];
        size_t off = 0;
        for (int64_t c = 0; c < w->at.a[2]; c++) {
            const nb_var *init = w->in[first_carry + c];
            if (unread[init->id] && e->offset[init->id] < 0 && e->offset[w->id] >= 0) {
                e->offset[init->id] = e->offset[w->id] + (int64_t)off;
            }
            off += nbi_leaf_bytes(nbi_exec_output(body, (int32_t)c));
        }
    }
    for (int32_t i = 0; i < n; i++) {
        if (unread[i] && e->offset[i] < 0) {
            e->offset[i] = unread_off; /* (never read by a loop's carry: unread_bytes) */
        }
    }
    nb_status pst = nbi_ctx_pool(ctx, &e->pool); /* threads start here, not while running */
    if (pst != NB_OK) {
        nbi_exec_destroy(e);
        return pst;
    }
    /* kernels that split work across threads get one scratch slice per worker */
    e->n_workers = nbi_pool_threads(e->pool);
    scratch *= (size_t)e->n_workers;
    e->ws_bytes = pl.top;
    e->scratch_off = pl.top;
    e->scratch_bytes = scratch;
    size_t ptr_bytes = nbi_round64((size_t)e->max_in * sizeof(void *));
    size_t io_in_bytes = nbi_round64((size_t)(e->n_inputs + 1) * sizeof(void *));
    size_t io_out_bytes = nbi_round64((size_t)(e->n_outputs + 1) * sizeof(void *));
    size_t direct_bytes = nbi_round64((size_t)(e->n_outputs + 1) * sizeof(bool));
    size_t fixed_bytes = nbi_round64((size_t)(k_ins + 1) * sizeof(void *));
    size_t last_bytes = nbi_round64((size_t)(e->n_inputs + 2 * e->n_outputs + 1) * sizeof(void *));
    uint32_t buckets = 16;
    while (buckets < 2u * (uint32_t)e->n_inputs && buckets < (1u << 30)) {
        buckets *= 2;
    }
    size_t hash_bytes =
        nbi_round64((size_t)(buckets + (uint32_t)e->n_inputs + 1) * sizeof(int32_t));
    size_t copy_bytes = nbi_round64((size_t)(e->n_outputs + 1) * sizeof(int32_t));
    e->ws_alloc = e->ws_bytes + scratch + ptr_bytes + io_in_bytes + io_out_bytes + direct_bytes +
                  fixed_bytes + hash_bytes + last_bytes + copy_bytes;
    e->ws = nbi_alloc(ctx, e->ws_alloc, 64);
    if (e->ws == NULL) {
        size_t want = e->ws_alloc;
        nbi_exec_destroy(e);
        return nbi_oom(ctx, fn, want);
    }
    e->in_ptrs = (const void **)(e->ws + e->ws_bytes + scratch);
    e->io_in = (const void **)(e->ws + e->ws_bytes + scratch + ptr_bytes);
    e->io_out = (void **)(e->ws + e->ws_bytes + scratch + ptr_bytes + io_in_bytes);
    e->out_direct =
        (bool *)(e->ws + e->ws_bytes + scratch + ptr_bytes + io_in_bytes + io_out_bytes);
    const void **fixed = (const void **)(e->ws + e->ws_bytes + scratch + ptr_bytes + io_in_bytes +
                                         io_out_bytes + direct_bytes);
    e->in_hash = (int32_t *)((unsigned char *)fixed + fixed_bytes);
    e->in_next = e->in_hash + buckets;
    e->hash_mask = buckets - 1;
    e->last_io = (const void **)((unsigned char *)e->in_hash + hash_bytes);
    e->last_valid = false;
    e->copy_out = (int32_t *)((unsigned char *)e->last_io + last_bytes);
    e->n_copy_out = 0;
    for (int32_t t = 0; t < n_instr; t++) {
        nbi_instr *ins = &e->instrs[t];
        ins->fixed_in = fixed;
        for (int32_t j = 0; j < ins->n_in; j++) {
            int32_t src = ins->in[j];
            fixed[j] = e->param_of[src] < 0 && e->out_of[src] < 0 && e->offset[src] >= 0
                           ? (const void *)(e->ws + e->offset[src])
                           : NULL;
        }
        fixed += ins->n_in;
        ins->fixed_out = e->out_of[ins->node] < 0 ? (void *)(e->ws + e->offset[ins->node]) : NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        if (resident[i] && e->offset[i] >= 0) {
            nbi_kargs k = {.node = &e->nodes[i], .out = e->ws + e->offset[i]};
            nbi_op_get((nbi_op)e->nodes[i].op)->kernel(&k);
        }
    }
    e->debug = debug;
    if (debug != 0) {
        nb_status st = nbi_exec_debug_strings(e);
        if (st != NB_OK) {
            nbi_exec_destroy(e);
            return st;
        }
    }
    *out = e;
    return NB_OK;
}

void nbi_exec_destroy(nbi_exec *e) {
    if (e == NULL || --e->refcount > 0) {
        return;
    }
    for (int32_t i = 0; i < e->n_nodes; i++) {
        if (e->nodes[i].op == NBI_OP_CONST) {
            nb_array_destroy(e->nodes[i].at.array);
        } else if (e->nodes[i].op == NBI_OP_CALL) {
            nbi_exec_destroy(e->nodes[i].at.callee);
        } else if (e->nodes[i].op == NBI_OP_WHILE || e->nodes[i].op == NBI_OP_LOOP_REVERSE) {
            nbi_exec_destroy(e->nodes[i].at.callee);
            nbi_exec_destroy(e->nodes[i].at.callee2);
            nbi_exec_destroy(e->nodes[i].at.callee3); /* NULL-safe */
        }
    }
    nbi_native_release(e);
    nb_ctx *ctx = e->ctx;
    if (e->ws != NULL) {
        nbi_free(ctx, e->ws, e->ws_alloc);
    }
    if (e->dbg_strings != NULL) {
        nbi_free(ctx, e->dbg_strings, e->dbg_bytes);
    }
    nbi_free(ctx, e->mem, e->mem_bytes);
}

/* ---- run ---------------------------------------------------------------------------- */

/* May the kernel of instruction t, which makes output node o, write into the buffer of
 * the input node x it reads? Only where it reads each element before writing it, at the
 * same index: an elementwise map (or fused chain) of x's own shape and element size. A
 * value a fused node stores (o a fused_output) is its kernel's like the node's own: copied
 * out at the end of each tile, after the tile's last read -- also when the kernel then
 * reduces the tile (each element is visited once). Two kernels write into one operand by
 * design: dynamic_update_slice into its data, an accumulating matmul into its accumulator. */
static bool nbi_inplace_ok(const nb_var *o, const nb_var *x) {
    if (o->op == NBI_OP_DYN_UPDATE) {
        /* writing into its own data operand: the kernel skips the copy and writes only the
         * update's block (a loop's tape or buffer row costs a row, not the whole array) --
         * as long as x is not also the update or a start index */
        for (int32_t j = 1; j < o->n_in; j++) {
            if (o->in[j] == x) {
                return false;
            }
        }
        return o->in[0] == x && x->dtype == o->dtype;
    }
    if (o->op == NBI_OP_MATMUL) {
        /* an accumulating product (a @ b + c, c its third operand: pass_accumulate.c) adds
         * into its accumulator's buffer where its kernel allows it (each block reads its c
         * elements before writing them); not when x is also a factor (read across rows and
         * columns while written) */
        return o->n_in == 3 && o->in[2] == x && o->in[0] != x && o->in[1] != x &&
               x->dtype == o->dtype && nbi_matmul_acc_in_place(o);
    }
    /* a fused kernel reading a view (slice, pad) reads x elsewhere than it writes */
    const nb_var *mk = o->op == NBI_OP_FUSED_OUTPUT ? o->in[0] : o;
    const nbi_fprog *fp = mk->op == NBI_OP_FUSED ? mk->at.callee : NULL;
    /* a copy (identity, stop_gradient; an output that is an input) into its own input's
     * buffer is nothing to do: its kernel skips it (a loop's unchanged carry) */
    bool copy = o->op == NBI_OP_IDENTITY || o->op == NBI_OP_STOP_GRADIENT;
    if (o->op == NBI_OP_RESHAPE) { /* the same elements in the same order: its own buffer's */
        return x->dtype == o->dtype && x->size == o->size;
    }
    bool map =
        (fp != NULL && fp->view_mask == 0 && (fp->red_op == 0 || o->op == NBI_OP_FUSED_OUTPUT)) ||
        nbi_is_map(o) || (copy && x->dtype == o->dtype);
    if (!map || x->rank != o->rank || nbi_dsize(x->dtype) != nbi_dsize(o->dtype)) {
        return false;
    }
    for (int d = 0; d < o->rank; d++) {
        if (x->shape[d] != o->shape[d]) {
            return false;
        }
    }
    return true;
}

/* Decide, for this run, which outputs are written straight into the caller's buffers. */
static uint32_t nbi_ptr_bucket(const nbi_exec *e, const void *p) {
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & e->hash_mask;
}

/* Which outputs are made in the caller's buffers. A fresh output buffer shares memory with
 * no input. A donated one is an input array's buffer: it may be written directly only if no
 * input still to be read when it is made lives there -- unless that is the making kernel's
 * own input at the same index. Arrays share memory only as a whole buffer (an array and its
 * reshapes start at the same address), so the inputs at the output's address are the ones
 * to look at: found through a hash of the input pointers, built once per donated run --
 * O(inputs + outputs) per call, not O(inputs x outputs). */
static void nbi_plan_outputs(const nbi_exec *e, const void *const *inputs, void *const *outputs,
                             const bool *donated) {
    if (donated != NULL) {
        /* A loop body runs on the same buffers step after step: the plan of the last donated
         * run holds while every input and output pointer and donation flag is the same. */
        const void **last = e->last_io;
        bool same = e->last_valid;
        for (int32_t p = 0; same && p < e->n_inputs; p++) {
            same = last[p] == inputs[p];
        }
        for (int32_t i = 0; same && i < e->n_outputs; i++) {
            same = last[e->n_inputs + i] == outputs[i] &&
                   (last[e->n_inputs + e->n_outputs + i] != NULL) == donated[i];
        }
        if (same) {
            return;
        }
        for (int32_t p = 0; p < e->n_inputs; p++) {
            last[p] = inputs[p];
        }
        for (int32_t i = 0; i < e->n_outputs; i++) {
            last[e->n_inputs + i] = outputs[i];
            last[e->n_inputs + e->n_outputs + i] = donated[i] ? (const void *)last : NULL;
        }
        ((nbi_exec *)e)->last_valid = true;
    } else {
        ((nbi_exec *)e)->last_valid = false;
    }
    if (donated != NULL) {
        memset(e->in_hash, 0xff, ((size_t)e->hash_mask + 1) * sizeof(int32_t)); /* -1: empty */
        for (int32_t p = 0; p < e->n_inputs; p++) {
            if (e->param_node[p] < 0 || e->param_bytes[p] == 0) {
                continue; /* unused, or holds no memory to overlap */
            }
            uint32_t b = nbi_ptr_bucket(e, inputs[p]);
            e->in_next[p] = e->in_hash[b];
            e->in_hash[b] = p;
        }
    }
    for (int32_t i = 0; i < e->n_outputs; i++) {
        bool ok = e->out_first[i] == i;
        if (donated == NULL || !donated[i]) {
            e->out_direct[i] = ok;
            continue;
        }
        const nb_var *o = &e->nodes[e->outputs[i]];
        const unsigned char *ob = outputs[i];
        if ((size_t)o->size * nbi_dsize(o->dtype) == 0) {
            e->out_direct[i] = ok;
            continue;
        }
        for (int32_t p = e->in_hash[nbi_ptr_bucket(e, ob)]; ok && p >= 0; p = e->in_next[p]) {
            if (inputs[p] != ob || e->param_last[p] < 2 * e->out_instr[i]) {
                continue; /* another address, or read only before the output is made */
            }
            ok = e->param_last[p] == 2 * e->out_instr[i] &&
                 nbi_inplace_ok(o, &e->nodes[e->param_node[p]]);
        }
        e->out_direct[i] = ok;
    }
    /* the outputs copied into the caller's buffers after the run (nbi_exec_copy_out) */
    int32_t n_copy = 0;
    for (int32_t i = 0; i < e->n_outputs; i++) {
        const nb_var *o = &e->nodes[e->outputs[i]];
        if (!e->out_direct[i] && o->size > 0) {
            e->copy_out[n_copy++] = i;
        }
    }
    ((nbi_exec *)e)->n_copy_out = n_copy;
}

/* ---- debugging checks (nb_jit_opts.debug_nans / debug_infs) ---------------------------- */

static int nbi_cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The leaf paths of the inputs node v depends on, in input order, into s (a walk back
 * through the executable's nodes; the first few, then how many more). */
static void nbi_debug_inputs(const nbi_exec *e, const nb_var *v, nbi_sbuf *s) {
    size_t bytes = (size_t)e->n_nodes + 1, ibytes = ((size_t)e->n_nodes + 1) * sizeof(int32_t);
    unsigned char *seen = nbi_alloc(e->ctx, bytes, 8); /* a failed run: allocating is fine */
    int32_t *stack = seen ? nbi_alloc(e->ctx, 2 * ibytes, 8) : NULL;
    if (stack == NULL) {
        if (seen != NULL) {
            nbi_free(e->ctx, seen, bytes);
        }
        return;
    }
    int32_t *params = stack + e->n_nodes + 1;
    memset(seen, 0, bytes);
    int32_t top = 0, found = 0;
    stack[top++] = v->id;
    seen[v->id] = 1;
    while (top > 0) {
        const nb_var *u = &e->nodes[stack[--top]];
        if (u->op == NBI_OP_PARAM) {
            params[found++] = (int32_t)u->at.ivalue;
            continue;
        }
        for (int32_t j = 0; j < u->n_in; j++) {
            int32_t w = u->in[j]->id;
            if (!seen[w]) {
                seen[w] = 1;
                stack[top++] = w;
            }
        }
    }
    qsort(params, (size_t)found, sizeof *params, nbi_cmp_i32);
    for (int32_t i = 0; i < found && i < 6; i++) {
        const nb_var *u = &e->nodes[e->param_node[params[i]]];
        nbi_sbuf_printf(s, "%s%s", i ? ", " : "", u->path && u->path[0] ? u->path : "(an input)");
    }
    if (found > 6) {
        nbi_sbuf_printf(s, " and %d more", (int)(found - 6));
    } else if (found == 0) {
        nbi_sbuf_puts(s, "no input (constants only)");
    }
    nbi_free(e->ctx, stack, 2 * ibytes);
    nbi_free(e->ctx, seen, bytes);
}

/* After instruction t made node v into out: a NaN / an infinity in a float result, or a
 * zero divisor of an integer division, is recorded as the run's failure. True if so. */
static bool nbi_debug_check(const nbi_exec *e, const nb_var *v, const nbi_kargs *k) {
    const char *what = NULL;
    bool divisor = false;
    int64_t at = -1, count = 0;
    if ((v->dtype == NB_DTYPE_F32 || v->dtype == NB_DTYPE_F64) && v->size > 0) {
        for (int64_t i = 0; i < v->size; i++) {
            double x = v->dtype == NB_DTYPE_F32 ? (double)((const float *)k->out)[i]
                                                : ((const double *)k->out)[i];
            const char *bad = (e->debug & NBI_DEBUG_NANS) && isnan(x)   ? "NaN"
                              : (e->debug & NBI_DEBUG_INFS) && isinf(x) ? "an infinity"
                                                                        : NULL;
            if (bad != NULL) {
                what = what ? what : bad;
                at = at < 0 ? i : at;
                count++;
            }
        }
    } else if (v->op == NBI_OP_DIV && (e->debug & NBI_DEBUG_NANS) && v->n_in == 2) {
        const nb_var *d = v->in[1];
        for (int64_t i = 0; i < d->size; i++) {
            int64_t y = d->dtype == NB_DTYPE_I32 ? ((const int32_t *)k->in[1])[i]
                                                 : ((const int64_t *)k->in[1])[i];
            if (y == 0) {
                what = "an integer division by zero";
                divisor = true;
                at = at < 0 ? i : at;
                count++;
            }
        }
    }
    if (what == NULL) {
        return false;
    }
    char msg[512], sig[NBI_SIG_CAP];
    nbi_sbuf s = nbi_sbuf_make(msg, sizeof msg);
    nbi_sbuf_printf(&s, "nb_fn_call: debug_nans: %s", what);
    nbi_sbuf_printf(&s, " in %s = %s(", nbi_var_sig(sig, sizeof sig, v),
                    nbi_op_get((nbi_op)v->op)->name);
    for (int32_t j = 0; j < v->n_in; j++) {
        nbi_sbuf_printf(&s, "%s%s", j ? ", " : "", nbi_var_sig(sig, sizeof sig, v->in[j]));
    }
    nbi_sbuf_printf(&s,
                    ") at %s [%lld] (%lld element%s), %%%d in the traced IR of '%s' "
                    "(nb_fn_format_ir shows it); it depends on ",
                    divisor ? "divisor element" : "element", (long long)at, (long long)count,
                    count == 1 ? "" : "s", (int)v->src, v->fn && v->fn[0] ? v->fn : "?");
    nbi_debug_inputs(e, v, &s);
    (void)nbi_sbuf_finish(&s, NULL);
    if (strcmp(what, "an infinity") == 0) {
        memcpy(msg + strlen("nb_fn_call: "), "debug_infs", 10); /* as long as debug_nans */
    }
    return nbi_check_fail_text(msg);
}

/* A run from instruction first on (0: all; e->n_pre: a loop's later step). *pre_valid:
 * NULL, or set to whether the prefix's values are in the workspace afterwards. */
static void nbi_exec_run_from(const nbi_exec *e, const void *const *inputs, void *const *outputs,
                              const bool *donated, bool skip_pre, bool *pre_valid) {
    unsigned char *ws = e->ws;
    nbi_plan_outputs(e, inputs, outputs, donated);
    if (e->native != NULL && e->native_fn == NULL) {
        nbi_native_tick((nbi_exec *)e); /* the context's thread: it owns e's native state */
    }
    void *check = NULL;
    if (e->native_fn != NULL && !nbi_native_interp_only()) {
        if (!nbi_native_checking()) {
            nbi_native_run(e, inputs, outputs);
            nbi_exec_copy_out(e, outputs);
            if (pre_valid != NULL) {
                *pre_valid = false; /* native code keeps values in locals */
            }
            return;
        }
        check = nbi_native_check_begin(e, inputs);
    }
    if (pre_valid != NULL) {
        *pre_valid = true;
    }
    for (int32_t t = skip_pre ? e->n_pre : 0; t < e->n_instrs; t++) {
        const nbi_instr *ins = &e->instrs[t];
        const nb_var *v = &e->nodes[ins->node];
        for (int32_t j = 0; j < ins->n_in; j++) {
            const void *fx = ins->fixed_in[j];
            if (fx != NULL) {
                e->in_ptrs[j] = fx;
                continue;
            }
            int32_t src = ins->in[j], oi = e->out_of[src];
            e->in_ptrs[j] = e->param_of[src] >= 0          ? inputs[e->param_of[src]]
                            : oi >= 0 && e->out_direct[oi] ? (const void *)outputs[oi]
                                                           : (const void *)(ws + e->offset[src]);
        }
        void *stored[NBI_FUSE_MAX_STORE];
        for (int32_t s = 0; s < ins->n_store; s++) {
            int32_t x = ins->store[s], xo = x >= 0 ? e->out_of[x] : -1;
            stored[s] = x < 0                          ? NULL
                        : xo >= 0 && e->out_direct[xo] ? outputs[xo]
                                                       : (void *)(ws + e->offset[x]);
        }
        int32_t oi = e->out_of[ins->node];
        nbi_kargs k = {.node = v,
                       .out = ins->fixed_out != NULL         ? ins->fixed_out
                              : oi >= 0 && e->out_direct[oi] ? outputs[oi]
                                                             : (void *)(ws + e->offset[ins->node]),
                       .in = e->in_ptrs,
                       .scratch = ws + e->scratch_off,
                       .pool = e->pool,
                       .n_workers = e->n_workers,
                       .outs = ins->n_store > 0 ? stored : NULL};
        nbi_op_get((nbi_op)v->op)->kernel(&k);
        if (e->debug != 0 && (nbi_check_failed() || nbi_debug_check(e, v, &k))) {
            return; /* the call fails with the first failure; its outputs are not used */
        }
    }
    nbi_exec_copy_out(e, outputs);
    if (check != NULL) {
        nbi_native_check_end(e, check, outputs);
    }
}

void nbi_exec_run_raw(const nbi_exec *e, const void *const *inputs, void *const *outputs,
                      const bool *donated) {
    nbi_exec_run_from(e, inputs, outputs, donated, false, NULL);
}

void nbi_exec_run_step(const nbi_exec *e, const void *const *inputs, void *const *outputs,
                       const bool *donated, bool *pre_valid) {
    nbi_exec_run_from(e, inputs, outputs, donated, *pre_valid && e->n_pre > 0, pre_valid);
}

int32_t nbi_exec_n_pre(const nbi_exec *e) {
    return e->n_pre;
}

unsigned nbi_exec_debug(const nbi_exec *e) {
    return e->debug;
}

bool nbi_exec_reaches(const nbi_exec *x, const nbi_exec *target, int depth) {
    if (depth >= 16) {
        return true;
    }
    for (int32_t t = 0; t < x->n_instrs; t++) {
        const nb_var *v = &x->nodes[x->instrs[t].node];
        if (v->op != NBI_OP_CALL && v->op != NBI_OP_WHILE && v->op != NBI_OP_LOOP_REVERSE) {
            continue;
        }
        const nbi_exec *c[3] = {v->at.callee, v->at.callee2, v->at.callee3};
        for (int q = 0; q < 3; q++) {
            if (c[q] != NULL && (c[q] == target || nbi_exec_reaches(c[q], target, depth + 1))) {
                return true;
            }
        }
    }
    return false;
}

const bool *nbi_exec_plan_io(const nbi_exec *e, const void *const *inputs, void *const *outputs,
                             const bool *donated, int *n_copy) {
    nbi_plan_outputs(e, inputs, outputs, donated);
    *n_copy = (int)e->n_copy_out;
    return e->out_direct;
}

/* The outputs not made in the caller's buffers, copied there. */
void nbi_exec_copy_out(const nbi_exec *e, void *const *outputs) {
    unsigned char *ws = e->ws;
    for (int32_t c = 0; c < e->n_copy_out; c++) {
        int32_t i = e->copy_out[c];
        const nb_var *o = &e->nodes[e->outputs[i]];
        size_t nbytes = (size_t)o->size * nbi_dsize(o->dtype);
        int32_t f = e->out_first[i];
        memcpy(outputs[i], e->out_direct[f] ? outputs[f] : ws + e->offset[e->outputs[i]], nbytes);
    }
}

void nbi_exec_run(const nbi_exec *e, nb_array *const *inputs, nb_array *const *outputs,
                  const bool *donated) {
    for (int32_t i = 0; i < e->n_inputs; i++) {
        e->io_in[i] = nb_array_data(inputs[i]);
    }
    for (int32_t i = 0; i < e->n_outputs; i++) {
        e->io_out[i] = nb_array_data(outputs[i]);
    }
    nbi_exec_run_raw(e, e->io_in, e->io_out, donated);
}

int32_t nbi_exec_n_inputs(const nbi_exec *e) {
    return e->n_inputs;
}

int32_t nbi_exec_n_outputs(const nbi_exec *e) {
    return e->n_outputs;
}

const nb_var *nbi_exec_output(const nbi_exec *e, int32_t i) {
    return &e->nodes[e->outputs[i]];
}

size_t nbi_exec_workspace_bytes(const nbi_exec *e) {
    return e->ws_alloc;
}

void nbi_exec_retain(nbi_exec *e) {
    e->refcount++;
}

typedef struct nbi_range_job {
    nbi_range_fn fn;
    void *ud;
    int64_t n, chunk;
} nbi_range_job;

static void nbi_range_task(void *ud, int64_t t, int worker) {
    const nbi_range_job *j = ud;
    int64_t first = t * j->chunk;
    int64_t count = j->n - first < j->chunk ? j->n - first : j->chunk;
    j->fn(j->ud, first, count, worker);
}

void nbi_par_range(nbi_pool *pool, int64_t n, int64_t chunk, nbi_range_fn fn, void *ud) {
    if (n <= 0) {
        return;
    }
    if (chunk < 1) {
        chunk = 1;
    }
    nbi_range_job j = {fn, ud, n, chunk};
    nbi_pool_run(pool, (n + chunk - 1) / chunk, nbi_range_task, &j);
}

void nbi_run_kernel(const nb_var *node, void *out, const void *const *in, void *scratch) {
    nbi_kargs k = {.node = node, .out = out, .in = in, .scratch = scratch, .n_workers = 1};
    nbi_op_get((nbi_op)node->op)->kernel(&k);
}
