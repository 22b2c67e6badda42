/*
 * colibri_sample.h - the optional sampler and streaming UTF-8 assembler of the
 * colibri runtime (runtime_c/src/sample.c). A build that does not call these
 * links none of it (every function has its own section; --gc-sections drops it).
 *
 * Like the core: no heap, no mutable globals, no VLAs, no recursion, no libm
 * (the exponential is the runtime's own cb_expf, the same bits on every target).
 * The caller owns the state (colibri_sampler, colibri_utf8) and the scratch.
 *
 * SAMPLING, exactly (the same seed gives the same id on every target, bit for bit)
 * --------------------------------------------------------------------------------
 * PRNG. 64-bit state s. colibri_sample_init sets s = splitmix64(seed), or 1 when
 * that is 0, where splitmix64(x): z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30))
 * * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB; z ^ (z >> 31)
 * (all mod 2^64). One draw is xorshift64*: s ^= s >> 12; s ^= s << 25;
 * s ^= s >> 27; r = s * 0x2545F4914F6CDD1D (mod 2^64). The uniform float is
 * u = (float)(r >> 40) * 2^-24: 24 bits, exact in a float, in [0, 1).
 * Exactly one draw per sampled token when temperature > 0, none when it is 0.
 *
 * One token from logits[0..vocab) (float32; the caller's array is not written):
 *  1. penalty   w[i] = logits[i]; for each id in recent[] (the caller's window of
 *               recent ids, duplicates allowed): w[id] = logits[id] / R when
 *               logits[id] > 0 (FLT_MAX if that overflows), else logits[id] * R
 *               (HF's RepetitionPenaltyLogitsProcessor: an id is penalised once
 *               however often it occurs). R = 1 skips the step.
 *  2. greedy    temperature == 0: the id of the largest w, the lowest such id on
 *               ties; no draw; steps 3-7 are skipped.
 *  3. top-k     rank the ids by w descending, equal w by id ascending (a total
 *               order, so the result does not depend on the sorting algorithm),
 *               and keep the first K (K = 0 or K >= vocab: all).
 *  4. softmax   with temperature T, over the kept ranks r = 0, 1, ... in order:
 *               e_r = cb_expf((w_r - w_0) / T) (a float subtraction, then a float
 *               division: T scales the logits inside the exponent, which is the
 *               same cut and the same distribution as dividing w by T before
 *               step 3, without overflow), S = e_0 + e_1 + ... summed in rank
 *               order, p_r = e_r / S.
 *  5. top-p     P < 1: keep the shortest prefix whose running sum p_0 + ... + p_r
 *               (in rank order, float) is >= P; at least one id. P >= 1: skip.
 *  6. min-p     M > 0: keep the ranks r (of those left) with p_r >= M * p_0
 *               (a prefix, as p is non-increasing). At least rank 0 stays.
 *  7. draw      T' = p_0 + ... + p_{n-1} over the n kept ranks (rank order),
 *               t = u * T', then walk the ranks accumulating c += p_r and return
 *               the first id with t < c; the last kept id if rounding leaves none.
 * Logits must not be NaN or +inf and not all -inf (COLIBRI_E_ARG); -inf masks an id.
 * Stop ids do not change the draw: colibri_sample_is_stop tells the caller to stop.
 *
 * STREAMING TEXT: colibri_utf8 never splits a character and replaces invalid
 * bytes exactly as HuggingFace tokenizers' decoders do:
 *  - bytes fed as COLIBRI_UTF8_TEXT (a token's own bytes: byte-level BPE pieces,
 *    SentencePiece pieces) follow Rust's String::from_utf8_lossy (the ByteLevel
 *    decoder): each maximal prefix of a well-formed sequence that cannot be
 *    completed becomes one U+FFFD; an incomplete tail is held back until the next
 *    byte (or colibri_utf8_flush, where it becomes one U+FFFD).
 *  - bytes fed as COLIBRI_UTF8_BYTE (byte-fallback tokens <0xXX>) collect into a
 *    run that ends at the next TEXT feed (even empty) or at flush (the ByteFallback decoder):
 *    a run that is well-formed UTF-8 as a whole is emitted as is, otherwise every
 *    byte of it becomes one U+FFFD. A run longer than COLIBRI_UTF8_RUN_MAX bytes
 *    is decided in pieces of that size at character boundaries (the only case
 *    where the output can differ from HF's: a run of more than 64 byte tokens
 *    that is ill-formed only after its first 64 bytes).
 * Output per call is at most COLIBRI_UTF8_OUT_MAX(n) bytes for n input bytes.
 */
#ifndef COLIBRI_SAMPLE_H
#define COLIBRI_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch bytes colibri_sample_next needs for a vocabulary of v ids (4-byte aligned). */
#define COLIBRI_SAMPLE_SCRATCH_BYTES(v) ((size_t)(v) * 8u)

typedef struct colibri_sample_params {
    float temperature;    /* >= 0, finite; 0: greedy */
    uint32_t top_k;       /* 0: off */
    float top_p;          /* in (0, 1]; 1: off */
    float min_p;          /* in [0, 1]; 0: off */
    float repeat_penalty; /* > 0, finite; 1: off */
    uint64_t seed;
    const int32_t *stop_ids; /* may be NULL when n_stop is 0 */
    size_t n_stop;
} colibri_sample_params;

typedef struct colibri_sampler {
    colibri_sample_params params;
    uint64_t state; /* the PRNG's: see above */
} colibri_sampler;

/* The defaults: greedy, no cut, no penalty, seed 0, no stop ids. */
COLIBRI_API colibri_sample_params colibri_sample_defaults(void);

/* Checks p (COLIBRI_E_ARG on a value outside its range above) and seeds s. */
COLIBRI_API colibri_status colibri_sample_init(colibri_sampler *s, const colibri_sample_params *p);

/* One id from logits (steps 1-7 above) into *out. recent: n_recent ids in [0, vocab)
 * (else COLIBRI_E_TOKEN), NULL when n_recent is 0. scratch: at least
 * COLIBRI_SAMPLE_SCRATCH_BYTES(vocab) bytes, 4-byte aligned (else COLIBRI_E_ARG). */
COLIBRI_API colibri_status colibri_sample_next(colibri_sampler *s, const float *logits, size_t vocab,
                                               const int32_t *recent, size_t n_recent, void *scratch,
                                               size_t scratch_len, int32_t *out);

/* Step 1 alone: out[0..vocab) = logits penalised for the ids in recent (out may be logits:
 * in place, duplicates in recent still penalised once). */
COLIBRI_API colibri_status colibri_sample_penalize(const float *logits, size_t vocab, const int32_t *recent,
                                                   size_t n_recent, float penalty, float *out);

/* 1 when id is one of the sampler's stop ids, else 0. */
COLIBRI_API int colibri_sample_is_stop(const colibri_sampler *s, int32_t id);

/* The next PRNG value r (advances the state): for tests of the specified sequence. */
COLIBRI_API uint64_t colibri_sample_rand(colibri_sampler *s);

/* ------------------------------------------------------------ streaming UTF-8 */

#define COLIBRI_UTF8_RUN_MAX 64
#define COLIBRI_UTF8_OUT_MAX(n) (3u * ((size_t)(n) + COLIBRI_UTF8_RUN_MAX + 4u))

typedef enum colibri_utf8_kind { COLIBRI_UTF8_TEXT = 0, COLIBRI_UTF8_BYTE = 1 } colibri_utf8_kind;

typedef struct colibri_utf8 {
    uint8_t pending[4]; /* TEXT: a well-formed prefix waiting for its next byte */
    uint8_t n_pending;
    uint8_t run[COLIBRI_UTF8_RUN_MAX]; /* BYTE: the current run of byte-fallback bytes */
    uint8_t n_run;
} colibri_utf8;

COLIBRI_API void colibri_utf8_init(colibri_utf8 *u);

/* Feeds n bytes of one token of the given kind; writes the complete text that is
 * now decided to out (cap >= COLIBRI_UTF8_OUT_MAX(n), else COLIBRI_E_ARG, nothing
 * consumed) and its length to *out_len. */
COLIBRI_API colibri_status colibri_utf8_feed(colibri_utf8 *u, const uint8_t *bytes, size_t n, colibri_utf8_kind kind,
                                             uint8_t *out, size_t cap, size_t *out_len);

/* End of text: what is held back, decided (cap >= COLIBRI_UTF8_OUT_MAX(0)). */
COLIBRI_API colibri_status colibri_utf8_flush(colibri_utf8 *u, uint8_t *out, size_t cap, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_SAMPLE_H */
