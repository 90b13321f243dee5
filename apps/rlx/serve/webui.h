/* The chat page rlx serve shows at / (webui/: its HTML, CSS and script, with Debian's marked and
 * DOMPurify), embedded at build time: webui/embed.cmake writes serve_webui_assets into the build
 * tree, and webui.c answers GET / and /webui/NAME with them. */
#ifndef RLX_APP_SERVE_WEBUI_H
#define RLX_APP_SERVE_WEBUI_H

#include <stddef.h>

typedef struct serve_webui_asset {
    const char *url;  /* "/" or "/webui/NAME" */
    const char *etag; /* quoted, as the ETag header says it */
    const unsigned char *data;
    size_t len;
} serve_webui_asset;

extern const serve_webui_asset serve_webui_assets[];
extern const size_t serve_webui_n_assets;

struct MHD_Response;

/* The response to a GET (or HEAD) of url: the file with its Content-Type, Cache-Control, ETag
 * and a Content-Security-Policy that allows this origin only and no inline script; a 304 when
 * if_none_match (the request's If-None-Match, or NULL) names its ETag. NULL when url is none of
 * the page's files (*status 404) or out of memory (*status 500). */
struct MHD_Response *serve_webui_response(const char *url, const char *if_none_match, unsigned *status);

#endif
