/* proc_accept: a connection past the descriptor limit is refused, and the
 * listener goes on.
 *
 * The gRPC core of this platform (1.51) closes a listening socket for good
 * the first time accept4 fails with EMFILE or ENFILE ("Failed accept4: Too
 * many open files" in the log): from then on the process takes no new
 * connection on that port, however many descriptors come free again.  So
 * any client able to open more connections than the process may hold
 * descriptors (RLIMIT_NOFILE) could shut a node or router off its port
 * until it is restarted.
 *
 * This module defines accept4 for the whole process; the definition in the
 * executable is the one the gRPC library binds to.  It is the system call
 * itself, except when that fails for want of a descriptor: then each
 * pending connection is taken on a descriptor kept in reserve and closed at
 * once (the client sees the connection reset), and once none is pending the
 * caller hears EAGAIN, as from an empty queue, and waits for the next one.
 * Connections that arrive after descriptors came free are accepted as
 * usual.  Each refusal counts in bloomgrid_connections_refused_total; a
 * warning is logged at most once a second.
 */
#ifndef BLOOMGRID_PROC_ACCEPT_H
#define BLOOMGRID_PROC_ACCEPT_H

/* Keep the reserve descriptor (call once at start, before listening: it
 * also makes sure this module is linked in).  Returns 0 or -errno. */
int proc_accept_guard(void);

#endif
