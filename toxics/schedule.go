package toxics

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Step is one fault of a nemesis schedule: Condition holds from At for For
// (offsets from the start of the schedule).
type Step struct {
	At, For time.Duration
	// Condition is what is injected; its Name is unique within the
	// schedule (e.g. "spike-3"), so that its Added and Removed events pair
	// up in the history.
	Condition Condition
}

// Nemesis names the faults a schedule draws from. Each returns a condition
// for the given step index; none of them closes connections, so every
// request of a surviving connection must still complete exactly once.
var Nemesis = []struct {
	Name string
	Make func(i int) Condition
}{
	{"spike", func(i int) Condition {
		return Condition{Name: fmt.Sprintf("spike-%d", i), Toxics: []Toxic{named(Latency(Downstream, 100, 50), i)}}
	}},
	{"jitter", func(i int) Condition {
		return Condition{Name: fmt.Sprintf("jitter-%d", i), Toxics: []Toxic{named(Latency(Upstream, 20, 20), i), named(Latency(Downstream, 20, 20), i)}}
	}},
	{"throttle", func(i int) Condition {
		return Condition{Name: fmt.Sprintf("throttle-%d", i), Toxics: []Toxic{named(Bandwidth(Downstream, 64), i)}}
	}},
	{"slicer", func(i int) Condition {
		return Condition{Name: fmt.Sprintf("slicer-%d", i), Toxics: []Toxic{named(newToxic("slicer", Downstream,
			map[string]any{"average_size": 64, "size_variation": 32, "delay": 200}), i)}}
	}},
	{"starve", func(i int) Condition {
		return Condition{Name: fmt.Sprintf("starve-%d", i), NanoCPUs: 250_000_000}
	}},
}

func named(t Toxic, i int) Toxic {
	t.Name = fmt.Sprintf("%s-%d", t.Name, i)
	return t
}

// Schedule draws a nemesis schedule for total from seed: faults of 1–4 s
// separated by quiet gaps of 1–3 s, one at a time, drawn from Nemesis. The
// same seed always gives the same schedule, so a failing run replays with
// its seed.
func Schedule(seed int64, total time.Duration) []Step {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6e656d65))
	var out []Step
	at := time.Duration(1+rng.IntN(2)) * time.Second
	for i := 0; ; i++ {
		d := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
		if at+d > total {
			return out
		}
		n := Nemesis[rng.IntN(len(Nemesis))]
		out = append(out, Step{At: at, For: d, Condition: n.Make(i)})
		at += d + time.Duration(1000+rng.IntN(2000))*time.Millisecond
	}
}
