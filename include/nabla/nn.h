/*
 * nabla/nn.h -- neural-network layers as pytrees: Linear, MLP, Embedding, Dropout,
 * Sequential; Conv1d/2d/3d and ConvTranspose1d/2d/3d; MaxPool, AvgPool and adaptive
 * pooling; LayerNorm, RMSNorm, GroupNorm, BatchNorm (with a state tree);
 * MultiheadAttention; GRUCell and LSTMCell.
 *
 * The C form of Equinox's modules. A layer is a dict tree holding its parameter arrays
 * (dynamic leaves: traced, differentiated, updated by optimizers) and its configuration as
 * static leaves (sizes, flags, the activation function as a function-reference leaf, and
 * a "kind" string naming the layer), e.g. a Linear layer prints as
 *     dict { kind: "linear"  weight: f32[out,in]  bias: f32[out]  in_features: 3 ... }
 * Models are trees of layers: put them in dicts and lists like any other parameters, pass
 * them as args[0] to nb_grad, save them, map over them. Changing a static leaf (an
 * activation, a dropout flag) retraces, as changing a static field does in Equinox.
 *
 * Each layer has two halves:
 *   - an eager init function (nb_nn_<layer>_init) that takes the sizes, options, dtype
 *     (NB_DTYPE_F32 or NB_DTYPE_F64) and a PRNG key (an i32[2] array from nb_random_key or
 *     a row of nb_random_split, see random.h) and returns a new tree;
 *   - a traced apply function (nb_nn_<layer>) for use inside a function body, taking the
 *     layer as the body received it -- a subtree of args or self whose array leaves are
 *     vars (array leaves that are still concrete arrays are used as constants) -- and
 *     returning a var. Like every op it never needs its result checked: a wrong input
 *     shape or a tree that is not the layer it should be is a sticky trace error whose
 *     message names the layer kind, the leaf path, the shapes and the fix.
 *
 * Initialisation follows Equinox's rules exactly (tests/nn checks values against
 * Equinox's own; uniform draws are bit-identical, normal draws within a few ULP):
 *   - Linear(in, out): keys = split(key, 2); weight [out, in] ~ U(-lim, lim) with key 0,
 *     bias [out] ~ U(-lim, lim) with key 1, lim = 1/sqrt(in) (both, as PyTorch);
 *   - MLP(in, out, width, depth): keys = split(key, depth + 1); layer i (depth + 1
 *     Linears: in->width, width->width x (depth-1), width->out; one in->out Linear when
 *     depth is 0) is made with key i;
 *   - LayerNorm(shape): weight ones, bias zeros;
 *   - Embedding(num, dim): weight [num, dim] ~ N(0, 1) with key itself;
 *   - Conv2d(in, out, (kh, kw), groups): keys = split(key, 2); weight [out, in/groups, kh,
 *     kw] and bias [out, 1, 1] ~ U(-lim, lim), lim = 1/sqrt(in/groups * kh * kw).
 * and the forward computations are Equinox's, extended to leading batch dims where
 * Equinox would need vmap: Linear y = x W^T + b on [..., in]; LayerNorm over the trailing
 * dims with the biased variance (jnp.var); Conv2d as lax.conv_general_dilated on [C,H,W]
 * or [N,C,H,W]; Dropout as jnp.where(bernoulli(key, 1-p), x / (1-p), 0).
 *
 * The layers added later follow Equinox the same way (init rules and forward formulas in
 * their source files: src/nn/conv.c, pool.c, norm.c, batch_norm.c, attention.c, rnn.c;
 * tests/nn/test_layers.c checks them against Equinox 0.13.8).
 *
 * Convolutions are computed by im2col: the input cut into its receptive fields (one op,
 * the padding a bounds test), a [C*K, L] matrix per example, multiplied by the weight
 * reshaped to [O, C*K] (BLIS, example by example; per group likewise). Its gradient is the
 * transposed product and col2im. Everything else is built from traced primitives, so
 * gradients, jit, vmap and fusion come for free.
 *
 * Statuses of the init functions: NB_OK; NB_ERR_MISUSE (NULL ctx, key or out, a destroyed
 * key); NB_ERR_SHAPE (key is not an i32[2] array); NB_ERR_INVALID (a size < 1 or > 2^31, a
 * dtype other than f32/f64, p outside [0, 1), groups that do not divide the channels, ...
 * with a message on the context saying which argument and why); NB_ERR_OVERFLOW (a
 * parameter array too large to allocate); NB_ERR_OOM. On failure *out is NULL. They
 * allocate; the tree returned is yours to destroy (nb_tree_destroy).
 *
 * Thread rule: as for the context the trees are made on (one thread at a time).
 */
#ifndef NABLA_NN_H
#define NABLA_NN_H

#include "array.h"
#include "core.h"
#include "loops.h"
#include "trace.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An activation: a traced elementwise function, e.g. nb_relu, nb_tanh, nb_sigmoid,
 * nb_gelu, nb_softplus, nb_nn_identity, or one of your own. Stored in layer trees as a
 * function-reference leaf (static: compared by pointer and name). */
typedef nb_var *(*nb_nn_activation)(nb_var *x);

/* ---- options ------------------------------------------------------------------------ */
typedef struct nb_nn_mlp_opts {
    nb_nn_activation activation;       /* after every hidden layer; default nb_relu */
    nb_nn_activation final_activation; /* after the output layer; default nb_nn_identity */
    /* Names stored with the function references (shown in messages and retrace reasons).
     * NULL (default): "relu", "tanh", "sigmoid", "gelu", "softplus", "identity" for those
     * functions, "activation" for any other. */
    const char *activation_name;
    const char *final_activation_name;
    bool use_bias;       /* bias on the hidden layers; default true */
    bool use_final_bias; /* bias on the output layer; default true */
} nb_nn_mlp_opts;

NB_API nb_nn_mlp_opts nb_nn_mlp_opts_default(void);

typedef struct nb_nn_conv2d_opts {
    int64_t stride[2];     /* (sh, sw) >= 1; default (1, 1) */
    int64_t padding[2][2]; /* zeros added {{top, bottom}, {left, right}}, >= 0; default 0 */
    int64_t dilation[2];   /* (dh, dw) >= 1: kernel taps dh rows apart; default (1, 1) */
    int64_t groups;        /* >= 1, dividing in and out channels; default 1 */
    bool use_bias;         /* default true */
} nb_nn_conv2d_opts;

NB_API nb_nn_conv2d_opts nb_nn_conv2d_opts_default(void);

/* How a convolution pads its input (Equinox's padding argument). */
typedef enum nb_nn_padding_kind {
    NB_NN_PAD_EXPLICIT = 0, /* the (lo, hi) amounts of nb_nn_conv_opts.padding */
    NB_NN_PAD_VALID,        /* none */
    NB_NN_PAD_SAME,         /* ceil(size / stride) outputs; an odd total puts one more after */
    NB_NN_PAD_SAME_LOWER    /* the same with the odd element before */
} nb_nn_padding_kind;

/* Options of Conv1d/2d/3d and ConvTranspose1d/2d/3d (entries past nd are ignored). */
typedef struct nb_nn_conv_opts {
    int64_t stride[3];               /* >= 1; default 1 */
    int64_t padding[3][2];           /* (lo, hi) zeros per spatial dim, >= 0; default 0 */
    nb_nn_padding_kind padding_kind; /* default NB_NN_PAD_EXPLICIT (the amounts above) */
    int64_t dilation[3];             /* >= 1: kernel taps d apart; default 1 */
    int64_t output_padding[3];       /* transposed only: extra outputs after, < stride; 0 */
    int64_t groups;                  /* >= 1, dividing in and out channels; default 1 */
    bool use_bias;                   /* default true */
} nb_nn_conv_opts;

NB_API nb_nn_conv_opts nb_nn_conv_opts_default(void);

/* Options of MaxPool / AvgPool (Equinox's defaults: stride 1 -- not the window size as in
 * PyTorch -- no padding, floor). */
typedef struct nb_nn_pool_opts {
    int64_t stride[3];     /* >= 1; default 1 */
    int64_t padding[3][2]; /* (lo, hi) per spatial dim, each <= the window size; default 0 */
    bool use_ceil;         /* pad the end by the stride when windows do not tile a dim */
} nb_nn_pool_opts;

NB_API nb_nn_pool_opts nb_nn_pool_opts_default(void);

typedef struct nb_nn_group_norm_opts {
    double eps;              /* >= 0; default 1e-5 */
    bool channelwise_affine; /* a weight (ones) and bias (zeros) per channel; default true */
    /* The channel axis of the input: 0 (default, Equinox: one example [C, ...]) or 1 for a
     * batch [N, C, ...] normalised example by example; negative counts from the end. */
    int channel_axis;
} nb_nn_group_norm_opts;

NB_API nb_nn_group_norm_opts nb_nn_group_norm_opts_default(void);

typedef enum nb_nn_batch_norm_mode {
    NB_NN_BATCH_NORM_BATCH = 0, /* Equinox's mode="batch" (its recommendation) */
    NB_NN_BATCH_NORM_EMA        /* Equinox's mode="ema" (its backward-compatible default) */
} nb_nn_batch_norm_mode;

typedef struct nb_nn_batch_norm_opts {
    double eps;                 /* >= 0; default 1e-5 */
    bool channelwise_affine;    /* default true */
    double momentum;            /* in [0, 1]; default 0.99 */
    nb_nn_batch_norm_mode mode; /* default NB_NN_BATCH_NORM_BATCH */
    bool inference;             /* default false (use nb_nn_inference_mode to switch) */
} nb_nn_batch_norm_opts;

NB_API nb_nn_batch_norm_opts nb_nn_batch_norm_opts_default(void);

/* Options of MultiheadAttention; 0 sizes take Equinox's defaults (key_size, value_size,
 * output_size: query_size; qk_size, vo_size: query_size / num_heads). */
typedef struct nb_nn_mha_opts {
    int64_t key_size, value_size, output_size, qk_size, vo_size;
    bool use_query_bias, use_key_bias, use_value_bias, use_output_bias; /* default false */
    double dropout_p; /* on the attention weights, in [0, 1); default 0 */
    bool inference;   /* the dropout's flag; default false */
    bool causal;      /* mask key positions after the query's (j > i); default false */
} nb_nn_mha_opts;

NB_API nb_nn_mha_opts nb_nn_mha_opts_default(void);

/* ---- init (eager) ------------------------------------------------------------------- */
/* Linear: dict {kind "linear", weight [out, in], bias [out] (null without bias),
 * in_features, out_features, use_bias}. in, out >= 1. */
NB_API nb_status nb_nn_linear_init(nb_ctx *ctx, int64_t in, int64_t out, bool use_bias,
                                   nb_dtype dtype, const nb_array *key, nb_tree **layer);
/* MLP: dict {kind "mlp", layers: list of depth + 1 Linears, activation, final_activation
 * (fn leaves), in_size, out_size, width_size, depth, use_bias, use_final_bias}.
 * in, out >= 1; depth >= 0; width >= 1 when depth > 0. opts may be NULL (defaults). */
NB_API nb_status nb_nn_mlp_init(nb_ctx *ctx, int64_t in, int64_t out, int64_t width, int64_t depth,
                                const nb_nn_mlp_opts *opts, nb_dtype dtype, const nb_array *key,
                                nb_tree **layer);
/* LayerNorm over trailing dims of the given shape (rank 1..8, dims >= 1): dict {kind
 * "layer_norm", weight (ones of shape, or null), bias (zeros, or null), shape (a tuple of
 * ints), eps, use_weight, use_bias}. eps >= 0 and finite (Equinox's default is 1e-5). */
NB_API nb_status nb_nn_layer_norm_init(nb_ctx *ctx, int rank, const int64_t *shape, double eps,
                                       bool use_weight, bool use_bias, nb_dtype dtype,
                                       nb_tree **layer);
/* Embedding: dict {kind "embedding", weight [num, dim] ~ N(0, 1), num_embeddings,
 * embedding_size}. num, dim >= 1. */
NB_API nb_status nb_nn_embedding_init(nb_ctx *ctx, int64_t num, int64_t dim, nb_dtype dtype,
                                      const nb_array *key, nb_tree **layer);
/* Dropout: dict {kind "dropout", p, inference}. 0 <= p < 1 (Equinox's default is 0.5);
 * no parameters, so no key or dtype. */
NB_API nb_status nb_nn_dropout_init(nb_ctx *ctx, double p, bool inference, nb_tree **layer);
/* Conv2d: dict {kind "conv2d", weight [out, in/groups, kh, kw], bias [out, 1, 1] (or null),
 * in_channels, out_channels, kernel_size, stride, dilation (tuples of 2 ints), padding (a
 * tuple of 2 (lo, hi) tuples), groups, use_bias}. in, out, kh, kw >= 1; opts may be NULL. */
NB_API nb_status nb_nn_conv2d_init(nb_ctx *ctx, int64_t in, int64_t out, int64_t kh, int64_t kw,
                                   const nb_nn_conv2d_opts *opts, nb_dtype dtype,
                                   const nb_array *key, nb_tree **layer);
/* Conv1d/2d/3d (nd = 1, 2, 3): dict {kind "conv<nd>d", weight [out, in/groups, *kernel],
 * bias [out, 1, ...] (or null), num_spatial_dims, in_channels, out_channels, kernel_size,
 * stride, dilation (tuples of nd ints), padding (a tuple of nd (lo, hi) tuples, or the
 * string "VALID", "SAME" or "SAME_LOWER"), groups, use_bias}; Equinox's init (above).
 * kernel holds nd sizes >= 1; opts may be NULL (defaults). nb_nn_conv2d_init is this with
 * nd = 2 and the older options struct. */
NB_API nb_status nb_nn_conv_init(nb_ctx *ctx, int nd, int64_t in, int64_t out,
                                 const int64_t *kernel, const nb_nn_conv_opts *opts, nb_dtype dtype,
                                 const nb_array *key, nb_tree **layer);
/* ConvTranspose1d/2d/3d: as nb_nn_conv_init (the same weight layout [out, in/groups,
 * *kernel] and init, as Equinox) with kind "conv_transpose<nd>d" and an output_padding
 * tuple; output_padding[i] < stride[i]. */
NB_API nb_status nb_nn_conv_transpose_init(nb_ctx *ctx, int nd, int64_t in, int64_t out,
                                           const int64_t *kernel, const nb_nn_conv_opts *opts,
                                           nb_dtype dtype, const nb_array *key, nb_tree **layer);
/* MaxPool / AvgPool over nd = 1..3 trailing dims with a window of kernel[0..nd-1]: dict
 * {kind "max_pool" / "avg_pool", num_spatial_dims, kernel_size, stride, padding (a tuple
 * of 2 nd ints: lo0, hi0, lo1, hi1, ...), use_ceil}; no parameters. opts may be NULL. */
NB_API nb_status nb_nn_max_pool_init(nb_ctx *ctx, int nd, const int64_t *kernel,
                                     const nb_nn_pool_opts *opts, nb_tree **layer);
NB_API nb_status nb_nn_avg_pool_init(nb_ctx *ctx, int nd, const int64_t *kernel,
                                     const nb_nn_pool_opts *opts, nb_tree **layer);
/* AdaptiveAvgPool / AdaptiveMaxPool to target[0..nd-1] outputs per trailing dim: dict
 * {kind "adaptive_avg_pool" / "adaptive_max_pool", num_spatial_dims, target_shape}. A
 * target of 1 everywhere is global pooling. */
NB_API nb_status nb_nn_adaptive_avg_pool_init(nb_ctx *ctx, int nd, const int64_t *target,
                                              nb_tree **layer);
NB_API nb_status nb_nn_adaptive_max_pool_init(nb_ctx *ctx, int nd, const int64_t *target,
                                              nb_tree **layer);
/* GroupNorm: dict {kind "group_norm", weight [C] (ones) and bias [C] (zeros), or nulls,
 * groups, channels, eps, channelwise_affine, channel_axis}. groups divides channels. */
NB_API nb_status nb_nn_group_norm_init(nb_ctx *ctx, int64_t groups, int64_t channels,
                                       const nb_nn_group_norm_opts *opts, nb_dtype dtype,
                                       nb_tree **layer);
/* RMSNorm over the trailing dims of the given shape: as LayerNorm (same keys, kind
 * "rms_norm"). */
NB_API nb_status nb_nn_rms_norm_init(nb_ctx *ctx, int rank, const int64_t *shape, double eps,
                                     bool use_weight, bool use_bias, nb_dtype dtype,
                                     nb_tree **layer);
/* BatchNorm over channels of a batch [N, C, ...]: the layer, dict {kind "batch_norm",
 * weight [C] (ones), bias [C] (zeros) (or nulls), input_size, eps, momentum, mode ("batch"
 * or "ema"), channelwise_affine, inference}, and its state (Equinox's State), a separate
 * tree to pass to every call and replace by the one the call returns:
 *     mode batch: dict {counter: i32[] 0, mean: [C] zeros, var: [C] ones}
 *     mode ema:   dict {first_time: bool[] true, mean: [C] zeros, var: [C] zeros}
 * Both are new trees (destroy them). opts may be NULL. */
NB_API nb_status nb_nn_batch_norm_init(nb_ctx *ctx, int64_t channels,
                                       const nb_nn_batch_norm_opts *opts, nb_dtype dtype,
                                       nb_tree **layer, nb_tree **state);
/* MultiheadAttention: dict {kind "multihead_attention", query_proj, key_proj, value_proj,
 * output_proj (Linear layers, made with split(key, 4)), dropout (a Dropout layer),
 * num_heads, query_size, key_size, value_size, output_size, qk_size, vo_size, causal}. */
NB_API nb_status nb_nn_multihead_attention_init(nb_ctx *ctx, int64_t num_heads, int64_t query_size,
                                                const nb_nn_mha_opts *opts, nb_dtype dtype,
                                                const nb_array *key, nb_tree **layer);
/* GRUCell: dict {kind "gru_cell", weight_ih [3H, in], weight_hh [3H, H], bias [3H] and
 * bias_n [H] (or nulls), input_size, hidden_size, use_bias}. LSTMCell: dict {kind
 * "lstm_cell", weight_ih [4H, in], weight_hh [4H, H], bias [4H] (or null), input_size,
 * hidden_size, use_bias}. Equinox's init (see src/nn/rnn.c). */
NB_API nb_status nb_nn_gru_cell_init(nb_ctx *ctx, int64_t input_size, int64_t hidden_size,
                                     bool use_bias, nb_dtype dtype, const nb_array *key,
                                     nb_tree **layer);
NB_API nb_status nb_nn_lstm_cell_init(nb_ctx *ctx, int64_t input_size, int64_t hidden_size,
                                      bool use_bias, nb_dtype dtype, const nb_array *key,
                                      nb_tree **layer);
/* Sequential: dict {kind "sequential", layers: list of the n >= 0 layers (borrowed; the
 * tree takes references; an array of nb_tree * or const nb_tree *, nb_tree_items in
 * nabla/tree.h)}; a layer may be any layer tree above, another sequential, or an
 * activation leaf (nb_nn_activation_leaf), as Equinox's Sequential with Lambda. */
NB_API nb_status nb_nn_sequential_init(nb_ctx *ctx, int n, nb_tree_items layers, nb_tree **layer);
/* A function-reference leaf holding an activation (name NULL: as in nb_nn_mlp_opts). */
NB_API nb_status nb_nn_activation_leaf(nb_ctx *ctx, nb_nn_activation fn, const char *name,
                                       nb_tree **leaf);

/* ---- utilities (eager) -------------------------------------------------------------- */
/* The number of parameters of a model: the total element count of its float array leaves
 * (frozen ones included). NB_ERR_MISUSE for a NULL or destroyed tree. Never allocates. */
NB_API nb_status nb_nn_count_params(const nb_tree *model, int64_t *count);
/* A copy of model with every bool leaf stored under the key "inference" (the flag of each
 * Dropout, at any depth) set to inference -- Equinox's nn.inference_mode. The arrays are
 * shared, not copied. Returns a new reference; allocates. */
NB_API nb_status nb_nn_inference_mode(const nb_tree *model, bool inference, nb_tree **out);

/* ---- apply (traced) ----------------------------------------------------------------- */
/* Each returns a var of x's dtype (the layer's parameters must have it too), or the
 * trace's poison after a sticky error. */

/* x, the identity activation. */
NB_API nb_var *nb_nn_identity(nb_var *x);
/* [..., in] -> [..., out]: x W^T + b (rank-1 x gives [out]). One matrix product: leading
 * dims are folded into the rows. */
NB_API nb_var *nb_nn_linear(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* [..., in] -> [..., out]: Linears with the activation between them, the final activation
 * after the last. */
NB_API nb_var *nb_nn_mlp(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* [..., *shape] -> same shape: (x - mean) / sqrt(var + eps) * weight + bias, mean and
 * biased variance over the trailing rank(shape) dims. */
NB_API nb_var *nb_nn_layer_norm(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* Integer indices (i32 or i64) of any shape S -> S + [dim]: rows of the weight (nb_take;
 * out-of-range and negative indices are clamped into [0, num), never read outside). */
NB_API nb_var *nb_nn_embedding(nb_trace *tr, const nb_tree *layer, nb_var *indices);
/* Training mode: where(bernoulli(key, 1 - p, x.shape), x / (1 - p), 0), with key a traced
 * i32[2] PRNG key (pass a fresh one each step, e.g. an argument made by nb_random_split
 * or nb_random_fold_in). Identity (key unused, may be NULL) when the layer's inference
 * flag is set or p == 0. The mask is nb_random_bernoulli(key, 1 - p, x.shape) bit for
 * bit. */
NB_API nb_var *nb_nn_dropout(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *key);
/* [C, H, W] -> [O, Ho, Wo] or [N, C, H, W] -> [N, O, Ho, Wo], with
 * Ho = (H + top + bottom - dh (kh - 1) - 1) / sh + 1 (rounded down; likewise Wo); the
 * padded input must hold at least one dilated kernel. */
NB_API nb_var *nb_nn_conv2d(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* Any Conv1d/2d/3d: [C, *S] -> [O, *So] or [N, C, *S] -> [N, O, *So] with nd spatial dims,
 * So = (S + lo + hi - d (k - 1) - 1) / s + 1 (rounded down), the padding as the layer says
 * ("SAME": ceil(S / s)). */
NB_API nb_var *nb_nn_conv(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* Any ConvTranspose1d/2d/3d: the same shapes with So = (S - 1) s - lo - hi + d (k - 1) + 1
 * + output_padding (explicit padding; "SAME": S s). */
NB_API nb_var *nb_nn_conv_transpose(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* Any pooling layer above on x [..., C, *S] (the trailing nd dims pooled; any leading
 * dims, so one example or a batch): [..., C, *So] with So = (S + lo + hi - k) / s + 1 for
 * max/avg, the target shape for adaptive pooling. */
NB_API nb_var *nb_nn_pool(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* GroupNorm of x whose channel_axis holds the C channels: each group of C / groups
 * channels normalised over them and every axis after the channel axis; same shape. */
NB_API nb_var *nb_nn_group_norm(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* RMSNorm: x * rsqrt(mean(x^2) + eps) * weight + bias over the trailing shape. */
NB_API nb_var *nb_nn_rms_norm(nb_trace *tr, const nb_tree *layer, nb_var *x);
/* BatchNorm of x [N, C, ...] (N >= 1 examples: axis 0 is the batch, as Equinox's
 * axis_name): returns the normalised x and sets *new_state to the updated state, a tree
 * of vars owned by the trace with the structure of state (return it from the body). In
 * inference mode the state is passed through unchanged. state is the layer's state as
 * the body received it (an argument subtree). On an error *new_state is state. */
NB_API nb_var *nb_nn_batch_norm(nb_trace *tr, const nb_tree *layer, nb_var *x, const nb_tree *state,
                                const nb_tree **new_state);
/* MultiheadAttention: query [..., Sq, query_size], key_ [..., Skv, key_size], value
 * [..., Skv, value_size] (the same leading dims) -> [..., Sq, output_size]. mask: NULL or
 * a bool var, true where a query may attend to a key, told apart by its rank: [Sq, Skv]
 * (everywhere), [..., Sq, Skv] with the query's leading dims (per example), or one more
 * dim, [..., num_heads, Sq, Skv] (per head; unbatched: Equinox's [num_heads, Sq, Skv]);
 * combined with the causal flag.
 * key: the dropout's PRNG key (training mode with dropout_p > 0 only; may be NULL). */
NB_API nb_var *nb_nn_multihead_attention(nb_trace *tr, const nb_tree *layer, nb_var *query,
                                         nb_var *key_, nb_var *value, nb_var *mask, nb_var *key);
/* One GRU step: x [..., in], h [..., H] -> h' [..., H]. */
NB_API nb_var *nb_nn_gru_cell(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *h);
/* A GRU cell over a sequence (PyTorch's nn.GRU, one layer): xs [T, ..., in], h0 [..., H] ->
 * every step's state hs [T, ..., H]. nb_scan of the cell's step, with the input side
 * (W_ih x + bias) of all T steps made before the scan by one matrix product, so its
 * gradient too is one product after the reverse sweep: the work of a scan of
 * nb_nn_gru_cell in fewer, larger products. The same values to rounding (each product's
 * element sums the same terms in the same order; BLIS may pick another kernel for more
 * rows). opts: the scan's (NULL: NB_LOOP_BOUNDED; NB_LOOP_CHECKPOINTED for long sequences). */
NB_API nb_var *nb_nn_gru(nb_trace *tr, const nb_tree *layer, nb_var *xs, nb_var *h0,
                         const nb_loop_opts *opts);
/* One LSTM step: x [..., in], (h, c) [..., H] -> h' (returned) and c' (*c_out). */
NB_API nb_var *nb_nn_lstm_cell(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *h, nb_var *c,
                               nb_var **c_out);
/* Any layer above, dispatched on its "kind" leaf; a function-reference leaf is applied as
 * an activation; a sequential applies its layers in order. key (may be NULL) is for
 * dropout: a sequential gives its layer i the key nb_rng_split(key, n)[i], as Equinox's
 * Sequential; a dropout in training mode with a NULL key is an error. */
NB_API nb_var *nb_nn_apply(nb_trace *tr, const nb_tree *layer, nb_var *x, nb_var *key);

#ifdef __cplusplus
}
#endif

#ifdef NB_TREE_ITEMS_UNION /* see nb_tree_items in nabla/tree.h */
#define nb_nn_sequential_init(...) (__extension__ nb_nn_sequential_init(__VA_ARGS__))
#endif
#endif /* NABLA_NN_H */
