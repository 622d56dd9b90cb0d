/*
 * dist_train.c -- data-parallel training of an MLP on the UCI digits with nabla/dist.h, run
 * by run_dist.sh under `mpirun -np N`:
 *
 *   dist_train <data dir> <steps> [--save-at K FILE] [--resume FILE]
 *
 * Global batch 64 rows cut into 8 micro-batches of 8; each process reads only its
 * micro-batches' rows (nb_batcher_next_rows) and nb_dist_train_run reduces the gradients
 * in the fixed tree. Rank 0 prints "params <digest> loss <%a> correct <n>"; the script
 * checks the line is the same for N = 1, 2, 3, 4, and for a run checkpointed on 4
 * processes and resumed on 2. Every process checks that all processes hold the same
 * parameter bits (an all-gather of their digests).
 */
#include <nabla/dist.h>
#include <nabla/nabla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 64, PARTS = 8 };

static nb_status loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *logits = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *y = nb_get(tr, args, "[2]");
    nb_var *logp = nb_log_softmax(logits, -1);
    nb_var *picked =
        nb_sum(nb_mul(logp, nb_one_hot(y, 10, nb_var_dtype(logp))), (int[]){-1}, 1, false);
    nb_var *loss = nb_neg(nb_mean(picked, NULL, 0, false));
    nb_var *correct =
        nb_sum(nb_cast(nb_eq(nb_argmax(logits, -1, false), nb_cast(y, NB_DTYPE_I64)), NB_DTYPE_I32),
               NULL, 0, false);
    nb_status st =
        nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(loss), nb_leaf(correct)}, out);
    return st != NB_OK ? st : nb_trace_status(tr);
}

static uint64_t digest(const nb_tree *t) {
    uint64_t h = 1469598103934665603ull;
    nb_tree *list = NULL;
    nb_tree_flatten(t, &list, NULL);
    for (int64_t k = 0; k < nb_tree_len(list); k++) {
        const nb_array *a = nb_tree_get_array(nb_tree_child(list, k));
        const unsigned char *p = nb_array_data(a);
        for (size_t i = 0; i < nb_array_nbytes(a); i++) {
            h = (h ^ p[i]) * 1099511628211ull;
        }
    }
    nb_tree_destroy(list);
    return h;
}

#define CK(expr)                                                                                   \
    do {                                                                                           \
        nb_status ck_st_ = (expr);                                                                 \
        if (ck_st_ != NB_OK) {                                                                     \
            printf("FAIL rank %d: %s: %s: %s\n", rank, #expr, nb_status_name(ck_st_),              \
                   nb_ctx_errmsg(ctx));                                                            \
            fflush(stdout);                                                                        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 3) {
        fprintf(stderr, "usage: dist_train DATA_DIR STEPS [--save-at K FILE] [--resume FILE]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int64_t steps = atoll(argv[2]), save_at = -1;
    const char *save = NULL, *resume = NULL;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--save-at") == 0 && i + 2 < argc) {
            save_at = atoll(argv[i + 1]);
            save = argv[i + 2];
            i += 2;
        } else if (strcmp(argv[i], "--resume") == 0 && i + 1 < argc) {
            resume = argv[++i];
        }
    }
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = 1;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    nb_dist *d = NULL;
    CK(nb_dist_create(ctx, MPI_COMM_WORLD, NULL, &d));
    char path[4096];
    snprintf(path, sizeof path, "%s/digits.csv.gz", argv[1]);
    nb_array *x = NULL, *y = NULL, *key = NULL, *k[3] = {NULL, NULL, NULL};
    nb_array *xtr = NULL, *ytr = NULL, *xte = NULL, *yte = NULL;
    CK(nb_csv_load(ctx, path, NULL, &x, &y));
    CK(nb_random_key(ctx, 0, &key));
    CK(nb_random_split_keys(key, 3, k));
    CK(nb_data_split(x, y, k[0], 0.2, &xtr, &ytr, &xte, &yte));
    CK(nb_data_standardize(xtr, xte, NULL, NULL));
    nb_tree *model = NULL, *opt = NULL, *state = NULL;
    CK(nb_nn_mlp_init(ctx, 64, 10, 32, 1, NULL, NB_DTYPE_F32, k[1], &model));
    CK(nb_optim_adam(ctx, 1e-2, NULL, &opt));
    nb_fn *loss = NULL;
    CK(nb_fn_create(ctx, "loss", loss_body, NULL, &loss));
    nb_train_opts to = nb_train_opts_default();
    to.has_aux = true;
    to.jit.max_traces = 1;
    nb_dist_train *tr = NULL;
    CK(nb_dist_train_create(d, loss, opt, &to, PARTS, &tr));
    CK(nb_dist_train_init(tr, &model, &state));

    int64_t first = 0, count = 0, m = BATCH / PARTS;
    CK(nb_dist_parts(d, PARTS, &first, &count));
    nb_batcher *b = NULL;
    CK(nb_batcher_create(xtr, ytr, k[2], BATCH, NULL, &b));
    int64_t nb = nb_batcher_num_batches(b), start = 0;
    nb_array *xb = NULL, *yb = NULL;
    CK(nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){count * m, 64}, &xb));
    CK(nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){count * m}, &yb));
    nb_tree *batch = NULL, *xl = NULL, *yl = NULL;
    CK(nb_tree_array(xb, &xl));
    CK(nb_tree_array(yb, &yl));
    CK(nb_tree_tuple(ctx, 2, (nb_tree *[]){xl, yl}, &batch));
    if (resume != NULL) {
        nb_tree *p = NULL, *s = NULL;
        CK(nb_checkpoint_load(resume, model, state, &p, &s, NULL, &start));
        nb_tree_destroy(model);
        nb_tree_destroy(state);
        model = p;
        state = s;
        /* the batcher where the run stopped: the epoch, then the batches already used */
        CK(nb_batcher_epoch(b, start / nb));
        for (int64_t i = 0, rows = 0; i < start % nb; i++) {
            CK(nb_batcher_next_rows(b, first * m, count * m, xb, yb, &rows));
        }
    }
    double l = 0;
    int64_t correct = 0;
    for (int64_t s = start; s < steps; s++) {
        if (s % nb == 0) {
            CK(nb_batcher_epoch(b, s / nb));
        }
        int64_t rows = 0;
        CK(nb_batcher_next_rows(b, first * m, count * m, xb, yb, &rows));
        nb_tree *aux = NULL;
        CK(nb_dist_train_run(tr, &model, &state, batch, &l, &aux));
        correct = *(const int32_t *)nb_array_data(nb_tree_get_array(aux));
        nb_tree_destroy(aux);
        if (s + 1 == save_at) {
            CK(nb_dist_checkpoint_save(d, save, model, state, NULL, s + 1));
        }
    }
    /* every process holds the same parameters */
    int64_t h = (int64_t)digest(model);
    nb_array *ha = NULL;
    CK(nb_array_from_data(ctx, NB_DTYPE_I64, 0, NULL, &h, &ha));
    nb_tree *hl = NULL, *hg = NULL;
    CK(nb_tree_array(ha, &hl));
    CK(nb_dist_allgather(d, hl, &hg));
    const int64_t *all = nb_array_data(nb_tree_get_array(hg));
    int same = 1;
    for (int r = 0; r < nb_dist_size(d); r++) {
        same &= all[r] == h;
    }
    nb_fn_stats fs;
    CK(nb_fn_stats_get(loss, &fs));
    if (rank == 0) {
        printf("params %016llx loss %a correct %lld\n", (unsigned long long)h, l,
               (long long)correct);
    }
    if (!same) {
        printf("FAIL rank %d: the processes' parameters differ\n", rank);
    }
    nb_tree *trees[] = {model, opt, state, batch, xl, yl, hl, hg};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array *arrays[] = {x, y, key, k[0], k[1], k[2], xtr, ytr, xte, yte, xb, yb, ha};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        nb_array_destroy(arrays[i]);
    }
    nb_batcher_destroy(b);
    nb_dist_train_destroy(tr);
    nb_fn_destroy(loss);
    nb_dist_destroy(d);
    nb_ctx_destroy(ctx);
    MPI_Finalize();
    return same ? 0 : 1;
}
