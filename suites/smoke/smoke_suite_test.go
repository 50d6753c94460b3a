package smoke_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
)

// h starts environments; set once per process by SynchronizedBeforeSuite.
var h *spec.Harness

func TestSmoke(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Smoke Suite", Label("smoke", "ci"))
}

var _ = SynchronizedBeforeSuite(func(ctx SpecContext) []byte {
	data, err := spec.Prepare(ctx)
	Expect(err).NotTo(HaveOccurred(), "prepare suite")
	return data
}, func(data []byte) {
	var err error
	h, err = spec.NewHarness(data)
	Expect(err).NotTo(HaveOccurred())
	AddReportEntry("images", fmt.Sprintf("server %s, toxiproxy %s, reused %v, ready in %s",
		h.Setup.ServerImage, h.Setup.ProxyImage, h.Setup.Reused, h.Setup.ColdStart.Round(time.Millisecond)))
}, NodeTimeout(5*time.Minute))

var _ = ReportAfterSuite("summary", func(r Report) {
	Expect(spec.WriteReports(r)).To(Succeed())
})
