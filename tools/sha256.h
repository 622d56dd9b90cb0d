/*
 * sha256.h -- SHA-256 (FIPS 180-4, section 6.2) for the `nabla` program: the digests that
 * name data files and benchmark inputs. No dependencies, no allocation, no globals; a context
 * is used by one thread at a time, different contexts are independent.
 *
 * Why here and not a library: the program must check files it downloads or caches without
 * pulling in a crypto library, and SHA-256 is small. Reference: NIST FIPS 180-4, "Secure
 * Hash Standard" (2015); test vectors from NIST's "Cryptographic Algorithm Validation
 * Program" examples (tests/tools/test_sha256.c).
 *
 *     sha256_ctx c;
 *     uint8_t d[32];
 *     char hex[65];
 *     sha256_init(&c);
 *     sha256_update(&c, "abc", 3);
 *     sha256_final(&c, d);
 *     sha256_hex(d, hex);  // "ba7816bf...f20015ad"
 */
#ifndef NABLA_TOOLS_SHA256_H
#define NABLA_TOOLS_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The running state of one digest. Its fields are private to sha256.c. */
typedef struct sha256_ctx {
    uint32_t h[8];     /* the hash value H(i) */
    uint64_t n_bytes;  /* message bytes seen so far */
    uint8_t block[64]; /* the partial block not yet compressed */
    size_t block_len;  /* bytes in block, < 64 */
} sha256_ctx;

/* Starts a digest (H(0) of FIPS 180-4 5.3.3). */
void sha256_init(sha256_ctx *c);

/* Adds n bytes at data (borrowed for the call; may be NULL when n is 0). Feeding a message
 * in pieces of any sizes gives the same digest as feeding it whole. */
void sha256_update(sha256_ctx *c, const void *data, size_t n);

/* Pads the message, writes its 32-byte digest to out and wipes the context; call
 * sha256_init again before reusing it. */
void sha256_final(sha256_ctx *c, uint8_t out[32]);

/* The digest as 64 lowercase hex characters and a terminating NUL. */
void sha256_hex(const uint8_t digest[32], char hex[65]);

/* The digest of the whole file at path as 64 lowercase hex characters (hex gets the NUL as
 * well). Returns 0, or -1 with errno set when the file cannot be opened or read (hex is
 * then an empty string). Reads in 16 KiB pieces; allocates nothing. */
int sha256_file(const char *path, char hex[65]);

#ifdef __cplusplus
}
#endif

#endif
