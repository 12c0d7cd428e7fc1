package testservers

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisURL is the test Redis used when OUTFLOW_TEST_REDIS_URL is not
// set.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

// RedisURL returns the test Redis URL.
func RedisURL() string {
	if u := os.Getenv("OUTFLOW_TEST_REDIS_URL"); u != "" {
		return u
	}
	return DefaultRedisURL
}

// Redis returns a client on the test Redis, closed when t ends. Tests share
// the server, so they must name their streams with [UniqueName].
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatalf("outflowtest: OUTFLOW_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		t.Fatalf("outflowtest: Redis is not reachable at %s: %v\n"+
			"Start it with `make services-up`, or point OUTFLOW_TEST_REDIS_URL at a server you run.", RedisURL(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// UniqueName returns a name no other test uses, for topics, streams and
// consumer groups. Streams whose name starts with it are deleted when t ends.
func UniqueName(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	name := "t" + randomHex(6)
	if c != nil {
		t.Cleanup(func() {
			ctx := context.Background()
			var cursor uint64
			for {
				keys, next, err := c.Scan(ctx, cursor, name+"*", 1000).Result()
				if err != nil {
					return
				}
				if len(keys) > 0 {
					c.Del(ctx, keys...)
				}
				if cursor = next; cursor == 0 {
					return
				}
			}
		})
	}
	return name
}

// RedisServer is a redis-server of the test's own, which the test may stop
// and start again on the same port to play an outage. The shared server is
// never touched.
type RedisServer struct {
	t    testing.TB
	dir  string
	Port int
	URL  string
	cmd  *exec.Cmd
	args []string
}

// StartRedis starts a redis-server on a free port, stopped when t ends. It
// fails the test if redis-server is not installed. args are more
// directives for the server's command line (e.g. "--proto-max-bulk-len",
// "1mb").
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("outflowtest: this test starts its own redis-server and none is installed: " +
			"install Redis (Debian: apt-get install redis-server; macOS: brew install redis)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &RedisServer{t: t, dir: t.TempDir(), Port: port, URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), args: args}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server (again) and waits until it answers.
func (s *RedisServer) Start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("outflowtest: start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.Port), 100*time.Millisecond)
		if err == nil {
			fmt.Fprintf(conn, "PING\r\n")
			buf := make([]byte, 16)
			n, _ := conn.Read(buf)
			conn.Close()
			if strings.HasPrefix(string(buf[:n]), "+PONG") {
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("outflowtest: redis-server on port %d did not answer", s.Port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server. Its append-only file keeps every acknowledged
// entry for the next Start, as a production Redis would.
func (s *RedisServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
	s.cmd = nil
}
