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
 * null slots, frozen marks and static leaves (ints, floats bit-exact, bools, strings;
 * function references by name), so that nb_load gives back an identical tree. Files from
 * other writers have no such entry: nb_load then returns a dict from tensor name to array
 * (keys sorted), and nb_load_into reads them into a template.
 *
 * Writes are atomic. The file is written to a temporary file in the same directory,
 * flushed with fsync, renamed over the old one and the directory fsynced: after a crash or
 * a full disk, the path holds either the old complete file or the new complete file, never
 * a torn one, and a failed save leaves the old file untouched. (A process killed while
 * saving may leave its temporary file, <path>.tmpXXXXXX, beside the target.)
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

/* Save the array leaves of tree (arrays only: a tree holding vars is NB_ERR_KIND) to path,
 * atomically. Returns NB_OK, NB_ERR_MISUSE, NB_ERR_KIND, NB_ERR_IO (naming the path and the
 * system's reason), NB_ERR_OOM. */
NB_API nb_status nb_save(const nb_tree *tree, const char *path);

/* Load path: the saved tree itself when nabla wrote it, else a dict from tensor name to
 * array. *out is a new tree. NB_ERR_IO, NB_ERR_FORMAT, NB_ERR_OOM. */
NB_API nb_status nb_load(nb_ctx *ctx, const char *path, nb_tree **out);

/* Load path into a template: *out has tmpl's structure and static leaves, with a new array
 * at every array leaf of tmpl read from the tensor under that leaf's path (nulls stay null).
 * A missing tensor, another dtype or shape is NB_ERR_STRUCTURE naming the first such path
 * and both signatures; tensors the template does not name are ignored. */
NB_API nb_status nb_load_into(const nb_tree *tmpl, const char *path, nb_tree **out);

/* The same, from bytes in memory (size bytes at data; borrowed): the loaders' parser, for
 * embedding and fuzzing. name is used in messages. */
NB_API nb_status nb_load_bytes(nb_ctx *ctx, const void *data, size_t size, const char *name,
                               nb_tree **out);

/* ---- training checkpoints ------------------------------------------------------------- */
/* One file holding a run's state: params, the optimizer state, the PRNG key and the step,
 * saved atomically (nb_save) as dict(params, opt_state, key, step) -- step an i64[] array.
 * Resuming from it continues a run bit for bit (tests/io/test_checkpoint_io.c). key may be
 * NULL (saved as null). */
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
