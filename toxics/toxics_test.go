package toxics_test

import (
	"testing"
	"time"

	"github.com/opcua-chaos/opcua-chaos/toxics"
)

func TestCIConditionsHaveUniqueNames(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range toxics.CI() {
		if c.Name == "" || seen[c.Name] {
			t.Fatalf("condition name %q empty or repeated", c.Name)
		}
		seen[c.Name] = true
		got, err := toxics.Lookup(c.Name)
		if err != nil || got.Name != c.Name {
			t.Fatalf("Lookup(%q) = %v, %v", c.Name, got, err)
		}
		names := map[string]bool{}
		for _, tx := range c.Toxics {
			if names[tx.Name] {
				t.Fatalf("condition %q adds toxic %q twice", c.Name, tx.Name)
			}
			names[tx.Name] = true
		}
	}
}

func TestLookupUnknown(t *testing.T) {
	if _, err := toxics.Lookup("nope"); err == nil {
		t.Fatal("Lookup(nope) succeeded")
	}
}

func TestScheduleIsSeededAndWellFormed(t *testing.T) {
	a, b := toxics.Schedule(42, time.Minute), toxics.Schedule(42, time.Minute)
	if len(a) < 5 {
		t.Fatalf("schedule of a minute has %d steps", len(a))
	}
	names := map[string]bool{}
	var end time.Duration
	for i := range a {
		if a[i].At != b[i].At || a[i].For != b[i].For || a[i].Condition.Name != b[i].Condition.Name {
			t.Fatalf("step %d differs for the same seed: %+v vs %+v", i, a[i], b[i])
		}
		if a[i].At < end || a[i].At+a[i].For > time.Minute {
			t.Fatalf("step %d overlaps the previous one or runs past the end: %+v", i, a[i])
		}
		end = a[i].At + a[i].For
		if names[a[i].Condition.Name] {
			t.Fatalf("step name %q repeated", a[i].Condition.Name)
		}
		names[a[i].Condition.Name] = true
	}
	if c := toxics.Schedule(43, time.Minute); len(c) == len(a) && c[0].At == a[0].At && c[0].Condition.Name == a[0].Condition.Name && c[len(c)-1].At == a[len(a)-1].At {
		t.Errorf("seeds 42 and 43 gave the same schedule")
	}
}

func TestWithSecurityNamesTheRowApart(t *testing.T) {
	for _, c := range toxics.CI() {
		for _, mode := range []string{toxics.SecuritySign, toxics.SecuritySignEncrypt} {
			s := c.WithSecurity(mode)
			if want := c.Name + "+" + mode; s.Name != want || s.String() != want {
				t.Errorf("%s.WithSecurity(%s) named %q, want %q", c.Name, mode, s.Name, want)
			}
			if s.Base() != c.Name || s.SecurityMode() != mode {
				t.Errorf("%s: Base %q, SecurityMode %q", s.Name, s.Base(), s.SecurityMode())
			}
			if s.NanoCPUs != c.NanoCPUs || len(s.Toxics) != len(c.Toxics) {
				t.Errorf("%s: toxics or CPU limit changed", s.Name)
			}
			if again := s.WithSecurity(mode); again.Name != s.Name {
				t.Errorf("%s secured twice is %q", s.Name, again.Name)
			}
			if none := s.WithSecurity(toxics.SecurityNone); none.Name != c.Name || none.SecurityMode() != toxics.SecurityNone {
				t.Errorf("%s.WithSecurity(none) = %q, %s", s.Name, none.Name, none.SecurityMode())
			}
			got, err := toxics.Lookup(s.Name)
			if err != nil || got.Name != s.Name || got.Security != mode {
				t.Errorf("Lookup(%q) = %+v, %v", s.Name, got, err)
			}
		}
		if c.SecurityMode() != toxics.SecurityNone || c.Base() != c.Name || c.WithSecurity("").Name != c.Name {
			t.Errorf("%s: a condition without security is not none or renamed", c.Name)
		}
	}
	if got := toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline); len(got) != 1 || got[0].Name != "baseline+sign-encrypt" {
		t.Errorf("Secured(sign-encrypt, baseline) = %v", got)
	}
}
