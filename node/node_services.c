/* node_services: the handler tables of the node's two services, in the
 * order of their protobuf-c service descriptors (node.h).  Handlers live in
 * the node_*_rpc.c files; what they share in node_rpc.c.
 */
#include <stddef.h>

#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"

/* Descriptor order: CreateFilter, DropFilter, ListFilters, GetFilter, Add,
 * MayContain, Remove, AddStream, MayContainStream, Export, Import. */
const struct rpc_handler node_rpc_public[] = {
    {.unary = node_rpc__h_create_filter},
    {.unary = node_rpc__h_drop_filter},
    {.unary = node_rpc__h_list_filters},
    {.unary = node_rpc__h_get_filter},
    {.unary = node_rpc__h_add, .checks_strings = true, .loop = true},
    {.unary = node_rpc__h_may_contain, .checks_strings = true, .loop = true},
    {.unary = node_rpc__h_remove, .checks_strings = true, .loop = true},
    {.loop_stream = &node_rpc__add_stream, .checks_strings = true},
    {.loop_stream = &node_rpc__may_contain_stream, .checks_strings = true},
    {.stream = node_rpc__h_export},
    {.stream = node_rpc__h_import},
};

/* CreateShard, DropShard, GetShard, ListShards, AddHashes, MayContainHashes,
 * RemoveHashes, PullPages, PushPages, ExportShard, ImportShard, Batches,
 * NodeInfo, Resync. */
const struct rpc_handler node_rpc_internal[] = {
    {.unary = node_rpc__h_create_shard},
    {.unary = node_rpc__h_drop_shard},
    {.unary = node_rpc__h_get_shard},
    {.unary = node_rpc__h_list_shards},
    {.unary = node_rpc__h_add_hashes},
    {.unary = node_rpc__h_may_contain_hashes},
    {.unary = node_rpc__h_remove_hashes},
    {.stream = node_rpc__h_pull_pages, .internal = true},
    {.stream = node_rpc__h_push_pages, .internal = true},
    {.stream = node_rpc__h_export_shard, .internal = true},
    {.stream = node_rpc__h_import_shard, .internal = true},
    {.loop_stream = &node_rpc__batches, .internal = true},
    {.unary = node_rpc__h_node_info},
    {.unary = node_rpc__h_resync},
};

const size_t node_rpc_public_count = sizeof node_rpc_public / sizeof node_rpc_public[0];
const size_t node_rpc_internal_count =
    sizeof node_rpc_internal / sizeof node_rpc_internal[0];
