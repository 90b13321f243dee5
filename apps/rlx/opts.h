/* Command-line options from tables: each command lists its options once, in groups, and the same
 * table drives glibc's getopt_long and prints the command's --help. */
#ifndef RLX_APP_OPTS_H
#define RLX_APP_OPTS_H

#include <stddef.h>
#include <stdint.h>

typedef enum app_opt_type {
    APP_OPT_FLAG,   /* int, set to 1 */
    APP_OPT_STRING, /* const char *, the argument itself (argv outlives the command) */
    APP_OPT_U32,    /* uint32_t, at least `min` */
    APP_OPT_INT,    /* int32_t, may be negative (-n -1) */
    APP_OPT_U64,    /* uint64_t */
    APP_OPT_FLOAT,  /* float, finite */
    APP_OPT_CUSTOM, /* parse(opt, value, target) does it all */
} app_opt_type;

typedef struct app_opt {
    char short_name;   /* 'n' for -n, 0 for none */
    const char *name;  /* long name without the dashes */
    const char *alias; /* a second long name kept for compatibility, or NULL */
    const char *arg;   /* the value's name in --help; NULL for an option without a value */
    const char *help;  /* '\n' continues the text on the next help line */
    app_opt_type type;
    void *target;
    int *given; /* set to 1 when the option appears; may be NULL */
    uint32_t min;
    /* APP_OPT_CUSTOM: `opt` is the spelling the user typed; 0 on success, -1 after reporting */
    int (*parse)(const char *opt, const char *value, void *target);
} app_opt;

typedef struct app_opt_group {
    const char *title; /* the heading of the group's help lines, NULL for none */
    const app_opt *opts;
    size_t n;
} app_opt_group;

#define APP_OPT_GROUP(title, array) ((app_opt_group){(title), (array), sizeof(array) / sizeof((array)[0])})

typedef struct app_command_spec {
    const char *name;  /* "generate": prefixes errors; NULL for rlx's own options, before a command */
    const char *usage; /* the --help text before the option lines */
    const app_opt_group *groups;
    size_t n_groups;
} app_command_spec;

/* Parses argv[1 .. argc) against the groups: an option named in an earlier group shadows a
 * later one with the same short or long name (a command's own -c over the shared one). --help,
 * -h and --version are answered here. Returns 0 when parsed, 1 after reporting an error and 2
 * after printing help or the version (the command then exits 0). With stop_at_operand, parsing
 * ends at the first argument that is no option and *first_operand is its index (argc if none);
 * with stop_at_operand 2 operands may stand anywhere: they are moved after the options (glibc's
 * permutation) and *first_operand is the index of the first; without it, an operand is an error.
 * llama.cpp's options of several letters after one dash (-ctk, -ngl, ...) are rewritten in argv to
 * the long names they stand for, or refused by name. */
int app_opts_parse(const app_command_spec *spec, int argc, char **argv, int stop_at_operand, int *first_operand);

/* Prints the option lines of the groups, each under its title. */
void app_opts_help(const app_opt_group *groups, size_t n_groups);

/* "rlx 0.2.0 (backend ABI 1.8, ...)" on stdout, for --version. */
void app_print_version(void);

#endif
