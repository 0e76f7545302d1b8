/*
 * svc_notify: tell the service manager (systemd, Type=notify) when a
 * process is ready, what it is doing, and that it is stopping.
 *
 * Every call is a no-op when the process was not started by one
 * (NOTIFY_SOCKET unset), so a process run by hand or by a test behaves the
 * same.  The protocol is libsystemd's sd_notify(3); these wrappers only fix
 * what each state means for bloomgrid:
 *
 *   READY=1     the process serves what it was started for: a node once its
 *               data directory is open (every filter loaded), a router or a
 *               merger once it listens.  `systemctl start` returns then, so
 *               a unit ordered After= a node starts against a loaded one.
 *   STATUS=...  one line shown by `systemctl status`.
 *   STOPPING=1  on SIGTERM/SIGINT, before calls are drained and data saved.
 *   RELOADING=1 then READY=1 around a SIGHUP reload.
 *
 * Thread-safe (each call sends one datagram).  Errors are logged once, never
 * fatal: a service manager that cannot be told is not a reason to stop.
 */
#ifndef BLOOMGRID_SVC_NOTIFY_H
#define BLOOMGRID_SVC_NOTIFY_H

/* READY=1 with STATUS set from fmt (printf-style; NULL: none). */
void svc_notify_ready(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* STATUS= only. */
void svc_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* STOPPING=1 with a status line naming the signal. */
void svc_notify_stopping(const char *why);

/* RELOADING=1; then svc_notify_reloaded() when the reload is done, which
 * says READY=1 again with the last status, or nothing if the process was
 * not ready before.  rpc_signals_wait() sends all three of these. */
void svc_notify_reloading(void);
void svc_notify_reloaded(void);

#endif
