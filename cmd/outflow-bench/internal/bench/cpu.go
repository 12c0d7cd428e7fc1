package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/outflow-dev/outflow/brokers"
)

// brokerProcess is the command name the kernel gives the broker process
// of each backend the benchmarks run on this machine's servers. The sql
// backend's broker is PostgreSQL, counted as such, and kafka's is kfake
// in the benchmark's own process (or a cluster elsewhere): none.
var brokerProcess = map[brokers.Kind]string{
	brokers.Redis: "redis-server",
	brokers.NATS:  "nats-server",
	brokers.AMQP:  "beam.smp", // RabbitMQ's Erlang VM
}

// cpuPostgres and cpuBroker are the groups of PostgreSQL's processes and
// of the run's broker's.
const (
	cpuPostgres = "postgres"
	cpuBroker   = "broker"
)

// cpuSelf is the group of the benchmark's own process: producers,
// forwarder and worker (and kfake).
const cpuSelf = "bench"

// cpuBusy and cpuAll are the whole machine's busy and total CPU time,
// summed over its CPUs.
const (
	cpuBusy = "busy"
	cpuAll  = "all"
)

// cpuSample is the CPU time, in seconds, each group had used at one
// moment (user and system), and the machine's (cpuBusy, cpuAll).
type cpuSample map[string]float64

// sampleCPU reads /proc with procfs (the Prometheus client's own reader,
// already among the project's modules). Where /proc cannot be read (off
// Linux) it returns nil, and cpuPerEvent and machineBusy print "n/a".
// broker is the command name of the run's broker (brokerProcess), "" when
// it has no process of its own.
func sampleCPU(broker string) cpuSample {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return nil
	}
	stat, err := fs.Stat()
	if err != nil {
		return nil
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return nil
	}
	t := stat.CPUTotal
	busy := t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ + t.Steal
	s := cpuSample{cpuBusy: busy, cpuAll: busy + t.Idle + t.Iowait, cpuSelf: processCPU().Seconds()}
	for _, p := range procs {
		ps, err := p.Stat()
		if err != nil {
			continue // the process ended
		}
		switch {
		case ps.Comm == "postgres":
			s[cpuPostgres] += ps.CPUTime()
		case broker != "" && ps.Comm == broker:
			s[cpuBroker] += ps.CPUTime()
		}
	}
	return s
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPerEvent formats the CPU each group used between a and b, in
// microseconds per event: "postgres / bench / broker", "n/a" for a group
// with no process. A process that
// started or ended between the two samples is counted for the part it was
// alive in both, or not at all: the runs keep their connections open, so
// this misses little.
func cpuPerEvent(a, b cpuSample, events int) string {
	if a == nil || b == nil || events <= 0 {
		return "n/a"
	}
	us := func(g string) string {
		if _, ok := b[g]; !ok {
			return "n/a"
		}
		return fmt.Sprintf("%.0f", max(b[g]-a[g], 0)*1e6/float64(events))
	}
	return us(cpuPostgres) + " / " + us(cpuSelf) + " / " + us(cpuBroker)
}

// machineBusy is the share of the machine's CPU time between a and b that
// was busy, in percent.
func machineBusy(a, b cpuSample) string {
	if a == nil || b == nil || b[cpuAll] <= a[cpuAll] {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", (b[cpuBusy]-a[cpuBusy])*100/(b[cpuAll]-a[cpuAll]))
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
