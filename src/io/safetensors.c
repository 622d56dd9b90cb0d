/*
 * safetensors.c -- pytrees to and from safetensors files (nabla/io.h): the writer (atomic:
 * temporary file beside the file the path leads to, fsync, rename, directory fsync), a
 * strict parser that validates every length, offset, dtype and shape before touching data,
 * the rules both share (so that nb_save writes nothing nb_load refuses), and the tree
 * encoding kept in __metadata__["nabla.tree"].
 *
 * The tree encoding (one line, no whitespace), per node in pre-order:
 *   N            null                      A        an array leaf (its tensor: by path)
 *   I<int>;      int                       X<16 hex digits>;  float: its IEEE 754 bits
 *   B0 B1        bool                      S<n>:<n bytes>     string
 *   K<n>:<name>  a built-in activation (nabla/nn.h: relu, tanh, ...), restored by name
 *   R<n>:<name>  any other function reference (restored only through a template)
 *   L<n>( ... )  list of n nodes           T<n>( ... )      tuple of n nodes
 *   D<n>( <k>:<k bytes><node> ... )        dict of n (key, node) pairs
 * A leading ! marks a frozen leaf (nb_tree_freeze). Read, no longer written: F<%a>; -- a
 * float in C's %a form, which wrote every NaN as nan or -nan (payload and signalling bit
 * lost); and R for the built-in activations too (nb_load then refuses those as any R).
 */
#define _POSIX_C_SOURCE 200809L

#include "core/internal.h"
#include "nabla/io.h"
#include "nabla/nn.h"
#include "nn/nn_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a growable byte buffer ------------------------------------------------------------ */

typedef struct nbs_buf {
    nb_ctx *ctx;
    char *p;
    size_t len, cap;
    bool oom;
} nbs_buf;

static void nbs_put(nbs_buf *b, const void *s, size_t n) {
    if (b->oom) {
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *q = nbi_alloc(b->ctx, cap, 16);
        if (q == NULL) {
            b->oom = true;
            return;
        }
        if (b->p != NULL) {
            memcpy(q, b->p, b->len);
            nbi_free(b->ctx, b->p, b->cap);
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void nbs_puts(nbs_buf *b, const char *s) {
    nbs_put(b, s, strlen(s));
}

static void nbs_printf(nbs_buf *b, const char *fmt, ...) NBI_PRINTF(2, 3);
static void nbs_printf(nbs_buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) {
        nbs_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
    }
}

static void nbs_free(nbs_buf *b) {
    if (b->p != NULL) {
        nbi_free(b->ctx, b->p, b->cap);
    }
    b->p = NULL;
    b->len = b->cap = 0;
}

/* s (n bytes) as a JSON string */
static void nbs_json_str(nbs_buf *b, const char *s, size_t n) {
    nbs_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            nbs_put(b, e, 2);
        } else if (c < 0x20) {
            nbs_printf(b, "\\u%04x", c);
        } else {
            nbs_put(b, &s[i], 1);
        }
    }
    nbs_put(b, "\"", 1);
}

/* ---- dtypes ------------------------------------------------------------------------------ */

static const char *const nbs_dtype_names[NB_DTYPE_COUNT] = {[NB_DTYPE_F32] = "F32",
                                                            [NB_DTYPE_F64] = "F64",
                                                            [NB_DTYPE_I32] = "I32",
                                                            [NB_DTYPE_I64] = "I64",
                                                            [NB_DTYPE_BOOL] = "BOOL"};

static int nbs_dtype_of(const char *s, size_t n) {
    for (int d = 0; d < NB_DTYPE_COUNT; d++) {
        if (strlen(nbs_dtype_names[d]) == n && memcmp(nbs_dtype_names[d], s, n) == 0) {
            return d;
        }
    }
    return -1;
}

/* ---- the rules the writer and the reader share ------------------------------------------- */
/* nb_save refuses, with NB_ERR_INVALID, every tree whose file nb_load would refuse: the
 * checks below are the reader's own, called from both sides. */

/* The length of a valid UTF-8 sequence at s (n bytes left), or 0. */
static size_t nbs_utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len = c < 0x80             ? 1
                 : (c & 0xE0) == 0xC0 ? 2
                 : (c & 0xF0) == 0xE0 ? 3
                 : (c & 0xF8) == 0xF0 ? 4
                                      : 0;
    if (len == 0 || len > n) {
        return 0;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1Fu : len == 3 ? c & 0x0Fu : c & 0x07u;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (s[k] & 0x3Fu);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        return 0; /* overlong, out of range, or a surrogate */
    }
    return len;
}

/* The offset of the first byte of s (n bytes) that is not part of valid UTF-8, or n: JSON
 * text (every header string) must be UTF-8. */
static size_t nbs_utf8_bad(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t l = nbs_utf8_len((const unsigned char *)s + i, n - i);
        if (l == 0) {
            return i;
        }
        i += l;
    }
    return n;
}

/* The header's reserved entry: no tensor may carry this name. */
static bool nbs_is_metadata_name(const char *s, size_t n) {
    return n == 12 && memcmp(s, "__metadata__", 12) == 0;
}

/* nabla's built-in activations (nabla/nn.h), stored by name (K in the tree encoding) and
 * restored by it (src/nn/common.c holds the one table). A function reference is stored so
 * only when both its function and its name are a built-in's -- the name
 * nb_nn_activation_leaf gives that function -- so that another function under a
 * built-in's name is never restored as the built-in. */
static nb_fnptr nbs_builtin_fn(const char *s, size_t n) {
    return (nb_fnptr)nbi_nn_activation_named(s, n);
}

/* s (n bytes) for a message, at most 48 of them: printable ASCII as it is, other bytes as
 * \xHH (the text may be what is wrong: not UTF-8). */
static void nbs_escape(char *out, size_t cap, const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n && i < 48 && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out[o++] = (char)c;
        } else {
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        }
    }
    if (n > 48 && o + 4 < cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o < cap ? o : cap - 1] = '\0';
}

/* ---- saving ------------------------------------------------------------------------------ */

typedef struct nbs_leaf {
    char *name; /* inside the names buffer: offset stored until the buffer stops moving */
    size_t name_off, name_len;
    const nb_array *a;
} nbs_leaf;

typedef struct nbs_save {
    nb_ctx *ctx;
    nbs_buf enc;   /* the tree encoding */
    nbs_buf names; /* every leaf's name, NUL-separated */
    nbs_leaf *leaves;
    int64_t n_leaves, cap_leaves;
    nb_status st;
    const char *path;
    nbi_path at; /* the node's path, for messages */
} nbs_save;

/* The save fails: the tree holds something nb_load would refuse. */
static void nbs_refuse(nbs_save *S, const char *fmt, ...) NBI_PRINTF(2, 3);
static void nbs_refuse(nbs_save *S, const char *fmt, ...) {
    if (S->enc.oom || S->names.oom) { /* the first failure was running out of memory */
        S->st = nbi_oom(S->ctx, "nb_save", 0);
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    S->st = nbi_err(S->ctx, NB_ERR_INVALID,
                    "nb_save: %s: %s (nb_load would refuse the file; nothing was written)", S->path,
                    msg);
}

/* Is s (n bytes: a key, a string, a function's name) valid UTF-8? Else the save fails,
 * naming what and where. */
static bool nbs_save_text(nbs_save *S, const char *s, size_t n, const char *what) {
    size_t bad = nbs_utf8_bad(s, n);
    if (bad == n) {
        return true;
    }
    char esc[256];
    nbs_escape(esc, sizeof esc, s, n);
    nbs_refuse(S,
               "%s at %s is \"%s\", which is not valid UTF-8 (byte %zu) -- a safetensors "
               "header is JSON text: use UTF-8",
               what, nbi_path_str(&S->at), esc, bad);
    return false;
}

/* A BOOL array's bytes must be 0 or 1 (the reader checks every one). */
static bool nbs_save_bools(nbs_save *S, const nb_array *a) {
    if (nb_array_dtype(a) != NB_DTYPE_BOOL) {
        return true;
    }
    const unsigned char *b = nb_array_data(a);
    size_t n = nb_array_nbytes(a);
    for (size_t i = 0; i < n; i++) {
        if (b[i] > 1) {
            nbs_refuse(S,
                       "the bool array at %s holds the byte %u at element %zu, where a bool is 0 "
                       "or 1 -- make it with nb_array_cast or store 0 and 1",
                       nbi_path_str(&S->at), (unsigned)b[i], i);
            return false;
        }
    }
    return true;
}

/* name of a child: prefix + "." + component (no dot at the root) */
static void nbs_child_name(nbs_buf *out, const char *prefix, size_t plen, const char *comp,
                           size_t clen) {
    out->len = 0;
    if (plen > 0) {
        nbs_put(out, prefix, plen);
        nbs_put(out, ".", 1);
    }
    nbs_put(out, comp, clen);
}

static void nbs_walk_save(nbs_save *S, const nb_tree *t, const char *name, size_t nlen, int depth) {
    if (S->st != NB_OK) {
        return;
    }
    if (depth > NB_TREE_MAX_DEPTH) {
        S->st = nbi_err(S->ctx, NB_ERR_INVALID, "nb_save: %s: the tree nests deeper than %d",
                        S->path, NB_TREE_MAX_DEPTH);
        return;
    }
    if (nb_tree_is_frozen(t)) {
        nbs_put(&S->enc, "!", 1);
    }
    nb_tree_kind k = nb_tree_kind_of(t);
    switch (k) {
    case NB_TREE_KIND_NULL:
        nbs_put(&S->enc, "N", 1);
        return;
    case NB_TREE_KIND_ARRAY: {
        nbs_put(&S->enc, "A", 1);
        if (S->n_leaves == S->cap_leaves) {
            int64_t cap = S->cap_leaves ? S->cap_leaves * 2 : 16;
            nbs_leaf *l = nbi_alloc(S->ctx, (size_t)cap * sizeof *l, 16);
            if (l == NULL) {
                S->st = nbi_oom(S->ctx, "nb_save", (size_t)cap * sizeof *l);
                return;
            }
            if (S->leaves != NULL) {
                memcpy(l, S->leaves, (size_t)S->n_leaves * sizeof *l);
                nbi_free(S->ctx, S->leaves, (size_t)S->cap_leaves * sizeof *l);
            }
            S->leaves = l;
            S->cap_leaves = cap;
        }
        if (nbs_is_metadata_name(name, nlen)) {
            nbs_refuse(S,
                       "the array at %s would be stored as the tensor '__metadata__', the name "
                       "the safetensors header reserves for its metadata -- rename the key",
                       nbi_path_str(&S->at));
            return;
        }
        if (!nbs_save_bools(S, nb_tree_get_array(t))) {
            return;
        }
        nbs_leaf *l = &S->leaves[S->n_leaves++];
        l->name_off = S->names.len;
        l->name_len = nlen;
        l->a = nb_tree_get_array(t);
        nbs_put(&S->names, name, nlen);
        nbs_put(&S->names, "", 1); /* the NUL */
        return;
    }
    case NB_TREE_KIND_VAR:
        S->st = nbi_err(S->ctx, NB_ERR_KIND,
                        "nb_save: %s: the leaf at %s is a traced var, not an array -- save "
                        "the arrays a function returned, outside any trace",
                        S->path, nbi_path_str(&S->at));
        return;
    case NB_TREE_KIND_INT: {
        int64_t v = 0;
        nb_tree_get_int(t, &v);
        nbs_printf(&S->enc, "I%lld;", (long long)v);
        return;
    }
    case NB_TREE_KIND_FLOAT: {
        double v = 0;
        nb_tree_get_float(t, &v);
        uint64_t bits = 0;
        memcpy(&bits, &v, sizeof bits);
        nbs_printf(&S->enc, "X%016llx;", (unsigned long long)bits);
        return;
    }
    case NB_TREE_KIND_BOOL: {
        bool v = false;
        nb_tree_get_bool(t, &v);
        nbs_puts(&S->enc, v ? "B1" : "B0");
        return;
    }
    case NB_TREE_KIND_STRING:
    case NB_TREE_KIND_FNREF: {
        const char *s = NULL;
        nb_fnptr fp = NULL;
        if (k == NB_TREE_KIND_STRING) {
            nb_tree_get_string(t, &s);
        } else {
            nb_tree_get_fnref(t, &fp, &s);
        }
        size_t n = strlen(s);
        if (!nbs_save_text(S, s, n,
                           k == NB_TREE_KIND_STRING ? "the string"
                                                    : "the name of the function reference")) {
            return;
        }
        char c = k == NB_TREE_KIND_STRING ? 'S' : nbs_builtin_fn(s, n) == fp ? 'K' : 'R';
        nbs_printf(&S->enc, "%c%zu:", c, n);
        nbs_put(&S->enc, s, n);
        return;
    }
    default:
        break;
    }
    int64_t n = nb_tree_len(t);
    nbs_printf(&S->enc, "%c%lld(",
               k == NB_TREE_KIND_LIST    ? 'L'
               : k == NB_TREE_KIND_TUPLE ? 'T'
                                         : 'D',
               (long long)n);
    nbs_buf child = {S->ctx, NULL, 0, 0, false};
    for (int64_t i = 0; i < n && S->st == NB_OK; i++) {
        char idx[32];
        const char *comp = idx;
        size_t clen;
        nbi_path_mark mark = nbi_path_save(&S->at);
        if (k == NB_TREE_KIND_DICT) {
            comp = nb_tree_key(t, i);
            clen = strlen(comp);
            if (!nbs_save_text(S, comp, clen, "a key of the dict")) {
                break;
            }
            nbs_printf(&S->enc, "%zu:", clen);
            nbs_put(&S->enc, comp, clen);
            nbi_path_push_key(&S->at, comp);
        } else {
            clen = (size_t)snprintf(idx, sizeof idx, "%lld", (long long)i);
            nbi_path_push_index(&S->at, i);
        }
        nbs_child_name(&child, name, nlen, comp, clen);
        if (child.oom) {
            break;
        }
        nbs_walk_save(S, nb_tree_child(t, i), child.p, child.len, depth + 1);
        nbi_path_restore(&S->at, mark);
    }
    if (child.oom && S->st == NB_OK) {
        S->st = nbi_oom(S->ctx, "nb_save", 0);
    }
    nbs_free(&child);
    nbs_put(&S->enc, ")", 1);
}

static int nbs_cmp_leaf_names(const void *a, const void *b, void *names) {
    const nbs_leaf *x = a, *y = b;
    (void)names;
    return strcmp(x->name, y->name);
}

/* qsort without a context argument: names are resolved into pointers first */
static int nbs_cmp_leaf(const void *a, const void *b) {
    return nbs_cmp_leaf_names(a, b, NULL);
}

static long nbs_write_all(nb_ctx *ctx, int fd, const void *buf, size_t n) {
    void *ud = NULL;
    nb_write_hook hook = nbi_ctx_write_hook(ctx, &ud);
    const char *p = buf;
    size_t left = n;
    while (left > 0) {
        size_t chunk = left > ((size_t)1 << 30) ? ((size_t)1 << 30) : left;
        long w = hook != NULL ? hook(ud, fd, p, chunk) : (long)write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    return (long)n;
}

/* What is at path, in words, when it is neither a regular file nor a symlink. */
static const char *nbs_file_type(mode_t m) {
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISDIR(m)  ? "a directory"
           : S_ISSOCK(m) ? "a socket"
                         : "a special file";
}

/* Symlinks followed before a save gives up (Linux's own limit for one lookup is 40). */
#define NBS_MAX_LINKS 40

/* The file a save to path replaces: path itself when nothing or a regular file is there;
 * when path is a symlink, the file at the end of the chain (a relative link read from its
 * own directory; a dangling link ends at the file it names, which the save creates). Any
 * other type of file -- FIFO, device, directory, socket -- is refused with NB_ERR_IO:
 * renaming over it would replace it (a device node as root) instead of writing to it.
 * *target is a new buffer of *cap bytes (the context's allocator). */
static nb_status nbs_save_target(nb_ctx *ctx, const char *fn, const char *path, char **target,
                                 size_t *cap) {
    *target = NULL;
    size_t n = strlen(path);
    char *cur = nbi_alloc(ctx, n + 1, 16);
    if (cur == NULL) {
        return nbi_oom(ctx, fn, n + 1);
    }
    memcpy(cur, path, n + 1);
    size_t cur_cap = n + 1;
    nb_status st = NB_OK;
    char link[4096];
    for (int hops = 0;; hops++) {
        struct stat sb;
        /* not there (or not reachable: creating the temporary file reports why) */
        if (lstat(cur, &sb) != 0 || S_ISREG(sb.st_mode)) {
            break;
        }
        if (!S_ISLNK(sb.st_mode)) {
            if (hops == 0) {
                st = nbi_err(ctx, NB_ERR_IO,
                             "%s: %s is %s, not a regular file -- nb_save replaces only regular "
                             "files (or the file a symlink leads to); save to another path",
                             fn, path, nbs_file_type(sb.st_mode));
            } else {
                st = nbi_err(ctx, NB_ERR_IO,
                             "%s: %s is a symlink to %s, which is %s, not a regular file -- "
                             "nb_save replaces only regular files; save to another path",
                             fn, path, cur, nbs_file_type(sb.st_mode));
            }
            break;
        }
        ssize_t k = hops < NBS_MAX_LINKS ? readlink(cur, link, sizeof link) : -1;
        if (k <= 0 || (size_t)k >= sizeof link) {
            st = nbi_err(ctx, NB_ERR_IO, "%s: cannot follow the symlink %s%s%s: %s", fn, path,
                         hops > 0 ? " at " : "", hops > 0 ? cur : "",
                         hops >= NBS_MAX_LINKS ? "more than 40 links in a chain (a loop?)"
                         : k < 0               ? strerror(errno)
                         : k == 0              ? "it is empty"
                                               : "its target is too long");
            break;
        }
        /* the next path: the link's text when absolute, else from the link's directory */
        size_t dl = 0;
        if (link[0] != '/') {
            dl = strlen(cur);
            while (dl > 0 && cur[dl - 1] != '/') {
                dl--;
            }
        }
        size_t next_cap = dl + (size_t)k + 1;
        char *next = nbi_alloc(ctx, next_cap, 16);
        if (next == NULL) {
            st = nbi_oom(ctx, fn, next_cap);
            break;
        }
        memcpy(next, cur, dl);
        memcpy(next + dl, link, (size_t)k);
        next[dl + (size_t)k] = '\0';
        nbi_free(ctx, cur, cur_cap);
        cur = next;
        cur_cap = next_cap;
    }
    if (st != NB_OK) {
        nbi_free(ctx, cur, cur_cap);
        return st;
    }
    *target = cur;
    *cap = cur_cap;
    return NB_OK;
}

/* fsync the directory holding path (the rename reaches the disk with it). */
static void nbs_sync_dir(char *path) {
    size_t dl = strlen(path);
    while (dl > 0 && path[dl - 1] != '/') {
        dl--;
    }
    int dfd;
    if (dl == 0) {
        dfd = open(".", O_RDONLY);
    } else {
        size_t cut = dl > 1 ? dl - 1 : 1; /* "/x": the root */
        char keep = path[cut];
        path[cut] = '\0';
        dfd = open(path, O_RDONLY);
        path[cut] = keep;
    }
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
}

/* The entry checks of a call on a tree and a path: a live tree (named arg), then a path. */
static nb_status nbs_tree_path_args(const char *fn, const char *arg, const nb_tree *t,
                                    const char *path) {
    nb_status st = nbi_check_handle(t, NBI_MAGIC_TREE, fn, arg);
    if (st == NB_OK && path == NULL) {
        st = nbi_err_null(nb_tree_ctx(t), fn, "path", "pass the file's path");
    }
    return st;
}

/* A NULL out-parameter named out_name, on ctx. */
static nb_status nbs_null_out(nb_ctx *ctx, const char *fn, const char *out_name) {
    return nbi_err(ctx, NB_ERR_MISUSE,
                   "%s: %s is NULL (pass the address of an nb_tree * to receive the loaded tree)",
                   fn, out_name);
}

nb_status nb_save(const nb_tree *tree, const char *path) {
    static const char fn[] = "nb_save";
    nb_status cst = nbs_tree_path_args(fn, "tree", tree, path);
    if (cst != NB_OK) {
        return cst;
    }
    nb_ctx *ctx = nb_tree_ctx(tree);
    nbs_save S = {.ctx = ctx,
                  .enc = {ctx, NULL, 0, 0, false},
                  .names = {ctx, NULL, 0, 0, false},
                  .st = NB_OK,
                  .path = path};
    nbi_path_init(&S.at);
    nbs_walk_save(&S, tree, "", 0, 0);
    nbs_buf hdr = {ctx, NULL, 0, 0, false};
    char *tmp = NULL, *target = NULL;
    size_t tmp_size = 0, target_size = 0;
    int fd = -1;
    if (S.st == NB_OK && (S.enc.oom || S.names.oom)) {
        S.st = nbi_oom(ctx, fn, 0);
    }
    /* unique names (a key holding a dot can collide with a nested path) */
    nbs_leaf *sorted = NULL;
    if (S.st == NB_OK && S.n_leaves > 0) {
        sorted = nbi_alloc(ctx, (size_t)S.n_leaves * sizeof *sorted, 16);
        if (sorted == NULL) {
            S.st = nbi_oom(ctx, fn, (size_t)S.n_leaves * sizeof *sorted);
        } else {
            for (int64_t i = 0; i < S.n_leaves; i++) {
                S.leaves[i].name = S.names.p + S.leaves[i].name_off;
                sorted[i] = S.leaves[i];
            }
            qsort(sorted, (size_t)S.n_leaves, sizeof *sorted, nbs_cmp_leaf);
            for (int64_t i = 1; i < S.n_leaves && S.st == NB_OK; i++) {
                if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
                    S.st = nbi_err(ctx, NB_ERR_INVALID,
                                   "%s: %s: two array leaves would both be stored as tensor "
                                   "'%s' (a dict key with a dot collides with a nested path) -- "
                                   "rename the key",
                                   fn, path, sorted[i].name);
                }
            }
        }
    }
    /* the header (given up early when the tree's encoding alone is past the limit) */
    if (S.st == NB_OK && S.enc.len <= NB_SAFETENSORS_MAX_HEADER) {
        nbs_puts(&hdr, "{\"__metadata__\":{\"format\":\"nabla\",\"nabla.tree\":");
        nbs_json_str(&hdr, S.enc.p != NULL ? S.enc.p : "", S.enc.len);
        nbs_puts(&hdr, "}");
        uint64_t off = 0;
        for (int64_t i = 0; i < S.n_leaves; i++) {
            const nb_array *a = S.leaves[i].a;
            size_t nbytes = nb_array_nbytes(a);
            nbs_puts(&hdr, ",");
            nbs_json_str(&hdr, S.leaves[i].name, S.leaves[i].name_len);
            nbs_printf(&hdr, ":{\"dtype\":\"%s\",\"shape\":[", nbs_dtype_names[nb_array_dtype(a)]);
            for (int d = 0; d < nb_array_rank(a); d++) {
                nbs_printf(&hdr, d ? ",%lld" : "%lld", (long long)nb_array_shape(a)[d]);
            }
            nbs_printf(&hdr, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                       (unsigned long long)(off + nbytes));
            off += nbytes;
        }
        nbs_puts(&hdr, "}");
        while (!hdr.oom && (8 + hdr.len) % 8 != 0) { /* (an out-of-memory buffer stops growing) */
            nbs_put(&hdr, " ", 1);
        }
        if (hdr.oom) {
            S.st = nbi_oom(ctx, fn, 0);
        }
    }
    if (S.st == NB_OK &&
        (S.enc.len > NB_SAFETENSORS_MAX_HEADER || hdr.len > NB_SAFETENSORS_MAX_HEADER)) {
        S.st = nbi_err(ctx, NB_ERR_INVALID,
                       "%s: %s: the header would take %s%zu bytes, more than the %llu a reader "
                       "accepts (NB_SAFETENSORS_MAX_HEADER) -- the tree holds too many leaves or "
                       "too long keys and strings; keep long text in arrays (nb_load would refuse "
                       "the file; nothing was written)",
                       fn, path, hdr.len > 0 ? "" : "over ", hdr.len > 0 ? hdr.len : S.enc.len,
                       (unsigned long long)NB_SAFETENSORS_MAX_HEADER);
    }
    /* where the bytes go: the file path leads to (through symlinks) */
    if (S.st == NB_OK) {
        S.st = nbs_save_target(ctx, fn, path, &target, &target_size);
    }
    /* the temporary file, in the target's directory */
    if (S.st == NB_OK) {
        tmp_size = strlen(target) + 16;
        tmp = nbi_alloc(ctx, tmp_size, 16);
        if (tmp == NULL) {
            S.st = nbi_oom(ctx, fn, tmp_size);
        } else {
            snprintf(tmp, tmp_size, "%s.tmpXXXXXX", target);
            fd = mkstemp(tmp);
            if (fd < 0) {
                S.st = nbi_err(ctx, NB_ERR_IO, "%s: cannot create a temporary file beside %s: %s",
                               fn, target, strerror(errno));
            } else {
                (void)fchmod(fd, 0644);
            }
        }
    }
    if (S.st == NB_OK) {
        unsigned char len8[8];
        uint64_t h = (uint64_t)hdr.len;
        for (int i = 0; i < 8; i++) {
            len8[i] = (unsigned char)(h >> (8 * i));
        }
        bool ok =
            nbs_write_all(ctx, fd, len8, 8) >= 0 && nbs_write_all(ctx, fd, hdr.p, hdr.len) >= 0;
        for (int64_t i = 0; ok && i < S.n_leaves; i++) {
            const nb_array *a = S.leaves[i].a;
            ok = nbs_write_all(ctx, fd, nb_array_data(a), nb_array_nbytes(a)) >= 0;
        }
        ok = ok && fsync(fd) == 0;
        int err = ok ? 0 : errno;
        if (close(fd) != 0 && ok) {
            ok = false;
            err = errno;
        }
        fd = -1;
        if (ok && rename(tmp, target) != 0) {
            ok = false;
            err = errno;
        }
        if (!ok) {
            unlink(tmp);
            S.st = nbi_err(ctx, NB_ERR_IO, "%s: writing %s failed: %s (the old file is untouched)",
                           fn, target, strerror(err));
        } else {
            nbs_sync_dir(target);
        }
    }
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    if (tmp != NULL) {
        nbi_free(ctx, tmp, tmp_size);
    }
    if (target != NULL) {
        nbi_free(ctx, target, target_size);
    }
    if (sorted != NULL) {
        nbi_free(ctx, sorted, (size_t)S.n_leaves * sizeof *sorted);
    }
    if (S.leaves != NULL) {
        nbi_free(ctx, S.leaves, (size_t)S.cap_leaves * sizeof *S.leaves);
    }
    nbs_free(&hdr);
    nbs_free(&S.enc);
    nbs_free(&S.names);
    return S.st;
}

/* ---- parsing the header ------------------------------------------------------------------ */

typedef struct nbs_tensor {
    char *name;
    size_t name_len;
    int dtype;
    int rank;
    int64_t shape[NB_MAX_RANK];
    uint64_t begin, end;
} nbs_tensor;

typedef struct nbs_parse {
    nb_ctx *ctx;
    const char *who, *file;
    const char *s;
    size_t n, i;
    nb_status st;
    nbs_tensor *t;
    int64_t nt, cap;
    char *tree; /* __metadata__["nabla.tree"], or NULL */
    size_t tree_len;
    nbs_buf strings; /* every decoded string, NUL-terminated; tensors point into it */
} nbs_parse;

static nb_status nbs_fail(nbs_parse *p, const char *fmt, ...) NBI_PRINTF(2, 3);
static nb_status nbs_fail(nbs_parse *p, const char *fmt, ...) {
    if (p->st != NB_OK) {
        return p->st;
    }
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->st = nbi_err(p->ctx, NB_ERR_FORMAT,
                    "%s: %s: %s (at header byte %zu) -- the file is corrupt or not safetensors",
                    p->who, p->file, msg, p->i);
    return p->st;
}

static void nbs_ws(nbs_parse *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) {
        p->i++;
    }
}

static bool nbs_expect(nbs_parse *p, char c) {
    nbs_ws(p);
    if (p->i < p->n && p->s[p->i] == c) {
        p->i++;
        return true;
    }
    nbs_fail(p, "expected '%c'", c);
    return false;
}

static int nbs_hex(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static void nbs_utf8(nbs_buf *b, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | (cp >> 6));
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | (cp >> 18));
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    nbs_put(b, u, n);
}

/* A JSON string: decoded into p->strings; *off, *len locate it there. */
static bool nbs_string(nbs_parse *p, size_t *off, size_t *len) {
    if (!nbs_expect(p, '"')) {
        return false;
    }
    *off = p->strings.len;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            *len = p->strings.len - *off;
            nbs_put(&p->strings, "", 1);
            if (p->strings.oom) {
                p->st = nbi_oom(p->ctx, p->who, 0);
                return false;
            }
            return true;
        }
        if (c < 0x20) {
            nbs_fail(p, "a control character inside a string");
            return false;
        }
        if (c == '\\') {
            if (p->i + 1 >= p->n) {
                break;
            }
            char e = p->s[p->i + 1];
            p->i += 2;
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *q = strchr(from, e);
            if (e != 'u' && (q == NULL || e == '\0')) {
                nbs_fail(p, "an invalid escape \\%c", e);
                return false;
            }
            if (e != 'u') {
                nbs_put(&p->strings, &to[q - from], 1);
                continue;
            }
            uint32_t cp = 0;
            for (int k = 0; k < 4; k++) {
                int h = p->i < p->n ? nbs_hex(p->s[p->i]) : -1;
                if (h < 0) {
                    nbs_fail(p, "an invalid \\u escape");
                    return false;
                }
                cp = cp * 16 + (uint32_t)h;
                p->i++;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
                uint32_t lo = 0;
                if (p->i + 6 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                    nbs_fail(p, "an unpaired surrogate");
                    return false;
                }
                p->i += 2;
                for (int k = 0; k < 4; k++) {
                    int h = nbs_hex(p->s[p->i]);
                    if (h < 0) {
                        nbs_fail(p, "an invalid \\u escape");
                        return false;
                    }
                    lo = lo * 16 + (uint32_t)h;
                    p->i++;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    nbs_fail(p, "an unpaired surrogate");
                    return false;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                nbs_fail(p, "an unpaired surrogate");
                return false;
            }
            if (cp == 0) {
                nbs_fail(p, "a NUL character inside a string");
                return false;
            }
            nbs_utf8(&p->strings, cp);
            continue;
        }
        size_t l = nbs_utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
        if (l == 0) {
            nbs_fail(p, "invalid UTF-8");
            return false;
        }
        nbs_put(&p->strings, p->s + p->i, l);
        p->i += l;
    }
    nbs_fail(p, "an unterminated string");
    return false;
}

/* A non-negative JSON integer (no sign, no fraction, no exponent, no leading zeros). */
static bool nbs_uint(nbs_parse *p, uint64_t *out) {
    nbs_ws(p);
    size_t start = p->i;
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = (unsigned)(p->s[p->i] - '0');
        if (v > (UINT64_MAX - d) / 10) {
            nbs_fail(p, "an integer too large");
            return false;
        }
        v = v * 10 + d;
        p->i++;
    }
    if (p->i == start || (p->i - start > 1 && p->s[start] == '0')) {
        nbs_fail(p, "expected a non-negative integer");
        return false;
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        nbs_fail(p, "expected an integer, not a fraction");
        return false;
    }
    *out = v;
    return true;
}

static const char *nbs_str_at(nbs_parse *p, size_t off) {
    return p->strings.p + off;
}

static bool nbs_tensor_entry(nbs_parse *p, size_t name_off, size_t name_len) {
    if (p->nt == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 16;
        nbs_tensor *t = nbi_alloc(p->ctx, (size_t)cap * sizeof *t, 16);
        if (t == NULL) {
            p->st = nbi_oom(p->ctx, p->who, (size_t)cap * sizeof *t);
            return false;
        }
        if (p->t != NULL) {
            memcpy(t, p->t, (size_t)p->nt * sizeof *t);
            nbi_free(p->ctx, p->t, (size_t)p->cap * sizeof *t);
        }
        p->t = t;
        p->cap = cap;
    }
    nbs_tensor *t = &p->t[p->nt++];
    memset(t, 0, sizeof *t);
    t->name = (char *)(uintptr_t)name_off; /* an offset until the strings stop moving */
    t->name_len = name_len;
    t->dtype = -1;
    bool have_shape = false, have_off = false;
    if (!nbs_expect(p, '{')) {
        return false;
    }
    nbs_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        nbs_fail(p, "a tensor entry without dtype, shape and data_offsets");
        return false;
    }
    for (;;) {
        size_t ko = 0, kl = 0;
        if (!nbs_string(p, &ko, &kl) || !nbs_expect(p, ':')) {
            return false;
        }
        const char *key = nbs_str_at(p, ko);
        if (strcmp(key, "dtype") == 0 && t->dtype < 0) {
            size_t vo = 0, vl = 0;
            if (!nbs_string(p, &vo, &vl)) {
                return false;
            }
            t->dtype = nbs_dtype_of(nbs_str_at(p, vo), vl);
            if (t->dtype < 0) {
                nbs_fail(p, "dtype '%.16s' is not one nabla reads (F32, F64, I32, I64, BOOL)",
                         nbs_str_at(p, vo));
                return false;
            }
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            have_shape = true;
            if (!nbs_expect(p, '[')) {
                return false;
            }
            nbs_ws(p);
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
            } else {
                for (;;) {
                    uint64_t d = 0;
                    if (!nbs_uint(p, &d)) {
                        return false;
                    }
                    if (t->rank == NB_MAX_RANK) {
                        nbs_fail(p, "a shape of more than %d dims", NB_MAX_RANK);
                        return false;
                    }
                    if (d > (uint64_t)INT64_MAX) {
                        nbs_fail(p, "a dim too large");
                        return false;
                    }
                    t->shape[t->rank++] = (int64_t)d;
                    nbs_ws(p);
                    if (p->i < p->n && p->s[p->i] == ',') {
                        p->i++;
                        continue;
                    }
                    if (!nbs_expect(p, ']')) {
                        return false;
                    }
                    break;
                }
            }
        } else if (strcmp(key, "data_offsets") == 0 && !have_off) {
            have_off = true;
            if (!nbs_expect(p, '[') || !nbs_uint(p, &t->begin) || !nbs_expect(p, ',') ||
                !nbs_uint(p, &t->end) || !nbs_expect(p, ']')) {
                return false;
            }
        } else {
            nbs_fail(p, "an unknown or repeated key '%.32s' in a tensor entry", key);
            return false;
        }
        nbs_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (!nbs_expect(p, '}')) {
            return false;
        }
        break;
    }
    if (t->dtype < 0 || !have_shape || !have_off) {
        nbs_fail(p, "a tensor entry lacks %s",
                 t->dtype < 0  ? "dtype"
                 : !have_shape ? "shape"
                               : "data_offsets");
        return false;
    }
    return true;
}

typedef struct nbs_key {
    size_t off, len;
} nbs_key;

static _Thread_local const char *g_nbs_keys_base; /* for the comparator (per thread) */

static int nbs_cmp_key(const void *a, const void *b) {
    const nbs_key *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(g_nbs_keys_base + x->off, g_nbs_keys_base + y->off, n);
    return c != 0 ? c : (x->len > y->len) - (x->len < y->len);
}

/* Are the n keys (offsets into p->strings) distinct? */
static bool nbs_keys_unique(nbs_parse *p, nbs_key *k, int64_t n) {
    g_nbs_keys_base = p->strings.p;
    qsort(k, (size_t)n, sizeof *k, nbs_cmp_key);
    for (int64_t i = 1; i < n; i++) {
        if (nbs_cmp_key(&k[i - 1], &k[i]) == 0) {
            nbs_fail(p, "__metadata__ holds the key '%.64s' twice", p->strings.p + k[i].off);
            return false;
        }
    }
    return true;
}

static bool nbs_metadata(nbs_parse *p) {
    if (!nbs_expect(p, '{')) {
        return false;
    }
    nbs_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return true;
    }
    nbs_key *keys = NULL;
    int64_t nk = 0, capk = 0;
    bool ok = false;
    for (;;) {
        size_t ko = 0, kl = 0, vo = 0, vl = 0;
        if (!nbs_string(p, &ko, &kl) || !nbs_expect(p, ':')) {
            break;
        }
        if (nk == capk) {
            int64_t cap = capk ? capk * 2 : 8;
            nbs_key *q = nbi_alloc(p->ctx, (size_t)cap * sizeof *q, 16);
            if (q == NULL) {
                p->st = nbi_oom(p->ctx, p->who, (size_t)cap * sizeof *q);
                break;
            }
            if (keys != NULL) {
                memcpy(q, keys, (size_t)nk * sizeof *q);
                nbi_free(p->ctx, keys, (size_t)capk * sizeof *keys);
            }
            keys = q;
            capk = cap;
        }
        keys[nk].off = ko;
        keys[nk].len = kl;
        nk++;
        nbs_ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') {
            nbs_fail(p, "a __metadata__ value that is not a string");
            break;
        }
        if (!nbs_string(p, &vo, &vl)) {
            break;
        }
        if (strcmp(nbs_str_at(p, ko), "nabla.tree") == 0) {
            p->tree = (char *)(uintptr_t)vo; /* an offset for now */
            p->tree_len = vl + 1;            /* + 1: set */
        }
        nbs_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        ok = nbs_expect(p, '}') && nbs_keys_unique(p, keys, nk);
        break;
    }
    if (keys != NULL) {
        nbi_free(p->ctx, keys, (size_t)capk * sizeof *keys);
    }
    return ok;
}

static int nbs_cmp_tensor_name(const void *a, const void *b) {
    const nbs_tensor *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c != 0 ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int nbs_cmp_tensor_begin(const void *a, const void *b) {
    const nbs_tensor *const *x = a, *const *y = b;
    if ((*x)->begin != (*y)->begin) {
        return (*x)->begin < (*y)->begin ? -1 : 1;
    }
    return ((*x)->end > (*y)->end) - ((*x)->end < (*y)->end);
}

/* Parse and validate the header of a file of total size bytes; data_size: bytes after the
 * header. On success the tensors are sorted by name. */
static nb_status nbs_parse_header(nbs_parse *p, uint64_t data_size) {
    if (!nbs_expect(p, '{')) {
        return p->st;
    }
    nbs_ws(p);
    bool first = true;
    bool meta_seen = false;
    while (p->st == NB_OK) {
        nbs_ws(p);
        if (first && p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            break;
        }
        size_t ko = 0, kl = 0;
        if (!nbs_string(p, &ko, &kl) || !nbs_expect(p, ':')) {
            break;
        }
        first = false;
        if (nbs_is_metadata_name(nbs_str_at(p, ko), kl)) {
            if (meta_seen) {
                nbs_fail(p, "two __metadata__ entries");
                break;
            }
            meta_seen = true;
            if (!nbs_metadata(p)) {
                break;
            }
        } else if (!nbs_tensor_entry(p, ko, kl)) {
            break;
        }
        nbs_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (nbs_expect(p, '}')) {
            break;
        }
    }
    if (p->st != NB_OK) {
        return p->st;
    }
    nbs_ws(p);
    if (p->i != p->n) {
        return nbs_fail(p, "bytes after the header's JSON object");
    }
    if (p->strings.oom) {
        return p->st = nbi_oom(p->ctx, p->who, 0);
    }
    /* the strings stopped moving: offsets become pointers */
    for (int64_t k = 0; k < p->nt; k++) {
        p->t[k].name = p->strings.p + (uintptr_t)p->t[k].name;
    }
    if (p->tree_len > 0) {
        p->tree = p->strings.p + (uintptr_t)p->tree;
        p->tree_len--;
    }
    /* names unique */
    if (p->nt > 1) {
        qsort(p->t, (size_t)p->nt, sizeof *p->t, nbs_cmp_tensor_name);
        for (int64_t k = 1; k < p->nt; k++) {
            if (nbs_cmp_tensor_name(&p->t[k - 1], &p->t[k]) == 0) {
                return nbs_fail(p, "two tensors named '%.64s'", p->t[k].name);
            }
        }
    }
    /* sizes, offsets and the tiling of the buffer */
    for (int64_t k = 0; k < p->nt; k++) {
        nbs_tensor *t = &p->t[k];
        uint64_t count = 1;
        for (int d = 0; d < t->rank; d++) {
            if (t->shape[d] != 0 && count > (uint64_t)INT64_MAX / (uint64_t)t->shape[d]) {
                return nbs_fail(p, "tensor '%.64s': its shape's size overflows", t->name);
            }
            count *= (uint64_t)t->shape[d];
        }
        uint64_t es = nbi_dsize((nb_dtype)t->dtype);
        if (count > UINT64_MAX / es || count * es > (uint64_t)SIZE_MAX) {
            return nbs_fail(p, "tensor '%.64s': its byte size overflows", t->name);
        }
        if (t->end < t->begin || t->end > data_size) {
            return nbs_fail(p,
                            "tensor '%.64s': data_offsets [%llu, %llu] lie outside the %llu "
                            "bytes of data",
                            t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                            (unsigned long long)data_size);
        }
        if (t->end - t->begin != count * es) {
            return nbs_fail(p,
                            "tensor '%.64s': data_offsets [%llu, %llu] hold %llu bytes, its dtype "
                            "and shape need %llu",
                            t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                            (unsigned long long)(t->end - t->begin),
                            (unsigned long long)(count * es));
        }
    }
    const nbs_tensor **by = NULL;
    if (p->nt > 0) {
        by = nbi_alloc(p->ctx, (size_t)p->nt * sizeof *by, 16);
        if (by == NULL) {
            return p->st = nbi_oom(p->ctx, p->who, (size_t)p->nt * sizeof *by);
        }
        for (int64_t k = 0; k < p->nt; k++) {
            by[k] = &p->t[k];
        }
        qsort(by, (size_t)p->nt, sizeof *by, nbs_cmp_tensor_begin);
    }
    uint64_t at = 0;
    for (int64_t k = 0; k < p->nt && p->st == NB_OK; k++) {
        if (by[k]->begin != at) {
            nbs_fail(p,
                     "tensor '%.64s' starts at byte %llu of the data where %llu was expected: %s",
                     by[k]->name, (unsigned long long)by[k]->begin, (unsigned long long)at,
                     by[k]->begin < at ? "tensors overlap" : "a gap");
        }
        at = by[k]->end;
    }
    if (by != NULL) {
        nbi_free(p->ctx, by, (size_t)p->nt * sizeof *by);
    }
    if (p->st == NB_OK && at != data_size) {
        nbs_fail(p, "the tensors cover %llu of the %llu bytes of data", (unsigned long long)at,
                 (unsigned long long)data_size);
    }
    return p->st;
}

/* ---- reading ----------------------------------------------------------------------------- */

typedef struct nbs_src {
    const unsigned char *mem; /* the whole file in memory, or NULL */
    FILE *f;
    uint64_t data_start;
} nbs_src;

static const nbs_tensor *nbs_find(const nbs_parse *p, const char *name, size_t len) {
    int64_t lo = 0, hi = p->nt - 1;
    nbs_tensor key;
    key.name = (char *)name;
    key.name_len = len;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = nbs_cmp_tensor_name(&key, &p->t[mid]);
        if (c == 0) {
            return &p->t[mid];
        }
        if (c < 0) {
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
    }
    return NULL;
}

/* A new leaf holding tensor t's data. */
static nb_status nbs_read_leaf(nbs_parse *p, const nbs_src *src, const nbs_tensor *t,
                               nb_tree **out) {
    nb_array *a = NULL;
    nb_status st = nbi_array_new(p->ctx, p->who, (nb_dtype)t->dtype, t->rank, t->shape, &a);
    if (st != NB_OK) {
        return st;
    }
    size_t n = (size_t)(t->end - t->begin);
    if (n > 0) {
        if (src->mem != NULL) {
            memcpy(nb_array_data(a), src->mem + src->data_start + t->begin, n);
        } else if (fseeko(src->f, (off_t)(src->data_start + t->begin), SEEK_SET) != 0 ||
                   fread(nb_array_data(a), 1, n, src->f) != n) {
            nb_array_destroy(a);
            return nbi_err(p->ctx, NB_ERR_IO, "%s: %s: reading tensor '%.64s' failed: %s", p->who,
                           p->file, t->name,
                           ferror(src->f) ? strerror(errno) : "the file is shorter");
        }
    }
    if (t->dtype == NB_DTYPE_BOOL) {
        const unsigned char *b = nb_array_data(a);
        for (size_t i = 0; i < n; i++) {
            if (b[i] > 1) {
                unsigned v = b[i];
                nb_array_destroy(a);
                return nbs_fail(p, "tensor '%.64s' is BOOL but byte %zu is %u (not 0 or 1)",
                                t->name, i, v);
            }
        }
    }
    st = nb_tree_array(a, out);
    nb_array_destroy(a);
    return st;
}

/* ---- the tree encoding, decoded -------------------------------------------------------- */

typedef struct nbs_dec {
    nbs_parse *p;
    const nbs_src *src;
    const char *s;
    size_t n, i;
    nbi_path at; /* the node's path, for messages */
} nbs_dec;

static bool nbs_dec_num(nbs_dec *d, uint64_t *out) {
    uint64_t v = 0;
    size_t start = d->i;
    while (d->i < d->n && d->s[d->i] >= '0' && d->s[d->i] <= '9') {
        unsigned k = (unsigned)(d->s[d->i] - '0');
        if (v > (UINT64_MAX - k) / 10) {
            return false;
        }
        v = v * 10 + k;
        d->i++;
    }
    *out = v;
    return d->i > start;
}

/* <len>:<bytes>: *s points into the encoding */
static bool nbs_dec_bytes(nbs_dec *d, const char **s, size_t *len) {
    uint64_t n = 0;
    if (!nbs_dec_num(d, &n) || d->i >= d->n || d->s[d->i] != ':' || n > d->n - d->i - 1) {
        return false;
    }
    d->i++;
    *s = d->s + d->i;
    *len = (size_t)n;
    d->i += (size_t)n;
    return true;
}

/* A float as the writer before bit patterns wrote it, C's %a followed by ';': [-]0x<hex
 * digits>[.<hex digits>]p[+|-]<decimal exponent>, [-]inf or [-]nan (every NaN was written
 * so). The radix point may be the ',' of the writer's locale; parsed here rather than by
 * strtod so that the reader's locale does not matter either. Exact for every double %a
 * prints (at most 53 significant bits). */
static bool nbs_dec_float_a(nbs_dec *d, double *out) {
    const char *s = d->s;
    size_t i = d->i, n = d->n;
    bool neg = i < n && s[i] == '-';
    i += neg;
    double v;
    if (n - i >= 3 && (memcmp(s + i, "nan", 3) == 0 || memcmp(s + i, "inf", 3) == 0)) {
        v = s[i] == 'n' ? NAN : INFINITY;
        i += 3;
    } else {
        if (n - i < 3 || s[i] != '0' || (s[i + 1] != 'x' && s[i + 1] != 'X')) {
            return false;
        }
        i += 2;
        uint64_t m = 0;
        long frac = 0;
        bool point = false, digits = false;
        for (; i < n; i++) {
            int h = nbs_hex(s[i]);
            if (h >= 0) {
                if (m >> 56 != 0) {
                    return false; /* more digits than a double holds: not %a's */
                }
                m = (m << 4) | (uint64_t)h;
                frac += point;
                digits = true;
            } else if ((s[i] == '.' || s[i] == ',') && !point) {
                point = true;
            } else {
                break;
            }
        }
        if (!digits || i >= n || (s[i] != 'p' && s[i] != 'P')) {
            return false;
        }
        i++;
        bool eneg = i < n && s[i] == '-';
        i += i < n && (s[i] == '-' || s[i] == '+');
        long e = 0;
        size_t e0 = i;
        for (; i < n && s[i] >= '0' && s[i] <= '9' && i - e0 < 6; i++) {
            e = e * 10 + (s[i] - '0');
        }
        if (i == e0) {
            return false;
        }
        v = ldexp((double)m, (int)((eneg ? -e : e) - 4 * frac));
    }
    if (i >= n || s[i] != ';') {
        return false;
    }
    d->i = i + 1;
    *out = copysign(v, neg ? -1.0 : 1.0);
    return true;
}

static nb_status nbs_dec_fail(nbs_dec *d, const char *what) {
    return nbs_fail(d->p, "__metadata__ nabla.tree: %s at character %zu", what, d->i);
}

static nb_status nbs_dec_node(nbs_dec *d, const char *name, size_t nlen, int depth, nb_tree **out) {
    nb_ctx *ctx = d->p->ctx;
    *out = NULL;
    if (depth > NB_TREE_MAX_DEPTH) {
        return nbs_dec_fail(d, "nesting deeper than the tree limit");
    }
    if (d->i >= d->n) {
        return nbs_dec_fail(d, "an unexpected end");
    }
    bool frozen = false;
    if (d->s[d->i] == '!') {
        frozen = true;
        d->i++;
        if (d->i >= d->n) {
            return nbs_dec_fail(d, "an unexpected end");
        }
    }
    char c = d->s[d->i++];
    nb_status st = NB_OK;
    nb_tree *t = NULL;
    switch (c) {
    case 'N':
        st = nb_tree_null(ctx, &t);
        break;
    case 'A': {
        const nbs_tensor *tt = nbs_find(d->p, name, nlen);
        if (tt == NULL) {
            return nbs_fail(d->p, "the tree names tensor '%.*s', which the file does not hold",
                            (int)(nlen > 64 ? 64 : nlen), name);
        }
        st = nbs_read_leaf(d->p, d->src, tt, &t);
        break;
    }
    case 'I': {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(d->s + d->i, &end, 10);
        if (end == d->s + d->i || *end != ';' || errno != 0) {
            return nbs_dec_fail(d, "a bad int");
        }
        d->i = (size_t)(end - d->s) + 1;
        st = nb_tree_int(ctx, v, &t);
        break;
    }
    case 'X': { /* a float's 64 bits, 16 hex digits */
        uint64_t bits = 0;
        for (int k = 0; k < 16; k++) {
            int h = d->i < d->n ? nbs_hex(d->s[d->i]) : -1;
            if (h < 0) {
                return nbs_dec_fail(d, "a bad float");
            }
            bits = (bits << 4) | (uint64_t)h;
            d->i++;
        }
        if (d->i >= d->n || d->s[d->i] != ';') {
            return nbs_dec_fail(d, "a bad float");
        }
        d->i++;
        double v;
        memcpy(&v, &bits, sizeof v);
        st = nb_tree_float(ctx, v, &t);
        break;
    }
    case 'F': { /* the earlier form, C's %a: still read */
        double v = 0;
        if (!nbs_dec_float_a(d, &v)) {
            return nbs_dec_fail(d, "a bad float");
        }
        st = nb_tree_float(ctx, v, &t);
        break;
    }
    case 'B':
        if (d->i >= d->n || (d->s[d->i] != '0' && d->s[d->i] != '1')) {
            return nbs_dec_fail(d, "a bad bool");
        }
        st = nb_tree_bool(ctx, d->s[d->i++] == '1', &t);
        break;
    case 'S':
    case 'K':
    case 'R': {
        const char *s = NULL;
        size_t len = 0;
        if (!nbs_dec_bytes(d, &s, &len) || memchr(s, 0, len) != NULL || (c != 'S' && len == 0)) {
            return nbs_dec_fail(d, "a bad string");
        }
        nb_fnptr fp = c == 'K' ? nbs_builtin_fn(s, len) : NULL;
        if (c == 'R') { /* a file holds no code: the file is fine, nb_load cannot do it */
            return nbi_err(ctx, NB_ERR_UNSUPPORTED,
                           "%s: %s holds a function reference '%.*s' at %s, which a file cannot "
                           "restore (only nabla's built-in activations come back by name): load "
                           "it with nb_load_into and a template that has it",
                           d->p->who, d->p->file, (int)(len > 64 ? 64 : len), s,
                           nbi_path_str(&d->at));
        }
        if (c == 'K' && fp == NULL) {
            return nbi_err(ctx, NB_ERR_UNSUPPORTED,
                           "%s: %s holds the built-in activation '%.*s' at %s, which this version "
                           "of nabla does not have: load it with nb_load_into and a template "
                           "that has it",
                           d->p->who, d->p->file, (int)(len > 64 ? 64 : len), s,
                           nbi_path_str(&d->at));
        }
        char *z = nbi_alloc(ctx, len + 1, 16);
        if (z == NULL) {
            return nbi_oom(ctx, d->p->who, len + 1);
        }
        memcpy(z, s, len);
        z[len] = '\0';
        st = c == 'S' ? nb_tree_string(ctx, z, &t) : nb_tree_fnref(ctx, fp, z, &t);
        nbi_free(ctx, z, len + 1);
        break;
    }
    case 'L':
    case 'T':
    case 'D': {
        uint64_t n = 0;
        if (!nbs_dec_num(d, &n) || d->i >= d->n || d->s[d->i] != '(' || n > d->n) {
            return nbs_dec_fail(d, "a bad node");
        }
        d->i++;
        nb_tree **items = n > 0 ? nbi_alloc(ctx, (size_t)n * sizeof *items, 16) : NULL;
        char **keys = n > 0 && c == 'D' ? nbi_alloc(ctx, (size_t)n * sizeof *keys, 16) : NULL;
        if (n > 0 && (items == NULL || (c == 'D' && keys == NULL))) {
            if (items != NULL) {
                nbi_free(ctx, items, (size_t)n * sizeof *items);
            }
            if (keys != NULL) {
                nbi_free(ctx, keys, (size_t)n * sizeof *keys);
            }
            return nbi_oom(ctx, d->p->who, (size_t)n * sizeof *items);
        }
        uint64_t made = 0, kmade = 0;
        nbs_buf child = {ctx, NULL, 0, 0, false};
        for (; made < n && st == NB_OK; made++) {
            const char *comp;
            size_t clen;
            char idx[32];
            nbi_path_mark mark = nbi_path_save(&d->at);
            if (c == 'D') {
                if (!nbs_dec_bytes(d, &comp, &clen) || memchr(comp, 0, clen) != NULL) {
                    st = nbs_dec_fail(d, "a bad key");
                    break;
                }
                keys[kmade] = nbi_alloc(ctx, clen + 1, 16);
                if (keys[kmade] == NULL) {
                    st = nbi_oom(ctx, d->p->who, clen + 1);
                    break;
                }
                memcpy(keys[kmade], comp, clen);
                keys[kmade][clen] = '\0';
                nbi_path_push_key(&d->at, keys[kmade]);
                kmade++;
            } else {
                clen = (size_t)snprintf(idx, sizeof idx, "%llu", (unsigned long long)made);
                comp = idx;
                nbi_path_push_index(&d->at, (int64_t)made);
            }
            nbs_child_name(&child, name, nlen, comp, clen);
            if (child.oom) {
                st = nbi_oom(ctx, d->p->who, 0);
                break;
            }
            st = nbs_dec_node(d, child.p, child.len, depth + 1, &items[made]);
            nbi_path_restore(&d->at, mark);
        }
        nbs_free(&child);
        if (st == NB_OK && (d->i >= d->n || d->s[d->i] != ')')) {
            st = nbs_dec_fail(d, "a node not closed");
        }
        if (st == NB_OK) {
            d->i++;
            st = c == 'L'   ? nb_tree_list(ctx, (int64_t)n, items, &t)
                 : c == 'T' ? nb_tree_tuple(ctx, (int64_t)n, items, &t)
                            : nb_tree_dict(ctx, (int64_t)n, (const char *const *)keys, items, &t);
            if (st == NB_ERR_INVALID) { /* nb_tree_dict: a key twice */
                st = nbs_dec_fail(d, "a dict holding a key twice");
            }
        }
        for (uint64_t k = 0; k < made && k < n; k++) {
            nb_tree_destroy(items[k]);
        }
        for (uint64_t k = 0; k < kmade; k++) {
            nbi_free(ctx, keys[k], strlen(keys[k]) + 1);
        }
        if (items != NULL) {
            nbi_free(ctx, items, (size_t)n * sizeof *items);
        }
        if (keys != NULL) {
            nbi_free(ctx, keys, (size_t)n * sizeof *keys);
        }
        break;
    }
    default:
        return nbs_dec_fail(d, "an unknown node kind");
    }
    if (st == NB_OK && frozen && !nb_tree_is_leaf(t)) {
        nb_tree_destroy(t);
        return nbs_dec_fail(d, "a frozen mark on a list, tuple or dict (only leaves freeze)");
    }
    if (st == NB_OK && frozen) {
        nb_tree *f = NULL;
        st = nb_tree_freeze(t, &f);
        nb_tree_destroy(t);
        t = f;
    }
    if (st != NB_OK) {
        nb_tree_destroy(t);
        return st;
    }
    *out = t;
    return NB_OK;
}

/* ---- loading ----------------------------------------------------------------------------- */

static void nbs_parse_free(nbs_parse *p) {
    if (p->t != NULL) {
        nbi_free(p->ctx, p->t, (size_t)p->cap * sizeof *p->t);
    }
    nbs_free(&p->strings);
}

/* The tree for tmpl (NULL: the file's own tree or a dict by name). */
static nb_status nbs_build(nbs_parse *p, const nbs_src *src, const nb_tree *tmpl, nb_tree **out);

/* An optional second tree read from the same file in the same pass (nb_checkpoint_load's
 * key): built from tmpl when the file holds a tensor named `if_has`, else *out stays NULL. */
typedef struct {
    const nb_tree *tmpl;
    const char *if_has;
    nb_tree **out;
} nbs_extra;

/* Parse a file given as header bytes (already read) and a data source. */
static nb_status nbs_load_common(nb_ctx *ctx, const char *who, const char *file, const char *hdr,
                                 size_t hlen, uint64_t data_size, const nbs_src *src,
                                 const nb_tree *tmpl, nb_tree **out, const nbs_extra *extra) {
    nbs_parse p;
    memset(&p, 0, sizeof p);
    p.ctx = ctx;
    p.who = who;
    p.file = file;
    p.s = hdr;
    p.n = hlen;
    p.strings.ctx = ctx;
    nb_status st = nbs_parse_header(&p, data_size);
    if (st == NB_OK) {
        st = nbs_build(&p, src, tmpl, out);
    }
    if (st == NB_OK && extra != NULL &&
        nbs_find(&p, extra->if_has, strlen(extra->if_has)) != NULL) {
        st = nbs_build(&p, src, extra->tmpl, extra->out);
        if (st != NB_OK) {
            nb_tree_destroy(*out);
            *out = NULL;
        }
    }
    nbs_parse_free(&p);
    return st;
}

/* the 8-byte length; checks against the size */
static nb_status nbs_header_len(nb_ctx *ctx, const char *who, const char *file,
                                const unsigned char *len8, uint64_t size, uint64_t *hlen) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) {
        n = (n << 8) | len8[i];
    }
    if (n > NB_SAFETENSORS_MAX_HEADER) {
        return nbi_err(ctx, NB_ERR_FORMAT,
                       "%s: %s: the header claims %llu bytes, more than the %llu allowed -- the "
                       "file is corrupt or not safetensors",
                       who, file, (unsigned long long)n,
                       (unsigned long long)NB_SAFETENSORS_MAX_HEADER);
    }
    if (n > size - 8) {
        return nbi_err(ctx, NB_ERR_FORMAT,
                       "%s: %s: the header claims %llu bytes but the file has %llu after the "
                       "length -- the file is truncated or not safetensors",
                       who, file, (unsigned long long)n, (unsigned long long)(size - 8));
    }
    if (n < 2) {
        return nbi_err(ctx, NB_ERR_FORMAT, "%s: %s: a header of %llu bytes cannot hold JSON", who,
                       file, (unsigned long long)n);
    }
    *hlen = n;
    return NB_OK;
}

nb_status nb_load_bytes(nb_ctx *ctx, const void *data, size_t size, const char *name,
                        nb_tree **out) {
    static const char who[] = "nb_load_bytes";
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL) {
        return NB_ERR_MISUSE; /* nowhere to say so */
    }
    if (out == NULL) {
        return nbs_null_out(ctx, who, "out");
    }
    if (data == NULL && size > 0) {
        return nbi_err(ctx, NB_ERR_MISUSE,
                       "%s: data is NULL with size %zu (pass the bytes to read, or size 0)", who,
                       size);
    }
    const char *file = name != NULL ? name : "<memory>";
    if (size < 8) {
        return nbi_err(ctx, NB_ERR_FORMAT,
                       "%s: %s: %zu bytes cannot hold a safetensors header length (8 bytes)", who,
                       file, size);
    }
    uint64_t hlen = 0;
    nb_status st = nbs_header_len(ctx, who, file, data, size, &hlen);
    if (st != NB_OK) {
        return st;
    }
    nbs_src src = {data, NULL, 8 + hlen};
    return nbs_load_common(ctx, who, file, (const char *)data + 8, (size_t)hlen, size - 8 - hlen,
                           &src, NULL, out, NULL);
}

static nb_status nbs_load_file(nb_ctx *ctx, const char *who, const char *path, const nb_tree *tmpl,
                               nb_tree **out, const nbs_extra *extra) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return nbi_err(ctx, NB_ERR_IO, "%s: cannot open %s: %s", who, path, strerror(errno));
    }
    nb_status st = NB_OK;
    struct stat sb;
    char *hdr = NULL;
    uint64_t hlen = 0, size = 0;
    if (fstat(fileno(f), &sb) != 0) {
        st = nbi_err(ctx, NB_ERR_IO, "%s: cannot stat %s: %s", who, path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = nbi_err(ctx, NB_ERR_IO, "%s: %s is not a regular file", who, path);
    } else {
        size = (uint64_t)sb.st_size;
        unsigned char len8[8];
        if (size < 8) {
            st = nbi_err(ctx, NB_ERR_FORMAT,
                         "%s: %s: %llu bytes cannot hold a safetensors header length (8 bytes)",
                         who, path, (unsigned long long)size);
        } else if (fread(len8, 1, 8, f) != 8) {
            st = nbi_err(ctx, NB_ERR_IO, "%s: reading %s failed", who, path);
        } else {
            st = nbs_header_len(ctx, who, path, len8, size, &hlen);
        }
    }
    if (st == NB_OK) {
        hdr = nbi_alloc(ctx, (size_t)hlen + 1, 16);
        if (hdr == NULL) {
            st = nbi_oom(ctx, who, (size_t)hlen + 1);
        } else if (fread(hdr, 1, (size_t)hlen, f) != hlen) {
            st = nbi_err(ctx, NB_ERR_IO, "%s: reading the header of %s failed", who, path);
        }
    }
    if (st == NB_OK) {
        nbs_src src = {NULL, f, 8 + hlen};
        st = nbs_load_common(ctx, who, path, hdr, (size_t)hlen, size - 8 - hlen, &src, tmpl, out,
                             extra);
    }
    if (hdr != NULL) {
        nbi_free(ctx, hdr, (size_t)hlen + 1);
    }
    fclose(f);
    return st;
}

nb_status nb_load(nb_ctx *ctx, const char *path, nb_tree **out) {
    static const char fn[] = "nb_load";
    if (out != NULL) {
        *out = NULL;
    }
    if (ctx == NULL) {
        return NB_ERR_MISUSE; /* nowhere to say so */
    }
    if (out == NULL) {
        return nbs_null_out(ctx, fn, "out");
    }
    if (path == NULL) {
        return nbi_err_null(ctx, fn, "path", "pass the file's path");
    }
    return nbs_load_file(ctx, fn, path, NULL, out, NULL);
}

nb_status nb_load_into(const nb_tree *tmpl, const char *path, nb_tree **out) {
    static const char fn[] = "nb_load_into";
    if (out != NULL) {
        *out = NULL;
    }
    nb_status st = nbs_tree_path_args(fn, "tmpl", tmpl, path);
    if (st == NB_OK && out == NULL) {
        st = nbs_null_out(nb_tree_ctx(tmpl), fn, "out");
    }
    if (st != NB_OK) {
        return st;
    }
    return nbs_load_file(nb_tree_ctx(tmpl), fn, path, tmpl, out, NULL);
}

/* The template's structure with arrays from the file. */
static nb_status nbs_from_template(nbs_parse *p, const nbs_src *src, const nb_tree *t,
                                   const char *name, size_t nlen, int depth, nb_tree **out) {
    nb_ctx *ctx = p->ctx;
    *out = NULL;
    nb_tree_kind k = nb_tree_kind_of(t);
    if (depth > NB_TREE_MAX_DEPTH) {
        return nbi_err(ctx, NB_ERR_INVALID, "%s: the template nests too deep", p->who);
    }
    if (k == NB_TREE_KIND_ARRAY) {
        const nb_array *a = nb_tree_get_array(t);
        const nbs_tensor *tt = nbs_find(p, name, nlen);
        char want[64], got[64];
        nbi_sig(want, sizeof want, nb_array_dtype(a), nb_array_rank(a), nb_array_shape(a));
        if (tt == NULL) {
            return nbi_err(ctx, NB_ERR_STRUCTURE,
                           "%s: %s holds no tensor '%.*s' for the template's %s at that path -- "
                           "was it saved from another model?",
                           p->who, p->file, (int)(nlen > 128 ? 128 : nlen), name, want);
        }
        nbi_sig(got, sizeof got, (nb_dtype)tt->dtype, tt->rank, tt->shape);
        if (tt->dtype != (int)nb_array_dtype(a) || tt->rank != nb_array_rank(a) ||
            memcmp(tt->shape, nb_array_shape(a), (size_t)tt->rank * sizeof(int64_t)) != 0) {
            return nbi_err(ctx, NB_ERR_STRUCTURE,
                           "%s: %s: tensor '%.*s' is %s where the template has %s -- was it saved "
                           "from another model?",
                           p->who, p->file, (int)(nlen > 128 ? 128 : nlen), name, got, want);
        }
        nb_tree *leaf = NULL;
        nb_status st = nbs_read_leaf(p, src, tt, &leaf);
        if (st == NB_OK && nb_tree_is_frozen(t)) {
            nb_tree *f = NULL;
            st = nb_tree_freeze(leaf, &f);
            nb_tree_destroy(leaf);
            leaf = f;
        }
        *out = st == NB_OK ? leaf : NULL;
        if (st != NB_OK) {
            nb_tree_destroy(leaf);
        }
        return st;
    }
    if (k != NB_TREE_KIND_LIST && k != NB_TREE_KIND_TUPLE && k != NB_TREE_KIND_DICT) {
        if (k == NB_TREE_KIND_VAR) {
            return nbi_err(ctx, NB_ERR_KIND, "%s: the template holds a traced var at '%.*s'",
                           p->who, (int)(nlen > 128 ? 128 : nlen), name);
        }
        *out = nb_tree_retain((nb_tree *)t); /* null and static leaves: the template's */
        return NB_OK;
    }
    int64_t n = nb_tree_len(t);
    nb_tree **items = n > 0 ? nbi_alloc(ctx, (size_t)n * sizeof *items, 16) : NULL;
    const char **keys = n > 0 ? nbi_alloc(ctx, (size_t)n * sizeof *keys, 16) : NULL;
    if (n > 0 && (items == NULL || keys == NULL)) {
        if (items != NULL) {
            nbi_free(ctx, items, (size_t)n * sizeof *items);
        }
        if (keys != NULL) {
            nbi_free(ctx, keys, (size_t)n * sizeof *keys);
        }
        return nbi_oom(ctx, p->who, (size_t)n * sizeof *items);
    }
    nb_status st = NB_OK;
    int64_t made = 0;
    nbs_buf child = {ctx, NULL, 0, 0, false};
    for (; made < n && st == NB_OK; made++) {
        char idx[32];
        const char *comp = idx;
        size_t clen;
        if (k == NB_TREE_KIND_DICT) {
            comp = keys[made] = nb_tree_key(t, made);
            clen = strlen(comp);
        } else {
            clen = (size_t)snprintf(idx, sizeof idx, "%lld", (long long)made);
        }
        nbs_child_name(&child, name, nlen, comp, clen);
        if (child.oom) {
            st = nbi_oom(ctx, p->who, 0);
            break;
        }
        st = nbs_from_template(p, src, nb_tree_child(t, made), child.p, child.len, depth + 1,
                               &items[made]);
        if (st != NB_OK) {
            break;
        }
    }
    nbs_free(&child);
    nb_tree *r = NULL;
    if (st == NB_OK) {
        st = k == NB_TREE_KIND_LIST    ? nb_tree_list(ctx, n, items, &r)
             : k == NB_TREE_KIND_TUPLE ? nb_tree_tuple(ctx, n, items, &r)
                                       : nb_tree_dict(ctx, n, keys, items, &r);
    }
    for (int64_t i = 0; i < made && i < n; i++) {
        nb_tree_destroy(items[i]);
    }
    if (items != NULL) {
        nbi_free(ctx, items, (size_t)n * sizeof *items);
        nbi_free(ctx, keys, (size_t)n * sizeof *keys);
    }
    *out = r;
    return st;
}

static nb_status nbs_build(nbs_parse *p, const nbs_src *src, const nb_tree *tmpl, nb_tree **out) {
    if (tmpl != NULL) {
        return nbs_from_template(p, src, tmpl, "", 0, 0, out);
    }
    if (p->tree != NULL) {
        nbs_dec d = {p, src, p->tree, p->tree_len, 0, {{0}, 0, false}};
        nbi_path_init(&d.at);
        nb_status st = nbs_dec_node(&d, "", 0, 0, out);
        if (st == NB_OK && d.i != d.n) {
            nb_tree_destroy(*out);
            *out = NULL;
            st = nbs_dec_fail(&d, "characters after the tree");
        }
        return st;
    }
    /* a file from another writer: dict(name -> array), names sorted */
    nb_ctx *ctx = p->ctx;
    nb_tree **items = p->nt > 0 ? nbi_alloc(ctx, (size_t)p->nt * sizeof *items, 16) : NULL;
    const char **keys = p->nt > 0 ? nbi_alloc(ctx, (size_t)p->nt * sizeof *keys, 16) : NULL;
    if (p->nt > 0 && (items == NULL || keys == NULL)) {
        if (items != NULL) {
            nbi_free(ctx, items, (size_t)p->nt * sizeof *items);
        }
        if (keys != NULL) {
            nbi_free(ctx, keys, (size_t)p->nt * sizeof *keys);
        }
        return nbi_oom(ctx, p->who, (size_t)p->nt * sizeof *items);
    }
    nb_status st = NB_OK;
    int64_t made = 0;
    for (; made < p->nt && st == NB_OK; made++) {
        if (memchr(p->t[made].name, 0, p->t[made].name_len) != NULL) {
            st = nbs_fail(p, "a tensor name holds a NUL");
            break;
        }
        keys[made] = p->t[made].name;
        st = nbs_read_leaf(p, src, &p->t[made], &items[made]);
        if (st != NB_OK) {
            break;
        }
    }
    nb_tree *r = NULL;
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, p->nt, keys, items, &r);
    }
    for (int64_t i = 0; i < made && i < p->nt; i++) {
        nb_tree_destroy(items[i]);
    }
    if (items != NULL) {
        nbi_free(ctx, items, (size_t)p->nt * sizeof *items);
        nbi_free(ctx, keys, (size_t)p->nt * sizeof *keys);
    }
    *out = r;
    return st;
}

/* ---- training checkpoints ------------------------------------------------------------------ */

/* The entry checks of the checkpoint calls: two live trees (a, b: params and the optimizer
 * state, or their templates) of one context, then a path. */
static nb_status nbs_ckpt_trees(const char *fn, const nb_tree *a, const char *aname,
                                const nb_tree *b, const char *bname, const char *path) {
    nb_ctx *ctx = nbi_handle_ctx(a) != NULL ? nbi_handle_ctx(a) : nbi_handle_ctx(b);
    nb_status st = nbi_check_handle_in(ctx, a, NBI_MAGIC_TREE, fn, aname);
    if (st == NB_OK) {
        st = nbi_check_handle_in(ctx, b, NBI_MAGIC_TREE, fn, bname);
    }
    if (st == NB_OK && nb_tree_ctx(b) != ctx) {
        st = nbi_err(ctx, NB_ERR_INVALID,
                     "%s: %s and %s belong to different contexts (each context's arrays and trees "
                     "stay in it) -- make both in one context",
                     fn, aname, bname);
    }
    if (st == NB_OK && path == NULL) {
        st = nbi_err_null(ctx, fn, "path", "pass the checkpoint file's path");
    }
    return st;
}

nb_status nb_checkpoint_save(const char *path, const nb_tree *params, const nb_tree *opt_state,
                             const nb_array *key, int64_t step) {
    static const char fn[] = "nb_checkpoint_save";
    nb_status st = nbs_ckpt_trees(fn, params, "params", opt_state, "opt_state", path);
    nb_ctx *ctx = nb_tree_ctx(params);
    if (st == NB_OK && key != NULL) {
        st = nbi_check_handle_in(ctx, key, NBI_MAGIC_ARRAY, fn, "key");
        if (st == NB_OK && nb_array_ctx(key) != ctx) {
            st = nbi_err(ctx, NB_ERR_INVALID,
                         "%s: key belongs to another context than params (each context's arrays "
                         "and trees stay in it) -- make the key with nb_random_key in params' "
                         "context",
                         fn);
        }
        if (st == NB_OK && (nb_array_dtype(key) != NB_DTYPE_I32 || nb_array_rank(key) != 1 ||
                            nb_array_shape(key)[0] != 2)) {
            char sig[NBI_SIG_CAP];
            nbi_sig(sig, sizeof sig, nb_array_dtype(key), nb_array_rank(key), nb_array_shape(key));
            st = nbi_err(ctx, NB_ERR_INVALID,
                         "%s: key is %s; a key is an i32[2] array (nb_checkpoint_load reads "
                         "one) -- pass the run's key from nb_random_key / nb_random_split, or "
                         "NULL",
                         fn, sig);
        }
    }
    if (st != NB_OK) {
        return st;
    }
    nb_array *sa = NULL;
    nb_tree *kl = NULL, *sl = NULL, *d = NULL;
    st = nb_array_from_data(ctx, NB_DTYPE_I64, 0, NULL, &step, &sa);
    if (st == NB_OK) {
        st = nb_tree_array(sa, &sl);
    }
    if (st == NB_OK) {
        st = key != NULL ? nb_tree_array((nb_array *)key, &kl) : nb_tree_null(ctx, &kl);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 4, (const char *[]){"params", "opt_state", "key", "step"},
                          (const nb_tree *[]){params, opt_state, kl, sl}, &d);
    }
    if (st == NB_OK) {
        st = nb_save(d, path);
    }
    nb_tree_destroy(d);
    nb_tree_destroy(kl);
    nb_tree_destroy(sl);
    nb_array_destroy(sa);
    return st;
}

nb_status nb_checkpoint_load(const char *path, const nb_tree *params_template,
                             const nb_tree *opt_state_template, nb_tree **params,
                             nb_tree **opt_state, nb_array **key, int64_t *step) {
    if (params != NULL) {
        *params = NULL;
    }
    if (opt_state != NULL) {
        *opt_state = NULL;
    }
    if (key != NULL) {
        *key = NULL;
    }
    if (step != NULL) {
        *step = 0;
    }
    nb_status st = nbs_ckpt_trees("nb_checkpoint_load", params_template, "params_template",
                                  opt_state_template, "opt_state_template", path);
    if (st != NB_OK) {
        return st;
    }
    /* through templates only: the file's own tree may hold function references (a model's
     * activations) that a file cannot restore, while the templates hold them */
    nb_ctx *ctx = nb_tree_ctx(params_template);
    nb_tree *tmpl = NULL, *sl = NULL, *kl = NULL, *kt = NULL, *got = NULL, *gk = NULL;
    nb_array *sa = NULL, *ka = NULL;
    int64_t zero = 0;
    st = nb_array_from_data(ctx, NB_DTYPE_I64, 0, NULL, &zero, &sa);
    if (st == NB_OK) {
        st = nb_tree_array(sa, &sl);
    }
    if (st == NB_OK) {
        st = nb_tree_dict(ctx, 3, (const char *[]){"params", "opt_state", "step"},
                          (const nb_tree *[]){params_template, opt_state_template, sl}, &tmpl);
    }
    /* the key: an i32[2] under "key", or none; read in the same pass as the rest, so that
     * a save replacing the file meanwhile cannot mix two checkpoints */
    if (st == NB_OK && key != NULL) {
        st = nb_array_zeros(ctx, NB_DTYPE_I32, 1, (int64_t[]){2}, &ka);
        if (st == NB_OK) {
            st = nb_tree_array(ka, &kl);
        }
        if (st == NB_OK) {
            st = nb_tree_dict(ctx, 1, (const char *[]){"key"}, &kl, &kt);
        }
    }
    if (st == NB_OK) {
        nbs_extra extra = {kt, "key", &gk};
        st = nbs_load_file(ctx, "nb_checkpoint_load", path, tmpl, &got, kt != NULL ? &extra : NULL);
    }
    if (st == NB_OK && gk != NULL) {
        *key = nb_array_retain(nb_tree_get_array(nb_tree_get(gk, "key")));
    }
    if (st == NB_OK) {
        if (step != NULL) {
            *step = *(const int64_t *)nb_array_data(nb_tree_get_array(nb_tree_get(got, "step")));
        }
        if (params != NULL) {
            *params = nb_tree_retain((nb_tree *)nb_tree_get(got, "params"));
        }
        if (opt_state != NULL) {
            *opt_state = nb_tree_retain((nb_tree *)nb_tree_get(got, "opt_state"));
        }
    }
    nb_tree_destroy(gk);
    nb_tree_destroy(kt);
    nb_tree_destroy(kl);
    nb_array_destroy(ka);
    nb_tree_destroy(got);
    nb_tree_destroy(tmpl);
    nb_tree_destroy(sl);
    nb_array_destroy(sa);
    return st;
}
