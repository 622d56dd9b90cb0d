/*
 * src/exec/fused.c -- fused elementwise programs: one pass over memory for a chain of
 * elementwise ops (made by the fusion pass, passes.c).
 *
 * The output is walked in chunks of NBI_FUSE_CHUNK elements (fixed by the shape, split
 * across threads) and, within a chunk, in tiles of NBI_FUSE_TILE elements that stay in
 * cache: each external input is read straight from memory when it has the output's shape,
 * or gathered through broadcast strides into a tile; each instruction then runs the op's
 * own per-element code (nbi_ew_tile) on tiles, and the last one writes into the output.
 * Every element is computed by the same code on the same values as without fusion, so
 * results are bit-identical to the unfused program and for any thread count.
 *
 * Stored values (registers a multi-output program also writes, fused_output nodes) stay in
 * their tiles until every instruction of the tile has run, and are then copied out. So
 * all of a tile's reads of the inputs come before any write of an output: an output may
 * share a buffer with an input read at the same index (the memory plan's in-place slots,
 * donated state updated in place) however the instructions are ordered.
 *
 * A trailing reduction (sum, max, min over the innermost dims) consumes the last
 * instruction's tile instead of storing it: each output's run of red_n elements is fed,
 * tile by tile, into a reduction stream that performs the reduction kernel's own
 * operations in its own order (nbi_rstream, op_reduce.c). Work is cut into pieces fixed by
 * the shape: groups of whole runs when a run is at most NBI_RSEG elements, else segments of
 * NBI_RSEG elements whose partial results are combined afterwards in the same tree the
 * unfused kernel builds. So a fused reduction gives the unfused bits for any thread count.
 *
 * Tiny index spaces (up to NBI_FUSE_TINY elements: an ODE's state, a scalar loss, a bias)
 * skip all of that: the plan holds, per instruction, where its operands and result are and
 * how it runs, and the offset of every element each gathered input reads, so a run is one
 * tile of that size -- no chunks, threads, index arithmetic or tile layout -- through the
 * same kernels (float arithmetic on up to NBI_FUSE_TINY_INLINE elements in line: the same
 * IEEE operations), its short runs reduced by the reduction kernel's left folds.
 */
#include "ad/ir.h"

#include <stddef.h>
#include <string.h>

#define NBI_FUSE_TILE 1024
#define NBI_FUSE_CHUNK 16384
/* Tiles are spaced a whole number of 4 KiB pages apart. A load is stalled (4K aliasing)
 * when a store still in flight from an earlier iteration has the same address modulo
 * 4 KiB, that is when the output tile sits a little *above* the input tile modulo 4 KiB;
 * at the same offset only the same iteration's elements match, and the load precedes the
 * store. (A spacing of 8 KiB + 192 B stalled every op that wrote a later slot: a fused
 * tanh chain ran 1.74 -> 1.45 ns per element with whole pages.) */
#define NBI_FUSE_TILE_BYTES ((size_t)NBI_FUSE_TILE * 8)

/* Pieces of a reduction: whole runs when they are short, else NBI_RSEG segments. */
static int64_t nbi_fused_segs(const nbi_fprog *p) {
    return p->red_n > NBI_RSEG ? (p->red_n + NBI_RSEG - 1) / NBI_RSEG : 1;
}

static int64_t nbi_shape_size_of(const nbi_fprog *p) {
    return nbi_shape_size(p->map_rank, p->map_shape);
}

/* Per worker: n_slots tiles; the first worker's slice also holds the partial results of
 * segmented reductions (8 bytes each). */
static size_t nbi_fused_bytes(const nbi_fprog *p, int32_t n_slots) {
    size_t tiles = (size_t)n_slots * NBI_FUSE_TILE_BYTES + 64;
    if (p->red_op != 0 && nbi_fused_segs(p) > 1) {
        tiles += (size_t)(nbi_shape_size_of(p) / p->red_n * nbi_fused_segs(p)) * 8 + 64;
    }
    return tiles;
}

/* The plan of a tiny program (nbi_fused_tiny): up to NBI_FUSE_TINY elements, and at most
 * NBI_FUSE_TINY_OFFS offsets of gathered inputs in all. Past 64 elements the tiled path is
 * as fast (measured per call, LV-like chains and views: 1,936 -> 660 instructions at 1
 * element, 2,098 -> 1,571 at 64; with two padded views 1,894 -> 1,697 at 64 but 2,605 ->
 * 3,018 at 128, where the per-element offsets cost more than the tiles' run copies). */
#define NBI_FUSE_TINY 64
#define NBI_FUSE_TINY_OFFS 256
#define NBI_FUSE_TINY_INLINE 4      /* float arithmetic in line up to this many elements */
#define NBI_FUSE_TINY_PAD INT16_MIN /* the offset of a padding element */
/* How a tiny program runs an instruction: through nbi_ew_tile, the resolved binary or
 * vector-math function (nbi_ew_fast), or in line (nbi_fused_tiny_how). */
enum {
    NBI_TINY_TILE,
    NBI_TINY_BIN,
    NBI_TINY_UN32,
    NBI_TINY_UN64,
    NBI_TINY_ADD64,
    NBI_TINY_SUB64,
    NBI_TINY_MUL64,
    NBI_TINY_DIV64,
    NBI_TINY_ADD32,
    NBI_TINY_SUB32,
    NBI_TINY_MUL32,
    NBI_TINY_DIV32
};
typedef struct nbi_ftins {
    uint8_t base[3]; /* operand a is at base[a]'s pointer (0: the slots, 1 + e: input e) */
    uint8_t how;     /* NBI_TINY_* */
    int16_t off[3];  /* ... plus off[a] bytes */
    int16_t dst;     /* the result is dst bytes into the slots (out 0) or the output (1) */
    uint8_t out;
    uint8_t scalar; /* bit a: operand a is one value for all (stride 0) */
    int8_t sa, sb;  /* the element strides of operands 0 and 1: 0 (scalar) or 1 */
} nbi_ftins;
typedef struct nbi_ftiny {
    nbi_ftins ins[NBI_FUSE_MAX_INSTR];
    int16_t off[NBI_FUSE_TINY_OFFS]; /* gathered inputs' element offsets from element 0 */
    int16_t first[NBI_FUSE_MAX_EXT]; /* where gathered input gather[g]'s offsets start */
    int8_t gather[NBI_FUSE_MAX_EXT]; /* the inputs gathered into their slots, n_gather */
    int32_t n_gather, slot_bytes;
} nbi_ftiny;

/* What a fused node's shapes fix: computed once per executable (nbi_fused_prepare, kept
 * in the program's plan bytes), not on every run. */
typedef struct nbi_fplan {
    size_t worker_bytes;
    int32_t n_slots; /* tiles per worker */
    int r;           /* the index space (map shape) */
    int64_t size;
    int64_t rows_per_piece, segs; /* reductions: whole runs per piece, or segments per run */
    bool tiny; /* run by nbi_fused_tiny, planned in tiny_plan (which replaces strides) */
    union {
        int64_t strides[NBI_FUSE_MAX_EXT][NB_MAX_RANK]; /* gathered inputs (tiles) */
        nbi_ftiny tiny_plan;
    };
    int64_t ext_off[NBI_FUSE_MAX_EXT];  /* bytes from the input's buffer to element 0 */
    bool direct[NBI_FUSE_MAX_EXT];      /* the input has the output's shape: read it in place */
    bool scalar[NBI_FUSE_MAX_EXT];      /* one element, only read by binary ops/select: stride 0 */
    int32_t ext_slot[NBI_FUSE_MAX_EXT]; /* tile slot of a gathered input, else -1 */
    int32_t reg_slot[NBI_FUSE_MAX_INSTR]; /* tile slot of each instruction's result */
    nbi_ew_fast fast[NBI_FUSE_MAX_INSTR]; /* each instruction's tile function */
    int32_t out_slot; /* where the reduced values go, tile by tile (reductions) */
    int64_t tile;     /* elements per tile */
    unsigned char padv[NBI_FUSE_MAX_EXT][8]; /* a padded view's value, in its dtype */
} nbi_fplan;
_Static_assert(sizeof(nbi_fplan) <= sizeof(((nbi_fprog *)0)->plan), "nbi_fprog.plan too small");

typedef struct nbi_fused_job {
    const nbi_kargs *k;
    const nbi_fprog *p;
    const nbi_fplan *pl;
    const int64_t *shape;                            /* p->map_shape */
    void *const *outs;                               /* stored values' buffers, or NULL */
    unsigned char *partials;                         /* segment results (segs > 1) */
    const unsigned char *ext_base[NBI_FUSE_MAX_EXT]; /* where element 0 is read, this run */
} nbi_fused_job;

/* n elements of es bytes: copies of the one at v (fill), or read with stride st elements
 * from src (st == 1: memcpy). Typed loops for the element sizes there are. */
static void nbi_fill(unsigned char *o, const unsigned char *v, size_t es, int64_t n) {
    switch (es) {
    case 1:
        memset(o, v[0], (size_t)n);
        return;
    case 4: {
        uint32_t x;
        memcpy(&x, v, 4);
        uint32_t *q = (uint32_t *)(void *)o;
        for (int64_t t = 0; t < n; t++) {
            q[t] = x;
        }
        return;
    }
    case 8: {
        uint64_t x;
        memcpy(&x, v, 8);
        uint64_t *q = (uint64_t *)(void *)o;
        for (int64_t t = 0; t < n; t++) {
            q[t] = x;
        }
        return;
    }
    default:
        for (int64_t t = 0; t < n; t++) {
            memcpy(o + (size_t)t * es, v, es);
        }
    }
}

static void nbi_copy_strided(unsigned char *o, const unsigned char *src, int64_t st, size_t es,
                             int64_t n) {
    if (st == 1) {
        memcpy(o, src, (size_t)n * es);
    } else if (st == 0) {
        nbi_fill(o, src, es, n);
    } else if (es == 8) {
        uint64_t *q = (uint64_t *)(void *)o;
        for (int64_t t = 0; t < n; t++) {
            memcpy(&q[t], src + (ptrdiff_t)(t * st) * 8, 8);
        }
    } else if (es == 4) {
        uint32_t *q = (uint32_t *)(void *)o;
        for (int64_t t = 0; t < n; t++) {
            memcpy(&q[t], src + (ptrdiff_t)(t * st) * 4, 4);
        }
    } else {
        for (int64_t t = 0; t < n; t++) {
            memcpy(o + (size_t)t * es, src + (ptrdiff_t)(t * st) * (ptrdiff_t)es, es);
        }
    }
}

/* Gather elements [first, first+n) of the index space from padded view e of x (buffer xb,
 * already offset to the view's origin): per run along the innermost dimension, the
 * padding value where the run's outer index falls outside pad_dims, else padding / the
 * view's elements (a copy when contiguous, a fill when broadcast) / padding. */
static void nbi_fused_gather_pad(const nbi_fused_job *j, int32_t e, const unsigned char *xb,
                                 size_t es, int64_t first, int64_t n, unsigned char *dst) {
    int r = j->pl->r;
    const int64_t *shape = j->shape;
    const int64_t *lo = j->p->pad_lo[e], *st = j->p->view_st[e], *dims = j->p->pad_dims[e];
    const unsigned char *pv = j->pl->padv[e];
    int64_t idx[NB_MAX_RANK], rest = first, inner = shape[r - 1], xin = dims[r - 1];
    int64_t ist = st[r - 1];
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = rest % shape[d];
        rest /= shape[d];
    }
    for (int64_t i = 0; i < n;) {
        int64_t run = inner - idx[r - 1] < n - i ? inner - idx[r - 1] : n - i;
        unsigned char *o = dst + (size_t)i * es;
        bool inside = true;
        int64_t off = 0;
        for (int d = 0; d < r - 1; d++) {
            int64_t xi = idx[d] - lo[d];
            inside = inside && xi >= 0 && xi < dims[d];
            off += xi * st[d];
        }
        if (!inside) {
            nbi_fill(o, pv, es, run);
        } else {
            int64_t a = idx[r - 1] - lo[r - 1]; /* the view's index of the run's first element */
            int64_t b0 = -a < 0 ? 0 : -a < run ? -a : run;
            int64_t b1 = xin - a < b0 ? b0 : xin - a < run ? xin - a : run;
            nbi_fill(o, pv, es, b0);
            const unsigned char *src = xb + (ptrdiff_t)(off + (a + b0) * ist) * (ptrdiff_t)es;
            if (b1 > b0) {
                nbi_copy_strided(o + (size_t)b0 * es, src, ist, es, b1 - b0);
            }
            nbi_fill(o + (size_t)b1 * es, pv, es, run - b1);
        }
        i += run;
        idx[r - 1] += run;
        for (int d = r - 1; d > 0 && idx[d] == shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

/* Where elements [first, first+n) of padded view e lie inside the padding, within one row
 * and contiguous in the node: the address of the first (read in place, no copy), else
 * NULL. */
static const unsigned char *nbi_fused_pad_direct(const nbi_fused_job *j, int32_t e, size_t es,
                                                 int64_t first, int64_t n) {
    int r = j->pl->r;
    const int64_t *lo = j->p->pad_lo[e], *st = j->p->view_st[e], *dims = j->p->pad_dims[e];
    if (st[r - 1] != 1) {
        return NULL;
    }
    int64_t rest = first, off = 0;
    for (int d = r - 1; d >= 0; d--) {
        int64_t idx = rest % j->shape[d];
        rest /= j->shape[d];
        int64_t xi = idx - lo[d];
        int64_t len = d == r - 1 ? n : 1;
        if (xi < 0 || xi + len > dims[d] || (d == r - 1 && idx + n > j->shape[d])) {
            return NULL;
        }
        off += xi * st[d];
    }
    return j->ext_base[e] + (ptrdiff_t)off * (ptrdiff_t)es;
}

/* Gather elements [first, first+n) of the index space from broadcast input x,
 * a run along the innermost dimension at a time: a copy where it has stride 1, a fill
 * where it is broadcast (stride 0). */
static void nbi_fused_gather(int r0, const int64_t *shape0, const int64_t *st0, const void *x,
                             size_t es, int64_t first, int64_t n, unsigned char *dst) {
    /* the index space seen from x: dims of extent 1 dropped, a dim merged into the one
     * outside it where x's strides allow (the same row-major order, longer runs: a [512, 1,
     * 65, 1] space went an element per run) */
    int64_t shape[NB_MAX_RANK], st[NB_MAX_RANK];
    int r = 0;
    for (int d = 0; d < r0; d++) {
        if (shape0[d] == 1) {
            continue;
        }
        if (r > 0 && st[r - 1] == st0[d] * shape0[d]) {
            shape[r - 1] *= shape0[d];
            st[r - 1] = st0[d];
            continue;
        }
        shape[r] = shape0[d];
        st[r++] = st0[d];
    }
    if (r == 0) {
        shape[0] = 1;
        st[0] = 0;
        r = 1;
    }
    int64_t idx[NB_MAX_RANK], off = 0, rest = first;
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = rest % shape[d];
        rest /= shape[d];
        off += idx[d] * st[d];
    }
    const unsigned char *src = x; /* off may be negative: a view with a negative step */
    int64_t inner = shape[r - 1], ist = st[r - 1];
    for (int64_t i = 0; i < n;) {
        int64_t run = inner - idx[r - 1];
        if (run > n - i) {
            run = n - i;
        }
        unsigned char *o = dst + (size_t)i * es;
        const unsigned char *s0 = src + (ptrdiff_t)off * (ptrdiff_t)es;
        nbi_copy_strided(o, s0, ist, es, run);
        i += run;
        off += run * ist;
        idx[r - 1] += run;
        if (idx[r - 1] < inner) {
            break; /* n exhausted mid-row */
        }
        off -= inner * ist;
        idx[r - 1] = 0;
        for (int d = r - 2; d >= 0; d--) {
            off += st[d];
            if (++idx[d] < shape[d]) {
                break;
            }
            off -= st[d] * shape[d];
            idx[d] = 0;
        }
    }
}

/* Evaluate the program over elements [t0, t0 + n) of the index space (n <= the tile);
 * the last instruction writes to dst, then the stored registers go to their buffers. */
static void nbi_fused_tile(const nbi_fused_job *j, unsigned char *base, int64_t t0, int64_t n,
                           void *dst) {
    const nbi_kargs *k = j->k;
    const nb_var *node = k->node;
    const nbi_fprog *p = j->p;
    size_t tile_bytes = NBI_FUSE_TILE_BYTES;
    const void *ext[NBI_FUSE_MAX_EXT];
    for (int32_t e = 0; e < p->n_ext; e++) {
        const nb_var *x = node->in[e];
        size_t es = nbi_dsize(x->dtype);
        if (j->pl->scalar[e]) {
            ext[e] = j->ext_base[e];
        } else if (j->pl->direct[e]) {
            ext[e] = j->ext_base[e] + (size_t)t0 * es;
        } else if (p->pad_mask & (1u << e)) {
            const unsigned char *in_place = nbi_fused_pad_direct(j, e, es, t0, n);
            unsigned char *g = base + (size_t)j->pl->ext_slot[e] * tile_bytes;
            if (in_place == NULL) {
                nbi_fused_gather_pad(j, e, j->ext_base[e], es, t0, n, g);
            }
            ext[e] = in_place != NULL ? in_place : g;
        } else {
            unsigned char *g = base + (size_t)j->pl->ext_slot[e] * tile_bytes;
            nbi_fused_gather(j->pl->r, j->shape, j->pl->strides[e], j->ext_base[e], es, t0, n, g);
            ext[e] = g;
        }
    }
    for (int32_t i = 0; i < p->n_instr; i++) {
        const nbi_finstr *in = &p->ins[i];
        const void *ops[3];
        bool sc[3] = {false, false, false};
        for (int a = 0; a < in->n_in; a++) {
            if (in->src[a] >= 0) {
                ops[a] = base + (size_t)j->pl->reg_slot[in->src[a]] * tile_bytes;
            } else {
                ops[a] = ext[-in->src[a] - 1];
                sc[a] = j->pl->scalar[-in->src[a] - 1];
            }
        }
        void *o = i == p->n_instr - 1 ? dst : base + (size_t)j->pl->reg_slot[i] * tile_bytes;
        const nbi_ew_fast *f = &j->pl->fast[i];
        if (f->kind == 1) {
            f->bin(o, ops[0], ops[1], n, sc[0] ? 0 : 1, sc[1] ? 0 : 1);
        } else if (f->kind == 2 && in->dtype == NB_DTYPE_F32) {
            f->un32(o, ops[0], n);
        } else if (f->kind == 2) {
            f->un64(o, ops[0], n);
        } else {
            nbi_ew_tile((nbi_op)in->op, in->dtype, in->in_dtype, in->n_in, o, ops, sc, n);
        }
    }
    for (int32_t s = 0; s < p->n_store && j->outs != NULL; s++) {
        int32_t r = p->store[s];
        if (j->outs[s] == NULL) {
            continue;
        }
        size_t es = nbi_dsize(p->ins[r].dtype);
        const unsigned char *v =
            r == p->n_instr - 1 ? dst : base + (size_t)j->pl->reg_slot[r] * tile_bytes;
        memcpy((unsigned char *)j->outs[s] + (size_t)t0 * es, v, (size_t)n * es);
    }
}

static unsigned char *nbi_fused_base(const nbi_fused_job *j, int worker) {
    unsigned char *base = (unsigned char *)j->k->scratch + (size_t)worker * j->pl->worker_bytes;
    return (unsigned char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
}

/* Elements [first, first + count) of a fused map, written to the output. */
static void nbi_fused_range(void *ud, int64_t first, int64_t count, int worker) {
    const nbi_fused_job *j = ud;
    unsigned char *base = nbi_fused_base(j, worker);
    size_t es_out = nbi_dsize(j->k->node->dtype);
    for (int64_t t0 = first; t0 < first + count; t0 += j->pl->tile) {
        int64_t n = first + count - t0 < j->pl->tile ? first + count - t0 : j->pl->tile;
        nbi_fused_tile(j, base, t0, n, (unsigned char *)j->k->out + (size_t)t0 * es_out);
    }
}

/* Reduce elements [first, first + n) (inside one run) into s, a tile at a time. */
static void nbi_fused_reduce_run(const nbi_fused_job *j, unsigned char *base, nbi_rstream *s,
                                 int64_t first, int64_t n) {
    unsigned char *vals = base + (size_t)j->pl->out_slot * NBI_FUSE_TILE_BYTES;
    for (int64_t t0 = first; t0 < first + n; t0 += j->pl->tile) {
        int64_t m = first + n - t0 < j->pl->tile ? first + n - t0 : j->pl->tile;
        nbi_fused_tile(j, base, t0, m, vals);
        nbi_rstream_feed(s, vals, m);
    }
}

/* Piece t of a fused reduction: rows_per_piece whole runs, or one segment of a run. */
static void nbi_fused_reduce_piece(void *ud, int64_t t, int worker) {
    const nbi_fused_job *j = ud;
    const nbi_fprog *p = j->p;
    const nb_var *node = j->k->node;
    unsigned char *base = nbi_fused_base(j, worker);
    size_t es = nbi_dsize(node->dtype);
    nbi_rstream s;
    if (j->pl->segs > 1) {
        int64_t row = t / j->pl->segs, seg = t % j->pl->segs;
        int64_t first = row * p->red_n + seg * NBI_RSEG;
        int64_t n = p->red_n - seg * NBI_RSEG < NBI_RSEG ? p->red_n - seg * NBI_RSEG : NBI_RSEG;
        nbi_rstream_begin(&s, (nbi_op)p->red_op, node->dtype);
        nbi_fused_reduce_run(j, base, &s, first, n);
        nbi_rstream_end(&s, j->partials + (size_t)t * es);
        return;
    }
    int64_t rows = node->size, row0 = t * j->pl->rows_per_piece;
    int64_t row1 = rows - row0 < j->pl->rows_per_piece ? rows : row0 + j->pl->rows_per_piece;
    unsigned char *out = j->k->out;
    if (p->red_n >= NBI_FUSE_TILE) { /* long runs: tiles from each run's start */
        for (int64_t row = row0; row < row1; row++) {
            nbi_rstream_begin(&s, (nbi_op)p->red_op, node->dtype);
            nbi_fused_reduce_run(j, base, &s, row * p->red_n, p->red_n);
            nbi_rstream_end(&s, out + (size_t)row * es);
        }
        return;
    }
    /* short runs (a softmax's 10 classes): whole tiles across runs, each tile's values fed
     * run by run (a stream gives the same result however its run is cut) */
    unsigned char *vals = base + (size_t)j->pl->out_slot * NBI_FUSE_TILE_BYTES;
    int64_t first = row0 * p->red_n, last = row1 * p->red_n, row = row0, pos = 0;
    nbi_rstream_begin(&s, (nbi_op)p->red_op, node->dtype);
    for (int64_t t0 = first; t0 < last; t0 += j->pl->tile) {
        int64_t n = last - t0 < j->pl->tile ? last - t0 : j->pl->tile;
        nbi_fused_tile(j, base, t0, n, vals);
        for (int64_t off = 0; off < n;) {
            int64_t whole = pos == 0 ? (n - off) / p->red_n : 0;
            if (whole > 0 &&
                nbi_reduce_short_runs((nbi_op)p->red_op, node->dtype, vals + (size_t)off * es,
                                      whole, p->red_n, out + (size_t)row * es)) {
                off += whole * p->red_n;
                row += whole;
                continue; /* (the stream, begun at pos 0, is still fresh) */
            }
            int64_t m = n - off < p->red_n - pos ? n - off : p->red_n - pos;
            nbi_rstream_feed(&s, vals + (size_t)off * es, m);
            off += m;
            pos += m;
            if (pos == p->red_n) {
                nbi_rstream_end(&s, out + (size_t)row * es);
                row++;
                pos = 0;
                nbi_rstream_begin(&s, (nbi_op)p->red_op, node->dtype);
            }
        }
    }
}

/* Tile slots: one per gathered input, then results share slots by lifetime (a slot is
 * reused once its value has been read for the last time, never by the instruction that
 * reads it, so no kernel runs in place; a stored value keeps its slot to the tile's end). */
static void nbi_fused_slots(const nbi_fprog *p, nbi_fplan *pl) {
    int32_t n_slots = 0, last[NBI_FUSE_MAX_INSTR], free_list[NBI_FUSE_MAX_INSTR], n_free = 0;
    for (int32_t e = 0; e < p->n_ext; e++) {
        pl->ext_slot[e] = !pl->scalar[e] && !pl->direct[e] ? n_slots++ : -1;
    }
    for (int32_t i = 0; i < p->n_instr; i++) {
        last[i] = -1;
        for (int a = 0; a < p->ins[i].n_in; a++) {
            if (p->ins[i].src[a] >= 0) {
                last[p->ins[i].src[a]] = i;
            }
        }
    }
    for (int32_t s = 0; s < p->n_store; s++) {
        last[p->store[s]] = p->n_instr; /* copied out after the last instruction */
    }
    pl->out_slot = p->red_op != 0 ? n_slots++ : -1; /* the values reduced, else the output */
    for (int32_t i = 0; i < p->n_instr; i++) {
        pl->reg_slot[i] = i == p->n_instr - 1 ? (pl->out_slot >= 0 ? pl->out_slot : 0)
                          : n_free > 0        ? free_list[--n_free]
                                              : n_slots++;
        for (int a = 0; a < p->ins[i].n_in; a++) {
            int32_t r = p->ins[i].src[a];
            bool dup = false;
            for (int b = 0; b < a; b++) {
                dup = dup || p->ins[i].src[b] == r;
            }
            if (r >= 0 && last[r] == i && !dup) {
                free_list[n_free++] = pl->reg_slot[r];
            }
        }
    }
    /* Tiles of NBI_FUSE_TILE: each instruction costs a call per tile, which shorter tiles
     * (to keep many slots in L1) paid for more than the L2 traffic they saved (Rosenbrock's
     * 21-instruction gradient: 107 -> 80 us at n = 1e4), and reductions then feed 8 pairwise
     * blocks at a time as independent chains. But a short map streaming a large array does
     * better in quarter tiles: its first instruction's loads from memory then interleave
     * with the compute that hides them (tanh(x*a + b)*c over 1e7 floats: 1.70 -> 1.52 ns
     * per element; the same loop in plain C: 1.64 -> 1.28). */
    pl->n_slots = n_slots;
    bool stream = p->red_op == 0 && p->n_instr <= 8 &&
                  nbi_shape_size(p->map_rank, p->map_shape) > 4 * NBI_FUSE_TILE;
    pl->tile = stream ? NBI_FUSE_TILE / 4 : NBI_FUSE_TILE;
}

/* The fill value of a fused pad, converted as the unfused pad kernel converts it (a plain C
 * cast here turned NaN into INT_MIN: undefined behaviour, and other bits than unfused). */
static void nbi_pad_bytes(nb_dtype d, double v, unsigned char *out) {
    memset(out, 0, 8);
    nbi_elem_from_f64(d, v, out);
}

/* How a tiny program of n elements runs instruction in (resolved to f). Float +, -, *, /
 * on up to NBI_FUSE_TINY_INLINE elements run in line: one IEEE operation per element,
 * rounded to the dtype -- what the op's kernels (nbi_badd_f64 and the rest, scalar or
 * AVX2) compute, so the same bits -- without a call that costs more than the two elements
 * of an ODE state. On more, the kernels' AVX2 loops are faster. */
static int nbi_fused_tiny_how(const nbi_finstr *in, const nbi_ew_fast *f, int64_t n) {
    bool f64 = in->in_dtype == NB_DTYPE_F64, f32 = in->in_dtype == NB_DTYPE_F32;
    if (n <= NBI_FUSE_TINY_INLINE && in->n_in == 2 && in->dtype == in->in_dtype && (f64 || f32)) {
        int base = f64 ? NBI_TINY_ADD64 : NBI_TINY_ADD32;
        switch ((nbi_op)in->op) {
        case NBI_OP_ADD:
            return base;
        case NBI_OP_SUB:
            return base + 1;
        case NBI_OP_MUL:
            return base + 2;
        case NBI_OP_DIV:
            return base + 3;
        default:
            break;
        }
    }
    return f->kind == 1   ? NBI_TINY_BIN
           : f->kind == 2 ? (in->dtype == NB_DTYPE_F32 ? NBI_TINY_UN32 : NBI_TINY_UN64)
                          : NBI_TINY_TILE;
}

/* The tiny plan (pl->tiny), when the index space is tiny and the offsets fit; pl, else
 * left as it is, is complete otherwise (slots, functions). The offsets come from the
 * strides, which the tiny plan then replaces. */
static void nbi_fused_plan_tiny(const nbi_fprog *p, nbi_fplan *pl) {
    int64_t n = pl->size;
    if (n < 1 || n > NBI_FUSE_TINY) {
        return;
    }
    nbi_ftiny t;
    memset(&t, 0, sizeof t);
    t.slot_bytes = (int32_t)((n * 8 + 63) / 64 * 64);
    if ((int64_t)pl->n_slots * t.slot_bytes > INT16_MAX) {
        return;
    }
    int32_t used = 0;
    for (int32_t e = 0; e < p->n_ext; e++) {
        if (pl->ext_slot[e] < 0) {
            continue; /* the output's shape, or one value: read in place */
        }
        if (used + n > NBI_FUSE_TINY_OFFS) {
            return;
        }
        bool pad = (p->pad_mask & (1u << e)) != 0;
        t.first[t.n_gather] = (int16_t)used;
        t.gather[t.n_gather++] = (int8_t)e;
        for (int64_t i = 0; i < n; i++) {
            int64_t rest = i, off = 0;
            bool inside = true;
            for (int d = pl->r - 1; d >= 0; d--) {
                int64_t idx = rest % p->map_shape[d], xi = idx - (pad ? p->pad_lo[e][d] : 0);
                rest /= p->map_shape[d];
                inside = inside && (!pad || (xi >= 0 && xi < p->pad_dims[e][d]));
                off += xi * pl->strides[e][d];
            }
            if (inside && (off <= NBI_FUSE_TINY_PAD || off > INT16_MAX)) {
                return;
            }
            t.off[used + i] = inside ? (int16_t)off : (int16_t)NBI_FUSE_TINY_PAD;
        }
        used += (int32_t)n;
    }
    for (int32_t i = 0; i < p->n_instr; i++) {
        const nbi_finstr *in = &p->ins[i];
        nbi_ftins *ti = &t.ins[i];
        for (int a = 0; a < in->n_in; a++) {
            int32_t r = in->src[a], e = -r - 1;
            int32_t slot = r >= 0 ? pl->reg_slot[r] : pl->ext_slot[e];
            ti->base[a] = (uint8_t)(slot >= 0 ? 0 : 1 + e);
            ti->off[a] = (int16_t)(slot >= 0 ? slot * t.slot_bytes : 0);
            if (r < 0 && pl->scalar[e]) {
                ti->scalar |= (uint8_t)(1u << a);
            }
        }
        ti->sa = (ti->scalar & 1u) ? 0 : 1;
        ti->sb = (ti->scalar & 2u) ? 0 : 1;
        ti->out = i == p->n_instr - 1;
        ti->dst = (int16_t)(ti->out ? 0 : pl->reg_slot[i] * t.slot_bytes);
        ti->how = (uint8_t)nbi_fused_tiny_how(in, &pl->fast[i], n);
    }
    pl->tiny_plan = t;
    pl->tiny = true;
    pl->worker_bytes = ((size_t)pl->n_slots * (size_t)t.slot_bytes + 64 + 63) / 64 * 64;
}

/* The plan of node (a fused node whose inputs are set): how each input is read, the tile
 * slots, how a reduction is cut into pieces. */
static void nbi_fused_plan(const nb_var *node, nbi_fplan *pl) {
    const nbi_fprog *p = node->at.callee;
    memset(pl, 0, sizeof *pl);
    pl->r = p->map_rank;
    pl->size = nbi_shape_size(p->map_rank, p->map_shape);
    const int64_t *shape = p->map_shape;
    for (int32_t e = 0; e < p->n_ext; e++) {
        const nb_var *x = node->in[e];
        bool same = x->rank == pl->r;
        for (int d = 0; same && d < x->rank; d++) {
            same = x->shape[d] == shape[d];
        }
        pl->direct[e] = same;
        pl->scalar[e] = x->size == 1 && pl->size > 1;
        nbi_bcast_strides(x->rank, x->shape, pl->r, shape, pl->strides[e]);
        if (p->view_mask & (1u << e)) { /* direct when the view is contiguous */
            int64_t want = 1;
            same = true;
            for (int d = pl->r - 1; d >= 0; d--) {
                pl->strides[e][d] = p->view_st[e][d];
                same = same && (shape[d] == 1 || pl->strides[e][d] == want);
                want *= shape[d];
            }
            pl->direct[e] = same && !(p->pad_mask & (1u << e));
            pl->scalar[e] = x->size == 1 && pl->size > 1 && !(p->pad_mask & (1u << e));
            nbi_pad_bytes(x->dtype, p->pad_value[e], pl->padv[e]);
            pl->ext_off[e] = p->view_off[e] * (int64_t)nbi_dsize(x->dtype);
        }
    }
    for (int32_t i = 0; i < p->n_instr; i++) { /* unary kernels read full tiles */
        const nbi_finstr *in = &p->ins[i];
        for (int a = 0; in->n_in == 1 && a < in->n_in; a++) {
            if (in->src[a] < 0) {
                pl->scalar[-in->src[a] - 1] = false;
            }
        }
    }
    nbi_fused_slots(p, pl);
    pl->worker_bytes = (nbi_fused_bytes(p, pl->n_slots) + 63) / 64 * 64;
    for (int32_t i = 0; i < p->n_instr; i++) {
        const nbi_finstr *in = &p->ins[i];
        nbi_ew_resolve((nbi_op)in->op, in->dtype, in->in_dtype, in->n_in, &pl->fast[i]);
    }
    if (p->red_op != 0) {
        pl->segs = nbi_fused_segs(p);
        pl->rows_per_piece = NBI_RSEG / p->red_n > 0 ? NBI_RSEG / p->red_n : 1;
    }
    nbi_fused_plan_tiny(p, pl);
}

void nbi_fused_prepare(nb_var *node) {
    nbi_fprog *p = node->at.callee;
    nbi_fused_plan(node, (nbi_fplan *)(void *)p->plan);
    p->planned = true;
}

/* n elements of es bytes gathered from src at the planned offsets (the pad value v where
 * an offset says padding). */
static void nbi_fused_tiny_gather(unsigned char *restrict dst, const unsigned char *src,
                                  const int16_t *off, const unsigned char *v, size_t es,
                                  int64_t n) {
    if (es == 8) {
        uint64_t *q = (uint64_t *)(void *)dst;
        for (int64_t i = 0; i < n; i++) {
            memcpy(&q[i], off[i] == NBI_FUSE_TINY_PAD ? v : src + (ptrdiff_t)off[i] * 8, 8);
        }
    } else if (es == 4) {
        uint32_t *q = (uint32_t *)(void *)dst;
        for (int64_t i = 0; i < n; i++) {
            memcpy(&q[i], off[i] == NBI_FUSE_TINY_PAD ? v : src + (ptrdiff_t)off[i] * 4, 4);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            memcpy(dst + (size_t)i * es,
                   off[i] == NBI_FUSE_TINY_PAD ? v : src + (ptrdiff_t)off[i] * (ptrdiff_t)es, es);
        }
    }
}

/* A tiny fused node: the whole index space as one tile, in the scratch, on this thread. The
 * same kernels on the same values as the tiled path (so the same bits), and the reduction
 * of its short runs by the same left folds. */
static void nbi_fused_tiny(const nbi_kargs *k, const nbi_fprog *p, const nbi_fplan *pl) {
    const nbi_ftiny *t = &pl->tiny_plan;
    const nb_var *node = k->node;
    int64_t n = pl->size;
    unsigned char *regs = (unsigned char *)(((uintptr_t)k->scratch + 63) & ~(uintptr_t)63);
    for (int32_t g = 0; g < t->n_gather; g++) {
        int32_t e = t->gather[g];
        nbi_fused_tiny_gather(regs + (size_t)pl->ext_slot[e] * (size_t)t->slot_bytes,
                              (const unsigned char *)k->in[e] + pl->ext_off[e],
                              &t->off[t->first[g]], pl->padv[e], nbi_dsize(node->in[e]->dtype), n);
    }
    unsigned char *vals = p->red_op != 0 ? regs + (size_t)pl->out_slot * (size_t)t->slot_bytes
                                         : (unsigned char *)k->out;
    const unsigned char *base[1 + NBI_FUSE_MAX_EXT];
    base[0] = regs;
    for (int32_t e = 0; e < p->n_ext; e++) {
        base[1 + e] = (const unsigned char *)k->in[e] + pl->ext_off[e];
    }
    unsigned char *dsts[2] = {regs, vals};
    for (const nbi_ftins *ti = t->ins, *end = t->ins + p->n_instr; ti < end; ti++) {
        /* (operands past n_in: the first slot, never read) */
        const void *a0 = base[ti->base[0]] + ti->off[0], *a1 = base[ti->base[1]] + ti->off[1];
        void *o = dsts[ti->out] + ti->dst;
#define NBI_TINY_ARITH(T, OP)                                                                      \
    {                                                                                              \
        T *q = o;                                                                                  \
        const T *qa = a0, *qb = a1;                                                                \
        int64_t sa = ti->sa, sb = ti->sb;                                                          \
        for (int64_t j = 0; j < n; j++) {                                                          \
            q[j] = qa[j * sa] OP qb[j * sb];                                                       \
        }                                                                                          \
    }                                                                                              \
    break
        switch (ti->how) {
        case NBI_TINY_ADD64:
            NBI_TINY_ARITH(double, +);
        case NBI_TINY_SUB64:
            NBI_TINY_ARITH(double, -);
        case NBI_TINY_MUL64:
            NBI_TINY_ARITH(double, *);
        case NBI_TINY_DIV64:
            NBI_TINY_ARITH(double, /);
        case NBI_TINY_ADD32:
            NBI_TINY_ARITH(float, +);
        case NBI_TINY_SUB32:
            NBI_TINY_ARITH(float, -);
        case NBI_TINY_MUL32:
            NBI_TINY_ARITH(float, *);
        case NBI_TINY_DIV32:
            NBI_TINY_ARITH(float, /);
        case NBI_TINY_BIN:
            pl->fast[ti - t->ins].bin(o, a0, a1, n, ti->sa, ti->sb);
            break;
        case NBI_TINY_UN32:
            pl->fast[ti - t->ins].un32(o, a0, n);
            break;
        case NBI_TINY_UN64:
            pl->fast[ti - t->ins].un64(o, a0, n);
            break;
        default: {
            const nbi_finstr *in = &p->ins[ti - t->ins];
            const void *ops[3] = {a0, a1, base[ti->base[2]] + ti->off[2]};
            unsigned sc = ti->scalar;
            bool scb[3] = {(sc & 1u) != 0, (sc & 2u) != 0, (sc & 4u) != 0};
            nbi_ew_tile((nbi_op)in->op, in->dtype, in->in_dtype, in->n_in, o, ops, scb, n);
        }
        }
#undef NBI_TINY_ARITH
    }
    for (int32_t s = 0; s < p->n_store && k->outs != NULL; s++) {
        int32_t r = p->store[s];
        if (k->outs[s] != NULL) {
            memcpy(k->outs[s], dsts[t->ins[r].out] + t->ins[r].dst,
                   (size_t)n * nbi_dsize(p->ins[r].dtype));
        }
    }
    if (p->red_op == 0) {
        return;
    }
    /* runs shorter than a pairwise block: left folds from their first element, as
     * nbi_reduce_short_runs does them (floats), else a stream per run */
    nbi_op op = (nbi_op)p->red_op;
    if (!nbi_reduce_short_runs(op, node->dtype, vals, node->size, p->red_n, k->out)) {
        size_t es = nbi_dsize(node->dtype);
        for (int64_t row = 0; row < node->size; row++) {
            nbi_rstream s;
            nbi_rstream_begin(&s, op, node->dtype);
            nbi_rstream_feed(&s, vals + (size_t)(row * p->red_n) * es, p->red_n);
            nbi_rstream_end(&s, (unsigned char *)k->out + (size_t)row * es);
        }
    }
}

static void nbi_k_fused(const nbi_kargs *k) {
    const nb_var *node = k->node;
    const nbi_fprog *p = node->at.callee;
    nbi_fplan local;
    const nbi_fplan *pl = (const nbi_fplan *)(const void *)p->plan;
    if (!p->planned) { /* a fused node run outside an executable */
        nbi_fused_plan(node, &local);
        pl = &local;
    }
    if (pl->tiny) {
        nbi_fused_tiny(k, p, pl);
        return;
    }
    if (pl->size == 0) {
        return; /* reductions over nothing are never fused */
    }
    nbi_fused_job j;
    j.k = k;
    j.p = p;
    j.pl = pl;
    j.shape = p->map_shape;
    j.partials = NULL;
    j.outs = p->n_store > 0 ? k->outs : NULL;
    for (int32_t e = 0; e < p->n_ext; e++) {
        j.ext_base[e] = (const unsigned char *)k->in[e] + pl->ext_off[e];
    }
    if (p->red_op == 0) {
        nbi_par_range(k->pool, pl->size, NBI_FUSE_CHUNK, nbi_fused_range, &j);
        return;
    }
    int64_t rows = node->size;
    if (pl->segs > 1) {
        j.partials = nbi_fused_base(&j, 0) + (size_t)pl->n_slots * NBI_FUSE_TILE_BYTES;
        nbi_pool_run(k->pool, rows * pl->segs, nbi_fused_reduce_piece, &j);
        size_t es = nbi_dsize(node->dtype);
        for (int64_t row = 0; row < rows; row++) {
            nbi_rstream_combine((nbi_op)p->red_op, node->dtype,
                                j.partials + (size_t)(row * pl->segs) * es, pl->segs,
                                (unsigned char *)k->out + (size_t)row * es);
        }
        return;
    }
    nbi_pool_run(k->pool, (rows + pl->rows_per_piece - 1) / pl->rows_per_piece,
                 nbi_fused_reduce_piece, &j);
}

/* The output: the map shape (every external input that is not a view broadcasts to it),
 * reduced over red_axes when there is a trailing reduction; the last instruction's dtype. */
/* Scratch: the planned slots of an executable's node, else as many as there can be. */
static size_t nbi_fused_worker_bytes(const nb_var *node) {
    const nbi_fprog *p = node->at.callee;
    if (p->planned) {
        return ((const nbi_fplan *)(const void *)p->plan)->worker_bytes;
    }
    return nbi_fused_bytes(p, p->n_instr + p->n_ext + 1);
}

static nb_status nbi_infer_fused(nb_trace *tr, nb_var *p) {
    const nbi_fprog *prog = p->at.callee;
    for (int32_t e = 0; e < p->n_in; e++) {
        if (prog->view_mask & (1u << e)) {
            continue;
        }
        int r2;
        int64_t s2[NB_MAX_RANK];
        if (!nbi_broadcast_shapes(prog->map_rank, prog->map_shape, p->in[e]->rank, p->in[e]->shape,
                                  &r2, s2) ||
            r2 != prog->map_rank ||
            memcmp(s2, prog->map_shape, (size_t)r2 * sizeof(int64_t)) != 0) {
            return nbi_trace_err(tr, NB_ERR_INTERNAL,
                                 "fused: input %d does not broadcast to "
                                 "the program's shape",
                                 (int)e);
        }
    }
    int r = 0;
    for (int d = 0; d < prog->map_rank; d++) {
        bool red = false;
        for (int a = 0; prog->red_op != 0 && a < prog->red_n_axes; a++) {
            red = red || prog->red_axes[a] == d;
        }
        if (!red) {
            p->shape[r++] = prog->map_shape[d];
        } else if (prog->red_keepdims) {
            p->shape[r++] = 1;
        }
    }
    p->rank = (int8_t)r;
    p->dtype = prog->ins[prog->n_instr - 1].dtype;
    return NB_OK;
}

const nbi_op_info nbi_opinfo_fused = {.name = "fused",
                                      .n_in = -1,
                                      .infer = nbi_infer_fused,
                                      .kernel = nbi_k_fused,
                                      .scratch = nbi_fused_worker_bytes};

/* fused_output {index=k}: register store[k] of its fused node's program, over the map
 * shape. The fused node's kernel writes it (the executor hands over its buffer in
 * nbi_kargs.outs), so it has nothing of its own to run. */
static nb_status nbi_infer_fused_output(nb_trace *tr, nb_var *p) {
    const nb_var *f = p->in[0];
    const nbi_fprog *prog = f->op == NBI_OP_FUSED ? f->at.callee : NULL;
    if (prog == NULL || p->at.ivalue < 0 || p->at.ivalue >= prog->n_store) {
        return nbi_trace_err(tr, NB_ERR_INTERNAL, "fused_output: index %lld of a %s",
                             (long long)p->at.ivalue,
                             prog == NULL ? "node that is not fused" : "program storing less");
    }
    p->dtype = prog->ins[prog->store[p->at.ivalue]].dtype;
    p->rank = (int8_t)prog->map_rank;
    memcpy(p->shape, prog->map_shape, sizeof p->shape);
    return NB_OK;
}

static void nbi_k_fused_output(const nbi_kargs *k) {
    (void)k; /* made by the fused node's kernel; never run as an instruction */
}

const nbi_op_info nbi_opinfo_fused_output = {.name = "fused_output",
                                             .n_in = 1,
                                             .infer = nbi_infer_fused_output,
                                             .kernel = nbi_k_fused_output};
