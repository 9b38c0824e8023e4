/* Byte encoding of the negotiation messages exchanged over MPI (docs/runtime.md, "Negotiation
 * messages"). All integers little-endian; every read is bounds-checked, so a corrupt message is
 * an error, never an out-of-bounds access. */
#ifndef HVD_RUNTIME_MESSAGE_H
#define HVD_RUNTIME_MESSAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "hvd/error.h"
#include "params.h"

/* Encodes one rank's cycle message (flags and requests) into b, replacing its contents.
 * Returns 0, or -1 on out of memory. */
int rt_encode_requests(hvd_buf *b, uint32_t flags, const rt_request *reqs, size_t n);
/* Decodes it; request names point into data. Returns 0, or -1 with err on malformed input
 * (HVD_E_PROTOCOL) or out of memory (HVD_E_INTERNAL). reqs is malloc'd (free it). */
int rt_decode_requests(const uint8_t *data, size_t len, uint32_t *flags, rt_request **reqs,
                       size_t *n, hvd_err *err);
/* Encodes a response list into b, replacing its contents. Returns 0, or -1 on out of memory. */
int rt_encode_responses(hvd_buf *b, const rt_response_list *l);
/* Appends the decoded responses to l. Returns 0, or -1 with err on malformed input or out of
 * memory (as rt_decode_requests). */
int rt_decode_responses(const uint8_t *data, size_t len, rt_response_list *l, hvd_err *err);

#endif
