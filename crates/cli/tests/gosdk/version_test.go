// The version line as each client parses it, with their code's logic re-stated here (none
// of them exports it): the Go SDK's machine_test.go (parseVersionFromStdout, whose
// result must equal the API's firecracker_version), Kata's virtcontainers/fc.go
// (getVersionNumber, parseVersion, checkVersion: the first line's second word less its
// "v", a semantic version of at least 0.21.1, parsed with blang/semver as Kata does).
// firecracker-containerd checks no version. Each reads standard output only and needs
// exit status 0.
package gosdk

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/blang/semver"
)

func versionOutput(t *testing.T) string {
	bin := os.Getenv("EXITLESS_BIN")
	if bin == "" {
		t.Skip("EXITLESS_BIN is not set (crates/cli/tests/gosdk.rs sets it)")
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	return string(out)
}

func TestTheVersionLineParsesAsTheGoSDKParsesIt(t *testing.T) {
	out := versionOutput(t)
	pattern := regexp.MustCompile(`Firecracker v(?P<version>[0-9]+\.[0-9]+\.[0-9]+-?.*)`)
	matches := pattern.FindStringSubmatch(out)
	if matches == nil {
		t.Fatalf("the SDK's pattern does not match %q (its test would panic)", out)
	}
	if got := matches[pattern.SubexpIndex("version")]; got != "1.16.1" {
		t.Fatalf("the SDK reads version %q from %q; GET / says 1.16.1", got, out)
	}
	if !strings.Contains(out, "exitless") {
		t.Fatalf("the version does not say exitless: %q", out)
	}
}

func TestTheVersionLineParsesAsKataParsesIt(t *testing.T) {
	out := versionOutput(t)
	fields := strings.Split(strings.Split(out, "\n")[0], " ")
	if len(fields) < 2 {
		t.Fatalf("Kata: getting FC version failed, the output is malformed: %q", out)
	}
	v, err := semver.Make(strings.TrimPrefix(strings.TrimSpace(fields[1]), "v"))
	if err != nil {
		t.Fatalf("Kata: Malformed firecracker version: %v (%q)", err, out)
	}
	if v.LT(semver.MustParse("0.21.1")) {
		t.Fatalf("Kata: version %v is below its minimum 0.21.1", v)
	}
	if v.String() != "1.16.1" {
		t.Fatalf("Kata reads %v", v)
	}
}
