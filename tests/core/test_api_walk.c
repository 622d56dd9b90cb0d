/*
 * test_api_walk.c -- the misuse contract, as a walk over the whole public API:
 * every public function, called with NULL (and, for pooled handles, a destroyed handle) in
 * each handle or pointer argument in turn, gives its documented misuse result.
 *
 * The list of public functions is read at run time from the installed headers
 * (NBT_INCLUDE_DIR: every NB_API declaration), and the table below must hold one entry for
 * each: a walker, or an exemption with its reason. A public function without an entry fails
 * the test by name, so the walk stays complete as the API grows.
 *
 * How an entry is walked. A walker makes its calls with every spoilable argument wrapped in
 * one of the macros below (NUL, OUT, ARR, TREE, ...). Each wrapped argument is a numbered
 * position; run k spoils position k only (NULL, or a destroyed handle: "positions" NULL and
 * destroyed count separately) and passes every other argument valid. The first run counts
 * the positions; the entry then runs once per position, each run in a fresh context with
 * fresh fixtures, and after each run:
 *   - the result is the documented one (NB_ERR_MISUSE for an nb_status function unless its
 *     header says otherwise; the bracketed default of an accessor; NULL or poison for a
 *     traced op, with the sticky error on the trace),
 *   - out-parameters are NULL (or zero, or false) -- core.h: "set to NULL (or zero) on
 *     failure",
 *   - when the failure can reach a context -- a destroyed handle (it keeps its context), a
 *     NULL out-parameter, or a NULL pointer or handle beside another argument that leads to
 *     the context, or a traced op whose trace is reachable -- the context holds it: errcode
 *     the status and a message naming the function (core.h: "nb_ctx_errmsg() holds one line
 *     naming the function ..."). A walker whose call reaches no context at all says so
 *     (w->no_ctx, with the reason),
 *   - the destroyed handle is still detected as destroyed (its pool slot was not reused),
 *   - with the fixtures released and the compile cache dropped nothing is live,
 *   - the context still works (an array and a tree are made and destroyed), and after
 *     nb_ctx_destroy every byte went back to the allocator.
 * Traced entries (ops that take an nb_trace or nb_var) run inside a body evaluated with
 * nb_eval, whose status must then be the trace's sticky status; they run once more outside
 * any trace with every handle NULL, where there is no trace to record on: NULL (or
 * NB_ERR_MISUSE) is the only possible answer.
 *
 * Destroyed handles: arrays, trees, treedefs, functions and batchers live in pooled blocks
 * that keep a DEAD mark (src/core/ctx.c, nbi_obj) and are reused FIFO, so a handle destroyed
 * just before the call is detected without reading freed memory (as test_misuse.c's
 * test_destroyed_array). A destroyed nb_ctx is not walked: core.h says its use is undefined
 * (its memory is gone). A var or a trace cannot be destroyed by the caller (they live in the
 * trace's arena, freed with it).
 *
 * Failures are collected (one line each, naming the function, the spoiled argument and the
 * source line), so one run lists every defect; the test fails at the end if there was any.
 */
#include "nbtest.h"

#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef NBT_INCLUDE_DIR
#error "NBT_INCLUDE_DIR (the directory of nabla's public headers) must be defined"
#endif

/* ---- the walk ----------------------------------------------------------------------- */

enum { SP_NONE, SP_NULL, SP_DEAD };
enum { DK_NONE, DK_ARRAY, DK_TREE, DK_TREEDEF, DK_FN, DK_BATCHER };

/* A set of statuses, for positions whose documented result is not NB_ERR_MISUSE. */
#define ACC(st) (1u << (unsigned)(-(int)(st)))
#define ACC_MISUSE ACC(NB_ERR_MISUSE)

typedef struct fixtures {
    nb_array *arr, *vec, *ones, *key, *rows, *labels, *yb;
    nb_tree *leaf, *ival, *fval, *bval, *sval, *fnref, *list, *params, *args1, *grads, *opt, *state,
        *sched, *mask, *lin, *mlp, *ln, *emb, *drop, *conv, *targs, *convn, *convt, *pool, *gn,
        *rms, *bn, *bn_state, *mha, *gru, *lstm;
    nb_treedef *def;
    nb_fn *fn, *fn_cond, *fn_fori, *fn_ode, *step;
    nb_batcher *bat;
} fixtures;

/* Vars of the body being traced (the arrays of fx_targs, as the body receives them). */
typedef struct tfix {
    nb_trace *tr;
    nb_var *x;   /* f32[2,3] */
    nb_var *v;   /* f32[3] */
    nb_var *s;   /* f32[] */
    nb_var *b;   /* bool[2,3] */
    nb_var *i;   /* i32[] */
    nb_var *idx; /* i32[2] */
    nb_var *key; /* i32[2] */
    nb_var *bs;  /* bool[] */
    nb_tree *args, *xleaf;
} tfix;

typedef struct walk walk;
typedef void (*walk_fn)(walk *w);

typedef struct entry {
    const char *name;
    walk_fn eager;      /* called outside any trace */
    walk_fn traced;     /* called inside a body being traced */
    const char *exempt; /* why the function is not walked */
} entry;

struct walk {
    const entry *e;
    nb_ctx *ctx;
    nbt_alloc al;
    int k;     /* the position spoiled in this run (-1: none) */
    int pos;   /* positions passed so far in this run */
    int spoil; /* what was done to position k */
    const char *what;
    unsigned accept;        /* statuses accepted for the spoiled position */
    const void *nulled_out; /* the out-parameter passed as NULL in this run */
    bool no_ctx;            /* the call cannot reach any context (set by its walker, with why) */
    int ctx_args;           /* arguments passed that lead to the context (live or destroyed) */
    /* traced entries */
    bool outside;   /* run outside any trace, every handle NULL */
    bool tr_nulled; /* the trace argument was spoiled */
    int carriers;   /* arguments left that lead to the trace */
    nb_trace *tr;
    tfix *t;
    bool body_ran;
    nb_status end_status;
    /* the destroyed handle of this run */
    const void *dead;
    int dead_kind;
    fixtures fx;
    int n_fail; /* failures of this entry */
};

static walk *g_walk;            /* the walk whose body nb_eval is tracing */
static int g_fail_total;        /* failures over the whole walk */
static char g_tmpdir[256];      /* files for the io entries */
static char g_params_path[320]; /* a safetensors file of fx_params */
static char g_ckpt_path[320];   /* a checkpoint of fx_params and fx_state */
static char g_new_path[320];    /* a path that must never be written */
static unsigned char *g_bytes;  /* the bytes of g_params_path */
static size_t g_n_bytes;
static FILE *g_devnull;

static nb_array *const S_A = (nb_array *)(uintptr_t)0x10; /* "untouched" out-parameters */
static nb_tree *const S_T = (nb_tree *)(uintptr_t)0x20;
static nb_treedef *const S_D = (nb_treedef *)(uintptr_t)0x30;
static nb_fn *const S_F = (nb_fn *)(uintptr_t)0x40;
static nb_batcher *const S_B = (nb_batcher *)(uintptr_t)0x50;
static nb_ctx *const S_C = (nb_ctx *)(uintptr_t)0x60;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
walk_failf(walk *w, int line, const char *fmt, ...) {
    const char *how = w->spoil == SP_NULL ? "NULL" : w->spoil == SP_DEAD ? "destroyed" : "";
    fprintf(stderr, "FAIL %s [%s%s%s%s, line %d]: ", w->e->name,
            w->outside ? "outside a trace" : "", how, w->spoil != SP_NONE ? " " : "",
            w->spoil != SP_NONE ? w->what : "", line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    w->n_fail++;
    g_fail_total++;
}

#define W_TRUE(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            walk_failf(w, __LINE__, "expected: %s", #cond);                                        \
        }                                                                                          \
    } while (0)

/* ---- positions ---------------------------------------------------------------------- */

/* The next position: true when this run spoils it. */
static bool walk_at(walk *w, int spoil, const char *what, unsigned accept) {
    if (w->pos++ != w->k) {
        return false;
    }
    w->spoil = spoil;
    w->what = what;
    w->accept = accept;
    return true;
}

static bool walk_out(walk *w, const void *p, const char *what) {
    if (!walk_at(w, SP_NULL, what, ACC_MISUSE)) {
        return false;
    }
    w->nulled_out = p;
    return true;
}

static void fx_fail(walk *w, const char *what, nb_status s) {
    walk_failf(w, 0, "fixture %s: %s: %s", what, nb_status_name(s), nb_ctx_errmsg(w->ctx));
}

static nb_array *dead_array(walk *w) {
    nb_array *a = NULL;
    nb_status s = nb_array_zeros(w->ctx, NB_DTYPE_F32, 1, (int64_t[]){2}, &a);
    if (s != NB_OK) {
        fx_fail(w, "dead array", s);
        return NULL;
    }
    nb_array_destroy(a);
    w->dead = a;
    w->dead_kind = DK_ARRAY;
    return a;
}

static nb_tree *dead_tree(walk *w) {
    nb_tree *t = NULL;
    nb_status s = nb_tree_int(w->ctx, 1, &t);
    if (s != NB_OK) {
        fx_fail(w, "dead tree", s);
        return NULL;
    }
    nb_tree_destroy(t);
    w->dead = t;
    w->dead_kind = DK_TREE;
    return t;
}

static nb_treedef *dead_treedef(walk *w) {
    nb_tree *t = NULL;
    nb_treedef *d = NULL;
    nb_status s = nb_tree_int(w->ctx, 1, &t);
    if (s == NB_OK) {
        s = nb_tree_treedef(t, &d);
    }
    nb_tree_destroy(t);
    if (s != NB_OK) {
        fx_fail(w, "dead treedef", s);
        return NULL;
    }
    nb_treedef_destroy(d);
    w->dead = d;
    w->dead_kind = DK_TREEDEF;
    return d;
}

static nb_status body_ident(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out);

static nb_fn *dead_fn(walk *w) {
    nb_fn *f = NULL;
    nb_status s = nb_fn_create(w->ctx, "dead", body_ident, NULL, &f);
    if (s != NB_OK) {
        fx_fail(w, "dead fn", s);
        return NULL;
    }
    nb_fn_destroy(f);
    w->dead = f;
    w->dead_kind = DK_FN;
    return f;
}

static nb_array *fx_rows(walk *w);
static nb_array *fx_labels(walk *w);
static nb_array *fx_key(walk *w);

static nb_batcher *dead_batcher(walk *w) {
    nb_batcher *b = NULL;
    nb_array *x = fx_rows(w), *y = fx_labels(w), *key = fx_key(w);
    nb_status s = nb_batcher_create(x, y, key, 2, NULL, &b);
    if (s != NB_OK) {
        fx_fail(w, "dead batcher", s);
        return NULL;
    }
    nb_batcher_destroy(b);
    w->dead = b;
    w->dead_kind = DK_BATCHER;
    return b;
}

static nb_array *walk_arr(walk *w, nb_array *p, const char *what, bool null_too) {
    /* both positions are passed in every run, so that every run counts the same */
    bool null = null_too && walk_at(w, SP_NULL, what, ACC_MISUSE);
    bool dead = walk_at(w, SP_DEAD, what, ACC_MISUSE);
    w->ctx_args += !null && (dead || p != NULL);
    return null ? NULL : dead ? dead_array(w) : p;
}

static nb_tree *walk_tree(walk *w, nb_tree *p, const char *what, bool null_too) {
    /* both positions are passed in every run, so that every run counts the same */
    bool null = null_too && walk_at(w, SP_NULL, what, ACC_MISUSE);
    bool dead = walk_at(w, SP_DEAD, what, ACC_MISUSE);
    w->ctx_args += !null && (dead || p != NULL);
    return null ? NULL : dead ? dead_tree(w) : p;
}

static nb_treedef *walk_tdef(walk *w, nb_treedef *p, const char *what) {
    /* both positions are passed in every run, so that every run counts the same */
    bool null = walk_at(w, SP_NULL, what, ACC_MISUSE);
    bool dead = walk_at(w, SP_DEAD, what, ACC_MISUSE);
    w->ctx_args += !null && (dead || p != NULL);
    return null ? NULL : dead ? dead_treedef(w) : p;
}

static nb_fn *walk_fnh(walk *w, nb_fn *p, const char *what) {
    /* both positions are passed in every run, so that every run counts the same */
    bool null = walk_at(w, SP_NULL, what, ACC_MISUSE);
    bool dead = walk_at(w, SP_DEAD, what, ACC_MISUSE);
    w->ctx_args += !null && (dead || p != NULL);
    return null ? NULL : dead ? dead_fn(w) : p;
}

static nb_batcher *walk_bat(walk *w, nb_batcher *p, const char *what) {
    /* both positions are passed in every run, so that every run counts the same */
    bool null = walk_at(w, SP_NULL, what, ACC_MISUSE);
    bool dead = walk_at(w, SP_DEAD, what, ACC_MISUSE);
    w->ctx_args += !null && (dead || p != NULL);
    return null ? NULL : dead ? dead_batcher(w) : p;
}

static nb_var *walk_var(walk *w, nb_var *p, const char *what, unsigned accept) {
    if (walk_at(w, SP_NULL, what, accept)) {
        return NULL;
    }
    if (p != NULL) {
        w->carriers++;
        w->ctx_args++;
    }
    return p;
}

static nb_trace *walk_trc(walk *w, nb_trace *p) {
    if (walk_at(w, SP_NULL, "trace", ACC_MISUSE)) {
        w->tr_nulled = true;
        return NULL;
    }
    if (p != NULL) {
        w->carriers++;
        w->ctx_args++;
    }
    return p;
}

static nb_ctx *walk_ctx(walk *w, nb_ctx *p) {
    if (walk_at(w, SP_NULL, "ctx", ACC_MISUSE)) {
        return NULL;
    }
    w->ctx_args += p != NULL;
    return p;
}

/* Spoilable arguments. */
#define NUL(p) (walk_at(w, SP_NULL, #p, ACC_MISUSE) ? NULL : (p))
#define NUL_ACC(p, acc) (walk_at(w, SP_NULL, #p, (acc)) ? NULL : (p))
#define OUT(p) (walk_out(w, (const void *)(p), "out-parameter " #p) ? NULL : (p))
#define CTX(p) walk_ctx(w, (p))
#define ARR(p) walk_arr(w, (p), #p, true)
#define ARR_OPT(p) walk_arr(w, (p), #p, false) /* NULL allowed: destroyed only */
#define TREE(p) walk_tree(w, (p), #p, true)
#define TREE_OPT(p) walk_tree(w, (p), #p, false)
#define TDEF(p) walk_tdef(w, (p), #p)
#define FN(p) walk_fnh(w, (p), #p)
#define BAT(p) walk_bat(w, (p), #p)
#define VAR(p) walk_var(w, (p), #p, ACC_MISUSE)
#define VAR_ACC(p, acc) walk_var(w, (p), #p, (acc))
#define TRC(p) walk_trc(w, (p))
/* A traced op's shape argument: trace.h documents no status for a NULL one, so the misuse or
 * the op's own shape error (array.h's constructors give NB_ERR_MISUSE). */
#define SHAPE_PTR(p) NUL_ACC(p, ACC_MISUSE | ACC(NB_ERR_SHAPE))

/* ---- checks ------------------------------------------------------------------------- */

static bool walk_accepts(const walk *w, nb_status s) {
    return s < 0 && s > -32 && (w->accept & ACC(s)) != 0;
}

static const char *accept_names(const walk *w, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int s = -1; s > -32; s--) {
        if (w->accept & ACC(s)) {
            size_t n = strlen(buf);
            snprintf(buf + n, cap - n, "%s%s", n ? " or " : "", nb_status_name((nb_status)s));
        }
    }
    return buf;
}

/* Does msg name the function fn ("fn: ...", or "fn" as a word inside)? */
static bool walk_names_fn(const char *msg, const char *fn) {
    size_t n = strlen(fn);
    for (const char *p = strstr(msg, fn); p != NULL; p = strstr(p + 1, fn)) {
        bool start = p == msg || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        bool end = !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (start && end) {
            return true;
        }
    }
    return false;
}

/* The failure s of the call text is on the context: errcode s and a message that names the
 * function (core.h: "nb_ctx_errmsg() holds one line naming the function ..."). */
static void walk_msg(walk *w, int line, const char *text, nb_status s) {
    const char *m = nb_ctx_errmsg(w->ctx);
    if (nb_ctx_errcode(w->ctx) != s || m[0] == '\0') {
        walk_failf(w, line, "%s returned %s with no message on the context (errcode %s, '%s')",
                   text, nb_status_name(s), nb_status_name(nb_ctx_errcode(w->ctx)), m);
    } else if (!walk_names_fn(m, w->e->name)) {
        walk_failf(w, line, "%s returned %s with a message that does not name %s: '%s'", text,
                   nb_status_name(s), w->e->name, m);
    }
}

/* An nb_status result: one of the accepted statuses (NB_ERR_MISUSE unless said otherwise). */
#define W_ST(expr) walk_st(w, __LINE__, #expr, (expr))
static void walk_st(walk *w, int line, const char *text, nb_status s) {
    if (!walk_accepts(w, s)) {
        char want[128];
        walk_failf(w, line, "%s returned %s, wanted %s (errmsg: %s)", text, nb_status_name(s),
                   accept_names(w, want, sizeof want), nb_ctx_errmsg(w->ctx));
    }
    /* Every error a context can be reached for says why: a destroyed handle still names its
     * context, and so does a live handle or ctx passed beside a NULL out-parameter, pointer
     * or handle (ctx_args). A NULL handle that is the only way to the context has nowhere
     * to record; a call that reaches no context at all is marked no_ctx by its walker. */
    if (s < 0 && !w->no_ctx &&
        (w->spoil == SP_DEAD || w->nulled_out != NULL ||
         (w->spoil == SP_NULL && w->ctx_args > 0))) {
        walk_msg(w, line, text, s);
    }
}

/* Out-parameters are set to NULL / zero on failure (unless it is the one passed as NULL). */
#define W_NULLOUT(o) walk_nullout(w, __LINE__, #o, (const void *)&(o), (const void *)(o))
static void walk_nullout(walk *w, int line, const char *text, const void *addr, const void *v) {
    if (addr != w->nulled_out && v != NULL) {
        walk_failf(w, line, "out-parameter %s was not set to NULL on failure (%s)", text,
                   v == (const void *)S_A || v == (const void *)S_T || v == (const void *)S_D ||
                           v == (const void *)S_F || v == (const void *)S_B ||
                           v == (const void *)S_C
                       ? "left untouched"
                       : "set to an object");
    }
}
#define W_ZERO(o)                                                                                  \
    do {                                                                                           \
        if ((const void *)&(o) != w->nulled_out && (o) != 0) {                                     \
            walk_failf(w, __LINE__, "out-parameter %s was not set to zero on failure", #o);        \
        }                                                                                          \
    } while (0)
#define W_ZEROMEM(o) walk_zeromem(w, __LINE__, #o, &(o), sizeof(o))
static void walk_zeromem(walk *w, int line, const char *text, const void *p, size_t n) {
    if (p == w->nulled_out) {
        return;
    }
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0) {
            walk_failf(w, line, "out-parameter %s was not zeroed on failure", text);
            return;
        }
    }
}

static nb_status tr_status(const walk *w) {
    return w->tr != NULL ? nb_trace_status(w->tr) : NB_OK;
}

/* A traced op returning a var. No way to the trace (every handle NULL): NULL and nothing
 * recorded. The trace argument NULL: NULL, or poison with the error recorded through another
 * argument. Otherwise (trace.h: "if it fails ... it records one message on the trace ... and
 * returns the trace's poison var"): poison, and the trace's sticky status is the misuse. */
#define T_VAR(expr) walk_tvar(w, __LINE__, #expr, (expr))
static void walk_tvar(walk *w, int line, const char *text, const nb_var *r) {
    nb_status ts = tr_status(w);
    char want[128];
    if (w->outside) {
        if (r != NULL) {
            walk_failf(w, line, "%s outside a trace returned a var, wanted NULL", text);
        }
    } else if (w->tr_nulled) {
        if (r != NULL && !(nb_var_is_poison(r) && walk_accepts(w, ts))) {
            walk_failf(w, line, "%s with a NULL trace returned a var that is not poison", text);
        } else if (r != NULL) {
            walk_msg(w, line, text, ts); /* recorded through another argument */
        }
    } else if (w->carriers == 0) {
        /* no argument leads to the trace; an op may still record on the trace whose body is
         * running (nb_concatenate of a NULL xs): then poison and the misuse, with a message */
        if (r != NULL && nb_var_is_poison(r) && walk_accepts(w, ts)) {
            walk_msg(w, line, text, ts);
        } else if (r != NULL || ts != NB_OK) {
            walk_failf(w, line,
                       "%s with no way to the trace: got %s, trace %s; wanted NULL, or poison "
                       "with the misuse recorded on the running trace",
                       text, r == NULL ? "NULL" : "a var", nb_status_name(ts));
        }
    } else if (r == NULL || !nb_var_is_poison(r) || !walk_accepts(w, ts)) {
        walk_failf(w, line, "%s returned %s with the trace's status %s; wanted poison and %s", text,
                   r == NULL             ? "NULL"
                   : nb_var_is_poison(r) ? "poison"
                                         : "a live var",
                   nb_status_name(ts), accept_names(w, want, sizeof want));
    } else {
        walk_msg(w, line, text, ts); /* the sticky error says why */
    }
}

/* A traced function returning a tree: NULL, and (when a trace is reachable) the sticky
 * misuse on it ("owned by the trace (NULL after a sticky error)"). */
#define T_TREE(expr) walk_ttree(w, __LINE__, #expr, (expr))
static void walk_ttree(walk *w, int line, const char *text, const nb_tree *r) {
    nb_status ts = tr_status(w);
    char want[128];
    if (r != NULL) {
        walk_failf(w, line, "%s returned a tree, wanted NULL", text);
    } else if (!w->outside && !w->tr_nulled && w->carriers > 0 && !walk_accepts(w, ts)) {
        walk_failf(w, line, "%s returned NULL but the trace's status is %s, wanted %s", text,
                   nb_status_name(ts), accept_names(w, want, sizeof want));
    } else if (!w->outside && !w->tr_nulled && w->carriers > 0) {
        walk_msg(w, line, text, ts);
    }
}

/* A traced function returning nb_status: the misuse, also recorded on a reachable trace. */
#define T_ST(expr) walk_tst(w, __LINE__, #expr, (expr))
static void walk_tst(walk *w, int line, const char *text, nb_status s) {
    walk_st(w, line, text, s);
    nb_status ts = tr_status(w);
    if (!w->outside && !w->tr_nulled && !walk_accepts(w, ts)) {
        walk_failf(w, line, "%s: the trace's status is %s, not the misuse", text,
                   nb_status_name(ts));
    } else if (!w->outside && !w->tr_nulled) {
        walk_msg(w, line, text, ts);
    }
}

static void drop_a(nb_array *a) {
    if (a != NULL && a != S_A) {
        nb_array_destroy(a);
    }
}
static void drop_t(nb_tree *t) {
    if (t != NULL && t != S_T) {
        nb_tree_destroy(t);
    }
}
static void drop_d(nb_treedef *d) {
    if (d != NULL && d != S_D) {
        nb_treedef_destroy(d);
    }
}
static void drop_f(nb_fn *f) {
    if (f != NULL && f != S_F) {
        nb_fn_destroy(f);
    }
}
static void drop_b(nb_batcher *b) {
    if (b != NULL && b != S_B) {
        nb_batcher_destroy(b);
    }
}

/* ---- function bodies used by the fixtures ------------------------------------------- */

/* Returns its argument tree. */
static nb_status body_ident(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)tr;
    (void)self;
    *out = nb_tree_retain((nb_tree *)args);
    return *out != NULL ? NB_OK : NB_ERR_MISUSE;
}

/* A while loop's cond: false. */
static nb_status body_false(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    (void)args;
    return nb_return(nb_scalar_typed(tr, NB_DTYPE_BOOL, 0), out);
}

/* fori_loop's body: (i, carry) -> carry. */
static nb_status body_fori(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)tr;
    (void)self;
    *out = nb_tree_retain((nb_tree *)nb_tree_child(args, 1));
    return *out != NULL ? NB_OK : NB_ERR_MISUSE;
}

/* An ODE term: (t, y, args) -> -y. */
static nb_status body_ode(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    return nb_return(nb_neg(nb_get(tr, args, "[1]")), out);
}

static void plain_fn(void) {
}

static nb_status map_keep(void *ud, const char *path, int n, const nb_tree *const *leaves,
                          nb_tree **out) {
    (void)ud;
    (void)path;
    (void)n;
    *out = nb_tree_retain((nb_tree *)leaves[0]);
    return NB_OK;
}

static bool pred_yes(void *ud, const nb_tree *leaf) {
    (void)ud;
    (void)leaf;
    return true;
}

static long write_hook(void *ud, int fd, const void *buf, size_t n) {
    (void)ud;
    (void)fd;
    (void)buf;
    return (long)n;
}

/* ---- fixtures (made on first use in a run, released at its end) --------------------- */

#define FX(field, what, expr)                                                                      \
    do {                                                                                           \
        if (w->fx.field == NULL) {                                                                 \
            nb_status fx_s_ = (expr);                                                              \
            if (fx_s_ != NB_OK) {                                                                  \
                fx_fail(w, what, fx_s_);                                                           \
            }                                                                                      \
        }                                                                                          \
        return w->fx.field;                                                                        \
    } while (0)

static nb_array *fx_arr(walk *w) { /* f32[2,3] */
    FX(arr, "arr", nb_array_zeros(w->ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, &w->fx.arr));
}
static nb_array *fx_vec(walk *w) { /* f32[3] zeros: a mean */
    FX(vec, "vec", nb_array_zeros(w->ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, &w->fx.vec));
}
static nb_array *fx_ones(walk *w) { /* f32[3] ones: a standard deviation */
    FX(ones, "ones", nb_array_ones(w->ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, &w->fx.ones));
}
static nb_array *fx_key(walk *w) {
    FX(key, "key", nb_random_key(w->ctx, 7, &w->fx.key));
}
static nb_array *fx_rows(walk *w) { /* f32[4,3] samples */
    FX(rows, "rows",
       nb_array_from_data(w->ctx, NB_DTYPE_F32, 2, (int64_t[]){4, 3},
                          (float[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, &w->fx.rows));
}
static nb_array *fx_labels(walk *w) { /* i32[4] */
    FX(labels, "labels",
       nb_array_from_data(w->ctx, NB_DTYPE_I32, 1, (int64_t[]){4}, (int32_t[]){0, 1, 0, 1},
                          &w->fx.labels));
}
static nb_array *fx_yb(walk *w) { /* i32[2]: a batch of labels (fx_arr is a batch of rows) */
    FX(yb, "yb", nb_array_zeros(w->ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, &w->fx.yb));
}
static nb_batcher *fx_bat(walk *w) {
    nb_array *x = fx_rows(w), *y = fx_labels(w), *key = fx_key(w);
    FX(bat, "batcher", nb_batcher_create(x, y, key, 2, NULL, &w->fx.bat));
}
static nb_tree *fx_leaf(walk *w) { /* an array leaf of fx_arr */
    nb_array *a = fx_arr(w);
    FX(leaf, "leaf", nb_tree_array(a, &w->fx.leaf));
}
static nb_tree *fx_ival(walk *w) {
    FX(ival, "int leaf", nb_tree_int(w->ctx, 3, &w->fx.ival));
}
static nb_tree *fx_fval(walk *w) {
    FX(fval, "float leaf", nb_tree_float(w->ctx, 0.5, &w->fx.fval));
}
static nb_tree *fx_bval(walk *w) {
    FX(bval, "bool leaf", nb_tree_bool(w->ctx, true, &w->fx.bval));
}
static nb_tree *fx_sval(walk *w) {
    FX(sval, "string leaf", nb_tree_string(w->ctx, "s", &w->fx.sval));
}
static nb_tree *fx_fnref(walk *w) {
    FX(fnref, "fnref leaf", nb_tree_fnref(w->ctx, plain_fn, "plain_fn", &w->fx.fnref));
}
static nb_tree *fx_list(walk *w) { /* list [leaf] */
    nb_tree *l = fx_leaf(w);
    FX(list, "list", nb_tree_list(w->ctx, 1, (nb_tree *[]){l}, &w->fx.list));
}
static nb_tree *fx_params(walk *w) { /* dict {w: leaf} */
    nb_tree *l = fx_leaf(w);
    FX(params, "params",
       nb_tree_dict(w->ctx, 1, (const char *[]){"w"}, (nb_tree *[]){l}, &w->fx.params));
}
static nb_tree *fx_args1(walk *w) { /* (leaf,): arguments for fx_fn */
    nb_tree *l = fx_leaf(w);
    FX(args1, "args1", nb_tree_tuple(w->ctx, 1, (nb_tree *[]){l}, &w->fx.args1));
}
static nb_tree *fx_grads(walk *w) {
    nb_tree *p = fx_params(w);
    FX(grads, "grads", nb_grad_template(p, NULL, &w->fx.grads));
}
static nb_treedef *fx_def(walk *w) {
    nb_tree *p = fx_params(w);
    FX(def, "treedef", nb_tree_treedef(p, &w->fx.def));
}
static nb_tree *fx_opt(walk *w) {
    FX(opt, "sgd", nb_optim_sgd(w->ctx, 0.1, NULL, &w->fx.opt));
}
static nb_tree *fx_state(walk *w) {
    nb_tree *o = fx_opt(w), *g = fx_grads(w);
    FX(state, "state", nb_optim_init(o, g, &w->fx.state));
}
static nb_tree *fx_sched(walk *w) {
    FX(sched, "schedule", nb_schedule_constant(w->ctx, 0.1, &w->fx.sched));
}
static nb_tree *fx_mask(walk *w) { /* a bool leaf true: a mask, a filter spec, donate-all */
    FX(mask, "mask", nb_tree_bool(w->ctx, true, &w->fx.mask));
}
static nb_tree *fx_lin(walk *w) {
    nb_array *key = fx_key(w);
    FX(lin, "linear", nb_nn_linear_init(w->ctx, 3, 2, true, NB_DTYPE_F32, key, &w->fx.lin));
}
static nb_tree *fx_mlp(walk *w) {
    nb_array *key = fx_key(w);
    FX(mlp, "mlp", nb_nn_mlp_init(w->ctx, 3, 2, 4, 1, NULL, NB_DTYPE_F32, key, &w->fx.mlp));
}
static nb_tree *fx_ln(walk *w) {
    FX(ln, "layer_norm",
       nb_nn_layer_norm_init(w->ctx, 1, (int64_t[]){3}, 1e-5, true, true, NB_DTYPE_F32, &w->fx.ln));
}
static nb_tree *fx_emb(walk *w) {
    nb_array *key = fx_key(w);
    FX(emb, "embedding", nb_nn_embedding_init(w->ctx, 4, 3, NB_DTYPE_F32, key, &w->fx.emb));
}
static nb_tree *fx_drop(walk *w) { /* training mode: needs a key */
    FX(drop, "dropout", nb_nn_dropout_init(w->ctx, 0.5, false, &w->fx.drop));
}
static nb_tree *fx_conv(walk *w) {
    nb_array *key = fx_key(w);
    FX(conv, "conv2d", nb_nn_conv2d_init(w->ctx, 2, 1, 1, 1, NULL, NB_DTYPE_F32, key, &w->fx.conv));
}
static nb_tree *fx_convn(walk *w) { /* conv1d 2 -> 1 channels: f32[2,3] is [C, L] */
    nb_array *key = fx_key(w);
    FX(convn, "conv1d",
       nb_nn_conv_init(w->ctx, 1, 2, 1, (int64_t[]){1}, NULL, NB_DTYPE_F32, key, &w->fx.convn));
}
static nb_tree *fx_convt(walk *w) {
    nb_array *key = fx_key(w);
    FX(convt, "conv_transpose1d",
       nb_nn_conv_transpose_init(w->ctx, 1, 2, 1, (int64_t[]){1}, NULL, NB_DTYPE_F32, key,
                                 &w->fx.convt));
}
static nb_tree *fx_pool(walk *w) {
    FX(pool, "max_pool", nb_nn_max_pool_init(w->ctx, 1, (int64_t[]){2}, NULL, &w->fx.pool));
}
static nb_tree *fx_gn(walk *w) {
    FX(gn, "group_norm", nb_nn_group_norm_init(w->ctx, 1, 2, NULL, NB_DTYPE_F32, &w->fx.gn));
}
static nb_tree *fx_rms(walk *w) {
    FX(rms, "rms_norm",
       nb_nn_rms_norm_init(w->ctx, 1, (int64_t[]){3}, 1e-5, true, true, NB_DTYPE_F32, &w->fx.rms));
}
static nb_tree *fx_bn(walk *w) { /* f32[2,3] is [N, C] */
    FX(bn, "batch_norm",
       nb_nn_batch_norm_init(w->ctx, 3, NULL, NB_DTYPE_F32, &w->fx.bn, &w->fx.bn_state));
}
static nb_tree *fx_mha(walk *w) { /* f32[2,3] is [S, 3] */
    nb_array *key = fx_key(w);
    FX(mha, "multihead_attention",
       nb_nn_multihead_attention_init(w->ctx, 1, 3, NULL, NB_DTYPE_F32, key, &w->fx.mha));
}
static nb_tree *fx_gru(walk *w) {
    nb_array *key = fx_key(w);
    FX(gru, "gru_cell", nb_nn_gru_cell_init(w->ctx, 3, 3, true, NB_DTYPE_F32, key, &w->fx.gru));
}
static nb_tree *fx_lstm(walk *w) {
    nb_array *key = fx_key(w);
    FX(lstm, "lstm_cell", nb_nn_lstm_cell_init(w->ctx, 3, 3, true, NB_DTYPE_F32, key, &w->fx.lstm));
}
static nb_fn *fx_fn(walk *w) {
    FX(fn, "fn", nb_fn_create(w->ctx, "ident", body_ident, NULL, &w->fx.fn));
}
static nb_fn *fx_fn_cond(walk *w) {
    FX(fn_cond, "fn_cond", nb_fn_create(w->ctx, "cond", body_false, NULL, &w->fx.fn_cond));
}
static nb_fn *fx_fn_fori(walk *w) {
    FX(fn_fori, "fn_fori", nb_fn_create(w->ctx, "fori", body_fori, NULL, &w->fx.fn_fori));
}
static nb_fn *fx_fn_ode(walk *w) {
    FX(fn_ode, "fn_ode", nb_fn_create(w->ctx, "ode", body_ode, NULL, &w->fx.fn_ode));
}
static nb_fn *fx_step(walk *w) { /* a training step of fx_fn with sgd */
    nb_fn *f = fx_fn(w);
    nb_tree *o = fx_opt(w);
    FX(step, "step", nb_train_step(f, o, NULL, &w->fx.step));
}

/* The argument tree of the traced runs (see tfix). */
static nb_tree *fx_targs(walk *w) {
    if (w->fx.targs != NULL) {
        return w->fx.targs;
    }
    nb_ctx *c = w->ctx;
    nb_array *a[8] = {NULL};
    nb_tree *l[8] = {NULL};
    nb_status s = nb_array_zeros(c, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, &a[0]);
    if (s == NB_OK) {
        s = nb_array_zeros(c, NB_DTYPE_F32, 1, (int64_t[]){3}, &a[1]);
    }
    if (s == NB_OK) {
        s = nb_array_scalar(c, NB_DTYPE_F32, 1.0, &a[2]);
    }
    if (s == NB_OK) {
        s = nb_array_zeros(c, NB_DTYPE_BOOL, 2, (int64_t[]){2, 3}, &a[3]);
    }
    if (s == NB_OK) {
        s = nb_array_scalar(c, NB_DTYPE_I32, 1.0, &a[4]);
    }
    if (s == NB_OK) {
        s = nb_array_zeros(c, NB_DTYPE_I32, 1, (int64_t[]){2}, &a[5]);
    }
    if (s == NB_OK) {
        s = nb_random_key(c, 3, &a[6]);
    }
    if (s == NB_OK) {
        s = nb_array_scalar(c, NB_DTYPE_BOOL, 1.0, &a[7]);
    }
    for (int i = 0; i < 8 && s == NB_OK; i++) {
        s = nb_tree_array(a[i], &l[i]);
    }
    if (s == NB_OK) {
        s = nb_tree_tuple(c, 8, l, &w->fx.targs);
    }
    for (int i = 0; i < 8; i++) {
        nb_tree_destroy(l[i]);
        nb_array_destroy(a[i]);
    }
    if (s != NB_OK) {
        fx_fail(w, "traced arguments", s);
    }
    return w->fx.targs;
}

static void fx_release(walk *w) {
    fixtures *f = &w->fx;
    nb_array *arrays[] = {f->arr, f->vec, f->ones, f->key, f->rows, f->labels, f->yb};
    nb_tree *trees[] = {f->leaf,   f->ival,  f->fval,  f->bval, f->sval,  f->fnref, f->list,
                        f->params, f->args1, f->grads, f->opt,  f->state, f->sched, f->mask,
                        f->lin,    f->mlp,   f->ln,    f->emb,  f->drop,  f->conv,  f->targs,
                        f->convn,  f->convt, f->pool,  f->gn,   f->rms,   f->bn,    f->bn_state,
                        f->mha,    f->gru,   f->lstm};
    nb_fn *fns[] = {f->step, f->fn, f->fn_cond, f->fn_fori, f->fn_ode};
    nb_batcher_destroy(f->bat);
    nb_treedef_destroy(f->def);
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        nb_fn_destroy(fns[i]);
    }
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        nb_array_destroy(arrays[i]);
    }
    memset(f, 0, sizeof *f);
}

/* Shorthands for the walkers. */
#define WALK(f) static void w_##f(walk *w)
#define TWALK(f) static void t_##f(walk *w)
#define T (w->t)

/* ====================================================================================== */
/* ---- core.h --------------------------------------------------------------------------- */

WALK(nb_build_info) {
    char buf[64];
    size_t need = 42;
    W_ST(nb_build_info(NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}

WALK(nb_ctx_create) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.allocator.alloc = NUL(o.allocator.alloc);
    o.allocator.free = NUL(o.allocator.free);
    nb_ctx *c = S_C;
    /* No context exists yet: nothing to record a message on (core.h: "No message is available
     * on failure ... the status says why"). */
    w->no_ctx = true;
    W_ST(nb_ctx_create(&o, OUT(&c)));
    W_NULLOUT(c);
    if (c != NULL && c != S_C) {
        nb_ctx_destroy(c);
    }
}

WALK(nb_ctx_destroy) {
    (void)w;
    nb_ctx_destroy(NULL); /* a no-op; a destroyed context is undefined (core.h) */
}

WALK(nb_ctx_errmsg) {
    (void)w;
    const char *m = nb_ctx_errmsg(NULL);
    W_TRUE(m != NULL && m[0] != '\0'); /* "a static message saying so" */
}

WALK(nb_ctx_errcode) {
    (void)w;
    W_TRUE(nb_ctx_errcode(NULL) == NB_ERR_MISUSE);
}

WALK(nb_ctx_clear_error) {
    (void)w;
    nb_ctx_clear_error(NULL); /* a no-op */
}

WALK(nb_ctx_stats_get) {
    nb_ctx_stats st;
    memset(&st, 0xab, sizeof st);
    W_ST(nb_ctx_stats_get(CTX(w->ctx), OUT(&st)));
    W_ZEROMEM(st);
}

WALK(nb_ctx_n_threads) {
    (void)w;
    W_TRUE(nb_ctx_n_threads(NULL) == 0);
}

WALK(nb_ctx_alloc) {
    (void)w;
    W_TRUE(nb_ctx_alloc(NULL, 64, 8) == NULL);
}

WALK(nb_ctx_free) {
    (void)w;
    nb_ctx_free(NULL, NULL, 64); /* a no-op */
}

/* ---- array.h -------------------------------------------------------------------------- */

static const int64_t k_shape23[2] = {2, 3};

WALK(nb_array_zeros) {
    nb_array *o = S_A;
    W_ST(nb_array_zeros(CTX(w->ctx), NB_DTYPE_F32, 2, NUL(k_shape23), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_ones) {
    nb_array *o = S_A;
    W_ST(nb_array_ones(CTX(w->ctx), NB_DTYPE_F32, 2, NUL(k_shape23), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_full) {
    nb_array *o = S_A;
    W_ST(nb_array_full(CTX(w->ctx), NB_DTYPE_F32, 2, NUL(k_shape23), 1.0, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_scalar) {
    nb_array *o = S_A;
    W_ST(nb_array_scalar(CTX(w->ctx), NB_DTYPE_F32, 1.0, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_from_data) {
    static const float data[6] = {0};
    nb_array *o = S_A;
    W_ST(nb_array_from_data(CTX(w->ctx), NB_DTYPE_F32, 2, NUL(k_shape23), NUL(data), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_arange) {
    nb_array *o = S_A;
    W_ST(nb_array_arange(CTX(w->ctx), NB_DTYPE_F32, 0, 4, 1, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_linspace) {
    nb_array *o = S_A;
    W_ST(nb_array_linspace(CTX(w->ctx), NB_DTYPE_F32, 0, 1, 3, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_eye) {
    nb_array *o = S_A;
    W_ST(nb_array_eye(CTX(w->ctx), NB_DTYPE_F32, 2, 2, 0, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_copy) {
    nb_array *a = fx_arr(w), *o = S_A;
    W_ST(nb_array_copy(ARR(a), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_cast) {
    nb_array *a = fx_arr(w), *o = S_A;
    W_ST(nb_array_cast(ARR(a), NB_DTYPE_F64, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_reshape) {
    nb_array *a = fx_arr(w), *o = S_A;
    W_ST(nb_array_reshape(ARR(a), 1, NUL((const int64_t[]){6}), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_index) {
    nb_array *a = fx_arr(w), *o = S_A;
    W_ST(nb_array_index(ARR(a), 1, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_array_rows) {
    nb_array *a = fx_arr(w), *o = S_A;
    W_ST(nb_array_rows(ARR(a), 0, 1, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}

WALK(nb_array_sum) {
    nb_array *a = fx_arr(w);
    double v = 42;
    W_ST(nb_array_sum(ARR(a), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_array_mean) {
    nb_array *a = fx_arr(w);
    double v = 42;
    W_ST(nb_array_mean(ARR(a), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_array_argmax) {
    nb_array *a = fx_arr(w), *o = S_A;
    W_ST(nb_array_argmax(ARR(a), -1, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_array_count_equal) {
    nb_array *a = fx_arr(w);
    int64_t n = 42;
    W_ST(nb_array_count_equal(ARR(a), ARR(a), OUT(&n)));
    W_ZERO(n);
}

WALK(nb_array_retain) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_retain(ARR(a)) == NULL);
}

WALK(nb_array_destroy) {
    nb_array *a = fx_arr(w);
    nb_ctx_clear_error(w->ctx);
    nb_array_destroy(ARR(a)); /* NULL: a no-op; destroyed: NB_ERR_MISUSE on its context */
    W_TRUE(nb_ctx_errcode(w->ctx) == (w->spoil == SP_DEAD ? NB_ERR_MISUSE : NB_OK));
}

WALK(nb_array_ctx) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_ctx(ARR(a)) == NULL);
}
WALK(nb_array_dtype) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_dtype(ARR(a)) == NB_DTYPE_F32);
}
WALK(nb_array_rank) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_rank(ARR(a)) == -1);
}
WALK(nb_array_shape) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_shape(ARR(a)) == NULL);
}
WALK(nb_array_dim) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_dim(ARR(a), 0) == -1);
}
WALK(nb_array_size) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_size(ARR(a)) == -1);
}
WALK(nb_array_nbytes) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_nbytes(ARR(a)) == 0);
}
WALK(nb_array_data) {
    nb_array *a = fx_arr(w);
    W_TRUE(nb_array_data(ARR(a)) == NULL);
}
WALK(nb_array_check) {
    nb_array *a = fx_arr(w);
    W_ST(nb_array_check(ARR(a)));
}

WALK(nb_array_get) {
    nb_array *a = fx_arr(w);
    double v = 42;
    W_ST(nb_array_get(ARR(a), NUL(((const int64_t[]){0, 0})), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_array_set) {
    nb_array *a = fx_arr(w);
    W_ST(nb_array_set(ARR(a), NUL(((const int64_t[]){0, 0})), 1.0));
}
WALK(nb_array_get_i64) {
    nb_array *a = fx_arr(w);
    int64_t v = 42;
    W_ST(nb_array_get_i64(ARR(a), NUL(((const int64_t[]){0, 0})), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_array_set_i64) {
    nb_array *a = fx_arr(w);
    W_ST(nb_array_set_i64(ARR(a), NUL(((const int64_t[]){0, 0})), 1));
}
WALK(nb_array_get_flat) {
    nb_array *a = fx_arr(w);
    double v = 42;
    W_ST(nb_array_get_flat(ARR(a), 0, OUT(&v)));
    W_ZERO(v);
}

WALK(nb_array_equal) {
    nb_array *a = fx_arr(w);
    bool b = true;
    W_ST(nb_array_equal(ARR(a), ARR(a), OUT(&b)));
    W_ZERO(b);
}
WALK(nb_array_identical) {
    nb_array *a = fx_arr(w);
    bool b = true;
    W_ST(nb_array_identical(ARR(a), ARR(a), OUT(&b)));
    W_ZERO(b);
}
WALK(nb_array_allclose) {
    nb_array *a = fx_arr(w);
    bool b = true;
    W_ST(nb_array_allclose(ARR(a), ARR(a), 0, 0, OUT(&b)));
    W_ZERO(b);
}

WALK(nb_array_format) {
    nb_array *a = fx_arr(w);
    char buf[128];
    size_t need = 42;
    W_ST(nb_array_format(ARR(a), NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}
WALK(nb_array_fprint) {
    nb_array *a = fx_arr(w);
    W_ST(nb_array_fprint(ARR(a), NUL(g_devnull)));
}
WALK(nb_array_format_sig) {
    nb_array *a = fx_arr(w);
    char buf[64];
    size_t need = 42;
    W_ST(nb_array_format_sig(ARR(a), NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}

/* ---- tree.h --------------------------------------------------------------------------- */

WALK(nb_tree_null) {
    nb_tree *o = S_T;
    W_ST(nb_tree_null(CTX(w->ctx), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_array) {
    nb_array *a = fx_arr(w);
    nb_tree *o = S_T;
    W_ST(nb_tree_array(ARR(a), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_int) {
    nb_tree *o = S_T;
    W_ST(nb_tree_int(CTX(w->ctx), 1, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_float) {
    nb_tree *o = S_T;
    W_ST(nb_tree_float(CTX(w->ctx), 1.0, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_bool) {
    nb_tree *o = S_T;
    W_ST(nb_tree_bool(CTX(w->ctx), true, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_string) {
    nb_tree *o = S_T;
    W_ST(nb_tree_string(CTX(w->ctx), NUL("s"), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_fnref) {
    nb_tree *o = S_T;
    /* "fn must not be NULL": which status is not said, so any failure */
    W_ST(nb_tree_fnref(CTX(w->ctx), NUL_ACC(plain_fn, ACC_MISUSE | ACC(NB_ERR_INVALID)),
                       NUL("plain_fn"), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_list) {
    nb_tree *l = fx_leaf(w), *o = S_T;
    nb_tree *items[2] = {l, TREE(l)};
    W_ST(nb_tree_list(CTX(w->ctx), 2, NUL(items), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_tuple) {
    nb_tree *l = fx_leaf(w), *o = S_T;
    nb_tree *items[2] = {l, TREE(l)};
    W_ST(nb_tree_tuple(CTX(w->ctx), 2, NUL(items), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_dict) {
    nb_tree *l = fx_leaf(w), *o = S_T;
    nb_tree *items[2] = {l, TREE(l)};
    /* tree.h: NB_ERR_INVALID for "NULL or duplicate dict key" */
    const char *keys[2] = {"a", NUL_ACC("b", ACC(NB_ERR_INVALID))};
    W_ST(nb_tree_dict(CTX(w->ctx), 2, NUL_ACC(keys, ACC_MISUSE | ACC(NB_ERR_INVALID)), NUL(items),
                      OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_retain) {
    nb_tree *t = fx_ival(w);
    W_TRUE(nb_tree_retain(TREE(t)) == NULL);
}
WALK(nb_tree_destroy) {
    nb_tree *t = fx_ival(w);
    nb_ctx_clear_error(w->ctx);
    nb_tree_destroy(TREE(t)); /* NULL: a no-op; destroyed: NB_ERR_MISUSE on the context */
    W_TRUE(nb_ctx_errcode(w->ctx) == (w->spoil == SP_DEAD ? NB_ERR_MISUSE : NB_OK));
}
WALK(nb_tree_freeze) {
    nb_tree *t = fx_leaf(w), *o = S_T;
    W_ST(nb_tree_freeze(TREE(t), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_is_frozen) {
    nb_tree *t = fx_leaf(w);
    W_TRUE(!nb_tree_is_frozen(TREE(t)));
}
WALK(nb_tree_check) {
    nb_tree *t = fx_leaf(w);
    W_ST(nb_tree_check(TREE(t)));
}
WALK(nb_tree_ctx) {
    nb_tree *t = fx_leaf(w);
    W_TRUE(nb_tree_ctx(TREE(t)) == NULL);
}
WALK(nb_tree_kind_of) {
    nb_tree *t = fx_leaf(w);
    W_TRUE(nb_tree_kind_of(TREE(t)) == NB_TREE_KIND_NULL);
}
/* is_leaf / is_static / is_dynamic document no result for a NULL or destroyed handle. A
 * handle that is no tree is neither static nor dynamic; whether it is a "leaf" is not said
 * (test_misuse.c: "unspecified value, must not crash"), so only the call is walked. */
WALK(nb_tree_is_leaf) {
    nb_tree *t = fx_list(w);
    (void)nb_tree_is_leaf(TREE(t));
}
WALK(nb_tree_is_static) {
    nb_tree *t = fx_ival(w);
    W_TRUE(!nb_tree_is_static(TREE(t)));
}
WALK(nb_tree_is_dynamic) {
    nb_tree *t = fx_leaf(w);
    W_TRUE(!nb_tree_is_dynamic(TREE(t)));
}
WALK(nb_tree_len) {
    nb_tree *t = fx_list(w);
    W_TRUE(nb_tree_len(TREE(t)) == -1);
}
WALK(nb_tree_child) {
    nb_tree *t = fx_list(w);
    W_TRUE(nb_tree_child(TREE(t), 0) == NULL);
}
WALK(nb_tree_key) {
    nb_tree *t = fx_params(w);
    W_TRUE(nb_tree_key(TREE(t), 0) == NULL);
}
WALK(nb_tree_get) {
    nb_tree *t = fx_params(w);
    W_TRUE(nb_tree_get(TREE(t), NUL("w")) == NULL);
}
WALK(nb_tree_get_array) {
    nb_tree *t = fx_leaf(w);
    W_TRUE(nb_tree_get_array(TREE(t)) == NULL);
}
WALK(nb_tree_get_int) {
    nb_tree *t = fx_ival(w);
    int64_t v = 42;
    W_ST(nb_tree_get_int(TREE(t), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_tree_get_float) {
    nb_tree *t = fx_fval(w);
    double v = 42;
    W_ST(nb_tree_get_float(TREE(t), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_tree_get_bool) {
    nb_tree *t = fx_bval(w);
    bool v = true;
    W_ST(nb_tree_get_bool(TREE(t), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_tree_get_string) {
    nb_tree *t = fx_sval(w);
    const char *v = "x";
    W_ST(nb_tree_get_string(TREE(t), OUT(&v)));
    W_NULLOUT(v);
}
WALK(nb_tree_get_fnref) {
    nb_tree *t = fx_fnref(w);
    nb_fnptr fn = plain_fn;
    const char *name = "x";
    /* name NULL is accepted (the name is not returned; not documented) */
    W_ST(nb_tree_get_fnref(TREE(t), OUT(&fn), &name));
    if ((const void *)&fn != w->nulled_out && fn != NULL) {
        walk_failf(w, __LINE__, "out-parameter fn was not set to NULL on failure");
    }
    W_NULLOUT(name);
}
WALK(nb_tree_num_leaves) {
    nb_tree *t = fx_params(w);
    W_TRUE(nb_tree_num_leaves(TREE(t)) == -1);
}
WALK(nb_tree_lookup) {
    nb_tree *t = fx_params(w);
    const nb_tree *o = S_T;
    W_ST(nb_tree_lookup(TREE(t), NUL("w"), OUT(&o)));
    W_NULLOUT(o);
}
WALK(nb_tree_leaf_path) {
    nb_tree *t = fx_params(w);
    char buf[64];
    size_t need = 42;
    W_ST(nb_tree_leaf_path(TREE(t), 0, NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}
WALK(nb_tree_flatten) {
    nb_tree *t = fx_params(w), *lv = S_T;
    nb_treedef *d = S_D;
    W_ST(nb_tree_flatten(TREE(t), &lv, &d)); /* either out-parameter may be NULL */
    W_NULLOUT(lv);
    W_NULLOUT(d);
    drop_t(lv);
    drop_d(d);
}
WALK(nb_tree_unflatten) {
    nb_treedef *d = fx_def(w);
    nb_tree *lv = fx_list(w), *o = S_T;
    W_ST(nb_tree_unflatten(TDEF(d), TREE(lv), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_treedef) {
    nb_tree *t = fx_params(w);
    nb_treedef *o = S_D;
    W_ST(nb_tree_treedef(TREE(t), OUT(&o)));
    W_NULLOUT(o);
    drop_d(o);
}
WALK(nb_treedef_retain) {
    nb_treedef *d = fx_def(w);
    W_TRUE(nb_treedef_retain(TDEF(d)) == NULL);
}
WALK(nb_treedef_destroy) {
    nb_treedef *d = fx_def(w);
    nb_ctx_clear_error(w->ctx);
    nb_treedef_destroy(TDEF(d));
    W_TRUE(nb_ctx_errcode(w->ctx) == (w->spoil == SP_DEAD ? NB_ERR_MISUSE : NB_OK));
}
WALK(nb_treedef_num_leaves) {
    nb_treedef *d = fx_def(w);
    W_TRUE(nb_treedef_num_leaves(TDEF(d)) == -1);
}
WALK(nb_treedef_hash) {
    nb_treedef *d = fx_def(w);
    W_TRUE(nb_treedef_hash(TDEF(d)) == 0);
}
WALK(nb_treedef_equal) {
    nb_treedef *d = fx_def(w);
    W_TRUE(!nb_treedef_equal(TDEF(d), TDEF(d)));
}
WALK(nb_treedef_format) {
    nb_treedef *d = fx_def(w);
    char buf[64];
    size_t need = 42;
    W_ST(nb_treedef_format(TDEF(d), NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}
WALK(nb_tree_map) {
    nb_tree *t = fx_params(w), *o = S_T;
    W_ST(nb_tree_map(TREE(t), NUL(map_keep), NULL, 0, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_map_n) {
    nb_tree *t = fx_params(w), *o = S_T;
    const nb_tree *trees[2] = {t, TREE(t)};
    const nb_tree *const *p = NUL(trees);
    if (p == NULL) {
        w->ctx_args = 0; /* the trees are not reachable through a NULL array */
    }
    W_ST(nb_tree_map_n(2, p, NUL(map_keep), NULL, 0, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_map_fail) {
    W_ST(nb_tree_map_fail(CTX(w->ctx), NB_ERR_SHAPE, NUL("shape %d"), 1));
}
WALK(nb_tree_pred_is_array) {
    nb_tree *t = fx_leaf(w);
    W_TRUE(!nb_tree_pred_is_array(NULL, TREE(t)));
}
WALK(nb_tree_pred_is_inexact_array) {
    nb_tree *t = fx_leaf(w);
    W_TRUE(!nb_tree_pred_is_inexact_array(NULL, TREE(t)));
}
WALK(nb_tree_filter) {
    nb_tree *t = fx_params(w), *o = S_T;
    W_ST(nb_tree_filter(TREE(t), NUL(pred_yes), NULL, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_partition) {
    nb_tree *t = fx_params(w), *m = S_T, *r = S_T;
    W_ST(nb_tree_partition(TREE(t), NUL(pred_yes), NULL, OUT(&m), OUT(&r)));
    W_NULLOUT(m);
    W_NULLOUT(r);
    drop_t(m);
    drop_t(r);
}
WALK(nb_tree_combine) {
    nb_tree *t = fx_params(w), *o = S_T;
    const nb_tree *trees[2] = {t, TREE(t)};
    const nb_tree *const *p = NUL(trees);
    if (p == NULL) {
        w->ctx_args = 0; /* the trees are not reachable through a NULL array */
    }
    W_ST(nb_tree_combine(2, p, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_tree_structure_equal) {
    nb_tree *t = fx_params(w);
    bool b = true;
    W_ST(nb_tree_structure_equal(TREE(t), TREE(t), OUT(&b)));
    W_ZERO(b);
}
WALK(nb_tree_equal) {
    nb_tree *t = fx_params(w);
    bool b = true;
    W_ST(nb_tree_equal(TREE(t), TREE(t), OUT(&b)));
    W_ZERO(b);
}
WALK(nb_tree_diff) {
    nb_tree *t = fx_params(w);
    bool differ = true;
    char buf[64];
    size_t need = 42;
    W_ST(nb_tree_diff(TREE(t), TREE(t), NB_TREE_DIFF_VALUES, OUT(&differ), NUL(buf), sizeof buf,
                      &need));
    W_ZERO(differ);
    W_ZERO(need);
}
WALK(nb_tree_format) {
    nb_tree *t = fx_params(w);
    char buf[256];
    size_t need = 42;
    W_ST(nb_tree_format(TREE(t), NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}
WALK(nb_tree_fprint) {
    nb_tree *t = fx_params(w);
    W_ST(nb_tree_fprint(TREE(t), NUL(g_devnull)));
}
WALK(nb_tree_fprint_leaves) {
    nb_tree *t = fx_params(w);
    W_ST(nb_tree_fprint_leaves(TREE(t), NUL(g_devnull)));
}

/* ---- trace.h -------------------------------------------------------------------------- */

TWALK(nb_trace_ctx) {
    W_TRUE(nb_trace_ctx(TRC(T->tr)) == NULL);
}
TWALK(nb_trace_status) {
    W_ST(nb_trace_status(TRC(T->tr)));
}
TWALK(nb_trace_fail) {
    /* tr or fmt NULL: nothing to record on or with; the call itself reports the misuse */
    W_ST(nb_trace_fail(TRC(T->tr), NB_ERR_SHAPE, NUL("shape %d"), 1));
}
TWALK(nb_get) {
    T_VAR(nb_get(TRC(T->tr), TREE(T->args), NUL("[%d]"), 0));
}
TWALK(nb_var_of) {
    T_VAR(nb_var_of(TRC(T->tr), TREE(T->xleaf)));
}
TWALK(nb_leaf) {
    T_TREE(nb_leaf(VAR(T->x)));
}
TWALK(nb_return) {
    nb_tree *o = S_T;
    W_ST(nb_return(VAR(T->x), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
/* The var accessors: rank and shape document -1 and NULL for a NULL var; the others say
 * nothing, and are held to the brackets of their nb_array twins. */
TWALK(nb_var_trace) {
    W_TRUE(nb_var_trace(VAR(T->x)) == NULL);
}
TWALK(nb_var_dtype) {
    W_TRUE(nb_var_dtype(VAR(T->x)) == NB_DTYPE_F32);
}
TWALK(nb_var_rank) {
    W_TRUE(nb_var_rank(VAR(T->x)) == -1);
}
TWALK(nb_var_shape) {
    W_TRUE(nb_var_shape(VAR(T->x)) == NULL);
}
TWALK(nb_var_dim) {
    W_TRUE(nb_var_dim(VAR(T->x), 0) == -1);
}
TWALK(nb_var_size) {
    W_TRUE(nb_var_size(VAR(T->x)) == -1);
}
TWALK(nb_var_is_poison) {
    W_TRUE(nb_var_is_poison(VAR(T->x)));
}

TWALK(nb_scalar) {
    T_VAR(nb_scalar(TRC(T->tr), 1.0));
}
TWALK(nb_scalar_typed) {
    T_VAR(nb_scalar_typed(TRC(T->tr), NB_DTYPE_F32, 1.0));
}
TWALK(nb_full) {
    T_VAR(nb_full(TRC(T->tr), NB_DTYPE_F32, 2, SHAPE_PTR(k_shape23), 1.0));
}
TWALK(nb_constant) {
    nb_array *a = fx_arr(w);
    T_VAR(nb_constant(TRC(T->tr), ARR(a)));
}
TWALK(nb_iota) {
    T_VAR(nb_iota(TRC(T->tr), NB_DTYPE_F32, 2, SHAPE_PTR(k_shape23), 0));
}

#define UNARY(f, x)                                                                                \
    TWALK(f) {                                                                                     \
        T_VAR(f(VAR(T->x)));                                                                       \
    }
#define BINARY(f, x)                                                                               \
    TWALK(f) {                                                                                     \
        T_VAR(f(VAR(T->x), VAR(T->x)));                                                            \
    }
UNARY(nb_neg, x)
UNARY(nb_abs, x)
UNARY(nb_sign, x)
UNARY(nb_exp, x)
UNARY(nb_expm1, x)
UNARY(nb_log, x)
UNARY(nb_log1p, x)
UNARY(nb_sqrt, x)
UNARY(nb_rsqrt, x)
UNARY(nb_square, x)
UNARY(nb_reciprocal, x)
UNARY(nb_sin, x)
UNARY(nb_cos, x)
UNARY(nb_tan, x)
UNARY(nb_tanh, x)
UNARY(nb_sigmoid, x)
UNARY(nb_relu, x)
UNARY(nb_gelu, x)
UNARY(nb_softplus, x)
UNARY(nb_erf, x)
UNARY(nb_logical_not, b)
UNARY(nb_stop_gradient, x)
UNARY(nb_nn_identity, x)
BINARY(nb_add, x)
BINARY(nb_sub, x)
BINARY(nb_mul, x)
BINARY(nb_div, x)
BINARY(nb_pow, x)
BINARY(nb_maximum, x)
BINARY(nb_minimum, x)
BINARY(nb_eq, x)
BINARY(nb_ne, x)
BINARY(nb_lt, x)
BINARY(nb_le, x)
BINARY(nb_gt, x)
BINARY(nb_ge, x)
BINARY(nb_logical_and, b)
BINARY(nb_logical_or, b)
BINARY(nb_dot, v)

TWALK(nb_select) {
    T_VAR(nb_select(VAR(T->b), VAR(T->x), VAR(T->x)));
}
TWALK(nb_debug_print) {
    /* the label is required ("" for none) */
    T_VAR(nb_debug_print(VAR(T->x), NUL("x")));
}
TWALK(nb_cast) {
    T_VAR(nb_cast(VAR(T->x), NB_DTYPE_F64));
}
TWALK(nb_matmul) {
    T_VAR(nb_matmul(VAR(T->x), VAR(T->v)));
}
/* linalg.h: a square f32[2,2] and a right-hand side f32[2] made from the fixtures (NULL
 * outside a trace) */
static nb_var *t_square(walk *w) {
    return nb_matmul(T->x, nb_transpose(T->x, (int[]){1, 0}));
}
static nb_var *t_rhs(walk *w) {
    return nb_sum(T->x, (int[]){1}, 1, false);
}
TWALK(nb_solve) {
    nb_var *a = t_square(w), *b = t_rhs(w);
    T_VAR(nb_solve(VAR(a), VAR(b)));
}
TWALK(nb_lu_factor) {
    nb_var *a = t_square(w);
    T_VAR(nb_lu_factor(VAR(a)));
}
TWALK(nb_lu_solve) {
    nb_var *lu = nb_lu_factor(t_square(w)), *b = t_rhs(w);
    T_VAR(nb_lu_solve(VAR(lu), VAR(b), true));
}
TWALK(nb_lu_singular) {
    nb_var *lu = nb_lu_factor(t_square(w));
    T_VAR(nb_lu_singular(VAR(lu)));
}
TWALK(nb_cholesky) {
    nb_var *a = t_square(w);
    T_VAR(nb_cholesky(VAR(a)));
}
TWALK(nb_cholesky_failed) {
    nb_var *l = nb_cholesky(t_square(w));
    T_VAR(nb_cholesky_failed(VAR(l)));
}
TWALK(nb_cholesky_solve) {
    nb_var *l = nb_cholesky(t_square(w)), *b = t_rhs(w);
    T_VAR(nb_cholesky_solve(VAR(l), VAR(b)));
}
TWALK(nb_triangular_solve) {
    nb_var *a = t_square(w), *b = t_rhs(w);
    T_VAR(nb_triangular_solve(VAR(a), VAR(b), true, false, false));
}
TWALK(nb_slogdet) {
    nb_var *a = t_square(w), *sign = NULL; /* sign may be NULL: not spoiled */
    T_VAR(nb_slogdet(VAR(a), &sign));
}
TWALK(nb_det) {
    nb_var *a = t_square(w);
    T_VAR(nb_det(VAR(a)));
}
TWALK(nb_inv) {
    nb_var *a = t_square(w);
    T_VAR(nb_inv(VAR(a)));
}
TWALK(nb_diagonal) {
    nb_var *a = t_square(w);
    T_VAR(nb_diagonal(VAR(a)));
}

#define REDUCE(f)                                                                                  \
    TWALK(f) {                                                                                     \
        T_VAR(f(VAR(T->x), NULL, 0, false)); /* axes NULL: every axis */                           \
    }
REDUCE(nb_sum)
REDUCE(nb_mean)
REDUCE(nb_max)
REDUCE(nb_min)
REDUCE(nb_prod)
REDUCE(nb_logsumexp)
TWALK(nb_argmax) {
    T_VAR(nb_argmax(VAR(T->x), 1, false));
}
TWALK(nb_argmin) {
    T_VAR(nb_argmin(VAR(T->x), 1, false));
}
TWALK(nb_softmax) {
    T_VAR(nb_softmax(VAR(T->x), 1));
}
TWALK(nb_log_softmax) {
    T_VAR(nb_log_softmax(VAR(T->x), 1));
}

TWALK(nb_reshape) {
    T_VAR(nb_reshape(VAR(T->x), 1, NUL((const int64_t[]){6})));
}
TWALK(nb_broadcast_to) {
    T_VAR(nb_broadcast_to(VAR(T->x), 3, NUL(((const int64_t[]){4, 2, 3}))));
}
TWALK(nb_transpose) {
    T_VAR(nb_transpose(VAR(T->x), NULL)); /* perm NULL: reverse the axes */
}
TWALK(nb_expand_dims) {
    T_VAR(nb_expand_dims(VAR(T->x), 0));
}
TWALK(nb_squeeze) {
    T_VAR(nb_squeeze(VAR(T->x), NULL, 0)); /* axes NULL: every size-1 axis */
}
TWALK(nb_slice) {
    /* step NULL means 1; start and stop NULL are taken as x[:] on every axis (not documented) */
    T_VAR(nb_slice(VAR(T->x), (const int64_t[]){0, 0}, (const int64_t[]){1, 2}, NULL));
}
TWALK(nb_concatenate) {
    nb_var *xs[2] = {VAR(T->x), VAR(T->x)};
    nb_var *const *p = NUL(xs);
    if (p == NULL) {
        w->carriers = 0; /* the vars are not reachable through a NULL list */
    }
    T_VAR(nb_concatenate(2, p, 0));
}
TWALK(nb_stack) {
    nb_var *xs[2] = {VAR(T->x), VAR(T->x)};
    nb_var *const *p = NUL(xs);
    if (p == NULL) {
        w->carriers = 0;
    }
    T_VAR(nb_stack(2, p, 0));
}
TWALK(nb_pad) {
    /* lo and hi NULL are taken as no padding on that side (not documented) */
    T_VAR(nb_pad(VAR(T->x), (const int64_t[]){1, 1}, (const int64_t[]){0, 1}, 0.0));
}
TWALK(nb_take) {
    T_VAR(nb_take(VAR(T->x), VAR(T->idx), 1));
}
TWALK(nb_take_along_axis) {
    T_VAR(nb_take_along_axis(VAR(T->x), VAR(T->idx), 1));
}
TWALK(nb_one_hot) {
    T_VAR(nb_one_hot(VAR(T->idx), 3, NB_DTYPE_F32));
}
TWALK(nb_dynamic_slice) {
    nb_var *starts[2] = {VAR(T->i), VAR(T->i)};
    T_VAR(nb_dynamic_slice(VAR(T->x), NUL(starts), NUL(((const int64_t[]){1, 2}))));
}
TWALK(nb_dynamic_update_slice) {
    nb_var *starts[2] = {VAR(T->i), VAR(T->i)};
    T_VAR(nb_dynamic_update_slice(VAR(T->x), VAR(T->x), NUL(starts)));
}

/* ---- fn.h ----------------------------------------------------------------------------- */

WALK(nb_fn_create) {
    nb_fn *o = S_F;
    nb_tree *self = fx_params(w);
    /* name NULL gives "fn" and self may be NULL: not misuse */
    W_ST(nb_fn_create(CTX(w->ctx), "f", NUL(body_ident), TREE_OPT(self), OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_fn_retain) {
    nb_fn *f = fx_fn(w);
    W_TRUE(nb_fn_retain(FN(f)) == NULL);
}
WALK(nb_fn_check) {
    nb_fn *f = fx_fn(w);
    W_ST(nb_fn_check(FN(f)));
}
WALK(nb_fn_destroy) {
    nb_fn *f = fx_fn(w);
    nb_ctx_clear_error(w->ctx);
    nb_fn_destroy(FN(f));
    W_TRUE(nb_ctx_errcode(w->ctx) == (w->spoil == SP_DEAD ? NB_ERR_MISUSE : NB_OK));
}
WALK(nb_fn_name) {
    nb_fn *f = fx_fn(w);
    const char *n = nb_fn_name(FN(f));
    W_TRUE(n != NULL && n[0] == '\0');
}
WALK(nb_jit) {
    nb_fn *f = fx_fn(w), *o = S_F;
    W_ST(nb_jit(FN(f), NULL, OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_max_traces) {
    nb_fn *f = fx_fn(w), *o = S_F;
    W_ST(nb_max_traces(FN(f), 2, OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_fn_call) {
    nb_fn *f = fx_fn(w);
    nb_tree *a = fx_args1(w), *o = S_T;
    W_ST(nb_fn_call(FN(f), TREE(a), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_fn_call_ex) {
    nb_fn *f = fx_fn(w);
    nb_tree *a = fx_args1(w), *m = fx_mask(w), *o = S_T;
    nb_call_opts co = nb_call_opts_default();
    co.donate = TREE_OPT(m);
    W_ST(nb_fn_call_ex(FN(f), TREE(a), &co, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_eval) {
    nb_tree *a = fx_args1(w), *self = fx_params(w), *o = S_T;
    W_ST(nb_eval(CTX(w->ctx), NUL(body_ident), TREE_OPT(self), TREE(a), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
TWALK(nb_apply) {
    nb_fn *f = fx_fn(w);
    T_TREE(nb_apply(TRC(T->tr), FN(f), TREE(T->args)));
}
TWALK(nb_apply1) {
    nb_fn *f = fx_fn(w);
    T_VAR(nb_apply1(TRC(T->tr), FN(f), VAR(T->x)));
}
WALK(nb_fn_stats_get) {
    nb_fn *f = fx_fn(w);
    nb_fn_stats st;
    memset(&st, 0xab, sizeof st);
    W_ST(nb_fn_stats_get(FN(f), OUT(&st)));
    W_ZEROMEM(st);
}
WALK(nb_fn_retrace_reason) {
    nb_fn *f = fx_fn(w);
    char buf[64];
    size_t need = 42;
    W_ST(nb_fn_retrace_reason(FN(f), 0, NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}
WALK(nb_ctx_clear_cache) {
    (void)w;
    nb_ctx_clear_cache(NULL); /* a no-op */
}
WALK(nb_fn_format_ir) {
    nb_fn *f = fx_fn(w);
    nb_tree *a = fx_args1(w);
    char buf[256];
    size_t need = 42;
    W_ST(nb_fn_format_ir(FN(f), TREE(a), NB_IR_TRACED, NUL(buf), sizeof buf, &need));
    W_ZERO(need);
}

/* ---- ad.h ----------------------------------------------------------------------------- */

WALK(nb_grad) {
    nb_fn *f = fx_fn(w), *o = S_F;
    nb_grad_opts go = nb_grad_opts_default();
    go.filter_spec = TREE_OPT(fx_mask(w));
    W_ST(nb_grad(FN(f), &go, OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_value_and_grad) {
    nb_fn *f = fx_fn(w), *o = S_F;
    nb_grad_opts go = nb_grad_opts_default();
    go.filter_spec = TREE_OPT(fx_mask(w));
    W_ST(nb_value_and_grad(FN(f), &go, OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_vjp) {
    nb_fn *f = fx_fn(w), *o = S_F;
    W_ST(nb_vjp(FN(f), OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_jvp) {
    nb_fn *f = fx_fn(w), *o = S_F;
    W_ST(nb_jvp(FN(f), OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_custom_vjp) {
    nb_fn *f = fx_fn(w), *o = S_F;
    W_ST(nb_custom_vjp(FN(f), FN(f), FN(f), OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_custom_jvp) {
    nb_fn *f = fx_fn(w), *o = S_F;
    W_ST(nb_custom_jvp(FN(f), FN(f), OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_vmap) {
    nb_fn *f = fx_fn(w), *o = S_F;
    nb_vmap_opts vo = nb_vmap_opts_default();
    vo.in_axes = TREE_OPT(fx_ival(w)); /* an int leaf: a prefix of any args */
    vo.out_axes = TREE_OPT(fx_ival(w));
    W_ST(nb_vmap(FN(f), &vo, OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
#define JACOBIAN(f)                                                                                \
    WALK(f) {                                                                                      \
        nb_fn *g = fx_fn(w), *o = S_F;                                                             \
        W_ST(f(FN(g), OUT(&o)));                                                                   \
        W_NULLOUT(o);                                                                              \
        drop_f(o);                                                                                 \
    }
JACOBIAN(nb_jacrev)
JACOBIAN(nb_jacfwd)
JACOBIAN(nb_jacobian)
JACOBIAN(nb_hessian)
WALK(nb_grad_template) {
    nb_tree *p = fx_params(w), *m = fx_mask(w), *o = S_T;
    W_ST(nb_grad_template(TREE(p), TREE_OPT(m), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}

/* ---- random.h ------------------------------------------------------------------------- */

static const int64_t k_shape4[1] = {4};

WALK(nb_random_key) {
    nb_array *o = S_A;
    W_ST(nb_random_key(CTX(w->ctx), 1, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_split) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_split(ARR(k), 2, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_split_keys) {
    nb_array *k = fx_key(w), *o[2] = {S_A, S_A};
    W_ST(nb_random_split_keys(ARR(k), 2, OUT(o)));
    W_NULLOUT(o[0]);
    if ((const void *)o != w->nulled_out) { /* keys itself NULL: no entries to clear */
        W_NULLOUT(o[1]);
    }
    drop_a(o[0]);
    drop_a(o[1]);
}
WALK(nb_random_fold_in) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_fold_in(ARR(k), 5, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_bits) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_bits(ARR(k), 1, NUL(k_shape4), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_uniform) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_uniform(ARR(k), NB_DTYPE_F32, 1, NUL(k_shape4), 0, 1, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_normal) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_normal(ARR(k), NB_DTYPE_F32, 1, NUL(k_shape4), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_truncated_normal) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_truncated_normal(ARR(k), NB_DTYPE_F32, -1, 1, 1, NUL(k_shape4), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_bernoulli) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_bernoulli(ARR(k), 0.5, 1, NUL(k_shape4), OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
WALK(nb_random_permutation) {
    nb_array *k = fx_key(w), *o = S_A;
    W_ST(nb_random_permutation(ARR(k), 4, OUT(&o)));
    W_NULLOUT(o);
    drop_a(o);
}
TWALK(nb_rng_split) {
    T_VAR(nb_rng_split(VAR(T->key), 2));
}
TWALK(nb_rng_fold_in) {
    T_VAR(nb_rng_fold_in(VAR(T->key), VAR(T->i)));
}
TWALK(nb_rng_bits) {
    T_VAR(nb_rng_bits(VAR(T->key), 1, SHAPE_PTR(k_shape4)));
}
TWALK(nb_rng_uniform) {
    T_VAR(nb_rng_uniform(VAR(T->key), NB_DTYPE_F32, 1, SHAPE_PTR(k_shape4), 0, 1));
}
TWALK(nb_rng_normal) {
    T_VAR(nb_rng_normal(VAR(T->key), NB_DTYPE_F32, 1, SHAPE_PTR(k_shape4)));
}
TWALK(nb_rng_truncated_normal) {
    T_VAR(nb_rng_truncated_normal(VAR(T->key), NB_DTYPE_F32, -1, 1, 1, SHAPE_PTR(k_shape4)));
}
TWALK(nb_rng_bernoulli) {
    T_VAR(nb_rng_bernoulli(VAR(T->key), 0.5, 1, SHAPE_PTR(k_shape4)));
}
TWALK(nb_rng_permutation) {
    T_VAR(nb_rng_permutation(VAR(T->key), 4));
}

/* ---- data.h --------------------------------------------------------------------------- */

WALK(nb_csv_load) {
    nb_array *f = S_A, *l = S_A; /* labels may be NULL when not wanted */
    W_ST(nb_csv_load(CTX(w->ctx), NUL(NBT_DATA_DIR "/iris.csv"), NULL, OUT(&f), &l));
    W_NULLOUT(f);
    W_NULLOUT(l);
    drop_a(f);
    drop_a(l);
}
WALK(nb_text_load) {
    nb_array *c = S_A;
    char vocab[256];
    int nv = 7;
    /* vocab and n_vocab may be NULL */
    W_ST(nb_text_load(CTX(w->ctx), NUL(NBT_DATA_DIR "/iris.csv"), OUT(&c), vocab, &nv));
    W_NULLOUT(c);
    drop_a(c);
}
WALK(nb_data_split) {
    nb_array *x = fx_rows(w), *y = fx_labels(w), *k = fx_key(w);
    nb_array *xtr = S_A, *ytr = S_A, *xte = S_A, *yte = S_A;
    /* y may be NULL (then y_train and y_test may be too); with y they are required */
    W_ST(
        nb_data_split(ARR(x), ARR_OPT(y), ARR(k), 0.5, OUT(&xtr), OUT(&ytr), OUT(&xte), OUT(&yte)));
    W_NULLOUT(xtr);
    W_NULLOUT(ytr);
    W_NULLOUT(xte);
    W_NULLOUT(yte);
    drop_a(xtr);
    drop_a(ytr);
    drop_a(xte);
    drop_a(yte);
}
WALK(nb_data_standardize) {
    nb_array *x = fx_rows(w), *t = fx_arr(w), *mean = S_A, *sd = S_A;
    /* test, mean and std may be NULL */
    W_ST(nb_data_standardize(ARR(x), ARR_OPT(t), &mean, &sd));
    W_NULLOUT(mean);
    W_NULLOUT(sd);
    drop_a(mean);
    drop_a(sd);
}
WALK(nb_data_standardize_apply) {
    nb_array *x = fx_arr(w), *mean = fx_vec(w), *sd = fx_ones(w);
    W_ST(nb_data_standardize_apply(ARR(x), ARR(mean), ARR(sd)));
}
WALK(nb_batcher_create) {
    nb_array *x = fx_rows(w), *y = fx_labels(w), *k = fx_key(w);
    nb_batcher *o = S_B;
    W_ST(nb_batcher_create(ARR(x), ARR_OPT(y), ARR(k), 2, NULL, OUT(&o)));
    W_NULLOUT(o);
    drop_b(o);
}
WALK(nb_batcher_destroy) {
    nb_batcher *b = fx_bat(w);
    nb_ctx_clear_error(w->ctx);
    nb_batcher_destroy(BAT(b));
    W_TRUE(nb_ctx_errcode(w->ctx) == (w->spoil == SP_DEAD ? NB_ERR_MISUSE : NB_OK));
}
WALK(nb_batcher_num_batches) {
    nb_batcher *b = fx_bat(w);
    W_TRUE(nb_batcher_num_batches(BAT(b)) == -1);
}
WALK(nb_batcher_epoch) {
    nb_batcher *b = fx_bat(w);
    W_ST(nb_batcher_epoch(BAT(b), 0));
}
WALK(nb_batcher_next) {
    nb_batcher *b = fx_bat(w);
    nb_array *xb = fx_arr(w), *yb = fx_yb(w);
    int64_t rows = 42;
    W_ST(nb_batcher_next(BAT(b), ARR(xb), ARR_OPT(yb), OUT(&rows)));
    W_ZERO(rows);
}
WALK(nb_batcher_next_rows) {
    nb_batcher *b = fx_bat(w);
    nb_array *xb = fx_arr(w), *yb = fx_yb(w);
    int64_t rows = 42;
    W_ST(nb_batcher_next_rows(BAT(b), 0, 2, ARR(xb), ARR_OPT(yb), OUT(&rows)));
    W_ZERO(rows);
}
WALK(nb_batcher_next_new) {
    nb_batcher *b = fx_bat(w);
    nb_array *xb = S_A, *yb = S_A; /* yb may be NULL */
    W_ST(nb_batcher_next_new(BAT(b), OUT(&xb), &yb));
    W_NULLOUT(xb);
    W_NULLOUT(yb);
    drop_a(xb);
    drop_a(yb);
}

/* ---- io.h ----------------------------------------------------------------------------- */

WALK(nb_save) {
    nb_tree *t = fx_params(w);
    W_ST(nb_save(TREE(t), NUL(g_new_path)));
    W_TRUE(access(g_new_path, F_OK) != 0);
}
WALK(nb_load) {
    nb_tree *o = S_T;
    W_ST(nb_load(CTX(w->ctx), NUL(g_params_path), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_load_into) {
    nb_tree *t = fx_params(w), *o = S_T;
    W_ST(nb_load_into(TREE(t), NUL(g_params_path), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_load_bytes) {
    nb_tree *o = S_T;
    /* name "is used in messages"; NULL is taken as "<memory>" (not documented) */
    W_ST(nb_load_bytes(CTX(w->ctx), NUL(g_bytes), g_n_bytes, "bytes", OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_checkpoint_save) {
    nb_tree *p = fx_params(w), *s = fx_state(w);
    nb_array *k = fx_key(w);
    /* key may be NULL */
    W_ST(nb_checkpoint_save(NUL(g_new_path), TREE(p), TREE(s), ARR_OPT(k), 3));
    W_TRUE(access(g_new_path, F_OK) != 0);
}
WALK(nb_checkpoint_load) {
    nb_tree *pt = fx_params(w), *st = fx_state(w), *p = S_T, *s = S_T;
    nb_array *k = S_A;
    int64_t step = 42;
    /* "Outputs may be NULL when not wanted" */
    W_ST(nb_checkpoint_load(NUL(g_ckpt_path), TREE(pt), TREE(st), &p, &s, &k, &step));
    W_NULLOUT(p);
    W_NULLOUT(s);
    W_NULLOUT(k);
    W_ZERO(step);
    drop_t(p);
    drop_t(s);
    drop_a(k);
}
WALK(nb_ctx_set_write_hook) {
    W_ST(nb_ctx_set_write_hook(CTX(w->ctx), write_hook, NULL)); /* a NULL hook restores */
}

/* ---- loops.h -------------------------------------------------------------------------- */

WALK(nb_loop_last_stats) {
    W_ST(nb_loop_last_stats(NULL));
}
TWALK(nb_while_loop) {
    nb_fn *c = fx_fn_cond(w), *b = fx_fn(w);
    T_TREE(nb_while_loop(TRC(T->tr), FN(c), FN(b), TREE(T->xleaf), NULL));
}
TWALK(nb_fori_loop) {
    nb_fn *b = fx_fn_fori(w);
    T_TREE(nb_fori_loop(TRC(T->tr), 0, 2, FN(b), TREE(T->xleaf), NULL));
}
TWALK(nb_scan) {
    nb_fn *b = fx_fn(w);
    /* xs NULL: none */
    T_TREE(nb_scan(TRC(T->tr), FN(b), TREE(T->xleaf), TREE_OPT(T->xleaf), 2, NULL));
}
TWALK(nb_cond) {
    nb_fn *f = fx_fn(w);
    T_TREE(nb_cond(TRC(T->tr), VAR(T->bs), FN(f), FN(f), TREE(T->xleaf)));
}
TWALK(nb_switch) {
    nb_fn *f = fx_fn(w);
    nb_fn *branches[2] = {f, FN(f)};
    /* branches NULL: "n >= 1" branches are needed (NB_ERR_INVALID, "bad options") */
    T_TREE(nb_switch(TRC(T->tr), VAR(T->i), 2, NUL_ACC(branches, ACC_MISUSE | ACC(NB_ERR_INVALID)),
                     TREE(T->xleaf)));
}

/* ---- nn.h ----------------------------------------------------------------------------- */

WALK(nb_nn_linear_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_linear_init(CTX(w->ctx), 3, 2, true, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_mlp_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_mlp_init(CTX(w->ctx), 3, 2, 4, 1, NULL, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_layer_norm_init) {
    nb_tree *o = S_T;
    /* nn.h lists NB_ERR_MISUSE for ctx, key and out only: a NULL shape may be NB_ERR_INVALID */
    W_ST(nb_nn_layer_norm_init(CTX(w->ctx), 1,
                               NUL_ACC((const int64_t[]){3}, ACC_MISUSE | ACC(NB_ERR_INVALID)),
                               1e-5, true, true, NB_DTYPE_F32, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_embedding_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_embedding_init(CTX(w->ctx), 4, 3, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_dropout_init) {
    nb_tree *o = S_T;
    W_ST(nb_nn_dropout_init(CTX(w->ctx), 0.5, false, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_conv2d_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_conv2d_init(CTX(w->ctx), 2, 1, 1, 1, NULL, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_conv_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    /* nn.h lists NB_ERR_MISUSE for ctx, key and out only: a NULL kernel may be INVALID */
    W_ST(nb_nn_conv_init(CTX(w->ctx), 1, 2, 1,
                         NUL_ACC((const int64_t[]){1}, ACC_MISUSE | ACC(NB_ERR_INVALID)), NULL,
                         NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_conv_transpose_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_conv_transpose_init(CTX(w->ctx), 1, 2, 1,
                                   NUL_ACC((const int64_t[]){1}, ACC_MISUSE | ACC(NB_ERR_INVALID)),
                                   NULL, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_max_pool_init) {
    nb_tree *o = S_T;
    W_ST(nb_nn_max_pool_init(CTX(w->ctx), 1,
                             NUL_ACC((const int64_t[]){2}, ACC_MISUSE | ACC(NB_ERR_INVALID)), NULL,
                             OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_avg_pool_init) {
    nb_tree *o = S_T;
    W_ST(nb_nn_avg_pool_init(CTX(w->ctx), 1,
                             NUL_ACC((const int64_t[]){2}, ACC_MISUSE | ACC(NB_ERR_INVALID)), NULL,
                             OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_adaptive_avg_pool_init) {
    nb_tree *o = S_T;
    W_ST(nb_nn_adaptive_avg_pool_init(
        CTX(w->ctx), 1, NUL_ACC((const int64_t[]){1}, ACC_MISUSE | ACC(NB_ERR_INVALID)), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_adaptive_max_pool_init) {
    nb_tree *o = S_T;
    W_ST(nb_nn_adaptive_max_pool_init(
        CTX(w->ctx), 1, NUL_ACC((const int64_t[]){1}, ACC_MISUSE | ACC(NB_ERR_INVALID)), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_group_norm_init) {
    nb_tree *o = S_T;
    W_ST(nb_nn_group_norm_init(CTX(w->ctx), 1, 2, NULL, NB_DTYPE_F32, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_rms_norm_init) {
    nb_tree *o = S_T;
    W_ST(nb_nn_rms_norm_init(CTX(w->ctx), 1,
                             NUL_ACC((const int64_t[]){3}, ACC_MISUSE | ACC(NB_ERR_INVALID)), 1e-5,
                             true, true, NB_DTYPE_F32, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_batch_norm_init) {
    nb_tree *o = S_T, *s = S_T;
    W_ST(nb_nn_batch_norm_init(CTX(w->ctx), 3, NULL, NB_DTYPE_F32, OUT(&o), OUT(&s)));
    W_NULLOUT(o);
    W_NULLOUT(s);
    drop_t(o);
    drop_t(s);
}
WALK(nb_nn_multihead_attention_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_multihead_attention_init(CTX(w->ctx), 1, 3, NULL, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_gru_cell_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_gru_cell_init(CTX(w->ctx), 3, 3, true, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_lstm_cell_init) {
    nb_array *k = fx_key(w);
    nb_tree *o = S_T;
    W_ST(nb_nn_lstm_cell_init(CTX(w->ctx), 3, 3, true, NB_DTYPE_F32, ARR(k), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_sequential_init) {
    nb_tree *l = fx_lin(w), *o = S_T;
    nb_tree *layers[2] = {l, TREE(l)};
    /* nn.h lists NB_ERR_MISUSE for ctx, key and out only: NULL layers may be NB_ERR_INVALID */
    W_ST(nb_nn_sequential_init(CTX(w->ctx), 2, NUL_ACC(layers, ACC_MISUSE | ACC(NB_ERR_INVALID)),
                               OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_activation_leaf) {
    nb_tree *o = S_T;
    /* name NULL: a default name. fn NULL: no status documented, so any failure */
    W_ST(nb_nn_activation_leaf(CTX(w->ctx), NUL_ACC(nb_relu, ACC_MISUSE | ACC(NB_ERR_INVALID)),
                               NULL, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_nn_count_params) {
    nb_tree *m = fx_lin(w);
    int64_t n = 42;
    W_ST(nb_nn_count_params(TREE(m), OUT(&n)));
    W_ZERO(n);
}
WALK(nb_nn_inference_mode) {
    nb_tree *m = fx_lin(w), *o = S_T;
    W_ST(nb_nn_inference_mode(TREE(m), true, OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
TWALK(nb_nn_linear) {
    nb_tree *layer = fx_lin(w);
    T_VAR(nb_nn_linear(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_mlp) {
    nb_tree *layer = fx_mlp(w);
    T_VAR(nb_nn_mlp(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_layer_norm) {
    nb_tree *layer = fx_ln(w);
    T_VAR(nb_nn_layer_norm(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_embedding) {
    nb_tree *layer = fx_emb(w);
    T_VAR(nb_nn_embedding(TRC(T->tr), TREE(layer), VAR(T->idx)));
}
TWALK(nb_nn_dropout) {
    nb_tree *layer = fx_drop(w);
    /* a training-mode dropout needs its key ("may be NULL" only in inference mode): an error
     * whose status nn.h does not give */
    T_VAR(nb_nn_dropout(TRC(T->tr), TREE(layer), VAR(T->x),
                        VAR_ACC(T->key, ACC_MISUSE | ACC(NB_ERR_INVALID))));
}
TWALK(nb_nn_conv2d) {
    nb_tree *layer = fx_conv(w);
    T_VAR(nb_nn_conv2d(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_conv) {
    nb_tree *layer = fx_convn(w);
    T_VAR(nb_nn_conv(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_conv_transpose) {
    nb_tree *layer = fx_convt(w);
    T_VAR(nb_nn_conv_transpose(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_pool) {
    nb_tree *layer = fx_pool(w);
    T_VAR(nb_nn_pool(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_group_norm) {
    nb_tree *layer = fx_gn(w);
    T_VAR(nb_nn_group_norm(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_rms_norm) {
    nb_tree *layer = fx_rms(w);
    T_VAR(nb_nn_rms_norm(TRC(T->tr), TREE(layer), VAR(T->x)));
}
TWALK(nb_nn_batch_norm) {
    nb_tree *layer = fx_bn(w);
    const nb_tree *ns = NULL;
    /* the state as an eager tree (its arrays become constants) */
    T_VAR(nb_nn_batch_norm(TRC(T->tr), TREE(layer), VAR(T->x), TREE(w->fx.bn_state), OUT(&ns)));
}
TWALK(nb_nn_multihead_attention) {
    nb_tree *layer = fx_mha(w);
    /* mask and key may be NULL (no mask, no dropout) */
    T_VAR(nb_nn_multihead_attention(TRC(T->tr), TREE(layer), VAR(T->x), VAR(T->x), VAR(T->x), NULL,
                                    NULL));
}
TWALK(nb_nn_gru_cell) {
    nb_tree *layer = fx_gru(w);
    T_VAR(nb_nn_gru_cell(TRC(T->tr), TREE(layer), VAR(T->x), VAR(T->x)));
}
TWALK(nb_nn_lstm_cell) {
    nb_tree *layer = fx_lstm(w);
    nb_var *c = NULL;
    T_VAR(nb_nn_lstm_cell(TRC(T->tr), TREE(layer), VAR(T->x), VAR(T->x), VAR(T->x), OUT(&c)));
}
TWALK(nb_nn_gru) {
    nb_tree *layer = fx_gru(w);
    /* xs f32[2,3]: 2 steps of 3; h0 f32[3]; opts may be NULL (a bounded scan) */
    T_VAR(nb_nn_gru(TRC(T->tr), TREE(layer), VAR(T->x), VAR(T->v), NULL));
}
TWALK(nb_nn_apply) {
    nb_tree *layer = fx_lin(w);
    /* key may be NULL (no dropout in a linear layer) */
    T_VAR(nb_nn_apply(TRC(T->tr), TREE(layer), VAR(T->x), NULL));
}

/* ---- ode.h ---------------------------------------------------------------------------- */

TWALK(nb_diffeqsolve) {
    nb_fn *f = fx_fn_ode(w);
    /* args may be NULL */
    T_TREE(nb_diffeqsolve(TRC(T->tr), FN(f), TREE(T->xleaf), TREE_OPT(T->xleaf), NULL));
}

/* ---- train.h -------------------------------------------------------------------------- */

WALK(nb_train_step) {
    nb_fn *f = fx_fn(w), *o = S_F;
    nb_tree *opt = fx_opt(w);
    nb_train_opts to = nb_train_opts_default();
    to.filter_spec = TREE_OPT(fx_mask(w));
    W_ST(nb_train_step(FN(f), TREE(opt), &to, OUT(&o)));
    W_NULLOUT(o);
    drop_f(o);
}
WALK(nb_train_init) {
    nb_fn *s = fx_step(w);
    nb_tree *p = fx_params(w), *o = S_T;
    W_ST(nb_train_init(FN(s), TREE(p), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_train_eval) {
    nb_fn *f = fx_fn(w);
    nb_tree *p = fx_params(w), *o = S_T;
    W_ST(nb_train_eval(FN(f), TREE(p), TREE_OPT(fx_args1(w)), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
/* every run spoils one argument, so no step runs: params and state stay the fixtures'
 * (loss and aux are optional outputs, not spoiled) */
WALK(nb_train_run) {
    nb_fn *s = fx_step(w);
    nb_tree *p = TREE(fx_params(w)), *st = TREE(fx_state(w));
    double l = 42;
    W_ST(nb_train_run(FN(s), NUL(&p), NUL(&st), TREE_OPT(fx_args1(w)), &l, NULL));
    W_ZERO(l);
}

/* ---- optim.h -------------------------------------------------------------------------- */

#define SCHEDULE(f, ...)                                                                           \
    WALK(f) {                                                                                      \
        nb_tree *o = S_T;                                                                          \
        W_ST(f(CTX(w->ctx), __VA_ARGS__, OUT(&o)));                                                \
        W_NULLOUT(o);                                                                              \
        drop_t(o);                                                                                 \
    }
SCHEDULE(nb_schedule_constant, 0.1)
SCHEDULE(nb_schedule_linear, 1.0, 0.0, 10, 0)
SCHEDULE(nb_schedule_polynomial, 1.0, 0.0, 2.0, 10, 0)
SCHEDULE(nb_schedule_cosine_decay, 1.0, 10, 0.0, 1.0)
SCHEDULE(nb_schedule_warmup_cosine_decay, 0.0, 1.0, 2, 10, 0.0, 1.0)
SCHEDULE(nb_schedule_exponential_decay, 1.0, 10, 0.5, 0, false, 0.0)
SCHEDULE(nb_optim_clip, 1.0)
SCHEDULE(nb_optim_clip_by_global_norm, 1.0)

WALK(nb_schedule_piecewise_constant) {
    nb_tree *o = S_T;
    W_ST(nb_schedule_piecewise_constant(CTX(w->ctx), 1.0, 1, NUL((const int64_t[]){5}),
                                        NUL((const double[]){0.5}), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
TWALK(nb_schedule_eval) {
    nb_tree *layer = fx_sched(w);
    T_VAR(nb_schedule_eval(TRC(T->tr), TREE(layer), VAR(T->i)));
}
WALK(nb_schedule_value) {
    nb_tree *s = fx_sched(w);
    double v = 42;
    W_ST(nb_schedule_value(TREE(s), 0, OUT(&v)));
    W_ZERO(v);
}

/* An optimizer's opts may be NULL; a destroyed schedule or mask in them is misuse. */
#define OPTIMIZER(f, with_mask)                                                                    \
    WALK(f) {                                                                                      \
        nb_tree *s = fx_sched(w), *m = fx_mask(w), *o = S_T;                                       \
        nb_optim_opts oo = nb_optim_opts_default();                                                \
        oo.schedule = TREE_OPT(s);                                                                 \
        if (with_mask) {                                                                           \
            oo.mask = TREE_OPT(m);                                                                 \
        }                                                                                          \
        W_ST(f(CTX(w->ctx), 0.1, &oo, OUT(&o)));                                                   \
        W_NULLOUT(o);                                                                              \
        drop_t(o);                                                                                 \
    }
OPTIMIZER(nb_optim_sgd, false)
OPTIMIZER(nb_optim_adam, false)
OPTIMIZER(nb_optim_adamw, true)
OPTIMIZER(nb_optim_rmsprop, false)
OPTIMIZER(nb_optim_adagrad, false)
OPTIMIZER(nb_optim_lion, true)
OPTIMIZER(nb_optim_lamb, true)

WALK(nb_optim_add_decayed_weights) {
    nb_tree *m = fx_mask(w), *o = S_T;
    W_ST(nb_optim_add_decayed_weights(CTX(w->ctx), 1e-4, TREE_OPT(m), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_optim_scale_by_schedule) {
    nb_tree *s = fx_sched(w), *o = S_T;
    W_ST(nb_optim_scale_by_schedule(CTX(w->ctx), TREE(s), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_optim_masked) {
    nb_tree *inner = fx_opt(w), *m = fx_mask(w), *o = S_T;
    W_ST(nb_optim_masked(TREE(inner), TREE(m), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_optim_chain) {
    nb_tree *p = fx_opt(w), *o = S_T;
    const nb_tree *parts[2] = {p, TREE(p)};
    W_ST(nb_optim_chain(CTX(w->ctx), 2, NUL(parts), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_optim_init) {
    nb_tree *opt = fx_opt(w), *g = fx_grads(w), *o = S_T;
    W_ST(nb_optim_init(TREE(opt), TREE(g), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
TWALK(nb_optim_init_in) {
    nb_tree *opt = fx_opt(w), *g = fx_grads(w);
    T_TREE(nb_optim_init_in(TRC(T->tr), TREE(opt), TREE(g)));
}
TWALK(nb_optim_update) {
    nb_tree *opt = fx_opt(w), *g = fx_grads(w), *s = fx_state(w), *p = fx_params(w);
    const nb_tree *u = S_T, *ns = S_T;
    /* params may be NULL for sgd */
    T_ST(nb_optim_update(TRC(T->tr), TREE(opt), TREE(g), TREE(s), TREE_OPT(p), OUT(&u), OUT(&ns)));
    W_NULLOUT(u);
    W_NULLOUT(ns);
}
TWALK(nb_apply_updates) {
    nb_tree *p = fx_params(w), *g = fx_grads(w);
    T_TREE(nb_apply_updates(TRC(T->tr), TREE(p), TREE(g)));
}
WALK(nb_optim_update_eager) {
    nb_tree *opt = fx_opt(w), *g = fx_grads(w), *s = fx_state(w), *p = fx_params(w);
    nb_tree *u = S_T, *ns = S_T;
    W_ST(nb_optim_update_eager(TREE(opt), TREE(g), TREE(s), TREE_OPT(p), OUT(&u), OUT(&ns)));
    W_NULLOUT(u);
    W_NULLOUT(ns);
    drop_t(u);
    drop_t(ns);
}
WALK(nb_apply_updates_eager) {
    nb_tree *p = fx_params(w), *g = fx_grads(w), *o = S_T;
    W_ST(nb_apply_updates_eager(TREE(p), TREE(g), OUT(&o)));
    W_NULLOUT(o);
    drop_t(o);
}
WALK(nb_optim_set_hyper) {
    nb_tree *s = fx_state(w);
    W_ST(nb_optim_set_hyper(TREE(s), NUL("learning_rate"), 0.5));
}
WALK(nb_optim_get_hyper) {
    nb_tree *s = fx_state(w);
    double v = 42;
    W_ST(nb_optim_get_hyper(TREE(s), NUL("learning_rate"), OUT(&v)));
    W_ZERO(v);
}
WALK(nb_optim_count) {
    nb_tree *s = fx_state(w);
    int64_t n = 42;
    W_ST(nb_optim_count(TREE(s), OUT(&n)));
    W_ZERO(n);
}

/* ====================================================================================== */
/* ---- the table: one entry per public function ----------------------------------------- */

#define EAGER(f)                                                                                   \
    { #f, w_##f, NULL, NULL }
#define TRACED(f)                                                                                  \
    { #f, NULL, t_##f, NULL }
#define EXEMPT(f, why)                                                                             \
    { #f, NULL, NULL, why }

static const char k_no_handle[] = "takes no handle or pointer";
static const char k_defaults[] = "returns default options; takes nothing";
static const char k_dist[] = "libnabla_dist (MPI), walked by tests/dist/dist_collectives.c";

static const entry k_table[] = {
    /* core.h */
    EXEMPT(nb_version, k_no_handle),
    EXEMPT(nb_version_number, k_no_handle),
    EXEMPT(nb_status_string, k_no_handle),
    EXEMPT(nb_status_name, k_no_handle),
    EAGER(nb_build_info),
    EXEMPT(nb_allocator_default, k_defaults),
    EXEMPT(nb_ctx_opts_default, k_defaults),
    EAGER(nb_ctx_create),
    EAGER(nb_ctx_destroy),
    EAGER(nb_ctx_errmsg),
    EAGER(nb_ctx_errcode),
    EAGER(nb_ctx_clear_error),
    EAGER(nb_ctx_stats_get),
    EAGER(nb_ctx_n_threads),
    /* array.h */
    EXEMPT(nb_dtype_name, k_no_handle),
    EXEMPT(nb_dtype_size, k_no_handle),
    EXEMPT(nb_dtype_is_float, k_no_handle),
    EAGER(nb_array_zeros),
    EAGER(nb_array_ones),
    EAGER(nb_array_full),
    EAGER(nb_array_scalar),
    EAGER(nb_array_from_data),
    EAGER(nb_array_arange),
    EAGER(nb_array_linspace),
    EAGER(nb_array_eye),
    EAGER(nb_array_copy),
    EAGER(nb_array_cast),
    EAGER(nb_array_reshape),
    EAGER(nb_array_index),
    EAGER(nb_array_sum),
    EAGER(nb_array_mean),
    EAGER(nb_array_argmax),
    EAGER(nb_array_count_equal),
    EAGER(nb_array_rows),
    EAGER(nb_array_retain),
    EAGER(nb_array_destroy),
    EAGER(nb_array_ctx),
    EAGER(nb_array_dtype),
    EAGER(nb_array_rank),
    EAGER(nb_array_shape),
    EAGER(nb_array_dim),
    EAGER(nb_array_size),
    EAGER(nb_array_nbytes),
    EAGER(nb_array_data),
    EAGER(nb_array_check),
    EAGER(nb_array_get),
    EAGER(nb_array_set),
    EAGER(nb_array_get_i64),
    EAGER(nb_array_set_i64),
    EAGER(nb_array_get_flat),
    EAGER(nb_array_equal),
    EAGER(nb_array_identical),
    EAGER(nb_array_allclose),
    EAGER(nb_array_format),
    EAGER(nb_array_fprint),
    EAGER(nb_array_format_sig),
    /* tree.h */
    EXEMPT(nb_tree_kind_name, k_no_handle),
    EAGER(nb_tree_null),
    EAGER(nb_tree_array),
    EAGER(nb_tree_int),
    EAGER(nb_tree_float),
    EAGER(nb_tree_bool),
    EAGER(nb_tree_string),
    EAGER(nb_tree_fnref),
    EAGER(nb_tree_list),
    EAGER(nb_tree_tuple),
    EAGER(nb_tree_dict),
    EAGER(nb_tree_retain),
    EAGER(nb_tree_destroy),
    EAGER(nb_tree_freeze),
    EAGER(nb_tree_is_frozen),
    EAGER(nb_tree_check),
    EAGER(nb_tree_ctx),
    EAGER(nb_tree_kind_of),
    EAGER(nb_tree_is_leaf),
    EAGER(nb_tree_is_static),
    EAGER(nb_tree_is_dynamic),
    EAGER(nb_tree_len),
    EAGER(nb_tree_child),
    EAGER(nb_tree_key),
    EAGER(nb_tree_get),
    EAGER(nb_tree_get_array),
    EAGER(nb_tree_get_int),
    EAGER(nb_tree_get_float),
    EAGER(nb_tree_get_bool),
    EAGER(nb_tree_get_string),
    EAGER(nb_tree_get_fnref),
    EAGER(nb_tree_num_leaves),
    EAGER(nb_tree_lookup),
    EAGER(nb_tree_leaf_path),
    EAGER(nb_tree_flatten),
    EAGER(nb_tree_unflatten),
    EAGER(nb_tree_treedef),
    EAGER(nb_treedef_retain),
    EAGER(nb_treedef_destroy),
    EAGER(nb_treedef_num_leaves),
    EAGER(nb_treedef_hash),
    EAGER(nb_treedef_equal),
    EAGER(nb_treedef_format),
    EAGER(nb_tree_map),
    EAGER(nb_tree_map_n),
    EAGER(nb_tree_map_fail),
    EAGER(nb_tree_pred_is_array),
    EAGER(nb_tree_pred_is_inexact_array),
    EAGER(nb_tree_filter),
    EAGER(nb_tree_partition),
    EAGER(nb_tree_combine),
    EAGER(nb_tree_structure_equal),
    EAGER(nb_tree_equal),
    EAGER(nb_tree_diff),
    EAGER(nb_tree_format),
    EAGER(nb_tree_fprint),
    EAGER(nb_tree_fprint_leaves),
    /* trace.h */
    TRACED(nb_trace_ctx),
    TRACED(nb_trace_status),
    TRACED(nb_trace_fail),
    TRACED(nb_get),
    TRACED(nb_var_of),
    TRACED(nb_leaf),
    TRACED(nb_return),
    TRACED(nb_var_trace),
    TRACED(nb_var_dtype),
    TRACED(nb_var_rank),
    TRACED(nb_var_shape),
    TRACED(nb_var_dim),
    TRACED(nb_var_size),
    TRACED(nb_var_is_poison),
    TRACED(nb_scalar),
    TRACED(nb_scalar_typed),
    TRACED(nb_full),
    TRACED(nb_constant),
    TRACED(nb_iota),
    TRACED(nb_neg),
    TRACED(nb_abs),
    TRACED(nb_sign),
    TRACED(nb_exp),
    TRACED(nb_expm1),
    TRACED(nb_log),
    TRACED(nb_log1p),
    TRACED(nb_sqrt),
    TRACED(nb_rsqrt),
    TRACED(nb_square),
    TRACED(nb_reciprocal),
    TRACED(nb_sin),
    TRACED(nb_cos),
    TRACED(nb_tan),
    TRACED(nb_tanh),
    TRACED(nb_sigmoid),
    TRACED(nb_relu),
    TRACED(nb_gelu),
    TRACED(nb_softplus),
    TRACED(nb_erf),
    TRACED(nb_add),
    TRACED(nb_sub),
    TRACED(nb_mul),
    TRACED(nb_div),
    TRACED(nb_pow),
    TRACED(nb_maximum),
    TRACED(nb_minimum),
    TRACED(nb_eq),
    TRACED(nb_ne),
    TRACED(nb_lt),
    TRACED(nb_le),
    TRACED(nb_gt),
    TRACED(nb_ge),
    TRACED(nb_logical_and),
    TRACED(nb_logical_or),
    TRACED(nb_logical_not),
    TRACED(nb_select),
    TRACED(nb_debug_print),
    TRACED(nb_cast),
    TRACED(nb_sum),
    TRACED(nb_mean),
    TRACED(nb_max),
    TRACED(nb_min),
    TRACED(nb_prod),
    TRACED(nb_argmax),
    TRACED(nb_argmin),
    TRACED(nb_logsumexp),
    TRACED(nb_softmax),
    TRACED(nb_log_softmax),
    TRACED(nb_reshape),
    TRACED(nb_broadcast_to),
    TRACED(nb_transpose),
    TRACED(nb_expand_dims),
    TRACED(nb_squeeze),
    TRACED(nb_slice),
    TRACED(nb_concatenate),
    TRACED(nb_stack),
    TRACED(nb_pad),
    TRACED(nb_take),
    TRACED(nb_take_along_axis),
    TRACED(nb_one_hot),
    TRACED(nb_dynamic_slice),
    TRACED(nb_dynamic_update_slice),
    TRACED(nb_matmul),
    TRACED(nb_dot),
    /* linalg.h */
    TRACED(nb_solve),
    TRACED(nb_lu_factor),
    TRACED(nb_lu_solve),
    TRACED(nb_lu_singular),
    TRACED(nb_cholesky),
    TRACED(nb_cholesky_failed),
    TRACED(nb_cholesky_solve),
    TRACED(nb_triangular_solve),
    TRACED(nb_slogdet),
    TRACED(nb_det),
    TRACED(nb_inv),
    TRACED(nb_diagonal),
    TRACED(nb_stop_gradient),
    /* fn.h */
    EAGER(nb_fn_create),
    EAGER(nb_fn_retain),
    EAGER(nb_fn_check),
    EAGER(nb_fn_destroy),
    EAGER(nb_fn_name),
    EXEMPT(nb_jit_opts_default, k_defaults),
    EAGER(nb_jit),
    EAGER(nb_max_traces),
    EXEMPT(nb_call_opts_default, k_defaults),
    EAGER(nb_fn_call),
    EAGER(nb_fn_call_ex),
    EAGER(nb_eval),
    TRACED(nb_apply),
    TRACED(nb_apply1),
    EAGER(nb_fn_stats_get),
    EAGER(nb_fn_retrace_reason),
    EAGER(nb_ctx_clear_cache),
    EAGER(nb_fn_format_ir),
    /* ad.h */
    EXEMPT(nb_grad_opts_default, k_defaults),
    EAGER(nb_grad),
    EAGER(nb_value_and_grad),
    EAGER(nb_vjp),
    EAGER(nb_jvp),
    EAGER(nb_custom_vjp),
    EAGER(nb_custom_jvp),
    EAGER(nb_vmap),
    EAGER(nb_jacrev),
    EAGER(nb_jacfwd),
    EAGER(nb_jacobian),
    EAGER(nb_hessian),
    EXEMPT(nb_vmap_opts_default, k_defaults),
    EAGER(nb_grad_template),
    /* random.h */
    EAGER(nb_random_key),
    EAGER(nb_random_split),
    EAGER(nb_random_split_keys),
    EAGER(nb_random_fold_in),
    EAGER(nb_random_bits),
    EAGER(nb_random_uniform),
    EAGER(nb_random_normal),
    EAGER(nb_random_truncated_normal),
    EAGER(nb_random_bernoulli),
    EAGER(nb_random_permutation),
    TRACED(nb_rng_split),
    TRACED(nb_rng_fold_in),
    TRACED(nb_rng_bits),
    TRACED(nb_rng_uniform),
    TRACED(nb_rng_normal),
    TRACED(nb_rng_truncated_normal),
    TRACED(nb_rng_bernoulli),
    TRACED(nb_rng_permutation),
    /* data.h */
    EXEMPT(nb_csv_opts_default, k_defaults),
    EAGER(nb_csv_load),
    EAGER(nb_text_load),
    EAGER(nb_data_split),
    EAGER(nb_data_standardize),
    EAGER(nb_data_standardize_apply),
    EXEMPT(nb_batcher_opts_default, k_defaults),
    EAGER(nb_batcher_create),
    EAGER(nb_batcher_destroy),
    EAGER(nb_batcher_num_batches),
    EAGER(nb_batcher_epoch),
    EAGER(nb_batcher_next),
    EAGER(nb_batcher_next_new),
    EAGER(nb_batcher_next_rows),
    EAGER(nb_ctx_alloc),
    EAGER(nb_ctx_free),
    /* dist.h: the MPI component is a library of its own (libnabla_dist, not linked into
     * this test); tests/dist/dist_collectives.c checks its NULL and destroyed handles */
    EXEMPT(nb_dist_opts_default, k_defaults),
    EXEMPT(nb_dist_create, k_dist),
    EXEMPT(nb_dist_destroy, k_dist),
    EXEMPT(nb_dist_rank, k_dist),
    EXEMPT(nb_dist_size, k_dist),
    EXEMPT(nb_dist_ctx, k_dist),
    EXEMPT(nb_dist_parts, k_dist),
    EXEMPT(nb_dist_reduce_parts, k_dist),
    EXEMPT(nb_dist_allreduce, k_dist),
    EXEMPT(nb_dist_broadcast, k_dist),
    EXEMPT(nb_dist_allgather, k_dist),
    EXEMPT(nb_dist_barrier, k_dist),
    EXEMPT(nb_dist_checkpoint_save, k_dist),
    EXEMPT(nb_dist_train_create, k_dist),
    EXEMPT(nb_dist_train_destroy, k_dist),
    EXEMPT(nb_dist_train_init, k_dist),
    EXEMPT(nb_dist_train_run, k_dist),
    EXEMPT(nb_dist_train_stats, k_dist),
    EXEMPT(nb_dist_stats_get, k_dist),
    /* io.h */
    EAGER(nb_save),
    EAGER(nb_load),
    EAGER(nb_load_into),
    EAGER(nb_load_bytes),
    EAGER(nb_checkpoint_save),
    EAGER(nb_checkpoint_load),
    EAGER(nb_ctx_set_write_hook),
    /* loops.h */
    EXEMPT(nb_loop_opts_default, k_defaults),
    EAGER(nb_loop_last_stats),
    TRACED(nb_while_loop),
    TRACED(nb_fori_loop),
    TRACED(nb_scan),
    TRACED(nb_cond),
    TRACED(nb_switch),
    /* nn.h */
    EXEMPT(nb_nn_mlp_opts_default, k_defaults),
    EXEMPT(nb_nn_conv2d_opts_default, k_defaults),
    EXEMPT(nb_nn_conv_opts_default, k_defaults),
    EXEMPT(nb_nn_pool_opts_default, k_defaults),
    EXEMPT(nb_nn_group_norm_opts_default, k_defaults),
    EXEMPT(nb_nn_batch_norm_opts_default, k_defaults),
    EXEMPT(nb_nn_mha_opts_default, k_defaults),
    EAGER(nb_nn_conv_init),
    EAGER(nb_nn_conv_transpose_init),
    EAGER(nb_nn_max_pool_init),
    EAGER(nb_nn_avg_pool_init),
    EAGER(nb_nn_adaptive_avg_pool_init),
    EAGER(nb_nn_adaptive_max_pool_init),
    EAGER(nb_nn_group_norm_init),
    EAGER(nb_nn_rms_norm_init),
    EAGER(nb_nn_batch_norm_init),
    EAGER(nb_nn_multihead_attention_init),
    EAGER(nb_nn_gru_cell_init),
    EAGER(nb_nn_lstm_cell_init),
    TRACED(nb_nn_conv),
    TRACED(nb_nn_conv_transpose),
    TRACED(nb_nn_pool),
    TRACED(nb_nn_group_norm),
    TRACED(nb_nn_rms_norm),
    TRACED(nb_nn_batch_norm),
    TRACED(nb_nn_multihead_attention),
    TRACED(nb_nn_gru_cell),
    TRACED(nb_nn_lstm_cell),
    TRACED(nb_nn_gru),
    EAGER(nb_nn_linear_init),
    EAGER(nb_nn_mlp_init),
    EAGER(nb_nn_layer_norm_init),
    EAGER(nb_nn_embedding_init),
    EAGER(nb_nn_dropout_init),
    EAGER(nb_nn_conv2d_init),
    EAGER(nb_nn_sequential_init),
    EAGER(nb_nn_activation_leaf),
    EAGER(nb_nn_count_params),
    EAGER(nb_nn_inference_mode),
    TRACED(nb_nn_identity),
    TRACED(nb_nn_linear),
    TRACED(nb_nn_mlp),
    TRACED(nb_nn_layer_norm),
    TRACED(nb_nn_embedding),
    TRACED(nb_nn_dropout),
    TRACED(nb_nn_conv2d),
    TRACED(nb_nn_apply),
    /* ode.h */
    EXEMPT(nb_ode_solver_name, k_no_handle),
    EXEMPT(nb_ode_solver_order, k_no_handle),
    EXEMPT(nb_ode_constant_step, k_defaults),
    EXEMPT(nb_ode_pid, k_no_handle),
    EXEMPT(nb_ode_opts_default, k_defaults),
    EXEMPT(nb_ode_result_string, k_no_handle),
    TRACED(nb_diffeqsolve),
    /* train.h */
    EXEMPT(nb_train_opts_default, k_defaults),
    EAGER(nb_train_step),
    EAGER(nb_train_init),
    EAGER(nb_train_run),
    EAGER(nb_train_eval),
    /* optim.h */
    EAGER(nb_schedule_constant),
    EAGER(nb_schedule_linear),
    EAGER(nb_schedule_polynomial),
    EAGER(nb_schedule_cosine_decay),
    EAGER(nb_schedule_warmup_cosine_decay),
    EAGER(nb_schedule_exponential_decay),
    EAGER(nb_schedule_piecewise_constant),
    TRACED(nb_schedule_eval),
    EAGER(nb_schedule_value),
    EXEMPT(nb_optim_opts_default, k_defaults),
    EAGER(nb_optim_sgd),
    EAGER(nb_optim_adam),
    EAGER(nb_optim_adamw),
    EAGER(nb_optim_rmsprop),
    EAGER(nb_optim_adagrad),
    EAGER(nb_optim_lion),
    EAGER(nb_optim_lamb),
    EAGER(nb_optim_clip),
    EAGER(nb_optim_clip_by_global_norm),
    EAGER(nb_optim_add_decayed_weights),
    EAGER(nb_optim_scale_by_schedule),
    EAGER(nb_optim_masked),
    EAGER(nb_optim_chain),
    EAGER(nb_optim_init),
    TRACED(nb_optim_init_in),
    TRACED(nb_optim_update),
    TRACED(nb_apply_updates),
    EAGER(nb_optim_update_eager),
    EAGER(nb_apply_updates_eager),
    EAGER(nb_optim_set_hyper),
    EAGER(nb_optim_get_hyper),
    EAGER(nb_optim_count),
};
#define N_TABLE (sizeof k_table / sizeof k_table[0])

/* ====================================================================================== */
/* ---- running an entry ----------------------------------------------------------------- */

static nb_status walk_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    (void)out;
    walk *w = g_walk;
    tfix t;
    memset(&t, 0, sizeof t);
    t.tr = tr;
    t.x = nb_get(tr, args, "[0]");
    t.v = nb_get(tr, args, "[1]");
    t.s = nb_get(tr, args, "[2]");
    t.b = nb_get(tr, args, "[3]");
    t.i = nb_get(tr, args, "[4]");
    t.idx = nb_get(tr, args, "[5]");
    t.key = nb_get(tr, args, "[6]");
    t.bs = nb_get(tr, args, "[7]");
    t.args = (nb_tree *)args;
    t.xleaf = (nb_tree *)nb_tree_child(args, 0);
    if (nb_trace_status(tr) != NB_OK || t.xleaf == NULL) {
        walk_failf(w, __LINE__, "the traced arguments: %s", nb_ctx_errmsg(w->ctx));
    } else {
        w->tr = tr;
        w->t = &t;
        w->body_ran = true;
        w->e->traced(w);
        w->end_status = nb_trace_status(tr);
    }
    w->tr = NULL;
    w->t = NULL;
    /* end the trace: the misuse recorded above, if any, is the sticky error that wins */
    return nb_trace_fail(tr, NB_ERR_INVALID, "api walk: end of the body");
}

static void walk_traced(walk *w) {
    nb_tree *args = fx_targs(w), *out = S_T;
    if (args == NULL) {
        return;
    }
    w->body_ran = false;
    w->end_status = NB_OK;
    g_walk = w;
    nb_status s = nb_eval(w->ctx, walk_body, NULL, args, &out);
    g_walk = NULL;
    if (!w->body_ran) {
        walk_failf(w, __LINE__, "the body did not run: %s: %s", nb_status_name(s),
                   nb_ctx_errmsg(w->ctx));
        return;
    }
    /* the call fails with the trace's sticky status */
    nb_status want = w->end_status != NB_OK ? w->end_status : NB_ERR_INVALID;
    if (s != want) {
        walk_failf(w, __LINE__, "nb_eval of the body returned %s, wanted the trace's %s (%s)",
                   nb_status_name(s), nb_status_name(want), nb_ctx_errmsg(w->ctx));
    }
    if (out != NULL) {
        walk_failf(w, __LINE__, "nb_eval of a failed body set its output");
        drop_t(out);
    }
}

static bool still_dead(const walk *w) {
    switch (w->dead_kind) {
    case DK_ARRAY:
        return nb_array_check((const nb_array *)w->dead) == NB_ERR_MISUSE;
    case DK_TREE:
        return nb_tree_check((const nb_tree *)w->dead) == NB_ERR_MISUSE;
    case DK_TREEDEF:
        return nb_treedef_num_leaves((const nb_treedef *)w->dead) == -1;
    case DK_FN:
        return nb_fn_check((const nb_fn *)w->dead) == NB_ERR_MISUSE;
    case DK_BATCHER:
        return nb_batcher_num_batches((const nb_batcher *)w->dead) == -1;
    default:
        return true;
    }
}

/* The context still works: an array and a tree are made, used and destroyed. */
static void ctx_works(walk *w) {
    nb_array *a = NULL;
    nb_tree *t = NULL;
    nb_status s = nb_array_zeros(w->ctx, NB_DTYPE_F32, 2, (int64_t[]){2, 3}, &a);
    if (s == NB_OK) {
        s = nb_array_set(a, (int64_t[]){1, 2}, 4.0);
    }
    if (s == NB_OK) {
        s = nb_tree_array(a, &t);
    }
    if (s != NB_OK || nb_tree_num_leaves(t) != 1) {
        walk_failf(w, __LINE__, "the context no longer works: %s: %s", nb_status_name(s),
                   nb_ctx_errmsg(w->ctx));
    }
    nb_tree_destroy(t);
    nb_array_destroy(a);
}

static bool g_verbose; /* NBT_WALK_VERBOSE=1: one line per run */

static void walk_run(walk *w, int k, bool outside) {
    memset(&w->al, 0, sizeof w->al);
    nb_ctx_opts o = nb_ctx_opts_default();
    o.allocator = nbt_alloc_make(&w->al);
    o.n_threads = 1;
    w->ctx = NULL;
    if (nb_ctx_create(&o, &w->ctx) != NB_OK) {
        walk_failf(w, __LINE__, "nb_ctx_create failed");
        return;
    }
    w->k = k;
    w->pos = 0;
    w->spoil = SP_NONE;
    w->what = "";
    w->accept = ACC_MISUSE;
    w->nulled_out = NULL;
    w->no_ctx = false;
    w->ctx_args = 0;
    w->outside = outside;
    w->tr_nulled = false;
    w->carriers = 0;
    w->tr = NULL;
    w->dead = NULL;
    w->dead_kind = DK_NONE;
    if (outside) {
        tfix none;
        memset(&none, 0, sizeof none);
        w->t = &none;
        w->e->traced(w);
        w->t = NULL;
    } else if (w->e->eager != NULL) {
        w->e->eager(w);
    } else {
        walk_traced(w);
    }
    if (g_verbose) {
        fprintf(stderr, "run %s k=%d%s: %s %s\n", w->e->name, k, outside ? " (outside)" : "",
                w->spoil == SP_NULL   ? "NULL"
                : w->spoil == SP_DEAD ? "destroyed"
                                      : "-",
                w->what);
    }
    if (!still_dead(w)) {
        walk_failf(w, __LINE__, "the destroyed handle's pool slot was reused during the run");
    }
    w->spoil = SP_NONE; /* the checks below are about the whole run */
    fx_release(w);
    nb_ctx_clear_cache(w->ctx);
    nb_ctx_stats st;
    if (nb_ctx_stats_get(w->ctx, &st) != NB_OK) {
        walk_failf(w, __LINE__, "nb_ctx_stats_get failed");
    } else if (st.live_arrays || st.live_trees || st.live_treedefs || st.live_buffers ||
               st.live_fns) {
        walk_failf(w, __LINE__,
                   "run %d left %lld arrays, %lld trees, %lld treedefs, %lld buffers, %lld fns "
                   "alive",
                   k, (long long)st.live_arrays, (long long)st.live_trees,
                   (long long)st.live_treedefs, (long long)st.live_buffers, (long long)st.live_fns);
    }
    ctx_works(w);
    nb_ctx_destroy(w->ctx);
    w->ctx = NULL;
    if (w->al.n_live != 0) {
        walk_failf(w, __LINE__, "run %d: %lld blocks (%zu bytes) not freed by nb_ctx_destroy", k,
                   (long long)w->al.n_live, w->al.live_bytes);
    }
}

/* Walk one entry: one run per position, plus one outside any trace for traced entries.
 * Returns the number of runs. */
static int walk_entry(const entry *e, int *n_failed_entries) {
    walk w;
    memset(&w, 0, sizeof w);
    w.e = e;
    int runs = 0, count = -1;
    for (int k = 0; count < 0 || k < count; k++) {
        walk_run(&w, k, false);
        runs++;
        if (count < 0) {
            count = w.pos; /* the first run counts the positions */
        } else if (w.pos != count) {
            walk_failf(&w, __LINE__, "the walker passed %d positions in run %d, %d in run 0", w.pos,
                       k, count);
        }
    }
    if (e->traced != NULL) {
        walk_run(&w, -1, true);
        runs++;
    }
    if (w.n_fail > 0) {
        (*n_failed_entries)++;
    }
    return runs;
}

/* ====================================================================================== */
/* ---- the public API, read from the headers -------------------------------------------- */

#define API_MAX 2048
#define API_NAME 80

typedef struct api {
    int n;
    char name[API_MAX][API_NAME];
    char file[API_MAX][32];
} api;

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf != NULL) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

/* Blank out comments, string and character literals and preprocessor lines (with their
 * continuations), keeping newlines. */
static void api_strip(char *s) {
    bool line_start = true;
    char *p = s;
    while (*p != '\0') {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e != NULL ? e + 2 : p + strlen(p);
            for (; p < end; p++) {
                if (*p != '\n') {
                    *p = ' ';
                }
            }
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p != '\0' && *p != '\n') {
                *p++ = ' ';
            }
        } else if (*p == '"' || *p == '\'') {
            char q = *p;
            *p++ = ' ';
            while (*p != '\0' && *p != q) {
                if (*p == '\\' && p[1] != '\0') {
                    *p++ = ' ';
                }
                if (*p != '\n') {
                    *p = ' ';
                }
                p++;
            }
            if (*p != '\0') {
                *p++ = ' ';
            }
            line_start = false;
        } else if (line_start && *p == '#') {
            bool esc = false;
            while (*p != '\0' && !(*p == '\n' && !esc)) {
                if (p[0] == '/' && p[1] == '*') {
                    break; /* a comment inside the directive: blanked on the next turn */
                }
                esc = *p == '\\' ? true : (isspace((unsigned char)*p) ? esc : false);
                if (*p != '\n') {
                    *p = ' ';
                }
                p++;
            }
            if (p[0] == '/' && p[1] == '*') {
                continue; /* still inside the directive after the comment */
            }
        } else {
            if (*p == '\n') {
                line_start = true;
            } else if (!isspace((unsigned char)*p)) {
                line_start = false;
            }
            p++;
        }
    }
}

static bool ident_char(char c) {
    return isalnum((unsigned char)c) || c == '_';
}

/* Every NB_API declaration in one header: the identifier just before the first '(' after
 * NB_API is the function's name. Returns false if a declaration could not be read. */
static bool api_scan(api *a, const char *text, const char *file) {
    const char *p = text;
    bool ok = true;
    while ((p = strstr(p, "NB_API")) != NULL) {
        bool whole = (p == text || !ident_char(p[-1])) && !ident_char(p[6]);
        p += 6;
        if (!whole) {
            continue;
        }
        const char *paren = p;
        while (*paren != '\0' && *paren != '(' && *paren != ';') {
            paren++;
        }
        if (*paren != '(') {
            fprintf(stderr, "%s: an NB_API declaration without a parameter list\n", file);
            ok = false;
            continue;
        }
        const char *end = paren;
        while (end > p && isspace((unsigned char)end[-1])) {
            end--;
        }
        const char *start = end;
        while (start > p && ident_char(start[-1])) {
            start--;
        }
        size_t len = (size_t)(end - start);
        if (len == 0 || len >= API_NAME || a->n >= API_MAX) {
            fprintf(stderr, "%s: cannot read the name of an NB_API declaration\n", file);
            ok = false;
            continue;
        }
        memcpy(a->name[a->n], start, len);
        a->name[a->n][len] = '\0';
        snprintf(a->file[a->n], sizeof a->file[a->n], "%.*s", (int)sizeof a->file[a->n] - 1,
                 file); /* a header's name, cut to fit */
        a->n++;
        p = paren;
    }
    return ok;
}

static bool api_read(api *a, const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "cannot open %s\n", dir);
        return false;
    }
    bool ok = true;
    int n_headers = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 3 || strcmp(de->d_name + len - 2, ".h") != 0) {
            continue;
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        size_t n = 0;
        char *text = slurp(path, &n);
        if (text == NULL) {
            fprintf(stderr, "cannot read %s\n", path);
            ok = false;
            continue;
        }
        api_strip(text);
        ok = api_scan(a, text, de->d_name) && ok;
        free(text);
        n_headers++;
    }
    closedir(d);
    return ok && n_headers > 0;
}

static const entry *table_find(const char *name) {
    for (size_t i = 0; i < N_TABLE; i++) {
        if (strcmp(k_table[i].name, name) == 0) {
            return &k_table[i];
        }
    }
    return NULL;
}

/* ====================================================================================== */
/* ---- the tests ------------------------------------------------------------------------ */

/* Every public function has an entry; every entry is a public function; no duplicates. */
static void test_table_complete(void **state) {
    (void)state;
    static api a;
    memset(&a, 0, sizeof a);
    if (!api_read(&a, NBT_INCLUDE_DIR)) {
        fail_msg("could not read the public headers in %s", NBT_INCLUDE_DIR);
    }
    int missing = 0, stale = 0, dup = 0;
    for (int i = 0; i < a.n; i++) {
        for (int j = 0; j < i; j++) {
            if (strcmp(a.name[i], a.name[j]) == 0) {
                fprintf(stderr, "declared twice: %s (%s, %s)\n", a.name[i], a.file[j], a.file[i]);
            }
        }
        if (table_find(a.name[i]) == NULL) {
            fprintf(stderr, "MISSING from the walk table: %s (%s)\n", a.name[i], a.file[i]);
            missing++;
        }
    }
    for (size_t i = 0; i < N_TABLE; i++) {
        bool found = false;
        for (int j = 0; j < a.n && !found; j++) {
            found = strcmp(a.name[j], k_table[i].name) == 0;
        }
        if (!found) {
            fprintf(stderr, "the walk table names %s, which no public header declares\n",
                    k_table[i].name);
            stale++;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(k_table[i].name, k_table[j].name) == 0) {
                fprintf(stderr, "the walk table names %s twice\n", k_table[i].name);
                dup++;
            }
        }
        if (k_table[i].exempt == NULL && k_table[i].eager == NULL && k_table[i].traced == NULL) {
            fprintf(stderr, "the walk table's %s has neither a walker nor a reason\n",
                    k_table[i].name);
            dup++;
        }
    }
    print_message("public functions in %s: %d; table entries: %zu\n", NBT_INCLUDE_DIR, a.n,
                  N_TABLE);
    if (a.n < 100) {
        fail_msg("only %d NB_API functions found: the header reader is broken", a.n);
    }
    if (missing || stale || dup) {
        fail_msg("the walk table is out of date: %d public functions missing (listed above), %d "
                 "stale entries, %d duplicate or empty entries",
                 missing, stale, dup);
    }
}

static void test_walk(void **state) {
    (void)state;
    int walked = 0, exempt = 0, runs = 0, failed_entries = 0;
    const char *v = getenv("NBT_WALK_VERBOSE");
    g_verbose = v != NULL && v[0] == '1';
    g_fail_total = 0;
    for (size_t i = 0; i < N_TABLE; i++) {
        const entry *e = &k_table[i];
        if (e->exempt != NULL) {
            exempt++;
            continue;
        }
        runs += walk_entry(e, &failed_entries);
        walked++;
    }
    print_message("walked %d functions in %d runs (%d exempt); %d failures in %d functions\n",
                  walked, runs, exempt, g_fail_total, failed_entries);
    if (g_fail_total > 0) {
        fail_msg("%d misuse checks failed in %d public functions (each listed above as FAIL)",
                 g_fail_total, failed_entries);
    }
}

/* ---- files for the io entries --------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    g_devnull = fopen("/dev/null", "w");
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s", "/tmp/nabla_api_walk_XXXXXX");
    if (g_devnull == NULL || mkdtemp(g_tmpdir) == NULL) {
        return -1;
    }
    snprintf(g_params_path, sizeof g_params_path, "%s/params.safetensors", g_tmpdir);
    snprintf(g_ckpt_path, sizeof g_ckpt_path, "%s/ckpt.safetensors", g_tmpdir);
    snprintf(g_new_path, sizeof g_new_path, "%s/never.safetensors", g_tmpdir);
    /* the files the loaders read: fx_params and a checkpoint of it */
    walk w;
    memset(&w, 0, sizeof w);
    const entry e = {"setup", NULL, NULL, NULL};
    w.e = &e;
    w.k = -1;
    if (nb_ctx_create(NULL, &w.ctx) != NB_OK) {
        return -1;
    }
    nb_status s = nb_save(fx_params(&w), g_params_path);
    if (s == NB_OK) {
        s = nb_checkpoint_save(g_ckpt_path, fx_params(&w), fx_state(&w), fx_key(&w), 3);
    }
    fx_release(&w);
    nb_ctx_destroy(w.ctx);
    g_bytes = (unsigned char *)slurp(g_params_path, &g_n_bytes);
    return s == NB_OK && g_bytes != NULL && w.n_fail == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    free(g_bytes);
    g_bytes = NULL;
    remove(g_params_path);
    remove(g_ckpt_path);
    remove(g_new_path);
    rmdir(g_tmpdir);
    if (g_devnull != NULL) {
        fclose(g_devnull);
    }
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_complete),
        cmocka_unit_test(test_walk),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
