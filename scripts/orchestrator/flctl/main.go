// flctl: a small client of flintlock's gRPC API (create/get/list/delete), built by
// orchestrator-check.sh inside flintlock's module so it speaks exactly that version's API.
// Its create sends one NIC (eth1, a tap on flintlockd's bridge) and cloud-init metadata
// (instance-id and an SSH key), as a flintlock user's request would.
//
//	flctl [-addr 127.0.0.1:9090] create -name vm1 -ns ns1 -kernel localhost:5000/fl/kernel:dev \
//	      -kernel-file boot/vmlinux -root localhost:5000/fl/root:dev -ssh-key /root/.ssh/id_ed25519.pub \
//	      [-bridge flbr0] [-cmdline init=/sbin/init,console=ttyS0] [-mem 1024] [-vcpu 1]
//	flctl get -uid UID | flctl list -ns ns1 | flctl delete -uid UID
package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	mvmv1 "github.com/liquidmetal-dev/flintlock/api/services/microvm/v1alpha1"
	"github.com/liquidmetal-dev/flintlock/api/types"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func main() {
	addr := flag.String("addr", "127.0.0.1:9090", "flintlockd gRPC endpoint")
	flag.Parse()
	if flag.NArg() < 1 {
		log.Fatal("usage: flctl [-addr A] create|get|list|delete [flags]")
	}
	fs := flag.NewFlagSet(flag.Arg(0), flag.ExitOnError)
	name, ns := fs.String("name", "vm1", "microvm name"), fs.String("ns", "ns1", "microvm namespace")
	uid := fs.String("uid", "", "microvm uid (get/delete)")
	kernel, kfile := fs.String("kernel", "localhost:5000/fl/kernel:dev", "kernel image"), fs.String("kernel-file", "boot/vmlinux", "kernel path in image")
	root := fs.String("root", "localhost:5000/fl/root:dev", "root volume image")
	sshKey, bridge := fs.String("ssh-key", "", "public key file"), fs.String("bridge", "", "bridge override for eth1")
	cmdline := fs.String("cmdline", "", "extra kernel args k=v,k2=v2 (a bare k gives a bare flag)")
	mem, vcpu := fs.Int("mem", 1024, "MiB (flintlock requires >= 1024)"), fs.Int("vcpu", 1, "vcpus")
	_ = fs.Parse(flag.Args()[1:])

	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	c := mvmv1.NewMicroVMClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var resp proto.Message
	switch flag.Arg(0) {
	case "create":
		key := ""
		if *sshKey != "" {
			k, err := os.ReadFile(*sshKey)
			if err != nil {
				log.Fatal(err)
			}
			key = strings.TrimSpace(string(k))
		}
		args := map[string]string{}
		for _, kv := range strings.Split(*cmdline, ",") {
			if k, v, _ := strings.Cut(kv, "="); k != "" {
				args[k] = v
			}
		}
		iface := &types.NetworkInterface{DeviceId: "eth1", Type: types.NetworkInterface_TAP}
		if *bridge != "" {
			iface.Overrides = &types.NetworkOverrides{BridgeName: bridge}
		}
		spec := &types.MicroVMSpec{
			Id: *name, Namespace: *ns, Vcpu: int32(*vcpu), MemoryInMb: int32(*mem),
			Kernel:     &types.Kernel{Image: *kernel, Filename: kfile, Cmdline: args, AddNetworkConfig: true},
			RootVolume: &types.Volume{Id: "root", Source: &types.VolumeSource{ContainerSource: root}},
			Interfaces: []*types.NetworkInterface{iface}, // flintlock prepends its own MMDS "eth0"
			Metadata: map[string]string{ // values must be base64 (meta-data is decoded as YAML map[string]string)
				"meta-data": b64(fmt.Sprintf("instance-id: %s-%s\nlocal-hostname: %s\npublic-keys: %q\n", *ns, *name, *name, key)),
				"user-data": b64(fmt.Sprintf("#cloud-config\nusers:\n- name: root\n  ssh_authorized_keys:\n  - %s\n", key)),
			},
		}
		resp, err = c.CreateMicroVM(ctx, &mvmv1.CreateMicroVMRequest{Microvm: spec})
	case "get":
		resp, err = c.GetMicroVM(ctx, &mvmv1.GetMicroVMRequest{Uid: *uid})
	case "list":
		resp, err = c.ListMicroVMs(ctx, &mvmv1.ListMicroVMsRequest{Namespace: *ns})
	case "delete":
		resp, err = c.DeleteMicroVM(ctx, &mvmv1.DeleteMicroVMRequest{Uid: *uid})
	default:
		log.Fatalf("unknown command %q", flag.Arg(0))
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(protojson.Format(resp))
}
