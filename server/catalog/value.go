package catalog

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultSlowReadShare is the slow-read fault's work when the switch is
// given without a value: 10 % of the server's measured CPU per Read.
const DefaultSlowReadShare = 0.10

// MaxSlowRead bounds a fixed slow-read value: a Read that burns more is a
// stall, not the slowdown the switch plants.
const MaxSlowRead = 100 * time.Millisecond

// SlowRead is the slow-read fault's value: the busy CPU work added to
// each Read request, a share of the measured CPU per Read or a set
// duration.
type SlowRead struct {
	// Share of the server's measured CPU per Read (0.1 for 10 %); 0 with
	// Fixed set.
	Share float64
	// Fixed is a set duration of CPU work per Read; 0 with Share set.
	Fixed time.Duration
}

// ParseSlowRead reads the slow-read fault's value: "10%" (a share of the
// measured CPU per Read, above 0 and at most 1000 %), a duration such as
// "20us" (above 0, at most MaxSlowRead), or "" for DefaultSlowReadShare.
func ParseSlowRead(v string) (SlowRead, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return SlowRead{Share: DefaultSlowReadShare}, nil
	}
	if pct, ok := strings.CutSuffix(v, "%"); ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
		if err != nil || !(p > 0 && p <= 1000) {
			return SlowRead{}, fmt.Errorf("slow-read=%s: want a share above 0 and at most 1000%% (e.g. 10%%) or a duration (e.g. 20us)", v)
		}
		return SlowRead{Share: p / 100}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > MaxSlowRead {
		return SlowRead{}, fmt.Errorf("slow-read=%s: want a share (e.g. 10%%) or a duration above 0 and at most %v (e.g. 20us)", v, MaxSlowRead)
	}
	return SlowRead{Fixed: d}, nil
}

// String is the value as ParseSlowRead reads it: "10%" or "20µs".
func (s SlowRead) String() string {
	if s.Fixed > 0 {
		return s.Fixed.String()
	}
	return strconv.FormatFloat(100*s.Share, 'f', -1, 64) + "%"
}

// CheckFault reads one item of a fault list (OPCUA_FAULTS, a side's
// faults=…): a switch's name, with "=value" where its row takes one
// (FaultRow.Value). It returns the fault and its value ("" when none was
// given), or an error naming the valid switches or the value's form.
func CheckFault(item string) (Fault, string, error) {
	name, val, hasVal := strings.Cut(strings.TrimSpace(item), "=")
	f := Fault(name)
	r, ok := f.Row()
	if !ok {
		return f, "", fmt.Errorf("unknown fault %q (valid: %s)", name, faultList())
	}
	switch {
	case hasVal && r.Value == "":
		return f, "", fmt.Errorf("fault %s takes no value (got %q)", name, item)
	case f == FaultSlowRead:
		if _, err := ParseSlowRead(val); err != nil {
			return f, "", err
		}
	}
	return f, val, nil
}

// faultList joins the fault switches' names, a value's form after those
// that take one.
func faultList() string {
	var names []string
	for _, r := range Faults() {
		n := string(r.Fault)
		if r.Value != "" {
			n += "[=VALUE]"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}
