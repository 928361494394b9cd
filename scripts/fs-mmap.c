/* The virtio-fs check's mmap helper (a static binary in the guest's initramfs):
 *   fs-mmap write FILE BYTES   sizes FILE, writes "exitless-mmap-N\n" lines through a
 *                              shared mapping, msyncs and fsyncs it
 *   fs-mmap read FILE          prints FILE's bytes read through a mapping
 * Exits non-zero on any failure. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
	if (argc == 4 && !strcmp(argv[1], "write")) {
		size_t len = strtoul(argv[3], 0, 0);
		int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || ftruncate(fd, len)) return perror("open"), 1;
		char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) return perror("mmap"), 1;
		size_t at = 0;
		for (unsigned n = 0; at < len; n++) {
			char line[32];
			int l = snprintf(line, sizeof line, "exitless-mmap-%u\n", n);
			for (int i = 0; i < l && at < len; i++) p[at++] = line[i];
		}
		if (msync(p, len, MS_SYNC) || fsync(fd)) return perror("sync"), 1;
		return munmap(p, len) || close(fd);
	}
	if (argc == 3 && !strcmp(argv[1], "read")) {
		int fd = open(argv[2], O_RDONLY);
		struct stat st;
		if (fd < 0 || fstat(fd, &st)) return perror("open"), 1;
		char *p = mmap(0, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) return perror("mmap"), 1;
		return fwrite(p, 1, st.st_size, stdout) != (size_t)st.st_size;
	}
	fprintf(stderr, "usage: fs-mmap write FILE BYTES | fs-mmap read FILE\n");
	return 2;
}
