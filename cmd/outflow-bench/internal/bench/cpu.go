package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
)

// cpuGroups names the processes whose CPU time a run splits out, by the
// command name the kernel gives them (/proc/PID/stat's second field): the
// database, and the brokers the benchmarks start no process for. The
// benchmark's own process is counted apart (cpuSelf).
var cpuGroups = map[string]string{
	"postgres":     "postgres",
	"redis-server": "broker",
	"nats-server":  "broker",
	"beam.smp":     "broker", // RabbitMQ's Erlang VM
}

// cpuSample is the CPU time (user and system, in clock ticks) each group
// had used at one moment.
type cpuSample map[string]int64

// cpuSelf is the group of the benchmark's own process: producers,
// forwarder and worker (and kfake).
const cpuSelf = "bench"

// cpuBusy and cpuAll are the whole machine's busy and total ticks, summed
// over its CPUs.
const (
	cpuBusy = "busy"
	cpuAll  = "all"
)

// parseMachine returns the busy and total ticks of /proc/stat's first
// line (user nice system idle iowait irq softirq steal ...): idle and
// iowait are the idle ones.
func parseMachine(b []byte) (busy, all int64) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0
		}
		all += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, all
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go runs on.
const clockTicks = 100

// sampleCPU reads /proc. Off Linux, or where /proc cannot be read, it
// returns nil, and cpuPerEvent prints nothing.
func sampleCPU() cpuSample {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil || len(dirs) == 0 {
		return nil
	}
	self := strconv.Itoa(os.Getpid())
	s := cpuSample{}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s[cpuBusy], s[cpuAll] = parseMachine(b)
	}
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue // the process ended
		}
		comm, ticks, ok := parseStat(b)
		if !ok {
			continue
		}
		if filepath.Base(d) == self {
			s[cpuSelf] += ticks
		} else if g, ok := cpuGroups[comm]; ok {
			s[g] += ticks
		}
	}
	return s
}

// parseStat returns the command name and utime+stime of a /proc/PID/stat
// line. The name is in parentheses and may hold spaces and parentheses
// itself, so the fields are counted from the last ')'.
func parseStat(b []byte) (comm string, ticks int64, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return "", 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return string(b[open+1 : end]), u + s, true
}

// cpuPerEvent formats the CPU each group used between a and b, in
// microseconds per event: "postgres / bench / broker". A process that
// started or ended between the two samples is counted for the part it was
// alive in both, or not at all: the runs keep their connections open, so
// this misses little.
func cpuPerEvent(a, b cpuSample, events int) string {
	if a == nil || b == nil || events <= 0 {
		return "n/a"
	}
	us := func(g string) float64 {
		return float64(max(b[g]-a[g], 0)) * 1e6 / clockTicks / float64(events)
	}
	return fmt.Sprintf("%.0f / %.0f / %.0f", us("postgres"), us(cpuSelf), us("broker"))
}

// machineBusy is the share of the machine's CPU time between a and b that
// was busy, in percent.
func machineBusy(a, b cpuSample) string {
	all := b[cpuAll] - a[cpuAll]
	if a == nil || b == nil || all <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", float64(b[cpuBusy]-a[cpuBusy])*100/float64(all))
}

// startProfile starts a CPU profile of the benchmark's process when
// BENCH_CPUPROFILE names a file, written as that name with "-"+run
// before its extension; the function it returns stops it, once.
func startProfile(run string) (stop func(), err error) {
	path := os.Getenv("BENCH_CPUPROFILE")
	if path == "" {
		return func() {}, nil
	}
	ext := filepath.Ext(path)
	f, err := os.Create(strings.TrimSuffix(path, ext) + "-" + run + ext)
	if err != nil {
		return func() {}, fmt.Errorf("BENCH_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return func() {}, fmt.Errorf("BENCH_CPUPROFILE: %w", err)
	}
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}), nil
}
