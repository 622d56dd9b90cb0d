/*
 * loop.c -- structured control flow inside traces (nabla/loops.h): the while op, and
 * fori_loop, scan, cond and switch built on it.
 *
 * The while op. Its operands are, in order, the cond function's lifted operands (its bound
 * data's leaves: closure conversion, see nbi_callee), the body's, and the initial carry.
 * at.callee is the body's executable, at.callee2 the cond's; at.a[0..2] count the three
 * operand groups, at.a[3] is max_steps (0: none), at.a[4] the loop kind. Its value is one
 * byte buffer holding the final carry laid out as a call's outputs (each leaf at a 64-byte
 * aligned offset), so call_output nodes read the leaves out of it, as for calls.
 *
 * The kernel keeps two carry buffers in its scratch and ping-pongs between them: cond and
 * body run on the current one, the body writes the next one; nothing is allocated while
 * the loop runs. The executables run serially, one after the other, each with its own
 * workspace; a kernel inside them may still use the thread pool.
 */
#include "ad/ir.h"
#include "loops/checkpoint.h"
#include "nabla/loops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* What reverse mode needs to rebuild a loop (its functions' bodies and bound data, the
 * carry's structure), kept in the trace's arena; the while node points at it (at.a[6]). */
typedef struct nbl_record nbl_record;
struct nbl_record {
    nb_fn_body cond_body, body_body;
    const char *cond_name, *body_name;
    const nb_tree *cond_self, *body_self; /* owned by the trace; NULL for none */
    const nb_tree *carry;                 /* the initial carry as traced (vars, statics) */
};

static nb_status nbl_vmap_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out);

/* The loop's body; for a batched loop (vmap), the body it batches. */
static nb_fn_body nbl_record_body(const nb_var *w) {
    const nbl_record *rec = (const nbl_record *)(intptr_t)w->at.a[6];
    if (rec == NULL) {
        return NULL;
    }
    nb_fn_body b = rec->body_body;
    if (b == nbl_vmap_body && rec->body_self != NULL) {
        nb_fnptr fp = NULL;
        const char *name = NULL;
        if (nb_tree_get_fnref(nb_tree_get(rec->body_self, "fn"), &fp, &name) == NB_OK) {
            b = (nb_fn_body)fp;
        }
    }
    return b;
}

nb_loop_opts nb_loop_opts_default(void) {
    nb_loop_opts o;
    memset(&o, 0, sizeof o);
    o.kind = NB_LOOP_LAX;
    return o;
}

/* ---- the while op ------------------------------------------------------------------- */

static size_t nbl_carry_bytes(const nbi_exec *body) {
    size_t off = 0;
    for (int32_t i = 0; i < nbi_exec_n_outputs(body); i++) {
        off += nbi_leaf_bytes(nbi_exec_output(body, i));
    }
    return off;
}

/* The carry lives in the node's own output (k->out, one packed buffer): the initial carry is
 * copied in, then the body runs in place -- its outputs are its carry inputs' buffers,
 * donated, so an elementwise update or a dynamic_update_slice into a buffer writes where it
 * reads (a row of a loop's tape costs a row, not the whole tape), and the executable copies
 * through its workspace only where an output is made while its buffer is still to be read.
 * scratch: the pointer arrays of the cond's and the body's inputs, the body's outputs, the
 * donated flags and the cond's output. */
static size_t nbi_scratch_while(const nb_var *node) {
    int64_t nc = node->at.a[0], nb = node->at.a[1], ncar = node->at.a[2];
    size_t bytes = (size_t)(nc + ncar + nb + ncar + ncar) * sizeof(void *);
    return bytes + (size_t)ncar + 64;
}

static void nbi_k_while(const nbi_kargs *k) {
    const nb_var *n = k->node;
    const nbi_exec *body = n->at.callee, *cond = n->at.callee2;
    int64_t nc = n->at.a[0], nb = n->at.a[1], ncar = n->at.a[2], max_steps = n->at.a[3];
    unsigned char *w = k->out;
    const void **cond_in = (const void **)k->scratch;
    const void **body_in = cond_in + nc + ncar;
    void **body_out = (void **)(body_in + nb + ncar);
    bool *donated = (bool *)(body_out + ncar);
    bool *flag = donated + ncar;
    for (int64_t i = 0; i < nc; i++) {
        cond_in[i] = k->in[i];
    }
    for (int64_t i = 0; i < nb; i++) {
        body_in[i] = k->in[nc + i];
    }
    size_t off = 0;
    for (int64_t i = 0; i < ncar; i++) {
        const nb_var *o = nbi_exec_output(body, (int32_t)i);
        size_t bytes = (size_t)o->size * nbi_dsize(o->dtype);
        if (bytes > 0 && nbi_while_uninit(n, i, body)) {
            /* a reverse-mode tape every step writes a row of, before any read (ir.h) */
        } else if (bytes > 0 && nbi_is_zero_fill(n->in[nc + nb + i])) {
            memset(w + off, 0, bytes); /* a tape, a scan's outputs, an accumulator */
        } else if (bytes > 0) {
            memcpy(w + off, k->in[nc + nb + i], bytes);
        }
        cond_in[nc + i] = w + off;
        body_in[nb + i] = w + off;
        body_out[i] = w + off;
        donated[i] = true;
        off += nbi_leaf_bytes(o);
    }
    /* the body's loop-invariant prefix (what depends only on its bound data) runs at the
     * first step only -- unless the cond or the body can run the body's executable between
     * two steps (a call of the body's function): that run would change its workspace */
    bool pre_valid = false, keep_pre = nbi_exec_n_pre(body) > 0 &&
                                       !nbi_exec_reaches(cond, body, 0) &&
                                       !nbi_exec_reaches(body, body, 0);
    for (int64_t step = 0; max_steps <= 0 || step < max_steps; step++) {
        void *flag_out = flag;
        nbi_exec_run_raw(cond, cond_in, &flag_out, NULL);
        if (!*flag) {
            break;
        }
        nbi_exec_run_step(body, body_in, body_out, donated, &pre_valid);
        pre_valid = pre_valid && keep_pre;
    }
}

static nb_status nbi_infer_while(nb_trace *tr, nb_var *p) {
    (void)tr;
    p->dtype = NB_DTYPE_BOOL;
    p->rank = 1;
    p->shape[0] = (int64_t)nbl_carry_bytes(p->at.callee);
    return NB_OK;
}

#define NBL_REVERSE_FIX                                                                            \
    "reverse mode through a loop of kind lax (forward only) -- make it NB_LOOP_CHECKPOINTED with " \
    "max_steps or checkpoints (bounded memory), or NB_LOOP_BOUNDED with max_steps"

/* Reverse mode reaches a while op only through nbi_while_vjp, forward mode only through
 * nbi_while_jvp (autodiff.c special-cases the op); what remains to report is reverse mode
 * through a lax loop -- and, as an internal error, anything else. */
static nb_status nbl_taped_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out);
static nb_status nbl_rev_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out);
static nb_status nbl_jvp_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out);

static nb_fn_body nbl_record_body(const nb_var *w);

void nbi_while_report(nb_trace *tr, const nb_var *w, bool reverse) {
    if (tr->status != NB_OK) {
        return;
    }
    nb_fn_body b = nbl_record_body(w);
    if (reverse && (b == nbl_taped_body || b == nbl_rev_body || b == nbl_jvp_body)) {
        nbi_trace_err(tr, NB_ERR_UNSUPPORTED,
                      "reverse mode through the derivative of a loop (a second derivative "
                      "through a loop) is not supported");
    } else if (reverse && w->at.a[4] == NB_LOOP_LAX) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s", NBL_REVERSE_FIX);
    } else {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "%s mode reached a loop's generic rule",
                      reverse ? "reverse" : "forward");
    }
}

static void nbi_vjp_while(nb_trace *tr, nb_var *node, nb_var *ct, nb_var **in_ct) {
    (void)ct;
    (void)in_ct;
    nbi_while_report(tr, node, true);
}

static nb_var *nbi_jvp_while(nb_trace *tr, nb_var *node, nb_var *const *tan) {
    (void)tan;
    nbi_while_report(tr, node, false);
    return NULL;
}

const nbi_op_info nbi_opinfo_while = {.name = "while",
                                      .n_in = -1,
                                      .infer = nbi_infer_while,
                                      .kernel = nbi_k_while,
                                      .scratch = nbi_scratch_while,
                                      .vjp = nbi_vjp_while,
                                      .jvp = nbi_jvp_while};

/* ---- building ----------------------------------------------------------------------- */

static bool nbl_plain_ok(nb_trace *tr, const char *who, const char *role, const nb_fn *f) {
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(f, NBI_MAGIC_FN, who, role, why, sizeof why)) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s", why);
        return false;
    }
    return true;
}

/* A tree of t's treedef whose dynamic leaves are vars of tr (arrays become constants):
 * the carry as the loop passes it around. */
static const nb_tree *nbl_as_vars(nb_trace *tr, const char *who, const nb_tree *t, nb_var ***vars,
                                  int64_t *n) {
    nb_tree *leaves = NULL;
    nb_treedef *def = NULL;
    if (nb_tree_flatten(t, &leaves, &def) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    int64_t m = nb_tree_len(leaves);
    nb_var **v = nbi_arena_alloc(&tr->arena, (size_t)(m + 1) * sizeof(nb_var *));
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(m + 1) * sizeof(nb_tree *));
    const nb_tree *res = NULL;
    if (v == NULL || items == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    } else {
        for (int64_t i = 0; i < m; i++) {
            const nb_tree *l = nb_tree_child(leaves, i);
            v[i] = nb_tree_kind_of(l) == NB_TREE_KIND_VAR ? nb_var_of(tr, l)
                                                          : nb_constant(tr, nb_tree_get_array(l));
            if (v[i] != NULL && v[i]->tr != tr && !nb_var_is_poison(v[i])) {
                nbi_trace_err(tr, NB_ERR_INVALID, "%s: the carry holds a var of another trace",
                              who);
            }
            items[i] = nb_leaf(v[i]);
        }
        nb_tree *list = NULL, *out = NULL;
        if (tr->status == NB_OK && nb_tree_list(tr->ctx, m, items, &list) == NB_OK &&
            nb_tree_unflatten(def, list, &out) == NB_OK && nbi_trace_own(tr, out) == NB_OK) {
            res = out;
        } else if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
        nb_tree_destroy(list);
    }
    nb_tree_destroy(leaves);
    nb_treedef_destroy(def);
    *vars = v;
    *n = m;
    return tr->status == NB_OK ? res : NULL;
}

/* The body's output must be the carry: same treedef, dtypes and shapes. */
static bool nbl_check_carry(nb_trace *tr, const char *who, const nb_fn *body,
                            const nbi_callee_info *ci, const nb_tree *carry, nb_var *const *cv,
                            int64_t ncar) {
    nb_treedef *cdef = NULL;
    if (nb_tree_treedef(carry, &cdef) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return false;
    }
    bool ok = nb_treedef_equal(cdef, ci->out_def);
    if (!ok) {
        char a[512], b[512];
        nb_treedef_format(cdef, a, sizeof a, NULL);
        nb_treedef_format(ci->out_def, b, sizeof b, NULL);
        nbi_trace_err(tr, NB_ERR_STRUCTURE,
                      "%s: the body '%s' returns %s but the carry is %s; a body returns a tree of "
                      "the carry's structure",
                      who, nb_fn_name(body), b, a);
    }
    nb_treedef_destroy(cdef);
    for (int64_t i = 0; ok && i < ncar; i++) {
        const nb_var *o = nbi_exec_output(ci->exec, (int32_t)i);
        bool same = o->dtype == cv[i]->dtype && o->rank == cv[i]->rank;
        for (int d = 0; same && d < o->rank; d++) {
            same = o->shape[d] == cv[i]->shape[d];
        }
        if (!same) {
            char path[NB_PATH_MAX], sa[96], sb[96];
            nb_tree_leaf_path(carry, i, path, sizeof path, NULL);
            nbi_var_sig(sa, sizeof sa, cv[i]);
            nbi_var_sig(sb, sizeof sb, o);
            nbi_trace_err(tr, NB_ERR_STRUCTURE,
                          "%s: the body '%s' returns %s at %s where the carry is %s; a loop's "
                          "carry keeps its dtypes and shapes",
                          who, nb_fn_name(body), sb, path[0] ? path : "<root>", sa);
            ok = false;
        }
    }
    return ok;
}

/* Buffers: carry leaf j is a buffer when bit j of at.b[] is set (at most 512 leaves). */
#define NBL_MAX_BUF_LEAVES (64 * NB_MAX_RANK)

static bool nbl_is_buf(const nb_var *w, int64_t j) {
    return j < NBL_MAX_BUF_LEAVES && ((uint64_t)w->at.b[j / 64] >> (j % 64)) & 1u;
}

/* Walk the carry t with the buffers mask m (bools, a prefix of t's structure), setting bit k
 * of bits for every dynamic leaf marked true. */
static bool nbl_mask_rec(nb_trace *tr, const char *who, const nb_tree *t, const nb_tree *m,
                         int have, bool val, uint64_t *bits, int64_t *k, int depth) {
    if (depth > NB_TREE_MAX_DEPTH) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: buffers: the carry nests too deeply", who);
        return false;
    }
    if (!have && nb_tree_kind_of(m) == NB_TREE_KIND_BOOL) {
        nb_tree_get_bool(m, &val);
        have = 1;
    }
    if (nb_tree_is_leaf(t)) {
        if (!have) {
            nbi_trace_err(tr, NB_ERR_STRUCTURE,
                          "%s: buffers holds a %s where the carry has a leaf; give a bool there",
                          who, nb_tree_kind_name(nb_tree_kind_of(m)));
            return false;
        }
        if (nb_tree_is_dynamic(t)) {
            if (val) {
                if (*k >= NBL_MAX_BUF_LEAVES) {
                    nbi_trace_err(tr, NB_ERR_INVALID, "%s: buffers among more than %d carry leaves",
                                  who, NBL_MAX_BUF_LEAVES);
                    return false;
                }
                bits[*k / 64] |= (uint64_t)1 << (*k % 64);
            }
            (*k)++;
        }
        return true;
    }
    int64_t n = nb_tree_len(t);
    if (!have && (nb_tree_kind_of(m) != nb_tree_kind_of(t) || nb_tree_len(m) != n)) {
        nbi_trace_err(tr, NB_ERR_STRUCTURE,
                      "%s: buffers does not fit the carry: %s of %lld vs %s of %lld (a tree of "
                      "bools shaped like the carry, or a prefix of it)",
                      who, nb_tree_kind_name(nb_tree_kind_of(m)), (long long)nb_tree_len(m),
                      nb_tree_kind_name(nb_tree_kind_of(t)), (long long)n);
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        if (!nbl_mask_rec(tr, who, nb_tree_child(t, i), have ? m : nb_tree_child(m, i), have, val,
                          bits, k, depth + 1)) {
            return false;
        }
    }
    return true;
}

static nb_fn *nbl_wrapper(nb_trace *tr, const char *who, const char *name, nb_fn_body wbody,
                          nb_fn_body ubody, const char *uname, const nb_tree *uself, int n_extra,
                          const char *const *keys, nb_tree *const *vals);
static nb_status nbl_call_user(nb_trace *tr, const nb_tree *wself, const nb_tree *args,
                               nb_tree **out);

/* Is v the constant 1 (a full node of value 1, as nb_scalar_typed makes)? */
static bool nbl_is_one(const nb_var *v) {
    return v->op == NBI_OP_FULL && v->size == 1 && v->at.value == 1.0;
}

/* Distinct writes, proved while tracing: every buffer leaf comes out as at most one
 * dynamic_update_slice of its input, writing one row (axis 0) at a step counter -- a 0-d
 * integer carry leaf the body returns as itself + 1 -- so no row is written twice. */
static nb_status nbl_guard_writes(nb_trace *tr, const nb_tree *args, const nb_tree *in_leaves,
                                  const nb_tree *out, const int64_t *src, const nb_tree *bm) {
    nb_tree *ol = NULL;
    if (nb_tree_flatten(out, &ol, NULL) != NB_OK) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    int64_t n = nb_tree_len(in_leaves);
    nb_status st = NB_OK;
    if (nb_tree_len(ol) != n) {
        nb_tree_destroy(ol);
        return NB_OK; /* the carry check reports the mismatch */
    }
    for (int64_t j = 0; j < n && st == NB_OK; j++) {
        bool buf = false;
        nb_tree_get_bool(nb_tree_child(bm, j), &buf);
        const nb_tree *il = nb_tree_child(in_leaves, j), *olj = nb_tree_child(ol, j);
        if (!buf || nb_tree_kind_of(il) != NB_TREE_KIND_VAR ||
            nb_tree_kind_of(olj) != NB_TREE_KIND_VAR) {
            continue;
        }
        nb_var *p = nb_var_of(tr, il), *o = nb_var_of(tr, olj);
        const char *why = NULL;
        if (o != p) {
            if (o->op != NBI_OP_DYN_UPDATE || o->in[0] != p ||
                (o->id < tr->g.n_nodes && src[o->id] != j + 1)) {
                why = o->op == NBI_OP_DYN_UPDATE && o->in[0]->op == NBI_OP_DYN_UPDATE
                          ? "it is written more than once in a step"
                          : "it is not the input buffer with one nb_dynamic_update_slice into it";
            } else if (o->in[1]->rank < 1 || o->in[1]->shape[0] != 1) {
                why = "a write covers more than one row of its first axis";
            } else {
                /* the row: a counter, maybe cast */
                const nb_var *idx = o->in[2];
                if (idx->op == NBI_OP_CAST) {
                    idx = idx->in[0];
                }
                bool counter = false;
                for (int64_t c = 0; c < n && !counter; c++) {
                    const nb_tree *ic = nb_tree_child(in_leaves, c), *oc = nb_tree_child(ol, c);
                    if (nb_tree_kind_of(ic) != NB_TREE_KIND_VAR ||
                        nb_tree_kind_of(oc) != NB_TREE_KIND_VAR) {
                        continue;
                    }
                    const nb_var *pc = nb_var_of(tr, ic), *occ = nb_var_of(tr, oc);
                    counter = pc == idx && pc->rank == 0 && !nb_dtype_is_float(pc->dtype) &&
                              pc->dtype != NB_DTYPE_BOOL && occ->op == NBI_OP_ADD &&
                              ((occ->in[0] == pc && nbl_is_one(occ->in[1])) ||
                               (occ->in[1] == pc && nbl_is_one(occ->in[0])));
                }
                if (!counter) {
                    why = "its row index is not the loop's step counter";
                }
            }
        }
        if (why != NULL) {
            char path[NB_PATH_MAX];
            nb_tree_leaf_path(args, j, path, sizeof path, NULL);
            st = nbi_trace_err(tr, NB_ERR_INVALID,
                               "the loop body's writes to the buffer at %s are not provably at "
                               "distinct indices: %s -- write one row per step with "
                               "nb_dynamic_update_slice at a step counter (a carry integer the "
                               "body returns plus 1), or take it out of nb_loop_opts.buffers",
                               path[0] ? path : "<root>", why);
        }
    }
    nb_tree_destroy(ol);
    return st;
}

/* The body of a loop with buffers, traced through this guard: buffers are write-only, so
 * a buffer (or what a dynamic_update_slice into it made) may only be the updated operand of
 * another dynamic_update_slice or an output; any other use is a read, reported with the
 * buffer's path. self = dict(fn, self, bufmask (a tuple of bools per carry leaf)). */
static nb_status nbl_guard_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    nb_tree *leaves = NULL;
    if (nb_tree_flatten(args, &leaves, NULL) != NB_OK) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    int32_t begin = tr->g.n_nodes;
    nb_status st = nbl_call_user(tr, self, args, out);
    int32_t end = tr->g.n_nodes;
    const nb_tree *bm = nb_tree_get(self, "bufmask");
    int64_t *src =
        st == NB_OK ? nbi_arena_alloc(&tr->arena, ((size_t)end + 1) * sizeof(int64_t)) : NULL;
    if (st == NB_OK && src == NULL) {
        st = nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    if (st == NB_OK) {
        /* src[id] = 1 + the carry leaf a buffer value comes from, 0 for other values */
        for (int64_t j = 0; j < nb_tree_len(leaves); j++) {
            bool buf = false;
            nb_tree_get_bool(nb_tree_child(bm, j), &buf);
            const nb_tree *l = nb_tree_child(leaves, j);
            if (buf && nb_tree_kind_of(l) == NB_TREE_KIND_VAR) {
                src[nb_var_of(tr, l)->id] = j + 1;
            }
        }
        for (int32_t i = begin; i < end && st == NB_OK; i++) {
            const nb_var *v = tr->g.nodes[i];
            for (int32_t k = 0; k < v->n_in && st == NB_OK; k++) {
                int64_t from = v->in[k]->id < end ? src[v->in[k]->id] : 0;
                if (from == 0) {
                    continue;
                }
                if (v->op == NBI_OP_DYN_UPDATE && k == 0) {
                    src[v->id] = from;
                    continue;
                }
                char path[NB_PATH_MAX];
                nb_tree_leaf_path(args, from - 1, path, sizeof path, NULL);
                st = nbi_trace_err(tr, NB_ERR_INVALID,
                                   "the loop body reads the buffer at %s (op %s); buffers are "
                                   "written at distinct indices with nb_dynamic_update_slice and "
                                   "never read -- take it out of nb_loop_opts.buffers, or read "
                                   "the value from the carry before it goes into the buffer",
                                   path[0] ? path : "<root>", nbi_op_name((nbi_op)v->op));
            }
        }
    }
    if (st == NB_OK) {
        st = nbl_guard_writes(tr, args, leaves, *out, src, bm);
    }
    nb_tree_destroy(leaves);
    if (st != NB_OK && *out != NULL) {
        nb_tree_destroy(*out);
        *out = NULL;
    }
    return st;
}

static bool nbl_unwrap(nb_trace *tr, const char *who, const char *role, const nb_fn *f,
                       nb_fn_body *body, const nb_tree **self);

static bool nbl_record_fill(nb_trace *tr, const char *who, nbl_record *rec, const nb_fn *cond,
                            const nb_fn *body, const nb_tree *carry) {
    if (!nbl_unwrap(tr, who, "cond", cond, &rec->cond_body, &rec->cond_self) ||
        !nbl_unwrap(tr, who, "body", body, &rec->body_body, &rec->body_self)) {
        return false;
    }
    const nb_tree *selfs[2] = {rec->cond_self, rec->body_self};
    for (int k = 0; k < 2; k++) {
        if (selfs[k] != NULL && nbi_trace_own(tr, nb_tree_retain((nb_tree *)selfs[k])) != NB_OK) {
            return false;
        }
    }
    const char *names[2] = {nb_fn_name(cond), nb_fn_name(body)};
    char *copies[2];
    for (int k = 0; k < 2; k++) {
        size_t len = strlen(names[k]) + 1;
        copies[k] = nbi_arena_alloc(&tr->arena, len);
        if (copies[k] == NULL) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
            return false;
        }
        memcpy(copies[k], names[k], len);
    }
    rec->cond_name = copies[0];
    rec->body_name = copies[1];
    rec->carry = carry;
    return true;
}

/* known_trips > 0: the loop runs exactly that many steps (fori, scan), so reversing it can
 * follow the offline (revolve) schedule. */
/* The loop options' rules (Equinox's); checkpoints are capped at max_steps (more slots
 * than steps never help). */
static bool nbl_check_opts(nb_trace *tr, const char *who, nb_loop_opts *o) {
    if ((int)o->kind < NB_LOOP_LAX || (int)o->kind > NB_LOOP_BOUNDED || o->max_steps < 0 ||
        o->checkpoints < 0 || o->checkpoints > ((int64_t)1 << 40)) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: bad options (kind %d, max_steps %lld, checkpoints %lld): kind is lax, "
                      "checkpointed or bounded; max_steps >= 0; 0 <= checkpoints <= 2^40",
                      who, (int)o->kind, (long long)o->max_steps, (long long)o->checkpoints);
        return false;
    }
    if (o->kind == NB_LOOP_CHECKPOINTED && o->max_steps == 0 && o->checkpoints == 0) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: a checkpointed loop needs max_steps or checkpoints (as in Equinox): "
                      "give max_steps (checkpoints then default to "
                      "floor(-1.5 + sqrt(2 max_steps + 0.25)) + 1) or checkpoints",
                      who);
        return false;
    }
    if (o->kind == NB_LOOP_BOUNDED && o->max_steps == 0) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: a bounded loop stores every step and needs max_steps to size its tape",
                      who);
        return false;
    }
    if (o->max_steps > 0 && o->checkpoints > o->max_steps) {
        o->checkpoints = o->max_steps;
    }
    return true;
}

/* trusted: buffer bits already proved (a batched copy of a loop whose body passed the
 * guard: vmap), used as they are, without opts->buffers or the guard; *node: the while node
 * (may be NULL). */
static const nb_tree *nbl_while_ex(nb_trace *tr, const char *who, nb_fn *cond, nb_fn *body,
                                   const nb_tree *init, const nb_loop_opts *opts,
                                   int64_t known_trips, const uint64_t *trusted, nb_var **node) {
    if (tr == NULL || nb_trace_status(tr) != NB_OK) {
        return NULL;
    }
    nb_loop_opts o = opts != NULL ? *opts : nb_loop_opts_default();
    if (!nbl_plain_ok(tr, who, "cond", cond) || !nbl_plain_ok(tr, who, "body", body)) {
        return NULL;
    }
    if (!nbi_obj_live(init, NBI_MAGIC_TREE)) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s: the initial carry is NULL or destroyed", who);
        return NULL;
    }
    if (!nbl_check_opts(tr, who, &o)) {
        return NULL;
    }
    nb_var **cv = NULL;
    int64_t ncar = 0;
    const nb_tree *carry = nbl_as_vars(tr, who, init, &cv, &ncar);
    if (carry == NULL) {
        return NULL;
    }
    uint64_t bufbits[NB_MAX_RANK] = {0};
    if (trusted != NULL) {
        memcpy(bufbits, trusted, sizeof bufbits);
    } else if (o.buffers != NULL) {
        int64_t k = 0;
        if (!nbi_obj_live(o.buffers, NBI_MAGIC_TREE)) {
            nbi_trace_err(tr, NB_ERR_MISUSE, "%s: buffers is a destroyed tree", who);
            return NULL;
        }
        if (!nbl_mask_rec(tr, who, carry, o.buffers, 0, false, bufbits, &k, 0)) {
            return NULL;
        }
        for (int64_t j = 0; j < ncar; j++) {
            if ((bufbits[j / 64] >> (j % 64) & 1u) && cv[j]->rank < 1) {
                char path[NB_PATH_MAX];
                nb_tree_leaf_path(carry, j, path, sizeof path, NULL);
                nbi_trace_err(tr, NB_ERR_SHAPE,
                              "%s: the buffer at %s is 0-d; a buffer is an array the body writes "
                              "at distinct indices of its first axis",
                              who, path[0] ? path : "<root>");
                return NULL;
            }
        }
    }
    nbl_record *rec = nbi_arena_alloc(&tr->arena, sizeof *rec);
    if (rec == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    if (!nbl_record_fill(tr, who, rec, cond, body, carry)) {
        return NULL;
    }
    nbi_callee_info ci_c, ci_b;
    nb_fn *guard = NULL;
    bool any_buf = false;
    for (int i = 0; i < NB_MAX_RANK; i++) {
        any_buf = any_buf || bufbits[i] != 0;
    }
    if (any_buf && trusted == NULL) {
        /* the body through the buffer guard (same output, same lifted operands) */
        nb_tree **bi = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_tree *));
        nb_tree *bufmask = NULL;
        bool ok = bi != NULL;
        for (int64_t j = 0; ok && j < ncar; j++) {
            ok = nb_tree_bool(tr->ctx, (bufbits[j / 64] >> (j % 64)) & 1u, &bi[j]) == NB_OK;
        }
        ok = ok && nb_tree_tuple(tr->ctx, ncar, bi, &bufmask) == NB_OK;
        for (int64_t j = 0; bi != NULL && j < ncar; j++) {
            nb_tree_destroy(bi[j]);
        }
        if (ok) {
            guard = nbl_wrapper(tr, who, nb_fn_name(body), nbl_guard_body, rec->body_body,
                                rec->body_name, rec->body_self, 1, (const char *[]){"bufmask"},
                                &bufmask);
        } else {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
        nb_tree_destroy(bufmask);
        if (guard == NULL) {
            return NULL;
        }
    }
    nb_status cst = nbi_callee(tr, cond, carry, who, false, &ci_c);
    if (cst == NB_OK) {
        cst = nbi_callee(tr, guard != NULL ? guard : body, carry, who, true, &ci_b);
    }
    nb_fn_destroy(guard);
    if (cst != NB_OK) {
        return NULL;
    }
    if (nbi_exec_n_outputs(ci_c.exec) != 1 || nbi_exec_output(ci_c.exec, 0)->rank != 0 ||
        nbi_exec_output(ci_c.exec, 0)->dtype != NB_DTYPE_BOOL) {
        char sig[96] = "several outputs";
        if (nbi_exec_n_outputs(ci_c.exec) == 1) {
            nbi_var_sig(sig, sizeof sig, nbi_exec_output(ci_c.exec, 0));
        }
        nbi_trace_err(tr, NB_ERR_SHAPE, "%s: the cond '%s' returns %s; it must return a 0-d bool",
                      who, nb_fn_name(cond), sig);
        return NULL;
    }
    if (!nbl_check_carry(tr, who, body, &ci_b, carry, cv, ncar)) {
        return NULL;
    }
    int64_t n_ops = ci_c.n_self + ci_b.n_self + ncar;
    nb_var **ops = nbi_arena_alloc(&tr->arena, (size_t)(n_ops + 1) * sizeof(nb_var *));
    if (ops == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    memcpy(ops, ci_c.ops, (size_t)ci_c.n_self * sizeof(nb_var *));
    memcpy(ops + ci_c.n_self, ci_b.ops, (size_t)ci_b.n_self * sizeof(nb_var *));
    memcpy(ops + ci_c.n_self + ci_b.n_self, cv, (size_t)ncar * sizeof(nb_var *));
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.callee = ci_b.exec;
    at.callee2 = ci_c.exec;
    at.a[0] = ci_c.n_self;
    at.a[1] = ci_b.n_self;
    at.a[2] = ncar;
    at.a[3] = o.max_steps;
    at.a[4] = o.kind;
    at.a[5] = o.checkpoints;
    at.a[6] = (int64_t)(intptr_t)rec;
    at.a[7] = known_trips;
    for (int i = 0; i < NB_MAX_RANK; i++) {
        at.b[i] = (int64_t)bufbits[i];
    }
    nb_var *w = nbi_emit(tr, NBI_OP_WHILE, (int)n_ops, ops, &at);
    if (node != NULL) {
        *node = w;
    }
    nb_tree **outl = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_tree *));
    if (outl == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    size_t off = 0;
    for (int64_t i = 0; i < ncar; i++) {
        memset(&at, 0, sizeof at);
        at.ivalue = i;
        at.a[0] = (int64_t)off;
        off += nbi_leaf_bytes(nbi_exec_output(ci_b.exec, (int32_t)i));
        outl[i] = nb_leaf(nbi_emit(tr, NBI_OP_CALL_OUTPUT, 1, &w, &at));
        if (outl[i] == NULL) {
            return NULL;
        }
    }
    if (tr->status != NB_OK) {
        return NULL;
    }
    nb_tree *list = NULL, *res = NULL;
    nb_status st = nb_tree_list(tr->ctx, ncar, outl, &list);
    if (st == NB_OK) {
        st = nb_tree_unflatten(ci_b.out_def, list, &res);
    }
    nb_tree_destroy(list);
    if (st != NB_OK || nbi_trace_own(tr, res) != NB_OK) {
        nbi_trace_err(tr, st != NB_OK ? st : NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    return res;
}

static const nb_tree *nbl_while(nb_trace *tr, const char *who, nb_fn *cond, nb_fn *body,
                                const nb_tree *init, const nb_loop_opts *opts,
                                int64_t known_trips) {
    return nbl_while_ex(tr, who, cond, body, init, opts, known_trips, NULL, NULL);
}

const nb_tree *nb_while_loop(nb_trace *tr, nb_fn *cond, nb_fn *body, const nb_tree *init,
                             const nb_loop_opts *opts) {
    return nbl_while(tr, "nb_while_loop", cond, body, init, opts, 0);
}

/* ---- fori_loop, scan, cond, switch: while loops of wrapper functions ------------------- */

/* The wrappers below call the user's function body directly, with the user's bound data
 * moved into the wrapper's own (self.self): its vars of the enclosing trace are lifted like
 * any others, and the wrapper's cache key holds the user's body pointer (self.fn). */
static bool nbl_unwrap(nb_trace *tr, const char *who, const char *role, const nb_fn *f,
                       nb_fn_body *body, const nb_tree **self) {
    if (!nbl_plain_ok(tr, who, role, f)) {
        return false;
    }
    while (f->kind == NBI_FN_JIT || f->kind == NBI_FN_MAXTRACES) {
        f = f->inner;
    }
    if (f->kind != NBI_FN_PLAIN) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: the %s function '%s' is a transformed function (grad, vjp, jvp, "
                      "custom_vjp); give a function made by nb_fn_create (or nb_jit of one) and "
                      "transform the function that contains the loop instead",
                      who, role, f->name);
        return false;
    }
    *body = f->body;
    *self = f->self;
    return true;
}

/* A wrapper function: body wbody, self dict(fn=<user body>, self=<user self or null>,
 * extra...). Returns a new function (NULL after a sticky error). */
static nb_fn *nbl_wrapper(nb_trace *tr, const char *who, const char *name, nb_fn_body wbody,
                          nb_fn_body ubody, const char *uname, const nb_tree *uself, int n_extra,
                          const char *const *keys, nb_tree *const *vals) {
    nb_ctx *ctx = tr->ctx;
    const char *k[8] = {"fn", "self"};
    nb_tree *v[8] = {NULL, NULL};
    nb_status st = nb_tree_fnref(ctx, (nb_fnptr)ubody, uname, &v[0]);
    if (st == NB_OK) {
        st = uself != NULL ? (v[1] = nb_tree_retain((nb_tree *)uself), NB_OK)
                           : nb_tree_null(ctx, &v[1]);
    }
    for (int i = 0; i < n_extra; i++) {
        k[2 + i] = keys[i];
        v[2 + i] = nb_tree_retain(vals[i]);
    }
    nb_tree *wself = NULL;
    nb_fn *f = NULL;
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 2 + n_extra, k, v, &wself);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, name, wbody, wself, &f);
    }
    for (int i = 0; i < 2 + n_extra; i++) {
        nb_tree_destroy(v[i]);
    }
    nb_tree_destroy(wself);
    if (st != NB_OK) {
        nbi_trace_err(tr, st, "%s: out of memory", who);
        return NULL;
    }
    return f;
}

/* Call the user's body stored in a wrapper's self on args; *out a new reference. */
static nb_status nbl_call_user(nb_trace *tr, const nb_tree *wself, const nb_tree *args,
                               nb_tree **out) {
    nb_fnptr fp = NULL;
    const char *name = NULL;
    nb_tree_get_fnref(nb_tree_get(wself, "fn"), &fp, &name);
    const nb_tree *uself = nb_tree_get(wself, "self");
    if (nb_tree_kind_of(uself) == NB_TREE_KIND_NULL) {
        uself = NULL;
    }
    *out = NULL;
    /* the user's function is the one being traced now (messages, debug_nans) */
    const char *saved = tr->fn_name;
    tr->fn_name = name != NULL ? name : saved;
    nb_status st = ((nb_fn_body)fp)(tr, uself, args, out);
    tr->fn_name = saved;
    if (tr->status != NB_OK) {
        st = tr->status;
    }
    if (st != NB_OK) {
        nb_tree_destroy(*out);
        *out = NULL;
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, st, "the function '%s' failed: %s", name, nb_ctx_errmsg(tr->ctx));
        }
    } else if (*out == NULL) {
        st = nbi_trace_err(tr, NB_ERR_MISUSE, "the function '%s' returned no output", name);
    }
    return st;
}

static nb_var *nbl_i32(nb_trace *tr, int64_t v) {
    return nb_scalar_typed(tr, NB_DTYPE_I32, (double)v);
}

/* fori: the carry is (i, carry); cond: i < hi; body: (i + 1, user((i, carry))). */
static nb_status nbl_fori_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    int64_t hi = 0;
    nb_tree_get_int(nb_tree_get(self, "hi"), &hi);
    return nb_return(nb_lt(nb_get(tr, args, "[0]"), nbl_i32(tr, hi)), out);
}

static nb_status nbl_fori_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_tree *res = NULL;
    nb_status st = nbl_call_user(tr, self, args, &res);
    if (st != NB_OK) {
        return st;
    }
    nb_tree *i1 = nb_leaf(nb_add(nb_get(tr, args, "[0]"), nbl_i32(tr, 1)));
    st = i1 == NULL ? nb_trace_status(tr) : nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){i1, res}, out);
    nb_tree_destroy(res);
    return st;
}

static nb_status nbl_const_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)args;
    return nb_return(nb_var_of(tr, nb_tree_get(self, "pred")), out);
}

/* The tuple (a, b) as a trace-owned tree. */
static const nb_tree *nbl_pair(nb_trace *tr, const nb_tree *a, const nb_tree *b) {
    nb_tree *t = NULL;
    if (nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){(nb_tree *)a, (nb_tree *)b}, &t) != NB_OK ||
        nbi_trace_own(tr, t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
        return NULL;
    }
    return t;
}

/* A trace-owned tuple of n masks for a wrapper's carry: false, or the user's buffers at
 * position user_at, true at position true_at (-1: none). */
static const nb_tree *nbl_buf_mask(nb_trace *tr, int n, int user_at, const nb_tree *user,
                                   int true_at) {
    nb_tree *items[4] = {NULL, NULL, NULL, NULL}, *t = NULL;
    nb_status st = NB_OK;
    for (int i = 0; i < n && st == NB_OK; i++) {
        if (i == user_at && user != NULL) {
            items[i] = nb_tree_retain((nb_tree *)user);
        } else {
            st = nb_tree_bool(tr->ctx, i == true_at, &items[i]);
        }
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(tr->ctx, n, items, &t);
    }
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    if (st != NB_OK || nbi_trace_own(tr, t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
        return NULL;
    }
    return t;
}

const nb_tree *nb_fori_loop(nb_trace *tr, int64_t lo, int64_t hi, nb_fn *body, const nb_tree *init,
                            const nb_loop_opts *opts) {
    static const char who[] = "nb_fori_loop";
    if (tr == NULL || tr->status != NB_OK) {
        return NULL;
    }
    nb_fn_body ub = NULL;
    const nb_tree *us = NULL;
    if (!nbl_unwrap(tr, who, "body", body, &ub, &us)) {
        return NULL;
    }
    if (!nbi_obj_live(init, NBI_MAGIC_TREE)) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s: the initial carry is NULL or destroyed", who);
        return NULL;
    }
    if (lo < INT32_MIN || hi > INT32_MAX || lo > INT32_MAX || hi < INT32_MIN) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: bounds [%lld, %lld) outside the i32 range", who,
                      (long long)lo, (long long)hi);
        return NULL;
    }
    nb_loop_opts o = opts != NULL ? *opts : nb_loop_opts_default();
    int64_t trips = hi > lo ? hi - lo : 0;
    if (o.max_steps > 0 && o.max_steps < trips) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: max_steps = %lld is less than the trip count %lld of [%lld, %lld): "
                      "the loop would stop after %lld steps; give max_steps >= %lld or 0 (the "
                      "trip count is known)",
                      who, (long long)o.max_steps, (long long)trips, (long long)lo, (long long)hi,
                      (long long)o.max_steps, (long long)trips);
        return NULL;
    }
    if (trips == 0) {
        nb_loop_opts chk = o;
        chk.max_steps = chk.max_steps > 0 ? chk.max_steps : 1;
        if (!nbl_check_opts(tr, who, &chk)) {
            return NULL;
        }
    }
    if (o.max_steps == 0 || o.max_steps > trips) {
        o.max_steps = trips; /* the trip count is known */
    }
    if (trips == 0) {
        nb_var **cv = NULL;
        int64_t ncv = 0;
        return nbl_as_vars(tr, who, init, &cv, &ncv); /* the carry, trace-owned */
    }
    nb_tree *hi_leaf = NULL;
    if (nb_tree_int(tr->ctx, hi, &hi_leaf) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    nb_fn *c = NULL, *b = NULL;
    nb_tree *cself = NULL;
    if (nb_tree_dict(tr->ctx, 1, (const char *[]){"hi"}, &hi_leaf, &cself) == NB_OK) {
        nb_fn_create(tr->ctx, "fori_cond", nbl_fori_cond, cself, &c);
    }
    nb_tree_destroy(cself);
    nb_tree_destroy(hi_leaf);
    b = nbl_wrapper(tr, who, "fori_body", nbl_fori_body, ub, body->name, us, 0, NULL, NULL);
    const nb_tree *res = NULL;
    if (c == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    } else if (b != NULL) {
        const nb_tree *carry = nbl_pair(tr, nb_leaf(nbl_i32(tr, lo)), init);
        if (o.buffers != NULL) {
            o.buffers = nbl_buf_mask(tr, 2, 1, o.buffers, -1);
        }
        const nb_tree *w =
            carry && tr->status == NB_OK ? nbl_while(tr, who, c, b, carry, &o, trips) : NULL;
        res = w != NULL ? nb_tree_child(w, 1) : NULL;
    }
    nb_fn_destroy(c);
    nb_fn_destroy(b);
    return res;
}

/* cond / switch: branch k runs as a while loop of at most one step whose cond is
 * (index == k), over the carry (out, operand); the loops are chained, so exactly the
 * chosen branch runs. */
static nb_status nbl_branch_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                 nb_tree **out) {
    nb_tree *res = NULL;
    nb_status st = nbl_call_user(tr, self, nb_tree_child(args, 1), &res);
    if (st != NB_OK) {
        return st;
    }
    st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){res, (nb_tree *)nb_tree_child(args, 1)}, out);
    nb_tree_destroy(res);
    return st;
}

/* Zero vars of the output signature of f on args (f traced through the cache). */
static const nb_tree *nbl_zeros_of(nb_trace *tr, const char *who, nb_fn *f, const nb_tree *args) {
    nbi_callee_info ci;
    if (nbi_callee(tr, f, args, who, false, &ci) != NB_OK) {
        return NULL;
    }
    int32_t n = nbi_exec_n_outputs(ci.exec);
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_tree *));
    if (items == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        const nb_var *o = nbi_exec_output(ci.exec, i);
        items[i] = nb_leaf(nb_full(tr, o->dtype, o->rank, o->shape, 0.0));
    }
    nb_tree *list = NULL, *res = NULL;
    if (tr->status == NB_OK && nb_tree_list(tr->ctx, n, items, &list) == NB_OK &&
        nb_tree_unflatten(ci.out_def, list, &res) == NB_OK && nbi_trace_own(tr, res) == NB_OK) {
        nb_tree_destroy(list);
        return res;
    }
    nb_tree_destroy(list);
    if (tr->status == NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    }
    return NULL;
}

const nb_tree *nb_switch(nb_trace *tr, nb_var *index, int n, nb_fn *const *branches,
                         const nb_tree *operand) {
    static const char who[] = "nb_switch";
    if (tr == NULL || tr->status != NB_OK) {
        return NULL;
    }
    if (index == NULL) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s: index is a NULL var (pass a 0-d integer var)", who);
        return NULL;
    }
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(operand, NBI_MAGIC_TREE, who, "operand", why, sizeof why)) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s", why);
        return NULL;
    }
    if (nb_var_is_poison(index)) {
        return NULL;
    }
    if (n < 1 || branches == NULL) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: needs n >= 1 branches", who);
        return NULL;
    }
    if (index->rank != 0 || nb_dtype_is_float(index->dtype) || index->dtype == NB_DTYPE_BOOL) {
        char sig[96];
        nbi_var_sig(sig, sizeof sig, index);
        bool int_dtype = !nb_dtype_is_float(index->dtype) && index->dtype != NB_DTYPE_BOOL;
        nbi_trace_err(tr, int_dtype ? NB_ERR_SHAPE : NB_ERR_DTYPE,
                      "%s: the index is %s; it must be a 0-d integer var", who, sig);
        return NULL;
    }
    nb_fn_body ub[64];
    const nb_tree *us[64];
    if (n > 64) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: %d branches (at most 64)", who, n);
        return NULL;
    }
    for (int k = 0; k < n; k++) {
        if (!nbl_unwrap(tr, who, "branch", branches[k], &ub[k], &us[k])) {
            return NULL;
        }
    }
    nb_var *idx =
        nb_minimum(nb_maximum(nb_cast(index, NB_DTYPE_I64), nb_scalar_typed(tr, NB_DTYPE_I64, 0.0)),
                   nb_scalar_typed(tr, NB_DTYPE_I64, (double)(n - 1)));
    const nb_tree *out = nbl_zeros_of(tr, who, branches[0], operand);
    const nb_tree *carry = out != NULL ? nbl_pair(tr, out, operand) : NULL;
    nb_loop_opts o = nb_loop_opts_default();
    o.max_steps = 1;
    o.kind = NB_LOOP_BOUNDED; /* reverse mode through a branch: a one-row tape */
    for (int k = 0; k < n && carry != NULL; k++) {
        nb_tree *pred = nb_leaf(nb_eq(idx, nb_scalar_typed(tr, NB_DTYPE_I64, (double)k)));
        nb_tree *cself = NULL;
        nb_fn *c = NULL, *b = NULL;
        if (pred != NULL &&
            nb_tree_dict(tr->ctx, 1, (const char *[]){"pred"}, &pred, &cself) == NB_OK) {
            nb_fn_create(tr->ctx, "branch_cond", nbl_const_cond, cself, &c);
        }
        nb_tree_destroy(cself);
        b = nbl_wrapper(tr, who, "branch", nbl_branch_body, ub[k], branches[k]->name, us[k], 0,
                        NULL, NULL);
        if (c == NULL && tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
        carry = (c != NULL && b != NULL) ? nbl_while(tr, who, c, b, carry, &o, 0) : NULL;
        nb_fn_destroy(c);
        nb_fn_destroy(b);
    }
    return carry != NULL ? nb_tree_child(carry, 0) : NULL;
}

const nb_tree *nb_cond(nb_trace *tr, nb_var *pred, nb_fn *true_fn, nb_fn *false_fn,
                       const nb_tree *operand) {
    if (tr == NULL || tr->status != NB_OK) {
        return NULL;
    }
    static const char who[] = "nb_cond";
    if (pred == NULL) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s: pred is a NULL var (pass a 0-d bool var)", who);
        return NULL;
    }
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(operand, NBI_MAGIC_TREE, who, "operand", why, sizeof why)) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s", why);
        return NULL;
    }
    /* the branches are checked here too, so that the message names nb_cond (not nb_switch) */
    if (!nbl_plain_ok(tr, who, "true_fn", true_fn) ||
        !nbl_plain_ok(tr, who, "false_fn", false_fn)) {
        return NULL;
    }
    if (nb_var_is_poison(pred)) {
        return NULL;
    }
    if (pred->rank != 0 || pred->dtype != NB_DTYPE_BOOL) {
        char sig[96];
        nbi_var_sig(sig, sizeof sig, pred);
        nbi_trace_err(tr, pred->dtype == NB_DTYPE_BOOL ? NB_ERR_SHAPE : NB_ERR_DTYPE,
                      "nb_cond: the predicate is %s; it must be a 0-d bool (compare with nb_gt "
                      "& co, or nb_cast to bool)",
                      sig);
        return NULL;
    }
    /* branch 0 is false, 1 is true (lax.cond's order) */
    nb_fn *br[2] = {false_fn, true_fn};
    return nb_switch(tr, nb_cast(pred, NB_DTYPE_I32), 2, br, operand);
}

/* scan: the carry is (i, carry, ys); x_i are slices of the wrapper's self.xs (lifted). */
static nb_status nbl_scan_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    nb_var *i = nb_get(tr, args, "[0]");
    const nb_tree *xs = nb_tree_get(self, "xs");
    nb_tree *xi = NULL;
    nb_status st = NB_OK;
    if (nb_tree_kind_of(xs) == NB_TREE_KIND_NULL) {
        st = nb_tree_null(tr->ctx, &xi);
    } else {
        nb_tree *leaves = NULL;
        nb_treedef *def = NULL;
        st = nb_tree_flatten(xs, &leaves, &def);
        int64_t m = st == NB_OK ? nb_tree_len(leaves) : 0;
        nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(m + 1) * sizeof(nb_tree *));
        for (int64_t k = 0; st == NB_OK && k < m; k++) {
            nb_var *x = nb_var_of(tr, nb_tree_child(leaves, k));
            nb_var *starts[NB_MAX_RANK];
            int64_t sizes[NB_MAX_RANK];
            starts[0] = i;
            sizes[0] = 1;
            for (int d = 1; d < nb_var_rank(x); d++) {
                starts[d] = nbl_i32(tr, 0);
                sizes[d] = nb_var_dim(x, d);
            }
            nb_var *sl = nb_dynamic_slice(x, starts, sizes);
            items[k] = nb_leaf(nb_reshape(sl, nb_var_rank(x) - 1, nb_var_shape(x) + 1));
        }
        nb_tree *list = NULL;
        if (st == NB_OK && tr->status == NB_OK && items != NULL) {
            st = nb_tree_list(tr->ctx, m, items, &list);
            if (st == NB_OK) {
                st = nb_tree_unflatten(def, list, &xi);
            }
        }
        nb_tree_destroy(list);
        nb_tree_destroy(leaves);
        nb_treedef_destroy(def);
    }
    if (st != NB_OK || tr->status != NB_OK) {
        nb_tree_destroy(xi);
        return tr->status != NB_OK ? tr->status : st;
    }
    nb_tree *uargs = NULL, *res = NULL;
    st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){(nb_tree *)nb_tree_child(args, 1), xi}, &uargs);
    nb_tree_destroy(xi);
    if (st == NB_OK) {
        st = nbl_call_user(tr, self, uargs, &res);
    }
    nb_tree_destroy(uargs);
    if (st != NB_OK) {
        return st;
    }
    if (nb_tree_kind_of(res) != NB_TREE_KIND_TUPLE || nb_tree_len(res) != 2) {
        nb_tree_destroy(res);
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "nb_scan: the body must return the pair (carry, y)");
    }
    /* ys[i] = y */
    const nb_tree *ys = nb_tree_child(args, 2), *y = nb_tree_child(res, 1);
    nb_tree *yl = NULL, *ysl = NULL;
    nb_treedef *ydef = NULL;
    st = nb_tree_flatten(y, &yl, NULL);
    if (st == NB_OK) {
        st = nb_tree_flatten(ys, &ysl, &ydef);
    }
    int64_t m = st == NB_OK ? nb_tree_len(ysl) : 0;
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(m + 1) * sizeof(nb_tree *));
    if (st == NB_OK && (items == NULL || nb_tree_len(yl) != m)) {
        st = nbi_trace_err(tr, NB_ERR_STRUCTURE,
                           "nb_scan: the body's y changed structure between traces");
    }
    for (int64_t k = 0; st == NB_OK && k < m; k++) {
        nb_var *buf = nb_var_of(tr, nb_tree_child(ysl, k));
        nb_var *yk = nb_var_of(tr, nb_tree_child(yl, k));
        nb_var *starts[NB_MAX_RANK];
        starts[0] = i;
        for (int d = 1; d < nb_var_rank(buf); d++) {
            starts[d] = nbl_i32(tr, 0);
        }
        items[k] = nb_leaf(nb_dynamic_update_slice(buf, nb_expand_dims(yk, 0), starts));
    }
    nb_tree *list = NULL, *ys2 = NULL;
    if (st == NB_OK && tr->status == NB_OK) {
        st = nb_tree_list(tr->ctx, m, items, &list);
        if (st == NB_OK) {
            st = nb_tree_unflatten(ydef, list, &ys2);
        }
    }
    nb_tree *i1 = nb_leaf(nb_add(i, nbl_i32(tr, 1)));
    if (st == NB_OK && tr->status == NB_OK && i1 != NULL) {
        st = nb_tree_tuple(tr->ctx, 3, (nb_tree *[]){i1, (nb_tree *)nb_tree_child(res, 0), ys2},
                           out);
    }
    nb_tree_destroy(list);
    nb_tree_destroy(ys2);
    nb_tree_destroy(yl);
    nb_tree_destroy(ysl);
    nb_treedef_destroy(ydef);
    nb_tree_destroy(res);
    return tr->status != NB_OK ? tr->status : st;
}

/* The user's body traced on (init, x_0) to learn y's signature. */
static nb_status nbl_scan_probe(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    nb_tree *res = NULL;
    nb_status st = nbl_call_user(tr, self, args, &res);
    if (st != NB_OK) {
        return st;
    }
    if (nb_tree_kind_of(res) != NB_TREE_KIND_TUPLE || nb_tree_len(res) != 2) {
        nb_tree_destroy(res);
        return nbi_trace_err(tr, NB_ERR_STRUCTURE,
                             "nb_scan: the body must return the pair (carry, y)");
    }
    *out = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
    nb_tree_destroy(res);
    return NB_OK;
}

const nb_tree *nb_scan(nb_trace *tr, nb_fn *body, const nb_tree *init, const nb_tree *xs,
                       int64_t length, const nb_loop_opts *opts) {
    static const char who[] = "nb_scan";
    if (tr == NULL || tr->status != NB_OK) {
        return NULL;
    }
    nb_fn_body ub = NULL;
    const nb_tree *us = NULL;
    if (!nbl_unwrap(tr, who, "body", body, &ub, &us)) {
        return NULL;
    }
    if (!nbi_obj_live(init, NBI_MAGIC_TREE) || (xs != NULL && !nbi_obj_live(xs, NBI_MAGIC_TREE))) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s: NULL or destroyed init or xs", who);
        return NULL;
    }
    if (length < 0 || length > INT32_MAX) {
        nbi_trace_err(tr, NB_ERR_INVALID, "%s: length %lld must be in [0, 2^31)", who,
                      (long long)length);
        return NULL;
    }
    if (opts != NULL && opts->max_steps > 0 && opts->max_steps < length) {
        nbi_trace_err(tr, NB_ERR_INVALID,
                      "%s: max_steps = %lld is less than the length %lld: the scan would stop "
                      "after %lld steps with ys partly unwritten; give max_steps >= %lld or 0 "
                      "(the length is known)",
                      who, (long long)opts->max_steps, (long long)length,
                      (long long)opts->max_steps, (long long)length);
        return NULL;
    }
    /* every xs leaf: a var (or array) with leading dim length */
    nb_tree *xl = NULL, *x0l = NULL, *x0 = NULL, *null = NULL;
    nb_treedef *xdef = NULL;
    nb_status st = nb_tree_null(tr->ctx, &null);
    if (st == NB_OK && xs != NULL) {
        st = nb_tree_flatten(xs, &xl, &xdef);
    }
    int64_t m = xl != NULL ? nb_tree_len(xl) : 0;
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(m + 1) * sizeof(nb_tree *));
    if (items == NULL) {
        st = NB_ERR_OOM;
    }
    for (int64_t k = 0; st == NB_OK && k < m; k++) {
        const nb_tree *l = nb_tree_child(xl, k);
        nb_var *x = nb_tree_kind_of(l) == NB_TREE_KIND_VAR ? nb_var_of(tr, l)
                                                           : nb_constant(tr, nb_tree_get_array(l));
        if (nb_var_rank(x) < 1 || nb_var_dim(x, 0) != length) {
            char path[NB_PATH_MAX], sig[96];
            nb_tree_leaf_path(xs, k, path, sizeof path, NULL);
            nbi_var_sig(sig, sizeof sig, x);
            nbi_trace_err(tr, NB_ERR_SHAPE,
                          "%s: xs%s%s is %s; every xs leaf needs leading dim length %lld", who,
                          path[0] && path[0] != '[' ? "." : "", path, sig, (long long)length);
            break;
        }
        nb_var *starts[NB_MAX_RANK];
        int64_t sizes[NB_MAX_RANK];
        for (int d = 0; d < nb_var_rank(x); d++) {
            starts[d] = nbl_i32(tr, 0);
            sizes[d] = d == 0 ? 1 : nb_var_dim(x, d);
        }
        /* a step's slice x_i; with length 0 there is none, so zeros of its shape stand in
         * for it (the body is traced for the structure of y, never run) */
        items[k] = nb_leaf(
            length == 0 ? nb_full(tr, nb_var_dtype(x), nb_var_rank(x) - 1, nb_var_shape(x) + 1, 0.0)
                        : nb_reshape(nb_dynamic_slice(x, starts, sizes), nb_var_rank(x) - 1,
                                     nb_var_shape(x) + 1));
    }
    if (st == NB_OK && tr->status == NB_OK && xs != NULL) {
        st = nb_tree_list(tr->ctx, m, items, &x0l);
        if (st == NB_OK) {
            st = nb_tree_unflatten(xdef, x0l, &x0);
        }
    }
    nb_tree_destroy(xl);
    nb_tree_destroy(x0l);
    nb_treedef_destroy(xdef);
    const nb_tree *res = NULL;
    nb_fn *probe = NULL, *b = NULL, *c = NULL;
    if (st != NB_OK && tr->status == NB_OK) {
        nbi_trace_err(tr, st, "%s: out of memory", who);
    }
    if (tr->status == NB_OK) {
        const nb_tree *pargs = nbl_pair(tr, init, x0 != NULL ? x0 : null);
        probe =
            nbl_wrapper(tr, who, "scan_probe", nbl_scan_probe, ub, body->name, us, 0, NULL, NULL);
        const nb_tree *y0 = (pargs && probe) ? nbl_zeros_of(tr, who, probe, pargs) : NULL;
        /* ys buffers: zeros of [length, *y.shape] */
        nb_tree *yl = NULL, *ylist = NULL, *ys = NULL;
        nb_treedef *ydef = NULL;
        if (y0 != NULL && nb_tree_flatten(y0, &yl, &ydef) == NB_OK) {
            int64_t ny = nb_tree_len(yl);
            nb_tree **yi = nbi_arena_alloc(&tr->arena, (size_t)(ny + 1) * sizeof(nb_tree *));
            for (int64_t k = 0; yi != NULL && k < ny; k++) {
                nb_var *y = nb_var_of(tr, nb_tree_child(yl, k));
                int64_t shape[NB_MAX_RANK];
                shape[0] = length;
                if (nb_var_rank(y) + 1 > NB_MAX_RANK) {
                    nbi_trace_err(tr, NB_ERR_SHAPE, "%s: y has rank %d; stacked it exceeds %d", who,
                                  nb_var_rank(y), NB_MAX_RANK);
                    break;
                }
                memcpy(shape + 1, nb_var_shape(y), (size_t)nb_var_rank(y) * sizeof(int64_t));
                yi[k] = nb_leaf(nb_full(tr, nb_var_dtype(y), nb_var_rank(y) + 1, shape, 0.0));
            }
            if (length == 0 && yi != NULL && tr->status == NB_OK &&
                nb_tree_list(tr->ctx, ny, yi, &ylist) == NB_OK &&
                nb_tree_unflatten(ydef, ylist, &ys) == NB_OK && nbi_trace_own(tr, ys) == NB_OK) {
                /* lax.scan of length 0: the initial carry and empty ys, no loop */
                nb_var **cv = NULL;
                int64_t ncv = 0;
                const nb_tree *carry = nbl_as_vars(tr, who, init, &cv, &ncv);
                res = carry != NULL ? nbl_pair(tr, carry, ys) : NULL;
            } else if (length > 0 && yi != NULL && tr->status == NB_OK &&
                       nb_tree_list(tr->ctx, ny, yi, &ylist) == NB_OK &&
                       nb_tree_unflatten(ydef, ylist, &ys) == NB_OK &&
                       nbi_trace_own(tr, ys) == NB_OK) {
                nb_tree *hi_leaf = NULL, *cself = NULL;
                if (nb_tree_int(tr->ctx, length, &hi_leaf) == NB_OK &&
                    nb_tree_dict(tr->ctx, 1, (const char *[]){"hi"}, &hi_leaf, &cself) == NB_OK) {
                    nb_fn_create(tr->ctx, "scan_cond", nbl_fori_cond, cself, &c);
                }
                nb_tree_destroy(hi_leaf);
                nb_tree_destroy(cself);
                nb_tree *xsv = x0 != NULL ? (nb_tree *)xs : null;
                b = nbl_wrapper(tr, who, "scan_body", nbl_scan_body, ub, body->name, us, 1,
                                (const char *[]){"xs"}, &xsv);
                nb_tree *carry = NULL;
                nb_tree *i0 = nb_leaf(nbl_i32(tr, 0));
                if (c != NULL && b != NULL && i0 != NULL &&
                    nb_tree_tuple(tr->ctx, 3, (nb_tree *[]){i0, (nb_tree *)init, ys}, &carry) ==
                        NB_OK &&
                    nbi_trace_own(tr, carry) == NB_OK) {
                    nb_loop_opts o = opts != NULL ? *opts : nb_loop_opts_default();
                    if (o.max_steps == 0 || o.max_steps > length) {
                        o.max_steps = length;
                    }
                    /* the stacked outputs are buffers: written once per step, never read */
                    o.buffers = nbl_buf_mask(tr, 3, 1, o.buffers, 2);
                    const nb_tree *w = nbl_while(tr, who, c, b, carry, &o, length);
                    if (w != NULL) {
                        res = nbl_pair(tr, nb_tree_child(w, 1), nb_tree_child(w, 2));
                    }
                } else if (tr->status == NB_OK) {
                    nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
                }
            } else if (tr->status == NB_OK) {
                nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
            }
        } else if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
        nb_tree_destroy(yl);
        nb_tree_destroy(ylist);
        nb_treedef_destroy(ydef);
    }
    nb_tree_destroy(x0);
    nb_tree_destroy(null);
    nb_fn_destroy(probe);
    nb_fn_destroy(b);
    nb_fn_destroy(c);
    return tr->status == NB_OK ? res : NULL;
}

/* ---- reverse mode: bounded loops (every step's carry on a tape) ------------------------ */

/* Flat (dynamic) leaves of t as vars of tr, arrays as constants; n of them. */
static nb_var **nbl_leaf_vars(nb_trace *tr, const nb_tree *t, int64_t *n) {
    nb_tree *leaves = NULL;
    *n = 0;
    if (t == NULL || nb_tree_kind_of(t) == NB_TREE_KIND_NULL) {
        return nbi_arena_alloc(&tr->arena, sizeof(nb_var *));
    }
    if (nb_tree_flatten(t, &leaves, NULL) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
        return NULL;
    }
    int64_t m = nb_tree_len(leaves);
    nb_var **v = nbi_arena_alloc(&tr->arena, (size_t)(m + 1) * sizeof(nb_var *));
    for (int64_t i = 0; v != NULL && i < m; i++) {
        const nb_tree *l = nb_tree_child(leaves, i);
        v[i] = nb_tree_kind_of(l) == NB_TREE_KIND_VAR ? nb_var_of(tr, l)
                                                      : nb_constant(tr, nb_tree_get_array(l));
    }
    nb_tree_destroy(leaves);
    if (v == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    *n = m;
    return v;
}

/* A trace-owned tree of def's structure holding vars v. */
static const nb_tree *nbl_tree_like(nb_trace *tr, const nb_tree *like, nb_var *const *v,
                                    int64_t n) {
    nb_treedef *def = NULL;
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_tree *));
    nb_tree *list = NULL, *out = NULL;
    if (items == NULL || nb_tree_treedef(like, &def) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        items[i] = nb_leaf(v[i]);
    }
    if (tr->status == NB_OK && nb_tree_list(tr->ctx, n, items, &list) == NB_OK &&
        nb_tree_unflatten(def, list, &out) == NB_OK && nbi_trace_own(tr, out) == NB_OK) {
        nb_tree_destroy(list);
        nb_treedef_destroy(def);
        return out;
    }
    nb_tree_destroy(list);
    nb_treedef_destroy(def);
    if (tr->status == NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    return NULL;
}

static nb_var *nbl_tape_read(nb_trace *tr, nb_var *tape, nb_var *k) {
    nb_var *starts[NB_MAX_RANK];
    int64_t sizes[NB_MAX_RANK];
    for (int d = 0; d < nb_var_rank(tape); d++) {
        starts[d] = d == 0 ? k : nbl_i32(tr, 0);
        sizes[d] = d == 0 ? 1 : nb_var_dim(tape, d);
    }
    return nb_reshape(nb_dynamic_slice(tape, starts, sizes), nb_var_rank(tape) - 1,
                      nb_var_shape(tape) + 1);
}

static nb_var *nbl_tape_write(nb_trace *tr, nb_var *tape, nb_var *k, nb_var *x) {
    nb_var *starts[NB_MAX_RANK];
    for (int d = 0; d < nb_var_rank(tape); d++) {
        starts[d] = d == 0 ? k : nbl_i32(tr, 0);
    }
    return nb_dynamic_update_slice(tape, nb_expand_dims(x, 0), starts);
}

/* ---- stored residuals (bounded loops) ---------------------------------------------------
 * A step's reverse traces the body again on the taped carry and differentiates that trace
 * (nbl_step_vjp): without more, the forward step runs twice, once taped and once in the
 * reverse sweep. So the taped run also stores the values the step's derivative reads --
 * nodes of the body's trace that depend on the carry (not only on the bound data: those
 * the reverse sweep makes again from the bound data) and are inputs of the derivative's
 * nodes -- each on a tape of its own, and the reverse sweep reads them back in their place:
 * its forward nodes then have no reader and go (DCE). A stored node is named by its
 * position in the body's trace counted from the region's first node (nbl_retrace: the
 * identities of the bound data and of the carry, then the body); every trace of the body
 * (the probe, the taped run, the reverse sweep) is made the same way, on identities, and
 * checks each stored node's dtype and shape against its tape. The stored values are the
 * recomputed ones (the same ops on the same values), so the gradient has the same bits.
 * Not done (the reverse sweep recomputes, as before) when the body holds a loop or a call
 * (their derivatives build loops of their own), or when the tapes would take more than
 * NBL_RES_MAX_BYTES. */
#define NBL_RES_MAX_BYTES ((int64_t)256 << 20)

static nb_status nbl_retrace(nb_trace *tr, const nb_tree *self, const nb_tree *carry,
                             nb_var *const *cv, int64_t n_c, int32_t *begin, nb_var ***ids,
                             int64_t *n_s, nb_var ***ov, nb_tree **res);

/* Stored node r (of the list rs) in the trace whose body region is [begin, end), checked
 * against like: its tape (lead 1: f32[n, shape...] for a node f32[shape...]) or a row of
 * it (lead 0); NULL with an error if the body traced differently. */
static nb_var *nbl_res_node(nb_trace *tr, const nb_tree *rs, int64_t r, int32_t begin, int32_t end,
                            const nb_var *like, int lead) {
    int64_t rel = -1;
    nb_tree_get_int(nb_tree_child(rs, r), &rel);
    nb_var *x = rel >= 0 && rel < end - begin ? tr->g.nodes[begin + rel] : NULL;
    bool ok = x != NULL && x->dtype == like->dtype && x->rank + lead == like->rank;
    for (int d = 0; ok && d < x->rank; d++) {
        ok = x->shape[d] == like->shape[d + lead];
    }
    if (!ok) {
        nbi_trace_err(tr, NB_ERR_INTERNAL,
                      "loop reverse: the loop's body traced differently on its second trace "
                      "(stored value %lld, node %lld of the step); a body must trace the same "
                      "ops for the same input types",
                      (long long)r, (long long)rel);
        return NULL;
    }
    return x;
}

/* The loop's body (named name) failed with st: recorded in the trace as nbl_call_user
 * records it, unless the trace has its error already. */
static void nbl_body_failed(nb_trace *tr, const char *name, nb_status st) {
    if (tr->status == NB_OK && st != NB_OK) {
        nbi_trace_err(tr, st, "the function '%s' failed: %s", name ? name : "?",
                      nb_ctx_errmsg(tr->ctx));
    }
}

/* The prints of region [begin, end) of tr made identities: a trace of the body made only to
 * look at it (dead code) must not print when the program runs (DCE keeps prints). */
static void nbl_silence(nb_trace *tr, int32_t begin, int32_t end) {
    for (int32_t q = begin; q < end; q++) {
        nb_var *v = tr->g.nodes[q];
        if (v->op == NBI_OP_PRINT) {
            v->op = NBI_OP_IDENTITY;
            v->n_in = 1;
        }
    }
}

/* May region [begin, end) of tr be differentiated with stored residuals (no loops or calls
 * inside)? */
static bool nbl_res_plain(const nb_trace *tr, int32_t begin, int32_t end) {
    for (int32_t q = begin; q < end; q++) {
        uint16_t op = tr->g.nodes[q]->op;
        if (op == NBI_OP_WHILE || op == NBI_OP_LOOP_REVERSE || op == NBI_OP_CALL) {
            return false;
        }
    }
    return true;
}

/* The residual plan of a bounded loop (record rec, initial carry carry0, n_max steps): the
 * body and its step derivative traced once here, in tr (dead code: DCE removes it), and the
 * stored nodes picked (above). *rs: a trace-owned tuple of their positions, *like: the
 * probe's nodes (their dtypes and shapes). Returns the count; 0: none (recompute). */
static int64_t nbl_res_probe(nb_trace *tr, const nbl_record *rec, nb_var *const *carry0,
                             int64_t ncar, int64_t n_max, nb_tree **rs, nb_var ***like) {
    *rs = NULL;
    *like = NULL;
    if (n_max <= 0 || tr->status != NB_OK) {
        return 0;
    }
    nb_tree *kv[2] = {NULL, NULL}, *wself = NULL;
    nb_status st = nb_tree_fnref(tr->ctx, (nb_fnptr)rec->body_body, rec->body_name, &kv[0]);
    if (st == NB_OK) {
        st = rec->body_self != NULL ? (kv[1] = nb_tree_retain((nb_tree *)rec->body_self), NB_OK)
                                    : nb_tree_null(tr->ctx, &kv[1]);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(tr->ctx, 2, (const char *[]){"fn", "self"}, kv, &wself);
    }
    nb_tree_destroy(kv[0]);
    nb_tree_destroy(kv[1]);
    if (st != NB_OK) {
        nbi_trace_err(tr, st, "reverse mode through a loop: out of memory");
        return 0;
    }
    int32_t begin = 0;
    int64_t ns = 0;
    nb_var **ids = NULL, **ov = NULL;
    nb_tree *res = NULL;
    st = nbl_retrace(tr, wself, rec->carry, carry0, ncar, &begin, &ids, &ns, &ov, &res);
    nb_tree_destroy(res);
    nb_tree_destroy(wself);
    if (st != NB_OK) { /* the body failed (a status of its own, or the trace's) */
        nbl_body_failed(tr, rec->body_name, st);
        return 0;
    }
    int32_t end = tr->g.n_nodes;
    nbl_silence(tr, begin, end);
    if (!nbl_res_plain(tr, begin, end)) {
        return 0;
    }
    nb_var **oct = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_var *));
    nb_var **wct = nbi_arena_alloc(&tr->arena, (size_t)(ns + ncar + 1) * sizeof(nb_var *));
    int32_t n = end - begin;
    bool *dep = nbi_arena_alloc(&tr->arena, (size_t)n + 1);
    bool *keep = nbi_arena_alloc(&tr->arena, (size_t)n + 1);
    if (oct == NULL || wct == NULL || dep == NULL || keep == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "reverse mode through a loop: out of memory");
        return 0;
    }
    for (int64_t j = 0; j < ncar; j++) { /* opaque cotangents, as the reverse sweep's carry */
        oct[j] =
            nbi_is_float_var(ov[j]) ? nbi_emit(tr, NBI_OP_IDENTITY, 1, &carry0[j], NULL) : NULL;
    }
    if (nbi_vjp_region(tr, begin, end, (int)ncar, ov, oct, (int)(ns + ncar), ids, wct) != NB_OK) {
        return 0;
    }
    memset(dep, 0, (size_t)n);
    memset(keep, 0, (size_t)n);
    for (int32_t q = 0; q < n; q++) { /* the carry's identities, and what depends on them */
        const nb_var *v = tr->g.nodes[begin + q];
        bool d = q >= ns && q < ns + ncar;
        for (int32_t j = 0; !d && j < v->n_in; j++) {
            int32_t x = v->in[j]->id - begin;
            d = x >= 0 && x < n && dep[x];
        }
        dep[q] = d;
    }
    for (int32_t q = end; q < tr->g.n_nodes; q++) {
        const nb_var *v = tr->g.nodes[q];
        for (int32_t j = 0; j < v->n_in; j++) {
            int32_t x = v->in[j]->id - begin;
            if (x >= ns + ncar && x < n && dep[x]) { /* not the carry itself: it is taped */
                keep[x] = true;
            }
        }
    }
    int64_t count = 0, bytes = 0;
    for (int32_t q = 0; q < n; q++) {
        if (keep[q]) {
            count++;
            bytes += (int64_t)nbi_leaf_bytes(tr->g.nodes[begin + q]);
        }
    }
    if (count == 0 || bytes > NBL_RES_MAX_BYTES / n_max) {
        return 0;
    }
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(count + 1) * sizeof(nb_tree *));
    nb_var **lk = nbi_arena_alloc(&tr->arena, (size_t)(count + 1) * sizeof(nb_var *));
    bool ok = items != NULL && lk != NULL;
    int64_t m = 0;
    for (int32_t q = 0; ok && q < n; q++) {
        if (keep[q]) {
            lk[m] = tr->g.nodes[begin + q];
            ok = nb_tree_int(tr->ctx, q, &items[m]) == NB_OK;
            m += ok;
        }
    }
    nb_tree *t = NULL;
    ok = ok && nb_tree_tuple(tr->ctx, count, items, &t) == NB_OK && nbi_trace_own(tr, t) == NB_OK;
    for (int64_t r = 0; items != NULL && r < m; r++) {
        nb_tree_destroy(items[r]);
    }
    if (!ok) {
        nbi_trace_err(tr, NB_ERR_OOM, "reverse mode through a loop: out of memory");
        return 0;
    }
    *rs = t;
    *like = lk;
    return count;
}

/* taped cond: self = dict(fn, self, n); args = (i, c, tapes): i < n && cond(c) */
static nb_status nbl_taped_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    int64_t n = 0;
    nb_tree_get_int(nb_tree_get(self, "n"), &n);
    nb_tree *res = NULL;
    nb_status st = nbl_call_user(tr, self, nb_tree_child(args, 1), &res);
    if (st != NB_OK) {
        return st;
    }
    nb_var *c = nb_var_of(tr, res);
    nb_tree_destroy(res);
    return nb_return(nb_logical_and(nb_lt(nb_get(tr, args, "[0]"), nbl_i32(tr, n)), c), out);
}

/* taped body: self = dict(fn, self, bufmask[, res]); args = (i, c, tapes) -> (i + 1, body(c),
 * tapes[i] = c, and with res (residuals, below) the stored nodes of the step on the tapes
 * after the carry's) */
static nb_status nbl_taped_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    nb_var *i = nb_get(tr, args, "[0]");
    const nb_tree *c = nb_tree_child(args, 1), *tapes = nb_tree_child(args, 2);
    const nb_tree *rs = nb_tree_get(self, "res");
    int64_t nc = 0, nt = 0, nres = rs != NULL ? nb_tree_len(rs) : 0;
    nb_var **cv = nbl_leaf_vars(tr, c, &nc), **tv = nbl_leaf_vars(tr, tapes, &nt);
    if (cv == NULL || tv == NULL || nc + nres != nt) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_INTERNAL;
    }
    nb_var **nv = nbi_arena_alloc(&tr->arena, (size_t)(nt + 1) * sizeof(nb_var *));
    const nb_tree *bm = nb_tree_get(self, "bufmask");
    for (int64_t k = 0; nv != NULL && k < nc; k++) {
        bool buf = false;
        nb_tree_get_bool(nb_tree_child(bm, k), &buf);
        nv[k] = buf ? tv[k] : nbl_tape_write(tr, tv[k], i, cv[k]); /* buffers: not taped */
    }
    nb_tree *res = NULL;
    nb_status st = nv != NULL ? NB_OK : nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    if (st == NB_OK && nres == 0) {
        st = nbl_call_user(tr, self, c, &res);
    } else if (st == NB_OK) { /* traced as the reverse sweep traces it; the nodes it reads */
        int32_t begin = 0;
        int64_t ns = 0;
        nb_var **ids = NULL, **ov = NULL;
        st = nbl_retrace(tr, self, c, cv, nc, &begin, &ids, &ns, &ov, &res);
        if (st != NB_OK) {
            const char *name = NULL;
            nb_fnptr fp = NULL;
            nb_tree_get_fnref(nb_tree_get(self, "fn"), &fp, &name);
            nbl_body_failed(tr, name, st);
        }
        int32_t end = tr->g.n_nodes; /* the body's region: before the tape writes below */
        for (int64_t r = 0; st == NB_OK && r < nres; r++) {
            nb_var *x = nbl_res_node(tr, rs, r, begin, end, tv[nc + r], 1);
            st = x != NULL ? NB_OK : tr->status;
            nv[nc + r] = x != NULL ? nbl_tape_write(tr, tv[nc + r], i, x) : NULL;
        }
    }
    const nb_tree *nt_tree = st == NB_OK ? nbl_tree_like(tr, tapes, nv, nt) : NULL;
    if (st == NB_OK && nt_tree == NULL) {
        st = nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_OOM;
    }
    if (st != NB_OK) {
        nb_tree_destroy(res);
        return st;
    }
    nb_tree *i1 = nb_leaf(nb_add(i, nbl_i32(tr, 1)));
    st = nb_tree_tuple(tr->ctx, 3, (nb_tree *[]){i1, res, (nb_tree *)nt_tree}, out);
    nb_tree_destroy(res);
    return st;
}

/* reverse cond: args = (k, ...): k >= 0 */
static nb_status nbl_rev_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    (void)self;
    return nb_return(nb_ge(nb_get(tr, args, "[0]"), nbl_i32(tr, 0)), out);
}

/* Trace the body stored in a wrapper's self (self.fn on self.self) once more, on fresh
 * identity copies of self.self's leaves and of the carry leaves cv (n_c, structure like
 * `carry`) -- the values derivatives are taken with respect to. *begin is the region's
 * first node, *ids the ns + n_c identity vars (*n_s = ns), *ov the body's n_c output
 * leaves, *res its output tree (a new reference). */
static nb_status nbl_retrace(nb_trace *tr, const nb_tree *self, const nb_tree *carry,
                             nb_var *const *cv, int64_t n_c, int32_t *begin, nb_var ***ids,
                             int64_t *n_s, nb_var ***ov, nb_tree **res) {
    *res = NULL;
    const nb_tree *uself = nb_tree_get(self, "self");
    int64_t ns = 0;
    nb_var **sv =
        nbl_leaf_vars(tr, nb_tree_kind_of(uself) == NB_TREE_KIND_NULL ? NULL : uself, &ns);
    nb_var **id = nbi_arena_alloc(&tr->arena, (size_t)(ns + n_c + 1) * sizeof(nb_var *));
    if (sv == NULL || id == NULL) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr)
                                            : nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    *begin = tr->g.n_nodes;
    for (int64_t j = 0; j < ns + n_c; j++) {
        nb_var *x = j < ns ? sv[j] : cv[j - ns];
        id[j] = nbi_emit(tr, NBI_OP_IDENTITY, 1, &x, NULL);
    }
    /* bound data without arrays (static leaves only) is passed as it is */
    const nb_tree *s_tree = ns > 0 ? nbl_tree_like(tr, uself, id, ns)
                            : nb_tree_kind_of(uself) == NB_TREE_KIND_NULL ? NULL
                                                                          : uself;
    const nb_tree *c_tree = nbl_tree_like(tr, carry, id + ns, n_c);
    if ((ns > 0 && s_tree == NULL) || c_tree == NULL) {
        return nb_trace_status(tr);
    }
    nb_fnptr fp = NULL;
    const char *name = NULL;
    nb_tree_get_fnref(nb_tree_get(self, "fn"), &fp, &name);
    /* traced to be differentiated, as under grad: calls inlined (a call node has no
     * derivative rule: its cotangents would be lost) and custom rules as their nodes -- and
     * the same whatever trace this is (the probe in the outer trace, or a wrapper's own), so
     * that every trace of the body makes the same nodes */
    tr->ad_depth++;
    nb_status st = ((nb_fn_body)fp)(tr, s_tree, c_tree, res);
    tr->ad_depth--;
    if (st != NB_OK || tr->status != NB_OK) {
        nb_tree_destroy(*res);
        *res = NULL;
        return tr->status != NB_OK ? tr->status : st;
    }
    int64_t no = 0;
    *ov = nbl_leaf_vars(tr, *res, &no);
    if (*ov == NULL || no != n_c) {
        nb_tree_destroy(*res);
        *res = NULL;
        return nb_trace_status(tr) != NB_OK
                   ? nb_trace_status(tr)
                   : nbi_trace_err(tr, NB_ERR_INTERNAL, "loop derivative: the body changed");
    }
    *ids = id;
    *n_s = ns;
    return NB_OK;
}

/* The reverse of one step inside a wrapper's trace: the body (self.fn on self.self) is
 * traced again on the carry leaves cv (n_c of them, structure like `carry`) and
 * differentiated in place: *ct_prev (n_c) gets the cotangent of the step's input carry for
 * the output cotangents ctv, *ct_self (n_s) that of self.self's leaves. Integer leaves pass
 * their "cotangent" through unchanged. quiet: the body's prints are made identities -- the
 * bounded reverse sweep, whose taped forward run printed every step (as JAX, whose
 * backward pass reads stored values and prints nothing); a checkpointed reversal's step
 * derivative keeps them (its last step runs only there, as a recomputation under JAX's
 * remat prints again). */
static nb_status nbl_step_vjp(nb_trace *tr, const nb_tree *self, const nb_tree *carry,
                              nb_var *const *cv, nb_var *const *ctv, int64_t n_c, nb_var ***ct_prev,
                              nb_var ***ct_self, int64_t *n_s, const nb_tree *rs, nb_var *const *rv,
                              bool quiet) {
    int32_t begin = 0;
    int64_t ns = 0;
    nb_var **wrt = NULL, **ov = NULL;
    nb_tree *res = NULL;
    nb_status st = nbl_retrace(tr, self, carry, cv, n_c, &begin, &wrt, &ns, &ov, &res);
    nb_tree_destroy(res);
    if (st != NB_OK) {
        return st;
    }
    int32_t end = tr->g.n_nodes;
    if (quiet) {
        nbl_silence(tr, begin, end);
    }
    nb_var **wct = nbi_arena_alloc(&tr->arena, (size_t)(ns + n_c + 1) * sizeof(nb_var *));
    nb_var **oct = nbi_arena_alloc(&tr->arena, (size_t)(n_c + 1) * sizeof(nb_var *));
    if (wct == NULL || oct == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
    }
    for (int64_t j = 0; j < n_c; j++) {
        oct[j] = nbi_is_float_var(ov[j]) ? ctv[j] : NULL;
    }
    st = nbi_vjp_region(tr, begin, end, (int)n_c, ov, oct, (int)(ns + n_c), wrt, wct);
    if (st != NB_OK) {
        return st;
    }
    int64_t nres = rs != NULL ? nb_tree_len(rs) : 0;
    if (nres > 0) { /* stored residuals: the derivative reads them, not the forward nodes */
        int32_t n = end - begin;
        int64_t *slot = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(int64_t));
        if (slot == NULL) {
            return nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
        }
        memset(slot, 0, (size_t)n * sizeof(int64_t));
        for (int64_t r = 0; r < nres; r++) {
            nb_var *x = nbl_res_node(tr, rs, r, begin, end, rv[r], 0);
            if (x == NULL) {
                return tr->status;
            }
            slot[x->id - begin] = r + 1;
        }
        for (int32_t q = end; q < tr->g.n_nodes; q++) {
            nb_var *v = tr->g.nodes[q];
            for (int32_t j = 0; j < v->n_in; j++) {
                int32_t x = v->in[j]->id - begin;
                if (x >= 0 && x < n && slot[x] > 0) {
                    v->in[j] = rv[slot[x] - 1];
                }
            }
        }
        for (int64_t j = 0; j < ns + n_c; j++) {
            int32_t x = wct[j] != NULL ? wct[j]->id - begin : -1;
            if (x >= 0 && x < n && slot[x] > 0) {
                wct[j] = rv[slot[x] - 1];
            }
        }
    }
    for (int64_t j = 0; j < n_c; j++) {
        if (!nbi_is_float_var(ctv[j])) {
            wct[ns + j] = ctv[j];
        }
    }
    *ct_self = wct;
    *ct_prev = wct + ns;
    *n_s = ns;
    return NB_OK;
}

/* acc + g, a bounded reverse sweep's accumulation of one step's cotangent g of the body's
 * bound data into acc, whose initial value must be +0s (nbl_zeros_tuple, where the reverse
 * loop is built; forward mode over it starts its tangent at +0s too). A sum is -0 only when
 * both terms are, so acc never holds a -0, and adding +0 to it leaves its bits (a value
 * made by adds is never a signalling NaN). Hence, with the same bits as the sum:
 *   - g a full of zeros (a bound leaf the body does not differentiate: another layer's
 *     weights closed over with the model): acc unchanged, not a pass over acc per step;
 *   - g = dynamic_update_slice(zeros, u, starts) (a scan's input row: the transpose of the
 *     body's dynamic_slice of xs): only the block is added, in place --
 *     dynamic_update_slice(acc, dynamic_slice(acc, starts) + u, starts), where the sum
 *     touched all of xs every step (O(T^2) for T steps). Both clamp the block alike. */
static nb_var *nbl_accumulate(nb_var *acc, nb_var *g) {
    if (g == NULL || nbi_is_zero_fill(g)) {
        return acc;
    }
    if (g->op == NBI_OP_DYN_UPDATE && !nbi_dyn_lanes(g) && nbi_is_zero_fill(g->in[0]) &&
        g->dtype == acc->dtype && g->n_in >= 2 && g->n_in - 2 == acc->rank &&
        g->in[1]->dtype == acc->dtype) {
        nb_var *u = g->in[1];
        nb_var *st[NB_MAX_RANK];
        for (int d = 0; d < acc->rank; d++) {
            st[d] = g->in[2 + d];
        }
        nb_var *blk = nb_dynamic_slice(acc, st, u->shape);
        return nb_dynamic_update_slice(acc, nb_add(blk, u), st);
    }
    return nb_add(acc, g);
}

/* reverse body: self = dict(fn, self, tapes, carry (a tree of the carry's structure));
 * args = (k, ct_c, ct_self) -> (k - 1, ct of c_k, ct_self + ct of self at step k). */
static nb_status nbl_rev_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    nb_var *k = nb_get(tr, args, "[0]");
    const nb_tree *ct_c = nb_tree_child(args, 1), *ct_s = nb_tree_child(args, 2);
    int64_t nt = 0, nct = 0, nacc = 0, ns = 0;
    nb_var **tv = nbl_leaf_vars(tr, nb_tree_get(self, "tapes"), &nt);
    nb_var **ctv = nbl_leaf_vars(tr, ct_c, &nct);
    nb_var **acc = nbl_leaf_vars(tr, ct_s, &nacc);
    nb_var **cv = nbi_arena_alloc(&tr->arena, (size_t)(nt + 1) * sizeof(nb_var *));
    const nb_tree *rs = nb_tree_get(self, "res");
    int64_t nres = rs != NULL ? nb_tree_len(rs) : 0;
    if (tv == NULL || ctv == NULL || acc == NULL || cv == NULL) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_OOM;
    }
    if (nt != nct + nres) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL,
                             "loop reverse: %lld tapes for %lld carry leaves and %lld stored "
                             "values",
                             (long long)nt, (long long)nct, (long long)nres);
    }
    const nb_tree *bm = nb_tree_get(self, "bufmask");
    for (int64_t j = 0; j < nt; j++) {
        bool buf = false;
        if (j < nct) {
            nb_tree_get_bool(nb_tree_child(bm, j), &buf);
        }
        /* a buffer's value does not enter the body's derivative: its 1-row tape of zeros;
         * the stored values (from nct on) are read before the body's trace, which then
         * refers to them */
        cv[j] = nbl_tape_read(tr, tv[j], buf ? nbl_i32(tr, 0) : k);
    }
    nb_var **cprev = NULL, **cself = NULL;
    nb_status st = nbl_step_vjp(tr, self, nb_tree_get(self, "carry"), cv, ctv, nct, &cprev, &cself,
                                &ns, rs, cv + nct, true);
    if (st != NB_OK) {
        return st;
    }
    if (ns != nacc) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "loop reverse: self changed");
    }
    nb_var **nacc_v = nbi_arena_alloc(&tr->arena, (size_t)(ns + 1) * sizeof(nb_var *));
    for (int64_t j = 0; nacc_v != NULL && j < ns; j++) {
        nacc_v[j] = nbi_is_float_var(acc[j]) ? nbl_accumulate(acc[j], cself[j]) : acc[j];
    }
    const nb_tree *t1 = nbl_tree_like(tr, ct_c, cprev, nct);
    const nb_tree *t2 = nacc_v ? nbl_tree_like(tr, ct_s, nacc_v, ns) : NULL;
    nb_tree *km = nb_leaf(nb_sub(k, nbl_i32(tr, 1)));
    if (t1 == NULL || t2 == NULL || km == NULL) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_OOM;
    }
    return nb_tree_tuple(tr->ctx, 3, (nb_tree *[]){km, (nb_tree *)t1, (nb_tree *)t2}, out);
}

/* one step's reverse as a function: self = dict(fn, self); args = (c, ct_c) ->
 * (ct of c, tuple of the cts of self's leaves) -- what a checkpointed reversal's TAPE runs */
static nb_status nbl_step_vjp_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                   nb_tree **out) {
    const nb_tree *c = nb_tree_child(args, 0), *ct_c = nb_tree_child(args, 1);
    int64_t nc = 0, nct = 0, ns = 0;
    nb_var **cv = nbl_leaf_vars(tr, c, &nc), **ctv = nbl_leaf_vars(tr, ct_c, &nct);
    if (cv == NULL || ctv == NULL || nc != nct) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_INTERNAL;
    }
    nb_var **cprev = NULL, **cself = NULL;
    nb_status st = nbl_step_vjp(tr, self, c, cv, ctv, nc, &cprev, &cself, &ns, NULL, NULL, false);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *t1 = nbl_tree_like(tr, ct_c, cprev, nc);
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(ns + 1) * sizeof(nb_tree *));
    nb_tree *t2 = NULL;
    for (int64_t j = 0; items != NULL && j < ns; j++) {
        items[j] = nb_leaf(cself[j]);
    }
    if (t1 == NULL || items == NULL || tr->status != NB_OK ||
        nb_tree_tuple(tr->ctx, ns, items, &t2) != NB_OK) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr) : NB_ERR_OOM;
    }
    st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){(nb_tree *)t1, t2}, out);
    nb_tree_destroy(t2);
    return st;
}

/* zeros like each var, as a trace-owned tuple */
static const nb_tree *nbl_zeros_tuple(nb_trace *tr, nb_var *const *v, int64_t n) {
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_tree *));
    nb_tree *t = NULL;
    for (int64_t i = 0; items != NULL && i < n; i++) {
        items[i] = nb_leaf(nb_full(tr, v[i]->dtype, v[i]->rank, v[i]->shape, 0.0));
    }
    if (items == NULL || tr->status != NB_OK || nb_tree_tuple(tr->ctx, n, items, &t) != NB_OK ||
        nbi_trace_own(tr, t) != NB_OK) {
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "out of memory");
        }
        return NULL;
    }
    return t;
}

static void nbl_vjp_checkpointed(nb_trace *tr, nb_var *w, nb_var *const *cts, nb_var **in_ct) {
    static const char who[] = "reverse mode through a checkpointed loop";
    const nbl_record *rec = (const nbl_record *)(intptr_t)w->at.a[6];
    int64_t nc = w->at.a[0], nb = w->at.a[1], ncar = w->at.a[2], n_max = w->at.a[3];
    int64_t ckpts = w->at.a[5] > 0 ? w->at.a[5] : nbl_ckpt_default_count(n_max);
    nb_var *const *carry0 = w->in + nc + nb;
    nb_var **ct0 = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_var *));
    if (ct0 == NULL || ckpts < 1) {
        nbi_trace_err(tr, ct0 == NULL ? NB_ERR_OOM : NB_ERR_INVALID, "%s: %s", who,
                      ct0 == NULL ? "out of memory" : "no checkpoints");
        return;
    }
    for (int64_t j = 0; j < ncar; j++) {
        ct0[j] = (cts[j] != NULL && nbi_is_float_var(carry0[j]))
                     ? cts[j]
                     : nb_full(tr, carry0[j]->dtype, carry0[j]->rank, carry0[j]->shape, 0.0);
    }
    const nb_tree *ct_tree = nbl_tree_like(tr, rec->carry, ct0, ncar);
    const nb_tree *args = ct_tree ? nbl_pair(tr, rec->carry, ct_tree) : NULL;
    nb_fn *sv = args ? nbl_wrapper(tr, who, "step_vjp", nbl_step_vjp_body, rec->body_body,
                                   rec->body_name, rec->body_self, 0, NULL, NULL)
                     : NULL;
    nbi_callee_info ci;
    if (sv == NULL || nbi_callee(tr, sv, args, who, false, &ci) != NB_OK) {
        nb_fn_destroy(sv);
        return;
    }
    nb_fn_destroy(sv);
    int64_t nv = ci.n_self, n_ops = nc + nb + nv + 2 * ncar;
    int32_t nvo = nbi_exec_n_outputs(ci.exec);
    if (nv != nb || nvo != (int32_t)(ncar + nb)) {
        nbi_trace_err(tr, NB_ERR_INTERNAL,
                      "%s: the step's reverse has %lld operands and %d "
                      "outputs for %lld carry leaves and %lld lifted operands",
                      who, (long long)nv, (int)nvo, (long long)ncar, (long long)nb);
        return;
    }
    nb_var **ops = nbi_arena_alloc(&tr->arena, (size_t)(n_ops + 1) * sizeof(nb_var *));
    if (ops == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return;
    }
    memcpy(ops, w->in, (size_t)(nc + nb) * sizeof(nb_var *));
    memcpy(ops + nc + nb, ci.ops, (size_t)nv * sizeof(nb_var *));
    memcpy(ops + nc + nb + nv, carry0, (size_t)ncar * sizeof(nb_var *));
    memcpy(ops + nc + nb + nv + ncar, ct0, (size_t)ncar * sizeof(nb_var *));
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.callee = ci.exec;
    at.callee2 = w->at.callee2;
    at.callee3 = w->at.callee;
    at.a[0] = nc;
    at.a[1] = nb;
    at.a[2] = ncar;
    at.a[3] = n_max;
    at.a[4] = ckpts;
    at.a[5] = nv;
    at.a[6] = w->at.a[7] > 0 && (n_max <= 0 || w->at.a[7] <= n_max) ? w->at.a[7] : 0;
    at.a[7] = w->at.a[6]; /* the loop's record (batching rebuilds the loop from it) */
    for (int i = 0; i < NB_MAX_RANK; i++) {
        at.b[i] = w->at.b[i];
    }
    nb_var *r = nbi_emit(tr, NBI_OP_LOOP_REVERSE, (int)n_ops, ops, &at);
    size_t off = 0;
    for (int32_t i = 0; i < nvo && tr->status == NB_OK; i++) {
        memset(&at, 0, sizeof at);
        at.ivalue = i;
        at.a[0] = (int64_t)off;
        off += nbi_leaf_bytes(nbi_exec_output(ci.exec, i));
        nb_var *o = nbi_emit(tr, NBI_OP_CALL_OUTPUT, 1, &r, &at);
        if (i < ncar) {
            in_ct[nc + nb + i] = nbi_is_float_var(carry0[i]) ? o : NULL;
        } else {
            nb_var *x = w->in[nc + (i - ncar)];
            in_ct[nc + (i - ncar)] = nbi_is_float_var(x) ? o : NULL;
        }
    }
}

void nbi_while_vjp(nb_trace *tr, nb_var *w, nb_var *const *cts, nb_var **in_ct) {
    static const char who[] = "reverse mode through a loop";
    if (w->at.a[4] == NB_LOOP_CHECKPOINTED) {
        nbl_vjp_checkpointed(tr, w, cts, in_ct);
        return;
    }
    if (w->at.a[4] != NB_LOOP_BOUNDED) {
        nbi_while_report(tr, w, true);
        return;
    }
    const nbl_record *rec = (const nbl_record *)(intptr_t)w->at.a[6];
    int64_t nc = w->at.a[0], nb = w->at.a[1], ncar = w->at.a[2], n_max = w->at.a[3];
    nb_var *const *carry0 = w->in + nc + nb;
    /* the values the reverse sweep reads instead of recomputing them (stored residuals) */
    nb_tree *rs = NULL;
    nb_var **like = NULL;
    int64_t nres = nbl_res_probe(tr, rec, carry0, ncar, n_max, &rs, &like);
    if (tr->status != NB_OK) {
        return;
    }
    /* forward again, writing every step's carry on a tape: zeros [n_max, *leaf]; then the
     * stored values' tapes */
    nb_var **tapes0 = nbi_arena_alloc(&tr->arena, (size_t)(ncar + nres + 1) * sizeof(nb_var *));
    if (tapes0 == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return;
    }
    for (int64_t r = 0; r < nres; r++) {
        int64_t shape[NB_MAX_RANK];
        if (like[r]->rank + 1 > NB_MAX_RANK) {
            nres = 0; /* cannot be taped: recompute instead */
            break;
        }
        shape[0] = n_max;
        memcpy(shape + 1, like[r]->shape, (size_t)like[r]->rank * sizeof(int64_t));
        tapes0[ncar + r] = nb_full(tr, like[r]->dtype, like[r]->rank + 1, shape, 0.0);
    }
    for (int64_t j = 0; j < ncar; j++) {
        int64_t shape[NB_MAX_RANK];
        if (carry0[j]->rank + 1 > NB_MAX_RANK) {
            nbi_trace_err(tr, NB_ERR_SHAPE, "%s: a carry leaf of rank %d cannot be taped", who,
                          carry0[j]->rank);
            return;
        }
        shape[0] = nbl_is_buf(w, j) ? 1 : n_max;
        memcpy(shape + 1, carry0[j]->shape, (size_t)carry0[j]->rank * sizeof(int64_t));
        tapes0[j] = nb_full(tr, carry0[j]->dtype, carry0[j]->rank + 1, shape, 0.0);
    }
    nb_tree **bmi = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_tree *));
    nb_tree *bufmask = NULL;
    bool bm_ok = bmi != NULL;
    for (int64_t j = 0; bm_ok && j < ncar; j++) {
        bm_ok = nb_tree_bool(tr->ctx, nbl_is_buf(w, j), &bmi[j]) == NB_OK;
    }
    if (bm_ok) {
        bm_ok = nb_tree_tuple(tr->ctx, ncar, bmi, &bufmask) == NB_OK &&
                nbi_trace_own(tr, bufmask) == NB_OK;
    }
    for (int64_t j = 0; bmi != NULL && j < ncar; j++) {
        nb_tree_destroy(bmi[j]);
    }
    if (!bm_ok) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return;
    }
    nb_tree **ti = nbi_arena_alloc(&tr->arena, (size_t)(ncar + nres + 1) * sizeof(nb_tree *));
    nb_tree *tapes = NULL;
    for (int64_t j = 0; ti != NULL && j < ncar + nres; j++) {
        ti[j] = nb_leaf(tapes0[j]);
    }
    if (ti == NULL || tr->status != NB_OK ||
        nb_tree_tuple(tr->ctx, ncar + nres, ti, &tapes) != NB_OK ||
        nbi_trace_own(tr, tapes) != NB_OK) {
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
        return;
    }
    nb_tree *nl = NULL;
    nb_fn *fc = NULL, *fb = NULL, *rc = NULL, *rb = NULL;
    nb_loop_opts o = nb_loop_opts_default();
    o.max_steps = n_max;
    const nb_tree *fwd = NULL, *rev = NULL;
    nb_status st = nb_tree_int(tr->ctx, n_max, &nl);
    if (st == NB_OK) {
        fc = nbl_wrapper(tr, who, "taped_cond", nbl_taped_cond, rec->cond_body, rec->cond_name,
                         rec->cond_self, 1, (const char *[]){"n"}, &nl);
        fb = nbl_wrapper(tr, who, "taped_body", nbl_taped_body, rec->body_body, rec->body_name,
                         rec->body_self, nres > 0 ? 2 : 1, (const char *[]){"bufmask", "res"},
                         (nb_tree *[]){bufmask, rs});
    }
    const nb_tree *init = NULL;
    if (fc != NULL && fb != NULL) {
        nb_tree *i0 = nb_leaf(nbl_i32(tr, 0)), *t = NULL;
        if (i0 != NULL &&
            nb_tree_tuple(tr->ctx, 3, (nb_tree *[]){i0, (nb_tree *)rec->carry, tapes}, &t) ==
                NB_OK &&
            nbi_trace_own(tr, t) == NB_OK) {
            init = t;
        }
    }
    nb_var *w2 = NULL;
    fwd = init != NULL ? nbl_while_ex(tr, who, fc, fb, init, &o, 0, NULL, &w2) : NULL;
    if (w2 != NULL) { /* w's twin: its carry leaves from 1 on are w's (nbi_pass_loop_share) */
        w2->at.c[0] = w->at.a[6];
        w2->at.c[1] = 1;
        /* the tapes (leaves 1 + ncar on) need no zeros when every row is written before the
         * reverse sweep reads it: w runs exactly n_max steps (a fori or a scan: known trips),
         * writing row i at step i (ir.h's nbi_while_uninit). Not a buffer's 1-row tape: never
         * written, it is read as zeros. */
        if (w->at.a[7] > 0 && w->at.a[7] == n_max) {
            w2->at.c[2] = 1 + ncar;
            for (int64_t r = 0; r < ncar + nres && r < NBI_UNINIT_MAX; r++) {
                if (r >= ncar || !nbl_is_buf(w, r)) {
                    w2->at.c[3 + r / 64] =
                        (int64_t)((uint64_t)w2->at.c[3 + r / 64] | (uint64_t)1 << (r % 64));
                }
            }
        }
    }
    /* backward from step n - 1 down to 0 */
    if (fwd != NULL) {
        nb_tree *tl = (nb_tree *)nb_tree_child(fwd, 2);
        const char *keys[4] = {"tapes", "carry", "bufmask", "res"};
        nb_tree *vals[4] = {tl, (nb_tree *)rec->carry, bufmask, rs};
        rc = NULL;
        st = nb_fn_create(tr->ctx, "reverse_cond", nbl_rev_cond, NULL, &rc);
        rb = st == NB_OK ? nbl_wrapper(tr, who, "reverse_body", nbl_rev_body, rec->body_body,
                                       rec->body_name, rec->body_self, nres > 0 ? 4 : 3, keys, vals)
                         : NULL;
        /* the carry's cotangent: the given ones, zeros where none (and for integer leaves) */
        nb_var **ct0 = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_var *));
        for (int64_t j = 0; ct0 != NULL && j < ncar; j++) {
            ct0[j] = (cts[j] != NULL && nbi_is_float_var(carry0[j]))
                         ? cts[j]
                         : nb_full(tr, carry0[j]->dtype, carry0[j]->rank, carry0[j]->shape, 0.0);
        }
        int64_t ns = 0;
        nb_var **sv = nbl_leaf_vars(tr, rec->body_self, &ns);
        const nb_tree *ct_c = ct0 ? nbl_tree_like(tr, rec->carry, ct0, ncar) : NULL;
        /* +0s: nbl_accumulate's rewrites keep the sum's bits only from there */
        const nb_tree *ct_s = sv ? nbl_zeros_tuple(tr, sv, ns) : NULL;
        nb_var *steps = nb_var_of(tr, nb_tree_child(fwd, 0));
        nb_tree *k0 = nb_leaf(nb_sub(steps, nbl_i32(tr, 1))), *t = NULL;
        if (rb != NULL && ct_c != NULL && ct_s != NULL && k0 != NULL &&
            nb_tree_tuple(tr->ctx, 3, (nb_tree *[]){k0, (nb_tree *)ct_c, (nb_tree *)ct_s}, &t) ==
                NB_OK &&
            nbi_trace_own(tr, t) == NB_OK) {
            rev = nbl_while(tr, who, rc, rb, t, &o, 0);
        }
    }
    if (rev != NULL) {
        int64_t m = 0, ms = 0;
        nb_var **cc = nbl_leaf_vars(tr, nb_tree_child(rev, 1), &m);
        nb_var **cs = nbl_leaf_vars(tr, nb_tree_child(rev, 2), &ms);
        for (int64_t j = 0; cs != NULL && j < ms && j < nb; j++) {
            in_ct[nc + j] = nbi_is_float_var(w->in[nc + j]) ? cs[j] : NULL;
        }
        for (int64_t j = 0; cc != NULL && j < m && j < ncar; j++) {
            in_ct[nc + nb + j] = nbi_is_float_var(carry0[j]) ? cc[j] : NULL;
        }
    } else if (tr->status == NB_OK) {
        nbi_trace_err(tr, st != NB_OK ? st : NB_ERR_OOM, "%s: building the reverse loop failed",
                      who);
    }
    nb_tree_destroy(nl);
    nb_fn_destroy(fc);
    nb_fn_destroy(fb);
    nb_fn_destroy(rc);
    nb_fn_destroy(rb);
}

/* ---- reverse mode: checkpointed loops (a kernel following a schedule) ----------------- */

/* The loop_reverse op. Operands: the cond's lifted operands (a[0]), the body's (a[1]), the
 * step vjp's (a[5], the body's again), the initial carry (a[2] leaves) and the cotangent of
 * the final carry (a[2]). callee: the step vjp's executable ((c, ct) -> (ct of c, cts of the
 * body's self)), callee2 the cond's, callee3 the body's. a[3] max_steps, a[4] checkpoints.
 * Its value is the step vjp's outputs laid out as a call's: the cotangent of the initial
 * carry, then the body's self cotangents summed over the steps (in the order the steps are
 * reversed, as the bounded reversal sums them: the same bits). The kernel runs the loop
 * forward with the online schedule's checkpoints (src/loops/checkpoint.h), then follows the
 * reversal's actions: ADVANCE reruns the body, TAKESHOT/RESTORE copy states, TAPE runs the
 * step vjp. No allocation: states, slots and the schedule's workspace live in its scratch. */

static _Thread_local nb_loop_stats nbl_last_stats;

nb_status nb_loop_last_stats(nb_loop_stats *out) {
    if (out == NULL) {
        return NB_ERR_MISUSE;
    }
    *out = nbl_last_stats;
    return NB_OK;
}

typedef struct nbl_rev_layout {
    size_t state;               /* bytes of one packed carry */
    size_t slot_state;          /* bytes of a checkpoint: the carry without its buffers */
    size_t vjp_out;             /* bytes of the step vjp's packed outputs */
    size_t off_w[2], off_slots; /* working states, slots */
    size_t off_ct[2], off_acc;  /* carry cotangents, self accumulators */
    size_t off_vout, off_ptrs, off_work;
    size_t n_ptrs, n_work, total;
} nbl_rev_layout;

static size_t nbl_outs_bytes(const nbi_exec *e, int32_t first, int32_t n) {
    size_t off = 0;
    for (int32_t i = first; i < first + n; i++) {
        off += nbi_leaf_bytes(nbi_exec_output(e, i));
    }
    return off;
}

static nbl_rev_layout nbl_rev_plan(const nb_var *node) {
    const nbi_exec *vjp = node->at.callee;
    int64_t nc = node->at.a[0], nb = node->at.a[1], ncar = node->at.a[2], c = node->at.a[4];
    int64_t nv = node->at.a[5];
    int32_t nvo = nbi_exec_n_outputs(vjp);
    nbl_rev_layout L;
    memset(&L, 0, sizeof L);
    L.state = nbl_outs_bytes(vjp, 0, (int32_t)ncar);
    for (int64_t j = 0; j < ncar; j++) {
        L.slot_state += nbl_is_buf(node, j) ? 0 : nbi_leaf_bytes(nbi_exec_output(vjp, (int32_t)j));
    }
    L.vjp_out = nbl_outs_bytes(vjp, 0, nvo);
    size_t off = 0;
    L.off_w[0] = off;
    off += L.state;
    L.off_w[1] = off;
    off += L.state;
    L.off_slots = off;
    off += (size_t)c * L.slot_state;
    L.off_ct[0] = off;
    off += L.state;
    L.off_ct[1] = off;
    off += L.state;
    L.off_acc = off;
    off += L.vjp_out - L.state;
    L.off_vout = off;
    off += L.vjp_out;
    L.off_ptrs = off;
    /* cond and body inputs, body outputs, the step vjp's inputs and outputs twice (one set
     * per cotangent buffer), the slot copies' runs (3 words each), the flag and the donated
     * flags */
    L.n_ptrs = (size_t)(nc + ncar) + (size_t)(nb + ncar) + (size_t)ncar +
               2 * ((size_t)(nv + 2 * ncar) + (size_t)nvo) + 3 * (size_t)ncar + 8 +
               (size_t)ncar / sizeof(void *) + 1;
    off += L.n_ptrs * sizeof(void *);
    off = (off + 63) / 64 * 64;
    L.off_work = off;
    L.n_work = nbl_online_work_len(c) + nbl_ckpt_rev_work_len(c);
    off += L.n_work * sizeof(int64_t);
    L.total = off + 64;
    return L;
}

static size_t nbi_scratch_loop_reverse(const nb_var *node) {
    return nbl_rev_plan(node).total;
}

/* leaf offsets inside a packed carry (leaf i of the step vjp's first ncar outputs) */
static void nbl_leaf_ptrs(const nbi_exec *vjp, int32_t first, int32_t n, unsigned char *base,
                          const void **out) {
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        out[i] = base + off;
        off += nbi_leaf_bytes(nbi_exec_output(vjp, first + i));
    }
}

/* The runs of a packed carry's non-buffer leaves (adjacent leaves merged): run r copies
 * runs[3r + 2] bytes between the state at runs[3r] and the slot at runs[3r + 1]. Returns
 * the number of runs. */
static int64_t nbl_slot_runs(const nb_var *node, const nbi_exec *vjp, int64_t ncar, size_t *runs) {
    size_t off = 0, soff = 0;
    int64_t n = 0;
    for (int64_t j = 0; j < ncar; j++) {
        size_t bytes = nbi_leaf_bytes(nbi_exec_output(vjp, (int32_t)j));
        if (!nbl_is_buf(node, j) && bytes > 0) {
            if (n > 0 && runs[3 * (n - 1)] + runs[3 * (n - 1) + 2] == off) {
                runs[3 * (n - 1) + 2] += bytes;
            } else {
                runs[3 * n] = off;
                runs[3 * n + 1] = soff;
                runs[3 * n + 2] = bytes;
                n++;
            }
            soff += bytes;
        }
        off += bytes;
    }
    return n;
}

/* Copy the non-buffer leaves of a packed carry into a slot (to_slot) or back. */
static void nbl_slot_copy(const size_t *runs, int64_t n_runs, unsigned char *state,
                          unsigned char *slot, bool to_slot) {
    for (int64_t r = 0; r < n_runs; r++) {
        const size_t *x = runs + 3 * r;
        if (to_slot) {
            memcpy(slot + x[1], state + x[0], x[2]);
        } else {
            memcpy(state + x[0], slot + x[1], x[2]);
        }
    }
}

/* How the reversal runs its executables: through nbi_exec_run_raw, or (native code) the
 * loop file's functions (cond: 0, body: 1, vjp: 2) on output plans made once per reversal
 * -- the cond's and the vjp's hold for any buffers (nothing donated), the body's for the
 * working state's, which stay -- or before every run when running one of them can run one
 * of them again (the plan is the executable's state: such a run changes it; f->replan). */
typedef struct nbl_runner {
    const nbi_loop_fns *f;
    const bool *direct[3];
    int n_copy[3];
} nbl_runner;

static inline void nbl_run(nbl_runner *r, int which, const nbi_exec *x, const void *const *in,
                           void *const *out, const bool *donated) {
    if (r->f == NULL) {
        nbi_exec_run_raw(x, in, out, donated);
        return;
    }
    if (r->direct[which] == NULL || r->f->replan) {
        r->direct[which] = nbi_exec_plan_io(x, in, out, donated, &r->n_copy[which]);
    }
    r->f->fn[which](r->f->env[which], in, out, r->direct[which]);
    if (r->n_copy[which] > 0) {
        nbi_exec_copy_out(x, out);
    }
}

static void nbi_k_loop_reverse(const nbi_kargs *k) {
    nbi_loop_reverse_run(k, NULL);
}

void nbi_loop_reverse_run(const nbi_kargs *k, const nbi_loop_fns *f) {
    const nb_var *n = k->node;
    const nbi_exec *vjp = n->at.callee, *cond = n->at.callee2, *body = n->at.callee3;
    int64_t nc = n->at.a[0], nb = n->at.a[1], ncar = n->at.a[2], max_steps = n->at.a[3];
    int64_t c = n->at.a[4], nv = n->at.a[5];
    int32_t nvo = nbi_exec_n_outputs(vjp);
    nbl_rev_layout L = nbl_rev_plan(n);
    unsigned char *S = k->scratch;
    const void **cond_in = (const void **)(S + L.off_ptrs);
    const void **body_in = cond_in + nc + ncar;
    void **body_out = (void **)(body_in + nb + ncar);
    /* the step vjp's inputs and outputs when the incoming cotangent is in ct buffer p */
    const void **vjp_in[2], **vjp_out[2];
    vjp_in[0] = (const void **)(body_out + ncar);
    vjp_in[1] = vjp_in[0] + nv + 2 * ncar;
    vjp_out[0] = vjp_in[1] + nv + 2 * ncar;
    vjp_out[1] = vjp_out[0] + nvo;
    size_t *runs = (size_t *)(void *)(vjp_out[1] + nvo);
    bool *flag = (bool *)(runs + 3 * ncar);
    bool *donated = flag + 1;
    for (int64_t i = 0; i < ncar; i++) {
        donated[i] = true; /* the body runs in place on the working state (see nbi_k_while) */
    }
    int64_t *work = (int64_t *)(S + L.off_work);
    const void *const *ops_cond = k->in, *const *ops_body = k->in + nc;
    const void *const *ops_vjp = k->in + nc + nb, *const *carry0 = k->in + nc + nb + nv;
    const void *const *ct_final = carry0 + ncar;
    for (int64_t i = 0; i < nc; i++) {
        cond_in[i] = ops_cond[i];
    }
    for (int64_t i = 0; i < nb; i++) {
        body_in[i] = ops_body[i];
    }
    /* the working state W[0] and every pointer into it, set once: the body runs in place */
    unsigned char *W = S + L.off_w[0];
    size_t off = 0;
    for (int64_t i = 0; i < ncar; i++) {
        const nb_var *o = nbi_exec_output(vjp, (int32_t)i);
        size_t bytes = (size_t)o->size * nbi_dsize(o->dtype);
        if (bytes > 0) {
            memcpy(W + off, carry0[i], bytes);
        }
        off += nbi_leaf_bytes(o);
    }
    nbl_leaf_ptrs(vjp, 0, (int32_t)ncar, W, cond_in + nc);
    nbl_leaf_ptrs(vjp, 0, (int32_t)ncar, W, body_in + nb);
    nbl_leaf_ptrs(vjp, 0, (int32_t)ncar, W, (const void **)body_out);
    for (int p = 0; p < 2; p++) {
        for (int64_t i = 0; i < nv; i++) {
            vjp_in[p][i] = ops_vjp[i];
        }
        nbl_leaf_ptrs(vjp, 0, (int32_t)ncar, W, vjp_in[p] + nv);
        nbl_leaf_ptrs(vjp, 0, (int32_t)ncar, S + L.off_ct[p], vjp_in[p] + nv + ncar);
        /* outputs: the previous cotangent into the other ct buffer, self cts after */
        nbl_leaf_ptrs(vjp, 0, (int32_t)ncar, S + L.off_ct[p ^ 1], vjp_out[p]);
        nbl_leaf_ptrs(vjp, (int32_t)ncar, nvo - (int32_t)ncar, S + L.off_vout, vjp_out[p] + ncar);
    }
    int64_t n_runs = nbl_slot_runs(n, vjp, ncar, runs);
    unsigned char *slots = S + L.off_slots;
    nbl_runner run = {.f = f, .direct = {NULL, NULL, NULL}, .n_copy = {0, 0, 0}};
    nbl_online on;
    nbl_ckpt_rev rev;
    int64_t known = n->at.a[6];
    nbl_online_start(&on, c, work, nbl_online_work_len(c));
    if (known > 0) {
        /* a known trip count: revolve drives the forward sweep too */
        nbl_revolve_start(&rev, known, c, work + nbl_online_work_len(c), nbl_ckpt_rev_work_len(c));
    }
    /* forward sweep (online) */
    int64_t steps = 0;
    for (; known == 0 && (max_steps <= 0 || steps < max_steps); steps++) {
        void *fo = flag;
        nbl_run(&run, 0, cond, cond_in, &fo, NULL);
        if (!*flag) {
            break;
        }
        int64_t slot = nbl_online_next(&on);
        if (slot >= 0) {
            nbl_slot_copy(runs, n_runs, W, slots + (size_t)slot * L.slot_state, true);
        }
        nbl_run(&run, 1, body, body_in, body_out, donated);
    }
    /* the reversal */
    if (known == 0) {
        nbl_online_reverse_start(&rev, &on, work + nbl_online_work_len(c),
                                 nbl_ckpt_rev_work_len(c));
    }
    int ct = 0;
    off = 0;
    for (int64_t i = 0; i < ncar; i++) {
        const nb_var *o = nbi_exec_output(vjp, (int32_t)i);
        size_t bytes = (size_t)o->size * nbi_dsize(o->dtype);
        if (bytes > 0) {
            memcpy(S + L.off_ct[0] + off, ct_final[i], bytes);
        }
        off += nbi_leaf_bytes(o);
    }
    memset(S + L.off_acc, 0, L.vjp_out - L.state);
    nbl_ckpt_action act;
    for (;;) {
        if (nbl_ckpt_next(&rev, &act) != NB_OK || act.op == NBL_CKPT_DONE) {
            break;
        }
        if (act.op == NBL_CKPT_ADVANCE) {
            for (int64_t s = 0; s < act.count; s++) {
                nbl_run(&run, 1, body, body_in, body_out, donated);
            }
        } else if (act.op == NBL_CKPT_TAKESHOT) {
            nbl_slot_copy(runs, n_runs, W, slots + (size_t)act.slot * L.slot_state, true);
        } else if (act.op == NBL_CKPT_RESTORE) {
            nbl_slot_copy(runs, n_runs, W, slots + (size_t)act.slot * L.slot_state, false);
        } else if (act.op == NBL_CKPT_TAPE) {
            nbl_run(&run, 2, vjp, vjp_in[ct], (void *const *)vjp_out[ct], NULL);
            ct ^= 1;
            /* acc += this step's self cotangents, in step order (as the bounded reversal) */
            size_t o2 = 0;
            for (int32_t i = (int32_t)ncar; i < nvo; i++) {
                const nb_var *o = nbi_exec_output(vjp, i);
                unsigned char *acc = S + L.off_acc + o2, *add = S + L.off_vout + o2;
                if (o->dtype == NB_DTYPE_F32) {
                    float *a = (float *)(void *)acc;
                    const float *b = (const float *)(const void *)add;
                    for (int64_t e = 0; e < o->size; e++) {
                        a[e] = a[e] + b[e];
                    }
                } else if (o->dtype == NB_DTYPE_F64) {
                    double *a = (double *)(void *)acc;
                    const double *b = (const double *)(const void *)add;
                    for (int64_t e = 0; e < o->size; e++) {
                        a[e] = a[e] + b[e];
                    }
                }
                o2 += nbi_leaf_bytes(o);
            }
        }
    }
    memcpy(k->out, S + L.off_ct[ct], L.state);
    memcpy((unsigned char *)k->out + L.state, S + L.off_acc, L.vjp_out - L.state);
    nb_loop_stats *ls = &nbl_last_stats;
    ls->primal_steps = rev.counts.taped; /* the trip count */
    ls->forward_sweep_steps = rev.counts.forward;
    ls->offline = known > 0;
    ls->recomputed_steps = rev.counts.recomputed;
    ls->taped_steps = rev.counts.taped;
    ls->checkpoints = c;
    ls->peak_checkpoints = rev.counts.peak_slots;
    ls->state_bytes = L.slot_state;
    ls->buffer_bytes = L.state - L.slot_state;
    ls->peak_checkpoint_bytes = (size_t)rev.counts.peak_slots * L.slot_state;
}

static nb_status nbi_infer_loop_reverse(nb_trace *tr, nb_var *p) {
    (void)tr;
    p->dtype = NB_DTYPE_BOOL;
    p->rank = 1;
    const nbi_exec *vjp = p->at.callee;
    p->shape[0] = (int64_t)nbl_outs_bytes(vjp, 0, nbi_exec_n_outputs(vjp));
    return NB_OK;
}

const nbi_op_info nbi_opinfo_loop_reverse = {.name = "loop_reverse",
                                             .n_in = -1,
                                             .infer = nbi_infer_loop_reverse,
                                             .kernel = nbi_k_loop_reverse,
                                             .scratch = nbi_scratch_loop_reverse};

/* ---- forward mode: a loop over (carry, tangent) ---------------------------------------- */

/* jvp cond: self = dict(fn, self); args = (c, dc): cond(c) */
static nb_status nbl_jvp_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    return nbl_call_user(tr, self, nb_tree_child(args, 0), out);
}

/* jvp body: self = dict(fn, self, dself (a tuple: the tangents of self's leaves));
 * args = (c, dc) -> (body(c), d body(c)[dself, dc]), the tangent by nbi_jvp_region. */
static nb_status nbl_jvp_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                              nb_tree **out) {
    const nb_tree *c = nb_tree_child(args, 0), *dc = nb_tree_child(args, 1);
    int64_t nds = 0, nc = 0, ndc = 0, ns = 0;
    nb_var **dsv = nbl_leaf_vars(tr, nb_tree_get(self, "dself"), &nds);
    nb_var **cv = nbl_leaf_vars(tr, c, &nc), **dcv = nbl_leaf_vars(tr, dc, &ndc);
    if (dsv == NULL || cv == NULL || dcv == NULL) {
        return nb_trace_status(tr);
    }
    if (nc != ndc) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "loop jvp: tangent counts differ");
    }
    int32_t begin = 0;
    nb_var **ins = NULL, **ov = NULL;
    nb_tree *res = NULL;
    nb_status st = nbl_retrace(tr, self, c, cv, nc, &begin, &ins, &ns, &ov, &res);
    if (st != NB_OK) {
        return st;
    }
    int32_t end = tr->g.n_nodes;
    nb_var **tans = nbi_arena_alloc(&tr->arena, (size_t)(ns + nc + 1) * sizeof(nb_var *));
    nb_var **ot = nbi_arena_alloc(&tr->arena, (size_t)(nc + 1) * sizeof(nb_var *));
    if (ns != nds || tans == NULL || ot == NULL) {
        nb_tree_destroy(res);
        return tans == NULL || ot == NULL
                   ? nbi_trace_err(tr, NB_ERR_OOM, "out of memory")
                   : nbi_trace_err(tr, NB_ERR_INTERNAL, "loop jvp: tangent counts differ");
    }
    for (int64_t j = 0; j < ns + nc; j++) {
        nb_var *x = ins[j]->in[0], *t = j < ns ? dsv[j] : dcv[j - ns];
        tans[j] = nbi_is_float_var(x) ? t : NULL;
    }
    st = nbi_jvp_region(tr, begin, end, (int)(ns + nc), ins, tans, (int)nc, ov, ot);
    if (st != NB_OK) {
        nb_tree_destroy(res);
        return st;
    }
    for (int64_t j = 0; j < nc; j++) {
        if (!nbi_is_float_var(ov[j])) {
            ot[j] = dcv[j]; /* an integer leaf's "tangent" placeholder stays as it is */
        }
    }
    const nb_tree *dres = nbl_tree_like(tr, dc, ot, nc);
    if (dres == NULL) {
        nb_tree_destroy(res);
        return nb_trace_status(tr);
    }
    st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){res, (nb_tree *)dres}, out);
    nb_tree_destroy(res);
    return st;
}

void nbi_while_jvp(nb_trace *tr, nb_var *w, nb_var *const *in_tan, nb_var **out_tan) {
    static const char who[] = "forward mode through a loop";
    const nbl_record *rec = (const nbl_record *)(intptr_t)w->at.a[6];
    int64_t nc = w->at.a[0], nb = w->at.a[1], ncar = w->at.a[2];
    nb_var *const *carry0 = w->in + nc + nb;
    /* the tangents of the body's lifted operands (zeros where none), and of the carry */
    nb_var **ds = nbi_arena_alloc(&tr->arena, (size_t)(nb + 1) * sizeof(nb_var *));
    nb_var **dc = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_var *));
    if (ds == NULL || dc == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        return;
    }
    for (int64_t j = 0; j < nb; j++) {
        nb_var *x = w->in[nc + j];
        ds[j] =
            in_tan[nc + j] != NULL ? in_tan[nc + j] : nb_full(tr, x->dtype, x->rank, x->shape, 0.0);
    }
    for (int64_t j = 0; j < ncar; j++) {
        nb_var *x = carry0[j];
        dc[j] = in_tan[nc + nb + j] != NULL ? in_tan[nc + nb + j]
                                            : nb_full(tr, x->dtype, x->rank, x->shape, 0.0);
    }
    nb_tree **di = nbi_arena_alloc(&tr->arena, (size_t)(nb + 1) * sizeof(nb_tree *));
    nb_tree *dself = NULL;
    for (int64_t j = 0; di != NULL && j < nb; j++) {
        di[j] = nb_leaf(ds[j]);
    }
    if (di == NULL || tr->status != NB_OK || nb_tree_tuple(tr->ctx, nb, di, &dself) != NB_OK) {
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
        }
        return;
    }
    nb_fn *fc = nbl_wrapper(tr, who, "jvp_cond", nbl_jvp_cond, rec->cond_body, rec->cond_name,
                            rec->cond_self, 0, NULL, NULL);
    nb_fn *fb = nbl_wrapper(tr, who, "jvp_body", nbl_jvp_body, rec->body_body, rec->body_name,
                            rec->body_self, 1, (const char *[]){"dself"}, &dself);
    nb_tree_destroy(dself);
    const nb_tree *dct = nbl_tree_like(tr, rec->carry, dc, ncar);
    const nb_tree *init = (fc && fb && dct) ? nbl_pair(tr, rec->carry, dct) : NULL;
    nb_loop_opts o = nb_loop_opts_default();
    o.max_steps = w->at.a[3];
    const nb_tree *res = init != NULL ? nbl_while(tr, who, fc, fb, init, &o, 0) : NULL;
    nb_fn_destroy(fc);
    nb_fn_destroy(fb);
    if (res == NULL) {
        return;
    }
    int64_t m = 0;
    nb_var **tv = nbl_leaf_vars(tr, nb_tree_child(res, 1), &m);
    for (int64_t j = 0; tv != NULL && j < m && j < ncar; j++) {
        out_tan[j] = nbi_is_float_var(carry0[j]) ? tv[j] : NULL;
    }
}

/* ---- batching (nb_vmap): a loop over B lanes --------------------------------------------
 *
 * JAX's semantics: the batched loop runs while any lane's cond holds; a lane whose cond
 * is false keeps its carry (the body's result is selected per lane), so every lane ends
 * with the carry its own loop would have. Every carry leaf is batched (a lane may stop
 * early whatever the leaf). The cond and body are traced once more, inside the batched
 * loop's wrappers, on lane examples (zeros of one lane's shape) and batched there by
 * nbi_vmap_region -- the loop's own functions are never changed. A carry leaf written with
 * one dynamic_update_slice at indices the same for every lane selects in the written block
 * (the block a finished lane would write is the one it holds), not over the whole leaf.
 * Not yet for per-lane indices -- and a batched loop's counters are per lane, so a buffer's
 * writes are: those run once per lane and the whole leaf is selected (exact; a copy of the
 * leaf a step, and B ops in the program). */

/* Trace fp on (uself, args) with the batched leaves replaced by lane examples, then batch
 * what it traced: uself's leaves are batched where bmask (a tuple of bools, one per array
 * leaf) says so, args' leaves all are. *bo: the n_out batched output leaves (batch on
 * axis 0; an output the same for every lane is broadcast), *res the output tree (a new
 * reference). */
static nb_status nbl_lanes(nb_trace *tr, const nb_tree *fnref, const nb_tree *uself,
                           const nb_tree *bmask, const nb_tree *args, int64_t B, nb_var ***bo,
                           int64_t *n_out, nb_tree **res) {
    *res = NULL;
    bool has_self = uself != NULL && nb_tree_kind_of(uself) != NB_TREE_KIND_NULL;
    int64_t ns = 0, nc = 0, no = 0;
    nb_var **sv = nbl_leaf_vars(tr, has_self ? uself : NULL, &ns);
    nb_var **cv = nbl_leaf_vars(tr, args, &nc);
    if (sv == NULL || cv == NULL) {
        return nb_trace_status(tr);
    }
    nb_var **lane = nbi_arena_alloc(&tr->arena, (size_t)(ns + nc + 1) * sizeof(nb_var *));
    nb_var **ins = nbi_arena_alloc(&tr->arena, (size_t)(ns + nc + 1) * sizeof(nb_var *));
    nb_var **bins = nbi_arena_alloc(&tr->arena, (size_t)(ns + nc + 1) * sizeof(nb_var *));
    if (lane == NULL || ins == NULL || bins == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
    }
    int32_t begin = tr->g.n_nodes;
    int k = 0;
    for (int64_t j = 0; j < ns + nc; j++) {
        nb_var *x = j < ns ? sv[j] : cv[j - ns];
        bool batched = j >= ns;
        if (!batched && bmask != NULL) {
            nb_tree_get_bool(nb_tree_child(bmask, j), &batched);
        }
        if (!batched) {
            lane[j] = x;
            continue;
        }
        if (x->rank < 1 || x->shape[0] != B) {
            return nbi_trace_err(tr, NB_ERR_INTERNAL,
                                 "nb_vmap: a loop's batched leaf has no "
                                 "batch axis");
        }
        lane[j] = nb_full(tr, x->dtype, x->rank - 1, x->shape + 1, 0.0);
        ins[k] = lane[j];
        bins[k] = x;
        k++;
    }
    const nb_tree *s_tree = ns > 0 ? nbl_tree_like(tr, uself, lane, ns) : has_self ? uself : NULL;
    const nb_tree *c_tree = nbl_tree_like(tr, args, lane + ns, nc);
    if ((ns > 0 && s_tree == NULL) || c_tree == NULL) {
        return nb_trace_status(tr);
    }
    nb_fnptr fp = NULL;
    const char *name = NULL;
    nb_tree_get_fnref(fnref, &fp, &name);
    const char *saved = tr->fn_name;
    tr->fn_name = name != NULL ? name : saved;
    tr->vmap_depth++; /* calls inlined, as in the vmap layer */
    nb_status st = ((nb_fn_body)fp)(tr, s_tree, c_tree, res);
    tr->vmap_depth--;
    tr->fn_name = saved;
    if (st == NB_OK && tr->status == NB_OK && *res == NULL) {
        st = nbi_trace_err(tr, NB_ERR_MISUSE, "the function '%s' returned no output", name);
    }
    if (st != NB_OK || tr->status != NB_OK) {
        nb_tree_destroy(*res);
        *res = NULL;
        if (tr->status == NB_OK) {
            nbi_trace_err(tr, st, "the function '%s' failed: %s", name, nb_ctx_errmsg(tr->ctx));
        }
        return tr->status;
    }
    int32_t end = tr->g.n_nodes;
    nb_var **ov = nbl_leaf_vars(tr, *res, &no);
    nb_var **out = ov ? nbi_arena_alloc(&tr->arena, (size_t)(no + 1) * sizeof(nb_var *)) : NULL;
    st = out != NULL ? nbi_vmap_region(tr, begin, end, k, ins, bins, B, (int)no, ov, out)
                     : (nb_trace_status(tr) != NB_OK
                            ? nb_trace_status(tr)
                            : nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory"));
    for (int64_t j = 0; st == NB_OK && j < no; j++) {
        if (out[j] == NULL) {
            out[j] = nbi_vmap_bcast(ov[j], B);
        }
    }
    if (st != NB_OK || tr->status != NB_OK) {
        nb_tree_destroy(*res);
        *res = NULL;
        return tr->status != NB_OK ? tr->status : st;
    }
    *bo = out;
    *n_out = no;
    return NB_OK;
}

/* Which lanes run: the cond of self (cfn on lifted[1], cbmask) on the batched carry, [B]. */
static nb_var *nbl_lanes_active(nb_trace *tr, const nb_tree *self, const nb_tree *args, int64_t B) {
    nb_var **act = NULL;
    int64_t n = 0;
    nb_tree *res = NULL;
    if (nbl_lanes(tr, nb_tree_get(self, "cfn"), nb_tree_child(nb_tree_get(self, "lifted"), 1),
                  nb_tree_get(self, "cbmask"), args, B, &act, &n, &res) != NB_OK) {
        return NULL;
    }
    nb_tree_destroy(res);
    if (n != 1 || act[0]->rank != 1 || act[0]->dtype != NB_DTYPE_BOOL) {
        nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_vmap: a loop's batched cond is not [B] bool");
        return NULL;
    }
    return act[0];
}

/* batched cond: self = dict(cfn, lifted = (body's self, cond's self), cbmask, B, ...);
 * args: the batched carry -> does any lane's cond hold? */
static nb_status nbl_vmap_cond(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    int64_t B = 0;
    nb_tree_get_int(nb_tree_get(self, "B"), &B);
    nb_var *act = nbl_lanes_active(tr, self, args, B);
    if (act == NULL) {
        return nb_trace_status(tr);
    }
    nb_var *n = nb_sum(nb_cast(act, NB_DTYPE_I32), NULL, 0, false);
    return nb_return(nb_gt(n, nb_scalar_typed(tr, NB_DTYPE_I32, 0.0)), out);
}

/* One leaf of the batched body's result: the body's where the lane runs, the carry's where
 * it has stopped. A dynamic_update_slice of the carry leaf itself selects in the block it
 * writes instead (the whole buffer is not read). */
static nb_var *nbl_lanes_keep(nb_trace *tr, nb_var *act, nb_var *c, nb_var *n) {
    if (n == c || c == NULL || n == NULL) {
        return n;
    }
    if (n->op == NBI_OP_DYN_UPDATE && n->in[0] == c && nbi_dyn_lanes(n)) {
        /* each lane's block at its own starts: the lane's old block where it has stopped */
        nb_var *u = n->in[1];
        nb_var *old = nbi_dyn_slice_lanes(c, n->in + 2, u->shape + 1, c->shape[0]);
        nb_var *keep = nb_select(nbi_vmap_lift(act, u->rank - 1), u, old);
        return nbi_dyn_update_lanes(c, keep, n->in + 2);
    }
    if (n->op == NBI_OP_DYN_UPDATE && n->in[0] == c && n->n_in == 2 + c->rank &&
        n->in[1]->rank == c->rank && n->in[1]->shape[0] == c->shape[0]) {
        nb_var *u = n->in[1];
        nb_var *old = nb_dynamic_slice(c, n->in + 2, u->shape);
        nb_var *keep = nb_select(nbi_vmap_lift(act, u->rank - 1), u, old);
        return nb_dynamic_update_slice(c, keep, n->in + 2);
    }
    (void)tr;
    return nb_select(nbi_vmap_lift(act, n->rank - 1), n, c);
}

/* batched body: self = dict(fn, cfn, lifted = (body's self, cond's self), bmask, cbmask,
 * B); args: the batched carry -> per leaf, the body's value where the lane's cond holds,
 * the carry where it does not. */
static nb_status nbl_vmap_body(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    int64_t B = 0, nn = 0, nc = 0;
    nb_tree_get_int(nb_tree_get(self, "B"), &B);
    nb_var *act = nbl_lanes_active(tr, self, args, B);
    nb_var **nv = NULL;
    nb_tree *res = NULL;
    if (act == NULL ||
        nbl_lanes(tr, nb_tree_get(self, "fn"), nb_tree_child(nb_tree_get(self, "lifted"), 0),
                  nb_tree_get(self, "bmask"), args, B, &nv, &nn, &res) != NB_OK) {
        return nb_trace_status(tr);
    }
    nb_var **cv = nbl_leaf_vars(tr, args, &nc);
    nb_var **ov = nbi_arena_alloc(&tr->arena, (size_t)(nc + 1) * sizeof(nb_var *));
    if (cv == NULL || ov == NULL || nn != nc) {
        nb_tree_destroy(res);
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr)
               : ov == NULL ? nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory")
                            : nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_vmap: the loop body changed");
    }
    for (int64_t j = 0; j < nc; j++) {
        ov[j] = nbl_lanes_keep(tr, act, cv[j], nv[j]);
    }
    const nb_tree *t = nbl_tree_like(tr, res, ov, nc);
    nb_tree_destroy(res);
    if (t == NULL) {
        return nb_trace_status(tr);
    }
    *out = nb_tree_retain((nb_tree *)t);
    return NB_OK;
}

/* A trace-owned tuple of the n bools b. */
static nb_tree *nbl_bool_tuple(nb_trace *tr, const bool *b, int64_t n) {
    nb_tree **items = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_tree *));
    nb_tree *t = NULL;
    bool ok = items != NULL;
    int64_t made = 0;
    for (; ok && made < n; made++) {
        ok = nb_tree_bool(tr->ctx, b[made], &items[made]) == NB_OK;
    }
    ok = ok && nb_tree_tuple(tr->ctx, n, items, &t) == NB_OK;
    for (int64_t j = 0; items != NULL && j < made; j++) {
        nb_tree_destroy(items[j]);
    }
    if (!ok || nbi_trace_own(tr, t) != NB_OK) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
        return NULL;
    }
    return t;
}

/* A function's self with its lifted operands ops (n of them, its array leaves in order)
 * replaced by their batched values where there is one (and, with all_float, floats made
 * batched by broadcasting: reverse mode's per-lane cotangents); *mask which are. NULL self:
 * a null tree. */
static const nb_tree *nbl_lanes_self(nb_trace *tr, const nb_tree *self, nb_var *const *ops,
                                     nb_var *const *bops, int64_t n, int64_t B, bool all_float,
                                     nb_tree **mask) {
    bool *b = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(bool));
    nb_var **v = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_var *));
    if (b == NULL || v == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
        return NULL;
    }
    for (int64_t j = 0; j < n; j++) {
        v[j] = bops[j] != NULL                         ? bops[j]
               : all_float && nbi_is_float_var(ops[j]) ? nbi_vmap_bcast(ops[j], B)
                                                       : ops[j];
        b[j] = v[j] != ops[j];
    }
    *mask = nbl_bool_tuple(tr, b, n);
    if (*mask == NULL || tr->status != NB_OK) {
        return NULL;
    }
    if (self == NULL) {
        nb_tree *t = NULL;
        if (nb_tree_null(tr->ctx, &t) != NB_OK || nbi_trace_own(tr, t) != NB_OK) {
            nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
            return NULL;
        }
        return t;
    }
    return n > 0 ? nbl_tree_like(tr, self, v, n) : self;
}

/* The batched copy of while node w (operands bin batched, NULL where the same for every
 * lane; with all_float, the body's float operands are batched too): a new while node, its
 * carry leaves (batch on axis 0) in outs[0..ncar). *bw: the new node. */
static nb_status nbl_while_lanes(nb_trace *tr, const nb_var *w, nb_var *const *bin, int64_t B,
                                 bool all_float, nb_var **outs, nb_var **bw) {
    static const char who[] = "nb_vmap of a loop";
    const nbl_record *rec = (const nbl_record *)(intptr_t)w->at.a[6];
    int64_t nc = w->at.a[0], nb = w->at.a[1], ncar = w->at.a[2];
    if (rec == NULL) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "%s: the loop has no record", who);
    }
    nb_tree *cmask = NULL, *bmask = NULL;
    const nb_tree *cs = nbl_lanes_self(tr, rec->cond_self, w->in, bin, nc, B, false, &cmask);
    const nb_tree *bs =
        cs ? nbl_lanes_self(tr, rec->body_self, w->in + nc, bin + nc, nb, B, all_float, &bmask)
           : NULL;
    nb_var **cv = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_var *));
    if (cs == NULL || bs == NULL || cv == NULL) {
        return nb_trace_status(tr) != NB_OK
                   ? nb_trace_status(tr)
                   : nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    }
    for (int64_t j = 0; j < ncar; j++) {
        nb_var *x = w->in[nc + nb + j];
        cv[j] = bin[nc + nb + j] != NULL ? bin[nc + nb + j] : nbi_vmap_bcast(x, B);
    }
    const nb_tree *init = nbl_tree_like(tr, rec->carry, cv, ncar);
    nb_tree *lifted = NULL, *bt = NULL, *cfn = NULL;
    nb_fn *fc = NULL, *fb = NULL;
    nb_status st = init != NULL ? NB_OK : nb_trace_status(tr);
    if (st == NB_OK) {
        st = nb_tree_tuple(tr->ctx, 2, (nb_tree *[]){(nb_tree *)bs, (nb_tree *)cs}, &lifted);
    }
    if (st == NB_OK) {
        st = nb_tree_int(tr->ctx, B, &bt);
    }
    if (st == NB_OK) {
        st = nb_tree_fnref(tr->ctx, (nb_fnptr)rec->cond_body, rec->cond_name, &cfn);
    }
    if (st == NB_OK) {
        const char *keys[5] = {"cfn", "lifted", "bmask", "cbmask", "B"};
        nb_tree *vals[5] = {cfn, lifted, bmask, cmask, bt};
        fc = nbl_wrapper(tr, who, "vmap_cond", nbl_vmap_cond, rec->cond_body, rec->cond_name, NULL,
                         5, keys, vals);
        fb = fc ? nbl_wrapper(tr, who, "vmap_body", nbl_vmap_body, rec->body_body, rec->body_name,
                              NULL, 5, keys, vals)
                : NULL;
    } else if (tr->status == NB_OK) {
        nbi_trace_err(tr, st, "%s: out of memory", who);
    }
    nb_tree_destroy(lifted);
    nb_tree_destroy(bt);
    nb_tree_destroy(cfn);
    const nb_tree *res = NULL;
    if (fc != NULL && fb != NULL) {
        nb_loop_opts o = nb_loop_opts_default();
        o.kind = (nb_loop_kind)w->at.a[4];
        o.max_steps = w->at.a[3];
        o.checkpoints = w->at.a[5];
        uint64_t bits[NB_MAX_RANK];
        for (int i = 0; i < NB_MAX_RANK; i++) {
            bits[i] = (uint64_t)w->at.b[i];
        }
        res = nbl_while_ex(tr, who, fc, fb, init, &o, w->at.a[7], bits, bw);
    }
    nb_fn_destroy(fc);
    nb_fn_destroy(fb);
    if (res == NULL) {
        return nb_trace_status(tr) != NB_OK ? nb_trace_status(tr)
                                            : nbi_trace_err(tr, NB_ERR_INTERNAL, "%s failed", who);
    }
    int64_t m = 0;
    nb_var **rv = nbl_leaf_vars(tr, res, &m);
    if (rv == NULL || m != ncar) {
        return nb_trace_status(tr) != NB_OK
                   ? nb_trace_status(tr)
                   : nbi_trace_err(tr, NB_ERR_INTERNAL, "%s: the carry changed", who);
    }
    memcpy(outs, rv, (size_t)ncar * sizeof(nb_var *));
    return NB_OK;
}

static nb_var *nbl_zeros_lanes(nb_trace *tr, const nb_var *x, int64_t B) {
    int64_t shape[NB_MAX_RANK];
    shape[0] = B;
    memcpy(shape + 1, x->shape, (size_t)x->rank * sizeof *shape);
    return nb_full(tr, x->dtype, x->rank + 1, shape, 0.0);
}

/* The batched loop_reverse: the loop it reverses batched (its body's float operands
 * batched too, so that their cotangents come out per lane rather than summed over the
 * lanes), and that loop's reverse. */
static nb_status nbl_reverse_lanes(nb_trace *tr, nb_var *r, nb_var *const *bin, int64_t B,
                                   nb_var **outs) {
    int64_t nc = r->at.a[0], nb = r->at.a[1], ncar = r->at.a[2], nv = r->at.a[5];
    nb_var fake;
    memset(&fake, 0, sizeof fake);
    fake.op = NBI_OP_WHILE;
    fake.in = nbi_arena_alloc(&tr->arena, (size_t)(nc + nb + ncar + 1) * sizeof(nb_var *));
    nb_var **fb = nbi_arena_alloc(&tr->arena, (size_t)(nc + nb + ncar + 1) * sizeof(nb_var *));
    nb_var **carry = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_var *));
    nb_var **ct = nbi_arena_alloc(&tr->arena, (size_t)(ncar + 1) * sizeof(nb_var *));
    if (fake.in == NULL || fb == NULL || carry == NULL || ct == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
    }
    int64_t c0 = nc + nb + nv, t0 = c0 + ncar;
    memcpy(fake.in, r->in, (size_t)(nc + nb) * sizeof(nb_var *));
    memcpy(fake.in + nc + nb, r->in + c0, (size_t)ncar * sizeof(nb_var *));
    memcpy(fb, bin, (size_t)(nc + nb) * sizeof(nb_var *));
    memcpy(fb + nc + nb, bin + c0, (size_t)ncar * sizeof(nb_var *));
    fake.n_in = (int32_t)(nc + nb + ncar);
    fake.at.a[0] = nc;
    fake.at.a[1] = nb;
    fake.at.a[2] = ncar;
    fake.at.a[3] = r->at.a[3];
    fake.at.a[4] = NB_LOOP_CHECKPOINTED;
    fake.at.a[5] = r->at.a[4];
    fake.at.a[6] = r->at.a[7];
    fake.at.a[7] = r->at.a[6];
    memcpy(fake.at.b, r->at.b, sizeof fake.at.b);
    nb_var *bw = NULL;
    nb_status st = nbl_while_lanes(tr, &fake, fb, B, true, carry, &bw);
    if (st != NB_OK) {
        return st;
    }
    for (int64_t j = 0; j < ncar; j++) {
        nb_var *x = r->in[t0 + j];
        ct[j] = bin[t0 + j] != NULL ? bin[t0 + j] : nbi_vmap_bcast(x, B);
    }
    nb_var **in_ct = nbi_arena_alloc(&tr->arena, (size_t)(bw->n_in + 1) * sizeof(nb_var *));
    if (in_ct == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "nb_vmap: out of memory");
    }
    memset(in_ct, 0, (size_t)(bw->n_in + 1) * sizeof(nb_var *));
    nbl_vjp_checkpointed(tr, bw, ct, in_ct);
    if (tr->status != NB_OK) {
        return tr->status;
    }
    /* the batched loop's body operands: the body's self's leaves, then the cond's */
    int64_t bnc = bw->at.a[0], bnb = bw->at.a[1];
    if (bnb != nb + nc || bw->at.a[2] != ncar) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "nb_vmap: the batched loop's operands");
    }
    for (int64_t j = 0; j < ncar; j++) {
        nb_var *g = in_ct[bnc + bnb + j];
        outs[j] = g != NULL ? g : nbl_zeros_lanes(tr, r->in[c0 + j], B);
    }
    for (int64_t j = 0; j < nv; j++) {
        nb_var *g = j < nb ? in_ct[bnc + j] : NULL;
        outs[ncar + j] = g != NULL ? g : nbl_zeros_lanes(tr, r->in[nc + j], B);
    }
    return tr->status;
}

nb_status nbi_loop_vmap(nb_trace *tr, nb_var *node, nb_var *const *bin, int64_t B, nb_var **outs) {
    if (node->op == NBI_OP_LOOP_REVERSE) {
        return nbl_reverse_lanes(tr, node, bin, B, outs);
    }
    nb_var *bw = NULL;
    return nbl_while_lanes(tr, node, bin, B, false, outs, &bw);
}
