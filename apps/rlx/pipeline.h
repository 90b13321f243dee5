/* Running a command over a pipeline of stages instead of one local session: options, launching
 * local stage processes, and the driver behind app_runtime's rlx_lm. */
#ifndef RLX_APP_PIPELINE_H
#define RLX_APP_PIPELINE_H

#include <stdint.h>

#include "opts.h"
#include "rlx/runtime.h"

typedef struct app_pipeline_options {
    const char *config;          /* --config FILE: a deployment file */
    uint32_t stages;             /* --stages N: launch N local stages on free loopback ports */
    int launch;                  /* --launch: start the config's local stages as child processes */
    const char *transport;       /* --transport NAME (overrides the file; default tcp) */
    uint32_t timeout_ms;         /* --timeout MS: control messages; 0 = the file's or the default */
    uint32_t connect_timeout_ms; /* --connect-timeout MS */
    uint32_t per_position_ms;    /* --compute-timeout MS: extra wait per position computed */
} app_pipeline_options;

struct app_runtime;
struct app_options;

/* The pipeline options as a group of an option table, writing into po. */
app_opt_group app_pipeline_group(app_pipeline_options *po);

/* True when any pipeline option was given (app_pipeline_open then reports incomplete ones). */
int app_pipeline_wanted(const app_pipeline_options *po);

/* The first half of opening a pipeline: checks the option combination and reads the deployment
 * file of --config, so what it configures (the speculator) is known before any stage runs.
 * 0 on success; 1 after reporting. rt must be zeroed; app_pipeline_close undoes it. */
int app_pipeline_load(struct app_runtime *rt, const app_pipeline_options *po);

/* The second half, after app_pipeline_load: checks the layer ranges against the model, launches
 * the local stages asked for and sets what ro needs to drive the pipeline (model, deployment,
 * stages, transport, timeouts). Launched stages divide the usable cores among themselves and,
 * when driver_computes (a speculator will run a backend here), this process, whose share lands
 * in *threads_share (0 otherwise); --threads and a stage's threads setting win over the share.
 * 0 on success; 1 after reporting (app_pipeline_close stops what was started). */
int app_pipeline_launch(struct app_runtime *rt, struct app_options *o, const app_pipeline_options *po,
                        int driver_computes, rlx_runtime_options *ro, uint32_t *threads_share);

/* Stops launched stages and frees the deployment; safe on a runtime without a pipeline. Call
 * after the runtime that drives the stages is closed. */
void app_pipeline_close(struct app_runtime *rt);

/* The deployment file the pipeline runs (generation defaults, speculator), or NULL when there is
 * no pipeline or it came from --stages. Borrowed from rt until app_pipeline_close. */
const struct rlx_deploy *app_pipeline_deploy(const struct app_runtime *rt);

/* One line per stage (address, layers, backend, resident memory) on stderr, for --verbose. */
void app_pipeline_describe(const struct app_runtime *rt);

int cmd_stage(int argc, char **argv, struct app_options *o);

#endif
