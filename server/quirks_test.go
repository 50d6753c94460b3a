package server

import (
	"io"
	"strings"
	"testing"
)

// TestParseQuirks: every declared quirk parses, the set prints sorted, and
// an unknown name is one error line listing the valid ones.
func TestParseQuirks(t *testing.T) {
	var names []string
	for _, q := range AllQuirks {
		names = append(names, string(q))
	}
	qs, err := ParseQuirks(" " + strings.Join(names, " , ") + ",")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range AllQuirks {
		if !qs.Has(q) {
			t.Errorf("%s not on", q)
		}
	}
	if got, want := qs.String(), "min-sampling-50ms,no-cert-on-none,retain-freed-memory"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (Quirks{}).String(); got != "none" {
		t.Errorf("empty String() = %q", got)
	}
	_, err = ParseQuirks("min-sampling-50ms,fast-everything")
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `"fast-everything"`) ||
		!strings.Contains(err.Error(), "retain-freed-memory") {
		t.Errorf("unknown quirk: err = %v", err)
	}
}

// TestLoadConfigQuirks: OPCUA_QUIRKS and -quirks switch quirks on; a bad
// name is an error naming OPCUA_QUIRKS.
func TestLoadConfigQuirks(t *testing.T) {
	getenv := func(v string) func(string) string {
		return func(k string) string {
			if k == "OPCUA_QUIRKS" {
				return v
			}
			return ""
		}
	}
	cfg, err := LoadConfig(nil, getenv("min-sampling-50ms"), io.Discard)
	if err != nil || !cfg.Quirks.Has(QuirkMinSampling50ms) || cfg.Quirks.Has(QuirkNoCertOnNone) {
		t.Errorf("env: quirks %v, err %v", cfg.Quirks, err)
	}
	cfg, err = LoadConfig([]string{"-quirks", "no-cert-on-none"}, getenv(""), io.Discard)
	if err != nil || !cfg.Quirks.Has(QuirkNoCertOnNone) {
		t.Errorf("flag: quirks %v, err %v", cfg.Quirks, err)
	}
	if _, err = LoadConfig(nil, getenv("bogus"), io.Discard); err == nil || !strings.HasPrefix(err.Error(), "OPCUA_QUIRKS: unknown quirk \"bogus\"") {
		t.Errorf("bad quirk: err = %v", err)
	}
}
