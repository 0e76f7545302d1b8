/* launch: the programs' entry point in the relocatable tarball (make dist).
 *
 * The tarball holds each program in libexec/bloomgrid/ and every shared
 * library it needs, the dynamic loader included, in lib/.  This launcher,
 * copied to bin/ under each program's name, runs
 *
 *     ROOT/libexec/bloomgrid/loader/NAME --library-path ROOT/lib \
 *         --argv0 ARGV0 ROOT/libexec/bloomgrid/NAME ARGS...
 *
 * ROOT being the directory above its own bin/, wherever the tarball was
 * unpacked, and loader/NAME a relative symlink to the bundled loader in
 * lib/ (named after the program so that ps, pidof and pkill see the
 * program's name, not the loader's).  Running the bundled loader by hand,
 * rather than through the program's PT_INTERP (an absolute path), is what
 * makes the tree relocatable and independent of the machine's glibc: only
 * the kernel is the machine's.
 *
 * It is linked statically and finds itself from AT_EXECFN, needing neither
 * /proc nor /bin/sh: it runs in a root that holds nothing but the unpacked
 * tarball.  The loader runs the program in this same process, so its pid,
 * signals and exit status are the program's. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

/* launch_self: the launcher's own path, symlinks resolved, in BUF (PATH_MAX).
 * AT_EXECFN is the name execve was given (relative to the cwd at exec, which
 * is still ours); /proc/self/exe is the fallback where it is not usable.
 * Returns 0 or a negative errno. */
static int launch_self(char *buf)
{
    const char *fn = (const char *)getauxval(AT_EXECFN);
    if (fn && realpath(fn, buf))
        return 0;
    ssize_t n = readlink("/proc/self/exe", buf, PATH_MAX - 1);
    if (n <= 0)
        return -ENOENT;
    buf[n] = '\0';
    return 0;
}

int main(int argc, char **argv)
{
    char self[PATH_MAX], root[PATH_MAX];
    char loader[PATH_MAX], libdir[PATH_MAX], prog[PATH_MAX];

    if (launch_self(self) < 0) {
        fprintf(stderr, "bloomgrid launcher: cannot find its own path (%s)\n",
                argc > 0 ? argv[0] : "?");
        return 127;
    }
    /* SELF is ROOT/bin/NAME (ROOT is "" when the tarball is unpacked at /). */
    snprintf(root, sizeof root, "%s", self);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(root, '/');
        if (!slash) {
            fprintf(stderr, "bloomgrid launcher: %s is not in a bin/ directory\n", self);
            return 127;
        }
        *slash = '\0';
    }
    const char *name = strrchr(self, '/') + 1;

    if (snprintf(loader, sizeof loader, "%s/libexec/bloomgrid/loader/%s", root, name) >=
            (int)sizeof loader ||
        snprintf(libdir, sizeof libdir, "%s/lib", root) >= (int)sizeof libdir ||
        snprintf(prog, sizeof prog, "%s/libexec/bloomgrid/%s", root, name) >= (int)sizeof prog) {
        fprintf(stderr, "bloomgrid launcher: path too long: %s\n", root);
        return 127;
    }
    if (access(prog, X_OK) != 0 || access(loader, X_OK) != 0) {
        fprintf(stderr, "bloomgrid launcher: %s: %s (a launcher in bin/ runs the program "
                "of its own name from ../libexec/bloomgrid/)\n",
                access(prog, X_OK) != 0 ? prog : loader, strerror(errno));
        return 127;
    }

    char **args = calloc((size_t)argc + 6, sizeof *args);
    if (!args) {
        fprintf(stderr, "bloomgrid launcher: out of memory\n");
        return 127;
    }
    int i = 0;
    args[i++] = loader;
    args[i++] = "--library-path";
    args[i++] = libdir;
    args[i++] = "--argv0";
    args[i++] = argc > 0 ? argv[0] : (char *)name;
    args[i++] = prog;
    for (int a = 1; a < argc; a++)
        args[i++] = argv[a];
    args[i] = NULL;
    execv(loader, args);
    fprintf(stderr, "bloomgrid launcher: cannot run %s: %s\n", loader, strerror(errno));
    free(args);
    return 127;
}
