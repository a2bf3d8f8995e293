package main

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Checks a history given as JSON lines.
func check(t *testing.T, lines ...string) porcupine.CheckResult {
	t.Helper()
	ops, _, err := parse(strings.NewReader(strings.Join(lines, "\n")), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return porcupine.CheckOperationsTimeout(model, ops, 10*time.Second)
}

func expect(t *testing.T, want porcupine.CheckResult, lines ...string) {
	t.Helper()
	if got := check(t, lines...); got != want {
		t.Fatalf("checked %q, want %q", got, want)
	}
}

func TestSequentialHistoryIsLinearizable(t *testing.T) {
	expect(t, porcupine.Ok,
		`{"client":0,"op":"get","key":"a","output":null,"call":0,"return":1,"status":"ok"}`,
		`{"client":0,"op":"put","key":"a","value":"1","call":2,"return":3,"status":"ok"}`,
		`{"client":0,"op":"get","key":"a","output":"1","call":4,"return":5,"status":"ok"}`,
		`{"client":0,"op":"del","key":"a","call":6,"return":7,"status":"ok"}`,
		`{"client":0,"op":"get","key":"a","output":null,"call":8,"return":9,"status":"ok"}`)
}

func TestAStaleReadIsNotLinearizable(t *testing.T) {
	expect(t, porcupine.Illegal,
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":1,"status":"ok"}`,
		`{"client":0,"op":"put","key":"a","value":"2","call":2,"return":3,"status":"ok"}`,
		`{"client":1,"op":"get","key":"a","output":"1","call":4,"return":5,"status":"ok"}`)
}

func TestALostAcknowledgedWriteIsNotLinearizable(t *testing.T) {
	expect(t, porcupine.Illegal,
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":1,"status":"ok"}`,
		`{"client":1,"op":"get","key":"a","output":null,"call":2,"return":3,"status":"ok"}`)
}

func TestAnUnknownWriteMayTakeEffectLate(t *testing.T) {
	expect(t, porcupine.Ok,
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":5,"status":"unknown"}`,
		`{"client":1,"op":"get","key":"a","output":null,"call":6,"return":7,"status":"ok"}`,
		`{"client":1,"op":"get","key":"a","output":"1","call":8,"return":9,"status":"ok"}`)
}

func TestAFailedWriteTookNoEffect(t *testing.T) {
	expect(t, porcupine.Illegal,
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":1,"status":"fail"}`,
		`{"client":1,"op":"get","key":"a","output":"1","call":2,"return":3,"status":"ok"}`)
}

// An unknown del that a read saw is kept.
func TestAnObservedUnknownDelIsKept(t *testing.T) {
	expect(t, porcupine.Ok,
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":1,"status":"ok"}`,
		`{"client":0,"op":"del","key":"a","call":2,"return":3,"status":"unknown"}`,
		`{"client":1,"op":"get","key":"a","output":null,"call":5,"return":6,"status":"ok"}`)
}

// An unknown del takes effect once, for good.
func TestAnObservedUnknownDelIsChecked(t *testing.T) {
	expect(t, porcupine.Illegal,
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":1,"status":"ok"}`,
		`{"client":0,"op":"del","key":"a","call":2,"return":3,"status":"unknown"}`,
		`{"client":1,"op":"get","key":"a","output":null,"call":5,"return":6,"status":"ok"}`,
		`{"client":1,"op":"get","key":"a","output":"1","call":7,"return":8,"status":"ok"}`)
}

// Leaving out unobserved unknown writes hides no violation.
func TestLeavingOutUnobservedWritesHidesNothing(t *testing.T) {
	lines := []string{
		`{"client":0,"op":"put","key":"a","value":"1","call":0,"return":1,"status":"ok"}`,
		`{"client":2,"op":"put","key":"a","value":"2","call":2,"return":3,"status":"unknown"}`,
		`{"client":2,"op":"del","key":"b","call":2,"return":3,"status":"unknown"}`,
		`{"client":1,"op":"get","key":"a","output":null,"call":4,"return":5,"status":"ok"}`,
	}
	ops, left, err := parse(strings.NewReader(strings.Join(lines, "\n")), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || left != 2 {
		t.Fatalf("kept %d operations and left out %d, want 2 and 2", len(ops), left)
	}
	expect(t, porcupine.Illegal, lines...)
}

func TestBadRecordsAreRefused(t *testing.T) {
	for _, line := range []string{
		`{"client":0,"op":"put","key":"a","call":0,"return":1,"status":"ok"}`,
		`{"client":0,"op":"inc","key":"a","call":0,"return":1,"status":"ok"}`,
		`{"client":0,"op":"get","key":"a","call":0,"return":1,"status":"maybe"}`,
		`{"client":0,"op":"get","key":"a","call":5,"return":1,"status":"ok"}`,
		`not json`,
	} {
		if _, _, err := parse(strings.NewReader(line), "bad"); err == nil {
			t.Errorf("accepted %s", line)
		}
	}
}
