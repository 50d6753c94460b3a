package catalog

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"testing"
	"time"
)

// declared lists the names of the constants of type typ declared in
// catalog.go, in order.
func declared(t *testing.T, typ string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "catalog.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); ok && id.Name == typ {
				for _, n := range v.Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

// TestAllFaultsListsEveryFault: every Fault constant is in AllFaults once,
// and no two faults share a name.
func TestAllFaultsListsEveryFault(t *testing.T) {
	names := declared(t, "Fault")
	if len(names) != len(AllFaults) {
		t.Errorf("%d Fault constants declared, AllFaults lists %d", len(names), len(AllFaults))
	}
	seen := map[Fault]bool{}
	for _, f := range AllFaults {
		if f == "" || seen[f] {
			t.Errorf("fault %q empty or listed twice", f)
		}
		seen[f] = true
	}
}

// TestAllQuirksListsEveryQuirk: every Quirk constant is in AllQuirks once,
// and no quirk shares a fault's name.
func TestAllQuirksListsEveryQuirk(t *testing.T) {
	names := declared(t, "Quirk")
	if len(names) != len(AllQuirks) {
		t.Errorf("%d Quirk constants declared, AllQuirks lists %d", len(names), len(AllQuirks))
	}
	seen := map[Quirk]bool{}
	for _, q := range AllQuirks {
		if q == "" || seen[q] || slices.Contains(AllFaults, Fault(q)) {
			t.Errorf("quirk %q empty, listed twice or named like a fault", q)
		}
		seen[q] = true
	}
}

// TestMinSoak: trickle-leak needs an hour's soak; the faults any run
// catches need none.
func TestMinSoak(t *testing.T) {
	if got := MinSoak(FaultTrickleLeak); got != time.Hour {
		t.Errorf("MinSoak(trickle-leak) = %v, want 1h", got)
	}
	for _, f := range []Fault{FaultSlowLeak, FaultRetainMemory, FaultUnweighted} {
		if got := MinSoak(f); got != 0 {
			t.Errorf("MinSoak(%s) = %v, want 0", f, got)
		}
	}
}
