/* rlx: run Qwen3 models on CPU through backend plugins. Dispatches to one command per verb;
 * options that every command shares may also come before the verb. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv, app_options *o);
    const char *summary;
} commands[] = {
    {"generate", cmd_generate, "continue a prompt given as text or token ids"},
    {"chat", cmd_chat, "talk with a model in the terminal"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"logits", cmd_logits, "write the logits of a prompt as raw float32"},
    {"bench", cmd_bench, "measure prefill and decode speed and peak memory"},
    {"perplexity", cmd_perplexity, "perplexity on a text, by llama.cpp's method"},
    {"graph", cmd_graph, "print the graph of a model and the backend of each node"},
    {"plugins", cmd_plugins, "list the plugins found"},
    {"stage", cmd_stage, "serve a layer range of a model to pipeline drivers"},
    {"quantize", cmd_quantize, "write a model as a GGUF file of a quantization type"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (batched generation)"},
};

/* "usage: ...", the commands and a note: what `rlx --help` prints above the shared options, or
 * (options_follow 0) what `rlx` alone prints, which points to --help for them. */
static void usage_text(char *buf, size_t len, int options_follow) {
    size_t n = (size_t)snprintf(buf, len, "usage: rlx [options] <command> [command options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "  %-10s %s\n", commands[i].name, commands[i].summary);
    if (n < len)
        snprintf(buf + n, len - n, "\n`rlx <command> --help` describes a command. %s",
                 options_follow ? "The options shared by the model\ncommands may also come before the command:\n\n"
                                : "`rlx --help` also lists the options\nshared by the model commands, which may come "
                                  "before the command too.\n");
}

/* OpenMP runtimes busy-wait at every barrier: libgomp, which the onednn backend runs on, spins
 * 300000 times (about 3 ms) by default, on cores another process or stage may need. It reads its
 * settings once, when it is loaded with the plugin, so they are bounded here, before any plugin is
 * loaded and while the process has one thread (setenv races with getenv in other threads).
 * 20000 spins are about 0.2 ms, like cpu-blas's spin_us default. A user's own setting wins. */
static void bound_openmp_spinning(void) {
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
        setenv("GOMP_SPINCOUNT", "20000", 0);
}

int main(int argc, char **argv) {
    bound_openmp_spinning();
    /* a closed stdout must end the program with an error, not kill it */
    signal(SIGPIPE, SIG_IGN);
    /* an F16 KV cache unless -ctk/-ctv say otherwise: llama.cpp's default, half F32's memory */
    app_options o = {.cache_type_k = RLX_DTYPE_F16, .cache_type_v = RLX_DTYPE_F16};
    char usage[2048];
    usage_text(usage, sizeof usage, 1);
    const app_opt_group groups[] = {app_common_group(&o), app_pipeline_group(&o.pipeline)};
    /* no name: rlx's own messages say "rlx: unknown option", not "rlx: rlx: ..." */
    app_command_spec spec = {.name = NULL, .usage = usage, .groups = groups, .n_groups = 2};
    int verb;
    int rc = app_opts_parse(&spec, argc, argv, 1, &verb);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (verb >= argc) {
        usage_text(usage, sizeof usage, 0);
        fputs(usage, stderr);
        return 1;
    }
    int i = verb;
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
        if (strcmp(argv[i], commands[c].name) == 0)
            return commands[c].run(argc - i, argv + i, &o);
    return app_fail("unknown command '%s' (see rlx --help)", argv[i]);
}
