/*
 * The task-escape suite's probe: run inside an isolated task, it makes each system
 * call the default seccomp filter denies and prints one line per call,
 * "<probe> <outcome>", the outcome being "ok" or the errno's name (EPERM, ENOSYS, ...).
 *
 * Arguments are chosen so that, without a filter, most calls answer something other
 * than EPERM (success, EINVAL, EBADF, ENOENT, EFAULT): an EPERM then comes from the
 * filter, not from a missing capability. Calls that would change the process (unshare,
 * clone, ptrace, personality) run in a child. Built by the exec and java tests with
 * `cc -static`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/keyctl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
/* The same number on every architecture (the generic table's). */
#ifndef SYS_io_uring_setup
#define SYS_io_uring_setup 425
#define SYS_io_uring_enter 426
#define SYS_io_uring_register 427
#endif
#ifndef SYS_lookup_dcookie
#define SYS_lookup_dcookie 212
#endif

static const char *name(int e) {
    switch (e) {
    case 0: return "ok";
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EINVAL: return "EINVAL";
    case EBADF: return "EBADF";
    case ENOENT: return "ENOENT";
    case EFAULT: return "EFAULT";
    case EACCES: return "EACCES";
    case ENOKEY: return "ENOKEY";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case ESRCH: return "ESRCH";
    default: {
        static char buf[32];
        snprintf(buf, sizeof buf, "errno%d", e);
        return buf;
    }
    }
}

static void report(const char *probe, long rc) {
    printf("%s %s\n", probe, rc < 0 ? name(errno) : "ok");
    fflush(stdout);
}

/* In a child: the call's outcome comes back as the exit code (0 or the errno). */
static void in_child(const char *probe, long (*call)(void)) {
    pid_t pid = fork();
    if (pid == 0) {
        long rc = call();
        _exit(rc < 0 ? errno : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 200;
    printf("%s %s\n", probe, name(code));
    fflush(stdout);
}

static long do_unshare_user(void) { return unshare(CLONE_NEWUSER); }
static long do_unshare_net(void) { return unshare(CLONE_NEWNET); }
static long do_clone_user(void) {
    /* Like fork (no new stack), but into a new user namespace. */
    long rc = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (rc == 0) _exit(0);
    if (rc > 0) waitpid((pid_t)rc, 0, 0);
    return rc < 0 ? -1 : 0;
}
static long do_fork(void) {
    long rc = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (rc == 0) _exit(0);
    if (rc > 0) waitpid((pid_t)rc, 0, 0);
    return rc < 0 ? -1 : 0;
}
static long do_traceme(void) { return ptrace(PTRACE_TRACEME, 0, 0, 0); }
static long do_attach_init(void) { return ptrace(PTRACE_ATTACH, 1, 0, 0); }
static long do_no_aslr(void) { return personality(ADDR_NO_RANDOMIZE); }
static long do_personality_query(void) { return personality(0xffffffff); }

int main(void) {
    /* New namespaces: the way to a user namespace with every capability in it. */
    in_child("unshare-user", do_unshare_user);
    in_child("unshare-net", do_unshare_net);
    in_child("clone-newuser", do_clone_user);
    report("clone3", syscall(SYS_clone3, 0, 0));
    report("setns", syscall(SYS_setns, -1, 0));
    /* Mounts. */
    report("mount", syscall(SYS_mount, 0, 0, 0, 0, 0));
    report("umount2", syscall(SYS_umount2, "/drover-no-such-dir", 0));
    report("pivot_root", syscall(SYS_pivot_root, "/drover-no-such-dir", "/drover-no-such-dir"));
    report("fsopen", syscall(SYS_fsopen, "drover-no-such-fs", 0));
    report("open_tree", syscall(SYS_open_tree, -1, "", 0));
    report("move_mount", syscall(SYS_move_mount, -1, "", -1, "", 0));
    /* Keys. */
    report("keyctl", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0));
    report("add_key", syscall(SYS_add_key, "user", "drover-escape", "x", 1, KEY_SPEC_PROCESS_KEYRING));
    report("request_key", syscall(SYS_request_key, "user", "drover-no-such-key", 0, 0));
    /* BPF, perf, userfaultfd. */
    report("bpf", syscall(SYS_bpf, 9999, 0, 0));
    report("perf_event_open", syscall(SYS_perf_event_open, 0, 0, -1, -1, 0));
    report("userfaultfd", syscall(SYS_userfaultfd, 0));
    /* The kernel itself. */
    report("kexec_load", syscall(SYS_kexec_load, 0, 0, 0, 0));
    report("init_module", syscall(SYS_init_module, 0, 0, ""));
    report("finit_module", syscall(SYS_finit_module, -1, "", 0));
    report("delete_module", syscall(SYS_delete_module, "drover_no_such_module", 0));
    report("reboot", syscall(SYS_reboot, 0, 0, 0, 0));
    report("swapon", syscall(SYS_swapon, "/drover-no-such-file", 0));
    report("swapoff", syscall(SYS_swapoff, "/drover-no-such-file"));
    report("acct", syscall(SYS_acct, 0));
    report("quotactl", syscall(SYS_quotactl, 0, 0, 0, 0));
    report("lookup_dcookie", syscall(SYS_lookup_dcookie, 0, 0, 0));
    report("open_by_handle_at", syscall(SYS_open_by_handle_at, -1, 0, 0));
    /* Clocks. */
    report("settimeofday", syscall(SYS_settimeofday, 0, 0));
    struct timespec ts = {0, 0};
    report("clock_settime", syscall(SYS_clock_settime, CLOCK_MONOTONIC, &ts));
    struct timex tx;
    memset(&tx, 0, sizeof tx);
    report("adjtimex", syscall(SYS_adjtimex, &tx));
    memset(&tx, 0, sizeof tx);
    report("clock_adjtime", syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx));
    /* Other processes. */
    in_child("ptrace-traceme", do_traceme);
    in_child("ptrace-attach-init", do_attach_init);
    report("process_vm_readv", syscall(SYS_process_vm_readv, getpid(), 0, 0, 0, 0, 0));
    report("process_vm_writev", syscall(SYS_process_vm_writev, getpid(), 0, 0, 0, 0, 0));
    /* io_uring: a ring would run operations (IORING_OP_SOCKET, ...) no filter sees.
     * Without the filter, setup with zeroed params (struct io_uring_params is 120
     * bytes) makes a ring, and enter/register on fd -1 answer EBADF. */
    {
        char params[120];
        memset(params, 0, sizeof params);
        report("io_uring_setup", syscall(SYS_io_uring_setup, 1, params));
    }
    report("io_uring_enter", syscall(SYS_io_uring_enter, -1, 0, 0, 0, 0, 0));
    report("io_uring_register", syscall(SYS_io_uring_register, -1, 0, 0, 0));
    /* Odds and ends. */
    in_child("personality-no-aslr", do_no_aslr);
    report("socket-vsock", syscall(SYS_socket, AF_VSOCK, SOCK_STREAM, 0));
    /* What must keep working under the filter. */
    in_child("allowed-fork", do_fork);
    in_child("allowed-personality-query", do_personality_query);
    report("allowed-getpid", syscall(SYS_getpid));
    printf("done\n");
    return 0;
}
