/*
 * partition.c - the model of an application image built with `scons PARTITION=model`: its weights
 * are not linked in but written on their own into the target's model partition
 * ([partitions.model], toolchain/partition.py), so a new model of the same shape is an update of
 * that partition alone. This file stands in for the generated model.c: the same two functions,
 * the same static arena, the blob found at the partition's address instead of .rodata.model.
 *
 * Nothing in the partition is trusted: its length comes from the blob's own header (blob_bytes)
 * only when that fits the partition, and colibri_init validates the rest as for any blob (magic,
 * CRC, dimensions; a specialised build also the model's shape, COLIBRI_E_MODEL_MISMATCH). An
 * erased partition (0xFF) is COLIBRI_E_BAD_MAGIC; main.c prints the status and ends the program
 * cleanly (exit status 3), where a product would wait for the next update.
 */
#include <stdint.h>

#include "model.h"

/* The partition's bounds: --defsym'd by the link (toolchain/scons/partition.py), one pair per memory map. */
extern const unsigned char __partition_model_start[], __partition_model_end[];

#define BLOB_BYTES_AT 16 /* FORMAT.md: u64 blob_bytes, little-endian */

/* The model arena: KV cache and activations, planned at export for this build's model. */
static unsigned char colibri_arena[COLIBRI_ARENA_SIZE]
    __attribute__((aligned(COLIBRI_ARENA_ALIGN), section(".bss.colibri_arena")));

/* The bytes colibri_init is given: the header's blob_bytes when it fits the partition, else the whole
 * partition (which colibri_init then refuses with the status that says why). */
static size_t partition_blob_len(void)
{
    const unsigned char *p = __partition_model_start;
    size_t cap = (size_t)(__partition_model_end - __partition_model_start);
    uint64_t n = 0;
    if (cap < BLOB_BYTES_AT + 8)
        return cap;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[BLOB_BYTES_AT + i];
    return n != 0 && n <= cap ? (size_t)n : cap;
}

const void *colibri_model_blob(size_t *len)
{
    if (len)
        *len = partition_blob_len();
    return __partition_model_start;
}

colibri_status colibri_model_open(colibri_ctx **ctx)
{
    return colibri_init(ctx, colibri_arena, sizeof colibri_arena, __partition_model_start, partition_blob_len());
}
