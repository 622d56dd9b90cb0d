/*
 * nabla -- the command-line tool.
 *
 *     nabla demo       a tour of arrays and pytrees (what `make run` shows)
 *     nabla version    the library version
 *
 * Later issues add `train` and `bench`.
 */
#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define CHECK(ctx, expr)                                                                           \
    do {                                                                                           \
        nb_status check_st_ = (expr);                                                              \
        if (check_st_ != NB_OK) {                                                                  \
            fprintf(stderr, "nabla: %s failed: %s\n  %s\n", #expr, nb_status_name(check_st_),      \
                    nb_ctx_errmsg(ctx));                                                           \
            return 1;                                                                              \
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

static int cmd_demo(void) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        fprintf(stderr, "nabla: cannot create a context\n");
        return 1;
    }
    char info[256];
    CHECK(ctx, nb_build_info(info, sizeof info, NULL));
    printf("%s\n-- a tour of arrays and pytrees\n\n", info);

    /* Arrays. */
    nb_array *r = NULL, *m = NULL, *lin = NULL, *eye = NULL, *ints = NULL;
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
    nb_ctx_stats stats;
    CHECK(ctx, nb_ctx_stats_get(ctx, &stats));
    printf("\nlive objects at the end: %lld arrays, %lld trees (peak %zu bytes allocated)\n",
           (long long)stats.live_arrays, (long long)stats.live_trees, stats.bytes_peak);
    nb_ctx_destroy(ctx);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: nabla <command>\n\n"
               "commands:\n"
               "  demo      a tour of arrays and pytrees\n"
               "  version   print the library version\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "demo") == 0) {
        return cmd_demo();
    }
    if (strcmp(argv[1], "version") == 0) {
        char info[256];
        nb_build_info(info, sizeof info, NULL);
        printf("%s\n", info);
        return 0;
    }
    fprintf(stderr, "nabla: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
