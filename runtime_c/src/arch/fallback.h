/*
 * arch/fallback.h - every kernel the selected ISA does not provide, mapped to the scalar one
 * (arch/scalar/), in one table (after ggml's arch-fallback.h). Included by select.h; the generic
 * code calls cb_<kernel>_isa, which is the ISA's own kernel where select.h sets CB_HAS_<KERNEL>.
 */
#ifndef CB_ARCH_FALLBACK_H
#define CB_ARCH_FALLBACK_H

#if !defined(CB_HAS_MATMUL)
#define cb_matmul_isa cb_matmul_scalar
#endif
#if !defined(CB_HAS_DOT)
#define cb_dot_isa cb_dot_scalar
#endif
#if !defined(CB_HAS_ATTN)
#define cb_scores_isa cb_scores_scalar
#define cb_weighted_rows_isa cb_weighted_rows_scalar
#endif
#if !defined(CB_HAS_ATTN_F16)
#define cb_scores_f16_isa cb_scores_f16_scalar
#define cb_weighted_rows_f16_isa cb_weighted_rows_f16_scalar
#endif
#if !defined(CB_HAS_ATTN_I8)
#define cb_scores_i8_isa cb_scores_i8_scalar
#define cb_weighted_rows_i8_isa cb_weighted_rows_i8_scalar
#endif
#if !defined(CB_HAS_EXP)
#define cb_exp_shift_isa cb_exp_shift_scalar
#define cb_softmax_isa cb_softmax_scalar
#define cb_silu_mul_isa cb_silu_mul_scalar
#endif
#if !defined(CB_HAS_Q8_QUANT)
#define cb_quantize_block_isa cb_quantize_block_scalar
#endif
#if !defined(CB_HAS_Q8_TILES)
#define cb_matmul_q8_isa cb_matmul_q8_scalar
#endif
#if !defined(CB_HAS_Q8_ROWS)
#define cb_dot32_isa cb_dot32_scalar
#endif

#if !defined(CB_HAS_Q16_DOT)
#define cb_q16_isums_isa cb_q16_isums_scalar
#endif

#if !defined(CB_HAS_Q4_DOT)
#define cb_dot32_q4_isa cb_dot32_q4_scalar
#endif

#endif /* CB_ARCH_FALLBACK_H */
