package cancellation_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
)

// h starts environments; set once per process by SynchronizedBeforeSuite.
var h *spec.Harness

func TestCancellation(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Cancellation Suite", Label("cancellation", "ci"))
}

var _ = SynchronizedBeforeSuite(spec.PrepareNode, func(data []byte) {
	var err error
	h, err = spec.NewHarness(data)
	Expect(err).NotTo(HaveOccurred())
}, NodeTimeout(spec.PrepareTimeout))

var _ = ReportAfterSuite("summary", func(r Report) {
	Expect(spec.WriteReports(r)).To(Succeed())
})
