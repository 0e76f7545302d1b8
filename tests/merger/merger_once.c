/* merger_once: one merger round as a process (see merger_once.h). */
#include "merger_once.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

void merger_once_run(const char *bin, const char *cfg, const char *dir,
                     struct round_out *o, const char *const *env,
                     int kill_after_ms, const char *kill_when)
{
    char out[700], log[700];
    snprintf(out, sizeof out, "%s/merger-once.out", dir);
    snprintf(log, sizeof log, "%s/merger.log", dir);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(ofd, 1);
        dup2(lfd, 2);
        for (int i = 0; env && env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        execl(bin, bin, "--config", cfg, "--once", (char *)NULL);
        _exit(127);
    }
    if (kill_after_ms) {
        harness_sleep_ms(kill_after_ms);
        kill(pid, SIGKILL);
    }
    /* Until the file appears or the process ends by itself. */
    int ws;
    pid_t done = 0;
    while (kill_when && access(kill_when, F_OK) != 0 &&
           (done = waitpid(pid, &ws, WNOHANG)) == 0)
        harness_sleep_ms(5);
    if (kill_when && !done)
        kill(pid, SIGKILL);
    if (!done)
        CHECK(waitpid(pid, &ws, 0) == pid, "waitpid");
    memset(o, 0, sizeof *o);
    o->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    FILE *f = fopen(out, "r");
    if (f) {
        size_t n = fread(o->text, 1, sizeof o->text - 1, f);
        o->text[n] = 0;
        fclose(f);
    }
    char *r = strstr(o->text, "round ");
    if (r)
        sscanf(strstr(r, "bytes_pulled"), "bytes_pulled %llu bytes_pushed %llu",
               &o->pulled, &o->pushed);
    if (r && strstr(r, "pages_pushed"))
        sscanf(strstr(r, "pages_pushed"), "pages_pushed %llu", &o->pages_pushed);
    if (r && strstr(r, "pages_changed"))
        sscanf(strstr(r, "pages_changed"), "pages_changed %llu errors %llu",
               &o->changed, &o->errors);
    printf("merger round: exit %d, pulled %llu, pushed %llu bytes, %llu pages "
           "changed, %llu errors\n", o->status, o->pulled, o->pushed, o->changed,
           o->errors);
}
