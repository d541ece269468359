/* The attack suite's probe (crates/cli/tests/attack.rs): each named probe
 * makes one attempt to reach past a sandbox and reports exactly how it
 * ended, one line each: `NAME ok`, `NAME errno ENAME` or `NAME signal N`.
 *
 * Every probe runs in a child of its own with a deadline, so a probe that
 * the seccomp filter kills (SIGSYS) or that blocks reports and the others
 * still run. Nothing a probe does outlives its child: mounts are made in a
 * mount namespace of the child's own on the host (see --host), keys go to
 * the child's process keyring, descriptors close when it exits, and no
 * probe writes to a kernel control file (opening one for writing is the
 * attempt).
 *
 *   attack-probe [--host] NAME...
 *
 * --host is the positive control: the same probes, run as root on the
 * host, where each must get past the point the sandbox refuses it. Probes
 * that mount first move the child into a private mount namespace, so the
 * host's mount table is never touched. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/perf_event.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/msg.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static int host_mode;

/* The result of a probe: 0 when the attempt succeeded, else its errno. */
static int fail(void) { return errno ? errno : EIO; }
static int check(long r) { return r < 0 ? fail() : 0; }

/* In --host mode, a child that mounts does so in a mount namespace of its
 * own, private all the way down, so nothing reaches the host's table. */
static int own_mount_ns(void) {
    if (!host_mode) return 0;
    if (unshare(CLONE_NEWNS) < 0) return fail();
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return fail();
    return 0;
}

/* A fresh directory under ATTACK_SCRATCH (a directory the test owns and
 * removes), else /tmp. */
static char scratch[256];
static const char *scratch_dir(void) {
    const char *base = getenv("ATTACK_SCRATCH");
    snprintf(scratch, sizeof scratch, "%s/attack-probe.XXXXXX", base ? base : "/tmp");
    return mkdtemp(scratch);
}

/* ---- mounts and namespaces ---- */

static int p_mount_tmpfs(void) {
    int e = own_mount_ns();
    if (e) return e;
    const char *d = scratch_dir();
    if (!d) return fail();
    int r = check(mount("none", d, "tmpfs", 0, NULL));
    if (r == 0) umount2(d, MNT_DETACH);
    rmdir(d);
    return r;
}

static int p_umount_proc(void) {
    int e = own_mount_ns();
    if (e) return e;
    return check(umount2("/proc", MNT_DETACH));
}

static int p_pivot_root(void) {
    int e = own_mount_ns();
    if (e) return e;
    if (host_mode) {
        /* pivot_root needs a mount point to pivot into. */
        const char *d = scratch_dir();
        if (!d || mount("none", d, "tmpfs", 0, NULL) < 0) return fail();
        if (chdir(d) < 0) return fail();
        return check(syscall(SYS_pivot_root, ".", "."));
    }
    return check(syscall(SYS_pivot_root, "/tmp", "/tmp"));
}

static int p_fsopen(void) {
    int e = own_mount_ns();
    if (e) return e;
    return check(syscall(SYS_fsopen, "tmpfs", 0));
}

static int p_open_tree(void) {
    int e = own_mount_ns();
    if (e) return e;
    return check(syscall(SYS_open_tree, AT_FDCWD, "/tmp", 1 /* OPEN_TREE_CLONE */));
}

static int p_move_mount(void) {
    int e = own_mount_ns();
    if (e) return e;
    const char *d = scratch_dir();
    if (!d) return fail();
    int fs = (int)syscall(SYS_fsopen, "tmpfs", 0);
    if (fs < 0) return fail();
    if (syscall(SYS_fsconfig, fs, 6 /* FSCONFIG_CMD_CREATE */, NULL, NULL, 0) < 0) return fail();
    int m = (int)syscall(SYS_fsmount, fs, 0, 0);
    if (m < 0) return fail();
    return check(syscall(SYS_move_mount, m, "", AT_FDCWD, d, 4 /* MOVE_MOUNT_F_EMPTY_PATH */));
}

static int p_mount_cgroup(void) {
    /* The cgroup v1 release_agent escape starts with mounting a hierarchy. */
    int e = own_mount_ns();
    if (e) return e;
    const char *d = scratch_dir();
    if (!d) return fail();
    int r = check(mount("cgroup2", d, "cgroup2", 0, NULL));
    if (r == 0) umount2(d, MNT_DETACH);
    rmdir(d);
    return r;
}

static int p_mknod_null(void) {
    const char *d = scratch_dir();
    if (!d) return fail();
    char path[96];
    snprintf(path, sizeof path, "%s/null", d);
    int r = check(mknod(path, S_IFCHR | 0600, makedev(1, 3)));
    unlink(path);
    rmdir(d);
    return r;
}

static int p_mknod_disk(void) {
    const char *d = scratch_dir();
    if (!d) return fail();
    char path[96];
    snprintf(path, sizeof path, "%s/sda", d);
    int r = check(mknod(path, S_IFBLK | 0600, makedev(8, 0)));
    unlink(path);
    rmdir(d);
    return r;
}

/* Its own mount namespace again: allowed for root on the host, and the
 * first step of entering any other. */
static int p_setns_mnt(void) {
    int fd = open("/proc/self/ns/mnt", O_RDONLY);
    /* gvisor has no namespace files: any descriptor asks the filter. */
    if (fd < 0 && errno == ENOENT) fd = open("/", O_RDONLY);
    if (fd < 0) return fail();
    return check(setns(fd, CLONE_NEWNS));
}

static int p_unshare_user(void) { return check(unshare(CLONE_NEWUSER)); }
static int p_unshare_mnt(void) { return check(unshare(CLONE_NEWNS)); }
static int p_unshare_net(void) { return check(unshare(CLONE_NEWNET)); }

static int p_clone_newuser(void) {
    long pid = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
    if (pid == 0) _exit(0);
    if (pid < 0) return fail();
    waitpid((pid_t)pid, NULL, 0);
    return 0;
}

/* ---- kernel interfaces in /proc and /sys ---- */

static int open_only(const char *path, int flags) {
    int fd = open(path, flags | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return fail();
    close(fd);
    return 0;
}

static int p_kcore(void) {
    int fd = open("/proc/kcore", O_RDONLY);
    if (fd < 0) return fail();
    char b[16];
    return read(fd, b, sizeof b) < 0 ? fail() : 0;
}
static int p_kmsg(void) { return open_only("/proc/kmsg", O_RDONLY | O_NONBLOCK); }
/* /proc/keys lists the keys the reader may view: a line means a key of
 * someone else's is in sight (the probe adds none of its own). */
static int p_proc_keys(void) {
    FILE *f = fopen("/proc/keys", "r");
    if (!f) return fail();
    char line[512];
    int lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    return lines ? 0 : ENOENT;
}
static int p_sysrq_trigger(void) { return open_only("/proc/sysrq-trigger", O_WRONLY); }
static int p_core_pattern(void) { return open_only("/proc/sys/kernel/core_pattern", O_WRONLY); }
static int p_sys_firmware(void) {
    DIR *d = opendir("/sys/firmware");
    if (!d) return fail();
    /* An empty directory (a masked one) hides nothing. */
    struct dirent *e;
    int entries = 0;
    while ((e = readdir(d))) entries += e->d_name[0] != '.';
    closedir(d);
    return entries ? 0 : ENOENT;
}
static int p_sys_kernel_write(void) { return open_only("/sys/kernel/uevent_helper", O_WRONLY); }
static int p_cgroup_release_agent(void) {
    return open_only("/sys/fs/cgroup/release_agent", O_WRONLY);
}
static int p_proc_sys_write(void) { return open_only("/proc/sys/vm/drop_caches", O_WRONLY); }

/* /proc/self/exe names the binary this process runs: writing through it
 * would change a file the host may run too (runc's CVE-2019-5736). */
static int p_proc_self_exe(void) { return open_only("/proc/self/exe", O_WRONLY); }

/* Every other process's exe (the sandbox's init, the shell or helper
 * that started this probe): none may be opened for writing. The probe's
 * own binary is left out: it is the task's file, and under gvisor, which
 * has no ETXTBSY, the task may write its own running binary
 * (proc_self_exe). Reports the first that opens, as ok. */
static int p_proc_any_exe(void) {
    struct stat self;
    if (stat("/proc/self/exe", &self) < 0) return fail();
    DIR *d = opendir("/proc");
    if (!d) return fail();
    struct dirent *e;
    int last = ENOENT, seen = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], target[256];
        snprintf(path, sizeof path, "/proc/%s/exe", e->d_name);
        struct stat st;
        int r;
        if (stat(path, &st) < 0) {
            r = fail();
        } else if (st.st_dev == self.st_dev && st.st_ino == self.st_ino) {
            continue;
        } else {
            r = open_only(path, O_WRONLY);
        }
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        if (r == 0) {
            fprintf(stderr, "%s (%s) opens for writing\n", path, target);
            closedir(d);
            return 0;
        }
        if (r == ENOENT) continue;
        if (seen && r != last) fprintf(stderr, "%s (%s): %s, others %s\n", path, target, strerrorname_np(r), strerrorname_np(last));
        seen++;
        last = r;
    }
    closedir(d);
    return seen ? last : ENOENT;
}

/* ---- other processes ---- */

static pid_t sleeper(void) {
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    return pid;
}
static void end(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static int p_ptrace_attach(void) {
    pid_t pid = sleeper();
    if (pid < 0) return fail();
    int r = check(syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, pid, 0, 0));
    end(pid);
    return r;
}

static int p_process_vm_readv(void) {
    pid_t pid = sleeper();
    if (pid < 0) return fail();
    static char buf[8];
    struct iovec local = {buf, sizeof buf}, remote = {buf, sizeof buf};
    int r = check(syscall(SYS_process_vm_readv, pid, &local, 1, &remote, 1, 0));
    end(pid);
    return r;
}

static int p_kcmp(void) {
    return check(syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0, 0));
}

static int p_pidfd_getfd(void) {
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0) return fail();
    return check(syscall(SYS_pidfd_getfd, pidfd, 0, 0));
}

/* SIGKILL to ATTACK_PID, a process outside the sandbox (on the host, the
 * test's own sleeper): from inside, that number names nothing. */
static int p_kill_outside(void) {
    const char *p = getenv("ATTACK_PID");
    if (!p) return EINVAL;
    return check(kill((pid_t)atoi(p), SIGKILL));
}

/* ---- the kernel's own attack surface ---- */

static int p_add_key(void) {
    return check(syscall(SYS_add_key, "user", "attack-probe", "x", 1, -2 /* KEY_SPEC_PROCESS_KEYRING */));
}
static int p_keyctl(void) {
    return check(syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* KEY_SPEC_SESSION_KEYRING */, 0));
}

static int pty_slave(void) {
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0) return -1;
    if (grantpt(m) < 0 || unlockpt(m) < 0) return -1;
    char *name = ptsname(m);
    if (!name) return -1;
    return open(name, O_RDWR | O_NOCTTY);
}
static int p_tiocsti(void) {
    int s = pty_slave();
    if (s < 0) return fail();
    char c = 'x';
    return check(ioctl(s, TIOCSTI, &c));
}
/* The kernel reads the request as 32 bits: a filter that compares all 64
 * would let 1<<32 | TIOCSTI through. */
static int p_tiocsti_high_bits(void) {
    int s = pty_slave();
    if (s < 0) return fail();
    char c = 'x';
    return check(syscall(SYS_ioctl, s, (1UL << 32) | TIOCSTI, &c));
}
static int p_tioclinux(void) {
    int s = pty_slave();
    if (s < 0) return fail();
    char sub = 2; /* TIOCL_SETSEL: a console's paste buffer */
    return check(ioctl(s, TIOCLINUX, &sub));
}

static int p_bpf(void) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 4;
    a.max_entries = 1;
    return check(syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof a));
}

static int p_perf_event_open(void) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.exclude_kernel = 1;
    return check(syscall(SYS_perf_event_open, &a, 0, -1, -1, 0));
}

static int p_userfaultfd(void) { return check(syscall(SYS_userfaultfd, O_CLOEXEC)); }

static int p_io_uring(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    return check(syscall(SYS_io_uring_setup, 1, &p));
}

/* Invalid arguments, so that on the host the call fails past its
 * permission check (EINVAL, EBADF, ENOENT) and never loads anything. */
static int p_kexec_load(void) { return check(syscall(SYS_kexec_load, 0, 0, NULL, 0xdead0000UL)); }
static int p_kexec_file_load(void) { return check(syscall(SYS_kexec_file_load, -1, -1, 0, "", 0xdead0000UL)); }
static int p_init_module(void) { return check(syscall(SYS_init_module, "", 0, "")); }
static int p_finit_module(void) { return check(syscall(SYS_finit_module, -1, "", 0)); }
static int p_delete_module(void) { return check(syscall(SYS_delete_module, "attack_probe_absent", O_NONBLOCK)); }
static int p_reboot(void) { return check(syscall(SYS_reboot, 0, 0, 0, NULL)); }
static int p_swapon(void) { return check(syscall(SYS_swapon, "/attack-probe-absent", 0)); }
static int p_syslog(void) { return check(syscall(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, NULL, 0)); }
static int p_settimeofday(void) {
    /* The time it is, set again: on the host nothing moves. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return check(clock_settime(CLOCK_REALTIME, &ts));
}

static int p_name_to_handle_at(void) {
    struct { unsigned int bytes; int type; unsigned char h[128]; } fh;
    fh.bytes = sizeof fh.h;
    int mnt;
    return check(syscall(SYS_name_to_handle_at, AT_FDCWD, "/", &fh, &mnt, 0));
}

/* The "shocker" escape: open a file by a forged handle on another mount. */
static int p_open_by_handle_at(void) {
    struct { unsigned int bytes; int type; unsigned char h[8]; } fh = {8, 1, {2, 0, 0, 0, 0, 0, 0, 0}};
    int root = open("/", O_RDONLY | O_DIRECTORY);
    if (root < 0) return fail();
    return check(syscall(SYS_open_by_handle_at, root, &fh, O_RDONLY));
}

/* ---- the 32-bit and x32 entry points ---- */

#if defined(__x86_64__)
static long int80(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory", "r8", "r9", "r10", "r11");
    return ret;
}
static int via_int80(long nr, long a, long b, long c) {
    long r = int80(nr, a, b, c);
    return r < 0 && r > -4096 ? (int)-r : 0;
}
/* i386 numbers: getpid 20, mount 21, ptrace 26, keyctl 288, unshare 310,
 * bpf 357. */
static int p_i386_getpid(void) { return via_int80(20, 0, 0, 0); }
static int p_i386_unshare(void) { return via_int80(310, CLONE_NEWUSER, 0, 0); }
static int p_i386_keyctl(void) { return via_int80(288, 0, -3, 0); }
static int p_i386_bpf(void) { return via_int80(357, 0, 0, 0); }
static int p_x32_getpid(void) { return check(syscall(0x40000000 | 39)); }
#endif

/* ---- sockets and the network ---- */

static int sock(int family, int type, int proto) {
    int s = socket(family, type | SOCK_CLOEXEC, proto);
    if (s < 0) return fail();
    close(s);
    return 0;
}
static int p_socket_raw(void) { return sock(AF_INET, SOCK_RAW, IPPROTO_ICMP); }
static int p_socket_packet(void) { return sock(AF_PACKET, SOCK_RAW, 0); }
static int p_socket_netlink_route(void) { return sock(AF_NETLINK, SOCK_RAW, 0); }
static int p_socket_netlink_audit(void) { return sock(AF_NETLINK, SOCK_RAW, 9 /* NETLINK_AUDIT */); }
static int p_socket_vsock(void) { return sock(40 /* AF_VSOCK */, SOCK_STREAM, 0); }

/* Connects to ATTACK_ADDR (host:port, numeric) within two seconds. */
static int connect_env(const char *var) {
    const char *spec = getenv(var);
    if (!spec) return EINVAL;
    char host[64];
    snprintf(host, sizeof host, "%s", spec);
    char *colon = strrchr(host, ':');
    if (!colon) return EINVAL;
    *colon = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return EINVAL;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return fail();
    struct timeval tv = {2, 0};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return check(connect(s, (struct sockaddr *)&a, sizeof a));
}
static int p_connect_daemon(void) { return connect_env("ATTACK_DAEMON"); }
static int p_connect_metadata(void) { return connect_env("ATTACK_METADATA"); }
static int p_connect_host(void) { return connect_env("ATTACK_HOST"); }

/* An abstract socket named by ATTACK_ABSTRACT (without the leading NUL). */
static int p_connect_abstract(void) {
    const char *name = getenv("ATTACK_ABSTRACT");
    if (!name) return EINVAL;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    if (n + 1 > sizeof a.sun_path) return EINVAL;
    memcpy(a.sun_path + 1, name, n);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return fail();
    return check(connect(s, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)));
}

/* The unix socket at the path ATTACK_UNIX. */
static int p_connect_unix(void) {
    const char *path = getenv("ATTACK_UNIX");
    if (!path) return EINVAL;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return ENAMETOOLONG;
    strcpy(a.sun_path, path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return fail();
    return check(connect(s, (struct sockaddr *)&a, sizeof a));
}

/* Opens the file or directory ATTACK_PATH for reading. */
static int p_open_path(void) {
    const char *path = getenv("ATTACK_PATH");
    if (!path) return EINVAL;
    return open_only(path, O_RDONLY);
}

/* SysV IPC by the key ATTACK_IPC_KEY (hex): a neighbour's segment and
 * queue must not be found. */
static int p_shm_neighbour(void) {
    const char *k = getenv("ATTACK_IPC_KEY");
    if (!k) return EINVAL;
    return check(shmget((key_t)strtol(k, NULL, 16), 0, 0));
}
static int p_msg_neighbour(void) {
    const char *k = getenv("ATTACK_IPC_KEY");
    if (!k) return EINVAL;
    return check(msgget((key_t)strtol(k, NULL, 16), 0));
}

/* ---- what this process was handed ---- */

/* Descriptors beyond 0, 1 and 2 this process was started with: reported
 * as ok (and listed on stderr) if there is any. Runs before the fork. */
static int inherited_fds[64];
static int inherited_count;
static void record_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int own = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd > 2 && fd != own && inherited_count < 64) inherited_fds[inherited_count++] = fd;
    }
    closedir(d);
}
static int p_leaked_fds(void) {
    for (int i = 0; i < inherited_count; i++) {
        char link[64], target[256];
        snprintf(link, sizeof link, "/proc/self/fd/%d", inherited_fds[i]);
        ssize_t n = readlink(link, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        fprintf(stderr, "fd %d -> %s\n", inherited_fds[i], target);
    }
    return inherited_count ? 0 : ENOENT;
}

struct probe {
    const char *name;
    int (*run)(void);
};

static const struct probe PROBES[] = {
    {"mount_tmpfs", p_mount_tmpfs},
    {"umount_proc", p_umount_proc},
    {"pivot_root", p_pivot_root},
    {"fsopen", p_fsopen},
    {"open_tree", p_open_tree},
    {"move_mount", p_move_mount},
    {"mount_cgroup", p_mount_cgroup},
    {"mknod_null", p_mknod_null},
    {"mknod_disk", p_mknod_disk},
    {"setns_mnt", p_setns_mnt},
    {"unshare_user", p_unshare_user},
    {"unshare_mnt", p_unshare_mnt},
    {"unshare_net", p_unshare_net},
    {"clone_newuser", p_clone_newuser},
    {"kcore", p_kcore},
    {"kmsg", p_kmsg},
    {"proc_keys", p_proc_keys},
    {"sysrq_trigger", p_sysrq_trigger},
    {"core_pattern", p_core_pattern},
    {"sys_firmware", p_sys_firmware},
    {"uevent_helper", p_sys_kernel_write},
    {"release_agent", p_cgroup_release_agent},
    {"drop_caches", p_proc_sys_write},
    {"proc_self_exe", p_proc_self_exe},
    {"proc_any_exe", p_proc_any_exe},
    {"ptrace_attach", p_ptrace_attach},
    {"process_vm_readv", p_process_vm_readv},
    {"kcmp", p_kcmp},
    {"pidfd_getfd", p_pidfd_getfd},
    {"kill_outside", p_kill_outside},
    {"add_key", p_add_key},
    {"keyctl", p_keyctl},
    {"tiocsti", p_tiocsti},
    {"tiocsti_high_bits", p_tiocsti_high_bits},
    {"tioclinux", p_tioclinux},
    {"bpf", p_bpf},
    {"perf_event_open", p_perf_event_open},
    {"userfaultfd", p_userfaultfd},
    {"io_uring_setup", p_io_uring},
    {"kexec_load", p_kexec_load},
    {"kexec_file_load", p_kexec_file_load},
    {"init_module", p_init_module},
    {"finit_module", p_finit_module},
    {"delete_module", p_delete_module},
    {"reboot", p_reboot},
    {"swapon", p_swapon},
    {"syslog", p_syslog},
    {"clock_settime", p_settimeofday},
    {"name_to_handle_at", p_name_to_handle_at},
    {"open_by_handle_at", p_open_by_handle_at},
#if defined(__x86_64__)
    {"i386_getpid", p_i386_getpid},
    {"i386_unshare", p_i386_unshare},
    {"i386_keyctl", p_i386_keyctl},
    {"i386_bpf", p_i386_bpf},
    {"x32_getpid", p_x32_getpid},
#endif
    {"socket_raw", p_socket_raw},
    {"socket_packet", p_socket_packet},
    {"socket_netlink_route", p_socket_netlink_route},
    {"socket_netlink_audit", p_socket_netlink_audit},
    {"socket_vsock", p_socket_vsock},
    {"connect_daemon", p_connect_daemon},
    {"connect_metadata", p_connect_metadata},
    {"connect_host", p_connect_host},
    {"connect_abstract", p_connect_abstract},
    {"connect_unix", p_connect_unix},
    {"open_path", p_open_path},
    {"shm_neighbour", p_shm_neighbour},
    {"msg_neighbour", p_msg_neighbour},
    {"leaked_fds", p_leaked_fds},
};

static void run_one(const struct probe *p) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        printf("%s fork-failed %s\n", p->name, strerrorname_np(errno));
        return;
    }
    if (pid == 0) {
        alarm(10);
        errno = 0;
        int e = p->run();
        fflush(stderr);
        /* The errno travels in the exit code; 0 is success. */
        _exit(e > 255 ? 255 : e);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(st)) {
        printf("%s signal %d\n", p->name, WTERMSIG(st));
    } else if (WEXITSTATUS(st) == 0) {
        printf("%s ok\n", p->name);
    } else {
        const char *n = strerrorname_np(WEXITSTATUS(st));
        printf("%s errno %s\n", p->name, n ? n : "?");
    }
}

/* --hold KEY NAME: what a neighbour holds for the others to reach for: a
 * SysV shared memory segment and message queue under KEY (hex) and a
 * listener on the abstract socket NAME. Prints "ready" and waits. */
static int hold(const char *key, const char *name) {
    key_t k = (key_t)strtol(key, NULL, 16);
    if (shmget(k, 4096, IPC_CREAT | 0666) < 0 || msgget(k, IPC_CREAT | 0666) < 0) {
        perror("attack-probe: ipc");
        return 1;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    if (n + 1 > sizeof a.sun_path) return 1;
    memcpy(a.sun_path + 1, name, n);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) < 0 || listen(s, 8) < 0) {
        perror("attack-probe: abstract socket");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c >= 0) close(c);
    }
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--hold") == 0) return hold(argv[2], argv[3]);
    record_fds();
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "--host") == 0) {
        host_mode = 1;
        first = 2;
    }
    if (argc > first && strcmp(argv[first], "--list") == 0) {
        for (size_t i = 0; i < sizeof PROBES / sizeof PROBES[0]; i++) printf("%s\n", PROBES[i].name);
        return 0;
    }
    for (int i = first; i < argc; i++) {
        size_t j;
        for (j = 0; j < sizeof PROBES / sizeof PROBES[0]; j++) {
            if (strcmp(PROBES[j].name, argv[i]) == 0) {
                run_one(&PROBES[j]);
                break;
            }
        }
        if (j == sizeof PROBES / sizeof PROBES[0]) {
            fprintf(stderr, "attack-probe: no probe named %s\n", argv[i]);
            return 2;
        }
    }
    return 0;
}
