/*
 * colibri.h - the whole public surface of the colibri MoE runtime.
 *
 * The caller owns every byte: the model blob (read-only, 64-byte aligned) and
 * the arena (writable, 64-byte aligned) are passed in; the runtime allocates
 * nothing, keeps no global state and makes no system calls. A context lives at
 * the start of its arena, so two arenas give two independent contexts that may
 * run in two threads over one shared blob.
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(COLIBRI_BUILDING) && defined(__GNUC__)
#define COLIBRI_API __attribute__((visibility("default")))
#else
#define COLIBRI_API
#endif

#define COLIBRI_ABI_VERSION 1 /* bumped on any incompatible change below */
#define COLIBRI_ABI_MINOR 1   /* bumped on each compatible addition (1: colibri_init_regions); 0 again with a new major */
#define COLIBRI_BLOB_ALIGN 64
#define COLIBRI_ARENA_ALIGN 64

typedef enum colibri_status {
    COLIBRI_OK = 0,
    COLIBRI_E_NULL = 1,          /* a required pointer argument is NULL */
    COLIBRI_E_BAD_MAGIC = 2,     /* blob does not start with the colibri magic */
    COLIBRI_E_VERSION = 3,       /* blob format major version not supported */
    COLIBRI_E_TRUNCATED = 4,     /* blob shorter than its header says, or length mismatch */
    COLIBRI_E_CRC = 5,           /* CRC-32 of the blob does not match */
    COLIBRI_E_BAD_HEADER = 6,    /* dims zero, inconsistent or overflowing */
    COLIBRI_E_TENSOR_BOUNDS = 7, /* a tensor lies (partly) outside the blob */
    COLIBRI_E_BAD_TENSOR = 8,    /* a tensor has the wrong kind, shape, dtype or alignment */
    COLIBRI_E_LAYOUT = 9,        /* weight layout not implemented by this build */
    COLIBRI_E_BLOB_ALIGN = 10,   /* blob pointer not 64-byte aligned */
    COLIBRI_E_ARENA_ALIGN = 11,  /* arena pointer not 64-byte aligned */
    COLIBRI_E_ARENA_SMALL = 12,  /* arena smaller than the model needs */
    COLIBRI_E_BAD_PLAN = 13,     /* arena plan in the blob overlaps live buffers or overflows */
    COLIBRI_E_MODEL_MISMATCH = 14, /* specialised build given a blob of another model or activation kind */
    COLIBRI_E_NOT_INIT = 15,     /* context not initialised by colibri_init */
    COLIBRI_E_TOKEN = 16,        /* token id outside [0, vocab) */
    COLIBRI_E_SEQ_FULL = 17,     /* forward would go past max_seq positions */
    COLIBRI_E_ARG = 18,          /* other bad argument (zero tokens, short logits buffer) */
    COLIBRI_E_DTYPE = 19         /* a tensor's weight format (dtype code) not implemented by this build */
} colibri_status;

typedef struct colibri_ctx colibri_ctx; /* opaque; lives inside the arena */

/* Filled by colibri_info. The caller sets struct_size = sizeof(colibri_model_info);
 * fields added later go at the end, so older callers keep working. */
typedef struct colibri_model_info {
    uint32_t struct_size;
    uint32_t abi_version;
    uint32_t vocab;
    uint32_t hidden;
    uint32_t n_layers;
    uint32_t n_experts;
    uint32_t top_k;
    uint32_t max_seq;
    uint32_t n_past; /* positions currently in the KV cache */
    uint32_t reserved;
    uint64_t arena_bytes;
    uint64_t blob_bytes;
} colibri_model_info;

/* Arena bytes a context for this blob needs. Validates the blob fully. */
COLIBRI_API colibri_status colibri_arena_bytes(const void *blob, size_t blob_len, size_t *out_bytes);

/* Validates the blob (magic, version, length, CRC-32, every tensor in bounds
 * and aligned, the arena plan) and builds a context at the start of the arena. */
COLIBRI_API colibri_status colibri_init(colibri_ctx **out_ctx, void *arena, size_t arena_len,
                                        const void *blob, size_t blob_len);

/* The arena across memories: one region per class of data, each 64-byte aligned, e.g. the KV cache in
 * external SDRAM and the activations in fast internal SRAM. The context lives at the start of the
 * activations region. model.h gives each class's size (COLIBRI_KV_BYTES, COLIBRI_ACT_BYTES,
 * COLIBRI_SCRATCH_BYTES); colibri_region_bytes reads them from any blob. */
typedef enum colibri_class {
    COLIBRI_CLASS_KV_CACHE = 0,    /* key and value caches: grows with max_seq */
    COLIBRI_CLASS_ACTIVATIONS = 1, /* the context and a block's activations */
    COLIBRI_CLASS_SCRATCH = 2,     /* attention scores, int8 activations: one step's scratch */
    COLIBRI_N_CLASSES = 3
} colibri_class;

typedef struct colibri_region {
    void *ptr;  /* 64-byte aligned; regions must not overlap */
    size_t len; /* bytes, at least what the class needs */
} colibri_region;

/* Bytes each region needs, out[c] for class c (n_out must be COLIBRI_N_CLASSES). Validates the blob fully;
 * COLIBRI_E_BAD_PLAN when its plan does not keep each class in a range of its own (an older export). */
COLIBRI_API colibri_status colibri_region_bytes(const void *blob, size_t blob_len, size_t *out, size_t n_out);

/* colibri_init with the arena split by class: regions[c] for class c, n_regions == COLIBRI_N_CLASSES (else
 * COLIBRI_E_ARG). Each region is checked as colibri_init checks its arena: COLIBRI_E_NULL,
 * COLIBRI_E_ARENA_ALIGN, COLIBRI_E_ARENA_SMALL; two overlapping regions are COLIBRI_E_ARG. */
COLIBRI_API colibri_status colibri_init_regions(colibri_ctx **out_ctx, const colibri_region *regions,
                                                size_t n_regions, const void *blob, size_t blob_len);

/* Appends n_tokens to the sequence and, when logits is not NULL, writes the
 * last position's vocab logits. On error the context is unchanged and usable. */
COLIBRI_API colibri_status colibri_forward(colibri_ctx *ctx, const int32_t *tokens, size_t n_tokens,
                                           float *logits, size_t logits_len);

/* The optional parallel hook. The runtime starts no threads; given a parallel_for it splits each
 * large matrix product into n_tasks row ranges (a prompt's attention and per-token steps into token
 * ranges) and calls
 *     parallel_for(fn, task_ctx, n_tasks, user)
 * which must call fn(task_ctx, i) exactly once for every i in [0, n_tasks), from any threads, in
 * any order, and return only when all calls have returned. The tasks write disjoint outputs and
 * compute every output as the single-threaded path does: results are bit-identical with and
 * without the hook. parallel_for NULL or n_tasks < 2 removes the hook (the default after init).
 * A build with -DCOLIBRI_NO_PARALLEL (the firmware targets: no threads, a static stack bound)
 * refuses a hook with COLIBRI_E_ARG. */
typedef void (*colibri_task_fn)(void *task_ctx, size_t i);
typedef void (*colibri_parallel_for_fn)(colibri_task_fn fn, void *task_ctx, size_t n_tasks, void *user);

COLIBRI_API colibri_status colibri_set_parallel(colibri_ctx *ctx, colibri_parallel_for_fn parallel_for, void *user,
                                                size_t n_tasks);

/* Empties the sequence (KV cache) without touching the blob. */
COLIBRI_API colibri_status colibri_reset(colibri_ctx *ctx);

COLIBRI_API colibri_status colibri_info(const colibri_ctx *ctx, colibri_model_info *info);

/* A static string for every status value; never NULL. */
COLIBRI_API const char *colibri_strerror(colibri_status status);

#ifdef COLIBRI_TRACE_CHECKS
/* Test builds (-DCOLIBRI_TRACE_CHECKS) only: validates the blob as colibri_init does and sets *line to
 * the source line (runtime_c/src/blob.c) of the check that refused it, 0 when none did. */
COLIBRI_API colibri_status colibri_debug_check(const void *blob, size_t blob_len, unsigned *line);
#endif

#ifdef __cplusplus
}
#endif
#endif /* COLIBRI_H */
