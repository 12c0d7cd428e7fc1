package bench

import "testing"

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		comm       string
		ticks      int64
		ok         bool
	}{
		{"postgres backend", "4242 (postgres) S 900 900 900 0 -1 4194560 300 0 0 0 1234 567 0 0 20 0 1 0 100 1000 10",
			"postgres", 1801, true},
		// A name with a space and a parenthesis of its own: the fields
		// count from the last ')'.
		{"odd name", "7 (a b) c) R 1 1 1 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 1 1 1", "a b) c", 15, true},
		{"truncated", "7 (redis-server) S 1 1 1 0", "", 0, false},
		{"no name", "7 redis-server S 1 1 1 0 -1 0 0 0 0 0 10 5", "", 0, false},
		{"not a number", "7 (x) S 1 1 1 0 -1 0 0 0 0 0 ten 5 0 0", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comm, ticks, ok := parseStat([]byte(tc.line))
			if comm != tc.comm || ticks != tc.ticks || ok != tc.ok {
				t.Fatalf("parseStat = %q, %d, %v; want %q, %d, %v", comm, ticks, ok, tc.comm, tc.ticks, tc.ok)
			}
		})
	}
}

func TestParseMachine(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stat      string
		busy, all int64
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice:
		// the guests are already in user and nice, so they are not added.
		{"linux", "cpu  100 2 30 500 8 1 4 5 7 0\ncpu0 50 1 15 250 4 0 2 2 3 0\n", 142, 650},
		{"older kernel", "cpu  100 2 30 500 8\n", 132, 640},
		{"not cpu", "intr 1 2 3 4 5 6\n", 0, 0},
		{"garbage", "cpu  100 x 30 500 8 1\n", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			busy, all := parseMachine([]byte(tc.stat))
			if busy != tc.busy || all != tc.all {
				t.Fatalf("parseMachine = %d, %d; want %d, %d", busy, all, tc.busy, tc.all)
			}
		})
	}
}

func TestCPUPerEvent(t *testing.T) {
	a := cpuSample{"postgres": 100, cpuSelf: 50, "broker": 10, cpuBusy: 1000, cpuAll: 4000}
	b := cpuSample{"postgres": 180, cpuSelf: 110, "broker": 17, cpuBusy: 2600, cpuAll: 6000}
	// 80 ticks of 10 ms over 1,000 events: 800 µs an event.
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
