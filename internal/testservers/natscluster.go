package testservers

import (
	"context"
	"errors"
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

// NATSCluster is a three-node NATS JetStream cluster of the test's own, on
// local ports, from the installed nats-server: streams of three replicas
// spread their leaders over it, and the test may kill a node and restart
// it with what it had stored. The shared server is never touched.
type NATSCluster struct {
	t            testing.TB
	bin          string
	name, routes string
	nodes        []*clusterNode
	// URL lists the three client URLs, comma-separated: what nats.Connect
	// (and brokers.NATSConfig.URL) takes to reach whichever node is up.
	URL string
}

type clusterNode struct {
	name        string
	port, route int
	dir         string
	cmd         *exec.Cmd
}

// clusterReadyTimeout bounds the wait for a started cluster to answer
// JetStream.
const clusterReadyTimeout = 30 * time.Second

// restartTimeout bounds the wait for a restarted node to answer
// JetStream. A node that comes back to a cluster without a meta leader
// waits for an election, whose timeouts nats-server draws at random (4-9 s
// in 2.9) and may draw again after a split vote: 6-28 s in 18 runs of the
// audit contract's failover, six at a time, and over 30 s once on CI.
const restartTimeout = 2 * time.Minute

// StartNATSCluster starts three nats-server -js processes clustered
// (routes between them, a server name each, JetStream stores under
// t.TempDir()) and waits until JetStream has a meta leader and takes a
// stream of three replicas; they are killed when t ends. It fails the test
// if nats-server is not installed.
func StartNATSCluster(t testing.TB) *NATSCluster {
	t.Helper()
	c := &NATSCluster{t: t, bin: natsServerBinary(t), name: "outflowtest-" + randomHex(4)}
	var urls, routes []string
	ports := freePorts(t, 6) // held together: six different ports
	for i := range 3 {
		n := &clusterNode{name: fmt.Sprintf("%s-n%d", c.name, i), port: ports[2*i], route: ports[2*i+1], dir: t.TempDir()}
		c.nodes = append(c.nodes, n)
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", n.port))
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", n.route))
	}
	c.URL, c.routes = strings.Join(urls, ","), strings.Join(routes, ",")
	t.Cleanup(func() {
		for i := range c.nodes {
			c.Kill(i)
		}
	})
	for i := range c.nodes {
		c.start(t, i)
	}
	c.waitReady()
	return c
}

// natsServerBinary is the installed nats-server, or fails t saying how to
// install it (the single server's and the cluster's).
func natsServerBinary(t testing.TB) string {
	t.Helper()
	if bin, err := exec.LookPath("nats-server"); err == nil {
		return bin
	}
	if _, err := os.Stat("/usr/sbin/nats-server"); err == nil {
		return "/usr/sbin/nats-server"
	}
	t.Fatalf("outflowtest: this test starts its own NATS cluster and nats-server is not installed: " +
		"install NATS (Debian: apt-get install nats-server; macOS: brew install nats-server)")
	return ""
}

func (c *NATSCluster) start(t testing.TB, i int) {
	t.Helper()
	n := c.nodes[i]
	log, err := os.OpenFile(filepath.Join(n.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	n.cmd = exec.Command(c.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-js", "-sd", filepath.Join(n.dir, "js"),
		"--server_name", n.name, "--cluster_name", c.name,
		"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", n.route), "--routes", c.routes)
	n.cmd.Stdout, n.cmd.Stderr = log, log
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("outflowtest: start nats-server %s: %v", n.name, err)
	}
}

// Kill kills node i at once (SIGKILL: no clean shutdown, as a crash).
func (c *NATSCluster) Kill(i int) {
	n := c.nodes[i]
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Wait()
	n.cmd = nil
}

// Restart starts node i again, on its ports with its store, and waits
// until it answers JetStream; it fails t (the caller's test, a subtest
// of the one that started the cluster, say) if it never does.
func (c *NATSCluster) Restart(t testing.TB, i int) {
	t.Helper()
	c.Kill(i)
	c.start(t, i)
	c.waitNode(t, i, restartTimeout)
}

// Start starts node i again (after Kill), on its ports with its store,
// without waiting: a node alone cannot answer JetStream, which takes a
// quorum; Restart of a second node then waits for both.
func (c *NATSCluster) Start(t testing.TB, i int) {
	t.Helper()
	c.Kill(i)
	c.start(t, i)
}

// StoreDir is node i's JetStream store directory (-sd): a test may empty
// it while the node is down, to play a node that lost its disk.
func (c *NATSCluster) StoreDir(i int) string {
	return filepath.Join(c.nodes[i].dir, "js")
}

// NodeURL is node i's client URL.
func (c *NATSCluster) NodeURL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].port)
}

// waitReady waits until every node answers JetStream and a stream of
// three replicas can be created: the meta group has a leader and all three
// peers.
func (c *NATSCluster) waitReady() {
	c.t.Helper()
	for i := range c.nodes {
		c.waitNode(c.t, i, clusterReadyTimeout)
	}
	var last error
	if poll.Until(context.Background(), 50*time.Millisecond, clusterReadyTimeout, func() (bool, error) {
		last = c.probe()
		return last == nil, nil
	}) == nil {
		return
	}
	c.t.Fatalf("outflowtest: the NATS cluster never took a stream of 3 replicas: %v\n%s", last, c.logs())
}

// probe creates and deletes a stream of three replicas.
func (c *NATSCluster) probe() error {
	conn, err := nats.Connect(c.URL, nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer conn.Close()
	js, err := conn.JetStream(nats.MaxWait(5 * time.Second))
	if err != nil {
		return err
	}
	name := "outflowtest_probe_" + randomHex(4)
	if _, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{name}, Replicas: 3, Storage: nats.FileStorage}); err != nil {
		return err
	}
	return js.DeleteStream(name)
}

// waitNode waits until node i answers a JetStream account info (the meta
// leader answers it through the node).
func (c *NATSCluster) waitNode(t testing.TB, i int, within time.Duration) {
	t.Helper()
	last := errors.New("not started")
	if poll.Until(context.Background(), 50*time.Millisecond, within, func() (bool, error) {
		conn, err := nats.Connect(c.NodeURL(i), nats.Timeout(500*time.Millisecond))
		if err == nil {
			var js nats.JetStreamContext
			if js, err = conn.JetStream(nats.MaxWait(2 * time.Second)); err == nil {
				_, err = js.AccountInfo()
			}
			conn.Close()
		}
		if err != nil {
			last = err
		}
		return err == nil, nil
	}) == nil {
		return
	}
	t.Fatalf("outflowtest: NATS cluster node %d never answered JetStream: %v\n%s", i, last, c.logs())
}

// logs is the end of every node's log, for a failure's message.
func (c *NATSCluster) logs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", n.name, logTail(filepath.Join(n.dir, "server.log"), 2000))
	}
	return b.String()
}

// Node is the index of the node of server name name (a stream's
// Cluster.Leader, say), -1 when none.
func (c *NATSCluster) Node(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// StreamStored reports whether the server still has files of stream
// name: nats-server removes a deleted stream's files after it answered the
// delete, and a stream of the same name created before they are gone has
// its files removed under it (nats-server 2.9), so a test that deletes and
// creates a stream again waits until this is false in between.
func (s *NATSServer) StreamStored(name string) bool {
	_, err := os.Stat(filepath.Join(s.dir, "jetstream", "$G", "streams", name))
	return err == nil
}

// logTail is the last n bytes of the file at path (a server's log), or
// what reading it failed with.
func logTail(path string, n int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(raw[max(len(raw)-n, 0):])
}
