/*
 * arch/select.h - the one place that decides which ISA the kernels use, from the
 * compiler's predefined macros (and -DCOLIBRI_SCALAR: the scalar kernels only).
 *
 * It defines:
 *   CB_ARCH          the family whose arch/ folder holds the build's kernels: CB_ARCH_X86,
 *                    CB_ARCH_ARM (NEON, SDOT, I8MM), CB_ARCH_RISCV (RVV), CB_ARCH_CORTEX_M (MVE,
 *                    DSP), or CB_ARCH_SCALAR (no folder of its own but scalar/);
 *   CB_ISA_NAME      the path of the float-activation matmul (cb_kernels_isa());
 *   CB_ISA_Q8_NAME   the path of the integer matmul (cb_kernels_q8_isa());
 *   CB_ISA_Q4_NAME   the path of the int4 matmul (cb_kernels_q4_isa());
 *   CB_HAS_<KERNEL>  the kernels the family's headers provide (listed below; fallback.h maps every
 *                    other one to the scalar kernel of arch/scalar/);
 *   feature macros   the variant inside a folder (CB_X86_AVX512, CB_ARM_DOTPROD, CB_CM_DSP, ...):
 *                    the arch headers test these, never the compiler's macros; and CB_F16_X86 /
 *                    CB_F16_ARM, the hardware f16 conversion cbmath.h uses.
 *
 * Each folder has the same files, where the ISA has them: matmul.h (the float vector primitives the
 * row dots of kernels.c are written over), q8.h (the integer tiles or row dot of kernels_q8.c),
 * attn.h (attention scores and values, softmax and SiLU: inlined from kernels.h). Each header is
 * empty unless CB_ARCH names its family and CB_HAS_* its kernels, so the generic files include the
 * whole list unconditionally. A new variant: its code in its family's folder, its lines here.
 *
 * The kernels (each named cb_<kernel>_isa where it is called; the scalar one is cb_<kernel>_scalar):
 *   CB_HAS_MATMUL    vector primitives for cb_matmul / cb_matvec        (matmul.h)
 *   CB_HAS_DOT       cb_dot, the attention's dot product               (attn.h)
 *   CB_HAS_ATTN      cb_scores and cb_weighted_rows                     (attn.h)
 *   CB_HAS_ATTN_F16  cb_scores_f16 and cb_weighted_rows_f16 (f16 KV)    (attn.h)
 *   CB_HAS_ATTN_I8   cb_scores_i8 and cb_weighted_rows_i8 (int8 KV)     (attn.h)
 *   CB_HAS_EXP       cb_exp_shift, cb_softmax, cb_silu_mul              (attn.h)
 *   CB_HAS_Q8_QUANT  one whole block of cb_quantize_q8                  (q8.h)
 *   CB_HAS_Q8_TILES  cb_matmul_q8 over the tiled layout: cb_tile_dot   (q8.h)
 *   CB_HAS_Q8_QUAD   with it, four tokens per pass over a tile          (q8.h)
 *   CB_HAS_Q8_ROWS   the int32 dot of 32 weights of a row-major row     (q8.h)
 *   CB_HAS_Q4_DOT    the int32 dot of one int4 block with 32 activations (q4.h)
 */
#ifndef CB_ARCH_SELECT_H
#define CB_ARCH_SELECT_H

#define CB_ARCH_SCALAR 0
#define CB_ARCH_X86 1
#define CB_ARCH_ARM 2
#define CB_ARCH_RISCV 3
#define CB_ARCH_CORTEX_M 4

#if defined(COLIBRI_SCALAR)
#define CB_ARCH CB_ARCH_SCALAR

#elif defined(__AVX2__) || defined(__AVX512F__)
#define CB_ARCH CB_ARCH_X86
#if defined(__AVX512F__)
#define CB_X86_AVX512 1 /* 16 float lanes */
#define CB_ISA_NAME "avx512"
#define CB_HAS_MATMUL 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CB_X86_AVX2 1 /* 8 float lanes (x86-64-v3) */
#define CB_ISA_NAME "avx2"
#define CB_HAS_MATMUL 1
#endif
#if defined(__AVX2__)
#define CB_HAS_Q4_DOT 1 /* PMADDUBSW; four rows at a time with F16C, by VPDPBUSD where AVX-512 VNNI has VL */
#if defined(__F16C__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define CB_ISA_Q4_NAME "avx512vnni"
#else
#define CB_ISA_Q4_NAME "avx2"
#endif
#define CB_HAS_DOT 1
#define CB_HAS_ATTN 1
#define CB_HAS_ATTN_I8 1 /* over an int8 KV cache: VPMOVSXBD + VCVTDQ2PS */
#if defined(__F16C__)
#define CB_HAS_ATTN_F16 1 /* over an f16 KV cache: VCVTPH2PS (x86-64-v3) */
#endif
#define CB_HAS_EXP 1
#define CB_HAS_Q8_QUANT 1
#define CB_HAS_Q16_DOT 1 /* PMADDWD */
#define CB_ISA_Q16_NAME "avx2"
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)              \
    && defined(__AVX512VL__)
#define CB_X86_VNNI 1 /* VPDPBUSD, on ZMM and (decode without prefetch) YMM */
#define CB_ISA_Q8_NAME "avx512vnni"
#define CB_HAS_Q8_TILES 1
#define CB_HAS_Q8_QUAD 1
#elif defined(__AVX2__) && defined(__F16C__)
#define CB_ISA_Q8_NAME "avx2" /* PMADDUBSW */
#define CB_HAS_Q8_TILES 1
#define CB_HAS_Q8_QUAD 1
#endif

#elif defined(__ARM_NEON)
#define CB_ARCH CB_ARCH_ARM
#define CB_ISA_NAME "neon"
#define CB_HAS_MATMUL 1
#define CB_HAS_Q8_TILES 1
#if defined(__aarch64__)
#define CB_ARM_A64 1 /* AArch64: IEEE subnormals, f16 conversion, across-vector adds */
#define CB_HAS_ATTN 1
#define CB_HAS_ATTN_F16 1 /* over an f16 KV cache: FCVTL */
#define CB_HAS_ATTN_I8 1  /* over an int8 KV cache: SXTL + SCVTF */
#endif
#if defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
#define CB_ARM_FMA 1
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8) && defined(__aarch64__)
#define CB_ARM_I8MM 1 /* SMMLA: Armv8.6-A int8 matrix multiply */
#define CB_ISA_Q8_NAME "neon-i8mm"
#elif defined(__ARM_FEATURE_DOTPROD)
#define CB_ARM_DOTPROD 1 /* SDOT */
#define CB_ISA_Q8_NAME "neon-dotprod"
#else
#define CB_ISA_Q8_NAME "neon" /* SMULL/SMLAL/SADALP */
#endif
#define CB_HAS_Q4_DOT 1
#define CB_HAS_Q16_DOT 1 /* SMULL/SMLAL */
#define CB_ISA_Q16_NAME "neon"
#if defined(CB_ARM_I8MM) || defined(CB_ARM_DOTPROD)
#define CB_ISA_Q4_NAME "neon-dotprod"
#else
#define CB_ISA_Q4_NAME "neon"
#endif

#elif defined(__riscv_vector) && defined(__riscv_v_intrinsic)
#define CB_ARCH CB_ARCH_RISCV
#define CB_ISA_NAME "rvv"
#define CB_ISA_Q8_NAME "rvv"
#define CB_ISA_Q4_NAME "rvv"
#define CB_HAS_Q4_DOT 1
#define CB_HAS_MATMUL 1
#define CB_HAS_Q8_TILES 1

#elif defined(__ARM_FEATURE_MVE) || defined(__ARM_FEATURE_DSP)
#define CB_ARCH CB_ARCH_CORTEX_M
#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2)
#define CB_ISA_NAME "mve" /* MVE with floating point */
#define CB_HAS_MATMUL 1
#endif
#if defined(__ARM_FEATURE_MVE)
#define CB_CM_MVE 1 /* VMLADAV */
#define CB_ISA_Q8_NAME "mve"
#define CB_ISA_Q4_NAME "mve"
#else
#define CB_CM_DSP 1 /* SMLAD */
#define CB_ISA_Q8_NAME "dsp"
#define CB_ISA_Q4_NAME "dsp"
#endif
#define CB_HAS_Q4_DOT 1
#define CB_HAS_Q8_ROWS 1

#else
#define CB_ARCH CB_ARCH_SCALAR
#endif

#if !defined(CB_ISA_NAME)
#define CB_ISA_NAME "scalar"
#endif
#if !defined(CB_ISA_Q8_NAME)
#define CB_ISA_Q8_NAME "scalar"
#endif
#if !defined(CB_ISA_Q4_NAME)
#define CB_ISA_Q4_NAME "scalar"
#endif
#if !defined(CB_ISA_Q16_NAME)
#define CB_ISA_Q16_NAME "scalar"
#endif

/* The f16 -> f32 conversion of cbmath.h, kernels or not (every f16 is exactly an f32, so the hardware
 * gives the portable code's bits): F16C, or an Arm FPU with half-precision conversions and the IEEE
 * __fp16 (AArch64, the Cortex-M55 by default, the Cortex-M7 with -mfp16-format=ieee). */
#if defined(__BMI2__) && defined(__x86_64__)
#define CB_X86_BMI2 1 /* BZHI (x86-64-v3): kernels_outl.h's column by a mask */
#endif
#if defined(__F16C__)
#define CB_F16_X86 1
#elif (defined(__aarch64__) || (defined(__ARM_FP) && (__ARM_FP & 2))) && defined(__ARM_FP16_FORMAT_IEEE)
#define CB_F16_ARM 1
#endif

#include "fallback.h"

#endif /* CB_ARCH_SELECT_H */
