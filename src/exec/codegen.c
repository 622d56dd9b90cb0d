/*
 * src/exec/codegen.c -- an executable as C: the native tier's code generator.
 *
 * The output is one self-contained translation unit (no #include: it compiles without
 * nabla's headers or the C library's) defining
 *
 *     void nbx_run(const nbx_env *env, const void *const *in, void *const *out,
 *                  const _Bool *direct);
 *
 * which does what the interpreter's loop in nbi_exec_run_raw does, instruction by
 * instruction, over the same workspace layout: every value at the same offset, outputs in
 * the caller's buffers where direct[] says so. Instructions are either written out or
 * kernel calls:
 *
 *  - Written out, when small: a fused elementwise program (at most NBX_INLINE_MAX
 *    elements; NBX_INLINE_VM_MAX when it calls vector math), a standalone elementwise op
 *    or broadcast, a slice, a reduction, a copy, a concatenation, a dynamic slice or update,
 *    a call's output. One loop nest over the index space with the shapes, strides and
 *    offsets as constants (a single loop the compiler vectorises when every input is read
 *    at the element's own index or as one value); each fused instruction a C expression on
 *    scalars -- the same IEEE operation per element as the op's kernel (nbi_ew_tile and
 *    the kernels of src/ad/op_elementwise.c), transcendental functions through the same
 *    SLEEF vector functions (one element through the padded-register path, which gives
 *    the bits of any other split); reductions, fused or not, as the reduction kernel's
 *    left fold from the first element (float sums below one pairwise block, max, min,
 *    integer sums; prod when not fused); data movement as element copies (clamped start
 *    indices as the kernels clamp them). The file is compiled with -ffp-contract=off and
 *    without fast-math, so nothing is contracted or reassociated: the interpreter's bits.
 *    Intermediates of at most NBX_PROMOTE_MAX elements that only written-out code makes
 *    and reads are C locals instead of workspace slots, so they stay in registers.
 *  - Written out when large: a fused program (or a standalone elementwise op) with no
 *    vector math and no reduction whose inputs are all read at the element's own index or
 *    as one value -- one vectorised pass over memory (an optimizer's update of a big leaf:
 *    every instruction in registers), where the kernel runs each instruction over a tile
 *    in turn. It is a function over a range of elements, nbx_w<t>, run over all of them
 *    without a thread pool and split into fixed chunks across the pool's threads with one
 *    (elementwise: the same bits for any split).
 *  - Written out tiled: any other fused program (vector math over more than
 *    NBX_INLINE_VM_MAX elements, a large reduction, inputs broadcast along inner dims:
 *    softmax, a GRU's gates) and a standalone transcendental op over more than
 *    NBX_INLINE_VM_MAX elements -- a worker over rows of the index space, each row a tile
 *    of local arrays on which runs of C expressions are vectorised loops and each
 *    transcendental one call of the vector function over the tile (nbx_emit_tiled_worker);
 *    reductions folded as the kernel folds them, four outputs' chains at a time.
 *  - Everything else (matrix products, large arrays, loops, random numbers): a direct
 *    call of the op's kernel -- the function the interpreter calls -- on an nbi_kargs
 *    built in place, its buffers resolved at compile time.
 *
 *  - While loops (and so fori loops, scans and an ODE solve): C loops in the same file, their
 *    cond and body executables written as functions of their own (nbx_f<k>, each on its
 *    executable's environment, env->sub[k]) called step after step on the loop's carry,
 *    as the while kernel runs them (nbx_emit_loop). A checkpointed reversal runs its
 *    kernel's schedule with its cond, body and step vjp as functions of the file too
 *    (nbx_emit_reverse).
 *
 * So the native code saves the interpreter's dispatch: resolving buffers, walking the
 * program, and calling one tile function per fused instruction.
 */
#include "exec/exec.h"

#include <stdlib.h>
#include <string.h>

/* Fused programs over more elements than this run through the interpreter's kernel, which
 * splits large arrays across threads and runs tiles through vector kernels. */
#define NBX_INLINE_MAX 4096

static const char *nbx_ctype(nb_dtype d) {
    switch (d) {
    case NB_DTYPE_F32:
        return "float";
    case NB_DTYPE_F64:
        return "double";
    case NB_DTYPE_I32:
        return "i32";
    case NB_DTYPE_I64:
        return "i64";
    case NB_DTYPE_BOOL:
        return "u8";
    }
    return "u8";
}

static const char *nbx_utype(nb_dtype d) {
    return d == NB_DTYPE_I32 ? "u32" : "u64";
}

static bool nbx_is_float(nb_dtype d) {
    return d == NB_DTYPE_F32 || d == NB_DTYPE_F64;
}

/* The vector-math function of a transcendental op (vmath.h's order), or -1. */
static int nbx_vm_index(nbi_op op) {
    switch (op) {
    case NBI_OP_EXP:
        return 0;
    case NBI_OP_EXPM1:
        return 1;
    case NBI_OP_LOG:
        return 2;
    case NBI_OP_LOG1P:
        return 3;
    case NBI_OP_SIN:
        return 4;
    case NBI_OP_COS:
        return 5;
    case NBI_OP_TAN:
        return 6;
    case NBI_OP_TANH:
        return 7;
    case NBI_OP_ERF:
        return 8;
    default:
        return -1;
    }
}

/* Can instruction in be written as a C expression here? */
static bool nbx_instr_ok(const nbi_finstr *in) {
    nbi_op op = (nbi_op)in->op;
    nb_dtype d = in->dtype, a = in->in_dtype;
    bool fl = nbx_is_float(d), in_int = a == NB_DTYPE_I32 || a == NB_DTYPE_I64;
    switch (op) {
    case NBI_OP_NEG:
    case NBI_OP_ABS:
    case NBI_OP_SIGN:
    case NBI_OP_SQUARE:
    case NBI_OP_RELU:
        return fl || d == NB_DTYPE_I32 || d == NB_DTYPE_I64;
    case NBI_OP_EXP:
    case NBI_OP_EXPM1:
    case NBI_OP_LOG:
    case NBI_OP_LOG1P:
    case NBI_OP_SIN:
    case NBI_OP_COS:
    case NBI_OP_TAN:
    case NBI_OP_TANH:
    case NBI_OP_ERF:
    case NBI_OP_SQRT:
    case NBI_OP_RSQRT:
    case NBI_OP_RECIPROCAL:
    case NBI_OP_SIGMOID:
    case NBI_OP_SOFTPLUS:
    case NBI_OP_GELU:
    case NBI_OP_POW:
        return fl;
    case NBI_OP_ADD:
    case NBI_OP_SUB:
    case NBI_OP_MUL:
    case NBI_OP_DIV:
    case NBI_OP_MAXIMUM:
    case NBI_OP_MINIMUM:
        return fl || d == NB_DTYPE_I32 || d == NB_DTYPE_I64;
    case NBI_OP_EQ:
    case NBI_OP_NE:
    case NBI_OP_LT:
    case NBI_OP_LE:
    case NBI_OP_GT:
    case NBI_OP_GE:
        return nbx_is_float(a) || in_int || a == NB_DTYPE_BOOL;
    case NBI_OP_LOGICAL_NOT:
    case NBI_OP_LOGICAL_AND:
    case NBI_OP_LOGICAL_OR:
        return d == NB_DTYPE_BOOL;
    case NBI_OP_SELECT:
    case NBI_OP_CAST:
    case NBI_OP_IDENTITY:
        return true;
    default:
        return false;
    }
}

/* Does instruction in call a vector-math function (one element at a time when written
 * out: the padded-register path, ~20 ns an element)? */
static bool nbx_instr_vm(const nbi_finstr *in) {
    return nbi_op_transcendental((nbi_op)in->op);
}

/* Programs calling vector math are written out up to this many elements; above, the
 * interpreter's kernel calls it a tile at a time. */
#define NBX_INLINE_VM_MAX 16

/* Can program p of node v have its trailing reduction (if any) written out: a left fold
 * from the first element, as the kernel folds -- sum, max or min, float sums only below one
 * pairwise block, of floats, i32 or i64? */
static bool nbx_red_ok(const nb_var *v, const nbi_fprog *p) {
    if (p->red_op == 0) {
        return true;
    }
    nb_dtype d = v->dtype;
    bool fl = nbx_is_float(d);
    if (p->red_op == NBI_OP_SUM) {
        if (fl && p->red_n >= 128) { /* pairwise blocks: the kernel's own path */
            return false;
        }
    } else if (p->red_op != NBI_OP_MAX && p->red_op != NBI_OP_MIN) {
        return false;
    }
    return (fl || d == NB_DTYPE_I32 || d == NB_DTYPE_I64) && p->red_n >= 1;
}

/* Is fused node v written out inline? */
static bool nbx_fused_inline(const nb_var *v) {
    const nbi_fprog *p = v->at.callee;
    int64_t size = nbi_shape_size(p->map_rank, p->map_shape);
    if (size <= 0 || size > NBX_INLINE_MAX) {
        return false;
    }
    for (int32_t i = 0; i < p->n_instr; i++) {
        if (!nbx_instr_ok(&p->ins[i]) || (nbx_instr_vm(&p->ins[i]) && size > NBX_INLINE_VM_MAX)) {
            return false;
        }
    }
    return nbx_red_ok(v, p);
}

/* A double as an exact C literal. */
static void nbx_double(nbi_sbuf *s, double x) {
    if (x != x) {
        nbi_sbuf_puts(s, "(0.0/0.0)"); /* pad values only; never arithmetic on it */
    } else if (x == 1.0 / 0.0) {
        nbi_sbuf_puts(s, "(1.0/0.0)");
    } else if (x == -1.0 / 0.0) {
        nbi_sbuf_puts(s, "(-1.0/0.0)");
    } else {
        nbi_sbuf_printf(s, "%a", x);
    }
}

/* The operand text of instruction operand src (a register or an external input). */
static void nbx_operand(char *buf, size_t cap, int16_t src) {
    if (src >= 0) {
        snprintf(buf, cap, "r%d", (int)src);
    } else {
        snprintf(buf, cap, "e%d", (int)(-src - 1));
    }
}

/* The cast of expression x from dtype a to dtype d, as nbi_cast_kernel converts. */
static void nbx_cast(nbi_sbuf *s, nb_dtype a, nb_dtype d, const char *x) {
    bool from_int = !nbx_is_float(a);
    char qx[64], dx[64];
    if (a == NB_DTYPE_BOOL) {
        snprintf(qx, sizeof qx, "(i64)(%s != 0)", x);
    } else {
        snprintf(qx, sizeof qx, "(i64)%s", x);
    }
    snprintf(dx, sizeof dx, "(double)%s", x);
    const char *v = from_int ? qx : dx;
    switch (d) {
    case NB_DTYPE_F32:
        if (a == NB_DTYPE_BOOL) {
            nbi_sbuf_printf(s, "(%s != 0 ? 1.0f : 0.0f)", x);
        } else {
            nbi_sbuf_printf(s, "(float)%s", from_int ? qx : x);
        }
        return;
    case NB_DTYPE_F64:
        if (a == NB_DTYPE_BOOL) {
            nbi_sbuf_printf(s, "(%s != 0 ? 1.0 : 0.0)", x);
        } else {
            nbi_sbuf_printf(s, "(double)%s", from_int ? qx : x);
        }
        return;
    case NB_DTYPE_I32:
        nbi_sbuf_printf(s, from_int ? "nbx_sat_i32_q(%s)" : "nbx_sat_i32_d(%s)", v);
        return;
    case NB_DTYPE_I64:
        nbi_sbuf_printf(s, from_int ? "(%s)" : "nbx_sat_i64_d(%s)", v);
        return;
    case NB_DTYPE_BOOL:
        nbi_sbuf_printf(s, "(u8)(%s != 0)", v);
        return;
    }
}

/* Instruction i of p as "T ri = <expr>;". */
static void nbx_instr(nbi_sbuf *s, const nbi_fprog *p, int32_t i) {
    const nbi_finstr *in = &p->ins[i];
    nbi_op op = (nbi_op)in->op;
    nb_dtype d = in->dtype;
    const char *T = nbx_ctype(d);
    char x[16], y[16], z[16];
    nbx_operand(x, sizeof x, in->src[0]);
    if (in->n_in > 1) {
        nbx_operand(y, sizeof y, in->src[1]);
    }
    if (in->n_in > 2) {
        nbx_operand(z, sizeof z, in->src[2]);
    }
    bool fl = nbx_is_float(d), f32 = d == NB_DTYPE_F32;
    const char *U = nbx_utype(d);
    const char *sfx = f32 ? "f" : "d"; /* helper suffix */
    nbi_sbuf_printf(s, "            %s r%d = ", T, (int)i);
    int vm = nbx_vm_index(op);
    if (vm >= 0) {
        nbi_sbuf_printf(s, "nbx_vm1%s(vm, %d, %s);\n", sfx, vm, x);
        return;
    }
    switch (op) {
    case NBI_OP_NEG:
        if (fl) {
            nbi_sbuf_printf(s, "-%s;\n", x);
        } else {
            nbi_sbuf_printf(s, "(%s)(0u - (%s)%s);\n", T, U, x);
        }
        return;
    case NBI_OP_ABS:
        if (fl) {
            nbi_sbuf_printf(s, "__builtin_fabs%s(%s);\n", f32 ? "f" : "", x);
        } else {
            nbi_sbuf_printf(s, "%s < 0 ? (%s)(0u - (%s)%s) : %s;\n", x, T, U, x, x);
        }
        return;
    case NBI_OP_SIGN:
        if (fl) {
            nbi_sbuf_printf(s, "%s > 0 ? (%s)1 : %s < 0 ? (%s)-1 : %s;\n", x, T, x, T, x);
        } else {
            nbi_sbuf_printf(s, "(%s)((%s > 0) - (%s < 0));\n", T, x, x);
        }
        return;
    case NBI_OP_SQRT:
        nbi_sbuf_printf(s, "__builtin_sqrt%s(%s);\n", f32 ? "f" : "", x);
        return;
    case NBI_OP_RSQRT:
        nbi_sbuf_printf(s, "(%s)1 / __builtin_sqrt%s(%s);\n", T, f32 ? "f" : "", x);
        return;
    case NBI_OP_SQUARE:
        if (fl) {
            nbi_sbuf_printf(s, "%s * %s;\n", x, x);
        } else {
            nbi_sbuf_printf(s, "(%s)((%s)%s * (%s)%s);\n", T, U, x, U, x);
        }
        return;
    case NBI_OP_RECIPROCAL:
        nbi_sbuf_printf(s, "(%s)1 / %s;\n", T, x);
        return;
    case NBI_OP_RELU:
        if (fl) {
            nbi_sbuf_printf(s, "(%s > 0 || %s != %s) ? %s : (%s)0;\n", x, x, x, x, T);
        } else {
            nbi_sbuf_printf(s, "%s > 0 ? %s : 0;\n", x, x);
        }
        return;
    case NBI_OP_SIGMOID:
        nbi_sbuf_printf(s, "nbx_sigmoid%s(vm, %s);\n", sfx, x);
        return;
    case NBI_OP_SOFTPLUS:
        nbi_sbuf_printf(s, "nbx_softplus%s(vm, %s);\n", sfx, x);
        return;
    case NBI_OP_GELU:
        nbi_sbuf_printf(s, "nbx_gelu%s(vm, %s);\n", sfx, x);
        return;
    case NBI_OP_LOGICAL_NOT:
        nbi_sbuf_printf(s, "(u8)!%s;\n", x);
        return;
    case NBI_OP_IDENTITY: /* a copy: standalone broadcasts */
        nbi_sbuf_printf(s, "%s;\n", x);
        return;
    case NBI_OP_CAST:
        nbx_cast(s, in->in_dtype, d, x);
        nbi_sbuf_puts(s, ";\n");
        return;
    case NBI_OP_ADD:
    case NBI_OP_SUB:
    case NBI_OP_MUL: {
        const char *o = op == NBI_OP_ADD ? "+" : op == NBI_OP_SUB ? "-" : "*";
        if (fl) {
            nbi_sbuf_printf(s, "%s %s %s;\n", x, o, y);
        } else {
            nbi_sbuf_printf(s, "(%s)((%s)%s %s (%s)%s);\n", T, U, x, o, U, y);
        }
        return;
    }
    case NBI_OP_DIV:
        if (fl) {
            nbi_sbuf_printf(s, "%s / %s;\n", x, y);
        } else {
            nbi_sbuf_printf(s, "%s == 0 ? (%s)0 : %s == -1 ? (%s)(0u - (%s)%s) : (%s)(%s / %s);\n",
                            y, T, y, T, U, x, T, x, y);
        }
        return;
    case NBI_OP_POW:
        nbi_sbuf_printf(s, "nbx_pow%s(vm, %s, %s);\n", sfx, x, y);
        return;
    case NBI_OP_MAXIMUM:
        if (fl) {
            nbi_sbuf_printf(s, "(%s > %s || %s != %s) ? %s : %s;\n", x, y, x, x, x, y);
        } else {
            nbi_sbuf_printf(s, "%s > %s ? %s : %s;\n", x, y, x, y);
        }
        return;
    case NBI_OP_MINIMUM:
        if (fl) {
            nbi_sbuf_printf(s, "(%s < %s || %s != %s) ? %s : %s;\n", x, y, x, x, x, y);
        } else {
            nbi_sbuf_printf(s, "%s < %s ? %s : %s;\n", x, y, x, y);
        }
        return;
    case NBI_OP_EQ:
    case NBI_OP_NE:
    case NBI_OP_LT:
    case NBI_OP_LE:
    case NBI_OP_GT:
    case NBI_OP_GE: {
        const char *o = op == NBI_OP_EQ   ? "=="
                        : op == NBI_OP_NE ? "!="
                        : op == NBI_OP_LT ? "<"
                        : op == NBI_OP_LE ? "<="
                        : op == NBI_OP_GT ? ">"
                                          : ">=";
        nbi_sbuf_printf(s, "(u8)(%s %s %s);\n", x, o, y);
        return;
    }
    case NBI_OP_LOGICAL_AND:
        nbi_sbuf_printf(s, "(u8)(%s && %s);\n", x, y);
        return;
    case NBI_OP_LOGICAL_OR:
        nbi_sbuf_printf(s, "(u8)(%s || %s);\n", x, y);
        return;
    case NBI_OP_SELECT:
        nbi_sbuf_printf(s, "%s ? %s : %s;\n", x, y, z);
        return;
    default:
        nbi_sbuf_puts(s, "0; /* unreachable */\n");
        return;
    }
}

/* One step of a reduction's left fold, "a = a (op) t;", as the kernel combines. */
static void nbx_fold_comb(char *buf, size_t cap, int red_op, nb_dtype d, const char *a,
                          const char *t) {
    const char *T = nbx_ctype(d), *U = nbx_utype(d);
    if (red_op == NBI_OP_SUM) {
        if (nbx_is_float(d)) {
            snprintf(buf, cap, "%s = %s + %s;", a, a, t);
        } else {
            snprintf(buf, cap, "%s = (%s)((%s)%s + (%s)%s);", a, T, U, a, U, t);
        }
        return;
    }
    const char *cmp = red_op == NBI_OP_MAX ? ">" : "<";
    if (nbx_is_float(d)) { /* (t > a || t != t) ? t : a, in two selects without a branch */
        snprintf(buf, cap, "%s = %s %s %s ? %s : %s; %s = %s != %s ? %s : %s;", a, t, cmp, a, t, a,
                 a, t, t, t, a);
    } else {
        snprintf(buf, cap, "%s = %s %s %s ? %s : %s;", a, t, cmp, a, t, a);
    }
}

/* The address text of value node (its buffer this run) into buf. */
typedef struct nbx_ctx {
    const nbi_exec *e;
    nbi_sbuf *s;
} nbx_ctx;

/* Values kept in C locals instead of the workspace (per node, during one codegen on this
 * thread): small intermediates made and read only by written-out code, so the compiler
 * keeps them in registers across instructions (the workspace is memory that may alias the
 * inputs and outputs, so every value there is stored and loaded again). */
static _Thread_local const bool *nbx_promoted;

/* Values written as pointers into their root (nbi_exec's alias_of: a reshape or a
 * contiguous dynamic slice), named A<node> in the function being written. */
static _Thread_local const bool *nbx_aliased;

/* The function being written (0: nbx_run, k + 1: nbx_f<k>), which names its workers
 * nbx_w<id>_<instruction>. */
static _Thread_local int nbx_fn_id;

/* Values written where a dynamic_update_slice would copy them (nbx_rows), named D<node>
 * from the instruction that makes them on. */
static _Thread_local const bool *nbx_redirect;

static void nbx_value(const nbi_exec *e, int32_t node, char *buf, size_t cap) {
    if (nbx_redirect != NULL && nbx_redirect[node]) {
        snprintf(buf, cap, "D%d", (int)node);
    } else if (nbx_aliased != NULL && nbx_aliased[node]) {
        snprintf(buf, cap, "A%d", (int)node);
    } else if (nbx_promoted != NULL && nbx_promoted[node]) {
        snprintf(buf, cap, "((u8 *)L%d)", (int)node);
    } else if (e->param_of[node] >= 0) {
        snprintf(buf, cap, "((u8 *)in[%d])", (int)e->param_of[node]);
    } else if (e->out_of[node] >= 0) {
        snprintf(buf, cap, "v%d", (int)node);
    } else {
        snprintf(buf, cap, "(ws + %lld)", (long long)e->offset[node]);
    }
}

/* A fused node written out: one loop nest over its index space -- in nbx_run's body, or,
 * with worker >= 0 (a flat program: nbx_prog_flat), as the function nbx_w<worker> that runs
 * elements [first, first + count), its buffers in ud (inputs, the output, the stores: the
 * order nbx_emit_big passes them). */
static void nbx_emit_fused_ex(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins,
                              const nbi_fprog *p, int worker) {
    const nb_var *v = &e->nodes[ins->node];
    int r = p->map_rank;
    const int64_t *shape = p->map_shape;
    char buf[96];
    if (worker >= 0) {
        nbi_sbuf_printf(s,
                        "static void nbx_w%d_%d(void *ud, i64 first, i64 count, int worker) {\n"
                        "    void *const *p = (void *const *)ud;\n    (void)worker;\n",
                        nbx_fn_id, worker);
    } else {
        nbi_sbuf_puts(s, "    {\n");
    }
    /* externals: typed base pointers and per-dim strides in elements */
    int64_t st[NBI_FUSE_MAX_EXT][NB_MAX_RANK];
    int64_t off[NBI_FUSE_MAX_EXT];
    bool flat[NBI_FUSE_MAX_EXT];
    for (int32_t x = 0; x < p->n_ext; x++) {
        const nb_var *in = v->in[x];
        bool view = (p->view_mask >> x) & 1u;
        off[x] = view ? p->view_off[x] : 0;
        if (view) {
            memcpy(st[x], p->view_st[x], sizeof st[x]);
        } else {
            nbi_bcast_strides(in->rank, in->shape, r, shape, st[x]);
        }
        int64_t want = 1;
        flat[x] = !((p->pad_mask >> x) & 1u);
        for (int d = r - 1; d >= 0; d--) {
            flat[x] = flat[x] && (shape[d] == 1 || st[x][d] == want);
            want *= shape[d];
        }
        if (worker >= 0) {
            snprintf(buf, sizeof buf, "p[%d]", (int)x);
        } else {
            nbx_value(e, ins->in[x], buf, sizeof buf);
        }
        nbi_sbuf_printf(s, "        const %s *x%d = (const %s *)%s;\n", nbx_ctype(in->dtype),
                        (int)x, nbx_ctype(in->dtype), buf);
    }
    char ob[96];
    if (worker >= 0) {
        snprintf(ob, sizeof ob, "p[%d]", (int)p->n_ext);
    } else {
        nbx_value(e, ins->node, ob, sizeof ob);
    }
    nbi_sbuf_printf(s, "        %s *o = (%s *)%s;\n", nbx_ctype(v->dtype), nbx_ctype(v->dtype), ob);
    for (int32_t k = 0; k < ins->n_store; k++) {
        int32_t sn = ins->store[k];
        if (sn < 0) {
            continue;
        }
        if (worker >= 0) {
            snprintf(buf, sizeof buf, "p[%d]", (int)(p->n_ext + 1 + k));
        } else {
            nbx_value(e, sn, buf, sizeof buf);
        }
        const char *T = nbx_ctype(p->ins[p->store[k]].dtype);
        nbi_sbuf_printf(s, "        %s *s%d = (%s *)%s;\n", T, (int)k, T, buf);
    }
    bool red = p->red_op != 0;
    if (red) {
        nbi_sbuf_printf(s, "        %s acc = 0;\n        i64 pos = 0, row = 0;\n",
                        nbx_ctype(v->dtype));
    }
    /* Every input read at the element's own index or as one value, no reduction: one flat
     * loop the compiler vectorises -- its iterations are independent (an output shares a
     * buffer with an input only at the same index), which the pragmas tell it. */
    bool simple = !red && p->pad_mask == 0;
    for (int32_t x = 0; x < p->n_ext && simple; x++) {
        bool zero = true;
        for (int d = 0; d < r; d++) {
            zero = zero && (st[x][d] == 0 || shape[d] == 1);
        }
        simple = flat[x] || zero;
    }
    int64_t total = nbi_shape_size(r, shape);
    /* in the flat loop, an input read as one value is loaded once, before it: the compiler
     * cannot hoist the load itself (a store through o might, as far as it knows, write it),
     * and a load in every iteration keeps it from vectorising the loop */
    bool hoist[NBI_FUSE_MAX_EXT] = {false};
    if (simple && (total > 1 || worker >= 0)) {
        for (int32_t x = 0; x < p->n_ext; x++) {
            hoist[x] = !flat[x];
            if (hoist[x]) {
                const char *T = nbx_ctype(v->in[x]->dtype);
                nbi_sbuf_printf(s, "        const %s e%d = x%d[%lld];\n", T, (int)x, (int)x,
                                (long long)off[x]);
            }
        }
    }
    if (worker >= 0) { /* flat (nbx_big_program): the caller's range */
        nbi_sbuf_puts(s, "#pragma GCC ivdep\n"
                         "        for (i64 i = first; i < first + count; i++)\n        {\n");
        simple = true;
    } else if (simple && total > 1) {
        nbi_sbuf_printf(s,
                        "#pragma GCC ivdep\n"
                        "        for (i64 i = 0; i < %lld; i++)\n        {\n",
                        (long long)total);
    } else {
        simple = false;
        nbi_sbuf_puts(s, "        i64 i = 0;\n");
        for (int d = 0; d < r; d++) {
            nbi_sbuf_printf(s, "        for (i64 i%d = 0; i%d < %lld; i%d++)\n", d, d,
                            (long long)shape[d], d);
        }
        nbi_sbuf_puts(s, "        {\n");
    }
    for (int32_t x = 0; x < p->n_ext; x++) {
        const nb_var *in = v->in[x];
        const char *T = nbx_ctype(in->dtype);
        if (hoist[x]) {
            continue;
        }
        /* the element offset as text */
        char idx[512];
        nbi_sbuf is = nbi_sbuf_make(idx, sizeof idx);
        if (flat[x]) {
            nbi_sbuf_printf(&is, "%lld + i", (long long)off[x]);
        } else {
            nbi_sbuf_printf(&is, "%lld", (long long)off[x]);
            for (int d = 0; d < r; d++) {
                if (st[x][d] != 0 && shape[d] > 1) {
                    nbi_sbuf_printf(&is, " + i%d * %lld", d, (long long)st[x][d]);
                }
            }
        }
        if ((p->pad_mask >> x) & 1u) {
            /* inside the padded dims: the view at idx - lo, else the padding value */
            nbi_sbuf_printf(s, "            %s e%d = (1", T, (int)x);
            for (int d = 0; d < r; d++) {
                long long lo = (long long)p->pad_lo[x][d], dim = (long long)p->pad_dims[x][d];
                nbi_sbuf_printf(s, " && i%d - %lld >= 0 && i%d - %lld < %lld", d, lo, d, lo, dim);
            }
            nbi_sbuf_printf(s, ") ? x%d[%lld", (int)x, (long long)off[x]);
            for (int d = 0; d < r; d++) {
                if (st[x][d] != 0) {
                    nbi_sbuf_printf(s, " + (i%d - %lld) * %lld", d, (long long)p->pad_lo[x][d],
                                    (long long)st[x][d]);
                }
            }
            unsigned char pv[8];
            memset(pv, 0, sizeof pv);
            nbi_elem_from_f64(in->dtype, p->pad_value[x], pv);
            nbi_sbuf_puts(s, "] : ");
            if (in->dtype == NB_DTYPE_F32) {
                float f;
                memcpy(&f, pv, 4);
                nbi_sbuf_puts(s, "(float)");
                nbx_double(s, (double)f);
            } else if (in->dtype == NB_DTYPE_F64) {
                double f;
                memcpy(&f, pv, 8);
                nbx_double(s, f);
            } else if (in->dtype == NB_DTYPE_I32) {
                int32_t q;
                memcpy(&q, pv, 4);
                nbi_sbuf_printf(s, "(i32)%lld", (long long)q);
            } else if (in->dtype == NB_DTYPE_I64) {
                int64_t q;
                memcpy(&q, pv, 8);
                nbi_sbuf_printf(s, "(i64)%lldll", (long long)q);
            } else {
                nbi_sbuf_printf(s, "(u8)%u", (unsigned)pv[0]);
            }
            nbi_sbuf_puts(s, ";\n");
        } else {
            nbi_sbuf_printf(s, "            %s e%d = x%d[%s];\n", T, (int)x, (int)x, idx);
        }
    }
    for (int32_t i = 0; i < p->n_instr; i++) {
        nbx_instr(s, p, i);
    }
    for (int32_t k = 0; k < ins->n_store; k++) {
        if (ins->store[k] >= 0) {
            nbi_sbuf_printf(s, "            s%d[i] = r%d;\n", (int)k, (int)p->store[k]);
        }
    }
    int last = p->n_instr - 1;
    if (!red) {
        nbi_sbuf_printf(s, "            o[i] = r%d;\n", last);
    } else {
        const char *T = nbx_ctype(v->dtype);
        char comb[160];
        nbx_fold_comb(comb, sizeof comb, p->red_op, v->dtype, "acc", "t");
        nbi_sbuf_printf(s, "            %s t = r%d;\n", T, last);
        nbi_sbuf_printf(s, "            if (pos == 0) acc = t;\n            else { %s }\n", comb);
        nbi_sbuf_printf(s, "            if (++pos == %lld) { o[row++] = acc; pos = 0; }\n",
                        (long long)p->red_n);
    }
    if (simple) {
        nbi_sbuf_puts(s, "        }\n    }\n");
    } else {
        nbi_sbuf_puts(s, "            i++;\n        }\n");
        nbi_sbuf_puts(s, "        (void)i;\n    }\n");
    }
}

static void nbx_emit_fused(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins,
                           const nbi_fprog *p) {
    nbx_emit_fused_ex(s, e, ins, p, -1);
}

/* A standalone elementwise node (or a broadcast, as a copy) as a one-instruction program
 * over its own shape, when it has at most max elements: the same per-element code. */
static bool nbx_single_fill(const nb_var *v, nbi_fprog *p) {
    if (v->size <= 0) {
        return false;
    }
    bool map = nbi_is_map(v) && v->n_in >= 1 && v->n_in <= 3;
    bool bcast = v->op == NBI_OP_BROADCAST;
    if (!map && !bcast) {
        return false;
    }
    memset(p, 0, sizeof *p);
    p->n_instr = 1;
    p->n_ext = v->n_in;
    p->ins[0].op = bcast ? (uint16_t)NBI_OP_IDENTITY : v->op;
    p->ins[0].n_in = (uint8_t)v->n_in;
    p->ins[0].dtype = v->dtype;
    p->ins[0].in_dtype = v->in[0]->dtype;
    for (int32_t j = 0; j < v->n_in; j++) {
        p->ins[0].src[j] = (int16_t)(-j - 1);
    }
    p->map_rank = v->rank;
    memcpy(p->map_shape, v->shape, sizeof p->map_shape);
    return true;
}

static bool nbx_single_program_n(const nb_var *v, nbi_fprog *p, int64_t max) {
    return v->size <= max && nbx_single_fill(v, p) && nbx_instr_ok(&p->ins[0]) &&
           !(nbx_instr_vm(&p->ins[0]) && v->size > NBX_INLINE_VM_MAX);
}

static bool nbx_single_program(const nb_var *v, nbi_fprog *p) {
    return nbx_single_program_n(v, p, NBX_INLINE_MAX);
}

/* Is program p of node v one flat loop: no reduction, no padding, every input read at the
 * element's own index or as one value (nbx_emit_fused's simple case)? */
static bool nbx_prog_flat(const nb_var *v, const nbi_fprog *p) {
    if (p->red_op != 0 || p->pad_mask != 0) {
        return false;
    }
    int r = p->map_rank;
    for (int32_t x = 0; x < p->n_ext; x++) {
        int64_t st[NB_MAX_RANK];
        if ((p->view_mask >> x) & 1u) {
            memcpy(st, p->view_st[x], sizeof st);
        } else {
            nbi_bcast_strides(v->in[x]->rank, v->in[x]->shape, r, p->map_shape, st);
        }
        bool flat = true, zero = true;
        int64_t want = 1;
        for (int d = r - 1; d >= 0; d--) {
            flat = flat && (p->map_shape[d] == 1 || st[d] == want);
            zero = zero && (p->map_shape[d] == 1 || st[d] == 0);
            want *= p->map_shape[d];
        }
        if (!flat && !zero) {
            return false;
        }
    }
    return true;
}

/* A large program written out as well (NBX_BIG: a worker function over a range of
 * elements, split across the pool's threads when there is one): one flat loop with no
 * vector math, which the compiler vectorises -- every instruction in registers, one pass
 * over memory, where the kernel runs each instruction over a tile in turn. p: v's
 * program, or its single-op program. */
static bool nbx_big_ok(const nb_var *v, const nbi_fprog *p) {
    for (int32_t i = 0; i < p->n_instr; i++) {
        if (!nbx_instr_ok(&p->ins[i]) || nbx_instr_vm(&p->ins[i])) {
            return false;
        }
    }
    return nbx_prog_flat(v, p);
}

/* v's program when v is a large fused or standalone elementwise node written out by
 * nbx_big_ok's rule. */
static bool nbx_big_program(const nb_var *v, nbi_fprog *p) {
    if (v->op == NBI_OP_FUSED) {
        const nbi_fprog *q = v->at.callee;
        if (nbi_shape_size(q->map_rank, q->map_shape) <= NBX_INLINE_MAX || !nbx_big_ok(v, q)) {
            return false;
        }
        memcpy(p, q, offsetof(nbi_fprog, planned));
        return true;
    }
    return v->size > NBX_INLINE_MAX && nbx_single_program_n(v, p, INT64_MAX) && nbx_big_ok(v, p);
}

/* A standalone reduction (sum, max, min, prod over any axes) of a small array whose
 * written-out form is the kernel's: each output a left fold, from its first element, of
 * its reduced sequence (the input elements in row-major order over the reduced axes) --
 * float sums only below one pairwise block. */
static bool nbx_reduce_ok(const nb_var *v) {
    const nb_var *x = v->in[0];
    if (v->op != NBI_OP_SUM && v->op != NBI_OP_MAX && v->op != NBI_OP_MIN && v->op != NBI_OP_PROD) {
        return false;
    }
    if (x->size <= 0 || x->size > NBX_INLINE_MAX || v->size <= 0) {
        return false;
    }
    int64_t count = x->size / v->size;
    if (v->dtype != x->dtype || (v->dtype != NB_DTYPE_F32 && v->dtype != NB_DTYPE_F64 &&
                                 v->dtype != NB_DTYPE_I32 && v->dtype != NB_DTYPE_I64)) {
        return false;
    }
    return !(nbx_is_float(v->dtype) && v->op == NBI_OP_SUM && count >= 128);
}

static void nbx_emit_reduce(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins) {
    const nb_var *v = &e->nodes[ins->node], *x = v->in[0];
    bool red[NB_MAX_RANK] = {false}; /* at.axes: normalised, sorted; none is none */
    for (int a = 0; a < v->at.n_axes; a++) {
        int ax = v->at.axes[a] < 0 ? v->at.axes[a] + x->rank : v->at.axes[a];
        red[ax] = true;
    }
    int64_t st[NB_MAX_RANK], w = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        st[d] = w;
        w *= x->shape[d];
    }
    const char *T = nbx_ctype(v->dtype), *U = nbx_utype(v->dtype);
    bool fl = nbx_is_float(v->dtype);
    char xb[96], ob[96];
    nbx_value(e, ins->in[0], xb, sizeof xb);
    nbx_value(e, ins->node, ob, sizeof ob);
    nbi_sbuf_printf(s, "    {\n        const %s *x = (const %s *)%s;\n", T, T, xb);
    nbi_sbuf_printf(s, "        %s *o = (%s *)%s;\n        i64 q = 0;\n", T, T, ob);
    for (int d = 0; d < x->rank; d++) {
        if (!red[d]) {
            nbi_sbuf_printf(s, "        for (i64 i%d = 0; i%d < %lld; i%d++)\n", d, d,
                            (long long)x->shape[d], d);
        }
    }
    nbi_sbuf_printf(s, "        {\n            %s acc = 0;\n            int first = 1;\n", T);
    for (int d = 0; d < x->rank; d++) {
        if (red[d]) {
            nbi_sbuf_printf(s, "            for (i64 i%d = 0; i%d < %lld; i%d++)\n", d, d,
                            (long long)x->shape[d], d);
        }
    }
    nbi_sbuf_puts(s, "            {\n                ");
    nbi_sbuf_printf(s, "%s t = x[0", T);
    for (int d = 0; d < x->rank; d++) {
        if (x->shape[d] > 1) {
            nbi_sbuf_printf(s, " + i%d * %lld", d, (long long)st[d]);
        }
    }
    nbi_sbuf_puts(s,
                  "];\n                if (first) { acc = t; first = 0; }\n                else ");
    if (v->op == NBI_OP_PROD) {
        if (fl) {
            nbi_sbuf_puts(s, "acc = acc * t;\n");
        } else {
            nbi_sbuf_printf(s, "acc = (%s)((%s)acc * (%s)t);\n", T, U, U);
        }
    } else {
        char comb[160];
        nbx_fold_comb(comb, sizeof comb, v->op, v->dtype, "acc", "t");
        nbi_sbuf_printf(s, "{ %s }\n", comb);
    }
    nbi_sbuf_puts(s,
                  "            }\n            o[q++] = acc;\n        }\n        (void)q;\n    }\n");
}

/* Copies (reshape, stop_gradient, identity): the bytes, unless made in place. */
static bool nbx_is_copy(const nb_var *v) {
    return (v->op == NBI_OP_RESHAPE || v->op == NBI_OP_STOP_GRADIENT || v->op == NBI_OP_IDENTITY) &&
           v->n_in == 1 && v->dtype == v->in[0]->dtype && v->size == v->in[0]->size;
}

static void nbx_emit_copy(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins) {
    const nb_var *v = &e->nodes[ins->node];
    char xb[96], ob[96];
    nbx_value(e, ins->in[0], xb, sizeof xb);
    nbx_value(e, ins->node, ob, sizeof ob);
    size_t bytes = (size_t)v->size * nbi_dsize(v->dtype);
    if (bytes > 0) {
        nbi_sbuf_printf(s, "    if (%s != %s) __builtin_memmove(%s, %s, %zu);\n", ob, xb, ob, xb,
                        bytes);
    }
}

/* `i64 off`, the element offset in x of the block blk of a dynamic slice or update whose
 * start indices are v's inputs first.. (each clamped into range, as the kernels do) */
static void nbx_emit_block_off(nbi_sbuf *s, const nbi_exec *e, const nb_var *v, int first,
                               const nb_var *x, const nb_var *blk) {
    nbi_sbuf_puts(s, "        i64 off = 0;\n");
    int64_t st = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        char ib[96];
        nbx_value(e, v->in[first + d]->id, ib, sizeof ib);
        long long hi = (long long)(x->shape[d] - blk->shape[d]);
        nbi_sbuf_printf(s,
                        "        { i64 t = (i64)((const %s *)%s)[0]; t = t < 0 ? 0 : t > %lld ? "
                        "%lld : t; off += t * %lld; }\n",
                        nbx_ctype(v->in[first + d]->dtype), ib, hi, hi, (long long)st);
        st *= x->shape[d];
    }
}

/* An alias (nbi_exec's alias_of): A<node>, a pointer into its operand -- the same bytes for
 * a reshape, the block's first element for a dynamic slice (its start indices clamped into
 * range, as the kernel does; the block is contiguous). */
static void nbx_emit_alias(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins) {
    const nb_var *v = &e->nodes[ins->node], *x = v->in[0];
    char xb[96];
    nbx_value(e, ins->in[0], xb, sizeof xb);
    if (v->op == NBI_OP_RESHAPE) {
        nbi_sbuf_printf(s, "    u8 *A%d = %s;\n    (void)A%d;\n", (int)ins->node, xb,
                        (int)ins->node);
        return;
    }
    nbi_sbuf_printf(s, "    u8 *A%d;\n    {\n", (int)ins->node);
    nbx_emit_block_off(s, e, v, 1, x, v);
    nbi_sbuf_printf(s, "        A%d = %s + off * %zu;\n    }\n    (void)A%d;\n", (int)ins->node, xb,
                    nbi_dsize(v->dtype), (int)ins->node);
}

/* The unsigned type of an element of es bytes (copies move bits). */
static const char *nbx_bits(size_t es) {
    return es == 1 ? "u8" : es == 4 ? "u32" : "u64";
}

/* Small data movement written out: a call's output taken from its buffer, a slice, a
 * concatenation, a dynamic slice or update (start indices clamped into range, as the
 * kernels do). False: not this kind, or too large -- the kernel then. */
static bool nbx_emit_move(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins) {
    const nb_var *v = &e->nodes[ins->node];
    size_t es = nbi_dsize(v->dtype);
    if (v->size > NBX_INLINE_MAX || (es != 1 && es != 4 && es != 8)) {
        return false;
    }
    const char *B = nbx_bits(es);
    char ob[96], xb[96];
    nbx_value(e, ins->node, ob, sizeof ob);
    switch ((nbi_op)v->op) {
    case NBI_OP_CALL_OUTPUT:
        nbx_value(e, ins->in[0], xb, sizeof xb);
        if (v->size > 0) {
            nbi_sbuf_printf(s, "    __builtin_memcpy(%s, %s + %lld, %zu);\n", ob, xb,
                            (long long)v->at.a[0], (size_t)v->size * es);
        }
        return true;
    case NBI_OP_CONCAT: {
        int ax = v->at.axis < 0 ? v->at.axis + v->rank : v->at.axis;
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < ax; d++) {
            outer *= v->shape[d];
        }
        for (int d = ax + 1; d < v->rank; d++) {
            inner *= v->shape[d];
        }
        int64_t at = 0;
        for (int32_t j = 0; j < ins->n_in; j++) {
            const nb_var *x = v->in[j];
            if (x->dtype != v->dtype) {
                return false;
            }
        }
        nbi_sbuf_printf(s, "    {\n        %s *o = (%s *)%s;\n", B, B, ob);
        for (int32_t j = 0; j < ins->n_in; j++) {
            const nb_var *x = v->in[j];
            int64_t m = x->rank > ax ? x->shape[ax] : 1;
            if (m * inner * outer > 0) {
                nbx_value(e, ins->in[j], xb, sizeof xb);
                nbi_sbuf_printf(
                    s,
                    "        for (i64 q = 0; q < %lld; q++)\n"
                    "            for (i64 r = 0; r < %lld; r++)\n"
                    "                o[q * %lld + %lld + r] = ((const %s *)%s)[q * %lld + r];\n",
                    (long long)outer, (long long)(m * inner), (long long)(v->shape[ax] * inner),
                    (long long)(at * inner), B, xb, (long long)(m * inner));
            }
            at += m;
        }
        nbi_sbuf_puts(s, "    }\n");
        return true;
    }
    case NBI_OP_DYN_SLICE:
    case NBI_OP_DYN_UPDATE: {
        bool upd = v->op == NBI_OP_DYN_UPDATE;
        const nb_var *x = v->in[0], *blk = upd ? v->in[1] : v;
        int first = upd ? 2 : 1;
        if (nbi_dyn_lanes(v) || x->dtype != v->dtype || (upd && blk->dtype != v->dtype) ||
            x->size == 0) {
            return false;
        }
        for (int d = 0; d < x->rank; d++) {
            nb_dtype it = v->in[first + d]->dtype;
            if (it != NB_DTYPE_I32 && it != NB_DTYPE_I64) {
                return false;
            }
        }
        int64_t xst[NB_MAX_RANK], bst[NB_MAX_RANK], w = 1, w2 = 1;
        for (int d = x->rank - 1; d >= 0; d--) {
            xst[d] = w;
            w *= x->shape[d];
            bst[d] = w2;
            w2 *= blk->shape[d];
        }
        nbx_value(e, ins->in[0], xb, sizeof xb);
        nbi_sbuf_printf(s,
                        "    {\n        %s *o = (%s *)%s;\n        const %s *x = (const %s *)%s;\n",
                        B, B, ob, B, B, xb);
        if (upd) {
            nbi_sbuf_printf(
                s, "        if ((void *)o != (const void *)x) __builtin_memmove(o, x, %zu);\n",
                (size_t)v->size * es);
            char ub[96];
            nbx_value(e, ins->in[1], ub, sizeof ub);
            nbi_sbuf_printf(s, "        const %s *u = (const %s *)%s;\n", B, B, ub);
        }
        nbx_emit_block_off(s, e, v, first, x, blk);
        /* the block's rows: dims [c, rank) are contiguous in both (full from c + 1 on), one
         * copy of run elements each */
        int c = x->rank;
        int64_t run = 1;
        while (c > 0 && (c == x->rank || blk->shape[c] == x->shape[c])) {
            run *= blk->shape[--c];
        }
        if (blk->size > 0 && c < x->rank && run > 1) {
            for (int d = 0; d < c; d++) {
                nbi_sbuf_printf(s, "        for (i64 i%d = 0; i%d < %lld; i%d++)\n", d, d,
                                (long long)blk->shape[d], d);
            }
            nbi_sbuf_puts(s, "        {\n            i64 xo = off, bo = 0;\n");
            for (int d = 0; d < c; d++) {
                nbi_sbuf_printf(s, "            xo += i%d * %lld; bo += i%d * %lld;\n", d,
                                (long long)xst[d], d, (long long)bst[d]);
            }
            nbi_sbuf_printf(s,
                            upd ? "            __builtin_memmove(o + xo, u + bo, %zu);\n"
                                : "            __builtin_memmove(o + bo, x + xo, %zu);\n",
                            (size_t)run * es);
            nbi_sbuf_puts(s, "        }\n");
        } else if (blk->size > 0) {
            for (int d = 0; d < x->rank; d++) {
                nbi_sbuf_printf(s, "        for (i64 i%d = 0; i%d < %lld; i%d++)\n", d, d,
                                (long long)blk->shape[d], d);
            }
            nbi_sbuf_puts(s, "        {\n            i64 xo = off, bo = 0;\n");
            for (int d = 0; d < x->rank; d++) {
                nbi_sbuf_printf(s, "            xo += i%d * %lld; bo += i%d * %lld;\n", d,
                                (long long)xst[d], d, (long long)bst[d]);
            }
            nbi_sbuf_puts(s, upd ? "            o[xo] = u[bo];\n" : "            o[bo] = x[xo];\n");
            nbi_sbuf_puts(s, "        }\n");
        }
        nbi_sbuf_puts(s, "    }\n");
        return true;
    }
    default:
        return false;
    }
}

/* A slice as a one-instruction program reading a view (a copy through strides). */
static bool nbx_slice_program(const nb_var *v, nbi_fprog *p) {
    const nb_var *y = v->in[0];
    if (v->op != NBI_OP_SLICE || v->size <= 0 || v->size > NBX_INLINE_MAX || y->size <= 0) {
        return false;
    }
    memset(p, 0, sizeof *p);
    p->n_instr = 1;
    p->n_ext = 1;
    p->ins[0].op = (uint16_t)NBI_OP_IDENTITY;
    p->ins[0].n_in = 1;
    p->ins[0].dtype = v->dtype;
    p->ins[0].in_dtype = v->dtype;
    p->ins[0].src[0] = -1;
    p->map_rank = v->rank;
    memcpy(p->map_shape, v->shape, sizeof p->map_shape);
    p->view_mask = 1;
    int64_t ys = 1;
    for (int d = y->rank - 1; d >= 0; d--) {
        p->view_off[0] += v->at.a[d] * ys;
        p->view_st[0][d] = v->at.c[d] * ys;
        ys *= y->shape[d];
    }
    return true;
}

/* A kernel call's opening: a block and its input buffers, a[]. */
static void nbx_emit_args(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins) {
    char buf[96];
    nbi_sbuf_puts(s, "    {\n        const void *a[] = {");
    for (int32_t j = 0; j < ins->n_in; j++) {
        nbx_value(e, ins->in[j], buf, sizeof buf);
        nbi_sbuf_printf(s, "%s%s", j ? ", " : "", buf);
    }
    if (ins->n_in == 0) {
        nbi_sbuf_puts(s, "0");
    }
    nbi_sbuf_puts(s, "};\n");
}

/* Any other instruction: its kernel, called as the interpreter calls it. */
static void nbx_emit_call(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins) {
    char buf[96];
    nbx_emit_args(s, e, ins);
    if (ins->n_store > 0) {
        nbi_sbuf_puts(s, "        void *st[] = {");
        for (int32_t k = 0; k < ins->n_store; k++) {
            int32_t sn = ins->store[k];
            if (sn >= 0) {
                nbx_value(e, sn, buf, sizeof buf);
            } else {
                snprintf(buf, sizeof buf, "0");
            }
            nbi_sbuf_printf(s, "%s%s", k ? ", " : "", buf);
        }
        nbi_sbuf_puts(s, "};\n");
    }
    nbx_value(e, ins->node, buf, sizeof buf);
    nbi_sbuf_printf(s,
                    "        nbx_kargs k = {env->node[%d], %s, a, env->scratch, env->pool, "
                    "env->n_workers, %s};\n",
                    (int)ins->node, buf, ins->n_store > 0 ? "st" : "0");
    nbi_sbuf_printf(s, "        env->kern[%d](&k);\n    }\n", (int)ins->node);
}

/* The prelude: types, the environment's layout (native.c's nbi_native_env), helpers that
 * mirror the kernels' composite activations and conversions. */
static const char nbx_prelude[] =
    "typedef signed char i8;\n"
    "typedef int i32;\n"
    "typedef long long i64;\n"
    "typedef unsigned char u8;\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "typedef struct nbx_kargs {\n"
    "    const void *node; void *out; const void *const *in; void *scratch;\n"
    "    void *pool; int n_workers; void *const *outs;\n"
    "} nbx_kargs;\n"
    "typedef struct nbx_vmath {\n"
    "    const char *isa;\n"
    "    void (*f32[9])(float *, const float *, i64);\n"
    "    void (*f64[9])(double *, const double *, i64);\n"
    "    void (*pow_f32)(float *, const float *, const float *, i64);\n"
    "    void (*pow_f64)(double *, const double *, const double *, i64);\n"
    "} nbx_vmath;\n"
    "struct nbx_loop_fns;\n"
    "typedef struct nbx_env {\n"
    "    u8 *ws; void *scratch; void *pool; int n_workers;\n"
    "    const void *const *node; void (*const *kern)(const nbx_kargs *);\n"
    "    const nbx_vmath *vm;\n"
    "    void (*par)(void *pool, i64 n, i64 chunk, void (*fn)(void *, i64, i64, int), void *ud);\n"
    "    const struct nbx_env *sub;\n"
    "    const void *exec;\n"
    "    const _Bool *(*plan)(const void *exec, const void *const *in, void *const *out,\n"
    "                         const _Bool *donated, int *n_copy);\n"
    "    void (*copy)(const void *exec, void *const *out);\n"
    "    void (*loop_reverse)(const nbx_kargs *k, const struct nbx_loop_fns *f);\n"
    "} nbx_env;\n"
    "typedef struct nbx_loop_fns {\n"
    "    void (*fn[3])(const nbx_env *, const void *const *, void *const *, const _Bool *);\n"
    "    const nbx_env *env[3];\n"
    "    int replan;\n"
    "} nbx_loop_fns;\n"
    "static inline float nbx_vm1f(const nbx_vmath *vm, int f, float x) {\n"
    "    float o; vm->f32[f](&o, &x, 1); return o;\n"
    "}\n"
    "static inline double nbx_vm1d(const nbx_vmath *vm, int f, double x) {\n"
    "    double o; vm->f64[f](&o, &x, 1); return o;\n"
    "}\n"
    "static inline float nbx_powf(const nbx_vmath *vm, float x, float y) {\n"
    "    float o; vm->pow_f32(&o, &x, &y, 1); return o;\n"
    "}\n"
    "static inline double nbx_powd(const nbx_vmath *vm, double x, double y) {\n"
    "    double o; vm->pow_f64(&o, &x, &y, 1); return o;\n"
    "}\n"
    "#define NBX_ACT(T, S, ABS)                                                       \\\n"
    "static inline T nbx_sigmoid##S(const nbx_vmath *vm, T x) {                        \\\n"
    "    T u = nbx_vm1##S(vm, 0, -ABS(x));                                             \\\n"
    "    return (x >= 0 ? (T)1 : u) / ((T)1 + u);                                      \\\n"
    "}                                                                                 \\\n"
    "static inline T nbx_softplus##S(const nbx_vmath *vm, T x) {                       \\\n"
    "    T u = nbx_vm1##S(vm, 0, -ABS(x));                                             \\\n"
    "    T t = nbx_vm1##S(vm, 3, u);                                                   \\\n"
    "    return (x > 0 ? x : (T)0) + t;                                                \\\n"
    "}                                                                                 \\\n"
    "static inline T nbx_gelu##S(const nbx_vmath *vm, T x) {                           \\\n"
    "    T u = nbx_vm1##S(vm, 0, -ABS((T)1.5957691216057308 *                          \\\n"
    "                                 (x + (T)0.044715 * x * x * x)));                 \\\n"
    "    T z = x + (T)0.044715 * x * x * x;                                            \\\n"
    "    return x * ((z >= 0 ? (T)1 : u) / ((T)1 + u));                                 \\\n"
    "}\n"
    "NBX_ACT(float, f, __builtin_fabsf)\n"
    "NBX_ACT(double, d, __builtin_fabs)\n"
    "static inline i32 nbx_sat_i32_d(double d) {\n"
    "    return d != d ? 0 : d <= -2147483648.0 ? (i32)(-2147483647 - 1)\n"
    "         : d >= 2147483647.0 ? 2147483647 : (i32)d;\n"
    "}\n"
    "static inline i32 nbx_sat_i32_q(i64 q) {\n"
    "    return q < -2147483648ll ? (i32)(-2147483647 - 1) : q > 2147483647ll ? 2147483647 : "
    "(i32)q;\n"
    "}\n"
    "static inline i64 nbx_sat_i64_d(double d) {\n"
    "    return d != d ? 0 : d <= -9223372036854775808.0 ? (i64)(-9223372036854775807ll - 1)\n"
    "         : d >= 9223372036854775808.0 ? 9223372036854775807ll : (i64)d;\n"
    "}\n";

/* NABLA_NATIVE_CALLS=<mask> (debugging the generator): instructions of the kinds in mask
 * are kernel calls instead of written out -- 1 fused programs, 2 standalone elementwise
 * ops and broadcasts, 4 reductions, 8 slices, 16 copies, 32 other data movement, 128 large
 * flat programs (NBX_BIG), 256 while loops, 512 tiled programs (NBX_TILED), 1024 aliases
 * (a reshape or dynamic slice copied, not a pointer), 2048 rows written in place (a value a
 * dynamic_update_slice copies made in its slot and copied: nbx_rows); 64 keeps every value
 * in the workspace (no C locals). With 1 alone, every fused program is tiled. */
static unsigned nbx_calls_mask(void) {
    const char *m = getenv("NABLA_NATIVE_CALLS");
    return m != NULL ? (unsigned)strtoul(m, NULL, 0) : 0u;
}

/* How instruction t is written (the same decision the emitter makes). */
enum {
    NBX_CALL,
    NBX_FUSED,
    NBX_SINGLE,
    NBX_REDUCE,
    NBX_SLICE,
    NBX_COPY,
    NBX_MOVE,
    NBX_BIG,
    NBX_LOOP,
    NBX_TILED
};

static bool nbx_move_kind(const nbi_exec *e, const nbi_instr *ins) {
    char scratch[1];
    nbi_sbuf none = nbi_sbuf_make(scratch, 0);
    return nbx_emit_move(&none, e, ins); /* decides without writing (cap 0) */
}

/* In calls: no NBX_BIG (its worker functions are emitted from the kinds array, so without
 * one there are none). */
#define NBX_NO_BIG (1u << 30)

static bool nbx_tiled_program(const nb_var *v, nbi_fprog *p);

static int nbx_kind(const nbi_exec *e, const nbi_instr *ins, unsigned calls) {
    const nb_var *v = &e->nodes[ins->node];
    nbi_fprog single;
    if (!(calls & 1) && v->op == NBI_OP_FUSED && nbx_fused_inline(v)) {
        return NBX_FUSED;
    }
    if (!(calls & 2) && nbx_single_program(v, &single)) {
        return NBX_SINGLE;
    }
    if (!(calls & 4) && nbx_reduce_ok(v)) {
        return NBX_REDUCE;
    }
    if (!(calls & 8) && nbx_slice_program(v, &single)) {
        return NBX_SLICE;
    }
    if (!(calls & 16) && nbx_is_copy(v)) {
        return NBX_COPY;
    }
    if (!(calls & 32) && nbx_move_kind(e, ins)) {
        return NBX_MOVE;
    }
    if (!(calls & 128) && !(calls & NBX_NO_BIG) && nbx_big_program(v, &single)) {
        return NBX_BIG;
    }
    if (!(calls & 512) && !(calls & NBX_NO_BIG) && nbx_tiled_program(v, &single)) {
        return NBX_TILED;
    }
    return NBX_CALL;
}

/* Elements per task when a pool splits a large written-out program (fixed by the data, not
 * by the thread count; elementwise, so any split gives the same bits). */
#define NBX_BIG_CHUNK 16384

/* A large flat program (NBX_BIG): its worker nbx_w<t> over every element, on this thread
 * without a pool, split across the pool's threads with one. */
static void nbx_emit_big(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins, int32_t t) {
    const nb_var *v = &e->nodes[ins->node];
    nbi_fprog big;
    nbx_big_program(v, &big);
    char buf[96];
    nbi_sbuf_puts(s, "    {\n        void *p[] = {");
    for (int32_t x = 0; x < big.n_ext; x++) {
        nbx_value(e, ins->in[x], buf, sizeof buf);
        nbi_sbuf_printf(s, "(void *)%s, ", buf);
    }
    nbx_value(e, ins->node, buf, sizeof buf);
    nbi_sbuf_printf(s, "(void *)%s", buf);
    for (int32_t k = 0; k < ins->n_store; k++) {
        if (ins->store[k] >= 0) {
            nbx_value(e, ins->store[k], buf, sizeof buf);
            nbi_sbuf_printf(s, ", (void *)%s", buf);
        } else {
            nbi_sbuf_puts(s, ", 0");
        }
    }
    long long total = (long long)nbi_shape_size(big.map_rank, big.map_shape);
    nbi_sbuf_printf(s,
                    "};\n"
                    "        if (env->pool == 0)\n            nbx_w%d_%d(p, 0, %lld, 0);\n"
                    "        else\n            env->par(env->pool, %lld, %d, nbx_w%d_%d, p);\n"
                    "    }\n",
                    nbx_fn_id, (int)t, total, total, NBX_BIG_CHUNK, nbx_fn_id, (int)t);
}

/* ---- tiled programs --------------------------------------------------------------------- */

/* A fused program that neither of the above writes out -- it calls vector math on more than
 * NBX_INLINE_VM_MAX elements, or is large with a reduction or inputs read at other indices
 * (a broadcast along an inner dim: softmax's max and sum) -- is written out tiled
 * (NBX_TILED): a worker nbx_w<t> over rows of its index space. A row is the block of its
 * innermost dims of at most NBX_TILE elements (or, when that block is tiny, the innermost
 * dims with the next one, cut into tiles of NBX_TILE). Per tile, each input is a pointer
 * (read at the element's own index), one value (constant along the row) or a local array
 * gathered at its strides; the instructions run in segments -- a vectorised loop over the
 * tile for each run of C expressions, one call of the vector function over the tile for each
 * transcendental (SLEEF's bits for any split: vmath.h) -- on local arrays; the output and
 * stores are written in the last loop (after every read of the tile: an output shares a
 * buffer with an input only at the same index); a reduction folds each output from its
 * first element, as the kernel does (float sums below one pairwise block). So the same bits
 * as the interpreter, which runs the same instructions over its own tiles. Rows split
 * across the pool's threads in whole outputs. */
#define NBX_TILE 512
/* At most this many bytes of local arrays in a tiled worker (nbx_tiled_ok). */
#define NBX_TILE_STACK (160 * 1024)
/* Tiled folds of one output per row: this many rows' values kept for one fold. */
#define NBX_FOLD_GROUP 4

typedef struct nbx_tiling {
    int k;           /* the row: dims [k, r) of the map shape */
    int64_t n_in;    /* its elements */
    int64_t n_outer; /* rows */
    int64_t unit;    /* rows per task unit when split (whole outputs); 0: not split */
} nbx_tiling;

static void nbx_tiling_of(const nbi_fprog *p, nbx_tiling *t) {
    int r = p->map_rank, k = r;
    int64_t n = 1;
    while (k > 0 && n * p->map_shape[k - 1] <= NBX_TILE) {
        n *= p->map_shape[--k];
    }
    if (k > 0 && n < NBX_TILE / 8) { /* a tiny row: take the next dim too, tiled */
        n *= p->map_shape[--k];
    }
    t->k = k;
    t->n_in = n;
    t->n_outer = nbi_shape_size(r, p->map_shape) / (n > 0 ? n : 1);
    t->unit = 1;
    if (p->red_op != 0) {
        t->unit = n % p->red_n == 0 ? 1 : p->red_n % n == 0 ? p->red_n / n : 0;
    }
}

static bool nbx_tiled_ok(const nb_var *v, const nbi_fprog *p) {
    int64_t size = nbi_shape_size(p->map_rank, p->map_shape);
    if (size <= 0 || p->pad_mask != 0 || p->map_rank < 1) {
        return false;
    }
    /* one row over a large array would run on one thread, where the kernel splits it */
    nbx_tiling tl;
    nbx_tiling_of(p, &tl);
    if (tl.n_outer < 2 && size > 2 * NBX_BIG_CHUNK) {
        return false;
    }
    /* the worker's local arrays (at most: every register, two more per activation, a
     * gathered copy and a constant's per input, the fold's rows) stay within
     * NBX_TILE_STACK bytes of stack */
    int64_t arrays = p->n_instr + 2 * p->n_ext;
    for (int32_t i = 0; i < p->n_instr; i++) {
        if (!nbx_instr_ok(&p->ins[i])) {
            return false;
        }
        arrays += nbx_instr_vm(&p->ins[i]) ? 2 : 0;
    }
    return (arrays + NBX_FOLD_GROUP) * NBX_TILE * 8 <= NBX_TILE_STACK && nbx_red_ok(v, p);
}

/* v's program when v is written out tiled: a fused program by nbx_tiled_ok's rule, or a
 * standalone elementwise op calling vector math on more than NBX_INLINE_VM_MAX elements. */
static bool nbx_tiled_program(const nb_var *v, nbi_fprog *p) {
    if (v->op == NBI_OP_FUSED) {
        const nbi_fprog *q = v->at.callee;
        if (!nbx_tiled_ok(v, q)) {
            return false;
        }
        memcpy(p, q, offsetof(nbi_fprog, planned));
        return true;
    }
    return v->op != NBI_OP_BROADCAST && v->size > NBX_INLINE_VM_MAX && nbx_single_fill(v, p) &&
           nbx_instr_vm(&p->ins[0]) && nbx_tiled_ok(v, p);
}

/* How a tiled program reads external input x along the row. */
enum { NBX_TX_FLAT, NBX_TX_CONST, NBX_TX_GATHER };

/* The element text of operand src at tile index j. */
static void nbx_tile_operand(char *buf, size_t cap, int16_t src, const int *how) {
    if (src >= 0) {
        snprintf(buf, cap, "R%d[j]", (int)src);
    } else if (how[-src - 1] == NBX_TX_CONST) {
        snprintf(buf, cap, "e%d", (int)(-src - 1));
    } else {
        snprintf(buf, cap, "X%d[j]", (int)(-src - 1));
    }
}

/* The array text of operand src (a vector-math argument): a register's array, an input's
 * pointer or gathered array, or K<x>, a constant input spread over the tile. */
static void nbx_tile_array(char *buf, size_t cap, int16_t src, const int *how) {
    if (src >= 0) {
        snprintf(buf, cap, "R%d", (int)src);
    } else if (how[-src - 1] == NBX_TX_CONST) {
        snprintf(buf, cap, "K%d", (int)(-src - 1));
    } else {
        snprintf(buf, cap, "X%d", (int)(-src - 1));
    }
}

static void nbx_emit_tiled_worker(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins,
                                  const nbi_fprog *p, int32_t t) {
    const nb_var *v = &e->nodes[ins->node];
    int r = p->map_rank;
    const int64_t *shape = p->map_shape;
    nbx_tiling tl;
    nbx_tiling_of(p, &tl);
    int k = tl.k;
    bool one_tile = tl.n_in <= NBX_TILE, red = p->red_op != 0;
    int last = p->n_instr - 1;
    nbi_sbuf_printf(s,
                    "static void nbx_w%d_%d(void *ud, i64 first, i64 count, int worker) {\n"
                    "    void *const *p = (void *const *)ud;\n    (void)worker;\n",
                    nbx_fn_id, (int)t);
    /* inputs: strides in elements, how each is read along the row */
    int64_t st[NBI_FUSE_MAX_EXT][NB_MAX_RANK];
    int64_t off[NBI_FUSE_MAX_EXT];
    int how[NBI_FUSE_MAX_EXT];
    int inner_dims = 0; /* non-unit dims of the row */
    for (int d = k; d < r; d++) {
        inner_dims += shape[d] > 1;
    }
    for (int32_t x = 0; x < p->n_ext; x++) {
        const nb_var *in = v->in[x];
        bool view = (p->view_mask >> x) & 1u;
        off[x] = view ? p->view_off[x] : 0;
        if (view) {
            memcpy(st[x], p->view_st[x], sizeof st[x]);
        } else {
            nbi_bcast_strides(in->rank, in->shape, r, shape, st[x]);
        }
        bool flat = true, zero = true;
        int64_t want = 1;
        for (int d = r - 1; d >= k; d--) {
            flat = flat && (shape[d] == 1 || st[x][d] == want);
            zero = zero && (shape[d] == 1 || st[x][d] == 0);
            want *= shape[d];
        }
        how[x] = zero ? NBX_TX_CONST : flat ? NBX_TX_FLAT : NBX_TX_GATHER;
        const char *T = nbx_ctype(in->dtype);
        nbi_sbuf_printf(s, "    const %s *x%d = (const %s *)p[%d];\n", T, (int)x, T, (int)x);
    }
    const char *TO = nbx_ctype(v->dtype);
    nbi_sbuf_printf(s, "    %s *o = (%s *)p[%d];\n", TO, TO, (int)p->n_ext);
    for (int32_t q = 0; q < ins->n_store; q++) {
        if (ins->store[q] >= 0) {
            const char *T = nbx_ctype(p->ins[p->store[q]].dtype);
            nbi_sbuf_printf(s, "    %s *s%d = (%s *)p[%d];\n", T, (int)q, T,
                            (int)(p->n_ext + 1 + q));
        }
    }
    nbi_sbuf_printf(s, "    const nbx_vmath *vm = (const nbx_vmath *)p[%d];\n    (void)vm;\n",
                    (int)(p->n_ext + 1 + ins->n_store));
    /* segments: runs of C expressions, and each vector-math instruction alone; seg[i] */
    int seg[NBI_FUSE_MAX_INSTR];
    int n_seg = 0;
    for (int32_t i = 0; i < p->n_instr; i++) {
        bool vmi = nbx_instr_vm(&p->ins[i]);
        if (i == 0 || vmi || nbx_instr_vm(&p->ins[i - 1])) {
            n_seg++;
        }
        seg[i] = n_seg - 1;
    }
    /* which registers live in arrays: read in a later segment or by vector math, a vector
     * math result, stored from an earlier segment, or folded */
    bool arr[NBI_FUSE_MAX_INSTR] = {false};
    bool cst_arr[NBI_FUSE_MAX_EXT] = {false}; /* K<x>: a constant input as a vm argument */
    for (int32_t i = 0; i < p->n_instr; i++) {
        const nbi_finstr *in = &p->ins[i];
        bool vmi = nbx_instr_vm(in);
        arr[i] = arr[i] || vmi;
        for (int a = 0; a < in->n_in; a++) {
            int16_t src = in->src[a];
            if (src >= 0 && (seg[src] != seg[i] || vmi)) {
                arr[src] = true;
            }
            if (src < 0 && vmi && how[-src - 1] == NBX_TX_CONST &&
                (nbx_vm_index((nbi_op)in->op) >= 0 || in->op == NBI_OP_POW)) {
                cst_arr[-src - 1] = true;
            }
        }
    }
    for (int32_t q = 0; q < ins->n_store; q++) {
        if (ins->store[q] >= 0 && seg[p->store[q]] != seg[last]) {
            arr[p->store[q]] = true;
        }
    }
    bool last_vm = nbx_instr_vm(&p->ins[last]);
    if (red || last_vm) {
        arr[last] = true;
    }
    /* a fold of whole outputs in each row: the folded values of up to NBX_FOLD_GROUP rows
     * side by side (RB), folded four outputs at a time (independent chains) */
    bool whole = red && one_tile && tl.n_in % p->red_n == 0;
    int group = whole && tl.n_in / p->red_n < 4 ? NBX_FOLD_GROUP : 1;
    for (int32_t i = 0; i < p->n_instr; i++) {
        if (arr[i] && !(whole && i == last)) {
            nbi_sbuf_printf(s, "    %s R%d[%d];\n", nbx_ctype(p->ins[i].dtype), (int)i, NBX_TILE);
        } else if (arr[i]) {
            nbi_sbuf_printf(s, "    %s RB[%lld];\n", TO, (long long)(group * tl.n_in));
        }
        if (nbx_instr_vm(&p->ins[i]) && nbx_vm_index((nbi_op)p->ins[i].op) < 0 &&
            p->ins[i].op != NBI_OP_POW) { /* sigmoid, softplus, gelu: exp(-|.|), log1p */
            const char *T = nbx_ctype(p->ins[i].dtype);
            nbi_sbuf_printf(s, "    %s U%d[%d], V%d[%d];\n", T, (int)i, NBX_TILE, (int)i, NBX_TILE);
        }
    }
    for (int32_t x = 0; x < p->n_ext; x++) {
        const char *T = nbx_ctype(v->in[x]->dtype);
        if (how[x] == NBX_TX_GATHER) {
            nbi_sbuf_printf(s, "    %s X%d[%d];\n", T, (int)x, NBX_TILE);
        }
        if (cst_arr[x]) {
            nbi_sbuf_printf(s, "    %s K%d[%d];\n", T, (int)x, NBX_TILE);
        }
    }
    if (red) {
        nbi_sbuf_printf(s,
                        "    %s acc = 0;\n    i64 pos = 0, row = first * %lldll / %lldll;\n"
                        "    (void)acc; (void)pos;\n",
                        TO, (long long)tl.n_in, (long long)p->red_n);
    }
    /* the rows */
    nbi_sbuf_puts(s, "    for (i64 q = first; q < first + count; q++) {\n");
    nbi_sbuf_puts(s, "        i64 c = q;\n        (void)c;\n");
    for (int d = k - 1; d >= 0; d--) {
        if (shape[d] > 1) {
            nbi_sbuf_printf(s, "        const i64 a%d = c %% %lld;\n        c /= %lld;\n", d,
                            (long long)shape[d], (long long)shape[d]);
        }
    }
    for (int32_t x = 0; x < p->n_ext; x++) {
        nbi_sbuf_printf(s, "        const i64 b%d = %lld", (int)x, (long long)off[x]);
        for (int d = 0; d < k; d++) {
            if (shape[d] > 1 && st[x][d] != 0) {
                nbi_sbuf_printf(s, " + a%d * %lld", d, (long long)st[x][d]);
            }
        }
        nbi_sbuf_puts(s, ";\n");
    }
    if (one_tile) {
        nbi_sbuf_printf(s, "        {\n        const i64 t0 = 0, n = %lld;\n        (void)t0;\n",
                        (long long)tl.n_in);
        if (whole) {
            nbi_sbuf_printf(s, "        %s *const R%d = RB + (q - first) %% %d * %lld;\n", TO,
                            (int)last, group, (long long)tl.n_in);
        }
    } else {
        nbi_sbuf_printf(s,
                        "        for (i64 t0 = 0; t0 < %lld; t0 += %d) {\n"
                        "        const i64 n = %lld - t0 < %d ? %lld - t0 : %d;\n",
                        (long long)tl.n_in, NBX_TILE, (long long)tl.n_in, NBX_TILE,
                        (long long)tl.n_in, NBX_TILE);
    }
    /* inputs of the tile */
    for (int32_t x = 0; x < p->n_ext; x++) {
        const char *T = nbx_ctype(v->in[x]->dtype);
        if (how[x] == NBX_TX_CONST) {
            nbi_sbuf_printf(s, "        const %s e%d = x%d[b%d];\n", T, (int)x, (int)x, (int)x);
            if (cst_arr[x]) {
                nbi_sbuf_printf(s, "        for (i64 j = 0; j < n; j++) K%d[j] = e%d;\n", (int)x,
                                (int)x);
            }
        } else if (how[x] == NBX_TX_FLAT) {
            nbi_sbuf_printf(s, "        const %s *X%d = x%d + b%d + t0;\n", T, (int)x, (int)x,
                            (int)x);
        } else if (inner_dims == 1) { /* strided along the row's one dim */
            int64_t sd = 0;
            for (int d = k; d < r; d++) {
                sd = shape[d] > 1 ? st[x][d] : sd;
            }
            nbi_sbuf_printf(s,
                            "        for (i64 j = 0; j < n; j++) X%d[j] = x%d[b%d + (t0 + j) * "
                            "%lld];\n",
                            (int)x, (int)x, (int)x, (long long)sd);
        } else { /* an odometer over the row's dims from t0 */
            nbi_sbuf_puts(s, "        {\n            i64 m = t0;\n            (void)m;\n");
            for (int d = r - 1; d >= k; d--) {
                if (shape[d] > 1) {
                    nbi_sbuf_printf(s, "            i64 c%d = m %% %lld;\n            m /= %lld;\n",
                                    d, (long long)shape[d], (long long)shape[d]);
                }
            }
            nbi_sbuf_printf(s,
                            "            for (i64 j = 0; j < n; j++) {\n"
                            "                X%d[j] = x%d[b%d",
                            (int)x, (int)x, (int)x);
            for (int d = k; d < r; d++) {
                if (shape[d] > 1) {
                    nbi_sbuf_printf(s, " + c%d * %lld", d, (long long)st[x][d]);
                }
            }
            nbi_sbuf_puts(s, "];\n");
            /* the odometer: innermost first */
            int depth = 0;
            for (int d = r - 1; d >= k; d--) {
                if (shape[d] > 1) {
                    nbi_sbuf_printf(s, "                if (++c%d == %lld) { c%d = 0;\n", d,
                                    (long long)shape[d], d);
                    depth++;
                }
            }
            nbi_sbuf_puts(s, "                ");
            for (int q = 0; q < depth; q++) {
                nbi_sbuf_puts(s, "}");
            }
            nbi_sbuf_puts(s, "\n            }\n        }\n");
        }
    }
    /* the segments */
    char xa[32], xb[32];
    for (int g = 0; g < n_seg; g++) {
        int32_t i0 = 0, i1 = 0;
        while (seg[i0] != g) {
            i0++;
        }
        for (i1 = i0; i1 < p->n_instr && seg[i1] == g; i1++) {
        }
        const nbi_finstr *in = &p->ins[i0];
        if (nbx_instr_vm(in)) {
            bool f32 = in->dtype == NB_DTYPE_F32;
            const char *T = nbx_ctype(in->dtype), *sfx = f32 ? "32" : "64";
            const char *ABS = f32 ? "__builtin_fabsf" : "__builtin_fabs";
            int f = nbx_vm_index((nbi_op)in->op);
            nbx_tile_array(xa, sizeof xa, in->src[0], how);
            if (f >= 0) {
                nbi_sbuf_printf(s, "        vm->f%s[%d](R%d, %s, n);\n", sfx, f, (int)i0, xa);
                continue;
            }
            if (in->op == NBI_OP_POW) {
                nbx_tile_array(xb, sizeof xb, in->src[1], how);
                nbi_sbuf_printf(s, "        vm->pow_f%s(R%d, %s, %s, n);\n", sfx, (int)i0, xa, xb);
                continue;
            }
            nbx_tile_operand(xa, sizeof xa, in->src[0], how);
            /* as nbx_sigmoid/softplus/gelu, over the tile */
            if (in->op == NBI_OP_GELU) {
                nbi_sbuf_printf(s,
                                "        for (i64 j = 0; j < n; j++) { %s x = %s; U%d[j] = -%s((%s)"
                                "1.5957691216057308 * (x + (%s)0.044715 * x * x * x)); }\n",
                                T, xa, (int)i0, ABS, T, T);
            } else {
                nbi_sbuf_printf(s, "        for (i64 j = 0; j < n; j++) U%d[j] = -%s(%s);\n",
                                (int)i0, ABS, xa);
            }
            nbi_sbuf_printf(s, "        vm->f%s[0](U%d, U%d, n);\n", sfx, (int)i0, (int)i0);
            if (in->op == NBI_OP_SIGMOID) {
                nbi_sbuf_printf(s,
                                "        for (i64 j = 0; j < n; j++) R%d[j] = (%s >= 0 ? (%s)1 : "
                                "U%d[j]) / ((%s)1 + U%d[j]);\n",
                                (int)i0, xa, T, (int)i0, T, (int)i0);
            } else if (in->op == NBI_OP_SOFTPLUS) {
                nbi_sbuf_printf(s, "        vm->f%s[3](V%d, U%d, n);\n", sfx, (int)i0, (int)i0);
                nbi_sbuf_printf(s,
                                "        for (i64 j = 0; j < n; j++) R%d[j] = (%s > 0 ? %s : (%s)0)"
                                " + V%d[j];\n",
                                (int)i0, xa, xa, T, (int)i0);
            } else {
                nbi_sbuf_printf(s,
                                "        for (i64 j = 0; j < n; j++) { %s x = %s; %s z = x + (%s)"
                                "0.044715 * x * x * x; R%d[j] = x * ((z >= 0 ? (%s)1 : U%d[j]) / "
                                "((%s)1 + U%d[j])); }\n",
                                T, xa, T, T, (int)i0, T, (int)i0, T, (int)i0);
            }
            continue;
        }
        /* a run of C expressions: one loop; the writes in the last one */
        bool final = g == seg[last];
        bool used_x[NBI_FUSE_MAX_EXT] = {false}, used_r[NBI_FUSE_MAX_INSTR] = {false};
        for (int32_t i = i0; i < i1; i++) {
            for (int a = 0; a < p->ins[i].n_in; a++) {
                int16_t src = p->ins[i].src[a];
                if (src < 0) {
                    used_x[-src - 1] = true;
                } else if (src < i0) {
                    used_r[src] = true;
                }
            }
        }
        if (final) {
            for (int32_t q = 0; q < ins->n_store; q++) {
                if (ins->store[q] >= 0 && p->store[q] < i0) {
                    used_r[p->store[q]] = true;
                }
            }
        }
        nbi_sbuf_puts(s, "#pragma GCC ivdep\n        for (i64 j = 0; j < n; j++) {\n");
        for (int32_t x = 0; x < p->n_ext; x++) {
            if (used_x[x] && how[x] != NBX_TX_CONST) {
                const char *T = nbx_ctype(v->in[x]->dtype);
                nbi_sbuf_printf(s, "            %s e%d = X%d[j];\n", T, (int)x, (int)x);
            }
        }
        for (int32_t i = 0; i < i0; i++) {
            if (used_r[i]) {
                nbi_sbuf_printf(s, "            %s r%d = R%d[j];\n", nbx_ctype(p->ins[i].dtype),
                                (int)i, (int)i);
            }
        }
        for (int32_t i = i0; i < i1; i++) {
            nbx_instr(s, p, i);
            if (arr[i]) {
                nbi_sbuf_printf(s, "            R%d[j] = r%d;\n", (int)i, (int)i);
            }
        }
        if (final) {
            for (int32_t q = 0; q < ins->n_store; q++) {
                if (ins->store[q] >= 0) {
                    nbi_sbuf_printf(s, "            s%d[q * %lldll + t0 + j] = r%d;\n", (int)q,
                                    (long long)tl.n_in, (int)p->store[q]);
                }
            }
            if (!red) {
                nbi_sbuf_printf(s, "            o[q * %lldll + t0 + j] = r%d;\n",
                                (long long)tl.n_in, (int)last);
            }
        }
        nbi_sbuf_puts(s, "        }\n");
    }
    if (last_vm && (!red || ins->n_store > 0)) { /* the writes after the last vm call */
        nbi_sbuf_puts(s, "        for (i64 j = 0; j < n; j++) {\n");
        for (int32_t q = 0; q < ins->n_store; q++) {
            if (ins->store[q] >= 0) {
                nbi_sbuf_printf(s, "            s%d[q * %lldll + t0 + j] = R%d[j];\n", (int)q,
                                (long long)tl.n_in, (int)p->store[q]);
            }
        }
        if (!red) {
            nbi_sbuf_printf(s, "            o[q * %lldll + t0 + j] = R%d[j];\n", (long long)tl.n_in,
                            (int)last);
        }
        nbi_sbuf_puts(s, "        }\n");
    }
    if (red) { /* each output a left fold from its first element */
        char comb[160];
        nbx_fold_comb(comb, sizeof comb, p->red_op, v->dtype, "acc", "t");
        if (whole) { /* the group's outputs, four chains at a time, then one by one */
            long long rn = (long long)p->red_n;
            char c4[4][160];
            for (int u = 0; u < 4; u++) {
                char a[8], tt[8];
                snprintf(a, sizeof a, "a%d", u);
                snprintf(tt, sizeof tt, "t%d", u);
                nbx_fold_comb(c4[u], sizeof c4[u], p->red_op, v->dtype, a, tt);
            }
            nbi_sbuf_printf(
                s,
                "        if ((q - first) %% %d == %d || q == first + count - 1) {\n"
                "            const i64 nout = ((q - first) %% %d + 1) * %lld;\n"
                "            i64 g = 0;\n"
                "            for (; g + 4 <= nout; g += 4) {\n"
                "                const %s *B = RB + g * %lld;\n"
                "                %s a0 = B[0], a1 = B[%lld], a2 = B[%lld], a3 = B[%lld];\n"
                "                for (i64 m = 1; m < %lld; m++) {\n"
                "                    %s t0 = B[m], t1 = B[%lld + m], t2 = B[%lld + m], "
                "t3 = B[%lld + m];\n"
                "                    %s\n                    %s\n"
                "                    %s\n                    %s\n"
                "                }\n"
                "                o[row] = a0; o[row + 1] = a1; o[row + 2] = a2; "
                "o[row + 3] = a3;\n"
                "                row += 4;\n"
                "            }\n"
                "            for (; g < nout; g++) {\n"
                "                acc = RB[g * %lld];\n"
                "                for (i64 m = 1; m < %lld; m++) {\n"
                "                    %s t = RB[g * %lld + m];\n"
                "                    %s\n                }\n"
                "                o[row++] = acc;\n            }\n        }\n",
                group, group - 1, group, (long long)(tl.n_in / p->red_n), TO, rn, TO, rn, 2 * rn,
                3 * rn, rn, TO, rn, 2 * rn, 3 * rn, c4[0], c4[1], c4[2], c4[3], rn, rn, TO, rn,
                comb);
        } else {
            nbi_sbuf_printf(s,
                            "        for (i64 j = 0; j < n; j++) {\n"
                            "            %s t = R%d[j];\n"
                            "            if (pos == 0) acc = t;\n            else { %s }\n"
                            "            if (++pos == %lld) { o[row++] = acc; pos = 0; }\n"
                            "        }\n",
                            TO, (int)last, comb, (long long)p->red_n);
        }
    }
    nbi_sbuf_puts(s, "        }\n    }\n}\n");
}

/* Rows per task when a pool splits a tiled program: about NBX_BIG_CHUNK elements, in whole
 * outputs (fixed by the shapes, not by the thread count: each output the same fold). */
static void nbx_emit_tiled(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins, int32_t t) {
    const nb_var *v = &e->nodes[ins->node];
    nbi_fprog prog;
    nbx_tiled_program(v, &prog);
    const nbi_fprog *p = &prog;
    nbx_tiling tl;
    nbx_tiling_of(p, &tl);
    char buf[96];
    nbi_sbuf_puts(s, "    {\n        void *p[] = {");
    for (int32_t x = 0; x < p->n_ext; x++) {
        nbx_value(e, ins->in[x], buf, sizeof buf);
        nbi_sbuf_printf(s, "(void *)%s, ", buf);
    }
    nbx_value(e, ins->node, buf, sizeof buf);
    nbi_sbuf_printf(s, "(void *)%s", buf);
    for (int32_t k = 0; k < ins->n_store; k++) {
        if (ins->store[k] >= 0) {
            nbx_value(e, ins->store[k], buf, sizeof buf);
            nbi_sbuf_printf(s, ", (void *)%s", buf);
        } else {
            nbi_sbuf_puts(s, ", 0");
        }
    }
    nbi_sbuf_puts(s, ", (void *)vm};\n");
    int64_t chunk = 0;
    if (tl.unit > 0 && tl.n_outer > tl.unit) {
        int64_t rows = (NBX_BIG_CHUNK + tl.n_in - 1) / tl.n_in;
        chunk = (rows + tl.unit - 1) / tl.unit * tl.unit;
    }
    if (chunk > 0 && chunk < tl.n_outer) {
        nbi_sbuf_printf(s,
                        "        if (env->pool == 0)\n            nbx_w%d_%d(p, 0, %lld, 0);\n"
                        "        else\n            env->par(env->pool, %lld, %lld, nbx_w%d_%d, "
                        "p);\n    }\n",
                        nbx_fn_id, (int)t, (long long)tl.n_outer, (long long)tl.n_outer,
                        (long long)chunk, nbx_fn_id, (int)t);
    } else {
        nbi_sbuf_printf(s, "        nbx_w%d_%d(p, 0, %lld, 0);\n    }\n", nbx_fn_id, (int)t,
                        (long long)tl.n_outer);
    }
}

/* Locals: at most this many elements (a state vector of an ODE, a scalar of a controller). */
#define NBX_PROMOTE_MAX 16

/* Has loop function k (a loop body with a loop-invariant prefix: nbi_exec_run_step) a second
 * function nbx_f<k>_r, its instructions after the prefix, for the steps after the first? */
static bool nbx_has_rest(const nbi_exec *x) {
    return nbi_exec_n_pre(x) > 0;
}

/* ---- loops as C loops ------------------------------------------------------------------- */

/* Loops are written out (their cond and body as functions of this file) while the whole file
 * stays below this many instructions (and has at most NBI_NATIVE_MAX_SUBS such functions). */
#define NBX_INLINE_INSTRS 3000

/* Loop node v's executables in the order its functions are listed (a while: cond, body; a
 * checkpointed reversal: cond, body, step vjp) into g: their count, 0 for any other node. */
static int nbx_loop_group(const nb_var *v, const nbi_exec **g) {
    int ng = 0;
    if (v->op == NBI_OP_WHILE) {
        g[0] = v->at.callee2;
        g[1] = v->at.callee;
        ng = 2;
    } else if (v->op == NBI_OP_LOOP_REVERSE) {
        g[0] = v->at.callee2;
        g[1] = v->at.callee3;
        g[2] = v->at.callee;
        ng = 3;
    }
    for (int q = 0; q < ng; q++) {
        if (g[q] == NULL) {
            return 0;
        }
    }
    return ng;
}

/* Where group g (ng executables) starts in list (n entries), or -1. */
static int32_t nbx_group_find(const nbi_exec *const *list, int32_t n, const nbi_exec *const *g,
                              int ng) {
    for (int32_t k = 0; k + ng <= n; k++) {
        int q = 0;
        while (q < ng && list[k + q] == g[q]) {
            q++;
        }
        if (q == ng) {
            return k;
        }
    }
    return -1;
}

typedef struct nbx_sublist {
    const nbi_exec *x[NBI_NATIVE_MAX_SUBS];
    int32_t n;
    int64_t instrs;
    bool over; /* too many functions, instructions or levels: no loop is written out */
} nbx_sublist;

/* e's loops' groups, each once and whole (reversals first: the forward while of the same
 * loop shares their cond and body), then, after all of them, the loops inside each. */
static void nbx_subs_rec(nbx_sublist *L, const nbi_exec *e, int depth) {
    if (L->over) {
        return;
    }
    int32_t first = L->n;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t t = 0; t < e->n_instrs; t++) {
            const nbi_exec *g[3];
            int ng = nbx_loop_group(&e->nodes[e->instrs[t].node], g);
            if (ng == 0 || (pass == 0) != (ng == 3) || nbx_group_find(L->x, L->n, g, ng) >= 0) {
                continue;
            }
            if (depth >= 16 || L->n + ng > NBI_NATIVE_MAX_SUBS) {
                L->over = true;
                return;
            }
            for (int q = 0; q < ng; q++) {
                L->x[L->n++] = g[q];
                L->instrs += g[q]->n_instrs;
            }
            if (L->instrs > NBX_INLINE_INSTRS) {
                L->over = true;
                return;
            }
        }
    }
    for (int32_t k = first, last = L->n; k < last && !L->over; k++) {
        nbx_subs_rec(L, L->x[k], depth + 1);
    }
}

int32_t nbi_native_subs(const nbi_exec *e, const nbi_exec **out, int32_t cap) {
    nbx_sublist L;
    L.n = 0;
    L.instrs = e->n_instrs;
    L.over = false;
    nbx_subs_rec(&L, e, 0);
    if (L.over) {
        return 0;
    }
    for (int32_t k = 0; out != NULL && k < L.n && k < cap; k++) {
        out[k] = L.x[k];
    }
    return L.n;
}

bool nbi_native_loop_inlined(const nbi_exec *e, const nb_var *v) {
    const nbi_exec *list[NBI_NATIVE_MAX_SUBS], *g[3];
    int ng = nbx_loop_group(v, g);
    if (ng == 0 || (nbx_calls_mask() & 256)) {
        return false;
    }
    int32_t n = nbi_native_subs(e, list, NBI_NATIVE_MAX_SUBS);
    return nbx_group_find(list, n, g, ng) >= 0;
}

/* The functions of this file (per codegen, on this thread): the subs table. */
static _Thread_local const nbi_exec *const *nbx_subs;
static _Thread_local int32_t nbx_n_subs;

/* Where loop node v's group starts among this file's functions (nbx_f<k>, k + 1, ...), or
 * -1: a kernel call. */
static int32_t nbx_loop_sub(const nb_var *v) {
    const nbi_exec *g[3];
    int ng = nbx_loop_group(v, g);
    return ng == 0 ? -1 : nbx_group_find(nbx_subs, nbx_n_subs, g, ng);
}

/* Must a loop plan its executables' outputs before every run? An executable's plan is its
 * state: when running one of the loop's executables can run one of them again (a cond that
 * calls the body's function), that run changes it between the loop's runs. Otherwise the
 * plan made for the loop's fixed buffers holds for every step. */
static bool nbx_group_replans(const nbi_exec *const *g, int ng) {
    for (int a = 0; a < ng; a++) {
        for (int b = 0; b < ng; b++) {
            if (nbi_exec_reaches(g[a], g[b], 0)) {
                return true;
            }
        }
    }
    return false;
}

/* A checkpointed reversal: its kernel (the schedule, the checkpoint copies) with the cond,
 * body and step vjp run as this file's functions nbx_f<kc>, <kc + 1>, <kc + 2>. */
static void nbx_emit_reverse(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins, int32_t kc) {
    const nb_var *v = &e->nodes[ins->node];
    const nbi_exec *grp[3] = {v->at.callee2, v->at.callee3, v->at.callee};
    char buf[96];
    nbx_emit_args(s, e, ins);
    nbx_value(e, ins->node, buf, sizeof buf);
    nbi_sbuf_printf(
        s,
        "        nbx_kargs k = {env->node[%d], %s, a, env->scratch, env->pool, "
        "env->n_workers, 0};\n"
        "        nbx_loop_fns f = {{nbx_f%d, nbx_f%d, nbx_f%d},\n"
        "                          {&env->sub[%d], &env->sub[%d], &env->sub[%d]}, %d};\n"
        "        env->loop_reverse(&k, &f);\n    }\n",
        (int)ins->node, buf, (int)kc, (int)kc + 1, (int)kc + 2, (int)kc, (int)kc + 1, (int)kc + 2,
        nbx_group_replans(grp, 3) ? 1 : 0);
}

/* A while loop as a C loop: the initial carry copied into the node's packed buffer (the
 * kernel's layout, nbi_k_while: leaves at 64-byte offsets), then cond and body -- the
 * functions nbx_f<kc>, nbx_f<kc + 1> of this file, on their executables' environments -- run
 * in place step after step. Each run's output plan (which outputs go straight into the
 * carry, which are copied after it) is asked for before it, as nbi_exec_run_raw does: the
 * executable's plan is its state, which another run of it (a call from the cond) changes;
 * for the same buffers as the last run it is a check of the pointers. */
static void nbx_emit_loop(nbi_sbuf *s, const nbi_exec *e, const nbi_instr *ins, int32_t kc) {
    const nb_var *v = &e->nodes[ins->node];
    const nbi_exec *body = v->at.callee;
    long long nc = (long long)v->at.a[0], nb = (long long)v->at.a[1];
    long long ncar = (long long)v->at.a[2], max_steps = (long long)v->at.a[3];
    char buf[96];
    nbx_value(e, ins->node, buf, sizeof buf);
    nbi_sbuf_printf(s,
                    "    {\n        u8 *w = (u8 *)%s;\n"
                    "        const void *ci[%lld];\n        const void *bi[%lld];\n"
                    "        void *bo[%lld];\n        _Bool don[%lld];\n",
                    buf, nc + ncar + 1, nb + ncar + 1, ncar + 1, ncar + 1);
    for (long long j = 0; j < nc + nb; j++) {
        nbx_value(e, ins->in[j], buf, sizeof buf);
        if (j < nc) {
            nbi_sbuf_printf(s, "        ci[%lld] = %s;\n", j, buf);
        } else {
            nbi_sbuf_printf(s, "        bi[%lld] = %s;\n", j - nc, buf);
        }
    }
    size_t off = 0;
    for (long long i = 0; i < ncar; i++) {
        const nb_var *o = nbi_exec_output(body, (int32_t)i);
        size_t bytes = (size_t)o->size * nbi_dsize(o->dtype);
        const nb_var *init = &e->nodes[ins->in[nc + nb + i]];
        if (bytes > 0 && nbi_while_uninit(v, i, body)) {
            nbi_sbuf_printf(s, "        /* carry %lld: a tape written row by row */\n", i);
        } else if (bytes > 0 && nbi_is_zero_fill(init)) {
            /* a carry that starts at zero (a tape, a scan's outputs, an accumulator):
             * written, not copied from the full's buffer (as nbi_k_while) */
            nbi_sbuf_printf(s, "        __builtin_memset(w + %zu, 0, %zu);\n", off, bytes);
        } else if (bytes > 0) {
            nbx_value(e, ins->in[nc + nb + i], buf, sizeof buf);
            nbi_sbuf_printf(s, "        __builtin_memcpy(w + %zu, %s, %zu);\n", off, buf, bytes);
        }
        nbi_sbuf_printf(s,
                        "        ci[%lld] = bi[%lld] = bo[%lld] = w + %zu;\n"
                        "        don[%lld] = 1;\n",
                        nc + i, nb + i, i, off, i);
        off += nbi_leaf_bytes(o);
    }
    const nbi_exec *grp[2] = {v->at.callee2, body};
    /* planned once unless a step can run cond or body elsewhere (then before every run) */
    bool replans = nbx_group_replans(grp, 2);
    const char *each = replans ? "" : "if (step == 0)\n                ";
    /* the body's loop-invariant prefix at the first step only (nbi_exec_run_step), unless a
     * step can run the body elsewhere */
    char call[96];
    if (nbx_has_rest(body) && !replans) {
        snprintf(call, sizeof call, "(step == 0 ? nbx_f%d : nbx_f%d_r)", (int)kc + 1, (int)kc + 1);
    } else {
        snprintf(call, sizeof call, "nbx_f%d", (int)kc + 1);
    }
    nbi_sbuf_printf(s,
                    "        u8 flag = 0;\n        void *fo[1] = {&flag};\n"
                    "        const nbx_env *ec = &env->sub[%d], *eb = &env->sub[%d];\n"
                    "        int nco = 0, nbo = 0;\n"
                    "        const _Bool *cd = 0, *bd = 0;\n"
                    "        for (i64 step = 0; %lld <= 0 || step < %lld; step++) {\n"
                    "            %scd = env->plan(ec->exec, ci, fo, 0, &nco);\n"
                    "            nbx_f%d(ec, ci, fo, cd);\n"
                    "            if (nco)\n                env->copy(ec->exec, fo);\n"
                    "            if (!flag)\n                break;\n"
                    "            %sbd = env->plan(eb->exec, bi, bo, don, &nbo);\n"
                    "            %s(eb, bi, bo, bd);\n"
                    "            if (nbo)\n                env->copy(eb->exec, bo);\n"
                    "        }\n    }\n",
                    (int)kc, (int)kc + 1, max_steps, max_steps, each, (int)kc, each, call);
}

/* Rows written in place. A loop body's taped step makes a value S in a fused program F and
 * copies it (through a reshape R) into a row of its tape with a dynamic_update_slice U of an
 * input T that nothing else reads (but F, through a pointer into that row:
 * nbx_rows_reads_ok), into the body's output, which the loop makes T's own
 * buffer: then F writes S into that row itself (D<S>: the row when U's output is T's buffer
 * in this run, else S's slot), and R and U run only when it is not (a copy of 16 KB per gate
 * and step of a GRU layer saved). S and R read by nothing else, the row contiguous, U's
 * indices known before F. For instruction t: row_s[t] the S that U = instruction t writes
 * (-1: none); row_of[S] = t; guard[t]: R or U, run only when S was not written in place. */
typedef struct nbx_rows {
    int32_t *row_s, *row_of, *guard;
} nbx_rows;

/* Besides U, may T's other readers stay? Each must be a pointer into U's own block (an
 * aliased dynamic slice with U's start nodes and block shape) that F alone reads, as a
 * plain input of its elementwise program -- no reduction, no view (a slice or broadcast of
 * it read at other indices) -- so F reads each element of the row before it writes it:
 * a row read, added to and written back (a reverse loop's cotangent of a scan's input,
 * nbl_accumulate: 48 KB a step of a GRU layer). reads: T's readers, U included. */
static bool nbx_rows_reads_ok(const nbi_exec *e, const int *kind, const bool *aliased,
                              const int32_t *reads, const nb_var *u, int32_t tf, const nb_var *sv) {
    const nb_var *x = u->in[0], *blk = u->in[1], *f = &e->nodes[e->instrs[tf].node];
    int32_t others = reads[x->id] - 1;
    if (others == 0) {
        return true;
    }
    nbi_fprog prog; /* F's program: a fused one's, or a single op's (NBX_SINGLE, NBX_BIG) */
    const nbi_fprog *p = &prog;
    if (kind[tf] == NBX_FUSED) {
        p = f->at.callee;
    } else if (!(kind[tf] == NBX_BIG && nbx_big_program(f, &prog)) &&
               !(kind[tf] == NBX_SINGLE && nbx_single_program(f, &prog))) {
        return false;
    }
    if (!nbx_prog_flat(f, p)) { /* every input at the element's own index, or one value */
        return false;
    }
    for (int32_t j = 0; j < e->n_instrs && others >= 0; j++) {
        const nbi_instr *in = &e->instrs[j];
        const nb_var *sl = &e->nodes[in->node];
        bool reads_x = false;
        for (int32_t k = 0; k < in->n_in; k++) {
            reads_x = reads_x || in->in[k] == x->id;
        }
        if (!reads_x || sl == u) {
            continue;
        }
        bool ok = sl->op == NBI_OP_DYN_SLICE && aliased[sl->id] && sl->in[0] == x &&
                  sl->n_in == 1 + x->rank && sl->rank == blk->rank && sl->size == sv->size &&
                  reads[sl->id] == 1 && e->out_of[sl->id] < 0;
        for (int d = 0; ok && d < x->rank; d++) {
            ok = sl->in[1 + d] == u->in[2 + d] && sl->shape[d] == blk->shape[d];
        }
        /* a flat program's input of its full size, not a view (a broadcast view of one of
         * its elements is flat too): read at the element's own index */
        bool by_f = false;
        for (int32_t k = 0; ok && k < f->n_in && k < p->n_ext; k++) {
            if (f->in[k] == sl) {
                by_f = true;
                ok = ((p->view_mask >> k) & 1u) == 0 &&
                     nbi_shape_size(p->map_rank, p->map_shape) == sl->size;
            }
        }
        if (!ok || !by_f) {
            return false;
        }
        others--;
    }
    return others == 0;
}

static void nbx_rows_plan(const nbi_exec *e, const int *kind, const bool *promoted,
                          const bool *aliased, int32_t first, nbx_rows *r) {
    int32_t n = e->n_nodes;
    int32_t *made = malloc(((size_t)n + 1) * sizeof(int32_t)),
            *reads = calloc((size_t)n + 1, sizeof(int32_t));
    for (int32_t i = 0; made != NULL && i < n; i++) {
        made[i] = -1;
        r->row_of[i] = -1;
    }
    for (int32_t t = 0; made != NULL && reads != NULL && t < e->n_instrs; t++) {
        const nbi_instr *ins = &e->instrs[t];
        made[ins->node] = t;
        for (int32_t k = 0; k < ins->n_store; k++) {
            if (ins->store[k] >= 0) {
                made[ins->store[k]] = t;
            }
        }
        for (int32_t j = 0; j < ins->n_in; j++) {
            reads[ins->in[j]]++;
        }
        r->row_s[t] = -1;
        r->guard[t] = -1;
    }
    for (int32_t t = first; made != NULL && reads != NULL && t < e->n_instrs; t++) {
        const nb_var *u = &e->nodes[e->instrs[t].node];
        if (u->op != NBI_OP_DYN_UPDATE || nbi_dyn_lanes(u) || kind == NULL ||
            (kind[t] != NBX_MOVE && kind[t] != NBX_CALL)) {
            continue;
        }
        const nb_var *x = u->in[0], *rv = u->in[1], *sv = rv;
        int32_t oi = e->out_of[u->id];
        bool ok = oi >= 0 && e->out_first[oi] == oi && e->param_of[x->id] >= 0 &&
                  e->out_of[x->id] < 0 && x->dtype == u->dtype && rv->dtype == u->dtype &&
                  x->size > 0 && rv->size > 0;
        if (ok && rv->op == NBI_OP_RESHAPE) {
            sv = rv->in[0];
            ok = reads[rv->id] == 1 && e->out_of[rv->id] < 0 && sv->dtype == rv->dtype &&
                 sv->size == rv->size && made[rv->id] >= 0 && !promoted[rv->id];
        }
        int32_t tf = ok ? made[sv->id] : -1;
        ok = ok && tf >= first && tf < t &&
             ((e->nodes[e->instrs[tf].node].op == NBI_OP_FUSED &&
               (kind[tf] == NBX_FUSED || kind[tf] == NBX_BIG || kind[tf] == NBX_TILED)) ||
              (sv->id == e->instrs[tf].node && (kind[tf] == NBX_BIG || kind[tf] == NBX_SINGLE))) &&
             reads[sv->id] == 1 && e->out_of[sv->id] < 0 && !promoted[sv->id] && !aliased[sv->id] &&
             r->row_of[sv->id] < 0 && nbx_rows_reads_ok(e, kind, aliased, reads, u, tf, sv);
        int d0 = 0; /* the block: ones, then (from the first dim past them) x's own sizes */
        while (ok && d0 < x->rank && rv->shape[d0] == 1) {
            d0++;
        }
        for (int d = d0 + 1; ok && d < x->rank; d++) {
            ok = rv->shape[d] == x->shape[d];
        }
        for (int d = 0; ok && d < x->rank; d++) { /* indices known before F */
            const nb_var *iv = u->in[2 + d];
            ok = (iv->dtype == NB_DTYPE_I32 || iv->dtype == NB_DTYPE_I64) &&
                 (e->param_of[iv->id] >= 0 || (made[iv->id] >= 0 && made[iv->id] < tf) ||
                  (made[iv->id] < 0 && iv->n_in == 0 && e->offset[iv->id] >= 0));
        }
        if (!ok) {
            continue;
        }
        r->row_s[t] = sv->id;
        r->row_of[sv->id] = t;
        r->guard[t] = t;
        if (rv != sv && !aliased[rv->id]) {
            r->guard[made[rv->id]] = t;
        }
    }
    free(made);
    free(reads);
}

/* D<S> for the value S that instruction t (U) copies into a row of its first input */
static void nbx_rows_emit(nbi_sbuf *s, const nbi_exec *e, int32_t t, int32_t sn) {
    const nb_var *u = &e->nodes[e->instrs[t].node], *x = u->in[0], *blk = u->in[1];
    char ob[96], xb[96], sb[96];
    nbx_value(e, u->id, ob, sizeof ob);
    nbx_value(e, x->id, xb, sizeof xb);
    nbx_value(e, sn, sb, sizeof sb);
    nbi_sbuf_printf(s, "    u8 *D%d;\n    {\n", (int)sn);
    nbx_emit_block_off(s, e, u, 2, x, blk);
    nbi_sbuf_printf(s,
                    "        /* into its row of %s's buffer when the output is that buffer */\n"
                    "        D%d = %s == %s ? %s + off * %zu : %s;\n    }\n",
                    xb, (int)sn, ob, xb, ob, nbi_dsize(u->dtype), sb);
}

/* Executable e as the function nbx_run (fid -1) or nbx_f<fid>. */
/* Executable e as the function nbx_run (fid -1) or nbx_f<fid>; with rest, as nbx_f<fid>_r:
 * the instructions after e's prefix only (emitted after nbx_f<fid>, whose fused workers it
 * calls). A value the prefix makes and the rest reads is never a local: it must be in the
 * workspace when nbx_f<fid>_r runs. */
static void nbx_gen_fn_ex(const nbi_exec *e, nbi_sbuf *s, int32_t fid, unsigned calls, bool rest);

static void nbx_gen_fn(const nbi_exec *e, nbi_sbuf *s, int32_t fid, unsigned calls) {
    nbx_gen_fn_ex(e, s, fid, calls, false);
    if (fid >= 0 && nbx_has_rest(e)) {
        nbx_gen_fn_ex(e, s, fid, calls, true);
    }
}

static void nbx_gen_fn_ex(const nbi_exec *e, nbi_sbuf *s, int32_t fid, unsigned calls, bool rest) {
    /* kinds, then which values live in locals: made by written-out code, read only by
     * written-out code, not an output, small */
    size_t kbytes = (size_t)(e->n_instrs + 1) * sizeof(int), pbytes = (size_t)e->n_nodes + 1;
    int *kind = malloc(kbytes);
    bool *promoted = calloc(pbytes, 1);
    if (kind == NULL) {
        calls |= NBX_NO_BIG;
    }
    for (int32_t t = 0; kind != NULL && t < e->n_instrs; t++) {
        kind[t] = nbx_kind(e, &e->instrs[t], calls);
        if (kind[t] == NBX_CALL && nbx_loop_sub(&e->nodes[e->instrs[t].node]) >= 0) {
            kind[t] = NBX_LOOP;
        }
    }
    if (kind != NULL && promoted != NULL && !(calls & 64)) {
        for (int32_t t = 0; t < e->n_instrs; t++) {
            const nbi_instr *ins = &e->instrs[t];
            if (kind[t] == NBX_CALL || kind[t] == NBX_BIG || kind[t] == NBX_LOOP ||
                kind[t] == NBX_TILED) {
                continue;
            }
            promoted[ins->node] = true;
            for (int32_t k = 0; k < ins->n_store; k++) {
                if (ins->store[k] >= 0) {
                    promoted[ins->store[k]] = true;
                }
            }
        }
        for (int32_t i = 0; i < e->n_nodes; i++) {
            const nb_var *v = &e->nodes[i];
            size_t es = nbi_dsize(v->dtype);
            promoted[i] = promoted[i] && e->out_of[i] < 0 && e->param_of[i] < 0 && v->size > 0 &&
                          v->size <= NBX_PROMOTE_MAX && (es == 1 || es == 4 || es == 8);
        }
        for (int32_t t = 0; t < e->n_instrs; t++) {
            if (kind[t] != NBX_CALL && kind[t] != NBX_BIG && kind[t] != NBX_LOOP &&
                kind[t] != NBX_TILED) {
                continue;
            }
            for (int32_t j = 0; j < e->instrs[t].n_in; j++) {
                promoted[e->instrs[t].in[j]] = false; /* a kernel reads it from memory */
            }
        }
        /* so does a loop body's rest (nbx_f<fid>_r) what its prefix made */
        for (int32_t t = fid >= 0 && nbx_has_rest(e) ? e->n_pre : e->n_instrs; t < e->n_instrs;
             t++) {
            for (int32_t j = 0; j < e->instrs[t].n_in; j++) {
                int32_t x = e->instrs[t].in[j];
                for (int32_t q = 0; q < e->n_pre; q++) {
                    const nbi_instr *p = &e->instrs[q];
                    bool made = p->node == x;
                    for (int32_t k = 0; !made && k < p->n_store; k++) {
                        made = p->store[k] == x;
                    }
                    if (made) {
                        promoted[x] = false;
                        break;
                    }
                }
            }
        }
    } else if (promoted != NULL) {
        memset(promoted, 0, pbytes);
    }
    int32_t inl = 0;
    for (int32_t t = 0; t < e->n_instrs; t++) {
        int kd = kind != NULL ? kind[t] : nbx_kind(e, &e->instrs[t], calls);
        inl += kd == NBX_FUSED || kd == NBX_TILED ||
               (kd == NBX_BIG && e->nodes[e->instrs[t].node].op == NBI_OP_FUSED);
    }
    nbi_sbuf_printf(s,
                    "/* %d instructions (%d fused programs written out), %d inputs, %d outputs, "
                    "workspace %zu bytes */\n",
                    (int)e->n_instrs, (int)inl, (int)e->n_inputs, (int)e->n_outputs, e->ws_bytes);
    /* The workers read every buffer through their argument. Their trip count is a run-time
     * value, which gcc's -O2 cost model ("very cheap": no epilogue loops) does not vectorise;
     * the dynamic model does (elementwise, no reassociation: the same bits). */
    nbx_promoted = NULL;
    nbx_fn_id = fid + 1;
    bool any_big = false;
    for (int32_t t = 0; kind != NULL && !rest && t < e->n_instrs; t++) {
        if (kind[t] == NBX_BIG || kind[t] == NBX_TILED) {
            if (!any_big) {
                nbi_sbuf_puts(s, "#if defined(__GNUC__) && !defined(__clang__)\n"
                                 "#pragma GCC push_options\n"
                                 "#pragma GCC optimize(\"vect-cost-model=dynamic\")\n"
                                 "#endif\n");
                any_big = true;
            }
            if (kind[t] == NBX_TILED) {
                nbi_fprog tp;
                nbx_tiled_program(&e->nodes[e->instrs[t].node], &tp);
                nbx_emit_tiled_worker(s, e, &e->instrs[t], &tp, t);
                continue;
            }
            nbi_fprog big;
            nbx_big_program(&e->nodes[e->instrs[t].node], &big);
            nbx_emit_fused_ex(s, e, &e->instrs[t], &big, (int)t);
        }
    }
    if (any_big) {
        nbi_sbuf_puts(s, "#if defined(__GNUC__) && !defined(__clang__)\n"
                         "#pragma GCC pop_options\n"
                         "#endif\n");
    }
    if (fid < 0) {
        nbi_sbuf_puts(s, "void nbx_run(");
    } else {
        nbi_sbuf_printf(s, "static void nbx_f%d%s(", (int)fid, rest ? "_r" : "");
    }
    int32_t first = rest ? e->n_pre : 0;
    if (rest && promoted != NULL) { /* the rest's locals: the values it makes */
        bool *mine = calloc(pbytes, 1);
        for (int32_t t = first; mine != NULL && t < e->n_instrs; t++) {
            mine[e->instrs[t].node] = true;
            for (int32_t k = 0; k < e->instrs[t].n_store; k++) {
                if (e->instrs[t].store[k] >= 0) {
                    mine[e->instrs[t].store[k]] = true;
                }
            }
        }
        for (int32_t i = 0; i < e->n_nodes; i++) {
            promoted[i] = promoted[i] && mine != NULL && mine[i];
        }
        free(mine);
    }
    /* aliases: pointers, not copies -- not for the prefix of a body written twice (its
     * rest would not see the pointer) */
    bool *aliased = (calls & 1024) ? NULL : calloc(pbytes, 1);
    for (int32_t t = first; aliased != NULL && t < e->n_instrs; t++) {
        int32_t node = e->instrs[t].node;
        if (e->alias_of[node] >= 0 && (fid < 0 || !nbx_has_rest(e) || t >= e->n_pre)) {
            aliased[node] = true;
            if (promoted != NULL) {
                promoted[node] = false;
            }
        }
    }
    nbi_sbuf_puts(s, "const nbx_env *env, const void *const *in, void *const *out,\n"
                     "             const _Bool *direct) {\n"
                     "    u8 *ws = env->ws;\n"
                     "    const nbx_vmath *vm = env->vm;\n"
                     "    (void)in; (void)out; (void)direct; (void)ws; (void)vm;\n");
    for (int32_t i = 0; promoted != NULL && i < e->n_nodes; i++) {
        if (promoted[i]) {
            const nb_var *v = &e->nodes[i];
            nbi_sbuf_printf(s, "    %s L%d[%lld];\n", nbx_ctype(v->dtype), (int)i,
                            (long long)v->size);
        }
    }
    /* rows written in place (nbx_rows_plan): in loop functions only (a top-level run's
     * donated output may share its buffer with another input, read between the program and
     * the update), after a body's loop-invariant prefix (the rest, run at later steps, must
     * find the same plan); not with NABLA_NATIVE_CALLS bit 2048 */
    size_t ib = ((size_t)e->n_instrs + 1) * sizeof(int32_t);
    nbx_rows rows = {NULL, NULL, NULL};
    bool *redirect = NULL;
    if (!(calls & 2048) && fid >= 0 && promoted != NULL && aliased != NULL) {
        rows.row_s = malloc(ib);
        rows.guard = malloc(ib);
        rows.row_of = malloc(pbytes * sizeof(int32_t));
        redirect = calloc(pbytes, 1);
        if (rows.row_s != NULL && rows.guard != NULL && rows.row_of != NULL && redirect != NULL) {
            nbx_rows_plan(e, kind, promoted, aliased, nbx_has_rest(e) ? e->n_pre : first, &rows);
        } else {
            free(rows.row_s);
            free(rows.guard);
            free(rows.row_of);
            free(redirect);
            rows.row_s = rows.guard = rows.row_of = NULL;
            redirect = NULL;
        }
    }
    nbx_promoted = promoted;
    nbx_aliased = aliased;
    nbx_redirect = redirect;
    /* outputs: in the caller's buffer or the workspace, per run */
    for (int32_t i = 0; i < e->n_outputs; i++) {
        int32_t node = e->outputs[i];
        if (e->out_first[i] != i || e->out_of[node] != i) {
            continue;
        }
        nbi_sbuf_printf(s, "    u8 *v%d = direct[%d] ? (u8 *)out[%d] : ws + %lld;\n", (int)node,
                        (int)i, (int)i, (long long)e->offset[node]);
    }
    for (int32_t t = first; t < e->n_instrs; t++) {
        const nbi_instr *ins = &e->instrs[t];
        const nb_var *v = &e->nodes[ins->node];
        char sig[NBI_SIG_CAP];
        nbi_sbuf_printf(s, "    /* %%%d = %s: %s */\n", (int)v->src, nbi_op_name((nbi_op)v->op),
                        nbi_var_sig(sig, sizeof sig, v));
        if (aliased != NULL && aliased[ins->node]) {
            nbx_emit_alias(s, e, ins);
            continue;
        }
        int32_t made_here[1 + NBI_FUSE_MAX_STORE], n_here = 0;
        made_here[n_here++] = ins->node;
        for (int32_t k = 0; k < ins->n_store; k++) {
            made_here[n_here++] = ins->store[k];
        }
        for (int32_t k = 0; redirect != NULL && k < n_here; k++) {
            int32_t sn = made_here[k];
            if (sn >= 0 && rows.row_of[sn] >= 0) {
                nbx_rows_emit(s, e, rows.row_of[sn], sn);
                redirect[sn] = true;
            }
        }
        int32_t gu = redirect != NULL ? rows.guard[t] : -1;
        if (gu >= 0) { /* R or U: only when S was not written into its row */
            char ob[96], xb[96];
            const nb_var *u = &e->nodes[e->instrs[gu].node];
            nbx_value(e, u->id, ob, sizeof ob);
            nbx_value(e, u->in[0]->id, xb, sizeof xb);
            nbi_sbuf_printf(s, "    if (%s != %s) {\n", ob, xb);
        }
        nbi_fprog single;
        switch (kind != NULL ? kind[t] : nbx_kind(e, ins, calls | NBX_NO_BIG)) {
        case NBX_FUSED:
            nbx_emit_fused(s, e, ins, v->at.callee);
            break;
        case NBX_SINGLE:
            nbx_single_program(v, &single);
            nbx_emit_fused(s, e, ins, &single);
            break;
        case NBX_REDUCE:
            nbx_emit_reduce(s, e, ins);
            break;
        case NBX_SLICE:
            nbx_slice_program(v, &single);
            nbx_emit_fused(s, e, ins, &single);
            break;
        case NBX_COPY:
            nbx_emit_copy(s, e, ins);
            break;
        case NBX_MOVE:
            nbx_emit_move(s, e, ins);
            break;
        case NBX_BIG:
            nbx_emit_big(s, e, ins, t);
            break;
        case NBX_TILED:
            nbx_emit_tiled(s, e, ins, t);
            break;
        case NBX_LOOP:
            if (v->op == NBI_OP_LOOP_REVERSE) {
                nbx_emit_reverse(s, e, ins, nbx_loop_sub(v));
            } else {
                nbx_emit_loop(s, e, ins, nbx_loop_sub(v));
            }
            break;
        default:
            nbx_emit_call(s, e, ins);
            break;
        }
        if (gu >= 0) {
            nbi_sbuf_puts(s, "    }\n");
        }
    }
    nbi_sbuf_puts(s, "}\n");
    nbx_promoted = NULL;
    nbx_aliased = NULL;
    nbx_redirect = NULL;
    free(redirect);
    free(rows.row_s);
    free(rows.guard);
    free(rows.row_of);
    free(aliased);
    free(promoted);
    free(kind);
}

void nbi_native_codegen(const nbi_exec *e, nbi_sbuf *s) {
    unsigned calls = nbx_calls_mask();
    nbi_sbuf_puts(s, "/* nabla native tier: generated from an optimized executable. */\n");
    nbi_sbuf_puts(s, nbx_prelude);
    /* the loops' conds and bodies: functions of this file (NABLA_NATIVE_CALLS bit 256: none,
     * every loop a kernel call) */
    const nbi_exec *subs[NBI_NATIVE_MAX_SUBS];
    int32_t n_sub = (calls & 256) ? 0 : nbi_native_subs(e, subs, NBI_NATIVE_MAX_SUBS);
    nbx_subs = subs;
    nbx_n_subs = n_sub;
    for (int32_t k = 0; k < n_sub; k++) {
        nbi_sbuf_printf(s,
                        "static void nbx_f%d(const nbx_env *env, const void *const *in, "
                        "void *const *out, const _Bool *direct);\n",
                        (int)k);
        if (nbx_has_rest(subs[k])) {
            nbi_sbuf_printf(s,
                            "static void nbx_f%d_r(const nbx_env *env, const void *const *in, "
                            "void *const *out, const _Bool *direct);\n",
                            (int)k);
        }
    }
    nbx_gen_fn(e, s, -1, calls);
    for (int32_t k = 0; k < n_sub; k++) {
        nbi_sbuf_printf(s, "/* loop function %d */\n", (int)k);
        nbx_gen_fn(subs[k], s, k, calls);
    }
    nbx_subs = NULL;
    nbx_n_subs = 0;
}
