/*
 * rnn.c -- recurrent cells (Equinox's eqx.nn.GRUCell and eqx.nn.LSTMCell): one step of
 * the recurrence, to be run over a sequence by nb_scan (nabla/loops.h; its checkpointed
 * form for long sequences).
 *
 * Initialisation, as Equinox: lim = sqrt(1 / hidden);
 *   GRU:  ihkey, hhkey, bkey, bkey2 = split(key, 4); weight_ih [3H, in], weight_hh
 *         [3H, H], bias [3H], bias_n [H], all U(-lim, lim);
 *   LSTM: ihkey, hhkey, bkey = split(key, 3); weight_ih [4H, in], weight_hh [4H, H],
 *         bias [4H].
 * Steps (gates in that order along the 3H / 4H rows):
 *   GRU:  i = W_ih x + bias, g = W_hh h; r = sigmoid(i_r + g_r), z = sigmoid(i_z + g_z),
 *         n = tanh(i_n + r * (g_n + bias_n)); h' = n + z * (h - n);
 *   LSTM: l = W_ih x + W_hh h + bias; i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of its
 *         quarters; c' = f * c + i * g; h' = o * tanh(c').
 * x may carry leading batch dims ([.., in] with h [.., H]); the products are then one
 * matrix product each (x W^T).
 *
 * nb_nn_gru runs the GRU cell over a sequence (PyTorch's nn.GRU, one layer): the input
 * side W_ih x + bias of every step is one product over all T steps before nb_scan, whose
 * step then makes only W_hh h and the gates -- so reverse mode's gradients of W_ih and of
 * the inputs are one product each after the reverse sweep too, where a scan of
 * nb_nn_gru_cell makes three small ones per step.
 */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

static nb_status nbi_rnn_make(nb_ctx *ctx, const char *fn, bool gru, int64_t in, int64_t hidden,
                              bool use_bias, nb_dtype dtype, const nb_array *key, nb_tree **layer) {
    nb_status st = nbi_nn_args(ctx, fn, layer);
    if (ctx == NULL) {
        st = nbi_err_null_ctx(key, fn);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "input_size", in, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_size(ctx, fn, "hidden_size", hidden, 1);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_dtype(ctx, fn, dtype);
    }
    if (st == NB_OK) {
        st = nbi_nn_check_key(ctx, fn, key);
    }
    if (st != NB_OK) {
        return st;
    }
    int64_t g = gru ? 3 : 4;
    double lim = sqrt(1.0 / (double)hidden);
    nb_array *keys = NULL, *k[4] = {NULL, NULL, NULL, NULL}, *a[4] = {NULL, NULL, NULL, NULL};
    st = nb_random_split(key, gru ? 4 : 3, &keys);
    for (int i = 0; i < (gru ? 4 : 3) && st == NB_OK; i++) {
        st = nbi_nn_key_row(keys, i, &k[i]);
    }
    if (st == NB_OK) {
        st = nbi_nn_uniform(k[0], dtype, 2, (const int64_t[]){g * hidden, in}, lim, &a[0]);
    }
    if (st == NB_OK) {
        st = nbi_nn_uniform(k[1], dtype, 2, (const int64_t[]){g * hidden, hidden}, lim, &a[1]);
    }
    if (st == NB_OK && use_bias) {
        st = nbi_nn_uniform(k[2], dtype, 1, (const int64_t[]){g * hidden}, lim, &a[2]);
    }
    if (st == NB_OK && use_bias && gru) {
        st = nbi_nn_uniform(k[3], dtype, 1, &hidden, lim, &a[3]);
    }
    nb_array_destroy(keys);
    for (int i = 0; i < 4; i++) {
        nb_array_destroy(k[i]);
    }
    if (st != NB_OK) {
        for (int i = 0; i < 4; i++) {
            nb_array_destroy(a[i]);
        }
        return st;
    }
    nbi_nn_dict d;
    nbi_nn_dict_begin(&d, ctx, gru ? "gru_cell" : "lstm_cell");
    nbi_nn_put_array(&d, "weight_ih", NB_OK, a[0]);
    nbi_nn_put_array(&d, "weight_hh", NB_OK, a[1]);
    if (use_bias) {
        nbi_nn_put_array(&d, "bias", NB_OK, a[2]);
    } else {
        nbi_nn_put_null(&d, "bias");
    }
    if (gru) {
        if (use_bias) {
            nbi_nn_put_array(&d, "bias_n", NB_OK, a[3]);
        } else {
            nbi_nn_put_null(&d, "bias_n");
        }
    }
    nbi_nn_put_int(&d, "input_size", in);
    nbi_nn_put_int(&d, "hidden_size", hidden);
    nbi_nn_put_bool(&d, "use_bias", use_bias);
    return nbi_nn_dict_finish(&d, layer);
}

nb_status nb_nn_gru_cell_init(nb_ctx *ctx, int64_t input_size, int64_t hidden_size, bool use_bias,
                              nb_dtype dtype, const nb_array *key, nb_tree **layer) {
    return nbi_rnn_make(ctx, "nb_nn_gru_cell_init", true, input_size, hidden_size, use_bias, dtype,
                        key, layer);
}

nb_status nb_nn_lstm_cell_init(nb_ctx *ctx, int64_t input_size, int64_t hidden_size, bool use_bias,
                               nb_dtype dtype, const nb_array *key, nb_tree **layer) {
    return nbi_rnn_make(ctx, "nb_nn_lstm_cell_init", false, input_size, hidden_size, use_bias,
                        dtype, key, layer);
}

/* W v for v [.., n] and W [m, n]: W @ v unbatched (Equinox's order), v W^T batched. */
static nb_var *nbi_rnn_mv(nb_var *wv, nb_var *v) {
    if (nb_var_rank(v) == 1) {
        return nb_matmul(wv, v);
    }
    return nb_matmul(v, nb_transpose(wv, NULL));
}

/* Part i of n equal parts of x's last dim. */
static nb_var *nbi_rnn_part(nb_var *x, int i, int n) {
    int r = nb_var_rank(x);
    int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
    memcpy(stop, nb_var_shape(x), (size_t)r * sizeof(int64_t));
    int64_t len = stop[r - 1] / n;
    start[r - 1] = i * len;
    stop[r - 1] = (i + 1) * len;
    return nb_slice(x, start, stop, NULL);
}

/* Reads the cell and checks x [.., in] and the states [.., H] (the same leading dims). */
static bool nbi_rnn_begin(nbi_nn_at *at, nb_trace *tr, const char *fn, const char *kind,
                          const nb_tree *layer, nb_var *x, nb_var *h, nb_var *c, int64_t g,
                          nb_var **wih, nb_var **whh, nb_var **b, nb_var **bn) {
    if (!nbi_nn_begin(at, tr, fn, kind, layer)) {
        return false;
    }
    int64_t in = 0, hid = 0;
    if (!nbi_nn_int(at, "input_size", &in) || !nbi_nn_int(at, "hidden_size", &hid)) {
        return false;
    }
    char w[NB_PATH_MAX + 64], xs[96], hs[96], cs[96];
    if (in < 1 || hid < 1 || in > NBI_NN_SIZE_MAX || hid > NBI_NN_SIZE_MAX) {
        nbi_nn_fail(at, NB_ERR_INVALID,
                    "%s has invalid static sizes (input_size %lld, hidden_size %lld); make it "
                    "with nb_nn_%s_init",
                    nbi_nn_where(at, w, sizeof w), (long long)in, (long long)hid, kind);
        return false;
    }
    char ex[64], eh[64];
    snprintf(ex, sizeof ex, "[..., %lld] (input_size)", (long long)in);
    snprintf(eh, sizeof eh, "[..., %lld] (hidden_size)", (long long)hid);
    if (!nbi_nn_check_input(at, x, 1, NB_MAX_RANK, ex) ||
        !nbi_nn_check_input(at, h, 1, NB_MAX_RANK, eh) ||
        (g == 4 && !nbi_nn_check_input(at, c, 1, NB_MAX_RANK, eh))) { /* LSTM: c required */
        return false;
    }
    int r = nb_var_rank(x);
    bool ok = nb_var_dim(x, -1) == in && nb_var_rank(h) == r && nb_var_dim(h, -1) == hid &&
              (c == NULL || (nb_var_rank(c) == r && nb_var_dim(c, -1) == hid)) &&
              nb_var_dtype(h) == nb_var_dtype(x) &&
              (c == NULL || nb_var_dtype(c) == nb_var_dtype(x));
    for (int a = 0; ok && a < r - 1; a++) {
        ok = nb_var_dim(h, a) == nb_var_dim(x, a) &&
             (c == NULL || nb_var_dim(c, a) == nb_var_dim(x, a));
    }
    if (!ok) {
        nbi_nn_fail(at, NB_ERR_SHAPE,
                    "%s got x %s and %s %s%s%s; expected x %s and the state%s %s, of one dtype "
                    "and with the same leading (batch) dims",
                    nbi_nn_where(at, w, sizeof w), nbi_nn_sig(xs, sizeof xs, x),
                    c != NULL ? "states h, c" : "state h", nbi_nn_sig(hs, sizeof hs, h),
                    c != NULL ? ", " : "", c != NULL ? nbi_nn_sig(cs, sizeof cs, c) : "", ex,
                    c != NULL ? "s" : "", eh);
        return false;
    }
    *bn = NULL;
    return nbi_nn_param(at, "weight_ih", false, 2, (const int64_t[]){g * hid, in}, x, wih) &&
           nbi_nn_param(at, "weight_hh", false, 2, (const int64_t[]){g * hid, hid}, x, whh) &&
           nbi_nn_param(at, "bias", true, 1, (const int64_t[]){g * hid}, x, b) &&
           (g != 3 || nbi_nn_param(at, "bias_n", true, 1, &hid, x, bn));
}

/* A GRU step from its input side ig = W_ih x + bias: h' from h, W_hh and bias_n (or NULL). */
static nb_var *nbi_gru_gates(nb_var *ig, nb_var *h, nb_var *whh, nb_var *bn) {
    nb_var *hg = nbi_rnn_mv(whh, h);
    nb_var *reset = nb_sigmoid(nb_add(nbi_rnn_part(ig, 0, 3), nbi_rnn_part(hg, 0, 3)));
    nb_var *inp = nb_sigmoid(nb_add(nbi_rnn_part(ig, 1, 3), nbi_rnn_part(hg, 1, 3)));
    nb_var *hn = nbi_rnn_part(hg, 2, 3);
    if (bn != NULL) {
        hn = nb_add(hn, bn);
    }
    nb_var *nw = nb_tanh(nb_add(nbi_rnn_part(ig, 2, 3), nb_mul(reset, hn)));
    return nb_add(nw, nb_mul(inp, nb_sub(h, nw)));
}

nb_var *nb_nn_gru_cell(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *h) {
    nbi_nn_at at;
    nb_var *wih = NULL, *whh = NULL, *b = NULL, *bn = NULL;
    if (!nbi_rnn_begin(&at, tr, "nb_nn_gru_cell", "gru_cell", layer, x, h, NULL, 3, &wih, &whh, &b,
                       &bn)) {
        return tr != NULL ? tr->poison : NULL;
    }
    nb_var *ig = nbi_rnn_mv(wih, x);
    if (b != NULL) {
        ig = nb_add(ig, b);
    }
    return nbi_gru_gates(ig, h, whh, bn);
}

/* nb_nn_gru's step, nb_nn_gru_cell's arithmetic from the projected input: self = the
 * layer, args = (h, ig_t) -> (h', h'). */
static nb_status nbi_gru_seq_step(nb_trace *tr, const nb_tree *self, const nb_tree *args,
                                  nb_tree **out) {
    nbi_nn_at at;
    nb_var *h = nb_get(tr, args, "[0]"), *ig = nb_get(tr, args, "[1]");
    nb_var *whh = NULL, *bn = NULL;
    int64_t hid = nb_var_dim(h, -1);
    if (!nbi_nn_begin(&at, tr, "nb_nn_gru", "gru_cell", self) ||
        !nbi_nn_param(&at, "weight_hh", false, 2, (const int64_t[]){3 * hid, hid}, h, &whh) ||
        !nbi_nn_param(&at, "bias_n", true, 1, &hid, h, &bn)) {
        return nb_trace_status(tr);
    }
    nb_var *h2 = nbi_gru_gates(ig, h, whh, bn);
    return nb_tree_tuple(nb_trace_ctx(tr), 2, (nb_tree *[]){nb_leaf(h2), nb_leaf(h2)}, out);
}

nb_var *nb_nn_gru(nb_trace *tr, const nb_tree *layer, nb_var *xs, nb_var *h0,
                  const nb_loop_opts *opts) {
    nbi_nn_at at;
    if (!nbi_nn_begin(&at, tr, "nb_nn_gru", "gru_cell", layer)) {
        return tr != NULL ? tr->poison : NULL;
    }
    char w[NB_PATH_MAX + 64], xsig[96], hsig[96];
    if (!nbi_nn_check_input(&at, xs, 2, NB_MAX_RANK, "[T, ..., input_size]") ||
        !nbi_nn_check_input(&at, h0, 1, NB_MAX_RANK, "[..., hidden_size]")) {
        return tr->poison;
    }
    int r = nb_var_rank(xs);
    bool ok = nb_var_rank(h0) == r - 1;
    for (int a = 1; ok && a < r - 1; a++) {
        ok = nb_var_dim(xs, a) == nb_var_dim(h0, a - 1);
    }
    if (!ok) {
        return nbi_nn_fail(&at, NB_ERR_SHAPE,
                           "%s got xs %s and h0 %s; expected xs [T, ..., input_size] (the "
                           "sequence along axis 0) and h0 [..., hidden_size] with xs's dims "
                           "after T as its leading (batch) dims",
                           nbi_nn_where(&at, w, sizeof w), nbi_nn_sig(xsig, sizeof xsig, xs),
                           nbi_nn_sig(hsig, sizeof hsig, h0));
    }
    /* the cell's checks on one step's x: [..., in] */
    int64_t start[NB_MAX_RANK] = {0}, stop[NB_MAX_RANK];
    memcpy(stop, nb_var_shape(xs), (size_t)r * sizeof(int64_t));
    stop[0] = 1;
    nb_var *x0 = nb_reshape(nb_slice(xs, start, stop, NULL), r - 1, nb_var_shape(xs) + 1);
    nb_var *wih = NULL, *whh = NULL, *b = NULL, *bn = NULL;
    if (!nbi_rnn_begin(&at, tr, "nb_nn_gru", "gru_cell", layer, x0, h0, NULL, 3, &wih, &whh, &b,
                       &bn)) {
        return tr->poison;
    }
    /* the input side of every step: one product over T x batch rows */
    int64_t in = nb_var_dim(xs, -1), g3 = nb_var_dim(wih, 0), rows = 1;
    for (int a = 0; a < r - 1; a++) {
        rows *= nb_var_dim(xs, a);
    }
    nb_var *ig = nb_matmul(nb_reshape(xs, 2, (const int64_t[]){rows, in}), nb_transpose(wih, NULL));
    if (b != NULL) {
        ig = nb_add(ig, b);
    }
    int64_t shape[NB_MAX_RANK];
    memcpy(shape, nb_var_shape(xs), (size_t)r * sizeof(int64_t));
    shape[r - 1] = g3;
    ig = nb_reshape(ig, r, shape);
    nb_fn *f = NULL;
    nb_status st = nb_fn_create(nb_trace_ctx(tr), "nb_nn_gru step", nbi_gru_seq_step, layer, &f);
    if (st != NB_OK) {
        return nbi_nn_fail(&at, st, "cannot create the scan's step");
    }
    nb_loop_opts lo = nb_loop_opts_default();
    if (opts != NULL) {
        lo = *opts;
    } else {
        lo.kind = NB_LOOP_BOUNDED;
    }
    const nb_tree *res = nb_scan(tr, f, nb_leaf(h0), nb_leaf(ig), nb_var_dim(xs, 0), &lo);
    nb_fn_destroy(f);
    return nb_get(tr, res, "[1]");
}

nb_var *nb_nn_lstm_cell(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *h, nb_var *c,
                        nb_var **c_out) {
    if (c_out != NULL) {
        *c_out = tr != NULL ? tr->poison : NULL;
    }
    nbi_nn_at at;
    nb_var *wih = NULL, *whh = NULL, *b = NULL, *bn = NULL;
    if (c_out == NULL) {
        memset(&at, 0, sizeof at);
        if (tr == NULL || nb_trace_status(tr) != NB_OK) {
            return tr != NULL ? tr->poison : NULL;
        }
        at.tr = tr;
        at.fn = "nb_nn_lstm_cell";
        at.kind = "lstm_cell";
        return nbi_nn_fail(&at, NB_ERR_MISUSE,
                           "c_out is NULL; the cell returns h' and writes the new cell state "
                           "c' there");
    }
    if (!nbi_rnn_begin(&at, tr, "nb_nn_lstm_cell", "lstm_cell", layer, x, h, c, 4, &wih, &whh, &b,
                       &bn)) {
        return tr != NULL ? tr->poison : NULL;
    }
    nb_var *lin = nb_add(nbi_rnn_mv(wih, x), nbi_rnn_mv(whh, h));
    if (b != NULL) {
        lin = nb_add(lin, b);
    }
    nb_var *i = nb_sigmoid(nbi_rnn_part(lin, 0, 4));
    nb_var *f = nb_sigmoid(nbi_rnn_part(lin, 1, 4));
    nb_var *g = nb_tanh(nbi_rnn_part(lin, 2, 4));
    nb_var *o = nb_sigmoid(nbi_rnn_part(lin, 3, 4));
    nb_var *c2 = nb_add(nb_mul(f, c), nb_mul(i, g));
    *c_out = c2;
    return nb_mul(o, nb_tanh(c2));
}
