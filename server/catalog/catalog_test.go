package catalog

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"testing"
	"time"
)

// declared lists the values of the constants of type typ declared in
// catalog.go, in order.
func declared(t *testing.T, typ string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "catalog.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); ok && id.Name == typ {
				for _, x := range v.Values {
					if lit, ok := x.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						values = append(values, lit.Value[1:len(lit.Value)-1])
					}
				}
			}
		}
	}
	return values
}

// TestEveryFaultHasOneRow: every Fault constant has one row, every row
// one constant, and no two faults share a name or an attack; each row says
// its bug and the specs aimed at it, and its defect pattern compiles.
func TestEveryFaultHasOneRow(t *testing.T) {
	consts := declared(t, "Fault")
	rows := Faults()
	if len(consts) != len(rows) {
		t.Errorf("%d Fault constants declared, Faults has %d rows", len(consts), len(rows))
	}
	seen := map[Fault]bool{}
	attacks := map[string]Fault{}
	for _, r := range rows {
		switch {
		case r.Fault == "" || seen[r.Fault]:
			t.Errorf("fault %q empty or listed twice", r.Fault)
		case r.Attack != "" && attacks[r.Attack] != "":
			t.Errorf("faults %s and %s both name attack %s: its specs are aimed at one switch", attacks[r.Attack], r.Fault, r.Attack)
		case !slices.Contains(consts, string(r.Fault)):
			t.Errorf("fault %q has a row but no constant", r.Fault)
		case r.Bug == "" || r.Specs == "":
			t.Errorf("fault %s: row without its bug or its specs", r.Fault)
		}
		seen[r.Fault] = true
		if r.Attack != "" {
			attacks[r.Attack] = r.Fault
		}
		if _, err := regexp.Compile(`(?i)` + r.DefectPattern()); err != nil {
			t.Errorf("fault %s: defect pattern: %v", r.Fault, err)
		}
	}
	if !slices.Equal(AllFaults(), names(rows, func(r FaultRow) Fault { return r.Fault })) {
		t.Error("AllFaults is not the rows' order")
	}
}

// TestEveryQuirkHasOneRow: every Quirk constant has one row, every row
// one constant, no quirk shares a fault's name, and each row says what the
// server and the suites do and what a skip it causes names.
func TestEveryQuirkHasOneRow(t *testing.T) {
	consts := declared(t, "Quirk")
	rows := Quirks()
	if len(consts) != len(rows) {
		t.Errorf("%d Quirk constants declared, Quirks has %d rows", len(consts), len(rows))
	}
	seen := map[Quirk]bool{}
	for _, r := range rows {
		switch {
		case r.Quirk == "" || seen[r.Quirk] || slices.Contains(AllFaults(), Fault(r.Quirk)):
			t.Errorf("quirk %q empty, listed twice or named like a fault", r.Quirk)
		case !slices.Contains(consts, string(r.Quirk)):
			t.Errorf("quirk %q has a row but no constant", r.Quirk)
		case r.Does == "" || r.SuiteMust == "" || len(r.Cause) == 0:
			t.Errorf("quirk %s: row without what it does, what the suites must do or its cause", r.Quirk)
		}
		seen[r.Quirk] = true
	}
}

// TestRow: a switch finds its row, a name that is none finds nothing.
func TestRow(t *testing.T) {
	if r, ok := FaultSamplingDrift.Row(); !ok || r.Fault != FaultSamplingDrift || r.Defect != "drift" {
		t.Errorf("Row(sampling-drift) = %+v, %v", r, ok)
	}
	if r, ok := Fault("sampling-drif").Row(); ok {
		t.Errorf("Row(sampling-drif) = %+v, want none", r)
	}
	if r, ok := QuirkNoTestNodes.Row(); !ok || r.Quirk != QuirkNoTestNodes {
		t.Errorf("Row(no-test-nodes) = %+v, %v", r, ok)
	}
	if _, ok := Quirk(FaultSamplingDrift).Row(); ok {
		t.Error("a fault's name found a quirk row")
	}
}

// TestDefectPattern: a row's own pattern, else its attack's name quoted,
// else none.
func TestDefectPattern(t *testing.T) {
	for _, tc := range []struct {
		row  FaultRow
		want string
	}{
		{FaultRow{Defect: `drift`, Attack: "a/b"}, `drift`},
		{FaultRow{Attack: "amplifier/rsa-blocks"}, `amplifier/rsa-blocks`},
		{FaultRow{Attack: "a.b(c)"}, `a\.b\(c\)`},
		{FaultRow{}, ""},
	} {
		if got := tc.row.DefectPattern(); got != tc.want {
			t.Errorf("DefectPattern(%+v) = %q, want %q", tc.row, got, tc.want)
		}
	}
}

// TestMinSoak: trickle-leak needs an hour's soak; the faults any run
// catches need none, nor does a name that is no fault.
func TestMinSoak(t *testing.T) {
	if got := MinSoak(FaultTrickleLeak); got != time.Hour {
		t.Errorf("MinSoak(trickle-leak) = %v, want 1h", got)
	}
	for _, f := range []Fault{FaultSlowLeak, FaultRetainMemory, FaultUnweighted, "no-such-fault"} {
		if got := MinSoak(f); got != 0 {
			t.Errorf("MinSoak(%s) = %v, want 0", f, got)
		}
	}
}

// TestABCaughtFaults: a fault `make ab` catches has no defect pattern,
// attack or soak (no spec is aimed at it) and is left out of
// SuiteFaults; every other fault is in it, in order.
func TestABCaughtFaults(t *testing.T) {
	var suite []Fault
	for _, r := range Faults() {
		if r.ABFigure == "" {
			suite = append(suite, r.Fault)
			continue
		}
		if r.Defect != "" || r.Attack != "" || r.MinSoak != 0 {
			t.Errorf("fault %s is caught by make ab but has a spec's defect, attack or soak: %+v", r.Fault, r)
		}
	}
	if !slices.Equal(SuiteFaults(), suite) || slices.Contains(SuiteFaults(), FaultSlowRead) {
		t.Errorf("SuiteFaults() = %v", SuiteFaults())
	}
	if f, v, err := CheckFault("slow-read=5%"); f != FaultSlowRead || v != "5%" || err != nil {
		t.Errorf("CheckFault(slow-read=5%%) = %s %q %v", f, v, err)
	}
	if _, _, err := CheckFault("unweighted=1"); err == nil {
		t.Error("a value on a switch without one passed")
	}
}
