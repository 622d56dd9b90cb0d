/*
 * test_grad.c -- gradients users rely on: an MLP with cross-entropy against PyTorch's
 * autograd (oracle data from tests/ad/oracle/gen_torch_mlp_grad.py), null slots at exactly
 * the non-differentiable paths, aux passed through untouched, grad and jit composing to
 * identical bits, and the error messages of misuse.
 */
#include "nbtest.h"

#include <stdlib.h>

#ifndef NBT_SOURCE_DIR
#define NBT_SOURCE_DIR "."
#endif

/* ---- the oracle file ---------------------------------------------------------------- */

#define MAX_TENSORS 32

typedef struct otensor {
    char name[32];
    nb_array *a;
} otensor;

static int load_oracle(nb_ctx *ctx, const char *file, otensor *ts) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/ad/oracle/%s", NBT_SOURCE_DIR, file);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fail_msg("cannot open %s", path);
    }
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "tensor ", 7) != 0) {
            continue;
        }
        char name[32], kind[8];
        int rank = 0, off = 0;
        if (sscanf(line, "tensor %31s %7s %d%n", name, kind, &rank, &off) != 3 ||
            n >= MAX_TENSORS) {
            fail_msg("%s: bad line '%s'", path, line);
        }
        int64_t shape[NB_MAX_RANK];
        char *p = line + off;
        for (int i = 0; i < rank; i++) {
            shape[i] = strtoll(p, &p, 10);
        }
        nb_dtype dt = strcmp(kind, "i64") == 0 ? NB_DTYPE_I64 : NB_DTYPE_F64;
        NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &ts[n].a));
        for (int64_t i = 0; i < nb_array_size(ts[n].a); i++) {
            if (fgets(line, sizeof line, f) == NULL) {
                fail_msg("%s: truncated tensor %s", path, name);
            }
            if (dt == NB_DTYPE_I64) {
                ((int64_t *)nb_array_data(ts[n].a))[i] = strtoll(line, NULL, 10);
            } else {
                ((double *)nb_array_data(ts[n].a))[i] = strtod(line, NULL);
            }
        }
        snprintf(ts[n].name, sizeof ts[n].name, "%s", name);
        n++;
    }
    fclose(f);
    return n;
}

static nb_array *find(otensor *ts, int n, const char *name) {
    for (int i = 0; i < n; i++) {
        if (strcmp(ts[i].name, name) == 0) {
            return ts[i].a;
        }
    }
    fail_msg("oracle tensor '%s' missing", name);
    return NULL;
}

static nb_tree *leaf_of(nb_array *a) {
    nb_tree *t = NULL;
    NBT_OK(nb_array_ctx(a), nb_tree_array(a, &t));
    return t;
}

/* max |a - b| / max(max |b|, tiny) */
static double rel_err(const nb_array *a, const nb_array *b) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < nb_array_size(b); i++) {
        double x = 0, y = 0;
        nb_array_get_flat(a, i, &x);
        nb_array_get_flat(b, i, &y);
        md = nbt_max(md, fabs(x - y));
        mb = nbt_max(mb, fabs(y));
    }
    return md / fmax(mb, 1e-300);
}

/* ---- the MLP with cross-entropy ----------------------------------------------------- */

/* args = (params, batch): params = {layers: [{w, b} x 3]}, batch = {x, y}. */
static nb_status body_mlp_ce(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *h = nb_get(tr, args, "[1].x");
    for (int i = 0; i < 3; i++) {
        nb_var *w = nb_get(tr, args, "[0].layers[%d].w", i);
        nb_var *b = nb_get(tr, args, "[0].layers[%d].b", i);
        h = nb_add(nb_matmul(h, w), b);
        if (i == 0) {
            h = nb_tanh(h);
        } else if (i == 1) {
            h = nb_relu(h);
        }
    }
    nb_var *logp = nb_log_softmax(h, -1);
    nb_var *y = nb_expand_dims(nb_get(tr, args, "[1].y"), -1);
    nb_var *picked = nb_take_along_axis(logp, y, -1);
    return nb_return(nb_neg(nb_mean(picked, NULL, 0, false)), out);
}

static nb_tree *mlp_params(nb_ctx *ctx, otensor *ts, int n) {
    nb_tree *layers[3], *list = NULL, *params = NULL;
    for (int i = 0; i < 3; i++) {
        char wn[8], bn[8];
        snprintf(wn, sizeof wn, "w%d", i);
        snprintf(bn, sizeof bn, "b%d", i);
        nb_tree *w = leaf_of(find(ts, n, wn)), *b = leaf_of(find(ts, n, bn));
        NBT_OK(ctx,
               nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    NBT_OK(ctx, nb_tree_list(ctx, 3, layers, &list));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"layers"}, &list, &params));
    for (int i = 0; i < 3; i++) {
        nb_tree_destroy(layers[i]);
    }
    nb_tree_destroy(list);
    return params;
}

static void test_mlp_cross_entropy_vs_torch(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    otensor ts[MAX_TENSORS];
    int n = load_oracle(ctx, "torch_mlp_grad.txt", ts);
    nb_tree *params = mlp_params(ctx, ts, n);
    nb_tree *x = leaf_of(find(ts, n, "x")), *y = leaf_of(find(ts, n, "y")), *batch = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){x, y}, &batch));
    nb_tree *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, batch}, &args));
    nb_fn *f = NULL, *vg = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "mlp_ce", body_mlp_ce, NULL, &f));
    NBT_OK(ctx, nb_value_and_grad(f, NULL, &vg));
    NBT_OK(ctx, nb_fn_call(vg, args, &out));
    double e = rel_err(nb_tree_get_array(nb_tree_child(out, 0)), find(ts, n, "loss"));
    print_message("loss: relative error vs torch %.3g\n", e);
    NBT_TRUE(e < 1e-12);
    const nb_tree *grads = nb_tree_child(out, 1);
    for (int i = 0; i < 3; i++) {
        char path[64], name[16];
        const nb_tree *g = NULL;
        snprintf(path, sizeof path, "layers[%d].w", i);
        snprintf(name, sizeof name, "grad_w%d", i);
        NBT_OK(ctx, nb_tree_lookup(grads, path, &g));
        e = rel_err(nb_tree_get_array(g), find(ts, n, name));
        print_message("%s: relative error vs torch %.3g\n", path, e);
        if (!(e < 1e-10)) {
            fail_msg("%s differs from torch by %g (relative)", path, e);
        }
        snprintf(path, sizeof path, "layers[%d].b", i);
        snprintf(name, sizeof name, "grad_b%d", i);
        NBT_OK(ctx, nb_tree_lookup(grads, path, &g));
        e = rel_err(nb_tree_get_array(g), find(ts, n, name));
        if (!(e < 1e-10)) {
            fail_msg("%s differs from torch by %g (relative)", path, e);
        }
    }
    /* The batch (x and the integer labels y) is not differentiated: only args[0] is. */
    NBT_EQ_I64(nb_tree_num_leaves(grads), 6);
    nb_tree_destroy(out);
    nb_tree_destroy(args);
    nb_tree_destroy(batch);
    nb_tree_destroy(y);
    nb_tree_destroy(x);
    nb_tree_destroy(params);
    nb_fn_destroy(vg);
    nb_fn_destroy(f);
    for (int i = 0; i < n; i++) {
        nb_array_destroy(ts[i].a);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- null slots --------------------------------------------------------------------- */

static float act_tanh(float v) {
    return v;
}

/* loss = sum((x @ w + b) * embed_scale) + sum(embed) * step -- every leaf takes part. */
static nb_status body_model(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[1]");
    nb_var *w = nb_get(tr, args, "[0].w"), *b = nb_get(tr, args, "[0].b");
    nb_var *emb = nb_get(tr, args, "[0].embed");
    nb_var *step = nb_cast(nb_get(tr, args, "[0].step"), NB_DTYPE_F32);
    nb_var *h = nb_add(nb_matmul(x, w), b);
    nb_var *loss =
        nb_add(nb_sum(nb_tanh(h), NULL, 0, false), nb_mul(nb_sum(emb, NULL, 0, false), step));
    nb_ctx *ctx = nb_trace_ctx(tr);
    /* aux: a static string, the int step, and the hidden activations */
    nb_tree *tag = NULL, *aux = NULL;
    nb_status st = nb_tree_string(ctx, "aux-tag", &tag);
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 3, (const char *[]){"tag", "step", "h"},
                          (nb_tree *[]){tag, nb_leaf(nb_get(tr, args, "[0].step")), nb_leaf(h)},
                          &aux);
    }
    if (st == NB_OK) {
        st = nb_tree_tuple(ctx, 2, (nb_tree *[]){nb_leaf(loss), aux}, out);
    }
    nb_tree_destroy(aux);
    nb_tree_destroy(tag);
    return st;
}

typedef struct model_parts {
    nb_tree *model, *spec, *x, *args;
} model_parts;

static model_parts make_model(nb_ctx *ctx) {
    model_parts m;
    nb_tree *w = nbt_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){3, 2});
    nb_tree *b0 = nbt_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){2}), *b = NULL;
    NBT_OK(ctx, nb_tree_freeze(b0, &b)); /* frozen by mark */
    nb_tree *emb = nbt_leaf(ctx, NB_DTYPE_F32, 2, (int64_t[]){4, 2});
    nb_tree *step = nbt_leaf(ctx, NB_DTYPE_I32, 0, NULL);
    nb_tree *act = NULL, *none = NULL;
    NBT_OK(ctx, nb_tree_fnref(ctx, (nb_fnptr)act_tanh, "tanh", &act));
    NBT_OK(ctx, nb_tree_null(ctx, &none));
    const char *keys[] = {"w", "b", "embed", "step", "act", "missing"};
    NBT_OK(ctx, nb_tree_dict(ctx, 6, keys, (nb_tree *[]){w, b, emb, step, act, none}, &m.model));
    /* the spec freezes embed (a prefix spec: one bool per top-level leaf) */
    nb_tree *t = NULL, *f = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &t));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &f));
    NBT_OK(ctx, nb_tree_dict(ctx, 6, keys, (nb_tree *[]){t, t, f, t, t, t}, &m.spec));
    nb_array *xa = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){5, 3}, 0.25, &xa));
    NBT_OK(ctx, nb_tree_array(xa, &m.x));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){m.model, m.x}, &m.args));
    nb_array_destroy(xa);
    nb_tree *all[] = {w, b0, b, emb, step, act, none, t, f};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_tree_destroy(all[i]);
    }
    return m;
}

static void free_model(model_parts *m) {
    nb_tree_destroy(m->args);
    nb_tree_destroy(m->x);
    nb_tree_destroy(m->spec);
    nb_tree_destroy(m->model);
}

static void test_null_slots(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    model_parts m = make_model(ctx);
    nb_fn *f = NULL, *g = NULL, *vg = NULL;
    nb_grad_opts o = nb_grad_opts_default();
    o.has_aux = true;
    o.filter_spec = m.spec;
    NBT_OK(ctx, nb_fn_create(ctx, "model_loss", body_model, NULL, &f));
    NBT_OK(ctx, nb_grad(f, &o, &g));
    nb_tree *out = NULL;
    NBT_OK(ctx, nb_fn_call(g, m.args, &out)); /* (grads, aux) */
    const nb_tree *grads = nb_tree_child(out, 0);
    struct {
        const char *path;
        bool array;
    } want[] = {{"w", true},     {"b", false},   {"embed", false},
                {"step", false}, {"act", false}, {"missing", false}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const nb_tree *leaf = NULL;
        NBT_OK(ctx, nb_tree_lookup(grads, want[i].path, &leaf));
        nb_tree_kind k = nb_tree_kind_of(leaf);
        if (want[i].array ? k != NB_TREE_KIND_ARRAY : k != NB_TREE_KIND_NULL) {
            fail_msg("grad at '%s' is %s, expected %s", want[i].path, nb_tree_kind_name(k),
                     want[i].array ? "an array" : "null");
        }
    }
    /* The gradient's treedef is the template's (computed without a gradient). */
    nb_tree *tmpl = NULL;
    NBT_OK(ctx, nb_grad_template(m.model, m.spec, &tmpl));
    bool same = false;
    NBT_OK(ctx, nb_tree_structure_equal(grads, tmpl, &same));
    NBT_TRUE(same);
    bool sig_differ = true;
    char buf[256];
    NBT_OK(ctx,
           nb_tree_diff(grads, tmpl, NB_TREE_DIFF_SIGNATURE, &sig_differ, buf, sizeof buf, NULL));
    NBT_TRUE(!sig_differ);
    /* The gradient of w: d/dw sum(tanh(x w + b)) = x^T (1 - tanh^2). x = 0.25, w = b = 0:
     * tanh(0) = 0, so every entry is sum over 5 rows of 0.25 = 1.25. */
    const nb_tree *gw = NULL;
    NBT_OK(ctx, nb_tree_lookup(grads, "w", &gw));
    double v = 0;
    NBT_OK(ctx, nb_array_get(nb_tree_get_array(gw), (int64_t[]){2, 1}, &v));
    NBT_NEAR(v, 1.25, 1e-6);
    /* aux comes back untouched: static string, int array, activations. */
    const nb_tree *aux = nb_tree_child(out, 1), *tag = NULL;
    const char *s = NULL;
    NBT_OK(ctx, nb_tree_lookup(aux, "tag", &tag));
    NBT_OK(ctx, nb_tree_get_string(tag, &s));
    NBT_STREQ(s, "aux-tag");
    const nb_tree *st = NULL;
    NBT_OK(ctx, nb_tree_lookup(aux, "step", &st));
    NBT_EQ_I64(nb_array_dtype(nb_tree_get_array(st)), NB_DTYPE_I32);
    nb_tree_destroy(out);
    /* value_and_grad with aux: ((value, aux), grads) */
    NBT_OK(ctx, nb_value_and_grad(f, &o, &vg));
    NBT_OK(ctx, nb_fn_call(vg, m.args, &out));
    NBT_EQ_I64(nb_tree_len(nb_tree_child(out, 0)), 2);
    NBT_OK(ctx, nb_tree_structure_equal(nb_tree_child(out, 1), tmpl, &same));
    NBT_TRUE(same);
    nb_tree_destroy(out);
    nb_tree_destroy(tmpl);
    nb_fn_destroy(vg);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    free_model(&m);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- grad and jit compose, bit for bit ---------------------------------------------- */

static nb_status body_smooth(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *w = nb_get(tr, args, "[0]"), *x = nb_get(tr, args, "[1]");
    nb_var *h = nb_tanh(nb_matmul(x, w));
    return nb_return(nb_mean(nb_mul(h, nb_exp(nb_neg(nb_square(h)))), NULL, 0, false), out);
}

static void test_grad_jit_commute(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *w = NULL, *x = NULL;
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, -1, 1, 12, &w));
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F32, -2, 3, 8, &x));
    nb_array *w2 = NULL, *x2 = NULL;
    NBT_OK(ctx, nb_array_reshape(w, 2, (int64_t[]){4, 3}, &w2));
    NBT_OK(ctx, nb_array_reshape(x, 2, (int64_t[]){2, 4}, &x2));
    nb_tree *lw = NULL, *lx = NULL, *args = NULL;
    NBT_OK(ctx, nb_tree_array(w2, &lw));
    NBT_OK(ctx, nb_tree_array(x2, &lx));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){lw, lx}, &args));
    nb_fn *f = NULL, *jf = NULL, *gjf = NULL, *gf = NULL, *jgf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "smooth", body_smooth, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &jf));
    NBT_OK(ctx, nb_grad(jf, NULL, &gjf));
    NBT_OK(ctx, nb_grad(f, NULL, &gf));
    NBT_OK(ctx, nb_jit(gf, NULL, &jgf));
    nb_tree *a = NULL, *b = NULL, *c = NULL;
    NBT_OK(ctx, nb_fn_call(gjf, args, &a));
    NBT_OK(ctx, nb_fn_call(jgf, args, &b));
    NBT_OK(ctx, nb_fn_call(jgf, args, &c)); /* and again: a cache hit, the same bits */
    bool same = false;
    NBT_OK(ctx, nb_array_identical(nb_tree_get_array(a), nb_tree_get_array(b), &same));
    NBT_TRUE(same);
    NBT_OK(ctx, nb_array_identical(nb_tree_get_array(b), nb_tree_get_array(c), &same));
    NBT_TRUE(same);
    nb_tree_destroy(c);
    nb_tree_destroy(b);
    nb_tree_destroy(a);
    nb_fn *fs[] = {jgf, gf, gjf, jf, f};
    for (int i = 0; i < 5; i++) {
        nb_fn_destroy(fs[i]);
    }
    nb_tree_destroy(args);
    nb_tree_destroy(lx);
    nb_tree_destroy(lw);
    nb_array_destroy(x2);
    nb_array_destroy(w2);
    nb_array_destroy(x);
    nb_array_destroy(w);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- custom_vjp --------------------------------------------------------------------- */

/* f(x) = x^3 (as a function of args = (x,)) */
static nb_status body_cube(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    return nb_return(nb_mul(nb_square(x), x), out);
}

/* fwd: (x^3, residuals = (x,)) */
static nb_status body_cube_fwd(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    nb_tree *res = NULL;
    nb_status st = nb_tree_tuple(nb_trace_ctx(tr), 1, (nb_tree *[]){nb_leaf(x)}, &res);
    if (st == NB_OK) {
        st = nb_tree_tuple(nb_trace_ctx(tr), 2,
                           (nb_tree *[]){nb_leaf(nb_mul(nb_square(x), x)), res}, out);
    }
    nb_tree_destroy(res);
    return st;
}

/* bwd: a deliberately different rule, ct * 10 x, so the test sees that it is used */
static nb_status body_cube_bwd(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                               nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0][0]"), *ct = nb_get(tr, args, "[1]");
    nb_tree *g = nb_leaf(nb_mul(ct, nb_mul(nb_scalar(tr, 10.0), x)));
    return nb_tree_tuple(nb_trace_ctx(tr), 1, &g, out);
}

/* loss = sum(cube(x)) through the custom rule */
static nb_fn *g_cube;
static nb_status body_cube_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                nb_tree **out) {
    (void)self;
    nb_var *y = nb_apply1(tr, g_cube, nb_get(tr, args, "[0]"));
    return nb_return(nb_sum(y, NULL, 0, false), out);
}

static void test_custom_vjp(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *fwd = NULL, *bwd = NULL, *loss = NULL, *g = NULL, *j = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "cube", body_cube, NULL, &f));
    NBT_OK(ctx, nb_fn_create(ctx, "cube_fwd", body_cube_fwd, NULL, &fwd));
    NBT_OK(ctx, nb_fn_create(ctx, "cube_bwd", body_cube_bwd, NULL, &bwd));
    NBT_OK(ctx, nb_custom_vjp(f, fwd, bwd, &g_cube));
    NBT_OK(ctx, nb_fn_create(ctx, "cube_loss", body_cube_loss, NULL, &loss));
    NBT_OK(ctx, nb_grad(loss, NULL, &g));
    nb_array *x = NULL;
    NBT_OK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, -1, 2, 4, &x));
    nb_tree *lx = NULL, *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_array(x, &lx));
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &lx, &args));
    /* forward: the primal f */
    NBT_OK(ctx, nb_fn_call(g_cube, args, &out));
    double v = 0;
    NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(out), 3, &v));
    NBT_EQ_F64(v, 8.0);
    nb_tree_destroy(out);
    /* reverse: the custom rule, 10 x, not 3 x^2 */
    NBT_OK(ctx, nb_fn_call(g, args, &out));
    for (int i = 0; i < 4; i++) {
        double xi = -1.0 + i;
        NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(out), i, &v));
        NBT_NEAR(v, 10.0 * xi, 1e-12);
    }
    nb_tree_destroy(out);
    /* forward mode through it is refused with a message */
    NBT_OK(ctx, nb_jvp(loss, &j));
    nb_tree *jargs = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){args, args}, &jargs));
    NBT_STATUS(ctx, NB_ERR_UNSUPPORTED, nb_fn_call(j, jargs, &out));
    NBT_ERRMSG_HAS(ctx, "nb_custom_vjp");
    nb_tree_destroy(jargs);
    nb_tree_destroy(args);
    nb_tree_destroy(lx);
    nb_array_destroy(x);
    nb_fn *fs[] = {j, g, loss, g_cube, bwd, fwd, f};
    for (int i = 0; i < 7; i++) {
        nb_fn_destroy(fs[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- misuse ------------------------------------------------------------------------- */

static nb_status body_vector_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    (void)self;
    return nb_return(nb_exp(nb_get(tr, args, "[0]")), out);
}

static void test_grad_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_fn *f = NULL, *g = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "vec", body_vector_loss, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &g));
    nb_tree *x = nbt_leaf(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}), *args = NULL, *out = NULL;
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, &x, &args));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_fn_call(g, args, &out));
    NBT_ERRMSG_HAS(ctx, "nb_grad: the loss of 'vec' is f32[3]; it must be a scalar");
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call(g, x, &out));
    NBT_ERRMSG_HAS(ctx, "must be a tuple or list");
    /* a filter spec that does not match args[0] */
    nb_tree *spec = NULL, *t = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &t));
    NBT_OK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){t, t}, &spec));
    nb_grad_opts o = nb_grad_opts_default();
    o.filter_spec = spec;
    nb_fn *g2 = NULL;
    NBT_OK(ctx, nb_grad(f, &o, &g2));
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call(g2, args, &out));
    NBT_ERRMSG_HAS(ctx, "filter spec");
    nb_fn_destroy(g2);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_grad(NULL, NULL, &g2));
    NBT_TRUE(g2 == NULL);
    nb_tree_destroy(spec);
    nb_tree_destroy(t);
    nb_tree_destroy(args);
    nb_tree_destroy(x);
    nb_fn_destroy(g);
    nb_fn_destroy(f);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_cross_entropy_vs_torch),
        cmocka_unit_test(test_null_slots),
        cmocka_unit_test(test_grad_jit_commute),
        cmocka_unit_test(test_grad_errors),
        cmocka_unit_test(test_custom_vjp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
