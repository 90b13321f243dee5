/* The credentials of pipeline links (rlx_dist_security): the shared token, read from its file
 * and proven in the handshake by HMAC-SHA256 over both sides' nonces (OpenSSL's libcrypto); the
 * TLS files, which the transport applies, handed to it as options; and the rule that a stage
 * without credentials listens on loopback only. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "dist/dist_internal.h"
#include "util/alloc.h"

/* OpenSSL frees its state from an atexit handler unless its first initialisation says not to.
 * Threads of a library that outlive that library's own shutdown still use OpenSSL while the
 * process exits: gRPC's event engine reconnects a channel in the background after the transport
 * gave it up (a failed TLS handshake), and its new handshake then crashed on OpenSSL's destroyed
 * locks or hung. Initialising OpenSSL when librlx loads, before any plugin is opened, keeps its
 * state to the end; the process's memory goes back to the system anyway. */
__attribute__((constructor)) static void keep_openssl_until_exit(void) {
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

/* A token file is one line; anything longer than this is not one. */
#define TOKEN_FILE_MAX 4096

static rlx_status read_token(const char *path, rlx__auth *a) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return rlx_error(RLX_E_IO, "auth token file %s: %s", path, strerror(errno));
    struct stat sb;
    rlx_status rc = RLX_OK;
    char buf[TOKEN_FILE_MAX + 1];
    ssize_t n = 0;
    if (fstat(fd, &sb) != 0)
        rc = rlx_error(RLX_E_IO, "auth token file %s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        rc = rlx_error(RLX_E_INVALID, "auth token file %s is not a regular file", path);
    else if (sb.st_mode & 077)
        rc = rlx_error(RLX_E_INVALID,
                       "auth token file %s may be read or written by other users (mode %03o): chmod 600 it, the token "
                       "is a password",
                       path, (unsigned)(sb.st_mode & 0777));
    else if ((n = read(fd, buf, TOKEN_FILE_MAX + 1)) < 0)
        rc = rlx_error(RLX_E_IO, "auth token file %s: %s", path, strerror(errno));
    close(fd);
    if (rc != RLX_OK)
        return rc;
    size_t len = 0;
    while (len < (size_t)n && buf[len] != '\n')
        len++;
    if (len == (size_t)n && n > TOKEN_FILE_MAX)
        return rlx_error(RLX_E_INVALID, "auth token file %s: the first line is longer than %d bytes", path,
                         TOKEN_FILE_MAX);
    if (len && buf[len - 1] == '\r')
        len--;
    if (len < RLX_DIST_MIN_TOKEN_BYTES) {
        OPENSSL_cleanse(buf, sizeof buf);
        return rlx_error(RLX_E_INVALID,
                         "auth token file %s: the token (the first line) has %zu bytes, at least %d are needed "
                         "(e.g. openssl rand -hex 32 > FILE)",
                         path, len, RLX_DIST_MIN_TOKEN_BYTES);
    }
    if (!(a->token = rlx__malloc(len))) {
        OPENSSL_cleanse(buf, sizeof buf);
        return rlx_error(RLX_E_NOMEM, "out of memory");
    }
    memcpy(a->token, buf, len);
    a->token_len = len;
    OPENSSL_cleanse(buf, sizeof buf);
    return RLX_OK;
}

/* Appends ",key=value" to the options being built (*out, *len), refusing values the option
 * syntax cannot carry. */
static rlx_status append_option(char **out, size_t *len, const char *key, const char *value) {
    if (strpbrk(value, ",="))
        return rlx_error(RLX_E_INVALID, "%s '%s' holds a ',' or '=', which transport options cannot carry", key, value);
    const size_t add = strlen(key) + strlen(value) + 2;
    char *grown = realloc(*out, *len + add + 1);
    if (!grown)
        return rlx_error(RLX_E_NOMEM, "out of memory");
    *out = grown;
    *len += (size_t)snprintf(grown + *len, add + 1, "%s%s=%s", *len ? "," : "", key, value);
    return RLX_OK;
}

/* Whether a "key=value,..." string sets key (a malformed item is the transport's to refuse). */
static int sets_option(const char *options, const char *key) {
    rlx_iface_option opt;
    char err[8];
    for (int got; (got = rlx_iface_option_next(&options, &opt, err, sizeof err)) != 0;)
        if (got == 1 && rlx_iface_option_is(&opt, key))
            return 1;
    return 0;
}

rlx_status rlx__auth_init(rlx__auth *a, const rlx_dist_security *s, const char *transport_options, uint64_t max_message,
                          int driver) {
    memset(a, 0, sizeof *a);
    const rlx_dist_security none = {0};
    if (!s)
        s = &none;
    const int n_tls = !!s->tls_ca + !!s->tls_cert + !!s->tls_key;
    if (n_tls && n_tls < 3)
        return rlx_error(RLX_E_INVALID, "TLS needs a CA, a certificate and its key together; %s%s%s missing",
                         s->tls_ca ? "" : "the CA (--tls-ca) ", s->tls_cert ? "" : "the certificate (--tls-cert) ",
                         s->tls_key ? "" : "the key (--tls-key) ");
    if (s->tls_name && !n_tls)
        return rlx_error(RLX_E_INVALID, "a TLS name (--tls-name %s) without TLS (--tls-ca, --tls-cert, --tls-key)",
                         s->tls_name);
    a->tls = n_tls == 3;
    size_t len = 0;
    rlx_status rc = RLX_OK;
    if (transport_options && *transport_options) {
        len = strlen(transport_options);
        if (!(a->options = rlx__strdup(transport_options)))
            rc = rlx_error(RLX_E_NOMEM, "out of memory");
    }
    if (rc == RLX_OK && a->tls)
        for (int i = 0; i < 3 && rc == RLX_OK; i++) {
            static const char *const keys[3] = {"tls_ca", "tls_cert", "tls_key"};
            const char *values[3] = {s->tls_ca, s->tls_cert, s->tls_key};
            if (sets_option(transport_options, keys[i]))
                rc = rlx_error(RLX_E_INVALID, "%s is given twice: as a transport option and as a TLS file", keys[i]);
            else
                rc = append_option(&a->options, &len, keys[i], values[i]);
        }
    if (rc == RLX_OK && driver && s->tls_name)
        rc = append_option(&a->options, &len, "tls_name", s->tls_name);
    if (rc == RLX_OK && max_message && !sets_option(transport_options, "max_message")) {
        char size[32];
        snprintf(size, sizeof size, "%llu", (unsigned long long)max_message);
        rc = append_option(&a->options, &len, "max_message", size);
    }
    if (rc == RLX_OK && s->auth_token_file)
        rc = read_token(s->auth_token_file, a);
    if (rc != RLX_OK)
        rlx__auth_free(a);
    return rc;
}

void rlx__auth_free(rlx__auth *a) {
    if (a->token)
        OPENSSL_cleanse(a->token, a->token_len);
    free(a->token);
    free(a->options);
    memset(a, 0, sizeof *a);
}

rlx_status rlx__auth_nonce(uint8_t out[RLX__AUTH_NONCE_BYTES]) {
    if (RAND_bytes(out, RLX__AUTH_NONCE_BYTES) != 1)
        return rlx_error(RLX_E_INTERNAL, "no random bytes for an authentication nonce (OpenSSL RAND_bytes failed)");
    return RLX_OK;
}

void rlx__auth_proof(const rlx__auth *a, const char *label, const uint8_t *driver_nonce, const uint8_t *stage_nonce,
                     uint8_t out[RLX__AUTH_PROOF_BYTES]) {
    uint8_t msg[64 + 2 * RLX__AUTH_NONCE_BYTES];
    const size_t label_len = strlen(label);
    memcpy(msg, label, label_len);
    memcpy(msg + label_len, driver_nonce, RLX__AUTH_NONCE_BYTES);
    memcpy(msg + label_len + RLX__AUTH_NONCE_BYTES, stage_nonce, RLX__AUTH_NONCE_BYTES);
    unsigned int n = RLX__AUTH_PROOF_BYTES;
    HMAC(EVP_sha256(), a->token, (int)a->token_len, msg, label_len + 2 * RLX__AUTH_NONCE_BYTES, out, &n);
}

int rlx__auth_proof_ok(const rlx__auth *a, const char *label, const uint8_t *driver_nonce, const uint8_t *stage_nonce,
                       const uint8_t *proof, size_t proof_len) {
    uint8_t want[RLX__AUTH_PROOF_BYTES];
    rlx__auth_proof(a, label, driver_nonce, stage_nonce, want);
    return proof_len == RLX__AUTH_PROOF_BYTES && CRYPTO_memcmp(want, proof, RLX__AUTH_PROOF_BYTES) == 0;
}

int rlx__address_is_loopback(const char *address) {
    char host[256], err[8];
    unsigned port;
    if (rlx_iface_split_address(address, host, sizeof host, &port, err, sizeof err) != RLX_OK)
        return 0;
    struct in_addr v4;
    struct in6_addr v6;
    if (strcasecmp(host, "localhost") == 0)
        return 1;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

const char *rlx_dist_security_mode(const rlx_dist_security *s, const char *address, const char *transport) {
    const int tls = s && s->tls_ca, token = s && s->auth_token_file;
    if (tls && token)
        return "drivers must authenticate: TLS with a certificate of the CA and the auth token";
    if (tls)
        return "drivers must authenticate: TLS with a certificate of the CA";
    if (token)
        return "drivers must authenticate: the auth token";
    if (transport && !strcmp(transport, "mpi"))
        return "no credentials: the ranks of this MPI job only";
    if (address && rlx__address_is_loopback(address))
        return "no credentials: drivers on this machine only (loopback)";
    return "no credentials (--insecure-listen): anyone who reaches the port can use this stage";
}
