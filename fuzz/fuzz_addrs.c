/* libFuzzer target for the text parsers of include/hvd/net.h: address lists and base64
 * secrets.
 *
 * Address lists: whatever hvd_addrs_parse accepts must format and parse back to the same
 * list, and formatting that list again must give the same text. Secrets: whatever
 * hvd_secret_from_base64 accepts must be the one canonical base64 form of the key it decoded
 * (give or take surrounding white space). Any violation aborts. */
#include "hvd/net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_addrs: %s:%d: %s\n", __FILE__, __LINE__, #cond);                 \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int same_addrs(const hvd_addr *a, size_t na, const hvd_addr *b, size_t nb) {
    if (na != nb) return 0;
    for (size_t i = 0; i < na; i++) {
        if (strcmp(a[i].ifname, b[i].ifname) != 0 || strcmp(a[i].host, b[i].host) != 0 ||
            a[i].port != b[i].port)
            return 0;
    }
    return 1;
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void check_addrs(const char *text) {
    hvd_addr *a = NULL;
    size_t na = 0;
    hvd_err err = {0};
    if (hvd_addrs_parse(text, &a, &na, &err) != 0) {
        REQUIRE(a == NULL && na == 0);
        REQUIRE(err.code == HVD_E_INVALID && err.msg[0] != '\0');
        REQUIRE(strlen(err.msg) < sizeof err.msg);
        return;
    }
    REQUIRE(a != NULL && na > 0);
    for (size_t i = 0; i < na; i++) {
        REQUIRE(memchr(a[i].ifname, '\0', sizeof a[i].ifname) != NULL);
        REQUIRE(memchr(a[i].host, '\0', sizeof a[i].host) != NULL);
        REQUIRE(a[i].host[0] != '\0' && a[i].port != 0);
        char buf[HVD_HOST_MAX + 16];
        REQUIRE(hvd_addr_str(&a[i], buf, sizeof buf) == buf);
        REQUIRE(strlen(buf) < sizeof buf - 1); /* never cut */
    }

    char *f1 = hvd_addrs_format(a, na);
    REQUIRE(f1 != NULL);
    hvd_addr *b = NULL;
    size_t nb = 0;
    if (hvd_addrs_parse(f1, &b, &nb, &err) != 0) {
        fprintf(stderr, "fuzz_addrs: formatted list \"%s\" does not parse: %s\n", f1, err.msg);
        abort();
    }
    REQUIRE(same_addrs(a, na, b, nb));
    char *f2 = hvd_addrs_format(b, nb);
    REQUIRE(f2 != NULL && strcmp(f1, f2) == 0);
    free(f2);
    free(f1);
    free(b);
    free(a);
}

static void check_secret(const char *text) {
    hvd_secret s;
    hvd_err err = {0};
    if (hvd_secret_from_base64(&s, text, &err) != 0) {
        REQUIRE(err.msg[0] != '\0');
        return;
    }
    char out[45];
    hvd_secret_to_base64(&s, out);
    while (is_space(*text))
        text++;
    size_t n = strlen(text);
    while (n > 0 && is_space(text[n - 1]))
        n--;
    REQUIRE(n == 44 && memcmp(text, out, 44) == 0);
    hvd_secret_wipe(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    check_addrs(text);
    check_secret(text);
    free(text);
    return 0;
}
