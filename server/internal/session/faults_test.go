package session

import (
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
)

// TestNeverExpireFault: under Limits.NeverExpire an activated session idle
// past its timeout stays open, while a session never activated still
// expires (its own timeout, and UnactivatedTimeout); without the fault
// both expire.
func TestNeverExpireFault(t *testing.T) {
	for _, on := range []bool{false, true} {
		m := NewManager(Limits{NeverExpire: on, UnactivatedTimeout: time.Second})
		now := time.Now()
		active := m.Create("active", 200*time.Millisecond, now)
		if _, code, _ := active.Activate("", 1, "", active.ServerNonce()); code != ua.StatusOK {
			t.Fatal("activate failed")
		}
		idle := m.Create("unactivated", 200*time.Millisecond, now)
		late := m.Create("late", time.Hour, now)
		expired := map[string]bool{}
		for _, s := range append(m.Expire(now.Add(500*time.Millisecond)), m.Expire(now.Add(2*time.Second))...) {
			expired[s.Name] = true
		}
		if !expired["unactivated"] || !expired["late"] || !idle.Closed() || !late.Closed() {
			t.Errorf("NeverExpire=%v: unactivated sessions expired: %v", on, expired)
		}
		if expired["active"] == on || active.Closed() == on {
			t.Errorf("NeverExpire=%v: activated session expired = %v", on, expired["active"])
		}
		if c := m.Counts(); on && (c.Current != 1 || c.Timeouts != 2) || !on && (c.Current != 0 || c.Timeouts != 3) {
			t.Errorf("NeverExpire=%v: counts %+v", on, c)
		}
	}
}
