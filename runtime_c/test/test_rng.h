/*
 * test_rng.h - the kernel tests' random numbers: xorshift64, reproducible on every target.
 */
#ifndef CB_TEST_RNG_H
#define CB_TEST_RNG_H

#include <stdint.h>

typedef struct rng { uint64_t s; } rng;

static inline uint32_t next(rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 16);
}

static inline float uniform(rng *r) /* [-1, 1) */
{
    return (float)(next(r) & 0xffffffu) / 8388608.0f - 1.0f;
}

#endif /* CB_TEST_RNG_H */
