package toxics_test

import (
	"testing"

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
