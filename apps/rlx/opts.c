/* Option tables for getopt_long: one declaration per option gives its parsing and its help line. */
#include "opts.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* where help text starts: "  -c, --ctx-size N   " */
#define HELP_COLUMN 21
/* getopt_long's value of long option i (above every short option character) */
#define LONG_BASE 256
#define MAX_OPTS 128

typedef struct opt_ref {
    const app_opt *opt;
    int taken_alias; /* the alias is shadowed by an earlier option */
} opt_ref;

static int same_name(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

/* Whether an option of refs[0 .. n) already uses long name `name` or short name c. */
static int taken(const opt_ref *refs, size_t n, const char *name, char c) {
    for (size_t i = 0; i < n; i++) {
        const app_opt *o = refs[i].opt;
        if ((c && o->short_name == c) || same_name(o->name, name) ||
            (!refs[i].taken_alias && same_name(o->alias, name)))
            return 1;
    }
    return 0;
}

/* The options in effect, earlier groups first, shadowed names left out. */
static size_t collect(const app_command_spec *spec, opt_ref *refs) {
    size_t n = 0;
    for (size_t g = 0; g < spec->n_groups; g++)
        for (size_t i = 0; i < spec->groups[g].n && n < MAX_OPTS; i++) {
            const app_opt *o = &spec->groups[g].opts[i];
            if (taken(refs, n, o->name, 0))
                continue;
            refs[n] = (opt_ref){.opt = o, .taken_alias = o->alias && taken(refs, n, o->alias, 0)};
            n++;
        }
    return n;
}

static int set_value(const app_opt *o, const char *spelled, const char *v) {
    char *end;
    switch (o->type) {
    case APP_OPT_FLAG:
        *(int *)o->target = 1;
        return 0;
    case APP_OPT_STRING:
        *(const char **)o->target = v;
        return 0;
    case APP_OPT_U32: {
        uint32_t u;
        if (app_parse_u32(spelled, v, &u) < 0)
            return -1;
        if (u < o->min)
            return app_fail("%s must be at least %u (got %u)", spelled, o->min, u), -1;
        *(uint32_t *)o->target = u;
        return 0;
    }
    case APP_OPT_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < INT32_MIN || x > INT32_MAX)
            return app_fail("%s: '%s' is not an integer", spelled, v), -1;
        *(int32_t *)o->target = (int32_t)x;
        return 0;
    }
    case APP_OPT_U64: {
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-')
            return app_fail("%s: '%s' is not a non-negative integer", spelled, v), -1;
        if (x < o->min)
            return app_fail("%s must be at least %u (got %llu)", spelled, o->min, x), -1;
        *(uint64_t *)o->target = x;
        return 0;
    }
    case APP_OPT_FLOAT: {
        float f;
        if (app_parse_float(spelled, v, &f) < 0)
            return -1;
        if (!isfinite(f))
            return app_fail("%s: '%s' is not a finite number", spelled, v), -1;
        *(float *)o->target = f;
        return 0;
    }
    case APP_OPT_CUSTOM:
        return o->parse(spelled, v, o->target);
    }
    return -1;
}

/* The column of an option's help line before its text: "  -n, --n-predict N". */
static int option_column(const app_opt *o, int alias_shown, char *buf, size_t len) {
    int n = snprintf(buf, len, "  %s%c%s--%s%s%s%s%s", o->short_name ? "-" : "", o->short_name ? o->short_name : ' ',
                     o->short_name ? ", " : "", o->name, alias_shown ? ", --" : "", alias_shown ? o->alias : "",
                     o->arg ? " " : "", o->arg ? o->arg : "");
    if (!o->short_name) /* no short name: "  --model DIR", without the blank of the missing letter */
        memmove(buf + 2, buf + 3, strlen(buf + 3) + 1), n--;
    return n;
}

static void print_option(const app_opt *o, int alias_shown) {
    char left[160];
    int n = option_column(o, alias_shown, left, sizeof left);
    fputs(left, stdout);
    /* a name too long for the column puts its text on the lines below */
    int pad = n < HELP_COLUMN - 1 ? HELP_COLUMN - n : -1;
    if (pad < 0)
        putchar('\n');
    const char *text = o->help;
    for (int line = 0; text; line++) {
        const char *nl = strchr(text, '\n');
        int len = nl ? (int)(nl - text) : (int)strlen(text);
        printf("%*s%.*s\n", line || pad < 0 ? HELP_COLUMN : pad, "", len, text);
        text = nl ? nl + 1 : NULL;
    }
}

void app_opts_help(const app_opt_group *groups, size_t n_groups) {
    app_command_spec spec = {.groups = groups, .n_groups = n_groups};
    opt_ref refs[MAX_OPTS];
    size_t n = collect(&spec, refs);
    for (size_t g = 0; g < n_groups; g++) {
        int heading = 0;
        for (size_t i = 0; i < groups[g].n; i++) {
            const app_opt *o = &groups[g].opts[i];
            int shown = 0;
            for (size_t r = 0; r < n; r++)
                if (refs[r].opt == o)
                    shown = 1 + !refs[r].taken_alias;
            if (!shown)
                continue; /* shadowed by the command's own option of that name */
            if (!heading && groups[g].title)
                printf("%s%s\n", g ? "\n" : "", groups[g].title);
            heading = 1;
            print_option(o, o->alias && shown == 2);
        }
    }
    printf("\n  -h, --help         this text\n  --version          rlx's version and plugin ABI\n");
}

void app_print_version(void) {
    printf("rlx %s (librlx %s; plugin ABI %d.%d)\n", RLX_APP_VERSION, rlx_version(), RLX_ABI_MAJOR, RLX_ABI_MINOR);
}

/* How the parser's messages name the command: "generate: ... (see rlx generate --help)", and
 * for the options before a command "... (see rlx --help)". */
typedef struct command_names {
    char pre[48];  /* "generate: ", or "" */
    char who[48];  /* "rlx generate", or "rlx before a command" */
    char help[48]; /* "rlx generate --help", or "rlx --help" */
} command_names;

static command_names names_of(const char *cmd) {
    command_names c;
    snprintf(c.pre, sizeof c.pre, "%s%s", cmd ? cmd : "", cmd ? ": " : "");
    snprintf(c.who, sizeof c.who, "rlx %s", cmd ? cmd : "before a command");
    snprintf(c.help, sizeof c.help, "rlx %s%s--help", cmd ? cmd : "", cmd ? " " : "");
    return c;
}

/* An unknown long option, or an abbreviation of several (getopt_long takes a unique one). */
static int unknown_long(const command_names *cmd, const char *typed, const struct option *longs, size_t n) {
    size_t len = strcspn(typed + 2, "=");
    char matches[256] = "";
    int count = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(longs[i].name, typed + 2, len) == 0 && strlen(matches) + strlen(longs[i].name) + 5 < sizeof matches)
            snprintf(matches + strlen(matches), sizeof matches - strlen(matches), "%s--%s", count++ ? ", " : "",
                     longs[i].name);
    if (count > 1)
        return app_fail("%soption '%.*s' is ambiguous: %s (see %s)", cmd->pre, (int)len + 2, typed, matches, cmd->help);
    return app_fail("%sunknown option '%s' (see %s)", cmd->pre, typed, cmd->help);
}

/* llama.cpp's options spelled with one dash and several letters, which getopt would read as a
 * cluster of short options ("-ngl 99" as -n with the value "gl"). Each is rewritten to its long
 * name where the command takes that name (rlx keeps llama.cpp's long names where the meaning
 * agrees); any other is refused by name, with what rlx offers instead where it offers something.
 * The names are those of llama.cpp's common/arg.cpp. */
static const struct {
    const char *llama, *name, *instead;
} llama_spellings[] = {
    {"-ctk", "cache-type-k", NULL},
    {"-ctv", "cache-type-v", NULL},
    {"-ngl", "n-gpu-layers", NULL},
    {"-fa", "flash-attn", NULL},
    {"-ub", "ubatch-size", NULL},
    {"-np", "parallel", "rlx serve --parallel N"},
    {"-sys", "system-prompt", "rlx chat --system TEXT"},
    {"-sysf", "system-prompt-file", "rlx chat --system-prompt-file FILE"},
    {"-cnv", "conversation", "rlx chat"},
    {"-no-cnv", "no-conversation", "rlx generate, which continues a prompt without a chat template"},
    {"-mli", "multiline-input", "rlx chat: end a line with \\ to go on, or put the lines between two \"\"\" lines"},
    {"-st", "single-turn", "rlx generate --chat"},
    {"-if", "interactive-first", "rlx chat"},
    {"-tb", "threads-batch", "-t N, the threads of prompt and generation alike"},
    {"-hf", "hf-repo", "-m PATH of a model downloaded beforehand"},
    {"-hfr", "hf-repo", "-m PATH of a model downloaded beforehand"},
    {"-hff", "hf-file", "-m PATH of a model downloaded beforehand"},
    {"-hft", "hf-token", NULL},
    {"-mu", "model-url", "-m PATH of a model downloaded beforehand"},
    {"-dev", "device", "--plugin NAME: rlx runs on the CPU"},
    {"-sm", "split-mode", "rlx runs on the CPU"},
    {"-mg", "main-gpu", "rlx runs on the CPU"},
    {"-ts", "tensor-split", "--stages N to split the layers over processes"},
    {"-ot", "override-tensor", "--place OP=NAME"},
    {"-kvo", "kv-offload", "rlx runs on the CPU"},
    {"-nkvo", "no-kv-offload", "rlx runs on the CPU"},
    {"-cmoe", "cpu-moe", "rlx runs on the CPU"},
    {"-ncmoe", "n-cpu-moe", "rlx runs on the CPU"},
    {"-nr", "no-repack", NULL},
    {"-dio", "direct-io", NULL},
    {"-ndio", "no-direct-io", NULL},
    {"-lm", "load-mode", NULL},
    {"-co", "color", NULL},
    {"-sp", "special", NULL},
    {"-lv", "verbosity", "-v"},
    {"-to", "timeout", NULL},
    {"-cb", "cont-batching", NULL},
    {"-nocb", "no-cont-batching", NULL},
    {"-sps", "slot-prompt-similarity", NULL},
    {"-cram", "cache-ram", NULL},
    {"-ctxcp", "ctx-checkpoints", NULL},
    {"-kvu", "kv-unified", NULL},
    {"-no-kvu", "no-kv-unified", NULL},
    {"-dt", "defrag-thold", NULL},
    {"-rea", "reasoning", "--no-think"},
    {"-jf", "json-schema-file", NULL},
    {"-bf", "binary-file", NULL},
    {"-ptc", "print-token-count", NULL},
    {"-gan", "grp-attn-n", NULL},
    {"-gaw", "grp-attn-w", NULL},
    {"-mm", "mmproj", NULL},
    {"-mmu", "mmproj-url", NULL},
    {"-lcs", "lookup-cache-static", NULL},
    {"-lcd", "lookup-cache-dynamic", NULL},
    {"-bs", "backend-sampling", NULL},
    {"-Cr", "cpu-range", NULL},
    {"-Cb", "cpu-mask-batch", NULL},
    {"-Crb", "cpu-range-batch", NULL},
    {"-ag", "agent", NULL},
};

/* Whether the option word (not its value) makes the next argument its value: "--model" or
 * "-m", also at the end of a cluster ("-vm"), but not "--model=DIR" or "-mDIR". */
static int value_follows(const opt_ref *refs, size_t n, const char *word) {
    if (word[0] != '-' || !word[1])
        return 0;
    if (word[1] == '-') {
        if (strchr(word, '='))
            return 0;
        for (size_t i = 0; i < n; i++)
            if (same_name(refs[i].opt->name, word + 2) ||
                (!refs[i].taken_alias && same_name(refs[i].opt->alias, word + 2)))
                return refs[i].opt->arg != NULL;
        return 0;
    }
    for (const char *c = word + 1; *c; c++)
        for (size_t i = 0; i < n; i++)
            if (refs[i].opt->short_name == *c && refs[i].opt->arg)
                return c[1] == '\0'; /* a letter with a value takes the rest of the word, or the next one */
    return 0;
}

/* Rewrites llama.cpp's single-dash spellings in argv to the long names they stand for (or
 * refuses them, naming them); with stop_at_operand 1 only before the first operand. 0, or 1
 * after reporting. */
static int rewrite_llama_spellings(const command_names *cmd, const opt_ref *refs, size_t n, int argc, char **argv,
                                   int stop_at_operand) {
    static char longer[sizeof llama_spellings / sizeof llama_spellings[0]][40];
    /* llama.cpp's older -fa took no value: alone, it means on (its --flash-attn takes one) */
    static char flash_on[] = "--flash-attn=on";
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (argv[i][0] != '-' || !argv[i][1]) {
            if (stop_at_operand == 1)
                break;
            continue;
        }
        size_t k = 0;
        while (k < sizeof llama_spellings / sizeof llama_spellings[0] && strcmp(argv[i], llama_spellings[k].llama) != 0)
            k++;
        if (k == sizeof llama_spellings / sizeof llama_spellings[0]) {
            if (value_follows(refs, n, argv[i]))
                i++;
            continue;
        }
        const char *name = llama_spellings[k].name, *instead = llama_spellings[k].instead;
        if (!taken(refs, n, name, 0))
            return app_fail("%s'%s' is llama.cpp's --%s, which %s does not take%s%s (see %s)", cmd->pre, argv[i], name,
                            cmd->who, instead ? "; instead: " : "", instead ? instead : "", cmd->help);
        if (strcmp(name, "flash-attn") == 0 && !app_is_flash_attn_value(i + 1 < argc ? argv[i + 1] : NULL)) {
            argv[i] = flash_on;
            continue;
        }
        snprintf(longer[k], sizeof longer[k], "--%s", name);
        argv[i] = longer[k];
        if (value_follows(refs, n, argv[i]))
            i++;
    }
    return 0;
}

static int is_cluster(const char *word) { return word[0] == '-' && word[1] && word[1] != '-' && word[2]; }

/* The word of several letters after one dash in which getopt found the unknown letter c, or
 * NULL: getopt moves optind past a word once its last letter is read, and stays on it before. */
static const char *cluster_of(int argc, char **argv, int c) {
    if (optind > 0 && optind - 1 < argc && is_cluster(argv[optind - 1]) &&
        argv[optind - 1][strlen(argv[optind - 1]) - 1] == c)
        return argv[optind - 1];
    if (optind < argc && is_cluster(argv[optind]) && strchr(argv[optind] + 1, c))
        return argv[optind];
    return NULL;
}

int app_opts_parse(const app_command_spec *spec, int argc, char **argv, int stop_at_operand, int *first_operand) {
    opt_ref refs[MAX_OPTS];
    size_t n = collect(spec, refs);
    const command_names cmd = names_of(spec->name);
    if (rewrite_llama_spellings(&cmd, refs, n, argc, argv, stop_at_operand))
        return 1;
    /* each option's long name and alias, then --help and --version */
    struct option longs[2 * MAX_OPTS + 3];
    char shorts[3 + 2 * MAX_OPTS + 2];
    size_t nl = 0, ns = 0;
    if (stop_at_operand == 1)
        shorts[ns++] = '+';
    shorts[ns++] = ':'; /* report a missing value as ':', and let this code word every message */
    for (size_t i = 0; i < n; i++) {
        const app_opt *o = refs[i].opt;
        int has_arg = o->arg ? required_argument : no_argument;
        longs[nl++] = (struct option){o->name, has_arg, NULL, LONG_BASE + (int)i};
        if (o->alias && !refs[i].taken_alias)
            longs[nl++] = (struct option){o->alias, has_arg, NULL, LONG_BASE + (int)i};
        if (o->short_name && !taken(refs, i, NULL, o->short_name)) {
            shorts[ns++] = o->short_name;
            if (o->arg)
                shorts[ns++] = ':';
        }
    }
    const int help_val = LONG_BASE + MAX_OPTS, version_val = help_val + 1;
    longs[nl++] = (struct option){"help", no_argument, NULL, help_val};
    longs[nl++] = (struct option){"version", no_argument, NULL, version_val};
    longs[nl] = (struct option){0};
    shorts[ns++] = 'h';
    shorts[ns] = '\0';
    optind = 0; /* glibc: start over, as each command parses its own argv */
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, shorts, longs, NULL)) != -1;) {
        if (c == 'h' || c == help_val) {
            fputs(spec->usage, stdout);
            app_opts_help(spec->groups, spec->n_groups);
            return 2;
        }
        if (c == version_val) {
            app_print_version();
            return 2;
        }
        if (c == '?' || c == ':') {
            const char *typed = argv[optind - 1];
            if (c == ':')
                return app_fail("%soption %s needs a value (see %s)", cmd.pre, typed, cmd.help);
            if (optopt >= LONG_BASE)
                return app_fail("%soption --%s takes no value (see %s)", cmd.pre, refs[optopt - LONG_BASE].opt->name,
                                cmd.help);
            const char *cluster = optopt ? cluster_of(argc, argv, optopt) : NULL;
            if (cluster)
                return app_fail("%sunknown option '-%c' in '%s' (one dash takes one letter; --NAME is a long option; "
                                "see %s)",
                                cmd.pre, optopt, cluster, cmd.help);
            if (optopt)
                return app_fail("%sunknown option '-%c' (see %s)", cmd.pre, optopt, cmd.help);
            return unknown_long(&cmd, typed, longs, nl);
        }
        const app_opt *o = NULL;
        char spelled[80];
        if (c >= LONG_BASE) {
            o = refs[c - LONG_BASE].opt;
            /* the name as typed, so "--ctx" is not reported as "--ctx-size" */
            const char *typed = argv[optind - (o->arg && optarg == argv[optind - 1] ? 2 : 1)];
            snprintf(spelled, sizeof spelled, "%.*s", (int)strcspn(typed, "="), typed);
        } else {
            for (size_t i = 0; i < n && !o; i++)
                if (refs[i].opt->short_name == c)
                    o = refs[i].opt;
            snprintf(spelled, sizeof spelled, "-%c", c);
        }
        if (set_value(o, spelled, optarg) < 0)
            return 1;
        if (o->given)
            *o->given = 1;
    }
    if (stop_at_operand) {
        *first_operand = optind;
        return 0;
    }
    if (optind < argc)
        return app_fail("%sunexpected argument '%s' (see %s)", cmd.pre, argv[optind], cmd.help);
    return 0;
}
