/* rlx tokenize / rlx detokenize: text to token ids and back with the model's tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rlx/text.h"

static const char tokenize_usage[] =
    "usage: rlx tokenize [-m PATH] (-p TEXT | -f FILE) [--no-special] [--add-special]\n\n"
    "Prints the token ids of TEXT (or of FILE's bytes, '-' for stdin) on one line, separated by\n"
    "spaces, exactly as the Hugging Face tokenizer of DIR/tokenizer.json encodes them (no BOS/EOS\n"
    "is added unless --add-special).\n\n";

static const char detokenize_usage[] = "usage: rlx detokenize [-m PATH] --ids 1,2,3 [--skip-special]\n\n"
                                       "Prints the text of the token ids (no newline is added).\n\n";

static int load(app_options *o, const char *cmd, rlx_tokenizer **tok) {
    if (app_resolve_model(o))
        return 1;
    if (rlx_tokenizer_open(o->model, tok) != RLX_OK) {
        char what[64];
        snprintf(what, sizeof what, "%s: cannot load the tokenizer", cmd);
        return app_fail_rlx(what);
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv, app_options *o) {
    const char *text = NULL, *file = NULL;
    int no_special = 0, add_special = 0;
    const app_opt own[] = {
        {'p', "prompt", "text", "TEXT", "the text to encode (UTF-8)", APP_OPT_STRING, &text},
        {'f', "file", NULL, "FILE", "encode the bytes of FILE instead ('-': standard input)", APP_OPT_STRING, &file},
        {0, "no-special", NULL, NULL, "treat special tokens such as <|im_end|> in the text as plain text", APP_OPT_FLAG,
         &no_special},
        {0, "add-special", NULL, NULL,
         "add the BOS/EOS the model's files ask for (as generate does for a raw prompt; Hugging Face's "
         "add_special_tokens=True)",
         APP_OPT_FLAG, &add_special},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("tokenize:", own), app_model_group(o)};
    int exit_status;
    if (app_parse_command("tokenize", tokenize_usage, groups, sizeof groups / sizeof groups[0], argc, argv,
                          &exit_status))
        return exit_status;
    if (!text == !file)
        return app_fail("tokenize: give exactly one of --prompt (or --text) and --file (see rlx tokenize --help)");
    char *buf = NULL;
    size_t len = 0;
    if (file && !(buf = app_read_file("tokenize", file, 0, &len)))
        return 1;
    rlx_tokenizer *tok;
    if (load(o, "tokenize", &tok)) {
        free(buf);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int status = 0;
    rlx_encode_options eo = {.size = sizeof eo, .parse_special = !no_special, .add_special = add_special};
    if (rlx_tokenizer_encode_ex(tok, file ? buf : text, file ? len : strlen(text), &eo, &ids, &n, NULL) != RLX_OK) {
        status = app_fail_rlx(file ? "tokenize: cannot encode the file" : "tokenize: cannot encode the text");
    } else {
        for (size_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        if (fflush(stdout) != 0 || ferror(stdout))
            status = app_fail("tokenize: cannot write the output: %s", strerror(errno));
    }
    free(ids);
    free(buf);
    rlx_tokenizer_close(tok);
    return status;
}

typedef struct id_list {
    int32_t *ids;
    int n;
} id_list;

static int parse_ids(const char *opt, const char *value, void *target) {
    id_list *l = target;
    free(l->ids);
    l->ids = NULL;
    l->n = app_parse_tokens(opt, value, &l->ids);
    return l->n < 0 ? -1 : 0;
}

int cmd_detokenize(int argc, char **argv, app_options *o) {
    id_list list = {NULL, 0};
    int skip_special = 0;
    const app_opt own[] = {
        {0, "ids", "tokens", "LIST", "token ids, separated by commas or spaces (what rlx tokenize prints)",
         APP_OPT_CUSTOM, &list, .parse = parse_ids},
        {0, "skip-special", NULL, NULL, "leave special tokens such as <|im_end|> out of the text", APP_OPT_FLAG,
         &skip_special},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("detokenize:", own), app_model_group(o)};
    int exit_status;
    if (app_parse_command("detokenize", detokenize_usage, groups, sizeof groups / sizeof groups[0], argc, argv,
                          &exit_status)) {
        free(list.ids);
        return exit_status;
    }
    if (!list.ids)
        return app_fail("detokenize: --ids is required (see rlx detokenize --help)");
    int32_t *ids = list.ids;
    int n = list.n;
    unsigned flags = RLX_DECODE_STRICT | (skip_special ? RLX_DECODE_SKIP_SPECIAL : 0);
    rlx_tokenizer *tok;
    if (load(o, "detokenize", &tok)) {
        free(ids);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    int status = 0;
    if (rlx_tokenizer_decode(tok, ids, (size_t)n, flags, &text, &len) != RLX_OK) {
        status = app_fail_rlx("detokenize");
    } else if (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) {
        status = app_fail("detokenize: cannot write the output: %s", strerror(errno));
    }
    free(text);
    free(ids);
    rlx_tokenizer_close(tok);
    return status;
}
