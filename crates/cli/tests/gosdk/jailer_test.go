// The Go SDK's JailerCfg path with exitless-jailer as its jailer and exitless as its
// ExecFile: the SDK links the kernel and drive into the jail, starts the jailer (uid and
// gid 4242, the NUMA node's cpuset cgroups, a network namespace holding the NIC's tap),
// finds the API socket in the jail and configures a drive, a NIC and vsock. Every call's
// result is asserted, and the VMM is checked from outside as the jail promises. The
// SDK's own jailer command, unchanged. Needs EXITLESS_JAILER and root.
package gosdk

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	firecracker "github.com/firecracker-microvm/firecracker-go-sdk"
	models "github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"
)

const jailUID = 4242

func run(t *testing.T, args ...string) {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
}

func procStatus(t *testing.T, pid int, field string) string {
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("the VMM's status: %v", err)
	}
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, field+":") {
			return strings.TrimSpace(strings.TrimPrefix(line, field+":"))
		}
	}
	return ""
}

func TestTheSDKsJailerPathRunsExitlessInAJail(t *testing.T) {
	jailer, bin, payloads := env(t, "EXITLESS_JAILER"), env(t, "EXITLESS_BIN"), env(t, "EXITLESS_PAYLOADS")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The NIC's tap, in the namespace the jailer joins, owned by the jailed user.
	ns, tap := fmt.Sprintf("exsdkjail%d", os.Getpid()%100000), "tapjail0"
	run(t, "ip", "netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	run(t, "ip", "-n", ns, "tuntap", "add", "dev", tap, "mode", "tap", "user", fmt.Sprint(jailUID), "group", fmt.Sprint(jailUID))
	run(t, "ip", "-n", ns, "link", "set", tap, "up")

	// The kernel and the drive on the chroot base's filesystem (the SDK hard-links them),
	// the drive writable by the jailed user.
	// A short directory: the socket's path in the jail must fit a sockaddr_un (108 bytes),
	// which t.TempDir()'s long names do not.
	dir, err := os.MkdirTemp("/tmp", "exj")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	kernel := filepath.Join(dir, "wait.elf")
	run(t, "cp", filepath.Join(payloads, "wait.elf"), kernel)
	drive := filepath.Join(dir, "root.img")
	sparseFile(t, drive, 1<<20)
	if err := os.Chown(drive, jailUID, jailUID); err != nil {
		t.Fatalf("chown the drive: %v", err)
	}
	base := filepath.Join(dir, "jails")
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("sdk-%d", os.Getpid())
	serial, stderr := &syncBuffer{}, &syncBuffer{}
	cfg := firecracker.Config{
		SocketPath:      "/run/firecracker.socket",
		KernelImagePath: kernel,
		KernelArgs:      "console=ttyS0",
		Drives:          firecracker.NewDrivesBuilder(drive).Build(),
		NetworkInterfaces: firecracker.NetworkInterfaces{{StaticConfiguration: &firecracker.StaticNetworkConfiguration{
			HostDevName: tap, MacAddress: "06:00:ac:10:00:09"}}},
		VsockDevices: []firecracker.VsockDevice{{ID: "vsock0", Path: "v.sock", CID: 3}},
		MachineCfg:   models.MachineConfiguration{VcpuCount: firecracker.Int64(1), MemSizeMib: firecracker.Int64(64)},
		NetNS:        "/var/run/netns/" + ns,
		// Seccomp on: without it the SDK passes --no-seccomp.
		Seccomp: firecracker.SeccompConfig{Enabled: true},
		JailerCfg: &firecracker.JailerConfig{
			UID: firecracker.Int(jailUID), GID: firecracker.Int(jailUID), ID: id,
			NumaNode: firecracker.Int(0), ExecFile: bin, JailerBinary: jailer,
			ChrootBaseDir: base, CgroupVersion: "1",
			ChrootStrategy: firecracker.NewNaiveChrootStrategy(kernel),
			Stdout:         serial, Stderr: stderr,
		},
	}
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	m, err := firecracker.NewMachine(ctx, cfg, firecracker.WithLogger(logrus.NewEntry(logger)))
	if err != nil {
		t.Fatalf("NewMachine: %v", err)
	}
	root := filepath.Join(base, filepath.Base(bin), id, "root")
	defer os.RemoveAll(filepath.Join(base, filepath.Base(bin), id))
	// The jail's cpuset cgroup (Firecracker's jailer leaves it too), once its last task left.
	defer func() {
		cgroup := filepath.Join("/sys/fs/cgroup/cpuset", filepath.Base(bin), id)
		for try := 0; try < 100 && os.Remove(cgroup) != nil && !os.IsNotExist(os.Remove(cgroup)); try++ {
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if m.Cfg.SocketPath != filepath.Join(root, "run/firecracker.socket") {
		t.Fatalf("the SDK's socket path %s is not in the jail %s", m.Cfg.SocketPath, root)
	}
	defer func() {
		if t.Failed() {
			t.Logf("the VMM's output: %s\nits stderr: %s", serial.String(), stderr.String())
		}
	}()
	if err := m.Start(ctx); err != nil {
		t.Fatalf("Start: %v\nstderr: %s", err, stderr.String())
	}
	defer m.StopVMM()
	waitFor(t, "the guest's first line", 30*time.Second, func() bool {
		return strings.Contains(serial.String(), "wait: running")
	})
	info, err := m.DescribeInstanceInfo(ctx)
	if err != nil || *info.State != "Running" || *info.ID != id {
		t.Fatalf("DescribeInstanceInfo: %v, %+v", err, info)
	}
	config, err := firecracker.NewClient(m.Cfg.SocketPath, logrus.NewEntry(logger), false).GetExportVMConfig()
	if err != nil || len(config.Payload.Drives) != 1 || *config.Payload.Drives[0].PathOnHost != "root.img" ||
		len(config.Payload.NetworkInterfaces) != 1 || config.Payload.Vsock == nil {
		t.Fatalf("GET /vm/config: %v, %+v", err, config)
	}
	// The vsock's socket, where a jailed client finds it: inside the jail.
	if fi, err := os.Stat(filepath.Join(root, "v.sock")); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the vsock socket in the jail: %v", err)
	}

	// From outside: the jail, the user, no capabilities, the namespace, the cgroup.
	pid, err := m.PID()
	if err != nil {
		t.Fatalf("PID: %v", err)
	}
	var seen, jail syscall.Stat_t
	if syscall.Stat(fmt.Sprintf("/proc/%d/root/.", pid), &seen) != nil || syscall.Stat(root, &jail) != nil ||
		seen.Ino != jail.Ino || seen.Dev != jail.Dev {
		t.Fatalf("/proc/%d/root is not the jail %s", pid, root)
	}
	if uid := procStatus(t, pid, "Uid"); uid != "4242\t4242\t4242\t4242" {
		t.Fatalf("the VMM's uids: %q", uid)
	}
	if caps := procStatus(t, pid, "CapEff"); caps != "0000000000000000" {
		t.Fatalf("the VMM's effective capabilities: %s", caps)
	}
	var netns, want syscall.Stat_t
	if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &netns) != nil || syscall.Stat(cfg.NetNS, &want) != nil || netns.Ino != want.Ino {
		t.Fatalf("the VMM is not in %s", cfg.NetNS)
	}
	cgroups, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if !strings.Contains(string(cgroups), fmt.Sprintf(":cpuset:/%s/%s", filepath.Base(bin), id)) {
		t.Fatalf("the VMM is not in the jail's cpuset cgroup: %s", cgroups)
	}

	if err := m.StopVMM(); err != nil {
		t.Fatalf("StopVMM: %v", err)
	}
	// SIGTERM: the process ends (128 + 15) and removes its socket in the jail.
	if err := m.Wait(ctx); err == nil || !strings.Contains(err.Error(), "143") && !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("Wait after StopVMM: %v", err)
	}
	if _, err := os.Stat(m.Cfg.SocketPath); !os.IsNotExist(err) {
		t.Fatalf("the API socket is left behind: %v", err)
	}
}
