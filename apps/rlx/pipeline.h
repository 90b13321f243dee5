/* Running a command over a pipeline of stages instead of one local session: options, launching
 * local stage processes, and the driver behind app_runtime's rlx_lm. */
#ifndef RLX_APP_PIPELINE_H
#define RLX_APP_PIPELINE_H

#include <stdint.h>

#include "cli.h"
#include "rlx/runtime.h"

/* Stages this command launched and the deployment it drives (pipeline.c owns it). */
typedef struct app_pipeline app_pipeline;

/* The pipeline options as a group of an option table, writing into po. */
app_opt_group app_pipeline_group(app_pipeline_options *po);

/* True when any pipeline option was given (app_pipeline_open then reports incomplete ones). */
int app_pipeline_wanted(const app_pipeline_options *po);
/* 1 when a launcher (mpirun, srun) started this process as a rank that becomes a stage of the
 * --config file: it must open nothing of its own (rlx serve's HTTP port) before it does. */
int app_pipeline_stage_rank(const app_pipeline_options *po);

/* The first half of opening a pipeline: checks the option combination and reads the deployment
 * file of --config, so what it configures (the speculator) is known before any stage runs.
 * 0 on success with *out set; 1 after reporting (*out NULL). app_pipeline_close undoes it. */
int app_pipeline_load(app_pipeline **out, const app_pipeline_options *po);

/* The second half, after app_pipeline_load: checks the layer ranges against the model, launches
 * the local stages asked for and sets what ro needs to drive the pipeline (model, deployment,
 * stages, transport, timeouts). Launched stages divide the usable cores among themselves and,
 * when driver_computes (a speculator will run a backend here), this process, whose share lands
 * in *threads_share (0 otherwise); --threads and a stage's threads setting win over the share.
 * 0 on success; 1 after reporting (app_pipeline_close stops what was started). */
int app_pipeline_launch(app_pipeline *p, app_options *o, const app_pipeline_options *po, int driver_computes,
                        rlx_runtime_options *ro, uint32_t *threads_share);

/* Stops launched stages and frees the deployment; NULL is a no-op. Call after the runtime that
 * drives the stages is closed. */
void app_pipeline_close(app_pipeline *p);

/* The deployment file the pipeline runs (generation defaults, speculator), or NULL when p is
 * NULL or came from --stages. Borrowed until app_pipeline_close. */
const rlx_deploy *app_pipeline_deploy(const app_pipeline *p);
/* The model app_pipeline_launch opened for its metadata (configuration, tokenizer, sampling
 * defaults; none of its weights is read), or NULL when p is NULL or not launched. Borrowed
 * until app_pipeline_close. */
const rlx_model *app_pipeline_model(const app_pipeline *p);

/* One line per stage of the pipeline rt drives (address, layers, backend, resident memory) on
 * stderr, for --verbose. */
void app_pipeline_describe(const rlx_runtime *rt);

#endif
