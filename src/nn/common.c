/*
 * common.c -- the nn layers' shared machinery (see nn_internal.h): building layer dicts,
 * argument checks, keys, and reading layers inside a trace with messages that name the
 * layer, the leaf and the fix; plus the utilities of nabla/nn.h (activation leaves,
 * parameter counts, inference mode, Sequential and the dispatching nb_nn_apply).
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- building ----------------------------------------------------------------------- */

void nbi_nn_dict_begin(nbi_nn_dict *d, nb_ctx *ctx, const char *kind) {
    memset(d, 0, sizeof *d);
    d->ctx = ctx;
    d->st = NB_OK;
    nb_tree *t = NULL;
    nb_status st = nb_tree_string(ctx, kind, &t);
    nbi_nn_put(d, "kind", st, t);
}

void nbi_nn_put(nbi_nn_dict *d, const char *key, nb_status st, nb_tree *item) {
    if (d->st == NB_OK && st != NB_OK) {
        d->st = st;
    }
    if (d->st != NB_OK || d->n >= NBI_NN_MAX_KEYS) {
        nb_tree_destroy(item);
        if (d->st == NB_OK) {
            d->st = nbi_err(d->ctx, NB_ERR_INTERNAL, "nn: too many keys in a layer dict");
        }
        return;
    }
    d->keys[d->n] = key;
    d->items[d->n] = item;
    d->n++;
}

void nbi_nn_put_array(nbi_nn_dict *d, const char *key, nb_status st, nb_array *a) {
    nb_tree *t = NULL;
    if (st == NB_OK) {
        st = nb_tree_array(a, &t);
    }
    nb_array_destroy(a);
    nbi_nn_put(d, key, st, t);
}

void nbi_nn_put_null(nbi_nn_dict *d, const char *key) {
    nb_tree *t = NULL;
    nb_status st = nb_tree_null(d->ctx, &t);
    nbi_nn_put(d, key, st, t);
}

void nbi_nn_put_int(nbi_nn_dict *d, const char *key, int64_t v) {
    nb_tree *t = NULL;
    nb_status st = nb_tree_int(d->ctx, v, &t);
    nbi_nn_put(d, key, st, t);
}

void nbi_nn_put_float(nbi_nn_dict *d, const char *key, double v) {
    nb_tree *t = NULL;
    nb_status st = nb_tree_float(d->ctx, v, &t);
    nbi_nn_put(d, key, st, t);
}

void nbi_nn_put_bool(nbi_nn_dict *d, const char *key, bool v) {
    nb_tree *t = NULL;
    nb_status st = nb_tree_bool(d->ctx, v, &t);
    nbi_nn_put(d, key, st, t);
}

void nbi_nn_put_ints(nbi_nn_dict *d, const char *key, int n, const int64_t *v) {
    nb_tree *items[NB_MAX_RANK] = {NULL};
    nb_tree *t = NULL;
    nb_status st = NB_OK;
    for (int i = 0; i < n && st == NB_OK; i++) {
        st = nb_tree_int(d->ctx, v[i], &items[i]);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(d->ctx, n, items, &t);
    }
    for (int i = 0; i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    nbi_nn_put(d, key, st, t);
}

void nbi_nn_put_affine(nbi_nn_dict *d, nb_dtype dtype, int rank, const int64_t *shape,
                       bool use_weight, bool use_bias) {
    nb_array *a = NULL;
    nb_status st;
    if (use_weight) {
        st = nb_array_ones(d->ctx, dtype, rank, shape, &a);
        nbi_nn_put_array(d, "weight", st, a);
    } else {
        nbi_nn_put_null(d, "weight");
    }
    a = NULL;
    if (use_bias) {
        st = nb_array_zeros(d->ctx, dtype, rank, shape, &a);
        nbi_nn_put_array(d, "bias", st, a);
    } else {
        nbi_nn_put_null(d, "bias");
    }
}

nb_status nbi_nn_dict_finish(nbi_nn_dict *d, nb_tree **out) {
    nb_status st = d->st;
    if (st == NB_OK) {
        st = nb_tree_dict(d->ctx, d->n, d->keys, d->items, out);
    }
    for (int i = 0; i < d->n; i++) {
        nb_tree_destroy(d->items[i]);
    }
    d->n = 0;
    return st;
}

nb_status nbi_nn_check_dtype(nb_ctx *ctx, const char *fn, nb_dtype dtype) {
    if (dtype != NB_DTYPE_F32 && dtype != NB_DTYPE_F64) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: dtype %s; layer parameters are NB_DTYPE_F32 or NB_DTYPE_F64", fn,
                       nb_dtype_name(dtype));
    }
    return NB_OK;
}

nb_status nbi_nn_check_size(nb_ctx *ctx, const char *fn, const char *what, int64_t v, int64_t min) {
    /* The cap keeps sums and products of two sizes far from overflow. */
    if (v < min) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: %s is %lld; it must be at least %lld", fn, what,
                       (long long)v, (long long)min);
    }
    if (v > NBI_NN_SIZE_MAX) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: %s is %lld; it must be at most 2^31", fn, what,
                       (long long)v);
    }
    return NB_OK;
}

nb_status nbi_nn_key_row(const nb_array *keys, int64_t i, nb_array **out) {
    const int32_t *w = nb_array_data(keys);
    return nb_array_from_data(nb_array_ctx(keys), NB_DTYPE_I32, 1, (const int64_t[]){2}, w + 2 * i,
                              out);
}

nb_status nbi_nn_uniform(const nb_array *key, nb_dtype dtype, int rank, const int64_t *shape,
                         double lim, nb_array **out) {
    return nb_random_uniform(key, dtype, rank, shape, -lim, lim, out);
}

nb_status nbi_nn_args(nb_ctx *ctx, const char *fn, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL) {
        return NB_ERR_MISUSE;
    }
    if (out == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: out is NULL (pass the address of an nb_tree * for the new layer)", fn);
    }
    return NB_OK;
}

nb_status nbi_nn_check_key(nb_ctx *ctx, const char *fn, const nb_array *key) {
    if (key == NULL) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: key is a NULL or destroyed array (make one with nb_random_key)", fn);
    }
    char why[NBI_ERRMSG_CAP];
    if (nbi_handle_why(key, NBI_MAGIC_ARRAY, fn, "key", why, sizeof why)) {
        nb_ctx *own = nbi_handle_ctx(key);
        return nbi_err(own != NULL ? own : ctx, NB_ERR_MISUSE, "%s (make one with nb_random_key)",
                       why);
    }
    if (key->hdr.ctx != ctx) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: key belongs to another context than ctx (each context's arrays and "
                       "trees stay in it) -- make the key with nb_random_key(ctx, ...) or copy it",
                       fn);
    }
    return NB_OK;
}

/* ---- messages ----------------------------------------------------------------------- */

const char *nbi_nn_sig(char *buf, size_t cap, const nb_var *v) {
    return nbi_var_sig(buf, cap, v);
}

const char *nbi_nn_shape_str(char *buf, size_t cap, int rank, const int64_t *shape) {
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_sbuf_putc(&s, '[');
    for (int i = 0; i < rank; i++) {
        nbi_sbuf_printf(&s, i ? ",%lld" : "%lld", (long long)shape[i]);
    }
    nbi_sbuf_putc(&s, ']');
    nbi_sbuf_finish(&s, NULL);
    return buf;
}

/* Find a var leaf under t whose path ends with its path relative to t ("weight",
 * "layers[0].weight") and cut that suffix off: the path of t itself. */
static bool nbi_nn_find_path(const nb_tree *t, const char *rel, int depth, char *out, size_t cap) {
    if (depth > 4) {
        return false;
    }
    nb_tree_kind k = nb_tree_kind_of(t);
    if (k == NB_TREE_KIND_VAR) {
        const nb_var *v = (const nb_var *)t->u.var.var;
        if (v == NULL || v->path == NULL) {
            return false;
        }
        size_t lp = strlen(v->path), lr = strlen(rel);
        if (lr == 0 || lp < lr || strcmp(v->path + lp - lr, rel) != 0) {
            return false;
        }
        size_t keep = lp - lr;
        if (rel[0] != '[' && keep > 0) {
            keep--; /* the '.' before a key */
        }
        if (keep + 1 > cap) {
            return false;
        }
        memcpy(out, v->path, keep);
        out[keep] = '\0';
        return true;
    }
    if (k != NB_TREE_KIND_DICT && k != NB_TREE_KIND_LIST && k != NB_TREE_KIND_TUPLE) {
        return false;
    }
    for (int64_t i = 0; i < nb_tree_len(t); i++) {
        char sub[NB_PATH_MAX];
        int n = k == NB_TREE_KIND_DICT
                    ? snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "." : "", nb_tree_key(t, i))
                    : snprintf(sub, sizeof sub, "%s[%lld]", rel, (long long)i);
        if (n < 0 || (size_t)n >= sizeof sub) {
            continue; /* a path this long cannot be a leaf's path suffix */
        }
        if (nbi_nn_find_path(nb_tree_child(t, i), sub, depth + 1, out, cap)) {
            return true;
        }
    }
    return false;
}

const char *nbi_nn_where(const nbi_nn_at *at, char *buf, size_t cap) {
    if (at->path[0] != '\0') {
        snprintf(buf, cap, "%s layer '%s'", at->kind, at->path);
    } else {
        snprintf(buf, cap, "the %s layer", at->kind);
    }
    return buf;
}

nb_var *nbi_nn_fail(const nbi_nn_at *at, nb_status st, const char *fmt, ...) {
    char msg[NBI_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nb_trace_fail(at->tr, st, "%s: %s", at->fn, msg);
    return at->tr->poison;
}

const char *nbi_nn_describe(const nb_tree *t, char *buf, size_t cap) {
    if (t == NULL) {
        snprintf(buf, cap, "missing");
        return buf;
    }
    nbi_sbuf s = nbi_sbuf_make(buf, cap);
    nbi_sbuf_describe(&s, t);
    nbi_sbuf_finish(&s, NULL);
    return buf;
}

const char *nbi_nn_kind_of(const nb_tree *layer) {
    const char *kind = NULL;
    if (!nbi_obj_live(layer, NBI_MAGIC_TREE) || nb_tree_kind_of(layer) != NB_TREE_KIND_DICT ||
        nb_tree_get_string(nb_tree_get(layer, "kind"), &kind) != NB_OK) {
        return NULL;
    }
    return kind;
}

bool nbi_nn_begin(nbi_nn_at *at, nb_trace *tr, const char *fn, const char *kind,
                  const nb_tree *layer) {
    memset(at, 0, sizeof *at);
    at->tr = tr;
    at->fn = fn;
    at->kind = kind;
    at->layer = layer;
    if (tr == NULL || nb_trace_status(tr) != NB_OK) {
        return false;
    }
    if (!nbi_obj_live(layer, NBI_MAGIC_TREE)) {
        nbi_nn_fail(at, NB_ERR_MISUSE,
                    "the layer is a NULL or destroyed tree (look it up with nb_tree_lookup "
                    "and check the path; make it with nb_nn_%s_init)",
                    kind);
        return false;
    }
    nbi_nn_find_path(layer, "", 0, at->path, sizeof at->path);
    char w[NB_PATH_MAX + 64];
    nbi_nn_where(at, w, sizeof w);
    if (nb_tree_kind_of(layer) != NB_TREE_KIND_DICT) {
        char d[128];
        nbi_nn_fail(at, NB_ERR_KIND, "%s is %s, not a layer dict (make it with nb_nn_%s_init)", w,
                    nbi_nn_describe(layer, d, sizeof d), kind);
        return false;
    }
    const nb_tree *k = nb_tree_get(layer, "kind");
    const char *have = NULL;
    if (k == NULL || nb_tree_get_string(k, &have) != NB_OK) {
        char d[128];
        nbi_nn_fail(at, NB_ERR_STRUCTURE,
                    "%s has no \"kind\" string leaf (%s); layer trees are made by "
                    "nb_nn_%s_init",
                    w, nbi_nn_describe(k, d, sizeof d), kind);
        return false;
    }
    if (strcmp(have, kind) != 0) {
        char lw[NB_PATH_MAX + 16];
        if (at->path[0] != '\0') {
            snprintf(lw, sizeof lw, "layer '%s'", at->path);
        } else {
            snprintf(lw, sizeof lw, "the layer");
        }
        nbi_nn_fail(at, NB_ERR_KIND,
                    "%s is a '%s' layer, not '%s' (apply it with nb_nn_%s, or with nb_nn_apply, "
                    "which dispatches on the kind)",
                    lw, have, kind, have);
        return false;
    }
    return true;
}

/* The leaf under key, or NULL after a sticky error naming it. */
static const nb_tree *nbi_nn_leaf(const nbi_nn_at *at, const char *key) {
    const nb_tree *t = nb_tree_get(at->layer, key);
    if (t == NULL) {
        char w[NB_PATH_MAX + 64];
        nbi_nn_fail(at, NB_ERR_STRUCTURE,
                    "%s has no '%s' leaf; layer trees are made by nb_nn_%s_init (keep every key "
                    "when you rebuild one)",
                    nbi_nn_where(at, w, sizeof w), key, at->kind);
    }
    return t;
}

static bool nbi_nn_static_fail(const nbi_nn_at *at, const char *key, const nb_tree *t,
                               const char *want) {
    char w[NB_PATH_MAX + 64], d[128];
    nbi_nn_fail(at, NB_ERR_KIND, "%s: '%s' is %s, not %s (layer trees are made by nb_nn_%s_init)",
                nbi_nn_where(at, w, sizeof w), key, nbi_nn_describe(t, d, sizeof d), want,
                at->kind);
    return false;
}

bool nbi_nn_int(const nbi_nn_at *at, const char *key, int64_t *v) {
    const nb_tree *t = nbi_nn_leaf(at, key);
    if (t == NULL) {
        return false;
    }
    if (nb_tree_kind_of(t) != NB_TREE_KIND_INT) {
        return nbi_nn_static_fail(at, key, t, "a static int");
    }
    nb_tree_get_int(t, v);
    return true;
}

bool nbi_nn_float(const nbi_nn_at *at, const char *key, double *v) {
    const nb_tree *t = nbi_nn_leaf(at, key);
    if (t == NULL) {
        return false;
    }
    if (nb_tree_kind_of(t) != NB_TREE_KIND_FLOAT) {
        return nbi_nn_static_fail(at, key, t, "a static float");
    }
    nb_tree_get_float(t, v);
    return true;
}

bool nbi_nn_bool(const nbi_nn_at *at, const char *key, bool *v) {
    const nb_tree *t = nbi_nn_leaf(at, key);
    if (t == NULL) {
        return false;
    }
    if (nb_tree_kind_of(t) != NB_TREE_KIND_BOOL) {
        return nbi_nn_static_fail(at, key, t, "a static bool");
    }
    nb_tree_get_bool(t, v);
    return true;
}

bool nbi_nn_ints(const nbi_nn_at *at, const char *key, int n, int64_t *v) {
    const nb_tree *t = nbi_nn_leaf(at, key);
    if (t == NULL) {
        return false;
    }
    bool ok = nb_tree_kind_of(t) == NB_TREE_KIND_TUPLE && nb_tree_len(t) == n;
    for (int i = 0; ok && i < n; i++) {
        ok = nb_tree_get_int(nb_tree_child(t, i), &v[i]) == NB_OK;
    }
    if (!ok) {
        char want[48];
        snprintf(want, sizeof want, "a tuple of %d static ints", n);
        return nbi_nn_static_fail(at, key, t, want);
    }
    return true;
}

bool nbi_nn_fn(const nbi_nn_at *at, const char *key, nb_nn_activation *fn) {
    const nb_tree *t = nbi_nn_leaf(at, key);
    if (t == NULL) {
        return false;
    }
    nb_fnptr p = NULL;
    const char *name = NULL;
    if (nb_tree_kind_of(t) != NB_TREE_KIND_FNREF || nb_tree_get_fnref(t, &p, &name) != NB_OK) {
        return nbi_nn_static_fail(at, key, t,
                                  "an activation (a function-reference leaf, see "
                                  "nb_nn_activation_leaf)");
    }
    *fn = (nb_nn_activation)p;
    return true;
}

bool nbi_nn_param(const nbi_nn_at *at, const char *key, bool allow_null, int rank,
                  const int64_t *shape, const nb_var *x, nb_var **v) {
    *v = NULL;
    const nb_tree *t = nbi_nn_leaf(at, key);
    if (t == NULL) {
        return false;
    }
    char w[NB_PATH_MAX + 64], d[128];
    nb_tree_kind k = nb_tree_kind_of(t);
    if (k == NB_TREE_KIND_NULL && allow_null) {
        return true;
    }
    nb_var *p = NULL;
    if (k == NB_TREE_KIND_VAR) {
        p = nb_var_of(at->tr, t);
    } else if (k == NB_TREE_KIND_ARRAY) {
        p = nb_constant(at->tr, nb_tree_get_array(t));
    } else {
        nbi_nn_fail(at, NB_ERR_KIND,
                    "%s: '%s' is %s, not an array%s (layer trees are made by "
                    "nb_nn_%s_init)",
                    nbi_nn_where(at, w, sizeof w), key, nbi_nn_describe(t, d, sizeof d),
                    allow_null ? " or null" : "", at->kind);
        return false;
    }
    if (nb_var_is_poison(p)) {
        return false;
    }
    const char *path = p->path != NULL ? p->path : key;
    if (rank >= 0) {
        bool ok = nb_var_rank(p) == rank;
        for (int i = 0; ok && i < rank; i++) {
            ok = shape[i] < 0 || nb_var_dim(p, i) == shape[i];
        }
        if (!ok) {
            char got[96], want[96];
            nbi_nn_sig(got, sizeof got, p);
            nbi_sbuf s = nbi_sbuf_make(want, sizeof want);
            nbi_sbuf_putc(&s, '[');
            for (int i = 0; i < rank; i++) {
                if (shape[i] < 0) {
                    nbi_sbuf_printf(&s, i ? ",*" : "*");
                } else {
                    nbi_sbuf_printf(&s, i ? ",%lld" : "%lld", (long long)shape[i]);
                }
            }
            nbi_sbuf_putc(&s, ']');
            nbi_sbuf_finish(&s, NULL);
            nbi_nn_fail(at, NB_ERR_SHAPE,
                        "%s: '%s' is %s; the layer's static sizes say it is %s (the parameter "
                        "was replaced by an array of another shape, or the sizes edited)",
                        nbi_nn_where(at, w, sizeof w), path, got, want);
            return false;
        }
    }
    if (x != NULL && !nb_var_is_poison(x) && nb_var_dtype(p) != nb_var_dtype(x)) {
        char got[96], xs[96];
        nbi_nn_fail(at, NB_ERR_DTYPE,
                    "%s: '%s' is %s but the input is %s; parameters and input must share a "
                    "dtype (init the layer with the input's dtype, or nb_cast the input)",
                    nbi_nn_where(at, w, sizeof w), path, nbi_nn_sig(got, sizeof got, p),
                    nbi_nn_sig(xs, sizeof xs, x));
        return false;
    }
    *v = p;
    return true;
}

bool nbi_nn_check_input(const nbi_nn_at *at, nb_var *x, int min_rank, int max_rank,
                        const char *expect) {
    char w[NB_PATH_MAX + 64];
    if (x == NULL) {
        nbi_nn_fail(at, NB_ERR_MISUSE, "the input of %s is a NULL var",
                    nbi_nn_where(at, w, sizeof w));
        return false;
    }
    if (nb_var_is_poison(x)) {
        return false;
    }
    char xs[96];
    const char *xp = x->path != NULL ? x->path : NULL;
    if (!nb_dtype_is_float(nb_var_dtype(x))) {
        nbi_nn_fail(at, NB_ERR_DTYPE,
                    "the input%s%s%s of %s is %s; it must be f32 or f64 (nb_cast it)",
                    xp ? " '" : "", xp ? xp : "", xp ? "'" : "", nbi_nn_where(at, w, sizeof w),
                    nbi_nn_sig(xs, sizeof xs, x));
        return false;
    }
    int r = nb_var_rank(x);
    if (r < min_rank || r > max_rank) {
        nbi_nn_fail(at, NB_ERR_SHAPE, "the input%s%s%s of %s is %s; expected %s", xp ? " '" : "",
                    xp ? xp : "", xp ? "'" : "", nbi_nn_where(at, w, sizeof w),
                    nbi_nn_sig(xs, sizeof xs, x), expect);
        return false;
    }
    return true;
}

/* ---- activations -------------------------------------------------------------------- */

nb_var *nb_nn_identity(nb_var *x) {
    return x;
}

/* The built-in activations and their names: one table for naming them and for finding
 * them by name (safetensors restores them from files). */
static const struct {
    nb_nn_activation fn;
    const char *name;
} nbi_nn_known[] = {
    {nb_relu, "relu"}, {nb_tanh, "tanh"},         {nb_sigmoid, "sigmoid"},
    {nb_gelu, "gelu"}, {nb_softplus, "softplus"}, {nb_nn_identity, "identity"},
};

const char *nbi_nn_activation_name(nb_nn_activation fn) {
    for (size_t i = 0; i < sizeof nbi_nn_known / sizeof nbi_nn_known[0]; i++) {
        if (nbi_nn_known[i].fn == fn) {
            return nbi_nn_known[i].name;
        }
    }
    return "activation";
}

nb_nn_activation nbi_nn_activation_named(const char *s, size_t n) {
    for (size_t i = 0; i < sizeof nbi_nn_known / sizeof nbi_nn_known[0]; i++) {
        if (strlen(nbi_nn_known[i].name) == n && memcmp(nbi_nn_known[i].name, s, n) == 0) {
            return nbi_nn_known[i].fn;
        }
    }
    return NULL;
}

nb_status nb_nn_activation_leaf(nb_ctx *ctx, nb_nn_activation fn, const char *name,
                                nb_tree **leaf) {
    static const char fname[] = "nb_nn_activation_leaf";
    nb_status st = nbi_nn_args(ctx, fname, leaf);
    if (st != NB_OK) {
        return st;
    }
    if (fn == NULL) {
        return nbi_err(ctx, NB_ERR_INVALID,
                       "%s: the activation is NULL (use nb_nn_identity for "
                       "none)",
                       fname);
    }
    if (name == NULL || name[0] == '\0') {
        name = nbi_nn_activation_name(fn);
    }
    return nb_tree_fnref(ctx, (nb_fnptr)fn, name, leaf);
}

/* ---- utilities ---------------------------------------------------------------------- */

static void nbi_nn_count(const nb_tree *t, int64_t *n) {
    nb_tree_kind k = nb_tree_kind_of(t);
    if (k == NB_TREE_KIND_ARRAY) {
        nb_array *a = nb_tree_get_array(t);
        if (nb_dtype_is_float(nb_array_dtype(a))) {
            *n += nb_array_size(a);
        }
    } else if (k == NB_TREE_KIND_VAR) {
        const nb_var *v = t->u.var.var;
        if (v != NULL && nb_dtype_is_float(v->dtype)) {
            *n += v->size;
        }
    } else {
        for (int64_t i = 0; i < nb_tree_len(t); i++) {
            nbi_nn_count(nb_tree_child(t, i), n);
        }
    }
}

nb_status nb_nn_count_params(const nb_tree *model, int64_t *count) {
    if (count != NULL) {
        *count = 0;
    }
    nb_status st = nbi_check_handle(model, NBI_MAGIC_TREE, "nb_nn_count_params", "model");
    if (st != NB_OK) {
        return st;
    }
    if (count == NULL) {
        return nbi_err(model->hdr.ctx, NB_ERR_MISUSE,
                       "nb_nn_count_params: count is NULL (pass the address of an int64_t to "
                       "receive the count)");
    }
    nbi_nn_count(model, count);
    return NB_OK;
}

static nb_status nbi_nn_inference_leaf(void *ud, const char *path, int n,
                                       const nb_tree *const *leaves, nb_tree **out) {
    (void)n;
    const bool *value = ud;
    const nb_tree *leaf = leaves[0];
    size_t lp = strlen(path);
    static const char key[] = "inference";
    size_t lk = sizeof key - 1;
    if (nb_tree_kind_of(leaf) == NB_TREE_KIND_BOOL && lp >= lk &&
        strcmp(path + lp - lk, key) == 0 && (lp == lk || path[lp - lk - 1] == '.')) {
        return nb_tree_bool(nb_tree_ctx(leaf), *value, out);
    }
    *out = nb_tree_retain((nb_tree *)leaf);
    return NB_OK;
}

nb_status nb_nn_inference_mode(const nb_tree *model, bool inference, nb_tree **out) {
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbi_check_handle(model, NBI_MAGIC_TREE, "nb_nn_inference_mode", "model");
    if (st != NB_OK) {
        return st;
    }
    if (out == NULL) {
        return nbi_err(model->hdr.ctx, NB_ERR_MISUSE,
                       "nb_nn_inference_mode: out is NULL (pass the address of an nb_tree * for "
                       "the new model)");
    }
    return nb_tree_map(model, nbi_nn_inference_leaf, &inference, NB_TREE_MAP_STATIC, out);
}

/* (name): the name is also a macro (tree.h, nb_tree_items) */
nb_status(nb_nn_sequential_init)(nb_ctx *ctx, int n, nb_tree_items layers_in, nb_tree **layer) {
    static const char fn[] = "nb_nn_sequential_init";
    const nb_tree *const *layers = NB_TREE_ITEMS_PTR(layers_in);
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL && n > 0 && layers != NULL) {
        st = nbi_err_null_ctx(layers[0], fn); /* the layers know the context */
    }
    if (st != NB_OK) {
        return st;
    }
    if (n < 0 || (n > 0 && layers == NULL)) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: n is %d with %s layers; n >= 0 layers are needed",
                       fn, n, layers == NULL ? "NULL" : "given");
    }
    for (int i = 0; i < n; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "layers[%d]", i);
        st = nbi_check_handle_in(ctx, layers[i], NBI_MAGIC_TREE, fn, arg);
        if (st != NB_OK) {
            return st;
        }
        if (layers[i]->hdr.ctx != ctx) {
            return nbi_err(ctx, NB_ERR_INVALID,
                           "%s: %s belongs to another context than ctx (each context's arrays and "
                           "trees stay in it) -- make the layer in ctx, or load it there",
                           fn, arg);
        }
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, "sequential");
    nb_tree *list = NULL;
    st = nb_tree_list(ctx, n, layers, &list);
    nbi_nn_put(&d, "layers", st, list);
    return nbi_nn_dict_finish(&d, layer);
}

/* ---- apply: dispatch ---------------------------------------------------------------- */

static nb_var *nbi_nn_sequential(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *key);

nb_var *nb_nn_apply(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *key) {
    if (tr == NULL) {
        return NULL;
    }
    nbi_nn_at at;
    memset(&at, 0, sizeof at);
    at.tr = tr;
    at.fn = "nb_nn_apply";
    at.kind = "any";
    at.layer = layer;
    if (nb_trace_status(tr) != NB_OK) {
        return tr->poison;
    }
    if (!nbi_obj_live(layer, NBI_MAGIC_TREE)) {
        return nbi_nn_fail(&at, NB_ERR_MISUSE,
                           "the layer is a NULL or destroyed tree (look it up with "
                           "nb_tree_lookup and check the path)");
    }
    if (x == NULL) {
        return nbi_nn_fail(&at, NB_ERR_MISUSE, "x is a NULL var (pass the layer's input)");
    }
    nb_tree_kind k = nb_tree_kind_of(layer);
    if (k == NB_TREE_KIND_FNREF) {
        nb_fnptr p = NULL;
        const char *name = NULL;
        nb_tree_get_fnref(layer, &p, &name);
        if (x == NULL) {
            return nbi_nn_fail(&at, NB_ERR_MISUSE, "the input of activation '%s' is a NULL var",
                               name);
        }
        return ((nb_nn_activation)p)(x);
    }
    const nb_tree *kt = k == NB_TREE_KIND_DICT ? nb_tree_get(layer, "kind") : NULL;
    const char *kind = NULL;
    if (kt == NULL || nb_tree_get_string(kt, &kind) != NB_OK) {
        char d[128];
        nbi_nn_find_path(layer, "", 0, at.path, sizeof at.path);
        return nbi_nn_fail(&at, NB_ERR_KIND,
                           "%s%s%s is %s, not a layer (a dict with a \"kind\" leaf made by an "
                           "nb_nn_*_init function, or an activation leaf)",
                           at.path[0] ? "'" : "the tree", at.path, at.path[0] ? "'" : "",
                           nbi_nn_describe(layer, d, sizeof d));
    }
    if (strcmp(kind, "linear") == 0) {
        return nb_nn_linear(tr, layer, x);
    }
    if (strcmp(kind, "mlp") == 0) {
        return nb_nn_mlp(tr, layer, x);
    }
    if (strcmp(kind, "layer_norm") == 0) {
        return nb_nn_layer_norm(tr, layer, x);
    }
    if (strcmp(kind, "embedding") == 0) {
        return nb_nn_embedding(tr, layer, x);
    }
    if (strcmp(kind, "conv1d") == 0 || strcmp(kind, "conv2d") == 0 || strcmp(kind, "conv3d") == 0) {
        return nb_nn_conv(tr, layer, x);
    }
    if (strncmp(kind, "conv_transpose", 14) == 0) {
        return nb_nn_conv_transpose(tr, layer, x);
    }
    if (strcmp(kind, "max_pool") == 0 || strcmp(kind, "avg_pool") == 0 ||
        strcmp(kind, "adaptive_avg_pool") == 0 || strcmp(kind, "adaptive_max_pool") == 0) {
        return nb_nn_pool(tr, layer, x);
    }
    if (strcmp(kind, "group_norm") == 0) {
        return nb_nn_group_norm(tr, layer, x);
    }
    if (strcmp(kind, "rms_norm") == 0) {
        return nb_nn_rms_norm(tr, layer, x);
    }
    static const char *const more[4][2] = {
        {"batch_norm", "nb_nn_batch_norm (it takes and returns its state)"},
        {"multihead_attention", "nb_nn_multihead_attention (it takes query, key and value)"},
        {"gru_cell", "nb_nn_gru_cell (it takes the input and the hidden state)"},
        {"lstm_cell", "nb_nn_lstm_cell (it takes the input and the states h and c)"}};
    for (int i = 0; i < 4; i++) {
        if (strcmp(kind, more[i][0]) == 0) {
            nbi_nn_find_path(layer, "", 0, at.path, sizeof at.path);
            return nbi_nn_fail(&at, NB_ERR_KIND,
                               "%s%s%s is a '%s' layer, which takes more than one input; call "
                               "%s",
                               at.path[0] ? "'" : "the layer", at.path, at.path[0] ? "'" : "", kind,
                               more[i][1]);
        }
    }
    if (strcmp(kind, "dropout") == 0) {
        return nb_nn_dropout(tr, layer, x, key);
    }
    if (strcmp(kind, "sequential") == 0) {
        return nbi_nn_sequential(tr, layer, x, key);
    }
    nbi_nn_find_path(layer, "", 0, at.path, sizeof at.path);
    return nbi_nn_fail(&at, NB_ERR_KIND,
                       "%s%s%s has kind '%s', which nb_nn_apply does not know (linear, mlp, "
                       "layer_norm, rms_norm, group_norm, embedding, conv1d/2d/3d, "
                       "conv_transpose1d/2d/3d, max_pool, avg_pool, adaptive_avg_pool, "
                       "adaptive_max_pool, dropout, sequential)",
                       at.path[0] ? "'" : "the layer", at.path, at.path[0] ? "'" : "", kind);
}

static nb_var *nbi_nn_sequential(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *key) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_apply", "sequential", layer)) {
        return tr->poison;
    }
    const nb_tree *layers = nbi_nn_leaf(&at, "layers");
    if (layers == NULL) {
        return tr->poison;
    }
    nb_tree_kind k = nb_tree_kind_of(layers);
    if (k != NB_TREE_KIND_LIST && k != NB_TREE_KIND_TUPLE) {
        nbi_nn_static_fail(&at, "layers", layers, "a list of layers");
        return tr->poison;
    }
    int64_t n = nb_tree_len(layers);
    nb_var *keys = NULL;
    if (key != NULL && n > 0) {
        keys = nb_rng_split(key, n);
    }
    for (int64_t i = 0; i < n && !nb_var_is_poison(x); i++) {
        nb_var *ki = NULL;
        if (keys != NULL) {
            ki = nb_take(keys, nb_scalar_typed(tr, NB_DTYPE_I64, (double)i), 0);
        }
        x = nb_nn_apply(tr, nb_tree_child(layers, i), x, ki);
    }
    return x;
}
