// This host's ceiling for the vsock lab's shape, without a VM: a client writes 64 KiB
// chunks into a Unix stream socket and reads the echo on the same socket; an echo thread
// (standing in for the VMM's vsock device thread) reads the other end in READ-byte calls
// and writes everything back in WRITE-byte calls (docs/benchmarks.md, vsock).
//   gcc -O2 -pthread -o /tmp/unix-echo scripts/unix-echo.c && /tmp/unix-echo READ [WRITE]
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static int sv[2];
static size_t total = 1ULL << 30;
static size_t per = 4096, wper = 4096;
static void *echo(void *a) {
	char *buf = malloc(65536);
	size_t done = 0;
	while (done < total) {
		ssize_t n = read(sv[1], buf, per);
		if (n <= 0) break;
		for (ssize_t w = 0; w < n;) { ssize_t k = write(sv[1], buf + w, (size_t)(n - w) < wper ? (size_t)(n - w) : wper); if (k <= 0) return 0; w += k; }
		done += n;
	}
	return 0;
}
static void *writer(void *a) {
	char *buf = malloc(65536); memset(buf, 7, 65536);
	for (size_t at = 0; at < total; at += 65536)
		for (size_t w = 0; w < 65536;) { ssize_t k = write(sv[0], buf + w, 65536 - w); if (k <= 0) return 0; w += k; }
	return 0;
}
int main(int argc, char **argv) {
	if (argc > 1) per = wper = atoi(argv[1]);
	if (argc > 2) wper = atoi(argv[2]);
	socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_t e, w; pthread_create(&e, 0, echo, 0); pthread_create(&w, 0, writer, 0);
	char *buf = malloc(65536); size_t seen = 0;
	while (seen < total) { ssize_t n = read(sv[0], buf, 65536); if (n <= 0) break; seen += n; }
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("read %zu-byte, write %zu-byte calls: %.2f GB/s\n", per, wper, total / s / 1e9);
	return 0;
}
