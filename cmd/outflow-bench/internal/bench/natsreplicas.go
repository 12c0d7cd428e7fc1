package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/poll"
)

// NATSReplicasConfig configures [NATSReplicas].
type NATSReplicasConfig struct {
	DatabaseURL string
	// Backlog is how many rows each drain moves. Defaults to 20,000.
	Backlog int
	// Rounds is how many times each replica count drains, alternating, so
	// that the machine's drift spreads over both. Defaults to 3.
	Rounds int
	Out    io.Writer
}

// NATSReplicas measures what stream replicas cost the forwarder: on a
// three-node JetStream cluster it starts itself from the installed
// nats-server (local ports, stores in a temporary directory), the same
// backlog drains to a stream of 1 replica and to one of 3, alternating,
// and the ratio of the medians is printed.
func NATSReplicas(ctx context.Context, cfg NATSReplicasConfig) error {
	if cfg.Backlog <= 0 {
		cfg.Backlog = 20_000
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	cluster, err := startBenchCluster(ctx)
	if err != nil {
		return err
	}
	defer cluster.stop()
	fmt.Fprintf(cfg.Out, "nats replicas: forwarder drain of %d rows to a JetStream stream on a local 3-node cluster, %d rounds\n\n",
		cfg.Backlog, cfg.Rounds)
	rates := map[int][]float64{}
	for round := range cfg.Rounds {
		for _, r := range []int{1, 3} {
			rate, err := drainToNATS(ctx, cfg, cluster.url, r)
			if err != nil {
				return fmt.Errorf("round %d, %d replicas: %w", round+1, r, err)
			}
			rates[r] = append(rates[r], rate)
		}
	}
	fmt.Fprintf(cfg.Out, "| replicas | rows/s per round | median rows/s |\n| --- | --- | ---: |\n")
	med := map[int]float64{}
	for _, r := range []int{1, 3} {
		var each []string
		for _, v := range rates[r] {
			each = append(each, fmt.Sprintf("%.0f", v))
		}
		med[r] = median(rates[r])
		fmt.Fprintf(cfg.Out, "| %d | %s | %.0f |\n", r, strings.Join(each, ", "), med[r])
	}
	fmt.Fprintf(cfg.Out, "\n3 replicas / 1 replica: %.2fx\n", med[3]/med[1])
	return nil
}

// drainToNATS seeds a fresh schema with backlog rows and times the
// forwarder publishing them all to a stream of replicas replicas.
func drainToNATS(ctx context.Context, cfg NATSReplicasConfig, url string, replicas int) (float64, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 8)
	if err != nil {
		return 0, err
	}
	defer drop()
	topic := "bench"
	if err := seedOutbox(ctx, pool, topic, cfg.Backlog, 0); err != nil {
		return 0, err
	}
	prefix := "b" + uuid.NewString()[:8] + "_"
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.NATS, Logger: quietLogger(),
		NATS: brokers.NATSConfig{URL: url, StreamPrefix: prefix, Replicas: replicas}})
	if err != nil {
		return 0, fmt.Errorf("open the backend: %w", err)
	}
	defer backend.Close()
	conn, err := nats.Connect(url)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	js, err := conn.JetStream()
	if err != nil {
		return 0, err
	}
	defer func() { _ = js.DeleteStream(prefix + topic) }()
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: backend.Broker(), AuditInterval: -1, Logger: quietLogger()})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	if err := poll.Until(ctx, 20*time.Millisecond, 10*time.Minute, func() (bool, error) {
		info, err := js.StreamInfo(prefix + topic)
		if err == nil && info.State.Msgs >= uint64(cfg.Backlog) {
			if info.Config.Replicas != replicas {
				return false, fmt.Errorf("stream of %d replicas, want %d", info.Config.Replicas, replicas)
			}
			return true, nil
		}
		// A busy stream leader may answer an info request late: ask again.
		if err != nil && !errors.Is(err, nats.ErrStreamNotFound) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			return false, fmt.Errorf("stream info: %w", err)
		}
		return false, nil
	}); err != nil {
		return 0, fmt.Errorf("the drain: %w", err)
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, fmt.Errorf("forwarder: %w", err)
	}
	return float64(cfg.Backlog) / elapsed.Seconds(), nil
}

// benchCluster is three nats-server -js processes clustered on local
// ports (testservers.StartNATSCluster is the tests' twin, on testing.TB).
type benchCluster struct {
	dir  string
	cmds []*exec.Cmd
	url  string
}

func startBenchCluster(ctx context.Context) (*benchCluster, error) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr != nil {
			return nil, errors.New("nats-server is not installed (Debian: apt-get install nats-server): the benchmark starts its own cluster")
		}
		bin = "/usr/sbin/nats-server"
	}
	dir, err := os.MkdirTemp("", "outflow-bench-nats-")
	if err != nil {
		return nil, err
	}
	c := &benchCluster{dir: dir}
	ports := make([]int, 6)
	for i := range ports {
		if ports[i], err = freeTCPPort(); err != nil {
			c.stop()
			return nil, err
		}
	}
	var urls, routes []string
	for i := range 3 {
		urls = append(urls, "nats://127.0.0.1:"+strconv.Itoa(ports[2*i]))
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(ports[2*i+1]))
	}
	c.url = strings.Join(urls, ",")
	for i := range 3 {
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(ports[2*i]), "-js",
			"-sd", filepath.Join(dir, fmt.Sprint(i)), "--server_name", fmt.Sprintf("bench-n%d", i), "--cluster_name", "outflow-bench",
			"--cluster", routes[i], "--routes", strings.Join(routes, ","))
		if err := cmd.Start(); err != nil {
			c.stop()
			return nil, fmt.Errorf("start nats-server: %w", err)
		}
		c.cmds = append(c.cmds, cmd)
	}
	// Ready: a stream of three replicas can be created.
	var probe error
	if poll.Until(ctx, 100*time.Millisecond, 30*time.Second, func() (bool, error) {
		probe = probeR3(c.url)
		return probe == nil, nil
	}) != nil {
		c.stop()
		return nil, fmt.Errorf("the NATS cluster never took a stream of 3 replicas: %w", probe)
	}
	return c, nil
}

func probeR3(url string) error {
	conn, err := nats.Connect(url, nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer conn.Close()
	js, err := conn.JetStream(nats.MaxWait(5 * time.Second))
	if err != nil {
		return err
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "probe", Subjects: []string{"probe"}, Replicas: 3}); err != nil {
		return err
	}
	return js.DeleteStream("probe")
}

func (c *benchCluster) stop() {
	for _, cmd := range c.cmds {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	_ = os.RemoveAll(c.dir)
}

func freeTCPPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
