/*
 * train.c -- `nabla train`: an MLP trained on the UCI digits with Adam, the way a C user
 * would write it with nabla: the model is a pytree (nabla/nn.h), the optimizer state comes
 * from the gradient template (nabla/optim.h), and forward, loss, backward, Adam and the
 * parameter update are one jitted function whose parameters and state are donated, so every
 * step updates them in place (nb_train_step, nabla/train.h). Shuffled minibatches come from a
 * Threefry key (nabla/data.h); the same seed gives the same final loss, bit for bit, on any thread
 * count.
 *
 * On a terminal a progress bar shows epoch, loss, accuracy, steps/s and an ETA; otherwise
 * (a pipe, a log file) one plain line per epoch. At the end: test accuracy, the number of
 * traces of the train step (1: it never retraced), and the final loss with its bit pattern.
 */
#include "cli.h"
#include "cli_dist.h"
#include "commands.h"

#include <nabla/nabla.h>
#ifdef NABLA_CLI_DIST
#include <nabla/dist.h>
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct train_opts {
    const char *data_dir; /* NULL: cli_data_dir() */
    int64_t epochs, batch, width, depth;
    int64_t micro; /* > 0: data-parallel (nabla/dist.h), that many micro-batches per step */
    double lr, test_fraction;
    uint64_t seed;
    int threads;
    int progress; /* -1 auto (a terminal), 0 plain lines, 1 bar */
} train_opts;

/* On a failed call: "nabla train: <doing>: <the library's message>", then to `done`; `doing`
 * is a local string naming the step under way in plain words. */
#define TCHECK(ctx, expr)                                                                          \
    do {                                                                                           \
        nb_status tcheck_st_ = (expr);                                                             \
        if (tcheck_st_ != NB_OK) {                                                                 \
            cli_fail("train", ctx, tcheck_st_, "%s", doing);                                       \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* ---- the model's functions (traced once) ------------------------------------------------ */

/* loss(params, x, y) = mean softmax cross-entropy of mlp(x) against labels y; aux = the
 * number of correct predictions (i32). */
static nb_status loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    const nb_tree *model = nb_tree_child(args, 0);
    nb_var *x = nb_get(tr, args, "[1]"), *y = nb_get(tr, args, "[2]");
    nb_var *logits = nb_nn_mlp(tr, model, x);
    int64_t classes = nb_var_dim(logits, -1);
    nb_var *logp = nb_log_softmax(logits, -1);
    nb_var *picked =
        nb_sum(nb_mul(logp, nb_one_hot(y, classes, nb_var_dtype(logp))), (int[]){-1}, 1, false);
    nb_var *loss = nb_neg(nb_mean(picked, NULL, 0, false));
    nb_var *correct =
        nb_sum(nb_cast(nb_eq(nb_argmax(logits, -1, false), nb_cast(y, NB_DTYPE_I64)), NB_DTYPE_I32),
               NULL, 0, false);
    nb_tree *pair = NULL;
    nb_status st =
        nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(loss), nb_leaf(correct)}, &pair);
    if (st != NB_OK) {
        return st;
    }
    *out = pair;
    return nb_trace_status(tr);
}

/* correct(params, x, y): the number of rows whose argmax is the label. */
static nb_status eval_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *logits = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *y = nb_cast(nb_get(tr, args, "[2]"), NB_DTYPE_I64);
    return nb_return(
        nb_sum(nb_cast(nb_eq(nb_argmax(logits, -1, false), y), NB_DTYPE_I32), NULL, 0, false), out);
}

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: nabla train [options]\n\n"
            "Train an MLP on the UCI digits (8x8 images, 10 classes) with Adam and report the\n"
            "test accuracy. One jitted, donated train step; same seed, same bits.\n\n"
            "options:\n"
            "  --data DIR        directory holding digits.csv.gz (default: $NABLA_DATA, else\n"
            "                    the data sets installed with nabla, else ./data)\n"
            "  --epochs N        passes over the training set (default 30)\n"
            "  --batch N         rows per step (default 64)\n"
            "  --width N         hidden units per layer (default 128)\n"
            "  --depth N         hidden layers (default 2)\n"
            "  --lr X            Adam's learning rate (default 1e-3)\n"
            "  --test-fraction X share of rows held out for testing (default 0.2)\n"
            "  --seed N          the Threefry seed of split, init and shuffling (default 0)\n"
            "  --threads N       kernel threads, 0 = all cores, at most 256 (default 0; results\n"
            "                    are the same for any count)\n"
            "  --progress MODE   bar, lines or auto (bar on a terminal; default auto)\n"
            "  --micro-batches M data-parallel: each step's batch is cut into M micro-batches\n"
            "                    whose gradients are added in one fixed order, so the result\n"
            "                    is the same bits on any number of processes (1 .. M); the\n"
            "                    default under mpirun is 8 (mpirun -np N nabla train)\n");
}

static int parse_args(int argc, char **argv, train_opts *o) {
    o->data_dir = NULL;
    o->epochs = 30;
    o->batch = 64;
    o->width = 128;
    o->depth = 2;
    o->lr = 1e-3;
    o->test_fraction = 0.2;
    o->seed = 0;
    o->threads = 0;
    o->progress = -1;
    o->micro = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            train_usage(stdout);
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "nabla train: unknown option or missing value: '%s'\n", a);
            train_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n = 0;
        int rc = 0;
        if (strcmp(a, "--data") == 0) {
            rc = cli_dir_path("train", a, v, &o->data_dir);
        } else if (strcmp(a, "--epochs") == 0) {
            rc = cli_i64("train", a, v, 1, INT64_MAX, &o->epochs);
        } else if (strcmp(a, "--batch") == 0) {
            rc = cli_i64("train", a, v, 1, INT64_MAX, &o->batch);
        } else if (strcmp(a, "--width") == 0) { /* nb_nn_mlp_init's limits */
            rc = cli_i64("train", a, v, 1, INT64_C(1) << 31, &o->width);
        } else if (strcmp(a, "--depth") == 0) {
            rc = cli_i64("train", a, v, 0, 4096, &o->depth);
        } else if (strcmp(a, "--lr") == 0) {
            rc = cli_f64("train", a, v, 0.0, 1e3, false, true, &o->lr);
        } else if (strcmp(a, "--test-fraction") == 0) {
            rc = cli_f64("train", a, v, 0.01, 0.9, false, true, &o->test_fraction);
        } else if (strcmp(a, "--seed") == 0) {
            rc = cli_i64("train", a, v, 0, INT64_MAX, &n);
            o->seed = (uint64_t)n;
        } else if (strcmp(a, "--threads") == 0) {
            rc = cli_i64("train", a, v, 0, 256, &n);
            o->threads = (int)n;
        } else if (strcmp(a, "--progress") == 0) {
            rc = cli_progress_mode("train", v, &o->progress);
        } else if (strcmp(a, "--micro-batches") == 0) {
            rc = cli_i64("train", a, v, 1, 65536, &o->micro);
        } else {
            fprintf(stderr, "nabla train: unknown option '%s'\n", a);
            train_usage(stderr);
            rc = 2;
        }
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

static nb_tree *leaf_new(nb_ctx *ctx, nb_array *a) {
    nb_tree *t = NULL;
    if (a != NULL && nb_tree_array(a, &t) != NB_OK) {
        t = NULL;
    }
    (void)ctx;
    return t;
}

static double scalar_of(const nb_tree *t) {
    const nb_array *a = nb_tree_get_array(t);
    if (a == NULL) {
        return NAN;
    }
    if (nb_array_dtype(a) == NB_DTYPE_F32) {
        return *(const float *)nb_array_data(a);
    }
    if (nb_array_dtype(a) == NB_DTYPE_I32) {
        return *(const int32_t *)nb_array_data(a);
    }
    return *(const double *)nb_array_data(a);
}

int nabla_cmd_train(int argc, char **argv) {
    train_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc != 0) {
        return prc < 0 ? 0 : prc;
    }
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = o.threads;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        fprintf(stderr, "nabla train: cannot create a context\n");
        return 1;
    }
    int rc = 1;
    /* data-parallel: --micro-batches, or launched by mpirun (8 micro-batches) */
    nb_dist *dist = NULL;
    int rank = 0, n_proc = 1;
    int64_t first = 0, count = 1, mrows = o.batch; /* this process's micro-batches */
    if (o.micro > 0 || cli_dist_launched()) {
        o.micro = o.micro > 0 ? o.micro : 8;
        int drc = cli_dist_open("train", ctx, &dist);
        if (drc != 0) {
            nb_ctx_destroy(ctx);
            return drc;
        }
#ifdef NABLA_CLI_DIST
        rank = nb_dist_rank(dist);
        n_proc = nb_dist_size(dist);
#endif
        if (rank != 0 && freopen("/dev/null", "w", stdout) == NULL) { /* rank 0 reports */
            fprintf(stderr, "nabla train: rank %d: cannot quiet its output\n", rank);
        }
        const char *bad = o.batch % o.micro != 0 ? "does not divide --batch"
                          : o.micro < n_proc     ? "is fewer than the processes"
                                                 : NULL;
        if (bad != NULL) {
            if (rank == 0) {
                fprintf(stderr,
                        "nabla train: --micro-batches %lld %s (%lld rows, %d process%s): use a "
                        "divisor of the batch, at least the number of processes\n",
                        (long long)o.micro, bad, (long long)o.batch, n_proc,
                        n_proc == 1 ? "" : "es");
            }
            cli_dist_close(dist);
            nb_ctx_destroy(ctx);
            return 2;
        }
        mrows = o.batch / o.micro;
    }
#ifdef NABLA_CLI_DIST
    nb_dist_train *dtrain = NULL;
#endif
    /* processes agree that each set up before the first collective: a process that failed
     * (say, no data file on its machine) makes all stop at once rather than at a timeout */
    bool agreed = false;
    nb_array *x = NULL, *y = NULL, *key = NULL, *k[3] = {NULL, NULL, NULL}, *xtr = NULL,
             *ytr = NULL, *xte = NULL, *yte = NULL, *xb = NULL, *yb = NULL;
    nb_tree *model = NULL, *opt = NULL, *state = NULL, *xb_leaf = NULL, *yb_leaf = NULL,
            *batch = NULL, *xte_leaf = NULL, *yte_leaf = NULL;
    nb_fn *loss_fn = NULL, *step = NULL, *eval_fn = NULL;
    nb_batcher *batcher = NULL;
    const char *data_dir = o.data_dir != NULL ? o.data_dir : cli_data_dir();
    char path[CLI_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/digits.csv.gz", data_dir);
    nb_csv_opts csv = nb_csv_opts_default();
    nb_status lst = nb_csv_load(ctx, path, &csv, &x, &y);
    if (lst != NB_OK) {
        cli_fail("train", ctx, lst, "cannot read the data set %s", path);
        if (o.data_dir == NULL) {
            cli_data_dir_explain(stderr);
        }
        goto done;
    }
    int64_t features = nb_array_shape(x)[1];
    int64_t classes = 10;

    /* three independent streams from one seed: split, init, shuffling */
    const char *doing = "cannot split the data";
    TCHECK(ctx, nb_random_key(ctx, o.seed, &key));
    TCHECK(ctx, nb_random_split_keys(key, 3, k)); /* k[0] split, k[1] init, k[2] shuffling */

    TCHECK(ctx, nb_data_split(x, y, k[0], o.test_fraction, &xtr, &ytr, &xte, &yte));
    TCHECK(ctx, nb_data_standardize(xtr, xte, NULL, NULL));
    int64_t n_train = nb_array_shape(xtr)[0], n_test = nb_array_shape(xte)[0];
    if (o.batch > n_train) {
        fprintf(stderr, "nabla train: --batch %lld is more than the %lld training rows\n",
                (long long)o.batch, (long long)n_train);
        rc = 2;
        goto done;
    }

    doing = "cannot build the model";
    TCHECK(ctx, nb_nn_mlp_init(ctx, features, classes, o.width, o.depth, NULL, NB_DTYPE_F32, k[1],
                               &model));
    int64_t n_params = 0;
    TCHECK(ctx, nb_nn_count_params(model, &n_params));
    TCHECK(ctx, nb_optim_adam(ctx, o.lr, NULL, &opt));

    /* the step: value_and_grad of the loss, Adam's update, apply_updates -- jitted once,
     * with the parameters and Adam's state donated (updated in place every step) */
    doing = "cannot build the train step";
    TCHECK(ctx, nb_fn_create(ctx, "loss", loss_body, NULL, &loss_fn));
    nb_train_opts to = nb_train_opts_default();
    to.has_aux = true;
    to.jit.max_traces = 1; /* a retrace would be a bug: make it an error */
    if (dist == NULL) {
        TCHECK(ctx, nb_train_step(loss_fn, opt, &to, &step));
        TCHECK(ctx, nb_train_init(step, model, &state));
    }
#ifdef NABLA_CLI_DIST
    else {
        /* the same step over processes: each micro-batch's gradient, their sum in one
         * fixed order, Adam's update on every process */
        TCHECK(ctx, nb_dist_train_create(dist, loss_fn, opt, &to, o.micro, &dtrain));
        agreed = true;
        if (cli_dist_agree(dist, 0) != 0) {
            fprintf(stderr, "nabla train: rank %d: another process failed to set up\n", rank);
            goto done;
        }
        TCHECK(ctx, nb_dist_train_init(dtrain, &model, &state));
        TCHECK(ctx, nb_dist_parts(dist, o.micro, &first, &count));
    }
#endif
    TCHECK(ctx, nb_fn_create(ctx, "evaluate", eval_body, NULL, &eval_fn));

    /* batches land in two arrays made once */
    doing = "cannot set up the batches";
    int64_t local_rows = dist != NULL ? count * mrows : o.batch; /* this process's rows */
    TCHECK(ctx,
           nb_array_zeros(ctx, nb_array_dtype(xtr), 2, (int64_t[]){local_rows, features}, &xb));
    TCHECK(ctx, nb_array_zeros(ctx, nb_array_dtype(ytr), 1, (int64_t[]){local_rows}, &yb));
    xb_leaf = leaf_new(ctx, xb);
    yb_leaf = leaf_new(ctx, yb);
    TCHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){xb_leaf, yb_leaf}, &batch));
    TCHECK(ctx, nb_batcher_create(xtr, ytr, k[2], o.batch, NULL, &batcher));
    int64_t n_batches = nb_batcher_num_batches(batcher);

    printf("nabla train: UCI digits (%s), %lld train / %lld test rows, %lld features, %lld "
           "classes\n",
           path, (long long)n_train, (long long)n_test, (long long)features, (long long)classes);
    printf("  MLP %lld-%lldx%lld-%lld (relu), %lld parameters; Adam lr %g; batch %lld; "
           "%lld epochs; seed %llu; %d thread%s\n",
           (long long)features, (long long)o.width, (long long)o.depth, (long long)classes,
           (long long)n_params, o.lr, (long long)o.batch, (long long)o.epochs,
           (unsigned long long)o.seed, nb_ctx_n_threads(ctx),
           nb_ctx_n_threads(ctx) == 1 ? "" : "s");
    if (dist != NULL) {
        printf("  data-parallel: %d process%s, %lld micro-batches of %lld rows per step, added in "
               "one fixed order (the same bits for any number of processes)\n",
               n_proc, n_proc == 1 ? "" : "es", (long long)o.micro, (long long)mrows);
    }

    cli_progress prog;
    cli_progress_start(&prog, o.progress,
                       o.epochs > INT64_MAX / n_batches ? INT64_MAX : o.epochs * n_batches);
    prog.width = 24;
    double t0 = prog.t0, loss = NAN;
    float last_loss = NAN;
    int64_t steps = 0;
    doing = "training failed";
    for (int64_t e = 0; e < o.epochs; e++) {
        TCHECK(ctx, nb_batcher_epoch(batcher, e));
        double loss_sum = 0.0;
        int64_t correct = 0, seen = 0, rows = 0;
        for (int64_t b = 0;; b++) {
            TCHECK(ctx, nb_batcher_next_rows(batcher, first * mrows, local_rows, xb, yb, &rows));
            if (rows == 0) {
                break;
            }
            nb_tree *aux = NULL; /* the number of correct rows */
            double l = 0.0;
            if (dist == NULL) {
                TCHECK(ctx, nb_train_run(step, &model, &state, batch, &l, &aux));
            }
#ifdef NABLA_CLI_DIST
            else {
                TCHECK(ctx, nb_dist_train_run(dtrain, &model, &state, batch, &l, &aux));
            }
#endif
            last_loss = (float)l;
            loss_sum += last_loss;
            correct += (int64_t)scalar_of(aux);
            nb_tree_destroy(aux);
            seen += o.batch; /* aux counts the whole batch's correct rows */
            steps++;
            cli_progress_update(
                &prog, steps, "epoch %lld/%lld  loss %.4f  acc %5.1f%%  %.0f steps/s",
                (long long)e + 1, (long long)o.epochs, loss_sum / (double)(b + 1),
                100.0 * (double)correct / (double)seen, (double)steps / (cli_now_s() - t0));
        }
        loss = loss_sum / (double)n_batches;
        if (!prog.bar) { /* a pipe or a log file: one plain line per epoch */
            cli_progress_line(
                &prog, "  epoch %3lld/%lld  loss %.4f  train acc %5.1f%%  %.0f steps/s",
                (long long)e + 1, (long long)o.epochs, loss, 100.0 * (double)correct / (double)seen,
                (double)steps / (cli_now_s() - t0));
        }
    }
    double elapsed = cli_now_s() - t0;
    cli_progress_end(&prog);

    /* test accuracy: eval_fn((model, x, y)) on the test rows */
    xte_leaf = leaf_new(ctx, xte);
    yte_leaf = leaf_new(ctx, yte);
    nb_tree *test = NULL, *eres = NULL;
    doing = "cannot evaluate the model on the test rows";
    TCHECK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){xte_leaf, yte_leaf}, &test));
    nb_status est = nb_train_eval(eval_fn, model, test, &eres);
    nb_tree_destroy(test);
    TCHECK(ctx, est);
    int64_t test_correct = (int64_t)scalar_of(eres);
    nb_tree_destroy(eres);
    nb_fn_stats stats;
    if (dist == NULL) {
        TCHECK(ctx, nb_fn_stats_get(step, &stats));
    }
#ifdef NABLA_CLI_DIST
    else {
        TCHECK(ctx, nb_dist_train_stats(dtrain, &stats, NULL));
    }
#endif
    uint32_t bits = 0;
    memcpy(&bits, &last_loss, sizeof bits);
    printf("  %lld steps in %.2f s (%.0f steps/s)\n", (long long)steps, elapsed,
           (double)steps / elapsed);
    printf("test accuracy: %.2f%% (%lld of %lld)\n", 100.0 * (double)test_correct / (double)n_test,
           (long long)test_correct, (long long)n_test);
    printf("train step traces: %lld (calls %lld, cache hits %lld)\n", (long long)stats.n_traces,
           (long long)stats.n_calls, (long long)stats.n_hits);
    printf("final loss: %.9g (bits 0x%08x)\n", (double)last_loss, (unsigned)bits);
#ifdef NABLA_CLI_DIST
    nb_dist_stats ds;
    if (dist != NULL && nb_dist_stats_get(dist, &ds) == NB_OK && n_proc > 1) {
        printf("communication (rank 0): %lld collectives, %.3f s waiting in them, %.2f MB sent, "
               "%.2f MB received\n",
               (long long)ds.calls, ds.wait_s, (double)ds.bytes_sent / 1e6,
               (double)ds.bytes_received / 1e6);
    }
#endif
    rc = 0;
done:
    if (dist != NULL && !agreed) {
        (void)cli_dist_agree(dist, 1); /* the others are waiting for this one's word */
    }
    nb_batcher_destroy(batcher);
    nb_fn_destroy(eval_fn);
    nb_fn_destroy(step);
#ifdef NABLA_CLI_DIST
    nb_dist_train_destroy(dtrain);
#endif
    nb_fn_destroy(loss_fn);
    nb_tree *trees[] = {model, opt, state, xb_leaf, yb_leaf, batch, xte_leaf, yte_leaf};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array *arrays[] = {x, y, key, k[0], k[1], k[2], xtr, ytr, xte, yte, xb, yb};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        nb_array_destroy(arrays[i]);
    }
    cli_dist_close(dist);
    nb_ctx_destroy(ctx);
    return rc;
}
