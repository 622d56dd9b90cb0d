/*
 * test_train.c -- nb_train_step / nb_train_init / nb_train_run (nabla/train.h):
 *   - the built step against the hand-written one (a body calling value_and_grad,
 *     nb_optim_update and nb_apply_updates, jitted, called with params and state donated,
 *     as tools/train.c wrote it): an MLP on UCI digits with Adam, 12 steps, every parameter
 *     and the loss bit for bit; with has_aux (the number of correct rows);
 *   - a frozen leaf (filter spec): null in the state, unchanged by the steps; a batch given
 *     as one array, and none;
 *   - one trace for every step; an equal step built again runs the same compiled code;
 *     donation updates the parameters' arrays in place, donate = false leaves them;
 *   - errors naming the call, the argument and the fix; allocation failures: NB_ERR_OOM,
 *     nothing leaked.
 */
#include "nbtest.h"

#include <math.h>
#include <string.h>

enum { ROWS = 64, FEAT = 64, CLASSES = 10, WIDTH = 16, STEPS = 12 };

/* loss((params, x, y)) = mean cross-entropy of mlp(x); self: has_aux (bool) -> also the
 * number of correct rows (i32) */
static nb_status loss_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    bool aux = false;
    nb_tree_get_bool(self, &aux);
    nb_var *x = nb_get(tr, args, "[1]"), *y = nb_get(tr, args, "[2]");
    nb_var *logits = nb_nn_mlp(tr, nb_tree_child(args, 0), x);
    nb_var *logp = nb_log_softmax(logits, -1);
    nb_var *picked =
        nb_sum(nb_mul(logp, nb_one_hot(y, CLASSES, nb_var_dtype(logp))), (int[]){-1}, 1, false);
    nb_var *loss = nb_neg(nb_mean(picked, NULL, 0, false));
    if (!aux) {
        return nb_return(loss, out);
    }
    nb_var *correct =
        nb_sum(nb_cast(nb_eq(nb_argmax(logits, -1, false), nb_cast(y, NB_DTYPE_I64)), NB_DTYPE_I32),
               NULL, 0, false);
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(loss), nb_leaf(correct)}, out);
}

/* the hand-written step, as tools/train.c: self = dict(opt, aux); args (params, state, x, y) */
static nb_fn *g_vg;
static nb_status step_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    nb_ctx *ctx = nb_trace_ctx(tr);
    const nb_tree *params = nb_tree_child(args, 0), *state = nb_tree_child(args, 1);
    nb_tree *gargs = NULL;
    nb_status st = nb_tree_tuple(
        ctx, 3, (const nb_tree *[]){params, nb_tree_child(args, 2), nb_tree_child(args, 3)},
        &gargs);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *vg = nb_apply(tr, g_vg, gargs);
    nb_tree_destroy(gargs);
    if (vg == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *updates = NULL, *new_state = NULL;
    st = nb_optim_update(tr, self, nb_tree_child(vg, 1), state, params, &updates, &new_state);
    if (st != NB_OK) {
        return st;
    }
    const nb_tree *new_params = nb_apply_updates(tr, params, updates);
    if (new_params == NULL) {
        return nb_trace_status(tr);
    }
    const nb_tree *value = nb_tree_child(vg, 0);
    bool aux = nb_tree_kind_of(value) == NB_TREE_KIND_TUPLE;
    return nb_tree_tuple(ctx, aux ? 4 : 3,
                         (const nb_tree *[]){new_params, new_state,
                                             aux ? nb_tree_child(value, 0) : value,
                                             aux ? nb_tree_child(value, 1) : NULL},
                         out);
}

typedef struct setup {
    nb_ctx *ctx;
    nb_tree *params, *opt, *x, *y, *batch;
} setup;

static setup make_setup(nb_ctx *ctx) {
    setup s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    nb_array *x = NULL, *y = NULL, *key = NULL, *xs = NULL, *ys = NULL;
    nb_csv_opts co = nb_csv_opts_default();
    NBT_OK(ctx, nb_csv_load(ctx, NBT_DATA_DIR "/digits.csv.gz", &co, &x, &y));
    /* the first ROWS rows, scaled to [0, 1] */
    float xv[ROWS * FEAT];
    int32_t yv[ROWS];
    for (int i = 0; i < ROWS; i++) {
        for (int j = 0; j < FEAT; j++) {
            double v = 0;
            NBT_OK(ctx, nb_array_get(x, (int64_t[]){i, j}, &v));
            xv[i * FEAT + j] = (float)(v / 16.0);
        }
        double l = 0;
        NBT_OK(ctx, nb_array_get_flat(y, i, &l));
        yv[i] = (int32_t)l;
    }
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_F32, 2, (int64_t[]){ROWS, FEAT}, xv, &xs));
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 1, (int64_t[]){ROWS}, yv, &ys));
    NBT_OK(ctx, nb_tree_array(xs, &s.x));
    NBT_OK(ctx, nb_tree_array(ys, &s.y));
    NBT_OK(ctx, nb_random_key(ctx, 7, &key));
    NBT_OK(ctx, nb_nn_mlp_init(ctx, FEAT, CLASSES, WIDTH, 1, NULL, NB_DTYPE_F32, key, &s.params));
    NBT_OK(ctx, nb_optim_adam(ctx, 1e-2, NULL, &s.opt));
    NBT_OK(ctx, nb_tree_tuple(ctx, 2, (nb_tree *[]){s.x, s.y}, &s.batch));
    nb_array_destroy(x);
    nb_array_destroy(y);
    nb_array_destroy(xs);
    nb_array_destroy(ys);
    nb_array_destroy(key);
    return s;
}

static void free_setup(setup *s) {
    nb_tree *t[] = {s->params, s->opt, s->x, s->y, s->batch};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        nb_tree_destroy(t[i]);
    }
}

/* A deep copy of t's arrays (donation overwrites the originals). */
static nb_status copy_leaf(void *ud, const char *path, int n, const nb_tree *const *leaves,
                           nb_tree **out) {
    (void)ud;
    (void)path;
    (void)n;
    nb_array *c = NULL;
    nb_status st = nb_array_copy(nb_tree_get_array(leaves[0]), &c);
    if (st == NB_OK) {
        st = nb_tree_array(c, out);
        nb_array_destroy(c);
    }
    return st;
}
static nb_tree *deep_copy(const nb_tree *t) {
    nb_tree *out = NULL;
    NBT_OK(nb_tree_ctx(t), nb_tree_map(t, copy_leaf, NULL, 0, &out));
    return out;
}

/* every array leaf of a and b equal bit for bit; returns the number of leaves compared */
static int64_t same_bits(const nb_tree *a, const nb_tree *b) {
    nb_tree *fa = NULL, *fb = NULL;
    nb_treedef *da = NULL, *db = NULL;
    NBT_OK(nb_tree_ctx(a), nb_tree_flatten(a, &fa, &da));
    NBT_OK(nb_tree_ctx(b), nb_tree_flatten(b, &fb, &db));
    NBT_TRUE(nb_treedef_equal(da, db));
    int64_t n = nb_tree_len(fa), arrays = 0;
    NBT_EQ_I64(nb_tree_len(fb), n);
    for (int64_t i = 0; i < n; i++) {
        const nb_tree *la = nb_tree_child(fa, i), *lb = nb_tree_child(fb, i);
        NBT_EQ_I64(nb_tree_kind_of(la), nb_tree_kind_of(lb));
        const nb_array *x = nb_tree_get_array(la), *y = nb_tree_get_array(lb);
        if (x == NULL) {
            continue;
        }
        NBT_EQ_I64(nb_array_size(x), nb_array_size(y));
        NBT_TRUE(memcmp(nb_array_data(x), nb_array_data(y),
                        (size_t)nb_array_size(x) * nb_dtype_size(nb_array_dtype(x))) == 0);
        arrays++;
    }
    nb_tree_destroy(fa);
    nb_tree_destroy(fb);
    nb_treedef_destroy(da);
    nb_treedef_destroy(db);
    return arrays;
}

/* STEPS steps of the hand-written step and of nb_train_step, from the same start */
static void check_against_hand_written(bool aux) {
    nb_ctx *ctx = nbt_ctx();
    setup s = make_setup(ctx);
    nb_tree *self = NULL, *tmpl = NULL, *hstate = NULL, *bstate = NULL, *t_true = NULL,
            *t_false = NULL, *donate = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, aux, &self));
    nb_fn *loss = NULL, *hstep = NULL, *hjit = NULL, *step = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "loss", loss_body, self, &loss));
    nb_grad_opts go = nb_grad_opts_default();
    go.has_aux = aux;
    NBT_OK(ctx, nb_value_and_grad(loss, &go, &g_vg));
    NBT_OK(ctx, nb_fn_create(ctx, "train_step", step_body, s.opt, &hstep));
    NBT_OK(ctx, nb_jit(hstep, NULL, &hjit));
    nb_train_opts to = nb_train_opts_default();
    to.has_aux = aux;
    NBT_OK(ctx, nb_train_step(loss, s.opt, &to, &step));
    /* the hand-written side */
    nb_tree *hparams = deep_copy(s.params);
    NBT_OK(ctx, nb_grad_template(hparams, NULL, &tmpl));
    NBT_OK(ctx, nb_optim_init(s.opt, tmpl, &hstate));
    NBT_OK(ctx, nb_tree_bool(ctx, true, &t_true));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &t_false));
    NBT_OK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){t_true, t_true, t_false, t_false}, &donate));
    nb_call_opts call = nb_call_opts_default();
    call.donate = donate;
    /* the builder's side */
    nb_tree *bparams = deep_copy(s.params);
    NBT_OK(ctx, nb_train_init(step, bparams, &bstate));
    for (int k = 0; k < STEPS; k++) {
        nb_tree *args = NULL, *res = NULL, *baux = NULL;
        NBT_OK(ctx, nb_tree_tuple(ctx, 4, (nb_tree *[]){hparams, hstate, s.x, s.y}, &args));
        NBT_OK(ctx, nb_fn_call_ex(hjit, args, &call, &res));
        nb_tree_destroy(args);
        nb_tree_destroy(hparams);
        nb_tree_destroy(hstate);
        hparams = nb_tree_retain((nb_tree *)nb_tree_child(res, 0));
        hstate = nb_tree_retain((nb_tree *)nb_tree_child(res, 1));
        double hl = 0, bl = 0;
        NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_child(res, 2)), 0, &hl));
        NBT_OK(ctx, nb_train_run(step, &bparams, &bstate, s.batch, &bl, aux ? &baux : NULL));
        NBT_EQ_F64(bl, hl);
        if (aux) {
            double hc = -1, bc = -2;
            NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_child(res, 3)), 0, &hc));
            NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(baux), 0, &bc));
            NBT_EQ_F64(bc, hc);
        }
        nb_tree_destroy(baux);
        nb_tree_destroy(res);
    }
    NBT_EQ_I64(same_bits(hparams, bparams), 4); /* 2 layers: weight and bias */
    NBT_TRUE(same_bits(hstate, bstate) >= 8);   /* mu and nu of each, the count */
    nb_fn_stats st;
    NBT_OK(ctx, nb_fn_stats_get(step, &st));
    NBT_EQ_I64(st.n_traces, 1);
    NBT_EQ_I64(st.n_calls, STEPS);
    /* an equal step built again (a new optimizer tree of the same value) shares the code */
    nb_tree *opt2 = NULL;
    nb_fn *step2 = NULL;
    NBT_OK(ctx, nb_optim_adam(ctx, 1e-2, NULL, &opt2));
    NBT_OK(ctx, nb_train_step(loss, opt2, &to, &step2));
    NBT_OK(ctx, nb_train_run(step2, &bparams, &bstate, s.batch, NULL, NULL));
    NBT_OK(ctx, nb_fn_stats_get(step2, &st));
    NBT_EQ_I64(st.n_traces, 1);
    NBT_EQ_I64(st.n_hits, STEPS);
    nb_fn_destroy(step2);
    nb_tree_destroy(opt2);
    nb_tree *trees[] = {self, tmpl, hstate, bstate, t_true, t_false, donate, hparams, bparams};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_fn_destroy(step);
    nb_fn_destroy(hjit);
    nb_fn_destroy(hstep);
    nb_fn_destroy(g_vg);
    g_vg = NULL;
    nb_fn_destroy(loss);
    free_setup(&s);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_same_bits_as_hand_written(void **state) {
    (void)state;
    check_against_hand_written(false);
}

static void test_same_bits_with_aux(void **state) {
    (void)state;
    check_against_hand_written(true);
}

/* loss((params, xy)) with xy one f64[2] array, or loss((params)) -- (w - 3)^2 summed;
 * params = dict(w f64[2], frozen f64[2]) */
static nb_status quad_body(nb_trace *tr, const nb_tree *self, const nb_tree *args, nb_tree **out) {
    (void)self;
    nb_var *w = nb_get(tr, args, "[0].w"), *fz = nb_get(tr, args, "[0].frozen");
    nb_var *target =
        nb_tree_len(args) > 1 ? nb_get(tr, args, "[1]") : nb_scalar_typed(tr, NB_DTYPE_F64, 3.0);
    nb_var *d = nb_sub(nb_add(w, fz), target);
    return nb_return(nb_sum(nb_mul(d, d), NULL, 0, false), out);
}

static nb_tree *f64_leaf(nb_ctx *ctx, double a, double b) {
    nb_array *x = nbt_arr_f64(ctx, 1, (int64_t[]){2}, (double[]){a, b});
    nb_tree *l = NULL;
    NBT_OK(ctx, nb_tree_array(x, &l));
    nb_array_destroy(x);
    return l;
}

static void test_frozen_leaf_batches_and_donation(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *params = NULL, *spec = NULL, *opt = NULL, *st = NULL, *target = f64_leaf(ctx, 3, 3);
    nb_tree *l0 = f64_leaf(ctx, 0.5, 0.5), *l1 = f64_leaf(ctx, 0, 1);
    NBT_OK(ctx,
           nb_tree_dict(ctx, 2, (const char *[]){"frozen", "w"}, (nb_tree *[]){l0, l1}, &params));
    nb_tree_destroy(l0);
    nb_tree_destroy(l1);
    nb_tree *tt = NULL, *ff = NULL;
    NBT_OK(ctx, nb_tree_bool(ctx, true, &tt));
    NBT_OK(ctx, nb_tree_bool(ctx, false, &ff));
    NBT_OK(ctx,
           nb_tree_dict(ctx, 2, (const char *[]){"frozen", "w"}, (nb_tree *[]){ff, tt}, &spec));
    NBT_OK(ctx, nb_optim_sgd(ctx, 0.25, NULL, &opt));
    nb_fn *loss = NULL, *step = NULL, *keep = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "quad", quad_body, NULL, &loss));
    nb_train_opts to = nb_train_opts_default();
    to.filter_spec = spec;
    NBT_OK(ctx, nb_train_step(loss, opt, &to, &step));
    NBT_OK(ctx, nb_train_init(step, params, &st));
    /* sgd has no moments: its state is the empty one, and the frozen leaf has no update */
    const nb_array *w0 = nb_tree_get_array(nb_tree_get(params, "w"));
    double l = 0;
    /* a batch that is one array: loss((params, target)) */
    NBT_OK(ctx, nb_train_run(step, &params, &st, target, &l, NULL));
    /* d = (0.5, 1.5) - 3: loss = 2.5^2 + 1.5^2 */
    NBT_EQ_F64(l, 6.25 + 2.25);
    /* donated: the new w is written into the old array */
    NBT_TRUE(nb_tree_get_array(nb_tree_get(params, "w")) == w0);
    double w[2], fz[2];
    for (int i = 0; i < 2; i++) {
        NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_get(params, "w")), i, &w[i]));
        NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_get(params, "frozen")), i, &fz[i]));
        NBT_EQ_F64(fz[i], 0.5);
    }
    /* w - 0.25 * 2 (w + 0.5 - 3) */
    NBT_EQ_F64(w[0], 0 - 0.5 * (0 + 0.5 - 3));
    NBT_EQ_F64(w[1], 1 - 0.5 * (1 + 0.5 - 3));
    /* the loss as a metric, same argument convention: with the one-array batch and none */
    double lw = (w[0] + 0.5 - 3) * (w[0] + 0.5 - 3) + (w[1] + 0.5 - 3) * (w[1] + 0.5 - 3);
    nb_tree *ev = NULL;
    NBT_OK(ctx, nb_train_eval(loss, params, target, &ev));
    double got = 0;
    NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(ev), 0, &got));
    NBT_EQ_F64(got, lw);
    nb_tree_destroy(ev);
    NBT_OK(ctx, nb_train_eval(loss, params, NULL, &ev));
    NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(ev), 0, &got));
    NBT_EQ_F64(got, lw);
    nb_tree_destroy(ev);
    /* no batch: loss((params)) with the target 3 inside */
    NBT_OK(ctx, nb_train_run(step, &params, &st, NULL, &l, NULL));
    NBT_EQ_F64(l, (w[0] + 0.5 - 3) * (w[0] + 0.5 - 3) + (w[1] + 0.5 - 3) * (w[1] + 0.5 - 3));
    /* donate = false: new arrays, the old ones unchanged */
    to.donate = false;
    NBT_OK(ctx, nb_train_step(loss, opt, &to, &keep));
    nb_tree *old = nb_tree_retain(params);
    NBT_OK(ctx, nb_train_run(keep, &params, &st, NULL, &l, NULL));
    NBT_TRUE(params != old);
    NBT_TRUE(nb_tree_get_array(nb_tree_get(params, "w")) !=
             nb_tree_get_array(nb_tree_get(old, "w")));
    double o0 = 0;
    NBT_OK(ctx, nb_array_get_flat(nb_tree_get_array(nb_tree_get(old, "w")), 0, &o0));
    NBT_EQ_F64(o0, w[0] - 0.5 * (w[0] + 0.5 - 3));
    nb_tree_destroy(old);
    nb_fn_destroy(keep);
    nb_fn_destroy(step);
    nb_fn_destroy(loss);
    nb_tree *trees[] = {params, spec, opt, st, target, tt, ff};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_tree *params = NULL, *opt = NULL, *st = NULL, *notopt = NULL, *aux = NULL;
    nb_tree *l0 = f64_leaf(ctx, 0.5, 0.5), *l1 = f64_leaf(ctx, 0, 1);
    NBT_OK(ctx,
           nb_tree_dict(ctx, 2, (const char *[]){"frozen", "w"}, (nb_tree *[]){l0, l1}, &params));
    nb_tree_destroy(l0);
    nb_tree_destroy(l1);
    NBT_OK(ctx, nb_optim_adam(ctx, 0.1, NULL, &opt));
    NBT_OK(ctx, nb_tree_int(ctx, 3, &notopt));
    nb_fn *loss = NULL, *step = NULL, *plain = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "quad", quad_body, NULL, &loss));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_train_step(loss, notopt, NULL, &step));
    NBT_ERRMSG_HAS(ctx, "nb_train_step: opt is not an optimizer");
    NBT_TRUE(step == NULL);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_train_step(loss, opt, NULL, NULL));
    NBT_ERRMSG_HAS(ctx, "nb_train_step: out is NULL");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_train_step(NULL, opt, NULL, &step));
    NBT_ERRMSG_HAS(ctx, "nb_train_step");
    NBT_OK(ctx, nb_train_step(loss, opt, NULL, &step));
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_train_init(loss, params, &st));
    NBT_ERRMSG_HAS(ctx, "nb_train_init: 'quad' is not a training step (make it with "
                        "nb_train_step)");
    NBT_OK(ctx, nb_train_init(step, params, &st));
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_train_run(step, &params, &st, NULL, NULL, &aux));
    NBT_ERRMSG_HAS(ctx, "nb_train_run: aux is not NULL but the step was built without has_aux");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_train_run(step, NULL, &st, NULL, NULL, NULL));
    NBT_ERRMSG_HAS(ctx, "nb_train_run: params is NULL");
    /* a batch the loss cannot take: (params, a, b) -- the loss reads [1] as one array and
     * adds it to w: a shape error from inside the loss, params and state left as they were */
    nb_tree *before = params, *bad = NULL, *three = NULL;
    nb_array *a3 = nbt_arr_f64(ctx, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    NBT_OK(ctx, nb_tree_array(a3, &three));
    nb_array_destroy(a3);
    NBT_OK(ctx, nb_tree_tuple(ctx, 1, (nb_tree *[]){three}, &bad));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_train_run(step, &params, &st, bad, NULL, NULL));
    NBT_ERRMSG_HAS(ctx, "f64[3]");
    NBT_TRUE(params == before);
    /* a non-tuple argument to the step itself */
    nb_tree *out = NULL;
    NBT_STATUS(ctx, NB_ERR_STRUCTURE, nb_fn_call(step, params, &out));
    NBT_ERRMSG_HAS(ctx, "nb_train_step: the step's arguments are a dict; they must be the tuple "
                        "(params, state, batch)");
    NBT_OK(ctx, nb_fn_create(ctx, "plain", quad_body, NULL, &plain));
    nb_fn_destroy(plain);
    nb_tree_destroy(bad);
    nb_tree_destroy(three);
    nb_fn_destroy(step);
    nb_fn_destroy(loss);
    nb_tree *trees[] = {params, opt, st, notopt};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* build, init and three steps (the first compiles) */
static nb_status scenario_train(nb_ctx *ctx) {
    nb_tree *params = NULL, *opt = NULL, *st = NULL, *a = NULL, *b = NULL;
    nb_fn *loss = NULL, *step = NULL;
    nb_array *x = NULL, *y = NULL;
    nb_status s =
        nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){0.5, 0.5}, &x);
    if (s == NB_OK) {
        s = nb_array_from_data(ctx, NB_DTYPE_F64, 1, (int64_t[]){2}, (double[]){0, 1}, &y);
    }
    if (s == NB_OK) {
        s = nb_tree_array(x, &a);
    }
    if (s == NB_OK) {
        s = nb_tree_array(y, &b);
    }
    if (s == NB_OK) {
        s = nb_tree_dict(ctx, 2, (const char *[]){"frozen", "w"}, (nb_tree *[]){a, b}, &params);
    }
    if (s == NB_OK) {
        s = nb_optim_adam(ctx, 0.1, NULL, &opt);
    }
    if (s == NB_OK) {
        s = nb_fn_create(ctx, "quad", quad_body, NULL, &loss);
    }
    if (s == NB_OK) {
        s = nb_train_step(loss, opt, NULL, &step);
    }
    if (s == NB_OK) {
        s = nb_train_init(step, params, &st);
    }
    for (int k = 0; k < 3 && s == NB_OK; k++) {
        s = nb_train_run(step, &params, &st, NULL, NULL, NULL);
    }
    nb_fn_destroy(step);
    nb_fn_destroy(loss);
    nb_tree *trees[] = {params, opt, st, a, b};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        nb_tree_destroy(trees[i]);
    }
    nb_array_destroy(x);
    nb_array_destroy(y);
    return s;
}

static void test_out_of_memory(void **state) {
    (void)state;
    int n = nbt_oom_sweep("scenario_train", scenario_train, true, true);
    printf("allocation failures: %d points, each NB_ERR_OOM with nothing leaked\n", n);
    NBT_TRUE(n > 50);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_as_hand_written),
        cmocka_unit_test(test_same_bits_with_aux),
        cmocka_unit_test(test_frozen_leaf_batches_and_donation),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
