/* rlx serve's HTTP side, on libmicrohttpd.
 *
 * Threading: a thread per connection (MHD_USE_THREAD_PER_CONNECTION), at most
 * --max-connections of them and --max-connections-per-ip of one address. A generation request
 * blocks its connection's thread while it waits for engine events, which is what makes every
 * wait simple to bound and a vanished client simple to notice: the waiting thread polls its own
 * socket between events for a reset and cancels the request at once. A FIN alone is no hang-up
 * (a client may half-close after its request and still read the answer): a stream then sends
 * an SSE comment, which a closed client's kernel answers with a reset. With MHD's internal
 * polling and suspended connections instead, a suspended connection is not watched at all, so a
 * client that closes while its request is queued or prefilling would hold its slot until the
 * next token. The number of connections worth having is small anyway (slots plus queue plus
 * idle keep-alives).
 *
 * Slow clients: MHD's own timeout (--timeout) counts from a connection's last byte, so a client
 * that sends a byte a second keeps it forever. A whole request (headers and body) must arrive
 * within --request-timeout of the connection's start or of its previous answer; the reaper
 * thread shuts down the sockets past that deadline.
 *
 * Browsers: a page on another origin may POST a text/plain body without a preflight, and a
 * DNS-rebinding page reaches the server under a name of its own. Without an API key, Host must
 * name the server (a loopback name, --host, or an IP address); with or without one, a request
 * whose Origin is not the server's own is refused unless --cors-origin allows it.
 *
 * Bodies: a Content-Length over --max-body is refused before any of the body is read; a
 * chunked body is counted as it arrives and never buffered beyond the limit. Every endpoint but
 * /health needs the API key when one is set, compared in constant time. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "serve.h"
#include "webui.h"

/* The size of the pieces a stream is sent in (MHD's buffer for the reader callback). */
#define STREAM_BLOCK 16384

/* A connection's deadline for its next request, on the daemon's list for the reaper. */
typedef struct conn_deadline {
    struct conn_deadline *prev, *next;
    int fd;
    double at; /* rlx__now_seconds() by which the request must be in; 0 while one is answered */
    int shut;  /* the reaper shut the socket down */
} conn_deadline;

struct serve_http {
    serve_server *server;
    struct MHD_Daemon *daemon;
    uint16_t port;
    atomic_uint answering; /* generation requests between submit and the end of their response */
    /* open connections, and the --max-connections past which they get a 503 at once: the daemon
     * itself admits SERVE_OVERFLOW_CONNECTIONS more, so a client over the limit hears why
     * rather than having its connection reset */
    atomic_uint connections;
    /* the connections' deadlines; MHD closes a socket only after its CLOSED notification, which
     * takes mu, so the reaper never shuts down a number reused by another connection */
    pthread_mutex_t mu;
    pthread_cond_t reaper_wake;
    conn_deadline *deadlines;
    int stopping;
    pthread_t reaper;
    int reaper_started;
};

// ---- errors and buffers ----

void serve_count_response(serve_server *s, unsigned code) {
    static const unsigned codes[] = {
#define SERVE_CODE_ENTRY(code) code,
        SERVE_STATUS_CODES(SERVE_CODE_ENTRY)
#undef SERVE_CODE_ENTRY
    };
    for (size_t i = 0; i < SERVE_N_STATUS_CODES; i++)
        if (codes[i] == code)
            atomic_fetch_add(&s->responses[i], 1);
}

// ---- one connection's request ----

typedef enum route {
    ROUTE_NONE = 0,
    ROUTE_HEALTH,
    ROUTE_MODELS,
    ROUTE_METRICS,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_LLAMA_COMPLETION, /* llama-server's /completion */
    ROUTE_ANTHROPIC,        /* Anthropic's /v1/messages */
    ROUTE_ANTHROPIC_COUNT,  /* /v1/messages/count_tokens */
    ROUTE_RESPONSES,        /* OpenAI's /v1/responses */
    ROUTE_MODEL,            /* /v1/models/{id} */
    ROUTE_PROPS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_APPLY_TEMPLATE,
    ROUTE_SLOTS,
    ROUTE_EMBEDDINGS,     /* llama-server's /embeddings, /embedding */
    ROUTE_EMBEDDINGS_OAI, /* /v1/embeddings */
    ROUTE_RERANK,         /* /v1/rerank and llama-server's aliases */
    ROUTE_WEBUI,          /* the chat page at / and its files under /webui/ */
} route;

typedef struct request {
    serve_http *http;
    struct MHD_Connection *connection;
    route route;
    const char *cors_origin; /* the allowed cross-origin request's Origin (MHD's copy), NULL otherwise */
    int answered;            /* a response was queued before the body was read */
    int too_large;
    serve_buf body;
    serve_job *job; /* a submitted generation */
    int counted;    /* counted in http->answering */
    serve_buf out;  /* a stream's bytes not yet handed to MHD */
    size_t out_pos;
    int stream_complete;
    int probed; /* a stream sent its SSE comment after the client's FIN */
} request;

#define GET_METHODS "GET, HEAD, OPTIONS"
#define POST_METHODS "POST, OPTIONS"

static const struct {
    const char *path;
    route route;
    const char *method;
    const char *allow; /* the Allow header: the method, HEAD for a GET, and OPTIONS for a preflight */
} routes[] = {
    {"/health", ROUTE_HEALTH, "GET", GET_METHODS},
    {"/v1/health", ROUTE_HEALTH, "GET", GET_METHODS},
    {"/v1/models", ROUTE_MODELS, "GET", GET_METHODS},
    {"/models", ROUTE_MODELS, "GET", GET_METHODS},
    {"/metrics", ROUTE_METRICS, "GET", GET_METHODS},
    {"/v1/chat/completions", ROUTE_CHAT, "POST", POST_METHODS},
    {"/chat/completions", ROUTE_CHAT, "POST", POST_METHODS},
    {"/v1/completions", ROUTE_COMPLETIONS, "POST", POST_METHODS},
    {"/completions", ROUTE_COMPLETIONS, "POST", POST_METHODS},
    {"/completion", ROUTE_LLAMA_COMPLETION, "POST", POST_METHODS},
    {"/v1/messages", ROUTE_ANTHROPIC, "POST", POST_METHODS},
    {"/v1/messages/count_tokens", ROUTE_ANTHROPIC_COUNT, "POST", POST_METHODS},
    {"/v1/responses", ROUTE_RESPONSES, "POST", POST_METHODS},
    {"/responses", ROUTE_RESPONSES, "POST", POST_METHODS},
    {"/v1/models/", ROUTE_MODEL, "GET", GET_METHODS}, /* a prefix: the model's id follows */
    {"/models/", ROUTE_MODEL, "GET", GET_METHODS},
    {"/props", ROUTE_PROPS, "GET", GET_METHODS},
    {"/tokenize", ROUTE_TOKENIZE, "POST", POST_METHODS},
    {"/detokenize", ROUTE_DETOKENIZE, "POST", POST_METHODS},
    {"/apply-template", ROUTE_APPLY_TEMPLATE, "POST", POST_METHODS},
    {"/slots", ROUTE_SLOTS, "GET", GET_METHODS},
    {"/v1/embeddings", ROUTE_EMBEDDINGS_OAI, "POST", POST_METHODS},
    {"/embeddings", ROUTE_EMBEDDINGS, "POST", POST_METHODS},
    {"/embedding", ROUTE_EMBEDDINGS, "POST", POST_METHODS},
    {"/v1/rerank", ROUTE_RERANK, "POST", POST_METHODS},
    {"/rerank", ROUTE_RERANK, "POST", POST_METHODS},
    {"/reranking", ROUTE_RERANK, "POST", POST_METHODS},
    {"/v1/reranking", ROUTE_RERANK, "POST", POST_METHODS},
    {"/", ROUTE_WEBUI, "GET", GET_METHODS},
    {"/webui/", ROUTE_WEBUI, "GET", GET_METHODS}, /* a prefix: the page's files */
};

/* Whether url is routes[i]'s path, or for a prefix (a path past "/" ending in '/', as
 * /v1/models/{id}) starts with it and names something after it. */
static int route_matches(size_t i, const char *url) {
    const size_t n = strlen(routes[i].path);
    if (n == 1 || routes[i].path[n - 1] != '/')
        return strcmp(url, routes[i].path) == 0;
    return strncmp(url, routes[i].path, n) == 0 && url[n];
}

static const char *route_allow(route rt) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (routes[i].route == rt)
            return routes[i].allow;
    return NULL;
}

/* The headers every response of r carries: CORS's for an allowed cross-origin request. */
static void add_common_headers(const request *r, struct MHD_Response *resp) {
    if (!r->cors_origin)
        return;
    const serve_server *s = r->http->server;
    int any = 0;
    for (size_t i = 0; i < s->n_cors_origins; i++)
        any |= strcmp(s->cors_origins[i], "*") == 0;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", any ? "*" : r->cors_origin);
    if (!any)
        MHD_add_response_header(resp, "Vary", "Origin");
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "Retry-After");
}

static enum MHD_Result queue(request *r, unsigned status, const char *type, const char *body, size_t len) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    add_common_headers(r, resp);
    enum MHD_Result rc = MHD_queue_response(r->connection, status, resp);
    MHD_destroy_response(resp);
    serve_count_response(r->http->server, status);
    return rc;
}

static enum MHD_Result queue_json(request *r, unsigned status, char *json) {
    if (!json)
        return MHD_NO;
    enum MHD_Result rc = queue(r, status, "application/json", json, strlen(json));
    free(json);
    return rc;
}

static enum MHD_Result queue_error(request *r, const serve_error *e) {
    const int anthropic = r->route == ROUTE_ANTHROPIC || r->route == ROUTE_ANTHROPIC_COUNT;
    char *json = anthropic ? serve_anthropic_error_json(e) : serve_error_json(e);
    if (!json)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    char seconds[16];
    if (e->retry_after) {
        snprintf(seconds, sizeof seconds, "%u", e->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, seconds);
    }
    if (e->status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (e->status == 405)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, route_allow(r->route));
    add_common_headers(r, resp);
    enum MHD_Result rc = MHD_queue_response(r->connection, e->status, resp);
    MHD_destroy_response(resp);
    serve_count_response(r->http->server, e->status);
    if ((r->route == ROUTE_CHAT || r->route == ROUTE_COMPLETIONS || r->route == ROUTE_LLAMA_COMPLETION ||
         r->route == ROUTE_ANTHROPIC || r->route == ROUTE_RESPONSES) &&
        e->status >= 400 && e->status < 500)
        atomic_fetch_add(&r->http->server->invalid_requests, 1);
    return rc;
}

/* Compares the whole of both strings whatever they hold, so the time taken tells nothing of
 * how much of a guess was right (only the key's length, which the loop runs over). */
static int same_secret(const char *given, size_t given_len, const char *key, size_t key_len) {
    unsigned char diff = given_len != key_len;
    for (size_t i = 0; i < key_len; i++)
        diff |= (unsigned char)((i < given_len ? given[i] : 0) ^ key[i]);
    return diff == 0;
}

static int authorized(request *r, serve_error *e) {
    const serve_server *s = r->http->server;
    /* the page holds no secret: it is what asks for the key, which its API calls then send */
    if (!s->api_key || r->route == ROUTE_HEALTH || r->route == ROUTE_WEBUI)
        return 1;
    const char *auth = MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    /* Anthropic's clients send the key as x-api-key */
    const char *x_key = auth ? NULL : MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, "x-api-key");
    if (x_key) {
        if (same_secret(x_key, strlen(x_key), s->api_key, s->api_key_len))
            return 1;
        serve_error_set(e, 401, "authentication_error", "invalid_api_key", "", "the API key is not valid");
        return 0;
    }
    if (!auth) {
        serve_error_set(e, 401, "authentication_error", "missing_api_key", "",
                        "no API key given: send the header 'Authorization: Bearer KEY' (or 'x-api-key: KEY')");
        return 0;
    }
    if (strncasecmp(auth, "Bearer ", 7) != 0) {
        serve_error_set(e, 401, "authentication_error", "invalid_api_key", "",
                        "the Authorization header must be 'Bearer KEY'");
        return 0;
    }
    const char *given = auth + 7 + strspn(auth + 7, " ");
    if (!same_secret(given, strlen(given), s->api_key, s->api_key_len)) {
        serve_error_set(e, 401, "authentication_error", "invalid_api_key", "", "the API key is not valid");
        return 0;
    }
    return 1;
}

/* The host of an authority, "host", "host:port" or "[v6]:port", without brackets; 0 when it
 * is none or does not fit size. */
static int authority_host(const char *authority, char *host, size_t size) {
    const char *end;
    if (authority[0] == '[') {
        end = strchr(++authority, ']');
        if (!end || (end[1] && end[1] != ':'))
            return 0;
    } else {
        end = authority + strcspn(authority, ":");
    }
    const size_t n = (size_t)(end - authority);
    if (n == 0 || n >= size)
        return 0;
    memcpy(host, authority, n);
    host[n] = '\0';
    return 1;
}

/* Whether a Host header names this server: a loopback name or address, --host's value, or any
 * IP address when --host is every interface's. A DNS-rebinding page reaches the server only
 * under a DNS name of its own, never under an address. */
static int host_allowed(const serve_server *s, const char *host_header) {
    char host[256];
    if (!authority_host(host_header, host, sizeof host))
        return 0;
    struct in_addr v4, listen_v4;
    struct in6_addr v6, listen_v6;
    const int ip4 = inet_pton(AF_INET, host, &v4) == 1, ip6 = inet_pton(AF_INET6, host, &v6) == 1;
    if (strcasecmp(host, "localhost") == 0 || (ip4 && ntohl(v4.s_addr) >> 24 == 127) ||
        (ip6 && IN6_IS_ADDR_LOOPBACK(&v6)))
        return 1;
    const char *listen = s->listen_host ? s->listen_host : "";
    if (strcasecmp(host, listen) == 0)
        return 1;
    const int every_interface = (inet_pton(AF_INET, listen, &listen_v4) == 1 && listen_v4.s_addr == INADDR_ANY) ||
                                (inet_pton(AF_INET6, listen, &listen_v6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&listen_v6));
    return every_interface && (ip4 || ip6);
}

/* The authority of an Origin of the web (what follows http:// or https://), or NULL. */
static const char *origin_authority(const char *origin) {
    return strncasecmp(origin, "http://", 7) == 0    ? origin + 7
           : strncasecmp(origin, "https://", 8) == 0 ? origin + 8
                                                     : NULL;
}

/* Whether Origin is the origin the request was sent to: a browser's same-origin request. */
static int same_origin(const char *origin, const char *host_header) {
    const char *authority = origin_authority(origin);
    return authority && host_header && strcasecmp(authority, host_header) == 0;
}

/* An Origin whose host is localhost, 127.0.0.1 or [::1], with any scheme of the web and port. */
static int origin_is_localhost(const char *origin) {
    const char *a = origin_authority(origin);
    char host[16];
    if (!a || !authority_host(a, host, sizeof host))
        return 0;
    const char *port = a[0] == '[' ? strchr(a, ']') + 1 : a + strcspn(a, ":");
    if (*port && (port[1] == '\0' || port[1 + strspn(port + 1, "0123456789")] != '\0'))
        return 0;
    return strcasecmp(host, "localhost") == 0 || strcmp(host, "127.0.0.1") == 0 || strcmp(host, "::1") == 0;
}

static int cors_allowed(const serve_server *s, const char *origin) {
    for (size_t i = 0; i < s->n_cors_origins; i++)
        if (strcmp(s->cors_origins[i], "*") == 0 || strcasecmp(s->cors_origins[i], origin) == 0 ||
            (strcmp(s->cors_origins[i], "localhost") == 0 && origin_is_localhost(origin)))
            return 1;
    return 0;
}

/* Host and Origin, which a browser sets and a page cannot: 1 when e holds the refusal. */
static int browser_error(request *r, serve_error *e) {
    const serve_server *s = r->http->server;
    const char *host = MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    /* with a key, a page that reaches the server under another name still lacks the key */
    if (!s->api_key && host && !host_allowed(s, host)) {
        serve_error_set(e, 400, "invalid_request_error", "host_not_allowed", "",
                        "Host '%.200s' is not a name of this server: without an API key it answers to localhost, "
                        "loopback addresses and --host only (a proxy in front should send one of them)",
                        host);
        return 1;
    }
    const char *origin = MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, "Origin");
    if (!origin || same_origin(origin, host))
        return 0;
    if (cors_allowed(s, origin)) {
        r->cors_origin = origin;
        return 0;
    }
    serve_error_set(e, 403, "invalid_request_error", "origin_not_allowed", "",
                    "cross-origin request from '%.200s' refused: start the server with --cors-origin %.200s to "
                    "serve it",
                    origin, origin);
    return 1;
}

/* The answer to a CORS preflight (or any OPTIONS): the methods, and for an allowed origin the
 * request headers it asked for. */
static enum MHD_Result preflight(request *r) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    const char *allow = route_allow(r->route);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (r->cors_origin) {
        const char *asked =
            MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", asked ? asked : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    add_common_headers(r, resp);
    enum MHD_Result rc = MHD_queue_response(r->connection, 204, resp);
    MHD_destroy_response(resp);
    serve_count_response(r->http->server, 204);
    return rc;
}

/* What can be said before the body arrives: Host and Origin, the path, the method, the key, the
 * phase and a declared length. 1 when e holds the answer. */
static int early_error(request *r, const char *url, const char *method, serve_error *e) {
    const serve_server *s = r->http->server;
    if (browser_error(r, e))
        return 1;
    const char *method_wanted = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !r->route; i++)
        if (route_matches(i, url)) {
            r->route = routes[i].route;
            method_wanted = routes[i].method;
        }
    if (r->route == ROUTE_WEBUI && s->no_webui) {
        serve_error_set(e, 404, "invalid_request_error", "not_found", "",
                        "no page %.200s: the chat page is off (--no-webui)", url);
        return 1;
    }
    if (!r->route) {
        serve_error_set(
            e, 404, "invalid_request_error", "not_found", "",
            "no endpoint %.200s (this server has /v1/chat/completions, /v1/completions, /v1/models, /v1/embeddings, "
            "/v1/rerank, /v1/responses, /health, /metrics, Anthropic's /v1/messages, and llama-server's /completion, "
            "/props, /slots, /tokenize, /detokenize, /apply-template and /embeddings)",
            url);
        return 1;
    }
    const int head = strcmp(method, "HEAD") == 0 && strcmp(method_wanted, "GET") == 0;
    if (strcmp(method, method_wanted) != 0 && !head && strcmp(method, "OPTIONS") != 0) {
        serve_error_set(e, 405, "invalid_request_error", "method_not_allowed", "", "%s takes %s, not %s", url,
                        method_wanted, method);
        return 1;
    }
    if (strcmp(method, "OPTIONS") == 0) /* a preflight carries no key: browsers send it without */
        return 0;
    if (!authorized(r, e))
        return 1;
    if (r->route != ROUTE_HEALTH && atomic_load(&r->http->connections) > s->max_connections) {
        serve_error_set(e, 503, "server_error", "too_many_connections", "",
                        "%u connections are open, over the limit of %u (--max-connections); retry shortly",
                        atomic_load(&r->http->connections), s->max_connections);
        e->retry_after = 1;
        return 1;
    }
    const int phase = atomic_load(&s->phase);
    /* the page loads while the model does; its API calls hear the 503 */
    if (phase != SERVE_READY && r->route != ROUTE_HEALTH && r->route != ROUTE_WEBUI) {
        serve_error_set(e, 503, "server_error", phase == SERVE_LOADING ? "loading" : "shutting_down", "",
                        phase == SERVE_LOADING ? "the model is loading" : "the server is shutting down");
        e->retry_after = phase == SERVE_LOADING ? 5 : 0;
        return 1;
    }
    const char *length = MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length && strtoull(length, NULL, 10) > s->max_body) {
        serve_error_set(e, 413, "invalid_request_error", "request_too_large", "",
                        "the body of %s bytes is over the limit of %zu (--max-body)", length, s->max_body);
        return 1;
    }
    return 0;
}

// ---- the simple endpoints ----

static enum MHD_Result health(request *r) {
    const int phase = atomic_load(&r->http->server->phase);
    if (phase == SERVE_READY)
        return queue(r, 200, "application/json", "{\"status\":\"ok\"}", 15);
    serve_error e;
    serve_error_set(&e, 503, "server_error", phase == SERVE_LOADING ? "loading" : "shutting_down", "",
                    phase == SERVE_LOADING ? "the model is loading" : "the server is shutting down");
    return queue_error(r, &e);
}

/* The model in OpenAI's shape. */
static cJSON *model_object(const serve_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "rlx");
    return m;
}

static enum MHD_Result models(request *r) {
    const serve_server *s = r->http->server;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *m = model_object(s);
    if (!cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m))
        cJSON_Delete(m);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return queue_json(r, 200, json);
}

/* GET /v1/models/{id}: the model under its id, as the list shows it, else a 404. */
static enum MHD_Result model(request *r, const char *url) {
    const serve_server *s = r->http->server;
    const char *id = strstr(url, "/models/") + strlen("/models/"); /* both routes' prefixes end so */
    if (strcmp(id, s->model_id) != 0) {
        serve_error e;
        serve_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                        "the model '%.200s' does not exist: this server has '%.200s'", id, s->model_id);
        return queue_error(r, &e);
    }
    cJSON *m = model_object(s);
    char *json = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    return queue_json(r, 200, json);
}

/* POST /tokenize, /detokenize, /apply-template: answered here, without the engine. */
static enum MHD_Result native(request *r) {
    const serve_native ep = r->route == ROUTE_TOKENIZE     ? SERVE_TOKENIZE
                            : r->route == ROUTE_DETOKENIZE ? SERVE_DETOKENIZE
                                                           : SERVE_APPLY_TEMPLATE;
    serve_error e;
    char *json = serve_native_answer(r->http->server, ep, r->body.data ? r->body.data : "", r->body.len, &e);
    return json ? queue_json(r, 200, json) : queue_error(r, &e);
}

static void metric(serve_buf *b, const char *name, const char *type, const char *help) {
    serve_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value in Prometheus's text format: backslash, quote and newline escaped. */
static void label_value(serve_buf *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            serve_buf_printf(b, "\\%c", *v);
        else if (*v == '\n')
            serve_buf_printf(b, "\\n");
        else
            serve_buf_printf(b, "%c", *v);
    }
}

/* `name{stage="i",address="...",layers="a-b"` of stage i, left open for more labels. */
static void stage_series(serve_buf *b, const char *name, uint32_t i, const rlx_driver_stage_info *info) {
    serve_buf_printf(b, "%s{stage=\"%u\",address=\"", name, i);
    label_value(b, info->address);
    serve_buf_printf(b, "\",layers=\"%u-%u\"", info->layers.start, info->layers.end - 1);
}

/* Over a pipeline: each stage's forward steps, their wall time (compute and both transfers, as
 * the driver sees it) and the bytes each way. */
static void pipeline_metrics(serve_buf *b, const rlx_driver *d) {
    const uint32_t n = rlx_driver_n_stages(d);
    rlx_driver_stage_info info[n ? n : 1];
    rlx_driver_stage_stats st[n ? n : 1];
    for (uint32_t i = 0; i < n; i++)
        if (rlx_driver_stage_info_of(d, i, &info[i]) != RLX_OK || rlx_driver_stage_stats_of(d, i, &st[i]) != RLX_OK)
            return;
    metric(b, "rlx_pipeline_stage_step_seconds", "summary",
           "Forward steps of each pipeline stage: seconds from sending a step to the stage's answer.");
    for (uint32_t i = 0; i < n; i++) {
        stage_series(b, "rlx_pipeline_stage_step_seconds_sum", i, &info[i]);
        serve_buf_printf(b, "} %.6f\n", st[i].seconds);
        stage_series(b, "rlx_pipeline_stage_step_seconds_count", i, &info[i]);
        serve_buf_printf(b, "} %llu\n", (unsigned long long)st[i].steps);
    }
    metric(b, "rlx_pipeline_stage_last_step_seconds", "gauge", "Seconds of each pipeline stage's latest forward step.");
    for (uint32_t i = 0; i < n; i++) {
        stage_series(b, "rlx_pipeline_stage_last_step_seconds", i, &info[i]);
        serve_buf_printf(b, "} %.6f\n", st[i].last_seconds);
    }
    metric(b, "rlx_pipeline_stage_max_step_seconds", "gauge", "Seconds of each pipeline stage's slowest forward step.");
    for (uint32_t i = 0; i < n; i++) {
        stage_series(b, "rlx_pipeline_stage_max_step_seconds", i, &info[i]);
        serve_buf_printf(b, "} %.6f\n", st[i].max_seconds);
    }
    metric(b, "rlx_pipeline_stage_bytes_total", "counter",
           "Bytes the driver sent to and received from each pipeline stage.");
    for (uint32_t i = 0; i < n; i++) {
        stage_series(b, "rlx_pipeline_stage_bytes_total", i, &info[i]);
        serve_buf_printf(b, ",direction=\"sent\"} %llu\n", (unsigned long long)st[i].bytes_sent);
        stage_series(b, "rlx_pipeline_stage_bytes_total", i, &info[i]);
        serve_buf_printf(b, ",direction=\"received\"} %llu\n", (unsigned long long)st[i].bytes_received);
    }
    rlx_driver_stats all;
    rlx_driver_stats_of(d, &all);
    metric(b, "rlx_pipeline_recovery_seconds", "summary",
           "Stages lost and replaced (their streams replayed): the seconds each recovery took.");
    serve_buf_printf(b, "rlx_pipeline_recovery_seconds_sum %.6f\n", all.recovery_seconds);
    serve_buf_printf(b, "rlx_pipeline_recovery_seconds_count %llu\n", (unsigned long long)all.recoveries);
    metric(b, "rlx_pipeline_last_recovery_seconds", "gauge", "Seconds the latest recovery of a lost stage took.");
    serve_buf_printf(b, "rlx_pipeline_last_recovery_seconds %.6f\n", all.last_recovery_seconds);
}

static enum MHD_Result metrics(request *r) {
    serve_server *s = r->http->server;
    rlx_engine_stats st;
    rlx_engine_stats_of(s->engine, &st);
    serve_buf b = {0};
    metric(&b, "rlx_requests_total", "counter", "Generation requests by outcome.");
    serve_buf_printf(&b, "rlx_requests_total{outcome=\"completed\"} %llu\n", (unsigned long long)st.requests_done);
    serve_buf_printf(&b, "rlx_requests_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)st.requests_cancelled);
    serve_buf_printf(&b, "rlx_requests_total{outcome=\"failed\"} %llu\n", (unsigned long long)st.requests_failed);
    serve_buf_printf(&b, "rlx_requests_total{outcome=\"refused\"} %llu\n", (unsigned long long)st.requests_refused);
    serve_buf_printf(&b, "rlx_requests_total{outcome=\"invalid\"} %llu\n",
                     (unsigned long long)atomic_load(&s->invalid_requests));
    metric(&b, "rlx_http_responses_total", "counter", "HTTP responses by status code.");
    static const unsigned codes[] = {
#define SERVE_CODE_ENTRY(code) code,
        SERVE_STATUS_CODES(SERVE_CODE_ENTRY)
#undef SERVE_CODE_ENTRY
    };
    for (size_t i = 0; i < SERVE_N_STATUS_CODES; i++)
        serve_buf_printf(&b, "rlx_http_responses_total{code=\"%u\"} %llu\n", codes[i],
                         (unsigned long long)atomic_load(&s->responses[i]));
    metric(&b, "rlx_prompt_tokens_total", "counter", "Prompt tokens of the requests admitted.");
    serve_buf_printf(&b, "rlx_prompt_tokens_total %llu\n", (unsigned long long)st.prompt_tokens);
    metric(&b, "rlx_prompt_tokens_cached_total", "counter", "Prompt tokens taken from a cached prefix.");
    serve_buf_printf(&b, "rlx_prompt_tokens_cached_total %llu\n", (unsigned long long)st.cached_tokens);
    metric(&b, "rlx_generated_tokens_total", "counter", "Tokens generated.");
    serve_buf_printf(&b, "rlx_generated_tokens_total %llu\n", (unsigned long long)st.generated_tokens);
    metric(&b, "rlx_engine_steps_total", "counter", "Forward passes of the engine.");
    serve_buf_printf(&b, "rlx_engine_steps_total %llu\n", (unsigned long long)st.steps);
    metric(&b, "rlx_engine_busy_seconds_total", "counter", "Seconds spent in forward passes and sampling.");
    serve_buf_printf(&b, "rlx_engine_busy_seconds_total %.6f\n", st.busy_seconds);
    metric(&b, "rlx_generated_tokens_per_second", "gauge",
           "Generated tokens per busy second since the start (rate() of the counters gives recent ones).");
    serve_buf_printf(&b, "rlx_generated_tokens_per_second %.3f\n",
                     st.busy_seconds > 0 ? (double)st.generated_tokens / st.busy_seconds : 0.0);
    pthread_mutex_lock(&s->latency_mu);
    const serve_latency lat = s->latency;
    pthread_mutex_unlock(&s->latency_mu);
    metric(&b, "rlx_request_stage_seconds", "summary",
           "Seconds the finished requests spent per stage: queue (waiting for a slot), prompt (from admission to "
           "the first token), decode (from the first token to the last).");
    serve_buf_printf(&b, "rlx_request_stage_seconds_sum{stage=\"queue\"} %.6f\n", lat.queue);
    serve_buf_printf(&b, "rlx_request_stage_seconds_count{stage=\"queue\"} %llu\n", (unsigned long long)lat.requests);
    serve_buf_printf(&b, "rlx_request_stage_seconds_sum{stage=\"prompt\"} %.6f\n", lat.prompt);
    serve_buf_printf(&b, "rlx_request_stage_seconds_count{stage=\"prompt\"} %llu\n", (unsigned long long)lat.requests);
    serve_buf_printf(&b, "rlx_request_stage_seconds_sum{stage=\"decode\"} %.6f\n", lat.decode);
    serve_buf_printf(&b, "rlx_request_stage_seconds_count{stage=\"decode\"} %llu\n", (unsigned long long)lat.requests);
    metric(&b, "rlx_requests_running", "gauge", "Requests holding a slot.");
    serve_buf_printf(&b, "rlx_requests_running %u\n", st.running);
    metric(&b, "rlx_requests_queued", "gauge", "Requests waiting for a slot.");
    serve_buf_printf(&b, "rlx_requests_queued %u\n", st.queued);
    metric(&b, "rlx_slots", "gauge", "Sequences the engine runs at once (--parallel).");
    serve_buf_printf(&b, "rlx_slots %u\n", st.n_slots);
    metric(&b, "rlx_kv_cache_positions", "gauge", "KV cache positions in all slots.");
    serve_buf_printf(&b, "rlx_kv_cache_positions %llu\n", (unsigned long long)st.n_slots * st.slot_positions);
    metric(&b, "rlx_kv_cache_positions_used", "gauge", "KV cache positions holding a sequence now.");
    serve_buf_printf(&b, "rlx_kv_cache_positions_used %llu\n", (unsigned long long)st.kv_positions_used);
    metric(&b, "rlx_kv_cache_usage_ratio", "gauge", "The used share of the KV cache (0 to 1).");
    const double total = (double)st.n_slots * st.slot_positions;
    serve_buf_printf(&b, "rlx_kv_cache_usage_ratio %.6f\n", total > 0 ? (double)st.kv_positions_used / total : 0.0);
    uint64_t kv_bytes, state_bytes;
    rlx_engine_memory(s->engine, &kv_bytes, &state_bytes);
    if (kv_bytes + state_bytes) { /* known for the batched engine; a pipeline's is in its stages */
        metric(&b, "rlx_kv_cache_bytes", "gauge", "Bytes of the KV rows of all slots.");
        serve_buf_printf(&b, "rlx_kv_cache_bytes %llu\n", (unsigned long long)kv_bytes);
        metric(&b, "rlx_recurrent_state_bytes", "gauge",
               "Bytes of the recurrent states of all slots (linear-attention layers).");
        serve_buf_printf(&b, "rlx_recurrent_state_bytes %llu\n", (unsigned long long)state_bytes);
    }
    if (s->driver)
        pipeline_metrics(&b, s->driver);
    if (b.failed) {
        serve_buf_free(&b);
        return MHD_NO;
    }
    enum MHD_Result rc = queue(r, 200, "text/plain; version=0.0.4", b.data, b.len);
    serve_buf_free(&b);
    return rc;
}

// ---- generation ----

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info ? info->connect_fd : -1;
}

/* MHD times a connection out from its last send or receive; a long wait for the engine is
 * activity of ours, so the clock restarts after it. */
static void restart_idle_clock(request *r) {
    MHD_set_connection_option(r->connection, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)r->http->server->timeout_s);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    request *r = cls;
    for (;;) {
        if (r->out_pos < r->out.len) {
            size_t n = r->out.len - r->out_pos < max ? r->out.len - r->out_pos : max;
            memcpy(buf, r->out.data + r->out_pos, n);
            r->out_pos += n;
            if (r->out_pos == r->out.len)
                r->out.len = r->out_pos = 0;
            return (ssize_t)n;
        }
        if (r->out.failed)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r->stream_complete)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (serve_job_stream(r->job, &r->out)) {
            r->stream_complete = 1;
            continue;
        }
        if (r->out.len)
            continue;
        serve_wait w = serve_job_wait(r->job, connection_fd(r->connection), r->http->server->timeout_s, !r->probed);
        restart_idle_clock(r);
        if (w == SERVE_WAIT_HANGUP)
            return MHD_CONTENT_READER_END_WITH_ERROR; /* the completion callback cancels the job */
        if (w == SERVE_WAIT_PEER_SHUTDOWN) {
            /* a comment, which SSE clients skip: a half-closed client reads on, a closed one's
             * kernel answers with a reset that the next wait sees */
            r->probed = 1;
            serve_buf_append(&r->out, ":\n\n", 3);
            continue;
        }
        if (w == SERVE_WAIT_TIMEOUT) {
            serve_error e;
            serve_error_set(&e, 504, "server_error", "timeout", "", "no progress for %u s (--timeout)",
                            r->http->server->timeout_s);
            char *json = serve_error_json(&e);
            serve_buf_append(&r->out, "data: ", 6);
            serve_buf_append(&r->out, json ? json : "{}", json ? strlen(json) : 2);
            serve_buf_append(&r->out, "\n\ndata: [DONE]\n\n", 16);
            free(json);
            r->stream_complete = 1;
        }
    }
}

/* GET / and /webui/NAME: the chat page's files (webui.c), a 404 for a name it lacks. */
static enum MHD_Result webui(request *r, const char *url) {
    const char *etags = MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    unsigned status;
    struct MHD_Response *resp = serve_webui_response(url, etags, &status);
    if (!resp) {
        serve_error e;
        if (status == 404)
            serve_error_set(&e, 404, "invalid_request_error", "not_found", "", "no file %.200s in the chat page", url);
        else
            serve_error_set(&e, 500, "server_error", NULL, "", "out of memory");
        return queue_error(r, &e);
    }
    add_common_headers(r, resp);
    enum MHD_Result rc = MHD_queue_response(r->connection, status, resp);
    MHD_destroy_response(resp);
    serve_count_response(r->http->server, status);
    return rc;
}

/* POST /v1/embeddings, /embeddings and /v1/rerank (embeddings.c): the connection's thread waits
 * for the engine's worker to run them, as a generation's does. */
static enum MHD_Result embeddings(request *r) {
    serve_server *s = r->http->server;
    serve_error e;
    const char *body = r->body.data ? r->body.data : "";
    const int fd = connection_fd(r->connection);
    char *json = r->route == ROUTE_RERANK
                     ? serve_rerank_answer(s, body, r->body.len, fd, &e)
                     : serve_embeddings_answer(s, r->route == ROUTE_EMBEDDINGS_OAI, body, r->body.len, fd, &e);
    restart_idle_clock(r);
    if (!json && e.status == 0)
        return MHD_NO; /* the client hung up */
    return json ? queue_json(r, 200, json) : queue_error(r, &e);
}

/* GET /slots, as llama-server answers it: 501 under --no-slots, and with ?fail_on_no_slot a
 * 503 when every slot is busy. */
static enum MHD_Result slots(request *r) {
    const serve_server *s = r->http->server;
    serve_error e;
    if (s->no_slots) {
        serve_error_set(&e, 501, "not_supported_error", NULL, "",
                        "this server does not serve /slots: it was started with --no-slots");
        return queue_error(r, &e);
    }
    uint32_t idle;
    char *json = serve_slots_json(s, &idle, &e);
    if (!json)
        return queue_error(r, &e);
    if (idle == 0 && MHD_lookup_connection_value(r->connection, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot")) {
        free(json);
        serve_error_set(&e, 503, "unavailable_error", NULL, "", "no slot available (fail_on_no_slot)");
        return queue_error(r, &e);
    }
    return queue_json(r, 200, json);
}

static enum MHD_Result generate(request *r) {
    serve_server *s = r->http->server;
    serve_error e;
    serve_job *job;
    const serve_endpoint ep = r->route == ROUTE_CHAT          ? SERVE_CHAT
                              : r->route == ROUTE_COMPLETIONS ? SERVE_COMPLETION
                              : r->route == ROUTE_ANTHROPIC   ? SERVE_ANTHROPIC
                              : r->route == ROUTE_RESPONSES   ? SERVE_RESPONSES
                                                              : SERVE_LLAMA_COMPLETION;
    if (serve_job_parse(s, ep, r->body.data ? r->body.data : "", r->body.len, &job, &e) < 0)
        return queue_error(r, &e);
    if (serve_job_submit(s, job, &e) < 0) {
        serve_job_release(job);
        return queue_error(r, &e);
    }
    r->job = job;
    r->counted = 1;
    atomic_fetch_add(&r->http->answering, 1);
    if (serve_job_streams(job)) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_reader, r, NULL);
        if (!resp)
            return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        add_common_headers(r, resp);
        enum MHD_Result rc = MHD_queue_response(r->connection, 200, resp);
        MHD_destroy_response(resp);
        serve_count_response(s, 200);
        return rc;
    }
    /* nothing may be written before the answer's status line, so a client's FIN tells nothing:
     * a closed client is noticed by a reset, or when the answer cannot be written */
    serve_wait w = serve_job_wait(job, connection_fd(r->connection), s->timeout_s, 0);
    restart_idle_clock(r);
    if (w == SERVE_WAIT_HANGUP)
        return MHD_NO; /* nobody to answer; the completion callback cancels the job */
    if (w == SERVE_WAIT_TIMEOUT) {
        serve_error_set(&e, 504, "server_error", "timeout", "", "no progress for %u s (--timeout)", s->timeout_s);
        return queue_error(r, &e);
    }
    unsigned status;
    char *json = serve_job_response(job, &status);
    return queue_json(r, status, json);
}

/* Sets the deadline of connection c's next request: at seconds from now, or none (0). */
static void set_deadline(serve_http *h, struct MHD_Connection *c, uint32_t seconds) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_deadline *d = info ? info->socket_context : NULL;
    if (!d)
        return;
    pthread_mutex_lock(&h->mu);
    d->at = seconds && !d->shut ? rlx__now_seconds() + seconds : 0;
    pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    serve_http *h = cls;
    request *r = *con_cls;
    serve_error e;
    if (!r) {
        if (!(r = calloc(1, sizeof *r)))
            return MHD_NO;
        *con_cls = r;
        r->http = h;
        r->connection = c;
        if (early_error(r, url, method, &e)) {
            r->answered = 1;
            set_deadline(h, c, 0);
            return queue_error(r, &e);
        }
        if (strcmp(method, "OPTIONS") == 0) {
            r->answered = 1;
            set_deadline(h, c, 0);
            return preflight(r);
        }
        return MHD_YES;
    }
    if (r->answered) { /* MHD may still hand over a body it read with the headers */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        /* MHD takes a response only once the body is in, so the rest of one over the limit is
         * read and dropped, and the 413 follows it */
        if (r->body.len + *upload_size > h->server->max_body)
            r->too_large = 1;
        if (!r->too_large)
            serve_buf_append(&r->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    set_deadline(h, c, 0); /* the whole request is in */
    if (r->too_large) {
        serve_error_set(&e, 413, "invalid_request_error", "request_too_large", "",
                        "the body is over the limit of %zu bytes (--max-body)", h->server->max_body);
        return queue_error(r, &e);
    }
    if (r->body.failed) {
        serve_error_set(&e, 500, "server_error", NULL, "", "out of memory");
        return queue_error(r, &e);
    }
    switch (r->route) {
    case ROUTE_HEALTH:
        return health(r);
    case ROUTE_MODELS:
        return models(r);
    case ROUTE_METRICS:
        return metrics(r);
    case ROUTE_MODEL:
        return model(r, url);
    case ROUTE_PROPS:
        return queue_json(r, 200, serve_props_json(h->server));
    case ROUTE_SLOTS:
        return slots(r);
    case ROUTE_WEBUI:
        return webui(r, url);
    case ROUTE_EMBEDDINGS:
    case ROUTE_EMBEDDINGS_OAI:
    case ROUTE_RERANK:
        return embeddings(r);
    case ROUTE_TOKENIZE:
    case ROUTE_DETOKENIZE:
    case ROUTE_APPLY_TEMPLATE:
        return native(r);
    case ROUTE_ANTHROPIC_COUNT: {
        char *json = serve_anthropic_count_tokens(h->server, r->body.data ? r->body.data : "", r->body.len, &e);
        return json ? queue_json(r, 200, json) : queue_error(r, &e);
    }
    default:
        return generate(r);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    serve_http *h = cls;
    request *r = *con_cls;
    set_deadline(h, c, h->server->request_timeout_s); /* a kept-alive connection's next request */
    if (!r)
        return;
    serve_job_release(r->job);
    if (r->counted)
        atomic_fetch_sub(&h->answering, 1);
    serve_buf_free(&r->body);
    serve_buf_free(&r->out);
    free(r);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
    serve_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&h->connections, 1);
        const int fd = connection_fd(c);
        conn_deadline *d = calloc(1, sizeof *d);
        if (!d) { /* without a deadline the connection could be held forever: refuse it */
            if (fd >= 0)
                shutdown(fd, SHUT_RDWR);
            return;
        }
        d->fd = fd;
        pthread_mutex_lock(&h->mu);
        d->at = rlx__now_seconds() + h->server->request_timeout_s;
        d->next = h->deadlines;
        if (h->deadlines)
            h->deadlines->prev = d;
        h->deadlines = d;
        pthread_mutex_unlock(&h->mu);
        *socket_ctx = d;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&h->connections, 1);
        conn_deadline *d = *socket_ctx;
        if (!d)
            return;
        pthread_mutex_lock(&h->mu);
        if (d->prev)
            d->prev->next = d->next;
        else
            h->deadlines = d->next;
        if (d->next)
            d->next->prev = d->prev;
        pthread_mutex_unlock(&h->mu);
        free(d);
        *socket_ctx = NULL;
    }
}

/* The reaper: shuts down the sockets whose request did not arrive by its deadline (MHD's thread
 * of the connection then reads the end and closes it), waking at the earliest deadline. */
static void *reap_slow_requests(void *arg) {
    serve_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        const double now = rlx__now_seconds();
        double next = now + 1.0;
        for (conn_deadline *d = h->deadlines; d; d = d->next) {
            if (!d->at)
                continue;
            if (d->at <= now) {
                shutdown(d->fd, SHUT_RDWR);
                d->at = 0;
                d->shut = 1;
            } else if (d->at < next) {
                next = d->at;
            }
        }
        const struct timespec until = rlx__deadline_in((uint64_t)((next - now) * 1000.0) + 1);
        pthread_cond_timedwait(&h->reaper_wake, &h->mu, &until);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void log_mhd(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("rlx serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

int serve_http_start(serve_server *s, const char *host, uint16_t port, int verbose, serve_http **out, char *err,
                     size_t err_len) {
    *out = NULL;
    char service[8];
    snprintf(service, sizeof service, "%u", port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, service, &hints, &ai);
    if (gai != 0) {
        snprintf(err, err_len, "--host %s: %s", host, gai_strerror(gai));
        return -1;
    }
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    h->server = s;
    atomic_init(&h->connections, 0);
    pthread_mutex_init(&h->mu, NULL);
    rlx__cond_init_monotonic(&h->reaper_wake);
    if (pthread_create(&h->reaper, NULL, reap_slow_requests, h) != 0) {
        freeaddrinfo(ai);
        snprintf(err, err_len, "cannot start a thread");
        serve_http_stop(h);
        return -1;
    }
    h->reaper_started = 1;
    /* MHD's own log says every client that went away mid-stream ("application error"): only with -v */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC;
    if (verbose)
        flags |= MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* the logger first: MHD reports the options after it through it */
    h->daemon = MHD_start_daemon(flags, port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)(s->max_connections + SERVE_OVERFLOW_CONNECTIONS),
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->max_connections_per_ip,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                                 on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon) {
        snprintf(err, err_len, "cannot listen on %s port %u (in use, or not an address of this machine?)", host, port);
        serve_http_stop(h);
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : port;
    *out = h;
    return 0;
}

uint16_t serve_http_port(const serve_http *h) { return h->port; }

void serve_http_quiesce(serve_http *h) {
    MHD_socket fd = MHD_quiesce_daemon(h->daemon);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
}

void serve_http_settle(serve_http *h, uint32_t timeout_ms) {
    for (uint32_t waited = 0; atomic_load(&h->answering) > 0 && waited < timeout_ms; waited += 10)
        usleep(10000);
}

void serve_http_stop(serve_http *h) {
    if (!h)
        return;
    if (h->reaper_started) {
        pthread_mutex_lock(&h->mu);
        h->stopping = 1;
        pthread_cond_signal(&h->reaper_wake);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->reaper, NULL);
    }
    if (h->daemon)
        MHD_stop_daemon(h->daemon); /* each connection's CLOSED frees its deadline */
    pthread_cond_destroy(&h->reaper_wake);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
