/* rpc_reflect: gRPC server reflection (grpc.reflection.v1 and v1alpha
 * ServerReflectionInfo) from the descriptor set embedded at build time
 * (proto/proto_descriptors.h), so that grpcurl, grpcui or Postman can call
 * a bloomgrid process without the .proto files.
 *
 * Answers list_services (the services the caller names at registration,
 * plus the two reflection services), file_by_filename and
 * file_containing_symbol (packages' messages, nested messages, enums,
 * services and methods) with the file and every file it imports that this
 * stream has not been sent yet, and all_extension_numbers_of_type with no
 * numbers (no bloomgrid message has extensions).  Unknown files, symbols
 * and extensions: an error_response NOT_FOUND, the stream goes on.
 */
#ifndef BLOOMGRID_RPC_REFLECT_H
#define BLOOMGRID_RPC_REFLECT_H

#include "rpc_server.h"

/* Register both reflection services on srv (before rpc_server_start).
 * services: the full names of the services srv serves, NULL-terminated
 * (copied).  Returns 0, -EINVAL when the embedded set does not parse, or
 * -ENOMEM. */
int rpc_reflect_add(struct rpc_server *srv, const char *const *services);
/* The same, on the listeners of the mask only (rpc_server_add_service_on). */
int rpc_reflect_add_on(struct rpc_server *srv, const char *const *services,
                       unsigned listeners);

#endif
