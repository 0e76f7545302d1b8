/* The descriptors of every .proto file a bloomgrid process serves (its own,
 * health, reflection) with their imports: a serialized
 * google.protobuf.FileDescriptorSet written by protoc at build time, for
 * gRPC reflection (rpc_reflect.h). */
#ifndef BLOOMGRID_PROTO_DESCRIPTORS_H
#define BLOOMGRID_PROTO_DESCRIPTORS_H

#include <stddef.h>

extern const unsigned char bloomgrid_descriptor_set[];
extern const size_t bloomgrid_descriptor_set_len;

#endif
