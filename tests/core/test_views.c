/*
 * test_views.c -- eager views of rows (nb_array_index, nb_array_rows) and keys held one by
 * one (nb_random_split_keys):
 *   - a row and a range of rows read the base's elements, negative indices count back,
 *     writes go through both ways, a view outlives its base, a view of a view and a reshape
 *     of a view start at the right element;
 *   - a view as an argument of a jitted function and as a donated argument (its rows of the
 *     base updated in place, the other rows untouched);
 *   - errors name the function, the index or range, the valid range and the shape;
 *   - split keys equal the rows of nb_random_split and sample as the rows do;
 *   - eager reductions: sum, mean, argmax along an axis (ties, NaN, negative axes), the
 *     count of equal elements across dtypes (an accuracy), with their errors;
 *   - allocation failures: NB_ERR_OOM, nothing leaked.
 */
#include "nbtest.h"

#include <math.h>
#include <string.h>

static nb_array *iota(nb_ctx *ctx, int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        n *= shape[i];
    }
    double v[64];
    for (int64_t i = 0; i < n; i++) {
        v[i] = (double)i;
    }
    return nbt_arr_f64(ctx, rank, shape, v);
}

static double flat(const nb_array *a, int64_t i) {
    double v = -1;
    nb_array_get_flat(a, i, &v);
    return v;
}

static void test_index_and_rows(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = iota(ctx, 3, (int64_t[]){4, 3, 2}), *r = NULL, *rs = NULL, *e = NULL;
    NBT_OK(ctx, nb_array_index(a, 1, &r));
    NBT_EQ_I64(nb_array_rank(r), 2);
    NBT_EQ_I64(nb_array_dim(r, 0), 3);
    NBT_EQ_I64(nb_array_size(r), 6);
    for (int k = 0; k < 6; k++) {
        NBT_EQ_F64(flat(r, k), 6 + k);
    }
    nb_array_destroy(r);
    NBT_OK(ctx, nb_array_index(a, -1, &r)); /* the last */
    NBT_EQ_F64(flat(r, 0), 18);
    /* a view of a view: element (3, 2, *) */
    NBT_OK(ctx, nb_array_index(r, 2, &e));
    NBT_EQ_I64(nb_array_rank(e), 1);
    NBT_EQ_F64(flat(e, 0), 22);
    NBT_EQ_F64(flat(e, 1), 23);
    /* writes go through both ways */
    NBT_OK(ctx, nb_array_set(e, (int64_t[]){1}, -5));
    NBT_EQ_F64(flat(a, 23), -5);
    NBT_OK(ctx, nb_array_set(a, (int64_t[]){3, 2, 0}, -4));
    NBT_EQ_F64(flat(e, 0), -4);
    nb_array_destroy(e);
    nb_array_destroy(r);
    /* rows 1..3, and the same counted back */
    NBT_OK(ctx, nb_array_rows(a, 1, 3, &rs));
    NBT_EQ_I64(nb_array_rank(rs), 3);
    NBT_EQ_I64(nb_array_dim(rs, 0), 2);
    NBT_EQ_I64(nb_array_nbytes(rs), 12 * 8);
    for (int k = 0; k < 12; k++) {
        NBT_EQ_F64(flat(rs, k), 6 + k);
    }
    nb_array *rb = NULL, *re = NULL, *z = NULL;
    NBT_OK(ctx, nb_array_rows(a, -3, -1, &rb));
    bool same = false;
    NBT_OK(ctx, nb_array_identical(rs, rb, &same));
    NBT_TRUE(same);
    NBT_OK(ctx, nb_array_rows(a, 4, 4, &z)); /* empty, at the end */
    NBT_EQ_I64(nb_array_size(z), 0);
    /* a reshape of a view starts at the view's first element */
    NBT_OK(ctx, nb_array_reshape(rs, 1, (int64_t[]){12}, &re));
    NBT_EQ_F64(flat(re, 0), 6);
    NBT_EQ_F64(flat(re, 11), 17);
    /* the views outlive the base */
    nb_array_destroy(a);
    NBT_EQ_F64(flat(rs, 11), 17);
    NBT_EQ_F64(flat(re, 5), 11);
    nb_array *c = NULL;
    NBT_OK(ctx, nb_array_copy(rs, &c));
    NBT_EQ_F64(flat(c, 0), 6);
    nb_array *views[] = {rs, rb, re, z, c};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
        nb_array_destroy(views[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_errors(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = iota(ctx, 2, (int64_t[]){3, 2}), *o = NULL, *s = NULL;
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_index(a, 3, &o));
    NBT_ERRMSG_HAS(ctx, "nb_array_index: index 3 is out of range for axis 0 of f64[3,2] (valid: "
                        "-3..2)");
    NBT_TRUE(o == NULL);
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_index(a, -4, &o));
    NBT_ERRMSG_HAS(ctx, "index -4 is out of range");
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_rows(a, 2, 1, &o));
    NBT_ERRMSG_HAS(ctx, "nb_array_rows: rows 2..1 are out of range for axis 0 of f64[3,2]");
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_rows(a, 0, 4, &o));
    NBT_ERRMSG_HAS(ctx, "rows 0..4 are out of range");
    NBT_STATUS(ctx, NB_ERR_INDEX, nb_array_rows(a, -4, 1, &o));
    NBT_OK(ctx, nb_array_scalar(ctx, NB_DTYPE_F32, 1.0, &s));
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_index(s, 0, &o));
    NBT_ERRMSG_HAS(ctx, "nb_array_index: f32[] has no axis to index");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_array_rows(a, 0, 1, NULL));
    NBT_ERRMSG_HAS(ctx, "nb_array_rows: out is NULL");
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_array_index(NULL, 0, &o));
    nb_array_destroy(s);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

/* args: (x f64[2,2]) -> 10 x + 1 */
static nb_status body_affine(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                             nb_tree **out) {
    (void)self;
    nb_var *x = nb_get(tr, args, "[0]");
    return nb_return(nb_add(nb_mul(x, nb_scalar(tr, 10.0)), nb_scalar(tr, 1.0)), out);
}

/* a view as a jitted function's argument; donated, its rows of the base change in place */
static void test_views_in_calls(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *a = iota(ctx, 2, (int64_t[]){4, 2}), *v = NULL;
    NBT_OK(ctx, nb_array_rows(a, 1, 3, &v)); /* rows 1 and 2: 2..5 */
    nb_fn *f = NULL, *jf = NULL;
    NBT_OK(ctx, nb_fn_create(ctx, "affine", body_affine, NULL, &f));
    NBT_OK(ctx, nb_jit(f, NULL, &jf));
    nb_tree *l = NULL, *args = NULL, *out = NULL, *yes = NULL;
    NBT_OK(ctx, nb_tree_array(v, &l));
    args = nbt_tuple_take(ctx, 1, (nb_tree *[]){l});
    NBT_OK(ctx, nb_fn_call(jf, args, &out));
    for (int k = 0; k < 4; k++) {
        NBT_EQ_F64(flat(nb_tree_get_array(out), k), 10.0 * (2 + k) + 1);
    }
    nb_tree_destroy(out);
    NBT_OK(ctx, nb_tree_bool(ctx, true, &yes));
    nb_call_opts co = nb_call_opts_default();
    co.donate = yes;
    NBT_OK(ctx, nb_fn_call_ex(jf, args, &co, &out));
    for (int k = 0; k < 8; k++) { /* rows 0 and 3 as they were; 1 and 2 now 10 x + 1 */
        double want = k >= 2 && k < 6 ? 10.0 * k + 1 : k;
        NBT_EQ_F64(flat(a, k), want);
        if (k >= 2 && k < 6) {
            NBT_EQ_F64(flat(nb_tree_get_array(out), k - 2), want);
        }
    }
    nb_tree_destroy(out);
    nb_tree_destroy(yes);
    nb_tree_destroy(args);
    nb_fn_destroy(jf);
    nb_fn_destroy(f);
    nb_array_destroy(v);
    nb_array_destroy(a);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_split_keys(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    nb_array *key = NULL, *all = NULL, *k[3] = {NULL, NULL, NULL};
    NBT_OK(ctx, nb_random_key(ctx, 42, &key));
    NBT_OK(ctx, nb_random_split(key, 3, &all));
    NBT_OK(ctx, nb_random_split_keys(key, 3, k));
    for (int i = 0; i < 3; i++) {
        nb_array *row = NULL, *u1 = NULL, *u2 = NULL;
        NBT_OK(ctx, nb_array_index(all, i, &row));
        bool same = false;
        NBT_OK(ctx, nb_array_identical(row, k[i], &same));
        NBT_TRUE(same);
        NBT_EQ_I64(nb_array_rank(k[i]), 1);
        NBT_EQ_I64(nb_array_dim(k[i], 0), 2);
        /* a key held alone samples as the row does */
        NBT_OK(ctx, nb_random_uniform(row, NB_DTYPE_F32, 1, (int64_t[]){5}, 0.0, 1.0, &u1));
        NBT_OK(ctx, nb_random_uniform(k[i], NB_DTYPE_F32, 1, (int64_t[]){5}, 0.0, 1.0, &u2));
        NBT_OK(ctx, nb_array_identical(u1, u2, &same));
        NBT_TRUE(same);
        nb_array_destroy(row);
        nb_array_destroy(u1);
        nb_array_destroy(u2);
    }
    /* errors leave every entry NULL */
    nb_array *bad[2] = {(nb_array *)key, (nb_array *)key};
    NBT_STATUS(ctx, NB_ERR_INVALID, nb_random_split_keys(key, 0, bad));
    NBT_ERRMSG_HAS(ctx, "nb_random_split_keys: n is 0");
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_random_split_keys(all, 2, bad));
    NBT_ERRMSG_HAS(ctx, "nb_random_split_keys: a key is an i32[2] array, got i32[3,2]");
    NBT_TRUE(bad[0] == NULL && bad[1] == NULL);
    for (int i = 0; i < 3; i++) {
        nb_array_destroy(k[i]);
    }
    nb_array_destroy(all);
    nb_array_destroy(key);
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static void test_reductions(void **state) {
    (void)state;
    nb_ctx *ctx = nbt_ctx();
    /* [2,3,4]: values with a tie and a NaN placed */
    double v[24];
    for (int i = 0; i < 24; i++) {
        v[i] = (double)((i * 7) % 11);
    }
    v[5] = 10; /* row (0,1): 10 at q = 1 and q = 2 */
    v[6] = 10;
    v[13] = NAN; /* row (1,0): NaN at q = 1 */
    nb_array *a = nbt_arr_f64(ctx, 3, (int64_t[]){2, 3, 4}, v), *am = NULL, *a0 = NULL;
    NBT_OK(ctx, nb_array_argmax(a, -1, &am));
    NBT_EQ_I64(nb_array_rank(am), 2);
    NBT_EQ_I64(nb_array_dtype(am), NB_DTYPE_I64);
    for (int r = 0; r < 6; r++) {
        int64_t best = 0;
        for (int q = 1; q < 4 && !isnan(v[r * 4 + best]); q++) {
            if (v[r * 4 + q] > v[r * 4 + best] || isnan(v[r * 4 + q])) {
                best = q;
            }
        }
        int64_t got = -1;
        NBT_OK(ctx, nb_array_get_i64(am, (int64_t[]){r / 3, r % 3}, &got));
        NBT_EQ_I64(got, best);
    }
    int64_t g = -1;
    NBT_OK(ctx, nb_array_get_i64(am, (int64_t[]){0, 1}, &g));
    NBT_EQ_I64(g, 1); /* the first of the tie */
    NBT_OK(ctx, nb_array_get_i64(am, (int64_t[]){1, 0}, &g));
    NBT_EQ_I64(g, 1);                        /* the NaN */
    NBT_OK(ctx, nb_array_argmax(a, 0, &a0)); /* over the first axis: [3,4] */
    NBT_EQ_I64(nb_array_dim(a0, 0), 3);
    NBT_OK(ctx, nb_array_get_i64(a0, (int64_t[]){0, 1}, &g));
    NBT_EQ_I64(g, 1); /* v[1] = 7 against v[13] = NaN */
    NBT_OK(ctx, nb_array_get_i64(a0, (int64_t[]){2, 3}, &g));
    NBT_EQ_I64(g, v[23] > v[11] ? 1 : 0);
    /* an accuracy: i64 predictions against i32 labels */
    int32_t lab[6] = {0, 1, 3, 1, 2, 0};
    nb_array *labels = NULL;
    NBT_OK(ctx, nb_array_from_data(ctx, NB_DTYPE_I32, 2, (int64_t[]){2, 3}, lab, &labels));
    int64_t correct = -1, want = 0;
    for (int r = 0; r < 6; r++) {
        int64_t p = -1;
        NBT_OK(ctx, nb_array_get_i64(am, (int64_t[]){r / 3, r % 3}, &p));
        want += p == lab[r];
    }
    NBT_OK(ctx, nb_array_count_equal(am, labels, &correct));
    NBT_EQ_I64(correct, want);
    NBT_TRUE(want > 0 && want < 6);
    /* sum and mean */
    double s = 0, m = 0;
    nb_array *f = nbt_arr_f64(ctx, 1, (int64_t[]){4}, (double[]){1.5, -2, 4, 0.25}), *e = NULL;
    NBT_OK(ctx, nb_array_sum(f, &s));
    NBT_EQ_F64(s, 3.75);
    NBT_OK(ctx, nb_array_mean(f, &m));
    NBT_EQ_F64(m, 3.75 / 4);
    NBT_OK(ctx, nb_array_sum(labels, &s));
    NBT_EQ_F64(s, 7);
    NBT_OK(ctx, nb_array_zeros(ctx, NB_DTYPE_F32, 1, (int64_t[]){0}, &e));
    NBT_OK(ctx, nb_array_mean(e, &m));
    NBT_TRUE(isnan(m));
    /* errors */
    nb_array *o = NULL;
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_argmax(a, 3, &o));
    NBT_ERRMSG_HAS(ctx, "nb_array_argmax: axis 3 is out of range for f64[2,3,4] (valid: -3..2)");
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_argmax(e, 0, &o));
    NBT_ERRMSG_HAS(ctx, "nb_array_argmax: axis 0 of f32[0] is empty");
    NBT_STATUS(ctx, NB_ERR_SHAPE, nb_array_count_equal(am, f, &correct));
    NBT_ERRMSG_HAS(ctx, "nb_array_count_equal: a i64[2,3] and b f64[4] differ in shape");
    NBT_EQ_I64(correct, 0);
    NBT_STATUS(ctx, NB_ERR_MISUSE, nb_array_sum(f, NULL));
    NBT_ERRMSG_HAS(ctx, "nb_array_sum");
    nb_array *all[] = {a, am, a0, labels, f, e};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        nb_array_destroy(all[i]);
    }
    nbt_assert_no_live(ctx);
    nb_ctx_destroy(ctx);
}

static nb_status scenario_views(nb_ctx *ctx) {
    nb_array *a = NULL, *r = NULL, *rs = NULL, *key = NULL, *k[4] = {NULL};
    nb_status st = nb_array_zeros(ctx, NB_DTYPE_F32, 2, (int64_t[]){5, 3}, &a);
    if (st == NB_OK) {
        st = nb_array_index(a, 2, &r);
    }
    if (st == NB_OK) {
        st = nb_array_rows(a, 1, 4, &rs);
    }
    if (st == NB_OK) {
        st = nb_random_key(ctx, 3, &key);
    }
    if (st == NB_OK) {
        st = nb_random_split_keys(key, 4, k);
    }
    for (int i = 0; i < 4; i++) {
        nb_array_destroy(k[i]);
    }
    nb_array_destroy(key);
    nb_array_destroy(rs);
    nb_array_destroy(r);
    nb_array_destroy(a);
    return st;
}

static void test_out_of_memory(void **state) {
    (void)state;
    /* the arrays' buffers (a view has none of its own), the handles' pool blocks */
    int n = nbt_oom_sweep("scenario_views", scenario_views, true, true);
    printf("allocation failures: %d points, each NB_ERR_OOM with nothing leaked\n", n);
    NBT_TRUE(n >= 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_and_rows), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_views_in_calls), cmocka_unit_test(test_split_keys),
        cmocka_unit_test(test_reductions),     cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
