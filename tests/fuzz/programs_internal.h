/*
 * programs_internal.h -- what the files of the program checker share: the op list, the
 * program as decoded, and the functions each file offers the others.
 *   programs_decode.c  bytes -> a program: the header, operand choice, each op family's
 *                      parameters (tests/fuzz/README.md has the byte format)
 *   programs_ops.c     applying an op while tracing, the bodies of loops and branches, and
 *                      printing a program as a listing
 *   programs.c         running a program every way and checking the rules; set-up, the
 *                      leak check, the minimizer
 * The checker's interface for its users is programs.h.
 */
#ifndef NABLA_FUZZ_PROGRAMS_INTERNAL_H
#define NABLA_FUZZ_PROGRAMS_INTERNAL_H

#include "programs.h"

#include <nabla/nabla.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---- limits ------------------------------------------------------------------------- */

#define NBP_MAX_INPUTS 4
#define NBP_MAX_OPS 20        /* inputs included */
#define NBP_MAX_VALS 40       /* values (an op may make 2) */
#define NBP_MAX_IN 8          /* operands of one op */
#define NBP_NP 32             /* integer parameters of one op */
#define NBP_MAX_SIZE 4096     /* values that ops make bigger (broadcasts, gathers) are avoided */
#define NBP_MAX_BIG (1 << 17) /* a value bigger than this ends the program */
#define NBP_MAX_FNS 4         /* sub-functions of a control-flow op */

/* ---- ops ------------------------------------------------------------------------------ */
/* X(code, public name) */
#define NBP_OPS(X)                                                                                 \
    X(PARAM, "param")                                                                              \
    X(CONST, "nb_constant")                                                                        \
    X(IOTA, "nb_iota")                                                                             \
    X(FULL, "nb_full")                                                                             \
    X(SCALAR_TYPED, "nb_scalar_typed")                                                             \
    X(NEG, "nb_neg")                                                                               \
    X(ABS, "nb_abs")                                                                               \
    X(SIGN, "nb_sign")                                                                             \
    X(SQUARE, "nb_square")                                                                         \
    X(RELU, "nb_relu")                                                                             \
    X(STOP_GRADIENT, "nb_stop_gradient")                                                           \
    X(EXP, "nb_exp")                                                                               \
    X(EXPM1, "nb_expm1")                                                                           \
    X(LOG, "nb_log")                                                                               \
    X(LOG1P, "nb_log1p")                                                                           \
    X(SQRT, "nb_sqrt")                                                                             \
    X(RSQRT, "nb_rsqrt")                                                                           \
    X(RECIPROCAL, "nb_reciprocal")                                                                 \
    X(SIN, "nb_sin")                                                                               \
    X(COS, "nb_cos")                                                                               \
    X(TAN, "nb_tan")                                                                               \
    X(TANH, "nb_tanh")                                                                             \
    X(SIGMOID, "nb_sigmoid")                                                                       \
    X(GELU, "nb_gelu")                                                                             \
    X(SOFTPLUS, "nb_softplus")                                                                     \
    X(ERF, "nb_erf")                                                                               \
    X(LOGICAL_NOT, "nb_logical_not")                                                               \
    X(CAST, "nb_cast")                                                                             \
    X(ADD, "nb_add")                                                                               \
    X(SUB, "nb_sub")                                                                               \
    X(MUL, "nb_mul")                                                                               \
    X(DIV, "nb_div")                                                                               \
    X(MAXIMUM, "nb_maximum")                                                                       \
    X(MINIMUM, "nb_minimum")                                                                       \
    X(POW, "nb_pow")                                                                               \
    X(EQ, "nb_eq")                                                                                 \
    X(NE, "nb_ne")                                                                                 \
    X(LT, "nb_lt")                                                                                 \
    X(LE, "nb_le")                                                                                 \
    X(GT, "nb_gt")                                                                                 \
    X(GE, "nb_ge")                                                                                 \
    X(LOGICAL_AND, "nb_logical_and")                                                               \
    X(LOGICAL_OR, "nb_logical_or")                                                                 \
    X(SCALAR_BIN, "nb_scalar")                                                                     \
    X(SELECT, "nb_select")                                                                         \
    X(SUM, "nb_sum")                                                                               \
    X(MEAN, "nb_mean")                                                                             \
    X(MAX, "nb_max")                                                                               \
    X(MIN, "nb_min")                                                                               \
    X(PROD, "nb_prod")                                                                             \
    X(LOGSUMEXP, "nb_logsumexp")                                                                   \
    X(ARGMAX, "nb_argmax")                                                                         \
    X(ARGMIN, "nb_argmin")                                                                         \
    X(SOFTMAX, "nb_softmax")                                                                       \
    X(LOG_SOFTMAX, "nb_log_softmax")                                                               \
    X(RESHAPE, "nb_reshape")                                                                       \
    X(BROADCAST_TO, "nb_broadcast_to")                                                             \
    X(TRANSPOSE, "nb_transpose")                                                                   \
    X(EXPAND_DIMS, "nb_expand_dims")                                                               \
    X(SQUEEZE, "nb_squeeze")                                                                       \
    X(SLICE, "nb_slice")                                                                           \
    X(CONCATENATE, "nb_concatenate")                                                               \
    X(STACK, "nb_stack")                                                                           \
    X(PAD, "nb_pad")                                                                               \
    X(TAKE, "nb_take")                                                                             \
    X(TAKE_ALONG, "nb_take_along_axis")                                                            \
    X(ONE_HOT, "nb_one_hot")                                                                       \
    X(DYN_SLICE, "nb_dynamic_slice")                                                               \
    X(DYN_UPDATE, "nb_dynamic_update_slice")                                                       \
    X(MATMUL, "nb_matmul")                                                                         \
    X(DOT, "nb_dot")                                                                               \
    X(RNG_BITS, "nb_rng_bits")                                                                     \
    X(RNG_UNIFORM, "nb_rng_uniform")                                                               \
    X(RNG_NORMAL, "nb_rng_normal")                                                                 \
    X(RNG_TRUNC, "nb_rng_truncated_normal")                                                        \
    X(RNG_BERNOULLI, "nb_rng_bernoulli")                                                           \
    X(RNG_PERM, "nb_rng_permutation")                                                              \
    X(RNG_SPLIT, "nb_rng_split")                                                                   \
    X(RNG_FOLD_IN, "nb_rng_fold_in")                                                               \
    X(FORI, "nb_fori_loop")                                                                        \
    X(SCAN, "nb_scan")                                                                             \
    X(WHILE, "nb_while_loop")                                                                      \
    X(COND, "nb_cond")                                                                             \
    X(SWITCH, "nb_switch")                                                                         \
    X(CALL, "nb_apply1")

#define NBP_ENUM_(c, n) NBP_##c,
enum { NBP_OPS(NBP_ENUM_) NBP_OP_COUNT };
#undef NBP_ENUM_
/* the public names, for messages and listings (programs_ops.c) */
extern const char *const nbp_op_names[NBP_OP_COUNT];

/* Unary functions used inside loop bodies and branches; the first NBP_U_INT also take
 * integers. */
enum {
    NBP_U_ID,
    NBP_U_NEG,
    NBP_U_ABS,
    NBP_U_SQUARE,
    NBP_U_RELU,
    NBP_U_TANH,
    NBP_U_SIN,
    NBP_U_SIGMOID,
    NBP_U_EXP,
    NBP_U_RECIP,
    NBP_U_SQRT,
    NBP_U_COUNT
};
#define NBP_U_INT 5

/* Values for constants, pad fills and weak scalars: the edges of every dtype (index modulo
 * NBP_N_SPECIALS). */
#define NBP_N_SPECIALS 44
double nbp_special(unsigned i);

/* ---- the program ---------------------------------------------------------------------- */

typedef struct nbp_val {
    nb_dtype dt;
    int rank;
    int64_t shape[NB_MAX_RANK];
    int64_t size;
    int op;   /* the op that made it */
    int uses; /* operand of how many later ops */
} nbp_val;

enum { NBP_IN_PARAM, NBP_IN_CONST, NBP_IN_FROZEN, NBP_IN_TIED };
enum { NBP_FILL_COUNT = 8 };

typedef struct nbp_input {
    nb_dtype dt;
    int rank;
    int64_t shape[NB_MAX_RANK];
    int kind;
    int fill;
    int tie;  /* NBP_IN_TIED: the input whose array this one shares */
    int leaf; /* its position in the params tuple (-1 for a constant) */
} nbp_input;

typedef struct nbp_op {
    int code;
    int n_in, in[NBP_MAX_IN];
    int n_out, out0;
    int64_t p[NBP_NP];
    double f[4];
    nb_fn *fn[2][NBP_MAX_FNS]; /* per context: the sub-functions of control flow */
    bool dead;                 /* dropped by the minimizer */
} nbp_op;

/* What to check and how, from the header's first two bytes (nbp_decode_header): the first
 * sets the argument tree's extra leaves, the generic inputs and R7 (when its bits 0-2 are
 * all set), the second the other checks -- R2 on a quarter of the programs, donation on a
 * quarter, R3-R5 on half (a quarter of those at the special inputs), R4 on half of those
 * (each about as costly as the rest: the weights keep a run near 250 programs a second
 * under the sanitizers). */
enum {
    NBP_NO_THREADS = 1u << 0,    /* skip R2 */
    NBP_NO_GRAD = 1u << 1,       /* skip R3-R5 */
    NBP_DONATE = 1u << 2,        /* also run with every argument donated */
    NBP_GRAD_SPECIAL = 1u << 3,  /* R3-R5 at the forward inputs (specials) instead of generic
                                    ones: bits only, no tolerance checks */
    NBP_GRAD_POSITIVE = 1u << 4, /* generic float inputs in (0.25, 2), not +-(0.25, 1.5) */
    NBP_EXTRA_STATIC = 1u << 5,  /* params get a static int leaf too */
    NBP_EXTRA_NULL = 1u << 6,    /* params get a null leaf too */
    NBP_NO_HESS = 1u << 7,       /* skip R4 */
    NBP_OOM = 1u << 8            /* R7: the whole program once more with an allocation failing */
};

typedef struct nbp_prog {
    const uint8_t *data;
    size_t size, at;
    unsigned flags;
    uint64_t seed;
    int n_inputs;
    nbp_input in[NBP_MAX_INPUTS];
    int n_leaves; /* children of the params tuple */
    int n_ops;
    nbp_op ops[NBP_MAX_OPS];
    int n_vals;
    nbp_val vals[NBP_MAX_VALS];
    int n_outs;
    int outs[NBP_MAX_VALS];
    bool decoded;
    int rejected_op; /* the op refused at trace time, or -1 */
    nb_ctx *ctx[2];
    nb_array *consts[2][NBP_MAX_INPUTS];
} nbp_prog;

/* the roles of a body, kept in its self tree with the program and the op index */
enum { NBP_ROLE_MAIN, NBP_ROLE_LOSS, NBP_ROLE_ALL, NBP_ROLE_OP, NBP_ROLE_SUB };

/* ---- programs.c ------------------------------------------------------------------------ */

/* Report a broken rule (with the program's listing and the input) and abort. */
void nbp_fail(nb_ctx *ctx, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
#define NBP_OK(ctx, expr)                                                                          \
    do {                                                                                           \
        nb_status nbp_s_ = (expr);                                                                 \
        if (nbp_s_ != NB_OK) {                                                                     \
            nbp_fail((ctx), "%s returned %s", #expr, nb_status_name(nbp_s_));                      \
        }                                                                                          \
    } while (0)
uint64_t nbp_mix(uint64_t x);
int64_t nbp_size_of(int rank, const int64_t *shape);
bool nbp_is_float(nb_dtype d);
bool nbp_is_int(nb_dtype d);
/* a body's self tree (program, op index, role), and back; the context index of a trace */
nb_tree *nbp_self(nb_ctx *ctx, const nbp_prog *P, int op, int role);
nbp_prog *nbp_self_get(const nb_tree *self, int *op, int *role);
int nbp_ci(const nbp_prog *P, const nb_trace *tr);

/* ---- programs_decode.c ----------------------------------------------------------------- */

/* The header: flags, value seed, inputs (their ops and values). */
void nbp_decode_header(nbp_prog *P);
/* Decode ops while tracing (v holds the inputs' vars), until the bytes or the room run out
 * or an op is refused (P->rejected_op). */
void nbp_decode(nb_trace *tr, nbp_prog *P, nb_var **v);
/* outputs: every value no later op uses, the last value, and a quarter of the others */
void nbp_choose_outputs(nbp_prog *P);

/* ---- programs_ops.c -------------------------------------------------------------------- */

/* Apply op oi to the vars in; the results go to out. Returns how many (the vars may be
 * poison: the trace's status says). */
int nbp_apply(nb_trace *tr, nbp_prog *P, int oi, nb_var *const *in, nb_var **out);
void nbp_fmt_shape(char *buf, size_t cap, nb_dtype dt, int rank, const int64_t *shape);
void nbp_print_program(FILE *f, const nbp_prog *P);

#endif /* NABLA_FUZZ_PROGRAMS_INTERNAL_H */
