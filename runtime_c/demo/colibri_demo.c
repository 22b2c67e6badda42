/*
 * colibri_demo - runs the model linked into this program (generated model.h,
 * model.c and blob), on its static arena:
 *
 *   colibri_demo [--tokens 3,17,42 | --prompt TEXT | --chat TEXT] [--generate N] [--print-logits] [--temperature T]
 *                [--top-k K] [--top-p P] [--min-p M] [--repeat-penalty R] [--seed S] [--stop 2,5]
 *                [--no-hugepages]
 *
 * Without arguments it runs the prompt, length and sampling chosen at export
 * (colibri.json's "prompt" - ids, or a text - "generate", "sampling"); the flags override each.
 * With the blob's tokenizer section (colibri_text.h) a text prompt is tokenized here and the
 * generated text streamed. On Linux a model of 2 MiB or more decodes from a copy of its weights in
 * transparent huge pages (demo_hugepage_copy; --no-hugepages: from the executable's own pages).
 */
#include "colibri.h"
#include "colibri_text.h"
#include "demo_common.h"
#include "model.h"

#define PROG "colibri_demo"
#ifdef COLIBRI_MODEL_NAME
#define NAME COLIBRI_MODEL_NAME
#else
#define NAME "embedded model"
#endif

static int demo_encode(void *user, const char *text, size_t len, int parse_special, int32_t *ids, size_t cap,
                       size_t *n_ids)
{
    static uint32_t scratch[COLIBRI_TOK_SCRATCH_BYTES / 4];
    return colibri_tok_encode((const colibri_tok *)user, text, len, parse_special ? COLIBRI_TOK_PARSE_SPECIAL : 0u,
                              ids, cap, n_ids, scratch, sizeof scratch);
}

/* One id's bytes; a byte-fallback token (FORMAT.md "Tokenizer": a SentencePiece section with the
 * byte_fallback flag, one of its 256 byte tokens) is a BYTE piece, all else TEXT. */
static int demo_piece(void *user, int32_t id, uint8_t *buf, size_t cap, size_t *len, colibri_utf8_kind *kind)
{
    const colibri_tok *t = (const colibri_tok *)user;
    *kind = COLIBRI_UTF8_TEXT;
    if (t->kind == 1u && (t->flags & 2u))
        for (unsigned b = 0; b < 256u; b++)
            if (t->byte_tok[b] == (uint32_t)id)
                *kind = COLIBRI_UTF8_BYTE;
    return colibri_tok_decode(t, id, 0, (char *)buf, cap, len);
}

int main(int argc, char **argv)
{
    static colibri_tok tok;
    static const unsigned char default_text[] = COLIBRI_DEFAULT_PROMPT_TEXT;
    static const unsigned char chat_prefix[] = COLIBRI_CHAT_PREFIX, chat_suffix[] = COLIBRI_CHAT_SUFFIX;
    static demo_args a;
    static const int32_t default_tokens[] = COLIBRI_DEFAULT_PROMPT;
    static float logits[COLIBRI_VOCAB], prompt_logits[COLIBRI_VOCAB];
    static int32_t tokens[COLIBRI_MAX_SEQ]; /* --tokens: at most the model's positions */
    static demo_api api = DEMO_LINKED_API;
    static const int32_t default_stop[] = COLIBRI_DEFAULT_STOP;
    static const colibri_sample_params default_sample = {
        COLIBRI_DEFAULT_TEMPERATURE, COLIBRI_DEFAULT_TOP_K, COLIBRI_DEFAULT_TOP_P, COLIBRI_DEFAULT_MIN_P,
        COLIBRI_DEFAULT_REPEAT_PENALTY, COLIBRI_DEFAULT_SEED, default_stop, COLIBRI_DEFAULT_N_STOP};
    int rc = demo_parse_sampled(argc, argv, PROG, 0, default_tokens, COLIBRI_DEFAULT_PROMPT_LEN,
                                COLIBRI_DEFAULT_GENERATE, &default_sample, &a);
    if (rc != DEMO_CONTINUE)
        return rc;
    size_t blob_len;
    const void *blob = colibri_model_blob(&blob_len);
    const void *copy = a.no_hugepages ? NULL : demo_hugepage_copy(blob, blob_len);
    colibri_ctx *ctx;
    colibri_status st = copy ? colibri_model_open_at(&ctx, copy) : colibri_model_open(&ctx);
    if (st != COLIBRI_OK)
        return demo_fail(&api, PROG, NAME, st);
    if (copy)
        blob = copy;
    if (colibri_tok_from_blob(&tok, blob, blob_len) == COLIBRI_TOK_OK) { /* else ids only */
        api.tokenize = demo_encode;
        api.token_piece = demo_piece;
        api.tok_strerror = colibri_tok_strerror;
        api.piece_user = &tok;
        if (COLIBRI_CHAT_PREFIX_LEN || COLIBRI_CHAT_SUFFIX_LEN) {
            api.chat_prefix = (const char *)chat_prefix;
            api.chat_suffix = (const char *)chat_suffix;
            api.chat_prefix_len = COLIBRI_CHAT_PREFIX_LEN;
            api.chat_suffix_len = COLIBRI_CHAT_SUFFIX_LEN;
        }
    }
    if (COLIBRI_DEFAULT_PROMPT_TEXT_LEN && !a.tokens_text && !a.prompt_text && !a.chat) {
        a.prompt_text = (const char *)default_text;
        a.prompt_len = COLIBRI_DEFAULT_PROMPT_TEXT_LEN;
    }
    return demo_run(&api, ctx, &a, tokens, COLIBRI_MAX_SEQ, logits, prompt_logits, COLIBRI_VOCAB, PROG, NAME);
}
