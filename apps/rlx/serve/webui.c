/* The chat page's files (webui.h): found by URL, answered with the headers a browser needs to
 * treat them as what they are and nothing more.
 *
 * The page shows model output, which is untrusted: besides its own sanitizing (webui/app.js),
 * the Content-Security-Policy lets it run only the scripts served here, load nothing from any
 * other origin, and talk to this server only, so that text which slipped through as markup
 * could neither run nor send the conversation anywhere. */
#include <microhttpd.h>
#include <string.h>

#include "serve/webui.h"

#define CSP                                                                                                            \
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; " \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static const struct {
    const char *suffix, *type;
} types[] = {
    {".js", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".svg", "image/svg+xml"},
};

static const char *content_type(const char *url) {
    const size_t n = strlen(url);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const size_t m = strlen(types[i].suffix);
        if (n >= m && strcmp(url + n - m, types[i].suffix) == 0)
            return types[i].type;
    }
    return "text/html; charset=utf-8"; /* "/", the page itself */
}

struct MHD_Response *serve_webui_response(const char *url, const char *if_none_match, unsigned *status) {
    const serve_webui_asset *a = NULL;
    for (size_t i = 0; i < serve_webui_n_assets && !a; i++)
        if (strcmp(serve_webui_assets[i].url, url) == 0)
            a = &serve_webui_assets[i];
    if (!a) {
        *status = 404;
        return NULL;
    }
    /* the ETags are quoted hex, so one found inside a list of them is that one */
    const int fresh = if_none_match && (strcmp(if_none_match, "*") == 0 || strstr(if_none_match, a->etag));
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        fresh ? 0 : a->len, fresh ? (void *)"" : (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        *status = 500;
        return NULL;
    }
    if (!fresh)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type(url));
    /* revalidated on every load, so a new binary's page is seen at once; the ETag makes that a 304 */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, a->etag);
    MHD_add_response_header(resp, "Content-Security-Policy", CSP);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    *status = fresh ? 304 : 200;
    return resp;
}
