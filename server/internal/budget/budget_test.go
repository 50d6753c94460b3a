package budget

import (
	"sync"
	"testing"
)

func TestClassShareAndLimit(t *testing.T) {
	b := New(1600)
	if !b.Charge(Logins, 100) {
		t.Fatal("100 B of logins refused under a 1600 B budget (share 100)")
	}
	if b.Charge(Logins, 1) {
		t.Fatal("a login beyond the class share was admitted")
	}
	if got := b.Refused(Logins); got != 1 {
		t.Fatalf("refused logins = %d, want 1", got)
	}
	if !b.Charge(Queue, 800) || !b.Charge(Chunks, 400) {
		t.Fatal("queue and chunks within their shares refused")
	}
	// Items' share is 800, but only 300 B of the limit are left.
	if b.Charge(Items, 400) {
		t.Fatal("a charge beyond the whole limit was admitted")
	}
	if got := b.UsedBy(Items); got != 0 {
		t.Fatalf("a refused charge left %d B charged", got)
	}
	if !b.Charge(Items, 300) {
		t.Fatal("300 B of items refused with 300 B left")
	}
	b.Release(Queue, 800)
	if got, want := b.Used(), int64(100+400+300); got != want {
		t.Fatalf("used = %d, want %d", got, want)
	}
}

func TestNilIsUnbounded(t *testing.T) {
	var b *Budget
	if !b.Charge(Queue, 1<<40) {
		t.Fatal("a nil budget refused a charge")
	}
	b.Release(Queue, 1<<40)
	if b.Used() != 0 || b.Limit() != 0 {
		t.Fatal("a nil budget reports usage")
	}
}

func TestConcurrentChargesNeverExceed(t *testing.T) {
	b := New(16 * 1024)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10_000 {
				if b.Charge(Queue, 100) {
					if u := b.UsedBy(Queue); u > b.ClassLimit(Queue) {
						t.Errorf("queue holds %d B over its share %d", u, b.ClassLimit(Queue))
					}
					b.Release(Queue, 100)
				}
			}
		})
	}
	wg.Wait()
	if b.Used() != 0 {
		t.Fatalf("used = %d after every charge was released", b.Used())
	}
}

func TestForceGoesOverAndChargeWaits(t *testing.T) {
	b := New(1600) // Responses' share: 800
	if !b.Charge(Responses, 800) {
		t.Fatal("800 B of responses refused under their share of 800")
	}
	b.Force(Responses, 50)
	if got := b.UsedBy(Responses); got != 850 {
		t.Fatalf("forced charge: responses hold %d, want 850", got)
	}
	if b.Charge(Responses, 1) {
		t.Fatal("a charge admitted while the class was over its share")
	}
	b.Refuse(Responses)
	if got := b.Refused(Responses); got != 2 {
		t.Fatalf("refused responses = %d, want 2 (one by Charge, one counted by Refuse)", got)
	}
	b.Release(Responses, 850)
	if b.Used() != 0 || !b.Charge(Responses, 800) {
		t.Fatal("the class did not come back after its forced charge was released")
	}
	var nb *Budget
	nb.Force(Responses, 10)
	nb.Refuse(Responses)
	if nb.Used() != 0 || nb.Refused(Responses) != 0 {
		t.Fatal("a nil budget counts forced charges or refusals")
	}
}
