package robustness_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
)

// windowsOf returns n consecutive windows of a second each.
func windowsOf(n int) []history.Window {
	ws := make([]history.Window, n)
	for i := range ws {
		ws[i] = history.Window{Start: time.Duration(i) * time.Second, End: time.Duration(i+1) * time.Second}
	}
	return ws
}

func TestMemoryRounds(t *testing.T) {
	for _, tc := range []struct {
		rounds int
		want   []history.Window
	}{
		{1, windowsOf(1)},
		{2, windowsOf(2)},
		{maxMemoryRounds, windowsOf(maxMemoryRounds)},
		// 9 rounds in 8 groups: the last holds two
		{9, append(windowsOf(7), history.Window{Start: 7 * time.Second, End: 9 * time.Second})},
		// 20 rounds in 8 groups of 2 or 3, every round in one
		{20, []history.Window{
			{Start: 0, End: 2 * time.Second}, {Start: 2 * time.Second, End: 5 * time.Second},
			{Start: 5 * time.Second, End: 7 * time.Second}, {Start: 7 * time.Second, End: 10 * time.Second},
			{Start: 10 * time.Second, End: 12 * time.Second}, {Start: 12 * time.Second, End: 15 * time.Second},
			{Start: 15 * time.Second, End: 17 * time.Second}, {Start: 17 * time.Second, End: 20 * time.Second},
		}},
	} {
		got := memoryRounds(windowsOf(tc.rounds))
		if len(got) != len(tc.want) {
			t.Fatalf("%d rounds: %d windows %v, want %d", tc.rounds, len(got), got, len(tc.want))
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%d rounds: window %d is %v, want %v", tc.rounds, i, got[i], tc.want[i])
			}
		}
	}
}

func TestEndRounds(t *testing.T) {
	now := time.Now()
	ctx := context.Background()
	long, cancel := context.WithDeadline(ctx, now.Add(time.Hour))
	defer cancel()
	short, cancel := context.WithDeadline(ctx, now.Add(reserve+30*time.Second))
	defer cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		alive   bool
		until   time.Time
		longest time.Duration
		want    string // "" or a part of the reason
	}{
		{"time for another", long, true, now.Add(10 * time.Minute), time.Minute, ""},
		{"no deadline", ctx, true, now.Add(10 * time.Minute), time.Minute, ""},
		{"dead server", long, false, now.Add(10 * time.Minute), time.Minute, "not running"},
		{"soak used up", long, true, now.Add(30 * time.Second), time.Minute, "would end after"},
		{"one round only", long, true, time.Time{}, time.Minute, "would end after"},
		{"spec's time", short, true, now.Add(10 * time.Minute), time.Minute, "spec's time left"},
	} {
		got := endRounds(tc.ctx, tc.alive, tc.until, tc.longest)
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
