package backpressure_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
)

// h starts environments; set once per process by SynchronizedBeforeSuite.
var h *spec.Harness

func TestBackpressure(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Backpressure Suite", Label("backpressure", "ci"))
}

var _ = SynchronizedBeforeSuite(spec.PrepareNode, func(data []byte) {
	var err error
	h, err = spec.NewHarness(data)
	Expect(err).NotTo(HaveOccurred())
}, NodeTimeout(spec.PrepareTimeout))

var _ = ReportAfterSuite("summary", func(r Report) {
	Expect(spec.WriteReports(r)).To(Succeed())
})
