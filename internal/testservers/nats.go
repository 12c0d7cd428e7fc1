package testservers

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/internal/poll"
)

// DefaultNATSURL is the test NATS used when OUTFLOW_TEST_NATS_URL is not
// set.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// NATSURL returns the test NATS URL.
func NATSURL() string {
	if u := os.Getenv("OUTFLOW_TEST_NATS_URL"); u != "" {
		return u
	}
	return DefaultNATSURL
}

// NATSPrefix checks that the test NATS answers with JetStream and returns a
// prefix for stream and subject names no other test uses; streams whose
// name starts with it are deleted when t ends.
func NATSPrefix(t testing.TB) string {
	t.Helper()
	conn, err := nats.Connect(NATSURL(), nats.Timeout(3*time.Second))
	if err == nil {
		var js nats.JetStreamContext
		if js, err = conn.JetStream(); err == nil {
			_, err = js.AccountInfo()
		}
		if err != nil {
			conn.Close()
		}
	}
	if err != nil {
		t.Fatalf("outflowtest: NATS with JetStream is not reachable at %s: %v\n"+
			"Start it with `make services-up` (nats-server -js), or point OUTFLOW_TEST_NATS_URL at a server you run.", NATSURL(), err)
	}
	prefix := "t" + randomHex(6) + "_"
	t.Cleanup(func() {
		defer conn.Close()
		js, err := conn.JetStream()
		if err != nil {
			return
		}
		for name := range js.StreamNames() {
			if strings.HasPrefix(name, prefix) {
				_ = js.DeleteStream(name)
			}
		}
	})
	return prefix
}

// NATSServer is a nats-server (JetStream, file storage) of the test's own,
// which the test may stop and start again on the same port to play an
// outage. The shared server is never touched.
type NATSServer struct {
	t    testing.TB
	dir  string
	conf string // a configuration file (-c), or ""
	log  string // the server's output, every start's
	Port int
	URL  string
	cmd  *exec.Cmd
	// exited is closed when the running server's process has ended, by
	// Stop or on its own (a crash).
	exited chan struct{}
}

// StartNATSConfig is StartNATS with conf, the text of a nats-server
// configuration file (such as "max_payload: 4096"), for the settings that
// have no command-line flag. The flags (port, JetStream, store) win.
func StartNATSConfig(t testing.TB, conf string) *NATSServer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatalf("outflowtest: write nats-server configuration: %v", err)
	}
	return startNATS(t, path)
}

// StartNATS starts a nats-server with JetStream on a free port, stopped
// when t ends. It fails the test if nats-server is not installed. A test
// that fails logs the end of the server's output.
func StartNATS(t testing.TB) *NATSServer {
	t.Helper()
	return startNATS(t, "")
}

func startNATS(t testing.TB, conf string) *NATSServer {
	t.Helper()
	port := freePorts(t, 1)[0]
	s := &NATSServer{t: t, dir: t.TempDir(), conf: conf, log: filepath.Join(t.TempDir(), "server.log"),
		Port: port, URL: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nats-server on port %d, the end of its log:\n%s", s.Port, s.Log())
		}
	})
	s.start(natsServerBinary(t))
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server again, with the streams it had.
func (s *NATSServer) Start() {
	s.t.Helper()
	s.start(natsServerBinary(s.t))
}

func (s *NATSServer) start(bin string) {
	args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-js", "-sd", s.dir}
	if s.conf != "" {
		args = append([]string{"-c", s.conf}, args...)
	}
	log, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer log.Close() // the server has its own descriptor
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("outflowtest: start nats-server: %v", err)
	}
	// Waited for at once, so that Crashed sees a server that died; it
	// ends with the process.
	cmd, exited := s.cmd, make(chan struct{})
	s.exited = exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	if poll.Until(context.Background(), 20*time.Millisecond, 10*time.Second, func() (bool, error) {
		conn, err := nats.Connect(s.URL, nats.Timeout(200*time.Millisecond))
		if err != nil {
			return false, nil
		}
		defer conn.Close()
		js, err := conn.JetStream()
		if err == nil {
			_, err = js.AccountInfo()
		}
		return err == nil, nil
	}) != nil {
		s.t.Fatalf("outflowtest: nats-server on port %d did not answer\n%s", s.Port, s.Log())
	}
}

// Crashed reports whether the server started last has ended without Stop:
// nats-server 2.9.10 can panic on a message read racing its stream's
// deletion (see docs/broker-loss.md). The end of its log says why.
func (s *NATSServer) Crashed() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// Log is the end of the server's output, every start's.
func (s *NATSServer) Log() string { return logTail(s.log, 4000) }

// StoreDir is the server's JetStream store directory (-sd). A test may
// copy it while the server is stopped and put the copy back later, to play
// a store restored from an older copy (or a replica behind taking over).
func (s *NATSServer) StoreDir() string { return s.dir }

// Stop stops the server; JetStream's file storage keeps the streams.
func (s *NATSServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.exited
	s.cmd = nil
}
