/*
 * `bench fs`'s workload: the same program times the host's own filesystem (run by the lab)
 * and virtio-fs (as a Linux guest's /init, mounting the share itself), so both sides make
 * the same calls on the same files.
 *   fsbench MODE DIR FILE MIB RUNS NFILES FILEBYTES COLD
 * (as /init, the same words comma-separated in the kernel's `fsbench=` word, which init
 * gets in its environment: words the VMM appends to the command line cannot reach them)
 * MODE: host, or guest (PID 1: mounts /proc and the virtio-fs tag "fsbench" on DIR, drops
 * its own page cache before each read pass so every byte crosses virtio-fs, and powers the
 * VM off at the end). FILE (DIR/FILE, MIB MiB) is read sequentially in 1 MiB read()s: once
 * untimed (the checksum both sides must agree on; it also leaves the host's page cache
 * warm), then COLD (1: one pass first, the host's cache of the file dropped beforehand:
 * by posix_fadvise here on the host, by the lab before it boots a guest) and RUNS passes
 * with the host's cache warm. Then RUNS times: NFILES files of FILEBYTES bytes created in
 * DIR/small (open O_CREAT|O_EXCL, write, close), each stat()ed (the guest's dentry and
 * inode caches dropped first: each stat is a lookup by virtiofsd; the host's are warm)
 * and its size checked, and all removed.
 * Each timing is a line "FSBENCH <pass> <run> <count> <ns>" on stdout; then "FSBENCH
 * checksum <hex>", "FSBENCH bad <n>" (files whose size was wrong, short reads), "FSBENCH
 * done". A failure prints "FSBENCH error <what>" and ends the run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int guest;

static void out(const char *fmt, ...) {
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof line - 1) n = sizeof line - 1;
	if (write(1, line, (size_t)n) < 0) { /* nowhere to say it */ }
}

static void finish(int code) {
	if (guest) {
		sync();
		reboot(RB_POWER_OFF);
	}
	exit(code);
}

static void die(const char *what) {
	out("FSBENCH error %s: %s\n", what, strerror(errno));
	finish(1);
}

static uint64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The guest's own page cache, dentries and inodes: what would answer instead of virtio-fs. */
static void drop_guest_caches(void) {
	if (!guest) return;
	sync();
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0 || write(fd, "3\n", 2) != 2) die("drop_caches");
	close(fd);
}

static char buf[1 << 20];

/* Reads `path` whole; returns the bytes read; `sum` gets a checksum when not NULL. */
static uint64_t read_whole(const char *path, uint64_t *sum) {
	int fd = open(path, O_RDONLY);
	if (fd < 0) die("open the large file");
	uint64_t total = 0, s = 0;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n < 0) die("read the large file");
		if (n == 0) break;
		if (sum)
			for (ssize_t i = 0; i + 8 <= n; i += 8) {
				uint64_t w;
				memcpy(&w, buf + i, 8);
				s = (s ^ w) * 0x100000001b3ull;
			}
		total += (uint64_t)n;
	}
	close(fd);
	if (sum) *sum = s;
	return total;
}

static void timed_read(const char *pass, int run, const char *path, uint64_t want, uint64_t *bad) {
	drop_guest_caches();
	uint64_t t0 = now_ns(), n = read_whole(path, NULL), t1 = now_ns();
	if (n != want) ++*bad;
	out("FSBENCH %s %d %llu %llu\n", pass, run, (unsigned long long)n, (unsigned long long)(t1 - t0));
}

int main(int argc, char **argv) {
	char *words[9], *env = getenv("fsbench");
	if (getpid() == 1 && env) {
		words[0] = argv[0];
		argc = 1;
		for (char *w = strtok(env, ","); w && argc < 9; w = strtok(NULL, ",")) words[argc++] = w;
		argv = words;
	}
	if (argc != 9) {
		out("FSBENCH error usage: fsbench host|guest DIR FILE MIB RUNS NFILES FILEBYTES COLD\n");
		if (getpid() == 1) { guest = 1; finish(2); }
		return 2;
	}
	guest = strcmp(argv[1], "guest") == 0;
	const char *dir = argv[2], *file = argv[3];
	uint64_t mib = strtoull(argv[4], NULL, 0);
	int runs = atoi(argv[5]), nfiles = atoi(argv[6]), filebytes = atoi(argv[7]), cold = atoi(argv[8]);
	if (runs < 1 || nfiles < 1 || filebytes < 0 || filebytes > (int)sizeof buf) {
		out("FSBENCH error bad parameters\n");
		finish(2);
	}
	if (guest) {
		mkdir("/proc", 0555);
		if (mount("proc", "/proc", "proc", 0, NULL) && errno != EBUSY) die("mount /proc");
		mkdir(dir, 0755);
		if (mount("fsbench", dir, "virtiofs", 0, NULL)) die("mount -t virtiofs fsbench");
	}
	char path[4096], small[4096];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	snprintf(small, sizeof small, "%s/small", dir);
	uint64_t want = mib << 20, bad = 0, sum = 0;

	if (cold) {
		if (!guest) {
			int fd = open(path, O_RDONLY);
			if (fd < 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)) die("drop the large file's pages");
			close(fd);
		}
		timed_read("seq-cold", 1, path, want, &bad);
	}
	drop_guest_caches();
	if (read_whole(path, &sum) != want) bad++;
	out("FSBENCH checksum %016llx\n", (unsigned long long)sum);
	for (int r = 1; r <= runs; r++) timed_read("seq-warm", r, path, want, &bad);

	memset(buf, 0x5a, (size_t)filebytes);
	for (int r = 1; r <= runs; r++) {
		char name[4200];
		if (mkdir(small, 0755) && errno != EEXIST) die("mkdir small");
		uint64_t t0 = now_ns();
		for (int i = 0; i < nfiles; i++) {
			snprintf(name, sizeof name, "%s/f%06d", small, i);
			int fd = open(name, O_CREAT | O_EXCL | O_WRONLY, 0644);
			if (fd < 0) die("create a small file");
			if (write(fd, buf, (size_t)filebytes) != filebytes) die("write a small file");
			if (close(fd)) die("close a small file");
		}
		uint64_t t1 = now_ns();
		out("FSBENCH create %d %d %llu\n", r, nfiles, (unsigned long long)(t1 - t0));
		drop_guest_caches();
		t0 = now_ns();
		for (int i = 0; i < nfiles; i++) {
			struct stat st;
			snprintf(name, sizeof name, "%s/f%06d", small, i);
			if (stat(name, &st)) die("stat a small file");
			if (st.st_size != filebytes) bad++;
		}
		t1 = now_ns();
		out("FSBENCH stat %d %d %llu\n", r, nfiles, (unsigned long long)(t1 - t0));
		t0 = now_ns();
		for (int i = 0; i < nfiles; i++) {
			snprintf(name, sizeof name, "%s/f%06d", small, i);
			if (unlink(name)) die("remove a small file");
		}
		t1 = now_ns();
		if (rmdir(small)) die("rmdir small");
		out("FSBENCH remove %d %d %llu\n", r, nfiles, (unsigned long long)(t1 - t0));
	}
	out("FSBENCH bad %llu\n", (unsigned long long)bad);
	if (guest && umount(dir)) die("umount");
	out("FSBENCH done\n");
	finish(0);
	return 0;
}
