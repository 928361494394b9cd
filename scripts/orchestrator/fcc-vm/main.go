// fcc-vm calls firecracker-containerd's control API (fccontrol over ttrpc, the API its Go
// client serves) for what firecracker-ctr cannot ask: a VM made before its containers,
// with room for several (ContainerCount) and a boot deadline of the caller's choosing;
// pausing, resuming and stopping it. orchestrator-check.sh builds it inside
// firecracker-containerd's own module, so it speaks exactly that version's API.
//   fcc-vm -address SOCK.ttrpc create VMID CONTAINERS TIMEOUT_SECONDS
//   fcc-vm -address SOCK.ttrpc pause|resume|stop|info VMID
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/containerd/containerd/namespaces"
	fcclient "github.com/firecracker-microvm/firecracker-containerd/firecracker-control/client"
	"github.com/firecracker-microvm/firecracker-containerd/proto"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "fcc-vm: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	address := flag.String("address", "", "firecracker-containerd's ttrpc socket (<grpc address>.ttrpc)")
	namespace := flag.String("namespace", "default", "containerd namespace")
	flag.Parse()
	args := flag.Args()
	if *address == "" || len(args) < 2 {
		fail("usage: fcc-vm -address SOCK.ttrpc create VMID CONTAINERS TIMEOUT | pause|resume|stop|info VMID")
	}
	client, err := fcclient.New(*address)
	if err != nil {
		fail("%v", err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), *namespace)
	vmID := args[1]
	switch args[0] {
	case "create":
		if len(args) != 4 {
			fail("create takes VMID CONTAINERS TIMEOUT_SECONDS")
		}
		count, err1 := strconv.Atoi(args[2])
		timeout, err2 := strconv.Atoi(args[3])
		if err1 != nil || err2 != nil || count < 1 || timeout < 1 {
			fail("create: CONTAINERS and TIMEOUT_SECONDS are positive numbers")
		}
		start := time.Now()
		_, err = client.CreateVM(ctx, &proto.CreateVMRequest{
			VMID:           vmID,
			ContainerCount: int32(count),
			TimeoutSeconds: uint32(timeout),
		})
		if err == nil {
			fmt.Printf("created %s in %.1f s\n", vmID, time.Since(start).Seconds())
		}
	case "pause":
		_, err = client.PauseVM(ctx, &proto.PauseVMRequest{VMID: vmID})
	case "resume":
		_, err = client.ResumeVM(ctx, &proto.ResumeVMRequest{VMID: vmID})
	case "stop":
		_, err = client.StopVM(ctx, &proto.StopVMRequest{VMID: vmID, TimeoutSeconds: 30})
	case "info":
		var info *proto.GetVMInfoResponse
		info, err = client.GetVMInfo(ctx, &proto.GetVMInfoRequest{VMID: vmID})
		if err == nil {
			fmt.Printf("%s socket %s vsock %s\n", info.VMID, info.SocketPath, info.VSockPath)
		}
	default:
		fail("unknown command %q", args[0])
	}
	if err != nil {
		fail("%s %s: %v", args[0], vmID, err)
	}
}
