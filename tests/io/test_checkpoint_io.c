/*
 * test_checkpoint_io.c -- training checkpoints (nabla/io.h): resuming continues a run bit
 * for bit (200 steps straight vs 100, save, a fresh start that loads, 100 more); a child
 * process SIGKILLed at random points while it saves checkpoints in a loop leaves, after
 * every kill, either the previous or the new complete checkpoint -- never a torn file.
 */
#define _POSIX_C_SOURCE 200809L

#include "nbtest.h"

#include <nabla/nabla.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- a small training run: y = x w_true, params (w f32[4,3], b f32[3]), Adam ------------ */

static nb_status loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *w = nb_get(tr, args, "[0].w"), *b = nb_get(tr, args, "[0].b");
    nb_var *x = nb_get(tr, args, "[1]"), *y = nb_get(tr, args, "[2]");
    nb_var *r = nb_sub(nb_add(nb_matmul(x, w), b), y);
    return nb_return(nb_mean(nb_square(r), NULL, 0, false), out);
}

typedef struct run {
    nb_ctx *ctx;
    nb_fn *grad;
    nb_tree *opt;
    nb_tree *params, *state;
    nb_array *key;
    int64_t step;
} run;

static nb_tree *leaf_take(nb_array *a) {
    nb_tree *t = NULL;
    assert_int_equal(nb_tree_array(a, &t), NB_OK);
    nb_array_destroy(a);
    return t;
}

static void run_start(run *r, nb_ctx *ctx) {
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    nb_fn *f = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "loss", loss_body, NULL, &f));
    NBT_OK(ctx, nb_grad(f, NULL, &r->grad));
    nb_fn_destroy(f);
    NBT_OK(ctx, nb_optim_adam(ctx, 0.05, NULL, &r->opt));
    nb_array *k = NULL, *w = NULL, *b = NULL;
    NBT_OK(ctx, nb_random_key(ctx, 7, &k));
    NBT_OK(ctx, nb_random_normal(k, NB_DTYPE_F32, 2, (int64_t[]){4, 3}, &w));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){3}, &b));
    nb_tree *l[2] = {leaf_take(w), leaf_take(b)};
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, l, &r->params));
    nb_tree_destroy(l[0]);
    nb_tree_destroy(l[1]);
    NBT_OK(ctx, nb_optim_init(r->opt, r->params, &r->state));
    NBT_OK(ctx, nb_random_fold_in(k, 99, &r->key));
    nb_array_destroy(k);
}

static void run_steps(run *r, int n) {
    nb_ctx *ctx = r->ctx;
    for (int s = 0; s < n; s++, r->step++) {
        /* the batch from the run's key and the step: resuming needs both */
        nb_array *kb = NULL, *x = NULL, *noise = NULL, *wt = NULL;
        NBT_OK(ctx, nb_random_fold_in(r->key, (uint32_t)r->step, &kb));
        NBT_OK(ctx, nb_random_normal(kb, NB_DTYPE_F32, 2, (int64_t[]){8, 4}, &x));
        NBT_OK(ctx, nb_random_normal(r->key, NB_DTYPE_F32, 2, (int64_t[]){4, 3}, &wt));
        nb_array_destroy(kb);
        /* y = x wt, computed eagerly in plain C (row-major) */
        float yv[8 * 3];
        const float *xv = nb_array_data(x), *wv = nb_array_data(wt);
        for (int i = 0; i < 8; i++) {
            for (int j = 0; j < 3; j++) {
                float acc = 0;
                for (int k = 0; k < 4; k++) {
                    acc += xv[i * 4 + k] * wv[k * 3 + j];
                }
                yv[i * 3 + j] = acc;
            }
        }
        NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){8, 3}, yv, &noise));
        nb_tree *args = NULL, *g = NULL, *upd = NULL, *ns = NULL, *np = NULL;
        nb_tree *xl = leaf_take(x), *yl = leaf_take(noise);
        NBT_OK(ctx, nb_tree_tuple(ctx, 3, (nb_tree *[]){r->params, xl, yl}, &args));
        NBT_OK(ctx, nb_fn_call(r->grad, args, &g));
        NBT_OK(ctx, nb_optim_update_eager(r->opt, g, r->state, r->params, &upd, &ns));
        NBT_OK(ctx, nb_apply_updates_eager(r->params, upd, &np));
        nb_tree_destroy(r->params);
        nb_tree_destroy(r->state);
        r->params = np;
        r->state = ns;
        nb_tree_destroy(upd);
        nb_tree_destroy(g);
        nb_tree_destroy(args);
        nb_tree_destroy(xl);
        nb_tree_destroy(yl);
        nb_array_destroy(wt);
    }
}

static void run_end(run *r) {
    nb_tree_destroy(r->params);
    nb_tree_destroy(r->state);
    nb_tree_destroy(r->opt);
    nb_array_destroy(r->key);
    nb_fn_destroy(r->grad);
}

static char g_dir[256];

static void test_resume(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/nbt_ckpt_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    char path[512];
    snprintf(path, sizeof path, "%s/run.ckpt", g_dir);
    nb_ctx *ctx = nbt_ctx();
    run straight, first, second;
    run_start(&straight, ctx);
    run_steps(&straight, 200);
    run_start(&first, ctx);
    run_steps(&first, 100);
    NBT_OK(ctx, nb_checkpoint_save(path, first.params, first.state, first.key, first.step));
    run_end(&first);
    /* a fresh start (other initial values, as after a restart), then the checkpoint */
    run_start(&second, ctx);
    nb_tree *p = NULL, *s = NULL;
    nb_array *k = NULL;
    int64_t step = -1;
    NBT_OK(ctx, nb_checkpoint_load(path, second.params, second.state, &p, &s, &k, &step));
    NBT_EQ_I64(step, 100);
    nb_tree_destroy(second.params);
    nb_tree_destroy(second.state);
    nb_array_destroy(second.key);
    second.params = p;
    second.state = s;
    second.key = k;
    second.step = step;
    run_steps(&second, 100);
    bool eq = false;
    NBT_OK(ctx, nb_tree_equal(straight.params, second.params, &eq));
    NBT_TRUE(eq);
    NBT_OK(ctx, nb_tree_equal(straight.state, second.state, &eq));
    NBT_TRUE(eq);
    int64_t c1 = 0, c2 = 0;
    NBT_OK(ctx, nb_optim_count(straight.state, &c1));
    NBT_OK(ctx, nb_optim_count(second.state, &c2));
    NBT_EQ_I64(c1, 200);
    NBT_EQ_I64(c2, 200);
    /* a template of another shape: the path is named */
    nb_array *w5 = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){5, 3}, &w5));
    nb_tree *wl = leaf_take(w5), *bad = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"w"}, &wl, &bad));
    nb_tree_destroy(wl);
    NBT_STATUS(ctx, NB_ERR_STRUCTURE,
               nb_checkpoint_load(path, bad, straight.state, &p, NULL, NULL, NULL));
    NBT_ERRMSG_HAS(ctx, "tensor 'params.w' is f32[4,3] where the template has f32[5,3]");
    nb_tree_destroy(bad);
    run_end(&straight);
    run_end(&second);
    unlink(path);
    rmdir(g_dir);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- SIGKILL while saving -------------------------------------------------------------------- */

enum { KILL_N = 1000 }; /* elements of the checkpoint's array: ~4 KB */

/* params = dict(w = f32[KILL_N] all equal to step), opt_state = dict(m = f32[KILL_N] all
 * equal to -step), step = step: a checkpoint is whole iff all three agree. */
static void make_ckpt(nb_ctx *ctx, int64_t step, nb_tree **params, nb_tree **st) {
    nb_array *w = NULL, *m = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){KILL_N}, (double)step, &w));
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 1, (int64_t[]){KILL_N}, -(double)step, &m));
    nb_tree *wl = leaf_take(w), *ml = leaf_take(m);
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"w"}, &wl, params));
    NBT_OK(ctx, nb_tree_dict(ctx, 1, (const char *[]){"m"}, &ml, st));
    nb_tree_destroy(wl);
    nb_tree_destroy(ml);
}

/* Saves checkpoints from..., forever; writes a byte to ready_fd after the first. */
static void saver_child(const char *path, int64_t from, int ready_fd) {
    nb_ctx *ctx = NULL;
    if (nb_ctx_create(NULL, &ctx) != NB_OK) {
        _exit(3);
    }
    for (int64_t step = from;; step++) {
        if (step == from + 1 && write(ready_fd, "r", 1) != 1) {
            _exit(5);
        }
        nb_tree *p = NULL, *s = NULL;
        make_ckpt(ctx, step, &p, &s);
        if (nb_checkpoint_save(path, p, s, NULL, step) != NB_OK) {
            _exit(4);
        }
        nb_tree_destroy(p);
        nb_tree_destroy(s);
    }
}

static void test_kill_while_saving(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/nbt_kill_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    char path[512];
    snprintf(path, sizeof path, "%s/run.ckpt", g_dir);
    nb_ctx *ctx = nbt_ctx();
    nb_tree *p0 = NULL, *s0 = NULL;
    make_ckpt(ctx, 0, &p0, &s0);
    NBT_OK(ctx, nb_checkpoint_save(path, p0, s0, NULL, 0));
    int64_t last = 0, advanced = 0;
    unsigned seed = 12345;
    int kills = 0;
    for (; kills < 220; kills++) {
        fflush(NULL);
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(ready[0]);
            saver_child(path, last + 1, ready[1]);
        }
        close(ready[1]);
        /* every other kill waits for the child's first save, so that the kills land in later
         * saves too however slow the machine is (a loaded machine can take longer than the
         * window below to start the child); the others may land before or in the first */
        if (kills % 2 == 0) {
            char byte;
            NBT_TRUE(read(ready[0], &byte, 1) == 1);
        }
        /* a pseudo-random moment: 0 to 4 ms later */
        seed = seed * 1103515245u + 12345u;
        struct timespec ts = {0, (long)((seed >> 8) % 4000) * 1000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        close(ready[0]); /* (open until now: the child's write must not fail) */
        NBT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        /* the file: a whole checkpoint, the previous one or a newer one */
        nb_tree *p = NULL, *s = NULL;
        int64_t step = -1;
        NBT_OK(ctx, nb_checkpoint_load(path, p0, s0, &p, &s, NULL, &step));
        NBT_TRUE(step >= last);
        const float *w = nb_array_data(nb_tree_get_array(nb_tree_get(p, "w")));
        const float *m = nb_array_data(nb_tree_get_array(nb_tree_get(s, "m")));
        for (int i = 0; i < KILL_N; i++) {
            if (w[i] != (float)step || m[i] != -(float)step) {
                fail_msg("kill %d: a torn checkpoint (step %lld, w[%d] = %g, m[%d] = %g)", kills,
                         (long long)step, i, w[i], i, m[i]);
            }
        }
        advanced += step > last;
        last = step;
        nb_tree_destroy(p);
        nb_tree_destroy(s);
    }
    /* temporary files of killed saves may remain beside it (never the checkpoint itself) */
    int leftovers = 0;
    DIR *d = opendir(g_dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char q[600];
        snprintf(q, sizeof q, "%s/%s", g_dir, e->d_name);
        if (strcmp(e->d_name, "run.ckpt") != 0) {
            leftovers++;
        }
        unlink(q);
    }
    closedir(d);
    rmdir(g_dir);
    print_message("%d kills while saving: every file whole; the checkpoint advanced after %lld of "
                  "them (to step %lld); %d temporary files left by killed saves\n",
                  kills, (long long)advanced, (long long)last, leftovers);
    NBT_TRUE(kills >= 200);
    NBT_TRUE(advanced >= 50); /* the kills landed mid-loop, not only before the first save */
    nb_tree_destroy(p0);
    nb_tree_destroy(s0);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- allocation failures across a whole run: model, jitted step, steps, save, load ------- */

static nb_fn *g_vg; /* value_and_grad of the MLP loss (per scenario context) */

static nb_status mlp_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *p = nb_nn_mlp(tr, nb_tree_child(args, 0), nb_get(tr, args, "[1]"));
    nb_var *r = nb_sub(p, nb_get(tr, args, "[2]"));
    return nb_return(nb_mean(nb_square(r), NULL, 0, false), out);
}

/* self: the optimizer; args (params, state, x, y) -> (params', state', loss) */
static nb_status train_step(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    nb_tree *gargs = NULL;
    nb_status st = nb_tree_tuple(ctx, 3,
                                 (nb_tree *[]){(nb_tree *)params, (nb_tree *)nb_tree_child(args, 2),
                                               (nb_tree *)nb_tree_child(args, 3)},
                                 &gargs);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *vg = nb_apply(tr, g_vg, gargs);
    nb_tree_destroy(gargs);
    if (vg == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *upd = NULL, *ns = NULL;
    st = nb_optim_update(tr, self, nb_tree_child(vg, 1), state, params, &upd, &ns);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *np = nb_apply_updates(tr, params, upd);
    if (np == NULL) {
        return nb_trace_status(tr);
    }
    return nb_tree_tuple(
        ctx, 3, (nb_tree *[]){(nb_tree *)np, (nb_tree *)ns, (nb_tree *)nb_tree_child(vg, 0)}, out);
}

static char g_fault_path[600];

static nb_status scenario_run(nb_ctx *ctx) {
    nb_array *key = NULL, *x = NULL, *y = NULL;
    nb_tree *model = NULL, *opt = NULL, *tmpl = NULL, *state = NULL, *xl = NULL, *yl = NULL;
    nb_tree *p2 = NULL, *s2 = NULL;
    nb_fn *loss = NULL, *step = NULL, *jstep = NULL;
    g_vg = NULL;
    nb_status st = nb_random_key(ctx, 3, &key);
    if (st == NB_OK) {
        st = nb_nn_mlp_init(ctx, 4, 2, 8, 1, NULL, NB_DTYPE_F32, key, &model);
    }
    if (st == NB_OK) {
        st = nb_optim_adam(ctx, 0.01, NULL, &opt);
    }
    if (st == NB_OK) {
        st = nb_grad_template(model, NULL, &tmpl);
    }
    if (st == NB_OK) {
        st = nb_optim_init(opt, tmpl, &state);
    }
    if (st == NB_OK) {
        st = nb_random_normal(key, NB_DTYPE_F32, 2, (int64_t[]){8, 4}, &x);
    }
    if (st == NB_OK) {
        st = nb_random_normal(key, NB_DTYPE_F32, 2, (int64_t[]){8, 2}, &y);
    }
    if (st == NB_OK) {
        st = nb_tree_array(x, &xl);
    }
    if (st == NB_OK) {
        st = nb_tree_array(y, &yl);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "mlp_loss", mlp_loss, NULL, &loss);
    }
    if (st == NB_OK) {
        st = nb_value_and_grad(loss, NULL, &g_vg);
    }
    if (st == NB_OK) {
        st = nb_fn_create(ctx, "train_step", train_step, opt, &step);
    }
    if (st == NB_OK) {
        st = nb_jit(step, NULL, &jstep);
    }
    for (int i = 0; i < 3 && st == NB_OK; i++) {
        nb_tree *args = NULL, *out = NULL;
        st = nb_tree_tuple(ctx, 4, (nb_tree *[]){model, state, xl, yl}, &args);
        if (st == NB_OK) {
            st = nb_fn_call(jstep, args, &out);
        }
        if (st == NB_OK) {
            nb_tree *np = nb_tree_retain((nb_tree *)nb_tree_child(out, 0));
            nb_tree *ns = nb_tree_retain((nb_tree *)nb_tree_child(out, 1));
            nb_tree_destroy(model);
            nb_tree_destroy(state);
            model = np;
            state = ns;
        }
        nb_tree_destroy(out);
        nb_tree_destroy(args);
    }
    if (st == NB_OK) {
        st = nb_checkpoint_save(g_fault_path, model, state, key, 3);
    }
    if (st == NB_OK) {
        st = nb_checkpoint_load(g_fault_path, model, state, &p2, &s2, NULL, NULL);
    }
    if (st == NB_OK) {
        bool eq = false;
        st = nb_tree_equal(model, p2, &eq);
        if (st == NB_OK && !eq) {
            st = NB_ERR_INTERNAL;
        }
    }
    nb_tree *ts[] = {model, opt, tmpl, state, xl, yl, p2, s2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        nb_tree_destroy(ts[i]);
    }
    nb_fn_destroy(jstep);
    nb_fn_destroy(step);
    nb_fn_destroy(g_vg);
    nb_fn_destroy(loss);
    nb_array_destroy(key);
    nb_array_destroy(x);
    nb_array_destroy(y);
    nb_ctx_clear_cache(ctx);
    return st;
}

static void test_out_of_memory_run(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/nbt_oomrun_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    snprintf(g_fault_path, sizeof g_fault_path, "%s/run.ckpt", g_dir);
    /* each allocation fails in turn: NB_ERR_OOM, nothing leaked, and the same context then
     * runs the whole scenario (rerun) */
    int points = nbt_oom_sweep("scenario_run", scenario_run, false, true);
    print_message("model, jitted train step, 3 steps, checkpoint save and load: %d allocation "
                  "failure points, each NB_ERR_OOM, nothing leaked, context usable after\n",
                  points);
    assert_true(points > 500);
    unlink(g_fault_path);
    rmdir(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_kill_while_saving),
        cmocka_unit_test(test_out_of_memory_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
