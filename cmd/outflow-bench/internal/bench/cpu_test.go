package bench

import (
	"testing"
	"time"
)

func TestCPUPerEvent(t *testing.T) {
	a := cpuSample{"postgres": 1.0, cpuSelf: 0.5, "broker": 0.1, cpuBusy: 10, cpuAll: 40}
	b := cpuSample{"postgres": 1.8, cpuSelf: 1.1, "broker": 0.17, cpuBusy: 26, cpuAll: 60}
	// 0.8 s over 1,000 events: 800 µs an event.
	if got := cpuPerEvent(a, b, 1000); got != "800 / 600 / 70" {
		t.Errorf("cpuPerEvent = %q", got)
	}
	if got := machineBusy(a, b); got != "80%" {
		t.Errorf("machineBusy = %q", got)
	}
	if got := cpuPerEvent(nil, b, 1000); got != "n/a" {
		t.Errorf("cpuPerEvent without a first sample = %q", got)
	}
	if got := machineBusy(a, nil); got != "n/a" {
		t.Errorf("machineBusy without a second sample = %q", got)
	}
}

// sampleCPU reads this process's CPU time and the machine's from /proc:
// the time this test spends busy shows in both.
func TestSampleCPUReadsThisProcessAndTheMachine(t *testing.T) {
	a := sampleCPU()
	if a == nil {
		t.Fatal("sampleCPU read nothing: /proc (Linux) is needed")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b := sampleCPU()
		// USER_HZ ticks: the machine's count moves in steps of 10 ms.
		if b[cpuSelf]-a[cpuSelf] >= 0.05 && b[cpuBusy]-a[cpuBusy] >= 0.02 && b[cpuAll] > b[cpuBusy] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s busy, and the samples moved by self %.3f s, machine busy %.3f s", b[cpuSelf]-a[cpuSelf], b[cpuBusy]-a[cpuBusy])
		}
		for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
		}
	}
}
