/* rlx tokenize / rlx detokenize: text to token ids and back with the model's tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rlx/text.h"

static const char tokenize_help[] =
    "usage: rlx tokenize --model DIR (--text TEXT | --file FILE) [--no-special]\n\n"
    "Prints the token ids of TEXT (or of FILE's bytes, '-' for stdin) on one line, separated by\n"
    "spaces, exactly as the Hugging Face tokenizer of DIR/tokenizer.json encodes them (no BOS/EOS\n"
    "is added).\n\noptions:\n"
    "  --model DIR        model directory holding tokenizer.json\n"
    "  --text TEXT        the text to encode (UTF-8)\n"
    "  --file FILE        encode the contents of FILE instead\n"
    "  --no-special       treat special tokens such as <|im_end|> in the text as plain text\n";

static const char detokenize_help[] =
    "usage: rlx detokenize --model DIR --ids 1,2,3 [--skip-special]\n\n"
    "Prints the text of the comma-separated token ids (no newline is added).\n\noptions:\n"
    "  --model DIR        model directory holding tokenizer.json\n"
    "  --ids LIST         token ids, separated by commas or spaces (what rlx tokenize prints)\n"
    "  --skip-special     leave special tokens such as <|im_end|> out of the text\n";

/* The whole of path ("-" = stdin) in a malloc'd buffer. */
static int read_all(const char *path, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return app_fail("tokenize: cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int status = 0;
    while (buf) {
        if (n == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (!buf)
        status = app_fail("tokenize: out of memory reading %s", path);
    else if (ferror(f))
        status = app_fail("tokenize: cannot read %s: %s", path, strerror(errno));
    if (f != stdin)
        fclose(f);
    if (status) {
        free(buf);
        return status;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int load(app_options *o, const char *cmd, rlx_tokenizer **tok) {
    if (app_resolve_model(o))
        return 1;
    if (rlx_tokenizer_load(o->model, tok) != RLX_OK) {
        char what[64];
        snprintf(what, sizeof what, "%s: cannot load the tokenizer", cmd);
        return app_fail_rlx(what);
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv, app_options *o) {
    const char *text = NULL, *file = NULL;
    int parse_special = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(tokenize_help, stdout);
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc < 0)
            return 1;
        if (rc)
            continue;
        if (strcmp(argv[i], "--text") == 0) {
            if (!(text = app_value(argc, argv, &i)))
                return 1;
        } else if (strcmp(argv[i], "--file") == 0) {
            if (!(file = app_value(argc, argv, &i)))
                return 1;
        } else if (strcmp(argv[i], "--no-special") == 0) {
            parse_special = 0;
        } else {
            return app_fail("tokenize: unknown option '%s' (see rlx tokenize --help)", argv[i]);
        }
    }
    if (!text == !file)
        return app_fail("tokenize: give exactly one of --text and --file (see rlx tokenize --help)");
    char *buf = NULL;
    size_t len = 0;
    if (file && read_all(file, &buf, &len))
        return 1;
    rlx_tokenizer *tok;
    if (load(o, "tokenize", &tok)) {
        free(buf);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int status = 0;
    if (rlx_tokenizer_encode(tok, file ? buf : text, file ? len : strlen(text), parse_special, &ids, &n) != RLX_OK) {
        status = app_fail_rlx(file ? "tokenize: cannot encode the file" : "tokenize: cannot encode --text");
    } else {
        for (size_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        if (fflush(stdout) != 0 || ferror(stdout))
            status = app_fail("tokenize: cannot write the output: %s", strerror(errno));
    }
    free(ids);
    free(buf);
    rlx_tokenizer_destroy(tok);
    return status;
}

int cmd_detokenize(int argc, char **argv, app_options *o) {
    const char *list = NULL, *opt = "--ids";
    unsigned flags = RLX_DECODE_STRICT;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(detokenize_help, stdout);
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc < 0)
            return 1;
        if (rc)
            continue;
        if (strcmp(argv[i], "--ids") == 0 || strcmp(argv[i], "--tokens") == 0) {
            opt = argv[i];
            if (!(list = app_value(argc, argv, &i)))
                return 1;
        } else if (strcmp(argv[i], "--skip-special") == 0) {
            flags |= RLX_DECODE_SKIP_SPECIAL;
        } else {
            return app_fail("detokenize: unknown option '%s' (see rlx detokenize --help)", argv[i]);
        }
    }
    if (!list)
        return app_fail("detokenize: --ids is required (see rlx detokenize --help)");
    int32_t *ids;
    int n = app_parse_tokens(opt, list, &ids);
    if (n < 0)
        return 1;
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
    rlx_tokenizer_destroy(tok);
    return status;
}
