/*
 * bench_dist.c -- data-parallel training steps over MPI (nabla/dist.h). Run without
 * arguments (as `make bench` does) it is the driver: it runs itself under mpirun in each
 * configuration below, three rounds interleaved, and prints the medians side by side:
 *
 *   bench_dist plain  MODEL THREADS   one process, nb_train_step on the whole batch
 *   bench_dist dist   MODEL THREADS   nb_dist_train_run, 8 micro-batches (under mpirun -np N)
 *   bench_dist reduce MODEL           the gradient's reduction alone, under mpirun -np N:
 *                                     nb_dist_reduce_parts over the 8 micro-batch gradients
 *                                     against MPI_Allreduce of each process's partial sum
 *                                     (what PyTorch DDP does: fast, order set by N)
 *
 * MODEL: digits (MLP 64-128-128-10 on the UCI digits, batch 64, as `nabla train`) or mlp784
 * (784-256-256-10 on synthetic N(0,1) inputs and uniform labels, batch 128). Rank 0 prints
 * "key value" lines: the median step (or reduction) time in microseconds over 200 timed
 * repetitions after 20 warm-up ones, and per step the collectives' wait and the bytes this
 * process sent and received.
 */
#include <nabla/dist.h>
#include <nabla/nabla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { WARM = 20, REPS = 200, MAX_PARTS = 64 };
static int PARTS = 8; /* micro-batches per step (argv[5]) */

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CK(expr)                                                                                   \
    do {                                                                                           \
        nb_status ck_st_ = (expr);                                                                 \
        if (ck_st_ != NB_OK) {                                                                     \
            fprintf(stderr, "bench_dist: %s: %s\n", #expr, nb_ctx_errmsg(ctx));                    \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

static nb_status loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *logits = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *logp = nb_log_softmax(logits, -1);
    nb_var *oh = nb_one_hot(nb_get(tr, args, "[2]"), 10, nb_var_dtype(logp));
    return nb_return(
        nb_neg(nb_mean(nb_sum(nb_mul(logp, oh), (int[]){-1}, 1, false), NULL, 0, false)), out);
}

typedef struct model {
    int64_t features, width, depth, batch;
    nb_array *x, *y; /* the training rows */
} model;

static void load_model(nb_ctx *ctx, const char *name, const char *data, model *m) {
    memset(m, 0, sizeof *m);
    nb_array *key = NULL;
    CK(nb_random_key(ctx, 1, &key));
    if (strcmp(name, "digits") == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/digits.csv.gz", data);
        CK(nb_csv_load(ctx, path, NULL, &m->x, &m->y));
        CK(nb_data_standardize(m->x, NULL, NULL, NULL));
        m->features = 64;
        m->width = 128;
        m->depth = 2;
        m->batch = 64;
    } else {
        int64_t n = 2048;
        nb_array *k[2] = {NULL, NULL}, *u = NULL;
        CK(nb_random_split_keys(key, 2, k));
        CK(nb_random_normal(k[0], NB_DTYPE_F32, 2, (int64_t[]){n, 784}, &m->x));
        CK(nb_random_uniform(k[1], NB_DTYPE_F32, 1, (int64_t[]){n}, 0.0, 10.0, &u));
        CK(nb_array_cast(u, NB_DTYPE_I32, &m->y));
        nb_array_destroy(u);
        nb_array_destroy(k[0]);
        nb_array_destroy(k[1]);
        m->features = 784;
        m->width = 256;
        m->depth = 2;
        m->batch = 128;
    }
    nb_array_destroy(key);
}

/* ---- the driver ---------------------------------------------------------------------- */

typedef struct run_cfg {
    const char *label, *mode;
    int np, threads, parts;
} run_cfg;

static const run_cfg k_runs[] = {
    {"1 process, 2 threads, nb_train_step", "plain", 1, 2, 8},
    {"1 process, 1 thread, nb_train_step", "plain", 1, 1, 8},
    {"1 process, 1 thread, nb_dist_train, 8 micro-batches", "dist", 1, 1, 8},
    {"2 processes, 1 thread each, nb_dist_train, 8 micro-batches", "dist", 2, 1, 8},
    {"2 processes, 1 thread each, nb_dist_train, 2 micro-batches", "dist", 2, 1, 2},
    {"2 processes: reduction alone, 8 micro-batches", "reduce", 2, 1, 8},
};
enum { N_RUNS = sizeof k_runs / sizeof k_runs[0], ROUNDS = 3, N_KEYS = 8 };
static const char *const k_keys[N_KEYS] = {
    "step_us",         "wait_us_per_step", "sent_bytes_per_step", "received_bytes_per_step",
    "reduce_parts_us", "mpi_allreduce_us", "sent_bytes_per_call", "elements"};

static int drive(const char *self) {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("bench_dist: SKIP: mpirun not found (Debian: openmpi-bin)\n");
        return 0;
    }
    static const char *const models[2] = {"digits", "mlp784"};
    static double v[2][N_RUNS][N_KEYS][ROUNDS];
    for (int mi = 0; mi < 2; mi++) {
        for (int rd = 0; rd < ROUNDS; rd++) {
            for (int r = 0; r < N_RUNS; r++) {
                char cmd[8192];
                snprintf(cmd, sizeof cmd,
                         "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                         "OMPI_MCA_btl_vader_single_copy_mechanism=none "
                         "mpirun --oversubscribe --bind-to none -np %d '%s' %s %s %d data %d",
                         k_runs[r].np, self, k_runs[r].mode, models[mi], k_runs[r].threads,
                         k_runs[r].parts);
                FILE *p = popen(cmd, "r");
                if (p == NULL) {
                    perror("bench_dist: popen");
                    return 1;
                }
                char line[512];
                while (fgets(line, sizeof line, p) != NULL) {
                    char key[128];
                    double x = 0;
                    if (sscanf(line, "%127s %lf", key, &x) != 2) {
                        continue;
                    }
                    for (int k = 0; k < N_KEYS; k++) {
                        if (strcmp(key, k_keys[k]) == 0) {
                            v[mi][r][k][rd] = x;
                        }
                    }
                }
                if (pclose(p) != 0) {
                    fprintf(stderr, "bench_dist: '%s' failed\n", cmd);
                    return 1;
                }
            }
        }
    }
    printf("# bench_dist: data-parallel steps over MPI on this machine (medians of 3 rounds of "
           "200 steps)\n\n");
    for (int mi = 0; mi < 2; mi++) {
        printf("%s (%s):\n\n| run | step us | vs 1 process 2 threads | wait us/step | "
               "sent KB/step | received KB/step |\n|---|---|---|---|---|---|\n",
               models[mi],
               mi == 0 ? "MLP 64-128-128-10, batch 64" : "MLP 784-256-256-10, batch 128");
        double base = median(v[mi][0][0], ROUNDS);
        for (int r = 0; r < N_RUNS - 1; r++) {
            double s = median(v[mi][r][0], ROUNDS);
            printf("| %s | %.1f | %.2fx | %.1f | %.1f | %.1f |\n", k_runs[r].label, s, base / s,
                   median(v[mi][r][1], ROUNDS), median(v[mi][r][2], ROUNDS) / 1e3,
                   median(v[mi][r][3], ROUNDS) / 1e3);
        }
        const int rr = N_RUNS - 1;
        printf("\nthe gradient's reduction alone, 2 processes, %.0f f32 elements: "
               "nb_dist_reduce_parts (fixed tree over 8 parts) %.1f us, %.1f KB sent per "
               "process; MPI_Allreduce of a partial sum (order set by the number of "
               "processes) %.1f us\n\n",
               median(v[mi][rr][7], ROUNDS), median(v[mi][rr][4], ROUNDS),
               median(v[mi][rr][6], ROUNDS) / 1e3, median(v[mi][rr][5], ROUNDS));
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            fprintf(stderr, "usage: bench_dist [plain|dist|reduce digits|mlp784 [threads]]\n");
            return 2;
        }
        self[n] = '\0';
        return drive(self);
    }
    const char *mode = argv[1], *name = argv[2];
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    const char *data = argc > 4 ? argv[4] : "data";
    PARTS = argc > 5 ? atoi(argv[5]) : 8;
    if (PARTS < 1 || PARTS > MAX_PARTS) {
        fprintf(stderr, "bench_dist: micro-batches %d out of 1 .. %d\n", PARTS, MAX_PARTS);
        return 2;
    }
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    nb_ctx_opts co = nb_ctx_opts_default();
    co.n_threads = threads;
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(&co, &ctx) != NB_OK) {
        return 1;
    }
    nb_dist *d = NULL;
    CK(nb_dist_create(ctx, MPI_COMM_WORLD, NULL, &d));
    int size = nb_dist_size(d);
    model m;
    load_model(ctx, name, data, &m);
    nb_array *key = NULL, *k[2] = {NULL, NULL};
    CK(nb_random_key(ctx, 0, &key));
    CK(nb_random_split_keys(key, 2, k));
    nb_tree *params = NULL, *opt = NULL, *state = NULL;
    CK(nb_nn_mlp_init(ctx, m.features, 10, m.width, m.depth, NULL, NB_DTYPE_F32, k[0], &params));
    CK(nb_optim_adam(ctx, 1e-3, NULL, &opt));
    nb_fn *loss = NULL;
    CK(nb_fn_create(ctx, "loss", loss_body, NULL, &loss));
    bool plain = strcmp(mode, "plain") == 0, reduce = strcmp(mode, "reduce") == 0;
    int64_t first = 0, count = 1, mrows = m.batch / PARTS;
    if (!plain) {
        CK(nb_dist_parts(d, PARTS, &first, &count));
    }
    int64_t rows = plain ? m.batch : count * mrows;
    nb_batcher *b = NULL;
    CK(nb_batcher_create(m.x, m.y, k[1], m.batch, NULL, &b));
    nb_array *xb = NULL, *yb = NULL;
    CK(nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){rows, m.features}, &xb));
    CK(nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){rows}, &yb));
    nb_tree *xl = NULL, *yl = NULL, *batch = NULL;
    CK(nb_tree_array(xb, &xl));
    CK(nb_tree_array(yb, &yl));
    CK(nb_tree_tuple(ctx, 2, (nb_tree *[]){xl, yl}, &batch));
    nb_fn *step = NULL;
    nb_dist_train *tr = NULL;
    nb_train_opts to = nb_train_opts_default();
    if (plain) {
        CK(nb_train_step(loss, opt, &to, &step));
        CK(nb_train_init(step, params, &state));
    } else {
        CK(nb_dist_train_create(d, loss, opt, &to, PARTS, &tr));
        CK(nb_dist_train_init(tr, &params, &state));
    }
    double t[REPS];
    int64_t epoch = 0, nb = nb_batcher_num_batches(b), got = 0;
    nb_dist_stats s0, s1;
    CK(nb_batcher_epoch(b, 0));
    if (reduce) {
        /* the 8 micro-batch gradients of one batch, then the reductions alone */
        nb_fn *g = NULL;
        CK(nb_grad(loss, NULL, &g));
        nb_tree *parts[MAX_PARTS] = {NULL};
        CK(nb_batcher_next_rows(b, first * mrows, rows, xb, yb, &got));
        for (int64_t i = 0; i < count; i++) {
            nb_array *xv = NULL, *yv = NULL;
            CK(nb_array_rows(xb, i * mrows, (i + 1) * mrows, &xv));
            CK(nb_array_rows(yb, i * mrows, (i + 1) * mrows, &yv));
            nb_tree *a[3] = {params, NULL, NULL}, *args = NULL;
            CK(nb_tree_array(xv, &a[1]));
            CK(nb_tree_array(yv, &a[2]));
            CK(nb_tree_tuple(ctx, 3, a, &args));
            CK(nb_fn_call(g, args, &parts[i]));
            nb_tree_destroy(args);
            nb_tree_destroy(a[1]);
            nb_tree_destroy(a[2]);
            nb_array_destroy(xv);
            nb_array_destroy(yv);
        }
        nb_tree *leaves = NULL;
        int64_t n_el = 0;
        CK(nb_tree_flatten(parts[0], &leaves, NULL));
        for (int64_t i = 0; i < nb_tree_len(leaves); i++) {
            n_el += nb_array_size(nb_tree_get_array(nb_tree_child(leaves, i)));
        }
        nb_tree_destroy(leaves);
        float *vec = calloc((size_t)n_el, sizeof *vec);
        double tm[REPS];
        CK(nb_dist_stats_get(d, &s0));
        for (int r = 0; r < WARM + REPS; r++) {
            double a = now_us();
            nb_tree *out = NULL;
            CK(nb_dist_reduce_parts(d, PARTS, (const nb_tree *const *)parts, NB_DIST_SUM, &out));
            double bt = now_us();
            nb_tree_destroy(out);
            /* DDP's way: MPI_Allreduce of each process's partial sum (its packing and its
             * local additions not timed: the communication alone) */
            double c = now_us();
            MPI_Allreduce(MPI_IN_PLACE, vec, (int)n_el, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double e = now_us();
            if (r == WARM - 1) {
                CK(nb_dist_stats_get(d, &s0));
            }
            if (r >= WARM) {
                t[r - WARM] = bt - a;
                tm[r - WARM] = e - c;
            }
        }
        CK(nb_dist_stats_get(d, &s1));
        if (rank == 0) {
            printf("elements %lld\nprocesses %d\nreduce_parts_us %.1f\nmpi_allreduce_us %.1f\n"
                   "sent_bytes_per_call %.0f\nreceived_bytes_per_call %.0f\n",
                   (long long)n_el, size, median(t, REPS), median(tm, REPS),
                   (double)(s1.bytes_sent - s0.bytes_sent) / REPS,
                   (double)(s1.bytes_received - s0.bytes_received) / REPS);
        }
        free(vec);
        for (int64_t i = 0; i < count; i++) {
            nb_tree_destroy(parts[i]);
        }
        nb_fn_destroy(g);
    } else {
        for (int r = 0; r < WARM + REPS; r++) {
            CK(nb_batcher_next_rows(b, first * mrows, rows, xb, yb, &got));
            if (got == 0) {
                CK(nb_batcher_epoch(b, ++epoch % nb));
                CK(nb_batcher_next_rows(b, first * mrows, rows, xb, yb, &got));
            }
            if (r == WARM) {
                CK(nb_dist_stats_get(d, &s0));
            }
            double a = now_us();
            if (plain) {
                CK(nb_train_run(step, &params, &state, batch, NULL, NULL));
            } else {
                CK(nb_dist_train_run(tr, &params, &state, batch, NULL, NULL));
            }
            if (r >= WARM) {
                t[r - WARM] = now_us() - a;
            }
        }
        CK(nb_dist_stats_get(d, &s1));
        if (rank == 0) {
            printf("processes %d\nthreads %d\nstep_us %.1f\nwait_us_per_step %.1f\n"
                   "sent_bytes_per_step %.0f\nreceived_bytes_per_step %.0f\n",
                   plain ? 1 : size, threads, median(t, REPS), 1e6 * (s1.wait_s - s0.wait_s) / REPS,
                   (double)(s1.bytes_sent - s0.bytes_sent) / REPS,
                   (double)(s1.bytes_received - s0.bytes_received) / REPS);
        }
    }
    nb_dist_train_destroy(tr);
    nb_fn_destroy(step);
    nb_fn_destroy(loss);
    nb_batcher_destroy(b);
    nb_tree *trees[] = {params, opt, state, xl, yl, batch};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array *arrays[] = {key, k[0], k[1], xb, yb, m.x, m.y};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        nb_array_destroy(arrays[i]);
    }
    nb_dist_destroy(d);
    nb_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
