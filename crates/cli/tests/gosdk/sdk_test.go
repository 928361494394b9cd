// Drives exitless with the unmodified firecracker-go-sdk (pinned in go.mod), as
// firecracker-containerd, flintlock and other Go orchestrators do: NewMachine with a
// process runner on the exitless binary, Start with logger and metrics FIFOs, a root
// drive and a NIC on a tap, the guest's serial output, PauseVM/ResumeVM,
// UpdateGuestDrive, FlushMetrics, Shutdown (Ctrl-Alt-Del to a guest that resets) and
// StopVMM. Run by crates/cli/tests/gosdk.rs, which builds the binary and passes
// EXITLESS_BIN, EXITLESS_PAYLOADS and EXITLESS_TAP.
package gosdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	firecracker "github.com/firecracker-microvm/firecracker-go-sdk"
	models "github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"
)

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Skipf("%s is not set: run through `cargo test --test gosdk`", name)
	}
	return v
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sparseFile(t *testing.T, path string, size int64) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

type vm struct {
	machine *firecracker.Machine
	serial  *syncBuffer
	stderr  *syncBuffer
	logs    *syncBuffer
	sock    string
	metrics string
}

// start boots the `wait` payload (waiting for Ctrl-Alt-Del) through the SDK.
func start(t *testing.T, ctx context.Context, withDevices bool) *vm {
	if !withDevices {
		return startWith(t, ctx, nil)
	}
	return startWith(t, ctx, withEveryDevice)
}

// withEveryDevice gives the VM a drive, vsock, a NIC with MMDS and the metadata.
func withEveryDevice(t *testing.T, cfg *firecracker.Config, m *firecracker.Machine) {
	if m == nil {
		root := filepath.Join(filepath.Dir(cfg.SocketPath), "root.img")
		sparseFile(t, root, 1<<20)
		cfg.Drives = firecracker.NewDrivesBuilder(root).Build()
		// A vsock device, as firecracker-containerd and Kata give every VM for their agent.
		cfg.VsockDevices = []firecracker.VsockDevice{{ID: "vsock0", Path: filepath.Join(filepath.Dir(cfg.SocketPath), "v.sock"), CID: 3}}
		cfg.NetworkInterfaces = firecracker.NetworkInterfaces{{
			StaticConfiguration: &firecracker.StaticNetworkConfiguration{
				HostDevName: env(t, "EXITLESS_TAP"),
				MacAddress:  "06:00:ac:10:00:02",
			},
			// MMDS on this NIC, as flintlock and cloud-init images want it.
			AllowMMDS: true,
		}}
		cfg.MmdsVersion = firecracker.MMDSv2
		return
	}
	// Metadata put before boot by the SDK's own handler, as firecracker-containerd does.
	m.Handlers.FcInit = m.Handlers.FcInit.Append(firecracker.NewSetMetadataHandler(
		map[string]interface{}{"latest": map[string]interface{}{"meta-data": map[string]interface{}{"instance-id": "i-exitless"}}}))
}

// startWith starts the wait payload; `setup` (if any) is called with the configuration
// before the machine is made (m nil), then with the machine before it starts.
func startWith(t *testing.T, ctx context.Context, setup func(*testing.T, *firecracker.Config, *firecracker.Machine)) *vm {
	bin, payloads := env(t, "EXITLESS_BIN"), env(t, "EXITLESS_PAYLOADS")
	dir := t.TempDir()
	v := &vm{serial: &syncBuffer{}, stderr: &syncBuffer{}, logs: &syncBuffer{},
		sock: filepath.Join(dir, "api.sock"), metrics: filepath.Join(dir, "metrics.fifo")}
	// --enable-pci: the payloads' virtio driver finds its devices on PCI. (The restore
	// below passes none: a restored guest keeps its snapshot's transport.)
	// --landlock-rule: the VM's directory, where the drive swapped in below lives; a
	// started exitless reaches no other file (Landlock).
	cmd := firecracker.VMCommandBuilder{}.WithBin(bin).WithSocketPath(v.sock).WithArgs([]string{"--enable-pci", "--landlock-rule", dir}).
		WithStdout(v.serial).WithStderr(v.stderr).Build(ctx)
	cfg := firecracker.Config{
		SocketPath:      v.sock,
		LogFifo:         filepath.Join(dir, "log.fifo"),
		MetricsFifo:     v.metrics,
		LogLevel:        "Info",
		FifoLogWriter:   v.logs,
		KernelImagePath: filepath.Join(payloads, "wait.elf"),
		KernelArgs:      "console=ttyS0 kbd",
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(2),
			MemSizeMib: firecracker.Int64(64),
			Smt:        firecracker.Bool(true),
		},
	}
	if setup != nil {
		setup(t, &cfg, nil)
	}
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	m, err := firecracker.NewMachine(ctx, cfg, firecracker.WithProcessRunner(cmd),
		firecracker.WithLogger(logrus.NewEntry(logger)))
	if err != nil {
		t.Fatalf("NewMachine: %v", err)
	}
	v.machine = m
	if setup != nil {
		setup(t, &cfg, m)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatalf("Start: %v\nstderr: %s", err, v.stderr.String())
	}
	waitFor(t, "the guest's first line", 30*time.Second, func() bool {
		return strings.Contains(v.serial.String(), "wait: running; waiting for ctrl-alt-del")
	})
	return v
}

func TestTheGoSDKDrivesAMicroVMThroughItsLife(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v := start(t, ctx, true)
	m := v.machine

	// The vsock device the SDK configured listens where the SDK said.
	vsock := m.Cfg.VsockDevices[0].Path
	if fi, err := os.Stat(vsock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the vsock's Unix socket %s: %v", vsock, err)
	}

	// MMDS: what the SDK put before boot, patched and read back while the guest runs.
	type metaData struct {
		Latest struct {
			MetaData map[string]string `json:"meta-data"`
		} `json:"latest"`
	}
	var md metaData
	if err := m.GetMetadata(ctx, &md); err != nil || md.Latest.MetaData["instance-id"] != "i-exitless" {
		t.Fatalf("GetMetadata after the SDK's SetMetadata handler: %+v, %v", md, err)
	}
	patch := map[string]interface{}{"latest": map[string]interface{}{"meta-data": map[string]interface{}{"local-ipv4": "172.16.0.2"}}}
	if err := m.UpdateMetadata(ctx, patch); err != nil {
		t.Fatalf("UpdateMetadata: %v", err)
	}
	if err := m.GetMetadata(ctx, &md); err != nil || md.Latest.MetaData["local-ipv4"] != "172.16.0.2" || md.Latest.MetaData["instance-id"] != "i-exitless" {
		t.Fatalf("GetMetadata after UpdateMetadata: %+v, %v", md, err)
	}
	if err := m.SetMetadata(ctx, map[string]string{"big": strings.Repeat("x", 60000)}); err == nil {
		t.Fatalf("SetMetadata beyond the data store's limit was accepted")
	}

	// Firecracker's own answers about the instance.
	version, err := m.GetFirecrackerVersion(ctx)
	if err != nil || version != "1.16.1" {
		t.Fatalf("GetFirecrackerVersion: %q, %v", version, err)
	}
	info, err := m.DescribeInstanceInfo(ctx)
	if err != nil || *info.State != "Running" || *info.AppName != "exitless" || *info.VmmVersion != "1.16.1" {
		t.Fatalf("DescribeInstanceInfo: %v, %v", err, info)
	}

	// The log FIFO, which nobody read when exitless opened it, carries Firecracker-shaped lines.
	waitFor(t, "API lines in the log FIFO", 10*time.Second, func() bool {
		return strings.Contains(v.logs.String(), "[anonymous-instance:") && strings.Contains(v.logs.String(), "PUT /actions -> 204")
	})

	if err := m.PauseVM(ctx); err != nil {
		t.Fatalf("PauseVM: %v", err)
	}
	if info, _ := m.DescribeInstanceInfo(ctx); *info.State != "Paused" {
		t.Fatalf("after PauseVM the state is %s", *info.State)
	}
	if err := m.ResumeVM(ctx); err != nil {
		t.Fatalf("ResumeVM: %v", err)
	}
	if info, _ := m.DescribeInstanceInfo(ctx); *info.State != "Running" {
		t.Fatalf("after ResumeVM the state is %s", *info.State)
	}

	// A new backing file for the running guest's root drive, as firecracker-containerd swaps one.
	swapped := filepath.Join(filepath.Dir(v.sock), "swapped.img")
	sparseFile(t, swapped, 4<<20)
	if err := m.UpdateGuestDrive(ctx, "root_drive", swapped); err != nil {
		t.Fatalf("UpdateGuestDrive: %v", err)
	}
	client := firecracker.NewClient(v.sock, logrus.NewEntry(logrus.New()), false)
	config, err := client.GetExportVMConfig()
	if err != nil || len(config.Payload.Drives) != 1 || *config.Payload.Drives[0].PathOnHost != swapped {
		t.Fatalf("GET /vm/config after UpdateGuestDrive: %+v, %v", config, err)
	}
	if err := m.UpdateGuestDrive(ctx, "root_drive", "/nonexistent/disk.img"); err == nil {
		t.Fatalf("UpdateGuestDrive to a missing file was accepted")
	}

	// FlushMetrics writes one line in Firecracker's format to the metrics FIFO.
	fifo, err := os.OpenFile(v.metrics, os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("open the metrics FIFO: %v", err)
	}
	defer fifo.Close()
	if _, err := client.CreateSyncAction(ctx, &models.InstanceActionInfo{
		ActionType: firecracker.String(models.InstanceActionInfoActionTypeFlushMetrics),
	}); err != nil {
		t.Fatalf("FlushMetrics: %v", err)
	}
	// Every line is one JSON object of groups; the first one after the PATCHes counts them.
	reader := bufio.NewReader(fifo)
	var line map[string]interface{}
	counter := func(group, field string) float64 {
		g, _ := line[group].(map[string]interface{})
		n, _ := g[field].(float64)
		return n
	}
	for {
		text, err := reader.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the metrics FIFO: %v", err)
		}
		line = nil
		if err := json.Unmarshal([]byte(text), &line); err != nil {
			t.Fatalf("a metrics line that is not JSON: %v: %q", err, text)
		}
		if counter("patch_api_requests", "drive_count") > 0 {
			break
		}
	}
	for _, group := range []string{"api_server", "block", "block_root_drive", "net", "net_1", "vcpu", "logger", "put_api_requests", "exits"} {
		if _, ok := line[group].(map[string]interface{}); !ok {
			t.Fatalf("the metrics line has no %q group: %v", group, line)
		}
	}
	if counter("patch_api_requests", "drive_count") != 2 || counter("patch_api_requests", "drive_fails") != 1 {
		t.Fatalf("the PATCHes are not counted: %v", line["patch_api_requests"])
	}
	if counter("vcpu", "exit_io_out") == 0 {
		t.Fatalf("no port writes counted (the guest printed): %v", line["vcpu"])
	}

	// Shutdown: Ctrl-Alt-Del, the guest resets through the i8042, the VMM exits 0.
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatalf("Wait after Shutdown: %v\nstderr: %s", err, v.stderr.String())
	}
	if !strings.Contains(v.serial.String(), "wait: ctrl-alt-del; resetting") {
		t.Fatalf("the guest did not see Ctrl-Alt-Del: %s", v.serial.String())
	}
	if _, err := os.Stat(v.sock); !os.IsNotExist(err) {
		t.Fatalf("the API socket is left behind: %v", err)
	}
}

func TestStopVMMEndsTheVMMAndItsSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := start(t, ctx, false)
	if err := v.machine.StopVMM(); err != nil {
		t.Fatalf("StopVMM: %v", err)
	}
	// SIGTERM: the process ends (128 + 15) and removes its socket.
	if err := v.machine.Wait(ctx); err == nil || !strings.Contains(err.Error(), "143") && !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("Wait after StopVMM: %v", err)
	}
	if _, err := os.Stat(v.sock); !os.IsNotExist(err) {
		t.Fatalf("the API socket is left behind: %v", err)
	}
}

// CreateSnapshot on a paused guest with a drive, a NIC, MMDS and vsock, then a new VMM
// started WithSnapshot (its devices rebuilt from the snapshot, the vsock socket the old
// VMM left bound anew): the guest, halted waiting for IRQ 1 when it was saved, takes
// Ctrl-Alt-Del in the new VMM and resets.
func TestSnapshotsThroughTheSDK(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v := start(t, ctx, true)
	m := v.machine
	if err := m.PauseVM(ctx); err != nil {
		t.Fatalf("PauseVM: %v", err)
	}
	// Beside the API socket: the VMM's own directory, which Landlock leaves it.
	dir := filepath.Dir(v.sock)
	mem, snap := filepath.Join(dir, "mem"), filepath.Join(dir, "snap")
	if err := m.CreateSnapshot(ctx, mem, snap); err != nil {
		t.Fatalf("CreateSnapshot: %v\nstderr: %s", err, v.stderr.String())
	}
	if err := m.StopVMM(); err != nil {
		t.Fatalf("StopVMM: %v", err)
	}
	_ = m.Wait(ctx)

	serial, stderr := &syncBuffer{}, &syncBuffer{}
	sock := filepath.Join(dir, "restored.sock")
	cmd := firecracker.VMCommandBuilder{}.WithBin(env(t, "EXITLESS_BIN")).WithSocketPath(sock).
		WithStdout(serial).WithStderr(stderr).Build(ctx)
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	resume := func(c *firecracker.SnapshotConfig) { c.ResumeVM = true }
	restored, err := firecracker.NewMachine(ctx, firecracker.Config{SocketPath: sock}, firecracker.WithProcessRunner(cmd),
		firecracker.WithSnapshot(mem, snap, resume), firecracker.WithLogger(logrus.NewEntry(logger)))
	if err != nil {
		t.Fatalf("NewMachine WithSnapshot: %v", err)
	}
	started := time.Now()
	if err := restored.Start(ctx); err != nil {
		t.Fatalf("Start WithSnapshot: %v\nstderr: %s", err, stderr.String())
	}
	t.Logf("Start WithSnapshot (a new VMM, the snapshot loaded, the guest resumed): %v", time.Since(started))
	info, err := restored.DescribeInstanceInfo(ctx)
	if err != nil || *info.State != "Running" {
		t.Fatalf("DescribeInstanceInfo after the restore: %v, %v", err, info)
	}
	if err := restored.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := restored.Wait(ctx); err != nil {
		t.Fatalf("Wait after Shutdown: %v\nstderr: %s", err, stderr.String())
	}
	if !strings.Contains(serial.String(), "wait: ctrl-alt-del; resetting") {
		t.Fatalf("the restored guest did not take Ctrl-Alt-Del: %q", serial.String())
	}
}

// The SDK's balloon calls (its CreateBalloon handler, then every Machine balloon method
// and the client's directly), each result asserted: the target, the statistics interval,
// Firecracker's refusals. The payload guest has no balloon driver: nothing inflates, so
// actual_pages stays 0 and no guest statistics are present (scripts/linux-memory.sh
// checks those with Linux's driver).
func TestTheSDKsBalloonCalls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := startWith(t, ctx, func(_ *testing.T, _ *firecracker.Config, m *firecracker.Machine) {
		if m != nil {
			m.Handlers.FcInit = m.Handlers.FcInit.Append(firecracker.NewCreateBalloonHandler(16, true, 2))
		}
	})
	m := v.machine
	defer func() { _ = m.StopVMM() }()

	cfg, err := m.GetBalloonConfig(ctx)
	if err != nil || *cfg.AmountMib != 16 || !*cfg.DeflateOnOom || cfg.StatsPollingIntervals != 2 {
		t.Fatalf("GetBalloonConfig after the handler's PUT: %v, %+v", err, cfg)
	}
	if err := m.UpdateBalloon(ctx, 32); err != nil {
		t.Fatalf("UpdateBalloon 32: %v", err)
	}
	if cfg, err = m.GetBalloonConfig(ctx); err != nil || *cfg.AmountMib != 32 {
		t.Fatalf("GetBalloonConfig after UpdateBalloon: %v, %+v", err, cfg)
	}
	stats, err := m.GetBalloonStats(ctx)
	if err != nil || *stats.TargetMib != 32 || *stats.TargetPages != 32*256 || *stats.ActualPages != 0 || *stats.ActualMib != 0 {
		t.Fatalf("GetBalloonStats: %v, %+v", err, stats)
	}
	if err := m.UpdateBalloonStats(ctx, 5); err != nil {
		t.Fatalf("UpdateBalloonStats 5: %v", err)
	}
	if cfg, err = m.GetBalloonConfig(ctx); err != nil || cfg.StatsPollingIntervals != 5 {
		t.Fatalf("GetBalloonConfig after UpdateBalloonStats: %v, %+v", err, cfg)
	}
	// Firecracker's refusals: statistics cannot be turned off after the start, nor the
	// target exceed the guest's memory.
	if err := m.UpdateBalloonStats(ctx, 0); err == nil || !strings.Contains(err.Error(), "Statistics cannot be enabled/disabled") {
		t.Fatalf("UpdateBalloonStats 0 was not refused as Firecracker refuses it: %v", err)
	}
	if err := m.UpdateBalloon(ctx, 65); err == nil || !strings.Contains(err.Error(), "Requested memory should be less than") {
		t.Fatalf("UpdateBalloon beyond the guest's 64 MiB was not refused: %v", err)
	}
	// The client's own calls, under the Machine's.
	client := firecracker.NewClient(v.sock, logrus.NewEntry(logrus.New()), false)
	amount, deflate, interval := int64(8), false, int64(3)
	if _, err := client.PutBalloon(ctx, &models.Balloon{AmountMib: &amount, DeflateOnOom: &deflate}); err == nil ||
		!strings.Contains(err.Error(), "not supported after starting") {
		t.Fatalf("PutBalloon after the start was not refused: %v", err)
	}
	if _, err := client.PatchBalloon(ctx, &models.BalloonUpdate{AmountMib: &amount}); err != nil {
		t.Fatalf("PatchBalloon: %v", err)
	}
	if got, err := client.DescribeBalloonConfig(ctx); err != nil || *got.Payload.AmountMib != amount {
		t.Fatalf("DescribeBalloonConfig: %v, %+v", err, got)
	}
	if _, err := client.PatchBalloonStatsInterval(ctx, &models.BalloonStatsUpdate{StatsPollingIntervals: &interval}); err != nil {
		t.Fatalf("PatchBalloonStatsInterval: %v", err)
	}
	if got, err := client.DescribeBalloonStats(ctx); err != nil || *got.Payload.TargetMib != amount {
		t.Fatalf("DescribeBalloonStats: %v, %+v", err, got)
	}
}
