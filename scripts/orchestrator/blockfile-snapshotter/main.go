// blockfile-snapshotter serves containerd's blockfile snapshotter (each snapshot an ext4
// image file) as a proxy snapshotter on a Unix socket. orchestrator-check.sh runs it for
// firecracker-containerd because this host has no device-mapper, so the devmapper
// snapshotter firecracker-containerd documents cannot run here; the shim hands a
// blockfile snapshot to the VM as a drive, as it would a devmapper thin device.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/snapshots/blockfile"
	"google.golang.org/grpc"
)

func main() {
	socket := flag.String("socket", "", "Unix socket to serve the snapshots API on")
	root := flag.String("root", "", "directory for the snapshots' image files")
	scratch := flag.String("scratch", "", "an empty ext4 image every new snapshot starts from")
	flag.Parse()
	if *socket == "" || *root == "" || *scratch == "" {
		fmt.Fprintln(os.Stderr, "blockfile-snapshotter: --socket, --root and --scratch are required")
		os.Exit(2)
	}
	sn, err := blockfile.NewSnapshotter(*root, blockfile.WithScratchFile(*scratch))
	if err != nil {
		fmt.Fprintf(os.Stderr, "blockfile-snapshotter: %v\n", err)
		os.Exit(1)
	}
	_ = os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "blockfile-snapshotter: listen on %s: %v\n", *socket, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(server, snapshotservice.FromSnapshotter(sn))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-stop
		server.Stop()
	}()
	if err := server.Serve(l); err != nil {
		fmt.Fprintf(os.Stderr, "blockfile-snapshotter: %v\n", err)
	}
	sn.Close()
	_ = os.Remove(*socket)
}
