package bench

import (
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/outflow-dev/outflow/outflowtest"
)

func TestCPUPerEvent(t *testing.T) {
	a := cpuSample{cpuPostgres: 1.0, cpuSelf: 0.5, cpuBroker: 0.1, cpuBusy: 10, cpuAll: 40}
	b := cpuSample{cpuPostgres: 1.8, cpuSelf: 1.1, cpuBroker: 0.17, cpuBusy: 26, cpuAll: 60}
	// 0.8 s over 1,000 events: 800 µs an event.
	if got := cpuPerEvent(a, b, 1000); got != "800 / 600 / 70" {
		t.Errorf("cpuPerEvent = %q", got)
	}
	if got := machineBusy(a, b); got != "80%" {
		t.Errorf("machineBusy = %q", got)
	}
	// A run whose broker has no process of its own (sql, kafka).
	delete(a, cpuBroker)
	delete(b, cpuBroker)
	if got := cpuPerEvent(a, b, 1000); got != "800 / 600 / n/a" {
		t.Errorf("cpuPerEvent without a broker process = %q", got)
	}
	if got := cpuPerEvent(nil, b, 1000); got != "n/a" {
		t.Errorf("cpuPerEvent without a first sample = %q", got)
	}
	if got := machineBusy(a, nil); got != "n/a" {
		t.Errorf("machineBusy without a second sample = %q", got)
	}
}

// sampleCPU reads this process's CPU time, the machine's and a broker's
// (here this test's own process, named as the broker) from /proc: the
// time this test spends busy shows in all three.
func TestSampleCPUReadsThisProcessAndTheMachine(t *testing.T) {
	self, err := procfs.Self()
	if err != nil {
		t.Fatalf("/proc (Linux) is needed: %v", err)
	}
	st, err := self.Stat()
	if err != nil {
		t.Fatal(err)
	}
	a := sampleCPU(st.Comm)
	if a == nil {
		t.Fatal("sampleCPU read nothing: /proc (Linux) is needed")
	}
	var b cpuSample
	outflowtest.WaitFor(t, 10*time.Second, "the samples to count this test's busy time", func() bool {
		for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
		}
		b = sampleCPU(st.Comm)
		// USER_HZ ticks: /proc's counts move in steps of 10 ms.
		return b[cpuSelf]-a[cpuSelf] >= 0.05 && b[cpuBroker]-a[cpuBroker] >= 0.02 &&
			b[cpuBusy]-a[cpuBusy] >= 0.02 && b[cpuAll] > b[cpuBusy]
	})
}
