/*
 * jit.c -- functions, the compile cache, trace accounting, calls in and out of traces.
 *
 * The cache is keyed by value. An *identity* is a function as the cache sees it: its chain
 * of wrappers (jit options, max_traces), its body pointer and the static part (treedef) of
 * its bound data. Two nb_fns built separately from the same body with equal bound static
 * data have the same identity. Each identity keeps its trace accounting and a list of
 * *entries*, one per argument signature: the treedef of the arguments plus (dtype, shape)
 * of every dynamic leaf of the bound data and the arguments. A lookup compares the whole
 * key without allocating: the arguments' treedef (an args tree already seen to match is
 * known by its serial, any other is compared by its memoised hash, then node by node), then
 * (dtype, shape) leaf by leaf. Traced values are never hashed: vars enter keys only as
 * (dtype, shape). A function memoises its identity; an entry keeps, per donate-spec
 * treedef, where each output goes and which output subtrees are args' own (nbi_dplan), so
 * a cache hit builds no key, no path string and no output subtree that is donated in place.
 *
 * Accounting is done where a function's body (or wrapper) is traced, not where it is
 * called: so nb_max_traces counts the same whether it wraps a jitted function or is
 * wrapped by one, and every retrace records the first leaf whose signature changed.
 */
#include "ad/ir.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBI_MAX_LAYERS 16
#define NBI_MAX_DEPTH 64
#define NBI_SIG_FLAG NBI_TREE_FLAG_SIG /* a signature-tree leaf: a string "f32[2,3]" */

typedef struct nbi_leafsig {
    int32_t dtype;
    int32_t rank;
    int64_t shape[NB_MAX_RANK];
} nbi_leafsig;

typedef struct nbi_layer {
    int32_t kind;
    int32_t max_traces;
    bool inline_calls;
    bool has_aux;
    bool with_value;
    uint8_t debug;
    nb_treedef *spec_def; /* the filter spec's value (owned by the identity), or NULL */
    const nb_tree *spec;  /* while looking up: the function's own spec tree */
    /* CUSTOM_VJP: the rule's bodies and the static part of their bound data */
    nb_fn_body rule_body[2];
    nb_treedef *rule_def[2]; /* owned by the identity; NULL when a rule has no bound data */
    const nb_tree *rule_self[2];
} nbi_layer;

/* How an entry runs under one donate spec, resolved once per (entry, spec treedef): the
 * input array each output is written into, and the output subtrees that are args' own
 * subtrees -- every leaf donated into the array it came from, the same static structure --
 * which a call returns as they are instead of building them. */
typedef struct nbi_dplan {
    struct nbi_dplan *next;
    nb_treedef *donate_def; /* the spec's treedef (owned), NULL for a plan not cached */
    uint64_t donate_hash;   /* nbi_tree_def_hash of the spec */
    uint64_t donate_serial; /* the serial of the last spec tree seen to match donate_def */
    int32_t *take;          /* per output: the leaf (self's, then args') it goes into, or -1 */
    int32_t *reuse;   /* per out_def node: the args_def node returned as is, or -1; NULL: none */
    bool *donated;    /* per output: take >= 0; NULL when no output is donated */
    bool *covered;    /* per output: inside a reused subtree (no leaf is made for it) */
    void *mem;        /* take, reuse, donated, covered */
    size_t mem_bytes; /* of mem */
} nbi_dplan;

typedef struct nbi_entry {
    struct nbi_entry *next;
    uint64_t hash;
    nb_treedef *args_def;
    uint64_t args_hash;   /* nbi_tree_def_hash of args (== for any args matching args_def) */
    uint64_t args_serial; /* the serial of the last args tree seen to match args_def */
    int64_t n_leaves;
    nbi_leafsig *sigs;
    nbi_exec *exec;
    nb_treedef *out_def;
    int32_t n_out;
    nbi_dplan *plans;
    uint8_t debug; /* the checks it was compiled with (NBI_DEBUG_*): part of the key */
    char *ir_text; /* NBI_DEBUG_RETRACE: the traced IR as text, to compare on every hit */
    size_t ir_bytes;
} nbi_entry;

typedef struct nbi_ident {
    struct nbi_ident *next;
    uint64_t hash;
    int n_layers;
    nbi_layer layers[NBI_MAX_LAYERS];
    nb_fn_body body;
    nb_treedef *self_def; /* NULL when the function has no bound data */
    nb_fn_stats stats;
    char **reasons;
    int64_t cap_reasons;
    nb_tree *last_sig;
    nbi_entry *entries;
} nbi_ident;

typedef struct nbi_jit_state {
    nb_ctx *ctx;
    nbi_ident **buckets;
    size_t n_buckets;
    size_t n_idents;
    uint64_t trace_counter;
    uint64_t donate_mark; /* stamps the buffers one call donates (nbi_dplan_unalias) */
    uint64_t gen;         /* bumped when the cache is cleared: functions' identity memos go stale */
    const nb_tree **leafbuf;
    int64_t leafcap;
    nb_tree **nodebuf; /* a call's args nodes in pre-order (indexed as its treedef's nodes) */
    int64_t nodecap;
    void **scratch; /* a call's buffer pointers and output arrays (scratch_busy: in use) */
    size_t scratch_bytes;
    bool scratch_busy;
} nbi_jit_state;

/* ---- functions ---------------------------------------------------------------------- */

static bool nbi_fn_live(const nb_fn *f) {
    return nbi_obj_live(f, NBI_MAGIC_FN);
}

/* "fn: out is NULL (pass the address of <what>)" on ctx. */
static nb_status nbi_fn_null_out(nb_ctx *ctx, const char *fn, const char *what) {
    return nbi_err(ctx, NB_ERR_MISUSE, "%s: out is NULL (pass the address of %s)", fn, what);
}

void nbi_fn_free_owned(nb_fn *f) {
    nb_ctx *ctx = f->hdr.ctx;
    if (f->name != NULL) {
        nbi_free(ctx, f->name, f->name_size);
        f->name = NULL;
    }
    nbi_count_add(ctx, NBI_COUNT_FN, -1);
}

static nb_status nbi_fn_new(nb_ctx *ctx, const char *fn_name, const char *name, nb_fn **out) {
    nb_fn *f = nbi_obj_new(ctx, NBI_MAGIC_FN, fn_name);
    if (f == NULL) {
        return NB_ERR_OOM;
    }
    nbi_count_add(ctx, NBI_COUNT_FN, 1);
    size_t len = strlen(name) + 1;
    f->name = nbi_alloc(ctx, len, 8);
    if (f->name == NULL) {
        nbi_fn_free_owned(f);
        nbi_obj_release(&f->hdr);
        return nbi_oom(ctx, fn_name, len);
    }
    memcpy(f->name, name, len);
    f->name_size = len;
    *out = f;
    return NB_OK;
}

nb_status nb_fn_create(nb_ctx *ctx, const char *name, nb_fn_body body, const nb_tree *self,
                       nb_fn **out) {
    static const char fn[] = "nb_fn_create";
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL) {
        return nbi_err_null_ctx(self, fn);
    }
    if (out == NULL) {
        return nbi_fn_null_out(ctx, fn, "an nb_fn * to receive the new function");
    }
    if (body == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: body is NULL (pass the C function that traces the function's ops)", fn);
    }
    if (self != NULL) {
        nb_status st = nbi_check_handle_in(ctx, self, NBI_MAGIC_TREE, fn, "self");
        if (st != NB_OK) {
            return st;
        }
    }
    if (self != NULL && self->hdr.ctx != ctx) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: self was made in another context", fn);
    }
    nb_fn *f = NULL;
    nb_status st = nbi_fn_new(ctx, fn, name ? name : "fn", &f);
    if (st != NB_OK) {
        return st;
    }
    f->kind = NBI_FN_PLAIN;
    f->body = body;
    f->self = self ? nb_tree_retain((nb_tree *)self) : NULL;
    *out = f;
    return NB_OK;
}

nb_fn *nb_fn_retain(nb_fn *f) {
    if (!nbi_fn_live(f)) {
        return NULL;
    }
    f->hdr.refcount++;
    return f;
}

void nb_fn_destroy(nb_fn *f) {
    while (f != NULL) {
        if (f->hdr.magic != NBI_MAGIC_FN) {
            nbi_obj_double_destroy(f, "nb_fn_destroy");
            return;
        }
        if (--f->hdr.refcount > 0) {
            return;
        }
        nb_fn *inner = f->inner;
        nb_tree_destroy(f->self);
        nb_tree_destroy(f->spec);
        nb_fn_destroy(f->fwd);
        nb_fn_destroy(f->bwd);
        nbi_fn_free_owned(f);
        nbi_obj_release(&f->hdr);
        f = inner;
    }
}

nb_status nb_fn_check(const nb_fn *f) {
    return nbi_check_handle(f, NBI_MAGIC_FN, "nb_fn_check", "f");
}

const char *nb_fn_name(const nb_fn *f) {
    return nbi_fn_live(f) ? f->name : "";
}

nb_jit_opts nb_jit_opts_default(void) {
    nb_jit_opts o;
    memset(&o, 0, sizeof o);
    o.max_traces = 0;
    o.inline_calls = true;
    return o;
}

nb_call_opts nb_call_opts_default(void) {
    nb_call_opts o;
    memset(&o, 0, sizeof o);
    return o;
}

static int nbi_fn_chain(const nb_fn *f) {
    int n = 0;
    for (const nb_fn *g = f; g != NULL; g = g->inner) {
        n++;
    }
    return n;
}

nb_status nbi_fn_wrap(nb_fn *f, const char *fn_name, nbi_fn_kind kind, int max_traces,
                      bool inline_calls, nb_fn **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status cst = nbi_check_handle(f, NBI_MAGIC_FN, fn_name, "f");
    if (cst != NB_OK) {
        return cst;
    }
    nb_ctx *ctx = f->hdr.ctx;
    if (out == NULL) {
        return nbi_fn_null_out(ctx, fn_name, "an nb_fn * to receive the new function");
    }
    if (max_traces < 0) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: max_traces is %d; it must be >= 0", fn_name,
                       max_traces);
    }
    if (nbi_fn_chain(f) >= NBI_MAX_LAYERS) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: more than %d nested wrappers", fn_name,
                       NBI_MAX_LAYERS - 1);
    }
    nb_fn *w = NULL;
    nb_status st = nbi_fn_new(ctx, fn_name, f->name, &w);
    if (st != NB_OK) {
        return st;
    }
    w->kind = kind;
    w->max_traces = max_traces;
    w->inline_calls = inline_calls;
    w->inner = nb_fn_retain(f);
    *out = w;
    return NB_OK;
}

nb_status nb_jit(nb_fn *f, const nb_jit_opts *opts, nb_fn **out) {
    nb_jit_opts o = opts ? *opts : nb_jit_opts_default();
    if (nbi_fn_live(f) && (o.native < NB_NATIVE_AUTO || o.native > NB_NATIVE_NOW)) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err(f->hdr.ctx, NB_ERR_INVALID,
                       "nb_jit: opts->native is %d; it must be NB_NATIVE_AUTO (%d), "
                       "NB_NATIVE_OFF (%d) or NB_NATIVE_NOW (%d)",
                       o.native, NB_NATIVE_AUTO, NB_NATIVE_OFF, NB_NATIVE_NOW);
    }
    nb_status st = nbi_fn_wrap(f, "nb_jit", NBI_FN_JIT, o.max_traces, o.inline_calls, out);
    if (st == NB_OK) {
        (*out)->native = (uint8_t)o.native;
        (*out)->debug =
            (uint8_t)((o.debug_nans ? NBI_DEBUG_NANS : 0) | (o.debug_infs ? NBI_DEBUG_INFS : 0) |
                      (o.debug_retrace ? NBI_DEBUG_RETRACE : 0));
    }
    return st;
}

/* The checks (NBI_DEBUG_*) of the call being made on this thread: what compiles get. */
static _Thread_local uint8_t nbi_debug_mode;
/* The native mode (NB_NATIVE_*) of the call being made on this thread: that of the
 * outermost jit layer that says other than AUTO (a wrapper decides for what it wraps). */
static _Thread_local uint8_t nbi_native_mode;

static uint8_t nbi_native_of(const nb_fn *f) {
    for (const nb_fn *g = f; g != NULL; g = g->inner) {
        if (g->kind == NBI_FN_JIT && g->native != NB_NATIVE_AUTO) {
            return g->native;
        }
    }
    return NB_NATIVE_AUTO;
}

/* NABLA_DEBUG_NANS / NABLA_DEBUG_INFS, read once per process. */
static unsigned nbi_debug_env(void) {
    static _Atomic int flags = -1; /* a benign race reads the same environment twice */
    int f = atomic_load_explicit(&flags, memory_order_relaxed);
    if (f < 0) {
        const char *a = getenv("NABLA_DEBUG_NANS"), *b = getenv("NABLA_DEBUG_INFS");
        const char *c = getenv("NABLA_DEBUG_RETRACE");
        f = (a != NULL && a[0] != '\0' && strcmp(a, "0") != 0 ? NBI_DEBUG_NANS : 0) |
            (b != NULL && b[0] != '\0' && strcmp(b, "0") != 0 ? NBI_DEBUG_INFS : 0) |
            (c != NULL && c[0] != '\0' && strcmp(c, "0") != 0 ? NBI_DEBUG_RETRACE : 0);
        atomic_store_explicit(&flags, f, memory_order_relaxed);
    }
    return (unsigned)f;
}

/* The checks a call of f is compiled with: the environment's and those of f's jit layers. */
static uint8_t nbi_debug_of(const nb_fn *f) {
    unsigned d = nbi_debug_env();
    for (const nb_fn *g = f; g != NULL; g = g->inner) {
        d |= g->debug;
    }
    return (uint8_t)d;
}

nb_status nb_max_traces(nb_fn *f, int n, nb_fn **out) {
    if (nbi_fn_live(f) && n < 1) {
        if (out != NULL) {
            *out = NULL;
        }
        return nbi_err(f->hdr.ctx, NB_ERR_INVALID, "nb_max_traces: n is %d; it must be >= 1", n);
    }
    return nbi_fn_wrap(f, "nb_max_traces", NBI_FN_MAXTRACES, n, true, out);
}

static const nb_fn *nbi_fn_plain(const nb_fn *f) {
    while (f->kind != NBI_FN_PLAIN) {
        f = f->inner;
    }
    return f;
}

/* ---- the cache state ---------------------------------------------------------------- */

static void nbi_layers_free(nbi_layer *layers, int n) {
    for (int i = 0; i < n; i++) {
        nb_treedef_destroy(layers[i].spec_def);
        nb_treedef_destroy(layers[i].rule_def[0]);
        nb_treedef_destroy(layers[i].rule_def[1]);
    }
}

static void nbi_dplan_free(nb_ctx *ctx, nbi_dplan *dp) {
    if (dp == NULL) {
        return;
    }
    nb_treedef_destroy(dp->donate_def);
    if (dp->mem != NULL) {
        nbi_free(ctx, dp->mem, dp->mem_bytes);
    }
    nbi_free(ctx, dp, sizeof *dp);
}

static void nbi_entry_free(nb_ctx *ctx, nbi_entry *e) {
    while (e->plans != NULL) {
        nbi_dplan *next = e->plans->next;
        nbi_dplan_free(ctx, e->plans);
        e->plans = next;
    }
    nb_treedef_destroy(e->args_def);
    nb_treedef_destroy(e->out_def);
    nbi_exec_destroy(e->exec);
    if (e->sigs != NULL) {
        nbi_free(ctx, e->sigs, (size_t)e->n_leaves * sizeof(nbi_leafsig));
    }
    if (e->ir_text != NULL) {
        nbi_free(ctx, e->ir_text, e->ir_bytes);
    }
    nbi_free(ctx, e, sizeof *e);
}

/* g as text (nb_fn_format_ir's form) in new memory: *out, *bytes (with the NUL). */
static nb_status nbi_graph_text(nb_ctx *ctx, const nbi_graph *g, const char *name, char **out,
                                size_t *bytes) {
    nbi_sbuf m = nbi_sbuf_make(NULL, 0);
    nbi_graph_format(&m, g, name);
    size_t need = 0;
    (void)nbi_sbuf_finish(&m, &need);
    char *t = nbi_alloc(ctx, need + 1, 8);
    if (t == NULL) {
        return nbi_oom(ctx, "debug_retrace", need + 1);
    }
    nbi_sbuf s = nbi_sbuf_make(t, need + 1);
    nbi_graph_format(&s, g, name);
    (void)nbi_sbuf_finish(&s, NULL);
    *out = t;
    *bytes = need + 1;
    return NB_OK;
}

static void nbi_ident_free(nb_ctx *ctx, nbi_ident *id) {
    nbi_entry *e = id->entries;
    while (e != NULL) {
        nbi_entry *next = e->next;
        nbi_entry_free(ctx, e);
        e = next;
    }
    for (int64_t i = 0; i < id->stats.n_retraces; i++) {
        nbi_free(ctx, id->reasons[i], strlen(id->reasons[i]) + 1);
    }
    if (id->reasons != NULL) {
        nbi_free(ctx, id->reasons, (size_t)id->cap_reasons * sizeof(char *));
    }
    nb_tree_destroy(id->last_sig);
    nb_treedef_destroy(id->self_def);
    nbi_layers_free(id->layers, id->n_layers);
    nbi_free(ctx, id, sizeof *id);
}

static void nbi_jit_clear(nbi_jit_state *s) {
    for (size_t b = 0; b < s->n_buckets; b++) {
        nbi_ident *id = s->buckets[b];
        while (id != NULL) {
            nbi_ident *next = id->next;
            nbi_ident_free(s->ctx, id);
            id = next;
        }
        s->buckets[b] = NULL;
    }
    s->n_idents = 0;
    s->gen++;
}

static void nbi_jit_free(nb_ctx *ctx, void *state) {
    nbi_jit_state *s = state;
    if (s == NULL) {
        return;
    }
    nbi_jit_clear(s);
    nbi_free(ctx, s->buckets, s->n_buckets * sizeof(nbi_ident *));
    if (s->leafbuf != NULL) {
        nbi_free(ctx, s->leafbuf, (size_t)s->leafcap * sizeof(const nb_tree *));
    }
    if (s->nodebuf != NULL) {
        nbi_free(ctx, s->nodebuf, (size_t)s->nodecap * sizeof(nb_tree *));
    }
    if (s->scratch != NULL) {
        nbi_free(ctx, s->scratch, s->scratch_bytes);
    }
    nbi_free(ctx, s, sizeof *s);
}

static nbi_jit_state *nbi_jit_get(nb_ctx *ctx, const char *fn) {
    void **slot = nbi_ctx_jit_slot(ctx);
    if (*slot != NULL) {
        return *slot;
    }
    nbi_jit_state *s = nbi_alloc(ctx, sizeof *s, 8);
    if (s == NULL) {
        nbi_oom(ctx, fn, sizeof *s);
        return NULL;
    }
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->gen = 1;
    s->n_buckets = 64;
    s->buckets = nbi_alloc(ctx, s->n_buckets * sizeof(nbi_ident *), 8);
    if (s->buckets == NULL) {
        nbi_free(ctx, s, sizeof *s);
        nbi_oom(ctx, fn, 64 * sizeof(nbi_ident *));
        return NULL;
    }
    memset(s->buckets, 0, s->n_buckets * sizeof(nbi_ident *));
    *slot = s;
    nbi_ctx_set_jit_free(ctx, nbi_jit_free);
    return s;
}

void nb_ctx_clear_cache(nb_ctx *ctx) {
    if (ctx == NULL) {
        return;
    }
    nbi_jit_state *s = *nbi_ctx_jit_slot(ctx);
    if (s != NULL) {
        nbi_jit_clear(s);
    }
}

/* ---- identities --------------------------------------------------------------------- */

static uint64_t nbi_mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static int nbi_layers_of(const nb_fn *f, nbi_layer *layers) {
    int n = 0;
    for (const nb_fn *g = f; g->kind != NBI_FN_PLAIN; g = g->inner) {
        memset(&layers[n], 0, sizeof layers[n]);
        layers[n].kind = g->kind;
        layers[n].max_traces = g->max_traces;
        layers[n].inline_calls = g->inline_calls;
        layers[n].has_aux = g->has_aux;
        layers[n].with_value = g->with_value;
        layers[n].debug = g->debug;
        layers[n].spec = g->spec;
        if (g->kind == NBI_FN_CUSTOM_VJP || g->kind == NBI_FN_CUSTOM_JVP) {
            const nb_fn *rules[2] = {nbi_fn_plain(g->fwd),
                                     g->bwd != NULL ? nbi_fn_plain(g->bwd) : NULL};
            for (int r = 0; r < 2 && rules[r] != NULL; r++) {
                layers[n].rule_body[r] = rules[r]->body;
                layers[n].rule_self[r] = rules[r]->self;
            }
        }
        n++;
    }
    return n;
}

static uint64_t nbi_ident_hash(const nbi_layer *layers, int n, nb_fn_body body,
                               const nb_tree *self) {
    uint64_t h = 0x6e61626c61ull; /* "nabla" */
    for (int i = 0; i < n; i++) {
        h = nbi_mix(h, (uint64_t)layers[i].kind);
        h = nbi_mix(h, (uint64_t)layers[i].max_traces);
        h = nbi_mix(h, (uint64_t)layers[i].inline_calls);
        h = nbi_mix(h, (uint64_t)layers[i].has_aux * 2 + (uint64_t)layers[i].with_value +
                           (uint64_t)layers[i].debug * 4);
        h = nbi_mix(h, layers[i].spec ? nbi_tree_def_hash(layers[i].spec) : 0);
        for (int r = 0; r < 2; r++) {
            uint64_t rb = 0;
            nb_fn_body fb = layers[i].rule_body[r];
            memcpy(&rb, &fb, sizeof fb < sizeof rb ? sizeof fb : sizeof rb);
            h = nbi_mix(h, rb);
            h = nbi_mix(h, layers[i].rule_self[r] ? nbi_tree_def_hash(layers[i].rule_self[r]) : 0);
        }
    }
    nb_fn_body b = body;
    uint64_t bits = 0;
    memcpy(&bits, &b, sizeof b < sizeof bits ? sizeof b : sizeof bits);
    h = nbi_mix(h, bits);
    h = nbi_mix(h, self ? nbi_tree_def_hash(self) : 0);
    return h;
}

/* The identity of f, or NULL (created when create is set; NULL with an error on OOM). */
static nbi_ident *nbi_ident_find(nbi_jit_state *s, const nb_fn *f, bool create, const char *fn) {
    nbi_layer layers[NBI_MAX_LAYERS];
    int n = nbi_layers_of(f, layers);
    const nb_fn *p = nbi_fn_plain(f);
    uint64_t h = nbi_ident_hash(layers, n, p->body, p->self);
    size_t b = (size_t)(h % s->n_buckets);
    for (nbi_ident *id = s->buckets[b]; id != NULL; id = id->next) {
        if (id->hash != h || id->n_layers != n || id->body != p->body ||
            (id->self_def == NULL) != (p->self == NULL)) {
            continue;
        }
        bool same = true;
        for (int i = 0; i < n && same; i++) {
            same = id->layers[i].kind == layers[i].kind &&
                   id->layers[i].max_traces == layers[i].max_traces &&
                   id->layers[i].inline_calls == layers[i].inline_calls &&
                   id->layers[i].has_aux == layers[i].has_aux &&
                   id->layers[i].with_value == layers[i].with_value &&
                   id->layers[i].debug == layers[i].debug &&
                   (id->layers[i].spec_def == NULL) == (layers[i].spec == NULL) &&
                   (layers[i].spec == NULL ||
                    nbi_tree_def_match(layers[i].spec, id->layers[i].spec_def));
            for (int r = 0; r < 2 && same; r++) {
                const nb_tree *rs = layers[i].rule_self[r];
                same = id->layers[i].rule_body[r] == layers[i].rule_body[r] &&
                       (id->layers[i].rule_def[r] == NULL) == (rs == NULL) &&
                       (rs == NULL || nbi_tree_def_match(rs, id->layers[i].rule_def[r]));
            }
        }
        if (same && (p->self == NULL || nbi_tree_def_match(p->self, id->self_def))) {
            return id;
        }
    }
    if (!create) {
        return NULL;
    }
    nbi_ident *id = nbi_alloc(s->ctx, sizeof *id, 8);
    if (id == NULL) {
        nbi_oom(s->ctx, fn, sizeof *id);
        return NULL;
    }
    memset(id, 0, sizeof *id);
    id->hash = h;
    id->n_layers = n;
    memcpy(id->layers, layers, sizeof layers);
    bool ok = true;
    for (int i = 0; i < n; i++) {
        id->layers[i].spec = NULL; /* the functions' trees are not kept; their values are */
        id->layers[i].rule_self[0] = id->layers[i].rule_self[1] = NULL;
        if (ok && layers[i].spec != NULL) {
            ok = nb_tree_treedef(layers[i].spec, &id->layers[i].spec_def) == NB_OK;
        }
        for (int r = 0; r < 2 && ok; r++) {
            if (layers[i].rule_self[r] != NULL) {
                ok = nb_tree_treedef(layers[i].rule_self[r], &id->layers[i].rule_def[r]) == NB_OK;
            }
        }
    }
    if (!ok) {
        nbi_layers_free(id->layers, n);
        nbi_free(s->ctx, id, sizeof *id);
        return NULL;
    }
    id->body = p->body;
    if (p->self != NULL && nb_tree_treedef(p->self, &id->self_def) != NB_OK) {
        nbi_layers_free(id->layers, n);
        nbi_free(s->ctx, id, sizeof *id);
        return NULL;
    }
    id->next = s->buckets[b];
    s->buckets[b] = id;
    s->n_idents++;
    return id;
}

/* nbi_ident_find through f's memo: a function's identity never changes (its wrappers, body
 * and bound data are fixed when it is made), so it is looked up once per cache generation. */
static nbi_ident *nbi_ident_of(nbi_jit_state *s, const nb_fn *f, bool create, const char *fn) {
    if (f->jit_gen == s->gen && f->jit_ident != NULL) {
        return f->jit_ident;
    }
    nbi_ident *id = nbi_ident_find(s, f, create, fn);
    if (id != NULL) {
        nb_fn *m = (nb_fn *)f; /* a memo of an immutable value, not a change to it */
        m->jit_ident = id;
        m->jit_gen = s->gen;
    }
    return id;
}

/* ---- signatures --------------------------------------------------------------------- */

static void nbi_collect(const nb_tree *t, const nb_tree **out, int64_t *k) {
    if (t->kind == NB_TREE_KIND_ARRAY || t->kind == NB_TREE_KIND_VAR) {
        out[(*k)++] = t;
        return;
    }
    for (int64_t i = 0; i < t->n; i++) {
        nbi_collect(t->children[i], out, k);
    }
}

static void nbi_leaf_sig(const nb_tree *leaf, nbi_leafsig *s) {
    memset(s, 0, sizeof *s);
    if (leaf->kind == NB_TREE_KIND_ARRAY) {
        const nb_array *a = leaf->u.array;
        s->dtype = (int32_t)a->dtype;
        s->rank = a->rank;
        memcpy(s->shape, a->shape, (size_t)a->rank * sizeof(int64_t));
    } else {
        const nb_var *v = leaf->u.var.var;
        s->dtype = (int32_t)v->dtype;
        s->rank = v->rank;
        memcpy(s->shape, v->shape, (size_t)v->rank * sizeof(int64_t));
    }
}

static uint64_t nbi_sig_hash(nb_dtype dtype, int rank, const int64_t *shape) {
    uint64_t h = 0x9e3779b97f4a7c15ull * ((uint64_t)dtype + 1) + (uint64_t)rank;
    for (int r = 0; r < rank; r++) {
        h = (h ^ (uint64_t)shape[r]) * 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static bool nbi_sig_eq(const nbi_leafsig *s, nb_dtype dtype, int rank, const int64_t *shape) {
    if ((int32_t)dtype != s->dtype || rank != s->rank) {
        return false;
    }
    for (int r = 0; r < rank; r++) {
        if (shape[r] != s->shape[r]) {
            return false;
        }
    }
    return true;
}

static bool nbi_leaf_sig_eq(const nb_tree *leaf, const nbi_leafsig *s) {
    if (leaf->kind == NB_TREE_KIND_ARRAY) {
        const nb_array *a = leaf->u.array;
        return nbi_sig_eq(s, a->dtype, a->rank, a->shape);
    }
    const nb_var *v = leaf->u.var.var;
    return nbi_sig_eq(s, v->dtype, v->rank, v->shape);
}

static uint64_t nbi_key_hash(const nb_tree *args, const nb_tree *const *leaves, int64_t n) {
    uint64_t h = nbi_tree_def_hash(args);
    for (int64_t i = 0; i < n; i++) {
        nbi_leafsig s;
        nbi_leaf_sig(leaves[i], &s);
        h = nbi_mix(h, (uint64_t)s.dtype);
        h = nbi_mix(h, (uint64_t)s.rank);
        for (int r = 0; r < s.rank; r++) {
            h = nbi_mix(h, (uint64_t)s.shape[r]);
        }
    }
    return h;
}

/* Does args have e's args treedef? A tree once seen to match is known by its serial (trees
 * are immutable and serials never reused); any other is compared in full. */
static bool nbi_entry_args_match(nbi_entry *e, const nb_tree *args) {
    if (args->serial == e->args_serial) {
        return true;
    }
    if (nbi_tree_def_hash(args) != e->args_hash || !nbi_tree_def_match(args, e->args_def)) {
        return false;
    }
    e->args_serial = args->serial;
    return true;
}

static bool nbi_entry_sigs_match(const nbi_entry *e, const nb_tree *const *leaves, int64_t n) {
    if (e->n_leaves != n) {
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        if (!nbi_leaf_sig_eq(leaves[i], &e->sigs[i])) {
            return false;
        }
    }
    return true;
}

static nbi_entry *nbi_entry_find(nbi_ident *id, uint64_t h, const nb_tree *args,
                                 const nb_tree *const *leaves, int64_t n, uint8_t debug) {
    for (nbi_entry *e = id->entries; e != NULL; e = e->next) {
        if (e->hash == h && e->n_leaves == n && e->debug == debug &&
            nbi_entry_args_match(e, args) && nbi_entry_sigs_match(e, leaves, n)) {
            return e;
        }
    }
    return NULL;
}

/* nbi_entry_find without the key's hash (a call from outside a trace): the whole key is
 * compared, entry by entry; the entry found moves to the front. */
static nbi_entry *nbi_entry_hit(nbi_ident *id, const nb_tree *args, const nb_tree *const *leaves,
                                int64_t n, uint8_t debug) {
    for (nbi_entry *e = id->entries, *prev = NULL; e != NULL; prev = e, e = e->next) {
        if (e->n_leaves == n && e->debug == debug && nbi_entry_args_match(e, args) &&
            nbi_entry_sigs_match(e, leaves, n)) {
            if (prev != NULL) {
                prev->next = e->next;
                e->next = id->entries;
                id->entries = e;
            }
            return e;
        }
    }
    return NULL;
}

/* A signature tree: t with every dynamic leaf replaced by a string "f32[2,3]" marked with
 * NBI_SIG_FLAG. Used only for retrace reasons. */
static nb_status nbi_sig_leaf_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                                 nb_tree **out) {
    (void)ud;
    (void)path;
    (void)n;
    nbi_leafsig s;
    nbi_leaf_sig(l[0], &s);
    char sig[NBI_SIG_CAP];
    nbi_sig(sig, sizeof sig, (nb_dtype)s.dtype, s.rank, s.shape);
    nb_status st = nb_tree_string(l[0]->hdr.ctx, sig, out);
    if (st == NB_OK) {
        (*out)->flags |= NBI_SIG_FLAG;
    }
    return st;
}

static void nbi_sbuf_static_value(nbi_sbuf *s, const nb_tree *t) {
    switch (t->kind) {
    case NB_TREE_KIND_INT:
        nbi_sbuf_printf(s, "%lld", (long long)t->u.i);
        break;
    case NB_TREE_KIND_FLOAT:
        nbi_sbuf_printf(s, "%.17g", t->u.f);
        break;
    case NB_TREE_KIND_BOOL:
        nbi_sbuf_puts(s, t->u.b ? "true" : "false");
        break;
    case NB_TREE_KIND_STRING:
        nbi_sbuf_printf(s, "\"%s\"", t->u.str);
        break;
    case NB_TREE_KIND_FNREF:
        nbi_sbuf_printf(s, "fn '%s'", t->u.fnref.name);
        break;
    default:
        nbi_sbuf_describe(s, t);
        break;
    }
}

static bool nbi_is_sig(const nb_tree *t) {
    return t->kind == NB_TREE_KIND_STRING && (t->flags & NBI_SIG_FLAG);
}

static void nbi_sbuf_sigdesc(nbi_sbuf *s, const nb_tree *t) {
    if (nbi_is_sig(t)) {
        nbi_sbuf_puts(s, t->u.str);
    } else if (nbi_tree_kind_is_static(t->kind)) {
        nbi_sbuf_puts(s, "static ");
        nbi_sbuf_static_value(s, t);
    } else {
        nbi_sbuf_describe(s, t);
    }
}

/* First difference between two signature trees: "<path>: <how>". */
static bool nbi_sig_diff(const nb_tree *a, const nb_tree *b, nbi_path *path, nbi_sbuf *s) {
    bool an = nbi_tree_kind_is_node(a->kind), bn = nbi_tree_kind_is_node(b->kind);
    if (an && bn && a->kind == b->kind && a->n == b->n) {
        for (int64_t i = 0; i < a->n; i++) {
            if (a->kind == NB_TREE_KIND_DICT && strcmp(a->keys[i], b->keys[i]) != 0) {
                nbi_sbuf_printf(s, "%s: dict keys differ at position %lld: \"%s\" → \"%s\"",
                                nbi_path_str(path), (long long)i, a->keys[i], b->keys[i]);
                return true;
            }
        }
        for (int64_t i = 0; i < a->n; i++) {
            nbi_path_mark m = nbi_path_save(path);
            if (a->kind == NB_TREE_KIND_DICT) {
                nbi_path_push_key(path, a->keys[i]);
            } else {
                nbi_path_push_index(path, i);
            }
            bool d = nbi_sig_diff(a->children[i], b->children[i], path, s);
            nbi_path_restore(path, m);
            if (d) {
                return true;
            }
        }
        return false;
    }
    if (!an && !bn && a->kind == b->kind && nbi_is_sig(a) == nbi_is_sig(b) &&
        (a->kind == NB_TREE_KIND_NULL || nbi_static_equal(a, b))) {
        return false;
    }
    nbi_sbuf_puts(s, nbi_path_str(path));
    nbi_sbuf_puts(s, ": ");
    if (nbi_is_sig(a) && nbi_is_sig(b)) {
        nbi_sbuf_printf(s, "%s → %s", a->u.str, b->u.str);
    } else if (nbi_tree_kind_is_static(a->kind) && !nbi_is_sig(a) &&
               nbi_tree_kind_is_static(b->kind) && !nbi_is_sig(b)) {
        nbi_sbuf_puts(s, "static ");
        nbi_sbuf_static_value(s, a);
        nbi_sbuf_puts(s, " → ");
        nbi_sbuf_static_value(s, b);
    } else if (an && bn) {
        nbi_sbuf_describe(s, a);
        nbi_sbuf_puts(s, " → ");
        nbi_sbuf_describe(s, b);
    } else {
        nbi_sbuf_puts(s, "was ");
        nbi_sbuf_sigdesc(s, a);
        nbi_sbuf_puts(s, ", now ");
        nbi_sbuf_sigdesc(s, b);
    }
    return true;
}

static const char *nbi_ordinal_suffix(int64_t n) {
    int64_t m = n % 100;
    if (m >= 11 && m <= 13) {
        return "th";
    }
    return n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
}

/* What nbi_note_trace changed in an identity, to take back when the trace fails (kept in
 * the trace's arena, newest first). */
typedef struct nbi_trace_undo {
    struct nbi_trace_undo *next;
    nbi_ident *id;
    uint64_t gen; /* the cache generation: a cleared cache has no identities to restore */
    int64_t n_traces, n_retraces;
    nb_tree *last_sig; /* the identity's previous signature (owned) */
    bool sig_moved;    /* last_sig was replaced (else the identity still holds it) */
} nbi_trace_undo;

/* The end of a trace's accounting: kept when the trace compiled (ok), taken back when it
 * failed anywhere -- a limit refused by an inner wrapper, an error in the body, a failed
 * compile. So n_traces counts the traces that produced an executable, the same whatever
 * order wrappers are in, and a refused call leaves the next retrace's reason unchanged. */
static void nbi_trace_settle(nb_trace *tr, bool ok) {
    nbi_jit_state *s = tr->jit;
    for (nbi_trace_undo *u = tr->undo; u != NULL; u = u->next) {
        if (ok || s == NULL || u->gen != s->gen) {
            nb_tree_destroy(u->last_sig);
            continue;
        }
        nbi_ident *id = u->id;
        for (int64_t i = u->n_retraces; i < id->stats.n_retraces; i++) {
            nbi_free(tr->ctx, id->reasons[i], strlen(id->reasons[i]) + 1);
            id->reasons[i] = NULL;
        }
        id->stats.n_traces = u->n_traces;
        id->stats.n_retraces = u->n_retraces;
        if (u->sig_moved) {
            nb_tree_destroy(id->last_sig);
            id->last_sig = u->last_sig;
        }
    }
    tr->undo = NULL;
}

/* Record a trace of identity id on arguments (self, args) (vars or arrays); on a retrace,
 * store the reason. Fails the trace when a max_traces limit of layer is exceeded. The
 * change is logged on tr, so that a trace that fails later is not counted. */
static nb_status nbi_note_trace(nb_trace *tr, nbi_ident *id, const nb_fn *layer,
                                const nb_tree *self, const nb_tree *args) {
    nb_ctx *ctx = tr->ctx;
    nb_tree *ss = NULL, *as = NULL, *sig = NULL;
    nb_status st = NB_OK;
    if (self != NULL) {
        st = nb_tree_map(self, nbi_sig_leaf_cb, NULL, 0, &ss);
    } else {
        st = nb_tree_null(ctx, &ss);
    }
    if (st == NB_OK) {
        st = nb_tree_map(args, nbi_sig_leaf_cb, NULL, 0, &as);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){ss, as}, &sig);
    }
    nb_tree_destroy(ss);
    nb_tree_destroy(as);
    if (st != NB_OK) {
        return nbi_trace_err(tr, st, "out of memory recording a trace");
    }
    char reason[NBI_ERRMSG_CAP / 2];
    reason[0] = '\0';
    if (id->last_sig != NULL) {
        nbi_sbuf rs = nbi_sbuf_make(reason, sizeof reason);
        nbi_path path;
        nbi_path_init(&path);
        nbi_path_push_key(&path, "self");
        bool d = nbi_sig_diff(id->last_sig->children[0], sig->children[0], &path, &rs);
        if (!d) {
            nbi_path_init(&path);
            if (args->kind != NB_TREE_KIND_DICT) {
                nbi_path_push_key(&path, "args");
            }
            d = nbi_sig_diff(id->last_sig->children[1], sig->children[1], &path, &rs);
        }
        if (!d) {
            snprintf(reason, sizeof reason,
                     "same signature as the previous trace (a function around it was "
                     "retraced, or its cache was cleared)");
        }
    }
    /* Over the limit: fail before recording anything, so every later call fails the same
     * way with the same reason (relative to the last trace that was allowed). */
    if (layer->kind != NBI_FN_PLAIN && layer->max_traces > 0 &&
        id->stats.n_traces + 1 > layer->max_traces) {
        nb_tree_destroy(sig);
        return nbi_trace_err(tr, NB_ERR_RETRACE,
                             "%s: '%s' would be traced a %lld%s time, more than max_traces = %d "
                             "allows; this retrace: %s",
                             layer->kind == NBI_FN_MAXTRACES ? "nb_max_traces" : "nb_jit",
                             layer->name, (long long)id->stats.n_traces + 1,
                             nbi_ordinal_suffix(id->stats.n_traces + 1), (int)layer->max_traces,
                             reason[0] ? reason : "(first trace)");
    }
    nbi_trace_undo *u = nbi_arena_alloc(&tr->arena, sizeof *u);
    if (u == NULL) {
        nb_tree_destroy(sig);
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory recording a trace");
    }
    *u = (nbi_trace_undo){.next = tr->undo,
                          .id = id,
                          .gen = tr->jit ? tr->jit->gen : 0,
                          .n_traces = id->stats.n_traces,
                          .n_retraces = id->stats.n_retraces};
    tr->undo = u;
    id->stats.n_traces++;
    if (id->last_sig != NULL) {
        if (id->stats.n_retraces == id->cap_reasons) {
            int64_t cap = id->cap_reasons ? id->cap_reasons * 2 : 8;
            char **r = nbi_alloc(ctx, (size_t)cap * sizeof(char *), 8);
            if (r == NULL) {
                nb_tree_destroy(sig);
                return nbi_trace_err(tr, NB_ERR_OOM, "out of memory recording a retrace");
            }
            if (id->reasons != NULL) {
                memcpy(r, id->reasons, (size_t)id->stats.n_retraces * sizeof(char *));
                nbi_free(ctx, id->reasons, (size_t)id->cap_reasons * sizeof(char *));
            }
            id->reasons = r;
            id->cap_reasons = cap;
        }
        size_t len = strlen(reason) + 1;
        char *copy = nbi_alloc(ctx, len, 8);
        if (copy == NULL) {
            nb_tree_destroy(sig);
            return nbi_trace_err(tr, NB_ERR_OOM, "out of memory recording a retrace");
        }
        memcpy(copy, reason, len);
        id->reasons[id->stats.n_retraces++] = copy;
    }
    u->last_sig = id->last_sig;
    u->sig_moved = true;
    id->last_sig = sig;
    return NB_OK;
}

/* ---- tracing ------------------------------------------------------------------------ */

/* Trace f (through its wrappers) into tr on (self, args) whose dynamic leaves are vars. */
nb_status nbi_trace_fn(nb_trace *tr, const nb_fn *f, const nb_tree *self, const nb_tree *args,
                       nb_tree **out) {
    *out = NULL;
    if (tr->depth >= NBI_MAX_DEPTH) {
        return nbi_trace_err(tr, NB_ERR_INVALID,
                             "calls nest deeper than %d (does '%s' call itself?)", NBI_MAX_DEPTH,
                             f->name);
    }
    if (!tr->quiet) {
        nbi_jit_state *s = nbi_jit_get(tr->ctx, "trace");
        nbi_ident *id = s ? nbi_ident_of(s, f, true, "trace") : NULL;
        if (id == NULL) {
            return nbi_trace_err(tr, NB_ERR_OOM, "out of memory in the compile cache");
        }
        nb_status st = nbi_note_trace(tr, id, f, self, args);
        if (st != NB_OK) {
            return st;
        }
    }
    if (nbi_fn_is_transform(f->kind) ||
        ((f->kind == NBI_FN_CUSTOM_VJP || f->kind == NBI_FN_CUSTOM_JVP) && tr->ad_depth > 0)) {
        return nbi_trace_transform(tr, f, self, args, out);
    }
    if (f->kind != NBI_FN_PLAIN) {
        return nbi_trace_fn(tr, f->inner, self, args, out);
    }
    const char *saved = tr->fn_name;
    tr->fn_name = f->name;
    tr->depth++;
    nb_trace *outer = nbi_trace_set_current(tr);
    nb_status st = f->body(tr, self, args, out);
    nbi_trace_set_current(outer);
    tr->depth--;
    if (tr->status != NB_OK) {
        tr->fn_name = saved;
        nb_tree_destroy(*out);
        *out = NULL;
        return tr->status;
    }
    if (st != NB_OK || !nbi_obj_live(*out, NBI_MAGIC_TREE)) {
        nb_tree_destroy(*out);
        *out = NULL;
        st = nbi_trace_err(tr, st != NB_OK ? st : NB_ERR_MISUSE,
                           st != NB_OK ? "the body returned %s without recording a message "
                                         "(use nb_trace_fail to say why)"
                                       : "the body returned %s but no output tree",
                           nb_status_name(st));
    }
    tr->fn_name = saved;
    return st;
}

typedef struct nbi_vars_ctx {
    nb_trace *tr;
    bool params;        /* dynamic leaves become fresh params (else: arrays -> constants) */
    int32_t next;       /* next param index */
    const char *prefix; /* "self", "args" or "" (args given as a dict) */
} nbi_vars_ctx;

static nb_status nbi_vars_cb(void *ud, const char *path, int n, const nb_tree *const *l,
                             nb_tree **out) {
    (void)n;
    nbi_vars_ctx *c = ud;
    nb_trace *tr = c->tr;
    const nb_tree *leaf = l[0];
    nb_var *v = NULL;
    if (c->params) {
        nbi_leafsig s;
        nbi_leaf_sig(leaf, &s);
        char full[NB_PATH_MAX];
        snprintf(full, sizeof full, "%s%s%s", c->prefix,
                 (c->prefix[0] && path[0] && path[0] != '[') ? "." : "", path);
        v = nbi_emit_param(tr, c->next++, (nb_dtype)s.dtype, s.rank, s.shape,
                           full[0] ? full : "args");
    } else if (leaf->kind == NB_TREE_KIND_ARRAY) {
        v = nb_constant(tr, leaf->u.array);
    } else {
        v = leaf->u.var.var;
        if (v->tr != tr) {
            return nbi_trace_err(tr, NB_ERR_INVALID,
                                 "the var at '%s' belongs to another trace (an outer function's "
                                 "var used inside a function traced on its own; pass it as an "
                                 "argument)",
                                 path[0] ? path : "<root>");
        }
    }
    if (tr->status != NB_OK) {
        return tr->status;
    }
    if (nbi_tree_var(tr->ctx, v, tr->id, out) != NB_OK) {
        return nbi_trace_err(tr, NB_ERR_OOM, "out of memory while tracing");
    }
    (*out)->flags = leaf->flags; /* a frozen mark survives into the trace */
    return NB_OK;
}

static nb_status nbi_vars_tree(nb_trace *tr, const nb_tree *t, bool params, int32_t *next,
                               const char *prefix, nb_tree **out) {
    nbi_vars_ctx c = {tr, params, next ? *next : 0, prefix};
    nb_status st = nb_tree_map(t, nbi_vars_cb, &c, 0, out);
    if (next != NULL) {
        *next = c.next;
    }
    if (st != NB_OK && tr->status == NB_OK) {
        tr->status = st; /* the map wrote the message */
    }
    return st;
}

/* Trace f as a function of its own into tr's graph: its bound data's then args' dynamic
 * leaves become params (in that order), the body's output leaves become the graph's
 * outputs (concrete arrays as constants). *out_def (may be NULL) gets the output treedef. */
static nb_status nbi_trace_graph(nb_trace *tr, const nb_fn *f, const nb_tree *args,
                                 nb_treedef **out_def) {
    const nb_fn *p = nbi_fn_plain(f);
    nb_tree *self_v = NULL, *args_v = NULL, *res = NULL, *res_leaves = NULL;
    nb_status st = NB_OK;
    int32_t next = 0;
    if (p->self != NULL) {
        st = nbi_vars_tree(tr, p->self, true, &next, "self", &self_v);
    }
    if (st == NB_OK) {
        st = nbi_vars_tree(tr, args, true, &next, args->kind == NB_TREE_KIND_DICT ? "" : "args",
                           &args_v);
    }
    if (st == NB_OK) {
        tr->g.n_inputs = next;
        tr->g.inputs = nbi_arena_alloc(&tr->arena, (size_t)(next + 1) * sizeof(nb_var *));
        if (tr->g.inputs == NULL) {
            st = nbi_trace_err(tr, NB_ERR_OOM, "out of memory while tracing");
        }
        for (int32_t i = 0, k = 0; st == NB_OK && i < tr->g.n_nodes; i++) {
            if (tr->g.nodes[i]->op == NBI_OP_PARAM) {
                tr->g.inputs[k++] = tr->g.nodes[i];
            }
        }
    }
    if (st == NB_OK) {
        st = nbi_trace_fn(tr, f, self_v, args_v, &res);
    }
    if (st == NB_OK) {
        st = nb_tree_flatten(res, &res_leaves, out_def);
    }
    if (st == NB_OK) {
        int32_t n_out = (int32_t)res_leaves->n;
        tr->g.outputs = nbi_arena_alloc(&tr->arena, (size_t)(n_out + 1) * sizeof(nb_var *));
        tr->g.n_outputs = n_out;
        if (tr->g.outputs == NULL) {
            st = nbi_trace_err(tr, NB_ERR_OOM, "out of memory while tracing");
        }
        for (int32_t i = 0; st == NB_OK && i < n_out; i++) {
            const nb_tree *leaf = res_leaves->children[i];
            nb_var *v =
                leaf->kind == NB_TREE_KIND_ARRAY ? nb_constant(tr, leaf->u.array) : leaf->u.var.var;
            if (tr->status == NB_OK && v->tr != tr) {
                nbi_trace_err(tr, NB_ERR_INVALID, "output %d of '%s' is a var of another trace",
                              (int)i, f->name);
            }
            st = tr->status;
            tr->g.outputs[i] = v;
        }
    }
    if (st != NB_OK && out_def != NULL) {
        nb_treedef_destroy(*out_def);
        *out_def = NULL;
    }
    nb_tree_destroy(res_leaves);
    nb_tree_destroy(res);
    nb_tree_destroy(args_v);
    nb_tree_destroy(self_v);
    return st;
}

/* Trace f as a function of its own on leaves (self's then args' dynamic leaves, arrays or
 * vars of an outer trace), compile it, and add the entry to id. n_fixed: the leading leaves
 * that stay the same from one run to the next (a loop body's bound data: nbi_graph.n_fixed),
 * else 0. */
static nb_status nbi_compile_entry(nbi_jit_state *s, nbi_ident *id, const nb_fn *f,
                                   const nb_tree *args, const nb_tree *const *leaves,
                                   int64_t n_leaves, uint64_t hash, int64_t n_fixed,
                                   nbi_entry **out) {
    nb_ctx *ctx = s->ctx;
    *out = NULL;
    nb_trace tr;
    nb_status st = nbi_trace_init(&tr, ctx, f->name);
    if (st != NB_OK) {
        nbi_trace_release(&tr);
        return st;
    }
    tr.id = ++s->trace_counter;
    tr.jit = s;
    nb_treedef *out_def = NULL;
    nbi_entry *e = NULL;
    nbi_exec *exec = NULL;
    st = nbi_trace_graph(&tr, f, args, &out_def);
    nbi_graph opt;
    unsigned checks = nbi_debug_mode & (NBI_DEBUG_NANS | NBI_DEBUG_INFS);
    tr.g.n_fixed = (int32_t)n_fixed;
    if (st == NB_OK) {
        st = nbi_optimize(ctx, &tr.g, checks, &tr.arena, &opt);
    }
    char *ir_text = NULL;
    size_t ir_bytes = 0;
    if (st == NB_OK && (nbi_debug_mode & NBI_DEBUG_RETRACE)) {
        st = nbi_graph_text(ctx, &tr.g, f->name, &ir_text, &ir_bytes);
    }
    if (st == NB_OK) {
        st = nbi_exec_compile(ctx, &opt, checks, &exec);
    }
    if (st == NB_OK) {
        e = nbi_alloc(ctx, sizeof *e, 8);
        if (e == NULL) {
            st = nbi_oom(ctx, "compile", sizeof *e);
        } else {
            memset(e, 0, sizeof *e);
        }
    }
    if (st == NB_OK && n_leaves > 0) {
        e->sigs = nbi_alloc(ctx, (size_t)n_leaves * sizeof(nbi_leafsig), 8);
        if (e->sigs == NULL) {
            st = nbi_oom(ctx, "compile", (size_t)n_leaves * sizeof(nbi_leafsig));
        }
    }
    if (st == NB_OK) {
        st = nb_tree_treedef(args, &e->args_def);
    }
    if (st == NB_OK) {
        e->n_leaves = n_leaves;
        for (int64_t i = 0; i < n_leaves; i++) {
            nbi_leaf_sig(leaves[i], &e->sigs[i]);
        }
        e->hash = hash;
        e->args_hash = nbi_tree_def_hash(args);
        e->args_serial = args->serial;
        e->exec = exec;
        e->out_def = out_def;
        e->n_out = nbi_exec_n_outputs(exec);
        e->debug = nbi_debug_mode;
        e->ir_text = ir_text;
        e->ir_bytes = ir_bytes;
        ir_text = NULL;
        e->next = id->entries;
        id->entries = e;
        *out = e;
        exec = NULL;
        out_def = NULL;
        e = NULL;
    }
    if (e != NULL) {
        e->n_leaves = n_leaves;
        nbi_entry_free(ctx, e);
    }
    nbi_exec_destroy(exec);
    nb_treedef_destroy(out_def);
    if (ir_text != NULL) {
        nbi_free(ctx, ir_text, ir_bytes);
    }
    nbi_trace_settle(&tr, st == NB_OK);
    nbi_trace_release(&tr);
    return st;
}

/* ---- calls from outside a trace ----------------------------------------------------- */

static nb_status nbi_leafbuf(nbi_jit_state *s, int64_t n) {
    if (n <= s->leafcap) {
        return NB_OK;
    }
    int64_t cap = s->leafcap ? s->leafcap : 64;
    while (cap < n) {
        cap *= 2;
    }
    const nb_tree **b = nbi_alloc(s->ctx, (size_t)cap * sizeof(const nb_tree *), 8);
    if (b == NULL) {
        return nbi_oom(s->ctx, "nb_fn_call", (size_t)cap * sizeof(const nb_tree *));
    }
    if (s->leafbuf != NULL) {
        nbi_free(s->ctx, s->leafbuf, (size_t)s->leafcap * sizeof(const nb_tree *));
    }
    s->leafbuf = b;
    s->leafcap = cap;
    return NB_OK;
}

typedef struct nbi_walk {
    const nb_tree **leaves;
    int64_t n_leaves;
    nb_tree **nodes;
    int64_t n_nodes, cap_nodes;
} nbi_walk;

/* Pre-order over args: every node into nodes (while there is room; n_nodes counts them
 * all), every dynamic leaf into leaves. */
static void nbi_walk_args(const nb_tree *t, nbi_walk *w) {
    if (w->n_nodes < w->cap_nodes) {
        w->nodes[w->n_nodes] = (nb_tree *)t;
    }
    w->n_nodes++;
    if (t->kind == NB_TREE_KIND_ARRAY || t->kind == NB_TREE_KIND_VAR) {
        w->leaves[w->n_leaves++] = t;
        return;
    }
    for (int64_t i = 0; i < t->n; i++) {
        nbi_walk_args(t->children[i], w);
    }
}

/* Collect self's then args' dynamic leaves into the state's leaf buffer, and args' nodes in
 * pre-order into its node buffer. */
static nb_status nbi_gather(nbi_jit_state *s, const nb_tree *self, const nb_tree *args,
                            int64_t *n) {
    int64_t total = (self ? self->n_leaves : 0) + args->n_leaves;
    nb_status st = nbi_leafbuf(s, total);
    if (st != NB_OK) {
        return st;
    }
    int64_t k = 0;
    if (self != NULL) {
        nbi_collect(self, s->leafbuf, &k);
    }
    nbi_walk w = {s->leafbuf, k, s->nodebuf, 0, s->nodecap};
    nbi_walk_args(args, &w);
    if (w.n_nodes > s->nodecap) { /* the first call with this many nodes: grow, walk again */
        int64_t cap = s->nodecap ? s->nodecap : 64;
        while (cap < w.n_nodes) {
            cap *= 2;
        }
        nb_tree **b = nbi_alloc(s->ctx, (size_t)cap * sizeof(nb_tree *), 8);
        if (b == NULL) {
            return nbi_oom(s->ctx, "nb_fn_call", (size_t)cap * sizeof(nb_tree *));
        }
        if (s->nodebuf != NULL) {
            nbi_free(s->ctx, s->nodebuf, (size_t)s->nodecap * sizeof(nb_tree *));
        }
        s->nodebuf = b;
        s->nodecap = cap;
        w = (nbi_walk){s->leafbuf, k, s->nodebuf, 0, s->nodecap};
        nbi_walk_args(args, &w);
    }
    *n = w.n_leaves;
    return NB_OK;
}

/* Per args leaf: donated? (spec: NULL, a bool leaf, or a tree of args' structure.) Without
 * a path (NULL), a mismatch returns NB_ERR_STRUCTURE with no message: walk again with one
 * to say where (paths are built only for messages). */
static nb_status nbi_donate_walk(nb_ctx *ctx, const nb_tree *a, const nb_tree *d, bool all,
                                 bool *flags, int64_t *k, nbi_path *path) {
    if (a->kind == NB_TREE_KIND_ARRAY || a->kind == NB_TREE_KIND_VAR) {
        bool on = all;
        if (d != NULL && d->kind == NB_TREE_KIND_BOOL) {
            on = d->u.b;
        } else if (d != NULL && d->kind != NB_TREE_KIND_NULL && !all) {
            if (path == NULL) {
                return NB_ERR_STRUCTURE;
            }
            return nbi_err(ctx, NB_ERR_STRUCTURE,
                           "nb_fn_call_ex: the donate tree has %s at %s where args has an array "
                           "(use a bool leaf)",
                           nb_tree_kind_name(d->kind), nbi_path_str(path));
        }
        flags[(*k)++] = on;
        return NB_OK;
    }
    bool sub_all = all || (d != NULL && d->kind == NB_TREE_KIND_BOOL && d->u.b);
    bool d_node = d != NULL && nbi_tree_kind_is_node(d->kind);
    if (d_node && (d->kind != a->kind || d->n != a->n)) {
        if (path == NULL) {
            return NB_ERR_STRUCTURE;
        }
        return nbi_err(ctx, NB_ERR_STRUCTURE,
                       "nb_fn_call_ex: the donate tree does not match args at %s (%s of %lld vs "
                       "%s of %lld)",
                       nbi_path_str(path), nb_tree_kind_name(d->kind), (long long)d->n,
                       nb_tree_kind_name(a->kind), (long long)a->n);
    }
    for (int64_t i = 0; i < a->n; i++) {
        nbi_path_mark m = {0, false};
        if (path != NULL) {
            m = nbi_path_save(path);
            if (a->kind == NB_TREE_KIND_DICT) {
                nbi_path_push_key(path, a->keys[i]);
            } else {
                nbi_path_push_index(path, i);
            }
        }
        nb_status st = nbi_donate_walk(ctx, a->children[i], d_node ? d->children[i] : NULL, sub_all,
                                       flags, k, path);
        if (path != NULL) {
            nbi_path_restore(path, m);
        }
        if (st != NB_OK) {
            return st;
        }
    }
    return NB_OK;
}

/* Resolve donate (a live spec) against e's args: which output goes into which donated
 * input array (the first unused donated args leaf of its dtype and shape, in leaf order),
 * and which output subtrees can be returned as args' own. The result depends only on e and
 * the spec's treedef. A spec of this context is cached with its treedef; one of another is
 * not (*out is then the caller's to free). */
static nb_status nbi_dplan_make(nbi_jit_state *s, const nbi_entry *e, const nb_tree *args,
                                const nb_tree *donate, int64_t first_arg, nbi_dplan **out) {
    static const char fn[] = "nb_fn_call_ex";
    nb_ctx *ctx = s->ctx;
    *out = NULL;
    const nb_treedef *ad = e->args_def, *od = e->out_def;
    int64_t n = e->n_leaves, n_args = n - first_arg, n_out = e->n_out;
    nbi_dplan *dp = nbi_alloc(ctx, sizeof *dp, 8);
    if (dp == NULL) {
        return nbi_oom(ctx, fn, sizeof *dp);
    }
    memset(dp, 0, sizeof *dp);
    /* temporary: extents of both treedefs, args leaf -> its node, then the flags */
    size_t tbytes =
        ((size_t)(ad->n_nodes + od->n_nodes) * 3 + (size_t)n_args + 1) * sizeof(int32_t) +
        (size_t)n_args * 2 + 1;
    int32_t *tmp = nbi_alloc(ctx, tbytes, 8);
    dp->mem_bytes = (size_t)(n_out + od->n_nodes + 1) * sizeof(int32_t) + (size_t)n_out * 2 + 1;
    dp->mem = nbi_alloc(ctx, dp->mem_bytes, 8);
    nb_status st = NB_OK;
    if (tmp == NULL || dp->mem == NULL) {
        st = nbi_oom(ctx, fn, tmp == NULL ? tbytes : dp->mem_bytes);
    }
    if (st == NB_OK && donate->hdr.ctx == ctx) {
        st = nb_tree_treedef(donate, &dp->donate_def);
        dp->donate_hash = nbi_tree_def_hash(donate);
        dp->donate_serial = donate->serial;
    }
    if (st != NB_OK) {
        if (tmp != NULL) {
            nbi_free(ctx, tmp, tbytes);
        }
        nbi_dplan_free(ctx, dp);
        return st;
    }
    int32_t *a_size = tmp, *a_first = a_size + ad->n_nodes, *a_nleaf = a_first + ad->n_nodes;
    int32_t *o_size = a_nleaf + ad->n_nodes, *o_first = o_size + od->n_nodes;
    int32_t *o_nleaf = o_first + od->n_nodes, *leaf_node = o_nleaf + od->n_nodes;
    bool *flags = (bool *)(leaf_node + n_args + 1), *used = flags + n_args;
    dp->take = dp->mem;
    dp->reuse = dp->take + n_out;
    dp->donated = (bool *)(dp->reuse + od->n_nodes + 1);
    dp->covered = dp->donated + n_out;
    memset(dp->donated, 0, (size_t)n_out * 2);
    memset(used, 0, (size_t)n_args);
    int64_t k = 0;
    st = nbi_donate_walk(ctx, args, donate, false, flags, &k, NULL);
    if (st != NB_OK) {
        nbi_path path;
        nbi_path_init(&path);
        nbi_path_push_key(&path, "args");
        k = 0;
        st = nbi_donate_walk(ctx, args, donate, false, flags, &k, &path);
    }
    bool any = false;
    /* The donated args leaves by signature, each signature's in leaf order, so every output
     * takes the first unused one of its own in O(1) (a scan of all leaves per output was
     * quadratic: half of a 3*10^4-leaf Adam step's first call). */
    uint32_t nbk = 16;
    while (nbk < 2u * (uint32_t)(n_args + 1) && nbk < (1u << 30)) {
        nbk *= 2;
    }
    size_t hbytes = (size_t)nbk * 3 * sizeof(int32_t) + (size_t)(n_args + 1) * sizeof(int32_t);
    int32_t *rep = st == NB_OK ? nbi_alloc(ctx, hbytes, 8) : NULL; /* a leaf of the sig, or -1 */
    if (st == NB_OK && rep == NULL) {
        st = nbi_oom(ctx, fn, hbytes);
    }
    int32_t *head = NULL, *tail = NULL, *next = NULL;
    if (st == NB_OK) {
        head = rep + nbk;
        tail = head + nbk;
        next = tail + nbk;
        memset(rep, 0xff, (size_t)nbk * 3 * sizeof(int32_t));
        for (int64_t j = 0; j < n_args; j++) {
            if (!flags[j]) {
                continue;
            }
            const nbi_leafsig *sj = &e->sigs[first_arg + j];
            uint32_t b =
                (uint32_t)nbi_sig_hash((nb_dtype)sj->dtype, sj->rank, sj->shape) & (nbk - 1);
            while (rep[b] >= 0 && !nbi_sig_eq(&e->sigs[first_arg + rep[b]], (nb_dtype)sj->dtype,
                                              sj->rank, sj->shape)) {
                b = (b + 1) & (nbk - 1);
            }
            next[j] = -1;
            if (rep[b] < 0) {
                rep[b] = head[b] = tail[b] = (int32_t)j;
            } else {
                if (head[b] < 0) {
                    head[b] = (int32_t)j;
                } else {
                    next[tail[b]] = (int32_t)j;
                }
                tail[b] = (int32_t)j;
            }
        }
    }
    for (int64_t i = 0; i < n_out && st == NB_OK; i++) {
        const nb_var *o = nbi_exec_output(e->exec, (int32_t)i);
        dp->take[i] = -1;
        uint32_t b = (uint32_t)nbi_sig_hash(o->dtype, o->rank, o->shape) & (nbk - 1);
        while (rep[b] >= 0 &&
               !nbi_sig_eq(&e->sigs[first_arg + rep[b]], o->dtype, o->rank, o->shape)) {
            b = (b + 1) & (nbk - 1);
        }
        if (rep[b] >= 0 && head[b] >= 0) {
            int32_t jj = head[b];
            head[b] = next[jj];
            used[jj] = true;
            dp->take[i] = (int32_t)(first_arg + jj);
            dp->donated[i] = any = true;
        }
    }
    if (rep != NULL) {
        nbi_free(ctx, rep, hbytes);
    }
    if (st == NB_OK && any) {
        /* An output subtree whose leaves went, in order, into the leaves of an args subtree
         * of the same definition is that subtree. Nodes whose first leaf is leaf a run in
         * pre-order up to a's own node. */
        nbi_treedef_extents(ad, a_size, a_first, a_nleaf);
        nbi_treedef_extents(od, o_size, o_first, o_nleaf);
        for (int64_t m = 0; m < ad->n_nodes; m++) {
            if (ad->nodes[m].kind == NB_TREE_KIND_ARRAY) {
                leaf_node[a_first[m]] = (int32_t)m;
            }
        }
        bool reused = false;
        for (int64_t q = 0; q < od->n_nodes; q++) {
            dp->reuse[q] = -1;
        }
        for (int64_t q = 0; q < od->n_nodes;) {
            int32_t nl = o_nleaf[q], ol = o_first[q], found = -1;
            bool ok = nl > 0 && dp->take[ol] >= first_arg;
            for (int32_t t = 1; ok && t < nl; t++) {
                ok = dp->take[ol + t] == dp->take[ol] + t;
            }
            int32_t a0 = ok ? dp->take[ol] - (int32_t)first_arg : 0;
            for (int32_t m = ok ? leaf_node[a0] : -1; m >= 0 && a_first[m] == a0 && found < 0;
                 m--) {
                if (a_size[m] == o_size[q] && a_nleaf[m] == nl &&
                    nbi_treedef_sub_equal(od, q, ad, m)) {
                    found = m;
                }
            }
            if (found >= 0) {
                dp->reuse[q] = found;
                memset(dp->covered + ol, 1, (size_t)nl);
                reused = true;
                q += o_size[q];
            } else {
                q++;
            }
        }
        if (!reused) {
            dp->reuse = NULL;
        }
    }
    if (st == NB_OK && !any) {
        dp->donated = NULL;
        dp->covered = NULL;
        dp->reuse = NULL;
    }
    nbi_free(ctx, tmp, tbytes);
    if (st != NB_OK) {
        nbi_dplan_free(ctx, dp);
        return st;
    }
    *out = dp;
    return NB_OK;
}

/* The plan of e under the live spec donate: a cached one whose spec treedef matches (the
 * same spec tree is known by its serial), or a new one. *temp: not cached, free it. */
static nb_status nbi_dplan_get(nbi_jit_state *s, nbi_entry *e, const nb_tree *args,
                               const nb_tree *donate, int64_t first_arg, nbi_dplan **out,
                               bool *temp) {
    *temp = false;
    bool mine = donate->hdr.ctx == s->ctx; /* serials and treedefs are per context */
    for (nbi_dplan *dp = e->plans; mine && dp != NULL; dp = dp->next) {
        if (dp->donate_serial == donate->serial || (dp->donate_hash == nbi_tree_def_hash(donate) &&
                                                    nbi_tree_def_match(donate, dp->donate_def))) {
            dp->donate_serial = donate->serial;
            *out = dp;
            return NB_OK;
        }
    }
    nb_status st = nbi_dplan_make(s, e, args, donate, first_arg, out);
    if (st == NB_OK && mine) {
        (*out)->next = e->plans;
        e->plans = *out;
    } else if (st == NB_OK) {
        *temp = true;
    }
    return st;
}

/* A buffer donated at two leaves (the same array, or an array and its reshaped view, at two
 * argument paths: tied weights) can take one output only: the plan, made from treedefs,
 * would write two outputs into it and return both as one array. For such a call *out is a
 * plan of its own (the caller frees it) in which only the first of those leaves is donated
 * and no args subtree is returned as is; otherwise *out is NULL. No allocation when
 * nothing is donated twice. */
static nb_status nbi_dplan_unalias(nbi_jit_state *s, const nbi_entry *e, const nbi_dplan *dp,
                                   const nb_tree *const *leaves, nbi_dplan **out) {
    *out = NULL;
    if (dp == NULL || dp->donated == NULL) {
        return NB_OK;
    }
    int64_t n_out = e->n_out;
    uint64_t mark = ++s->donate_mark;
    bool twice = false;
    for (int64_t i = 0; i < n_out && !twice; i++) {
        if (dp->take[i] >= 0) {
            nbi_buffer *b = leaves[dp->take[i]]->u.array->buf;
            twice = b->donate_mark == mark;
            b->donate_mark = mark;
        }
    }
    if (!twice) {
        return NB_OK;
    }
    nbi_dplan *np = nbi_alloc(s->ctx, sizeof *np, 8);
    size_t bytes = (size_t)n_out * (sizeof(int32_t) + 1) + 1;
    void *mem = np != NULL ? nbi_alloc(s->ctx, bytes, 8) : NULL;
    if (mem == NULL) {
        if (np != NULL) {
            nbi_free(s->ctx, np, sizeof *np);
        }
        return nbi_oom(s->ctx, "nb_fn_call_ex", bytes);
    }
    memset(np, 0, sizeof *np);
    np->mem = mem;
    np->mem_bytes = bytes;
    np->take = mem;
    np->donated = (bool *)(np->take + n_out);
    mark = ++s->donate_mark;
    bool any = false;
    for (int64_t i = 0; i < n_out; i++) {
        np->take[i] = -1;
        np->donated[i] = false;
        if (dp->take[i] >= 0) {
            nbi_buffer *b = leaves[dp->take[i]]->u.array->buf;
            if (b->donate_mark != mark) {
                b->donate_mark = mark;
                np->take[i] = dp->take[i];
                np->donated[i] = any = true;
            }
        }
    }
    if (!any) {
        np->donated = NULL;
    }
    *out = np;
    return NB_OK;
}

/* Run e on the gathered leaves (self's then args') under plan dp (NULL: nothing donated)
 * and build the output tree: new arrays for the outputs not donated, args' own arrays (and
 * subtrees, nodes: args' nodes in pre-order) for the others. */
static nb_status nbi_run_entry(nbi_jit_state *s, const nbi_entry *e, const nb_tree *const *leaves,
                               int64_t n_leaves, const nbi_dplan *dp, nb_tree *const *nodes,
                               nb_tree **out) {
    nb_ctx *ctx = s->ctx;
    static const char fn[] = "nb_fn_call";
    int32_t n_out = e->n_out;
    /* in[n_leaves], out[n_out] buffer pointers, out arrays [n_out], out leaves [n_out] */
    size_t bytes = (size_t)(n_leaves + 3 * (int64_t)n_out + 1) * sizeof(void *);
    void **buf = s->scratch;
    bool own = s->scratch_busy; /* a call made while another runs: a buffer of its own */
    if (!own && bytes > s->scratch_bytes) {
        if (s->scratch != NULL) {
            nbi_free(ctx, s->scratch, s->scratch_bytes);
        }
        s->scratch_bytes = bytes * 2;
        s->scratch = nbi_alloc(ctx, s->scratch_bytes, 8);
        if (s->scratch == NULL) {
            s->scratch_bytes = 0;
            return nbi_oom(ctx, fn, bytes * 2);
        }
        buf = s->scratch;
    } else if (own) {
        buf = nbi_alloc(ctx, bytes, 8);
        if (buf == NULL) {
            return nbi_oom(ctx, fn, bytes);
        }
    }
    s->scratch_busy = true;
    const void **in_ptr = (const void **)buf;
    void **out_ptr = buf + n_leaves;
    nb_array **outs = (nb_array **)(out_ptr + n_out);
    nb_tree **out_leaves = (nb_tree **)(outs + n_out);
    for (int64_t i = 0; i < n_leaves; i++) {
        in_ptr[i] = leaves[i]->u.array->data;
    }
    nb_status st = NB_OK;
    int32_t made = 0; /* outputs 0..made-1 have their array */
    for (int32_t i = 0; i < n_out && st == NB_OK; i++) {
        int32_t j = dp != NULL ? dp->take[i] : -1;
        out_leaves[i] = NULL;
        if (j >= 0) {
            outs[i] = leaves[j]->u.array; /* borrowed: args hold it */
        } else {
            const nb_var *o = nbi_exec_output(e->exec, i);
            st = nbi_array_new(ctx, fn, o->dtype, o->rank, o->shape, &outs[i]);
        }
        if (st == NB_OK) {
            out_ptr[i] = outs[i]->data;
            made++;
        }
    }
    if (st == NB_OK) {
        nbi_check_clear();
        nbi_exec_run_raw(e->exec, in_ptr, out_ptr, dp != NULL ? dp->donated : NULL);
        st = nbi_check_take(ctx); /* a failed run-time check: no outputs */
    }
    for (int32_t i = 0; i < made && st == NB_OK; i++) {
        if (dp == NULL || dp->covered == NULL || !dp->covered[i]) {
            st = nb_tree_array(outs[i], &out_leaves[i]);
        }
    }
    if (st == NB_OK) {
        st = nbi_tree_unflatten_reuse(e->out_def, out_leaves, dp != NULL ? dp->reuse : NULL, nodes,
                                      out);
    }
    for (int32_t i = 0; i < made; i++) {
        nb_tree_destroy(out_leaves[i]);
        if (dp == NULL || dp->take[i] < 0) {
            nb_array_destroy(outs[i]);
        }
    }
    if (own) {
        nbi_free(ctx, buf, bytes);
    } else {
        s->scratch_busy = false;
    }
    return st;
}

/* nb_fn_call_ex, with fn the public function that was called (for messages). */
static nb_status nbi_fn_call_body(const char *fn, nb_fn *f, const nb_tree *args,
                                  const nb_call_opts *opts, nb_tree **out);

/* debug_retrace: trace f again on args (quietly: no accounting) and compare its IR with the
 * text e was compiled from. */
static nb_status nbi_retrace_check(const char *fn, const nb_fn *f, const nb_tree *args,
                                   const nbi_entry *e) {
    nb_ctx *ctx = f->hdr.ctx;
    nb_trace tr;
    nb_status st = nbi_trace_init(&tr, ctx, f->name);
    tr.quiet = true;
    if (st == NB_OK) {
        st = nbi_trace_graph(&tr, f, args, NULL);
    }
    char *now = NULL;
    size_t bytes = 0;
    if (st == NB_OK) {
        st = nbi_graph_text(ctx, &tr.g, f->name, &now, &bytes);
    }
    nbi_trace_release(&tr);
    if (st != NB_OK || strcmp(now, e->ir_text) == 0) {
        if (now != NULL) {
            nbi_free(ctx, now, bytes);
        }
        return st;
    }
    /* the first differing line, both ways */
    const char *a = e->ir_text, *b = now;
    int line = 1;
    while (*a == *b && *a != '\0') {
        line += *a == '\n';
        a++;
        b++;
    }
    while (a > e->ir_text && a[-1] != '\n') {
        a--;
        b--;
    }
    int la = (int)strcspn(a, "\n"), lb = (int)strcspn(b, "\n");
    st = nbi_err(ctx, NB_ERR_RUNTIME,
                 "%s: debug_retrace: '%s' traced again gives another IR than the one compiled, "
                 "at line %d: was '%.*s', now '%.*s' -- the body reads something besides its "
                 "arguments and bound data (a C global, a static variable) that changed; pass "
                 "it as a static leaf (a new value retraces) or as an array",
                 fn, f->name, line, la > 160 ? 160 : la, a, lb > 160 ? 160 : lb, b);
    nbi_free(ctx, now, bytes);
    return st;
}

/* A call from outside a trace: its checks (NBI_DEBUG_*) are what everything compiled for it
 * gets, nested loop bodies and calls included; a call made while another runs has its own. */
static nb_status nbi_fn_call(const char *fn, nb_fn *f, const nb_tree *args,
                             const nb_call_opts *opts, nb_tree **out) {
    nb_ctx *held = nbi_fn_live(f) ? f->hdr.ctx : NULL; /* f may die during the call */
    if (held != NULL) {
        nb_status g = nbi_ctx_enter(held, fn);
        if (g != NB_OK) {
            if (out != NULL) {
                *out = NULL;
            }
            return g;
        }
    }
    uint8_t saved = nbi_debug_mode, saved_native = nbi_native_mode;
    nbi_debug_mode = nbi_fn_live(f) ? nbi_debug_of(f) : 0;
    nbi_native_mode = nbi_fn_live(f) ? nbi_native_of(f) : NB_NATIVE_AUTO;
    bool saved_interp =
        nbi_native_set_interp_only(nbi_native_resolve(nbi_native_mode) == NB_NATIVE_OFF);
    nb_status st = nbi_fn_call_body(fn, f, args, opts, out);
    nbi_debug_mode = saved;
    nbi_native_mode = saved_native;
    nbi_native_set_interp_only(saved_interp);
    if (held != NULL) {
        nbi_ctx_leave(held);
    }
    return st;
}

static nb_status nbi_fn_call_body(const char *fn, nb_fn *f, const nb_tree *args,
                                  const nb_call_opts *opts, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status cst = nbi_check_handle_in(nbi_handle_ctx(args), f, NBI_MAGIC_FN, fn, "f");
    if (cst != NB_OK) {
        return cst;
    }
    nb_ctx *ctx = f->hdr.ctx;
    if (out == NULL) {
        return nbi_fn_null_out(ctx, fn, "an nb_tree * to receive the outputs");
    }
    if (args == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: args is a NULL tree (pass the arguments as a tree; an empty tuple "
                       "for no arguments)",
                       fn);
    }
    cst = nbi_check_handle(args, NBI_MAGIC_TREE, fn, "args");
    if (cst != NB_OK) {
        return cst;
    }
    if (args->hdr.ctx != ctx) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: args were made in another context", fn);
    }
    nbi_jit_state *s = nbi_jit_get(ctx, fn);
    if (s == NULL) {
        return NB_ERR_OOM;
    }
    nbi_ident *id = nbi_ident_of(s, f, true, fn);
    if (id == NULL) {
        return NB_ERR_OOM;
    }
    id->stats.n_calls++;
    const nb_fn *p = nbi_fn_plain(f);
    int64_t n = 0;
    nb_status st = nbi_gather(s, p->self, args, &n);
    if (st != NB_OK) {
        return st;
    }
    for (int64_t i = 0; i < n; i++) {
        if (s->leafbuf[i]->kind == NB_TREE_KIND_VAR) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "%s: '%s' was given a traced var (leaf %lld) outside any trace; vars "
                           "live only while their trace runs (inside a body use nb_apply)",
                           fn, f->name, (long long)i);
        }
    }
    int64_t first_arg = p->self ? p->self->n_leaves : 0;
    nbi_entry *e = nbi_entry_hit(id, args, s->leafbuf, n, nbi_debug_mode);
    if (e != NULL && e->ir_text != NULL) {
        st = nbi_retrace_check(fn, f, args, e);
        if (st == NB_OK) {
            st = nbi_gather(s, p->self, args, &n); /* tracing may have used the buffer */
        }
        if (st != NB_OK) {
            return st;
        }
    }
    if (e != NULL) {
        id->stats.n_hits++;
    } else {
        /* Tracing may call back into the cache (nested calls): work on a private copy. */
        size_t bytes = (size_t)(n + 1) * sizeof(const nb_tree *);
        const nb_tree **mine = nbi_alloc(ctx, bytes, 8);
        if (mine == NULL) {
            return nbi_oom(ctx, fn, bytes);
        }
        if (n > 0) {
            memcpy(mine, s->leafbuf, (size_t)n * sizeof(const nb_tree *));
        }
        st = nbi_compile_entry(s, id, f, args, mine, n, nbi_key_hash(args, mine, n), 0, &e);
        nbi_free(ctx, mine, bytes);
        if (st != NB_OK) {
            return st;
        }
        st = nbi_gather(s, p->self, args, &n);
        if (st != NB_OK) {
            return st;
        }
    }
    nbi_dplan *dp = NULL;
    bool temp = false;
    if (opts != NULL && opts->donate != NULL) {
        nb_status dst = nbi_check_handle_in(ctx, opts->donate, NBI_MAGIC_TREE, fn, "opts->donate");
        if (dst != NB_OK) {
            return dst;
        }
        st = nbi_dplan_get(s, e, args, opts->donate, first_arg, &dp, &temp);
    }
    nbi_dplan *unaliased = NULL;
    if (st == NB_OK) {
        st = nbi_dplan_unalias(s, e, dp, s->leafbuf, &unaliased);
    }
    if (st == NB_OK) {
        id->stats.workspace_bytes = nbi_exec_workspace_bytes(e->exec);
        st = nbi_native_attach(e->exec, nbi_native_mode);
    }
    if (st == NB_OK) {
        st =
            nbi_run_entry(s, e, s->leafbuf, n, unaliased != NULL ? unaliased : dp, s->nodebuf, out);
        id->stats.tier = nbi_exec_native(e->exec) ? 1 : 0;
        id->stats.n_native += id->stats.tier;
    }
    if (unaliased != NULL) {
        nbi_dplan_free(ctx, unaliased);
    }
    if (temp) {
        nbi_dplan_free(ctx, dp);
    }
    return st;
}

nb_status nb_fn_call_ex(nb_fn *f, const nb_tree *args, const nb_call_opts *opts, nb_tree **out) {
    return nbi_fn_call("nb_fn_call_ex", f, args, opts, out);
}

nb_status nb_fn_call(nb_fn *f, const nb_tree *args, nb_tree **out) {
    return nbi_fn_call("nb_fn_call", f, args, NULL, out);
}

nb_status nb_eval(nb_ctx *ctx, nb_fn_body body, const nb_tree *self, const nb_tree *args,
                  nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL) {
        return nbi_err_null_ctx(nbi_handle_ctx(args) != NULL ? (const void *)args : self,
                                "nb_eval");
    }
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_eval: out is NULL (pass the address of an nb_tree * for the outputs)");
    }
    /* the misuses nb_fn_create and nb_fn_call would find, reported as nb_eval's */
    if (body == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_eval: body is NULL (pass the C function that traces the ops)");
    }
    if (self != NULL) {
        nb_status sst = nbi_check_handle_in(ctx, self, NBI_MAGIC_TREE, "nb_eval", "self");
        if (sst != NB_OK) {
            return sst;
        }
    }
    if (args == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_eval: args is a NULL tree (pass the arguments as a tree; an empty "
                       "tuple for no arguments)");
    }
    nb_status st = nbi_check_handle(args, NBI_MAGIC_TREE, "nb_eval", "args");
    if (st != NB_OK) {
        return st;
    }
    nb_fn *f = NULL;
    st = nb_fn_create(ctx, "eval", body, self, &f);
    if (st == NB_OK) {
        st = nbi_fn_call("nb_eval", f, args, NULL, out);
    }
    nb_fn_destroy(f);
    return st;
}

/* ---- callees of control flow ----------------------------------------------------- */

nb_status nbi_callee(nb_trace *tr, nb_fn *f, const nb_tree *args, const char *who, bool loop_body,
                     nbi_callee_info *out) {
    memset(out, 0, sizeof *out);
    nb_ctx *ctx = tr->ctx;
    nbi_jit_state *s = nbi_jit_get(ctx, who);
    nbi_ident *id = s ? nbi_ident_find(s, f, true, who) : NULL;
    if (id == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory in the compile cache", who);
    }
    const nb_fn *p = nbi_fn_plain(f);
    int64_t n_self = p->self ? p->self->n_leaves : 0;
    int64_t n = n_self + args->n_leaves;
    const nb_tree **leaves = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_tree *));
    nb_var **ops = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_var *));
    if (leaves == NULL || ops == NULL) {
        return nbi_trace_err(tr, NB_ERR_OOM, "%s: out of memory", who);
    }
    int64_t k = 0;
    if (p->self != NULL) {
        nbi_collect(p->self, leaves, &k);
    }
    nbi_collect(args, leaves, &k);
    for (int64_t i = 0; i < n; i++) {
        if (leaves[i]->kind == NB_TREE_KIND_VAR) {
            ops[i] = leaves[i]->u.var.var;
            if (ops[i]->tr != tr) {
                return nbi_trace_err(tr, NB_ERR_INVALID,
                                     "%s: operand %lld of '%s' is a var of another trace (a "
                                     "function's bound data may hold vars of the trace it is "
                                     "called in, not of others)",
                                     who, (long long)i, f->name);
            }
        } else {
            ops[i] = nb_constant(tr, leaves[i]->u.array);
        }
    }
    if (tr->status != NB_OK) {
        return tr->status;
    }
    uint64_t h = nbi_key_hash(args, leaves, n);
    nbi_entry *e = nbi_entry_find(id, h, args, leaves, n, nbi_debug_mode);
    if (e != NULL) {
        id->stats.n_hits++;
    } else {
        /* a loop's body: its bound data is the same in every step */
        nb_status st = nbi_compile_entry(s, id, f, args, leaves, n, h, loop_body ? n_self : 0, &e);
        if (st != NB_OK) {
            char msg[NBI_ERRMSG_CAP];
            snprintf(msg, sizeof msg, "%s", nb_ctx_errmsg(ctx));
            return nbi_trace_err(tr, st, "%s", msg);
        }
    }
    out->exec = e->exec;
    out->ops = ops;
    out->n_ops = n;
    out->n_self = n_self;
    out->out_def = e->out_def;
    return NB_OK;
}

/* ---- calls inside a trace ----------------------------------------------------------- */

/* A call to f's own cached executable: operands are its self and args leaves (vars of tr,
 * or concrete arrays that become constants). */
static const nb_tree *nbi_apply_call(nb_trace *tr, const nb_fn *f, const nb_tree *args) {
    nb_ctx *ctx = tr->ctx;
    nbi_jit_state *s = nbi_jit_get(ctx, "nb_apply");
    nbi_ident *id = s ? nbi_ident_of(s, f, true, "nb_apply") : NULL;
    if (id == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_apply: out of memory in the compile cache");
        return NULL;
    }
    id->stats.n_calls++;
    const nb_fn *p = nbi_fn_plain(f);
    int64_t n = (p->self ? p->self->n_leaves : 0) + args->n_leaves;
    const nb_tree **leaves = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_tree *));
    nb_var **ops = nbi_arena_alloc(&tr->arena, (size_t)(n + 1) * sizeof(nb_var *));
    if (leaves == NULL || ops == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_apply: out of memory");
        return NULL;
    }
    int64_t k = 0;
    if (p->self != NULL) {
        nbi_collect(p->self, leaves, &k);
    }
    nbi_collect(args, leaves, &k);
    for (int64_t i = 0; i < n; i++) {
        if (leaves[i]->kind == NB_TREE_KIND_VAR) {
            ops[i] = leaves[i]->u.var.var;
            if (ops[i]->tr != tr) {
                nbi_trace_err(tr, NB_ERR_INVALID,
                              "nb_apply: operand %lld of '%s' is a var of another trace",
                              (long long)i, f->name);
                return NULL;
            }
        } else {
            ops[i] = nb_constant(tr, leaves[i]->u.array);
        }
    }
    if (tr->status != NB_OK) {
        return NULL;
    }
    uint64_t h = nbi_key_hash(args, leaves, n);
    nbi_entry *e = nbi_entry_find(id, h, args, leaves, n, nbi_debug_mode);
    if (e != NULL) {
        id->stats.n_hits++;
    } else {
        nb_status st = nbi_compile_entry(s, id, f, args, leaves, n, h, 0, &e);
        if (st != NB_OK) {
            char msg[NBI_ERRMSG_CAP];
            snprintf(msg, sizeof msg, "%s", nb_ctx_errmsg(ctx));
            nbi_trace_err(tr, st, "%s", msg);
            return NULL;
        }
    }
    nbi_attrs at;
    memset(&at, 0, sizeof at);
    at.callee = e->exec;
    nb_var *call = nbi_emit(tr, NBI_OP_CALL, (int)n, ops, &at);
    nb_tree **outl = nbi_arena_alloc(&tr->arena, (size_t)(e->n_out + 1) * sizeof(nb_tree *));
    if (outl == NULL) {
        nbi_trace_err(tr, NB_ERR_OOM, "nb_apply: out of memory");
        return NULL;
    }
    size_t off = 0;
    for (int32_t i = 0; i < e->n_out; i++) {
        const nb_var *o = nbi_exec_output(e->exec, i);
        memset(&at, 0, sizeof at);
        at.ivalue = i;
        at.a[0] = (int64_t)off;
        off += ((size_t)o->size * nb_dtype_size(o->dtype) + 63) / 64 * 64;
        outl[i] = nb_leaf(nbi_emit(tr, NBI_OP_CALL_OUTPUT, 1, &call, &at));
        if (outl[i] == NULL) {
            return NULL;
        }
    }
    if (tr->status != NB_OK) {
        return NULL;
    }
    nb_tree *list = NULL, *res = NULL;
    nb_status st = nb_tree_list(ctx, e->n_out, outl, &list);
    if (st == NB_OK) {
        st = nb_tree_unflatten(e->out_def, list, &res);
    }
    nb_tree_destroy(list);
    if (st != NB_OK || nbi_trace_own(tr, res) != NB_OK) {
        nbi_trace_err(tr, st != NB_OK ? st : NB_ERR_OOM, "nb_apply: out of memory");
        return NULL;
    }
    return res;
}

nb_status nbi_inline_call(nb_trace *tr, const nb_fn *f, const nb_tree *args, nb_tree **out) {
    const nb_fn *p = nbi_fn_plain(f);
    nb_tree *self_v = NULL, *args_v = NULL;
    nb_status st = NB_OK;
    *out = NULL;
    if (p->self != NULL) {
        st = nbi_vars_tree(tr, p->self, false, NULL, "self", &self_v);
    }
    if (st == NB_OK) {
        st = nbi_vars_tree(tr, args, false, NULL, "args", &args_v);
    }
    if (st == NB_OK) {
        st = nbi_trace_fn(tr, f, self_v, args_v, out);
    }
    nb_tree_destroy(self_v);
    nb_tree_destroy(args_v);
    return st;
}

const nb_tree *nb_apply(nb_trace *tr, nb_fn *f, const nb_tree *args) {
    if (tr == NULL || tr->status != NB_OK) {
        return NULL;
    }
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(f, NBI_MAGIC_FN, "nb_apply", "f", why, sizeof why)) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s", why);
        return NULL;
    }
    if (nbi_handle_why(args, NBI_MAGIC_TREE, "nb_apply", "args", why, sizeof why)) {
        nbi_trace_err(tr, NB_ERR_MISUSE, "%s (calling '%s')", why, f->name);
        return NULL;
    }
    if (args->hdr.ctx != tr->ctx || f->hdr.ctx != tr->ctx) {
        nbi_trace_err(tr, NB_ERR_MISUSE,
                      "nb_apply: %s of '%s' %s from another context than the trace (make "
                      "functions and arguments in the trace's context)",
                      f->hdr.ctx != tr->ctx ? "the function" : "the args", f->name,
                      f->hdr.ctx != tr->ctx ? "is" : "are");
        return NULL;
    }
    /* Under a gradient transform every call is inlined, so that it is differentiated. */
    for (const nb_fn *g = f; tr->ad_depth == 0 && tr->vmap_depth == 0 && g->kind != NBI_FN_PLAIN;
         g = g->inner) {
        if (nbi_fn_is_transform(g->kind)) {
            break; /* the transform's own body is traced inline */
        }
        if (g->kind == NBI_FN_JIT && !g->inline_calls) {
            return nbi_apply_call(tr, g, args);
        }
    }
    nb_tree *res = NULL;
    nb_status st = nbi_inline_call(tr, f, args, &res);
    if (st != NB_OK) {
        if (tr->status == NB_OK) { /* a failure before the body ran (an allocation) */
            nbi_trace_err(tr, st, "nb_apply: calling '%s' failed: %s", f->name,
                          st == NB_ERR_OOM ? "out of memory" : nb_status_string(st));
        }
        return NULL;
    }
    if (nbi_trace_own(tr, res) != NB_OK) {
        return NULL;
    }
    return res;
}

nb_var *nb_apply1(nb_trace *tr, nb_fn *f, nb_var *x) {
    if (tr == NULL) {
        return NULL;
    }
    char why[NBI_ERRMSG_CAP];
    if (tr->status == NB_OK && nbi_handle_why(f, NBI_MAGIC_FN, "nb_apply1", "f", why, sizeof why)) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE, "%s", why);
    }
    if (x == NULL && tr->status == NB_OK) {
        return nbi_trace_errv(tr, NB_ERR_MISUSE, "nb_apply1: x is a NULL var (pass the argument)");
    }
    if (tr->status != NB_OK || x == NULL || (x->flags & NBI_NODE_POISON)) {
        return tr->poison;
    }
    nb_tree *leaf = nb_leaf(x), *args = NULL;
    if (leaf == NULL || nb_tree_tuple(tr->ctx, 1, &leaf, &args) != NB_OK ||
        nbi_trace_own(tr, args) != NB_OK) {
        return nbi_trace_errv(tr, NB_ERR_OOM, "nb_apply1: out of memory");
    }
    const nb_tree *res = nb_apply(tr, f, args);
    if (res == NULL) {
        return tr->poison;
    }
    if (res->kind != NB_TREE_KIND_VAR) {
        char what[128];
        nbi_sbuf ws = nbi_sbuf_make(what, sizeof what);
        nbi_sbuf_describe(&ws, res);
        return nbi_trace_errv(tr, NB_ERR_KIND,
                              "nb_apply1: '%s' returned %s, not a single array (use nb_apply)",
                              f->name, what);
    }
    return res->u.var.var;
}

/* ---- accounting and introspection --------------------------------------------------- */

nb_status nb_fn_stats_get(const nb_fn *f, nb_fn_stats *out) {
    if (out != NULL) {
        memset(out, 0, sizeof *out);
    }
    nb_status cst = nbi_check_handle(f, NBI_MAGIC_FN, "nb_fn_stats_get", "f");
    if (cst != NB_OK) {
        return cst;
    }
    if (out == NULL) {
        return nbi_err(f->hdr.ctx, NB_ERR_MISUSE,
                       "nb_fn_stats_get: out is NULL (pass the address of an nb_fn_stats to "
                       "fill)");
    }
    nbi_jit_state *s = *nbi_ctx_jit_slot(f->hdr.ctx);
    nbi_ident *id = s ? nbi_ident_of(s, f, false, "nb_fn_stats_get") : NULL;
    if (id != NULL) {
        *out = id->stats;
    }
    return NB_OK;
}

nb_status nb_fn_retrace_reason(const nb_fn *f, int64_t i, char *buf, size_t cap, size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    nb_status cst = nbi_check_handle(f, NBI_MAGIC_FN, "nb_fn_retrace_reason", "f");
    if (cst != NB_OK) {
        return cst;
    }
    if (buf == NULL && cap > 0) {
        return nbi_err(f->hdr.ctx, NB_ERR_MISUSE,
                       "nb_fn_retrace_reason: buf is NULL but cap is %zu (pass a buffer of cap "
                       "bytes, or cap 0 to measure)",
                       cap);
    }
    nbi_jit_state *s = *nbi_ctx_jit_slot(f->hdr.ctx);
    nbi_ident *id = s ? nbi_ident_of(s, f, false, "nb_fn_retrace_reason") : NULL;
    if (id == NULL || i < 0 || i >= id->stats.n_retraces) {
        return nbi_err(f->hdr.ctx, NB_ERR_INDEX,
                       "nb_fn_retrace_reason: retrace %lld of '%s' does not exist (it has %lld)",
                       (long long)i, f->name, id ? (long long)id->stats.n_retraces : 0LL);
    }
    nbi_sbuf sb = nbi_sbuf_make(buf, cap);
    nbi_sbuf_puts(&sb, id->reasons[i]);
    return nbi_sbuf_finish(&sb, needed);
}

nb_status nb_fn_format_ir(nb_fn *f, const nb_tree *args, int which, char *buf, size_t cap,
                          size_t *needed) {
    if (needed != NULL) {
        *needed = 0;
    }
    nb_status cst =
        nbi_check_handle_in(nbi_handle_ctx(args), f, NBI_MAGIC_FN, "nb_fn_format_ir", "f");
    if (cst != NB_OK) {
        return cst;
    }
    nb_ctx *ctx = f->hdr.ctx;
    if (buf == NULL && cap > 0) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_fn_format_ir: buf is NULL but cap is %zu (pass a buffer of cap "
                       "bytes, or cap 0 to measure)",
                       cap);
    }
    cst = nbi_check_handle_in(ctx, args, NBI_MAGIC_TREE, "nb_fn_format_ir", "args");
    if (cst != NB_OK) {
        return cst;
    }
    if (args->hdr.ctx != ctx) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "nb_fn_format_ir: args come from another context than f (make both in "
                       "one context)");
    }
    nb_trace tr;
    nb_status st = nbi_trace_init(&tr, ctx, f->name);
    tr.quiet = true;
    if (st == NB_OK) {
        st = nbi_trace_graph(&tr, f, args, NULL);
    }
    nbi_graph opt;
    const nbi_graph *show = &tr.g;
    if (st == NB_OK && (which == NB_IR_OPTIMIZED || which == NB_IR_NATIVE_C)) {
        st = nbi_optimize(ctx, &tr.g, 0, &tr.arena, &opt);
        show = &opt;
    } else if (st == NB_OK) {
        st = nbi_graph_verify(ctx, &tr.g, "trace");
    }
    if (st == NB_OK && which == NB_IR_NATIVE_C) {
        nbi_sbuf sb = nbi_sbuf_make(buf, cap);
        st = nbi_native_format(ctx, show, &sb);
        if (st == NB_OK) {
            st = nbi_sbuf_finish(&sb, needed);
        }
    } else if (st == NB_OK) {
        nbi_sbuf sb = nbi_sbuf_make(buf, cap);
        nbi_graph_format(&sb, show, f->name);
        st = nbi_sbuf_finish(&sb, needed);
    }
    nbi_trace_release(&tr);
    return st;
}
