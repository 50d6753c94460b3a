package server

import (
	"os"
	"testing"

	"github.com/opcua-chaos/opcua-chaos/fixtures/machine"
)

// TestMain runs the package's tests, seconds of CPU, under the machine
// lock: beside a suite started by the same `go test ./...`, they would
// take the cores its specs measure with.
func TestMain(m *testing.M) { os.Exit(machine.LockedMain(m, "server")) }
