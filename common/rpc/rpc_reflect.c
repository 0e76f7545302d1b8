/* rpc_reflect: server reflection over the embedded descriptor set.
 *
 * The set is indexed once per process (files by name with their exact
 * serialized bytes, symbols by full name) and never freed.  v1alpha's
 * messages are the same on the wire as v1's, so both services share one
 * handler that speaks v1's generated types. */
#include "rpc_reflect.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/protobuf/descriptor.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "log.h"
#include "proto_descriptors.h"

/* The v1alpha service descriptor comes from the same generated code shape;
 * only its name differs, so it is described here by hand. */

struct rfile {
    const char *name;              /* in the unpacked proto */
    ProtobufCBinaryData raw;       /* exact bytes from the set */
    size_t *deps;                  /* indexes of imported files */
    size_t ndeps;
};

struct rsym {
    char *name;                    /* full name, no leading dot */
    size_t file;
};

struct rindex {
    Google__Protobuf__FileDescriptorProto **protos;
    struct rfile *files;
    size_t nfiles;
    struct rsym *syms;
    size_t nsyms, capsyms;
};

#define REFLECT_MAX_FILES 64

static struct rindex *g_index;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int sym_add(struct rindex *x, const char *prefix, const char *name, size_t file)
{
    if (x->nsyms == x->capsyms) {
        size_t cap = x->capsyms ? 2 * x->capsyms : 64;
        struct rsym *n = realloc(x->syms, cap * sizeof *n);
        if (!n)
            return -ENOMEM;
        x->syms = n;
        x->capsyms = cap;
    }
    char *full;
    if (asprintf(&full, "%s%s%s", prefix, *prefix ? "." : "", name) < 0)
        return -ENOMEM;
    x->syms[x->nsyms++] = (struct rsym){full, file};
    return 0;
}

static int index_message(struct rindex *x, const char *prefix,
                         const Google__Protobuf__DescriptorProto *m, size_t file)
{
    if (sym_add(x, prefix, m->name, file) != 0)
        return -ENOMEM;
    const char *me = x->syms[x->nsyms - 1].name;
    for (size_t i = 0; i < m->n_nested_type; i++)
        if (index_message(x, me, m->nested_type[i], file) != 0)
            return -ENOMEM;
    for (size_t i = 0; i < m->n_enum_type; i++)
        if (sym_add(x, me, m->enum_type[i]->name, file) != 0)
            return -ENOMEM;
    return 0;
}

/* Walk the FileDescriptorSet's "repeated FileDescriptorProto file = 1" by
 * hand, to keep each file's exact bytes. */
static int read_varint(const uint8_t *p, size_t len, size_t *at, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *at < len; shift += 7) {
        uint8_t b = p[(*at)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -EINVAL;
}

static void build_index(void)
{
    const uint8_t *p = bloomgrid_descriptor_set;
    size_t len = bloomgrid_descriptor_set_len, at = 0;
    struct rindex *x = calloc(1, sizeof *x);
    if (!x)
        return;
    while (at < len) {
        uint64_t tag, n;
        if (read_varint(p, len, &at, &tag) != 0 || tag != 0x0a ||
            read_varint(p, len, &at, &n) != 0 || n > len - at)
            goto bad;
        struct rfile *nf = realloc(x->files, (x->nfiles + 1) * sizeof *nf);
        Google__Protobuf__FileDescriptorProto **np =
            realloc(x->protos, (x->nfiles + 1) * sizeof *np);
        if (nf)
            x->files = nf;
        if (np)
            x->protos = np;
        if (!nf || !np)
            goto bad;
        Google__Protobuf__FileDescriptorProto *fd =
            google__protobuf__file_descriptor_proto__unpack(NULL, (size_t)n, p + at);
        if (!fd || !fd->name)
            goto bad;
        x->protos[x->nfiles] = fd;
        x->files[x->nfiles] = (struct rfile){fd->name, {(size_t)n, (uint8_t *)p + at}, NULL, 0};
        x->nfiles++;
        at += (size_t)n;
    }
    if (x->nfiles > REFLECT_MAX_FILES)
        goto bad;
    for (size_t f = 0; f < x->nfiles; f++) {
        Google__Protobuf__FileDescriptorProto *fd = x->protos[f];
        struct rfile *rf = &x->files[f];
        rf->deps = calloc(fd->n_dependency ? fd->n_dependency : 1, sizeof *rf->deps);
        if (!rf->deps)
            goto bad;
        for (size_t d = 0; d < fd->n_dependency; d++)
            for (size_t g = 0; g < x->nfiles; g++)
                if (strcmp(x->files[g].name, fd->dependency[d]) == 0)
                    rf->deps[rf->ndeps++] = g;
        const char *pkg = fd->package ? fd->package : "";
        for (size_t i = 0; i < fd->n_message_type; i++)
            if (index_message(x, pkg, fd->message_type[i], f) != 0)
                goto bad;
        for (size_t i = 0; i < fd->n_enum_type; i++)
            if (sym_add(x, pkg, fd->enum_type[i]->name, f) != 0)
                goto bad;
        for (size_t i = 0; i < fd->n_service; i++) {
            const Google__Protobuf__ServiceDescriptorProto *s = fd->service[i];
            if (sym_add(x, pkg, s->name, f) != 0)
                goto bad;
            const char *sn = x->syms[x->nsyms - 1].name;
            for (size_t m = 0; m < s->n_method; m++) {
                char *snc = strdup(sn);
                int rc = snc ? sym_add(x, snc, s->method[m]->name, f) : -ENOMEM;
                free(snc);
                if (rc != 0)
                    goto bad;
            }
        }
    }
    g_index = x;
    return;
bad:
    log_error("reflection: the embedded descriptor set does not parse");
    /* Partly built: keep it reachable, unused. */
    g_index = NULL;
}

static long file_by_name(const struct rindex *x, const char *name)
{
    for (size_t f = 0; f < x->nfiles; f++)
        if (strcmp(x->files[f].name, name) == 0)
            return (long)f;
    return -1;
}

static long file_by_symbol(const struct rindex *x, const char *sym)
{
    if (*sym == '.')
        sym++;
    for (size_t i = 0; i < x->nsyms; i++)
        if (strcmp(x->syms[i].name, sym) == 0)
            return (long)x->syms[i].file;
    return -1;
}

struct reflect_arg {
    const char *const *services;
    struct reflect_arg *next;      /* every registration, kept reachable */
};

static struct reflect_arg *g_args;
static pthread_mutex_t g_args_lock = PTHREAD_MUTEX_INITIALIZER;

/* Append file f and, before it, what it imports that was not sent yet. */
static void collect(const struct rindex *x, size_t f, bool *sent,
                    ProtobufCBinaryData *out, size_t *n)
{
    if (sent[f])
        return;
    sent[f] = true;
    out[(*n)++] = x->files[f].raw;
    for (size_t d = 0; d < x->files[f].ndeps; d++)
        collect(x, x->files[f].deps[d], sent, out, n);
}

static int answer(struct rpc_stream *st, const struct rindex *x,
                  const struct reflect_arg *a, bool *sent,
                  Grpc__Reflection__V1__ServerReflectionRequest *rq)
{
    Grpc__Reflection__V1__ServerReflectionResponse rs =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    Grpc__Reflection__V1__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse lsr =
        GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ExtensionNumberResponse enr =
        GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse er = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    ProtobufCBinaryData files[REFLECT_MAX_FILES];
    Grpc__Reflection__V1__ServiceResponse svc[32], *svcp[32];
    char msg[300];
    long f = -1;

    rs.valid_host = rq->host ? rq->host : (char *)"";
    rs.original_request = rq;
    switch (rq->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES: {
        size_t n = 0;
        for (; a->services[n] && n < 32; n++) {
            svc[n] = (Grpc__Reflection__V1__ServiceResponse)
                GRPC__REFLECTION__V1__SERVICE_RESPONSE__INIT;
            svc[n].name = (char *)a->services[n];
            svcp[n] = &svc[n];
        }
        lsr.n_service = n;
        lsr.service = svcp;
        rs.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        rs.list_services_response = &lsr;
        break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        f = file_by_name(x, rq->file_by_filename);
        if (f < 0)
            snprintf(msg, sizeof msg, "file \"%.200s\" not found", rq->file_by_filename);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        f = file_by_symbol(x, rq->file_containing_symbol);
        if (f < 0)
            snprintf(msg, sizeof msg, "symbol \"%.200s\" not found",
                     rq->file_containing_symbol);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        if (file_by_symbol(x, rq->all_extension_numbers_of_type) < 0) {
            snprintf(msg, sizeof msg, "type \"%.200s\" not found",
                     rq->all_extension_numbers_of_type);
        } else {
            enr.base_type_name = rq->all_extension_numbers_of_type;
            rs.message_response_case =
                GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
            rs.all_extension_numbers_response = &enr;
        }
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        snprintf(msg, sizeof msg, "no extension %d of \"%.200s\" (no message has extensions)",
                 rq->file_containing_extension ? rq->file_containing_extension->extension_number : 0,
                 rq->file_containing_extension && rq->file_containing_extension->containing_type
                     ? rq->file_containing_extension->containing_type : "");
        break;
    default:
        snprintf(msg, sizeof msg, "empty request");
        er.error_code = GRPC_STATUS_INVALID_ARGUMENT;
        break;
    }
    if (f >= 0) {
        size_t n = 0;
        collect(x, (size_t)f, sent, files, &n);
        fdr.n_file_descriptor_proto = n;
        fdr.file_descriptor_proto = files;
        rs.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
        rs.file_descriptor_response = &fdr;
    } else if (rs.message_response_case ==
               GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE__NOT_SET) {
        if (!er.error_code)
            er.error_code = GRPC_STATUS_NOT_FOUND;
        er.error_message = msg;
        rs.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        rs.error_response = &er;
    }
    return rpc_stream_write(st, &rs.base);
}

static void reflect_stream(void *arg, struct rpc_stream *st)
{
    const struct reflect_arg *a = arg;
    const struct rindex *x = g_index;
    if (!x) {
        rpc_stream_finish(st, GRPC_STATUS_INTERNAL, "reflection data unavailable");
        return;
    }
    bool *sent = calloc(x->nfiles, sizeof *sent);
    if (!sent) {
        rpc_stream_finish(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    const uint8_t *buf;
    size_t len;
    int rc;
    while ((rc = rpc_stream_read(st, &buf, &len)) == 1) {
        Grpc__Reflection__V1__ServerReflectionRequest *rq =
            grpc__reflection__v1__server_reflection_request__unpack(NULL, len, buf);
        if (!rq) {
            free(sent);
            rpc_stream_finish(st, GRPC_STATUS_INVALID_ARGUMENT,
                              "ServerReflectionRequest does not parse");
            return;
        }
        rc = answer(st, x, a, sent, rq);
        grpc__reflection__v1__server_reflection_request__free_unpacked(rq, NULL);
        if (rc != 0)
            break;
    }
    free(sent);
    if (rc >= 0)
        rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
}

/* grpc.reflection.v1alpha.ServerReflection: v1's method under the older
 * package name (same messages on the wire). */
static const ProtobufCMethodDescriptor alpha_methods[] = {
    {"ServerReflectionInfo", &grpc__reflection__v1__server_reflection_request__descriptor,
     &grpc__reflection__v1__server_reflection_response__descriptor},
};
static const unsigned alpha_index[] = {0};
static const ProtobufCServiceDescriptor alpha_service = {
    PROTOBUF_C__SERVICE_DESCRIPTOR_MAGIC,
    "grpc.reflection.v1alpha.ServerReflection",
    "ServerReflection",
    "Grpc__Reflection__V1alpha__ServerReflection",
    "grpc.reflection.v1alpha",
    1,
    alpha_methods,
    alpha_index,
};

int rpc_reflect_add_on(struct rpc_server *srv, const char *const *services,
                       unsigned listeners)
{
    pthread_once(&g_once, build_index);
    if (!g_index)
        return -EINVAL;
    size_t n = 0;
    while (services && services[n])
        n++;
    /* The caller's services, then the two reflection services. */
    struct reflect_arg *a = calloc(1, sizeof *a);
    const char **names = calloc(n + 3, sizeof *names);
    if (!a || !names) {
        free(a);
        free(names);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        names[i] = services[i];
    names[n] = grpc__reflection__v1__server_reflection__descriptor.name;
    names[n + 1] = alpha_service.name;
    a->services = names;
    /* Kept for the life of the process: servers hold no destructor for
     * handler arguments, and a process registers this once per server. */
    pthread_mutex_lock(&g_args_lock);
    a->next = g_args;
    g_args = a;
    pthread_mutex_unlock(&g_args_lock);
    static const struct rpc_handler h[1] = {{.stream = reflect_stream}};
    int rc = rpc_server_add_service_on(srv, &grpc__reflection__v1__server_reflection__descriptor,
                                       h, a, listeners);
    if (rc == 0)
        rc = rpc_server_add_service_on(srv, &alpha_service, h, a, listeners);
    return rc;
}

int rpc_reflect_add(struct rpc_server *srv, const char *const *services)
{
    return rpc_reflect_add_on(srv, services, RPC_LISTENERS_ALL);
}
