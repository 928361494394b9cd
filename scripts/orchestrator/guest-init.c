// The init of orchestrator-check.sh's container guests, in place of firecracker-containerd's
// image-builder rootfs (Debian with systemd, which this nested host takes minutes to start).
// It does what that image's overlay-init and firecracker-agent.service do: a writable layer
// over the read-only root, the file systems runc needs, then the agent; when the agent ends
// the VM reboots (the unit's SuccessAction=reboot), which with reboot=k ends the VMM.
// C with system calls, not a shell: every exec on this host risks its TLS segfault
// (docs/linux.md), so init execs nothing but the agent.
//   gcc -static -O2 -o overlay-init guest-init.c
//   kernel command line: init=/sbin/overlay-init
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void say(const char *what, const char *where) {
  fprintf(stderr, "overlay-init: %s %s: %s\n", what, where, strerror(errno));
}

static void mnt(const char *src, const char *dst, const char *type, unsigned long flags,
                const char *data) {
  mkdir(dst, 0755);
  if (mount(src, dst, type, flags, data) != 0) say("cannot mount", dst);
}

int main(void) {
  // The writable layer: a tmpfs under an overlay of the read-only root, then pivot_root
  // into it with the old root at /rom, as the image-builder's overlay-init does.
  mnt("tmpfs", "/overlay", "tmpfs", 0, "mode=0755");
  mkdir("/overlay/root", 0755);
  mkdir("/overlay/work", 0755);
  mnt("overlay", "/mnt", "overlay", MS_NOATIME,
      "lowerdir=/,upperdir=/overlay/root,workdir=/overlay/work");
  mkdir("/mnt/rom", 0755);
  if (chdir("/mnt") != 0 || syscall(SYS_pivot_root, ".", "rom") != 0) {
    say("cannot pivot_root into", "/mnt");
  } else if (chdir("/") != 0) {
    say("cannot chdir to", "/");
  }
  mnt("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  mnt("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  mnt("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, NULL);
  mnt("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "ptmxmode=0666,newinstance");
  mnt("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, NULL);
  mnt("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  mnt("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  mnt("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
  mnt("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, NULL);
  mkdir("/container", 0755);
  mkdir("/volumes", 0755);
  sethostname("exitless-guest", 14);

  const char *agent = "/usr/local/bin/agent";
  fprintf(stderr, "overlay-init: starting %s\n", agent);
  pid_t pid = fork();
  if (pid == 0) {
    if (chdir("/container") != 0) say("cannot chdir to", "/container");
    char *const args[] = {(char *)agent, "-debug", NULL};
    char *const env[] = {"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    execve(agent, args, env);
    say("cannot exec", agent);
    _exit(127);
  }
  int status = 0;
  // PID 1 reaps every orphan; the agent's end is what ends the VM.
  for (;;) {
    pid_t got = wait(&status);
    if (got == pid || (got < 0 && errno == ECHILD)) break;
  }
  fprintf(stderr, "overlay-init: agent ended (status %d); rebooting\n", status);
  sync();
  reboot(RB_AUTOBOOT);
  return 0;
}
