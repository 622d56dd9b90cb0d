/*
 * nabla -- the command-line tool.
 *
 *     nabla train      an MLP trained on the UCI digits with Adam: one jitted, donated
 *                      train step (what `make run` shows); see train.c
 *     nabla ode        Lotka-Volterra's parameters fitted through an ODE solve; see ode.c
 *     nabla bench      a reproducible optimizer benchmark suite; see bench.c
 *     nabla demo       a tour of arrays and pytrees, then an MLP forward traced, compiled
 *                      and run on the digits data
 *     nabla version    (or --version) the version, the build type, BLIS and SLEEF, and the
 *                      data directory the commands would use
 */
#include "cli.h"
#include "commands.h"

#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The build type, for --version (tools/CMakeLists.txt passes $<CONFIG>). */
#ifndef NABLA_BUILD_TYPE
#define NABLA_BUILD_TYPE ""
#endif

/* On a failed call: "nabla demo: <doing>: <the library's message>", and the demo ends;
 * `doing` is a local string naming the section in plain words. */
#define CHECK(ctx, expr)                                                                           \
    do {                                                                                           \
        nb_status check_st_ = (expr);                                                              \
        if (check_st_ != NB_OK) {                                                                  \
            return cli_fail("demo", ctx, check_st_, "%s", doing);                                  \
        }                                                                                          \
    } while (0)

static float act_relu(float x) {
    return x > 0.0f ? x : 0.0f;
}

static nb_tree *leaf_take(nb_ctx *ctx, nb_array *a) {
    nb_tree *t = NULL;
    if (nb_tree_array(a, &t) != NB_OK) {
        fprintf(stderr, "nabla: %s\n", nb_ctx_errmsg(ctx));
    }
    nb_array_destroy(a);
    return t;
}

/* One dense layer {weight: f32[out,in], bias: f32[out]} with weights from a fixed formula. */
static nb_tree *make_layer(nb_ctx *ctx, int64_t in, int64_t out) {
    nb_array *w = NULL, *b = NULL;
    if (nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){out, in}, &w) != NB_OK ||
        nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){out}, 0.1, &b) != NB_OK) {
        nb_array_destroy(w);
        return NULL;
    }
    float *p = nb_array_data(w);
    for (int64_t i = 0; i < out * in; i++) {
        p[i] = (float)sin((double)(i + 1)) / (float)sqrt((double)in);
    }
    nb_tree *lw = leaf_take(ctx, w), *lb = leaf_take(ctx, b), *layer = NULL;
    if (lw != NULL && lb != NULL) {
        nb_tree_dict(ctx, 2, (const char *[]){"weight", "bias"}, (nb_tree *[]){lw, lb}, &layer);
    }
    nb_tree_destroy(lw);
    nb_tree_destroy(lb);
    return layer;
}

static nb_status scale_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                            nb_tree **out) {
    (void)path;
    (void)n;
    double factor = *(const double *)ud;
    nb_array *a = NULL;
    nb_status st = nb_array_copy(nb_tree_get_array(leaves[0]), &a);
    if (st != NB_OK) {
        return st;
    }
    float *p = nb_array_data(a);
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        p[i] = (float)(p[i] * factor);
    }
    st = nb_tree_array(a, out);
    nb_array_destroy(a);
    return st;
}

static int demo_tour(nb_ctx *ctx) {
    printf("== 1. arrays and pytrees\n\n");

    /* Arrays. */
    nb_array *r = NULL, *m = NULL, *lin = NULL, *eye = NULL, *ints = NULL;
    const char *doing = "the tour of arrays and pytrees failed";
    CHECK(ctx, nb_array_arange(ctx, NB_DTYPE_F32, 0, 12, 1, &r));
    CHECK(ctx, nb_array_reshape(r, 2, (int64_t[]){3, 4}, &m));
    CHECK(ctx, nb_array_linspace(ctx, NB_DTYPE_F64, 0, 1, 5, &lin));
    CHECK(ctx, nb_array_eye(ctx, NB_DTYPE_I32, 3, 3, 0, &eye));
    CHECK(ctx, nb_array_cast(m, NB_DTYPE_I64, &ints));
    printf("arange(12).reshape(3, 4), f32:\n");
    CHECK(ctx, nb_array_fprint(m, stdout));
    printf("linspace(0, 1, 5), f64:\n");
    CHECK(ctx, nb_array_fprint(lin, stdout));
    printf("eye(3), i32:\n");
    CHECK(ctx, nb_array_fprint(eye, stdout));
    CHECK(ctx, nb_array_set(m, (int64_t[]){-1, -1}, 0.5));
    printf("after m[-1, -1] = 0.5 (the reshape shares its data with arange):\n");
    CHECK(ctx, nb_array_fprint(r, stdout));

    /* A model as a pytree: two layers, an activation, a step counter, a frozen slot. */
    nb_tree *l0 = make_layer(ctx, 4, 8), *l1 = make_layer(ctx, 8, 3);
    nb_tree *layers = NULL, *act = NULL, *step = NULL, *frozen = NULL, *model = NULL;
    if (l0 == NULL || l1 == NULL) {
        fprintf(stderr, "nabla: %s\n", nb_ctx_errmsg(ctx));
        return 1;
    }
    CHECK(ctx, nb_tree_list(ctx, 2, (nb_tree *[]){l0, l1}, &layers));
    CHECK(ctx, nb_tree_fnref(ctx, (nb_fnptr)act_relu, "relu", &act));
    CHECK(ctx, nb_tree_int(ctx, 0, &step));
    CHECK(ctx, nb_tree_null(ctx, &frozen));
    CHECK(ctx, nb_tree_dict(ctx, 4, (const char *[]){"layers", "act", "step", "embedding"},
                            (nb_tree *[]){layers, act, step, frozen}, &model));
    printf("\nthe model pytree:\n");
    CHECK(ctx, nb_tree_fprint(model, stdout));
    printf("\nits dynamic leaves, by path:\n");
    CHECK(ctx, nb_tree_fprint_leaves(model, stdout));

    /* Flatten: leaves + treedef. */
    nb_tree *leaves = NULL, *rebuilt = NULL;
    nb_treedef *def = NULL;
    char text[1024];
    CHECK(ctx, nb_tree_flatten(model, &leaves, &def));
    CHECK(ctx, nb_treedef_format(def, text, sizeof text, NULL));
    printf("\nflatten: %lld leaves, treedef %s\n  hash %016llx\n", (long long)nb_tree_len(leaves),
           text, (unsigned long long)nb_treedef_hash(def));
    CHECK(ctx, nb_tree_unflatten(def, leaves, &rebuilt));
    bool same = false;
    CHECK(ctx, nb_tree_equal(model, rebuilt, &same));
    printf("unflatten(flatten(model)) == model: %s\n", same ? "yes" : "NO");

    /* Lookup by path, map, diff. */
    const nb_tree *w1 = NULL;
    CHECK(ctx, nb_tree_lookup(model, "layers[1].weight", &w1));
    printf("\nlookup \"layers[1].weight\":\n");
    CHECK(ctx, nb_array_fprint(nb_tree_get_array(w1), stdout));
    double half = 0.5;
    nb_tree *halved = NULL;
    CHECK(ctx, nb_tree_map(model, scale_leaf, &half, 0, &halved));
    bool differ = false;
    CHECK(ctx, nb_tree_diff(model, halved, NB_TREE_DIFF_VALUES, &differ, text, sizeof text, NULL));
    printf("\nmap(x -> x/2), then diff against the model:\n  %s\n", differ ? text : "(none)");
    CHECK(ctx,
          nb_tree_diff(model, halved, NB_TREE_DIFF_SIGNATURE, &differ, text, sizeof text, NULL));
    printf("same diff at signature level (dtypes and shapes only): %s\n",
           differ ? text : "no difference");

    nb_tree_destroy(halved);
    nb_tree_destroy(rebuilt);
    nb_treedef_destroy(def);
    nb_tree_destroy(leaves);
    nb_tree_destroy(model);
    nb_tree_destroy(frozen);
    nb_tree_destroy(step);
    nb_tree_destroy(act);
    nb_tree_destroy(layers);
    nb_tree_destroy(l1);
    nb_tree_destroy(l0);
    nb_array_destroy(ints);
    nb_array_destroy(eye);
    nb_array_destroy(lin);
    nb_array_destroy(m);
    nb_array_destroy(r);
    return 0;
}

/* ---- 2. trace, compile and run an MLP forward on the digits data ---------------------- */

/* The model's body: self = {layers: [{w, b}, ...]}, args = (x,). Returns log-probabilities
 * and the predicted classes. */
static nb_status mlp_forward(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    nb_var *h = nb_get(tr, args, "[0]");
    int64_t n_layers = nb_tree_len(nb_tree_get(self, "layers"));
    for (int64_t i = 0; i < n_layers; i++) {
        nb_var *w = nb_get(tr, self, "layers[%lld].w", (long long)i);
        nb_var *b = nb_get(tr, self, "layers[%lld].b", (long long)i);
        h = nb_add(nb_matmul(h, w), b);
        if (i + 1 < n_layers) {
            h = nb_tanh(h);
        }
    }
    nb_var *logp = nb_log_softmax(h, -1);
    nb_var *pred = nb_argmax(logp, -1, false);
    return nb_tree_dict(nb_trace_ctx(tr), 2, (const char *[]){"log_probs", "pred"},
                        (nb_tree *[]){nb_leaf(logp), nb_leaf(pred)}, out);
}

/* Layers of sizes[0] -> sizes[1] -> ...; weights from a fixed formula scaled by
 * 1/sqrt(fan_in) (no training yet: the optimizer issue brings that). */
static nb_tree *mlp_params(nb_ctx *ctx, int n, const int64_t *sizes) {
    nb_tree *layers[8] = {0}, *list = NULL, *model = NULL;
    for (int i = 0; i + 1 < n; i++) {
        nb_array *w = NULL, *b = NULL;
        if (nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){sizes[i], sizes[i + 1]}, &w) !=
                NB_OK ||
            nb_array_zeros(ctx, NB_DTYPE_F32, 1, &sizes[i + 1], &b) != NB_OK) {
            nb_array_destroy(w);
            return NULL;
        }
        float *p = nb_array_data(w);
        for (int64_t k = 0; k < sizes[i] * sizes[i + 1]; k++) {
            p[k] = (float)(sin((double)(k * 7 + i + 1) * 0.37) * 1.7 / sqrt((double)sizes[i]));
        }
        nb_tree *lw = leaf_take(ctx, w), *lb = leaf_take(ctx, b);
        nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){lw, lb}, &layers[i]);
        nb_tree_destroy(lw);
        nb_tree_destroy(lb);
    }
    nb_tree_list(ctx, n - 1, layers, &list);
    nb_tree_dict(ctx, 1, (const char *[]){"layers"}, &list, &model);
    for (int i = 0; i + 1 < n; i++) {
        nb_tree_destroy(layers[i]);
    }
    nb_tree_destroy(list);
    return model;
}

static nb_tree *rows_arg(nb_ctx *ctx, nb_array *x, int64_t n) {
    int64_t cols = nb_array_dim(x, 1);
    nb_array *part = NULL;
    nb_tree *leaf = NULL, *args = NULL;
    if (nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){n, cols}, nb_array_data(x), &part) ==
        NB_OK) {
        leaf = leaf_take(ctx, part);
        nb_tree_tuple(ctx, 1, &leaf, &args);
        nb_tree_destroy(leaf);
    }
    return args;
}

/* Where the demo's data set is: --data, else cli_data_dir(). */
typedef struct demo_data {
    const char *dir; /* NULL: no --data given */
    char path[CLI_PATH_MAX + 64];
} demo_data;

/* DIR/digits.csv.gz into *x (pixels scaled from 0..16 to 0..1) and *y. 0, or 1 with a
 * message (and where the data directory came from, when no --data was given). */
static int demo_load_digits(nb_ctx *ctx, demo_data *d, nb_array **x, nb_array **y) {
    snprintf(d->path, sizeof d->path, "%s/digits.csv.gz", d->dir != NULL ? d->dir : cli_data_dir());
    nb_status st = nb_csv_load(ctx, d->path, NULL, x, y);
    if (st != NB_OK) {
        cli_fail("demo", ctx, st, "cannot read the data set %s", d->path);
        if (d->dir == NULL) {
            cli_data_dir_explain(stderr);
        }
        return 1;
    }
    float *px = nb_array_data(*x);
    for (int64_t i = 0; i < nb_array_size(*x); i++) {
        px[i] /= 16.0f; /* pixels 0..16 -> 0..1 */
    }
    return 0;
}

static int demo_mlp(nb_ctx *ctx, demo_data *data) {
    printf("\n== 2. an MLP forward on UCI digits: trace, compile, run\n\n");
    nb_array *x = NULL, *y = NULL;
    if (demo_load_digits(ctx, data, &x, &y) != 0) {
        return 1;
    }
    printf("loaded %s: x f32[%lld,%lld], labels i32[%lld]\n", data->path,
           (long long)nb_array_dim(x, 0), (long long)nb_array_dim(x, 1),
           (long long)nb_array_dim(y, 0));

    nb_tree *params = mlp_params(ctx, 4, (int64_t[]){64, 32, 32, 10});
    nb_fn *mlp = NULL, *jmlp = NULL;
    const char *doing = "the MLP forward failed";
    CHECK(ctx, params ? NB_OK : NB_ERR_OOM);
    CHECK(ctx, nb_fn_create(ctx, "mlp", mlp_forward, params, &mlp));
    CHECK(ctx, nb_jit(mlp, NULL, &jmlp));
    nb_tree *batch = rows_arg(ctx, x, 8), *all = rows_arg(ctx, x, nb_array_dim(x, 0));
    CHECK(ctx, batch && all ? NB_OK : NB_ERR_OOM);

    size_t need = 0;
    nb_fn_format_ir(jmlp, batch, NB_IR_OPTIMIZED, NULL, 0, &need);
    char *ir = malloc(need + 1);
    CHECK(ctx, ir ? nb_fn_format_ir(jmlp, batch, NB_IR_OPTIMIZED, ir, need + 1, NULL) : NB_ERR_OOM);
    printf("\nthe compiled IR (after constant folding, CSE and DCE):\n%s", ir);
    free(ir);

    nb_tree *out = NULL;
    CHECK(ctx, nb_fn_call(jmlp, batch, &out));
    printf("\nlog-probabilities of the first 8 samples (untrained weights):\n");
    CHECK(ctx, nb_array_fprint(nb_tree_get_array(nb_tree_get(out, "log_probs")), stdout));
    printf("predicted: ");
    CHECK(ctx, nb_array_fprint(nb_tree_get_array(nb_tree_get(out, "pred")), stdout));
    nb_tree_destroy(out);

    /* The same function on every sample: a new shape, so one retrace, with its reason. */
    CHECK(ctx, nb_fn_call(jmlp, all, &out));
    const int64_t *pred = nb_array_data(nb_tree_get_array(nb_tree_get(out, "pred")));
    const int32_t *lab = nb_array_data(y);
    int64_t n = nb_array_dim(y, 0), hit = 0;
    for (int64_t i = 0; i < n; i++) {
        hit += pred[i] == lab[i];
    }
    printf("\nall %lld samples: accuracy %.1f%% (chance is 10%%: nothing is trained yet)\n",
           (long long)n, 100.0 * (double)hit / (double)n);
    nb_tree_destroy(out);
    CHECK(ctx, nb_fn_call(jmlp, batch, &out)); /* back to 8 rows: a cache hit */
    nb_tree_destroy(out);
    nb_fn_stats st;
    CHECK(ctx, nb_fn_stats_get(jmlp, &st));
    char reason[256];
    CHECK(ctx, nb_fn_retrace_reason(jmlp, 0, reason, sizeof reason, NULL));
    printf("jit accounting: %lld calls, %lld traces, %lld cache hits; retrace 1: %s\n",
           (long long)st.n_calls, (long long)st.n_traces, (long long)st.n_hits, reason);

    nb_tree_destroy(all);
    nb_tree_destroy(batch);
    nb_fn_destroy(jmlp);
    nb_fn_destroy(mlp);
    nb_tree_destroy(params);
    nb_array_destroy(y);
    nb_array_destroy(x);
    return 0;
}

/* ---- 3. gradients: value_and_grad of the cross-entropy, a few descent steps ----------- */

/* args = (params, batch{x, y}) */
static nb_status mlp_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *h = nb_get(tr, args, "[1].x");
    int64_t n_layers = nb_tree_len(nb_tree_get(nb_tree_child(args, 0), "layers"));
    for (int64_t i = 0; i < n_layers; i++) {
        h = nb_add(nb_matmul(h, nb_get(tr, args, "[0].layers[%lld].w", (long long)i)),
                   nb_get(tr, args, "[0].layers[%lld].b", (long long)i));
        if (i + 1 < n_layers) {
            h = nb_tanh(h);
        }
    }
    nb_var *y = nb_expand_dims(nb_get(tr, args, "[1].y"), -1);
    nb_var *picked = nb_take_along_axis(nb_log_softmax(h, -1), y, -1);
    return nb_return(nb_neg(nb_mean(picked, NULL, 0, false)), out);
}

typedef struct sgd_ctx {
    float lr;
} sgd_ctx;

/* p - lr * g where the gradient is an array; the parameter unchanged where it is null */
static nb_status sgd_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                          nb_tree **out) {
    (void)path;
    (void)n;
    const sgd_ctx *c = ud;
    nb_array *p = nb_tree_get_array(leaves[0]), *g = nb_tree_get_array(leaves[1]), *q = NULL;
    if (g == NULL) {
        return nb_tree_freeze(leaves[0], out); /* keeps the frozen mark */
    }
    nb_status st = nb_array_copy(p, &q);
    if (st != NB_OK) {
        return st;
    }
    float *qd = nb_array_data(q);
    const float *gd = nb_array_data(g);
    for (int64_t i = 0; i < nb_array_size(q); i++) {
        qd[i] -= c->lr * gd[i];
    }
    st = nb_tree_array(q, out);
    nb_array_destroy(q);
    return st;
}

static int demo_grad(nb_ctx *ctx, demo_data *data) {
    printf("\n== 3. gradients: value_and_grad of the cross-entropy, and a few steps\n\n");
    nb_array *x = NULL, *y = NULL;
    if (demo_load_digits(ctx, data, &x, &y) != 0) {
        return 1;
    }
    nb_tree *params = mlp_params(ctx, 4, (int64_t[]){64, 32, 32, 10});
    /* freeze the first layer's bias: its gradient slot is null, and it never changes */
    const nb_tree *b0 = NULL;
    const char *doing = "the gradient steps failed";
    CHECK(ctx, nb_tree_lookup(params, "layers[0].b", &b0));
    nb_tree *fb = NULL, *model = NULL;
    CHECK(ctx, nb_tree_freeze(b0, &fb));
    /* rebuild the tree with the frozen leaf (trees are immutable) */
    const nb_tree *l0 = NULL;
    CHECK(ctx, nb_tree_lookup(params, "layers[0]", &l0));
    nb_tree *l0n = NULL, *list = NULL;
    CHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "b"},
                            (const nb_tree *[]){nb_tree_get(l0, "w"), fb}, &l0n));
    const nb_tree *layers = nb_tree_get(params, "layers");
    CHECK(ctx,
          nb_tree_list(ctx, 3,
                       (const nb_tree *[]){l0n, nb_tree_child(layers, 1), nb_tree_child(layers, 2)},
                       &list));
    CHECK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"layers"}, &list, &model));
    nb_tree *lx = NULL, *ly = NULL, *batch = NULL;
    CHECK(ctx, nb_tree_array(x, &lx));
    CHECK(ctx, nb_tree_array(y, &ly));
    CHECK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){lx, ly}, &batch));

    nb_fn *loss = NULL, *vg = NULL, *jvg = NULL;
    CHECK(ctx, nb_fn_create(ctx, "mlp_loss", mlp_loss, NULL, &loss));
    CHECK(ctx, nb_value_and_grad(loss, NULL, &vg));
    CHECK(ctx, nb_jit(vg, NULL, &jvg));
    sgd_ctx sgd = {0.3f};
    for (int step = 0; step <= 30; step++) {
        nb_tree *args = NULL, *out = NULL, *next = NULL;
        CHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){model, batch}, &args));
        CHECK(ctx, nb_fn_call(jvg, args, &out));
        const nb_tree *grads = nb_tree_child(out, 1);
        if (step == 0) {
            printf("the gradient tree (null where the bias is frozen):\n");
            CHECK(ctx, nb_tree_fprint(grads, stdout));
        }
        if (step % 10 == 0) {
            double l = 0;
            CHECK(ctx, nb_array_get(nb_tree_get_array(nb_tree_child(out, 0)), NULL, &l));
            printf("step %2d: loss %.4f\n", step, l);
        }
        CHECK(ctx,
              nb_tree_map_n(2, (const nb_tree *const[]){model, grads}, sgd_leaf, &sgd, 0, &next));
        nb_tree_destroy(model);
        model = next;
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    nb_fn_stats st;
    CHECK(ctx, nb_fn_stats_get(jvg, &st));
    printf("value_and_grad traced %lld time(s) for %lld calls; workspace %.1f KiB\n",
           (long long)st.n_traces, (long long)st.n_calls, (double)st.workspace_bytes / 1024.0);
    nb_fn_destroy(jvg);
    nb_fn_destroy(vg);
    nb_fn_destroy(loss);
    nb_tree *trees[] = {batch, ly, lx, model, list, l0n, fb, params};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array_destroy(y);
    nb_array_destroy(x);
    return 0;
}

static int cmd_demo(demo_data *data) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        fprintf(stderr, "nabla: cannot create a context\n");
        return 1;
    }
    char info[256];
    nb_build_info(info, sizeof info, NULL);
    printf("%s\n\n", info);
    int rc = demo_tour(ctx);
    if (rc == 0) {
        rc = demo_mlp(ctx, data);
    }
    if (rc == 0) {
        rc = demo_grad(ctx, data);
    }
    nb_ctx_clear_cache(ctx);
    nb_ctx_stats stats;
    nb_ctx_stats_get(ctx, &stats);
    printf("\nlive objects at the end: %lld arrays, %lld trees (peak %zu bytes allocated)\n",
           (long long)stats.live_arrays, (long long)stats.live_trees, stats.bytes_peak);
    nb_ctx_destroy(ctx);
    return rc;
}

static void demo_usage(FILE *f) {
    fprintf(f, "usage: nabla demo [--data DIR]\n\n"
               "A tour of arrays and pytrees, then an MLP forward traced, compiled and run on\n"
               "DIR/digits.csv.gz, and a few gradient steps.\n\n"
               "options:\n"
               "  --data DIR   directory holding digits.csv.gz (default: $NABLA_DATA, else the\n"
               "               data sets installed with nabla, else ./data)\n");
}

/* 0: go on; -1: --help shown; 2: bad usage (message printed). */
static int demo_parse_args(int argc, char **argv, demo_data *d) {
    d->dir = NULL;
    d->path[0] = '\0';
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            demo_usage(stdout);
            return -1;
        }
        if (strcmp(a, "--data") != 0) {
            fprintf(stderr, "nabla demo: unknown option '%s' (nabla demo --help lists them)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "nabla demo: --data wants a value: --data DIR\n");
            return 2;
        }
        if (cli_dir_path("demo", a, argv[++i], &d->dir) != 0) {
            return 2;
        }
    }
    return 0;
}

/* `nabla version`, `nabla --version`. */
static int cmd_version(void) {
    char info[512];
    nb_build_info(info, sizeof info, NULL);
    printf("nabla %s (%s build)\n", NB_VERSION_STRING,
           NABLA_BUILD_TYPE[0] != '\0' ? NABLA_BUILD_TYPE : "no build type");
    printf("library: %s\n", info);
    const char *dir = cli_data_dir(), *source = cli_data_dir_source();
    if (source == NULL) {
        printf("data: none found\n");
        cli_data_dir_explain(stdout);
        return 0;
    }
    char cwd[CLI_PATH_MAX];
    bool relative = dir[0] != '/' && getcwd(cwd, sizeof cwd) != NULL;
    printf("data: %s%s%s (%s)\n", relative ? cwd : "", relative ? "/" : "", dir, source);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: nabla <command>\n\n"
               "commands:\n"
               "  train [options]     train an MLP on the UCI digits with Adam (see\n"
               "                      nabla train --help)\n"
               "  ode [options]       fit Lotka-Volterra's parameters to noisy data through an\n"
               "                      adaptive ODE solve (see nabla ode --help)\n"
               "  bench [options]     a reproducible optimizer benchmark: problems x optimizers\n"
               "                      x learning rates x seeds, tables, plots and a digest\n"
               "                      (see nabla bench --help)\n"
               "  demo [--data DIR]   a tour of arrays and pytrees, then an MLP forward on\n"
               "                      DIR/digits.csv.gz\n"
               "  version             the version, build type, BLIS and SLEEF, and the data\n"
               "                      directory (also --version)\n\n"
               "The data sets: --data DIR, else $NABLA_DATA, else those installed with nabla\n"
               "(<prefix>/share/nabla/data), else ./data.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "train") == 0) {
        return nabla_cmd_train(argc - 2, argv + 2);
    }
    if (strcmp(argv[1], "ode") == 0) {
        return nabla_cmd_ode(argc - 2, argv + 2);
    }
    if (strcmp(argv[1], "bench") == 0) {
        return nabla_cmd_bench(argc - 2, argv + 2);
    }
    if (strcmp(argv[1], "demo") == 0) {
        demo_data data;
        int prc = demo_parse_args(argc - 2, argv + 2, &data);
        if (prc != 0) {
            return prc < 0 ? 0 : prc;
        }
        return cmd_demo(&data);
    }
    if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
        if (argc > 2) {
            fprintf(stderr, "nabla %s: takes no arguments, got '%s'\n", argv[1], argv[2]);
            return 2;
        }
        return cmd_version();
    }
    fprintf(stderr, "nabla: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
