package recovery_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
)

// h starts environments; spec.Bootstrap fills it before the first spec.
var h = spec.Bootstrap()

func TestRecovery(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Recovery Suite", Label("recovery", "ci"))
}
