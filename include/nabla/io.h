/*
 * nabla/io.h -- pytrees on disk: safetensors files and training checkpoints.
 *
 * Files are safetensors (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON naming every tensor (dtype F32, F64, I32,
 * I64 or BOOL, shape, data_offsets into the buffer that follows), then the tensors'
 * little-endian bytes, row-major, packed in order with no gaps. nabla pads the header with
 * spaces so the data starts at a multiple of 8 bytes, as the official writer does; PyTorch,
 * JAX and numpy users read nabla's files with the safetensors package as they are.
 *
 * Names. Each array leaf is stored under its leaf path in dotted form: the leaf at
 * layers[1].weight is the tensor "layers.1.weight" (a tuple or list index is a path
 * component like a dict key).
 *
 * The tree. __metadata__["nabla.tree"] holds the tree's structure: nodes and their keys,
 * null slots, frozen marks and static leaves -- ints, bools, strings, floats bit for bit
 * (stored as their 64-bit pattern: NaN payloads, signalling NaNs, -0.0, infinities and
 * subnormals come back identical, so a jitted function does not retrace on a loaded tree),
 * and function references by name -- so that nb_load gives back an identical tree. Of
 * function references, nabla's built-in activations (nabla/nn.h: relu, tanh, sigmoid, gelu,
 * softplus, identity, under the names nb_nn_activation_leaf gives them) are restored by
 * name, so nb_load reads any nn model or checkpoint of one. Any other function (one of
 * yours, or a built-in under another name) cannot come back from a file: nb_load returns
 * NB_ERR_UNSUPPORTED naming it and its path, and nb_load_into with a template that holds
 * it reads the file. Files from other writers have no such entry: nb_load then returns a
 * dict from tensor name to array (keys sorted), and nb_load_into reads them into a
 * template. (Files from earlier versions, which wrote floats as C's %a text -- every NaN
 * as nan -- still load, with such NaNs quiet and without payload.)
 *
 * What nb_save writes, nb_load reads. nb_save checks the reader's rules before writing and
 * refuses with NB_ERR_INVALID, naming the leaf path and the fix, a tree whose file nb_load
 * would refuse: a dict key, string leaf or function name that is not valid UTF-8 (the
 * header is JSON text); an array stored as the tensor "__metadata__" (an array under that
 * top-level key: the name the header reserves); two array leaves stored under one tensor
 * name (a key with a dot colliding with a nested path); a bool array holding a byte other
 * than 0 or 1; a header past NB_SAFETENSORS_MAX_HEADER. Nothing is written then.
 *
 * Writes are atomic. The file is written to a temporary file in the same directory,
 * flushed with fsync, renamed over the old one and the directory fsynced: after a crash or
 * a full disk, the path holds either the old complete file or the new complete file, never
 * a torn one, and a failed save leaves the old file untouched. (A process killed while
 * saving may leave its temporary file, <file>.tmpXXXXXX, beside the file.)
 *
 * Where the path leads. A symlink is followed (through chains; a relative link from its
 * own directory) and the file at its end is replaced as above -- the temporary file in
 * that file's directory, the rename over it, that directory fsynced -- so the link stays a
 * link (latest.safetensors -> run-7.safetensors updates run-7.safetensors). A dangling
 * symlink: the file it names is created. Anything at the end that is not a regular file --
 * a FIFO, a device such as /dev/null, a directory, a socket -- is refused with NB_ERR_IO
 * naming the path and what it is, and left as it was (nb_load reads only regular files
 * too). The path is examined just before the write: replacing it meanwhile is a race the
 * caller must avoid.
 *
 * Reads never trust the file. Every length, offset, dtype, shape and size is validated
 * (with overflow checks) before a byte of data is read: the header is bounded by
 * NB_SAFETENSORS_MAX_HEADER; names and metadata keys must be unique (the official library
 * lets the last duplicate win, which hides data); tensors must tile the data buffer
 * exactly (no gap, no overlap, nothing past the end); BOOL bytes must be 0 or 1. Any
 * violation is NB_ERR_FORMAT with a message naming the file, the tensor and the rule;
 * files that cannot be opened or read are NB_ERR_IO with the system's reason.
 */
#ifndef NABLA_IO_H
#define NABLA_IO_H

#include "array.h"
#include "core.h"
#include "tree.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Headers longer than this are refused (the official library's limit, 10^8 bytes). */
#define NB_SAFETENSORS_MAX_HEADER ((uint64_t)100000000)

/* Save tree (arrays only: a tree holding vars is NB_ERR_KIND) to path -- or to the file a
 * symlink at path leads to -- atomically (above). Returns NB_OK, NB_ERR_MISUSE, NB_ERR_KIND,
 * NB_ERR_INVALID (a tree nb_load would refuse, above; nothing written), NB_ERR_IO (naming the
 * path and the system's reason, or what the path is when it is not a regular file),
 * NB_ERR_OOM. Borrows tree; allocates only for the duration of the call. */
NB_API nb_status nb_save(const nb_tree *tree, const char *path);

/* Load path: the saved tree itself when nabla wrote it, else a dict from tensor name to
 * array. *out is a new tree. NB_ERR_IO, NB_ERR_FORMAT, NB_ERR_UNSUPPORTED (the tree holds a
 * function reference other than a built-in activation: the message names it and its path;
 * use nb_load_into), NB_ERR_OOM. */
NB_API nb_status nb_load(nb_ctx *ctx, const char *path, nb_tree **out);

/* Load path into a template: *out has tmpl's structure and static leaves, with a new array
 * at every array leaf of tmpl read from the tensor under that leaf's path (nulls stay null).
 * A missing tensor, another dtype or shape is NB_ERR_STRUCTURE naming the first such path
 * and both signatures; tensors the template does not name are ignored. */
NB_API nb_status nb_load_into(const nb_tree *tmpl, const char *path, nb_tree **out);

/* The same as nb_load, from bytes in memory (size bytes at data; borrowed): the loaders'
 * parser, for embedding and fuzzing. name is used in messages. NB_ERR_FORMAT,
 * NB_ERR_UNSUPPORTED, NB_ERR_OOM. */
NB_API nb_status nb_load_bytes(nb_ctx *ctx, const void *data, size_t size, const char *name,
                               nb_tree **out);

/* ---- training checkpoints ------------------------------------------------------------- */
/* One file holding a run's state: params, the optimizer state, the PRNG key and the step,
 * saved atomically (nb_save) as dict(params, opt_state, key, step) -- step an i64[] array.
 * Resuming from it continues a run bit for bit (tests/io/test_checkpoint_io.c). key may be
 * NULL (saved as null); otherwise it is an i32[2] key (what nb_checkpoint_load reads back:
 * another dtype or shape is NB_ERR_INVALID, nothing written). params, opt_state and key must
 * come from one context (NB_ERR_INVALID otherwise). Statuses, symlinks and refusals as nb_save;
 * nb_load reads the file whole unless the trees hold function references other than built-in
 * activations. */
NB_API nb_status nb_checkpoint_save(const char *path, const nb_tree *params,
                                    const nb_tree *opt_state, const nb_array *key, int64_t step);
/* Load a checkpoint into templates (the run's current params and optimizer state, or any
 * trees of their structure, dtypes and shapes): mismatches are NB_ERR_STRUCTURE naming the
 * first path. Outputs may be NULL when not wanted; *key is NULL if none was saved. */
NB_API nb_status nb_checkpoint_load(const char *path, const nb_tree *params_template,
                                    const nb_tree *opt_state_template, nb_tree **params,
                                    nb_tree **opt_state, nb_array **key, int64_t *step);

/* Writes go through this hook when set (fault injection: return -1 with errno set to
 * ENOSPC, or a short count, to simulate a full disk). NULL restores write(2). */
typedef long (*nb_write_hook)(void *ud, int fd, const void *buf, size_t n);
NB_API nb_status nb_ctx_set_write_hook(nb_ctx *ctx, nb_write_hook hook, void *ud);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_IO_H */
