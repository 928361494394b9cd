/* linux-check's vsock client, run by the guest's /init: connects to the host (CID 2) on
 * port 5000, sends 64 KiB of a pattern, reads it back (the host echoes) and prints "ok"
 * or what went wrong. Built static by linux-check.sh. */
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BYTES 65536

int main(void) {
	static unsigned char out[BYTES], back[BYTES];
	struct sockaddr_vm host = {.svm_family = AF_VSOCK, .svm_cid = 2, .svm_port = 5000};
	int s = socket(AF_VSOCK, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&host, sizeof host)) {
		perror("connect");
		return 1;
	}
	for (int i = 0; i < BYTES; i++) out[i] = (unsigned char)(i * 31 + 7);
	for (size_t at = 0; at < BYTES;) {
		ssize_t n = write(s, out + at, BYTES - at);
		if (n <= 0) return perror("write"), 1;
		at += (size_t)n;
	}
	for (size_t at = 0; at < BYTES;) {
		ssize_t n = read(s, back + at, BYTES - at);
		if (n <= 0) return perror("read"), 1;
		at += (size_t)n;
	}
	puts(memcmp(out, back, BYTES) ? "differ" : "ok");
	return 0;
}
