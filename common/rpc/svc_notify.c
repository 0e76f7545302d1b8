#include "svc_notify.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <systemd/sd-daemon.h>

#include "log.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool warned, was_ready;
static char last_status[400];

/* Under lock. */
static void send_state(const char *state)
{
    /* unset_environment = 0: later calls, on any thread, use the same socket. */
    int r = sd_notify(0, state);
    if (r < 0 && !warned) {
        warned = true;
        log_warn("cannot notify the service manager: %s", strerror(-r));
    }
}

/* Under lock: head ("READY=1" or "") and a status line from fmt. */
static void send_with_status(const char *head, const char *fmt, va_list ap)
{
    char msg[512];

    if (fmt) {
        vsnprintf(last_status, sizeof last_status, fmt, ap);
        /* A status is one line: a newline would start another assignment. */
        for (char *p = last_status; *p; p++)
            if (*p == '\n')
                *p = ' ';
    }
    snprintf(msg, sizeof msg, "%s%s%s%s", head, head[0] && fmt ? "\n" : "",
             fmt ? "STATUS=" : "", fmt ? last_status : "");
    send_state(msg);
}

void svc_notify_ready(const char *fmt, ...)
{
    va_list ap;

    pthread_mutex_lock(&lock);
    was_ready = true;
    va_start(ap, fmt);
    send_with_status("READY=1", fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&lock);
}

void svc_notify_status(const char *fmt, ...)
{
    va_list ap;

    if (!fmt)
        return;
    pthread_mutex_lock(&lock);
    va_start(ap, fmt);
    send_with_status("", fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&lock);
}

void svc_notify_stopping(const char *why)
{
    char msg[256];

    snprintf(msg, sizeof msg, "STOPPING=1\nSTATUS=stopping (%s)", why ? why : "signal");
    pthread_mutex_lock(&lock);
    send_state(msg);
    pthread_mutex_unlock(&lock);
}

void svc_notify_reloading(void)
{
    pthread_mutex_lock(&lock);
    send_state("RELOADING=1\nSTATUS=reloading settings");
    pthread_mutex_unlock(&lock);
}

void svc_notify_reloaded(void)
{
    char msg[512];

    pthread_mutex_lock(&lock);
    if (was_ready)
        snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", last_status);
    else
        snprintf(msg, sizeof msg, "STATUS=%s", last_status);
    send_state(msg);
    pthread_mutex_unlock(&lock);
}
