package testservers

import (
	"context"
	"fmt"
	"github.com/outflow-dev/outflow/outflowtest"
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

// RedisNode is one redis-server process of the test's own (a
// [RedisCluster]'s node or a [RedisPair]'s server), which the test may kill
// and start again on the same port. It keeps no data across a restart (no
// RDB, no AOF): a restarted node gets its data from its primary, as a
// replaced machine would.
type RedisNode struct {
	t    testing.TB
	Port int
	// Addr is 127.0.0.1:Port.
	Addr string
	dir  string
	args []string
	cmd  *exec.Cmd
	// paused: stopped by Pause, not resumed yet.
	paused bool
}

func requireRedisServer(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("outflowtest: this test starts its own redis-server processes and none is installed: " +
			"install Redis (Debian: apt-get install redis-server; macOS: brew install redis)")
	}
}

// freePorts returns n distinct ports that were free a moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("outflowtest: a free port: %v", err)
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

func newRedisNode(t testing.TB, port int, extra ...string) *RedisNode {
	n := &RedisNode{t: t, Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port), dir: t.TempDir()}
	n.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", n.dir, "--logfile", filepath.Join(n.dir, "redis.log"),
		// A replica syncs at once rather than after the default 5s.
		"--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"}, extra...)
	t.Cleanup(n.Kill)
	return n
}

// Start starts the node (again) and waits until it answers PING.
func (n *RedisNode) Start() {
	n.t.Helper()
	if n.cmd != nil {
		n.t.Fatalf("outflowtest: redis node %s is running already", n.Addr)
	}
	n.cmd = exec.Command("redis-server", n.args...)
	if err := n.cmd.Start(); err != nil {
		n.t.Fatalf("outflowtest: start redis-server: %v", err)
	}
	c := n.client()
	defer c.Close()
	outflowtest.WaitFor(n.t, 10*time.Second, "redis-server on "+n.Addr+" to answer (see "+filepath.Join(n.dir, "redis.log")+")", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
}

// Kill kills the node with SIGKILL: what it had not replicated is lost, as
// in a crash. Killing a stopped node does nothing.
func (n *RedisNode) Kill() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Wait()
	n.cmd, n.paused = nil, false
}

// Pause stops the node's process (SIGSTOP) without killing it: a replica
// paused so falls behind its primary, as over a slow link, and is still
// there to take over once resumed.
func (n *RedisNode) Pause() {
	n.t.Helper()
	if n.cmd == nil {
		n.t.Fatalf("outflowtest: pause of redis node %s, which is not running", n.Addr)
	}
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		n.t.Fatalf("outflowtest: pause redis node %s: %v", n.Addr, err)
	}
	n.paused = true
}

// Resume resumes a paused node (SIGCONT).
func (n *RedisNode) Resume() {
	n.t.Helper()
	if n.cmd == nil {
		n.t.Fatalf("outflowtest: resume of redis node %s, which is not running", n.Addr)
	}
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		n.t.Fatalf("outflowtest: resume redis node %s: %v", n.Addr, err)
	}
	n.paused = false
}

// Running says whether the node's process is running.
func (n *RedisNode) Running() bool { return n.cmd != nil }

// client is a connection to this node alone, with short timeouts: nodes
// are killed under it.
func (n *RedisNode) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1, PoolSize: 2})
}

// infoAll returns INFO section on the node, "" when it does not answer.
func (n *RedisNode) infoAll(section string) string {
	c := n.client()
	defer c.Close()
	s, _ := c.Info(context.Background(), section).Result()
	return s
}

// info returns one field of INFO section on the node, "" when it does not
// answer.
func (n *RedisNode) info(section, field string) string {
	c := n.client()
	defer c.Close()
	s, err := c.Info(context.Background(), section).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// clusterState is cluster_state of CLUSTER INFO, "" when the node does not
// answer.
func (n *RedisNode) clusterState() string {
	c := n.client()
	defer c.Close()
	s, err := c.ClusterInfo(context.Background()).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, "cluster_state:"); ok {
			return v
		}
	}
	return ""
}

// RedisPair is a primary with one replica, of the test's own.
type RedisPair struct {
	Primary, Replica *RedisNode
	// URL is the primary's.
	URL string
}

// StartRedisPair starts a redis-server primary and a replica of it on free
// ports, both killed when t ends, and waits until the replica is in sync.
// It fails the test if redis-server is not installed.
func StartRedisPair(t testing.TB) *RedisPair {
	t.Helper()
	requireRedisServer(t)
	ports := freePorts(t, 2)
	p := &RedisPair{Primary: newRedisNode(t, ports[0])}
	p.Replica = newRedisNode(t, ports[1], "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
	p.URL = fmt.Sprintf("redis://%s/0", p.Primary.Addr)
	p.Primary.Start()
	p.Replica.Start()
	p.WaitReplicaInSync()
	return p
}

// WaitReplicaInSync waits until the primary counts its replica connected
// and the replica's link to it is up.
func (p *RedisPair) WaitReplicaInSync() {
	p.Primary.t.Helper()
	outflowtest.WaitFor(p.Primary.t, 20*time.Second, "the replica in sync with its primary", func() bool {
		return p.Primary.info("replication", "connected_slaves") == "1" &&
			p.Replica.info("replication", "master_link_status") == "up"
	})
}

// HoldReplication makes what the primary takes from now on stay on it
// alone, as [RedisCluster.HoldReplication] does: lost if it dies before
// the replica is resumed.
func (p *RedisPair) HoldReplication() { holdReplication(p.Primary, p.Replica) }

// FailOver makes the replica the primary, as Sentinel or an operator
// would once the primary died: the primary is killed (what it had not
// replicated is lost with it) and the replica promoted (REPLICAOF NO ONE).
// A paused replica (see HoldReplication) is resumed first.
func (p *RedisPair) FailOver() {
	p.Primary.t.Helper()
	p.Primary.Kill()
	if p.Replica.paused {
		p.Replica.Resume()
	}
	c := p.Replica.client()
	defer c.Close()
	outflowtest.WaitFor(p.Primary.t, 10*time.Second, "the replica to become the primary", func() bool {
		return c.Do(context.Background(), "replicaof", "no", "one").Err() == nil &&
			p.Replica.info("replication", "role") == "master"
	})
}

// RedisCluster is a Redis Cluster of the test's own: three primaries, each
// with one replica, on local ports, with a node timeout of one second, so
// that a replica takes over about two seconds after its primary dies.
type RedisCluster struct {
	t testing.TB
	// Nodes are the six nodes: 0-2 are the primaries at the start, 3+i the
	// replica of i.
	Nodes []*RedisNode
	// URL names every node (redis://n0?addr=n1&addr=n2...): a Cluster URL
	// for brokers.RedisConfig.
	URL string
}

// StartRedisCluster starts six redis-server processes in cluster mode,
// joins them by hand (CLUSTER MEET, ADDSLOTSRANGE, REPLICATE: the layout is
// then known, which redis-cli --cluster create would choose itself), and
// waits until the cluster is ok on every node with every replica in sync.
// The processes are killed when t ends. It fails the test if redis-server
// is not installed.
func StartRedisCluster(t testing.TB) *RedisCluster {
	t.Helper()
	requireRedisServer(t)
	// Bus ports are given, not left to port+10000, which may be taken or
	// past 65535.
	ports := freePorts(t, 12)
	c := &RedisCluster{t: t}
	var addrs []string
	for i := range 6 {
		n := newRedisNode(t, ports[i], "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports[6+i]),
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000",
			// A replica may always take over (it is as up to date as it
			// gets), and the other primaries keep serving meanwhile.
			"--cluster-replica-validity-factor", "0", "--cluster-require-full-coverage", "no")
		n.Start()
		c.Nodes = append(c.Nodes, n)
		addrs = append(addrs, n.Addr)
	}
	c.URL = "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")

	ctx := context.Background()
	first := c.Nodes[0].client()
	defer first.Close()
	for i, n := range c.Nodes[1:] {
		if err := first.Do(ctx, "cluster", "meet", "127.0.0.1", n.Port, ports[7+i]).Err(); err != nil {
			t.Fatalf("outflowtest: CLUSTER MEET %s: %v", n.Addr, err)
		}
	}
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	ids := make([]string, 6)
	for i, n := range c.Nodes {
		nc := n.client()
		id, err := nc.Do(ctx, "cluster", "myid").Text()
		if err == nil && i < 3 {
			err = nc.Do(ctx, "cluster", "addslotsrange", ranges[i][0], ranges[i][1]).Err()
		}
		nc.Close()
		if err != nil {
			t.Fatalf("outflowtest: set up cluster node %s: %v", n.Addr, err)
		}
		ids[i] = id
	}
	// A replica can REPLICATE only a primary it knows.
	outflowtest.WaitFor(t, 20*time.Second, "every cluster node to know the six", func() bool {
		for _, n := range c.Nodes {
			if len(c.view(n)) != 6 {
				return false
			}
		}
		return true
	})
	for i := 3; i < 6; i++ {
		nc := c.Nodes[i].client()
		err := nc.Do(ctx, "cluster", "replicate", ids[i-3]).Err()
		nc.Close()
		if err != nil {
			t.Fatalf("outflowtest: CLUSTER REPLICATE on %s: %v", c.Nodes[i].Addr, err)
		}
	}
	c.WaitHealthy()
	return c
}

// Client returns a Cluster client on every node, closed when the test ends.
func (c *RedisCluster) Client() *redis.ClusterClient {
	c.t.Helper()
	o, err := redis.ParseClusterURL(c.URL)
	if err != nil {
		c.t.Fatal(err)
	}
	cc := redis.NewClusterClient(o)
	c.t.Cleanup(func() { cc.Close() })
	return cc
}

// clusterNodeView is a line of CLUSTER NODES.
type clusterNodeView struct {
	addr, id, primaryID string
	primary, failed     bool
	slots               bool // serves some slots
}

// view is CLUSTER NODES as node n sees it, by address; nil when n does not
// answer.
func (c *RedisCluster) view(n *RedisNode) map[string]clusterNodeView {
	nc := n.client()
	defer nc.Close()
	s, err := nc.ClusterNodes(context.Background()).Result()
	if err != nil {
		return nil
	}
	out := map[string]clusterNodeView{}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := f[2]
		out[addr] = clusterNodeView{addr: addr, id: f[0], primaryID: f[3],
			primary: strings.Contains(flags, "master"),
			failed:  strings.Contains(flags, "fail") || strings.Contains(flags, "handshake") || strings.Contains(flags, "noaddr"),
			slots:   len(f) > 8}
	}
	return out
}

// WaitHealthy waits until every running node says cluster_state:ok, sees
// the same three primaries serving the slots, all running, and every
// running replica's link to its primary is up: then WAIT 1 can succeed on
// every primary whose replica runs.
func (c *RedisCluster) WaitHealthy() {
	c.t.Helper()
	outflowtest.WaitFor(c.t, 30*time.Second, "the Redis Cluster to be ok on every running node, replicas in sync", func() bool {
		var primaries string
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			if n.clusterState() != "ok" {
				return false
			}
			v := c.view(n)
			var serving []string
			for _, m := range c.Nodes {
				nv, ok := v[m.Addr]
				if !ok || (m.Running() && nv.failed) || (!m.Running() && nv.slots) {
					return false
				}
				if nv.primary && nv.slots {
					serving = append(serving, m.Addr)
				}
			}
			if len(serving) != 3 {
				return false
			}
			if s := strings.Join(serving, ","); primaries == "" {
				primaries = s
			} else if s != primaries {
				return false // not every node has seen the failover yet
			}
			if n.info("replication", "role") == "slave" && n.info("replication", "master_link_status") != "up" {
				return false
			}
		}
		return true
	})
}

// PrimaryOf returns the index in Nodes of the primary serving key's slot.
func (c *RedisCluster) PrimaryOf(key string) int {
	c.t.Helper()
	ctx := context.Background()
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		nc := n.client()
		slot, err := nc.ClusterKeySlot(ctx, key).Result()
		shards, err2 := nc.ClusterSlots(ctx).Result()
		nc.Close()
		if err != nil || err2 != nil {
			continue
		}
		for _, s := range shards {
			if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
				for i, m := range c.Nodes {
					if m.Addr == s.Nodes[0].Addr {
						return i
					}
				}
			}
		}
	}
	c.t.Fatalf("outflowtest: no running cluster node knows the primary of %q", key)
	return -1
}

// ReplicaOf returns the index in Nodes of the replica of primary i (as
// INFO replication on i lists it).
func (c *RedisCluster) ReplicaOf(i int) int {
	c.t.Helper()
	for _, line := range strings.Split(c.Nodes[i].infoAll("replication"), "\r\n") {
		if !strings.HasPrefix(line, "slave0:") {
			continue
		}
		for j, n := range c.Nodes {
			if strings.Contains(line, fmt.Sprintf("port=%d,", n.Port)) {
				return j
			}
		}
	}
	c.t.Fatalf("outflowtest: cluster node %s has no replica", c.Nodes[i].Addr)
	return -1
}

// fillerSize is more than the loopback socket buffers between a primary and
// its replica hold, and less than a replica's output buffer soft limit
// (64 MiB), past which the primary would drop the replica.
const fillerSize = 24 << 20

// HoldReplication makes what primary i takes from now on stay on it alone,
// and returns the index of its replica: the replica is paused (SIGSTOP),
// and a filler value written to the primary fills the socket buffers of
// the replication link (the kernel would otherwise keep receiving for the
// paused replica, which would apply it all once resumed). What the primary
// acknowledges afterwards waits in its memory, and is lost if it dies
// before the replica is resumed: a replica that had not caught up, made
// deterministic. Resume the replica with [RedisCluster.FailOver] or
// Nodes[replica].Resume().
func (c *RedisCluster) HoldReplication(i int) int {
	c.t.Helper()
	r := c.ReplicaOf(i)
	holdReplication(c.Nodes[i], c.Nodes[r])
	return r
}

// holdReplication pauses replica and fills its link from primary (see
// [RedisCluster.HoldReplication]). The filler goes to the first key whose
// slot primary holds (on a Cluster the others answer MOVED).
func holdReplication(primary, replica *RedisNode) {
	replica.t.Helper()
	// Not primary.client(): its one-second timeouts are for probes, and
	// writing 24 MiB on a loaded machine (the suite runs packages side by
	// side) took longer.
	nc := redis.NewClient(&redis.Options{Addr: primary.Addr, DialTimeout: 5 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, MaxRetries: -1, PoolSize: 1})
	defer nc.Close()
	ctx := context.Background()
	// What the primary has now is what the replica must keep: it is the
	// writes from here on that the failover is to lose. Paused at once,
	// the replica could lack the last writes before the hold too.
	outflowtest.WaitFor(replica.t, 10*time.Second, "the replica to have the primary's writes", func() bool {
		n, err := nc.Do(ctx, "wait", 1, 1000).Int()
		return err == nil && n >= 1
	})
	replica.Pause()
	filler := strings.Repeat("f", fillerSize)
	for k := 0; ; k++ {
		err := nc.Set(ctx, fmt.Sprintf("outflowtest-filler-%d", k), filler, 0).Err()
		if err == nil {
			return
		}
		if !strings.HasPrefix(err.Error(), "MOVED") || k > 1000 {
			primary.t.Fatalf("outflowtest: filler on %s: %v", primary.Addr, err)
		}
	}
}

// FailOver kills primary i (SIGKILL), resumes its replica r (paused by
// [RedisCluster.HoldReplication]; resuming a running one does nothing),
// and waits until r has taken over and the cluster is healthy.
func (c *RedisCluster) FailOver(i, r int) {
	c.t.Helper()
	c.Nodes[i].Kill()
	c.Nodes[r].Resume()
	c.WaitHealthy()
}

// Kill kills node i (SIGKILL) and, when it was a primary, waits until its
// replica has taken over and every running node agrees.
func (c *RedisCluster) Kill(i int) {
	c.t.Helper()
	c.Nodes[i].Kill()
	c.WaitHealthy()
}

// KillPrimaryOf kills the primary serving key, waits until its replica has
// taken over, and returns the killed node's index (for [RedisCluster.Start]).
func (c *RedisCluster) KillPrimaryOf(key string) int {
	c.t.Helper()
	i := c.PrimaryOf(key)
	c.Kill(i)
	if j := c.PrimaryOf(key); j == i {
		c.t.Fatalf("outflowtest: %s still serves %q after it was killed", c.Nodes[i].Addr, key)
	}
	return i
}

// Start starts killed node i again, with its cluster identity
// (nodes.conf) and no data: it rejoins as a replica of whoever took its
// slots, and Start waits until it is in sync and the cluster is healthy.
func (c *RedisCluster) Start(i int) {
	c.t.Helper()
	c.Nodes[i].Start()
	c.WaitHealthy()
}

// Logs returns the log of node i, for a failing test to print.
func (c *RedisCluster) Logs(i int) string {
	b, _ := os.ReadFile(filepath.Join(c.Nodes[i].dir, "redis.log"))
	return string(b)
}
