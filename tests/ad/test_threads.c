/*
 * test_threads.c -- results are bit-identical for 1, 2 and 4 threads and for the baseline
 * and AVX2 kernels, and running a compiled executable allocates nothing.
 */
#include "nbtest.h"

#include "ad/ir.h"

#include <stdatomic.h>
#include <time.h>

/* value_and_grad of an MLP 64-300-200-10 with cross-entropy, batch 96: the wide matmuls
 * have several column blocks and the elementwise ops several chunks. */
static nb_status body_loss(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *h = nb_get(tr, args, "[1].x");
    for (int i = 0; i < 3; i++) {
        h = nb_add(nb_matmul(h, nb_get(tr, args, "[0][%d].w", i)),
                   nb_get(tr, args, "[0][%d].b", i));
        if (i < 2) {
            h = nb_tanh(h);
        }
    }
    nb_var *y = nb_expand_dims(nb_get(tr, args, "[1].y"), -1);
    nb_var *picked = nb_take_along_axis(nb_log_softmax(h, -1), y, -1);
    return nb_return(nb_neg(nb_mean(picked, NULL, 0, false)), out);
}

static nb_tree *leaf_fill(nb_ctx *ctx, nb_dtype dt, int rank, const int64_t *shape, uint32_t seed) {
    nb_array *a = NULL;
    NBT_OK(ctx, nb_array_zeros(ctx, dt, rank, shape, &a));
    for (int64_t i = 0; i < nb_array_size(a); i++) {
        seed = seed * 1664525u + 1013904223u;
        if (dt == NB_DTYPE_F32) {
            ((float *)nb_array_data(a))[i] = (float)((double)(seed >> 8) / 16777216.0 - 0.5);
        } else {
            ((int32_t *)nb_array_data(a))[i] = (int32_t)((seed >> 8) % 10);
        }
    }
    nb_tree *t = NULL;
    NBT_OK(ctx, nb_tree_array(a, &t));
    nb_array_destroy(a);
    return t;
}

/* Run the loss's value_and_grad (layer sizes sz, batch rows) in a context with n threads;
 * return the flat results. */
static nb_tree *run_model(int n_threads, const int64_t *sz, int64_t batch, nb_ctx **ctx_out) {
    nb_ctx_opts o = nb_ctx_opts_default();
    o.n_threads = n_threads;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    NBT_EQ_I64(nb_ctx_n_threads(ctx), n_threads);
    nb_tree *layers[3], *params = NULL;
    for (int i = 0; i < 3; i++) {
        nb_tree *w = leaf_fill(ctx, NB_DTYPE_F32, 2, (int64_t[]){sz[i], sz[i + 1]}, 11u + i);
        nb_tree *b = leaf_fill(ctx, NB_DTYPE_F32, 1, &sz[i + 1], 23u + i);
        NBT_OK(ctx,
               nb_tree_dict(ctx, 2, (const char *[]){"w", "b"}, (nb_tree *[]){w, b}, &layers[i]));
        nb_tree_destroy(w);
        nb_tree_destroy(b);
    }
    NBT_OK(ctx, nb_tree_list(ctx, 3, layers, &params));
    nb_tree *x = leaf_fill(ctx, NB_DTYPE_F32, 2, (int64_t[]){batch, sz[0]}, 5u);
    nb_tree *y = leaf_fill(ctx, NB_DTYPE_I32, 1, &batch, 7u), *bt = NULL, *args = NULL;
    NBT_OK(ctx, nb_tree_dict(ctx, 2, (const char *[]){"x", "y"}, (nb_tree *[]){x, y}, &bt));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){params, bt}, &args));
    nb_fn *f = NULL, *vg = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "loss", body_loss, NULL, &f));
    NBT_OK(ctx, nb_value_and_grad(f, NULL, &vg));
    nb_tree *out = NULL, *leaves = NULL;
    NBT_OK(ctx, nb_fn_call(vg, args, &out));
    NBT_OK(ctx, nb_tree_flatten(out, &leaves, NULL));
    nb_tree_destroy(out);
    nb_fn_destroy(vg);
    nb_fn_destroy(f);
    nb_tree *trees[] = {args, bt, y, x, params, layers[0], layers[1], layers[2]};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    *ctx_out = ctx;
    return leaves;
}

static nb_tree *run_with_threads(int n_threads, nb_ctx **ctx_out) {
    return run_model(n_threads, (int64_t[]){64, 300, 200, 10}, 96, ctx_out);
}

/* Same bits from the same flat results of two runs (of different contexts). */
static void assert_same_bits(nb_tree *r1, nb_tree *r2, const char *what) {
    NBT_EQ_I64(nb_tree_len(r1), nb_tree_len(r2));
    for (int64_t i = 0; i < nb_tree_len(r1); i++) {
        nb_array *a = nb_tree_get_array(nb_tree_child(r1, i));
        nb_array *b = nb_tree_get_array(nb_tree_child(r2, i));
        NBT_EQ_I64(nb_array_nbytes(a), nb_array_nbytes(b));
        if (memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a)) != 0) {
            fail_msg("output %lld differs between %s", (long long)i, what);
        }
    }
}

/* The AVX2 twins of the float kernels (binary arithmetic, small matmuls, with transposed
 * operands in the backward pass and a 17-wide column tail) give the baseline kernels'
 * bits. A small model, so every matmul takes the small-product loop. */
static void test_avx2_twins_same_bits(void **state) {
    (void)state;
    const int64_t sz[4] = {5, 32, 17, 10};
    nb_ctx *c0 = NULL, *c1 = NULL;
    nbi_isa_override = 0;
    nb_tree *r0 = run_model(1, sz, 16, &c0);
    nbi_isa_override = -1;
    nb_tree *r1 = run_model(1, sz, 16, &c1);
    if (!nbi_use_avx2()) {
        print_message("note: this CPU has no AVX2; both runs used the baseline kernels\n");
    }
    NBT_EQ_I64(nb_tree_len(r0), 7);
    assert_same_bits(r0, r1, "the baseline and AVX2 kernels");
    nb_tree_destroy(r1);
    nb_tree_destroy(r0);
    nbt_assert_no_live(c1);
    nbt_assert_no_live(c0);
    nb_ctx_destroy(c1);
    nb_ctx_destroy(c0);
}

static void test_bit_identical_across_thread_counts(void **state) {
    (void)state;
    nb_ctx *c1 = NULL, *c2 = NULL, *c4 = NULL;
    nb_tree *r1 = run_with_threads(1, &c1), *r2 = run_with_threads(2, &c2);
    nb_tree *r4 = run_with_threads(4, &c4);
    NBT_EQ_I64(nb_tree_len(r1), 7); /* loss + 6 gradients */
    for (int64_t i = 0; i < nb_tree_len(r1); i++) {
        nb_array *a = nb_tree_get_array(nb_tree_child(r1, i));
        nb_array *b = nb_tree_get_array(nb_tree_child(r2, i));
        nb_array *d = nb_tree_get_array(nb_tree_child(r4, i));
        /* contexts differ, so compare the bytes directly */
        NBT_EQ_I64(nb_array_nbytes(a), nb_array_nbytes(b));
        NBT_EQ_I64(nb_array_nbytes(a), nb_array_nbytes(d));
        if (memcmp(nb_array_data(a), nb_array_data(b), nb_array_nbytes(a)) != 0 ||
            memcmp(nb_array_data(a), nb_array_data(d), nb_array_nbytes(a)) != 0) {
            fail_msg("output %lld differs between 1, 2 and 4 threads", (long long)i);
        }
    }
    nb_tree_destroy(r4);
    nb_tree_destroy(r2);
    nb_tree_destroy(r1);
    nbt_assert_no_live(c4);
    nbt_assert_no_live(c2);
    nbt_assert_no_live(c1);
    nb_ctx_destroy(c4);
    nb_ctx_destroy(c2);
    nb_ctx_destroy(c1);
}

/* Optimize and compile tr's graph with inputs ins and one output y. */
static nbi_exec *compile_traced(nb_ctx *ctx, nb_trace *tr, nb_var **ins, int32_t n_in,
                                nb_var **out) {
    NBT_OK(ctx, nb_trace_status(tr));
    tr->g.inputs = ins;
    tr->g.n_inputs = n_in;
    tr->g.outputs = out;
    tr->g.n_outputs = 1;
    nbi_graph opt;
    NBT_OK(ctx, nbi_optimize(ctx, &tr->g, 0, &tr->arena, &opt));
    nbi_exec *e = NULL;
    NBT_OK(ctx, nbi_exec_compile(ctx, &opt, 0, &e));
    return e;
}

/* A loop body's loop-invariant prefix (nbi_graph.n_fixed, nbi_exec_run_step): for
 * y = tanh(x @ transpose(w)) + 2 s with w and s the bound data (the first two inputs), the
 * transpose stays a node of its own (not folded into the product: the transpose-matmul pass
 * leaves a loop-invariant one) and runs first, once: a later step, told the prefix is valid,
 * does not look at w again -- shown by changing w between steps -- and one told it is not
 * runs it again. Without bound data (n_fixed 0): no prefix, and the transpose is folded. The
 * step's results equal nbi_exec_run_raw's bit for bit. */
static void test_loop_invariant_prefix(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    for (int fixed = 2; fixed >= 0; fixed -= 2) {
        nb_trace tr;
        NBT_OK(ctx, nbi_trace_init(&tr, ctx, "prefix"));
        nb_var *w = nbi_emit_param(&tr, 0, NB_DTYPE_F32, 2, (int64_t[]){24, 16}, NULL);
        nb_var *s = nbi_emit_param(&tr, 1, NB_DTYPE_F32, 1, (int64_t[]){24}, NULL);
        nb_var *x = nbi_emit_param(&tr, 2, NB_DTYPE_F32, 2, (int64_t[]){8, 16}, NULL);
        nb_var *y =
            nb_add(nb_tanh(nb_matmul(x, nb_transpose(w, NULL))), nb_mul(s, nb_scalar(&tr, 2.0)));
        nb_var *ins[3] = {w, s, x}, *outs[1] = {y};
        tr.g.n_fixed = fixed;
        nbi_exec *e = compile_traced(ctx, &tr, ins, 3, outs);
        printf("n_fixed %d: %d of the executable's instructions run once per loop\n", fixed,
               (int)nbi_exec_n_pre(e));
        if (fixed == 0) {
            NBT_EQ_I64(nbi_exec_n_pre(e), 0);
        } else {
            assert_true(nbi_exec_n_pre(e) >= 2); /* the transpose, 2 s */
        }
        float wv[24 * 16], sv[24], xv[8 * 16], y0[8 * 24], y1[8 * 24], y2[8 * 24];
        for (int i = 0; i < 24 * 16; i++) {
            wv[i] = 0.05f * (float)((i * 7) % 13) - 0.3f;
        }
        for (int i = 0; i < 24; i++) {
            sv[i] = 0.01f * (float)i;
        }
        for (int i = 0; i < 8 * 16; i++) {
            xv[i] = 0.1f * (float)((i * 5) % 11) - 0.5f;
        }
        const void *in[3] = {wv, sv, xv};
        void *o0[1] = {y0}, *o1[1] = {y1}, *o2[1] = {y2};
        nbi_exec_run_raw(e, in, o0, NULL);
        bool valid = false;
        nbi_exec_run_step(e, in, o1, NULL, &valid); /* the first step: everything */
        assert_true(valid);
        assert_memory_equal(y0, y1, sizeof y0);
        float keep = wv[5];
        wv[5] = 9.0f;                               /* w[0, 5]: changes row 0 of y's column 0 */
        nbi_exec_run_step(e, in, o2, NULL, &valid); /* a later step: the prefix not run */
        if (fixed > 0) {
            assert_memory_equal(y1, y2, sizeof y1); /* the old transpose */
        } else {
            assert_true(memcmp(y1, y2, sizeof y1) != 0);
        }
        valid = false;
        nbi_exec_run_step(e, in, o2, NULL, &valid); /* told it is not valid: runs it again */
        nbi_exec_run_raw(e, in, o0, NULL);
        assert_memory_equal(y0, y2, sizeof y0);
        assert_true(memcmp(y1, y2, sizeof y1) != 0);
        wv[5] = keep;
        nbi_exec_destroy(e);
        nbi_trace_release(&tr);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* Compile y = sum(tanh(x @ w) * 2) directly and count allocator calls while running it. */
static void test_running_allocates_nothing(void **state) {
    (void)state;
    nbt_alloc al = {0};
    nb_ctx_opts o = nb_ctx_opts_default();
    o.allocator = nbt_alloc_make(&al);
    o.n_threads = 2;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(&o, &ctx));
    nb_trace tr;
    NBT_OK(ctx, nbi_trace_init(&tr, ctx, "alloc"));
    nb_var *x = nbi_emit_param(&tr, 0, NB_DTYPE_F32, 2, (int64_t[]){128, 64}, NULL);
    nb_var *w = nbi_emit_param(&tr, 1, NB_DTYPE_F32, 2, (int64_t[]){64, 300}, NULL);
    nb_var *y = nb_sum(nb_mul(nb_tanh(nb_matmul(x, w)), nb_scalar(&tr, 2.0)), NULL, 0, false);
    nb_var *ins[2] = {x, w}, *outs[1] = {y};
    nbi_exec *e = compile_traced(ctx, &tr, ins, 2, outs);
    nb_array *ax = NULL, *aw = NULL, *ay = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){128, 64}, 0.5, &ax));
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){64, 300}, 0.01, &aw));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 0, NULL, &ay));
    nbi_exec_run(e, (nb_array *const[]){ax, aw}, (nb_array *const[]){ay}, NULL); /* warm */
    int64_t before = al.n_calls;
    for (int i = 0; i < 50; i++) {
        nbi_exec_run(e, (nb_array *const[]){ax, aw}, (nb_array *const[]){ay}, NULL);
    }
    NBT_EQ_I64(al.n_calls - before, 0);
    double v = 0;
    NBT_OK(ctx, nb_array_get(ay, NULL, &v));
    double want = 128.0 * 300.0 * 2.0 * tanh(64 * 0.5 * 0.01);
    NBT_NEAR(v, want, 1e-5 * want); /* an f32 sum of 38400 terms */
    nb_array_destroy(ay);
    nb_array_destroy(aw);
    nb_array_destroy(ax);
    nbi_exec_destroy(e);
    nbi_trace_release(&tr);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
    NBT_EQ_I64(al.n_live, 0);
}

/* The memory plan runs an elementwise kernel in place over an input it reads for the last
 * time: y = tanh(x @ w) @ v needs one [128, 300] slot, not two. */
static void test_plan_in_place(void **state) {
    (void)state;
    nb_ctx *ctx = NULL;
    NBT_OK(NULL, nb_ctx_create(NULL, &ctx));
    nb_trace tr;
    NBT_OK(ctx, nbi_trace_init(&tr, ctx, "inplace"));
    nb_var *x = nbi_emit_param(&tr, 0, NB_DTYPE_F32, 2, (int64_t[]){128, 64}, NULL);
    nb_var *w = nbi_emit_param(&tr, 1, NB_DTYPE_F32, 2, (int64_t[]){64, 300}, NULL);
    nb_var *v = nbi_emit_param(&tr, 2, NB_DTYPE_F32, 2, (int64_t[]){300, 10}, NULL);
    nb_var *y = nb_matmul(nb_tanh(nb_matmul(x, w)), v);
    nb_var *ins[3] = {x, w, v}, *outs[1] = {y};
    nbi_exec *e = compile_traced(ctx, &tr, ins, 3, outs);
    size_t big = 128 * 300 * sizeof(float);
    if (nbi_exec_workspace_bytes(e) >= 2 * big) {
        fail_msg("workspace %zu bytes: tanh did not reuse its input's slot (one is %zu)",
                 nbi_exec_workspace_bytes(e), big);
    }
    nb_array *ax = NULL, *aw = NULL, *av = NULL, *ay = NULL;
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){128, 64}, 0.5, &ax));
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){64, 300}, 0.01, &aw));
    NBT_OK(ctx, nb_array_full(ctx, NB_DTYPE_F32, 2, (int64_t[]){300, 10}, 1.0, &av));
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){128, 10}, &ay));
    nbi_exec_run(e, (nb_array *const[]){ax, aw, av}, (nb_array *const[]){ay}, NULL);
    double got = 0, want = 300.0 * tanh(64 * 0.5 * 0.01);
    NBT_OK(ctx, nb_array_get(ay, (int64_t[]){127, 9}, &got));
    NBT_NEAR(got, want, 1e-4 * want);
    nb_array_destroy(ay);
    nb_array_destroy(av);
    nb_array_destroy(aw);
    nb_array_destroy(ax);
    nbi_exec_destroy(e);
    nbi_trace_release(&tr);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* ---- oversubscription ---------------------------------------------------------------- */

/* A job's tasks: each counts its own runs (every task must run exactly once per job). */
typedef struct count_job {
    _Atomic int64_t *runs;
} count_job;

static void count_task(void *ud, int64_t t, int worker) {
    (void)worker;
    count_job *j = ud;
    atomic_fetch_add_explicit(&j->runs[t], 1, memory_order_relaxed);
}

/* Seconds for n_jobs jobs of n_tasks tiny tasks on a pool of n_threads. */
static double time_jobs(nb_ctx *ctx, int n_threads, int n_jobs, int n_tasks) {
    nbi_pool *p = NULL;
    NBT_OK(ctx, nbi_pool_create(ctx, n_threads, &p));
    _Atomic int64_t runs[16];
    for (int t = 0; t < n_tasks; t++) {
        atomic_init(&runs[t], 0);
    }
    count_job j = {runs};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int k = 0; k < n_jobs; k++) {
        nbi_pool_run(p, n_tasks, count_task, &j);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    nbi_pool_destroy(p);
    for (int t = 0; t < n_tasks; t++) {
        if (atomic_load(&runs[t]) != n_jobs) {
            fail_msg("%d threads: task %d ran %lld times in %d jobs", n_threads, t,
                     (long long)atomic_load(&runs[t]), n_jobs);
        }
    }
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}

/* With many more threads than cores (32 on this 2-core machine; any other job running),
 * a job must not wait for every thread to wake and check in: the threads that run take
 * the tasks and the job ends. The pool waited for all of them, so 2000 jobs of 4 tasks
 * took 30-70x as long as with 2 threads; now within a small factor (generous bound: the
 * machine is shared). And every task still runs exactly once per job. */
static void test_pool_oversubscribed(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    double best2 = 1e9, best32 = 1e9;
    for (int round = 0; round < 3; round++) { /* the best of 3: robust to a noisy moment */
        double t2 = time_jobs(ctx, 2, 2000, 4), t32 = time_jobs(ctx, 32, 2000, 4);
        best2 = t2 < best2 ? t2 : best2;
        best32 = t32 < best32 ? t32 : best32;
    }
    print_message("2000 jobs of 4 tasks: 2 threads %.2f ms, 32 threads %.2f ms (%.1fx)\n",
                  best2 * 1e3, best32 * 1e3, best32 / best2);
    if (best32 > 8.0 * best2 + 0.02) {
        fail_msg("32 threads took %.1fx as long as 2 (%.2f ms vs %.2f ms)", best32 / best2,
                 best32 * 1e3, best2 * 1e3);
    }
    nb_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical_across_thread_counts),
        cmocka_unit_test(test_avx2_twins_same_bits),
        cmocka_unit_test(test_running_allocates_nothing),
        cmocka_unit_test(test_plan_in_place),
        cmocka_unit_test(test_loop_invariant_prefix),
        cmocka_unit_test(test_pool_oversubscribed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
